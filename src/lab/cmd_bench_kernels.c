/* cmd_bench_kernels.c — `k3-lab bench kernels`: each product kernel at K3's real shapes, weight
 * bytes per second beside the memory bandwidth of a large copy measured in the same run, one
 * thread and all threads, on every kernel path this CPU runs. `k3-lab bench decode`: seconds per
 * token per layer kind on a real-width checkpoint, extrapolated to K3's 93 layers. */
#include <cblas.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../cli/model_dir.h"
#include "../cli/opts.h"
#include "../engine/k3.h"
#include "../engine/k3_lab.h"
#include "../format/safetensors.h"
#include "../kernels/kernels.h"
#include "lab.h"
#include "../util/clock.h"
#include "../util/parse.h"

/* ---- k3-lab bench kernels ----------------------------------------------------------------- */

typedef struct kernels_args {
    double seconds;
    const char *only; /* --only TEXT */
} kernels_args;

#define KARG(f) K3_OPT_CMD(kernels_args, f), .field = #f
static const k3_opt kernels_rows[] = {
    {.flag = "--seconds", KARG(seconds), .type = K3_OPT_DOUBLE, .lo = 0, .hi = 1e4,
     .flags = K3_OPTF_LO_OPEN, .def = "0.5", .meta = "S",
     .help = "time each measurement for about S seconds"},
    {.flag = "--only", KARG(only), .type = K3_OPT_STR, .flags = K3_OPTF_NONEMPTY, .meta = "TEXT",
     .help = "only the kernels whose name contains TEXT (e.g. MXFP4)"},
};

static const k3_cli_command kernels_cmd = {
    .name = "bench kernels", .prog = "k3-lab",
    .usage =
        "usage: k3-lab bench kernels [--kernels NAME] [--threads N] [--seconds S] [--only TEXT]\n"
        "\n"
        "Times every product kernel at K3's shapes (out <- in): BF16 7168->12288, 7168->33792,\n"
        "lm_head 7168->163840, F32 7168->12288, the int8 spine (alone and with --approx)\n"
        "7168->12288, the lossless spine (k3 pack --lossless: a trained-like matrix, normal\n"
        "weights with 0.1%% outliers, encoded as k3 pack encodes it) 7168->12288 and\n"
        "7168->33792, MXFP4 experts 3584->3072 and 3072->3584\n"
        "(cycling through enough experts to miss the caches), one small MXFP4 matrix read\n"
        "from cache (the decode's own speed), and the batched forms for 2, 4 and 32 vectors.\n"
        "Prints weight GB/s beside the bandwidth of a large memcpy measured in the\n"
        "same run (bytes read + bytes written per second, STREAM's convention), for one thread\n"
        "and for all threads (--threads), and matrix rows per second (the lossless rows against\n"
        "BF16's: the same rows in 25% fewer bytes). Uses about 4.5 GB of memory. Every path this\n"
        "CPU runs unless --kernels names one.\n"
        "Then the batched products at 64 rows against the peak of their own instruction mix,\n"
        "timed in registers and L1 in the same run (k3_kernels_mix), beside the FMA peak and\n"
        "OpenBLAS's sgemm on the same shapes (f32 weights; the practical limit).\n",
    .rows = kernels_rows, .n_rows = sizeof kernels_rows / sizeof *kernels_rows,
    .groups = K3_OG_THREADS | K3_OG_KERNELS,
};

/* Pseudo-random bytes for weights (BF16 exponents kept in range so no value is inf/NaN). */
static void fill(void *p, size_t bytes, int bf16) {
    const uint64_t s = 0x9e3779b97f4a7c15ull;
    uint8_t *b = p;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < bytes / 8; i++) {
        uint64_t z = (s + i) * 0xbf58476d1ce4e5b9ull;
        z ^= z >> 31;
        if (bf16) z = (z & 0x807f807f807f807full) | 0x3c003c003c003c00ull;
        memcpy(b + i * 8, &z, 8);
    }
}

double k3_lab_copy_bw(uint8_t *dst, const uint8_t *src, size_t bytes) {
    double best = 1e30;
    for (int it = 0; it < 3; it++) {
        double t = k3_now_s();
#pragma omp parallel
        {
            size_t nt = (size_t)omp_get_num_threads(), i = (size_t)omp_get_thread_num();
            size_t c = bytes / nt / 64 * 64, off = i * c, n = i + 1 == nt ? bytes - off : c;
            memcpy(dst + off, src + off, n);
        }
        t = k3_now_s() - t;
        if (t < best) best = t;
    }
    return 2.0 * (double)bytes / best;
}

double k3_lab_copy_rate(size_t bytes) {
    uint8_t *src = malloc(bytes), *dst = malloc(bytes);
    double bw = 0;
    if (src && dst) {
        memset(src, 1, bytes), memset(dst, 2, bytes);
        bw = k3_lab_copy_bw(dst, src, bytes);
    }
    free(src), free(dst);
    return bw;
}

