/* int8.c — the int8 spine (issue 8): per-row symmetric quantization of BF16 matrices and the
 * int8 × float32 matrix-vector rows. NOT exact: opt-in through `k3 pack` (see
 * docs/PACKED-SPINE.md). The rule and the product order are written out in kernels.h. */
#include "kernels.h"

#include <math.h>

float k3_quantize_row_i8(const uint16_t *w, int64_t n, int8_t *q) {
    float amax = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(k3_bf16_to_f32(w[i]));
        if (!isfinite(a)) return NAN;
        if (a > amax) amax = a;
    }
    if (amax == 0) {
        memset(q, 0, (size_t)n);
        return 0;
    }
    float scale = amax / 127.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = nearbyintf(k3_bf16_to_f32(w[i]) / scale); /* default mode: half to even */
        q[i] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v);
    }
    return scale;
}

/* Four rows at a time, as rows_bf16 in kernels.c: independent sequential sums. */
void k3_rows_i8(const k3_mat *w, const float *x, float *y, int64_t r0, int64_t r1) {
    const int8_t *q = w->data;
    const float *scale = w->scale;
    int64_t cols = w->cols, r = r0;
    for (; r + 4 <= r1; r += 4) {
        const int8_t *a = q + r * cols, *b = a + cols, *c = b + cols, *d = c + cols;
        float sa = 0, sb = 0, sc = 0, sd = 0;
        for (int64_t i = 0; i < cols; i++) {
            float xi = x[i];
            sa += (float)a[i] * xi;
            sb += (float)b[i] * xi;
            sc += (float)c[i] * xi;
            sd += (float)d[i] * xi;
        }
        y[r] = sa * scale[r], y[r + 1] = sb * scale[r + 1];
        y[r + 2] = sc * scale[r + 2], y[r + 3] = sd * scale[r + 3];
    }
    for (; r < r1; r++) {
        const int8_t *a = q + r * cols;
        float s = 0;
        for (int64_t i = 0; i < cols; i++) s += (float)a[i] * x[i];
        y[r] = s * scale[r];
    }
}

#if defined(__x86_64__)
#include <immintrin.h>

/* 8 int8 weights starting at p, widened to f32. */
__attribute__((target("avx2,fma"))) static inline __m256 load8_i8(const int8_t *p) {
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

/* The 8 lanes summed in a fixed order: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
__attribute__((target("avx2,fma"))) static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* Four rows at a time, two 8-lane accumulators per row (columns i ≡ 0..7 and 8..15 mod 16),
 * FMA; the last cols % 16 columns are added in ascending order after the lanes. */
__attribute__((target("avx2,fma"))) void k3_rows_i8_avx2(const k3_mat *w, const float *x,
                                                          float *y, int64_t r0, int64_t r1) {
    const int8_t *q = w->data;
    const float *scale = w->scale;
    int64_t cols = w->cols, body = cols - cols % 16, r = r0;
    for (; r < r1; r += 4) {
        int nr = r1 - r < 4 ? (int)(r1 - r) : 4;
        const int8_t *a[4];
        for (int k = 0; k < 4; k++) a[k] = q + (r + (k < nr ? k : 0)) * cols;
        __m256 acc[4][2];
        for (int k = 0; k < 4; k++) acc[k][0] = acc[k][1] = _mm256_setzero_ps();
        for (int64_t i = 0; i < body; i += 16) {
            __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
            for (int k = 0; k < 4; k++) {
                acc[k][0] = _mm256_fmadd_ps(load8_i8(a[k] + i), x0, acc[k][0]);
                acc[k][1] = _mm256_fmadd_ps(load8_i8(a[k] + i + 8), x1, acc[k][1]);
            }
        }
        for (int k = 0; k < nr; k++) {
            float s = hsum8(_mm256_add_ps(acc[k][0], acc[k][1]));
            for (int64_t i = body; i < cols; i++) s += (float)a[k][i] * x[i];
            y[r + k] = s * scale[r + k];
        }
    }
}
#endif

/* ---- --approx: int8 activations as well (NOT exact; see kernels.h) ----------------------- */

void k3_quantize_act_q8(const float *x, int64_t n, int8_t *q, float *scale) {
    for (int64_t b = 0; b * K3_Q8_BLOCK < n; b++) {
        int64_t i0 = b * K3_Q8_BLOCK, i1 = i0 + K3_Q8_BLOCK < n ? i0 + K3_Q8_BLOCK : n;
        float amax = 0;
        int finite = 1;
        for (int64_t i = i0; i < i1; i++) {
            amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
            finite &= isfinite(x[i]) != 0;
        }
        float s = finite ? amax / 127.0f : NAN; /* a NaN/Inf activation makes the product NaN */
        scale[b] = s;
        for (int64_t i = i0; i < i1; i++) {
            float v = s > 0 ? nearbyintf(x[i] / s) : 0.0f;
            q[i] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v == v ? (int)v : 0);
        }
    }
}

