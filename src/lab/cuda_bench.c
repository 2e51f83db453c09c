/* cuda_bench.c — `k3-lab bench-gpu` part 1 (lab.h): the card's device-to-device copy bandwidth
 * and the kernels at K3's decode shapes (batch 1), each against that copy bandwidth, in one run.
 *
 * Method (/work/.library/device/METHOD.md): random finite inputs, never zeros; 3 warm-up
 * launches; then 7 batches of launches timed with events, the median batch mean reported;
 * each launch reads the next of several weight copies so that the 60 MB L2 never holds the
 * next launch's weights. Bytes count each weight byte once (inputs and outputs are KB).
 * Lab switches, for kernel work (k3_gpu_tuning; `k3 bench-gpu` sets them from K3_MX_SWEEP,
 * K3_MX_SCAN, K3_ONLY_EXPERTS, K3_MX_SCHEDULE, K3_PDL): mx_sweep adds a row per MXFP4 launch
 * schedule (kern.h); mx_scan times the MXFP4 launches at 1..32 experts (a launch's fixed
 * cost against its streaming rate) and prints the host's enqueue time per launch;
 * only_experts skips every other kernel (for profilers); no_pdl launches without
 * programmatic dependent launch (kernels.cu), for comparison. */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../cuda/gpu.h"
#include "../cuda/kern.h"
#include "lab.h"
#include "../util/clock.h"

#define CK(call)                                                                            \
    do {                                                                                    \
        cudaError_t ck_ = (call);                                                           \
        if (ck_ != cudaSuccess)                                                             \
            return k3_fail(err, K3_ERR_DEVICE, "CUDA: %s failed: %s", #call,               \
                           cudaGetErrorString(ck_));                                        \
    } while (0)

#define BATCHES 7
#define ROTATE_BYTES (512ull << 20) /* weight copies per shape: at least this much in total */

typedef struct job {
    int kind;            /* 0 BF16/I8 matvec, 1 experts gate+up, 2 experts down, 3 KDA heads,
                          * 4 MLA attention, 5 several matrices of one input (one launch),
                          * 6 MLA attention over the latent cache (ys[0]: qa, ys[1]: acc) */
    k3k_mat mat[8];      /* matvec: one per weight copy */
    k3k_mat multi[4][K3K_MAX_MULTI]; /* kind 5: per weight copy, n_multi matrices */
    int n_multi;
    float *ys[K3K_MAX_MULTI];
    k3k_experts ex[16];
    int sets;
    double host_s;       /* time_job: host seconds per launch (the enqueue alone) */
    float *x, *y, *h, *aux;
    int H, D, t;         /* KDA / MLA */
} job;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static cudaError_t launch(job *j, int i, cudaStream_t s) {
    int k = i % j->sets;
    switch (j->kind) {
    case 0: return k3k_matvec(&j->mat[k], j->x, j->y, s);
    case 1: return k3k_experts_gate_up(&j->ex[k], j->x, 4.0f, 25.0f, j->h, s);
    case 2: return k3k_experts_down(&j->ex[k], j->h, j->y, s);
    case 5: {
        const k3k_mat *m[K3K_MAX_MULTI];
        for (int i = 0; i < j->n_multi; i++) m[i] = &j->multi[k][i];
        return k3k_matvec_multi(m, j->ys, j->n_multi, j->x, s);
    }
    case 3: {
        int P = j->H * j->D;
        float *q = j->x, *kk = q + P, *v = kk + P, *f = v + P, *g = f + P, *o = g + P;
        return k3k_kda_heads(q, kk, v, f, j->y, g, j->y, f, j->y, j->aux, j->H, j->D, -5.0f,
                             1e-5f, o, s);
    }
    case 6:
        return k3k_mla_latent_attend(j->x, &j->mat[0], j->aux, j->t, j->H, 128, 64, 128, 512,
                                     j->ys[0], j->ys[1], j->h, j->y, s);
    default:
        return k3k_mla_attend(j->x, j->aux, j->t, j->H, 128, 64, 128, j->h, j->y, s);
    }
}

