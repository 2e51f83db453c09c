/* test_cuda.c — the CUDA backend (src/cuda): every kernel against the CPU scalar kernel (or the
 * CPU code of src/model it replaces) on fresh random inputs, then the whole model: the
 * k3-nano fixtures with the engine on the GPU, greedy tokens identical to the CPU path, the
 * streamed-spine and small-expert-cache paths, and state files across the device boundary.
 *
 * Every test prints SKIPPED with the reason when this k3 was built without CUDA
 * (make CUDA=1) or no CUDA device answers; none passes silently.
 *
 * Tolerances: products and reductions sum in another order on the GPU, so they are checked
 * to 1e-5 relative to Σ|terms| (f32 accumulation error); element-wise recurrences the GPU
 * keeps in the CPU's order (conv windows, the MoE weighted sum) are checked bit for bit;
 * functions of libm (expf, tanhf) to 2e-6 relative (their ulp error on either side). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/engine/k3.h"
#include "../src/format/safetensors.h"
#include "../src/kernels/kernels.h"
#include "../src/util/err.h"
#include "cli_run.h"
#include "../src/model/layers.h"
#include "fixture_check.h"
#include "test.h"

#ifdef K3_WITH_CUDA
#include <cuda_runtime_api.h>

#include "../src/cuda/gpu.h"
#include "../src/cuda/kern.h"
#endif

#define NANO "tests/fixtures/k3-nano"
#define NANO_REF NANO "/reference"

static const fixture_tol nano_tol = {1e-4, 1e-4, 1e-5, 1e-4};

/* 1 when the GPU tests can run; otherwise marks the test SKIPPED with the reason. */
static int have_gpu(void) {
#ifdef K3_WITH_CUDA
    char why[256] = "";
    if (k3_gpu_device_count(why, sizeof why) > 0) return 1;
    k3_test_skip("no CUDA device: %s", why);
#else
    k3_test_skip("this k3 was built without CUDA (make CUDA=1)");
#endif
    return 0;
}

/* ---- model-level tests (the engine API only) ---------------------------------------------- */

/* Runs f with the engine's device forced through K3_DEVICE (and optional knobs). */
static void with_env(const char *dev, const char *layers, const char *slots, void (*f)(void)) {
    setenv("K3_DEVICE", dev, 1);
    if (layers) setenv("K3_GPU_LAYERS", layers, 1);
    if (slots) setenv("K3_GPU_EXPERT_SLOTS", slots, 1);
    f();
    unsetenv("K3_DEVICE");
    unsetenv("K3_GPU_LAYERS");
    unsetenv("K3_GPU_EXPERT_SLOTS");
}

static void nano_prompts(void) { fixture_check_prompts(NANO, NANO_REF, &nano_tol); }
static void nano_trace(void) { fixture_check_trace(NANO, NANO_REF, "trace_len7.json", &nano_tol); }
static void nano_decode(void) { fixture_check_decode(NANO, NANO_REF, &nano_tol); }

/* The trained k3-tiny-kjv (hidden 128, top-2 of 16, AttnRes block 3): same checks, on the GPU. */
#define KJV "tests/fixtures/k3-tiny-kjv"
static void kjv_prompts(void) { fixture_check_prompts(KJV, KJV "/reference", &nano_tol); }
static void kjv_trace(void) {
    fixture_check_trace(KJV, KJV "/reference", "trace_len9.json", &nano_tol);
}
static void kjv_decode(void) { fixture_check_decode(KJV, KJV "/reference", &nano_tol); }
static void test_kjv_fixture(void) {
    if (!have_gpu()) return;
    with_env("cuda", NULL, NULL, kjv_trace);
    if (!k3_test_stopped()) with_env("cuda", NULL, NULL, kjv_prompts);
    if (!k3_test_stopped()) with_env("cuda", NULL, NULL, kjv_decode);
}

static void test_nano_trace(void) {
    if (have_gpu()) with_env("cuda", NULL, NULL, nano_trace);
}
static void test_nano_prompts(void) {
    if (have_gpu()) with_env("cuda", NULL, NULL, nano_prompts);
}
static void test_nano_decode(void) {
    if (have_gpu()) with_env("cuda", NULL, NULL, nano_decode);
}
/* 3 of 9 layers resident, 6 streamed through the staging buffers; 6 expert slots for 8 MoE
 * layers of top-4 (every layer evicts). */
static void test_nano_streamed_small_cache(void) {
    if (have_gpu()) with_env("cuda", "3", "6", nano_prompts);
}

static k3_engine *load(const char *dev) {
    k3_engine_opts o = k3_engine_opts_default();
    o.device = dev;
    k3_engine *e = NULL;
    k3_err err = {0};
    if (k3_engine_load(NANO, &o, &e, &err)) k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
    return e;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* 40 greedy tokens after a 13-token prompt: the GPU picks the CPU's token at every step. */
static void test_greedy_matches_cpu(void) {
    if (!have_gpu()) return;
    k3_engine *ec = load("cpu"), *eg = ec ? load("cuda") : NULL;
    k3_session *sc = NULL, *sg = NULL;
    k3_err err = {0};
    int vocab = 2048, ok = eg && !k3_session_new(ec, 0, &sc, &err) && !k3_session_new(eg, 0, &sg, &err);
    float *lc = malloc(vocab * sizeof *lc), *lg = malloc(vocab * sizeof *lg);
    int32_t tok = 1792; /* [BOS] */
    double worst = 0;
    for (int step = 0; ok && step < 53; step++) {
        if (k3_session_step(sc, tok, lc, &err) || k3_session_step(sg, tok, lg, &err)) {
            k3_test_fail(__FILE__, __LINE__, "step %d: %s", step, err.msg);
            break;
        }
        for (int i = 0; i < vocab; i++) worst = fmax(worst, fabs((double)lc[i] - lg[i]));
        int a = argmax(lc, vocab), b = argmax(lg, vocab);
        if (a != b || !(worst <= 1e-4)) {
            k3_test_fail(__FILE__, __LINE__, "step %d: CPU token %d, GPU %d, max |dlogit| %g",
                         step, a, b, worst);
            break;
        }
        tok = step < 12 ? (int32_t)(100 + 37 * step) : a; /* a prompt, then greedy */
    }
    if (getenv("K3_TEST_VERBOSE")) printf("  greedy CPU vs GPU: max |dlogit| %.3g\n", worst);
    free(lc);
    free(lg);
    k3_session_free(sc);
    k3_session_free(sg);
    k3_engine_free(ec);
    k3_engine_free(eg);
}

/* A state saved from the GPU and loaded into a fresh GPU session continues bit for bit. */
static void test_state_file_roundtrip(void) {
    if (!have_gpu()) return;
    k3_engine *e = load("cuda");
    k3_session *a = NULL, *b = NULL;
    k3_err err = {0};
    float la[2048], lb[2048];
    char path[] = "/tmp/k3_cuda_state_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    int ok = e && fd >= 0 && !k3_session_new(e, 64, &a, &err) && !k3_session_new(e, 64, &b, &err);
    for (int t = 0; ok && t < 9; t++) ok = !k3_session_step(a, (int32_t)(1792 - 3 * t), NULL, &err);
    ok = ok && !k3_session_save(a, path, &err) && !k3_session_load(b, path, &err) &&
         !k3_session_step(a, 55, la, &err) && !k3_session_step(b, 55, lb, &err);
    if (!ok) k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
    else CHECK(!memcmp(la, lb, sizeof la), "logits after a state round trip differ");
    unlink(path);
    k3_session_free(a);
    k3_session_free(b);
    k3_engine_free(e);
}

#ifdef K3_WITH_CUDA
/* ---- kernel tests -------------------------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd_u32(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (uint32_t)((rng * 2685821657736338717ull) >> 32);
}
static float rnd(void) { return (float)(rnd_u32() >> 8) / 8388608.0f - 1.0f; } /* [-1, 1) */

static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = rnd() * scale;
}

