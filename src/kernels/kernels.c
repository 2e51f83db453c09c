/* kernels.c — the public kernel entry points: path selection (once, at engine load), the
 * split of a product's rows across OpenMP threads, and the small element-wise functions. The
 * per-CPU inner loops live in cpu_scalar.c, cpu_avx2.c, cpu_avx512.c and cpu_neon.c. */
#include "kernels.h"

#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "../util/dtype.h"
#include "dispatch.h"

/* Below this many multiply-adds a product runs on one thread (fork/join costs more). */
#define PARALLEL_MIN_MACS (1 << 15)
/* Threads get contiguous row ranges in multiples of this (whole cache lines of y). */
#define ROW_BLOCK 16

float k3_mxfp4_value(uint8_t code, uint8_t scale) {
    return k3_e2m1[code & 15] * k3_e8m0_to_f32(scale);
}

float k3_mat_at(const k3_mat *m, int64_t i) {
    if (m->dtype == K3_DT_BF16) return k3_bf16_to_f32(((const uint16_t *)m->data)[i]);
    if (m->dtype == K3_DT_I8 || m->dtype == K3_DT_I8_Q8)
        return ((const int8_t *)m->data)[i] * m->scale[i / m->cols];
    if (m->dtype == K3_DT_BF16LX) { /* one group decoded: for a few values, never a loop */
        int64_t r = i / m->cols, c = i % m->cols, c0 = c / K3_LX_GROUP * K3_LX_GROUP;
        uint16_t t[K3_LX_GROUP];
        uint32_t e, end;
        k3_lx_row_escapes(m, r, &e, &end);
        const uint32_t *list = m->esc + m->rows + 1;
        while (e < end && (int64_t)(list[e] >> 8) < c0) e++;
        k3_lx_group_u16((const uint8_t *)m->data + (uint64_t)r * k3_lx_row_bytes(m->cols) +
                            c0 / K3_LX_GROUP * K3_LX_GROUP_BYTES,
                        m->xtab, list, &e, end, c0, m->cols, t);
        return k3_bf16_to_f32(t[c - c0]);
    }
    return ((const float *)m->data)[i];
}

/* ---- path selection ------------------------------------------------------------------ */

/* Every path compiled into this binary, fastest first. */
static const k3_kernels *const PATHS[] = {
#if defined(__x86_64__)
    &k3_kernels_avx512,
    &k3_kernels_avx2,
#endif
#if defined(__aarch64__)
    &k3_kernels_neon,
#endif
    &k3_kernels_scalar,
};
#define N_PATHS (int)(sizeof PATHS / sizeof PATHS[0])

