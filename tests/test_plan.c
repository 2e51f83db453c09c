/* test_plan.c — the memory planner on a table of machines, and the probe on fake /proc and
 * /sys trees (cgroup v1, v2, v2 under /unified, a namespaced path, memory.high). Expected
 * figures are worked out by hand from the rules in src/engine/plan.h. */
#include "test.h"
#include "../src/engine/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define GB 1000000000ull
#define SLOT 17547264ull /* one K3 routed expert */

/* K3 as the engine runs it: BF16 spine ~115 GB, 92 MoE layers x 896 experts, top-16. */
static const k3_plan_model k3_bf16 = {
    .spine_bytes = 115 * GB, .staging_bytes = 3 * GB, .expert_slot_bytes = SLOT,
    .experts_bytes = 92ull * 896 * SLOT, .top_k = 16, .session_bytes = GB / 2};

static k3_machine_mem machine(uint64_t total, uint64_t avail, uint64_t cg) {
    k3_machine_mem m = {.ram_total_bytes = total, .ram_available_bytes = avail,
                        .cgroup_limit_bytes = cg};
    if (cg) snprintf(m.cgroup_source, sizeof m.cgroup_source, "/sys/fs/cgroup/x/memory.max");
    return m;
}

static k3_plan_request req(double spine_gb, double expert_gb) {
    return (k3_plan_request){.base_bytes = GB / 4, .sessions = 1, .spine_gb = spine_gb,
                             .expert_gb = expert_gb};
}

/* Every plan stays within its limit less headroom. */
static int within(const k3_plan *p) {
    return p->total_bytes + p->headroom_bytes <= p->limit_bytes;
}

static void test_64gb_machine_streams_the_spine(void) {
    k3_machine_mem m = machine(64 * GB, 60 * GB, 0);
    k3_plan_request r = req(-1, 0);
    k3_plan p;
    k3_err err = {0};
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_OK, "%s", err.msg);
    /* limit min(64, 60 + 0.25) = 60.25 GB (MemAvailable) in whole pages; headroom 10% */
    uint64_t limit = (60 * GB + GB / 4) / 4096 * 4096;
    CHECK(p.limit_bytes == limit, "%llu", (unsigned long long)p.limit_bytes);
    CHECK(strstr(p.limit_source, "MemAvailable"), "%s", p.limit_source);
    CHECK(p.headroom_bytes == limit / 10, "%llu", (unsigned long long)p.headroom_bytes);
    /* the spine does not fit: experts get 2 x top-k = 32 slots, the spine the rest */
    CHECK(p.spine_budgeted && !p.spine_from_user);
    CHECK(p.expert_cache_bytes == 32 * SLOT, "%llu", (unsigned long long)p.expert_cache_bytes);
    uint64_t room = limit - limit / 10 - GB / 4 - GB / 2;
    CHECK(p.spine_budget_bytes == room - 32 * SLOT);
    CHECK(within(&p));
}

static void test_huge_machine_holds_everything(void) {
    k3_machine_mem m = machine(4096 * GB, 4000 * GB, 0);
    k3_plan_request r = req(-1, 0);
    k3_plan p;
    k3_err err = {0};
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_OK, "%s", err.msg);
    CHECK(!p.spine_budgeted && p.spine_ram_bytes == 115 * GB);
    CHECK(p.expert_cache_bytes == k3_bf16.experts_bytes, "the cache is capped at every expert");
    CHECK(within(&p));
}

static void test_cgroup_beats_meminfo(void) {
    /* k3-wide in a 5 GB cgroup on a 25 GB machine (issue 16's measurement) */
    k3_plan_model wide = {.spine_bytes = 5400000000ull, .staging_bytes = 700000000ull,
                          .expert_slot_bytes = SLOT, .experts_bytes = 3ull * 64 * SLOT,
                          .top_k = 16, .session_bytes = 100000000ull};
    k3_machine_mem m = machine(25 * GB, 23 * GB, 5 * GB);
    k3_plan_request r = req(-1, 0);
    k3_plan p;
    k3_err err = {0};
    CHECK(k3_plan_memory(&m, &wide, &r, &p, &err) == K3_OK, "%s", err.msg);
    CHECK(p.limit_bytes == 5 * GB / 4096 * 4096 && strstr(p.limit_source, "cgroup"), "%s",
          p.limit_source);
    CHECK(p.headroom_bytes == 5 * GB / 4096 * 4096 / 8, "an eighth of a small limit: %llu",
          (unsigned long long)p.headroom_bytes);
    CHECK(p.spine_budgeted, "5.4 GB of spine cannot sit in place under 5 GB");
    CHECK(within(&p));
}

