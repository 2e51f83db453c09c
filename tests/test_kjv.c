/* test_kjv.c — the engine against k3-tiny-kjv's reference outputs (tests/fixtures/k3-tiny-kjv,
 * formats: tests/fixtures/README.md): logits at every position of the four held-out-verse
 * prompts, routing (top-2 of 16 in MoE layers 1-5), the 24-token greedy continuations, the
 * per-layer trace and cached decode vs full prefill, each on every kernel path this CPU runs,
 * and the chunked prefill bit-identical to token by token; greedy speculative decoding on
 * held-out verse openings identical to plain decoding, with its acceptance gated (real text).
 *
 * This model is TRAINED (KJV), so its logits are about 8x larger than k3-nano's random ones and
 * the float32 noise between the two references is 1.3e-5 on logits (manifest cross_check);
 * the tolerances are still the manifest's recommended ones (1e-4 logits and trace, 1e-5 expert
 * weights), and argmax, greedy tokens and expert ids are exact (margins >= 0.025 and 2.0e-4). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cli/gen.h"
#include "../src/engine/k3.h"
#include "../src/engine/spec.h"
#include "../src/tok/tokenizer.h"
#include "batch_check.h"
#include "fixture_check.h"
#include "test.h"

#define KJV "tests/fixtures/k3-tiny-kjv"
#define KJV_REF KJV "/reference"

static const fixture_tol kjv_tol = {1e-4, 1e-4, 1e-5, 1e-4};
/* Greedy --spec 4 on the held-out prompts below, 4 x 128 ids (measured 2026-12-01,
 * BENCHMARKS.md): 2.436 drafts accepted per pass (246 of 397), 0.512 forward passes per
 * token. The gates sit just beyond. */
static const double KJV_SPEC_MIN_PER_PASS = 2.3, KJV_SPEC_MAX_PASSES_PER_TOKEN = 0.55;

static void prompts(void) { fixture_check_prompts(KJV, KJV_REF, &kjv_tol); }
static void trace(void) { fixture_check_trace(KJV, KJV_REF, "trace_len9.json", &kjv_tol); }
static void decode(void) { fixture_check_decode(KJV, KJV_REF, &kjv_tol); }

static void test_prompts(void) { fixture_on_every_path(prompts, 0); }
static void test_trace(void) { fixture_on_every_path(trace, 0); }
static void test_decode(void) { fixture_on_every_path(decode, 0); }

/* 6 layers, AttnRes block 3 (boundary at layer 3), KDA 0,1,3,4 and MLA 2,5: chunk sizes cut the
 * 9-, 33- and 70-token prompts at many positions (1 and 70 also give one pass). */
static void test_chunked(void) {
    static const int chunks[] = {1, 2, 3, 5, 8, 16, 32, 70};
    bc_check_chunked(KJV, KJV_REF, chunks, (int)(sizeof chunks / sizeof chunks[0]), 1e-4, 24);
}

/* ---- speculation on real text ---------------------------------------------------------------- */

/* Held-out verse openings (KJV Philippians-Revelation: not in the training split). */
static const char *const SPEC_PROMPTS[] = {
    "For to me to live is Christ", "And I saw a new heaven and a new earth",
    "Grace be unto you, and peace", "Now faith is the substance of things hoped for"};
enum { SPEC_NEW = 128, SPEC_DRAFTS = 4, KJV_VOCAB = 2048, KJV_BOS = 1792 };

/* [BOS] + the prompt, then SPEC_NEW ids (greedy when temperature is 0) with --spec `spec` (0 =
 * off) and the pays-off rule disabled, so that acceptance is measured on every pass (on this
 * tiny model a pass of 5 ids costs ~4 steps on the CPU, so the rule would soon stop it). */
static int spec_generate(k3_engine *e, const char *prompt, int spec, double temperature,
                         int32_t *ids, k3_spec_stats *st) {
    k3_session *s = NULL;
    k3_sampler sm;
    k3_spec sp = {0};
    k3_err err = {0};
    k3_sampler_opts so = {.temperature = temperature, .top_p = 1, .seed = 7};
    int32_t *p = NULL;
    size_t n = 0;
    float *logits = malloc(KJV_VOCAB * sizeof *logits);
    FILE *null = fopen("/dev/null", "w");
    k3_gen_result r = {0};
    int rc = k3_tokenizer_encode(k3_engine_tokenizer(e), prompt, strlen(prompt), false, &p, &n,
                                 &err);
    int32_t *b = rc ? NULL : realloc(p, (n + 1) * sizeof *p);
    if (b) memmove(b + 1, b, n * sizeof *b), b[0] = KJV_BOS, p = b;
    if (!rc && !b) rc = k3_fail(&err, K3_ERR_GENERIC, "out of memory");
    if (!rc) rc = k3_session_new(e, 0, &s, &err);
    if (!rc) rc = k3_sampler_init(&sm, &so, KJV_VOCAB, &err);
    if (!rc) rc = k3_spec_init(&sp, spec, s, &sm, &err);
    sp.judge = false;
    if (!rc) rc = k3_session_prefill(s, p, n + 1, logits, NULL, &err);
    if (!rc) {
        k3_stops stops = {0};
        k3_gen_opts go = {.tok = k3_engine_tokenizer(e), .max_new = SPEC_NEW, .print_ids = true,
                          .out = null, .spec = spec ? &sp : NULL};
        rc = k3_cli_generate(s, &sm, &stops, logits, NULL, &go, &r, &err);
        if (!rc && r.n != SPEC_NEW) rc = k3_fail(&err, K3_ERR_GENERIC, "%zu ids generated", r.n);
        if (!rc) memcpy(ids, r.ids, SPEC_NEW * sizeof *ids);
        k3_sampler_free(&sm);
    }
    *st = sp.st;
    if (rc) k3_test_fail(__FILE__, __LINE__, "'%s': %s", prompt, err.msg);
    free(r.ids);
    k3_spec_free(&sp);
    k3_session_free(s);
    fclose(null);
    free(logits);
    free(p);
    return !rc;
}

