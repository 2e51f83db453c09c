/* store_flags.c — expert-store flags, router trace, profile and summary (see store_flags.h). */
#include "store_flags.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void k3_cli_store_usage(FILE *f) {
    fprintf(f,
        "expert store (routed experts are read from the shards on demand; each flag overrides\n"
        "its environment variable):\n"
        "  --expert-gb GB       expert cache budget, GB (K3_EXPERT_GB; default: available\n"
        "                       memory minus spine, state and max(2 GB, 10%%) headroom)\n"
        "  --load-threads N     expert reader threads (K3_LOAD_THREADS; default 4)\n"
        "  --direct 0|1         O_DIRECT reads (K3_DIRECT; default: 1 when the experts do not\n"
        "                       fit in RAM, else buffered reads through the page cache)\n"
        "  --pipe MODE          prefetch: 0, 1 (both), prev (previous token's choice), lookahead\n"
        "                       (next layer's router on this layer's input) (K3_PIPE; default\n"
        "                       on when the cache holds 2 x top-k experts)\n"
        "  --cache-policy P     s3fifo or lru (K3_CACHE_POLICY; default s3fifo)\n"
        "  --dirs D1:D2         extra folders holding shards, e.g. on other drives (K3_DIRS)\n"
        "  --expert-disk-gb GB  streaming install (k3 setup --stream): disk for the experts\n"
        "                       fetched on demand, GB (0: keep none; default: leave max(10%%,\n"
        "                       min(20 GB, 25%%)) of its file system free), the least\n"
        "                       recently used evicted first\n"
        "  --mmap-experts       no cache: experts used in place from the mapped shards\n"
        "                       (K3_MMAP_EXPERTS=1; the reference path)\n"
        "  --profile            one line per token on stderr: attention, router, expert wait,\n"
        "                       expert compute, head (K3_PROFILE=1); K3_PROFILE=2 adds a line\n"
        "                       with each MoE layer's expert wait / compute\n"
        "  --router-trace PATH  write one JSON line per (step, layer): chosen expert ids and\n"
        "                       weights in router order, flushed line by line\n");
}

static int bad(const char *cmd, const char *flag, const char *v, const char *want) {
    fprintf(stderr, "k3 %s: %s needs %s, got '%s'\n", cmd, flag, want, v);
    return K3_ERR_USAGE;
}

int k3_cli_store_flag(const char *cmd, int argc, char **argv, int *i, k3_cli_store_opts *o) {
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    char *end;
    if (!strcmp(a, "--mmap-experts")) { o->mmap_experts = 1; return 1; }
    if (!strcmp(a, "--profile")) { o->profile = 1; return 1; }
    static const char *const with_value[] = {"--expert-gb", "--load-threads", "--direct",
        "--pipe", "--cache-policy", "--dirs", "--router-trace", "--expert-disk-gb"};
    size_t k = 0;
    while (k < sizeof with_value / sizeof *with_value && strcmp(a, with_value[k])) k++;
    if (k == sizeof with_value / sizeof *with_value) return 0;
    if (!v) return bad(cmd, a, "a value", "nothing");
    ++*i;
    switch (k) {
    case 0:
        o->expert_gb = strtod(v, &end);
        if (*end || !(o->expert_gb > 0)) return bad(cmd, a, v, "a positive number of GB");
        break;
    case 1: {
        long n = strtol(v, &end, 10);
        if (*end || n < 1 || n > 256) return bad(cmd, a, v, "an integer in [1, 256]");
        o->load_threads = (int)n;
        break;
    }
    case 2:
        if (strcmp(v, "0") && strcmp(v, "1")) return bad(cmd, a, v, "0 or 1");
        o->direct = v[0] == '1' ? 1 : -1;
        break;
    case 3:
        if (!strcmp(v, "0")) o->pipe = -1;
        else if (!strcmp(v, "1")) o->pipe = 3;
        else if (!strcmp(v, "prev")) o->pipe = 1;
        else if (!strcmp(v, "lookahead")) o->pipe = 2;
        else return bad(cmd, a, v, "0, 1, prev or lookahead");
        break;
    case 4:
        if (strcmp(v, "lru") && strcmp(v, "s3fifo")) return bad(cmd, a, v, "lru or s3fifo");
        o->cache_policy = v;
        break;
    case 5: o->dirs = v; break;
    case 6: o->router_trace = v; break;
    default:
        o->expert_disk_gb = strtod(v, &end);
        if (*end || !(o->expert_disk_gb >= 0 && o->expert_disk_gb < 1e9))
            return bad(cmd, a, v, "a number of GB >= 0");
        o->expert_disk_budget = 1;
        break;
    }
    return 1;
}

