/* test_clihints.c — messages a user acts on: `k3-lab bench` with no or an unknown benchmark
 * names every benchmark (it said "the only benchmark is 'io'"); a trailing comma in an id
 * file is reported on its own line (not the line after it); the --spine-gb help of commands
 * that have no --direct flag does not send the user to --direct; a bad K3_SPINE_GB is quoted
 * back by name (by k3-lab bench decode before it reads the disk); k3-lab bench prefill / spec
 * explain every flag with its default; tokenize and detokenize --file - read stdin. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/util/err.h"
#include "cli_run.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"

static void test_bench_names_every_benchmark(void) {
    static const char *args[] = {"bench", "bench decdoe", "bench --help"};
    for (int i = 0; i < 3; i++) {
        k3t_cli r = {0};
        if (k3t_lab_run(args[i], &r)) continue;
        const char *text = i == 2 ? r.out : r.err;
        CHECK(r.status == (i == 2 ? 0 : K3_ERR_USAGE), "k3-lab %s: exit %d", args[i], r.status);
        CHECK(strstr(text, "kernels") && strstr(text, "decode") && strstr(text, "prefill") &&
              strstr(text, "spec") && strstr(text, " io"), "k3-lab %s: %s", args[i], text);
        CHECK(i != 1 || strstr(r.err, "'decdoe'"), "the unknown name is not quoted: %s", r.err);
        k3t_cli_free(&r);
    }
}

static void test_trailing_comma_line(void) {
    char *dir = k3t_tmpdir(), path[512], args[700];
    if (!dir) return;
    snprintf(path, sizeof path, "%s/ids.txt", dir);
    FILE *f = fopen(path, "w");
    if (f) fputs("5,6\n7,\n\n", f), fclose(f);
    snprintf(args, sizeof args, "detokenize " NANO " --file '%s'", path);
    k3t_cli r = {0};
    if (f && !k3t_cli_run(args, &r)) {
        char want[600];
        snprintf(want, sizeof want, "%s:2: an empty item", path);
        CHECK(r.status == K3_ERR_USAGE && strstr(r.err, want), "exit %d, stderr: %s (want %s)",
              r.status, r.err, want);
    }
    k3t_cli_free(&r);
    k3t_rm_dir(dir);
}

/* serve, quality and (k3-lab) bench decode take no --direct: their help must not point there
 * alone. */
static void test_spine_gb_help_direct(void) {
    static const char *cmds[] = {"serve", "quality", "bench decode", "run", "chat"};
    for (int i = 0; i < 5; i++) {
        char args[64];
        snprintf(args, sizeof args, "%s --help", cmds[i]);
        k3t_cli r = {0};
        if (i == 2 ? k3t_lab_run(args, &r) : k3t_cli_run(args, &r)) continue;
        const char *h = strstr(r.out, "--spine-gb G");
        CHECK(h, "k3 %s --help has no --spine-gb", cmds[i]);
        if (h && i < 3)
            CHECK(strstr(h, "K3_DIRECT=0") || !strstr(h, "--direct"),
                  "k3 %s --help sends the user to --direct, which it refuses", cmds[i]);
        k3t_cli_free(&r);
    }
}

static void test_env_value_named(void) {
    k3t_cli r = {0};
    setenv("K3_SPINE_GB", "lots", 1);
    int ran = !k3t_cli_run("run " NANO " --prompt hi --max-new 1", &r);
    unsetenv("K3_SPINE_GB");
    if (ran)
        CHECK(r.status == K3_ERR_USAGE && strstr(r.err, "K3_SPINE_GB='lots'"),
              "exit %d, stderr: %s", r.status, r.err);
    k3t_cli_free(&r);
}

/* k3-lab bench decode checks K3_SPINE_GB before it measures the disk (up to 2 GB) or loads the
 * model: with a missing model folder the bad value is still what is reported (exit 2, not the
 * missing config.json's 3). */