/* x's int8 copy lives on the stack of each thread: K3_Q8_MAX_COLS bounds it. */
#define Q8_MAX_COLS K3_Q8_MAX_COLS

void k3_rows_i8_q8(const k3_mat *w, const float *x, float *y, int64_t r0, int64_t r1) {
    if (w->cols > Q8_MAX_COLS) { /* too wide for the stack copy: plain int8 x f32 */
        k3_rows_i8(w, x, y, r0, r1);
        return;
    }
    int8_t xq[Q8_MAX_COLS];
    float xs[Q8_MAX_COLS / K3_Q8_BLOCK];
    const int8_t *q = w->data;
    int64_t cols = w->cols, nb = (cols + K3_Q8_BLOCK - 1) / K3_Q8_BLOCK;
    k3_quantize_act_q8(x, cols, xq, xs);
    for (int64_t r = r0; r < r1; r++) {
        const int8_t *a = q + r * cols;
        float s = 0;
        for (int64_t b = 0; b < nb; b++) {
            int64_t i0 = b * K3_Q8_BLOCK, i1 = i0 + K3_Q8_BLOCK < cols ? i0 + K3_Q8_BLOCK : cols;
            int32_t acc = 0; /* exact: |acc| <= 32 · 127 · 127 */
            for (int64_t i = i0; i < i1; i++) acc += (int32_t)a[i] * xq[i];
            s += (float)acc * xs[b];
        }
        y[r] = s * w->scale[r];
    }
}

#if defined(__x86_64__)
/* Σ over one block of 32 of w·x in int32 lanes: maddubs takes unsigned × signed, so it gets
 * |x| and w with x's sign moved onto it (exact: each int16 pair sum <= 2·127·127). */
__attribute__((target("avx2,fma"))) static inline __m256i dot32(__m256i w, __m256i ax,
                                                               __m256i x) {
    __m256i p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Four rows at a time; per block of 32 the int32 sum is exact, then lane-wise FMA with the
 * block's activation scale; blocks of a partial tail (cols % 32) go through the scalar loop. */
__attribute__((target("avx2,fma"))) void k3_rows_i8_q8_avx2(const k3_mat *w, const float *x,
                                                             float *y, int64_t r0, int64_t r1) {
    if (w->cols > Q8_MAX_COLS) {
        k3_rows_i8_avx2(w, x, y, r0, r1);
        return;
    }
    int8_t xq[Q8_MAX_COLS];
    float xs[Q8_MAX_COLS / K3_Q8_BLOCK];
    const int8_t *q = w->data;
    int64_t cols = w->cols, full = cols / K3_Q8_BLOCK;
    k3_quantize_act_q8(x, cols, xq, xs);
    for (int64_t r = r0; r < r1; r += 4) {
        int nr = r1 - r < 4 ? (int)(r1 - r) : 4;
        const int8_t *a[4];
        for (int k = 0; k < 4; k++) a[k] = q + (r + (k < nr ? k : 0)) * cols;
        __m256 acc[4];
        for (int k = 0; k < 4; k++) acc[k] = _mm256_setzero_ps();
        for (int64_t b = 0; b < full; b++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + b * K3_Q8_BLOCK));
            __m256i ax = _mm256_sign_epi8(xv, xv);
            __m256 sc = _mm256_set1_ps(xs[b]);
            for (int k = 0; k < 4; k++) {
                __m256i wv = _mm256_loadu_si256((const __m256i *)(a[k] + b * K3_Q8_BLOCK));
                acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(wv, ax, xv)), sc, acc[k]);
            }
        }
        for (int k = 0; k < nr; k++) {
            float s = hsum8(acc[k]);
            int32_t t = 0;
            for (int64_t i = full * K3_Q8_BLOCK; i < cols; i++) t += (int32_t)a[k][i] * xq[i];
            if (full * K3_Q8_BLOCK < cols) s += (float)t * xs[full];
            y[r + k] = s * w->scale[r + k];
        }
    }
}
#endif
