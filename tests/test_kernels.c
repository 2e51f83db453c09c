/* test_kernels.c — the math primitives (src/kernels) and the AttnRes mix against independent
 * references: values written out by hand from the spec, or the spec's formula evaluated in
 * double precision here (never values printed by the engine).
 *
 * Tolerances: a matvec or weighted sum is checked to 1e-5 relative to Σ|terms| (the scale of
 * f32 accumulation error; equal to plain relative error when nothing cancels); an elementwise
 * function (RMSNorm, SiTU, the KDA gate) to 1e-6 relative. Decoding is checked exactly. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "../src/format/safetensors.h"
#include "../src/kernels/kernels.h"
#include "../src/model/layers.h"
#include "test.h"

/* These tests check the scalar reference path against independent computations;
 * tests/test_simd.c checks every SIMD path against it. */
#define SCALAR k3_kernels_get("scalar")

/* ---- independent references -------------------------------------------------------------- */

/* E2M1 from its bit fields (spec §10.4: bit 3 sign, bits 2..1 exponent, bit 0 mantissa),
 * bias 1, exponent 0 subnormal: 0.5·m; otherwise (1 + 0.5·m)·2^(e-1). No lookup table. */
static double e2m1_ref(unsigned code) {
    unsigned sign = (code >> 3) & 1, e = (code >> 1) & 3, m = code & 1;
    double mag = e == 0 ? 0.5 * m : ldexp(1.0 + 0.5 * m, (int)e - 1);
    return sign ? -mag : mag;
}

/* BF16 from its bit fields: sign, 8-bit exponent (bias 127), 7-bit mantissa. Finite only. */
static double bf16_ref(uint16_t h) {
    int sign = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
    double mag = e == 0 ? ldexp(m, -126 - 7) : ldexp(128 + m, e - 127 - 7);
    return sign ? -mag : mag;
}

/* Deterministic values: a 32-bit LCG; rnd() in [-1, 1). */
static uint32_t rng_state;
static uint32_t rnd_u32(void) { return rng_state = rng_state * 1664525u + 1013904223u; }
static float rnd(void) { return (float)((rnd_u32() >> 8) & 0xffff) / 32768.0f - 1.0f; }

/* Top 16 bits of an f32 (truncation: any BF16 pattern will do for a test matrix). */
static uint16_t to_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* |got - want| <= tol · scale, scale > 0. */
static int close_to(double got, double want, double tol, double scale) {
    return fabs(got - want) <= tol * scale;
}

static double rel_scale(double want) { return fabs(want) > 1e-300 ? fabs(want) : 1e-300; }

/* ---- 1. MXFP4 decode ----------------------------------------------------------------------- */

static void test_mxfp4_codes_at_scale_127(void) {
    /* spec §10.4 table, written out: codes 0..7 positive, 8..15 the same negated */
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (unsigned c = 0; c < 16; c++) {
        float v = k3_mxfp4_value((uint8_t)c, 127), want = c < 8 ? mag[c] : -mag[c - 8];
        CHECK(v == want, "code %u: %g, want %g", c, v, want);
        CHECK(!!signbit(v) == (c >= 8), "code %u: sign bit %d", c, !!signbit(v));
    }
    float nz = k3_mxfp4_value(8, 127);
    CHECK(nz == 0.0f && signbit(nz), "code 8 must be -0, got %g", nz);
}

static void test_mxfp4_scale_0_is_2_pow_minus_127(void) {
    for (unsigned c = 0; c < 16; c++) {
        double v = k3_mxfp4_value((uint8_t)c, 0), want = e2m1_ref(c) * ldexp(1.0, -127);
        CHECK(v == want, "code %u: %a, want %a", c, v, want);
    }
    float half = k3_mxfp4_value(1, 0); /* 0.5 · 2^-127 = 2^-128, an f32 subnormal */
    CHECK((double)half == ldexp(1.0, -128), "%a", (double)half);
    CHECK(fpclassify(half) == FP_SUBNORMAL, "0.5*2^-127 should be subnormal");
    float nhalf = k3_mxfp4_value(9, 0);
    CHECK((double)nhalf == -ldexp(1.0, -128), "%a", (double)nhalf);
}

/* 2^127 · E2M1: |code| <= 1.5 gives an exact finite value (1.5·2^127 < FLT_MAX); |code| >= 2
 * gives 2^128 or more, above FLT_MAX = (2 - 2^-23)·2^127, so the f32 product is ±inf. */
