/* mla.c — gated multi-head latent attention without positional encoding (spec §7), over the
 * LATENT KV cache in the absorbed form (spec §7.5).
 *
 * The cache keeps, per MLA layer and position j, c_j = kv_a_layernorm(c_kv) [lora] and the
 * shared k_pe_j [rope] (state.h). Since k_nope_j = W_uk c_j and v_j = W_uv c_j (the two halves
 * of kv_b_proj per head), each head's
 *     score_j = q_nope·(W_uk c_j) + q_pe·k_pe_j = (W_ukᵀ q_nope)·c_j + q_pe·k_pe_j
 *     o       = Σ_j p_j W_uv c_j                = W_uv (Σ_j p_j c_j)
 * so every head of every query reads the same latent rows: a (query, head) row's absorbed
 * query q' ++ q_pe [lora + rope] meets a tile of cache rows in one batched product, and the
 * probabilities meet the same tile, as stored, in a second (k3_matmul_xw). The softmax's
 * exponentials are k3_softmax_exp's (one polynomial, vectorized, the same bits on every kernel
 * path), and one parallel region runs all the tiles of a block (each thread its share of each
 * product: k3_matmul_rows, k3_matmul_xw), so a tile costs barriers rather than forks. The sums
 * run in another order than the expanded reference (spec §7.5): results agree within float32
 * rounding, not bit for bit (tests/test_latent.c measures it against the expanded oracle).
 *
 * Determinism: a (query, head) row's result depends only on its query, its position t and the
 * cache rows 0..t: tiles start at absolute multiples of K3_MLA_TILE, a product row is
 * independent of the other rows beside it and of how the threads split the product
 * (kernels.h), the online softmax walks the tiles in
 * order, and the absorb and the final W_uv product are per row. So chunking, batch
 * composition, block size and thread count change no bit.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "layers.h"

/* The MLA LoRA norms are built without eps in the official code: KimiRMSNorm's 1e-6 (§4). */
#define MLA_LORA_EPS K3_MLA_LORA_EPS

/* (query, head) rows a block takes at most, beyond one query's heads: bounds the scratch. */
#define BLOCK_ROWS 1024

struct k3_mla_ws {
    int rows;            /* (query, head) rows per block */
    float *qa;           /* [rows][lora + rope]: absorbed query q' = W_ukᵀ q_nope, then q_pe */
    float *s;            /* [rows][<= TILE]: one tile's raw scores */
    float *p;            /* [rows][TILE]: one tile's e^(score - running max), 0 past t */
    float *y;            /* [rows][lora]: one tile's Σ_j p_j c_j */
    float *acc;          /* [rows][lora]: the running Σ_j p_j c_j, then divided by the sum */
    float *m, *l, *corr; /* [rows]: running max, running Σ p, this tile's rescale of acc */
    float *ov;           /* [rows][v]: the W_uv products before they are scattered to o */
};

int k3_mla_ws_rows(const k3_config *c, int queries) {
    int64_t H = c->num_attention_heads, want = H * (queries > 0 ? queries : 1);
    int64_t cap = H > BLOCK_ROWS ? H : BLOCK_ROWS;
    return (int)(want < cap ? want : cap);
}

/* Lays out (ws non-NULL: allocates) a workspace of `rows` rows; returns its bytes. */
static size_t ws_layout(const k3_config *c, int rows, k3_mla_ws *ws, int *ok) {
    size_t R = (size_t)rows, lora = (size_t)c->kv_lora_rank, T = K3_MLA_TILE, bytes = 0;
    size_t kvf = lora + (size_t)c->qk_rope_head_dim;
#define ALLOC(f, count)                                                                       \
    do {                                                                                      \
        bytes += ((size_t)(count) + 1) * sizeof(float);                                       \
        if (ws) *ok &= (ws->f = calloc((size_t)(count) + 1, sizeof(float))) != NULL;          \
    } while (0)
    ALLOC(qa, R * kvf); ALLOC(s, R * T); ALLOC(p, R * T); ALLOC(y, R * lora);
    ALLOC(acc, R * lora); ALLOC(m, R); ALLOC(l, R); ALLOC(corr, R);
    ALLOC(ov, R * (size_t)c->v_head_dim);
#undef ALLOC
    return bytes + sizeof(k3_mla_ws);
}

size_t k3_mla_ws_bytes(const k3_config *c, int rows) { return ws_layout(c, rows, NULL, NULL); }