/* Median over BATCHES of the mean seconds per launch, n launches per batch. */
static int time_job(job *j, int n, double *out, k3_err *err) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) CK(launch(j, i, 0));
    double t[BATCHES], host[BATCHES];
    for (int r = 0; r < BATCHES; r++) {
        CK(cudaEventRecord(a, 0));
        double h0 = k3_now_s();
        for (int i = 0; i < n; i++) CK(launch(j, i, 0));
        host[r] = (k3_now_s() - h0) / n;
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        t[r] = ms * 1e-3 / n;
    }
    qsort(t, BATCHES, sizeof *t, cmp_d);
    qsort(host, BATCHES, sizeof *host, cmp_d);
    *out = t[BATCHES / 2];
    j->host_s = host[BATCHES / 2];
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return K3_OK;
}

static void row(FILE *out, const char *name, const char *shape, double bytes, double s,
                double copy_bps) {
    fprintf(out, "%-34s %-22s %9.1f %9.1f %8.0f %6.1f%%\n", name, shape, bytes / 1e6, s * 1e6,
            bytes / s / 1e9, 100.0 * bytes / s / copy_bps);
}

static int copy_bandwidth(FILE *out, int reps, double *bps, k3_err *err) {
    size_t n = 2ull << 30;
    void *a = NULL, *b = NULL;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(k3k_fill_random(a, n, 1, 0xffffffffu, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double t[64];
    int r = reps < 64 ? reps : 64;
    CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0));
    for (int i = 0; i < r; i++) {
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, n, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t[i] = ms * 1e-3;
    }
    qsort(t, (size_t)r, sizeof *t, cmp_d);
    *bps = 2.0 * n / t[r / 2];
    fprintf(out, "%-34s %-22s %9.1f %9.1f %8.0f %6.1f%%\n", "copy D2D (read + write)",
            "2 GiB", 2.0 * n / 1e6, t[r / 2] * 1e6, *bps / 1e9, 100.0);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return K3_OK;
}

/* Matvec of [rows, cols] (BF16 or I8) over enough weight copies; seconds per launch. */
static int bench_matvec(FILE *out, const char *name, int dtype, int64_t rows, int64_t cols,
                        int reps, double copy_bps, int scan, double *sec, k3_err *err) {
    job j = {.kind = 0};
    size_t es = dtype == K3K_BF16 ? 2 : 1, wb = (size_t)rows * cols * es;
    size_t sb = dtype == K3K_I8 ? (size_t)rows * 4 : 0;
    j.sets = (int)((ROTATE_BYTES + wb - 1) / wb);
    j.sets = j.sets < 2 ? 2 : j.sets > 8 ? 8 : j.sets;
    void *w = NULL;
    CK(cudaMalloc(&w, (wb + sb + 256) * j.sets));
    CK(cudaMalloc((void **)&j.x, cols * 4));
    CK(cudaMalloc((void **)&j.y, rows * 4));
    CK(k3k_fill_random(w, (wb + sb + 256) * j.sets / 4 * 4, 7, dtype == K3K_BF16 ? 0xbfffbfffu : 0x3f7f7f7fu, 0));
    CK(k3k_fill_random(j.x, cols * 4, 8, 0x3fffffffu, 0)); /* finite, |x| < 2 */
    for (int k = 0; k < j.sets; k++) {
        char *base = (char *)w + (wb + sb + 256) * k;
        j.mat[k] = (k3k_mat){base, dtype == K3K_I8 ? (const float *)(base + wb) : NULL, dtype,
                             rows, cols};
    }
    int rc = time_job(&j, reps, sec, err);
    if (!rc) {
        char shape[64];
        snprintf(shape, sizeof shape, "%lldx%lld %s", (long long)rows, (long long)cols,
                 dtype == K3K_BF16 ? "bf16" : "int8");
        row(out, name, shape, (double)(wb + sb), *sec, copy_bps);
        if (scan) fprintf(out, "    (host enqueue %.1f us per launch)\n", j.host_s * 1e6);
    }
    cudaFree(w);
    cudaFree(j.x);
    cudaFree(j.y);
    return rc;
}

