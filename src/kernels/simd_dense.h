/* simd_dense.h — the BF16 / F32 / lossless products of the x86 SIMD paths, written once over
 * per-ISA lane macros (the idea of ggml-cpu's simd-mappings.h) and included by cpu_avx2.c
 * (8 lanes) and cpu_avx512.c (16 lanes) inside their target pragma. It includes simd_vec.h
 * (the matrix-vector loops and element-wise helpers, shared with cpu_neon.c) and simd_gemm.h
 * (the batched GEMM). Internal to src/kernels.
 *
 * The includer defines, before including: simd_vec.h's lane macros and functions (W, VF,
 * VZERO, VLOADU, VSTOREU, VFMA, VADD, VMUL, VSET1, VBF16, hsum, load_tail), VLOADA and
 * VSTOREA, the unroll pragmas UNROLL and UNROLL_V, the register-blocking choices SMALL_ACC,
 * SMALL_R4 and SMALL_R5, simd_gemm.h's GEMM_R, GEMM_V, GEMM_RB and GEMM_KC, and LX_JOIN (four
 * 8-lane vectors of a lossless group as 32 / W VFs).
 *
 * Exactness: the macros stand for the one intrinsic each ISA has for the operation, so each
 * path runs the same sequence of f32 operations it ran when the two files were written out
 * separately (the lane recipe of cpu_avx2.c's comment: one accumulator per (row, vector), lane
 * l takes columns l, l+W, ..., a zero-padded last step, then hsum); the bits are unchanged.
 * The register blocking (GEMM_*, SMALL_R*) only groups independent (row, vector) sums, so it
 * changes no result either. The MXFP4 decodes and micro-kernels differ and stay in each file;
 * their batched driver is simd_mxgemm.h's. */

#include "simd_vec.h" /* bf16_tail, bf16_vec, f32_vec, dot, axpy, kda_delta, softmax_exp, xw */

/* ---- batched BF16 / F32 / lossless (n > 1): tiles widened once for every vector, the GEMM
 * of simd_gemm.h ------------------------------------------------------------------------- */

enum { SRC_BF16, SRC_F32, SRC_LX };
typedef struct wsrc {
    int kind;
    const void *w; /* BF16 or F32 data */
    int64_t cols;
    const k3_mat *m;      /* SRC_LX: the lossless matrix */
    struct lx_cur *cur;   /* SRC_LX: [GEMM_RB] escape cursors of the tile's rows (r % GEMM_RB) */
} wsrc;

static void lx_tile_row(const wsrc *s, int64_t r, int64_t k0, int64_t kc, float *t);

/* t[0 .. kc rounded up to W) = W[r][k0 .. k0 + kc), zero-padded: the very vectors the
 * matrix-vector loops compute in registers. */
static void tile_row(const wsrc *s, int64_t r, int64_t k0, int64_t kc, float *t) {
    int64_t full = kc & ~(int64_t)(W - 1), tail = kc - full;
    if (s->kind == SRC_BF16) {
        const uint16_t *p = (const uint16_t *)s->w + r * s->cols + k0;
        for (int64_t i = 0; i < full; i += W) VSTOREA(t + i, VBF16(p + i));
        if (tail) VSTOREA(t + full, bf16_tail(p + full, tail));
    } else if (s->kind == SRC_LX) {
        lx_tile_row(s, r, k0, kc, t);
    } else {
        const float *p = (const float *)s->w + r * s->cols + k0;
        for (int64_t i = 0; i < full; i += W) VSTOREA(t + i, VLOADU(p + i));
        if (tail) VSTOREA(t + full, load_tail(p + full, tail));
    }
}


#include "simd_gemm.h" /* gemm_dense: the batched product (n > BF16_SMALL) */

/* ---- BF16 small batches (2 <= n <= BF16_SMALL): straight from registers ---------------- */

/* Widest batch taken from registers; above it the tiles. Chunked prefill's per-expert and
 * speculative verification's batches are this small; the tile path cost ~2.6x a matrix-vector
 * product at n = 2, this ~1x while the weights stream from memory (AVX2). */
#define BF16_SMALL 5