static void test_mxfp4_scale_254_is_2_pow_127(void) {
    for (unsigned c = 0; c < 16; c++) {
        double v = k3_mxfp4_value((uint8_t)c, 254), want = e2m1_ref(c) * ldexp(1.0, 127);
        if (fabs(want) <= FLT_MAX)
            CHECK(v == want, "code %u: %a, want %a", c, v, want);
        else
            CHECK(isinf(v) && (v > 0) == (want > 0), "code %u: %a, want %sinf", c, v,
                  want > 0 ? "+" : "-");
    }
    float big = k3_mxfp4_value(3, 254), nbig = k3_mxfp4_value(11, 254);
    CHECK(isfinite(big) && (double)big == 1.5 * ldexp(1.0, 127), "1.5*2^127 = %g", big);
    CHECK(isfinite(nbig) && (double)nbig == -1.5 * ldexp(1.0, 127), "-1.5*2^127 = %g", nbig);
    CHECK(isinf(k3_mxfp4_value(7, 254)), "6*2^127 > FLT_MAX must be inf");
}

static void test_mxfp4_scale_255_is_nan(void) {
    /* E8M0 255 is NaN (OCP MX); every code, zero included, times NaN is NaN */
    for (unsigned c = 0; c < 16; c++) {
        float v = k3_mxfp4_value((uint8_t)c, 255);
        CHECK(isnan(v), "code %u at scale 255: %g", c, v);
    }
}

static void test_mxfp4_every_code_and_scale_vs_ldexp(void) {
    for (unsigned s = 0; s < 255; s++)
        for (unsigned c = 0; c < 16; c++) {
            double v = k3_mxfp4_value((uint8_t)c, (uint8_t)s);
            double want = e2m1_ref(c) * ldexp(1.0, (int)s - 127);
            /* exact for every scale <= 252; above, |value| > FLT_MAX rounds to ±inf */
            if (s <= 252) CHECK(fabs(want) <= FLT_MAX, "scale %u code %u overflows", s, c);
            CHECK(v == (float)want, "code %u scale %u: %a, want %a", c, s, v, want);
        }
}

/* ---- 2. MXFP4 matvec ----------------------------------------------------------------------- */

#define MX_R 3
#define MX_C 64

typedef struct mx_case {
    uint8_t code[MX_R][MX_C]; /* the logical matrix, one E2M1 code per element */
    uint8_t scale[MX_R][MX_C / 32];
    uint8_t packed[MX_R * MX_C / 2];
    float x[MX_C];
} mx_case;

/* Codes differ between each even column and the odd column after it, so a nibble swap
 * changes the product; scales differ per row and per 32-group. */
static void mx_build(mx_case *m) {
    static const uint8_t scales[MX_R][2] = {{127, 129}, {120, 131}, {133, 124}};
    for (int r = 0; r < MX_R; r++) {
        for (int g = 0; g < MX_C / 32; g++) m->scale[r][g] = scales[r][g];
        for (int c = 0; c < MX_C; c++) m->code[r][c] = (uint8_t)((c * 7 + r * 5 + (c & 1) * 3) % 16);
    }
    memset(m->packed, 0, sizeof m->packed);
    for (int r = 0; r < MX_R; r++)
        for (int c = 0; c < MX_C; c++) {
            uint8_t *byte = &m->packed[r * (MX_C / 2) + c / 2];
            if (c % 2 == 0)
                *byte = (uint8_t)(*byte | m->code[r][c]); /* even column: low nibble */
            else
                *byte = (uint8_t)(*byte | (m->code[r][c] << 4)); /* odd column: high nibble */
        }
    rng_state = 12345;
    for (int c = 0; c < MX_C; c++) m->x[c] = rnd() + (c % 2 ? 0.75f : -0.25f);
}

/* Σ_c W[r][c]·x[c] in double, W decoded from the logical codes; swap = 1 reads each pair's
 * codes the other way round (what a high-nibble-first decoder would see). */
static double mx_ref(const mx_case *m, int r, int swap, double *abs_sum) {
    double s = 0, a = 0;
    for (int c = 0; c < MX_C; c++) {
        int src = swap ? c ^ 1 : c;
        double w = e2m1_ref(m->code[r][src]) * ldexp(1.0, m->scale[r][c / 32] - 127);
        s += w * m->x[c];
        a += fabs(w * m->x[c]);
    }
    if (abs_sum) *abs_sum = a;
    return s;
}

static void test_mxfp4_matvec_vs_double_reference(void) {
    static mx_case m;
    mx_build(&m);
    k3_mxfp4 w = {m.packed, &m.scale[0][0], MX_R, MX_C};
    float y[MX_R];
    k3_matvec_mxfp4(SCALAR, &w, m.x, y);
    for (int r = 0; r < MX_R; r++) {
        double a, want = mx_ref(&m, r, 0, &a);
        CHECK(close_to(y[r], want, 1e-5, a), "row %d: %.9g, want %.9g", r, y[r], want);
    }
}

