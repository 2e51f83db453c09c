/* test_expranks.c — expert parallelism's model side (model/pass.h's k3_expert_ranks), without
 * MPI: the ownership rule at K3's sizes, and two "ranks" as two engines on two threads in this
 * process, whose exchange is a shared buffer and a barrier. Each asks its store for its own
 * experts only and takes the others' outputs from the peer; both must produce exactly the
 * logits of one engine that computes every expert (k3-nano and k3-tiny-kjv, token by token
 * and in batched passes). src/dist does the same over MPI (make test-mpi). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../src/engine/k3.h"
#include "../src/engine/k3_lab.h"
#include "test.h"

/* ---- ownership -------------------------------------------------------------------------- */

static void test_owner_balanced_per_layer(void) {
    for (int n = 2; n <= 8; n++)
        for (int l = 1; l <= 92; l++) {
            int count[8] = {0};
            for (int e = 0; e < 896; e++) {
                int r = k3_expert_owner(l, e, n);
                CHECK(r >= 0 && r < n, "layer %d expert %d: owner %d of %d", l, e, r, n);
                count[r]++;
            }
            int lo = 896 / n;
            for (int r = 0; r < n; r++)
                CHECK(count[r] == lo || count[r] == lo + 1, "N %d layer %d: rank %d owns %d", n,
                      l, r, count[r]);
        }
    for (int l = 1; l <= 4; l++) {
        int want = l == 4 ? 0 : l;
        CHECK(k3_expert_owner(l, 0, 4) == want, "layer %d: expert 0 on rank %d", l,
              k3_expert_owner(l, 0, 4));
    }
    /* K3 on 4 ranks: 224 each in every layer; expert 0 moves across the ranks by layer */
    int c = 0;
    for (int e = 0; e < 896; e++) c += k3_expert_owner(7, e, 4) == 2;
    CHECK(c == 224, "rank 2 owns %d of layer 7's experts", c);
}

/* ---- two ranks in one process ------------------------------------------------------------- */

typedef struct shared {
    pthread_barrier_t bar;
    float *outs[2];
    int status[2];
    int layer[2];
} shared;

typedef struct rank_ctx {
    shared *sh;
    int rank;
    k3_expert_ranks xr;
    const char *model;
    const int32_t *ids;
    int n, chunk;
    float *logits; /* [n][vocab] */
    int rc;
    k3_err err;
} rank_ctx;

static int fake_exchange(void *user, int layer, const int *ids, int rows, int k, float *outs,
                         int dim, int status, k3_err *err) {
    rank_ctx *c = user;
    shared *sh = c->sh;
    sh->outs[c->rank] = outs, sh->status[c->rank] = status, sh->layer[c->rank] = layer;
    pthread_barrier_wait(&sh->bar);
    int peer = 1 - c->rank, rc = K3_OK;
    if (sh->layer[peer] != layer)
        rc = k3_fail(err, K3_ERR_DIST, "the ranks are at layers %d and %d", layer,
                     sh->layer[peer]);
    else if (sh->status[0] || sh->status[1])
        rc = k3_fail(err, K3_ERR_DIST, "a rank failed");
    for (int i = 0; !rc && i < rows * k; i++) /* disjoint slots: no write meets a read */
        if (k3_expert_owner(layer, ids[i], 2) == peer)
            memcpy(outs + (size_t)i * dim, sh->outs[peer] + (size_t)i * dim,
                   (size_t)dim * sizeof *outs);
    pthread_barrier_wait(&sh->bar); /* neither overwrites its rows before the other copied */
    return rc;
}

/* Loads the model (with ranks when xr), feeds ids in passes of chunk (1: steps), logits at
 * every position. */
static int feed(const char *model, const k3_expert_ranks *xr, const int32_t *ids, int n,
                int chunk, float *logits, k3_err *err) {
    k3_engine_opts o = k3_engine_opts_default();
    o.threads = 1;
    o.lab = &(k3_lab_opts){.expert_slots = 64, .gpu_max_layers = -1};
    o.expert_ranks = xr;
    k3_engine *e = NULL;
    k3_session *s = NULL;
    int rc = k3_engine_load(model, &o, &e, err);
    if (!rc) rc = k3_session_new(e, 0, &s, err);
    size_t V = e ? (size_t)k3_engine_config(e)->vocab_size : 0;
    for (int i = 0; !rc && i < n; i += chunk) {
        int len = n - i < chunk ? n - i : chunk;
        rc = chunk == 1 ? k3_session_step(s, ids[i], logits + (size_t)i * V, err)
                        : k3_session_forward(s, ids + i, len, logits + (size_t)i * V,
                                             K3_FWD_ALL_LOGITS, err);
    }
    k3_session_free(s);
    k3_engine_free(e);
    return rc;
}

static void *rank_main(void *arg) {
    rank_ctx *c = arg;
    c->rc = feed(c->model, &c->xr, c->ids, c->n, c->chunk, c->logits, &c->err);
    return NULL;
}

static void two_ranks_match(const char *model, int vocab, int chunk) {
    enum { N = 24 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 37 + 11) % vocab);
    size_t bytes = (size_t)N * vocab * sizeof(float);
    float *ref = malloc(bytes), *got[2] = {malloc(bytes), malloc(bytes)};
    CHECK(ref && got[0] && got[1], "out of memory");
    k3_err err = {0};
    int rc = feed(model, NULL, ids, N, chunk, ref, &err);
    CHECK(rc == 0, "%s: one engine: %s", model, err.msg);
    shared sh;
    pthread_barrier_init(&sh.bar, NULL, 2);
    rank_ctx c[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        c[r] = (rank_ctx){.sh = &sh, .rank = r, .model = model, .ids = ids, .n = N,
                          .chunk = chunk, .logits = got[r]};
        c[r].xr = (k3_expert_ranks){.user = &c[r], .rank = r, .n_ranks = 2,
                                    .exchange = fake_exchange};
        pthread_create(&th[r], NULL, rank_main, &c[r]);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&sh.bar);
    for (int r = 0; r < 2; r++) {
        CHECK(c[r].rc == 0, "%s rank %d: %s", model, r, c[r].err.msg);
        CHECK(memcmp(ref, got[r], bytes) == 0, "%s chunk %d: rank %d's logits differ from one "
              "engine's", model, chunk, r);
    }
    free(ref);
    free(got[0]);
    free(got[1]);
}

static void test_two_ranks_nano(void) {
    two_ranks_match("tests/fixtures/k3-nano", 2048, 1);
    two_ranks_match("tests/fixtures/k3-nano", 2048, 5);
}

static void test_two_ranks_kjv(void) {
    two_ranks_match("tests/fixtures/k3-tiny-kjv", 2048, 1);
    two_ranks_match("tests/fixtures/k3-tiny-kjv", 2048, 8);
}

const k3_test k3_suite_expranks[] = {
    {"owner_balanced_per_layer", test_owner_balanced_per_layer},
    {"two_ranks_nano_bit_identical", test_two_ranks_nano},
    {"two_ranks_kjv_bit_identical", test_two_ranks_kjv},
    {0},
};