/* y[v·rows + r + i] = W[r + i] · x[v] for rows i < R and vectors v < V: each W-weight vector is
 * widened once and meets all V inputs; per (row, vector) the lane recipe exactly (full steps,
 * then the masked tail step, then hsum), so the bits equal bf16_vec's. R·V <= SMALL_ACC
 * accumulators; R and V are constants at each call. */
static inline __attribute__((always_inline)) void bf16_rows(const uint16_t *w, int64_t rows,
                                                            int64_t cols, const float *x,
                                                            int V, int R, float *y, int64_t r) {
    int64_t full = cols & ~(int64_t)(W - 1), tail = cols - full;
    VF acc[SMALL_ACC];
    UNROLL_V
    for (int k = 0; k < R * V; k++) acc[k] = VZERO();
    for (int64_t i = 0; i < full; i += W)
        UNROLL
        for (int q = 0; q < R; q++) {
            VF wq = VBF16(w + (r + q) * cols + i);
            UNROLL_V
            for (int v = 0; v < V; v++)
                acc[q * V + v] = VFMA(wq, VLOADU(x + v * cols + i), acc[q * V + v]);
        }
    if (tail)
        UNROLL
        for (int q = 0; q < R; q++) {
            VF wq = bf16_tail(w + (r + q) * cols + full, tail);
            UNROLL_V
            for (int v = 0; v < V; v++)
                acc[q * V + v] = VFMA(wq, load_tail(x + v * cols + full, tail), acc[q * V + v]);
        }
    UNROLL
    for (int q = 0; q < R; q++)
        UNROLL_V
        for (int v = 0; v < V; v++) y[v * rows + r + q] = hsum(acc[q * V + v]);
}

#define BF16_RUN(R_, V_)                                                              \
    do {                                                                              \
        for (; r + (R_) <= r1; r += (R_)) bf16_rows(w, rows, cols, x, (V_), (R_), y, r); \
        for (; r < r1; r++) bf16_rows(w, rows, cols, x, (V_), 1, y, r);              \
    } while (0)

static void bf16_small(const uint16_t *w, int64_t rows, int64_t cols, const float *x, int n,
                       float *y, int64_t r0, int64_t r1) {
    int64_t r = r0;
    switch (n) {
    case 2: BF16_RUN(4, 2); break;
    case 3: BF16_RUN(4, 3); break;
    case 4: BF16_RUN(SMALL_R4, 4); break;
    default: BF16_RUN(SMALL_R5, 5); break;
    }
}
#undef BF16_RUN

/* ---- lossless BF16 (K3_DT_BF16LX, kernels.h): decoded in registers, then the BF16 recipe -- */

/* The 32 high bytes of a group by position (one vpshufb of the 16-entry table, both lanes):
 * lane 0 takes the low nibbles (positions 0..15), lane 1 the high ones (16..31). */
static inline __m256i lx_hi(const uint8_t *g, __m256i tab) {
    __m256i c = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)g));
    __m256i idx = _mm256_srlv_epi32(c, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_shuffle_epi8(tab, _mm256_and_si256(idx, _mm256_set1_epi8(15)));
}

/* Row escape cursor: the next escape's index and its column (INT64_MAX past the row's last),
 * so that the per-group test is one compare of a register. */
typedef struct lx_cur {
    uint32_t e, end;
    int64_t next;
} lx_cur;

static inline void lx_cur_init(const k3_mat *m, int64_t r, const uint32_t *list, lx_cur *c) {
    k3_lx_row_escapes(m, r, &c->e, &c->end);
    c->next = c->e < c->end ? (int64_t)(list[c->e] >> 8) : INT64_MAX;
}

/* Writes the group's escapes (consumed from the cursor) into hi, each with one byte compare
 * and blend in registers. Rare (a group of 32 holds an escape with probability 0.6% at
 * k3-tiny-kjv's 0.02% escapes). */
