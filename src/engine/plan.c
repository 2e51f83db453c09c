/* plan.c — the memory planner and the probe of the machine's memory (plan.h). */
#include "plan.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define GB 1e9
#define NO_LIMIT (UINT64_C(1) << 62) /* v1 writes 2^63 rounded down to a page for "none" */

/* ==== the probe ========================================================================= */

static int read_meminfo(const char *root, k3_machine_mem *m, k3_err *err) {
    char path[512];
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    FILE *f = fopen(path, "r");
    if (!f) return k3_fail(err, K3_ERR_IO, "%s: cannot read the machine's memory", path);
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) m->ram_total_bytes = kb * 1024;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) m->ram_available_bytes = kb * 1024;
    }
    fclose(f);
    if (!m->ram_total_bytes) return k3_fail(err, K3_ERR_IO, "%s: no MemTotal line", path);
    return K3_OK;
}

static void copy_str(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

/* One limit file: a byte count, or "max" / a v1 value near 2^63 (none). Keeps the smallest. */
static void limit_file(k3_machine_mem *m, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char buf[64] = {0};
    unsigned long long v;
    if (fgets(buf, sizeof buf, f) && sscanf(buf, "%llu", &v) == 1 && v > 0 && v < NO_LIMIT &&
        (!m->cgroup_limit_bytes || v < m->cgroup_limit_bytes)) {
        m->cgroup_limit_bytes = v;
        copy_str(m->cgroup_source, sizeof m->cgroup_source, path);
    }
    fclose(f);
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The cgroup at mount/cg and each ancestor up to the mount (a limit anywhere above binds
 * too). Inside a cgroup namespace the path may not exist under the mount: then the mount's
 * own files are the process's cgroup. */
static void walk_cgroup(k3_machine_mem *m, const char *mount, const char *cg,
                        const char *const *files) {
    char dir[640], path[700];
    snprintf(dir, sizeof dir, "%s%s", mount, cg);
    if (!is_dir(dir)) snprintf(dir, sizeof dir, "%s", mount);
    size_t stop = strlen(mount);
    for (;;) {
        for (int i = 0; files[i]; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, files[i]);
            limit_file(m, path);
        }
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < stop) break;
        *slash = 0;
    }
}

static int has_memory_controller(const char *list) {
    for (const char *p = list; (p = strstr(p, "memory")); p += 6)
        if ((p == list || p[-1] == ',') && (p[6] == 0 || p[6] == ','))
            return 1;
    return 0;
}

int k3_machine_mem_probe(const char *root, k3_machine_mem *out, k3_err *err) {
    memset(out, 0, sizeof *out);
    if (!root) root = "";
    int rc = read_meminfo(root, out, err);
    if (rc) return rc;
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "r");
    if (!f) return K3_OK; /* no cgroups: RAM is the limit */
    static const char *const v1_files[] = {"memory.limit_in_bytes", NULL};
    static const char *const v2_files[] = {"memory.max", "memory.high", NULL};
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2 || c2[1] != '/') continue;
        *c2 = 0;
        const char *controllers = c1 + 1, *cg = c2 + 1;
        char mount[560];
        if (!*controllers) { /* "0::/path": cgroup v2 */
            snprintf(mount, sizeof mount, "%s/sys/fs/cgroup", root);
            char probe[600];
            snprintf(probe, sizeof probe, "%s/cgroup.controllers", mount);
            struct stat st;
            if (stat(probe, &st) != 0) snprintf(mount, sizeof mount, "%s/sys/fs/cgroup/unified", root);
            walk_cgroup(out, mount, strcmp(cg, "/") ? cg : "", v2_files);
        } else if (has_memory_controller(controllers)) {
            snprintf(mount, sizeof mount, "%s/sys/fs/cgroup/memory", root);
            walk_cgroup(out, mount, strcmp(cg, "/") ? cg : "", v1_files);
        }
    }
    fclose(f);
    return K3_OK;
}

/* ==== the plan ========================================================================== */

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }
static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* The limit and its source: the cgroup's when tighter than RAM, and never more than what the
 * OS has available now plus what this process already holds. */