typedef struct kcase {
    const char *name;
    int dtype;       /* K3_DT_BF16, K3_DT_F32, K3_DT_I8 / I8_Q8 (int8 spine), -1 for MXFP4 */
    int64_t rows, cols;
    int n;           /* vectors per call */
    int copies;      /* distinct matrices cycled through (experts) */
    int group;       /* > 1: this many experts per call of k3_matvec_mxfp4_many */
} kcase;

static const kcase CASES[] = {
    {"BF16 7168->12288", K3_DT_BF16, 12288, 7168, 1, 1, 1},
    {"BF16 7168->33792", K3_DT_BF16, 33792, 7168, 1, 1, 1},
    {"BF16 lm_head 7168->163840", K3_DT_BF16, 163840, 7168, 1, 1, 1},
    {"F32 7168->12288", K3_DT_F32, 12288, 7168, 1, 1, 1},
    {"int8 spine 7168->12288", K3_DT_I8, 12288, 7168, 1, 1, 1},
    {"int8 spine --approx 7168->12288", K3_DT_I8_Q8, 12288, 7168, 1, 1, 1},
    {"lossless spine 7168->12288", K3_DT_BF16LX, 12288, 7168, 1, 1, 1},
    {"lossless spine 7168->33792", K3_DT_BF16LX, 33792, 7168, 1, 1, 1},
    {"MXFP4 expert 3584->3072", -1, 3072, 3584, 1, 48, 1},
    {"MXFP4 expert 3072->3584", -1, 3584, 3072, 1, 48, 1},
    {"MXFP4 16 experts 3584->3072, one call", -1, 3072, 3584, 1, 48, 16},
    /* 192 rows, 0.36 MB: the same matrix every call, so it is read from L2 (the decode's
     * own speed, without memory) */
    {"MXFP4 192x3584, in cache", -1, 192, 3584, 1, 1, 1},
    /* small batches: chunked prefill's per-expert token counts, speculative verification */
    {"BF16 7168->12288 x2", K3_DT_BF16, 12288, 7168, 2, 1, 1},
    {"BF16 7168->12288 x4", K3_DT_BF16, 12288, 7168, 4, 1, 1},
    {"lossless spine 7168->12288 x4", K3_DT_BF16LX, 12288, 7168, 4, 1, 1},
    {"MXFP4 expert 3584->3072 x2", -1, 3072, 3584, 2, 48, 1},
    {"MXFP4 expert 3584->3072 x4", -1, 3072, 3584, 4, 48, 1},
    {"BF16 7168->12288 x32", K3_DT_BF16, 12288, 7168, 32, 1, 1},
    {"lossless spine 7168->12288 x32", K3_DT_BF16LX, 12288, 7168, 32, 1, 1},
    {"MXFP4 expert 3584->3072 x32", -1, 3072, 3584, 32, 48, 1},
    /* prompt rows at the GEMM micro-kernels' size (gemm_table compares them with their peak) */
    {"BF16 7168->12288 x64", K3_DT_BF16, 12288, 7168, 64, 1, 1},
    {"MXFP4 expert 3584->3072 x64", -1, 3072, 3584, 64, 48, 1},
};
#define CASE_BF16_X64 (sizeof CASES / sizeof CASES[0] - 2)
#define CASE_MXFP4_X64 (sizeof CASES / sizeof CASES[0] - 1)

typedef struct bufs {
    void *w;          /* largest BF16 / F32 / int8 weight matrix */
    size_t w_bytes;
    uint8_t *mx;      /* the MXFP4 experts (copies included), fill_mxfp4's bytes */
    size_t mx_bytes;
    float *x, *y;
    k3_mat lx[2];     /* the lossless matrices: 12288 and 33792 rows (lx_build) */
} bufs;

/* A trained-like BF16 matrix [rows, 7168] encoded as k3 pack --lossless does: weights
 * 0.02 x (sum of 4 uniforms - 2) (near normal), 0.1% of them times 2^4..2^11 (outliers that
 * become escapes); NULL data when out of memory. */