static inline __m256i lx_patch(__m256i hi, const uint32_t *list, lx_cur *c, int64_t c0) {
    const __m256i iota = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                                          16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,
                                          29, 30, 31);
    do { /* a corrupt list stays inside: & 31, and the cursor only moves forward */
        uint32_t x = list[c->e++];
        int p = k3_lx_pos((int)(c->next - c0) & 31);
        __m256i at = _mm256_cmpeq_epi8(iota, _mm256_set1_epi8((char)p));
        hi = _mm256_blendv_epi8(hi, _mm256_set1_epi8((char)(x & 0xff)), at);
        c->next = c->e < c->end ? (int64_t)(list[c->e] >> 8) : INT64_MAX;
    } while (c->next < c0 + K3_LX_GROUP);
    return hi;
}

/* A whole group (c0 + 32 <= cols) as 32 / W vectors in column order: (low, high) byte pairs
 * interleave into BF16 words (vpunpck*bw), the words into f32 bits (vpunpck*wd against zero:
 * word << 16), and the position order makes each 8-lane result 8 consecutive columns. */
static inline void lx_group(const uint8_t *g, __m256i tab, const uint32_t *list, lx_cur *c,
                            int64_t c0, VF *v) {
    __m256i hi = lx_hi(g, tab), z = _mm256_setzero_si256();
    if (__builtin_expect(c->next < c0 + K3_LX_GROUP, 0)) hi = lx_patch(hi, list, c, c0);
    __m256i lo = _mm256_loadu_si256((const __m256i *)(g + 16));
    __m256i b0 = _mm256_unpacklo_epi8(lo, hi), b1 = _mm256_unpackhi_epi8(lo, hi);
    __m256 v8[4] = {_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, b0)),
                    _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, b0)),
                    _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, b1)),
                    _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, b1))};
    LX_JOIN(v8, v);
}

#define LX_STEPS (K3_LX_GROUP / W)
#ifndef LX_PF
#define LX_PF 768 /* software prefetch, bytes ahead in each row (16 groups): with it four
                   * rows streamed at ~0.7x BF16s time per row from DRAM, without it
                   * 0.8-1.2x (2-vCPU VM, BENCHMARKS.md) */
#endif

/* The last, partial group of a row (c0 + 32 > cols): decoded to BF16 in column order, then
 * exactly bf16_vec's last steps (full steps, then the tail step with xt). */
static inline VF lx_last(const uint8_t *g, const k3_mat *m, const uint32_t *list, lx_cur *c,
                         int64_t c0, const float *x, VF xt, VF s) {
    uint16_t t[K3_LX_GROUP];
    int64_t full = m->cols & ~(int64_t)(W - 1);
    k3_lx_group_u16(g, m->xtab, list, &c->e, c->end, c0, m->cols, t);
    for (int64_t i = c0; i < full; i += W) s = VFMA(VBF16(t + (i - c0)), VLOADU(x + i), s);
    if (full < m->cols) s = VFMA(VBF16(t + (full - c0)), xt, s);
    return s;
}

/* Rows r .. r + R - 1 (R a constant at each call: the accumulators stay in registers), each
 * row's operations those of bf16_vec. */
static inline __attribute__((always_inline)) void lx_rows(const k3_mat *m, const float *x,
                                                          VF xt, __m256i tab, float *y,
                                                          int64_t r, int R) {
    int64_t cols = m->cols, ng = cols / K3_LX_GROUP;
    uint64_t rb = k3_lx_row_bytes(cols);
    const uint32_t *list = m->esc + m->rows + 1;
    const uint8_t *row = (const uint8_t *)m->data + (uint64_t)r * rb;
    lx_cur c[4];
    VF s[4];
    UNROLL
    for (int q = 0; q < R; q++) lx_cur_init(m, r + q, list, &c[q]), s[q] = VZERO();
    for (int64_t gi = 0; gi < ng; gi++) {
        const float *xg = x + gi * K3_LX_GROUP;
        UNROLL
        for (int q = 0; q < R; q++) {
            VF v[LX_STEPS];
            _mm_prefetch((const char *)(row + q * rb + gi * K3_LX_GROUP_BYTES + LX_PF), _MM_HINT_T0);
            lx_group(row + q * rb + gi * K3_LX_GROUP_BYTES, tab, list, &c[q], gi * K3_LX_GROUP, v);
            UNROLL
            for (int j = 0; j < LX_STEPS; j++) s[q] = VFMA(v[j], VLOADU(xg + j * W), s[q]);
        }
    }
    if (ng * K3_LX_GROUP < cols)
        for (int q = 0; q < R; q++)
            s[q] = lx_last(row + q * rb + ng * K3_LX_GROUP_BYTES, m, list, &c[q],
                           ng * K3_LX_GROUP, x, xt, s[q]);
    UNROLL
    for (int q = 0; q < R; q++) y[r + q] = hsum(s[q]);
}

