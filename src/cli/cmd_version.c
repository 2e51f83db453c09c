/* cmd_version.c — `k3 version` / `k3 --version`: the version, the CPU kernel paths this
 * binary holds and the one this CPU gets, and whether the CUDA backend is compiled in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kernels.h"
#include "../util/version.h"
#include "cli.h"
#include "opts.h"

/* The paths compiled in, fastest first: the PATHS table of src/kernels/kernels.c. */
#if defined(__x86_64__)
#define COMPILED_PATHS "avx512, avx2, scalar"
#define ARCH "x86-64"
#elif defined(__aarch64__)
#define COMPILED_PATHS "neon, scalar"
#define ARCH "aarch64"
#else
#define COMPILED_PATHS "scalar"
#define ARCH "other"
#endif

static const k3_cli_command version_cmd = {
    .name = "version",
    .usage = "usage: k3 version (or k3 --version)\n\nPrints the k3 version, the CPU kernel paths "
             "compiled into this binary, those this CPU runs\nand the one k3 picks (--kernels or "
             "K3_KERNELS overrides), and whether the CUDA backend is\ncompiled in. Exit status "
             "0.\n",
    .groups = K3_OG_KERNELS,
};

int k3_cmd_version(int argc, char **argv) {
    k3_engine_opts eo;
    k3_opts_parsed parsed;
    k3_opt_targets t = {.eo = &eo};
    int rc = k3_opts_parse(&version_cmd, argc, argv, &t, &parsed);
    if (rc) return rc < 0 ? 0 : rc;
    const k3_kernels *runs[8];
    int n = k3_kernels_available(runs, 8);
    printf("k3 %s\n", K3_VERSION);
    printf("build: %s, C compiler %s\n", ARCH, __VERSION__);
    printf("kernels: compiled in: %s; this CPU runs:", COMPILED_PATHS);
    for (int i = 0; i < n; i++) printf("%s %s", i ? "," : "", k3_kernels_name(runs[i]));
    const k3_kernels *pick;
    k3_err err = {0};
    const char *forced = eo.kernels; /* --kernels or K3_KERNELS, as every command reads it */
    int from = k3_opts_given(&version_cmd, &parsed, "--kernels");
    if (k3_kernels_select(forced, &pick, &err) == K3_OK)
        printf("; picked: %s%s\n", k3_kernels_name(pick),
               from == 2 ? " (set by K3_KERNELS)" : from ? " (set by --kernels)" : "");
    else
        printf("; picked: none (K3_KERNELS='%s': %s)\n", forced, err.msg);
#ifdef K3_WITH_CUDA
    printf("cuda: compiled in (make CUDA=1; --device cuda|auto)\n");
#else
    printf("cuda: not compiled in (rebuild with make CUDA=1 where nvcc is installed)\n");
#endif
    return 0;
}