/* n BF16 matrices [rows[i], cols] of one input in one launch (k3k_matvec_multi), as the decode
 * runs a layer's input projections; seconds per launch. */
static int bench_multi(FILE *out, const char *name, const int64_t *rows, int n, int64_t cols,
                       int reps, double copy_bps, k3_err *err) {
    job j = {.kind = 5, .n_multi = n};
    size_t off[K3K_MAX_MULTI + 1] = {0};
    for (int i = 0; i < n; i++) off[i + 1] = off[i] + ((size_t)rows[i] * cols * 2 + 255) / 256 * 256;
    const size_t wb = off[n]; /* one copy of the n matrices, each 256-byte aligned */
    j.sets = (int)((ROTATE_BYTES + wb - 1) / wb);
    j.sets = j.sets < 2 ? 2 : j.sets > 4 ? 4 : j.sets;
    char *w = NULL;
    CK(cudaMalloc((void **)&w, wb * j.sets));
    CK(k3k_fill_random(w, wb * j.sets, 7, 0xbfffbfffu, 0));
    CK(cudaMalloc((void **)&j.x, cols * 4));
    CK(k3k_fill_random(j.x, cols * 4, 8, 0x3fffffffu, 0));
    for (int i = 0; i < n; i++) {
        CK(cudaMalloc((void **)&j.ys[i], rows[i] * 4));
        for (int k = 0; k < j.sets; k++)
            j.multi[k][i] = (k3k_mat){w + wb * k + off[i], NULL, K3K_BF16, rows[i], cols};
    }
    double t = 0;
    int rc = time_job(&j, reps, &t, err);
    if (!rc) {
        char shape[64];
        int64_t r = 0;
        for (int i = 0; i < n; i++) r += rows[i];
        snprintf(shape, sizeof shape, "%d: %lldx%lld bf16", n, (long long)r, (long long)cols);
        row(out, name, shape, 2.0 * (double)r * (double)cols, t, copy_bps);
    }
    cudaFree(w);
    cudaFree(j.x);
    for (int i = 0; i < n; i++) cudaFree(j.ys[i]);
    return rc;
}

/* Prepares the sets · K experts at raw into w (slot bytes each) for the schedule in force. */
static int prepare_all(const k3k_experts *d, const uint8_t *raw, uint8_t *w, uint64_t slot, int n,
                       k3_err *err) {
    for (int k = 0; k < n; k++) CK(k3k_experts_prepare(d, raw + k * slot, w + k * slot, 0));
    CK(cudaDeviceSynchronize());
    return K3_OK;
}

/* mx_sweep: every launch schedule of the MXFP4 kernels (kern.h; the weights prepared again
 * for each, as its layout may differ), the default first and again last, so that the spread of
 * one schedule's two timings is in the table. */
