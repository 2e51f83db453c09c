/* cmd_plan.c — `k3 plan`: the memory plan `k3 run` would make for a model on this machine (or
 * on a machine of --memory-gb), without reading a weight (k3_engine_plan). */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../engine/k3.h"
#include "cli.h"
#include "opts.h"

typedef struct plan_opts {
    int sessions;
} plan_opts;

#define PLAN(f) K3_OPT_CMD(plan_opts, f), .field = #f
static const k3_opt plan_rows[] = {
    {.flag = "--sessions", PLAN(sessions), .type = K3_OPT_INT, .lo = 1, .hi = 4096, .def = "1",
     .meta = "N", .help = "sessions open at once (each counted at --ctx positions)"},
};

static const k3_cli_command plan_cmd = {
    .name = "plan",
    .usage =
        "usage: k3 plan [MODEL_DIR] [--memory-gb G] [options]\n"
        "\n"
        "Prints the memory plan k3 run makes for MODEL_DIR on this machine (RAM, available\n"
        "memory and the process's cgroup limits) or on a machine of --memory-gb G: the limit\n"
        "and where it came from, the OS reserve, the spine (in place, or resident layers and\n"
        "the layers streamed per token), the expert cache, the sessions' KV cache and state,\n"
        "with the bytes of each part. Reads config.json, the tokenizer and the shards' headers\n"
        "only: no weight is read, so a snapshot whose shards are sparse files holding just\n"
        "their headers plans too. Its \"memory planner:\" line is the one k3 run prints with\n"
        "the same flags (k3 run without --ctx counts its prompt + --max-new: give plan that\n"
        "--ctx to compare).\n",
    .rows = plan_rows, .n_rows = sizeof plan_rows / sizeof *plan_rows,
    .groups = K3_OG_DEVICE | K3_OG_SPINE | K3_OG_BUDGET | K3_OG_STORE | K3_OG_CTX | K3_OG_QUIET,
    .epilog = "Exit status: 0 a plan within the limit (or past it only by the --spine-gb /\n"
              "--expert-gb given, which the line says); 2 the model cannot run within the\n"
              "limit (the message gives the minimum) or a bad flag; 3 I/O, 4 config,\n"
              "5 checkpoint, 6 tokenizer, 8 packed spine.\n",
    .max_positional = 1,
};

#define GB 1e9

/* One row: name, bytes, GB, what it is. */
static void part(const char *name, uint64_t bytes, const char *note) {
    printf("  %-14s %15llu B %9.3f GB  %s\n", name, (unsigned long long)bytes,
           (double)bytes / GB, note);
}

/* "layers 0..5" / "layer 3" / "no layers" into buf. */
static const char *layers(int from, int to, char *buf, size_t cap) {
    if (to < from) snprintf(buf, cap, "no layers");
    else if (to == from) snprintf(buf, cap, "layer %d", from);
    else snprintf(buf, cap, "layers %d..%d", from, to);
    return buf;
}

