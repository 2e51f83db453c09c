/* test_simd.c — every SIMD kernel path this CPU runs against the scalar reference path.
 *
 * Needs nothing but src/kernels (and src/util/err.c), so `make test-neon` also builds it alone
 * for aarch64 and runs it under qemu. Sizes are awkward on purpose (not multiples of any
 * vector width, rows not multiples of 4) and every pointer is misaligned by one element.
 *
 * Tolerance (rounding only, any summation order): a sum of n products in f32 is within
 * n·2⁻²⁴·Σ|wᵢxᵢ| of the exact sum, so two orders differ by at most 2n·2⁻²⁴·Σ|wᵢxᵢ|; we
 * allow exactly that. A dropped, repeated or misplaced element is off by about Σ|wᵢxᵢ|/n,
 * which is larger for every n used here (n < 2^11). Small-integer inputs, whose sums are
 * exact in f32 in any order, must match the exact result bit for bit. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/format/safetensors.h"
#include "../src/kernels/kernels.h"
#include "test.h"

enum { DT_BF16, DT_F32, DT_MXFP4 };
static const char *const DT_NAME[] = {"bf16", "f32", "mxfp4"};

static uint32_t rng;
static uint32_t rnd_u32(void) { return rng = rng * 1664525u + 1013904223u; }
static float rnd(void) { return (float)((rnd_u32() >> 8) & 0xffff) / 32768.0f - 1.0f; }
static int rnd_int(int lo, int hi) { return lo + (int)((rnd_u32() >> 8) % (uint32_t)(hi - lo + 1)); }

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* A test matrix in one of the three formats, every buffer misaligned by one element (or one
 * byte), plus its exact f64 values for the reference sums. */
typedef struct tmat {
    int dt;
    int64_t rows, cols;
    uint16_t *bf16_buf;
    float *f32_buf;
    uint8_t *packed_buf, *scale_buf;
    k3_mat mat;
    k3_mxfp4 mx;
    double *val; /* [rows][cols] */
} tmat;

/* integers = 1: values are small integers (bf16/f32) or E2M1 codes at scale 2^0 (mxfp4),
 * so that with integer x every partial sum is exact. */
static void tmat_make(tmat *t, int dt, int64_t rows, int64_t cols, int integers) {
    memset(t, 0, sizeof *t);
    t->dt = dt, t->rows = rows, t->cols = cols;
    int64_t n = rows * cols;
    t->val = malloc((size_t)n * sizeof *t->val);
    if (dt == DT_MXFP4) {
        t->packed_buf = calloc((size_t)(n / 2 + 1), 1);
        t->scale_buf = malloc((size_t)(n / 32 + 1));
        uint8_t *p = t->packed_buf + 1, *s = t->scale_buf + 1;
        for (int64_t i = 0; i < n / 32; i++) s[i] = integers ? 127 : (uint8_t)rnd_int(118, 134);
        for (int64_t i = 0; i < n; i++) {
            uint8_t code = (uint8_t)rnd_int(0, 15);
            p[i / 2] = (uint8_t)(p[i / 2] | (i % 2 ? code << 4 : code));
            t->val[i] = k3_mxfp4_value(code, s[(i / cols) * (cols / 32) + (i % cols) / 32]);
        }
        t->mx = (k3_mxfp4){p, s, rows, cols};
        return;
    }
    if (dt == DT_BF16) {
        t->bf16_buf = malloc((size_t)(n + 1) * sizeof *t->bf16_buf);
        for (int64_t i = 0; i < n; i++) {
            float v = integers ? (float)rnd_int(-4, 4) : rnd() * 2.0f;
            t->bf16_buf[i + 1] = to_bf16(v);
            t->val[i] = k3_bf16_to_f32(t->bf16_buf[i + 1]);
        }
        t->mat = (k3_mat){.data = t->bf16_buf + 1, .dtype = K3_DT_BF16, .rows = rows, .cols = cols};
    } else {
        t->f32_buf = malloc((size_t)(n + 1) * sizeof *t->f32_buf);
        for (int64_t i = 0; i < n; i++) {
            float v = integers ? (float)rnd_int(-4, 4) : rnd() * 2.0f;
            t->f32_buf[i + 1] = v;
            t->val[i] = v;
        }
        t->mat = (k3_mat){.data = t->f32_buf + 1, .dtype = K3_DT_F32, .rows = rows, .cols = cols};
    }
}

static void tmat_free(tmat *t) {
    free(t->bf16_buf), free(t->f32_buf), free(t->packed_buf), free(t->scale_buf), free(t->val);
}

static void product(const k3_kernels *k, const tmat *t, const float *x, int n, float *y) {
    if (t->dt == DT_MXFP4)
        k3_matmul_mxfp4(k, &t->mx, x, n, y);
    else
        k3_matmul(k, &t->mat, x, n, y);
}

/* The SIMD paths this CPU runs (scalar excluded); skips the test when there is none. */
static int simd_paths(const k3_kernels **out) {
    const k3_kernels *all[8];
    int n = k3_kernels_available(all, 8), m = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(k3_kernels_name(all[i]), "scalar") != 0) out[m++] = all[i];
    if (!m) k3_test_skip("this CPU runs no SIMD kernel path");
    return m;
}

