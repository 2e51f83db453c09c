/* device_flags.c — see device_flags.h. */
#include "device_flags.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int k3_cli_device_flag(const char *cmd, int argc, char **argv, int *i, k3_cli_device_opts *o) {
    const char *a = argv[*i];
    if (strcmp(a, "--device") && strcmp(a, "--gpu-gb")) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "k3 %s: %s needs a value\n", cmd, a);
        return K3_ERR_USAGE;
    }
    const char *v = argv[++*i];
    if (!strcmp(a, "--device")) {
        if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto")) {
            fprintf(stderr, "k3 %s: --device needs cpu, cuda or auto, got '%s'\n", cmd, v);
            return K3_ERR_USAGE;
        }
        o->device = v;
        return 1;
    }
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || *end || end == v || !(x > 0 && x < 1e9)) { /* inf too: a budget is finite */
        fprintf(stderr, "k3 %s: --gpu-gb needs a number of GB > 0 (and below 1e9), got '%s'\n",
                cmd, v);
        return K3_ERR_USAGE;
    }
    o->gpu_gb = x;
    return 1;
}

void k3_cli_device_usage(FILE *f) {
    fprintf(f,
        "device:\n"
        "  --device DEV         cpu, cuda or auto (default; K3_DEVICE): auto runs on the GPU\n"
        "                       when this k3 was built with CUDA (make CUDA=1) and a device\n"
        "                       answers, else on the CPU; the load line says which. cuda\n"
        "                       without either is an error (exit status 12)\n"
        "  --gpu-gb G           device memory the GPU may use, in GB (default: the free memory\n"
        "                       less max(1 GiB, 5%%); K3_GPU_GB): spine layers stay resident as\n"
        "                       far as it allows (the rest are streamed per token from pinned\n"
        "                       host memory) and the remainder caches routed experts\n");
}

int k3_cli_device_engine_opts(const k3_cli_device_opts *o, k3_engine_opts *eo, k3_err *err) {
    const char *env = getenv("K3_DEVICE");
    /* checked here so that the message names the variable: a stale export is easy to forget */
    if (!o->device && env && *env && strcmp(env, "cpu") && strcmp(env, "cuda") &&
        strcmp(env, "auto"))
        return k3_fail(err, K3_ERR_USAGE, "K3_DEVICE='%s': expected cpu, cuda or auto (or "
                       "unset it: the default is auto)", env);
    eo->device = o->device ? o->device : env && *env ? NULL : "auto";
    eo->gpu_gb = o->gpu_gb;
    return K3_OK;
}

const char *const k3_cli_device_env_help =
    "device: this command runs on the CPU unless K3_DEVICE=cuda (an error without a GPU) or\n"
    "  K3_DEVICE=auto (the GPU when one answers) says otherwise, in a k3 built with make\n"
    "  CUDA=1; K3_GPU_GB caps the device memory it uses (as --device and --gpu-gb of k3 run)\n";