static void print_plan(const char *dir, const k3_engine_plan_info *in) {
    const k3_plan *p = &in->plan;
    const k3_plan_model *m = &in->model;
    const k3_spine_stats *sp = &in->spine;
    char note[512], r0[48], r1[48];
    printf("k3 plan: %s: %d layers (%d MoE x %d experts of %.2f MB, top-%d), spine %.3f GB, "
           "experts %.3f GB\n", dir, in->n_layers, in->moe_layers, in->n_experts,
           (double)m->expert_slot_bytes / 1e6, m->top_k, (double)in->spine_mapped_bytes / GB,
           (double)m->experts_bytes / GB);
    printf("%s\n", in->line);
    part("limit", p->limit_bytes, p->limit_source);
    part("OS reserve", p->headroom_bytes, "headroom: the OS, page cache, allocator slack");
    part("base", p->base_bytes, "allowance for this process before weights: 16 MiB + 2 x "
         "config, tokenizer, index and headers");
    if (!p->spine_budgeted) {
        part("spine", p->spine_ram_bytes, "in place: every layer and lm_head mapped, nothing "
             "streamed");
    } else {
        snprintf(note, sizeof note, "budget %.3f GB%s: %s%s resident, %s%s streamed",
                 (double)p->spine_budget_bytes / GB, p->spine_from_user ? " (given)" : "",
                 layers(0, sp->resident_layers - 1, r0, sizeof r0),
                 sp->head_resident ? " + lm_head" : "",
                 layers(sp->resident_layers, sp->n_layers - 1, r1, sizeof r1),
                 sp->head_resident ? "" : " + lm_head");
        part("spine", p->spine_ram_bytes, note);
        part("  resident", sp->resident_bytes, "used in place from the mapped shards");
        part("  staging", sp->staging_bytes, "two buffers of the largest streamed half-layer");
        part("  pinned", sp->pinned_bytes, "small tensors of streamed layers (router, conv)");
        part("  streamed", sp->streamed_bytes, "read from the shards per token (not in RAM)");
        printf("  %s\n", in->spine_line);
    }
    uint64_t slots = m->expert_slot_bytes ? p->expert_cache_bytes / m->expert_slot_bytes : 0;
    snprintf(note, sizeof note, "%llu slots of %.2f MB%s (%.1f%% of the %.3f GB of experts)",
             (unsigned long long)slots, (double)m->expert_slot_bytes / 1e6,
             p->experts_from_user ? ", given" : "",
             m->experts_bytes ? 100.0 * (double)p->expert_cache_bytes / (double)m->experts_bytes
                              : 0.0, (double)m->experts_bytes / GB);
    part("expert cache", p->expert_cache_bytes, note);
    part("expert slot", m->expert_slot_bytes, "one routed expert as the cache holds it (its six "
         "tensors, 4 KiB aligned, + 4 KiB)");
    snprintf(note, sizeof note, "%d x %d positions: KV cache, KDA state, scratch "
             "(%.3f GB each)", p->sessions, p->ctx, (double)m->session_bytes / GB);
    part("sessions", p->sessions_bytes, note);
    snprintf(note, sizeof note, "%d x %.3f GB: a prompt pass keeps each session's KDA state "
             "to go back to its start when stopped (Ctrl-C, a client gone)", p->pass_sessions,
             (double)m->undo_bytes / GB);
    part("pass copies", p->undo_bytes, note);
    snprintf(note, sizeof note, "a prompt in passes of %d ids: each routed expert read once per "
             "pass (%.2f MB per id beyond %d, + %.2f GB of %d-row groups)", p->prefill_rows,
             (double)m->prefill_row_bytes / 1e6, m->prefill_rows_min,
             (double)m->prefill_group_bytes / GB, m->prefill_group_rows);
    part("prompt passes", p->prefill_bytes, note);
    part("total", p->total_bytes, "peak RSS stays within this + 5%");
    part("minimum limit", p->min_limit_bytes, "staging + top-k + 1 experts + sessions + base, "
         "with headroom (one page less is refused)");
    uint64_t requested = (uint64_t)m->top_k * (uint64_t)in->moe_layers * m->expert_slot_bytes;
    printf("  per token: spine %.3f GB read from disk, experts %.3f GB requested (top-%d x %d "
           "MoE layers; misses are read)\n", (double)sp->streamed_bytes / GB,
           (double)requested / GB, m->top_k, in->moe_layers);
    if (p->over_limit_bytes)
        printf("  over the limit less headroom by %.3f GB: the --spine-gb / --expert-gb given\n",
               (double)p->over_limit_bytes / GB);
}

int k3_cmd_plan(int argc, char **argv) {
    plan_opts po = {0};
    k3_engine_opts eo;
    k3_cli_common cc;
    k3_opts_parsed parsed;
    k3_opt_targets t = {.eo = &eo, .cc = &cc, .cmd = &po};
    int rc = k3_opts_parse(&plan_cmd, argc, argv, &t, &parsed);
    if (rc) return rc < 0 ? 0 : rc;
    const char *dir;
    if ((rc = k3_model_arg("k3 plan", parsed.n_positional ? parsed.positional[0] : NULL, &dir)))
        return rc;
    /* a streaming install (k3 setup --stream) keeps its incomplete shards, headers whole, in
     * DIR/.k3/partial: plan from them as k3 run loads them (load.c) */
    char dirs[8192], partial[4200];
    struct stat st;
    snprintf(partial, sizeof partial, "%s/.k3/partial", dir);
    if (stat(partial, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(dirs, sizeof dirs, "%s%s%s", eo.dirs ? eo.dirs : "", eo.dirs ? ":" : "", partial);
        eo.dirs = dirs;
    }
    eo.ctx = cc.ctx;
    eo.sessions = po.sessions;
    eo.verbose = 0;
    k3_engine_plan_info info;
    k3_err err = {0};
    if ((rc = k3_engine_plan(dir, &eo, &info, &err))) {
        k3_opts_error("plan", &err);
        return rc;
    }
    if (cc.quiet) printf("%s\n", info.line);
    else print_plan(dir, &info);
    return 0;
}
