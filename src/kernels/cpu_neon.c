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

/* Lane macros for simd_vec.h (the matrix-vector BF16 / F32 loops and the element-wise helpers,
 * shared with the x86 paths) and simd_gemm.h (the batched product, below): 4 lanes. */
#define W 4
#define VF float32x4_t
#define VZERO() vdupq_n_f32(0)
#define VLOADU(p) vld1q_f32(p)
#define VLOADA(p) vld1q_f32(p)
#define VSTOREU(p, v) vst1q_f32(p, v)
#define VSTOREA(p, v) vst1q_f32(p, v)
#define VFMA(a, b, c) vfmaq_f32(c, a, b)
#define VADD(a, b) vaddq_f32(a, b)
#define VMUL(a, b) vmulq_f32(a, b)
#define VSUB(a, b) vsubq_f32(a, b)
#define VMAX(a, b) vbslq_f32(vcgtq_f32(a, b), a, b) /* not vmaxq_f32, which returns NaN */
#define VPOW2(t) \
    vreinterpretq_f32_u32(vshlq_n_u32(vaddq_u32(vreinterpretq_u32_f32(t), vdupq_n_u32(127)), 23))
#define VSET1(a) vdupq_n_f32(a)
#define VBF16(p) bf16_4(p)
#include "simd_vec.h" /* bf16_tail, bf16_vec, f32_vec, dot, axpy, kda_delta, softmax_exp, xw */

/* ---- MXFP4 matrix-vector (n = 1) -------------------------------------------------------- */

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

/* ---- lossless BF16 (K3_DT_BF16LX, kernels.h): decoded in registers, then the BF16 recipe -- */

/* A whole group (c0 + 32 <= cols) as 8 vectors in column order: TBL looks the codes up (low
 * nibbles: positions 0..15, high: 16..31), escapes are written over the looked-up bytes (rare,
 * out of line), ZIP pairs (low, high) bytes into BF16 words and vshll widens them; position
 * p = 16·b + 4·a + c holds column 8·a + 4·b + c (kernels.h), so the vectors come out in the
 * order below. */
static __attribute__((noinline)) void lx_patch(uint8x16_t *h0, uint8x16_t *h1, const uint32_t *list,
                                               uint32_t *e, uint32_t end, int64_t c0) {
    uint8_t t[32];
    vst1q_u8(t, *h0);
    vst1q_u8(t + 16, *h1);
    for (; *e < end && (int64_t)(list[*e] >> 8) < c0 + K3_LX_GROUP; ++*e)
        t[k3_lx_pos((int)((int64_t)(list[*e] >> 8) - c0) & 31)] = (uint8_t)list[*e];
    *h0 = vld1q_u8(t);
    *h1 = vld1q_u8(t + 16);
}

static inline void lx_group(const uint8_t *g, uint8x16_t tab, const uint32_t *list, uint32_t *e,
                            uint32_t end, int64_t c0, float32x4_t v[8]) {
    uint8x16_t c = vld1q_u8(g);
    uint8x16_t h0 = vqtbl1q_u8(tab, vandq_u8(c, vdupq_n_u8(15))), h1 = vqtbl1q_u8(tab, vshrq_n_u8(c, 4));
    if (*e < end && (int64_t)(list[*e] >> 8) < c0 + K3_LX_GROUP) lx_patch(&h0, &h1, list, e, end, c0);
    uint8x16_t l0 = vld1q_u8(g + 16), l1 = vld1q_u8(g + 32);
    uint16x8_t w0 = vreinterpretq_u16_u8(vzip1q_u8(l0, h0)); /* positions 0..7 */
    uint16x8_t w1 = vreinterpretq_u16_u8(vzip2q_u8(l0, h0)); /* 8..15 */
    uint16x8_t w2 = vreinterpretq_u16_u8(vzip1q_u8(l1, h1)); /* 16..23 */
    uint16x8_t w3 = vreinterpretq_u16_u8(vzip2q_u8(l1, h1)); /* 24..31 */
#define LX_F(w, half) vreinterpretq_f32_u32(vshll_n_u16(vget_##half##_u16(w), 16))
    v[0] = LX_F(w0, low);  /* columns 0..3: positions 0..3 */
    v[1] = LX_F(w2, low);  /* 4..7: 16..19 */
    v[2] = LX_F(w0, high); /* 8..11: 4..7 */
    v[3] = LX_F(w2, high); /* 12..15: 20..23 */
    v[4] = LX_F(w1, low);  /* 16..19: 8..11 */
    v[5] = LX_F(w3, low);  /* 20..23: 24..27 */
    v[6] = LX_F(w1, high); /* 24..27: 12..15 */
    v[7] = LX_F(w3, high); /* 28..31: 28..31 */
#undef LX_F
}

/* The last, partial group of a row: decoded to BF16 in column order, then bf16_vec's last
 * steps exactly (full steps, then the tail step with xt). */
static inline float32x4_t lx_last(const uint8_t *g, const k3_mat *m, const uint32_t *list,
                                  uint32_t *e, uint32_t end, int64_t c0, const float *x,
                                  float32x4_t xt, float32x4_t s) {
    uint16_t t[K3_LX_GROUP];
    int64_t full = m->cols & ~(int64_t)3;
    k3_lx_group_u16(g, m->xtab, list, e, end, c0, m->cols, t);
    for (int64_t i = c0; i < full; i += 4) s = vfmaq_f32(s, bf16_4(t + (i - c0)), vld1q_f32(x + i));
    if (full < m->cols) s = vfmaq_f32(s, bf16_4(t + (full - c0)), xt);
    return s;
}