/* Greedy --spec 4 gives the ids of plain greedy decoding on every prompt, and accepts as many
 * drafts as measured (gates above). Sampled runs (temperature 0.8, speculative sampling) are
 * measured beside it (printed with K3_TEST_VERBOSE: 0.27 drafts per pass) but not gated. */
static void test_spec_real_text(void) {
    k3_engine *e = NULL;
    k3_err err = {0};
    unsetenv("K3_MMAP_EXPERTS");
    CHECK(k3_engine_load(KJV, NULL, &e, &err) == K3_OK, "%s", err.msg);
    static int32_t base[SPEC_NEW], run[SPEC_NEW];
    k3_spec_stats st, g = {0}, smp = {0};
    int n = (int)(sizeof SPEC_PROMPTS / sizeof SPEC_PROMPTS[0]);
    for (int i = 0; i < n && !k3_test_stopped(); i++) {
        if (!spec_generate(e, SPEC_PROMPTS[i], 0, 0, base, &st) ||
            !spec_generate(e, SPEC_PROMPTS[i], SPEC_DRAFTS, 0, run, &st))
            break;
        int diff = -1;
        for (int j = 0; j < SPEC_NEW && diff < 0; j++)
            if (base[j] != run[j]) diff = j;
        if (diff >= 0) {
            k3_test_fail(__FILE__, __LINE__, "'%s': id %d is %d with --spec, %d without",
                         SPEC_PROMPTS[i], diff, run[diff], base[diff]);
            break;
        }
        if (getenv("K3_TEST_VERBOSE"))
            printf("  greedy '%s': %ld passes, %ld steps, %ld/%ld drafts accepted\n",
                   SPEC_PROMPTS[i], st.passes, st.steps, st.accepted, st.proposed);
        g.passes += st.passes, g.steps += st.steps, g.proposed += st.proposed;
        g.accepted += st.accepted;
        if (!spec_generate(e, SPEC_PROMPTS[i], SPEC_DRAFTS, 0.8, run, &st)) break;
        if (getenv("K3_TEST_VERBOSE"))
            printf("  T=0.8  '%s': %ld passes, %ld steps, %ld/%ld drafts accepted\n",
                   SPEC_PROMPTS[i], st.passes, st.steps, st.accepted, st.proposed);
        smp.passes += st.passes, smp.steps += st.steps, smp.proposed += st.proposed;
        smp.accepted += st.accepted;
    }
    k3_engine_free(e);
    if (k3_test_stopped()) return;
    double per_pass = (double)g.accepted / (double)g.passes;
    double passes_per_token = (double)(g.passes + g.steps) / (n * SPEC_NEW);
    if (getenv("K3_TEST_VERBOSE"))
        printf("  greedy: %.3f drafts accepted per pass (%ld/%ld), %.3f passes per token; "
               "T=0.8: %.3f per pass (%ld/%ld), %.3f passes per token\n", per_pass, g.accepted,
               g.proposed, passes_per_token, (double)smp.accepted / (double)smp.passes,
               smp.accepted, smp.proposed, (double)(smp.passes + smp.steps) / (n * SPEC_NEW));
    CHECK(g.passes > 0 && per_pass >= KJV_SPEC_MIN_PER_PASS, "greedy: %.3f drafts accepted per "
          "pass, gate %.2f", per_pass, KJV_SPEC_MIN_PER_PASS);
    CHECK(passes_per_token <= KJV_SPEC_MAX_PASSES_PER_TOKEN, "greedy: %.3f passes per token, "
          "gate %.2f", passes_per_token, KJV_SPEC_MAX_PASSES_PER_TOKEN);
}

const k3_test k3_suite_kjv[] = {
    {"kjv_trace_every_path", test_trace},
    {"kjv_prompts_logits_routing_greedy_every_path", test_prompts},
    {"kjv_decode_vs_prefill_every_path", test_decode},
    {"kjv_chunked_prefill_bit_identical", test_chunked},
    {"kjv_spec_greedy_identical_real_text", test_spec_real_text},
    {0},
};
