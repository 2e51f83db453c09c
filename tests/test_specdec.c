/* test_specdec.c — speculative decoding with exact rollback (issue 10) on k3-nano:
 *  - rewinding a pass to k of its n ids leaves a state file (ids, KDA state, conv windows, the
 *    used MLA cache) byte-identical to feeding the k ids alone, for every k and several n, at
 *    positions whose passes cross chunk ends; the next step's logits match bit for bit;
 *  - greedy generation with --spec N equals generation without it, id for id and logit row for
 *    logit row, over long generations (600 ids) from repetitive prompts, with drafts accepted,
 *    partial accepts and accepts at several draft positions; also when the generation ends
 *    inside a pass (a stop id, --max-new, a full context);
 *  - with sampling, a seeded run with --spec is id for id the run without it (1000 seeds),
 *    while drafts are accepted and rejected often.
 * k3-nano mixes KDA (layers 0-2, 4-6) and MLA (3, 7, 8) with AttnRes block boundaries at
 * layers 4 and 8, so every pass and every rewind goes through both mixers and both boundaries.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/cli/gen.h"
#include "../src/engine/k3.h"
#include "../src/engine/spec.h"
#include "batch_check.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"
#define NANO_REF NANO "/reference"

static k3_engine *load(void) {
    k3_engine *e = NULL;
    k3_err err = {0};
    unsetenv("K3_MMAP_EXPERTS");
    CHECK_OR(NULL, k3_engine_load(NANO, NULL, &e, &err) == K3_OK, "%s", err.msg);
    return e;
}

/* ---- rewind -------------------------------------------------------------------------------- */

/* Session after prefilling ids[0, n0) in chunks of 5 (so later passes start mid-chunk). */
static k3_session *prefilled(k3_engine *e, const int32_t *ids, int n0) {
    k3_session *s = NULL;
    k3_err err = {0};
    CHECK_OR(NULL, k3_session_new(e, 128, &s, &err) == K3_OK, "%s", err.msg);
    k3_session_set_chunk(s, 5);
    if (k3_session_prefill(s, ids, (size_t)n0, NULL, NULL, &err)) {
        k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
        k3_session_free(s);
        return NULL;
    }
    return s;
}