k3_mla_ws *k3_mla_ws_new(const k3_config *c, int rows) {
    k3_mla_ws *ws = calloc(1, sizeof *ws);
    int ok = 1;
    if (!ws) return NULL;
    ws->rows = rows;
    ws_layout(c, rows, ws, &ok);
    if (!ok) {
        k3_mla_ws_free(ws);
        return NULL;
    }
    return ws;
}

void k3_mla_ws_free(k3_mla_ws *ws) {
    if (!ws) return;
    float *f[] = {ws->qa, ws->s, ws->p, ws->y, ws->acc, ws->m, ws->l, ws->corr, ws->ov};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(f[i]);
    free(ws);
}

void k3_mla_append(const k3_model *m, const k3_layer *L, k3_state *s, int t, const float *ckv) {
    (void)m;
    memcpy(k3_mla_row(s, L->state_slot, t), ckv, s->kv_floats * sizeof(float));
}

/* Row r of w [rows][cols] as f32 into out [cols]: BF16 widened exactly, F32 copied, int8 times
 * its row scale (the int8 spine is not exact anyway, kernels.h). */
static void widen_row(const k3_mat *w, int64_t r, float *out) {
    int64_t n = w->cols;
    if (w->dtype == K3_DT_BF16) {
        const uint16_t *p = (const uint16_t *)w->data + r * n;
        for (int64_t i = 0; i < n; i++) out[i] = k3_bf16_to_f32(p[i]);
    } else if (w->dtype == K3_DT_I8 || w->dtype == K3_DT_I8_Q8) {
        const int8_t *p = (const int8_t *)w->data + r * n;
        for (int64_t i = 0; i < n; i++) out[i] = (float)p[i] * w->scale[r];
    } else {
        memcpy(out, (const float *)w->data + r * n, (size_t)n * sizeof(float));
    }
}

/* The block's absorbed queries (rows r0..r1-1 of the head-major (head, query) order, row
 * r = h·n + q): qa[r - r0] = W_ukᵀ q_nope ++ q_pe. W_uk of head h is kv_b_proj's rows
 * h·(nope + v) .. + nope; q' accumulates row by row (d ascending) with k3_axpy, exact on every
 * kernel path and independent of the other rows. */
static void absorb(const k3_model *m, const k3_mla_weights *w, const float *Q, int n, int r0,
                   int r1, k3_mla_ws *ws) {
    const k3_config *c = &m->cfg;
    int H = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int vd = c->v_head_dim, lora = c->kv_lora_rank, qk = nope + rope, kvf = lora + rope;
    int h0 = r0 / n, h1 = (r1 - 1) / n;
#pragma omp parallel for schedule(static) if ((int64_t)(r1 - r0) * nope * lora >= 65536)
    for (int h = h0; h <= h1; h++) {
        float wrow[K3_MLA_MAX_LORA];
        int a = h * n > r0 ? h * n : r0, z = (h + 1) * n < r1 ? (h + 1) * n : r1;
        for (int r = a; r < z; r++) {
            float *qa = ws->qa + (size_t)(r - r0) * kvf;
            memset(qa, 0, (size_t)lora * sizeof(float));
            memcpy(qa + lora, Q + ((size_t)(r % n) * H + h) * qk + nope, (size_t)rope * sizeof(float));
        }
        for (int d = 0; d < nope; d++) {
            widen_row(&w->kv_b_proj, (int64_t)h * (nope + vd) + d, wrow);
            for (int r = a; r < z; r++)
                k3_axpy(m->kr, Q[((size_t)(r % n) * H + h) * qk + d], wrow,
                        ws->qa + (size_t)(r - r0) * kvf, lora);
        }
    }
}

/* One row's online-softmax step over a tile: raw scores s [cnt] of positions j0.., of which
 * the first `valid` are at or before the row's position. Writes p [TILE] (zeros past valid),
 * updates the running max and sum, and leaves acc's rescale in *corr. The exponentials are
 * k3_softmax_exp's (kernels.h: the same bits on every kernel path, its own summation order). */
static void softmax_step(const k3_kernels *kr, const float *s, int valid, float scale, float *p,
                         float *mx, float *l, float *corr) {
    float m0 = *mx, sum = k3_softmax_exp(kr, s, valid, scale, mx, p);
    *corr = m0 == -INFINITY ? 0.0f : k3_exp(m0 - *mx);
    memset(p + valid, 0, (size_t)(K3_MLA_TILE - valid) * sizeof(float));
    *l = *l * *corr + sum;
}