static void lx_vec(const k3_mat *m, const float *x, float *y, int64_t r0, int64_t r1) {
    int64_t cols = m->cols, ng = cols / K3_LX_GROUP, full = cols & ~(int64_t)3;
    uint64_t rb = k3_lx_row_bytes(cols);
    const uint8_t *data = m->data;
    const uint32_t *list = m->esc + m->rows + 1;
    uint8x16_t tab = vld1q_u8(m->xtab);
    float32x4_t xt = full < cols ? load_tail(x + full, cols - full) : vdupq_n_f32(0);
    for (int64_t r = r0; r < r1;) {
        int R = r + 4 <= r1 ? 4 : 1;
        uint32_t e[4], end[4];
        float32x4_t s[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
        for (int q = 0; q < R; q++) k3_lx_row_escapes(m, r + q, &e[q], &end[q]);
        const uint8_t *row = data + (uint64_t)r * rb;
        for (int64_t gi = 0; gi < ng; gi++)
            for (int q = 0; q < R; q++) {
                float32x4_t v[8];
                __builtin_prefetch(row + q * rb + gi * K3_LX_GROUP_BYTES + 768);
                lx_group(row + q * rb + gi * K3_LX_GROUP_BYTES, tab, list, &e[q], end[q],
                         gi * K3_LX_GROUP, v);
                for (int j = 0; j < 8; j++)
                    s[q] = vfmaq_f32(s[q], v[j], vld1q_f32(x + gi * K3_LX_GROUP + 4 * j));
            }
        if (ng * K3_LX_GROUP < cols)
            for (int q = 0; q < R; q++)
                s[q] = lx_last(row + q * rb + ng * K3_LX_GROUP_BYTES, m, list, &e[q], end[q],
                               ng * K3_LX_GROUP, x, xt, s[q]);
        for (int q = 0; q < R; q++) y[r + q] = hsum(s[q]);
        r += R;
    }
}

/* ---- batched (n > 1): decode a tile once, use it for every vector (simd_gemm.h) ---- */

#define GEMM_RB 64 /* simd_gemm.h's rows per tile; also the lossless cursors' ring (r % GEMM_RB) */

enum { SRC_BF16, SRC_F32, SRC_MXFP4, SRC_LX };
typedef struct wsrc {
    int kind;
    const void *w;         /* BF16 / F32 data, or MXFP4 packed */
    const uint8_t *scale;  /* MXFP4 only */
    int64_t cols;
    const k3_mat *m;       /* SRC_LX: the matrix */
    uint32_t *cur, *curend; /* SRC_LX: [GEMM_RB] escape cursors of the tile's rows (r % GEMM_RB) */
} wsrc;

/* A lossless tile row: lx_vec's vectors stored (zeros past cols, as bf16_tail). */
static void lx_tile_row(const wsrc *s, int64_t r, int64_t k0, int64_t kc, float *t) {
    const k3_mat *m = s->m;
    const uint8_t *row = (const uint8_t *)m->data + (uint64_t)r * k3_lx_row_bytes(m->cols);
    const uint32_t *list = m->esc + m->rows + 1;
    uint32_t *e = &s->cur[r % GEMM_RB], end;
    if (k0 == 0) k3_lx_row_escapes(m, r, e, &s->curend[r % GEMM_RB]);
    end = s->curend[r % GEMM_RB];
    uint8x16_t tab = vld1q_u8(m->xtab);
    for (int64_t c0 = k0; c0 < k0 + kc; c0 += K3_LX_GROUP) {
        const uint8_t *g = row + c0 / K3_LX_GROUP * K3_LX_GROUP_BYTES;
        float *o = t + (c0 - k0);
        if (c0 + K3_LX_GROUP <= m->cols) {
            float32x4_t v[8];
            lx_group(g, tab, list, e, end, c0, v);
            for (int j = 0; j < 8; j++) vst1q_f32(o + 4 * j, v[j]);
        } else {
            uint16_t u[K3_LX_GROUP];
            k3_lx_group_u16(g, m->xtab, list, e, end, c0, m->cols, u);
            for (int64_t i = 0; i < m->cols - c0; i += 4) vst1q_f32(o + i, bf16_4(u + i));
        }
    }
}

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
    } else if (s->kind == SRC_LX) {
        lx_tile_row(s, r, k0, kc, t);
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
#define UNROLL8 _Pragma("GCC unroll 8")
#define GEMM_R 4
#define GEMM_V 6
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
    wsrc s = {SRC_BF16, w, NULL, cols, NULL, NULL, NULL};
    gemm_dense(&s, rows, x, n, y, r0, r1);
}

static void mxfp4(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols,
                  const float *x, int n, float *y, int64_t r0, int64_t r1) {
    if (n == 1) {
        mxfp4_vec(packed, scale, cols, x, y, r0, r1);
        return;
    }
    wsrc s = {SRC_MXFP4, packed, scale, cols, NULL, NULL, NULL};
    gemm_dense(&s, rows, x, n, y, r0, r1);
}

static void bf16lx(const k3_mat *m, const float *x, int n, float *y, int64_t r0, int64_t r1) {
    if (n == 1) {
        lx_vec(m, x, y, r0, r1);
        return;
    }
    uint32_t cur[GEMM_RB], curend[GEMM_RB];
    wsrc s = {SRC_LX, NULL, NULL, m->cols, m, cur, curend};
    gemm_dense(&s, m->rows, x, n, y, r0, r1);
}

K3_SIMD_TABLE(k3_kernels_neon, "neon");

#endif
