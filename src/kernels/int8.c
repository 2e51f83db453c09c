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