static void test_spine_override_shrinks_the_cache(void) {
    k3_machine_mem m = machine(64 * GB, 64 * GB, 0);
    k3_plan_request r = req(40, 0);
    k3_plan p;
    k3_err err = {0};
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_OK, "%s", err.msg);
    CHECK(p.spine_from_user && p.spine_budget_bytes == 40 * GB);
    /* limit 64 GB, headroom 6.4 GB: room 64 - 6.4 - 0.25 - 0.5 = 56.85 GB, 16.85 GB for experts */
    uint64_t left = 64 * GB - 6400000000ull - GB / 4 - GB / 2 - 40 * GB;
    CHECK(p.expert_cache_bytes == left / SLOT * SLOT, "%llu vs %llu",
          (unsigned long long)p.expert_cache_bytes, (unsigned long long)(left / SLOT * SLOT));
    CHECK(within(&p));
    /* a budget that leaves less than top-k + 1 experts is refused, naming the field */
    r = req(56.7, 0);
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_ERR_USAGE);
    CHECK(strstr(err.msg, "spine_gb"), "%s", err.msg);
}

static void test_expert_override_shrinks_the_spine(void) {
    k3_machine_mem m = machine(128 * GB, 128 * GB, 0);
    k3_plan_request r = req(-1, 20);
    k3_plan p;
    k3_err err = {0};
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_OK, "%s", err.msg);
    CHECK(p.experts_from_user && p.expert_cache_bytes == 20 * GB / SLOT * SLOT);
    /* 128 - 12.8 headroom - 0.75 fixed = 114.45 GB of room: the spine (115) gets the rest */
    CHECK(p.spine_budgeted && p.spine_budget_bytes == 114450000000ull - 20 * GB / SLOT * SLOT);
    CHECK(within(&p));
    /* both given and too large together: obeyed, and the excess said */
    r = req(100, 20);
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_OK, "%s", err.msg);
    CHECK(p.over_limit_bytes == p.total_bytes - (114450000000ull + 750000000ull), "%llu",
          (unsigned long long)p.over_limit_bytes);
    char line[512];
    k3_plan_describe(&p, line, sizeof line);
    CHECK(strstr(line, "over the limit"), "%s", line);
}

static void test_below_the_minimum_says_so(void) {
    /* staging 3 + 17 slots 0.298 + base 0.25 + session 0.5 = 4.048 GB; a 4 GB cgroup cannot */
    k3_machine_mem m = machine(64 * GB, 64 * GB, 4 * GB);
    k3_plan_request r = req(-1, 0);
    k3_plan p;
    k3_err err = {0};
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_ERR_USAGE);
    CHECK(strstr(err.msg, "cannot run within 4.000 GB") && strstr(err.msg, "cgroup"), "%s",
          err.msg);
    CHECK(p.min_limit_bytes > 4048000000ull && p.min_limit_bytes < 5 * GB, "%llu",
          (unsigned long long)p.min_limit_bytes);
    /* the minimum is exact (whole pages): at it the plan holds the minimum's parts, one byte
     * or one page less is refused */
    uint64_t min = p.min_limit_bytes;
    CHECK((min & 4095) == 0, "%llu", (unsigned long long)min);
    m = machine(64 * GB, 64 * GB, min - 1);
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_ERR_USAGE, "one byte below %llu",
          (unsigned long long)min);
    m = machine(64 * GB, 64 * GB, min - 4096);
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_ERR_USAGE);
    m = machine(64 * GB, 64 * GB, min);
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_OK, "%s", err.msg);
    CHECK(within(&p) && p.expert_cache_bytes >= 17 * SLOT);
    /* need = staging + 17 slots + base + session; headroom an eighth below 16 GB */
    uint64_t need = 3 * GB + 17 * SLOT + GB / 4 + GB / 2;
    CHECK(min - min / 8 >= need && (min - 4096) - (min - 4096) / 8 < need, "%llu",
          (unsigned long long)min);
    CHECK(p.min_limit_bytes == min, "the same inputs, the same minimum");
    /* more sessions raise the minimum */
    r.sessions = 8;
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_ERR_USAGE);
    CHECK(strstr(err.msg, "8 session(s)"), "%s", err.msg);
}

