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
