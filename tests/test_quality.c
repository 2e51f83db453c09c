/* test_quality.c — the int8 spine's math and the quality harness:
 *  - the int8 × f32 rows against a double-precision computation written here;
 *  - the row quantizer on hand-made rows (absmax scale, round half to even, zero row, NaN);
 *  - `k3 quality` on k3-nano: the bf16 mode against the exact reference gives KL 0, 100%
 *    agreement and Δ 0; the int8 mode's NLL, perplexity, KL, top-1 and max |Δlogit| equal the
 *    figures recomputed here from the engine's own logits (two engines stepped in this test),
 *    and stay under thresholds chosen from the first measurement (BENCHMARKS.md);
 *  - the quality gates proper, on the TRAINED k3-tiny-kjv and held-out KJV text (Philippians,
 *    not in its training split): the same figures, recomputed, within thresholds set just
 *    beyond the measured values (BENCHMARKS.md, "k3-tiny-kjv"). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/engine/k3.h"
#include "../src/format/safetensors.h"
#include "../src/kernels/kernels.h"
#include "../src/tok/tokenizer.h"
#include "pack_helpers.h"
#include "test.h"

/* Thresholds for the int8 spine on k3-nano (measured 2026-11-30: mean KL 0.0075, top-1 85.7%
 * on the built-in text; random weights make near-ties common). A regression fails here. */
#define NANO_MAX_KL 0.02
#define NANO_MIN_TOP1 0.75
/* --approx (int8 activations on top): measured 2026-11-30, see BENCHMARKS.md. */
#define NANO_APPROX_MAX_KL 0.05
#define NANO_APPROX_MIN_TOP1 0.6

/* The gates on k3-tiny-kjv: the first 511 held-out tokens of KJV_TEXT after [BOS] (512 ids,
 * 511 predictions). Measured 2026-12-01 on the avx512, avx2 and scalar paths (BENCHMARKS.md):
 * exact NLL 3.0711 nats/token; int8 mean KL 0.00172, top-1 98.63% on every path, max |Δlogit|
 * 4.42, NLL +0.0001; --approx KL 0.00241-0.00242, top-1 97.65% (scalar) - 98.43% (avx2), max
 * |Δlogit| 4.37, NLL -0.0012..-0.0008. Each gate sits just beyond the worst path's value. */
#define KJV KJV_DIR /* pack_helpers.h */
#define KJV_TEXT "tests/fixtures/kjv-heldout-philippians.txt"
#define KJV_IDS 512
static const double KJV_EXACT_NLL_LO = 3.0, KJV_EXACT_NLL_HI = 3.15;

typedef struct gate {
    double max_kl, min_top1, max_dlogit, max_dnll; /* max_dlogit, max_dnll: <= 0 = not gated */
} gate;
static const gate NANO_INT8 = {NANO_MAX_KL, NANO_MIN_TOP1, 0, 0};
static const gate NANO_APPROX = {NANO_APPROX_MAX_KL, NANO_APPROX_MIN_TOP1, 0, 0};
static const gate KJV_INT8 = {0.002, 0.98, 5.5, 0.005};
static const gate KJV_APPROX = {0.003, 0.97, 5.5, 0.005};

static uint32_t rng = 12345;
static uint32_t next_u32(void) { return rng = rng * 1664525u + 1013904223u; }

static void test_rows_i8_vs_double(void) {
    enum { R = 37, C = 301 }; /* rows not a multiple of 4, odd cols */
    static int8_t q[R * C];
    static float s[R], x[C], y[R];
    for (int i = 0; i < R * C; i++) q[i] = (int8_t)((int)(next_u32() >> 24) - 128 + (i == 5));
    for (int r = 0; r < R; r++) s[r] = (float)((next_u32() >> 8) & 0xffff) / 65536.0f * 0.01f;
    for (int i = 0; i < C; i++) x[i] = (float)((next_u32() >> 8) & 0xffff) / 32768.0f - 1.0f;
    k3_mat w = {.data = q, .dtype = K3_DT_I8, .rows = R, .cols = C, .scale = s};
    k3_rows_i8(&w, x, y, 0, 3);   /* a range that is not a multiple of 4 ... */
    k3_rows_i8(&w, x, y, 3, R);   /* ... then the rest */
    for (int r = 0; r < R; r++) {
        double want = 0, mag = 0;
        for (int i = 0; i < C; i++) {
            want += (double)q[r * C + i] * x[i] * s[r];
            mag += fabs((double)q[r * C + i] * x[i] * s[r]);
        }
        CHECK(fabs(y[r] - want) <= 1e-5 * mag + 1e-30, "row %d: %.9g, want %.9g", r, y[r], want);
    }
}