static int sweep_schedules(FILE *out, job *j, const k3k_experts *d, const uint8_t *raw,
                           uint8_t *w, uint64_t slot, int n, int reps, double b1, double b2,
                           double copy_bps, const k3_gpu_tuning *t, k3_err *err) {
    int rc = K3_OK, pdl = !t->no_pdl, keep = t->mx_schedule;
    for (int i = 0; i <= K3K_MX_SCHEDULES && !rc; i++) {
        int sc = i % K3K_MX_SCHEDULES, cw, st, k, ld;
        char name[64];
        k3k_set_tuning(pdl, sc);
        rc = prepare_all(d, raw, w, slot, n, err);
        double t = 0;
        for (int gu = 1; gu >= 0 && !rc; gu--) {
            k3k_mx_schedule(sc, gu, &cw, &st, &k, &ld);
            j->kind = gu ? 1 : 2;
            rc = time_job(j, reps, &t, err);
            snprintf(name, sizeof name, "  sched %d %s: %s %dx%d%s", sc, gu ? "gate+up" : "down",
                     cw ? "copy warp" : "per warp", st, k, ld ? " old dec" : "");
            if (!rc)
                row(out, name, gu ? "16x2x3072x3584" : "16x3584x3072", gu ? b1 : b2, t, copy_bps);
        }
    }
    k3k_set_tuning(pdl, keep);
    if (!rc) rc = prepare_all(d, raw, w, slot, n, err);
    return rc;
}

/* mx_scan: n routed experts per launch for n = 1..32 (the 32 prepared experts rotated in
 * sets of n), so that a launch's fixed cost and its streaming rate can be told apart:
 * µs = fixed + bytes / rate. Also the host's enqueue time per launch. */
static int scan_counts(FILE *out, job *j, uint8_t *w, uint64_t slot, int reps, double per_ex,
                       double copy_bps, k3_err *err) {
    static const int ns[] = {1, 2, 4, 8, 16, 32};
    const k3k_experts d = j->ex[0];
    const int saved = j->sets;
    int rc = K3_OK;
    for (size_t a = 0; a < sizeof ns / sizeof *ns && !rc; a++) {
        const int n = ns[a];
        j->sets = 32 / n > 16 ? 16 : 32 / n;
        for (int s = 0; s < j->sets; s++) {
            j->ex[s] = d;
            j->ex[s].n = n;
            for (int e = 0; e < n; e++) j->ex[s].base[e] = w + (uint64_t)(s * n + e) * slot;
        }
        for (int gu = 1; gu >= 0 && !rc; gu--) {
            double t = 0;
            char name[64], shape[32];
            j->kind = gu ? 1 : 2;
            rc = time_job(j, reps, &t, err);
            snprintf(name, sizeof name, "  scan %s n=%d (host %.1f us)", gu ? "gate+up" : "down",
                     n, j->host_s * 1e6);
            snprintf(shape, sizeof shape, "%dx%s", n, gu ? "2x3072x3584" : "3584x3072");
            if (!rc) row(out, name, shape, per_ex * n * (gu ? 2 : 1), t, copy_bps);
        }
    }
    for (int s = 0; s < saved; s++) {
        j->ex[s] = d;
        j->ex[s].n = 16;
        for (int e = 0; e < 16; e++) j->ex[s].base[e] = w + (uint64_t)(s * 16 + e) * slot;
    }
    j->sets = saved;
    return rc;
}

