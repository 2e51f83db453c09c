/* test_expertmajor.c — expert-major prompt processing (issue 31): a prompt fed in the memory
 * plan's prompt passes reads each (layer, expert) pair its routing touches about once, with
 * an expert cache far smaller than those pairs, and gives the logits of passes of 32 ids bit
 * for bit.
 *
 * The model is `k3-lab synth --layers 4 --experts 128 --top-k 4` (MoE layers 1..3: 384
 * routed experts), the prompt 512 pseudo-random ids; the cache holds a tenth of the distinct
 * (layer, expert) pairs the routing touches (counted from the trace's on_routing, an
 * independent record of the router's choices). Passes of 32 ids re-read an expert in every
 * pass that chose it again (the issue measured 8.8x); the plan's pass takes the whole prompt,
 * so each pair is read once (the bound allows 1.25x for prefetch reads). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/engine/k3.h"
#include "../src/engine/k3_lab.h"
#include "cli_run.h"
#include "test.h"

enum { N_IDS = 512, LAYERS = 4, EXPERTS = 128 };

typedef struct routing {
    unsigned char seen[LAYERS][EXPERTS];
    int distinct;
} routing;

static void on_routing(void *user, int pos, int layer, const int *ids, const float *w, int k) {
    routing *r = user;
    (void)pos, (void)w;
    for (int j = 0; j < k; j++)
        if (layer >= 0 && layer < LAYERS && ids[j] >= 0 && ids[j] < EXPERTS &&
            !r->seen[layer][ids[j]]++)
            r->distinct++;
}

/* Prefills ids with `slots` expert cache slots in passes of `chunk` ids (0: the plan's);
 * writes the last logits, the expert reads and (trace) the routing. */
static int prefill(const char *dir, int slots, int chunk, const int32_t *ids, float *logits,
                   uint64_t *reads, int *pass_ids, routing *rt) {
    k3_engine_opts o = k3_engine_opts_default();
    k3_lab_opts lab = k3_lab_opts_default();
    lab.expert_slots = slots;
    o.lab = &lab;
    o.threads = 2;
    k3_engine *e = NULL;
    k3_session *s = NULL;
    k3_err err = {0};
    CHECK_OR(0, k3_engine_load(dir, &o, &e, &err) == K3_OK, "%s", err.msg);
    int ok = k3_session_new(e, N_IDS + 8, &s, &err) == K3_OK;
    if (ok && chunk) k3_session_set_chunk(s, chunk);
    if (ok) *pass_ids = k3_session_chunk(s);
    k3_trace tr = {.user = rt, .on_routing = on_routing};
    if (ok && rt) k3_session_set_trace(s, &tr);
    if (ok) ok = k3_session_prefill(s, ids, N_IDS, logits, NULL, &err) == K3_OK;
    k3_run_stats st;
    if (ok) k3_session_stats(s, &st), *reads = st.reads;
    if (!ok) k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
    k3_session_free(s);
    k3_engine_free(e);
    return ok;
}