static void plan_limit(const k3_machine_mem *m, uint64_t base, k3_plan *p) {
    p->limit_bytes = m->ram_total_bytes;
    snprintf(p->limit_source, sizeof p->limit_source, "%s",
             m->ram_source[0] ? m->ram_source : "RAM (MemTotal)");
    if (m->cgroup_limit_bytes && m->cgroup_limit_bytes < p->limit_bytes) {
        p->limit_bytes = m->cgroup_limit_bytes;
        memcpy(p->limit_source, "cgroup ", 7);
        copy_str(p->limit_source + 7, sizeof p->limit_source - 7, m->cgroup_source);
    }
    if (m->ram_available_bytes && m->ram_available_bytes + base < p->limit_bytes) {
        p->limit_bytes = m->ram_available_bytes + base;
        snprintf(p->limit_source, sizeof p->limit_source, "MemAvailable + this process");
    }
    p->limit_bytes = p->limit_bytes / K3_PLAN_PAGE_BYTES * K3_PLAN_PAGE_BYTES;
}

/* Headroom for the OS, page cache and allocator slack: 10% of the limit, and at least an
 * eighth of it up to 2 GB (small limits need proportionally more slack). */
static uint64_t headroom(uint64_t limit) {
    return max_u64(limit / 10, min_u64(2000000000ull, limit / 8));
}

/* The smallest limit, in whole pages, whose room after headroom holds need bytes: limit -
 * headroom(limit) never decreases as the limit grows (7/8 of it up to 16 GB, then less 2 GB,
 * then 9/10), so a binary search over pages finds it, and every smaller whole-page limit
 * leaves less than need. */
static uint64_t min_limit(uint64_t need) {
    uint64_t lo = 0, hi = need / K3_PLAN_PAGE_BYTES * 2 + 2; /* in pages; hi always suffices */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2, bytes = mid * K3_PLAN_PAGE_BYTES;
        if (bytes - headroom(bytes) >= need) hi = mid;
        else lo = mid + 1;
    }
    return lo * K3_PLAN_PAGE_BYTES;
}

uint64_t k3_plan_base_bytes(uint64_t metadata_bytes) {
    return K3_PLAN_PROCESS_BYTES + 2 * metadata_bytes;
}

static uint64_t slots_bytes(const k3_plan_model *mod, uint64_t n) {
    return n * mod->expert_slot_bytes;
}

/* Bytes rounded down to whole slots, within [lo, every expert]. */
static uint64_t cache_fit(const k3_plan_model *mod, uint64_t bytes, uint64_t lo) {
    uint64_t s = mod->expert_slot_bytes ? bytes / mod->expert_slot_bytes * mod->expert_slot_bytes
                                        : 0;
    uint64_t all = mod->experts_bytes;
    if (s > all) s = all;
    if (s < lo) s = lo;
    return s;
}

static int check_request(const k3_plan_request *r, k3_err *err) {
    if (r->sessions < 1 || r->sessions > 4096)
        return k3_fail_field(err, K3_ERR_USAGE, "sessions",
                             ": expected 1..4096, got %d", r->sessions);
    if (r->ctx < 0) return k3_fail_field(err, K3_ERR_USAGE, "ctx",
                                         ": expected >= 0, got %d", r->ctx);
    if (!isfinite(r->spine_gb) || r->spine_gb > 1e6)
        return k3_fail_field(err, K3_ERR_USAGE, "spine_gb",
                             ": expected a finite number of GB below 1e6");
    if (!isfinite(r->expert_gb) || r->expert_gb > 1e6)
        return k3_fail_field(err, K3_ERR_USAGE, "expert_gb",
                             ": expected a finite number of GB below 1e6");
    return K3_OK;
}

