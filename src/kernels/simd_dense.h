/* simd_dense.h — the BF16 / F32 products and the element-wise helpers of the x86 SIMD paths,
 * written once over per-ISA lane macros (the idea of ggml-cpu's simd-mappings.h) and included
 * by cpu_avx2.c (8 lanes) and cpu_avx512.c (16 lanes) inside their target pragma. Internal to
 * src/kernels.
 *
 * The includer defines, before including: W (f32 lanes), VF (the vector type), VZERO, VLOADU,
 * VLOADA, VSTOREU, VSTOREA, VFMA, VADD, VMUL, VSET1, VBF16 (W BF16 values widened), the
 * functions hsum (the fixed lane sum) and load_tail (a masked load of fewer than W floats), the
 * unroll pragmas UNROLL and UNROLL_V, the register-blocking choices SMALL_ACC, SMALL_R4 and
 * SMALL_R5, and simd_gemm.h's GEMM_R, GEMM_V, GEMM_RB and GEMM_KC.
 *
 * Exactness: the macros stand for the one intrinsic each ISA has for the operation, so each
 * path runs the same sequence of f32 operations it ran when the two files were written out
 * separately (the lane recipe of cpu_avx2.c's comment: one accumulator per (row, vector), lane
 * l takes columns l, l+W, ..., a zero-padded last step, then hsum); the bits are unchanged.
 * The register blocking (GEMM_*, SMALL_R*) only groups independent (row, vector) sums, so it
 * changes no result either. The MXFP4 loops differ in their decode and stay in each file. */

/* p[0..n) for 0 < n < W as BF16 widened to f32, zeros above; never reads past p + n. */
static inline VF bf16_tail(const uint16_t *p, int64_t n) {
    uint16_t t[W] = {0};
    memcpy(t, p, (size_t)n * sizeof *p);
    return VBF16(t);
}

/* ---- matrix-vector (n = 1): four rows share each x load ---------------------------------- */

static void bf16_vec(const uint16_t *w, int64_t cols, const float *x, float *y, int64_t r0,
                     int64_t r1) {
    int64_t full = cols & ~(int64_t)(W - 1), tail = cols - full, r = r0;
    VF xt = tail ? load_tail(x + full, tail) : VZERO();
    for (; r + 4 <= r1; r += 4) {
        const uint16_t *a = w + r * cols, *b = a + cols, *c = b + cols, *d = c + cols;
        VF sa = VZERO(), sb = sa, sc = sa, sd = sa;
        for (int64_t i = 0; i < full; i += W) {
            VF xi = VLOADU(x + i);
            sa = VFMA(VBF16(a + i), xi, sa);
            sb = VFMA(VBF16(b + i), xi, sb);
            sc = VFMA(VBF16(c + i), xi, sc);
            sd = VFMA(VBF16(d + i), xi, sd);
        }
        if (tail) {
            sa = VFMA(bf16_tail(a + full, tail), xt, sa);
            sb = VFMA(bf16_tail(b + full, tail), xt, sb);
            sc = VFMA(bf16_tail(c + full, tail), xt, sc);
            sd = VFMA(bf16_tail(d + full, tail), xt, sd);
        }
        y[r] = hsum(sa), y[r + 1] = hsum(sb), y[r + 2] = hsum(sc), y[r + 3] = hsum(sd);
    }
    for (; r < r1; r++) {
        const uint16_t *a = w + r * cols;
        VF s = VZERO();
        for (int64_t i = 0; i < full; i += W)
            s = VFMA(VBF16(a + i), VLOADU(x + i), s);
        if (tail) s = VFMA(bf16_tail(a + full, tail), xt, s);
        y[r] = hsum(s);
    }
}

/* bf16_vec with plain loads; two functions rather than one over a load macro, so that each
 * reads as the loop it is. */
static void f32_vec(const float *w, int64_t cols, const float *x, float *y, int64_t r0,
                    int64_t r1) {
    int64_t full = cols & ~(int64_t)(W - 1), tail = cols - full, r = r0;
    VF xt = tail ? load_tail(x + full, tail) : VZERO();
    for (; r + 4 <= r1; r += 4) {
        const float *a = w + r * cols, *b = a + cols, *c = b + cols, *d = c + cols;
        VF sa = VZERO(), sb = sa, sc = sa, sd = sa;
        for (int64_t i = 0; i < full; i += W) {
            VF xi = VLOADU(x + i);
            sa = VFMA(VLOADU(a + i), xi, sa);
            sb = VFMA(VLOADU(b + i), xi, sb);
            sc = VFMA(VLOADU(c + i), xi, sc);
            sd = VFMA(VLOADU(d + i), xi, sd);
        }
        if (tail) {
            sa = VFMA(load_tail(a + full, tail), xt, sa);
            sb = VFMA(load_tail(b + full, tail), xt, sb);
            sc = VFMA(load_tail(c + full, tail), xt, sc);
            sd = VFMA(load_tail(d + full, tail), xt, sd);
        }
        y[r] = hsum(sa), y[r + 1] = hsum(sb), y[r + 2] = hsum(sc), y[r + 3] = hsum(sd);
    }
    for (; r < r1; r++) {
        const float *a = w + r * cols;
        VF s = VZERO();
        for (int64_t i = 0; i < full; i += W)
            s = VFMA(VLOADU(a + i), VLOADU(x + i), s);
        if (tail) s = VFMA(load_tail(a + full, tail), xt, s);
        y[r] = hsum(s);
    }
}

