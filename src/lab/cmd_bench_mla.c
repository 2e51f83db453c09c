/* cmd_bench_mla.c — `k3-lab bench mla`: one MLA layer's attention over the latent cache (spec
 * §7.5, absorbed form, src/model/mla.c) against the context length, beside its floor measured
 * in the same run: the latent bytes read per token at memcpy's rate, and the multiply-adds at
 * the rate of the batched f32 product the attention runs on (k3_matmul, one tile's two
 * products). Then the attention of an 8k-position prefill in K3_DEFAULT_CHUNK passes beside the
 * layer's own projections (its share of the MLA layer's prefill time).
 *
 * The cache rows and queries are random; the attention's time does not depend on the values,
 * so a headers-only snapshot (k3-lab synth --real --sparse) is a real-width slice. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/model_dir.h"
#include "../format/config.h"
#include "../format/safetensors.h"
#include "../kernels/kernels.h"
#include "../model/model.h"
#include "../util/clock.h"
#include "lab.h"

#define MAX_CTX_LIST 16
#define K3_MLA_LAYERS 24 /* K3's MLA layers: a token's attention is 24 of these */
#define SAMPLE 16        /* prefill: one pass in SAMPLE is timed */

typedef struct mla_opts {
    const char *dir;
    int ctx[MAX_CTX_LIST], n_ctx, prefill;
    double seconds;
} mla_opts;

static void usage(FILE *f) {
    fprintf(f,
        "usage: k3-lab bench mla [DIR] [options]\n"
        "\n"
        "Times one MLA layer's decode attention over the latent cache at each context length\n"
        "beside its floor (latent bytes at memcpy's rate; multiply-adds at the batched f32\n"
        "product's rate, both measured in the same run), then the attention of a prefill in\n"
        "passes of %d beside the layer's projections. DIR: a real-width snapshot; a headers-only\n"
        "one is enough (k3-lab synth --real --layers 4 --sparse DIR).\n"
        "\n"
        "  --ctx LIST       context lengths (default 1024,8192,32768,131072)\n"
        "  --prefill N      prompt length of the prefill measurement (default 8192; 0: skip)\n"
        "  --seconds S      time per measurement at least (default 2)\n"
        "  -h, --help       this help\n", K3_DEFAULT_CHUNK);
}

static int parse(int argc, char **argv, mla_opts *o) {
    *o = (mla_opts){.ctx = {1024, 8192, 32768, 131072}, .n_ctx = 4, .prefill = 8192,
                    .seconds = 2};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return -1; }
        else if (!strcmp(a, "--seconds") && v) o->seconds = atof(argv[++i]);
        else if (!strcmp(a, "--prefill") && v) o->prefill = atoi(argv[++i]);
        else if (!strcmp(a, "--ctx") && v) {
            char *p = argv[++i];
            for (o->n_ctx = 0; *p && o->n_ctx < MAX_CTX_LIST; p += *p == ',')
                o->ctx[o->n_ctx++] = (int)strtol(p, &p, 10);
        } else if (a[0] != '-' && !o->dir) o->dir = a;
        else {
            fprintf(stderr, "k3-lab bench mla: unknown option or missing value: '%s'\n", a);
            return K3_ERR_USAGE;
        }
    }
    for (int i = 0; i < o->n_ctx; i++)
        if (o->ctx[i] < 1) {
            fprintf(stderr, "k3-lab bench mla: --ctx takes positive lengths\n");
            return K3_ERR_USAGE;
        }
    if (!(o->seconds > 0) || o->prefill < 0) {
        fprintf(stderr, "k3-lab bench mla: need --seconds > 0 and --prefill >= 0\n");
        return K3_ERR_USAGE;
    }
    return k3_model_arg("k3-lab bench mla", o->dir, &o->dir); /* NULL: the bundled model */
}

static void fill_random(float *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((int64_t)(seed >> 40) - (1 << 23)) / (float)(1 << 23);
    }
}