/* acc = acc·corr + y for the rows that took the tile at j0 (the others keep acc). */
static void rescale_row(const k3_mla_ws *ws, int r, int lora, int t, int j0) {
    if (t < j0) return;
    float *acc = ws->acc + (size_t)r * lora, cr = ws->corr[r];
    const float *y = ws->y + (size_t)r * lora;
    for (int i = 0; i < lora; i++) acc[i] = acc[i] * cr + y[i];
}

/* This thread's share [*a, *b) of n items, in a region of nt threads (0 <= tid < nt). */
static void share(int64_t n, int tid, int nt, int64_t *a, int64_t *b) {
    *a = n * tid / nt, *b = n * (tid + 1) / nt;
}

/* One tile of the block's attention, run by every thread of the region: the scores product
 * (each thread its share of the tile's rows), then per row the previous tile's rescale and
 * this tile's softmax step, then the Σ p·c product over the tile as stored (k3_matmul_xw, each
 * thread its share of the lora columns, in whole 64-column blocks), with a barrier after each
 * of the three. The tile starts at cache row j0 and holds cnt rows; scale is the softmax's. */
static void attend_tile(const k3_model *m, const float *cache, int pos0, int n, int r0, int R,
                        int j0, int cnt, float scale, k3_mla_ws *ws) {
    const k3_config *c = &m->cfg;
    int lora = c->kv_lora_rank, kvf = lora + c->qk_rope_head_dim;
    int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    int64_t a, b;
    k3_mat C = {.data = cache + (size_t)j0 * kvf, .dtype = K3_DT_F32, .rows = cnt, .cols = kvf};
    share(cnt, tid, nt, &a, &b);
    k3_matmul_rows(m->kr, &C, ws->qa, R, ws->s, a, b); /* s[r][j] = (q' ++ q_pe)·(c_j ++ k_pe_j) */
#pragma omp barrier
#pragma omp for schedule(static)
    for (int r = 0; r < R; r++) {
        int t = pos0 + (r0 + r) % n, valid = t - j0 + 1 < cnt ? t - j0 + 1 : cnt;
        if (j0 > 0) rescale_row(ws, r, lora, t, j0 - K3_MLA_TILE);
        if (valid > 0)
            softmax_step(m->kr, ws->s + (size_t)r * cnt, valid, scale,
                         ws->p + (size_t)r * K3_MLA_TILE, &ws->m[r], &ws->l[r], &ws->corr[r]);
        else /* the tile lies past this row: it takes nothing from it */
            memset(ws->p + (size_t)r * K3_MLA_TILE, 0, K3_MLA_TILE * sizeof(float));
    }
    share((lora + 63) / 64, tid, nt, &a, &b);
    a = a * 64 < lora ? a * 64 : lora, b = b * 64 < lora ? b * 64 : lora;
    k3_matmul_xw(m->kr, C.data, kvf, cnt, ws->p, K3_MLA_TILE, R, ws->y, lora, a, b);
#pragma omp barrier /* y[r] = Σ_j p[r][j] c_j */
}

/* Attention of the block's rows over their causal prefixes of the layer cache, tile by tile
 * (flash style): leaves each row's Σ_j softmax_j · c_j in ws->acc. Query q sits at pos0 + q.
 * One parallel region for all the tiles: each fork is a wait on a shared machine, a barrier
 * half of one. */
static void attend_block(const k3_model *m, const float *cache, int pos0, int n, int r0, int r1,
                         k3_mla_ws *ws) {
    const k3_config *c = &m->cfg;
    int lora = c->kv_lora_rank, R = r1 - r0;
    const float scale = (float)(1.0 / sqrt((double)(c->qk_nope_head_dim + c->qk_rope_head_dim)));
    int last_q = r1 - r0 >= n || r0 / n != (r1 - 1) / n ? n - 1 : (r1 - 1) % n;
    int maxpos = pos0 + last_q, last = maxpos / K3_MLA_TILE * K3_MLA_TILE;
    for (int r = 0; r < R; r++) ws->m[r] = -INFINITY, ws->l[r] = 0;
    memset(ws->acc, 0, (size_t)R * lora * sizeof(float));
#pragma omp parallel if ((int64_t)R * (maxpos + 1) >= 16384)
    {
        for (int j0 = 0; j0 <= maxpos; j0 += K3_MLA_TILE)
            attend_tile(m, cache, pos0, n, r0, R, j0,
                        maxpos + 1 - j0 < K3_MLA_TILE ? maxpos + 1 - j0 : K3_MLA_TILE, scale, ws);
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++) { /* the last tile's rescale, then the sum */
            rescale_row(ws, r, lora, pos0 + (r0 + r) % n, last);
            float *acc = ws->acc + (size_t)r * lora, l = ws->l[r];
            for (int i = 0; i < lora; i++) acc[i] = acc[i] / l;
        }
    }
}