static void *dup_dev(const void *h, size_t n) {
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 1) != cudaSuccess) return NULL;
    if (n && cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess) return NULL;
    return d;
}

/* Device buffer of n floats filled with NaN (so an unwritten output fails). */
static float *poisoned(size_t n) {
    float *d = NULL;
    if (cudaMalloc((void **)&d, (n ? n : 1) * 4) != cudaSuccess) return NULL;
    cudaMemset(d, 0xff, n * 4);
    return d;
}

static int fetch(void *h, const void *d, size_t n) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) k3_test_fail(__FILE__, __LINE__, "CUDA: %s", cudaGetErrorString(e));
    return e == cudaSuccess;
}

/* max over i of |got - want| / scale_i; NaN counts as infinite. */
static double worst_rel(const float *got, const float *want, const double *scale, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]) / (scale ? scale[i] : fmax(fabs(want[i]), 1e-30));
        if (!(d <= w)) w = isnan(d) ? INFINITY : d;
    }
    return w;
}

#define SCALAR k3_kernels_get("scalar")

static double weight_at(const k3_mat *m, int64_t i) { return k3_mat_at(m, i); }

static void check_matvec(int dtype, int64_t rows, int64_t cols) {
    size_t n = (size_t)rows * cols, es = dtype == K3_DT_F32 ? 4 : dtype == K3_DT_BF16 ? 2 : 1;
    uint8_t *w = malloc(n * es);
    float *x = malloc(cols * 4), *y = malloc(rows * 4), *yg = malloc(rows * 4), *sc = malloc(rows * 4);
    double *bound = malloc(rows * sizeof *bound);
    for (size_t i = 0; i < n; i++) {
        float f = rnd();
        uint32_t u;
        memcpy(&u, &f, 4);
        if (dtype == K3_DT_BF16) ((uint16_t *)w)[i] = (uint16_t)(u >> 16);
        else if (dtype == K3_DT_F32) ((float *)w)[i] = f;
        else ((int8_t *)w)[i] = (int8_t)(rnd_u32() & 0xff);
    }
    fill(x, cols, 2.0f);
    for (int64_t r = 0; r < rows; r++) sc[r] = 0.01f + fabsf(rnd());
    k3_mat m = {.data = w, .dtype = dtype, .rows = rows, .cols = cols,
                .scale = dtype == K3_DT_I8 ? sc : NULL};
    k3_matvec(SCALAR, &m, x, y);
    for (int64_t r = 0; r < rows; r++) {
        double b = 0;
        for (int64_t i = 0; i < cols; i++) b += fabs(weight_at(&m, r * cols + i) * x[i]);
        bound[r] = b > 1e-30 ? b : 1e-30;
    }
    void *dw = dup_dev(w, n * es);
    float *dx = dup_dev(x, cols * 4), *dsc = dup_dev(sc, rows * 4), *dy = poisoned(rows);
    k3k_mat km = {dw, dtype == K3_DT_I8 ? dsc : NULL, dtype, rows, cols};
    cudaError_t e = k3k_matvec(&km, dx, dy, 0);
    if (e != cudaSuccess) k3_test_fail(__FILE__, __LINE__, "launch: %s", cudaGetErrorString(e));
    else if (fetch(yg, dy, rows * 4)) {
        double wr = worst_rel(yg, y, bound, rows);
        if (!(wr <= 1e-5))
            k3_test_fail(__FILE__, __LINE__, "dtype %d [%lld, %lld]: error %g of Σ|terms|", dtype,
                         (long long)rows, (long long)cols, wr);
    }
    cudaFree(dw), cudaFree(dx), cudaFree(dsc), cudaFree(dy);
    free(w), free(x), free(y), free(yg), free(sc), free(bound);
}