/* x [n][cols] (misaligned by one float), random or small integers. */
static float *make_x(int n, int64_t cols, int integers, float **buf) {
    *buf = malloc(((size_t)n * (size_t)cols + 1) * sizeof **buf);
    float *x = *buf + 1;
    for (int64_t i = 0; i < n * cols; i++) x[i] = integers ? (float)rnd_int(-3, 3) : rnd();
    return x;
}

/* Compares path k with scalar (and with the f64 sums) for one shape and batch size. */
static void check_shape(const k3_kernels *k, int dt, int64_t rows, int64_t cols, int n,
                        int integers) {
    tmat t;
    tmat_make(&t, dt, rows, cols, integers);
    float *xbuf, *x = make_x(n, cols, integers, &xbuf);
    float *ys = malloc((size_t)(n * rows) * sizeof *ys), *yk = malloc((size_t)(n * rows) * sizeof *yk);
    product(k3_kernels_get("scalar"), &t, x, n, ys);
    product(k, &t, x, n, yk);
    for (int b = 0; b < n && !k3_test_stopped(); b++)
        for (int64_t r = 0; r < rows; r++) {
            double exact = 0, mag = 0;
            for (int64_t i = 0; i < cols; i++) {
                double p = t.val[r * cols + i] * x[b * cols + i];
                exact += p, mag += fabs(p);
            }
            float s = ys[b * rows + r], v = yk[b * rows + r];
            double tol = integers ? 0 : 2.0 * (double)cols * ldexp(1.0, -24) * mag;
            int ok = integers ? v == exact && s == exact : fabs((double)v - s) <= tol;
            if (!ok) {
                k3_test_fail(__FILE__, __LINE__, "%s %s %lldx%lld n=%d: row %lld vec %d: %.9g, "
                             "scalar %.9g, exact %.9g (tol %.3g)", k3_kernels_name(k),
                             DT_NAME[dt], (long long)rows, (long long)cols, n, (long long)r, b,
                             v, s, exact, tol);
                break;
            }
        }
    free(ys), free(yk), free(xbuf);
    tmat_free(&t);
}

static const int64_t ROWS[] = {1, 3, 5, 17, 38};
static const int64_t COLS[] = {1, 7, 13, 33, 100, 1031};
static const int64_t MX_COLS[] = {32, 96, 288, 1024};

static void check_all_shapes(int integers, int n) {
    const k3_kernels *paths[8];
    int np = simd_paths(paths);
    rng = 4242u + (uint32_t)n;
    for (int p = 0; p < np; p++)
        for (int dt = 0; dt < 3; dt++)
            for (size_t ri = 0; ri < sizeof ROWS / sizeof ROWS[0]; ri++) {
                size_t nc = dt == DT_MXFP4 ? 4 : sizeof COLS / sizeof COLS[0];
                for (size_t ci = 0; ci < nc; ci++) {
                    check_shape(paths[p], dt, ROWS[ri], dt == DT_MXFP4 ? MX_COLS[ci] : COLS[ci], n,
                                integers);
                    if (k3_test_stopped()) return;
                }
            }
}

static void test_matvec_integers_exact(void) { check_all_shapes(1, 1); }
static void test_matvec_random_within_bound(void) { check_all_shapes(0, 1); }
static void test_matmul_integers_exact(void) { check_all_shapes(1, 5); }
static void test_matmul_random_within_bound(void) { check_all_shapes(0, 3); }

/* Every path's batched product of a rows x cols matrix (MXFP4: cols_mx) with each count of
 * vectors in ns equals, row for row, the matvec of each vector, bit for bit. */
static void rows_equal_matvec(const int *ns, size_t n_ns, int64_t rows, int64_t cols,
                              int64_t cols_mx) {
    const k3_kernels *all[8];
    int np = k3_kernels_available(all, 8);
    for (int p = 0; p < np; p++)
        for (int dt = 0; dt < 3; dt++)
            for (size_t ni = 0; ni < n_ns; ni++) {
                int n = ns[ni];
                int64_t cc = dt == DT_MXFP4 ? cols_mx : cols;
                tmat t;
                tmat_make(&t, dt, rows, cc, 0);
                float *xbuf, *x = make_x(n, cc, 0, &xbuf);
                float *yb = malloc((size_t)(n * rows) * sizeof *yb), *yv = malloc((size_t)rows * 4);
                product(all[p], &t, x, n, yb);
                int bad = -1;
                for (int b = 0; b < n && bad < 0; b++) {
                    product(all[p], &t, x + b * cc, 1, yv);
                    if (memcmp(yv, yb + b * rows, (size_t)rows * sizeof *yv) != 0) bad = b;
                }
                free(yb), free(yv), free(xbuf);
                tmat_free(&t);
                CHECK(bad < 0, "%s %s n=%d: batched row of vector %d differs from matvec",
                      k3_kernels_name(all[p]), DT_NAME[dt], n, bad);
            }
}

/* Row b of a batched product equals the matrix-vector product of x[b] bit for bit, on every
 * path (scalar included), for batches below, at and above the kernels' 64-vector batch. */
static void test_matmul_rows_equal_matvec_bitwise(void) {
    static const int NS[] = {2, 4, 7, 8, 13, 64, 67};
    rng = 777;
    /* > one 256-column tile; 26 rows: a 24-row tile and 2 more, and not a multiple of the GEMM
     * micro-kernels' 3 or 6 rows */
    rows_equal_matvec(NS, sizeof NS / sizeof NS[0], 26, 523, 544);
}

