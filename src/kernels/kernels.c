/* kernels.c — scalar reference kernels (spec §2). Rows are split across OpenMP threads;
 * within a row the sum is sequential, so results are identical for any thread count. */
#include "kernels.h"

#include <math.h>

#include "../format/safetensors.h"

/* Below this many multiply-adds a product runs on one thread (fork/join costs more). */
#define PARALLEL_MIN_MACS (1 << 15)

static const float E2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float k3_mxfp4_value(uint8_t code, uint8_t scale) {
    return E2M1[code & 15] * k3_e8m0_to_f32(scale);
}

float k3_mat_at(const k3_mat *m, int64_t i) {
    if (m->dtype == K3_DT_BF16) return k3_bf16_to_f32(((const uint16_t *)m->data)[i]);
    if (m->dtype == K3_DT_I8) return ((const int8_t *)m->data)[i] * m->scale[i / m->cols];
    return ((const float *)m->data)[i];
}

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

static void rows_f32(const float *w, int64_t cols, const float *x, float *y, int64_t r0,
                     int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const float *a = w + r * cols;
        float s = 0;
        for (int64_t i = 0; i < cols; i++) s += a[i] * x[i];
        y[r] = s;
    }
}

#define ROW_BLOCK 16

void k3_matvec(const k3_mat *w, const float *x, float *y) {
    int64_t rows = w->rows, cols = w->cols, nblk = (rows + ROW_BLOCK - 1) / ROW_BLOCK;
#pragma omp parallel for schedule(static) if (rows * cols >= PARALLEL_MIN_MACS)
    for (int64_t b = 0; b < nblk; b++) {
        int64_t r0 = b * ROW_BLOCK, r1 = r0 + ROW_BLOCK < rows ? r0 + ROW_BLOCK : rows;
        if (w->dtype == K3_DT_BF16)
            rows_bf16(w->data, cols, x, y, r0, r1);
        else if (w->dtype == K3_DT_I8)
            k3_rows_i8(w, x, y, r0, r1);
        else
            rows_f32(w->data, cols, x, y, r0, r1);
    }
}

void k3_matvec_mxfp4(const k3_mxfp4 *w, const float *x, float *y) {
    int64_t rows = w->rows, cols = w->cols, ngroups = cols / 32;
#pragma omp parallel for schedule(static) if (rows * cols >= PARALLEL_MIN_MACS)
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *p = w->packed + r * (cols / 2), *sc = w->scale + r * ngroups;
        float s = 0;
        for (int64_t g = 0; g < ngroups; g++) {
            float scale = k3_e8m0_to_f32(sc[g]);
            const uint8_t *pg = p + g * 16;
            const float *xg = x + g * 32;
            for (int j = 0; j < 16; j++) {
                s += (E2M1[pg[j] & 15] * scale) * xg[2 * j];
                s += (E2M1[pg[j] >> 4] * scale) * xg[2 * j + 1];
            }
        }
        y[r] = s;
    }
}

void k3_rmsnorm(const float *x, const k3_mat *w, int n, float eps, float *y) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) {
        float v = x[i] * r;
        y[i] = w ? k3_mat_at(w, i) * v : v;
    }
}

float k3_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

float k3_silu(float x) { return x / (1.0f + expf(-x)); }

float k3_situ(float g, float u, float beta, float linear_beta) {
    float a = beta * tanhf(g / beta);
    a = a * k3_sigmoid(g);
    return a * (linear_beta * tanhf(u / linear_beta));
}

float k3_kda_gate(float f, float dt_bias, float a_log, float lower_bound) {
    float z = f + dt_bias;
    return expf(lower_bound * k3_sigmoid(expf(a_log) * z));
}

void k3_situ_vec(const float *gate, const float *up, int n, float beta, float linear_beta,
                 float *out) {
    for (int i = 0; i < n; i++) out[i] = k3_situ(gate[i], up[i], beta, linear_beta);
}