static void test_mxfp4_matvec_detects_nibble_swap(void) {
    static mx_case m;
    mx_build(&m);
    k3_mxfp4 w = {m.packed, &m.scale[0][0], MX_R, MX_C};
    float y[MX_R];
    k3_matvec_mxfp4(SCALAR, &w, m.x, y);
    for (int r = 0; r < MX_R; r++) {
        double a, swapped = mx_ref(&m, r, 1, &a);
        /* the swapped-order result is far outside the tolerance the real check uses */
        CHECK(!close_to(y[r], swapped, 1e-2, a), "row %d: %.9g matches swapped %.9g", r, y[r],
              swapped);
    }
}

/* x = e_c picks out column c: y[r] = W[r][c] exactly, for every column (layout + scales). */
static void test_mxfp4_matvec_unit_columns_exact(void) {
    static mx_case m;
    mx_build(&m);
    k3_mxfp4 w = {m.packed, &m.scale[0][0], MX_R, MX_C};
    float x[MX_C], y[MX_R];
    for (int c = 0; c < MX_C; c++) {
        memset(x, 0, sizeof x);
        x[c] = 1.0f;
        k3_matvec_mxfp4(SCALAR, &w, x, y);
        for (int r = 0; r < MX_R; r++) {
            double want = e2m1_ref(m.code[r][c]) * ldexp(1.0, m.scale[r][c / 32] - 127);
            CHECK((double)y[r] == want, "W[%d][%d] = %g, want %g", r, c, y[r], want);
        }
    }
}

/* ---- 3. BF16 widening and dense matvec ----------------------------------------------------- */

static void test_bf16_widening_special_values(void) {
    CHECK(k3_bf16_to_f32(0x3f80) == 1.0f, "0x3f80 -> %g", k3_bf16_to_f32(0x3f80));
    CHECK(k3_bf16_to_f32(0xc000) == -2.0f, "0xc000 -> %g", k3_bf16_to_f32(0xc000));
    float inf = k3_bf16_to_f32(0x7f80);
    CHECK(isinf(inf) && inf > 0, "0x7f80 -> %g", inf);
    float sub = k3_bf16_to_f32(0x0001);
    CHECK((double)sub == ldexp(1.0, -133), "0x0001 -> %a, want 2^-133", (double)sub);
    CHECK(fpclassify(sub) == FP_SUBNORMAL, "0x0001 should be subnormal");
    CHECK(isnan(k3_bf16_to_f32(0x7fc0)), "0x7fc0 -> %g", k3_bf16_to_f32(0x7fc0));
    float nz = k3_bf16_to_f32(0x8000);
    CHECK(nz == 0.0f && signbit(nz), "0x8000 -> -0");
}

static void test_bf16_widening_matches_bit_fields(void) {
    for (uint32_t h = 0; h < 0x10000; h++) {
        if (((h >> 7) & 0xff) == 0xff) continue; /* inf / NaN: checked above */
        double v = k3_bf16_to_f32((uint16_t)h), want = bf16_ref((uint16_t)h);
        CHECK(v == want, "0x%04x -> %a, want %a", (unsigned)h, v, want);
    }
}

/* y = W x for a rows×cols BF16 or F32 matrix vs Σ in double. */
static void check_matvec(int dtype, int rows, int cols, uint32_t seed) {
    static uint16_t wb[64 * 64];
    static float wf[64 * 64], x[64], y[64];
    rng_state = seed;
    for (int i = 0; i < rows * cols; i++) {
        float v = rnd() * 2.0f;
        wb[i] = to_bf16_bits(v);
        wf[i] = v;
    }
    for (int i = 0; i < cols; i++) x[i] = rnd();
    k3_mat w = {.data = dtype == K3_DT_BF16 ? (const void *)wb : (const void *)wf, .dtype = dtype,
                .rows = rows, .cols = cols};
    k3_matvec(SCALAR, &w, x, y);
    for (int r = 0; r < rows; r++) {
        double s = 0, a = 0;
        for (int i = 0; i < cols; i++) {
            double wi = dtype == K3_DT_BF16 ? bf16_ref(wb[r * cols + i]) : (double)wf[r * cols + i];
            s += wi * x[i];
            a += fabs(wi * x[i]);
        }
        CHECK(close_to(y[r], s, 1e-5, a), "%s %dx%d row %d: %.9g, want %.9g",
              dtype == K3_DT_BF16 ? "bf16" : "f32", rows, cols, r, y[r], s);
    }
}