/* The batched products over several row blocks and column tiles (301 rows: two 128-row
 * blocks and 45 rows, not a multiple of 3 or 4; 1100 columns, MXFP4 1120: two 512-column
 * tiles and more), on one thread so that one range crosses every block: each slab's successor
 * is decoded while it runs (simd_gemm.h; NEON's MXFP4 too), also across tiles and blocks;
 * row b equals the matvec of x[b] bit for bit. */
static void test_matmul_blocks_rows_equal_matvec(void) {
    static const int NS[] = {7, 64};
    int saved = omp_get_max_threads();
    rng = 4242;
    omp_set_num_threads(1);
    rows_equal_matvec(NS, sizeof NS / sizeof NS[0], 301, 1100, 1120);
    omp_set_num_threads(saved);
}

/* A MoE layer's experts in one call give each expert's own matvec bit for bit, with 1 and 2
 * threads (row blocks of different matrices land on one thread). */
static void test_mxfp4_many_equals_each_matvec(void) {
    const k3_kernels *all[8];
    int np = k3_kernels_available(all, 8), saved = omp_get_max_threads();
    enum { E = 5 };
    static const int64_t R[E] = {37, 300, 5, 128, 97}, C[E] = {64, 256, 32, 96, 256};
    rng = 2024;
    for (int p = 0; p < np; p++)
        for (int th = 1; th <= 2; th++) {
            tmat t[E];
            k3_mxfp4 w[E];
            float *xb[E], *x[E], *y[E], *yv = malloc(300 * sizeof *yv);
            for (int j = 0; j < E; j++) {
                tmat_make(&t[j], DT_MXFP4, R[j], C[j], 0);
                w[j] = t[j].mx;
                x[j] = make_x(1, C[j], 0, &xb[j]);
                y[j] = malloc((size_t)R[j] * sizeof *y[j]);
            }
            x[4] = x[1]; /* a shared input vector, as the w1 / w3 of one token */
            omp_set_num_threads(th);
            k3_matvec_mxfp4_many(all[p], E, w, (const float *const *)x, y);
            omp_set_num_threads(saved);
            int bad = -1;
            for (int j = 0; j < E && bad < 0; j++) {
                k3_matvec_mxfp4(all[p], &w[j], x[j], yv);
                if (memcmp(yv, y[j], (size_t)R[j] * sizeof *yv) != 0) bad = j;
            }
            for (int j = 0; j < E; j++) free(xb[j]), free(y[j]), tmat_free(&t[j]);
            free(yv);
            CHECK(bad < 0, "%s, %d threads: expert %d differs from its own matvec",
                  k3_kernels_name(all[p]), th, bad);
        }
}

/* One thread and two threads give the same bits (rows split only). */
static void test_thread_count_does_not_change_results(void) {
    const k3_kernels *all[8];
    int np = k3_kernels_available(all, 8), saved = omp_get_max_threads();
    rng = 31337;
    for (int p = 0; p < np; p++)
        for (int dt = 0; dt < 3; dt++)
            for (int n = 1; n <= 3; n += 2) {
                int64_t rows = 301, cols = dt == DT_MXFP4 ? 256 : 250;
                tmat t;
                tmat_make(&t, dt, rows, cols, 0);
                float *xbuf, *x = make_x(n, cols, 0, &xbuf);
                float *y1 = malloc((size_t)(n * rows) * sizeof *y1), *y2 = malloc((size_t)(n * rows) * sizeof *y2);
                omp_set_num_threads(1);
                product(all[p], &t, x, n, y1);
                omp_set_num_threads(2);
                product(all[p], &t, x, n, y2);
                omp_set_num_threads(saved);
                int same = memcmp(y1, y2, (size_t)(n * rows) * sizeof *y1) == 0;
                free(y1), free(y2), free(xbuf);
                tmat_free(&t);
                CHECK(same, "%s %s n=%d: 1 and 2 threads differ", k3_kernels_name(all[p]),
                      DT_NAME[dt], n);
            }
}

/* MXFP4 edge scales: 0 (2^-127, subnormal weights), 254 (2^127: codes >= 2 overflow to inf)
 * and 255 (NaN) must give what the scalar path gives (same value, inf or NaN). */
static void test_mxfp4_edge_scales(void) {
    const k3_kernels *paths[8];
    int np = simd_paths(paths);
    enum { R = 6, C = 64 };
    static uint8_t packed[R * C / 2 + 1], scale[R * C / 32 + 1];
    static const uint8_t SC[R] = {0, 1, 254, 255, 127, 254};
    float x[C + 1], ys[R], yk[R];
    rng = 99;
    for (int r = 0; r < R; r++) {
        scale[1 + 2 * r] = SC[r], scale[2 + 2 * r] = r == 4 ? 255 : SC[r];
        for (int j = 0; j < C / 2; j++) /* row 2: codes <= 3 (|1.5·2^127| is finite) */
            packed[1 + r * C / 2 + j] = (uint8_t)(r == 2 ? (rnd_int(0, 3) | rnd_int(8, 11) << 4)
                                                        : rnd_int(0, 255));
    }
    for (int i = 0; i < C; i++) x[1 + i] = rnd() * ldexp(1.0, -100); /* no overflow at 2^127 */
    k3_mxfp4 w = {packed + 1, scale + 1, R, C};
    k3_matvec_mxfp4(k3_kernels_get("scalar"), &w, x + 1, ys);
    for (int p = 0; p < np; p++) {
        k3_matvec_mxfp4(paths[p], &w, x + 1, yk);
        for (int r = 0; r < R; r++) {
            int same_class = !!isnan(ys[r]) == !!isnan(yk[r]) && !!isinf(ys[r]) == !!isinf(yk[r]);
            double tol = 64 * 2 * ldexp(1.0, -24) * fabs(ys[r]);
            CHECK(same_class && (isnan(ys[r]) || isinf(ys[r]) ? isnan(ys[r]) || ys[r] == yk[r]
                                                               : fabs(yk[r] - ys[r]) <= tol),
                  "%s row %d (scale %d): %g, scalar %g", k3_kernels_name(paths[p]), r, SC[r],
                  yk[r], ys[r]);
        }
    }
}

