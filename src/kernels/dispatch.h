/* dispatch.h — the per-CPU kernel tables behind kernels.h (internal to src/kernels).
 *
 * Each cpu_*.c file defines one const table. The products work on a row range so that
 * kernels.c can split rows across threads; a kernel must give every row the same result
 * whatever range it is called with (rows are never summed together), and must give row b
 * of a batch (n > 1) exactly what it gives that vector alone (n = 1): see kernels.h.
 */
#ifndef K3_DISPATCH_H
#define K3_DISPATCH_H

#include <math.h>

#include "kernels.h"

/* Most input vectors a product kernel takes at once; kernels.c splits larger batches. */
#define K3_MAX_BATCH 64

struct k3_kernels {
    const char *name;
    /* y[b*rows + r] = Σ_i W[r][i]·x[b*cols + i] for r0 <= r < r1 and b < n (1..K3_MAX_BATCH);
     * W [rows, cols] row-major. */
    void (*bf16)(const uint16_t *w, int64_t rows, int64_t cols, const float *x, int n,
                 float *y, int64_t r0, int64_t r1);
    void (*f32)(const float *w, int64_t rows, int64_t cols, const float *x, int n, float *y,
                int64_t r0, int64_t r1);
    /* The same for an MXFP4 matrix (packed [rows, cols/2], scale [rows, cols/32]). */
    void (*mxfp4)(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols,
                  const float *x, int n, float *y, int64_t r0, int64_t r1);
    /* The same for a lossless BF16 matrix (K3_DT_BF16LX, kernels.h): bit-identical to .bf16 on
     * the BF16 matrix it encodes. */
    void (*bf16lx)(const k3_mat *w, const float *x, int n, float *y, int64_t r0, int64_t r1);
    /* Runs instruction mix `which` (enum k3_mix) reps times on one thread from L1 and returns
     * the multiply-adds it did, or 0 where this path has no such loop. */
    int64_t (*mix)(int which, int64_t reps);
    float (*dot)(const float *a, const float *b, int64_t n);
    void (*axpy)(float a, const float *x, float *y, int64_t n);
    void (*kda_delta)(float *S, const float *q, const float *k, const float *v,
                      const float *alpha, float beta, int d, float *u, float *o);
    /* k3_matmul_xw (kernels.h): the same bits on every path. */
    void (*xw)(const float *w, int64_t ldw, int64_t k, const float *x, int64_t ldx, int n,
               float *y, int64_t ldy, int64_t c0, int64_t c1);
    /* k3_softmax_exp (kernels.h): the same bits on every path. */
    float (*softmax_exp)(const float *s, int64_t n, float scale, float *m, float *p);
};

extern const k3_kernels k3_kernels_scalar;
#if defined(__x86_64__)
extern const k3_kernels k3_kernels_avx2, k3_kernels_avx512;
#endif
#if defined(__aarch64__)
extern const k3_kernels k3_kernels_neon;
#endif

/* Lossless BF16 helpers (lossless.c), shared by every path. Row r's escapes: [*e, *end) of
 * the list, clamped to n_esc. */
void k3_lx_row_escapes(const k3_mat *m, int64_t r, uint32_t *e, uint32_t *end);
/* The 32 BF16 values of the group at g (columns c0 .. c0 + 31; those >= cols come out 0) into
 * t in column order, escapes of the group applied (consumed from *e while < end). */
void k3_lx_group_u16(const uint8_t *g, const uint8_t *xtab, const uint32_t *list, uint32_t *e,
                     uint32_t end, int64_t c0, int64_t cols, uint16_t t[K3_LX_GROUP]);
/* The scalar path's product (also its .bf16lx). */
void k3_rows_bf16lx(const k3_mat *w, const float *x, int n, float *y, int64_t r0, int64_t r1);

/* E2M1 codes 0..15 as f32 (spec §10.4): 0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6; code 8 is -0. */
extern const float k3_e2m1[16];

/* The KDA delta rule's two per-row steps (k3_kda_delta_rule, kernels.h) over value columns
 * [j0, d) in the scalar order, separate multiply and add: the scalar path runs them over all
 * columns, each SIMD path over the columns past its last full vector, so every element sees
 * the same operations on every path (exact).
 * Decay and read: row_j ← α_i·row_j, u_j += k_i·row_j. */
