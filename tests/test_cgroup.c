/* test_cgroup.c — k3 under a real memory cgroup (issue 16): the planner obeys the process's
 * own limit (not /proc/meminfo), the output is bit-identical to an unlimited run, the process
 * is never OOM-killed, and a limit below the model's minimum is refused before loading.
 * Needs root and a writable cgroup v1 memory controller; SKIPPED with the reason otherwise. */
#include "test.h"
#include "cli_run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CG_ROOT "/sys/fs/cgroup/memory"
#define MODEL "tests/fixtures/k3-tiny-kjv"
#define ARGS "run " MODEL " --prompt-ids 1,2,3 --max-new 8 --ids --threads 1"

/* Makes CG_ROOT/k3-test-PID with a limit of `bytes`; writes its path to dir. */
static int make_cgroup(char *dir, size_t cap, unsigned long long bytes) {
    snprintf(dir, cap, CG_ROOT "/k3-test-%d", (int)getpid());
    if (mkdir(dir, 0755) && access(dir, F_OK)) return -1;
    char p[512];
    snprintf(p, sizeof p, "%s/memory.limit_in_bytes", dir);
    FILE *f = fopen(p, "w");
    if (!f) return -1;
    int ok = fprintf(f, "%llu\n", bytes) > 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static long long read_num(const char *dir, const char *file, const char *key) {
    char p[512], line[256];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "r");
    long long v = -1;
    while (f && fgets(line, sizeof line, f)) {
        if (!key) v = atoll(line);
        else if (!strncmp(line, key, strlen(key))) v = atoll(line + strlen(key));
    }
    if (f) fclose(f);
    return v;
}

/* Runs k3 ARGS inside the cgroup at dir. */
static int run_in(const char *dir, const char *args, k3t_cli *r) {
    char cmd[2048], bin[1024];
    snprintf(bin, sizeof bin, "%s", k3t_bin());
    if (bin[0] != '/') {
        char cwd[512];
        if (!getcwd(cwd, sizeof cwd)) return -1;
        snprintf(bin, sizeof bin, "%s/%s", cwd, k3t_bin());
    }
    snprintf(cmd, sizeof cmd, "-c 'echo $$ > %s/cgroup.procs && exec %s %s'", dir, bin, args);
    return k3t_cli_run_in(NULL, "/bin/sh", cmd, r);
}

static int usable(void) {
    if (geteuid() != 0) {
        k3_test_skip("needs root to make a memory cgroup");
        return 0;
    }
    if (access(CG_ROOT "/memory.limit_in_bytes", W_OK) && access(CG_ROOT, W_OK)) {
        k3_test_skip("no writable cgroup v1 memory controller at " CG_ROOT);
        return 0;
    }
    return 1;
}

static void test_default_flags_under_a_limit(void) {
    if (!usable()) return;
    char dir[256];
    k3t_cli free_run = {0}, limited = {0};
    int rc0 = k3t_cli_run(ARGS, &free_run) ? -1 : free_run.status;
    if (make_cgroup(dir, sizeof dir, 256ull << 20)) {
        k3t_cli_free(&free_run);
        k3_test_skip("cannot create a cgroup under " CG_ROOT);
        return;
    }
    int rc1 = run_in(dir, ARGS, &limited) ? -1 : limited.status;
    /* k3 plan in the same cgroup prints the line k3 run printed (run counts prompt + --max-new
     * = 11 positions) */
    k3t_cli plan = {0};
    int rc2 = run_in(dir, "plan " MODEL " --ctx 11 -q", &plan) ? -1 : plan.status;
    char run_line[1024] = "", plan_line[1024] = "";
    const char *rl = limited.err ? strstr(limited.err, "memory planner:") : NULL;
    if (rl) snprintf(run_line, sizeof run_line, "%.*s", (int)strcspn(rl, "\n"), rl);
    if (plan.out) snprintf(plan_line, sizeof plan_line, "%.*s", (int)strcspn(plan.out, "\n"),
                           plan.out);
    k3t_cli_free(&plan);
    long long kills = read_num(dir, "memory.oom_control", "oom_kill ");
    long long peak = read_num(dir, "memory.max_usage_in_bytes", NULL);
    int same = free_run.out && limited.out && !strcmp(free_run.out, limited.out);
    int planned = limited.err && strstr(limited.err, "memory planner: limit 0.27 GB (cgroup " CG_ROOT);
    char err[2048];
    snprintf(err, sizeof err, "%s", limited.err ? limited.err : "");
    k3t_cli_free(&free_run), k3t_cli_free(&limited);
    rmdir(dir);
    CHECK(rc0 == 0 && rc1 == 0, "exit %d / %d: %s", rc0, rc1, err);
    CHECK(kills <= 0, "the kernel killed k3 in the cgroup (%lld)", kills);
    CHECK(same, "ids differ under the limit");
    CHECK(planned, "the plan does not obey the cgroup: %s", err);
    CHECK(rc2 == 0 && run_line[0] && !strcmp(run_line, plan_line), "k3 plan (exit %d): %s\n"
          "k3 run: %s", rc2, plan_line, run_line);
    CHECK(peak > 0 && peak <= (256ll << 20), "peak %lld", peak);
}

