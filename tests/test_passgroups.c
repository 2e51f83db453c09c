/* test_passgroups.c — a pass runs every step but the routed experts over row groups of
 * K3_BATCH_GROUP rows (src/model/batch.h), so its scratch per id is what must live across a
 * layer: the rows' partial sums and AttnRes blocks, the FFN input and the routed experts'
 * inputs and per-slot outputs.
 *
 *  - The scratch per id at K3's widths (config from the spec: hidden 7,168, 93 layers in
 *    AttnRes blocks of 4, 896 experts, top-16, latent 3,584) stays within that floor counted
 *    here from the widths, not from the layout; the old layout (every intermediate of every
 *    row, 2.91 MB per id) exceeds it 2.9x. The plan's formula counts a pass exactly.
 *  - On k3-nano a pass of 600 ids (three groups) gives every position's logits and the state
 *    bit for bit as feeding the ids one by one, rewinds to a position in its second group
 *    exactly, and a two-session pass whose second segment straddles a group boundary gives
 *    each session what it gets alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/engine/k3.h"
#include "../src/model/batch.h"
#include "../src/model/model.h"
#include "batch_check.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"
enum { N = 600, VOCAB = 2048 };

/* K3's widths (shared/spec/K3-SPEC.md §1.1, §1.2). f_a_proj's rank is not in the config; it
 * sizes only a group's buffers, never a row of the pass. */
static k3_model k3_widths(void) {
    k3_model m;
    memset(&m, 0, sizeof m);
    k3_config *c = &m.cfg;
    c->hidden_size = 7168, c->num_hidden_layers = 93, c->attn_res_block_size = 4;
    c->kda_num_heads = 96, c->kda_head_dim = 128, m.kda_rank = 128;
    c->num_attention_heads = 96, c->qk_nope_head_dim = 128, c->qk_rope_head_dim = 64;
    c->v_head_dim = 128, c->q_lora_rank = 1536, c->kv_lora_rank = 512;
    c->num_experts = 896, c->num_experts_per_token = 16, c->routed_expert_hidden_size = 3584;
    c->intermediate_size = 33792, c->moe_intermediate_size = 3072, c->num_shared_experts = 2;
    return m;
}

static void test_k3_row_bytes_at_floor(void) {
    k3_model m = k3_widths();
    size_t hd = 7168, blocks = (93 + 3) / 4 + 1, K = 16, lat = 3584;
    /* what must live across a layer, per id: P and the AttnRes blocks, the FFN input (the
     * shared experts run after the routed ones), the routed experts' input and K outputs; the
     * router's choice (ids, weights) and the union's member lists; the row's segment, position */
    size_t floor = 4 * (hd * (1 + blocks + 1) + lat * (1 + K) + 2 * K + 2 * K + 3);
    size_t row = k3_prefill_row_bytes(&m);
    CHECK(row <= floor, "%zu bytes per id of a prompt pass at K3's widths; the floor is %zu",
          row, floor);
    CHECK(row * 2 > floor, "%zu bytes per id: less than the partial sums and blocks", row);
    /* the plan's formula: a pass of R >= group rows takes exactly
     * bytes(32) + group part + (R - 32) x row */
    int G = k3_prefill_group_rows(), mb = (int)blocks;
    size_t base = k3_batch_plan_bytes(&m, mb, 32), grp = k3_prefill_group_bytes(&m, 32);
    static const int Rs[] = {256, 257, 1000, 6589, 16384};
    for (int i = 0; i < 5; i++) {
        size_t want = base + grp + (size_t)(Rs[i] - 32) * row;
        CHECK(Rs[i] < G || k3_batch_plan_bytes(&m, mb, Rs[i]) == want, "R = %d: %zu bytes, the "
              "plan counts %zu", Rs[i], k3_batch_plan_bytes(&m, mb, Rs[i]), want);
    }
    printf("passgroups: %.3f MB per id at K3's widths (floor %.3f MB), %.3f GB for %d-row "
           "groups\n", (double)row / 1e6, (double)floor / 1e6, (double)grp / 1e9, G);
}

static int32_t id_at(int i) { return (int32_t)((i * 7919u + 11u) % VOCAB); }

static k3_session *fresh(k3_engine *e) {
    k3_session *s = NULL;
    k3_err err = {0};
    CHECK_OR(NULL, k3_session_new(e, N + 16, &s, &err) == K3_OK, "%s", err.msg);
    return s;
}