/* The batched MXFP4 product (the GEMM from 8 vectors) gives each vector its matvec bits also
 * where blocks have the edge scales 0, 253, 254 and 255 (the weight-by-weight path) among
 * ordinary ones, in some row groups and not others. */
static void test_mxfp4_edge_scales_batched(void) {
    const k3_kernels *all[8];
    int np = k3_kernels_available(all, 8);
    enum { R = 26, C = 544, N = 64 };
    static uint8_t packed[R * C / 2 + 1], scale[R * C / 32 + 1];
    static const uint8_t EDGE[4] = {0, 253, 254, 255};
    rng = 4242;
    for (int i = 0; i < R * C / 2; i++) packed[1 + i] = (uint8_t)rnd_int(0, 255);
    for (int i = 0; i < R * C / 32; i++)
        scale[1 + i] = (i / (C / 32)) % 4 == 1 && rnd_int(0, 3) == 0 ? EDGE[rnd_int(0, 3)]
                                                                     : (uint8_t)rnd_int(118, 134);
    float *xbuf = malloc((size_t)(N * C + 1) * sizeof *xbuf), *x = xbuf + 1;
    for (int i = 0; i < N * C; i++) x[i] = rnd() * (float)ldexp(1.0, -100);
    k3_mxfp4 w = {packed + 1, scale + 1, R, C};
    float *yb = malloc((size_t)(N * R) * sizeof *yb), yv[R];
    for (int p = 0; p < np; p++) {
        k3_matmul_mxfp4(all[p], &w, x, N, yb);
        int bad = -1;
        for (int b = 0; b < N && bad < 0; b++) {
            k3_matvec_mxfp4(all[p], &w, x + b * C, yv);
            if (memcmp(yv, yb + b * R, sizeof yv) != 0) bad = b;
        }
        CHECK(bad < 0, "%s: batched row of vector %d differs from matvec", k3_kernels_name(all[p]),
              bad);
    }
    free(yb), free(xbuf);
}

/* The instruction-mix loops do the multiply-adds they report, and every SIMD path has them. */
static void test_mix_counts(void) {
    const k3_kernels *paths[8];
    int np = simd_paths(paths);
    for (int p = 0; p < np; p++)
        for (int m = K3_MIX_FMA; m <= K3_MIX_GEMM_MXFP4; m++) {
            int64_t one = k3_kernels_mix(paths[p], m, 1), three = k3_kernels_mix(paths[p], m, 3);
            CHECK(one > 0 && three == 3 * one, "%s mix %d: %lld then %lld MACs",
                  k3_kernels_name(paths[p]), m, (long long)one, (long long)three);
        }
    CHECK(k3_kernels_mix(k3_kernels_get("scalar"), K3_MIX_FMA, 1) == 0, "scalar has no mix");
}

static void test_dot_within_bound(void) {
    const k3_kernels *paths[8];
    int np = simd_paths(paths);
    static float a[1200], b[1200];
    rng = 5;
    for (int i = 0; i < 1200; i++) a[i] = rnd(), b[i] = rnd();
    static const int NS[] = {1, 3, 8, 15, 64, 128, 192, 1099};
    for (int p = 0; p < np; p++)
        for (size_t ni = 0; ni < sizeof NS / sizeof NS[0]; ni++) {
            int n = NS[ni];
            float s = k3_dot(k3_kernels_get("scalar"), a + 1, b + 3, n);
            float v = k3_dot(paths[p], a + 1, b + 3, n);
            double mag = 0;
            for (int i = 0; i < n; i++) mag += fabs((double)a[1 + i] * b[3 + i]);
            CHECK(fabs((double)v - s) <= 2.0 * n * ldexp(1.0, -24) * mag,
                  "%s n=%d: %.9g vs scalar %.9g", k3_kernels_name(paths[p]), n, v, s);
        }
}

static void test_axpy_exact(void) {
    const k3_kernels *paths[8];
    int np = simd_paths(paths);
    static float x[300], y0[300], ys[300], yk[300];
    rng = 6;
    for (int i = 0; i < 300; i++) x[i] = rnd(), y0[i] = rnd();
    for (int p = 0; p < np; p++)
        for (int n = 1; n < 140; n += 23) {
            memcpy(ys, y0, sizeof ys), memcpy(yk, y0, sizeof yk);
            k3_axpy(k3_kernels_get("scalar"), 0.3711f, x + 1, ys + 2, n);
            k3_axpy(paths[p], 0.3711f, x + 1, yk + 2, n);
            CHECK(memcmp(ys, yk, sizeof ys) == 0, "%s n=%d: differs from scalar",
                  k3_kernels_name(paths[p]), n);
        }
}

