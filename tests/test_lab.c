/* test_lab.c — the two binaries: k3 lists only the commands users run and says where the
 * developer tools went (k3-lab, exit 2); k3-lab lists and runs them (trace-gen then replay,
 * checked against the trace's own distinct experts); the typo hint in both. The names are
 * written here, independently of the command tables in src/cli/main.c and src/lab/main.c. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cli/waitpolicy.h"
#include "../src/util/err.h"
#include "cli_run.h"
#include "test.h"

static const char *const user_cmds[] = {"run", "chat", "serve", "setup", "pack", "quality",
    "tokenize", "detokenize", "render", "version"};
static const char *const lab_cmds[] = {"bench", "bench-gpu", "synth", "replay", "trace-gen"};
#define N_USER (sizeof user_cmds / sizeof user_cmds[0])
#define N_LAB (sizeof lab_cmds / sizeof lab_cmds[0])

/* Whether the usage text lists name as a command: a line "  NAME ..." (the first word of an
 * indented line; "version," counts as version). */
static int lists(const char *usage, const char *name) {
    size_t n = strlen(name);
    for (const char *l = usage; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, "  ", 2) && !strncmp(l + 2, name, n) && strchr(" ,\n", l[2 + n]))
            return 1;
    return 0;
}

static void test_help_lists(void) {
    k3t_cli r;
    if (k3t_cli_run("--help", &r)) return;
    CHECK(r.status == 0, "k3 --help: exit %d", r.status);
    for (size_t i = 0; i < N_USER; i++)
        CHECK(lists(r.out, user_cmds[i]), "k3 --help does not list %s: %s", user_cmds[i], r.out);
    for (size_t i = 0; i < N_LAB; i++)
        CHECK(!lists(r.out, lab_cmds[i]), "k3 --help lists the lab's %s: %s", lab_cmds[i], r.out);
    CHECK(strstr(r.out, "k3-lab"), "k3 --help does not say where the developer tools are");
    k3t_cli_free(&r);
    if (k3t_lab_run("--help", &r)) return;
    CHECK(r.status == 0, "k3-lab --help: exit %d", r.status);
    for (size_t i = 0; i < N_LAB; i++)
        CHECK(lists(r.out, lab_cmds[i]), "k3-lab --help does not list %s: %s", lab_cmds[i],
              r.out);
    for (size_t i = 0; i + 1 < N_USER; i++) /* version is in both */
        CHECK(!lists(r.out, user_cmds[i]), "k3-lab --help lists %s: %s", user_cmds[i], r.out);
    static const char *const subs[] = {"kernels", "decode", "prefill", "spec", "io"};
    for (size_t i = 0; i < 5; i++)
        CHECK(strstr(r.out, subs[i]), "k3-lab --help does not name bench %s", subs[i]);
    k3t_cli_free(&r);
}

/* Every lab command run through k3: exit 2, nothing on stdout, the same command line with
 * k3-lab on stderr. */
static void test_moved_commands(void) {
    static const char *const args[] = {"bench kernels", "bench", "bench-gpu", "synth /tmp/x",
        "replay t.jsonl", "trace-gen t.jsonl --tokens 3"};
    for (size_t i = 0; i < sizeof args / sizeof args[0] && !k3_test_stopped(); i++) {
        k3t_cli r;
        if (k3t_cli_run(args[i], &r)) return;
        char want[128];
        snprintf(want, sizeof want, "run k3-lab %s\n", args[i]);
        CHECK(r.status == K3_ERR_USAGE && r.out[0] == 0 && strstr(r.err, want) &&
              strstr(r.err, "moved"), "k3 %s: exit %d, stderr %s", args[i], r.status, r.err);
        k3t_cli_free(&r);
    }
}

/* Each lab command's --help through k3-lab (dispatch reaches it: exit 0, its own usage). */
static void test_lab_dispatch(void) {
    static const char *const args[] = {"bench kernels --help", "bench decode --help",
        "bench prefill --help", "bench spec --help", "bench io --help", "bench-gpu --help",
        "synth --help", "replay --help", "trace-gen --help", "--version"};
    static const char *const want[] = {"usage: k3-lab bench kernels", "usage: k3-lab bench "
        "decode", "usage: k3-lab bench prefill", "usage: k3-lab bench spec", "usage: k3-lab "
        "bench io", "usage: k3-lab bench-gpu", "usage: k3-lab synth", "usage: k3-lab replay",
        "usage: k3-lab trace-gen", "k3 "};
    for (size_t i = 0; i < sizeof args / sizeof args[0] && !k3_test_stopped(); i++) {
        k3t_cli r;
        if (k3t_lab_run(args[i], &r)) return;
        CHECK(r.status == 0 && strstr(r.out, want[i]), "k3-lab %s: exit %d, stdout %.300s",
              args[i], r.status, r.out);
        k3t_cli_free(&r);
    }
}