/* 7 rows: one 4-row block + 3 tail rows; 5 rows: 4 + 1; 3 rows: tail only. */
static void test_matvec_bf16_odd_sizes(void) {
    check_matvec(K3_DT_BF16, 7, 13, 1);
    if (k3_test_stopped()) return;
    check_matvec(K3_DT_BF16, 5, 3, 2);
    if (k3_test_stopped()) return;
    check_matvec(K3_DT_BF16, 3, 33, 3);
    if (k3_test_stopped()) return;
    check_matvec(K3_DT_BF16, 37, 64, 4); /* crosses a 16-row thread block */
}

static void test_matvec_f32_odd_sizes(void) {
    check_matvec(K3_DT_F32, 7, 13, 5);
    if (k3_test_stopped()) return;
    check_matvec(K3_DT_F32, 5, 3, 6);
    if (k3_test_stopped()) return;
    check_matvec(K3_DT_F32, 37, 64, 7);
}

/* 300×200 = 60000 multiply-adds, above kernels.c's PARALLEL_MIN_MACS (32768). */
#define TH_R 300
#define TH_C 200

static void test_matvec_same_result_1_and_2_threads(void) {
    static uint16_t wb[TH_R * TH_C];
    static float wf[TH_R * TH_C], x[TH_C], y1[TH_R], y2[TH_R];
    rng_state = 99;
    for (int i = 0; i < TH_R * TH_C; i++) wf[i] = rnd(), wb[i] = to_bf16_bits(wf[i]);
    for (int i = 0; i < TH_C; i++) x[i] = rnd();
    int saved = omp_get_max_threads();
    for (int dt = 0; dt < 2; dt++) {
        k3_mat w = {.data = dt ? (const void *)wb : (const void *)wf,
                    .dtype = dt ? K3_DT_BF16 : K3_DT_F32, .rows = TH_R, .cols = TH_C};
        omp_set_num_threads(1);
        k3_matvec(SCALAR, &w, x, y1);
        omp_set_num_threads(2);
        k3_matvec(SCALAR, &w, x, y2);
        omp_set_num_threads(saved);
        CHECK(memcmp(y1, y2, sizeof y1) == 0, "%s: 1-thread and 2-thread results differ",
              dt ? "bf16" : "f32");
    }
}

static void test_matvec_mxfp4_same_result_1_and_2_threads(void) {
    enum { R = 64, C = 1024 }; /* 65536 MACs */
    static uint8_t packed[R * C / 2], scale[R * C / 32];
    static float x[C], y1[R], y2[R];
    rng_state = 7;
    for (int i = 0; i < R * C / 2; i++) packed[i] = (uint8_t)(rnd_u32() >> 24);
    for (int i = 0; i < R * C / 32; i++) scale[i] = (uint8_t)(120 + i % 15);
    for (int i = 0; i < C; i++) x[i] = rnd();
    k3_mxfp4 w = {packed, scale, R, C};
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    k3_matvec_mxfp4(SCALAR, &w, x, y1);
    omp_set_num_threads(2);
    k3_matvec_mxfp4(SCALAR, &w, x, y2);
    omp_set_num_threads(saved);
    CHECK(memcmp(y1, y2, sizeof y1) == 0, "1-thread and 2-thread results differ");
}

/* ---- 4. RMSNorm ------------------------------------------------------------------------------ */

/* x = {1,2,3,4}: Σx² = 30, mean 7.5, r = 1/sqrt(7.5 + 1e-5). */
static const float RMS_X[4] = {1, 2, 3, 4};
static const uint16_t RMS_W_BF16[4] = {0x3f80, 0x3f00, 0x4000, 0xbf80}; /* 1, 0.5, 2, -1 */
static const double RMS_W[4] = {1, 0.5, 2, -1};

static void test_rmsnorm_no_weight(void) {
    float y[4];
    k3_rmsnorm(RMS_X, NULL, 4, 1e-5f, y);
    double r = 1.0 / sqrt(30.0 / 4.0 + (double)1e-5f);
    for (int i = 0; i < 4; i++) {
        double want = RMS_X[i] * r;
        CHECK(close_to(y[i], want, 1e-6, rel_scale(want)), "y[%d]=%.9g, want %.9g", i, y[i], want);
    }
}

