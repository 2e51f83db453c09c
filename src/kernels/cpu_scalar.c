/* cpu_scalar.c — the scalar reference path (spec §2): every dot product sums ascending into
 * one f32 accumulator with separate multiply and add. The SIMD paths are tested against it. */
#include <math.h>

#include "dispatch.h"

const float k3_e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                           -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* Four rows at a time: four independent sequential sums give the CPU parallel work without
 * changing any row's order of operations. */
static void rows_bf16(const uint16_t *w, int64_t cols, const float *x, float *y, int64_t r0,
                      int64_t r1) {
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        const uint16_t *a = w + r * cols, *b = a + cols, *c = b + cols, *d = c + cols;
        float sa = 0, sb = 0, sc = 0, sd = 0;
        for (int64_t i = 0; i < cols; i++) {
            float xi = x[i];
            sa += k3_bf16_to_f32(a[i]) * xi;
            sb += k3_bf16_to_f32(b[i]) * xi;
            sc += k3_bf16_to_f32(c[i]) * xi;
            sd += k3_bf16_to_f32(d[i]) * xi;
        }
        y[r] = sa, y[r + 1] = sb, y[r + 2] = sc, y[r + 3] = sd;
    }
    for (; r < r1; r++) {
        const uint16_t *a = w + r * cols;
        float s = 0;
        for (int64_t i = 0; i < cols; i++) s += k3_bf16_to_f32(a[i]) * x[i];
        y[r] = s;
    }
}

static void bf16(const uint16_t *w, int64_t rows, int64_t cols, const float *x, int n, float *y,
                 int64_t r0, int64_t r1) {
    for (int b = 0; b < n; b++) rows_bf16(w, cols, x + b * cols, y + b * rows, r0, r1);
}

static void f32(const float *w, int64_t rows, int64_t cols, const float *x, int n, float *y,
                int64_t r0, int64_t r1) {
    for (int b = 0; b < n; b++)
        for (int64_t r = r0; r < r1; r++) {
            const float *a = w + r * cols, *xb = x + b * cols;
            float s = 0;
            for (int64_t i = 0; i < cols; i++) s += a[i] * xb[i];
            y[b * rows + r] = s;
        }
}

/* Each weight is (E2M1 value · scale), then times x, as the spec's dequantize-then-matmul. */
static void mxfp4(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols,
                  const float *x, int n, float *y, int64_t r0, int64_t r1) {
    int64_t ngroups = cols / 32;
    for (int b = 0; b < n; b++)
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *p = packed + r * (cols / 2), *sc = scale + r * ngroups;
            const float *xb = x + b * cols;
            float s = 0;
            for (int64_t g = 0; g < ngroups; g++) {
                float gs = k3_e8m0_to_f32(sc[g]);
                const uint8_t *pg = p + g * 16;
                const float *xg = xb + g * 32;
                for (int j = 0; j < 16; j++) {
                    s += (k3_e2m1[pg[j] & 15] * gs) * xg[2 * j];
                    s += (k3_e2m1[pg[j] >> 4] * gs) * xg[2 * j + 1];
                }
            }
            y[b * rows + r] = s;
        }
}

static float dot(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy(float a, const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = y[i] + a * x[i];
}

/* Decay, read, write (β·k_i)·δ_j, then o = Sᵀq with the updated S (fla naive order); the
 * per-row steps are dispatch.h's, which the SIMD paths run on their last columns. */
static void kda_delta(float *S, const float *q, const float *k, const float *v,
                      const float *alpha, float beta, int d, float *u, float *o) {
    for (int j = 0; j < d; j++) u[j] = 0;
    for (int i = 0; i < d; i++) k3_kda_decay_cols(S + (size_t)i * d, alpha[i], k[i], u, 0, d);
    for (int j = 0; j < d; j++) u[j] = v[j] - u[j]; /* δ */
    for (int j = 0; j < d; j++) o[j] = 0;
    for (int i = 0; i < d; i++) k3_kda_write_cols(S + (size_t)i * d, beta * k[i], u, q[i], o, 0, d);
}

/* k3_matmul_xw's reference order: per output one sum over i ascending from 0, multiply then
 * add; y's row is the accumulator, so w's rows are read in order. */
static void xw(const float *w, int64_t ldw, int64_t k, const float *x, int64_t ldx, int n,
               float *y, int64_t ldy, int64_t c0, int64_t c1) {
    for (int b = 0; b < n; b++) {
        float *yb = y + b * ldy;
        for (int64_t c = c0; c < c1; c++) yb[c] = 0;
        for (int64_t i = 0; i < k; i++) {
            float xi = x[b * ldx + i];
            const float *wi = w + i * ldw;
            for (int64_t c = c0; c < c1; c++) yb[c] = yb[c] + xi * wi[c];
        }
    }
}

/* The reference order of k3_softmax_exp (kernels.h): lane j % K3_SM_LANES takes element j's
 * max and sum, in ascending j; the SIMD paths keep K3_SM_LANES / W vectors of lanes. */
static float softmax_exp(const float *s, int64_t n, float scale, float *m, float *p) {
    float lane[K3_SM_LANES];
    for (int l = 0; l < K3_SM_LANES; l++) lane[l] = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        float t = s[j] * scale, *a = lane + j % K3_SM_LANES;
        *a = t > *a ? t : *a;
    }
    float mt = k3_sm_max(lane), mn = mt > *m ? mt : *m;
    *m = mn;
    for (int l = 0; l < K3_SM_LANES; l++) lane[l] = 0;
    for (int64_t j = 0; j < n; j++) {
        p[j] = k3_exp_steps(s[j] * scale - mn);
        lane[j % K3_SM_LANES] = lane[j % K3_SM_LANES] + p[j];
    }
    return k3_sm_sum(lane);
}

const k3_kernels k3_kernels_scalar = {
    .name = "scalar",
    .bf16 = bf16,
    .f32 = f32,
    .mxfp4 = mxfp4,
    .bf16lx = k3_rows_bf16lx,
    .dot = dot,
    .axpy = axpy,
    .kda_delta = kda_delta,
    .xw = xw,
    .softmax_exp = softmax_exp,
};