/* Three matrices of one input in one launch (BF16, then int8) against the scalar products. */
static void check_matvec_multi(int dtype) {
    int64_t rows[3] = {300, 17, 1000}, cols = 7168;
    size_t es = dtype == K3_DT_BF16 ? 2 : 1;
    float *x = malloc(cols * 4), *dx, *y[3], *yg = malloc(1000 * 4);
    fill(x, cols, 1.0f);
    dx = dup_dev(x, cols * 4);
    k3k_mat km[3];
    const k3k_mat *kp[3];
    k3_mat m[3];
    void *dw[3], *dsc[3];
    for (int i = 0; i < 3; i++) {
        size_t n = (size_t)rows[i] * cols;
        uint8_t *w = malloc(n * es);
        float *sc = malloc(rows[i] * 4);
        for (size_t k = 0; k < n * es; k++) w[k] = (uint8_t)(rnd_u32() & (k % 2 && es == 2 ? 0xbf : 0xff));
        for (int64_t r = 0; r < rows[i]; r++) sc[r] = 0.01f + fabsf(rnd());
        m[i] = (k3_mat){.data = w, .dtype = dtype, .rows = rows[i], .cols = cols,
                        .scale = dtype == K3_DT_I8 ? sc : NULL};
        dw[i] = dup_dev(w, n * es), dsc[i] = dup_dev(sc, rows[i] * 4), y[i] = poisoned(rows[i]);
        km[i] = (k3k_mat){dw[i], dtype == K3_DT_I8 ? dsc[i] : NULL, dtype, rows[i], cols};
        kp[i] = &km[i];
    }
    cudaError_t e = k3k_matvec_multi(kp, y, 3, dx, 0);
    if (e != cudaSuccess) k3_test_fail(__FILE__, __LINE__, "launch: %s", cudaGetErrorString(e));
    for (int i = 0; i < 3 && e == cudaSuccess && !k3_test_stopped(); i++) {
        float *want = malloc(rows[i] * 4);
        double *bound = malloc(rows[i] * sizeof *bound);
        k3_matvec(SCALAR, &m[i], x, want);
        for (int64_t r = 0; r < rows[i]; r++) {
            double b = 0;
            for (int64_t k = 0; k < cols; k++) b += fabs(k3_mat_at(&m[i], r * cols + k) * x[k]);
            bound[r] = b > 1e-30 ? b : 1e-30;
        }
        if (fetch(yg, y[i], rows[i] * 4)) {
            double wr = worst_rel(yg, want, bound, rows[i]);
            if (!(wr <= 1e-5))
                k3_test_fail(__FILE__, __LINE__, "multi dtype %d matrix %d: error %g", dtype, i, wr);
        }
        free(want), free(bound);
    }
    for (int i = 0; i < 3; i++) {
        cudaFree(dw[i]), cudaFree(dsc[i]), cudaFree(y[i]);
        free((void *)m[i].data), free((void *)m[i].scale);
    }
    cudaFree(dx);
    free(x), free(yg);
}

static void test_matvec(void) {
    if (!have_gpu()) return;
    check_matvec_multi(K3_DT_BF16);
    if (!k3_test_stopped()) check_matvec_multi(K3_DT_I8);
    int dts[3] = {K3_DT_BF16, K3_DT_I8, K3_DT_F32};
    int64_t shapes[][2] = {{300, 7168}, {37, 100}, {64, 64}, {9, 3584 + 8}, {1000, 512}};
    for (int d = 0; d < 3 && !k3_test_stopped(); d++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes && !k3_test_stopped(); s++)
            check_matvec(dts[d], shapes[s][0], shapes[s][1]);
}

/* K experts of [inter, latent] (w1, w3) and [latent, inter] (w2), random nibbles and scales
 * around 2^0; the GPU's h against the scalar MXFP4 products + SiTU, then the GPU's down
 * projections of its own h against the scalar product of that h. */
static int mx_schedule; /* the launch schedule under test, for messages */
static void check_experts(int K, int inter, int latent, int special, int zexp) {
    const float beta = 4, lb = 25;
    uint64_t np = (uint64_t)inter * latent / 2, ns = (uint64_t)inter * latent / 32;
    uint64_t off[7], o = 0;
    for (int i = 0; i < 7; i++) {
        uint64_t b = i == 6 ? 4 : i % 2 ? ns : np;
        off[i] = o, o += b + 256 - b % 256;
    }
    uint64_t slot = o;
    uint8_t *host = malloc(slot * K);
    for (uint64_t i = 0; i < slot * K; i++) host[i] = (uint8_t)rnd_u32();
    /* scales around 2^0; special: also 2^-127 and 2^-126 (byte 0 takes the exact decode) */
    for (int j = 0; j < K; j++)
        for (int i = 1; i < 6; i += 2)
            for (uint64_t b = 0; b < ns; b++)
                host[j * slot + off[i] + b] = (uint8_t)(special && rnd_u32() % 4 == 0 ? rnd_u32() % 2
                                                        : 120 + rnd_u32() % 10);
    float *z = malloc(latent * 4), *h = malloc((size_t)K * inter * 4), *hg = malloc((size_t)K * inter * 4);
    float *g = malloc(inter * 4), *u = malloc(inter * 4), *eo = malloc((size_t)K * latent * 4);
    float *eog = malloc((size_t)K * latent * 4);
    double *bh = malloc((size_t)K * inter * sizeof *bh), *bo = malloc((size_t)K * latent * sizeof *bo);
    fill(z, latent, 1.0f);
    for (int i = 0; i < latent; i++) z[i] = ldexpf(z[i], zexp); /* the kernels scale x by 2^S */
    uint8_t *raw = dup_dev(host, slot * K), *dev = NULL;
    float *dz = dup_dev(z, latent * 4), *dh = poisoned((size_t)K * inter), *deo = poisoned((size_t)K * latent);
    k3k_experts ex = {.n = K, .inter = inter, .latent = latent, .off_w1p = off[0], .off_w1s = off[1],
                      .off_w3p = off[2], .off_w3s = off[3], .off_w2p = off[4], .off_w2s = off[5],
                      .off_flag = off[6]};
    cudaError_t e = cudaMalloc((void **)&dev, slot * K);
    for (int j = 0; j < K && e == cudaSuccess; j++) {
        ex.base[j] = dev + (size_t)j * slot;
        e = k3k_experts_prepare(&ex, raw + (size_t)j * slot, dev + (size_t)j * slot, 0);
    }
    if (e == cudaSuccess) e = k3k_experts_gate_up(&ex, dz, beta, lb, dh, 0);
    if (e != cudaSuccess) k3_test_fail(__FILE__, __LINE__, "gate_up: %s", cudaGetErrorString(e));
    if (e != cudaSuccess || !fetch(hg, dh, (size_t)K * inter * 4)) goto done;
    for (int j = 0; j < K; j++) {
        uint8_t *b = host + (size_t)j * slot;
        k3_mxfp4 w1 = {b + off[0], b + off[1], inter, latent}, w3 = {b + off[2], b + off[3], inter, latent};
        k3_matvec_mxfp4(SCALAR, &w1, z, g);
        k3_matvec_mxfp4(SCALAR, &w3, z, u);
        k3_situ_vec(g, u, inter, beta, lb, h + (size_t)j * inter);
        for (int r = 0; r < inter; r++) { /* |dSiTU| <= 50 per unit of g or u (β 4, β₂ 25) */
            double s = 0;
            for (int i = 0; i < latent; i++)
                s += (fabs(k3_mxfp4_value(i % 2 ? w1.packed[r * latent / 2 + i / 2] >> 4
                                                : w1.packed[r * latent / 2 + i / 2] & 15,
                                          w1.scale[r * latent / 32 + i / 32])) +
                      fabs(k3_mxfp4_value(i % 2 ? w3.packed[r * latent / 2 + i / 2] >> 4
                                                : w3.packed[r * latent / 2 + i / 2] & 15,
                                          w3.scale[r * latent / 32 + i / 32]))) * fabs(z[i]);
            bh[(size_t)j * inter + r] = 50 * s + fabs(h[(size_t)j * inter + r]) + 1e-30;
        }
    }
    double wr = worst_rel(hg, h, bh, (size_t)K * inter);
    if (!(wr <= 1e-5)) {
        k3_test_fail(__FILE__, __LINE__, "schedule %d special %d gate/up K %d [%d, %d]: error %g",
                     mx_schedule, special, K, inter, latent, wr);
        goto done;
    }
    e = k3k_experts_down(&ex, dh, deo, 0);
    if (e != cudaSuccess) k3_test_fail(__FILE__, __LINE__, "down: %s", cudaGetErrorString(e));
    if (e != cudaSuccess || !fetch(eog, deo, (size_t)K * latent * 4)) goto done;
    for (int j = 0; j < K; j++) {
        uint8_t *b = host + (size_t)j * slot;
        k3_mxfp4 w2 = {b + off[4], b + off[5], latent, inter};
        const float *hj = hg + (size_t)j * inter;
        k3_matvec_mxfp4(SCALAR, &w2, hj, eo + (size_t)j * latent);
        for (int r = 0; r < latent; r++) {
            double s = 0;
            for (int i = 0; i < inter; i++)
                s += fabs(k3_mxfp4_value(i % 2 ? w2.packed[(size_t)r * inter / 2 + i / 2] >> 4
                                               : w2.packed[(size_t)r * inter / 2 + i / 2] & 15,
                                         w2.scale[(size_t)r * inter / 32 + i / 32]) * hj[i]);
            bo[(size_t)j * latent + r] = s + 1e-30;
        }
    }
    wr = worst_rel(eog, eo, bo, (size_t)K * latent);
    if (!(wr <= 1e-5))
        k3_test_fail(__FILE__, __LINE__, "schedule %d special %d down K %d [%d, %d]: error %g",
                     mx_schedule, special, K, latent, inter, wr);
done:
    cudaFree(raw), cudaFree(dev), cudaFree(dz), cudaFree(dh), cudaFree(deo);
    free(host), free(z), free(h), free(hg), free(g), free(u), free(eo), free(eog), free(bh), free(bo);
}