static void test_rmsnorm_bf16_weight(void) {
    float y[4];
    k3_mat w = {.data = RMS_W_BF16, .dtype = K3_DT_BF16, .rows = 1, .cols = 4};
    k3_rmsnorm(RMS_X, &w, 4, 1e-5f, y);
    double r = 1.0 / sqrt(30.0 / 4.0 + (double)1e-5f);
    for (int i = 0; i < 4; i++) {
        double want = RMS_W[i] * (RMS_X[i] * r);
        CHECK(close_to(y[i], want, 1e-6, rel_scale(want)), "y[%d]=%.9g, want %.9g", i, y[i], want);
    }
}

static void test_rmsnorm_eps_matters_for_small_input(void) {
    /* x = 1e-3·{1,2,3,4}: mean x² = 7.5e-6, comparable to eps 1e-5 */
    float x[4], y[4];
    for (int i = 0; i < 4; i++) x[i] = RMS_X[i] * 1e-3f;
    k3_rmsnorm(x, NULL, 4, 1e-5f, y);
    double ms = 0;
    for (int i = 0; i < 4; i++) ms += (double)x[i] * x[i];
    double r = 1.0 / sqrt(ms / 4 + (double)1e-5f);
    for (int i = 0; i < 4; i++) {
        double want = x[i] * r;
        CHECK(close_to(y[i], want, 1e-6, rel_scale(want)), "y[%d]=%.9g, want %.9g", i, y[i], want);
    }
}

static void test_rmsnorm_in_place(void) {
    float y[4], xy[4];
    k3_mat w = {.data = RMS_W_BF16, .dtype = K3_DT_BF16, .rows = 1, .cols = 4};
    k3_rmsnorm(RMS_X, &w, 4, 1e-5f, y);
    memcpy(xy, RMS_X, sizeof xy);
    k3_rmsnorm(xy, &w, 4, 1e-5f, xy);
    CHECK(memcmp(y, xy, sizeof y) == 0, "in-place result differs from out-of-place");
}

/* ---- 5. SiTU ----------------------------------------------------------------------------------- */

/* Spec §8.1: (4·tanh(g/4))·σ(g)·(25·tanh(u/25)), σ on the uncapped g. */
static double situ_ref(double g, double u) {
    return (4.0 * tanh(g / 4.0)) * (1.0 / (1.0 + exp(-g))) * (25.0 * tanh(u / 25.0));
}

static void test_situ_vs_double_formula(void) {
    static const float cases[][2] = {{1, 2},     {-1, 0.5f}, {0.25f, -7}, {3, 30},   {-3, -30},
                                     {10, 1},    {-10, 1},   {20, 100},   {-20, -5}, {40, 2},
                                     {-40, 2},   {7, -60},   {0.001f, 1}, {-2.5f, 3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float g = cases[i][0], u = cases[i][1];
        double got = k3_situ(g, u, 4.0f, 25.0f), want = situ_ref(g, u);
        CHECK(close_to(got, want, 1e-6, rel_scale(want)), "SiTU(%g,%g)=%.9g, want %.9g", g, u,
              got, want);
    }
}

static void test_situ_zero_gate_is_zero(void) {
    CHECK(k3_situ(0.0f, 3.0f, 4.0f, 25.0f) == 0.0f, "SiTU(0,3)=%g", k3_situ(0.0f, 3.0f, 4.0f, 25.0f));
    CHECK(k3_situ(0.0f, -100.0f, 4.0f, 25.0f) == 0.0f, "SiTU(0,-100) should be 0");
    CHECK(k3_situ(2.0f, 0.0f, 4.0f, 25.0f) == 0.0f, "SiTU(2,0) should be 0");
}

/* Large |g|: 4·tanh(g/4) saturates to ±4, so SiTU / (σ(g)·u') → ±4. */
static void test_situ_gate_saturates_at_4_sigma(void) {
    static const float gs[] = {40.0f, 60.0f, -45.0f, -60.0f};
    for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++) {
        float g = gs[i], u = 3.0f;
        double up = 25.0 * tanh(u / 25.0), sig = 1.0 / (1.0 + exp(-(double)g));
        double ratio = k3_situ(g, u, 4.0f, 25.0f) / (sig * up), want = g > 0 ? 4.0 : -4.0;
        CHECK(close_to(ratio, want, 1e-6, 4.0), "g=%g: SiTU/(sigma*u') = %.9g, want %g", g, ratio,
              want);
    }
}