/* Whether a and b hold the same state (their state files byte for byte). */
static int same_state(k3_session *a, k3_session *b) {
    char pa[256], pb[256];
    k3_err err = {0};
    bc_tmp_path(pa, sizeof pa, "groups-a");
    bc_tmp_path(pb, sizeof pb, "groups-b");
    int ok = k3_session_save(a, pa, &err) == K3_OK && k3_session_save(b, pb, &err) == K3_OK &&
             bc_same_file(pa, pb);
    unlink(pa), unlink(pb);
    return ok;
}

static void test_nano_pass_over_groups(void) {
    k3_engine *e = NULL;
    k3_err err = {0};
    CHECK_OR(, k3_engine_load(NANO, NULL, &e, &err) == K3_OK, "%s", err.msg);
    CHECK(N > 2 * k3_prefill_group_rows(), "the pass should span three groups");
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = id_at(i);
    float *rows = malloc((size_t)N * VOCAB * 4), *one = malloc(VOCAB * 4);
    k3_session *a = fresh(e), *b = fresh(e);
    int ok = a && b && rows && one &&
             k3_session_forward(a, ids, N, rows, K3_FWD_ALL_LOGITS | K3_FWD_REWINDABLE,
                                &err) == K3_OK;
    int bad = -1;
    for (int t = 0; ok && t < N; t++) {
        ok = k3_session_step(b, ids[t], one, &err) == K3_OK;
        if (ok && bad < 0 && memcmp(one, rows + (size_t)t * VOCAB, VOCAB * 4)) bad = t;
    }
    CHECK(ok, "%s", err.msg);
    CHECK(bad < 0, "the logits of position %d differ from token by token", bad);
    CHECK(ok && same_state(a, b), "the state after a %d-id pass differs from token by token", N);
    k3_session_free(b);
    /* rewind into the second group: the state of the first 300 ids alone */
    b = fresh(e);
    ok = ok && b && k3_session_rewind(a, 300, &err) == K3_OK;
    for (int t = 0; ok && t < 300; t++) ok = k3_session_step(b, ids[t], NULL, &err) == K3_OK;
    CHECK(ok, "%s", err.msg);
    CHECK(ok && same_state(a, b), "rewound to 300 of a %d-id pass: the state differs", N);
    k3_session_free(a), k3_session_free(b);

    /* two sessions in one pass: rows 0..199 and 200..549 (the group boundary at 256 inside
     * the second), each with all its logits, against each stepped alone */
    k3_multistep *ms = NULL;
    k3_session *g[2] = {fresh(e), fresh(e)}, *t[2] = {fresh(e), fresh(e)};
    CHECK(k3_multistep_new(e, 550, &ms, &err) == K3_OK, "%s", err.msg);
    k3_multistep_seg seg[2] = {{.session = g[0], .ids = ids, .n_ids = 200,
                                .flags = K3_MS_ALL_LOGITS},
                               {.session = g[1], .ids = ids + 50, .n_ids = 350,
                                .flags = K3_MS_ALL_LOGITS}};
    ok = ms && g[0] && g[1] && t[0] && t[1] && k3_multistep_run(ms, seg, 2, rows, &err) == K3_OK;
    CHECK(ok, "%s", err.msg);
    for (int i = 0; ok && i < 2; i++) {
        bad = -1;
        for (int r = 0; ok && r < seg[i].n_ids; r++) {
            ok = k3_session_step(t[i], seg[i].ids[r], one, &err) == K3_OK;
            if (ok && bad < 0 &&
                memcmp(one, rows + (size_t)(seg[i].logits_row + r) * VOCAB, VOCAB * 4))
                bad = r;
        }
        CHECK(ok, "%s", err.msg);
        CHECK(bad < 0, "session %d: the logits of its row %d differ from stepping alone", i,
              bad);
        CHECK(ok && same_state(g[i], t[i]), "session %d: the state differs from stepping alone",
              i);
    }
    for (int i = 0; i < 2; i++) k3_session_free(g[i]), k3_session_free(t[i]);
    k3_multistep_free(ms);
    free(rows), free(one);
    k3_engine_free(e);
}

const k3_test k3_suite_passgroups[] = {
    {"k3_widths_row_bytes_at_floor", test_k3_row_bytes_at_floor},
    {"nano_pass_over_groups_bit_identical", test_nano_pass_over_groups},
    {0},
};