/* The KDA state update is element-wise in the value index: bit-exact on every path, over
 * several steps (the state carries forward), for K3's head_dim 128 and an awkward 13. */
static void test_kda_delta_rule_exact(void) {
    const k3_kernels *paths[8];
    int np = simd_paths(paths);
    enum { D = 128 };
    static float S0[D * D + 1], Ss[D * D + 1], Sk[D * D + 1];
    float q[D + 1], k[D + 1], v[D + 1], al[D + 1], u[D + 1], os[D + 1], ok[D + 1];
    for (int p = 0; p < np; p++)
        for (int d = 13; d <= D; d += D - 13) {
            rng = 11;
            for (int i = 0; i < d * d; i++) S0[1 + i] = rnd();
            memcpy(Ss, S0, sizeof Ss), memcpy(Sk, S0, sizeof Sk);
            for (int step = 0; step < 3; step++) {
                for (int i = 0; i < d; i++)
                    q[1 + i] = rnd(), k[1 + i] = rnd() * 0.1f, v[1 + i] = rnd(),
                    al[1 + i] = 0.5f + 0.5f * (rnd() + 1) / 2;
                float beta = 0.7f;
                k3_kda_delta_rule(k3_kernels_get("scalar"), Ss + 1, q + 1, k + 1, v + 1, al + 1,
                                  beta, d, u + 1, os + 1);
                k3_kda_delta_rule(paths[p], Sk + 1, q + 1, k + 1, v + 1, al + 1, beta, d, u + 1,
                                  ok + 1);
                CHECK(memcmp(os + 1, ok + 1, (size_t)d * sizeof *os) == 0 &&
                          memcmp(Ss, Sk, sizeof Ss) == 0,
                      "%s d=%d step %d: output or state differs from scalar",
                      k3_kernels_name(paths[p]), d, step);
            }
        }
}

/* Distance of f from the exact value e in units of f32's last place at e. */
static double ulps(float f, double e) {
    int ex;
    frexp(e, &ex); /* e = m·2^ex, 0.5 <= m < 1: one ulp is 2^(ex - 24), at least 2^-149 */
    return fabs((double)f - e) / ldexp(1.0, ex - 24 > -149 ? ex - 24 : -149);
}

/* k3_exp against libm's double exp (an independent computation): within 2 ulp on [-87.3, 0]
 * (a dense sweep and random points), e^-87.33654 (~2^-126) below it, NaN for NaN. */
static void test_exp_within_2ulp(void) {
    double worst = 0, at = 0;
    rng = 4242;
    for (int i = 0; i <= 2000000; i++) {
        float x = i <= 1000000 ? (float)(-87.3 * i / 1000000.0) : -87.3f * (rnd() + 1) / 2;
        double u = ulps(k3_exp(x), exp((double)x));
        if (u > worst) worst = u, at = x;
    }
    CHECK(worst <= 2.0, "k3_exp: %.2f ulp at x = %.9g", worst, at);
    if (getenv("K3_TEST_VERBOSE")) printf("        k3_exp: at most %.3f ulp (at %.9g)\n", worst, at);
    CHECK(k3_exp(0.0f) == 1.0f && k3_exp(-0.0f) == 1.0f, "e^0 = %.9g", k3_exp(0.0f));
    float lo = k3_exp(-87.33654f); /* the clamp: e^ln 2^-126 */
    CHECK(ulps(lo, exp((double)-87.33654f)) <= 2.0 && k3_exp(-100.0f) == lo && k3_exp(-INFINITY) == lo,
          "e^-87.33654 = %g, e^-100 = %g", lo, k3_exp(-100.0f));
    CHECK(isnan(k3_exp(NAN)), "e^NaN = %g", k3_exp(NAN));
}

/* k3_softmax_exp gives the scalar path's bits (p, the sum, the max) on every SIMD path, for
 * lengths around the 16 lanes and a tile's 512, a running max below and above the row's; and
 * the scalar path's values are what they say: the max exactly, p within 2 ulp of
 * e^(s·scale − m), the sum within n·2⁻²⁴·Σp of the exact sum of its p. */
static void test_softmax_exp_same_bits(void) {
    const k3_kernels *all[8];
    int np = k3_kernels_available(all, 8);
    static const int NS[] = {1, 5, 15, 16, 17, 100, 512, 513};
    static float s[600], ps[600], pk[600];
    const k3_kernels *sc = k3_kernels_get("scalar");
    rng = 99;
    for (size_t ni = 0; ni < sizeof NS / sizeof NS[0]; ni++)
        for (int mi = 0; mi < 3; mi++) {
            int n = NS[ni];
            float scale = 0.0721f, m0 = mi == 0 ? -INFINITY : mi == 1 ? -50.0f : 3.0f;
            for (int j = 0; j < n; j++) s[1 + j] = 40 * rnd();
            float ms = m0, sums = k3_softmax_exp(sc, s + 1, n, scale, &ms, ps + 1);
            double mx = m0, exact = 0, worst = 0;
            for (int j = 0; j < n; j++) mx = s[1 + j] * scale > mx ? s[1 + j] * scale : mx;
            for (int j = 0; j < n; j++) {
                double u = ulps(ps[1 + j], exp((double)(s[1 + j] * scale - (float)mx)));
                worst = u > worst ? u : worst, exact += ps[1 + j];
            }
            CHECK(ms == (float)mx && worst <= 2.0 &&
                      fabs(sums - exact) <= n * ldexp(1.0, -24) * exact,
                  "scalar n=%d: max %g (want %g), p %.2f ulp, sum %.9g (exact %.9g)", n, ms, mx,
                  worst, sums, exact);
            for (int p = 0; p < np; p++) {
                float mk = m0, sumk = k3_softmax_exp(all[p], s + 1, n, scale, &mk, pk + 1);
                CHECK(memcmp(&mk, &ms, 4) == 0 && memcmp(&sumk, &sums, 4) == 0 &&
                          memcmp(pk + 1, ps + 1, (size_t)n * sizeof *pk) == 0,
                      "%s n=%d m0=%g: differs from scalar (sum %.9g vs %.9g)",
                      k3_kernels_name(all[p]), n, m0, sumk, sums);
            }
        }
}