static k3_mat lx_build(int64_t rows, int64_t cols) {
    k3_mat m = {.dtype = K3_DT_BF16LX, .rows = rows, .cols = cols};
    uint16_t *w = malloc((size_t)(rows * cols) * 2);
    uint8_t *data = malloc((size_t)rows * k3_lx_row_bytes(cols));
    uint32_t *esc = malloc((size_t)(rows + 1 + rows * cols / 64) * 4);
    uint64_t hist[256] = {0}, s = 0x2545f4914f6cdd1dull;
    uint8_t code_of[256];
    if (!w || !data || !esc) {
        free(w), free(data), free(esc);
        return m;
    }
    for (int64_t i = 0; i < rows * cols; i++) {
        float u = 0;
        for (int k = 0; k < 4; k++) s ^= s << 13, s ^= s >> 7, s ^= s << 17, u += (float)(s >> 40) / 16777216.0f;
        float v = 0.02f * (u - 2.0f);
        if (s % 1000 == 0) v *= (float)(16 << (s >> 20) % 8);
        uint32_t bits;
        memcpy(&bits, &v, 4);
        w[i] = (uint16_t)(bits >> 16);
        hist[w[i] >> 8]++;
    }
    k3_lx_table(hist, m.xtab, code_of);
    uint32_t n = 0;
    for (int64_t r = 0; r < rows; r++) {
        esc[r] = n;
        if (n + (uint64_t)cols > (uint64_t)(rows * cols / 64)) break; /* never, at 0.1% */
        n += (uint32_t)k3_lx_encode_row(w + r * cols, cols, code_of,
                                        data + (uint64_t)r * k3_lx_row_bytes(cols),
                                        esc + rows + 1 + n);
    }
    esc[rows] = n;
    free(w);
    m.data = data, m.esc = esc, m.n_esc = n;
    return m;
}

static const k3_mat *lx_of(const bufs *b, int64_t rows) { return &b->lx[rows != 12288]; }

/* Every byte 118..134: as E8M0 scales 2^-9..2^7 (a real expert's range; the BF16 pattern's
 * bytes would make scales down to 2^-127, whose subnormal products slow both old and new
 * kernels alike), as packed codes any E2M1 pair. */
static void fill_mxfp4(uint8_t *p, size_t bytes) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)(118 + (i * 2654435761u >> 7) % 17);
}

static size_t case_bytes(const kcase *c, const bufs *b) {
    if (c->dtype == K3_DT_BF16LX) {
        const k3_mat *m = lx_of(b, c->rows);
        return (size_t)((uint64_t)c->rows * k3_lx_row_bytes(c->cols) + 4 * ((uint64_t)c->rows + 1 + m->n_esc));
    }
    if (c->dtype < 0) return (size_t)(c->rows * c->cols / 2 + c->rows * c->cols / 32);
    if (c->dtype == K3_DT_I8 || c->dtype == K3_DT_I8_Q8) return (size_t)(c->rows * c->cols);
    return (size_t)(c->rows * c->cols) * (c->dtype == K3_DT_BF16 ? 2 : 4);
}

/* CPU seconds this process has used (every thread). */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per call of case c on path k (after one warm-up call); *cpu (if not NULL) the
 * process's CPU seconds per call. */
static double time_case(const k3_kernels *k, const kcase *c, const bufs *b, double seconds,
                        double *cpu) {
    size_t one = case_bytes(c, b);
    int reps = 0, which = 0, group = c->group > 1 ? c->group : 1;
    double t0 = 0, t = 0;
    k3_mxfp4 ws[16];
    const float *xs[16];
    float *ys[16];
    double c0 = 0;
    for (int it = -1; reps < 2 || t < seconds; it++) {
        if (it == 0) t0 = k3_now_s(), c0 = cpu_s();
        for (int g = 0; g < group; g++) {
            uint8_t *base = (c->dtype < 0 ? b->mx : (uint8_t *)b->w) + (size_t)which * one;
            which = (which + 1) % c->copies;
            ws[g] = (k3_mxfp4){base, base + c->rows * c->cols / 2, c->rows, c->cols};
            xs[g] = b->x, ys[g] = b->y + (size_t)g * (size_t)c->rows;
        }
        if (group > 1) {
            k3_matvec_mxfp4_many(k, group, ws, xs, ys);
        } else if (c->dtype < 0) {
            k3_matmul_mxfp4(k, &ws[0], b->x, c->n, b->y);
        } else if (c->dtype == K3_DT_BF16LX) {
            k3_matmul(k, lx_of(b, c->rows), b->x, c->n, b->y);
        } else {
            k3_mat w = {.data = ws[0].packed, .dtype = c->dtype, .rows = c->rows, .cols = c->cols,
                        .scale = b->x}; /* int8: any finite per-row scales do for timing */
            k3_matmul(k, &w, b->x, c->n, b->y);
        }
        if (it >= 0) reps++, t = k3_now_s() - t0;
    }
    if (cpu) *cpu = (cpu_s() - c0) / reps;
    return t / reps;
}

/* ---- k3-lab bench kernels: the batched products against their peaks ------------------- */

/* Multiply-adds per second of mix `which` on path k with every thread of the team running
 * it for about `seconds` (best of 3 rounds); *per_cpu the same per CPU-second of a thread
 * (what each thread does while it runs: on a busy machine the wall-clock rate also counts the
 * time other processes held the cores). */