static int cpu_runs(const k3_kernels *k) {
#if defined(__x86_64__)
    /* libgcc's checks include the OS having enabled the AVX / AVX-512 register state. */
#if defined(K3_AVX512_EMULATED)
    if (k == &k3_kernels_avx512) return 1; /* make test-avx512-emu: SIMDe, runs anywhere */
#endif
    if (k == &k3_kernels_avx512) return __builtin_cpu_supports("avx512f");
    if (k == &k3_kernels_avx2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    (void)k;
    return 1; /* scalar everywhere; NEON is part of the aarch64 base ISA */
}

int k3_kernels_available(const k3_kernels **out, int cap) {
    int n = 0;
    for (int i = 0; i < N_PATHS && n < cap; i++)
        if (cpu_runs(PATHS[i])) out[n++] = PATHS[i];
    return n;
}

const k3_kernels *k3_kernels_get(const char *name) {
    for (int i = 0; i < N_PATHS; i++)
        if (!strcmp(PATHS[i]->name, name)) return cpu_runs(PATHS[i]) ? PATHS[i] : NULL;
    return NULL;
}

const k3_kernels *k3_kernels_best(void) {
    const k3_kernels *k[N_PATHS];
    k3_kernels_available(k, N_PATHS);
    return k[0];
}

int k3_kernels_select(const char *name, const k3_kernels **out, k3_err *err) {
    if (!name || !*name) {
        *out = k3_kernels_best();
        return K3_OK;
    }
    if ((*out = k3_kernels_get(name))) return K3_OK;
    char list[128] = "";
    const k3_kernels *k[N_PATHS];
    for (int i = 0, n = k3_kernels_available(k, N_PATHS); i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                 k[i]->name);
    return k3_fail_field(err, K3_ERR_USAGE, "kernels",
                         " '%s': unknown, or this CPU cannot run that "
                   "path; this CPU runs: %s", name, list);
}

const char *k3_kernels_name(const k3_kernels *k) { return k->name; }

/* One number from a sysfs file, or -1. */
static long read_long(const char *fmt, int cpu) {
    char path[128];
    long v = -1;
    snprintf(path, sizeof path, fmt, cpu);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    if (fscanf(f, "%ld", &v) != 1) v = -1;
    fclose(f);
    return v;
}

/* Counts distinct (package, core) pairs among the CPUs in our affinity mask; falls back to
 * the mask size when sysfs is unreadable. Called once at engine load, not per token. */
int k3_cpu_physical_cores(void) {
    enum { MAX_CPUS = 1024 };
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return omp_get_num_procs();
    int n_cpus = CPU_COUNT(&set), n = 0;
    long seen[MAX_CPUS];
    for (int cpu = 0; cpu < CPU_SETSIZE && cpu < MAX_CPUS; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        long core = read_long("/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        long pkg = read_long("/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
        if (core < 0 || pkg < 0) return n_cpus > 0 ? n_cpus : 1;
        long id = pkg * 1000000 + core;
        int dup = 0;
        for (int j = 0; j < n && !dup; j++) dup = seen[j] == id;
        if (!dup) seen[n++] = id;
    }
    return n > 0 ? n : 1;
}

/* ---- products: rows split across threads ----------------------------------------------- */

/* The dtype switch: a new weight format adds one case here. */
static void mat_rows(const k3_kernels *kr, const k3_mat *w, const float *x, int n, float *y,
                     int64_t r0, int64_t r1) {
    switch (w->dtype) {
    case K3_DT_BF16:
        kr->bf16(w->data, w->rows, w->cols, x, n, y, r0, r1);
        break;
    case K3_DT_BF16LX: /* lossless: bit-identical to the BF16 case (src/kernels/lossless.c) */
        kr->bf16lx(w, x, n, y, r0, r1);
        break;
    case K3_DT_I8: /* one vector at a time (src/kernels/int8.c); AVX2 on the x86 SIMD paths */
#if defined(__x86_64__)
        if (kr != &k3_kernels_scalar) {
            for (int b = 0; b < n; b++)
                k3_rows_i8_avx2(w, x + b * w->cols, y + b * w->rows, r0, r1);
            break;
        }
#endif
        for (int b = 0; b < n; b++) k3_rows_i8(w, x + b * w->cols, y + b * w->rows, r0, r1);
        break;
    case K3_DT_I8_Q8: /* --approx: int8 activations as well (src/kernels/int8.c) */
#if defined(__x86_64__)
        if (kr != &k3_kernels_scalar) {
            for (int b = 0; b < n; b++)
                k3_rows_i8_q8_avx2(w, x + b * w->cols, y + b * w->rows, r0, r1);
            break;
        }
#endif
        for (int b = 0; b < n; b++) k3_rows_i8_q8(w, x + b * w->cols, y + b * w->rows, r0, r1);
        break;
    default:
        kr->f32(w->data, w->rows, w->cols, x, n, y, r0, r1);
    }
}

typedef struct product {
    const k3_kernels *kr;
    const k3_mat *mat;
    const k3_mxfp4 *mx;
    int64_t rows, cols;
} product;

/* Rows [r0, r1) for all n vectors, K3_MAX_BATCH vectors per kernel call. */
static void product_rows(const product *p, const float *x, int n, float *y, int64_t r0,
                         int64_t r1) {
    for (int b = 0; b < n; b += K3_MAX_BATCH) {
        int nb = n - b < K3_MAX_BATCH ? n - b : K3_MAX_BATCH;
        const float *xb = x + (int64_t)b * p->cols;
        float *yb = y + (int64_t)b * p->rows;
        if (p->mx)
            p->kr->mxfp4(p->mx->packed, p->mx->scale, p->rows, p->cols, xb, nb, yb, r0, r1);
        else
            mat_rows(p->kr, p->mat, xb, nb, yb, r0, r1);
    }
}

/* Each thread takes one contiguous range of ROW_BLOCK-row blocks. */
static void product_run(const product *p, const float *x, int n, float *y) {
    if (n <= 0 || p->rows <= 0) return;
    int64_t nblk = (p->rows + ROW_BLOCK - 1) / ROW_BLOCK;
#pragma omp parallel if (p->rows * p->cols * n >= PARALLEL_MIN_MACS && nblk > 1)
    {
        int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t r0 = nblk * t / nt * ROW_BLOCK, r1 = nblk * (t + 1) / nt * ROW_BLOCK;
        if (r1 > p->rows) r1 = p->rows;
        if (r0 < r1) product_rows(p, x, n, y, r0, r1);
    }
}

void k3_matvec(const k3_kernels *kr, const k3_mat *w, const float *x, float *y) {
    k3_matmul(kr, w, x, 1, y);
}

void k3_matmul(const k3_kernels *kr, const k3_mat *w, const float *x, int n, float *y) {
    if (!kr) kr = &k3_kernels_scalar; /* a model bound outside the engine */
    product p = {kr, w, NULL, w->rows, w->cols};
    product_run(&p, x, n, y);
}

void k3_matmul_rows(const k3_kernels *kr, const k3_mat *w, const float *x, int n, float *y,
                    int64_t r0, int64_t r1) {
    if (!kr) kr = &k3_kernels_scalar;
    product p = {kr, w, NULL, w->rows, w->cols};
    if (n > 0 && r0 < r1) product_rows(&p, x, n, y, r0, r1);
}

void k3_matmul_xw(const k3_kernels *kr, const float *w, int64_t ldw, int64_t k, const float *x,
                  int64_t ldx, int n, float *y, int64_t ldy, int64_t c0, int64_t c1) {
    if (!kr) kr = &k3_kernels_scalar;
    if (n > 0 && c0 < c1) kr->xw(w, ldw, k, x, ldx, n, y, ldy, c0, c1);
}

void k3_matvec_mxfp4(const k3_kernels *kr, const k3_mxfp4 *w, const float *x, float *y) {
    k3_matmul_mxfp4(kr, w, x, 1, y);
}

void k3_matmul_mxfp4(const k3_kernels *kr, const k3_mxfp4 *w, const float *x, int n, float *y) {
    if (!kr) kr = &k3_kernels_scalar; /* a model bound outside the engine */
    product p = {kr, NULL, w, w->rows, w->cols};
    product_run(&p, x, n, y);
}

void k3_matvec_mxfp4_many(const k3_kernels *kr, int count, const k3_mxfp4 *w,
                          const float *const *x, float *const *y) {
    if (!kr) kr = &k3_kernels_scalar;
    int64_t nblk = 0, macs = 0;
    for (int j = 0; j < count; j++)
        nblk += (w[j].rows + ROW_BLOCK - 1) / ROW_BLOCK, macs += w[j].rows * w[j].cols;
    /* Global block b is block b - first[j] of the matrix j whose range holds it. */
#pragma omp parallel if (macs >= PARALLEL_MIN_MACS && nblk > 1)
    {
        int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t b0 = nblk * t / nt, b1 = nblk * (t + 1) / nt, first = 0;
        for (int j = 0; j < count && first < b1; j++) {
            int64_t nb = (w[j].rows + ROW_BLOCK - 1) / ROW_BLOCK;
            int64_t lo = b0 > first ? b0 - first : 0, hi = b1 - first < nb ? b1 - first : nb;
            if (lo < hi) {
                int64_t r0 = lo * ROW_BLOCK, r1 = hi * ROW_BLOCK < w[j].rows ? hi * ROW_BLOCK
                                                                              : w[j].rows;
                kr->mxfp4(w[j].packed, w[j].scale, w[j].rows, w[j].cols, x[j], 1, y[j], r0, r1);
            }
            first += nb;
        }
    }
}

int64_t k3_kernels_mix(const k3_kernels *kr, int which, int64_t reps) {
    if (!kr) kr = &k3_kernels_scalar;
    return kr->mix ? kr->mix(which, reps) : 0;
}

float k3_dot(const k3_kernels *kr, const float *a, const float *b, int64_t n) {
    if (!kr) kr = &k3_kernels_scalar;
    return kr->dot(a, b, n);
}

void k3_axpy(const k3_kernels *kr, float a, const float *x, float *y, int64_t n) {
    if (!kr) kr = &k3_kernels_scalar;
    kr->axpy(a, x, y, n);
}

void k3_kda_delta_rule(const k3_kernels *kr, float *S, const float *q, const float *k,
                       const float *v, const float *alpha, float beta, int d, float *u,
                       float *o) {
    if (!kr) kr = &k3_kernels_scalar;
    kr->kda_delta(S, q, k, v, alpha, beta, d, u, o);
}

float k3_softmax_exp(const k3_kernels *kr, const float *s, int64_t n, float scale, float *m,
                     float *p) {
    if (!kr) kr = &k3_kernels_scalar;
    return kr->softmax_exp(s, n, scale, m, p);
}

float k3_exp(float x) { return k3_exp_steps(x); }

/* ---- element-wise (scalar on every path: a few thousand values per token) ---------------- */

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