/* The AVX2 rows against the same double computation (skipped on CPUs without AVX2+FMA). */
static void test_rows_i8_avx2_vs_double(void) {
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        k3_test_skip("this CPU has no AVX2+FMA");
        return;
    }
    enum { R = 23, C = 301 }; /* 301 = 18·16 + 13: a tail after the 16-column body */
    static int8_t q[R * C];
    static float s[R], x[C], y[R], y2[R];
    for (int i = 0; i < R * C; i++) /* -127..127: the quantization rule never makes -128 */
        q[i] = (int8_t)((int)((next_u32() >> 24) % 255) - 127);
    for (int r = 0; r < R; r++) s[r] = (float)((next_u32() >> 8) & 0xffff) / 65536.0f;
    for (int i = 0; i < C; i++) x[i] = (float)((next_u32() >> 8) & 0xffff) / 32768.0f - 1.0f;
    k3_mat w = {.data = q, .dtype = K3_DT_I8, .rows = R, .cols = C, .scale = s};
    k3_rows_i8_avx2(&w, x, y, 0, 6);
    k3_rows_i8_avx2(&w, x, y, 6, R);
    k3_rows_i8_avx2(&w, x, y2, 0, R); /* a row does not depend on the range it is in */
    for (int r = 0; r < R; r++) {
        double want = 0, mag = 0;
        for (int i = 0; i < C; i++) {
            want += (double)q[r * C + i] * x[i] * s[r];
            mag += fabs((double)q[r * C + i] * x[i] * s[r]);
        }
        CHECK(fabs(y[r] - want) <= 1e-5 * mag + 1e-30, "row %d: %.9g, want %.9g", r, y[r], want);
        CHECK(y[r] == y2[r], "row %d depends on the row range", r);
    }
#else
    k3_test_skip("not x86-64");
#endif
}

/* --approx: activations in blocks of 32, absmax scale, half to even; zero and NaN blocks. */
static void test_quantize_act_q8(void) {
    float x[72] = {0};
    x[0] = 2.5f, x[1] = 3.5f, x[2] = -127, x[3] = 0.5f, x[4] = -2.5f, x[31] = 63.5f; /* s = 1 */
    x[64] = 1.0f, x[65] = NAN;                                                     /* NaN block */
    int8_t q[72];
    float s[3];
    k3_quantize_act_q8(x, 72, q, s);
    const int8_t want[6] = {2, 4, -127, 0, -2, 64};
    const int at[6] = {0, 1, 2, 3, 4, 31};
    CHECK(s[0] == 1.0f && s[1] == 0.0f && isnan(s[2]), "scales %g %g %g", s[0], s[1], s[2]);
    for (int k = 0; k < 6; k++) CHECK(q[at[k]] == want[k], "q[%d] = %d", at[k], q[at[k]]);
    for (int i = 32; i < 64; i++) CHECK(q[i] == 0, "zero block: q[%d] = %d", i, q[i]);
}

/* --approx products against the true product of the int8 weights with the f32 x: the error
 * is bounded by the activation rounding, Σ_i |w_i| · s_b(i) / 2, plus f32 accumulation. */