/* Spine RAM and expert cache within `room` (bytes after base, sessions and headroom). */
static int plan_parts(const k3_plan_model *mod, const k3_plan_request *r, uint64_t room,
                      k3_plan *p, k3_err *err) {
    uint64_t e_min = slots_bytes(mod, (uint64_t)mod->top_k + 1); /* the store completes */
    uint64_t e_pref = min_u64(max_u64(slots_bytes(mod, 2 * (uint64_t)mod->top_k), e_min),
                              max_u64(mod->experts_bytes, e_min)); /* prefetch stays on */
    uint64_t spine_all = mod->spine_bytes;
    if (p->spine_from_user) {
        p->spine_budgeted = 1;
        p->spine_budget_bytes = (uint64_t)(r->spine_gb * GB);
        p->spine_ram_bytes = max_u64(min_u64(p->spine_budget_bytes, spine_all + mod->staging_bytes),
                                     mod->staging_bytes);
    }
    if (p->experts_from_user) {
        p->expert_cache_bytes = cache_fit(mod, (uint64_t)(r->expert_gb * GB), mod->expert_slot_bytes);
        if (p->expert_cache_bytes < e_min && mod->expert_slot_bytes)
            p->expert_cache_bytes = cache_fit(mod, (uint64_t)(r->expert_gb * GB), 0);
    }
    if (p->spine_from_user && p->experts_from_user) return K3_OK;
    if (p->experts_from_user) { /* the spine gets what the experts leave */
        uint64_t left = room > p->expert_cache_bytes ? room - p->expert_cache_bytes : 0;
        if (r->gpu || left >= spine_all) {
            p->spine_ram_bytes = spine_all;
            return K3_OK;
        }
        if (left < mod->staging_bytes)
            return k3_fail_field(err, K3_ERR_USAGE, "expert_gb",
                                 ": an expert cache of %.2f GB leaves "
                           "%.2f GB for the spine, below its %.2f GB of staging: lower it",
                           p->expert_cache_bytes / GB, left / GB, mod->staging_bytes / GB);
        p->spine_budgeted = 1;
        p->spine_budget_bytes = p->spine_ram_bytes = left;
        return K3_OK;
    }
    if (p->spine_from_user) { /* the experts get what the spine leaves */
        uint64_t left = room > p->spine_ram_bytes ? room - p->spine_ram_bytes : 0;
        if (left < e_min)
            return k3_fail_field(err, K3_ERR_USAGE, "spine_gb",
                                 ": a spine budget of %.2f GB leaves %.2f GB "
                           "for the expert cache, below top-k + 1 = %d experts (%.2f GB): lower it",
                           p->spine_budget_bytes / GB, left / GB, mod->top_k + 1, e_min / GB);
        p->expert_cache_bytes = cache_fit(mod, left, e_min);
        return K3_OK;
    }
    if (r->gpu || room >= spine_all + e_pref) { /* the spine fits in place */
        p->spine_ram_bytes = spine_all;
        p->expert_cache_bytes = cache_fit(mod, room > spine_all ? room - spine_all : 0, e_min);
        return K3_OK;
    }
    uint64_t e = room >= mod->staging_bytes + e_pref ? e_pref : e_min;
    p->spine_budgeted = 1;
    p->spine_budget_bytes = p->spine_ram_bytes = room - e;
    p->expert_cache_bytes = cache_fit(mod, e, e_min);
    return K3_OK;
}

/* Bytes of a prompt pass of lo + extra rows beyond what the sessions count (plan.h). */
static uint64_t prefill_bytes_of(const k3_plan_model *mod, int lo, uint64_t extra) {
    uint64_t span = mod->prefill_group_rows > lo ? (uint64_t)(mod->prefill_group_rows - lo) : 0;
    uint64_t group = !span || extra >= span ? mod->prefill_group_bytes
                     : (mod->prefill_group_bytes * extra + span - 1) / span;
    return extra ? extra * mod->prefill_row_bytes + group : 0;
}

/* Bytes of prompt-pass scratch the plan wants beyond what the sessions count. */
static uint64_t prefill_want(const k3_plan_model *mod) {
    int lo = mod->prefill_rows_min > 0 ? mod->prefill_rows_min : 1;
    return mod->prefill_rows_max > lo
               ? prefill_bytes_of(mod, lo, (uint64_t)(mod->prefill_rows_max - lo)) : 0;
}