void k3_cli_store_engine_opts(const k3_cli_store_opts *o, k3_engine_opts *eo) {
    eo->expert_gb = o->expert_gb;
    eo->load_threads = o->load_threads;
    eo->direct = o->direct;
    eo->pipe = o->pipe;
    eo->cache_policy = o->cache_policy;
    eo->dirs = o->dirs;
    eo->experts_in_place = o->mmap_experts;
    eo->expert_disk_budget = o->expert_disk_budget;
    eo->expert_disk_gb = o->expert_disk_gb;
}

/* One JSON object per (step, layer), flushed so a killed run keeps every finished line. */
static void on_routing(void *user, int pos, int layer, const int *ids, const float *w, int k) {
    k3_cli_store_run *r = user;
    if (!r->trace) return;
    fprintf(r->trace, "{\"step\":%d,\"layer\":%d,\"ids\":[", pos, layer);
    for (int j = 0; j < k; j++) fprintf(r->trace, "%s%d", j ? "," : "", ids[j]);
    fprintf(r->trace, "],\"weights\":[");
    for (int j = 0; j < k; j++) fprintf(r->trace, "%s%.9g", j ? "," : "", w[j]);
    fprintf(r->trace, "]}\n");
    fflush(r->trace);
}

static void on_step(void *user, int pos) {
    (void)pos;
    k3_cli_store_run *r = user;
    if (!r->profile) return;
    k3_run_stats st;
    char line[512];
    k3_session_stats(r->s, &st);
    k3_run_stats_profile(&st, line, sizeof line);
    fprintf(stderr, "k3: %s\n", line);
    if (r->profile < 2 || !st.layer_eload_s) return;
    fprintf(stderr, "k3: profile layers (expert wait / compute, ms):");
    for (int l = 0; l < st.n_layers; l++)
        if (st.layer_eload_s[l] > 0 || st.layer_expert_s[l] > 0)
            fprintf(stderr, " %d:%.1f/%.1f", l, 1e3 * st.layer_eload_s[l],
                    1e3 * st.layer_expert_s[l]);
    fprintf(stderr, "\n");
}

int k3_cli_store_attach(k3_cli_store_run *r, k3_session *s, const k3_cli_store_opts *o,
                        k3_err *err) {
    *r = (k3_cli_store_run){.o = o, .s = s, .profile = o->profile};
    const char *env = getenv("K3_PROFILE");
    if (env && *env && strcmp(env, "0")) r->profile = atoi(env) >= 2 ? 2 : 1;
    if (o->router_trace && !(r->trace = fopen(o->router_trace, "w")))
        return k3_fail(err, K3_ERR_IO, "%s: cannot create the router trace: %s", o->router_trace,
                       strerror(errno));
    if (r->trace || r->profile) {
        k3_trace t = {.user = r, .on_routing = on_routing, .on_step = on_step};
        k3_session_set_trace(s, &t);
    }
    return K3_OK;
}

void k3_cli_store_finish(k3_cli_store_run *r, int verbose) {
    if (r->s && verbose) {
        k3_run_stats st;
        char line[1024];
        k3_session_stats(r->s, &st);
        k3_run_stats_summary(&st, line, sizeof line);
        fprintf(stderr, "k3: %s\n", line);
    }
    if (r->trace) fclose(r->trace);
    r->trace = NULL;
}