/* Bytes copied per second by a parallel memcpy of 512 MiB (best of 3): the rate the floor
 * reads the latent rows at (half of what is read + written). */
static double copy_rate(void) { return k3_lab_copy_rate((size_t)512 << 20) / 2; }

/* Multiply-adds per second of one attention tile's two products for H (query, head) rows:
 * scores [H][TILE] from the tile [TILE][lora + rope], and Σ p·c [H][lora] from its transpose
 * [lora][TILE] (K3_MLA_TILE positions, as mla.c). */
static double mac_rate(const k3_kernels *kr, int H, int lora, int kvf, double seconds) {
    int T = K3_MLA_TILE;
    float *tile = malloc(sizeof(float) * T * kvf), *ct = malloc(sizeof(float) * lora * T);
    float *q = malloc(sizeof(float) * H * kvf), *p = malloc(sizeof(float) * H * T);
    float *y = malloc(sizeof(float) * H * (T > lora ? T : lora));
    fill_random(tile, (size_t)T * kvf, 1), fill_random(ct, (size_t)lora * T, 2);
    fill_random(q, (size_t)H * kvf, 3), fill_random(p, (size_t)H * T, 4);
    k3_mat A = {.data = tile, .dtype = K3_DT_F32, .rows = T, .cols = kvf};
    k3_mat B = {.data = ct, .dtype = K3_DT_F32, .rows = lora, .cols = T};
    double macs = (double)H * T * kvf + (double)H * lora * T, best = 1e30, t_end = k3_now_s() + seconds;
    for (int it = 0; it < 5 || k3_now_s() < t_end; it++) {
        double t = k3_now_s();
        k3_matmul(kr, &A, q, H, y);
        k3_matmul(kr, &B, p, H, y);
        t = k3_now_s() - t;
        best = t < best ? t : best;
    }
    free(tile), free(ct), free(q), free(p), free(y);
    return macs / best;
}

/* The tile products alone of a decode step at position ctx: per tile of K3_MLA_TILE rows of the cache,
 * the scores product and the Σ p·c product (mla.c's two k3_matmul calls), on buffers of the
 * same shapes. What the attention cannot go below at the batched product's rate. */
typedef struct prod_bufs {
    float *qa, *s, *p, *ct, *y;
} prod_bufs;

static void tile_products(const k3_model *m, const float *cache, int ctx, const prod_bufs *b) {
    const k3_config *c = &m->cfg;
    int H = c->num_attention_heads, lora = c->kv_lora_rank, kvf = lora + c->qk_rope_head_dim;
    for (int j0 = 0; j0 <= ctx; j0 += K3_MLA_TILE) {
        int cnt = ctx + 1 - j0 < K3_MLA_TILE ? ctx + 1 - j0 : K3_MLA_TILE;
        k3_mat C = {.data = cache + (size_t)j0 * kvf, .dtype = K3_DT_F32, .rows = cnt, .cols = kvf};
        k3_mat Ct = {.data = b->ct, .dtype = K3_DT_F32, .rows = lora, .cols = K3_MLA_TILE};
        k3_matmul(m->kr, &C, b->qa, H, b->s);
        k3_matmul(m->kr, &Ct, b->p, H, b->y);
    }
}

/* Least seconds (the machine may be shared: the least is the one least disturbed) of the
 * decode attention at position ctx (rows 0..ctx in the cache) into *att, and of its tile
 * products alone into *prod, the two timed alternately so that both see the same load. */
static void time_decode(const k3_model *m, int layer, k3_state *s, int ctx, const float *Q,
                        float *o, const prod_bufs *b, double seconds, double *att,
                        double *prod) {
    k3_state_buffers h;
    k3_state_buffers_of(s, &h);
    k3_mla_attend_rows(m, layer, s, NULL, ctx, 1, Q, o); /* warm */
    double t_end = k3_now_s() + seconds;
    *att = *prod = 1e30;
    for (int n = 0; n < 3 || k3_now_s() < t_end; n++) {
        double t0 = k3_now_s();
        k3_mla_attend_rows(m, layer, s, NULL, ctx, 1, Q, o);
        double t1 = k3_now_s();
        tile_products(m, h.kv, ctx, b);
        double t2 = k3_now_s();
        *att = t1 - t0 < *att ? t1 - t0 : *att;
        *prod = t2 - t1 < *prod ? t2 - t1 : *prod;
    }
}