/* Matrix-vector rows [r0, r1), four rows at a time (four FMA chains). */
static void lx_vec(const k3_mat *m, const float *x, float *y, int64_t r0, int64_t r1) {
    int64_t cols = m->cols, full = cols & ~(int64_t)(W - 1), r = r0;
    __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)m->xtab));
    VF xt = full < cols ? load_tail(x + full, cols - full) : VZERO();
    for (; r + 4 <= r1; r += 4) lx_rows(m, x, xt, tab, y, r, 4);
    for (; r < r1; r++) lx_rows(m, x, xt, tab, y, r, 1);
}

/* Small batches (2 <= n <= BF16_SMALL) from registers, as bf16_rows: each group of R rows is
 * decoded once and meets all V vectors; per (row, vector) the operations of lx_vec exactly,
 * so the bits are bf16_vec's. R and V are constants at each call. */
static inline __attribute__((always_inline)) void lx_rows_v(const k3_mat *m, const float *x,
                                                            __m256i tab, float *y, int64_t r,
                                                            int R, int V) {
    int64_t cols = m->cols, rows = m->rows, ng = cols / K3_LX_GROUP;
    int64_t full = cols & ~(int64_t)(W - 1), tail = cols - full;
    uint64_t rb = k3_lx_row_bytes(cols);
    const uint32_t *list = m->esc + m->rows + 1;
    const uint8_t *row = (const uint8_t *)m->data + (uint64_t)r * rb;
    lx_cur c[4];
    VF acc[4 * BF16_SMALL];
    UNROLL
    for (int q = 0; q < R; q++) lx_cur_init(m, r + q, list, &c[q]);
    UNROLL_V
    for (int k = 0; k < R * V; k++) acc[k] = VZERO();
    for (int64_t gi = 0; gi < ng; gi++)
        UNROLL
        for (int q = 0; q < R; q++) {
            VF v[LX_STEPS];
            _mm_prefetch((const char *)(row + q * rb + gi * K3_LX_GROUP_BYTES + LX_PF), _MM_HINT_T0);
            lx_group(row + q * rb + gi * K3_LX_GROUP_BYTES, tab, list, &c[q], gi * K3_LX_GROUP, v);
            UNROLL
            for (int j = 0; j < LX_STEPS; j++)
                UNROLL_V
                for (int b = 0; b < V; b++)
                    acc[q * V + b] = VFMA(v[j], VLOADU(x + b * cols + gi * K3_LX_GROUP + j * W),
                                          acc[q * V + b]);
        }
    if (ng * K3_LX_GROUP < cols)
        for (int q = 0; q < R; q++) {
            uint16_t t[K3_LX_GROUP];
            int64_t c0 = ng * K3_LX_GROUP;
            k3_lx_group_u16(row + q * rb + ng * K3_LX_GROUP_BYTES, m->xtab, list, &c[q].e,
                            c[q].end, c0, cols, t);
            for (int b = 0; b < V; b++) {
                VF s = acc[q * V + b];
                for (int64_t i = c0; i < full; i += W)
                    s = VFMA(VBF16(t + (i - c0)), VLOADU(x + b * cols + i), s);
                if (tail) s = VFMA(VBF16(t + (full - c0)), load_tail(x + b * cols + full, tail), s);
                acc[q * V + b] = s;
            }
        }
    UNROLL
    for (int q = 0; q < R; q++)
        UNROLL_V
        for (int b = 0; b < V; b++) y[b * rows + r + q] = hsum(acc[q * V + b]);
}

