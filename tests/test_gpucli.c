/* test_gpucli.c — the GPU-facing command line as a user without a GPU meets it: a K3_DEVICE
 * that is not cpu/cuda/auto is quoted back by name (it was "device 'x'", no variable named);
 * --gpu-gb refuses inf (it was taken as a budget); chat and serve --help say how to put them on
 * the GPU (K3_DEVICE, K3_GPU_GB); scripts/gpu-check.sh has --help (it exited 2), stops with
 * status 12 before any stage when no CUDA device answers (it ran every stage and exited 1), and
 * its status is 0 when the GPU tests all passed (it was 1 from its last line's test).
 * The script runs against stand-in k3 / k3_tests binaries in a scratch copy, so that these
 * tests behave the same on a machine with a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../src/util/err.h"
#include "cli_run.h"
#include "test.h"

static void test_k3_device_env_named(void) {
    const char *saved = getenv("K3_DEVICE");
    char keep[64] = "";
    if (saved) snprintf(keep, sizeof keep, "%s", saved);
    setenv("K3_DEVICE", "gpu", 1);
    k3t_cli r = {0};
    int ran = k3t_cli_run("run --prompt hi --max-new 1 -q", &r);
    k3t_cli r2 = {0}; /* --device wins over the variable, so a bad export is then harmless */
    int ran2 = k3t_cli_run("run --device cpu --prompt-ids 1792 --max-new 1 -q --ids", &r2);
    if (saved) setenv("K3_DEVICE", keep, 1);
    else unsetenv("K3_DEVICE");
    if (!ran)
        CHECK(r.status == K3_ERR_USAGE && strstr(r.err, "K3_DEVICE='gpu'") &&
              strstr(r.err, "cuda"), "exit %d, stderr: %s", r.status, r.err);
    if (!ran2) CHECK(r2.status == 0, "--device cpu with K3_DEVICE=gpu: exit %d: %s", r2.status,
                     r2.err);
    k3t_cli_free(&r);
    k3t_cli_free(&r2);
}

static void test_gpu_gb_finite(void) {
    static const char *bad[] = {"inf", "1e9", "-1", "abc"};
    for (int i = 0; i < 4; i++) {
        char args[128];
        snprintf(args, sizeof args, "run --gpu-gb %s --prompt hi --max-new 1 -q", bad[i]);
        k3t_cli r = {0};
        if (k3t_cli_run(args, &r)) continue;
        char want[64];
        snprintf(want, sizeof want, "--gpu-gb='%s': expected a finite number in (0, ", bad[i]);
        CHECK(r.status == K3_ERR_USAGE && strstr(r.err, want) && strstr(r.err, bad[i]),
              "--gpu-gb %s: exit %d, stderr: %s", bad[i], r.status, r.err);
        k3t_cli_free(&r);
    }
}

static void test_chat_serve_help_device(void) {
    static const char *cmds[] = {"chat --help", "serve --help"};
    for (int i = 0; i < 2; i++) {
        k3t_cli r = {0};
        if (k3t_cli_run(cmds[i], &r)) continue;
        CHECK(r.status == 0 && strstr(r.out, "--device DEV") && strstr(r.out, "K3_DEVICE") &&
              strstr(r.out, "--gpu-gb G") && strstr(r.out, "K3_GPU_GB") &&
              strstr(r.out, "make CUDA=1") && strstr(r.out, "(default auto; K3_DEVICE)"),
              "k3 %s: %s", cmds[i], r.out);
        k3t_cli_free(&r);
    }
}

static int write_file(const char *path, const char *text, int exec) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    fclose(f);
    return exec ? chmod(path, 0755) : 0;
}

/* A scratch tree holding a copy of scripts/gpu-check.sh and stand-ins in .gpu/bin: k3 (its
 * script body k3_body) and k3_tests (prints tests_out and leaves a mark that it ran). */
static char *gpu_check_tree(const char *k3_body, const char *tests_out) {
    char *dir = k3t_tmpdir(), p[600], body[800];
    if (!dir) return NULL;
    FILE *in = fopen("scripts/gpu-check.sh", "r");
    CHECK_OR(NULL, in, "scripts/gpu-check.sh: cannot open");
    static char script[65536];
    size_t n = fread(script, 1, sizeof script - 1, in);
    fclose(in);
    script[n] = 0;
    snprintf(p, sizeof p, "%s/scripts", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/.gpu", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/.gpu/bin", dir);
    mkdir(p, 0755);
    int rc = 0;
    snprintf(p, sizeof p, "%s/scripts/gpu-check.sh", dir);
    rc |= write_file(p, script, 1);
    snprintf(p, sizeof p, "%s/.gpu/bin/k3", dir);
    snprintf(body, sizeof body, "#!/bin/sh\n%s\n", k3_body);
    rc |= write_file(p, body, 1);
    snprintf(p, sizeof p, "%s/.gpu/bin/k3_tests", dir);
    snprintf(body, sizeof body, "#!/bin/sh\ntouch \"%s/tests_ran\"\nprintf '%s'\n", dir,
             tests_out);
    rc |= write_file(p, body, 1);
    CHECK_OR(NULL, rc == 0, "cannot write the scratch tree in %s", dir);
    return dir;
}