static double mix_rate(const k3_kernels *k, int which, double seconds, double *per_cpu) {
    int64_t reps = 2000;
    double t = 0;
    for (;;) { /* grow reps until one round takes at least seconds / 3 */
        t = k3_now_s();
        k3_kernels_mix(k, which, reps);
        t = k3_now_s() - t;
        if (t >= seconds / 3 || reps > ((int64_t)1 << 40)) break;
        reps = t > 1e-4 ? (int64_t)((double)reps * seconds / 3 / t) + 1 : reps * 16;
    }
    double best = 0;
    *per_cpu = 0;
    for (int it = 0; it < 3; it++) {
        int64_t macs = 0;
        double t0 = k3_now_s(), c0 = cpu_s();
#pragma omp parallel reduction(+ : macs)
        macs += k3_kernels_mix(k, which, reps);
        double r = (double)macs / (k3_now_s() - t0), rc = (double)macs / (cpu_s() - c0);
        if (r > best) best = r;
        if (rc > *per_cpu) *per_cpu = rc;
    }
    return best;
}

/* Seconds per cblas_sgemm of c's shape: y[n][rows] = x[n][cols] · w[rows][cols]ᵀ in f32. */
static double sgemm_time(const kcase *c, const float *w, const float *x, float *y, double seconds) {
    int reps = 0;
    double t0 = 0, t = 0;
    for (int it = -1; reps < 2 || t < seconds; it++) {
        if (it == 0) t0 = k3_now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c->n, (int)c->rows, (int)c->cols, 1.0f,
                    x, (int)c->cols, w, (int)c->cols, 0.0f, y, (int)c->rows);
        if (it >= 0) reps++, t = k3_now_s() - t0;
    }
    return t / reps;
}

/* The x64 cases on each path beside the peak of their instruction mix and the FMA peak, and
 * OpenBLAS's sgemm on the same shapes. */
static void gemm_table(const k3_kernels *const *paths, int np, const int *tcounts, const bufs *b,
                       double seconds) {
    static const size_t CS[2] = {CASE_BF16_X64, CASE_MXFP4_X64};
    static const int MIX[2] = {K3_MIX_GEMM_BF16, K3_MIX_GEMM_MXFP4};
    printf("\n| product, 64 rows | path | threads | GMAC/s | mix peak GMAC/s | %% of mix peak | "
           "FMA peak GMAC/s | %% of FMA peak | per CPU-second: %% of mix, %% of FMA |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    for (int p = 0; p < np; p++)
        for (int t = 0; t < 2; t++) {
            omp_set_num_threads(tcounts[t]);
            double fma_c, fma = mix_rate(paths[p], K3_MIX_FMA, seconds, &fma_c);
            for (int i = 0; i < 2; i++) {
                const kcase *c = &CASES[CS[i]];
                double mix_c, mix = mix_rate(paths[p], MIX[i], seconds, &mix_c), cpu = 0;
                double work = (double)(c->rows * c->cols * c->n);
                double g = work / time_case(paths[p], c, b, seconds, &cpu), g_c = work / cpu;
                if (fma <= 0) {
                    printf("| %s | %s | %d | %.2f | - | - | - | - | - |\n", c->name,
                           k3_kernels_name(paths[p]), tcounts[t], g / 1e9);
                    continue;
                }
                printf("| %s | %s | %d | %.2f | %.2f | %.0f%% | %.2f | %.0f%% | %.0f%%, %.0f%% |\n",
                       c->name, k3_kernels_name(paths[p]), tcounts[t], g / 1e9, mix / 1e9,
                       100 * g / mix, fma / 1e9, 100 * g / fma, 100 * g_c / mix_c,
                       100 * g_c / fma_c);
                fflush(stdout);
            }
        }
    /* OpenBLAS on f32 weights of the same shapes (BF16 / MXFP4 widened; a yardstick only) */
    int64_t most = CASES[CS[0]].rows * CASES[CS[0]].cols;
    float *w = malloc((size_t)most * sizeof *w);
    if (!w) {
        fprintf(stderr, "k3-lab bench kernels: out of memory for the sgemm weights\n");
        return;
    }
    for (int64_t i = 0; i < most; i++) w[i] = b->x[i % (32 * 7168)] * 0.01f;
    printf("\n| OpenBLAS sgemm (f32 weights) | threads | GMAC/s |\n|---|---|---|\n");
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < 2; t++) {
            const kcase *c = &CASES[CS[i]];
            openblas_set_num_threads(tcounts[t]);
            double s = sgemm_time(c, w, b->x, b->y, seconds);
            printf("| %s | %d | %.2f |\n", c->name, tcounts[t],
                   (double)(c->rows * c->cols * c->n) / s / 1e9);
            fflush(stdout);
        }
    free(w);
}