/* k3_matmul_rows over pieces of the rows gives k3_matmul's bits, every path, one vector and
 * a batch, and leaves the rows outside its range alone. */
static void test_matmul_rows_equal_matmul(void) {
    const k3_kernels *all[8];
    int np = k3_kernels_available(all, 8);
    rng = 5150;
    for (int p = 0; p < np; p++)
        for (int dt = 0; dt < 2; dt++)
            for (int n = 1; n <= 13; n += 12) {
                int64_t rows = 71, cols = 300;
                tmat t;
                tmat_make(&t, dt, rows, cols, 0);
                float *xbuf, *x = make_x(n, cols, 0, &xbuf);
                float *y1 = malloc((size_t)(n * rows) * sizeof *y1), *y2 = malloc((size_t)(n * rows) * sizeof *y2);
                k3_matmul(all[p], &t.mat, x, n, y1);
                for (int64_t i = 0; i < n * rows; i++) y2[i] = -1;
                k3_matmul_rows(all[p], &t.mat, x, n, y2, 0, 0); /* an empty range */
                int untouched = y2[0] == -1;
                for (int64_t r0 = 0; r0 < rows; r0 += 17)
                    k3_matmul_rows(all[p], &t.mat, x, n, y2, r0, r0 + 17 < rows ? r0 + 17 : rows);
                int same = memcmp(y1, y2, (size_t)(n * rows) * sizeof *y1) == 0;
                free(y1), free(y2), free(xbuf);
                tmat_free(&t);
                CHECK(same && untouched, "%s %s n=%d: k3_matmul_rows differs from k3_matmul",
                      k3_kernels_name(all[p]), DT_NAME[dt], n);
            }
}

/* k3_matmul_xw: on every path (scalar included) an output's bits do not depend on the column
 * range (the whole range against pieces that start mid-vector, and k = 0) and the other
 * columns are left alone; the scalar path is within the rounding bound of the exact product
 * computed here in double, and each SIMD path within twice that of the scalar path. */
static void test_matmul_xw(void) {
    const k3_kernels *all[8];
    int np = k3_kernels_available(all, 8);
    enum { K = 37, LDW = 150, N = 13, LDX = 41, LDY = 160 };
    static float w[K * LDW + 1], x[N * LDX + 1], ys[N * LDY], yf[N * LDY], yk[N * LDY];
    static double mg[N * LDY];
    static const int64_t CUT[] = {0, 3, 64, 67, 68, 133, 149, 150};
    rng = 2024;
    for (int i = 0; i < K * LDW; i++) w[1 + i] = rnd();
    for (int i = 0; i < N * LDX; i++) x[1 + i] = rnd();
    for (int k = 0; k <= K; k += K) {
        k3_matmul_xw(k3_kernels_get("scalar"), w + 1, LDW, k, x + 1, LDX, N, ys, LDY, 0, LDW);
        int within = 1;
        for (int b = 0; b < N; b++)
            for (int64_t c = 0; c < LDW; c++) {
                double e = 0, mag = 0;
                for (int i = 0; i < k; i++) {
                    double t = (double)x[1 + b * LDX + i] * w[1 + i * LDW + c];
                    e += t, mag += fabs(t);
                }
                within &= fabs(ys[b * LDY + c] - e) <= k * ldexp(1.0, -24) * mag;
                mg[b * LDY + c] = mag;
            }
        CHECK(within, "scalar k=%d: off the exact product", k);
        for (int p = 0; p < np; p++) {
            for (int i = 0; i < N * LDY; i++) yf[i] = yk[i] = -7;
            k3_matmul_xw(all[p], w + 1, LDW, k, x + 1, LDX, N, yf, LDY, 0, LDW);
            for (size_t ci = 0; ci + 1 < sizeof CUT / sizeof CUT[0]; ci++)
                k3_matmul_xw(all[p], w + 1, LDW, k, x + 1, LDX, N, yk, LDY, CUT[ci], CUT[ci + 1]);
            int same = memcmp(yf, yk, sizeof yf) == 0, alone = 1, near = 1;
            for (int b = 0; b < N; b++)
                for (int64_t c = 0; c < LDY; c++) {
                    float v = yf[b * LDY + c];
                    if (c >= LDW) alone &= v == -7;
                    else
                        near &= fabs(v - ys[b * LDY + c]) <= 2.0 * k * ldexp(1.0, -24) *
                                                                 mg[b * LDY + c];
                }
            CHECK(same && alone && near, "%s k=%d: pieces differ from the whole range (%d), "
                  "wrote past its columns (%d) or off scalar (%d)", k3_kernels_name(all[p]), k,
                  same, alone, near);
        }
    }
}

