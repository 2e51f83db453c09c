/* lab.h — the commands of k3-lab, the developer binary beside k3 (benchmarks and test-data
 * tools over the same library). Each takes the arguments after its name (argv[0] is the
 * command or benchmark name), prints to stdout/stderr and returns the process exit status.
 *
 * Layer rule: src/lab may include anything src/cli may (and src/cli's own headers); nothing
 * outside src/lab includes it, so the shipped k3 links none of it. cuda_bench.c also includes
 * src/cuda/kern.h: it times the kernels directly. */
#ifndef K3_LAB_H
#define K3_LAB_H

#include <stdio.h>

#include "../util/err.h"

/* k3-lab bench kernels / decode (cmd_bench_kernels.c); argv[0] is "kernels" or "decode". */
int k3_cmd_bench_compute(int argc, char **argv);
/* k3-lab bench prefill / spec (cmd_bench_batch.c); argv[0] is "prefill" or "spec". */
int k3_cmd_bench_batch(int argc, char **argv);
/* k3-lab bench io, and `bench` without or with an unknown benchmark (cmd_bench.c); argv[0] is
 * "bench". */
int k3_cmd_bench(int argc, char **argv);
int k3_cmd_bench_gpu(int argc, char **argv);
int k3_cmd_synth(int argc, char **argv);
int k3_cmd_replay(int argc, char **argv);
int k3_cmd_tracegen(int argc, char **argv);

/* What `k3-lab bench-gpu` measures of the kernels alone (cuda_bench.c, CUDA=1 builds). */
typedef struct k3_gpu_bench {
    double copy_bps;     /* device-to-device copy, bytes read + written per second */
    double lm_head_s;    /* K3's lm_head product [163840, 7168] BF16, seconds */
    double bf16_bps;     /* the BF16 product at [12288, 7168], weight bytes per second */
    double mxfp4_bps;    /* 16 experts gate+up (one launch), weight bytes per second */
} k3_gpu_bench;

/* Measures the card's copy bandwidth and every product kernel at K3's decode shapes (median
 * of reps timed launches after warm-up, inputs rotated so the 60 MB L2 cannot hold them) and
 * prints a table against the copy bandwidth to out. Errors: K3_ERR_DEVICE. */
int k3_gpu_bench_kernels(FILE *out, int reps, k3_gpu_bench *res, k3_err *err);

#endif