static inline void k3_kda_decay_cols(float *row, float alpha_i, float k_i, float *u, int j0,
                                     int d) {
    for (int j = j0; j < d; j++) {
        row[j] = row[j] * alpha_i;
        u[j] = u[j] + k_i * row[j];
    }
}

/* Write and read out: row_j += (β·k_i)·δ_j (δ in u), o_j += q_i·row_j. */
static inline void k3_kda_write_cols(float *row, float bk, const float *u, float q_i, float *o,
                                     int j0, int d) {
    for (int j = j0; j < d; j++) {
        row[j] = row[j] + bk * u[j];
        o[j] = o[j] + q_i * row[j];
    }
}

/* ---- k3_exp / k3_softmax_exp (kernels.h): one sequence of f32 operations on every path ---
 *
 * e^x for x <= 0 as Cephes' expf: x clamped below at ln 2^-126 (lo > x ? lo : x, so NaN stays
 * NaN); n = round(x·log2 e) by adding and subtracting 1.5·2^23 (round to nearest even); r =
 * x − n·C1 − n·C2 (C1 + C2 = ln 2, n·C1 exact); e^r = 1 + r + r²·P(r), P of degree 5 by Horner;
 * times 2^n built from the rounded value's low bits ((bits + 127) << 23, n in -126..0). Each
 * step is one IEEE multiply, add or subtract (no FMA), so a SIMD path that runs the same steps
 * lane-wise (simd_vec.h) gets these bits exactly. Within 2 ulp of e^x on [-87.3, 0]
 * (tests/test_simd.c measures it against libm); below -87.34 it gives 2^-126 (not 0). */
#define K3_EXP_LO (-87.33654f) /* ln 2^-126 */
#define K3_EXP_LOG2E 1.44269504088896341f
#define K3_EXP_ROUND 0x1.8p23f /* adding it rounds |v| < 2^22 to an integer */
#define K3_EXP_C1 0.693359375f
#define K3_EXP_C2 (-2.12194440e-4f)
#define K3_EXP_P0 1.9875691500e-4f
#define K3_EXP_P1 1.3981999507e-3f
#define K3_EXP_P2 8.3334519073e-3f
#define K3_EXP_P3 4.1665795894e-2f
#define K3_EXP_P4 1.6666665459e-1f
#define K3_EXP_P5 5.0000001201e-1f

static inline float k3_exp_steps(float x) {
    x = K3_EXP_LO > x ? K3_EXP_LO : x;
    float t = x * K3_EXP_LOG2E;
    t = t + K3_EXP_ROUND;
    float n = t - K3_EXP_ROUND;
    float r = x - n * K3_EXP_C1;
    r = r - n * K3_EXP_C2;
    float z = r * r, y = K3_EXP_P0;
    y = y * r + K3_EXP_P1;
    y = y * r + K3_EXP_P2;
    y = y * r + K3_EXP_P3;
    y = y * r + K3_EXP_P4;
    y = y * r + K3_EXP_P5;
    y = y * z;
    y = y + r;
    y = y + 1.0f;
    uint32_t b;
    memcpy(&b, &t, 4);
    b = (b + 127u) << 23;
    float p2;
    memcpy(&p2, &b, 4);
    return y * p2;
}

/* k3_softmax_exp's lanes: element j of a row goes to lane j % K3_SM_LANES (max and sum), and
 * the lanes are combined by these two folds, on every path. */
#define K3_SM_LANES 16
static inline float k3_sm_max(float *lane) {
    for (int h = K3_SM_LANES / 2; h > 0; h /= 2)
        for (int l = 0; l < h; l++) lane[l] = lane[l + h] > lane[l] ? lane[l + h] : lane[l];
    return lane[0];
}
static inline float k3_sm_sum(float *lane) {
    for (int h = K3_SM_LANES / 2; h > 0; h /= 2)
        for (int l = 0; l < h; l++) lane[l] = lane[l] + lane[l + h];
    return lane[0];
}

#endif