static int bench_experts(FILE *out, int reps, double copy_bps, const k3_gpu_tuning *t,
                         double *gate_up_bps, k3_err *err) {
    const int K = 16, inter = 3072, latent = 3584, sets = 2;
    uint64_t packed = (uint64_t)inter * latent / 2, scale = packed / 16, off = 0, o[7];
    for (int i = 0; i < 7; i++) {
        uint64_t b = i == 6 ? 4 : i % 2 ? scale : packed;
        o[i] = off, off += b + 256 - b % 256;
    }
    uint64_t slot = off;
    job j = {.kind = 1, .sets = sets};
    uint8_t *w = NULL, *raw = NULL;
    CK(cudaMalloc((void **)&w, slot * K * sets));
    CK(cudaMalloc((void **)&raw, slot * K * sets)); /* kept for the sweep's re-preparation */
    k3k_experts d = {.inter = inter, .latent = latent, .off_w1p = o[0], .off_w1s = o[1],
                     .off_w3p = o[2], .off_w3s = o[3], .off_w2p = o[4], .off_w2s = o[5],
                     .off_flag = o[6]};
    uint8_t *hs = malloc(scale);
    if (!hs) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    uint64_t z = 12345;
    for (int k = 0; k < sets * K; k++) { /* random nibbles; E8M0 scales in 100..163 (finite) */
        CK(k3k_fill_random(raw + k * slot, slot, 11 + k, 0xffffffffu, 0));
        for (int i = 1; i < 6; i += 2) {
            for (uint64_t b = 0; b < scale; b++) {
                z = z * 6364136223846793005ull + 1442695040888963407ull;
                hs[b] = (uint8_t)(100 + (z >> 58));
            }
            CK(cudaMemcpy(raw + k * slot + o[i], hs, scale, cudaMemcpyHostToDevice));
        }
    }
    free(hs);
    int rc = prepare_all(&d, raw, w, slot, sets * K, err);
    if (rc) return rc;
    CK(cudaMalloc((void **)&j.x, latent * 4));
    CK(cudaMalloc((void **)&j.h, (size_t)sets * K * inter * 4)); /* mx_scan: up to 32 */
    CK(cudaMalloc((void **)&j.y, (size_t)sets * K * latent * 4));
    CK(k3k_fill_random(j.x, latent * 4, 13, 0x3fffffffu, 0));
    for (int s = 0; s < sets; s++) {
        j.ex[s] = d;
        j.ex[s].n = K;
        for (int e = 0; e < K; e++) j.ex[s].base[e] = w + (uint64_t)(s * K + e) * slot;
    }
    CK(k3k_fill_random(j.h, (size_t)sets * K * inter * 4, 14, 0x3fffffffu, 0));
    double t1 = 0, t2 = 0;
    rc = time_job(&j, reps, &t1, err);
    j.kind = 2;
    if (!rc) rc = time_job(&j, reps, &t2, err);
    double b1 = 2.0 * K * (packed + scale), b2 = 1.0 * K * (packed + scale);
    if (!rc) {
        row(out, "mxfp4 16 experts gate+up+SiTU", "16x2x3072x3584", b1, t1, copy_bps);
        row(out, "mxfp4 16 experts down", "16x3584x3072", b2, t2, copy_bps);
        *gate_up_bps = b1 / t1;
    }
    if (!rc && t->mx_scan)
        rc = scan_counts(out, &j, w, slot, reps, (double)(packed + scale), copy_bps, err);
    if (!rc && t->mx_sweep)
        rc = sweep_schedules(out, &j, &d, raw, w, slot, sets * K, reps, b1, b2, copy_bps, t,
                             err);
    cudaFree(w);
    cudaFree(raw);
    cudaFree(j.x);
    cudaFree(j.h);
    cudaFree(j.y);
    return rc;
}

/* MLA attention over a ctx-position LATENT cache at K3 widths (96 heads, lora 512, rope 64,
 * kv_b_proj BF16 [96·256][512] read by the absorb and the W_uv product): bytes = the latent
 * rows + kv_b_proj. */
