/* test_paths.c — the k3-nano fixture checks once per kernel path this CPU runs (scalar, and
 * avx2 / avx512 / neon where present), and the path choice as the CLI reports it. The k3-wide
 * checks do the same (tests/test_wide.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../src/kernels/kernels.h"
#include "fixture_check.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"
#define NANO_REF NANO "/reference"

static const fixture_tol nano_tol = {1e-4, 1e-4, 1e-5, 1e-4};

static void prompts(void) { fixture_check_prompts(NANO, NANO_REF, &nano_tol); }
static void trace(void) { fixture_check_trace(NANO, NANO_REF, "trace_len7.json", &nano_tol); }
static void decode(void) { fixture_check_decode(NANO, NANO_REF, &nano_tol); }

static void test_prompts(void) { fixture_on_every_path(prompts, 0); }
static void test_trace(void) { fixture_on_every_path(trace, 0); }
static void test_decode(void) { fixture_on_every_path(decode, 0); }

/* stdout + stderr of `K3_KERNELS=path $K3_BIN run ...` and its exit status. */
static int run_k3(const char *path, char *out, size_t cap) {
    const char *bin = getenv("K3_BIN") ? getenv("K3_BIN") : "./k3";
    char cmd[512];
    snprintf(cmd, sizeof cmd, "K3_KERNELS=%s %s run --prompt-ids 1 --max-new 1 --ids 2>&1", path,
             bin);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli_names_the_path(void) {
    static char out[8192];
    const k3_kernels *all[8];
    int n = k3_kernels_available(all, 8);
    for (int i = 0; i < n; i++) {
        char want[64];
        snprintf(want, sizeof want, "kernels: %s path", k3_kernels_name(all[i]));
        int st = run_k3(k3_kernels_name(all[i]), out, sizeof out);
        CHECK(st == 0 && strstr(out, want), "K3_KERNELS=%s: exit %d, output: %s",
              k3_kernels_name(all[i]), st, out);
    }
    int st = run_k3("nosuchpath", out, sizeof out);
    CHECK(st == K3_ERR_USAGE && strstr(out, "nosuchpath") && strstr(out, "scalar"),
          "K3_KERNELS=nosuchpath: exit %d, output: %s", st, out);
}

const k3_test k3_suite_paths[] = {
    {"nano_trace_every_path", test_trace},
    {"nano_prompts_every_path", test_prompts},
    {"nano_decode_vs_prefill_every_path", test_decode},
    {"cli_names_the_path", test_cli_names_the_path},
    {0},
};
