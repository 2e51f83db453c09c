/* cpu_neon.c — the aarch64 NEON path (4 f32 lanes). NEON is part of the aarch64 base ISA, so
 * no runtime check is needed; on other architectures this file compiles to nothing. Tested
 * under qemu-aarch64 by `make test-neon` (tests/test_simd.c).
 *
 * Lane recipe as in cpu_avx2.c, with one 4-lane accumulator per (row, vector) and FMA; the
 * matrix-vector and batched loops run the same sequence, so they agree bit for bit.
 *
 * MXFP4 decode: TBL looks the 32 codes of a block up in a 16-byte table of 2·E2M1 (small
 * integers), they are widened to f32 and multiplied by scale/2. 2·E2M1·(scale/2) is exactly
 * E2M1·scale (both factors are exact and so is their product, or both overflow to inf), so
 * each weight equals the scalar path's, except that code 8 (-0) comes out +0, which changes
 * no sum but the sign of a zero one. */
#include "dispatch.h"

#if defined(__aarch64__)
#include <arm_neon.h>


static const int8_t E2M1_X2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline float hsum(float32x4_t v) { return vaddvq_f32(v); }

/* p[0..n) for 0 < n < 4, zeros above; never reads past p + n. */
static inline float32x4_t load_tail(const float *p, int64_t n) {
    float t[4] = {0};
    memcpy(t, p, (size_t)n * sizeof *p);
    return vld1q_f32(t);
}

static inline float32x4_t bf16_4(const uint16_t *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

static inline float32x4_t bf16_tail(const uint16_t *p, int64_t n) {
    uint16_t t[4] = {0};
    memcpy(t, p, (size_t)n * sizeof *p);
    return bf16_4(t);
}

static inline void widen_8(int8x8_t v, float32x4_t h, float32x4_t *out) {
    int16x8_t w = vmovl_s8(v);
    out[0] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), h);
    out[1] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), h);
}

/* The 32 weights of one MXFP4 block (16 packed bytes, even column in the low nibble). */
static inline void mx_32(const uint8_t *p, uint8_t scale, float32x4_t out[8]) {
    int8x16_t table = vld1q_s8(E2M1_X2);
    float32x4_t h = vdupq_n_f32(k3_e8m0_to_f32(scale) * 0.5f);
    uint8x16_t b = vld1q_u8(p);
    int8x16_t lo = vqtbl1q_s8(table, vandq_u8(b, vdupq_n_u8(15)));
    int8x16_t hi = vqtbl1q_s8(table, vshrq_n_u8(b, 4));
    int8x16_t z0 = vzip1q_s8(lo, hi), z1 = vzip2q_s8(lo, hi); /* columns 0..15, 16..31 */
    widen_8(vget_low_s8(z0), h, out);
    widen_8(vget_high_s8(z0), h, out + 2);
    widen_8(vget_low_s8(z1), h, out + 4);
    widen_8(vget_high_s8(z1), h, out + 6);
}

/* ---- matrix-vector (n = 1) ---------------------------------------------------------------- */

static void bf16_vec(const uint16_t *w, int64_t cols, const float *x, float *y, int64_t r0,
                     int64_t r1) {
    int64_t full = cols & ~(int64_t)3, tail = cols - full, r = r0;
    float32x4_t xt = tail ? load_tail(x + full, tail) : vdupq_n_f32(0);
    for (; r + 4 <= r1; r += 4) {
        const uint16_t *a = w + r * cols, *b = a + cols, *c = b + cols, *d = c + cols;
        float32x4_t sa = vdupq_n_f32(0), sb = sa, sc = sa, sd = sa;
        for (int64_t i = 0; i < full; i += 4) {
            float32x4_t xi = vld1q_f32(x + i);
            sa = vfmaq_f32(sa, bf16_4(a + i), xi);
            sb = vfmaq_f32(sb, bf16_4(b + i), xi);
            sc = vfmaq_f32(sc, bf16_4(c + i), xi);
            sd = vfmaq_f32(sd, bf16_4(d + i), xi);
        }
        if (tail) {
            sa = vfmaq_f32(sa, bf16_tail(a + full, tail), xt);
            sb = vfmaq_f32(sb, bf16_tail(b + full, tail), xt);
            sc = vfmaq_f32(sc, bf16_tail(c + full, tail), xt);
            sd = vfmaq_f32(sd, bf16_tail(d + full, tail), xt);
        }
        y[r] = hsum(sa), y[r + 1] = hsum(sb), y[r + 2] = hsum(sc), y[r + 3] = hsum(sd);
    }
    for (; r < r1; r++) {
        const uint16_t *a = w + r * cols;
        float32x4_t s = vdupq_n_f32(0);
        for (int64_t i = 0; i < full; i += 4) s = vfmaq_f32(s, bf16_4(a + i), vld1q_f32(x + i));
        if (tail) s = vfmaq_f32(s, bf16_tail(a + full, tail), xt);
        y[r] = hsum(s);
    }
}

