/* simd_vec.h — the matrix-vector BF16 / F32 loops (n = 1), the element-wise helpers (dot,
 * axpy, kda_delta, softmax_exp) and, through simd_xw.h, k3_matmul_xw's product, of every SIMD
 * path, written once over per-ISA lane macros and included by simd_dense.h (AVX2: 8 lanes,
 * AVX-512F: 16) and cpu_neon.c (4 lanes) inside their target pragma. Internal to
 * src/kernels. K3_SIMD_TABLE below names a SIMD path's table entries.
 *
 * The includer defines, before including: W (f32 lanes), VF (the vector type), VZERO, VLOADU,
 * VSTOREU, VFMA(a, b, c) (= a·b + c, one rounding), VADD, VSUB, VMUL, VSET1, VMAX(a, b)
 * (= a > b ? a : b lane-wise: NaN in a gives b, NaN in b gives b), VPOW2(t) (the f32 whose bits
 * are (bits of t + 127) << 23, lane-wise), VBF16 (W BF16 values widened), and the functions hsum (the fixed lane sum) and load_tail (fewer than W floats,
 * zeros above, never reading past them).
 *
 * Exactness: each macro stands for the one instruction its ISA has for the operation, so every
 * path runs the sequence of f32 operations its own copy ran before these loops were shared —
 * the lane recipe of kernels.h: one accumulator per row, lane l takes columns l, l+W, ..., a
 * zero-padded last step, then hsum — and the bits are unchanged. Four rows side by side only
 * run four independent sums at once. */

/* p[0..n) for 0 < n < W as BF16 widened to f32, zeros above; never reads past p + n. */
static inline VF bf16_tail(const uint16_t *p, int64_t n) {
    uint16_t t[W] = {0};
    memcpy(t, p, (size_t)n * sizeof *p);
    return VBF16(t);
}

/* ---- matrix-vector (n = 1): four rows share each x load ---------------------------------- */

/* W weights from element i of a BF16 (bf) or F32 matrix as f32, and the last n < W of a row
 * (zeros above, never reading past them). bf is a constant at each call: each loop below is
 * compiled with only its own load, as when BF16 and F32 were written out separately. */
static inline __attribute__((always_inline)) VF vec_w(const void *w, int bf, int64_t i) {
    return bf ? VBF16((const uint16_t *)w + i) : VLOADU((const float *)w + i);
}
static inline __attribute__((always_inline)) VF vec_w_tail(const void *w, int bf, int64_t i,
                                                           int64_t n) {
    return bf ? bf16_tail((const uint16_t *)w + i, n) : load_tail((const float *)w + i, n);
}

/* y[r] = W[r] · x for rows [r0, r1) of a BF16 (bf) or F32 matrix: the lane recipe per row,
 * four rows at a time (four independent FMA chains sharing each x load), then one at a time. */
static inline __attribute__((always_inline)) void dense_vec(const void *w, int bf, int64_t cols,
                                                            const float *x, float *y, int64_t r0,
                                                            int64_t r1) {
    int64_t full = cols & ~(int64_t)(W - 1), tail = cols - full, r = r0;
    VF xt = tail ? load_tail(x + full, tail) : VZERO();
    for (; r + 4 <= r1; r += 4) {
        int64_t a = r * cols, b = a + cols, c = b + cols, d = c + cols;
        VF sa = VZERO(), sb = sa, sc = sa, sd = sa;
        for (int64_t i = 0; i < full; i += W) {
            VF xi = VLOADU(x + i);
            sa = VFMA(vec_w(w, bf, a + i), xi, sa);
            sb = VFMA(vec_w(w, bf, b + i), xi, sb);
            sc = VFMA(vec_w(w, bf, c + i), xi, sc);
            sd = VFMA(vec_w(w, bf, d + i), xi, sd);
        }
        if (tail) {
            sa = VFMA(vec_w_tail(w, bf, a + full, tail), xt, sa);
            sb = VFMA(vec_w_tail(w, bf, b + full, tail), xt, sb);
            sc = VFMA(vec_w_tail(w, bf, c + full, tail), xt, sc);
            sd = VFMA(vec_w_tail(w, bf, d + full, tail), xt, sd);
        }
        y[r] = hsum(sa), y[r + 1] = hsum(sb), y[r + 2] = hsum(sc), y[r + 3] = hsum(sd);
    }
    for (; r < r1; r++) {
        int64_t a = r * cols;
        VF s = VZERO();
        for (int64_t i = 0; i < full; i += W) s = VFMA(vec_w(w, bf, a + i), VLOADU(x + i), s);
        if (tail) s = VFMA(vec_w_tail(w, bf, a + full, tail), xt, s);
        y[r] = hsum(s);
    }
}