/* A typo gets the closest command in both binaries; in k3 a lab command's typo is named with
 * the program that has it. */
static void test_typo_hint(void) {
    static const struct { int lab; const char *args, *want; } t[] = {
        {0, "rnu", "did you mean 'run'?"},
        {0, "snyth", "did you mean 'k3-lab synth'?"},
        {0, "--verison", "did you mean 'version'?"},
        {1, "snyth", "did you mean 'synth'?"},
        {1, "trace-ge", "did you mean 'trace-gen'?"},
        {1, "--verison", "did you mean 'version'?"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0] && !k3_test_stopped(); i++) {
        k3t_cli r;
        if (t[i].lab ? k3t_lab_run(t[i].args, &r) : k3t_cli_run(t[i].args, &r)) return;
        CHECK(r.status == K3_ERR_USAGE && strstr(r.err, t[i].want) &&
              strstr(r.err, t[i].lab ? "k3-lab --help" : "k3 --help"), "%s %s: exit %d, %s",
              t[i].lab ? "k3-lab" : "k3", t[i].args, r.status, r.err);
        k3t_cli_free(&r);
    }
    k3t_cli r;
    if (k3t_lab_run("frobnicate", &r)) return;
    CHECK(r.status == K3_ERR_USAGE && strstr(r.err, "unknown command 'frobnicate'") &&
          !strstr(r.err, "did you mean"), "k3-lab frobnicate: %s", r.err);
    k3t_cli_free(&r);
}

/* k3-lab trace-gen writes a trace, k3-lab replay reads it: with a slot for every expert of
 * the traced layers, every cache policy misses only on each (layer, expert)'s first use, so
 * the hit rate is (lookups - distinct) / lookups, counted here from the file itself. */
static void test_tracegen_replay(void) {
    char *dir = k3t_tmpdir(), args[700], path[600];
    if (!dir) return;
    snprintf(path, sizeof path, "%s/t.jsonl", dir);
    snprintf(args, sizeof args, "trace-gen '%s' --tokens 40 --layers 2 --experts 16 --top-k 4 "
             "--hot 4 --seed 7", path);
    k3t_cli r;
    if (k3t_lab_run(args, &r)) goto out;
    int ok = r.status == 0;
    if (!ok) k3_test_fail(__FILE__, __LINE__, "k3-lab %s: exit %d, %s", args, r.status, r.err);
    k3t_cli_free(&r);
    if (!ok) goto out;
    FILE *f = fopen(path, "r");
    int seen[3][16] = {{0}}, lookups = 0, distinct = 0, lines = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        int step, layer, id[4];
        int n = sscanf(line, "{\"step\":%d,\"layer\":%d,\"ids\":[%d,%d,%d,%d]}", &step, &layer,
                       &id[0], &id[1], &id[2], &id[3]);
        if (n != 6 || layer < 1 || layer > 2) break;
        for (int k = 0; k < 4; k++) {
            if (id[k] < 0 || id[k] >= 16) break;
            lookups++;
            distinct += !seen[layer][id[k]]++;
        }
        lines++;
    }
    if (f) fclose(f);
    if (lines != 80 || lookups != 320) {
        k3_test_fail(__FILE__, __LINE__, "%s: %d lines, %d lookups (want 80, 320)", path, lines,
                     lookups);
        goto out;
    }
    snprintf(args, sizeof args, "replay '%s' --slots 32", path);
    if (k3t_lab_run(args, &r)) goto out;
    char want[128];
    double hit = 100.0 * (lookups - distinct) / lookups;
    snprintf(want, sizeof want, "| 32 | 100.0%% | %.1f%% | %.1f%% |", hit, hit);
    if (!(r.status == 0 && strstr(r.out, want)))
        k3_test_fail(__FILE__, __LINE__, "k3-lab %s: exit %d, no '%s' in %s", args, r.status,
                     want, r.out);
    k3t_cli_free(&r);
out:
    k3t_rm_dir(dir);
}

/* k3-lab bench decode on k3-nano (hidden 64, top-4): the per-layer times are printed, the K3
 * extrapolation is marked not applicable and names the widths that differ (it printed a
 * "K3 compute floor" of a 64-wide model scaled to 93 layers). */