static void test_select_by_name_and_env(void) {
    k3_err err = {0};
    const k3_kernels *k = NULL;
    CHECK(k3_kernels_select("scalar", &k, &err) == 0 && k == k3_kernels_get("scalar"),
          "select scalar");
    CHECK(k3_kernels_select("nosuchpath", &k, &err) == K3_ERR_USAGE &&
              strstr(err.msg, "nosuchpath") && strstr(err.msg, "scalar"),
          "unknown path: %s", err.msg);
    /* the library reads no environment: K3_KERNELS is the CLI's (src/cli/opts.c) */
    const char *saved = getenv("K3_KERNELS");
    char *keep = saved ? strdup(saved) : NULL;
    setenv("K3_KERNELS", "scalar", 1);
    int rc = k3_kernels_select(NULL, &k, &err);
    if (keep) setenv("K3_KERNELS", keep, 1); else unsetenv("K3_KERNELS");
    free(keep);
    CHECK(rc == 0 && k == k3_kernels_best(), "K3_KERNELS read by the library");
    const k3_kernels *all[8];
    int n = k3_kernels_available(all, 8);
    CHECK(n >= 1 && all[0] == k3_kernels_best() && all[n - 1] == k3_kernels_get("scalar"),
          "available list: %d paths, best first, scalar last", n);
#if defined(__aarch64__)
    CHECK(k3_kernels_best() == k3_kernels_get("neon"), "aarch64 must pick neon");
#endif
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        CHECK(k3_kernels_get("avx2") != NULL, "this CPU has AVX2+FMA but avx2 is unavailable");
#endif
    CHECK(k3_cpu_physical_cores() >= 1, "physical cores %d", k3_cpu_physical_cores());
}

/* ---- lossless BF16 (K3_DT_BF16LX) ----------------------------------------------------------- */

/* A BF16 matrix re-encoded as the packer does (one table from the whole matrix's high-byte
 * histogram); *data and *esc are malloc'd, data misaligned by one byte. */
static k3_mat lx_make(const uint16_t *w, int64_t rows, int64_t cols, uint8_t **data,
                      uint32_t **esc) {
    uint64_t hist[256] = {0};
    uint8_t code_of[256];
    k3_mat m = {.dtype = K3_DT_BF16LX, .rows = rows, .cols = cols};
    for (int64_t i = 0; i < rows * cols; i++) hist[w[i] >> 8]++;
    k3_lx_table(hist, m.xtab, code_of);
    uint64_t rb = k3_lx_row_bytes(cols);
    *data = malloc((size_t)(rows * rb) + 1);
    *esc = malloc((size_t)(rows + 1 + rows * cols) * sizeof **esc);
    uint32_t n = 0;
    for (int64_t r = 0; r < rows; r++) {
        (*esc)[r] = n;
        n += (uint32_t)k3_lx_encode_row(w + r * cols, cols, code_of, *data + 1 + r * rb,
                                        *esc + rows + 1 + n);
    }
    (*esc)[rows] = n;
    m.data = *data + 1, m.esc = *esc, m.n_esc = n;
    return m;
}

/* BF16 values of every kind: most from a few exponents (table hits), some from far ones
 * (escapes), and ±0, subnormals, ±inf and NaN. */
static uint16_t lx_value(void) {
    int k = rnd_int(0, 99);
    if (k < 3) return (uint16_t)rnd_u32(); /* any bit pattern at all */
    if (k < 5) {
        static const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x7f80, 0xff80, 0x7fc1};
        return special[rnd_int(0, 6)];
    }
    return to_bf16(rnd() * ldexpf(1.0f, rnd_int(-3, 2)));
}

static void test_lossless_decode_gives_every_bit(void) {
    static const int64_t cols[] = {1, 31, 32, 33, 100, 1031};
    rng = 31;
    for (int c = 0; c < 6; c++) {
        int64_t rows = 7, n = rows * cols[c];
        uint16_t *w = malloc((size_t)n * 2), *back = malloc((size_t)cols[c] * 2);
        for (int64_t i = 0; i < n; i++) w[i] = lx_value();
        uint8_t *data;
        uint32_t *esc;
        k3_mat m = lx_make(w, rows, cols[c], &data, &esc);
        int64_t escapes = 0; /* counted independently: high bytes the table lacks */
        for (int64_t i = 0; i < n; i++)
            escapes += memchr(m.xtab, w[i] >> 8, 15) == NULL;
        for (int64_t r = 0; r < rows && !k3_test_stopped(); r++) {
            k3_lx_decode_row(&m, r, back);
            for (int64_t i = 0; i < cols[c]; i++)
                CHECK(back[i] == w[r * cols[c] + i], "cols %lld row %lld col %lld: %04x != %04x",
                      (long long)cols[c], (long long)r, (long long)i, back[i], w[r * cols[c] + i]);
            for (int64_t i = 0; i < cols[c]; i += 13)
                CHECK(k3_mat_at(&m, r * cols[c] + i) == k3_bf16_to_f32(w[r * cols[c] + i]) ||
                      (w[r * cols[c] + i] & 0x7fff) > 0x7f80);
        }
        CHECK((int64_t)m.n_esc == escapes, "%u escapes, %lld expected", m.n_esc, (long long)escapes);
        free(w), free(back), free(data), free(esc);
    }
}