static int bench_latent(FILE *out, int ctx, int reps, double copy_bps, k3_err *err) {
    const int H = 96, lora = 512, kvf = 512 + 64;
    size_t latb = (size_t)ctx * kvf * 4, wb = (size_t)H * 256 * lora * 2;
    job m = {.kind = 6, .sets = 1, .H = H, .t = ctx - 1};
    void *w = NULL;
    CK(cudaMalloc((void **)&m.x, H * 192 * 4));
    CK(cudaMalloc((void **)&m.y, H * 128 * 4));
    CK(cudaMalloc((void **)&m.h, k3k_mla_latent_scratch_floats(H, lora) * 4));
    CK(cudaMalloc((void **)&m.ys[0], (size_t)H * kvf * 4));
    CK(cudaMalloc((void **)&m.ys[1], (size_t)H * lora * 4));
    CK(cudaMalloc((void **)&m.aux, latb));
    CK(cudaMalloc(&w, wb));
    CK(k3k_fill_random(m.x, H * 192 * 4, 26, 0x3d7fffffu, 0));
    CK(k3k_fill_random(m.aux, latb, 27, 0x3f7fffffu, 0));
    CK(k3k_fill_random(w, wb, 28, 0x3d7f3d7fu, 0));
    m.mat[0] = (k3k_mat){w, NULL, K3K_BF16, (int64_t)H * 256, lora};
    double t = 0;
    int rc = time_job(&m, reps / 4 > 1 ? reps / 4 : 1, &t, err);
    char shape[32];
    snprintf(shape, sizeof shape, "ctx %d x 96 heads", ctx);
    if (!rc) row(out, "MLA attention, latent cache (absorbed)", shape, (double)(latb + wb), t, copy_bps);
    cudaFree(m.x), cudaFree(m.y), cudaFree(m.h), cudaFree(m.ys[0]), cudaFree(m.ys[1]);
    cudaFree(m.aux), cudaFree(w);
    return rc;
}

/* KDA per-head core at K3 widths (state read and written twice) and MLA attention over a
 * full 4096-position expanded KV cache (bytes: S or KV traffic). */
static int bench_mixers(FILE *out, int reps, double copy_bps, k3_err *err) {
    job j = {.kind = 3, .sets = 1, .H = 96, .D = 128};
    size_t P = 96 * 128, S = P * 128;
    CK(cudaMalloc((void **)&j.x, 6 * P * 4));
    CK(cudaMalloc((void **)&j.y, P * 4));
    CK(cudaMalloc((void **)&j.aux, S * 4));
    CK(k3k_fill_random(j.x, 6 * P * 4, 21, 0x3effffffu, 0));
    CK(k3k_fill_random(j.y, P * 4, 22, 0x3effffffu, 0));
    CK(k3k_fill_random(j.aux, S * 4, 23, 0x3effffffu, 0)); /* |S| < 0.5: stays bounded */
    double t = 0;
    int rc = time_job(&j, reps, &t, err);
    if (!rc) row(out, "KDA heads (norms, gate, delta rule)", "96 heads x 128^2 f32", 4.0 * S * 4, t, copy_bps);
    cudaFree(j.x);
    cudaFree(j.y);
    cudaFree(j.aux);
    if (rc) return rc;
    job m = {.kind = 4, .sets = 1, .H = 96, .t = 4095};
    size_t kvf = 96 * 128 + 64 + 96 * 128, kvb = (size_t)4096 * kvf * 4;
    CK(cudaMalloc((void **)&m.x, 96 * 192 * 4));
    CK(cudaMalloc((void **)&m.y, 96 * 128 * 4));
    CK(cudaMalloc((void **)&m.h, 96 * 4096 * 4));
    CK(cudaMalloc((void **)&m.aux, kvb));
    CK(k3k_fill_random(m.x, 96 * 192 * 4, 24, 0x3d7fffffu, 0));
    CK(k3k_fill_random(m.aux, kvb, 25, 0x3f7fffffu, 0));
    rc = time_job(&m, reps / 4 > 1 ? reps / 4 : 1, &t, err);
    if (!rc) row(out, "MLA attention, expanded KV cache", "ctx 4096 x 96 heads", (double)kvb, t, copy_bps);
    cudaFree(m.x);
    cudaFree(m.y);
    cudaFree(m.h);
    cudaFree(m.aux);
    static const int ctxs[] = {4096, 32768, 131072}; /* 131,072: 302 MB of latent rows */
    for (int i = 0; !rc && i < 3; i++) rc = bench_latent(out, ctxs[i], reps, copy_bps, err);
    return rc;
}

void k3_gpu_set_tuning(const k3_gpu_tuning *t) { k3k_set_tuning(!t->no_pdl, t->mx_schedule); }

