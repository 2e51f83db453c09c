/* device_flags.h — the device flags shared by the commands that run the model (--device,
 * --gpu-gb): where sessions run (src/engine/backend.h). The CLI default is auto: the GPU
 * when this k3 has CUDA and a device answers, else the CPU; the load line says which. */
#ifndef K3_CLI_DEVICE_FLAGS_H
#define K3_CLI_DEVICE_FLAGS_H

#include <stdio.h>
#include "../engine/k3.h"

typedef struct k3_cli_device_opts {
    const char *device; /* "cpu", "cuda", "auto"; NULL = $K3_DEVICE, else auto */
    double gpu_gb;      /* 0 = $K3_GPU_GB, else the free device memory less a margin */
} k3_cli_device_opts;

/* Parses the device flag at argv[*i] (advancing *i past its value). Returns 1 when consumed,
 * 0 when argv[*i] is not a device flag, else K3_ERR_USAGE (message printed, naming cmd). */
int k3_cli_device_flag(const char *cmd, int argc, char **argv, int *i, k3_cli_device_opts *o);
/* The flags' help lines. */
void k3_cli_device_usage(FILE *f);
/* Copies the flags into engine options. Errors: K3_ERR_USAGE when K3_DEVICE (read when
 * --device was not given) is not cpu, cuda or auto. */
int k3_cli_device_engine_opts(const k3_cli_device_opts *o, k3_engine_opts *eo, k3_err *err);
/* Help lines for the commands without device flags (chat, serve): K3_DEVICE and K3_GPU_GB. */
extern const char *const k3_cli_device_env_help;

#endif