/* Every launch schedule (k3k_set_tuning, kern.h), each with the fast and the exact scale
 * decode; the default schedule is restored afterwards. */
static void test_experts_mxfp4(void) {
    if (!have_gpu()) return;
    for (int sc = 0; sc < K3K_MX_SCHEDULES && !k3_test_stopped(); sc++) {
        k3k_set_tuning(1, sc);
        mx_schedule = sc;
        for (int sp = 0; sp < 2 && !k3_test_stopped(); sp++) { /* fast and exact scale decode */
            check_experts(16, 96, 160, sp, 0);                          /* odd group count */
            if (!k3_test_stopped()) check_experts(3, 3072, 3584, sp, 0); /* K3's expert shape */
            if (!k3_test_stopped()) check_experts(5, 64, 4608, sp, -30); /* long rows, small x */
            if (!k3_test_stopped()) check_experts(2, 32, 32, sp, 20);    /* one group, large x */
        }
    }
    k3k_set_tuning(1, 0);
}

static void test_rmsnorm(void) {
    if (!have_gpu()) return;
    int ns[3] = {7168, 100, 3};
    for (int t = 0; t < 3 && !k3_test_stopped(); t++)
        for (int wk = 0; wk < 3 && !k3_test_stopped(); wk++) { /* BF16, F32, none */
            int n = ns[t];
            float *x = malloc(n * 4), *y = malloc(n * 4), *yg = malloc(n * 4), *wf = malloc(n * 4);
            uint16_t *wb = malloc(n * 2);
            fill(x, n, 3.0f);
            fill(wf, n, 1.0f);
            for (int i = 0; i < n; i++) wb[i] = (uint16_t)(rnd_u32() & 0xbfff); /* finite */
            k3_mat w = {.data = wk == 0 ? (void *)wb : (void *)wf,
                        .dtype = wk == 0 ? K3_DT_BF16 : K3_DT_F32, .rows = 1, .cols = n};
            k3_rmsnorm(x, wk == 2 ? NULL : &w, n, 1e-5f, y);
            float *dx = dup_dev(x, n * 4), *dy = poisoned(n);
            void *dw = dup_dev(w.data, (size_t)n * (wk == 0 ? 2 : 4));
            cudaError_t e = k3k_rmsnorm(dx, wk == 2 ? NULL : dw, w.dtype, n, 1e-5f, dy, 0);
            if (e != cudaSuccess) k3_test_fail(__FILE__, __LINE__, "%s", cudaGetErrorString(e));
            else if (fetch(yg, dy, n * 4)) {
                double wr = worst_rel(yg, y, NULL, n);
                if (!(wr <= 2e-6)) k3_test_fail(__FILE__, __LINE__, "n %d w %d: rel error %g", n, wk, wr);
            }
            cudaFree(dx), cudaFree(dy), cudaFree(dw);
            free(x), free(y), free(yg), free(wf), free(wb);
        }
}

static void test_attn_res(void) {
    if (!have_gpu()) return;
    int hd = 7168;
    for (int n = 1; n <= 9 && !k3_test_stopped(); n += 4) {
        float *v = malloc((size_t)n * hd * 4), *sw = malloc(hd * 4), *out = malloc(hd * 4), *og = malloc(hd * 4);
        for (int j = 0; j < n; j++) fill(v + (size_t)j * hd, hd, 1.0f + j);
        fill(sw, hd, 0.05f);
        const float *vals[16];
        for (int j = 0; j < n; j++) vals[j] = v + (size_t)j * hd;
        k3_attn_res(vals, n, sw, hd, 1e-5f, out);
        float *dv = dup_dev(v, (size_t)n * hd * 4), *dsw = dup_dev(sw, hd * 4), *dout = poisoned(hd);
        float *dsc = poisoned(K3K_MAX_RES);
        const float *dvals[16];
        for (int j = 0; j < n; j++) dvals[j] = dv + (size_t)j * hd;
        cudaError_t e = k3k_attn_res(dvals, n, dsw, hd, 1e-5f, dsc, dout, 0);
        if (e != cudaSuccess) k3_test_fail(__FILE__, __LINE__, "%s", cudaGetErrorString(e));
        else if (fetch(og, dout, hd * 4)) {
            double *sc = malloc(hd * sizeof *sc); /* a convex mix: scale by the largest value */
            for (int i = 0; i < hd; i++) sc[i] = n + 1.0;
            double wr = worst_rel(og, out, sc, hd);
            if (!(wr <= 1e-5)) k3_test_fail(__FILE__, __LINE__, "n %d: error %g", n, wr);
            free(sc);
        }
        cudaFree(dv), cudaFree(dsw), cudaFree(dout), cudaFree(dsc);
        free(v), free(sw), free(out), free(og);
    }
}