static void test_rewind_bit_identical(void) {
    bc_prompt p;
    if (!bc_prompt_load(NANO_REF, "prompt_len70.json", &p)) return;
    k3_engine *e = load();
    k3_err err = {0};
    size_t V = (size_t)p.vocab;
    float *la = malloc(V * 4), *lb = malloc(V * 4), *rows = malloc(9 * V * 4);
    char pa[256], pb[256];
    bc_tmp_path(pa, sizeof pa, "rewound");
    bc_tmp_path(pb, sizeof pb, "alone");
    static const int starts[] = {23, 41}, sizes[] = {2, 5, 9};
    for (int si = 0; e && si < 2 && !k3_test_stopped(); si++) {
        int n0 = starts[si];
        for (int zi = 0; zi < 3 && !k3_test_stopped(); zi++) {
            int n = sizes[zi];
            for (int k = 1; k <= n && !k3_test_stopped(); k++) {
                k3_session *a = prefilled(e, p.ids, n0), *b = prefilled(e, p.ids, n0);
                if (!a || !b) {
                    k3_session_free(a), k3_session_free(b);
                    break;
                }
                int ok = k3_session_forward(a, p.ids + n0, n, rows,
                                            K3_FWD_ALL_LOGITS | K3_FWD_REWINDABLE, &err) == K3_OK
                         && k3_session_rewind(a, n0 + k, &err) == K3_OK;
                for (int t = 0; ok && t < k; t++)
                    ok = k3_session_step(b, p.ids[n0 + t], NULL, &err) == K3_OK;
                ok = ok && k3_session_save(a, pa, &err) == K3_OK &&
                     k3_session_save(b, pb, &err) == K3_OK;
                if (!ok) k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
                else if (k3_session_pos(a) != n0 + k || !bc_same_file(pa, pb))
                    k3_test_fail(__FILE__, __LINE__, "accept %d of %d after %d ids: the state "
                                 "(KDA, conv windows, MLA cache, ids) differs from feeding the "
                                 "%d ids alone", k, n, n0, k);
                else if (k3_session_step(a, 77, la, &err) || k3_session_step(b, 77, lb, &err) ||
                         memcmp(la, lb, V * 4))
                    k3_test_fail(__FILE__, __LINE__, "accept %d of %d after %d ids: the next "
                                 "step differs %s", k, n, n0, err.msg);
                k3_session_free(a);
                k3_session_free(b);
            }
        }
    }
    /* Only the last rewindable pass, and only before anything else is fed, can be undone. */
    k3_session *a = e && !k3_test_stopped() ? prefilled(e, p.ids, 10) : NULL;
    if (a) {
        CHECK(k3_session_forward(a, p.ids + 10, 4, NULL, 0, &err) == K3_OK, "%s", err.msg);
        CHECK(k3_session_rewind(a, 12, &err) == K3_ERR_INPUT, "rewound a plain pass");
        CHECK(k3_session_forward(a, p.ids + 14, 4, rows, K3_FWD_ALL_LOGITS | K3_FWD_REWINDABLE,
                                 &err) == K3_OK, "%s", err.msg);
        CHECK(k3_session_rewind(a, 13, &err) == K3_ERR_INPUT, "rewound before the pass");
        CHECK(k3_session_rewind(a, 18, &err) == K3_OK, "rewinding to the end is a no-op");
        CHECK(k3_session_step(a, 5, NULL, &err) == K3_OK, "%s", err.msg);
        CHECK(k3_session_rewind(a, 16, &err) == K3_ERR_INPUT, "rewound after a later step");
        k3_session_free(a);
    }
    unlink(pa), unlink(pb);
    free(la), free(lb), free(rows);
    k3_engine_free(e);
    bc_prompt_free(&p);
}

/* ---- greedy generation with and without --spec ---------------------------------------------- */

typedef struct gen_run {
    int32_t ids[1024];
    int n, n_sampled;
    enum k3_gen_end end;
    uint64_t logit_hash; /* FNV-1a over every on_logits row */
    long rows;
    k3_spec_stats st;
    char why[160];
} gen_run;

static int hash_rows(void *user, const float *logits, k3_err *err) {
    (void)err;
    gen_run *g = user;
    const unsigned char *b = (const unsigned char *)logits;
    for (size_t i = 0; i < 2048 * sizeof(float); i++) g->logit_hash = (g->logit_hash ^ b[i]) * 1099511628211ull;
    g->rows++;
    return K3_OK;
}

/* Prompt (a repeated pattern), then greedy generation of max_new ids with --spec `spec` (0 =
 * off) in a context of ctx positions, ending at `stop` too when >= 0. */
static int generate(k3_engine *e, const int32_t *prompt, int n_prompt, int max_new, int spec,
                    int ctx, int32_t stop, double temperature, gen_run *out) {
    k3_session *s = NULL;
    k3_sampler sm;
    k3_spec sp = {0};
    k3_err err = {0};
    k3_sampler_opts so = {.temperature = temperature, .top_p = 1, .seed = 7};
    memset(out, 0, sizeof *out);
    out->logit_hash = 1469598103934665603ull;
    float *logits = malloc(2048 * sizeof *logits);
    FILE *null = fopen("/dev/null", "w");
    int rc = k3_session_new(e, ctx, &s, &err);
    if (!rc) rc = k3_sampler_init(&sm, &so, 2048, &err);
    if (!rc) rc = k3_spec_init(&sp, spec, s, &sm, &err);
    sp.judge = false; /* a random-weight model accepts little: keep verifying */
    if (!rc) rc = k3_session_prefill(s, prompt, (size_t)n_prompt, logits, NULL, &err);
    if (!rc) {
        k3_stops stops = {.n = stop >= 0};
        stops.ids[0] = stop;
        k3_gen_opts go = {.tok = k3_engine_tokenizer(e), .max_new = max_new, .print_ids = true,
                          .out = null, .on_logits = hash_rows, .user = out,
                          .spec = spec ? &sp : NULL};
        k3_gen_result r;
        rc = k3_cli_generate(s, &sm, &stops, logits, NULL, &go, &r, &err);
        if (!rc) {
            out->n = (int)r.n < 1024 ? (int)r.n : 1024;
            memcpy(out->ids, r.ids, (size_t)out->n * sizeof *r.ids);
            out->n_sampled = r.n_sampled;
            out->end = r.end;
        }
        free(r.ids);
        k3_sampler_free(&sm);
    }
    out->st = sp.st;
    snprintf(out->why, sizeof out->why, "%s", sp.why);
    if (rc) k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
    k3_spec_free(&sp);
    k3_session_free(s);
    fclose(null);
    free(logits);
    return !rc;
}