static void f32_vec(const float *w, int64_t cols, const float *x, float *y, int64_t r0,
                    int64_t r1) {
    int64_t full = cols & ~(int64_t)3, tail = cols - full;
    float32x4_t xt = tail ? load_tail(x + full, tail) : vdupq_n_f32(0);
    for (int64_t r = r0; r < r1; r++) {
        const float *a = w + r * cols;
        float32x4_t s = vdupq_n_f32(0);
        for (int64_t i = 0; i < full; i += 4) s = vfmaq_f32(s, vld1q_f32(a + i), vld1q_f32(x + i));
        if (tail) s = vfmaq_f32(s, load_tail(a + full, tail), xt);
        y[r] = hsum(s);
    }
}

/* Four rows at a time: four independent FMA chains instead of one (each row's operations
 * unchanged, so the bits stay those of the batched tiles). */
static void mxfp4_vec(const uint8_t *packed, const uint8_t *scale, int64_t cols,
                      const float *x, float *y, int64_t r0, int64_t r1) {
    int64_t ng = cols / 32, r = r0;
    for (; r + 4 <= r1; r += 4) {
        const uint8_t *p = packed + r * (cols / 2), *s = scale + r * ng;
        float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
        for (int64_t g = 0; g < ng; g++)
            for (int q = 0; q < 4; q++) {
                float32x4_t w[8];
                mx_32(p + q * (cols / 2) + g * 16, s[q * ng + g], w);
                for (int j = 0; j < 8; j++)
                    acc[q] = vfmaq_f32(acc[q], w[j], vld1q_f32(x + g * 32 + 4 * j));
            }
        for (int q = 0; q < 4; q++) y[r + q] = hsum(acc[q]);
    }
    for (; r < r1; r++) {
        const uint8_t *p = packed + r * (cols / 2), *s = scale + r * ng;
        float32x4_t acc = vdupq_n_f32(0), w[8];
        for (int64_t g = 0; g < ng; g++) {
            mx_32(p + g * 16, s[g], w);
            for (int j = 0; j < 8; j++) acc = vfmaq_f32(acc, w[j], vld1q_f32(x + g * 32 + 4 * j));
        }
        y[r] = hsum(acc);
    }
}

/* ---- batched (n > 1): decode a 16-row × 256-column tile once, use it for every vector ---- */

enum { SRC_BF16, SRC_F32, SRC_MXFP4 };
typedef struct wsrc {
    int kind;
    const void *w;         /* BF16 / F32 data, or MXFP4 packed */
    const uint8_t *scale;  /* MXFP4 only */
    int64_t cols;
} wsrc;

/* t[0 .. kc rounded up to 4) = W[r][k0 .. k0 + kc), zero-padded. */
static void tile_row(const wsrc *s, int64_t r, int64_t k0, int64_t kc, float *t) {
    int64_t full = kc & ~(int64_t)3, tail = kc - full;
    if (s->kind == SRC_BF16) {
        const uint16_t *p = (const uint16_t *)s->w + r * s->cols + k0;
        for (int64_t i = 0; i < full; i += 4) vst1q_f32(t + i, bf16_4(p + i));
        if (tail) vst1q_f32(t + full, bf16_tail(p + full, tail));
    } else if (s->kind == SRC_F32) {
        const float *p = (const float *)s->w + r * s->cols + k0;
        for (int64_t i = 0; i < full; i += 4) vst1q_f32(t + i, vld1q_f32(p + i));
        if (tail) vst1q_f32(t + full, load_tail(p + full, tail));
    } else {
        const uint8_t *p = (const uint8_t *)s->w + r * (s->cols / 2) + k0 / 2;
        const uint8_t *sc = s->scale + r * (s->cols / 32) + k0 / 32;
        float32x4_t w[8];
        for (int64_t g = 0; g < kc / 32; g++) {
            mx_32(p + g * 16, sc[g], w);
            for (int j = 0; j < 8; j++) vst1q_f32(t + g * 32 + 4 * j, w[j]);
        }
    }
}

/* The batched product: simd_gemm.h's register-blocked micro-kernel over this file's tiles (the
 * same lane recipe: one 4-lane accumulator per (row, vector), FMA per step in column order, a
 * zero-padded last step, then vaddvq), 4 rows × 6 vectors: 24 accumulators of the 32 q
 * registers. MXFP4 weights are decoded into the tile by tile_row, so all three formats share
 * it. */