static void test_rows_q8_error_bound(void) {
    enum { R = 23, C = 301 }; /* 9 full blocks and a tail of 13 */
    static int8_t q[R * C];
    static float s[R], x[C], y[R], y2[R];
    static int8_t xq[C];
    static float xs[(C + 31) / 32];
    for (int i = 0; i < R * C; i++) /* -127..127: the quantization rule never makes -128 */
        q[i] = (int8_t)((int)((next_u32() >> 24) % 255) - 127);
    for (int r = 0; r < R; r++) s[r] = (float)((next_u32() >> 8) & 0xffff) / 65536.0f;
    for (int i = 0; i < C; i++) x[i] = (float)((next_u32() >> 8) & 0xffff) / 32768.0f - 1.0f;
    x[40] = 9.0f; /* one outlier: its block gets a coarser step */
    k3_quantize_act_q8(x, C, xq, xs);
    k3_mat w = {.data = q, .dtype = K3_DT_I8_Q8, .rows = R, .cols = C, .scale = s};
    k3_rows_i8_q8(&w, x, y, 0, R);
    for (int r = 0; r < R; r++) {
        double exact = 0, bound = 0, mag = 0;
        for (int i = 0; i < C; i++) {
            double wi = (double)q[r * C + i] * s[r];
            exact += wi * x[i];
            bound += fabs(wi) * xs[i / 32] / 2;
            mag += fabs(wi * x[i]);
        }
        CHECK(fabs(y[r] - exact) <= bound + 1e-5 * mag, "row %d: %.9g vs %.9g, bound %.3g", r,
              y[r], exact, bound);
    }
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        k3_rows_i8_q8_avx2(&w, x, y2, 0, 7);
        k3_rows_i8_q8_avx2(&w, x, y2, 7, R);
        for (int r = 0; r < R; r++) { /* same integer block sums; f32 adds in another order */
            double mag = 0;
            for (int i = 0; i < C; i++) mag += fabs((double)q[r * C + i] * s[r] * x[i]);
            CHECK(fabs(y2[r] - y[r]) <= 1e-5 * mag, "row %d: avx2 %.9g scalar %.9g", r, y2[r],
                  y[r]);
        }
    }
#endif
}

static uint16_t bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    CHECK_OR(0, (u & 0xffff) == 0, "%g is not a BF16 value", f);
    return (uint16_t)(u >> 16);
}

/* Quantizes the row vals[n] and compares with want_q and want_scale. */
static void expect_row(const float *vals, int n, const int8_t *want_q, float want_scale) {
    uint16_t w[16];
    int8_t q[16];
    for (int i = 0; i < n; i++) w[i] = bf16(vals[i]);
    if (k3_test_stopped()) return;
    float scale = k3_quantize_row_i8(w, n, q);
    CHECK(scale == want_scale, "scale %.9g, want %.9g", scale, want_scale);
    for (int i = 0; i < n; i++)
        CHECK(q[i] == want_q[i], "q[%d] = %d, want %d (value %g)", i, q[i], want_q[i], vals[i]);
}

static void test_quantize_rule(void) {
    /* absmax 127: scale 1, so q is the value rounded half to even (2.5 -> 2, 3.5 -> 4). */
    const float a[] = {127, 2.5f, 3.5f, -2.5f, 0.5f, 1.5f, -127, 0, -0.5f, 100.5f, 101.5f};
    const int8_t qa[] = {127, 2, 4, -2, 0, 2, -127, 0, 0, 100, 102};
    expect_row(a, 11, qa, 1.0f);
    /* absmax 254 (negative): scale 2; 127/2 = 63.5 -> 64, 5/2 = 2.5 -> 2, 7/2 = 3.5 -> 4. */
    const float b[] = {-254, 5, 7, 3, -5, 1, 127, 254};
    const int8_t qb[] = {-127, 2, 4, 2, -2, 0, 64, 127};
    expect_row(b, 8, qb, 2.0f);
    /* all zero (with a negative zero): scale 0, q 0 */
    const float z[] = {0, -0.0f, 0, 0};
    const int8_t qz[] = {0, 0, 0, 0};
    expect_row(z, 4, qz, 0.0f);
    /* a scale that is not a power of two: q = nearest integer to w / (1/127 in f32) */
    const float c[] = {1.0f, 0.25f, -0.5f, 0.75f};
    const int8_t qc[] = {127, 32, -64, 95}; /* 31.75, -63.5 -> -64 (even), 95.25 */
    expect_row(c, 4, qc, 1.0f / 127.0f);
    uint16_t nan_row[3] = {bf16(1.0f), 0x7fc0, bf16(2.0f)}, inf_row[2] = {0x7f80, 0};
    int8_t q[3];
    CHECK(isnan(k3_quantize_row_i8(nan_row, 3, q)), "a NaN weight must be reported");
    CHECK(isnan(k3_quantize_row_i8(inf_row, 2, q)), "an infinite weight must be reported");
}