static void test_bench_decode_not_k3_wide(void) {
    k3t_cli r;
    if (k3t_lab_run("bench decode tests/fixtures/k3-nano --tokens 1", &r)) return;
    CHECK(r.status == 0, "exit %d, stderr %s", r.status, r.err);
    CHECK(strstr(r.out, "| KDA mixer | 6 |") && strstr(r.out, "| MLA mixer | 3 |") &&
          strstr(r.out, "| 69 | n/a |"), "%s", r.out);
    CHECK(strstr(r.out, "K3 compute floor: not applicable") &&
          strstr(r.out, "hidden_size 64 (K3: 7168)") && !strstr(r.out, "tokens/s"), "%s", r.out);
    k3t_cli_free(&r);
}

/* bench prefill / spec say on stderr what they measure before each wait. */
static void test_bench_batch_progress(void) {
    k3t_cli r;
    if (k3t_lab_run("bench prefill tests/fixtures/k3-nano --tokens 4 --chunks 1,4", &r)) return;
    CHECK(r.status == 0 && strstr(r.err, "k3-lab bench prefill: measuring the memory bandwidth") &&
          strstr(r.err, "chunk 1 (1 of 2)") && strstr(r.err, "chunk 4 (2 of 2)") &&
          !strstr(r.out, "chunk 4 ("), "exit %d, stderr %s", r.status, r.err);
    k3t_cli_free(&r);
    if (k3t_lab_run("bench spec tests/fixtures/k3-nano --spec 2 --max-new 2", &r)) return;
    CHECK(r.status == 0 && strstr(r.err, "k3-lab bench spec: passes of 3 ids (size 3 of 3)") &&
          strstr(r.err, "(5 of 5)"), "exit %d, stderr %s", r.status, r.err);
    k3t_cli_free(&r);
}

/* The wait policy (waitpolicy.h) as libgomp itself reports it (OMP_DISPLAY_ENV, printed when
 * the runtime starts): with neither variable set, a command that runs the model's threads
 * re-executes once with GOMP_SPINCOUNT=K3_SPINCOUNT_DEFAULT (the last report shows it, the
 * first libgomp's own 300000), in both binaries; one that does not (version) is not
 * re-executed; a policy the user set is left alone. */
static void test_wait_policy(void) {
    static const struct { int lab; const char *env, *cmd, *want; int reports; } t[] = {
        {0, "", "run --help", "GOMP_SPINCOUNT = '" K3_SPINCOUNT_DEFAULT "'", 2},
        {1, "", "bench kernels --help", "GOMP_SPINCOUNT = '" K3_SPINCOUNT_DEFAULT "'", 2},
        {0, "", "version", "GOMP_SPINCOUNT = '300000'", 1},
        {0, "GOMP_SPINCOUNT=777", "run --help", "GOMP_SPINCOUNT = '777'", 1},
        {0, "OMP_WAIT_POLICY=passive", "chat --help", "GOMP_SPINCOUNT = '0'", 1},
        {1, "OMP_WAIT_POLICY=active", "bench spec --help", "OMP_WAIT_POLICY = 'ACTIVE'", 1},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0] && !k3_test_stopped(); i++) {
        char bin[PATH_MAX], args[PATH_MAX + 200];
        const char *b = t[i].lab ? k3t_lab_bin() : k3t_bin();
        CHECK(realpath(b, bin), "%s: %s", b, strerror(errno));
        snprintf(args, sizeof args, "-u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DISPLAY_ENV=verbose "
                 "%s '%s' %s", t[i].env, bin, t[i].cmd);
        k3t_cli r;
        if (k3t_cli_run_in(NULL, "/usr/bin/env", args, &r)) return;
        int reports = 0;
        const char *last = NULL;
        for (const char *p = r.err; (p = strstr(p, "OPENMP DISPLAY ENVIRONMENT BEGIN")); p++)
            reports++, last = p;
        if (!reports) {
            k3_test_skip("this OpenMP runtime does not print OMP_DISPLAY_ENV (not libgomp)");
            k3t_cli_free(&r);
            return;
        }
        CHECK(r.status == 0 && reports == t[i].reports && strstr(last, t[i].want),
              "%s %s %s: exit %d, %d reports (want %d), want %s in the last: %s", t[i].env, b,
              t[i].cmd, r.status, reports, t[i].reports, t[i].want, last);
        k3t_cli_free(&r);
    }
}

const k3_test k3_suite_lab[] = {
    {"help_lists_user_and_lab_commands", test_help_lists},
    {"k3_names_k3_lab_for_moved_commands", test_moved_commands},
    {"lab_dispatches_every_command", test_lab_dispatch},
    {"typo_hint_in_both_binaries", test_typo_hint},
    {"tracegen_then_replay_through_lab", test_tracegen_replay},
    {"bench_decode_not_k3_wide_says_so", test_bench_decode_not_k3_wide},
    {"bench_prefill_spec_progress", test_bench_batch_progress},
    {"wait_policy_bounded_spin_unless_set", test_wait_policy},
    {0},
};
