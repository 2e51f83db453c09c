/* test_latent.c — the latent MLA cache and its absorbed attention (src/model/mla.c, spec §7.5)
 * against the EXPANDED oracle, which lives only here: per MLA layer and position it expands
 * the cached latent row with kv_b_proj (k_nope, v per head; k_pe shared) exactly as the
 * product did before the latent cache, and attends with the two-pass softmax of the reference.
 * It runs the same passes through k3_model.mla_oracle (tests only).
 *
 * k3-nano's MLA has no rotary position, so a config copy with a long max_position_embeddings
 * runs it past its 4,096 positions on unchanged weights: 8,000 positions, several logits
 * compared within 1e-4 (the fixtures' tolerance) and identical greedy continuations. A second
 * test checks the latent path's own invariant across tile boundaries (K3_MLA_TILE): the same
 * bits token by token, in chunks of any size and after a rewind. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/engine/k3_test.h"
#include "../src/model/model.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"
#define LONG_N 8000
#define N_CHECK 5
#define N_GREEDY 6

/* ---- the expanded oracle ------------------------------------------------------------------ */

typedef struct oracle {
    int max_ctx;
    size_t kvf;          /* H·nope + rope + H·v floats per position (the expanded row) */
    float *kv[8];        /* per MLA slot [max_ctx][kvf]: k_nope [H][nope], k_pe, v [H][v] */
    int filled[8];       /* rows expanded so far (a forward-only session never rewrites them) */
    float *KV, *scores;  /* kv_b_proj output [H][nope + v]; [64][H][max_ctx] (the pass) */
} oracle;

/* Expands row j of the latent cache (normed c_kv ++ k_pe) into layer slot's expanded row. */
static void expand(oracle *o, const k3_model *m, const k3_layer *L, const float *cache, int j) {
    const k3_config *c = &m->cfg;
    int H = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int vd = c->v_head_dim, lora = c->kv_lora_rank;
    const float *ckv = cache + (size_t)j * (lora + rope);
    k3_matvec(m->kr, &L->mla.kv_b_proj, ckv, o->KV); /* [H][nope + v] */
    float *e = o->kv[L->state_slot] + (size_t)j * o->kvf, *kpe = e + (size_t)H * nope;
    for (int h = 0; h < H; h++)
        for (int d = 0; d < nope; d++) e[h * nope + d] = o->KV[h * (nope + vd) + d];
    for (int d = 0; d < rope; d++) kpe[d] = ckv[lora + d];
    for (int h = 0; h < H; h++)
        for (int d = 0; d < vd; d++) kpe[rope + h * vd + d] = o->KV[h * (nope + vd) + nope + d];
}

/* The reference attention (spec §7.5) over the expanded rows: per head the scores
 * (q_nope·k_nope + q_pe·k_pe) / sqrt(nope + rope) over 0..t, softmax with the max subtracted,
 * o = Σ_j p_j v_j. */
static void oracle_attend(void *user, const k3_model *m, const k3_layer *L, const float *cache,
                          int pos0, int n, const float *Q, float *out) {
    oracle *o = user;
    const k3_config *c = &m->cfg;
    int H = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int vd = c->v_head_dim, qk = nope + rope, slot = L->state_slot;
    for (; o->filled[slot] < pos0 + n; o->filled[slot]++) expand(o, m, L, cache, o->filled[slot]);
    const float *kv = o->kv[slot];
    const float scale = (float)(1.0 / sqrt((double)qk));
#pragma omp parallel for schedule(dynamic, 4)
    for (int ih = 0; ih < n * H; ih++) {
        int i = ih / H, h = ih % H, t = pos0 + i;
        {
            const float *q = Q + ((size_t)i * H + h) * qk;
            float *sc = o->scores + (size_t)ih * o->max_ctx, mx = -INFINITY, sum = 0;
            for (int j = 0; j <= t; j++) {
                const float *e = kv + (size_t)j * o->kvf;
                sc[j] = (k3_dot(m->kr, q, e + h * nope, nope) +
                         k3_dot(m->kr, q + nope, e + (size_t)H * nope, rope)) * scale;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int j = 0; j <= t; j++) sum += (sc[j] = expf(sc[j] - mx));
            float *ov = out + ((size_t)i * H + h) * vd;
            for (int d = 0; d < vd; d++) ov[d] = 0;
            for (int j = 0; j <= t; j++)
                k3_axpy(m->kr, sc[j] / sum, kv + (size_t)j * o->kvf + (size_t)H * nope + rope +
                        h * vd, ov, vd);
        }
    }
}