static void test_gpu_check_help(void) {
    k3t_cli r = {0};
    if (k3t_cli_run_in(NULL, "scripts/gpu-check.sh", "--help", &r)) return;
    CHECK(r.status == 0 && strstr(r.out, "gpu-check.sh prepare") &&
          strstr(r.out, "gpu-check.sh run") && strstr(r.out, "Exit status"),
          "exit %d, stdout: %s", r.status, r.out);
    k3t_cli_free(&r);
    CHECK(!k3t_cli_run_in(NULL, "scripts/gpu-check.sh", "bogus", &r), "could not run");
    CHECK(r.status == 2 && strstr(r.err, "--help"), "exit %d, stderr: %s", r.status, r.err);
    k3t_cli_free(&r);
}

static void test_gpu_check_no_device(void) {
    char *dir = gpu_check_tree("echo 'k3: no CUDA device: stand-in' >&2; exit 12",
                               "16 passed, 0 failed\\n");
    if (!dir) return;
    char script[600], env[700], mark[600];
    snprintf(script, sizeof script, "%s/scripts/gpu-check.sh", dir);
    snprintf(env, sizeof env, "OUT='%s/out' K3_SCRATCH='%s' SKIP_BENCH=1 SKIP_WIDE=1 '%s' run",
             dir, dir, script);
    snprintf(mark, sizeof mark, "%s/tests_ran", dir);
    k3t_cli r = {0};
    if (!k3t_cli_run_in(dir, "env", env, &r)) {
        struct stat st;
        CHECK(r.status == K3_ERR_DEVICE && strstr(r.err, "no CUDA device: stand-in") &&
              strstr(r.err, "nvidia-smi"), "exit %d, stderr: %s", r.status, r.err);
        CHECK(stat(mark, &st) != 0, "the GPU tests ran without a device");
    }
    k3t_cli_free(&r);
    k3t_rm_dir(dir);
}

/* A CUDA build on a machine with no NVIDIA driver says so (CUDA's own message, "driver version
 * is insufficient", sent users to upgrade a driver they do not have). Skipped where it cannot
 * apply: a build without CUDA, or a machine with a driver. */
static void test_no_driver_message(void) {
    struct stat st;
    k3t_cli v = {0}, r = {0};
    if (k3t_cli_run("--version", &v)) return;
    const int cuda = strstr(v.out, "cuda: compiled in") != NULL;
    k3t_cli_free(&v);
    if (!cuda) {
        k3_test_skip("this k3 was built without CUDA");
        return;
    }
    if (stat("/proc/driver/nvidia", &st) == 0) {
        k3_test_skip("an NVIDIA driver is installed here");
        return;
    }
    if (k3t_cli_run("run --device cuda --prompt-ids 1792 --max-new 1 -q", &r)) return;
    CHECK(r.status == K3_ERR_DEVICE && strstr(r.err, "no NVIDIA driver is installed"),
          "exit %d, stderr: %s", r.status, r.err);
    k3t_cli_free(&r);
}

/* Exit status from the GPU tests' summary: all passed 0; any skipped or failed 1. */
static void test_gpu_check_verdict(void) {
    static const char *logs[] = {"ok a/b\\n16 passed, 0 failed\\n",
                                 "SKIPPED a/b: no device\\n1 skipped\\n15 passed, 0 failed\\n",
                                 "FAIL a/b: x\\n15 passed, 1 failed\\n"};
    for (int i = 0; i < 3; i++) {
        char *dir = gpu_check_tree("exit 0", logs[i]);
        if (!dir) return;
        char script[600], env[800];
        snprintf(script, sizeof script, "%s/scripts/gpu-check.sh", dir);
        snprintf(env, sizeof env,
                 "OUT='%s/out' K3_SCRATCH='%s' SKIP_BENCH=1 SKIP_WIDE=1 SKIP_STREAM=1 "
                 "PATH=/usr/bin:/bin '%s' run", dir, dir, script);
        k3t_cli r = {0};
        if (!k3t_cli_run_in(dir, "env", env, &r))
            CHECK(r.status == (i == 0 ? 0 : 1), "log %d: exit %d, stdout: %s", i, r.status,
                  r.out);
        k3t_cli_free(&r);
        k3t_rm_dir(dir);
    }
}

const k3_test k3_suite_gpucli[] = {
    {"k3_device_env_named", test_k3_device_env_named},
    {"gpu_gb_finite", test_gpu_gb_finite},
    {"chat_serve_help_device", test_chat_serve_help_device},
    {"gpu_check_help", test_gpu_check_help},
    {"gpu_check_no_device", test_gpu_check_no_device},
    {"gpu_check_verdict", test_gpu_check_verdict},
    {"no_driver_message", test_no_driver_message},
    {0},
};