/* o[q][h] = W_uv · acc for the block's rows: per head one product over its rows (W_uv of head
 * h is kv_b_proj's rows h·(nope + v) + nope .. + v), scattered to o [n][H][v]. */
static void up_project(const k3_model *m, const k3_mla_weights *w, int n, int r0, int r1,
                       k3_mla_ws *ws, float *o) {
    const k3_config *c = &m->cfg;
    int H = c->num_attention_heads, nope = c->qk_nope_head_dim, vd = c->v_head_dim;
    int lora = c->kv_lora_rank;
    const k3_mat *kvb = &w->kv_b_proj;
    /* one region over the heads (each product then runs on its thread): one fork, not H */
#pragma omp parallel for schedule(static) if ((int64_t)(r1 - r0) * vd * lora >= 65536)
    for (int h = r0 / n; h <= (r1 - 1) / n; h++) {
        int a = h * n > r0 ? h * n : r0, z = (h + 1) * n < r1 ? (h + 1) * n : r1;
        int64_t row0 = (int64_t)h * (nope + vd) + nope;
        size_t esize = kvb->dtype == K3_DT_BF16 ? 2 : kvb->dtype == K3_DT_F32 ? 4 : 1;
        k3_mat wuv = {.data = (const char *)kvb->data + (size_t)row0 * kvb->cols * esize,
                      .dtype = kvb->dtype, .rows = vd, .cols = lora,
                      .scale = kvb->scale ? kvb->scale + row0 : NULL};
        float *ov = ws->ov + (size_t)(a - r0) * vd; /* this head's rows of ov */
        k3_matmul(m->kr, &wuv, ws->acc + (size_t)(a - r0) * lora, z - a, ov);
        for (int r = a; r < z; r++)
            memcpy(o + ((size_t)(r % n) * H + h) * vd, ov + (size_t)(r - a) * vd,
                   (size_t)vd * sizeof(float));
    }
}

void k3_mla_attend(const k3_model *m, const k3_layer *L, const k3_state *s, int pos0, int n,
                   const float *Q, k3_mla_ws *ws, float *o) {
    int rows = m->cfg.num_attention_heads * n;
    const float *cache = k3_mla_row(s, L->state_slot, 0);
    if (m->mla_oracle) { /* tests only (model.h) */
        m->mla_oracle(m->mla_oracle_user, m, L, cache, pos0, n, Q, o);
        return;
    }
    for (int r0 = 0; r0 < rows; r0 += ws->rows) {
        int r1 = rows - r0 < ws->rows ? rows : r0 + ws->rows;
        absorb(m, &L->mla, Q, n, r0, r1, ws);
        attend_block(m, cache, pos0, n, r0, r1, ws);
        up_project(m, &L->mla, n, r0, r1, ws, o);
    }
}

void k3_mla_forward(const k3_model *m, const k3_layer *L, k3_state *s, const float *x,
                    float *out) {
    const k3_config *c = &m->cfg;
    const k3_mla_weights *w = &L->mla;
    int H = c->num_attention_heads, vd = c->v_head_dim, lora = c->kv_lora_rank, t = s->pos;

    k3_matvec(m->kr, &w->q_a_proj, x, s->cq);
    k3_rmsnorm(s->cq, &w->q_a_layernorm, c->q_lora_rank, MLA_LORA_EPS, s->cq);
    k3_matvec(m->kr, &w->q_b_proj, s->cq, s->Q);
    k3_matvec(m->kr, &w->kv_a_proj, x, s->ckv);
    k3_rmsnorm(s->ckv, &w->kv_a_layernorm, lora, MLA_LORA_EPS, s->ckv); /* latent part only */
    k3_mla_append(m, L, s, t, s->ckv); /* this position, then attend over 0..t */
    k3_mla_attend(m, L, s, t, 1, s->Q, s->mla_ws, s->o);
    /* Output gate on the normed layer input, then o_proj (spec §7.4). */
    k3_matvec(m->kr, &w->g_proj, x, s->g);
    for (int i = 0; i < H * vd; i++) s->o[i] = s->o[i] * k3_sigmoid(s->g[i]);
    k3_matvec(m->kr, &w->o_proj, s->o, out);
}

void k3_mla_attend_rows(const k3_model *m, int layer, k3_state *s, k3_batch *b, int pos0, int n,
                        const float *Q, float *o) {
    k3_mla_attend(m, &m->layers[layer], s, pos0, n, Q, b ? b->mla_ws : s->mla_ws, o);
}