static void test_prompt_reads_each_expert_once(void) {
    char dir[128], cmd[512];
    snprintf(dir, sizeof dir, "/tmp/k3-expertmajor-%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf %s && %s synth %s --layers %d --experts %d --top-k 4 "
             ">/dev/null", dir, k3t_lab_bin(), dir, LAYERS, EXPERTS);
    CHECK_OR(, access(k3t_lab_bin(), X_OK) == 0, "K3_LAB_BIN=%s is not built", k3t_lab_bin());
    CHECK_OR(, system(cmd) == 0, "failed: %s", cmd);
    int32_t ids[N_IDS];
    for (int i = 0; i < N_IDS; i++) ids[i] = (int32_t)((i * 7919u + 11u) % 2048u);
    routing rt = {0};
    float *a = malloc(2048 * sizeof *a), *b = malloc(2048 * sizeof *b);
    uint64_t reads_plan = 0, reads_32 = 0;
    int pass_plan = 0, pass_32 = 0;
    /* first the routing (any cache: it does not change the choices), then a tenth of it */
    int ok = prefill(dir, 64, 0, ids, a, &reads_plan, &pass_plan, &rt);
    int slots = rt.distinct / 10 > 5 ? rt.distinct / 10 : 5; /* >= top-k + 1 */
    ok = ok && prefill(dir, slots, 0, ids, a, &reads_plan, &pass_plan, NULL) &&
         prefill(dir, slots, 32, ids, b, &reads_32, &pass_32, NULL);
    if (ok) {
        CHECK(rt.distinct > 200, "the routing touches %d (layer, expert) pairs", rt.distinct);
        CHECK(pass_plan >= N_IDS, "the plan's prompt pass holds %d ids", pass_plan);
        CHECK(memcmp(a, b, 2048 * sizeof *a) == 0, "logits differ from passes of 32 ids");
        CHECK(reads_plan * 4 <= (uint64_t)rt.distinct * 5,
              "%llu expert reads for %d distinct (layer, expert) pairs, %d slots",
              (unsigned long long)reads_plan, rt.distinct, slots);
        CHECK(reads_32 > 2 * reads_plan, "passes of 32: %llu reads, the plan's: %llu",
              (unsigned long long)reads_32, (unsigned long long)reads_plan);
        printf("expertmajor: %d pairs, %d slots: %llu reads in passes of %d, %llu in passes "
               "of 32\n", rt.distinct, slots, (unsigned long long)reads_plan, pass_plan,
               (unsigned long long)reads_32);
    }
    free(a), free(b);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* on_layer sees every layer of a prompt pass in order with the pass's ids, and a nonzero
 * return stops the pass there: K3_ERR_INTERRUPTED, the session back at position 0 where the
 * pass began (tests/test_keepstate.c stops a later pass), and a later prefill gives the
 * uninterrupted logits. */
typedef struct layers_seen {
    int calls, last, stop_at, bad;
} layers_seen;

static int on_layer(void *user, int pos, int n, int layer, int n_layers) {
    layers_seen *ls = user;
    if (pos != 0 || n != 40 || layer != ls->last + 1 || n_layers != 9) ls->bad++;
    ls->calls++, ls->last = layer;
    return layer == ls->stop_at;
}

static void test_layer_hook_progress_and_stop(void) {
    k3_engine *e = NULL;
    k3_session *s = NULL;
    k3_err err = {0};
    CHECK_OR(, k3_engine_load("tests/fixtures/k3-nano", NULL, &e, &err) == K3_OK, "%s", err.msg);
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (int32_t)(i * 37 % 1000 + 3);
    const k3_config *c = k3_engine_config(e);
    float *a = malloc((size_t)c->vocab_size * sizeof *a), *b = malloc((size_t)c->vocab_size * 4);
    CHECK(k3_session_new(e, 64, &s, &err) == K3_OK, "%s", err.msg);
    layers_seen ls = {.last = -1, .stop_at = 4};
    k3_trace tr = {.user = &ls, .on_layer = on_layer};
    k3_session_set_trace(s, &tr);
    int rc = k3_session_prefill(s, ids, 40, a, NULL, &err);
    CHECK(rc == K3_ERR_INTERRUPTED && ls.calls == 5 && !ls.bad && k3_session_pos(s) == 0,
          "rc %d, %d calls (%d out of order), position %d", rc, ls.calls, ls.bad,
          k3_session_pos(s));
    ls = (layers_seen){.last = -1, .stop_at = -1};
    rc = k3_session_prefill(s, ids, 40, a, NULL, &err);
    CHECK(rc == K3_OK && ls.calls == 9 && !ls.bad, "rc %d (%s), %d calls", rc, err.msg, ls.calls);
    k3_session_set_trace(s, NULL);
    k3_session_reset(s);
    CHECK(k3_session_prefill(s, ids, 40, b, NULL, &err) == K3_OK, "%s", err.msg);
    CHECK(memcmp(a, b, (size_t)c->vocab_size * sizeof *a) == 0,
          "logits after a stopped pass differ from a clean prefill");
    free(a), free(b);
    k3_session_free(s);
    k3_engine_free(e);
}

const k3_test k3_suite_expertmajor[] = {
    {"layer_hook_progress_and_stop", test_layer_hook_progress_and_stop},
    {"prompt_reads_each_expert_once", test_prompt_reads_each_expert_once},
    {0},
};