/* ---- the harness on k3-nano ---------------------------------------------------------------- */

#define N_IDS 40

static void make_ids(int32_t *ids) {
    rng = 777;
    ids[0] = 1792; /* [BOS] */
    for (int i = 1; i < N_IDS; i++) ids[i] = (int32_t)(next_u32() >> 8) % 1792;
}

typedef struct figures {
    double nll, kl, top1, maxd, nll_ref;
} figures;

static int argmax(const float *l, int v) {
    int a = 0;
    for (int i = 1; i < v; i++)
        if (l[i] > l[a]) a = i;
    return a;
}

static double log_sum_exp(const float *l, int v) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < v; i++) m = fmax(m, l[i]);
    for (int i = 0; i < v; i++) s += exp(l[i] - m);
    return m + log(s);
}

/* The figures of model's int8 spine in pack_dir (with int8 activations when approx) against
 * its BF16 spine over ids[0..n), from two engines stepped here. */
static void recompute(const char *model, const char *pack_dir, const int32_t *ids, int n,
                      int approx, figures *f) {
    k3_engine *e[2] = {0};
    k3_session *s[2] = {0};
    k3_err err;
    float *l[2] = {0};
    int rc = 0, v = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        k3_engine_opts o = k3_engine_opts_default();
        o.spine = k ? K3_SPINE_INT8 : K3_SPINE_BF16;
        o.pack_dir = pack_dir;
        o.approx = k && approx;
        rc = k3_engine_load(model, &o, &e[k], &err);
        if (!rc) rc = k3_session_new(e[k], n, &s[k], &err);
        if (!rc) v = k3_engine_config(e[k])->vocab_size;
        if (!rc) l[k] = malloc((size_t)v * sizeof(float));
    }
    memset(f, 0, sizeof *f);
    for (int i = 0; i + 1 < n && !rc; i++) {
        for (int k = 0; k < 2 && !rc; k++) rc = k3_session_step(s[k], ids[i], l[k], &err);
        if (rc) break;
        double lr = log_sum_exp(l[0], v), lq = log_sum_exp(l[1], v), kl = 0;
        for (int j = 0; j < v; j++) {
            double p = exp(l[0][j] - lr);
            kl += p * ((l[0][j] - lr) - (l[1][j] - lq));
            f->maxd = fmax(f->maxd, fabs((double)l[1][j] - l[0][j]));
        }
        f->kl += kl / (n - 1);
        f->nll += (lq - l[1][ids[i + 1]]) / (n - 1);
        f->nll_ref += (lr - l[0][ids[i + 1]]) / (n - 1);
        f->top1 += (double)(argmax(l[0], v) == argmax(l[1], v)) / (n - 1);
    }
    for (int k = 0; k < 2; k++) {
        free(l[k]);
        k3_session_free(s[k]);
        k3_engine_free(e[k]);
    }
    CHECK(rc == 0, "%s", err.msg);
}

static double field(const cJSON *mode, const char *k) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(mode, k);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

static int close_rel(double a, double b, double tol) {
    return fabs(a - b) <= tol * fmax(fabs(b), 1e-12);
}