static void test_elementwise(void) {
    if (!have_gpu()) return;
    int n = 6144;
    float *g = malloc(n * 4), *u = malloc(n * 4), *y = malloc(n * 4), *yg = malloc(n * 4);
    fill(g, n, 12.0f);
    fill(u, n, 60.0f);
    k3_situ_vec(g, u, n, 4, 25, y);
    float *dg = dup_dev(g, n * 4), *du = dup_dev(u, n * 4), *dy = poisoned(n);
    cudaError_t e = k3k_situ(dg, du, n, 4, 25, dy, 0);
    if (e != cudaSuccess || !fetch(yg, dy, n * 4)) {
        k3_test_fail(__FILE__, __LINE__, "situ: %s", cudaGetErrorString(e));
        goto done;
    }
    double wr = worst_rel(yg, y, NULL, n);
    CHECK(wr <= 2e-6, "SiTU: rel error %g", wr);
    for (int i = 0; i < n; i++) y[i] = g[i] + u[i];
    e = k3k_add(dg, du, dy, n, 0);
    CHECK(e == cudaSuccess && fetch(yg, dy, n * 4) && !memcmp(yg, y, n * 4), "add differs");
    for (int i = 0; i < n; i++) y[i] = g[i] * k3_sigmoid(u[i]);
    e = k3k_sigmoid_gate(dg, du, n, 0);
    CHECK(e == cudaSuccess && fetch(yg, dg, n * 4), "sigmoid gate");
    wr = worst_rel(yg, y, NULL, n);
    CHECK(wr <= 2e-6, "sigmoid gate: rel error %g", wr);
done:
    cudaFree(dg), cudaFree(du), cudaFree(dy);
    free(g), free(u), free(y), free(yg);
}

/* The CPU conv of src/model/kda.c, written out (silu divides). */
static void conv_ref(float *x, const float *w, float *hist, int P, int conv) {
    int nh = conv - 1;
    for (int c = 0; c < P; c++) {
        float *h = hist + c * nh, y = 0;
        const float *wc = w + c * conv;
        for (int i = 0; i < nh; i++) y += wc[i] * h[i];
        y += wc[nh] * x[c];
        for (int i = 0; i + 1 < nh; i++) h[i] = h[i + 1];
        h[nh - 1] = x[c];
        x[c] = k3_silu(y);
    }
}

static void test_short_conv(void) {
    if (!have_gpu()) return;
    int P = 1000, conv = 4;
    float *x = malloc(P * 4), *w = malloc(P * conv * 4), *hist = malloc(P * 3 * 4);
    float *xg = malloc(P * 4), *hg = malloc(P * 3 * 4);
    fill(w, (size_t)P * conv, 1.0f);
    fill(hist, (size_t)P * 3, 2.0f);
    float *dw = dup_dev(w, P * conv * 4), *dh = dup_dev(hist, P * 3 * 4), *dx = NULL;
    for (int step = 0; step < 3 && !k3_test_stopped(); step++) { /* the window slides */
        fill(x, P, 2.0f);
        cudaFree(dx);
        dx = dup_dev(x, P * 4);
        conv_ref(x, w, hist, P, conv);
        cudaError_t e = k3k_short_conv(dx, dw, dh, P, conv, 0);
        CHECK(e == cudaSuccess && fetch(xg, dx, P * 4) && fetch(hg, dh, P * 3 * 4), "conv launch");
        CHECK(!memcmp(hg, hist, P * 3 * 4), "step %d: conv window differs", step);
        double wr = worst_rel(xg, x, NULL, P);
        CHECK(wr <= 2e-6, "step %d: conv output rel error %g", step, wr);
    }
    cudaFree(dw), cudaFree(dh), cudaFree(dx);
    free(x), free(w), free(hist), free(xg), free(hg);
}

/* One KDA head step of src/model/kda.c on the CPU (scalar delta rule). */
static void kda_ref(float *q, float *k, const float *v, const float *f, const float *b,
                    const float *g, const float *a_log, const float *dt, const float *on,
                    float *S, int H, int D, float *o) {
    float alpha[1024], u[1024];
    for (int h = 0; h < H; h++) {
        float *qh = q + h * D, *kh = k + h * D, *oh = o + h * D, ss = 0;
        for (int i = 0; i < D; i++) ss += qh[i] * qh[i];
        float n = sqrtf(ss + 1e-6f), scale = (float)(1.0 / sqrt((double)D));
        for (int i = 0; i < D; i++) qh[i] = qh[i] / n * scale;
        ss = 0;
        for (int i = 0; i < D; i++) ss += kh[i] * kh[i];
        n = sqrtf(ss + 1e-6f);
        for (int i = 0; i < D; i++) kh[i] = kh[i] / n;
        for (int d = 0; d < D; d++) alpha[d] = k3_kda_gate(f[h * D + d], dt[h * D + d], a_log[h], -5.0f);
        k3_kda_delta_rule(SCALAR, S + (size_t)h * D * D, qh, kh, v + h * D, alpha,
                          k3_sigmoid(b[h]), D, u, oh);
        ss = 0;
        for (int d = 0; d < D; d++) ss += oh[d] * oh[d];
        float r = 1.0f / sqrtf(ss / (float)D + 1e-5f);
        for (int d = 0; d < D; d++) oh[d] = on[d] * (oh[d] * r) * k3_sigmoid(g[h * D + d]);
    }
}