static void test_bench_decode_env_first(void) {
    k3t_cli r = {0};
    setenv("K3_SPINE_GB", "lots", 1);
    int ran = !k3t_lab_run("bench decode /nonexistent/k3-model --tokens 1", &r);
    unsetenv("K3_SPINE_GB");
    if (ran)
        CHECK(r.status == K3_ERR_USAGE && strstr(r.err, "K3_SPINE_GB='lots'"),
              "exit %d, stderr: %s", r.status, r.err);
    k3t_cli_free(&r);
}

/* k3-lab bench prefill / spec: every flag explained with its default; the other one's flags
 * refused (they were accepted and ignored). */
static void test_bench_batch_help(void) {
    static const struct { const char *args, *need[4]; } h[] = {
        {"bench prefill --help", {"--chunks LIST", "default 1,8,32", "--tokens N", "--threads N"}},
        {"bench spec --help", {"--spec N", "(default 4)", "--max-new N", "(default 32)"}},
    };
    for (int i = 0; i < 2; i++) {
        k3t_cli r = {0};
        if (k3t_lab_run(h[i].args, &r)) continue;
        for (int k = 0; k < 4; k++)
            CHECK(strstr(r.out, h[i].need[k]), "k3-lab %s: no '%s' in: %s", h[i].args,
                  h[i].need[k], r.out);
        CHECK(r.status == 0 && strstr(r.out, "OMP_NUM_THREADS"), "k3-lab %s: exit %d, %s",
              h[i].args, r.status, r.out);
        k3t_cli_free(&r);
    }
    static const char *wrong[] = {"bench prefill " NANO " --spec 2", "bench spec " NANO
                                  " --chunks 4"};
    for (int i = 0; i < 2; i++) {
        k3t_cli r = {0};
        if (k3t_lab_run(wrong[i], &r)) continue;
        CHECK(r.status == K3_ERR_USAGE && strstr(r.err, "belongs to k3-lab bench"),
              "k3-lab %s: exit %d, stderr %s", wrong[i], r.status, r.err);
        k3t_cli_free(&r);
    }
}

/* --file - reads stdin: k3 tokenize ... | k3 detokenize --file - round-trips, and the
 * messages call it stdin (a pipe or /dev/stdin was refused as "not a regular file"). */
static void test_file_from_stdin(void) {
    char cmd[1024], out[512] = "";
    const char *bin = k3t_bin();
    snprintf(cmd, sizeof cmd, "printf 'Hello, world!' | '%s' tokenize " NANO " --file - | "
             "'%s' detokenize " NANO " --file - 2>&1; printf ' rc=%%d' $?", bin, bin);
    FILE *p = popen(cmd, "r");
    if (p) out[fread(out, 1, sizeof out - 1, p)] = 0, pclose(p);
    CHECK(!strcmp(out, "Hello, world!\n rc=0"), "round trip through stdin: '%s'", out);
    snprintf(cmd, sizeof cmd, "printf '5,\\nx' | '%s' detokenize " NANO " --file - 2>&1; "
             "printf ' rc=%%d' $?", bin);
    out[0] = 0;
    if ((p = popen(cmd, "r"))) out[fread(out, 1, sizeof out - 1, p)] = 0, pclose(p);
    CHECK(strstr(out, "stdin:2: 'x' is not a token id") && strstr(out, " rc=2"), "'%s'", out);
}

const k3_test k3_suite_clihints[] = {
    {"bench_names_every_benchmark", test_bench_names_every_benchmark},
    {"trailing_comma_line", test_trailing_comma_line},
    {"spine_gb_help_direct", test_spine_gb_help_direct},
    {"env_value_named", test_env_value_named},
    {"bench_decode_env_first", test_bench_decode_env_first},
    {"bench_batch_help", test_bench_batch_help},
    {"file_from_stdin", test_file_from_stdin},
    {0},
};