static int same_run(const gen_run *a, const gen_run *b, const char *what) {
    CHECK_OR(0, a->n_sampled == b->n_sampled && a->n == b->n && a->end == b->end, "%s: %d vs %d "
             "ids sampled, end %d vs %d", what, b->n_sampled, a->n_sampled, b->end, a->end);
    for (int i = 0; i < a->n; i++)
        CHECK_OR(0, a->ids[i] == b->ids[i], "%s: id %d is %d with --spec, %d without", what, i,
                 b->ids[i], a->ids[i]);
    CHECK_OR(0, a->rows == b->rows && a->logit_hash == b->logit_hash, "%s: the logits after "
             "each fed id differ (%ld vs %ld rows)", what, b->rows, a->rows);
    return 1;
}

/* n copies of pattern[0, len) */
static int repeat(int32_t *out, const int32_t *pattern, int len, int n) {
    for (int i = 0; i < n * len; i++) out[i] = pattern[i % len];
    return n * len;
}

/* Patterns and --spec values of the long test: all in the plain build, one of each under the
 * sanitizers (make asan), where 600-id generations are ~50x slower. */
#if defined(__SANITIZE_ADDRESS__)
#define L_PATTERNS 1
#define L_SPECS 1
#else
#define L_PATTERNS 3
#define L_SPECS 3
#endif

static void test_greedy_identical_long(void) {
    k3_engine *e = load();
    if (!e) return;
    static const int32_t pat_a[] = {5, 17, 33, 2, 900, 17, 44, 61};
    static const int32_t pat_b[] = {700, 701, 702, 703, 700, 701};
    static const int32_t pat_c[] = {1792, 100, 200, 300, 1797};
    const int32_t *pats[] = {pat_a, pat_b, pat_c};
    const int lens[] = {8, 6, 5};
    static const int specs[] = {1, 3, 6};
    int32_t prompt[128];
    gen_run *base = malloc(sizeof *base), *run = malloc(sizeof *run);
    k3_spec_stats total = {0};
    for (int pi = 0; pi < L_PATTERNS && !k3_test_stopped(); pi++) {
        int n = repeat(prompt, pats[pi], lens[pi], 80 / lens[pi]);
        if (!generate(e, prompt, n, 600, 0, 0, -1, 0, base)) break;
        for (int si = L_SPECS == 1; si < 3 && si < (L_SPECS == 1) + L_SPECS && !k3_test_stopped();
             si++) {
            char what[64];
            snprintf(what, sizeof what, "pattern %d, --spec %d", pi, specs[si]);
            if (!generate(e, prompt, n, 600, specs[si], 0, -1, 0, run) ||
                !same_run(base, run, what))
                break;
            CHECK(run->st.passes > 0 && run->st.proposed > 0, "%s: no verification pass", what);
            total.passes += run->st.passes, total.accepted += run->st.accepted;
            total.partial += run->st.partial;
            for (int i = 0; i < 8; i++) total.accepted_at[i] += run->st.accepted_at[i];
        }
    }
    if (!k3_test_stopped()) {
        CHECK(total.accepted > 0 && total.partial > 0, "accepted %ld drafts, %ld partial passes",
              total.accepted, total.partial);
        int positions = 0;
        for (int i = 0; i < 8; i++) positions += total.accepted_at[i] > 0;
        CHECK(positions >= (L_SPECS == 1 ? 2 : 3), "drafts accepted at only %d positions of a "
              "pass", positions);
    }
    free(base), free(run);
    k3_engine_free(e);
}

