/* test_multistep.c — several sessions in one pass (k3_multistep, k3_sessions_step; issue 18)
 * on k3-nano and k3-tiny-kjv: every session's logits, greedy ids and state file bit-identical
 * to stepping it alone; a new request's prefill chunk beside other sessions' decode rows
 * within the fixture tolerance of the reference logits; a segment that cannot run fails alone;
 * each routed expert of a pass asked for (and read) once however many rows chose it;
 * speculative verifications (rewindable segments) beside decode rows, rewound as alone. */
#include <stdlib.h>
#include <string.h>

#include "../src/engine/k3.h"
#include "../src/engine/k3_lab.h"
#include "../src/engine/k3_test.h"
#include "../src/store/store.h"
#include "batch_check.h"
#include "cli_run.h"
#include "pack_helpers.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"
#define KJV "tests/fixtures/k3-tiny-kjv"
#define MAXN 5
#define STEPS 4

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* The state files of a and b hold the same bytes (ids, KDA and conv state, MLA cache). */
static int same_state(k3_session *a, k3_session *b) {
    char pa[256], pb[256];
    k3_err err = {0};
    bc_tmp_path(pa, sizeof pa, "ms_a");
    bc_tmp_path(pb, sizeof pb, "ms_b");
    int same = k3_session_save(a, pa, &err) == K3_OK && k3_session_save(b, pb, &err) == K3_OK &&
               bc_same_file(pa, pb);
    remove(pa), remove(pb);
    return same;
}

/* N = 1..5 sessions, session i prefilled with a different prefix of the prompt (so each
 * decodes at its own position), then STEPS greedy ids: one k3_sessions_step per step for the
 * group against k3_session_step on a twin session for each. */