static void check_kda(int H, int D) {
    size_t P = (size_t)H * D, nS = P * D;
    float *q = malloc(P * 4), *k = malloc(P * 4), *v = malloc(P * 4), *f = malloc(P * 4);
    float *g = malloc(P * 4), *dt = malloc(P * 4), *on = malloc(D * 4), *b = malloc(H * 4);
    float *al = malloc(H * 4), *S = calloc(nS, 4), *o = malloc(P * 4), *og = malloc(P * 4);
    float *Sg = malloc(nS * 4);
    fill(dt, P, 1.0f), fill(on, D, 1.0f), fill(al, H, 1.0f);
    float *dS = dup_dev(S, nS * 4), *ddt = dup_dev(dt, P * 4), *don = dup_dev(on, D * 4);
    float *dal = dup_dev(al, H * 4);
    for (int step = 0; step < 3 && !k3_test_stopped(); step++) {
        fill(q, P, 1.0f), fill(k, P, 1.0f), fill(v, P, 1.0f), fill(f, P, 2.0f), fill(g, P, 2.0f);
        fill(b, H, 2.0f);
        float *dq = dup_dev(q, P * 4), *dk = dup_dev(k, P * 4), *dv = dup_dev(v, P * 4);
        float *df = dup_dev(f, P * 4), *dg = dup_dev(g, P * 4), *db = dup_dev(b, H * 4);
        float *dout = poisoned(P);
        kda_ref(q, k, v, f, b, g, al, dt, on, S, H, D, o);
        cudaError_t e = k3k_kda_heads(dq, dk, dv, df, db, dg, dal, ddt, don, dS, H, D, -5.0f,
                                      1e-5f, dout, 0);
        int ok = e == cudaSuccess && fetch(og, dout, P * 4) && fetch(Sg, dS, nS * 4);
        if (!ok) k3_test_fail(__FILE__, __LINE__, "kda launch: %s", cudaGetErrorString(e));
        double *sc = malloc(P * sizeof *sc); /* normalised outputs: absolute, O(1) */
        for (size_t i = 0; i < P; i++) sc[i] = 1.0 + fabs(o[i]);
        double wo = ok ? worst_rel(og, o, sc, P) : 0, ws = 0;
        free(sc);
        for (size_t i = 0; ok && i < nS; i++) ws = fmax(ws, fabs((double)Sg[i] - S[i]));
        if (ok && !(wo <= 1e-4 && ws <= 1e-5))
            k3_test_fail(__FILE__, __LINE__, "H %d D %d step %d: o rel error %g, S abs error %g",
                         H, D, step, wo, ws);
        memcpy(S, Sg, nS * 4); /* next step from the same state: errors must not compound */
        cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(df), cudaFree(dg), cudaFree(db);
        cudaFree(dout);
    }
    cudaFree(dS), cudaFree(ddt), cudaFree(don), cudaFree(dal);
    free(q), free(k), free(v), free(f), free(g), free(dt), free(on), free(b), free(al), free(S);
    free(o), free(og), free(Sg);
}

static void test_kda_heads(void) {
    if (!have_gpu()) return;
    check_kda(3, 128);
    if (!k3_test_stopped()) check_kda(4, 16);
}

static void test_mla_attention(void) {
    if (!have_gpu()) return;
    int H = 4, nope = 16, rope = 8, vd = 16, lora = 8, T = 600, qk = nope + rope;
    int kvf = H * nope + rope + H * vd;
    float *kv = calloc((size_t)T * kvf, 4), *KV = malloc(H * (nope + vd) * 4);
    float *ckv = malloc((lora + rope) * 4), *Q = malloc(H * qk * 4), *o = malloc(H * vd * 4);
    float *og = malloc(H * vd * 4), *kvg = malloc((size_t)T * kvf * 4), sc[600];
    float *dkv = poisoned((size_t)T * kvf), *dout = poisoned(H * vd);
    float *dsc = poisoned(k3k_mla_scratch_floats(H, vd, T));
    for (int t = 0; t < T && !k3_test_stopped(); t++) {
        fill(KV, H * (nope + vd), 2.0f), fill(ckv, lora + rope, 2.0f), fill(Q, H * qk, 2.0f);
        float *e = kv + (size_t)t * kvf; /* the device's expanded layout (kern.h), written out */
        for (int h = 0; h < H; h++)
            for (int d = 0; d < nope; d++) e[h * nope + d] = KV[h * (nope + vd) + d];
        for (int d = 0; d < rope; d++) e[H * nope + d] = ckv[lora + d];
        for (int h = 0; h < H; h++)
            for (int d = 0; d < vd; d++) e[H * nope + rope + h * vd + d] = KV[h * (nope + vd) + nope + d];
        float *dKV = dup_dev(KV, H * (nope + vd) * 4), *dckv = dup_dev(ckv, (lora + rope) * 4);
        float *dQ = dup_dev(Q, H * qk * 4);
        cudaError_t err = k3k_mla_append(dkv, t, dKV, dckv, H, nope, rope, vd, lora, 0);
        /* every position is appended; attention is checked within and across chunks */
        int check = t < 12 || t % 97 == 0 || t == K3K_ATT_CHUNK - 1 || t == K3K_ATT_CHUNK ||
                    t == T - 1;
        if (err == cudaSuccess && check)
            err = k3k_mla_attend(dQ, dkv, t, H, nope, rope, vd, dsc, dout, 0);
        int ok = err == cudaSuccess && (!check || (fetch(og, dout, H * vd * 4) &&
                 fetch(kvg, dkv, (size_t)(t + 1) * kvf * 4)));
        cudaFree(dKV), cudaFree(dckv), cudaFree(dQ);
        CHECK(ok, "launch: %s", cudaGetErrorString(err));
        if (!check) continue;
        CHECK(!memcmp(kvg, kv, (size_t)(t + 1) * kvf * 4), "t %d: KV cache differs", t);
        float scale = (float)(1.0 / sqrt((double)qk));
        for (int h = 0; h < H; h++) {
            float mx = -INFINITY, sum = 0;
            for (int j = 0; j <= t; j++) {
                const float *ej = kv + (size_t)j * kvf;
                float dot = k3_dot(SCALAR, Q + h * qk, ej + h * nope, nope) +
                            k3_dot(SCALAR, Q + h * qk + nope, ej + H * nope, rope);
                sc[j] = dot * scale;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int j = 0; j <= t; j++) sum += (sc[j] = expf(sc[j] - mx));
            for (int d = 0; d < vd; d++) o[h * vd + d] = 0;
            for (int j = 0; j <= t; j++)
                k3_axpy(SCALAR, sc[j] / sum, kv + (size_t)j * kvf + H * nope + rope + h * vd,
                        o + h * vd, vd);
        }
        double *s = malloc(H * vd * sizeof *s); /* a convex mix of values in [-2, 2] */
        for (int i = 0; i < H * vd; i++) s[i] = 2.0;
        double wr = worst_rel(og, o, s, H * vd);
        free(s);
        CHECK(wr <= 1e-5, "t %d: attention error %g", t, wr);
    }
    cudaFree(dkv), cudaFree(dsc), cudaFree(dout);
    free(kv), free(KV), free(ckv), free(Q), free(o), free(og), free(kvg);
}

