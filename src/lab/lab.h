/* lab.h — the commands of k3-lab, the developer binary beside k3 (benchmarks and test-data
 * tools over the same library). Each takes the arguments after its name (argv[0] is the
 * command or benchmark name), prints to stdout/stderr and returns the process exit status.
 *
 * Layer rule: src/lab may include anything src/cli may (and src/cli's own headers); nothing
 * outside src/lab includes it, so the shipped k3 links none of it. cuda_bench.c also includes
 * src/cuda/kern.h: it times the kernels directly. */
#ifndef K3_LAB_H
#define K3_LAB_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../util/err.h"

/* k3-lab bench kernels / decode (cmd_bench_kernels.c); argv[0] is "kernels" or "decode". */
int k3_cmd_bench_compute(int argc, char **argv);
/* k3-lab bench prefill / spec (cmd_bench_batch.c); argv[0] is "prefill" or "spec". */
int k3_cmd_bench_batch(int argc, char **argv);
/* k3-lab bench mla (cmd_bench_mla.c): the latent MLA attention against the context length. */
int k3_cmd_bench_mla(int argc, char **argv);
/* k3-lab bench io, and `bench` without or with an unknown benchmark (cmd_bench.c); argv[0] is
 * "bench". */
int k3_cmd_bench(int argc, char **argv);
/* k3-lab bench-batch (cmd_bench_multi.c): N sessions stepped in one pass vs one after another. */
int k3_cmd_bench_multi(int argc, char **argv);
int k3_cmd_bench_gpu(int argc, char **argv);
int k3_cmd_synth(int argc, char **argv);
int k3_cmd_replay(int argc, char **argv);
int k3_cmd_tracegen(int argc, char **argv);

/* Read + written bytes per second of a parallel memcpy of `bytes` from src to dst (best of 3;
 * every benchmark's bandwidth floor, cmd_bench_kernels.c). k3_lab_copy_rate allocates and
 * fills its own buffers of `bytes` each; 0 when out of memory. */
double k3_lab_copy_bw(uint8_t *dst, const uint8_t *src, size_t bytes);
double k3_lab_copy_rate(size_t bytes);

/* What `k3-lab bench-gpu` measures of the kernels alone (cuda_bench.c, CUDA=1 builds). */
typedef struct k3_gpu_bench {
    double copy_bps;     /* device-to-device copy, bytes read + written per second */
    double lm_head_s;    /* K3's lm_head product [163840, 7168] BF16, seconds */
    double bf16_bps;     /* the BF16 product at [12288, 7168], weight bytes per second */
    double mxfp4_bps;    /* 16 experts gate+up (one launch), weight bytes per second */
} k3_gpu_bench;

/* The lab switches of `k3-lab bench-gpu` (benchmarks only; the product never sets them). */
typedef struct k3_gpu_tuning {
    int no_pdl;        /* 1: launch without programmatic dependent launch (k3k_set_tuning) */
    int mx_schedule;   /* MXFP4 experts' launch schedule, 0..K3K_MX_SCHEDULES-1 (0 = fastest) */
    int mx_scan;       /* 1: also n experts per launch for n = 1..32, and host enqueue times */
    int mx_sweep;      /* 1: also every MXFP4 schedule */
    int only_experts;  /* 1: only the MXFP4 expert rows (profiling runs) */
} k3_gpu_tuning;

/* Applies t's no_pdl and mx_schedule process-wide (k3k_set_tuning); before any launch. */
void k3_gpu_set_tuning(const k3_gpu_tuning *t);

/* Measures the card's copy bandwidth and every product kernel at K3's decode shapes (median
 * of reps timed launches after warm-up, inputs rotated so the 60 MB L2 cannot hold them) and
 * prints a table against the copy bandwidth to out; t (NULL = none) adds the lab rows.
 * Errors: K3_ERR_DEVICE. */
int k3_gpu_bench_kernels(FILE *out, int reps, const k3_gpu_tuning *t, k3_gpu_bench *res,
                         k3_err *err);

#endif