/* One lossy mode's JSON row against its recomputation and its gate. */
static void check_mode(const cJSON *m, const char *name, const figures *f, const gate *g) {
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(m, "mode");
    CHECK(cJSON_IsString(mode) && !strcmp(mode->valuestring, name), "mode %s missing", name);
    double nll = field(m, "nll"), ppl = field(m, "perplexity"), kl = field(m, "mean_kl");
    double top1 = field(m, "top1_agreement"), d = field(m, "max_abs_dlogit");
    CHECK(close_rel(nll, f->nll, 1e-9), "%s NLL %.12g, recomputed %.12g", name, nll, f->nll);
    CHECK(close_rel(ppl, exp(f->nll), 1e-9), "%s perplexity %.12g", name, ppl);
    CHECK(close_rel(kl, f->kl, 1e-6), "%s KL %.12g, recomputed %.12g", name, kl, f->kl);
    CHECK(close_rel(top1, f->top1, 1e-12), "%s top-1 %g vs %g", name, top1, f->top1);
    CHECK(d == f->maxd, "%s max |dlogit| %.9g vs %.9g", name, d, f->maxd);
    CHECK(kl > 0 && kl <= g->max_kl, "%s mean KL %g outside (0, %g]", name, kl, g->max_kl);
    CHECK(top1 >= g->min_top1, "%s top-1 agreement %g < %g", name, top1, g->min_top1);
    CHECK(g->max_dlogit <= 0 || d <= g->max_dlogit, "%s max |dlogit| %g > %g", name, d,
          g->max_dlogit);
    CHECK(g->max_dnll <= 0 || fabs(nll - f->nll_ref) <= g->max_dnll, "%s NLL %g is %g from the "
          "exact %g (gate %g)", name, nll, nll - f->nll_ref, f->nll_ref, g->max_dnll);
}

static void test_quality_harness_nano(void) {
    const char *pack = ph_nano_pack();
    if (!pack) return;
    int32_t ids[N_IDS];
    make_ids(ids);
    char *dir = ph_tmpdir();
    if (!dir) return;
    char *json = ph_join(dir, "q.json"), args[8192];
    int n = snprintf(args, sizeof args, "quality " NANO " --pack-dir %s --modes "
                     "bf16,int8,approx -q --json %s --ids ", pack, json);
    for (int i = 0; i < N_IDS; i++)
        n += snprintf(args + n, sizeof args - (size_t)n, "%s%d", i ? "," : "", ids[i]);
    char *err = NULL;
    int st = ph_k3(args, NULL, &err);
    char *text = (char *)ph_read(json, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text), free(json);
    ph_rmdir(dir);
    free(dir);
    const cJSON *modes = cJSON_GetObjectItemCaseSensitive(j, "modes");
    const cJSON *ex = cJSON_GetArrayItem(modes, 0), *b = cJSON_GetArrayItem(modes, 1);
    figures f8, fa;
    recompute(NANO, pack, ids, N_IDS, 0, &f8);
    recompute(NANO, pack, ids, N_IDS, 1, &fa);
    if (st != 0 || k3_test_stopped()) {
        k3_test_fail(__FILE__, __LINE__, "k3 quality exited %d: %s", st, err ? err : "");
    } else {
        double ex_nll = field(ex, "nll"), ex_ppl = field(ex, "perplexity");
        double b_kl = field(b, "mean_kl"), b_top1 = field(b, "top1_agreement");
        double b_d = field(b, "max_abs_dlogit"), b_nll = field(b, "nll");
        if (field(j, "predictions") != N_IDS - 1)
            k3_test_fail(__FILE__, __LINE__, "predictions %g", field(j, "predictions"));
        else if (!(b_kl == 0 && b_top1 == 1 && b_d == 0 && b_nll == ex_nll))
            k3_test_fail(__FILE__, __LINE__, "bf16 vs exact must be identical: KL %g top-1 %g "
                         "max %g", b_kl, b_top1, b_d);
        else if (!close_rel(ex_nll, f8.nll_ref, 1e-9) || !close_rel(ex_ppl, exp(f8.nll_ref), 1e-9))
            k3_test_fail(__FILE__, __LINE__, "exact NLL %.12g / perplexity %.12g, recomputed "
                         "NLL %.12g", ex_nll, ex_ppl, f8.nll_ref);
        else
            check_mode(cJSON_GetArrayItem(modes, 2), "int8", &f8, &NANO_INT8);
        if (!k3_test_stopped())
            check_mode(cJSON_GetArrayItem(modes, 3), "approx", &fa, &NANO_APPROX);
    }
    cJSON_Delete(j);
    free(err);
}

/* ---- the gates on k3-tiny-kjv ------------------------------------------------------------- */