static void test_situ_sigmoid_takes_uncapped_gate(void) {
    float g = 10.0f, u = 5.0f;
    double got = k3_situ(g, u, 4.0f, 25.0f), up = 25.0 * tanh(5.0 / 25.0);
    double capped = 4.0 * tanh(2.5);
    double want = capped * (1.0 / (1.0 + exp(-10.0))) * up;     /* σ(10) ≈ 0.99995 */
    double wrong = capped * (1.0 / (1.0 + exp(-capped))) * up; /* σ(3.95) ≈ 0.981 */
    CHECK(close_to(got, want, 1e-6, fabs(want)), "%.9g, want %.9g", got, want);
    CHECK(!close_to(got, wrong, 1e-3, fabs(wrong)), "%.9g matches sigma(capped g) %.9g", got,
          wrong);
}

static void test_situ_vec_in_place_matches_scalar(void) {
    float g[5] = {-3, -0.5f, 0, 1.5f, 12}, u[5] = {2, -4, 7, 30, -0.1f}, want[5];
    for (int i = 0; i < 5; i++) want[i] = k3_situ(g[i], u[i], 4.0f, 25.0f);
    k3_situ_vec(g, u, 5, 4.0f, 25.0f, g);
    CHECK(memcmp(g, want, sizeof want) == 0, "k3_situ_vec in place differs from k3_situ");
}

/* ---- 6. KDA decay gate ---------------------------------------------------------------------- */

/* Spec §6.4: α = exp(lb · σ(exp(A_log[h]) · (f + dt_bias))). */
static double kda_gate_ref(double f, double dt_bias, double a_log, double lb) {
    double z = f + dt_bias;
    return exp(lb * (1.0 / (1.0 + exp(-(exp(a_log) * z)))));
}

static void test_kda_gate_hand_case(void) {
    /* z = 0.2, exp(0.5)·z = 0.329744, σ = 0.581697, ·(−5) = −2.908486, α ≈ 0.054558 */
    float a = k3_kda_gate(0.3f, -0.1f, 0.5f, -5.0f);
    double want = kda_gate_ref(0.3f, -0.1f, 0.5f, -5.0);
    CHECK(close_to(a, want, 1e-6, want), "alpha=%.9g, want %.9g", a, want);
    CHECK(fabs(a - 0.054558) < 1e-5, "alpha=%.9g, hand value 0.054558", a);
}

static void test_kda_gate_at_zero_is_e_minus_2_5(void) {
    /* z = 0 → σ = 1/2 → α = e^-2.5 whatever A_log is */
    static const float alogs[] = {-3.0f, 0.0f, 1.0f, 2.5f};
    for (size_t i = 0; i < sizeof alogs / sizeof alogs[0]; i++) {
        float a = k3_kda_gate(0.25f, -0.25f, alogs[i], -5.0f);
        CHECK(close_to(a, exp(-2.5), 1e-6, exp(-2.5)), "a_log=%g: %.9g", alogs[i], a);
    }
}

static void test_kda_gate_range(void) {
    /* α ∈ (e^-5, 1]; in f32 σ rounds to 1 (or 0) for large |z|, reaching the ends exactly */
    float lo = expf(-5.0f);
    for (int i = -400; i <= 400; i++) {
        float f = (float)i * 0.125f;
        for (float al = -2.0f; al <= 2.0f; al += 1.0f) {
            float a = k3_kda_gate(f, 0.1f, al, -5.0f);
            CHECK(a >= lo && a <= 1.0f, "f=%g a_log=%g: alpha=%.9g", f, al, a);
            double want = kda_gate_ref(f, 0.1f, al, -5.0);
            CHECK(close_to(a, want, 1e-6, want), "f=%g a_log=%g: %.9g, want %.9g", f, al, a, want);
            /* |exp(A_log)·z| < 3: σ ∈ (0.047, 0.953), α strictly inside, well clear of f32 ends */
            if (fabs(exp(al) * (f + 0.1)) < 3.0)
                CHECK(a > lo && a < 1.0f, "f=%g a_log=%g: %.9g not interior", f, al, a);
        }
    }
}

static void test_kda_gate_a_log_acts_per_head(void) {
    /* same channel input, two heads' A_log: different α, each matching its own formula */
    float f = 0.4f, b = 0.1f;
    float a0 = k3_kda_gate(f, b, -1.0f, -5.0f), a1 = k3_kda_gate(f, b, 1.5f, -5.0f);
    CHECK(a0 != a1, "A_log had no effect: %.9g", a0);
    double w0 = kda_gate_ref(f, b, -1.0, -5.0), w1 = kda_gate_ref(f, b, 1.5, -5.0);
    CHECK(close_to(a0, w0, 1e-6, w0), "%.9g, want %.9g", a0, w0);
    CHECK(close_to(a1, w1, 1e-6, w1), "%.9g, want %.9g", a1, w1);
    /* larger exp(A_log)·z (z > 0) → σ closer to 1 → stronger decay (smaller α) */
    CHECK(a1 < a0, "a1=%.9g should be < a0=%.9g", a1, a0);
}