static int oracle_init(oracle *o, const k3_config *c, int n_mla, int max_ctx) {
    memset(o, 0, sizeof *o);
    int H = c->num_attention_heads;
    o->max_ctx = max_ctx;
    o->kvf = (size_t)H * (c->qk_nope_head_dim + c->v_head_dim) + (size_t)c->qk_rope_head_dim;
    int ok = n_mla <= 8;
    for (int i = 0; i < n_mla && ok; i++) ok = (o->kv[i] = malloc(max_ctx * o->kvf * 4)) != NULL;
    o->KV = malloc((size_t)H * (c->qk_nope_head_dim + c->v_head_dim) * 4);
    o->scores = malloc((size_t)H * 64 * max_ctx * 4); /* [64 queries][H][max_ctx] */
    return ok && o->KV && o->scores;
}

static void oracle_free(oracle *o) {
    for (int i = 0; i < 8; i++) free(o->kv[i]);
    free(o->KV);
    free(o->scores);
}

/* ---- a long-context copy of k3-nano ------------------------------------------------------- */

/* dir (a fresh temp dir) gets k3-nano's files as links and its config.json with
 * max_position_embeddings 16384. Returns 0 on success. */
static int long_nano(char *dir) {
    strcpy(dir, "/tmp/k3-latent-XXXXXX");
    CHECK_OR(-1, mkdtemp(dir), "mkdtemp");
    char cmd[1024], *json = NULL;
    snprintf(cmd, sizeof cmd, "for f in $(pwd)/" NANO "/*; do ln -s \"$f\" '%s'/; done; rm '%s'/config.json",
             dir, dir);
    CHECK_OR(-1, system(cmd) == 0, "%s", cmd);
    FILE *f = fopen(NANO "/config.json", "rb");
    CHECK_OR(-1, f, "config.json");
    json = calloc(1, 1 << 16);
    size_t n = fread(json, 1, (1 << 16) - 1, f);
    fclose(f);
    char *at = strstr(json, "\"max_position_embeddings\": 4096");
    CHECK_OR(-1, n > 0 && at, "max_position_embeddings not found");
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "wb");
    CHECK_OR(-1, f, "%s", path);
    fwrite(json, 1, (size_t)(at - json), f);
    fprintf(f, "\"max_position_embeddings\": 16384");
    fputs(at + strlen("\"max_position_embeddings\": 4096"), f);
    fclose(f);
    free(json);
    return 0;
}

static void remove_dir(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* LONG_N pseudo-random ordinary ids (below the specials at 1792). */
static void prompt(int32_t *ids, int n) {
    uint32_t x = 12345;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        ids[i] = (int32_t)((x >> 8) % 1792);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) b = v[i] > v[b] ? i : b;
    return b;
}

static float max_abs_diff(const float *a, const float *b, int n) {
    float d = 0;
    for (int i = 0; i < n; i++) d = fabsf(a[i] - b[i]) > d ? fabsf(a[i] - b[i]) : d;
    return d;
}

static const int check_at[N_CHECK] = {K3_MLA_TILE - 1, K3_MLA_TILE, 2047, 5000, LONG_N - 1};

/* Logits after ids[0..check_at[i]] for each i, then N_GREEDY greedy steps (their logits and
 * ids), with prefill passes of `chunk` ids. Returns 0 on success. */
static int run_long(k3_engine *e, const int32_t *ids, int chunk, float *logits, int32_t *greedy) {
    int V = k3_engine_config(e)->vocab_size;
    k3_session *s = NULL;
    k3_err err = {0};
    CHECK_OR(-1, k3_session_new(e, LONG_N + N_GREEDY + 1, &s, &err) == K3_OK, "%s", err.msg);
    k3_session_set_chunk(s, chunk);
    int rc = 0;
    for (int i = 0; i < N_CHECK && !rc; i++)
        rc = k3_session_prefill(s, ids, (size_t)check_at[i] + 1, logits + (size_t)i * V, NULL,
                                &err);
    float *last = logits + (size_t)(N_CHECK - 1) * V;
    for (int g = 0; g < N_GREEDY && !rc; g++) {
        greedy[g] = argmax(last, V);
        rc = k3_session_step(s, greedy[g], last + V, &err);
        last += V;
    }
    k3_session_free(s);
    CHECK_OR(-1, rc == 0, "%s", err.msg);
    return 0;
}