int k3_gpu_bench_kernels(FILE *out, int reps, const k3_gpu_tuning *tuning, k3_gpu_bench *res,
                         k3_err *err) {
    const k3_gpu_tuning none = {0}, *t = tuning ? tuning : &none;
    struct cudaDeviceProp pr;
    char why[256] = "";
    if (k3_gpu_device_count(why, sizeof why) <= 0)
        return k3_fail(err, K3_ERR_DEVICE, "no CUDA device: %s", why);
    CK(cudaSetDevice(0));
    CK(cudaGetDeviceProperties(&pr, 0));
    *res = (k3_gpu_bench){0};
    fprintf(out, "kernels on %s (%d SMs, L2 %d MB), batch 1, median of %d batches of %d:\n",
            pr.name, pr.multiProcessorCount, pr.l2CacheSize >> 20, BATCHES, reps);
    fprintf(out, "%-34s %-22s %9s %9s %8s %7s\n", "kernel", "shape", "MB", "us", "GB/s",
            "of copy");
    int rc = copy_bandwidth(out, reps, &res->copy_bps, err);
    static const struct { const char *name; int64_t rows, cols; } shapes[] = {
        {"KDA q/k/v/g_proj; MLA g_proj", 12288, 7168}, {"KDA/MLA o_proj", 7168, 12288},
        {"dense gate/up_proj (layer 0)", 33792, 7168}, {"dense down_proj", 7168, 33792},
        {"shared experts gate/up", 6144, 7168}, {"shared experts down", 7168, 6144},
        {"latent down_proj", 3584, 7168}, {"latent up_proj", 7168, 3584},
        {"router", 896, 7168}, {"MLA q_a_proj", 1536, 7168}, {"MLA q_b_proj", 18432, 1536},
        {"MLA kv_a_proj", 576, 7168}, {"MLA kv_b_proj", 24576, 512},
        {"KDA f_a_proj", 128, 7168}, {"KDA f_b_proj", 12288, 128}, {"KDA b_proj", 96, 7168},
        {"lm_head (vocab 163840)", 163840, 7168}};
    const int experts_only = t->only_experts; /* profiling runs */
    for (size_t i = 0; !rc && !experts_only && i < sizeof shapes / sizeof *shapes; i++) {
        double s = 0;
        rc = bench_matvec(out, shapes[i].name, K3K_BF16, shapes[i].rows, shapes[i].cols, reps,
                          res->copy_bps, t->mx_scan, &s, err);
        if (i == 0) res->bf16_bps = 2.0 * 12288 * 7168 / s;
        if (i + 1 == sizeof shapes / sizeof *shapes) res->lm_head_s = s;
    }
    /* the layers' input projections as the decode launches them: one launch each */
    static const int64_t kda_in[6] = {12288, 12288, 12288, 12288, 128, 96},
                         mla_in[3] = {1536, 576, 12288}, moe_in[3] = {3584, 6144, 6144};
    if (!rc && !experts_only)
        rc = bench_multi(out, "KDA q,k,v,g,f_a,b_proj (one launch)", kda_in, 6, 7168, reps,
                         res->copy_bps, err);
    if (!rc && !experts_only)
        rc = bench_multi(out, "MLA q_a,kv_a,g_proj (one launch)", mla_in, 3, 7168, reps,
                         res->copy_bps, err);
    if (!rc && !experts_only)
        rc = bench_multi(out, "MoE latent down, shared gate,up (one)", moe_in, 3, 7168, reps,
                         res->copy_bps, err);
    double s = 0;
    if (!rc && !experts_only) rc = bench_matvec(out, "int8 spine (not exact) q_proj", K3K_I8, 12288, 7168, reps,
                               res->copy_bps, t->mx_scan, &s, err);
    if (!rc) rc = bench_experts(out, reps, res->copy_bps, t, &res->mxfp4_bps, err);
    if (!rc && !experts_only) rc = bench_mixers(out, reps, res->copy_bps, err);
    return rc;
}