/* ---- 7. AttnRes ---------------------------------------------------------------------------- */

#define AR_H 8

/* Spec §5 in double: key_j = v_j / sqrt(mean(v_j²) + eps) (no weight), score_j = key_j·sw,
 * p = softmax(score), out = Σ_j p_j · v_j (raw values). */
static void attn_res_ref(const float *const *v, int n, const float *sw, int hidden, double eps,
                         double *out, double *abs_out, double *p) {
    double score[16], mx = -INFINITY, sum = 0;
    for (int j = 0; j < n; j++) {
        double ss = 0, dot = 0;
        for (int i = 0; i < hidden; i++) ss += (double)v[j][i] * v[j][i];
        double r = 1.0 / sqrt(ss / hidden + eps);
        for (int i = 0; i < hidden; i++) dot += (v[j][i] * r) * sw[i];
        score[j] = dot;
        if (dot > mx) mx = dot;
    }
    for (int j = 0; j < n; j++) sum += (p[j] = exp(score[j] - mx));
    for (int j = 0; j < n; j++) p[j] /= sum;
    for (int i = 0; i < hidden; i++) {
        out[i] = abs_out[i] = 0;
        for (int j = 0; j < n; j++) {
            out[i] += p[j] * v[j][i];
            abs_out[i] += fabs(p[j] * v[j][i]);
        }
    }
}

/* sw = w_norm ⊙ w_proj, the f32 fold of spec §5 step 1. */
static void ar_sw(float *sw) {
    static const float wn[AR_H] = {1.0f, 0.5f, 2.0f, -1.0f, 0.25f, 1.5f, -0.75f, 3.0f};
    static const float wp[AR_H] = {0.3f, -0.2f, 0.1f, 0.4f, -0.5f, 0.05f, 0.2f, -0.1f};
    for (int i = 0; i < AR_H; i++) sw[i] = wn[i] * wp[i];
}

static const char *ar_check(const float *const *v, int n, const float *sw, const float *out) {
    static char msg[200];
    double want[AR_H], a[AR_H], p[16];
    attn_res_ref(v, n, sw, AR_H, 1e-5f, want, a, p);
    for (int i = 0; i < AR_H; i++)
        if (!close_to(out[i], want[i], 1e-5, a[i] > 0 ? a[i] : 1e-30)) {
            snprintf(msg, sizeof msg, "out[%d]=%.9g, want %.9g", i, out[i], want[i]);
            return msg;
        }
    return NULL;
}

static void test_attn_res_single_value_is_identity(void) {
    float v0[AR_H] = {1.5f, -2.0f, 0.1f, 7.0f, -0.003f, 1e4f, -1e-6f, 0.0f}, sw[AR_H], out[AR_H];
    ar_sw(sw);
    const float *vals[1] = {v0};
    k3_attn_res(vals, 1, sw, AR_H, 1e-5f, out);
    for (int i = 0; i < AR_H; i++) CHECK(out[i] == v0[i], "out[%d]=%g, want %g", i, out[i], v0[i]);
}

static void test_attn_res_two_and_three_values_vs_double(void) {
    float v0[AR_H] = {1, 2, 3, 4, -1, -2, 0.5f, 0.25f};
    float v1[AR_H] = {-0.5f, 1.5f, 2, -3, 0.75f, 4, -1, 2};
    float v2[AR_H] = {2e-3f, -1e-3f, 3e-3f, 0, 1e-3f, -2e-3f, 5e-4f, 1e-3f}; /* eps matters */
    float sw[AR_H], out[AR_H];
    ar_sw(sw);
    const float *vals[3] = {v0, v1, v2};
    for (int n = 2; n <= 3; n++) {
        k3_attn_res(vals, n, sw, AR_H, 1e-5f, out);
        const char *err = ar_check(vals, n, sw, out);
        CHECK(!err, "n=%d: %s", n, err ? err : "");
    }
}

/* v1 = 1000·v0: keys (and scores) equal, p = (1/2, 1/2), out = 500.5·v0, a mix of the raw
 * values. A mix of the normalised keys would give out = key0 instead. */
static void test_attn_res_mixes_raw_values(void) {
    float v0[AR_H] = {1, 2, 3, 4, -1, -2, 0.5f, 0.25f}, v1[AR_H], sw[AR_H], out[AR_H];
    for (int i = 0; i < AR_H; i++) v1[i] = 1000.0f * v0[i];
    ar_sw(sw);
    const float *vals[2] = {v0, v1};
    k3_attn_res(vals, 2, sw, AR_H, 1e-5f, out);
    for (int i = 0; i < AR_H; i++) {
        double want = 500.5 * v0[i];
        CHECK(close_to(out[i], want, 1e-5, fabs(want)), "out[%d]=%.9g, want %.9g", i, out[i], want);
    }
}