#define W 4
#define VF float32x4_t
#define VZERO() vdupq_n_f32(0)
#define VLOADU(p) vld1q_f32(p)
#define VLOADA(p) vld1q_f32(p)
#define VSTOREA(p, v) vst1q_f32(p, v)
#define VFMA(a, b, c) vfmaq_f32(c, a, b)
#define VADD(a, b) vaddq_f32(a, b)
#define VSET1(a) vdupq_n_f32(a)
#define UNROLL8 _Pragma("GCC unroll 8")
#define GEMM_R 4
#define GEMM_V 6
#define GEMM_RB 64
#define GEMM_KC 512 /* a multiple of 32: MXFP4 blocks stay whole */
#include "simd_gemm.h"

/* MXFP4 is decoded into the same f32 tile, so its batched loop is the dense micro-kernel. */
static int64_t mix(int which, int64_t reps) {
    return which == K3_MIX_FMA ? mix_fma(reps) : mix_gemm_dense(reps);
}

/* ---- the table's entries -------------------------------------------------------------- */

static void bf16(const uint16_t *w, int64_t rows, int64_t cols, const float *x, int n, float *y,
                 int64_t r0, int64_t r1) {
    if (n == 1) {
        bf16_vec(w, cols, x, y, r0, r1);
        return;
    }
    wsrc s = {SRC_BF16, w, NULL, cols};
    gemm_dense(&s, rows, x, n, y, r0, r1);
}

static void f32(const float *w, int64_t rows, int64_t cols, const float *x, int n, float *y,
                int64_t r0, int64_t r1) {
    if (n == 1) {
        f32_vec(w, cols, x, y, r0, r1);
        return;
    }
    wsrc s = {SRC_F32, w, NULL, cols};
    gemm_dense(&s, rows, x, n, y, r0, r1);
}

static void mxfp4(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols,
                  const float *x, int n, float *y, int64_t r0, int64_t r1) {
    if (n == 1) {
        mxfp4_vec(packed, scale, cols, x, y, r0, r1);
        return;
    }
    wsrc s = {SRC_MXFP4, packed, scale, cols};
    gemm_dense(&s, rows, x, n, y, r0, r1);
}

static float dot(const float *a, const float *b, int64_t n) {
    int64_t full = n & ~(int64_t)3, tail = n - full;
    float32x4_t s = vdupq_n_f32(0);
    for (int64_t i = 0; i < full; i += 4) s = vfmaq_f32(s, vld1q_f32(a + i), vld1q_f32(b + i));
    if (tail) s = vfmaq_f32(s, load_tail(a + full, tail), load_tail(b + full, tail));
    return hsum(s);
}

/* Separate multiply and add, element by element: the scalar result exactly. */
static void axpy(float a, const float *x, float *y, int64_t n) {
    float32x4_t va = vdupq_n_f32(a);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_f32(va, vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = y[i] + a * x[i];
}

/* cpu_scalar.c's kda_delta vectorised over the value index j, no FMA: exact. */
static void kda_delta(float *S, const float *q, const float *k, const float *v,
                      const float *alpha, float beta, int d, float *u, float *o) {
    int dv = d & ~3;
    for (int j = 0; j < d; j++) u[j] = 0;
    for (int i = 0; i < d; i++) {
        float *row = S + (size_t)i * d;
        float32x4_t al = vdupq_n_f32(alpha[i]), ki = vdupq_n_f32(k[i]);
        for (int j = 0; j < dv; j += 4) {
            float32x4_t s = vmulq_f32(vld1q_f32(row + j), al);
            vst1q_f32(row + j, s);
            vst1q_f32(u + j, vaddq_f32(vld1q_f32(u + j), vmulq_f32(ki, s)));
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
        float32x4_t vbk = vdupq_n_f32(bk), qi = vdupq_n_f32(q[i]);
        for (int j = 0; j < dv; j += 4) {
            float32x4_t s = vaddq_f32(vld1q_f32(row + j), vmulq_f32(vbk, vld1q_f32(u + j)));
            vst1q_f32(row + j, s);
            vst1q_f32(o + j, vaddq_f32(vld1q_f32(o + j), vmulq_f32(qi, s)));
        }
        for (int j = dv; j < d; j++) {
            row[j] = row[j] + bk * u[j];
            o[j] = o[j] + q[i] * row[j];
        }
    }
}

const k3_kernels k3_kernels_neon = {
    .name = "neon",
    .bf16 = bf16,
    .f32 = f32,
    .mxfp4 = mxfp4,
    .mix = mix,
    .dot = dot,
    .axpy = axpy,
    .kda_delta = kda_delta,
};

#endif