/* Generations that end inside a verification pass: at a stop id the model produces, at
 * --max-new, and when the context fills. */
static void test_greedy_identical_endings(void) {
    k3_engine *e = load();
    if (!e) return;
    static const int32_t pat[] = {5, 17, 33, 2, 900, 17, 44, 61};
    int32_t prompt[128];
    int n = repeat(prompt, pat, 8, 8);
    gen_run *base = malloc(sizeof *base), *run = malloc(sizeof *run);
    if (generate(e, prompt, n, 300, 0, 0, -1, 0, base)) {
        int32_t stop = base->ids[base->n / 2]; /* an id the model generates: it ends there */
        static const int max_news[] = {1, 2, 7, 31, 117};
        for (int i = 0; i < 5 && !k3_test_stopped(); i++) {
            char what[64];
            snprintf(what, sizeof what, "--max-new %d", max_news[i]);
            if (generate(e, prompt, n, max_news[i], 0, 0, -1, 0, base) &&
                generate(e, prompt, n, max_news[i], 4, 0, -1, 0, run))
                same_run(base, run, what);
        }
        if (!k3_test_stopped() && generate(e, prompt, n, 300, 0, 0, stop, 0, base) &&
            generate(e, prompt, n, 300, 5, 0, stop, 0, run) && same_run(base, run, "stop id"))
            CHECK(run->end == K3_GEN_STOP, "did not end at the stop id");
        if (!k3_test_stopped() && generate(e, prompt, n, 300, 0, n + 90, -1, 0, base) &&
            generate(e, prompt, n, 300, 5, n + 90, -1, 0, run) &&
            same_run(base, run, "full context"))
            CHECK(run->end == K3_GEN_CONTEXT, "end %d, expected a full context", run->end);
    }
    free(base), free(run);
    k3_engine_free(e);
}

/* ---- sampling: a seed gives the same ids with and without --spec ------------------------- */

#define S_NEW 6
#define S_VOCAB 2048
/* Under the sanitizers (make asan, ~50x slower here) fewer runs: they look for memory errors. */
#if defined(__SANITIZE_ADDRESS__)
#define S_RUNS 60
#else
#define S_RUNS 1000
#endif

/* The S_NEW ids of each of S_RUNS seeded runs (seeds 1..S_RUNS) at temperature 1, top-k 2,
 * from prompt[n], into ids[run - 1]; --spec `spec` (0 = off); st sums the runs' statistics. */
static int sample_runs(k3_engine *e, const int32_t *prompt, int n, int spec,
                       int32_t (*ids)[S_NEW], k3_spec_stats *st) {
    k3_session *s = NULL;
    k3_err err = {0};
    float *logits = malloc(S_VOCAB * sizeof *logits);
    FILE *null = fopen("/dev/null", "w");
    int rc = k3_session_new(e, 64, &s, &err);
    memset(st, 0, sizeof *st);
    for (int run = 1; run <= S_RUNS && !rc; run++) {
        k3_sampler sm;
        k3_spec sp = {0};
        k3_sampler_opts so = {.temperature = 1, .top_k = 2, .top_p = 1, .seed = (uint64_t)run};
        k3_stops stops = {0};
        k3_gen_result r = {0};
        rc = k3_sampler_init(&sm, &so, S_VOCAB, &err);
        if (!rc) rc = k3_spec_init(&sp, spec, s, &sm, &err);
        sp.judge = false;
        if (!rc) rc = k3_session_prefill(s, prompt, (size_t)n, logits, NULL, &err);
        if (!rc) {
            k3_gen_opts go = {.tok = k3_engine_tokenizer(e), .max_new = S_NEW, .print_ids = true,
                              .out = null, .spec = spec ? &sp : NULL};
            rc = k3_cli_generate(s, &sm, &stops, logits, NULL, &go, &r, &err);
        }
        for (int i = 0; i < S_NEW; i++) ids[run - 1][i] = !rc && i < (int)r.n ? r.ids[i] : -1;
        st->passes += sp.st.passes, st->proposed += sp.st.proposed;
        st->accepted += sp.st.accepted;
        free(r.ids);
        k3_spec_free(&sp);
        k3_sampler_free(&sm);
        k3_session_reset(s);
    }
    if (rc) k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
    k3_session_free(s);
    fclose(null);
    free(logits);
    return !rc;
}