static int bench_kernels(int argc, char **argv) {
    kernels_args a = {0};
    k3_engine_opts eo;
    k3_opts_parsed parsed;
    k3_opt_targets t = {.eo = &eo, .cmd = &a};
    int prc = k3_opts_parse(&kernels_cmd, argc, argv, &t, &parsed);
    if (prc) return prc < 0 ? 0 : prc;
    const char *only = eo.kernels, *filter = a.only;
    int threads = eo.threads ? eo.threads : omp_get_max_threads();
    double seconds = a.seconds;
    const k3_kernels *paths[8];
    int np = k3_kernels_available(paths, 8);
    if (only) {
        k3_err err = {0};
        if (k3_kernels_select(only, &paths[0], &err)) {
            fprintf(stderr, "k3-lab bench kernels: %s\n", err.msg);
            return err.code;
        }
        np = 1;
    }
    bufs b = {0};
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        if (CASES[i].dtype == K3_DT_BF16LX) continue; /* its own buffers (lx_build) */
        size_t s = case_bytes(&CASES[i], &b) * (size_t)CASES[i].copies;
        size_t *need = CASES[i].dtype < 0 ? &b.mx_bytes : &b.w_bytes;
        if (s > *need) *need = s;
    }
    size_t copy_bytes = (size_t)1 << 30;
    uint8_t *src = malloc(copy_bytes), *dst = malloc(copy_bytes);
    b.w = malloc(b.w_bytes);
    b.mx = malloc(b.mx_bytes);
    b.x = malloc(32 * 163840 * sizeof(float));
    b.y = malloc(32 * 163840 * sizeof(float));
    if (!src || !dst || !b.w || !b.mx || !b.x || !b.y) {
        fprintf(stderr, "k3-lab bench kernels: out of memory (needs about %.1f GB)\n",
                (2.0 * copy_bytes + b.w_bytes + b.mx_bytes) / 1e9);
        free(src), free(dst), free(b.w), free(b.mx), free(b.x), free(b.y);
        return K3_ERR_GENERIC;
    }
    fill(src, copy_bytes, 0), fill(dst, copy_bytes, 0), fill(b.w, b.w_bytes, 1);
    fill_mxfp4(b.mx, b.mx_bytes);
    b.lx[0] = lx_build(12288, 7168), b.lx[1] = lx_build(33792, 7168);
    if (!b.lx[0].data || !b.lx[1].data) {
        fprintf(stderr, "k3-lab bench kernels: out of memory (the lossless matrices)\n");
        return K3_ERR_GENERIC;
    }
    printf("lossless matrices: %.4f%% and %.4f%% of the weights escaped\n",
           100.0 * b.lx[0].n_esc / (12288.0 * 7168), 100.0 * b.lx[1].n_esc / (33792.0 * 7168));
    for (int64_t i = 0; i < 32 * 163840; i++) b.x[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;

    const int tcounts[2] = {1, threads};
    double bw[2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(tcounts[t]);
        bw[t] = k3_lab_copy_bw(dst, src, copy_bytes);
    }
    printf("memory bandwidth (1 GiB memcpy, read + written bytes/s): %.1f GB/s with 1 thread, "
           "%.1f GB/s with %d threads\n\n", bw[0] / 1e9, bw[1] / 1e9, threads);
    printf("| kernel | path | threads | ms/call | weight GB/s | %% of copy BW | GMAC/s | Mrows/s |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
        for (int p = 0; p < np && (!filter || strstr(CASES[i].name, filter)); p++)
            for (int t = 0; t < 2; t++) {
                const kcase *c = &CASES[i];
                omp_set_num_threads(tcounts[t]);
                double s = time_case(paths[p], c, &b, seconds, NULL);
                double one = (double)case_bytes(c, &b), g = c->group > 1 ? c->group : 1;
                printf("| %s | %s | %d | %.3f | %.2f | %.0f%% | %.2f | %.1f |\n", c->name,
                       k3_kernels_name(paths[p]), tcounts[t], s * 1e3, one * g / s / 1e9,
                       100.0 * one * g / s / bw[t],
                       g * (double)(c->rows * c->cols * c->n) / s / 1e9,
                       g * (double)c->rows / s / 1e6);
                fflush(stdout);
            }
    if (!filter || strstr("x64 GEMM", filter)) gemm_table(paths, np, tcounts, &b, seconds);
    free(src), free(dst), free(b.w), free(b.mx), free(b.x), free(b.y);
    for (int i = 0; i < 2; i++) free((void *)b.lx[i].data), free((void *)b.lx[i].esc);
    return 0;
}

/* ---- k3-lab bench decode ------------------------------------------------------------------ */

/* K3's layer counts (spec §3, config table): 93 layers, MLA at the 24 one-based positions of
 * full_attn_layers, KDA elsewhere; layer 0 dense, the other 92 MoE; vocabulary 163840. */
enum { K3_LAYERS = 93, K3_MLA = 24, K3_KDA = 69, K3_DENSE = 1, K3_MOE = 92, K3_VOCAB = 163840 };

/* Whether c has K3's per-layer widths (spec §3, config table: every dimension a layer's time
 * depends on; the expert count, layer count and vocabulary may differ, the extrapolation
 * scales those). If not, writes the first mismatches ("hidden_size 64 (K3: 7168), ...") to
 * why: the extrapolated floor would then be meaningless. */
static int k3_wide(const k3_config *c, char *why, size_t cap) {
    const struct { const char *name; int here, k3; } f[] = {
        {"hidden_size", c->hidden_size, 7168},
        {"intermediate_size", c->intermediate_size, 33792},
        {"num_attention_heads", c->num_attention_heads, 96},
        {"q_lora_rank", c->q_lora_rank, 1536},
        {"kv_lora_rank", c->kv_lora_rank, 512},
        {"qk_nope_head_dim", c->qk_nope_head_dim, 128},
        {"qk_rope_head_dim", c->qk_rope_head_dim, 64},
        {"v_head_dim", c->v_head_dim, 128},
        {"kda num_heads", c->kda_num_heads, 96},
        {"kda head_dim", c->kda_head_dim, 128},
        {"num_experts_per_token", c->num_experts_per_token, 16},
        {"num_shared_experts", c->num_shared_experts, 2},
        {"moe_intermediate_size", c->moe_intermediate_size, 3072},
        {"routed_expert_hidden_size", c->routed_expert_hidden_size, 3584},
    };
    size_t len = 0;
    int bad = 0;
    why[0] = 0;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (f[i].here == f[i].k3) continue;
        if (bad++ < 3 && len < cap)
            len += (size_t)snprintf(why + len, cap - len, "%s%s %d (K3: %d)", bad > 1 ? ", " : "",
                                    f[i].name, f[i].here, f[i].k3);
    }
    if (bad > 3 && len < cap) snprintf(why + len, cap - len, " and %d more", bad - 3);
    return !bad;
}