/* [BOS] and the first KJV_IDS - 1 tokens of KJV_TEXT, as `k3 quality --text --bos` reads it. */
static int kjv_ids(int32_t **ids, size_t *n) {
    k3_tokenizer *tok = NULL;
    k3_config cfg;
    k3_err err = {0};
    char *text = (char *)ph_read(KJV_TEXT, NULL);
    CHECK_OR(0, text, "cannot read %s", KJV_TEXT);
    int32_t *t = NULL;
    size_t nt = 0;
    int rc = k3_config_load(KJV, &cfg, &err);
    if (!rc) rc = k3_tokenizer_load(KJV, &tok, &err);
    if (!rc) rc = k3_tokenizer_encode(tok, text, strlen(text), false, &t, &nt, &err);
    k3_tokenizer_free(tok);
    free(text);
    CHECK_OR(0, !rc && nt >= KJV_IDS, "%s: %s (%zu tokens)", KJV_TEXT, err.msg, nt);
    *ids = malloc(KJV_IDS * sizeof **ids);
    (*ids)[0] = cfg.bos_token_id;
    memcpy(*ids + 1, t, (KJV_IDS - 1) * sizeof *t);
    *n = KJV_IDS;
    free(t);
    return 1;
}

static void test_quality_gates_kjv(void) {
    const char *pack = ph_kjv_pack();
    int32_t *ids = NULL;
    size_t n = 0;
    if (!pack || !kjv_ids(&ids, &n)) return;
    char *dir = ph_tmpdir();
    if (!dir) {
        free(ids);
        return;
    }
    char *json = ph_join(dir, "q.json"), args[1024], *err = NULL;
    snprintf(args, sizeof args, "quality " KJV " --pack-dir %s --modes int8,approx -q --json %s "
             "--text " KJV_TEXT " --bos --max-tokens %d", pack, json, KJV_IDS);
    int st = ph_k3(args, NULL, &err);
    char *text = (char *)ph_read(json, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text), free(json);
    ph_rmdir(dir);
    free(dir);
    const cJSON *modes = cJSON_GetObjectItemCaseSensitive(j, "modes");
    const cJSON *ex = cJSON_GetArrayItem(modes, 0);
    figures f8, fa;
    recompute(KJV, pack, ids, (int)n, 0, &f8);
    if (!k3_test_stopped()) recompute(KJV, pack, ids, (int)n, 1, &fa);
    free(ids);
    double ex_nll = field(ex, "nll");
    if (k3_test_stopped()) {
    } else if (st != 0 || !j) {
        k3_test_fail(__FILE__, __LINE__, "k3 quality exited %d: %s", st, err ? err : "");
    } else if (field(j, "predictions") != KJV_IDS - 1) {
        k3_test_fail(__FILE__, __LINE__, "predictions %g", field(j, "predictions"));
    } else if (!close_rel(ex_nll, f8.nll_ref, 1e-9)) {
        k3_test_fail(__FILE__, __LINE__, "exact NLL %.12g, recomputed %.12g", ex_nll, f8.nll_ref);
    } else if (!(ex_nll >= KJV_EXACT_NLL_LO && ex_nll <= KJV_EXACT_NLL_HI)) {
        k3_test_fail(__FILE__, __LINE__, "exact NLL %g nats/token outside [%g, %g] (the "
                     "trained model's held-out NLL)", ex_nll, KJV_EXACT_NLL_LO, KJV_EXACT_NLL_HI);
    } else {
        check_mode(cJSON_GetArrayItem(modes, 1), "int8", &f8, &KJV_INT8);
        if (!k3_test_stopped())
            check_mode(cJSON_GetArrayItem(modes, 2), "approx", &fa, &KJV_APPROX);
    }
    cJSON_Delete(j);
    free(err);
}

const k3_test k3_suite_quality[] = {
    {"int8_rows_vs_double", test_rows_i8_vs_double},
    {"int8_rows_avx2_vs_double", test_rows_i8_avx2_vs_double},
    {"int8_quantize_rule", test_quantize_rule},
    {"approx_quantize_activations", test_quantize_act_q8},
    {"approx_rows_error_bound", test_rows_q8_error_bound},
    {"quality_harness_nano", test_quality_harness_nano},
    {"quality_gates_kjv", test_quality_gates_kjv},
    {0},
};