/* D18 (issue 32): a cgroup of exactly the minimum `k3 plan` prints (in the cgroup, for the
 * run's context) runs to the end without an OOM kill; one page less is refused before
 * loading. */
static void test_runs_at_the_printed_minimum(void) {
    if (!usable()) return;
    char dir[256];
    if (make_cgroup(dir, sizeof dir, 256ull << 20)) {
        k3_test_skip("cannot create a cgroup under " CG_ROOT);
        return;
    }
    k3t_cli plan = {0}, at = {0}, below = {0};
    int rc0 = run_in(dir, "plan " MODEL " --ctx 11", &plan) ? -1 : plan.status;
    const char *row = plan.out ? strstr(plan.out, "\n  minimum limit ") : NULL;
    long long min = row ? atoll(row + strlen("\n  minimum limit ")) : -1;
    k3t_cli_free(&plan);
    char p[512];
    snprintf(p, sizeof p, "%s/memory.limit_in_bytes", dir);
    FILE *f = min > 0 ? fopen(p, "w") : NULL;
    int set = f && fprintf(f, "%lld\n", min) > 0;
    if (f && fclose(f)) set = 0;
    int rc1 = set && !run_in(dir, ARGS " --ctx 11", &at) ? at.status : -1;
    long long kills = read_num(dir, "memory.oom_control", "oom_kill ");
    long long limit = read_num(dir, "memory.limit_in_bytes", NULL);
    f = min > 0 ? fopen(p, "w") : NULL;
    set = f && fprintf(f, "%lld\n", min - 4096) > 0;
    if (f && fclose(f)) set = 0;
    int rc2 = set && !run_in(dir, ARGS " --ctx 11", &below) ? below.status : -1;
    char err[2048];
    snprintf(err, sizeof err, "%s | %s", at.err ? at.err : "", below.err ? below.err : "");
    int says = below.err && strstr(below.err, "cannot run within");
    k3t_cli_free(&at), k3t_cli_free(&below);
    rmdir(dir);
    CHECK(rc0 == 0 && min > 0, "k3 plan: exit %d", rc0);
    CHECK(limit == min, "the cgroup holds %lld, not %lld", limit, min);
    CHECK(rc1 == 0 && kills <= 0, "at the minimum %lld: exit %d, %lld OOM kills: %s", min, rc1,
          kills, err);
    CHECK(rc2 == 2 && says, "one page below %lld: exit %d: %s", min, rc2, err);
}

static void test_below_the_minimum_is_refused(void) {
    if (!usable()) return;
    char dir[256];
    if (make_cgroup(dir, sizeof dir, 16ull << 20)) {
        k3_test_skip("cannot create a cgroup under " CG_ROOT);
        return;
    }
    k3t_cli r = {0};
    /* at the default context (4096 positions) the minimum (the base allowance ~17 MB, the
     * session's 2.9 MB of latent cache and state, top-k + 1 experts, headroom: ~24 MB, `k3 plan`)
     * passes 16 MB */
    int rc = run_in(dir, ARGS " --ctx 4096", &r) ? -1 : r.status;
    long long kills = read_num(dir, "memory.oom_control", "oom_kill ");
    int says = r.err && strstr(r.err, "cannot run within 0.017 GB (cgroup") &&
               strstr(r.err, "it needs at least");
    char err[1024];
    snprintf(err, sizeof err, "%s", r.err ? r.err : "");
    k3t_cli_free(&r);
    rmdir(dir);
    if (kills > 0 && strstr(k3t_bin(), "asan")) {
        k3_test_skip("a sanitizer build's shadow memory alone passes a 16 MB limit");
        return;
    }
    CHECK(kills <= 0, "killed instead of refused");
    CHECK(rc == 2 && says, "exit %d: %s", rc, err);
}

const k3_test k3_suite_cgroup[] = {
    {"default_flags_under_a_limit", test_default_flags_under_a_limit},
    {"below_the_minimum_is_refused", test_below_the_minimum_is_refused},
    {"runs_at_the_printed_minimum", test_runs_at_the_printed_minimum},
    {0}};