typedef struct decode_args {
    int tokens;
} decode_args;

static const k3_opt_choice decode_spines[] = {
    {"bf16", K3_SPINE_BF16}, {"lossless", K3_SPINE_LOSSLESS}, {"int8", K3_SPINE_INT8},
    {NULL, 0}};

static const k3_opt decode_rows[] = {
    {.flag = "--tokens", K3_OPT_CMD(decode_args, tokens), .field = "tokens", .type = K3_OPT_INT,
     .lo = 1, .hi = 1 << 20, .def = "10", .meta = "N", .help = "decode steps"},
    {.flag = "--spine", K3_OPT_ENG(spine), .type = K3_OPT_CHOICE, .choices = decode_spines,
     .def = "bf16", .meta = "MODE",
     .help = "bf16, lossless (k3 pack --lossless: exact) or int8 (the packed spine, NOT\n"
             "exact; k3 pack)"},
};

static const k3_cli_command decode_cmd = {
    .name = "bench decode", .prog = "k3-lab",
    .usage =
        "usage: k3-lab bench decode [MODEL_DIR] [--tokens N] [--threads N] [--spine-gb G]\n"
        "\n"
        "Runs N decode steps (logits every step) on MODEL_DIR with every expert used in place\n"
        "from the mapped shards (for a real-width checkpoint that fits in RAM, such as k3-wide\n"
        "from make test-wide) and times each layer's token mixer (KDA or MLA) and FFN (dense or\n"
        "MoE) through the trace hook. Prints seconds per token per layer kind and the compute\n"
        "floor of K3's 93 layers (69 KDA + 24 MLA mixers, 1 dense + 92 MoE FFNs, the rest per\n"
        "layer, lm_head scaled to 163840 rows); the floor needs a model at K3's per-layer\n"
        "widths (hidden 7168, top-16 experts, ...: k3-wide, or k3-lab synth --real --top-k 16),\n"
        "and is marked not applicable for any other. The first 2 steps are warm-up and not\n"
        "counted. The spine is used in place unless --spine-gb gives a budget; then it also\n"
        "prints the spine bytes streamed per token, the time passes waited for them, and the\n"
        "disk's sequential O_DIRECT read bandwidth measured in the same run (up to 2 GB of the\n"
        "largest shard) with the floor it sets.\n",
    .rows = decode_rows, .n_rows = sizeof decode_rows / sizeof *decode_rows,
    .groups = K3_OG_THREADS | K3_OG_BUDGET, .max_positional = 1,
};

#define MAX_BENCH_LAYERS 256
typedef struct layer_clock {
    double t_mix, t_ffn, t_final;       /* start times of the current phase */
    double mixer_s[MAX_BENCH_LAYERS], ffn_s[MAX_BENCH_LAYERS], head_start;
    int counting;
} layer_clock;

static void on_vector(void *user, int pos, int layer, enum k3_trace_point pt, const float *x,
                      int n) {
    (void)pos, (void)x, (void)n;
    layer_clock *c = user;
    double t = k3_now_s();
    if (layer >= MAX_BENCH_LAYERS) return;
    if (pt == K3_TRACE_ATTN_IN) c->t_mix = t;
    if (pt == K3_TRACE_ATTN_OUT && c->counting) c->mixer_s[layer] += t - c->t_mix;
    if (pt == K3_TRACE_MLP_IN) c->t_ffn = t;
    if (pt == K3_TRACE_MLP_OUT && c->counting) c->ffn_s[layer] += t - c->t_ffn;
    if (pt == K3_TRACE_FINAL_NORMED) c->head_start = t;
}