static void test_long_context_oracle(void) {
    char dir[64];
    if (long_nano(dir)) return;
    k3_engine_opts o = k3_engine_opts_default();
    o.threads = 2;
    o.ctx = LONG_N + N_GREEDY + 1;
    k3_engine *e = NULL;
    k3_err err = {0};
    unsetenv("K3_DEVICE");
    CHECK_OR(, k3_engine_load(dir, &o, &e, &err) == K3_OK, "%s", err.msg);
    const k3_config *c = k3_engine_config(e);
    int V = c->vocab_size, n_mla = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n_mla += c->layer_is_mla[l];
    size_t rows = N_CHECK + N_GREEDY;
    int32_t *ids = malloc(LONG_N * sizeof *ids), ga[N_GREEDY], gb[N_GREEDY];
    float *la = malloc(rows * V * sizeof *la), *lb = malloc(rows * V * sizeof *lb);
    prompt(ids, LONG_N);
    oracle orc;
    int ok = oracle_init(&orc, c, n_mla, LONG_N + N_GREEDY + 1);
    CHECK(ok, "out of memory for the oracle");
    /* The latent path in passes of 97 ids (crossing the tiles' edges everywhere), the
     * oracle in passes of 64. */
    double t0 = now_s();
    if (ok) ok = run_long(e, ids, 97, la, ga) == 0;
    double t1 = now_s();
    k3_model *m = k3_engine_model(e);
    m->mla_oracle = oracle_attend, m->mla_oracle_user = &orc;
    if (ok) ok = run_long(e, ids, 64, lb, gb) == 0;
    double t2 = now_s();
    m->mla_oracle = NULL;
    float worst = 0;
    for (size_t r = 0; ok && r < rows; r++) {
        float d = max_abs_diff(la + r * V, lb + r * V, V);
        worst = d > worst ? d : worst;
        CHECK(d <= 1e-4f, "logits row %zu (%s %d) differ from the expanded oracle by %g", r,
              r < N_CHECK ? "position" : "greedy step", r < N_CHECK ? check_at[r] : (int)r - N_CHECK, d);
    }
    CHECK(!ok || memcmp(ga, gb, sizeof ga) == 0, "greedy continuations differ");
    if (ok) printf("        latent vs expanded oracle at %d positions: max |dlogit| %.3g "
                   "(latent %.1f s, oracle %.1f s)\n", LONG_N, worst, t1 - t0, t2 - t1);
    oracle_free(&orc);
    free(ids);
    free(la);
    free(lb);
    k3_engine_free(e);
    remove_dir(dir);
}

/* ---- the latent path's own invariant across tiles ----------------------------------------- */

#define TILE_N (2 * K3_MLA_TILE + 80) /* two whole tiles and part of a third */

static int prefill_logits(k3_engine *e, const int32_t *ids, int n, int chunk, float *out) {
    k3_session *s = NULL;
    k3_err err = {0};
    CHECK_OR(-1, k3_session_new(e, TILE_N + 1, &s, &err) == K3_OK, "%s", err.msg);
    k3_session_set_chunk(s, chunk);
    int rc = k3_session_prefill(s, ids, (size_t)n, out, NULL, &err);
    k3_session_free(s);
    CHECK_OR(-1, rc == 0, "%s", err.msg);
    return 0;
}

static void test_tiles_bit_identical(void) {
    k3_engine_opts o = k3_engine_opts_default();
    o.threads = 2;
    k3_engine *e = NULL;
    k3_err err = {0};
    unsetenv("K3_DEVICE");
    CHECK_OR(, k3_engine_load(NANO, &o, &e, &err) == K3_OK, "%s", err.msg);
    int V = k3_engine_config(e)->vocab_size;
    int32_t ids[TILE_N];
    prompt(ids, TILE_N);
    float *ref = malloc(V * sizeof *ref), *got = malloc(V * sizeof *got);
    static const int chunks[] = {300, 64, K3_MLA_TILE - 1, K3_MLA_TILE + 1};
    int ok = prefill_logits(e, ids, TILE_N, 1, ref) == 0; /* token by token */
    for (size_t i = 0; ok && i < sizeof chunks / sizeof chunks[0]; i++) {
        ok = prefill_logits(e, ids, TILE_N, chunks[i], got) == 0;
        CHECK(ok && memcmp(ref, got, V * sizeof *got) == 0, "chunk %d: logits differ by %g",
              chunks[i], max_abs_diff(ref, got, V));
    }
    /* A rewindable pass over the second tile's edge, rewound past it, then stepped on: the
     * same bits as the token-by-token run (the rows past the rewind are overwritten). */
    int edge = 2 * K3_MLA_TILE, last = edge + 16;
    k3_session *s = NULL;
    if (ok) ok = prefill_logits(e, ids, last + 1, 1, ref) == 0;
    if (ok) ok = k3_session_new(e, TILE_N + 1, &s, &err) == K3_OK;
    if (ok) ok = k3_session_prefill(s, ids, edge - 14, NULL, NULL, &err) == K3_OK;
    if (ok) ok = k3_session_forward(s, ids + edge - 14, 30, NULL, K3_FWD_REWINDABLE, &err) == K3_OK;
    if (ok) ok = k3_session_rewind(s, edge - 5, &err) == K3_OK;
    for (int p = edge - 5; ok && p <= last; p++) ok = k3_session_step(s, ids[p], got, &err) == K3_OK;
    CHECK(ok, "%s", err.msg);
    CHECK(!ok || memcmp(ref, got, V * sizeof *got) == 0, "after the rewind: logits differ by %g",
          max_abs_diff(ref, got, V));
    k3_session_free(s);
    free(ref);
    free(got);
    k3_engine_free(e);
}

const k3_test k3_suite_latent[] = {
    {"nano_long_context_vs_expanded_oracle", test_long_context_oracle},
    {"nano_tiles_bit_identical", test_tiles_bit_identical},
    {0},
};
