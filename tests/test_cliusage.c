/* test_cliusage.c — what a new user meets first: `k3 --version` / `k3 version`, `k3 --help`
 * naming them, an unknown command (exit 2 with a hint), every flag `k3 run` parses described
 * in `k3 run --help`, and a k3 copied away from the repository run without a model folder. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/kernels/kernels.h"
#include "../src/util/version.h"
#include "cli_run.h"
#include "test.h"

static void run_ok(const char *args, k3t_cli *r) {
    if (k3t_cli_run(args, r)) return;
    CHECK(r->status == 0, "k3 %s: exit %d, stderr %s", args, r->status, r->err);
}

/* The version line, the kernel paths (compiled in, runnable here, picked: the library's own
 * answer for this CPU and for K3_KERNELS=scalar) and the CUDA line, by both spellings. */
static void test_version(void) {
    const char *spell[] = {"--version", "version"};
    char want[256];
    for (int i = 0; i < 2 && !k3_test_stopped(); i++) {
        k3t_cli r;
        run_ok(spell[i], &r);
        if (!k3_test_stopped()) {
            snprintf(want, sizeof want, "k3 %s\n", K3_VERSION);
            CHECK(!strncmp(r.out, want, strlen(want)), "first line of: %s", r.out);
#if defined(__x86_64__)
            CHECK(strstr(r.out, "compiled in: avx512, avx2, scalar"), "%s", r.out);
#endif
            snprintf(want, sizeof want, "picked: %s\n", k3_kernels_name(k3_kernels_best()));
            CHECK(getenv("K3_KERNELS") || strstr(r.out, want), "no '%s' in %s", want, r.out);
#ifdef K3_WITH_CUDA
            CHECK(strstr(r.out, "cuda: compiled in"), "%s", r.out);
#else
            CHECK(strstr(r.out, "cuda: not compiled in"), "%s", r.out);
#endif
        }
        k3t_cli_free(&r);
    }
    k3t_cli r;
    if (!k3_test_stopped() && !k3t_cli_run("version extra", &r))
        CHECK(r.status == K3_ERR_USAGE, "k3 version extra: exit %d", r.status);
    k3t_cli_free(&r);
}

/* K3_KERNELS is honoured: the path the engine would take (the environment is restored). */
static void test_version_k3_kernels(void) {
    const char *old = getenv("K3_KERNELS");
    char *saved = old ? strdup(old) : NULL;
    setenv("K3_KERNELS", "scalar", 1);
    k3t_cli r;
    int rc = k3t_cli_run("version", &r);
    if (saved) setenv("K3_KERNELS", saved, 1);
    else unsetenv("K3_KERNELS");
    free(saved);
    if (!rc)
        CHECK(r.status == 0 && strstr(r.out, "picked: scalar (set by K3_KERNELS)"), "%s", r.out);
    k3t_cli_free(&r);
}

static void test_help_mentions_version(void) {
    k3t_cli r;
    run_ok("--help", &r);
    if (!k3_test_stopped()) CHECK(strstr(r.out, "--version"), "k3 --help: %s", r.out);
    k3t_cli_free(&r);
}

/* Exit 2, one line naming the command and pointing at --help; a typo gets a suggestion. */
static void test_unknown_command(void) {
    k3t_cli r;
    if (k3t_cli_run("frobnicate", &r)) return;
    CHECK(r.status == K3_ERR_USAGE, "exit %d", r.status);
    CHECK(strstr(r.err, "unknown command 'frobnicate'") && strstr(r.err, "k3 --help") &&
          !strstr(r.err, "did you mean"), "stderr: %s", r.err);
    CHECK(r.out[0] == 0, "stdout: %s", r.out);
    k3t_cli_free(&r);
    if (k3t_cli_run("rnu", &r)) return;
    CHECK(r.status == K3_ERR_USAGE && strstr(r.err, "did you mean 'run'?"), "stderr: %s", r.err);
    k3t_cli_free(&r);
    if (k3t_cli_run("--verison", &r)) return;
    CHECK(r.status == K3_ERR_USAGE && strstr(r.err, "did you mean"), "stderr: %s", r.err);
    k3t_cli_free(&r);
}

/* Every "--flag" row of run's own options and of the option table (src/cli/opts.c) appears
 * in `k3 run --help` as a word (the table's rows run does not draw are checked in test_opts). */
static void test_run_help_lists_every_flag(void) {
    static const char *const files[] = {"src/cli/cmd_run.c"};
    k3t_cli r;
    run_ok("run --help", &r);
    int checked = 0;
    for (size_t f = 0; f < sizeof files / sizeof files[0] && !k3_test_stopped(); f++) {
        FILE *in = fopen(files[f], "r");
        if (!in) continue; /* spine_flags.c may not exist in this tree */
        char line[1024];
        while (fgets(line, sizeof line, in)) {
            for (char *p = line; (p = strstr(p, ".flag = ")); p++) {
                char *q = strchr(p, '"'), *end = q ? strchr(q + 1, '"') : NULL;
                if (!q || !end || q[1] != '-') continue;
                char flag[64];
                snprintf(flag, sizeof flag, "%.*s", (int)(end - q - 1), q + 1);
                int found = 0;
                for (char *h = r.out; (h = strstr(h, flag)); h++) {
                    char after = h[strlen(flag)], before = h == r.out ? ' ' : h[-1];
                    if (strchr(" ,=)\n", after) && strchr(" ,(/\n", before)) found = 1;
                }
                CHECK(found, "%s parses %s but k3 run --help does not describe it", files[f],
                      flag);
                checked++;
            }
        }
        fclose(in);
    }
    CHECK(checked >= 8, "only %d flags found in the sources", checked);
    k3t_cli_free(&r);
}

/* k3 copied to a folder without tests/fixtures, run from there without MODEL_DIR: the error
 * says how to give a model folder. */
static void test_copied_binary_without_model(void) {
    char *dir = k3t_tmpdir(), bin[512], cmd[1024];
    if (!dir) return;
    snprintf(bin, sizeof bin, "%s/k3", dir);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", k3t_bin(), bin);
    CHECK(system(cmd) == 0, "%s failed", cmd);
    const char *args[] = {"run --prompt hi", "tokenize hi"};
    for (int i = 0; i < 2 && !k3_test_stopped(); i++) {
        k3t_cli r;
        if (k3t_cli_run_in(dir, bin, args[i], &r)) break;
        CHECK(r.status == K3_ERR_IO, "k3 %s: exit %d, stderr %s", args[i], r.status, r.err);
        CHECK(strstr(r.err, "no MODEL_DIR given") && strstr(r.err, "tests/fixtures/k3-tiny-kjv") &&
              strstr(r.err, dir) && strstr(r.err, "k3 run /path/to/Kimi-K3"),
              "k3 %s: stderr %s", args[i], r.err);
        k3t_cli_free(&r);
    }
    k3t_rm_dir(dir);
}

const k3_test k3_suite_cliusage[] = {
    {"version", test_version},
    {"version_k3_kernels", test_version_k3_kernels},
    {"help_mentions_version", test_help_mentions_version},
    {"unknown_command", test_unknown_command},
    {"run_help_lists_every_flag", test_run_help_lists_every_flag},
    {"copied_binary_without_model", test_copied_binary_without_model},
    {0},
};