/* A state whose layer-slot cache holds `rows` random latent rows; NULL on failure. */
static k3_state *filled_state(const k3_model *m, int rows, k3_err *err) {
    k3_state *s = NULL;
    if (k3_state_new(m, rows, &s, err)) return NULL;
    k3_state_buffers h;
    k3_state_buffers_of(s, &h);
    fill_random(h.kv, (size_t)rows * h.kv_floats, 7); /* slot 0: the first MLA layer */
    return s;
}

static void decode_rows(const mla_opts *o, const k3_model *m, int layer, double bps,
                        double macps) {
    const k3_config *c = &m->cfg;
    int H = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int lora = c->kv_lora_rank, vd = c->v_head_dim, kvf = lora + rope;
    float *Q = malloc(sizeof(float) * H * (nope + rope)), *out = malloc(sizeof(float) * H * vd);
    size_t T = K3_MLA_TILE;
    prod_bufs b = {malloc(sizeof(float) * H * kvf), malloc(sizeof(float) * H * T),
                   malloc(sizeof(float) * H * T), malloc(sizeof(float) * lora * T),
                   malloc(sizeof(float) * H * lora)};
    fill_random(Q, (size_t)H * (nope + rope), 9), fill_random(b.qa, (size_t)H * kvf, 10);
    fill_random(b.p, (size_t)H * T, 11), fill_random(b.ct, (size_t)lora * T, 12);
    printf("| context | latent MB / layer | ms / token / layer | s / token (%d layers) | bytes "
           "floor (ms) | MACs at the burst rate (ms) | tile products alone (ms) | x floor |\n"
           "|---:|---:|---:|---:|---:|---:|---:|---:|\n", K3_MLA_LAYERS);
    for (int i = 0; i < o->n_ctx; i++) {
        int ctx = o->ctx[i];
        k3_err err = {0};
        k3_state *s = filled_state(m, ctx + 1, &err);
        if (!s) {
            printf("| %d | (no state: %s) | | | | | | |\n", ctx, err.msg);
            continue;
        }
        double sec, prod;
        time_decode(m, layer, s, ctx, Q, out, &b, o->seconds, &sec, &prod);
        double bytes = (double)(ctx + 1) * kvf * 4;
        double macs = (double)H * (ctx + 1) * (kvf + lora) + (double)H * nope * lora +
                      (double)H * vd * lora; /* tiles' two products, absorb, W_uv */
        double fb = bytes / bps, fm = macs / macps, floor = fb > prod ? fb : prod;
        printf("| %d | %.1f | %.2f | %.3f | %.2f | %.2f | %.2f | %.2f |\n", ctx, bytes / 1e6,
               sec * 1e3, sec * K3_MLA_LAYERS, fb * 1e3, fm * 1e3, prod * 1e3, sec / floor);
        fflush(stdout);
        k3_state_free(s);
    }
    free(Q), free(out), free(b.qa), free(b.s), free(b.p), free(b.ct), free(b.y);
}

/* The prefill: attention of o->prefill positions in passes of K3_DEFAULT_CHUNK, beside the MLA
 * layer's projections over the same rows (q_a, q_b, kv_a, g, o_proj; norms and the gate are
 * element-wise and left out). */