/* The most rows beyond lo whose pass fits in `bytes`. */
static uint64_t prefill_rows_in(const k3_plan_model *mod, int lo, uint64_t bytes) {
    uint64_t span = mod->prefill_group_rows > lo ? (uint64_t)(mod->prefill_group_rows - lo) : 0;
    uint64_t rows;
    if (!span || bytes >= prefill_bytes_of(mod, lo, span)) /* whole groups: linear beyond */
        rows = span + (bytes - (span ? prefill_bytes_of(mod, lo, span) : 0)) /
                          mod->prefill_row_bytes;
    else /* within the first group: both parts grow; the rounding may cost a row */
        rows = bytes / (mod->prefill_row_bytes + (mod->prefill_group_bytes + span - 1) / span);
    while (rows && prefill_bytes_of(mod, lo, rows) > bytes) rows--;
    return rows;
}

/* The part of `room` (bytes after base, sessions and headroom) set aside for prompt passes
 * before the spine and the expert cache are planned: an eighth of it at most, and never what
 * their minimum (staging or the GPU's spine, top-k + 1 slots) needs (plan.h). */
static uint64_t prefill_reserve(const k3_plan_model *mod, const k3_plan_request *r,
                                uint64_t room) {
    uint64_t floor = (r->gpu ? mod->spine_bytes : mod->staging_bytes) +
                     slots_bytes(mod, (uint64_t)mod->top_k + 1);
    uint64_t res = min_u64(prefill_want(mod), room / 8);
    return room > floor + res ? res : room > floor ? min_u64(res, room - floor) : 0;
}

/* The prompt pass's rows once the spine and the expert cache are planned in room - reserve:
 * the reserve, the room they left, then up to half of the cache above its prefetch minimum
 * when the user did not fix it (plan.h). */
static void plan_prefill(const k3_plan_model *mod, uint64_t room, uint64_t reserve, k3_plan *p) {
    int lo = mod->prefill_rows_min > 0 ? mod->prefill_rows_min : 1;
    p->prefill_rows = lo;
    p->prefill_bytes = 0;
    uint64_t want = prefill_want(mod);
    if (!want) return;
    uint64_t used = p->spine_ram_bytes + p->expert_cache_bytes + reserve;
    uint64_t spare = reserve + (room > used ? room - used : 0), from_cache = 0;
    uint64_t e_pref = max_u64(slots_bytes(mod, 2 * (uint64_t)mod->top_k),
                              slots_bytes(mod, (uint64_t)mod->top_k + 1));
    if (!p->experts_from_user && p->expert_cache_bytes > e_pref)
        from_cache = (p->expert_cache_bytes - e_pref) / 2;
    uint64_t rows = prefill_rows_in(mod, lo, min_u64(spare + from_cache, want));
    p->prefill_rows = lo + (int)rows;
    p->prefill_bytes = prefill_bytes_of(mod, lo, rows);
    if (p->prefill_bytes > spare) /* the rest from the cache, in whole slots */
        p->expert_cache_bytes =
            cache_fit(mod, p->expert_cache_bytes - (p->prefill_bytes - spare), e_pref);
}