/* Very different magnitudes and directions: the small value's softmax weight is set by its
 * direction alone, but its contribution to out is by its raw size. */
static void test_attn_res_very_different_magnitudes(void) {
    float big[AR_H] = {300, -200, 100, 400, -500, 50, 200, -100};
    float small[AR_H] = {0.02f, 0.01f, -0.03f, 0.04f, 0.05f, -0.01f, 0.02f, 0.03f};
    float sw[AR_H], out[AR_H];
    ar_sw(sw);
    const float *vals[2] = {small, big};
    k3_attn_res(vals, 2, sw, AR_H, 1e-5f, out);
    const char *err = ar_check(vals, 2, sw, out);
    CHECK(!err, "%s", err ? err : "");
    /* and out is on the scale of the raw big value, not of an RMS-normalised key (~1) */
    double want[AR_H], a[AR_H], p[16];
    attn_res_ref(vals, 2, sw, AR_H, 1e-5f, want, a, p);
    CHECK(p[1] > 0.05 && p[1] < 0.95, "test values should give a real mix, p1=%g", p[1]);
    CHECK(fabs(out[4]) > 10.0f, "out[4]=%g: expected raw-value scale", out[4]);
}

const k3_test k3_suite_kernels[] = {
    {"mxfp4_codes_at_scale_127", test_mxfp4_codes_at_scale_127},
    {"mxfp4_scale_0_is_2_pow_minus_127", test_mxfp4_scale_0_is_2_pow_minus_127},
    {"mxfp4_scale_254_is_2_pow_127", test_mxfp4_scale_254_is_2_pow_127},
    {"mxfp4_scale_255_is_nan", test_mxfp4_scale_255_is_nan},
    {"mxfp4_every_code_and_scale_vs_ldexp", test_mxfp4_every_code_and_scale_vs_ldexp},
    {"mxfp4_matvec_vs_double_reference", test_mxfp4_matvec_vs_double_reference},
    {"mxfp4_matvec_detects_nibble_swap", test_mxfp4_matvec_detects_nibble_swap},
    {"mxfp4_matvec_unit_columns_exact", test_mxfp4_matvec_unit_columns_exact},
    {"bf16_widening_special_values", test_bf16_widening_special_values},
    {"bf16_widening_matches_bit_fields", test_bf16_widening_matches_bit_fields},
    {"matvec_bf16_odd_sizes", test_matvec_bf16_odd_sizes},
    {"matvec_f32_odd_sizes", test_matvec_f32_odd_sizes},
    {"matvec_same_result_1_and_2_threads", test_matvec_same_result_1_and_2_threads},
    {"matvec_mxfp4_same_result_1_and_2_threads", test_matvec_mxfp4_same_result_1_and_2_threads},
    {"rmsnorm_no_weight", test_rmsnorm_no_weight},
    {"rmsnorm_bf16_weight", test_rmsnorm_bf16_weight},
    {"rmsnorm_eps_matters_for_small_input", test_rmsnorm_eps_matters_for_small_input},
    {"rmsnorm_in_place", test_rmsnorm_in_place},
    {"situ_vs_double_formula", test_situ_vs_double_formula},
    {"situ_zero_gate_is_zero", test_situ_zero_gate_is_zero},
    {"situ_gate_saturates_at_4_sigma", test_situ_gate_saturates_at_4_sigma},
    {"situ_sigmoid_takes_uncapped_gate", test_situ_sigmoid_takes_uncapped_gate},
    {"situ_vec_in_place_matches_scalar", test_situ_vec_in_place_matches_scalar},
    {"kda_gate_hand_case", test_kda_gate_hand_case},
    {"kda_gate_at_zero_is_e_minus_2_5", test_kda_gate_at_zero_is_e_minus_2_5},
    {"kda_gate_range", test_kda_gate_range},
    {"kda_gate_a_log_acts_per_head", test_kda_gate_a_log_acts_per_head},
    {"attn_res_single_value_is_identity", test_attn_res_single_value_is_identity},
    {"attn_res_two_and_three_values_vs_double", test_attn_res_two_and_three_values_vs_double},
    {"attn_res_mixes_raw_values", test_attn_res_mixes_raw_values},
    {"attn_res_very_different_magnitudes", test_attn_res_very_different_magnitudes},
    {0},
};