static void check_greedy(const char *model, const char *ref, const char *prompt) {
    bc_prompt p;
    if (!bc_prompt_load(ref, prompt, &p)) return;
    k3_engine *e = NULL;
    k3_multistep *ms = NULL;
    k3_err err = {0};
    size_t V = (size_t)p.vocab;
    float *multi = malloc(MAXN * V * sizeof *multi), *alone = malloc(V * sizeof *alone);
    CHECK(k3_engine_load(model, NULL, &e, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_multistep_new(e, 8, &ms, &err) == K3_OK, "%s", err.msg);
    for (int N = 1; N <= MAXN && !k3_test_stopped(); N++) {
        k3_session *g[MAXN] = {0}, *t[MAXN] = {0};
        int32_t ids[MAXN];
        for (int i = 0; i < N; i++) {
            CHECK(k3_session_new(e, 0, &g[i], &err) == K3_OK &&
                  k3_session_new(e, 0, &t[i], &err) == K3_OK, "%s", err.msg);
            size_t len = 1 + (size_t)(i * 13 + N * 3) % (size_t)p.n; /* 1 .. p.n positions */
            CHECK(k3_session_prefill(g[i], p.ids, len, NULL, NULL, &err) == K3_OK &&
                  k3_session_prefill(t[i], p.ids, len, NULL, NULL, &err) == K3_OK, "%s", err.msg);
            ids[i] = p.ids[len % (size_t)p.n];
        }
        for (int step = 0; step < STEPS; step++) {
            int status[MAXN];
            CHECK(k3_sessions_step(ms, g, ids, N, multi, status, &err) == K3_OK, "N=%d: %s", N,
                  err.msg);
            for (int i = 0; i < N; i++) {
                CHECK(status[i] == K3_OK, "N=%d session %d: status %d", N, i, status[i]);
                CHECK(k3_session_step(t[i], ids[i], alone, &err) == K3_OK, "%s", err.msg);
                CHECK(memcmp(multi + i * V, alone, V * sizeof *alone) == 0, "N=%d step %d "
                      "session %d: the multistep logits differ from stepping it alone", N,
                      step, i);
                int a = argmax(multi + i * V, p.vocab), b = argmax(alone, p.vocab);
                CHECK(a == b, "N=%d step %d session %d: greedy id %d vs %d alone", N, step, i,
                      a, b);
                ids[i] = a;
            }
        }
        for (int i = 0; i < N; i++) {
            CHECK(k3_session_pos(g[i]) == k3_session_pos(t[i]), "N=%d: position %d vs %d", N,
                  k3_session_pos(g[i]), k3_session_pos(t[i]));
            CHECK(same_state(g[i], t[i]), "N=%d session %d: the state differs from alone", N,
                  i);
            k3_session_free(g[i]);
            k3_session_free(t[i]);
        }
    }
    k3_multistep_stats st;
    k3_multistep_get_stats(ms, &st);
    CHECK(st.passes == (uint64_t)MAXN * STEPS && st.rows == (uint64_t)STEPS * 15,
          "%llu passes, %llu rows", (unsigned long long)st.passes, (unsigned long long)st.rows);
    k3_multistep_free(ms);
    k3_engine_free(e);
    free(multi), free(alone);
    bc_prompt_free(&p);
}

static void test_nano_greedy(void) { check_greedy(NANO, NANO "/reference", "prompt_len70.json"); }
static void test_kjv_greedy(void) { check_greedy(KJV, KJV "/reference", "prompt_len70.json"); }

/* Continuous batching: a new request's prompt is prefilled in chunks of 5 ids (the middle
 * chunks wanting no logits, the last one all of its rows) in the same passes as two other
 * sessions' decode rows. The chunk's logits match the reference at those positions, and every
 * session ends bit-identical (logits and state) to feeding it alone. */
static void test_nano_prefill_beside_decode(void) {
    bc_prompt p;
    if (!bc_prompt_load(NANO "/reference", "prompt_len33.json", &p)) return;
    k3_engine *e = NULL;
    k3_multistep *ms = NULL;
    k3_err err = {0};
    size_t V = (size_t)p.vocab;
    k3_session *s[3], *t[3];
    CHECK(k3_engine_load(NANO, NULL, &e, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_multistep_new(e, 7, &ms, &err) == K3_OK, "%s", err.msg);
    for (int i = 0; i < 3; i++)
        CHECK(k3_session_new(e, 0, &s[i], &err) == K3_OK &&
              k3_session_new(e, 0, &t[i], &err) == K3_OK, "%s", err.msg);
    for (int i = 0; i < 2; i++) { /* the decoding sessions: 4 and 11 positions in */
        size_t len = i ? 11 : 4;
        CHECK(k3_session_prefill(s[i], p.ids + 20, len, NULL, NULL, &err) == K3_OK &&
              k3_session_prefill(t[i], p.ids + 20, len, NULL, NULL, &err) == K3_OK, "%s",
              err.msg);
    }
    float *rows = malloc(8 * V * sizeof *rows), *alone = malloc(V * sizeof *alone);
    int32_t dec[2] = {p.ids[3], p.ids[9]};
    for (int at = 0; at < p.n; at += 5) {
        int len = p.n - at < 5 ? p.n - at : 5, last = at + len == p.n;
        k3_multistep_seg seg[3] = {
            {.session = s[0], .ids = &dec[0], .n_ids = 1},
            {.session = s[2], .ids = p.ids + at, .n_ids = len,
             .flags = last ? K3_MS_ALL_LOGITS : K3_MS_NO_LOGITS},
            {.session = s[1], .ids = &dec[1], .n_ids = 1},
        };
        CHECK(k3_multistep_logit_rows(seg, 3) == (last ? 2 + len : 2), "logit rows");
        CHECK(k3_multistep_run(ms, seg, 3, rows, &err) == K3_OK, "chunk at %d: %s", at, err.msg);
        CHECK(seg[0].logits_row == 0 && seg[1].logits_row == (last ? 1 : -1) &&
              seg[2].logits_row == (last ? 1 + len : 1), "rows %d %d %d", seg[0].logits_row,
              seg[1].logits_row, seg[2].logits_row);
        for (int k = 0; k < 2; k++) { /* the decode rows against their twins */
            const k3_multistep_seg *g = &seg[k ? 2 : 0];
            CHECK(k3_session_step(t[k], dec[k], alone, &err) == K3_OK, "%s", err.msg);
            CHECK(memcmp(rows + (size_t)g->logits_row * V, alone, V * sizeof *alone) == 0,
                  "chunk at %d: decode session %d differs from alone", at, k);
            dec[k] = argmax(alone, p.vocab);
        }
        for (int j = 0; j < len; j++) { /* the new request, id by id on its twin */
            float *want = j + 1 == len && last ? alone : NULL;
            CHECK(k3_session_step(t[2], p.ids[at + j], want, &err) == K3_OK, "%s", err.msg);
        }
        if (!last) continue;
        for (int j = 0; j < len; j++) { /* the reference logits at the chunk's positions */
            const float *got = rows + (size_t)(seg[1].logits_row + j) * V;
            const float *ref = p.logits + (size_t)(at + j) * V;
            float worst = 0;
            for (size_t v = 0; v < V; v++) {
                float d = got[v] > ref[v] ? got[v] - ref[v] : ref[v] - got[v];
                worst = d > worst ? d : worst;
            }
            CHECK(worst <= 1e-4f && argmax(got, p.vocab) == argmax(ref, p.vocab),
                  "position %d: max |dlogit| %g against the reference", at + j, worst);
        }
        CHECK(memcmp(rows + (size_t)(seg[1].logits_row + len - 1) * V, alone,
                     V * sizeof *alone) == 0, "the prefilled request's last logits differ from "
              "feeding it alone");
    }
    for (int i = 0; i < 3; i++) {
        CHECK(same_state(s[i], t[i]), "session %d: the state differs from alone", i);
        k3_session_free(s[i]);
        k3_session_free(t[i]);
    }
    k3_multistep_free(ms);
    k3_engine_free(e);
    free(rows), free(alone);
    bc_prompt_free(&p);
}

/* Speculative verification beside other rows (issue 27): two sessions each feed 4 ids as a
 * rewindable segment (K3_MS_ALL_LOGITS | K3_MS_REWINDABLE) beside a third session's decode
 * row, then are rewound to 1 and 3 of them. Logits rows, and the states after the rewinds and
 * after one more step, must equal the twins that did the same alone with k3_session_forward
 * (K3_FWD_REWINDABLE) and k3_session_rewind — and the twin fed only the kept ids, id by id. */
static void test_kjv_rewindable_segments(void) {
    bc_prompt p;
    if (!bc_prompt_load(KJV "/reference", "prompt_len33.json", &p)) return;
    k3_engine *e = NULL;
    k3_multistep *ms = NULL;
    k3_err err = {0};
    size_t V = (size_t)p.vocab;
    k3_session *s[3], *t[3], *u[2];
    CHECK(k3_engine_load(KJV, NULL, &e, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_multistep_new(e, 9, &ms, &err) == K3_OK, "%s", err.msg);
    for (int i = 0; i < 3; i++) {
        CHECK(k3_session_new(e, 0, &s[i], &err) == K3_OK &&
              k3_session_new(e, 0, &t[i], &err) == K3_OK, "%s", err.msg);
        CHECK(k3_session_prefill(s[i], p.ids, (size_t)(6 + 5 * i), NULL, NULL, &err) == K3_OK &&
              k3_session_prefill(t[i], p.ids, (size_t)(6 + 5 * i), NULL, NULL, &err) == K3_OK,
              "%s", err.msg);
    }
    for (int i = 0; i < 2; i++) {
        CHECK(k3_session_new(e, 0, &u[i], &err) == K3_OK, "%s", err.msg);
        CHECK(k3_session_prefill(u[i], p.ids, (size_t)(6 + 5 * i), NULL, NULL, &err) == K3_OK,
              "%s", err.msg);
    }
    float *rows = malloc(9 * V * sizeof *rows), *alone = malloc(4 * V * sizeof *alone);
    const int32_t *draft[2] = {p.ids + 20, p.ids + 24}, dec = p.ids[30];
    k3_multistep_seg seg[3] = {
        {.session = s[0], .ids = draft[0], .n_ids = 4,
         .flags = K3_MS_ALL_LOGITS | K3_MS_REWINDABLE},
        {.session = s[2], .ids = &dec, .n_ids = 1},
        {.session = s[1], .ids = draft[1], .n_ids = 4,
         .flags = K3_MS_ALL_LOGITS | K3_MS_REWINDABLE},
    };
    CHECK(k3_multistep_run(ms, seg, 3, rows, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_session_step(t[2], dec, alone, &err) == K3_OK, "%s", err.msg);
    CHECK(memcmp(rows + (size_t)seg[1].logits_row * V, alone, V * sizeof *alone) == 0,
          "the decode row beside the verifications differs from alone");
    int keep[2] = {1, 3};
    for (int i = 0; i < 2; i++) {
        const k3_multistep_seg *g = &seg[i ? 2 : 0];
        int pos = k3_session_pos(t[i]);
        CHECK(k3_session_forward(t[i], draft[i], 4, alone, K3_FWD_ALL_LOGITS | K3_FWD_REWINDABLE,
                                 &err) == K3_OK, "%s", err.msg);
        CHECK(memcmp(rows + (size_t)g->logits_row * V, alone, 4 * V * sizeof *alone) == 0,
              "session %d: the verification rows differ from its pass alone", i);
        CHECK(k3_session_rewind(s[i], pos + keep[i], &err) == K3_OK &&
              k3_session_rewind(t[i], pos + keep[i], &err) == K3_OK, "%s", err.msg);
        for (int j = 0; j < keep[i]; j++) /* the twin that never saw the rejected drafts */
            CHECK(k3_session_step(u[i], draft[i][j], NULL, &err) == K3_OK, "%s", err.msg);
        CHECK(same_state(s[i], t[i]) && same_state(s[i], u[i]), "session %d: the state after "
              "the rewind to %d differs from alone", i, pos + keep[i]);
        CHECK(k3_session_step(s[i], p.ids[31], rows, &err) == K3_OK &&
              k3_session_step(u[i], p.ids[31], alone, &err) == K3_OK, "%s", err.msg);
        CHECK(memcmp(rows, alone, V * sizeof *alone) == 0, "session %d: the step after the "
              "rewind differs", i);
    }
    for (int i = 0; i < 3; i++) k3_session_free(s[i]), k3_session_free(t[i]);
    for (int i = 0; i < 2; i++) k3_session_free(u[i]);
    k3_multistep_free(ms);
    k3_engine_free(e);
    free(rows), free(alone);
    bc_prompt_free(&p);
}

/* A segment whose session's context is full, and one with an id out of range, fail alone with
 * K3_ERR_INPUT before the pass: their sessions do not move, the others' rows equal stepping
 * alone. Caller errors (a session twice, more ids than the row budget) run nothing. */
static void test_nano_segment_fails_alone(void) {
    bc_prompt p;
    if (!bc_prompt_load(NANO "/reference", "prompt_len33.json", &p)) return;
    k3_engine *e = NULL;
    k3_multistep *ms = NULL;
    k3_err err = {0};
    size_t V = (size_t)p.vocab;
    k3_session *full = NULL, *a = NULL, *b = NULL, *ta = NULL, *tb = NULL;
    CHECK(k3_engine_load(NANO, NULL, &e, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_multistep_new(e, 4, &ms, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_session_new(e, 8, &full, &err) == K3_OK && k3_session_new(e, 0, &a, &err) == K3_OK &&
          k3_session_new(e, 0, &b, &err) == K3_OK && k3_session_new(e, 0, &ta, &err) == K3_OK &&
          k3_session_new(e, 0, &tb, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_session_prefill(full, p.ids, 8, NULL, NULL, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_session_prefill(a, p.ids, 5, NULL, NULL, &err) == K3_OK &&
          k3_session_prefill(ta, p.ids, 5, NULL, NULL, &err) == K3_OK, "%s", err.msg);
    float *rows = malloc(4 * V * sizeof *rows), *alone = malloc(V * sizeof *alone);
    int32_t ids[3] = {p.ids[5], p.ids[6], p.ids[0]};
    k3_session *ss[3] = {a, full, b};
    int status[3];
    int rc = k3_sessions_step(ms, ss, ids, 3, rows, status, &err);
    CHECK(rc == K3_ERR_INPUT && status[1] == K3_ERR_INPUT && status[0] == K3_OK &&
          status[2] == K3_OK, "rc %d, statuses %d %d %d", rc, status[0], status[1], status[2]);
    CHECK(strstr(err.msg, "segment 1") && strstr(err.msg, "context is full"), "%s", err.msg);
    CHECK(k3_session_pos(full) == 8 && k3_session_pos(a) == 6 && k3_session_pos(b) == 1,
          "positions %d %d %d", k3_session_pos(full), k3_session_pos(a), k3_session_pos(b));
    CHECK(k3_session_step(ta, ids[0], alone, &err) == K3_OK, "%s", err.msg);
    CHECK(memcmp(rows, alone, V * sizeof *alone) == 0, "session a differs from alone");
    CHECK(k3_session_step(tb, ids[2], alone, &err) == K3_OK, "%s", err.msg);
    CHECK(memcmp(rows + 2 * V, alone, V * sizeof *alone) == 0, "session b differs from alone");

    int32_t bad[2] = {p.ids[7], 1 << 20};
    k3_multistep_seg seg[2] = {{.session = a, .ids = &bad[0], .n_ids = 1},
                               {.session = b, .ids = &bad[1], .n_ids = 1}};
    CHECK(k3_multistep_run(ms, seg, 2, rows, &err) == K3_ERR_INPUT && seg[0].status == K3_OK &&
          seg[1].status == K3_ERR_INPUT && strstr(seg[1].err.msg, "outside the vocabulary"),
          "statuses %d %d: %s", seg[0].status, seg[1].status, seg[1].err.msg);
    CHECK(k3_session_step(ta, bad[0], alone, &err) == K3_OK, "%s", err.msg);
    CHECK(memcmp(rows, alone, V * sizeof *alone) == 0, "session a differs from alone");
    CHECK(same_state(a, ta), "session a's state differs from alone");

    k3_multistep_seg twice[2] = {{.session = a, .ids = ids, .n_ids = 1},
                                 {.session = a, .ids = ids, .n_ids = 1}};
    CHECK(k3_multistep_run(ms, twice, 2, rows, &err) == K3_ERR_USAGE &&
          twice[0].status == K3_ERR_USAGE && strstr(err.msg, "same session"), "%s", err.msg);
    k3_multistep_seg big[2] = {{.session = a, .ids = p.ids, .n_ids = 3},
                               {.session = b, .ids = p.ids, .n_ids = 2}};
    CHECK(k3_multistep_run(ms, big, 2, rows, &err) == K3_ERR_USAGE && strstr(err.msg, "4 rows"),
          "%s", err.msg);
    CHECK(k3_session_pos(a) == 7 && k3_session_pos(b) == 1, "a refused call moved a session");
    CHECK(k3_multistep_new(e, K3_MULTISTEP_MAX_ROWS + 1, &(k3_multistep *){0}, &err) ==
          K3_ERR_INPUT, "row budget above the maximum");
    /* the scratch grows with the rows: at least the residual stream [rows][hidden] floats */
    uint64_t b1 = k3_multistep_plan_bytes(e, 1), b8 = k3_multistep_plan_bytes(e, 8);
    CHECK(b1 >= 64 * sizeof(float) && b8 >= b1 + 7 * 64 * sizeof(float) && b8 < 8 * b1 + 4096,
          "plan bytes %llu for 1 row, %llu for 8", (unsigned long long)b1,
          (unsigned long long)b8);
    k3_session *all[] = {full, a, b, ta, tb};
    for (int i = 0; i < 5; i++) k3_session_free(all[i]);
    k3_multistep_free(ms);
    k3_engine_free(e);
    free(rows), free(alone);
    bc_prompt_free(&p);
}

/* The routing of a layer, recorded by a trace hook: ids chosen per (position, MoE layer). */
typedef struct routes {
    int ids[16][9][4]; /* [position][layer][k] */
    int k;
} routes;

static void on_routing(void *user, int pos, int layer, const int *ids, const float *w, int k) {
    routes *r = user;
    (void)w;
    if (pos < 16 && layer < 9 && k <= 4) memcpy(r->ids[pos][layer], ids, (size_t)k * sizeof *ids);
    r->k = k;
}

/* Reads per pass: the store is asked once for each expert of a layer's union, however many
 * rows chose it. Two sessions fed the same id at position 0 choose the same experts: the pass
 * asks (and, from a cold cache, reads) top-k per MoE layer, half of what stepping them alone
 * asks. Two different ids: the union's size per layer, counted from the routing each session
 * has alone (a trace hook on a separate engine). */
static void test_nano_expert_reads_once(void) {
    const int K = 4, n_moe = 8; /* k3-nano: top-4, MoE layers 1..8 */
    int32_t tok[2][2] = {{17, 17}, {17, 901}};
    for (int c = 0; c < 2 && !k3_test_stopped(); c++) {
        routes r[2] = {0};
        size_t want = 0;
        { /* the routing each session has alone */
            k3_engine *e = NULL;
            k3_err err = {0};
            CHECK(k3_engine_load(NANO, NULL, &e, &err) == K3_OK, "%s", err.msg);
            for (int i = 0; i < 2; i++) {
                k3_session *s = NULL;
                k3_trace tr = {.user = &r[i], .on_routing = on_routing};
                CHECK(k3_session_new(e, 0, &s, &err) == K3_OK, "%s", err.msg);
                k3_session_set_trace(s, &tr);
                CHECK(k3_session_step(s, tok[c][i], NULL, &err) == K3_OK, "%s", err.msg);
                k3_session_free(s);
            }
            k3_engine_free(e);
            for (int l = 1; l <= n_moe; l++) {
                want += (size_t)K;
                for (int j = 0; j < K; j++) {
                    int dup = 0;
                    for (int q = 0; q < K; q++) dup |= r[1].ids[0][l][j] == r[0].ids[0][l][q];
                    want += !dup;
                }
            }
        }
        k3_engine_opts o = k3_engine_opts_default();
        o.lab = &(k3_lab_opts){.expert_slots = 2 * K * n_moe + 8, .gpu_max_layers = -1}; /* nothing evicted */
        o.pipe = K3_PIPE_OFF;
        k3_engine *e = NULL;
        k3_multistep *ms = NULL;
        k3_session *s[2] = {0};
        k3_err err = {0};
        CHECK(k3_engine_load(NANO, &o, &e, &err) == K3_OK, "%s", err.msg);
        CHECK(k3_multistep_new(e, 2, &ms, &err) == K3_OK && k3_session_new(e, 0, &s[0], &err) ==
              K3_OK && k3_session_new(e, 0, &s[1], &err) == K3_OK, "%s", err.msg);
        k3_store_stats before, after;
        k3_store_get_stats(k3_engine_store(e), &before);
        CHECK(k3_sessions_step(ms, s, tok[c], 2, NULL, NULL, &err) == K3_OK, "%s", err.msg);
        k3_store_get_stats(k3_engine_store(e), &after);
        k3_multistep_stats st;
        k3_multistep_get_stats(ms, &st);
        uint64_t asked = after.requests - before.requests, reads = after.reads - before.reads;
        CHECK(asked == want && st.experts == want, "ids %d, %d: %llu experts asked (multistep "
              "counted %llu), the union of the routing alone has %zu", tok[c][0], tok[c][1],
              (unsigned long long)asked, (unsigned long long)st.experts, want);
        CHECK(reads == want, "%llu expert reads from a cold cache, expected %zu",
              (unsigned long long)reads, want);
        CHECK(st.row_experts == (uint64_t)(2 * K * n_moe), "%llu row experts",
              (unsigned long long)st.row_experts);
        if (c == 0) CHECK(want == (size_t)(K * n_moe), "the same id chose different experts");
        k3_session_free(s[0]);
        k3_session_free(s[1]);
        k3_multistep_free(ms);
        k3_engine_free(e);
    }
}

/* Non-finite logits fail their own row's segment only: on a copy of k3-nano whose embedding
 * row of one id holds a NaN, the session fed that id fails with K3_ERR_CHECKPOINT naming its
 * position while the session beside it in the same pass gets its logits, bit-identical to
 * stepping it alone. */
static void test_nano_nonfinite_row_fails_alone(void) {
    const int32_t poisoned = 77, clean = 78;
    char *dir = k3t_nano_copy();
    if (!dir || k3t_patch_bf16(dir, "language_model.model.embed_tokens.weight",
                               (size_t)poisoned * 64, 0x7fc0)) /* hidden 64; BF16 NaN */
        return k3t_rm_dir(dir);
    k3_engine *e = NULL;
    k3_multistep *ms = NULL;
    k3_session *s[2] = {0}, *t = NULL;
    k3_err err = {0};
    float *rows = NULL, *alone = NULL;
    int ok = k3_engine_load(dir, NULL, &e, &err) == K3_OK && k3_multistep_new(e, 2, &ms, &err) ==
             K3_OK && k3_session_new(e, 0, &s[0], &err) == K3_OK &&
             k3_session_new(e, 0, &s[1], &err) == K3_OK && k3_session_new(e, 0, &t, &err) == K3_OK;
    size_t V = ok ? (size_t)k3_engine_config(e)->vocab_size : 0;
    if (ok) ok = (rows = malloc(2 * V * sizeof *rows)) && (alone = malloc(V * sizeof *alone));
    if (!ok) k3_test_fail(__FILE__, __LINE__, "setup: %s", err.msg);
    int32_t pre[3] = {5, 9, 11}, ids[2] = {clean, poisoned};
    if (ok) ok = k3_session_prefill(s[0], pre, 3, NULL, NULL, &err) == K3_OK &&
                 k3_session_prefill(t, pre, 3, NULL, NULL, &err) == K3_OK &&
                 k3_session_prefill(s[1], pre, 2, NULL, NULL, &err) == K3_OK;
    int status[2] = {-1, -1}, rc = -1;
    if (ok) rc = k3_sessions_step(ms, s, ids, 2, rows, status, &err);
    if (ok) ok = k3_session_step(t, clean, alone, &err) == K3_OK;
    k3_session_free(s[0]), k3_session_free(s[1]), k3_session_free(t);
    k3_multistep_free(ms);
    k3_engine_free(e);
    k3t_rm_dir(dir);
    int same = ok && memcmp(rows, alone, V * sizeof *alone) == 0;
    free(rows), free(alone);
    CHECK(ok, "%s", err.msg);
    CHECK(rc == K3_ERR_CHECKPOINT && status[1] == K3_ERR_CHECKPOINT && status[0] == K3_OK,
          "rc %d, statuses %d %d: %s", rc, status[0], status[1], err.msg);
    CHECK(strstr(err.msg, "segment 1") && strstr(err.msg, "non-finite logits") &&
          strstr(err.msg, "after position 2"), "%s", err.msg);
    CHECK(same, "the clean session's logits differ from stepping it alone");
}

/* What a trace hook saw, folded into a hash in call order (FNV-1a over every argument and
 * value), and how many calls of each kind. */
typedef struct seen {
    uint64_t h;
    int vectors, routings, steps;
} seen;

static void mix_bytes(seen *s, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) s->h = (s->h ^ b[i]) * 1099511628211ull;
}

static void saw_vector(void *user, int pos, int layer, enum k3_trace_point pt, const float *x,
                       int n) {
    seen *s = user;
    int head[4] = {pos, layer, (int)pt, n};
    mix_bytes(s, head, sizeof head);
    mix_bytes(s, x, (size_t)n * sizeof *x);
    s->vectors++;
}

static void saw_routing(void *user, int pos, int layer, const int *ids, const float *w, int k) {
    seen *s = user;
    int head[3] = {pos, layer, k};
    mix_bytes(s, head, sizeof head);
    mix_bytes(s, ids, (size_t)k * sizeof *ids);
    mix_bytes(s, w, (size_t)k * sizeof *w);
    s->routings++;
}

static void saw_step(void *user, int pos) {
    seen *s = user;
    mix_bytes(s, &pos, sizeof pos);
    s->steps++;
}

/* Each session's trace hook sees, in a pass beside another session, exactly the calls (order,
 * positions, vectors, routing) it sees when stepped alone, and only its own rows. */
static void test_nano_traces_per_session(void) {
    k3_engine *e = NULL;
    k3_multistep *ms = NULL;
    k3_session *g[2] = {0}, *t[2] = {0};
    k3_err err = {0};
    const seen fnv = {.h = 14695981039346656037ull}; /* the FNV-1a offset basis */
    seen sg[2] = {fnv, fnv}, st[2] = {fnv, fnv};
    int32_t pre[5] = {3, 141, 59, 26, 535}, ids[2] = {897, 93};
    CHECK(k3_engine_load(NANO, NULL, &e, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_multistep_new(e, 2, &ms, &err) == K3_OK, "%s", err.msg);
    for (int i = 0; i < 2; i++) {
        CHECK(k3_session_new(e, 0, &g[i], &err) == K3_OK &&
              k3_session_new(e, 0, &t[i], &err) == K3_OK, "%s", err.msg);
        CHECK(k3_session_prefill(g[i], pre, (size_t)(2 + 3 * i), NULL, NULL, &err) == K3_OK &&
              k3_session_prefill(t[i], pre, (size_t)(2 + 3 * i), NULL, NULL, &err) == K3_OK,
              "%s", err.msg);
        k3_trace tg = {.user = &sg[i], .on_vector = saw_vector, .on_routing = saw_routing,
                       .on_step = saw_step};
        k3_trace tt = tg;
        tt.user = &st[i];
        k3_session_set_trace(g[i], &tg);
        k3_session_set_trace(t[i], &tt);
    }
    for (int step = 0; step < 2; step++) {
        CHECK(k3_sessions_step(ms, g, ids, 2, NULL, NULL, &err) == K3_OK, "%s", err.msg);
        for (int i = 0; i < 2; i++)
            CHECK(k3_session_step(t[i], ids[i], NULL, &err) == K3_OK, "%s", err.msg);
        ids[0] = 5 + step, ids[1] = 700 + step;
    }
    for (int i = 0; i < 2; i++) {
        CHECK(st[i].steps == 2 && st[i].routings == 2 * 8 && st[i].vectors > 0, "alone: %d "
              "steps, %d routings", st[i].steps, st[i].routings);
        CHECK(sg[i].h == st[i].h && sg[i].vectors == st[i].vectors &&
              sg[i].routings == st[i].routings && sg[i].steps == st[i].steps, "session %d: "
              "%d vectors, %d routings, %d steps traced in the pass; %d, %d, %d alone%s", i,
              sg[i].vectors, sg[i].routings, sg[i].steps, st[i].vectors, st[i].routings,
              st[i].steps, sg[i].h == st[i].h ? "" : " (and other values)");
        k3_session_free(g[i]);
        k3_session_free(t[i]);
    }
    k3_multistep_free(ms);
    k3_engine_free(e);
}

/* k3-wide (real widths; `make test-wide`): 6 sessions at positions 1..6, two greedy passes,
 * every row's logits and the states bit-identical to stepping alone. Six rows take the tiled
 * BF16 product and the MoE runs most of each layer's 32 experts over several rows, where the
 * single step takes the matrix-vector kernels. */
static void test_wide_six_sessions(void) {
    const char *model;
    if (!ph_wide(&model, NULL)) return;
    enum { W = 6 };
    k3_engine *e = NULL;
    k3_multistep *ms = NULL;
    k3_session *g[W] = {0}, *t[W] = {0};
    k3_err err = {0};
    CHECK(k3_engine_load(model, NULL, &e, &err) == K3_OK, "%s", err.msg);
    size_t V = (size_t)k3_engine_config(e)->vocab_size;
    float *multi = malloc(W * V * sizeof *multi), *alone = malloc(V * sizeof *alone);
    CHECK(k3_multistep_new(e, W, &ms, &err) == K3_OK, "%s", err.msg);
    printf("        (k3-wide: a multistep of 8 rows plans %.1f MB)\n",
           (double)k3_multistep_plan_bytes(e, 8) / 1e6);
    int32_t prompt[W] = {11, 503, 77, 2047, 9, 1234}, ids[W];
    for (int i = 0; i < W; i++) {
        CHECK(k3_session_new(e, 16, &g[i], &err) == K3_OK &&
              k3_session_new(e, 16, &t[i], &err) == K3_OK, "%s", err.msg);
        CHECK(k3_session_prefill(g[i], prompt, (size_t)i + 1, NULL, NULL, &err) == K3_OK &&
              k3_session_prefill(t[i], prompt, (size_t)i + 1, NULL, NULL, &err) == K3_OK, "%s",
              err.msg);
        ids[i] = prompt[(i + 3) % W];
    }
    for (int step = 0; step < 2; step++) {
        CHECK(k3_sessions_step(ms, g, ids, W, multi, NULL, &err) == K3_OK, "%s", err.msg);
        for (int i = 0; i < W; i++) {
            CHECK(k3_session_step(t[i], ids[i], alone, &err) == K3_OK, "%s", err.msg);
            CHECK(memcmp(multi + i * V, alone, V * sizeof *alone) == 0, "step %d session %d: "
                  "the multistep logits differ from stepping it alone", step, i);
            ids[i] = argmax(alone, (int)V);
        }
    }
    for (int i = 0; i < W; i++) {
        CHECK(same_state(g[i], t[i]), "session %d: the state differs from alone", i);
        k3_session_free(g[i]);
        k3_session_free(t[i]);
    }
    k3_multistep_free(ms);
    k3_engine_free(e);
    free(multi), free(alone);
}

/* k3-lab bench-batch on k3-nano: a table row per N and way, the ids identical both ways, the
 * usage error for a bad --sessions. */
static void test_lab_bench_batch(void) {
    k3t_cli r;
    if (k3t_lab_run("bench-batch " NANO " --sessions 1,3 --tokens 2 --threads 1", &r)) return;
    CHECK(r.status == 0, "exit %d: %s", r.status, r.err);
    CHECK(strstr(r.out, "generated ids: identical both ways for every N"), "%s", r.out);
    CHECK(strstr(r.out, "| 1 | one after another |") && strstr(r.out, "| 1 | together |") &&
          strstr(r.out, "| 3 | one after another |") && strstr(r.out, "| 3 | together |"), "%s",
          r.out);
    k3t_cli_free(&r);
    if (k3t_lab_run("bench-batch " NANO " --sessions 0", &r)) return;
    CHECK(r.status == 2 && strstr(r.err, "--sessions"), "exit %d: %s", r.status, r.err);
    k3t_cli_free(&r);
}

const k3_test k3_suite_multistep[] = {
    {"nano_greedy_1_to_5_sessions_bit_identical", test_nano_greedy},
    {"kjv_greedy_1_to_5_sessions_bit_identical", test_kjv_greedy},
    {"nano_prefill_chunk_beside_decode_rows", test_nano_prefill_beside_decode},
    {"nano_segment_fails_alone", test_nano_segment_fails_alone},
    {"kjv_rewindable_segments_beside_decode", test_kjv_rewindable_segments},
    {"nano_expert_read_once_per_pass", test_nano_expert_reads_once},
    {"nano_nonfinite_row_fails_alone", test_nano_nonfinite_row_fails_alone},
    {"nano_traces_per_session", test_nano_traces_per_session},
    {"lab_bench_batch", test_lab_bench_batch},
    {"wide_six_sessions_bit_identical", test_wide_six_sessions},
    {0},
};
