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
    if (errno || *end || end == v || !(x > 0)) {
        fprintf(stderr, "k3 %s: --gpu-gb needs a number of GB > 0, got '%s'\n", cmd, v);
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

void k3_cli_device_engine_opts(const k3_cli_device_opts *o, k3_engine_opts *eo) {
    const char *env = getenv("K3_DEVICE");
    eo->device = o->device ? o->device : env && *env ? NULL : "auto";
    eo->gpu_gb = o->gpu_gb;
}