/* ---- batched BF16 / F32 (n > 1): widen a 16-row × 256-column tile once, use it for every
 * vector ---------------------------------------------------------------------------------- */

enum { SRC_BF16, SRC_F32 };
typedef struct wsrc {
    int kind;
    const void *w; /* BF16 or F32 data */
    int64_t cols;
} wsrc;

/* t[0 .. kc rounded up to W) = W[r][k0 .. k0 + kc), zero-padded: the very vectors the
 * matrix-vector loops compute in registers. */
static void tile_row(const wsrc *s, int64_t r, int64_t k0, int64_t kc, float *t) {
    int64_t full = kc & ~(int64_t)(W - 1), tail = kc - full;
    if (s->kind == SRC_BF16) {
        const uint16_t *p = (const uint16_t *)s->w + r * s->cols + k0;
        for (int64_t i = 0; i < full; i += W) VSTOREA(t + i, VBF16(p + i));
        if (tail) VSTOREA(t + full, bf16_tail(p + full, tail));
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
    wsrc s = {SRC_BF16, w, cols};
    gemm_dense(&s, rows, x, n, y, r0, r1);
}

static void f32(const float *w, int64_t rows, int64_t cols, const float *x, int n, float *y,
                int64_t r0, int64_t r1) {
    if (n == 1) {
        f32_vec(w, cols, x, y, r0, r1);
        return;
    }
    wsrc s = {SRC_F32, w, cols};
    gemm_dense(&s, rows, x, n, y, r0, r1);
}

static float dot(const float *a, const float *b, int64_t n) {
    int64_t full = n & ~(int64_t)(W - 1), tail = n - full;
    VF s = VZERO();
    for (int64_t i = 0; i < full; i += W)
        s = VFMA(VLOADU(a + i), VLOADU(b + i), s);
    if (tail) s = VFMA(load_tail(a + full, tail), load_tail(b + full, tail), s);
    return hsum(s);
}

/* Separate multiply and add, element by element: the scalar result exactly. */
static void axpy(float a, const float *x, float *y, int64_t n) {
    VF va = VSET1(a);
    int64_t i = 0;
    for (; i + W <= n; i += W)
        VSTOREU(y + i, VADD(VLOADU(y + i), VMUL(va, VLOADU(x + i))));
    for (; i < n; i++) y[i] = y[i] + a * x[i];
}

/* cpu_scalar.c's kda_delta vectorised over the value index j: each element sees the same
 * operations in the same order (no FMA), so the result is the scalar one exactly; the columns
 * past the last full vector run cpu_scalar.c's loop itself, on purpose. cpu_neon.c keeps its
 * own copy: it is built for another architecture, and this header is x86's. */
static void kda_delta(float *S, const float *q, const float *k, const float *v,
                      const float *alpha, float beta, int d, float *u, float *o) {
    int dv = d & ~(W - 1);
    for (int j = 0; j < d; j++) u[j] = 0;
    for (int i = 0; i < d; i++) {
        float *row = S + (size_t)i * d;
        VF al = VSET1(alpha[i]), ki = VSET1(k[i]);
        for (int j = 0; j < dv; j += W) {
            VF s = VMUL(VLOADU(row + j), al);
            VSTOREU(row + j, s);
            VSTOREU(u + j, VADD(VLOADU(u + j), VMUL(ki, s)));
        }
        for (int j = dv; j < d; j++) {
            row[j] = row[j] * alpha[i];
            u[j] = u[j] + k[i] * row[j];
        }
    }
    for (int j = 0; j < d; j++) u[j] = v[j] - u[j]; /* δ */
    for (int j = 0; j < d; j++) o[j] = 0;
    for (int i = 0; i < d; i++) {
        float bk = beta * k[i];
        float *row = S + (size_t)i * d;
        VF vbk = VSET1(bk), qi = VSET1(q[i]);
        for (int j = 0; j < dv; j += W) {
            VF s = VADD(VLOADU(row + j), VMUL(vbk, VLOADU(u + j)));
            VSTOREU(row + j, s);
            VSTOREU(o + j, VADD(VLOADU(o + j), VMUL(qi, s)));
        }
        for (int j = dv; j < d; j++) {
            row[j] = row[j] + bk * u[j];
            o[j] = o[j] + q[i] * row[j];
        }
    }
}