int k3_plan_memory(const k3_machine_mem *m, const k3_plan_model *mod, const k3_plan_request *r,
                   k3_plan *p, k3_err *err) {
    memset(p, 0, sizeof *p);
    int rc = check_request(r, err);
    if (rc) return rc;
    p->base_bytes = r->base_bytes;
    p->sessions_bytes = (uint64_t)r->sessions * mod->session_bytes;
    p->sessions = r->sessions, p->ctx = r->ctx;
    p->pass_sessions = r->pass_sessions > 0 ? r->pass_sessions : 1;
    p->undo_bytes = (uint64_t)p->pass_sessions * mod->undo_bytes;
    p->spine_from_user = r->spine_gb >= 0;
    p->experts_from_user = r->expert_gb > 0;
    if (r->gpu && p->spine_from_user)
        return k3_fail_field(err, K3_ERR_USAGE, "spine_gb",
                             " is a budget of the CPU backend; the GPU "
                       "backend plans its own device memory");
    plan_limit(m, r->base_bytes, p);
    p->headroom_bytes = headroom(p->limit_bytes);
    uint64_t fixed = p->base_bytes + p->sessions_bytes + p->undo_bytes;
    uint64_t need = fixed + (r->gpu ? mod->spine_bytes : mod->staging_bytes) +
                    slots_bytes(mod, (uint64_t)mod->top_k + 1);
    p->min_limit_bytes = min_limit(need);
    uint64_t avail = p->limit_bytes > p->headroom_bytes ? p->limit_bytes - p->headroom_bytes : 0;
    if (avail < need)
        return k3_fail(err, K3_ERR_USAGE, "the model cannot run within %.3f GB (%s): it needs "
                       "at least %.3f GB (%llu bytes: base %.3f + %d session(s) %.3f + spine "
                       "staging %.3f + top-k + 1 = %d experts %.3f, plus headroom %.3f); give it "
                       "more memory or fewer sessions", p->limit_bytes / GB, p->limit_source,
                       p->min_limit_bytes / GB, (unsigned long long)p->min_limit_bytes,
                       p->base_bytes / GB, r->sessions,
                       (p->sessions_bytes + p->undo_bytes) / GB,
                       (r->gpu ? mod->spine_bytes : mod->staging_bytes) / GB,
                       mod->top_k + 1, slots_bytes(mod, (uint64_t)mod->top_k + 1) / GB,
                       headroom(p->min_limit_bytes) / GB);
    uint64_t reserve = prefill_reserve(mod, r, avail - fixed);
    rc = plan_parts(mod, r, avail - fixed - reserve, p, err);
    if (rc) return rc;
    plan_prefill(mod, avail - fixed, reserve, p);
    p->total_bytes = fixed + p->spine_ram_bytes + p->expert_cache_bytes + p->prefill_bytes;
    /* the user's own figures are obeyed even past the limit (the session estimate is a
     * worst case: its KV cache is committed as positions are used); the line says so */
    if (p->total_bytes > avail) p->over_limit_bytes = p->total_bytes - avail;
    return K3_OK;
}

void k3_plan_settle(k3_plan *p, const k3_plan_model *mod, uint64_t spine_ram_bytes) {
    if (!p->spine_budgeted || spine_ram_bytes >= p->spine_ram_bytes) return;
    uint64_t spare = p->spine_ram_bytes - spine_ram_bytes;
    p->spine_ram_bytes = spine_ram_bytes;
    if (!p->experts_from_user)
        p->expert_cache_bytes = cache_fit(mod, p->expert_cache_bytes + spare, p->expert_cache_bytes);
    p->total_bytes = p->base_bytes + p->sessions_bytes + p->undo_bytes + p->spine_ram_bytes +
                     p->expert_cache_bytes + p->prefill_bytes;
}

void k3_plan_describe(const k3_plan *p, char *buf, size_t cap) {
    char spine[128];
    if (p->spine_budgeted)
        snprintf(spine, sizeof spine, "spine budget %.2f GB%s", p->spine_budget_bytes / GB,
                 p->spine_from_user ? " (given)" : "");
    else
        snprintf(spine, sizeof spine, "spine %.2f GB in place", p->spine_ram_bytes / GB);
    snprintf(buf, cap, "memory planner: limit %.2f GB (%s), headroom %.2f GB; base %.2f GB + %s + "
             "expert cache %.2f GB%s + sessions %.2f GB (%d x %d positions) = %.2f GB",
             p->limit_bytes / GB, p->limit_source, p->headroom_bytes / GB, p->base_bytes / GB,
             spine, p->expert_cache_bytes / GB, p->experts_from_user ? " (given)" : "",
             p->sessions_bytes / GB, p->sessions, p->ctx, p->total_bytes / GB);
    size_t n = strlen(buf);
    if (p->undo_bytes && n < cap) /* in the total: the sessions' part a stopped pass needs */
        snprintf(buf + n, cap - n, "; pass-start copies %.2f GB (%d x the KDA state)",
                 p->undo_bytes / GB, p->pass_sessions);
    n = strlen(buf);
    if (p->prefill_bytes && n < cap) /* prompt passes beyond what the sessions count (their
                                        ids follow the base's RSS: not in this line) */
        snprintf(buf + n, cap - n, "; prompt passes +%.2f GB", p->prefill_bytes / GB);
    n = strlen(buf);
    if (p->over_limit_bytes && n < cap)
        snprintf(buf + n, cap - n, " (%.2f GB over the limit less headroom: as given)",
                 p->over_limit_bytes / GB);
}
