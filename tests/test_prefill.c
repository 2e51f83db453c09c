/* test_prefill.c — batched prefill (k3_session_forward / k3_session_prefill in chunks) on
 * k3-nano: bit-identical to token by token, within the fixture tolerance of the reference, and
 * each routed expert read once per chunk. k3-nano's 9 layers put AttnRes block boundaries at
 * layers 4 and 8 and mix KDA (0-2, 4-6) with MLA (3, 7, 8), so every pass crosses both
 * boundaries and both mixers; the chunk sizes cut the 7-, 33- and 70-token prompts at many
 * different positions (1 and 70 also give one pass for the whole prompt). */
#include <stdlib.h>
#include <string.h>

#include "../src/engine/k3.h"
#include "../src/engine/k3_lab.h"
#include "batch_check.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"
#define NANO_REF NANO "/reference"

static void test_chunked_bit_identical(void) {
    static const int chunks[] = {1, 2, 3, 4, 5, 7, 9, 16, 32, 64, 70};
    bc_check_chunked(NANO, NANO_REF, chunks, (int)(sizeof chunks / sizeof chunks[0]), 1e-4,
                     24);
}

/* Runs the 70-token prompt with the store at exactly `slots` cache slots (chunk = 0: token by
 * token, else passes of chunk ids); returns the expert requests and writes the logits after
 * each pass's last id into last [vocab]. */
static int run_store(const bc_prompt *p, int slots, int chunk, float *last, uint64_t *requests) {
    k3_engine_opts o = k3_engine_opts_default();
    o.lab = &(k3_lab_opts){.expert_slots = slots, .gpu_max_layers = -1};
    o.pipe = -1;
    o.experts_in_place = slots ? 0 : 1;
    k3_engine *e = NULL;
    k3_session *s = NULL;
    k3_err err = {0};
    unsetenv("K3_MMAP_EXPERTS");
    unsetenv("K3_EXPERT_GB");
    CHECK_OR(0, k3_engine_load(NANO, &o, &e, &err) == K3_OK, "%s", err.msg);
    int ok = k3_session_new(e, 0, &s, &err) == K3_OK;
    if (ok) k3_session_set_chunk(s, chunk ? chunk : 1);
    if (ok) ok = k3_session_prefill(s, p->ids, (size_t)p->n, last, NULL, &err) == K3_OK;
    k3_run_stats st;
    if (ok) k3_session_stats(s, &st), *requests = st.expert_requests;
    if (!ok) k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
    k3_session_free(s);
    k3_engine_free(e);
    return ok;
}

/* The MoE asks the store for the UNION of a chunk's experts: with a cache of top-k + 1 slots
 * (so a chunk's union passes through the slots in turns) the logits stay bit-identical to
 * experts used in place token by token, and a chunk requests each expert at most once per
 * layer instead of top-k per token. */
static void test_store_union_once_per_chunk(void) {
    bc_prompt p;
    if (!bc_prompt_load(NANO_REF, "prompt_len70.json", &p)) return;
    const int E = 32, K = 4, n_moe = 8; /* k3-nano: 32 experts, top-4, MoE layers 1..8 */
    float *ref = malloc((size_t)p.vocab * 4), *got = malloc((size_t)p.vocab * 4);
    uint64_t req_steps = 0, req_chunk = 0;
    int ok = run_store(&p, 0, 0, ref, &req_steps) && run_store(&p, K + 1, 32, got, &req_chunk);
    if (ok) {
        CHECK(memcmp(ref, got, (size_t)p.vocab * 4) == 0, "logits through the store's union "
              "requests differ from in-place token by token");
        CHECK(req_steps == (uint64_t)p.n * n_moe * K, "token by token: %llu requests",
              (unsigned long long)req_steps);
        int passes = (p.n + 31) / 32; /* 70 ids: passes of 32, 32, 6 */
        CHECK(req_chunk <= (uint64_t)passes * n_moe * E && req_chunk < req_steps / 3,
              "chunked: %llu expert requests (token by token %llu; at most %d per pass)",
              (unsigned long long)req_chunk, (unsigned long long)req_steps, n_moe * E);
    }
    free(ref), free(got);
    bc_prompt_free(&p);
}

/* k3_session_prefill keeps a strict prefix and feeds the rest in chunks: the result equals a
 * fresh chunked prefill, and a pass's limits are enforced. */
static void test_prefill_reuse_and_limits(void) {
    bc_prompt p;
    if (!bc_prompt_load(NANO_REF, "prompt_len33.json", &p)) return;
    k3_engine *e = NULL;
    k3_session *a = NULL, *b = NULL;
    k3_err err = {0};
    float *la = malloc((size_t)p.vocab * 4), *lb = malloc((size_t)p.vocab * 4);
    int reused = -1;
    CHECK(k3_engine_load(NANO, NULL, &e, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_session_new(e, 40, &a, &err) == K3_OK && k3_session_new(e, 40, &b, &err) == K3_OK,
          "%s", err.msg);
    k3_session_set_chunk(a, 4);
    k3_session_set_chunk(b, 32);
    CHECK(k3_session_prefill(a, p.ids, 10, NULL, NULL, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_session_prefill(a, p.ids, (size_t)p.n, la, &reused, &err) == K3_OK, "%s", err.msg);
    CHECK(reused == 10, "reused %d positions, expected 10", reused);
    CHECK(k3_session_prefill(b, p.ids, (size_t)p.n, lb, NULL, &err) == K3_OK, "%s", err.msg);
    CHECK(memcmp(la, lb, (size_t)p.vocab * 4) == 0, "prefill with reuse differs from fresh");
    CHECK(k3_session_pos(a) == p.n, "position %d", k3_session_pos(a));
    /* 33 + 8 > 40: refused before anything is fed; a pass of 0 ids is refused too */
    CHECK(k3_session_forward(a, p.ids, 8, NULL, 0, &err) == K3_ERR_INPUT, "context overflow");
    CHECK(k3_session_forward(a, p.ids, 0, NULL, 0, &err) == K3_ERR_INPUT, "empty pass");
    int32_t bad[2] = {5, 1 << 20};
    CHECK(k3_session_forward(a, bad, 2, NULL, 0, &err) == K3_ERR_INPUT, "id out of range");
    CHECK(k3_session_pos(a) == p.n, "a refused pass moved the position to %d",
          k3_session_pos(a));
    k3_session_free(a);
    k3_session_free(b);
    k3_engine_free(e);
    free(la), free(lb);
    bc_prompt_free(&p);
}

const k3_test k3_suite_prefill[] = {
    {"nano_chunked_bit_identical_all_prompts", test_chunked_bit_identical},
    {"nano_store_union_once_per_chunk", test_store_union_once_per_chunk},
    {"nano_prefill_reuse_and_limits", test_prefill_reuse_and_limits},
    {0},
};