/* Speculative sampling draws each emitted id with the sampler's PRNG at its own row, as
 * without --spec: over 1000 seeds (top-k 2, temperature 1) every run's ids equal the run
 * without --spec, id for id, while drafts are accepted and rejected often (so each run takes
 * both paths: an accepted draft, and a rejected one whose row's draw is emitted). The old rule
 * (accept with probability p(x), else draw from the residual) kept the distribution but not
 * the ids: it differed in most runs. The prompt is a phrase, the model's greedy continuation
 * of it, and the phrase again, so the drafter proposes that continuation, which sampling then
 * follows often but not always. */
static void test_sampling_seed_identical(void) {
    k3_engine *e = load();
    if (!e) return;
    static const int32_t phrase[] = {300, 1201, 45, 1777, 902, 66};
    int32_t prompt[32];
    gen_run *g = malloc(sizeof *g);
    int n = 0;
    for (int i = 0; i < 6; i++) prompt[n++] = phrase[i];
    if (!generate(e, prompt, n, 8, 0, 0, -1, 0, g)) {
        free(g);
        k3_engine_free(e);
        return;
    }
    for (int i = 0; i < g->n; i++) prompt[n++] = g->ids[i];
    for (int i = 0; i < 6; i++) prompt[n++] = phrase[i];
    free(g);
    int32_t (*a)[S_NEW] = calloc(S_RUNS, sizeof *a), (*b)[S_NEW] = calloc(S_RUNS, sizeof *b);
    k3_spec_stats sa, sb;
    if (sample_runs(e, prompt, n, 0, a, &sa) && sample_runs(e, prompt, n, 4, b, &sb)) {
        CHECK(sb.passes > S_RUNS / 4 && sb.accepted > S_RUNS / 4 &&
              sb.proposed - sb.accepted > S_RUNS / 4, "speculation barely exercised: %ld "
              "passes, %ld of %ld drafts accepted", sb.passes, sb.accepted, sb.proposed);
        int differ = 0, first = -1, distinct = 0;
        for (int r = 0; r < S_RUNS; r++) {
            bool same = !memcmp(a[r], b[r], sizeof a[r]);
            differ += !same;
            if (!same && first < 0) first = r;
            distinct += r > 0 && memcmp(a[r], a[0], sizeof a[r]) != 0;
        }
        CHECK(differ == 0, "%d of %d seeded runs differ with --spec 4 (first: seed %d)", differ,
              S_RUNS, first + 1);
        CHECK(distinct > S_RUNS / 4, "the seeds barely change the ids (%d of %d differ from "
              "seed 1's): the runs sample nothing", distinct, S_RUNS);
    }
    free(a), free(b);
    k3_engine_free(e);
}

const k3_test k3_suite_specdec[] = {
    {"nano_rewind_bit_identical", test_rewind_bit_identical},
    {"nano_greedy_identical_long_repetitive", test_greedy_identical_long},
    {"nano_greedy_identical_endings", test_greedy_identical_endings},
    {"nano_sampling_seed_identical", test_sampling_seed_identical},
    {0},
};