static void test_gpu_keeps_the_spine_mapped(void) {
    k3_machine_mem m = machine(256 * GB, 250 * GB, 0);
    k3_plan_request r = req(-1, 0);
    r.gpu = 1;
    k3_plan p;
    k3_err err = {0};
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_OK, "%s", err.msg);
    CHECK(!p.spine_budgeted && p.spine_ram_bytes == 115 * GB);
    CHECK(within(&p));
    r.spine_gb = 10;
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_ERR_USAGE);
    CHECK(strstr(err.msg, "CPU backend"), "%s", err.msg);
}

static void test_settle_gives_spare_spine_to_experts(void) {
    k3_machine_mem m = machine(64 * GB, 64 * GB, 0);
    k3_plan_request r = req(-1, 0);
    k3_plan p;
    k3_err err = {0};
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_OK, "%s", err.msg);
    uint64_t cache = p.expert_cache_bytes, total = p.total_bytes;
    k3_plan_settle(&p, &k3_bf16, p.spine_ram_bytes - 100 * SLOT - 5);
    CHECK(p.expert_cache_bytes == cache + 100 * SLOT, "whole slots of the spare");
    CHECK(p.total_bytes <= total);
}

/* A session counted at the context it is opened with (plan.h "Sessions"): K3's KV cache at
 * 4096 positions is ~10 GB; at 256 positions the spine budget gets the difference. */
static void test_sessions_at_their_context(void) {
    k3_machine_mem m = machine(64 * GB, 64 * GB, 0);
    k3_plan_model at4096 = k3_bf16, at256 = k3_bf16;
    at4096.session_bytes = 10 * GB, at256.session_bytes = 10 * GB / 16;
    k3_plan_request r = req(-1, 0);
    k3_plan a, b;
    k3_err err = {0};
    r.ctx = 4096;
    CHECK(k3_plan_memory(&m, &at4096, &r, &a, &err) == K3_OK, "%s", err.msg);
    r.ctx = 256;
    CHECK(k3_plan_memory(&m, &at256, &r, &b, &err) == K3_OK, "%s", err.msg);
    CHECK(b.spine_budget_bytes - a.spine_budget_bytes == 10 * GB - 10 * GB / 16, "%llu",
          (unsigned long long)(b.spine_budget_bytes - a.spine_budget_bytes));
    CHECK(a.ctx == 4096 && b.ctx == 256 && b.sessions == 1);
    char line[512];
    k3_plan_describe(&b, line, sizeof line);
    CHECK(strstr(line, "sessions 0.62 GB (1 x 256 positions)"), "%s", line);
    r.ctx = -1;
    CHECK(k3_plan_memory(&m, &at256, &r, &b, &err) == K3_ERR_USAGE && strstr(err.msg, "ctx"));
}

static void test_bad_requests(void) {
    k3_machine_mem m = machine(64 * GB, 64 * GB, 0);
    k3_plan p;
    k3_err err = {0};
    k3_plan_request r = req(-1, 1.0 / 0.0);
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_ERR_USAGE && strstr(err.msg, "expert_gb"));
    r = req(-1, 0);
    r.sessions = 0;
    CHECK(k3_plan_memory(&m, &k3_bf16, &r, &p, &err) == K3_ERR_USAGE && strstr(err.msg, "sessions"));
}

/* ---- the probe on fake trees ---------------------------------------------------------------- */