/* Every path's lossless product equals its BF16 product bit for bit, for matrix-vector and
 * batched sizes (small, tiled, over K3_MAX_BATCH), with escapes in some groups and partial
 * last groups. A NaN result only has to be a NaN: which operand's payload an FMA passes on
 * follows the instruction form the compiler picked, even between two BF16 loops. */
static void test_lossless_products_bit_identical(void) {
    /* 130 rows: more than one GEMM row tile (GEMM_RB 64 / 96), whose escape cursors are kept
     * per row modulo the tile; 1031 columns: three column tiles of GEMM_KC 512 */
    static const int64_t rows[] = {1, 5, 38, 130}, cols[] = {7, 32, 33, 100, 300, 1031};
    static const int ns[] = {1, 2, 5, 7, 65};
    const k3_kernels *paths[8];
    int np = k3_kernels_available(paths, 8);
    rng = 77;
    for (int ri = 0; ri < 4; ri++)
        for (int ci = 0; ci < 6; ci++) {
            int64_t R = rows[ri], C = cols[ci];
            uint16_t *w = malloc((size_t)(R * C) * 2);
            for (int64_t i = 0; i < R * C; i++) w[i] = lx_value();
            uint8_t *data;
            uint32_t *esc;
            k3_mat lx = lx_make(w, R, C, &data, &esc);
            k3_mat bf = {.data = w, .dtype = K3_DT_BF16, .rows = R, .cols = C};
            CHECK(R * C < 200 || lx.n_esc > 0, "the test must exercise escapes");
            for (int ni = 0; ni < 5 && !k3_test_stopped(); ni++) {
                int n = ns[ni];
                float *xbuf, *x = make_x(n, C, 0, &xbuf);
                float *ya = malloc((size_t)(n * R) * 4), *yb = malloc((size_t)(n * R) * 4);
                for (int p = 0; p < np && !k3_test_stopped(); p++) {
                    k3_matmul(paths[p], &bf, x, n, ya);
                    k3_matmul(paths[p], &lx, x, n, yb);
                    for (int64_t i = 0; i < n * R; i++)
                        CHECK(memcmp(&ya[i], &yb[i], 4) == 0 || (isnan(ya[i]) && isnan(yb[i])), "%s: [%lld, %lld] n=%d: y[%lld] %g != %g",
                              k3_kernels_name(paths[p]), (long long)R, (long long)C, n, (long long)i, ya[i], yb[i]);
                }
                free(xbuf), free(ya), free(yb);
            }
            free(w), free(data), free(esc);
        }
}

/* A corrupt escape index (past the list, backwards) gives numbers, never a read outside. */
static void test_lossless_corrupt_index_stays_inside(void) {
    const k3_kernels *paths[8];
    int np = k3_kernels_available(paths, 8);
    rng = 5;
    int64_t R = 9, C = 100;
    uint16_t *w = malloc((size_t)(R * C) * 2);
    for (int64_t i = 0; i < R * C; i++) w[i] = lx_value();
    uint8_t *data;
    uint32_t *esc;
    k3_mat lx = lx_make(w, R, C, &data, &esc);
    esc[3] = 0xfffffff0u, esc[5] = 1, esc[R] = 0xffffffffu;
    for (uint32_t i = 0; i < lx.n_esc; i++) esc[R + 1 + i] ^= 0xa5a5a500u; /* columns scrambled */
    float *xbuf, *x = make_x(3, C, 0, &xbuf), y[3 * 9];
    for (int p = 0; p < np; p++) {
        k3_matmul(paths[p], &lx, x, 1, y);
        k3_matmul(paths[p], &lx, x, 3, y);
    }
    CHECK(1, "reached (ASan / UBSan builds check the reads)");
    free(w), free(data), free(esc), free(xbuf);
}

const k3_test k3_suite_simd[] = {
    {"lossless_decode_gives_every_bit", test_lossless_decode_gives_every_bit},
    {"lossless_products_bit_identical", test_lossless_products_bit_identical},
    {"lossless_corrupt_index_stays_inside", test_lossless_corrupt_index_stays_inside},
    {"select_by_name_and_env", test_select_by_name_and_env},
    {"matvec_integers_exact", test_matvec_integers_exact},
    {"matvec_random_within_bound", test_matvec_random_within_bound},
    {"matmul_integers_exact", test_matmul_integers_exact},
    {"matmul_random_within_bound", test_matmul_random_within_bound},
    {"matmul_rows_equal_matvec_bitwise", test_matmul_rows_equal_matvec_bitwise},
    {"matmul_blocks_rows_equal_matvec", test_matmul_blocks_rows_equal_matvec},
    {"mxfp4_edge_scales_batched", test_mxfp4_edge_scales_batched},
    {"mix_counts", test_mix_counts},
    {"thread_count_does_not_change_results", test_thread_count_does_not_change_results},
    {"mxfp4_edge_scales", test_mxfp4_edge_scales},
    {"mxfp4_many_equals_each_matvec", test_mxfp4_many_equals_each_matvec},
    {"dot_within_bound", test_dot_within_bound},
    {"axpy_exact", test_axpy_exact},
    {"kda_delta_rule_exact", test_kda_delta_rule_exact},
    {"exp_within_2ulp", test_exp_within_2ulp},
    {"softmax_exp_same_bits", test_softmax_exp_same_bits},
    {"matmul_rows_equal_matmul", test_matmul_rows_equal_matmul},
    {"matmul_xw", test_matmul_xw},
    {0},
};