/* Sequential O_DIRECT read bandwidth (bytes/s) of up to 2 GB of the largest .safetensors in
 * dir, 64 MB per pread (the spine stream's request size: on a virtual disk the request size
 * changes the figure more than twofold); 0 when it cannot be measured. */
static double disk_read_bw(const char *dir) {
    char best[4096] = "", path[4096];
    off_t best_size = 0;
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        struct stat st;
        size_t n = strlen(de->d_name);
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (n > 12 && !strcmp(de->d_name + n - 12, ".safetensors") && !stat(path, &st) &&
            st.st_size > best_size)
            best_size = st.st_size, snprintf(best, sizeof best, "%s", path);
    }
    if (d) closedir(d);
    int fd = best[0] ? open(best, O_RDONLY | O_DIRECT) : -1;
    size_t chunk = (size_t)64 << 20;
    void *buf = NULL;
    if (fd < 0 || posix_memalign(&buf, 4096, chunk)) {
        if (fd >= 0) close(fd);
        return 0;
    }
    uint64_t got = 0, limit = (uint64_t)2 << 30;
    double t = k3_now_s();
    ssize_t r;
    while (got < limit && (r = pread(fd, buf, chunk, (off_t)got)) > 0) got += (uint64_t)r;
    t = k3_now_s() - t;
    close(fd);
    free(buf);
    return t > 0 ? (double)got / t : 0;
}

/* With a spine budget: what streaming cost per counted token (st0: before them), beside the
 * disk's bandwidth measured before the load (bw0) and now (its drift shows other work). */
static void spine_report(const k3_engine *e, const k3_spine_stats *st0, int tokens,
                         double s_per_token, const char *dir, double bw0) {
    k3_spine_stats st;
    k3_engine_spine_stats(e, &st);
    if (!st.budgeted) return;
    double bytes = (double)(st.bytes_read - st0->bytes_read) / tokens;
    double wait = (st.wait_s - st0->wait_s) / tokens, read = (st.read_s - st0->read_s) / tokens;
    double bw1 = disk_read_bw(dir), bw = bw0 > 0 && bw1 > 0 ? (bw0 + bw1) / 2 : bw1;
    char plan[K3_DESCRIBE_CAP], mode[K3_DESCRIBE_CAP];
    k3_engine_describe(e, K3_DESCRIBE_SPINE_PLAN, plan, sizeof plan);
    k3_engine_describe(e, K3_DESCRIBE_SPINE, mode, sizeof mode);
    printf("\nspine (%s, %s): %d of %d layers streamed%s, %.3f GB read per token (%s), "
           "reading %.3f s/token, passes waited %.3f s/token; decode %.3f s/token\n",
           k3_engine_spine_int8(e) ? "int8" : strstr(mode, "lossless") ? "lossless" : "bf16", plan,
           st.streamed_layers, st.n_layers, st.head_resident ? "" : " + lm_head", bytes / 1e9,
           st.direct ? "O_DIRECT" : "buffered", read, wait, s_per_token);
    if (bw > 0)
        printf("disk: sequential O_DIRECT pread of 64 MB requests %.3f GB/s before, %.3f GB/s "
               "after (mean %.3f): the stream's floor %.3f s/token; the stream read at %.3f "
               "GB/s\n", bw0 / 1e9, bw1 / 1e9, bw / 1e9, bytes / bw,
               read > 0 ? bytes / read / 1e9 : 0);
}