#define LX_RUN(R_, V_)                                                                 \
    do {                                                                               \
        for (; r + (R_) <= r1; r += (R_)) lx_rows_v(m, x, tab, y, r, (R_), (V_));      \
        for (; r < r1; r++) lx_rows_v(m, x, tab, y, r, 1, (V_));                       \
    } while (0)

static void lx_small(const k3_mat *m, const float *x, int n, float *y, int64_t r0, int64_t r1) {
    __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)m->xtab));
    int64_t r = r0;
    switch (n) {
    case 2: LX_RUN(LX_SMALL_R2, 2); break;
    case 3: LX_RUN(LX_SMALL_R2, 3); break;
    case 4: LX_RUN(LX_SMALL_R4, 4); break;
    default: LX_RUN(LX_SMALL_R4, 5); break;
    }
}
#undef LX_RUN

/* Batched: gemm_dense (simd_gemm.h) with each tile row decoded as above (the very vectors
 * lx_vec computes, stored), so row b equals lx_vec of x[b] bit for bit, and the product the
 * BF16 one of the matrix encoded. s->cur[r % GEMM_RB] is row r's escape cursor across its
 * tiles (the rows of one row block are distinct modulo GEMM_RB, each row's tiles are decoded
 * in column order, and a block's rows are done before the next block's first are decoded;
 * GEMM_KC is a multiple of K3_LX_GROUP, so groups never straddle tiles). */
static void lx_tile_row(const wsrc *s, int64_t r, int64_t k0, int64_t kc, float *t) {
    const k3_mat *m = s->m;
    const uint8_t *row = (const uint8_t *)m->data + (uint64_t)r * k3_lx_row_bytes(m->cols);
    const uint32_t *list = m->esc + m->rows + 1;
    __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)m->xtab));
    lx_cur *c = &s->cur[r % GEMM_RB];
    if (k0 == 0) lx_cur_init(m, r, list, c);
    for (int64_t c0 = k0; c0 < k0 + kc; c0 += K3_LX_GROUP) {
        const uint8_t *g = row + c0 / K3_LX_GROUP * K3_LX_GROUP_BYTES;
        float *o = t + (c0 - k0);
        if (c0 + K3_LX_GROUP <= m->cols) {
            VF v[LX_STEPS];
            lx_group(g, tab, list, c, c0, v);
            for (int j = 0; j < LX_STEPS; j++) VSTOREA(o + j * W, v[j]);
        } else { /* zeros past cols, as bf16_tail */
            uint16_t u[K3_LX_GROUP];
            k3_lx_group_u16(g, m->xtab, list, &c->e, c->end, c0, m->cols, u);
            for (int64_t i = 0; i < m->cols - c0; i += W) VSTOREA(o + i, VBF16(u + i));
        }
    }
}

_Static_assert(GEMM_KC % K3_LX_GROUP == 0, "lossless groups stay whole in a tile");

static void lx_tiles(const k3_mat *m, const float *x, int n, float *y, int64_t r0, int64_t r1) {
    lx_cur cur[GEMM_RB];
    wsrc s = {SRC_LX, NULL, m->cols, m, cur};
    gemm_dense(&s, m->rows, x, n, y, r0, r1);
}

static void bf16lx(const k3_mat *m, const float *x, int n, float *y, int64_t r0, int64_t r1) {
    if (n == 1)
        lx_vec(m, x, y, r0, r1);
    else if (n <= BF16_SMALL)
        lx_small(m, x, n, y, r0, r1);
    else
        lx_tiles(m, x, n, y, r0, r1);
}

/* ---- the table's entries -------------------------------------------------------------- */

static void bf16(const uint16_t *w, int64_t rows, int64_t cols, const float *x, int n, float *y,
                 int64_t r0, int64_t r1) {
    if (n == 1) {
        bf16_vec(w, cols, x, y, r0, r1);
        return;
    }
    if (n <= BF16_SMALL) {
        bf16_small(w, rows, cols, x, n, y, r0, r1);
        return;
    }
    wsrc s = {SRC_BF16, w, cols, NULL, NULL};
    gemm_dense(&s, rows, x, n, y, r0, r1);
}