static void bf16_vec(const uint16_t *w, int64_t cols, const float *x, float *y, int64_t r0,
                     int64_t r1) {
    dense_vec(w, 1, cols, x, y, r0, r1);
}

static void f32_vec(const float *w, int64_t cols, const float *x, float *y, int64_t r0,
                    int64_t r1) {
    dense_vec(w, 0, cols, x, y, r0, r1);
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
 * past the last full vector run the scalar path's own steps (dispatch.h), on purpose. */
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
        k3_kda_decay_cols(row, alpha[i], k[i], u, dv, d);
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
        k3_kda_write_cols(row, bk, u, q[i], o, dv, d);
    }
}

/* The kernel table of a SIMD path, whose file defines the entries under these names. One
 * definition so that a new entry in k3_kernels (dispatch.h) is added to every SIMD path. */
/* k3_exp_steps (dispatch.h) lane-wise: the same IEEE operations, so the same bits. */
static inline __attribute__((always_inline)) VF exp_steps(VF x) {
    x = VMAX(VSET1(K3_EXP_LO), x);
    VF t = VADD(VMUL(x, VSET1(K3_EXP_LOG2E)), VSET1(K3_EXP_ROUND));
    VF n = VSUB(t, VSET1(K3_EXP_ROUND));
    VF r = VSUB(x, VMUL(n, VSET1(K3_EXP_C1)));
    r = VSUB(r, VMUL(n, VSET1(K3_EXP_C2)));
    VF z = VMUL(r, r), y = VSET1(K3_EXP_P0);
    y = VADD(VMUL(y, r), VSET1(K3_EXP_P1));
    y = VADD(VMUL(y, r), VSET1(K3_EXP_P2));
    y = VADD(VMUL(y, r), VSET1(K3_EXP_P3));
    y = VADD(VMUL(y, r), VSET1(K3_EXP_P4));
    y = VADD(VMUL(y, r), VSET1(K3_EXP_P5));
    y = VADD(VADD(VMUL(y, z), r), VSET1(1.0f));
    return VMUL(y, VPOW2(t));
}

/* cpu_scalar.c's softmax_exp with K3_SM_LANES / W vectors holding the K3_SM_LANES lanes: each
 * lane sees the scalar path's operations in its order, the elements past the last full group
 * go to their lanes one by one, and the lanes fold as there (dispatch.h): the scalar bits. */
#define SM_V (K3_SM_LANES / W)
static float softmax_exp(const float *s, int64_t n, float scale, float *m, float *p) {
    _Alignas(64) float lane[K3_SM_LANES];
    int64_t full = n & ~(int64_t)(K3_SM_LANES - 1), j;
    VF sc = VSET1(scale), a[SM_V];
    for (int u = 0; u < SM_V; u++) a[u] = VSET1(-INFINITY);
    for (j = 0; j < full; j += K3_SM_LANES)
        for (int u = 0; u < SM_V; u++) a[u] = VMAX(VMUL(VLOADU(s + j + u * W), sc), a[u]);
    for (int u = 0; u < SM_V; u++) VSTOREU(lane + u * W, a[u]);
    for (; j < n; j++) {
        float t = s[j] * scale, *l = lane + j % K3_SM_LANES;
        *l = t > *l ? t : *l;
    }
    float mt = k3_sm_max(lane), mn = mt > *m ? mt : *m;
    *m = mn;
    VF vm = VSET1(mn);
    for (int u = 0; u < SM_V; u++) a[u] = VZERO();
    for (j = 0; j < full; j += K3_SM_LANES)
        for (int u = 0; u < SM_V; u++) {
            VF e = exp_steps(VSUB(VMUL(VLOADU(s + j + u * W), sc), vm));
            VSTOREU(p + j + u * W, e);
            a[u] = VADD(a[u], e);
        }
    for (int u = 0; u < SM_V; u++) VSTOREU(lane + u * W, a[u]);
    for (; j < n; j++) {
        p[j] = k3_exp_steps(s[j] * scale - mn);
        lane[j % K3_SM_LANES] = lane[j % K3_SM_LANES] + p[j];
    }
    return k3_sm_sum(lane);
}
#undef SM_V

#include "simd_xw.h" /* xw: k3_matmul_xw */

#define K3_SIMD_TABLE(var, isa)                                                          \
    const k3_kernels var = {                                                             \
        .name = isa,                                                                     \
        .bf16 = bf16,                                                                    \
        .f32 = f32,                                                                      \
        .mxfp4 = mxfp4,                                                                  \
        .bf16lx = bf16lx,                                                                \
        .mix = mix,                                                                      \
        .dot = dot,                                                                      \
        .axpy = axpy,                                                                    \
        .kda_delta = kda_delta,                                                          \
        .xw = xw,                                                                        \
        .softmax_exp = softmax_exp,                                                      \
    }