static void prefill_row(const mla_opts *o, const k3_model *m, int layer) {
    const k3_config *c = &m->cfg;
    const k3_mla_weights *w = &m->layers[layer].mla;
    int H = c->num_attention_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    int vd = c->v_head_dim, N = o->prefill, n = K3_DEFAULT_CHUNK;
    k3_err err = {0};
    k3_state *s = filled_state(m, N, &err);
    k3_batch *b = k3_batch_new(m, n);
    size_t big = (size_t)n * (size_t)(H * (qk > vd ? qk : vd) > c->hidden_size
                                      ? H * (qk > vd ? qk : vd) : c->hidden_size);
    float *Q = malloc(sizeof(float) * big), *out = malloc(sizeof(float) * big);
    float *x = malloc(sizeof(float) * big), *y = malloc(sizeof(float) * big);
    if (!s || !b || !Q || !out || !x || !y) {
        printf("prefill: out of memory (%s)\n", err.msg);
    } else {
        fill_random(Q, big, 11), fill_random(x, big, 12);
        const k3_mat *mats[] = {&w->q_a_proj, &w->q_b_proj, &w->kv_a_proj, &w->g_proj,
                                &w->o_proj};
        /* every SAMPLE-th pass, from the middle of the first SAMPLE: the passes' cost grows
         * linearly with their position, so the sum times SAMPLE is the whole prefill's */
        double attn = 0, proj = 0;
        for (int p = SAMPLE / 2 * n; p + n <= N; p += SAMPLE * n) {
            double t0 = k3_now_s();
            k3_mla_attend_rows(m, layer, s, b, p, n, Q, out);
            double t1 = k3_now_s();
            for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
                k3_matmul(m->kr, mats[i], x, n, y); /* x is wide enough for every input */
            attn += t1 - t0, proj += k3_now_s() - t1;
        }
        attn *= SAMPLE, proj *= SAMPLE;
        printf("\nprefill of %d positions in passes of %d (every %dth pass timed, times %d), one "
               "MLA layer: attention %.2f s, "
               "projections %.2f s: attention is %.1f%% of the layer's time (%.2f ms per "
               "position)\n", N, n, SAMPLE, SAMPLE, attn, proj, 100 * attn / (attn + proj), attn / N * 1e3);
    }
    free(Q), free(out), free(x), free(y);
    k3_batch_free(b);
    k3_state_free(s);
}

int k3_cmd_bench_mla(int argc, char **argv) {
    mla_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    k3_config c;
    k3_checkpoint *ck = NULL;
    k3_model m = {0};
    k3_err err = {0};
    rc = k3_config_load(o.dir, &c, &err);
    if (!rc) rc = k3_checkpoint_open(o.dir, &ck, &err);
    if (!rc) rc = k3_model_bind(&m, &c, ck, &err);
    int layer = -1;
    for (int l = 0; !rc && l < c.num_hidden_layers && layer < 0; l++)
        if (c.layer_is_mla[l]) layer = l;
    if (!rc && layer < 0) rc = k3_fail(&err, K3_ERR_USAGE, "%s has no MLA layer", o.dir);
    if (!rc) {
        m.kr = k3_kernels_best();
        int lora = c.kv_lora_rank, kvf = lora + c.qk_rope_head_dim;
        double bps = copy_rate(), macps = mac_rate(m.kr, c.num_attention_heads, lora, kvf, 1);
        printf("k3-lab bench mla: %s, MLA layer %d: %d heads, kv_lora_rank %d, rope %d, "
               "nope %d, v %d; kernels %s, %d threads\nmemcpy %.2f GB/s copied; one tile's two "
               "products %.2f GMAC/s\n\n", o.dir, layer, c.num_attention_heads, lora,
               c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim, k3_kernels_name(m.kr),
               omp_get_max_threads(), bps / 1e9, macps / 1e9);
        decode_rows(&o, &m, layer, bps, macps);
        if (o.prefill >= K3_DEFAULT_CHUNK) prefill_row(&o, &m, layer);
    }
    k3_model_free(&m);
    k3_checkpoint_close(ck);
    if (rc) fprintf(stderr, "k3-lab bench mla: %s\n", err.msg);
    return rc;
}