static int bench_decode(int argc, char **argv) {
    decode_args a = {0};
    k3_engine_opts eo;
    k3_opts_parsed parsed;
    k3_opt_targets t = {.eo = &eo, .cmd = &a};
    int rc = k3_opts_parse(&decode_cmd, argc, argv, &t, &parsed);
    if (rc) return rc < 0 ? 0 : rc;
    const char *dir;
    if ((rc = k3_model_arg("k3-lab bench decode", parsed.n_positional ? parsed.positional[0]
                           : NULL, &dir)))
        return rc;
    int tokens = a.tokens;
    k3_err err = {0};
    k3_engine *e = NULL;
    k3_session *s = NULL;
    float *logits = NULL;
    static layer_clock clk;
    /* without --spine-gb (or K3_SPINE_GB) the spine is used in place whatever the plan (the
     * lab's control, k3_lab.h) */
    int budget = k3_opts_given(&decode_cmd, &parsed, "--spine-gb") != 0;
    k3_lab_opts lab = k3_lab_opts_default();
    lab.spine_in_place = !budget;
    eo.lab = &lab;
    eo.verbose = 1, eo.experts_in_place = 1;
    k3_spine_stats st0 = {0};
    double bw0 = budget ? disk_read_bw(dir) : 0;
    if ((rc = k3_engine_load(dir, &eo, &e, &err))) goto done;
    const k3_config *c = k3_engine_config(e);
    if (c->num_hidden_layers > MAX_BENCH_LAYERS) {
        rc = k3_fail(&err, K3_ERR_INPUT, "more than %d layers", MAX_BENCH_LAYERS);
        goto done;
    }
    if ((rc = k3_session_new(e, tokens + 8, &s, &err))) goto done;
    if (!(logits = malloc((size_t)c->vocab_size * sizeof *logits))) {
        rc = k3_fail(&err, K3_ERR_GENERIC, "out of memory");
        goto done;
    }
    k3_trace tr = {.user = &clk, .on_vector = on_vector};
    k3_session_set_trace(s, &tr);
    double total = 0, head = 0;
    for (int i = 0; i < tokens + 2 && !rc; i++) {
        clk.counting = i >= 2;
        if (i == 2) k3_engine_spine_stats(e, &st0);
        double t0 = k3_now_s();
        rc = k3_session_step(s, (int32_t)((i * 7919 + 11) % c->vocab_size), logits, &err);
        double t1 = k3_now_s();
        if (clk.counting) total += t1 - t0, head += t1 - clk.head_start;
    }
    if (rc) goto done;
    /* per layer kind: mean seconds per token per layer */
    double kda = 0, mla = 0, dense = 0, moe = 0, layers_s = 0;
    int n_kda = 0, n_mla = 0, n_dense = 0, n_moe = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        int is_mla = c->layer_is_mla[l], is_moe = c->layer_is_moe[l];
        double m = clk.mixer_s[l] / tokens, f = clk.ffn_s[l] / tokens;
        if (is_mla) mla += m, n_mla++; else kda += m, n_kda++;
        if (is_moe) moe += f, n_moe++; else dense += f, n_dense++;
        layers_s += m + f;
    }
    total /= tokens, head /= tokens;
    double rest = (total - layers_s - head) / c->num_hidden_layers; /* AttnRes, norms, adds */
#define MEAN(sum, n) ((n) ? (sum) / (n) : 0.0)
    printf("\n%s: %d layers, %d decode steps at positions 2..%d, %d threads\n\n", dir,
           c->num_hidden_layers, tokens, tokens + 1, omp_get_max_threads());
    char why[256];
    int wide = k3_wide(c, why, sizeof why);
    printf("| part | layers here | s/token/layer | K3 layers | K3 s/token |\n");
    printf("|---|---|---|---|---|\n");
    const struct { const char *name; int here; double s; int k3; } row[] = {
        {"KDA mixer", n_kda, MEAN(kda, n_kda), K3_KDA},
        {"MLA mixer", n_mla, MEAN(mla, n_mla), K3_MLA},
        {"dense FFN", n_dense, MEAN(dense, n_dense), K3_DENSE},
        {"MoE FFN", n_moe, MEAN(moe, n_moe), K3_MOE},
        {"AttnRes, norms, adds", c->num_hidden_layers, rest, K3_LAYERS},
    };
    double head_k3 = head * K3_VOCAB / c->vocab_size, floor_s = head_k3;
    for (size_t r = 0; r < sizeof row / sizeof row[0]; r++) {
        floor_s += row[r].s * row[r].k3;
        if (wide)
            printf("| %s | %d | %.4f | %d | %.3f |\n", row[r].name, row[r].here, row[r].s,
                   row[r].k3, row[r].s * row[r].k3);
        else
            printf("| %s | %d | %.4f | %d | n/a |\n", row[r].name, row[r].here, row[r].s,
                   row[r].k3);
    }
    if (wide)
        printf("| lm_head (%d rows here) | - | %.4f | 163840 rows | %.3f |\n", c->vocab_size,
               head, head_k3);
    else
        printf("| lm_head (%d rows here) | - | %.4f | 163840 rows | n/a |\n", c->vocab_size,
               head);
#undef MEAN
    if (wide)
        printf("\nmeasured: %.3f s/token for %d layers; K3 compute floor (93 layers, all "
               "weights in RAM): %.2f s/token = %.3f tokens/s\n", total, c->num_hidden_layers,
               floor_s, 1.0 / floor_s);
    else
        printf("\nmeasured: %.3f s/token for %d layers; K3 compute floor: not applicable, this "
               "model is not at K3's per-layer widths (%s): measure k3-wide (make test-wide) or "
               "k3-lab synth DIR --real --top-k 16\n", total, c->num_hidden_layers, why);
    spine_report(e, &st0, tokens, total, dir, bw0);
done:
    if (rc) fprintf(stderr, "k3-lab bench decode: %s\n", err.msg);
    free(logits);
    k3_session_free(s);
    k3_engine_free(e);
    return rc;
}

/* argv[0] is "kernels" or "decode". */
int k3_cmd_bench_compute(int argc, char **argv) {
    if (!strcmp(argv[0], "decode")) return bench_decode(argc, argv);
    return bench_kernels(argc, argv);
}