/* The latent cache's attention (k3k_mla_latent_attend) against the EXPANDED form in double,
 * computed independently of the absorbed order: k_nope_j = W_uk c_j and v_j = W_uv c_j per
 * head (kv_b_proj's two row blocks, spec §7.5), softmax over q_nope·k_nope + q_pe·k_pe. lora
 * over one block's 512 columns or not, heads a whole 16-head group or not, positions across
 * the kernel's 128-position tiles and its splits (each of at least two tiles). */
static void check_mla_latent(int dtype, int H, int lora) {
    int nope = 16, rope = 8, vd = 16, T = 600, qk = nope + rope;
    int kvf = lora + rope, rows = H * (nope + vd);
    size_t nw = (size_t)rows * lora, es = dtype == K3_DT_BF16 ? 2 : 4;
    float *wf = malloc(nw * 4), *lat = malloc((size_t)T * kvf * 4), *Q = malloc(H * qk * 4);
    float *og = malloc(H * vd * 4);
    double *kn = malloc((size_t)T * H * nope * sizeof(double));
    double *vv = malloc((size_t)T * H * vd * sizeof(double)), *sc = malloc(T * sizeof(double));
    uint16_t *wb = malloc(nw * 2);
    fill(wf, nw, 0.1f), fill(lat, (size_t)T * kvf, 1.0f);
    for (size_t i = 0; i < nw; i++) { /* BF16: the top half, and the f32 it stands for */
        uint32_t u;
        memcpy(&u, &wf[i], 4);
        wb[i] = (uint16_t)(u >> 16), u &= 0xffff0000u;
        if (dtype == K3_DT_BF16) memcpy(&wf[i], &u, 4);
    }
    for (int j = 0; j < T; j++)
        for (int h = 0; h < H; h++)
            for (int r = 0; r < nope + vd; r++) {
                double a = 0;
                for (int i = 0; i < lora; i++)
                    a += (double)wf[((size_t)h * (nope + vd) + r) * lora + i] * lat[(size_t)j * kvf + i];
                if (r < nope) kn[((size_t)j * H + h) * nope + r] = a;
                else vv[((size_t)j * H + h) * vd + r - nope] = a;
            }
    void *dW = dup_dev(dtype == K3_DT_BF16 ? (void *)wb : (void *)wf, nw * es);
    float *dlat = dup_dev(lat, (size_t)T * kvf * 4), *dqa = poisoned((size_t)H * kvf);
    float *dacc = poisoned((size_t)H * lora), *dout = poisoned(H * vd);
    float *dsc = poisoned(k3k_mla_latent_scratch_floats(H, lora));
    k3k_mat kb = {dW, NULL, dtype == K3_DT_BF16 ? K3K_BF16 : K3K_F32, rows, lora};
    int ts[] = {0, 1, 7, 127, 128, 255, 256, 383, 2 * K3K_ATT_CHUNK + 3, T - 1};
    for (size_t ti = 0; ti < sizeof ts / sizeof *ts && !k3_test_stopped(); ti++) {
        int t = ts[ti];
        fill(Q, H * qk, 1.0f);
        float *dQ = dup_dev(Q, H * qk * 4);
        cudaError_t e = k3k_mla_latent_attend(dQ, &kb, dlat, t, H, nope, rope, vd, lora, dqa,
                                              dacc, dsc, dout, 0);
        int ok = e == cudaSuccess && fetch(og, dout, H * vd * 4);
        cudaFree(dQ);
        CHECK(ok, "dtype %d t %d: launch: %s", dtype, t, cudaGetErrorString(e));
        if (!ok) break;
        double worst = 0;
        for (int h = 0; h < H; h++) {
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j <= t; j++) {
                double d = 0;
                for (int i = 0; i < nope; i++) d += (double)Q[h * qk + i] * kn[((size_t)j * H + h) * nope + i];
                for (int i = 0; i < rope; i++) d += (double)Q[h * qk + nope + i] * lat[(size_t)j * kvf + lora + i];
                sc[j] = d / sqrt((double)qk), mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int j = 0; j <= t; j++) sum += (sc[j] = exp(sc[j] - mx));
            double vmax = 0;
            for (int j = 0; j <= t; j++)
                for (int d = 0; d < vd; d++) vmax = fmax(vmax, fabs(vv[((size_t)j * H + h) * vd + d]));
            for (int d = 0; d < vd; d++) {
                double o = 0;
                for (int j = 0; j <= t; j++) o += sc[j] / sum * vv[((size_t)j * H + h) * vd + d];
                /* o is a convex mix of values within ±vmax: the error relative to that */
                double err = fabs(og[h * vd + d] - o) / vmax;
                if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
            }
        }
        CHECK(worst <= 1e-5, "dtype %d t %d: latent attention error %g (of the values' range)",
              dtype, t, worst);
    }
    cudaFree(dW), cudaFree(dlat), cudaFree(dqa), cudaFree(dacc), cudaFree(dout), cudaFree(dsc);
    free(wf), free(lat), free(Q), free(og), free(kn), free(vv), free(sc), free(wb);
}

static void test_mla_latent(void) {
    if (!have_gpu()) return;
    check_mla_latent(K3_DT_BF16, 4, 300);
    if (!k3_test_stopped()) check_mla_latent(K3_DT_F32, 20, 600);
}

/* src/model/ffn.c's route() after the router product, written out. */
static void route_ref(const float *logit, const float *bias, int E, int K, float scaling, int *ids,
                      float *w) {
    float *s = malloc(E * 4), *b = malloc(E * 4);
    for (int e = 0; e < E; e++) {
        s[e] = k3_sigmoid(logit[e]), b[e] = s[e] + bias[e];
        if (!(b[e] > -FLT_MAX)) b[e] = -FLT_MAX; /* NaN or -Inf ranks last */
    }
    for (int j = 0; j < K; j++) {
        int best = 0;
        while (b[best] == -INFINITY) best++; /* the first not taken */
        for (int e = best + 1; e < E; e++)
            if (b[e] > b[best]) best = e;
        ids[j] = best;
        b[best] = -INFINITY; /* taken */
    }
    float sum = 0;
    for (int j = 0; j < K; j++) sum += s[ids[j]];
    sum = sum + 1e-20f;
    for (int j = 0; j < K; j++) w[j] = s[ids[j]] / sum * scaling;
    free(s), free(b);
}

/* The last two cases: corrupt router scores (NaN logits, -Inf biases) rank last, as on the CPU
 * (k3_moe_select), so the ids stay distinct and valid; K reaches into them. */