static void put(const char *root, const char *rel, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *s = path + strlen(root) + 1; (s = strchr(s, '/')); s++) {
        *s = 0;
        mkdir(path, 0755);
        *s = '/';
    }
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static char *fake_tree(void) {
    char tmpl[] = "/tmp/k3-plan-XXXXXX";
    char *d = mkdtemp(tmpl);
    if (!d) return NULL;
    char *root = strdup(d);
    put(root, "proc/meminfo", "MemTotal:       26214400 kB\nMemFree: 1 kB\n"
                              "MemAvailable:   24117248 kB\n");
    return root;
}

static void rm_tree(const char *root) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
}

static void test_probe_meminfo_only(void) {
    char *root = fake_tree();
    CHECK(root);
    k3_machine_mem m;
    k3_err err = {0};
    int rc = k3_machine_mem_probe(root, &m, &err);
    rm_tree(root);
    free(root);
    CHECK(rc == K3_OK, "%s", err.msg);
    CHECK(m.ram_total_bytes == 26214400ull * 1024 && m.ram_available_bytes == 24117248ull * 1024);
    CHECK(m.cgroup_limit_bytes == 0 && !m.cgroup_source[0]);
}

static void test_probe_cgroup_v1(void) {
    char *root = fake_tree();
    CHECK(root);
    put(root, "proc/self/cgroup", "9:name=systemd:/\n4:memory:/box/job\n3:cpuset:/\n0::/\n");
    put(root, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put(root, "sys/fs/cgroup/memory/box/memory.limit_in_bytes", "6000000000\n");
    put(root, "sys/fs/cgroup/memory/box/job/memory.limit_in_bytes", "9223372036854771712\n");
    k3_machine_mem m;
    k3_err err = {0};
    int rc = k3_machine_mem_probe(root, &m, &err);
    rm_tree(root);
    free(root);
    CHECK(rc == K3_OK, "%s", err.msg);
    CHECK(m.cgroup_limit_bytes == 6000000000ull, "the parent's limit binds: %llu",
          (unsigned long long)m.cgroup_limit_bytes);
    CHECK(strstr(m.cgroup_source, "memory/box/memory.limit_in_bytes"), "%s", m.cgroup_source);
}

static void test_probe_cgroup_v2(void) {
    char *root = fake_tree();
    CHECK(root);
    put(root, "proc/self/cgroup", "0::/user.slice/k3.service\n");
    put(root, "sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
    put(root, "sys/fs/cgroup/user.slice/memory.max", "max\n");
    put(root, "sys/fs/cgroup/user.slice/k3.service/memory.max", "8589934592\n");
    put(root, "sys/fs/cgroup/user.slice/k3.service/memory.high", "7516192768\n");
    k3_machine_mem m;
    k3_err err = {0};
    int rc = k3_machine_mem_probe(root, &m, &err);
    CHECK(rc == K3_OK, "%s", err.msg);
    CHECK(m.cgroup_limit_bytes == 7516192768ull, "memory.high is tighter: %llu",
          (unsigned long long)m.cgroup_limit_bytes);
    CHECK(strstr(m.cgroup_source, "k3.service/memory.high"), "%s", m.cgroup_source);
    /* inside a cgroup namespace the path is not under the mount: the mount's files count */
    put(root, "proc/self/cgroup", "0::/elsewhere/not/here\n");
    put(root, "sys/fs/cgroup/memory.max", "3000000000\n");
    rc = k3_machine_mem_probe(root, &m, &err);
    rm_tree(root);
    free(root);
    CHECK(rc == K3_OK && m.cgroup_limit_bytes == 3000000000ull, "%llu",
          (unsigned long long)m.cgroup_limit_bytes);
}

static void test_probe_unified_mount(void) {
    char *root = fake_tree();
    CHECK(root);
    put(root, "proc/self/cgroup", "4:memory:/\n0::/app\n");
    put(root, "sys/fs/cgroup/unified/app/memory.max", "2000000000\n");
    k3_machine_mem m;
    k3_err err = {0};
    int rc = k3_machine_mem_probe(root, &m, &err);
    rm_tree(root);
    free(root);
    CHECK(rc == K3_OK && m.cgroup_limit_bytes == 2000000000ull, "%llu",
          (unsigned long long)m.cgroup_limit_bytes);
}

static void test_probe_missing_meminfo(void) {
    k3_machine_mem m;
    k3_err err = {0};
    CHECK(k3_machine_mem_probe("/nonexistent-k3-root", &m, &err) == K3_ERR_IO);
    CHECK(strstr(err.msg, "/nonexistent-k3-root/proc/meminfo"), "%s", err.msg);
}

/* Prompt passes (plan.h): a pass of lo + r rows takes r x row + the group's part (r >= the
 * group's rows - lo; below, that part x r / (group - lo), rounded up). The plan gives the most
 * rows whose bytes fit what it set aside: on a 64 GB machine an eighth of the room (the
 * budgeted spine takes the rest), whole groups and more; on a 4 GB one, part of a group. */
static uint64_t pass_bytes(const k3_plan_model *k, uint64_t r) {
    uint64_t span = (uint64_t)(k->prefill_group_rows - k->prefill_rows_min);
    uint64_t grp = r >= span ? k->prefill_group_bytes : (k->prefill_group_bytes * r + span - 1) / span;
    return r ? r * k->prefill_row_bytes + grp : 0;
}

static void test_prompt_passes_count_the_group(void) {
    k3_plan_model k = k3_bf16;
    k.staging_bytes = GB; /* so that a 4 GB machine runs */
    k.prefill_row_bytes = 1018124, k.prefill_rows_min = 32, k.prefill_rows_max = 16384;
    k.prefill_group_rows = 256, k.prefill_group_bytes = 194000000;
    static const uint64_t mem[] = {64, 4};
    for (int i = 0; i < 2; i++) {
        k3_machine_mem m = machine(mem[i] * GB, mem[i] * GB, 0);
        k3_plan_request r = req(-1, 0);
        k3_plan p;
        k3_err err = {0};
        CHECK(k3_plan_memory(&m, &k, &r, &p, &err) == K3_OK, "%s", err.msg);
        uint64_t room = p.limit_bytes - p.headroom_bytes - GB / 4 - GB / 2, set = room / 8;
        uint64_t rows = (uint64_t)(p.prefill_rows - 32);
        CHECK(p.prefill_bytes == pass_bytes(&k, rows), "%llu GB: %d rows counted as %llu bytes",
              (unsigned long long)mem[i], p.prefill_rows, (unsigned long long)p.prefill_bytes);
        CHECK(pass_bytes(&k, rows) <= set && pass_bytes(&k, rows + 1) > set, "%llu GB: %d rows "
              "for %llu bytes set aside", (unsigned long long)mem[i], p.prefill_rows,
              (unsigned long long)set);
        CHECK(i == 0 ? p.prefill_rows > 256 : p.prefill_rows > 32 && p.prefill_rows < 256,
              "%llu GB: %d rows", (unsigned long long)mem[i], p.prefill_rows);
        CHECK(within(&p));
    }
}

const k3_test k3_suite_plan[] = {
    {"prompt_passes_count_the_group", test_prompt_passes_count_the_group},
    {"64gb_machine_streams_the_spine", test_64gb_machine_streams_the_spine},
    {"huge_machine_holds_everything", test_huge_machine_holds_everything},
    {"cgroup_beats_meminfo", test_cgroup_beats_meminfo},
    {"spine_override_shrinks_the_cache", test_spine_override_shrinks_the_cache},
    {"expert_override_shrinks_the_spine", test_expert_override_shrinks_the_spine},
    {"below_the_minimum_says_so", test_below_the_minimum_says_so},
    {"gpu_keeps_the_spine_mapped", test_gpu_keeps_the_spine_mapped},
    {"settle_gives_spare_spine_to_experts", test_settle_gives_spare_spine_to_experts},
    {"sessions_at_their_context", test_sessions_at_their_context},
    {"bad_requests", test_bad_requests},
    {"probe_meminfo_only", test_probe_meminfo_only},
    {"probe_cgroup_v1", test_probe_cgroup_v1},
    {"probe_cgroup_v2", test_probe_cgroup_v2},
    {"probe_unified_mount", test_probe_unified_mount},
    {"probe_missing_meminfo", test_probe_missing_meminfo},
    {0}};