static void test_router_topk(void) {
    if (!have_gpu()) return;
    int cases[5][3] = {{896, 16, 0}, {32, 4, 0}, {3000, 64, 0}, {32, 16, 24}, {896, 16, 890}};
    for (int c = 0; c < 5 && !k3_test_stopped(); c++) {
        int E = cases[c][0], K = cases[c][1], bad = cases[c][2], ids[64], idg[64];
        float *lg = malloc(E * 4), *bias = malloc(E * 4), w[64], wg[64];
        fill(lg, E, 4.0f), fill(bias, E, 0.1f);
        bias[5 % E] = bias[7 % E], lg[5 % E] = lg[7 % E]; /* a tie: the lower id first */
        for (int i = 0; i < bad; i++) { /* spread over the ids: every third NaN, else -Inf */
            int e = (int)(((int64_t)i * 7919) % E);
            if (i % 3) bias[e] = -INFINITY;
            else lg[e] = NAN;
        }
        route_ref(lg, bias, E, K, 2.5f, ids, w);
        float *dl = dup_dev(lg, E * 4), *db = dup_dev(bias, E * 4), *dw = poisoned(K);
        int *di = (int *)poisoned(K);
        cudaError_t e = k3k_router_topk(dl, db, E, K, 2.5f, di, dw, 0);
        int ok = e == cudaSuccess && fetch(idg, di, K * 4) && fetch(wg, dw, K * 4);
        cudaFree(dl), cudaFree(db), cudaFree(dw), cudaFree(di);
        free(lg), free(bias);
        CHECK(ok, "launch: %s", cudaGetErrorString(e));
        for (int j = 0; j < K; j++) {
            CHECK(idg[j] == ids[j], "E %d bad %d slot %d: expert %d, want %d", E, bad, j, idg[j],
                  ids[j]);
            CHECK(isnan(w[j]) ? isnan(wg[j]) : fabsf(wg[j] - w[j]) <= 1e-6f * fabsf(w[j]),
                  "E %d bad %d slot %d: weight %g, want %g", E, bad, j, wg[j], w[j]);
        }
        if (bad) { /* the CPU reference itself: distinct ids in range, NaN experts among them */
            int nan_ids = 0;
            for (int j = 0; j < K; j++) {
                CHECK(ids[j] >= 0 && ids[j] < E, "E %d slot %d: id %d", E, j, ids[j]);
                for (int i = 0; i < j; i++) CHECK(ids[i] != ids[j], "E %d: id %d twice", E, ids[j]);
                nan_ids += isnan(w[j]) != 0;
            }
            CHECK(nan_ids > 0, "E %d bad %d: no NaN weight among the top %d", E, bad, K);
        }
    }
}

static void test_moe_sum(void) {
    if (!have_gpu()) return;
    int K = 16, n = 3584;
    float *eo = malloc((size_t)K * n * 4), w[16], *acc = malloc(n * 4), *ag = malloc(n * 4);
    fill(eo, (size_t)K * n, 3.0f), fill(w, K, 1.0f);
    for (int i = 0; i < n; i++) { /* src/model/ffn.c's order */
        acc[i] = 0;
        for (int j = 0; j < K; j++) acc[i] += eo[(size_t)j * n + i] * w[j];
    }
    float *deo = dup_dev(eo, (size_t)K * n * 4), *dw = dup_dev(w, K * 4), *da = poisoned(n);
    cudaError_t e = k3k_moe_sum(deo, dw, K, n, da, 0);
    int ok = e == cudaSuccess && fetch(ag, da, n * 4);
    cudaFree(deo), cudaFree(dw), cudaFree(da);
    CHECK(ok && !memcmp(ag, acc, n * 4), "weighted sum differs from the CPU's bit for bit");
    free(eo), free(acc), free(ag);
}

#define KERNEL_TESTS                                                                       \
    {"cuda_matvec_bf16_i8_f32", test_matvec}, {"cuda_experts_mxfp4", test_experts_mxfp4},  \
    {"cuda_rmsnorm", test_rmsnorm}, {"cuda_attn_res", test_attn_res},                     \
    {"cuda_elementwise", test_elementwise}, {"cuda_short_conv", test_short_conv},          \
    {"cuda_kda_heads", test_kda_heads}, {"cuda_mla_attention", test_mla_attention},        \
    {"cuda_mla_latent", test_mla_latent},                                                 \
    {"cuda_router_topk", test_router_topk}, {"cuda_moe_sum", test_moe_sum},
#else
static void test_kernels_skipped(void) { have_gpu(); }
#define KERNEL_TESTS {"cuda_kernels", test_kernels_skipped},
#endif

/* K3_GPU_GB must be a finite budget: inf was taken as one (it is now refused as --gpu-gb inf
 * is). */
static void test_gpu_gb_env_finite(void) {
    if (!have_gpu()) return;
    const char *d = getenv("K3_DEVICE"), *b = getenv("K3_GPU_GB");
    char kd[64] = "", kb[64] = "";
    if (d) snprintf(kd, sizeof kd, "%s", d);
    if (b) snprintf(kb, sizeof kb, "%s", b);
    setenv("K3_DEVICE", "cuda", 1);
    setenv("K3_GPU_GB", "inf", 1);
    k3t_cli r = {0};
    int ran = k3t_cli_run("run --prompt-ids 1792 --max-new 1 -q", &r);
    if (d) setenv("K3_DEVICE", kd, 1);
    else unsetenv("K3_DEVICE");
    if (b) setenv("K3_GPU_GB", kb, 1);
    else unsetenv("K3_GPU_GB");
    if (!ran)
        CHECK(r.status == K3_ERR_USAGE && strstr(r.err, "K3_GPU_GB='inf'"), "exit %d: %s",
              r.status, r.err);
    k3t_cli_free(&r);
}

const k3_test k3_suite_cuda[] = {
    KERNEL_TESTS
    {"cuda_nano_trace_len7", test_nano_trace},
    {"cuda_nano_prompts_logits_routing_greedy", test_nano_prompts},
    {"cuda_nano_decode_vs_prefill", test_nano_decode},
    {"cuda_nano_streamed_spine_small_expert_cache", test_nano_streamed_small_cache},
    {"cuda_kjv_trace_prompts_decode_vs_prefill", test_kjv_fixture},
    {"cuda_greedy_matches_cpu", test_greedy_matches_cpu},
    {"cuda_state_file_roundtrip", test_state_file_roundtrip},
    {"cuda_gpu_gb_env_finite", test_gpu_gb_env_finite},
    {0},
};
