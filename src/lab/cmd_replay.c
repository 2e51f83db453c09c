/* cmd_replay.c — `k3-lab replay` (a router trace against the cache policies and Belady's MIN)
 * and `k3-lab trace-gen` (synthetic traces with K3's published routing locality).
 * src/store/replay.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../store/replay.h"
#include "../store/store.h"
#include "lab.h"

static void replay_usage(FILE *f) {
    fprintf(f,
        "usage: k3-lab replay TRACE.jsonl [--percent P1,P2,...] [--slots S1,S2,...]\n"
        "\n"
        "Replays a router trace (k3 run --router-trace, or k3-lab trace-gen) against each expert\n"
        "cache policy of the store (lru, s3fifo: the same code, pins included) and Belady's\n"
        "offline MIN, and prints their hit rates per budget.\n"
        "\n"
        "  --percent LIST   budgets as %% of the traced layers' experts (default 2,5,10,25)\n"
        "  --slots LIST     budgets as slot counts instead (each at least top-k + 1)\n"
        "  -h, --help       this help\n");
}

static void tracegen_usage(FILE *f) {
    fprintf(f,
        "usage: k3-lab trace-gen OUT.jsonl [options]\n"
        "\n"
        "Writes a synthetic router trace whose locality matches what is published for K3's\n"
        "routing: consecutive tokens share ~31%% of a layer's experts and the 16 hottest of 896\n"
        "take ~41%% of the routing mass. The popularity exponent and the reuse probability are\n"
        "calibrated by simulation; the statistics measured on the written trace are printed.\n"
        "(The lookahead recall of real runs, 60-70%%, concerns prediction, not the trace.)\n"
        "\n"
        "  --tokens N       decode steps (default 1000)\n"
        "  --layers N       MoE layers (default 92)\n"
        "  --experts N      experts per layer (default 896)\n"
        "  --top-k N        experts per token (default 16)\n"
        "  --overlap F      share repeated from the previous token (default 0.31)\n"
        "  --hot N          size of the hot set (default 16)\n"
        "  --hot-mass F     share of selections taken by the hot set (default 0.41)\n"
        "  --seed N         random seed (default 1)\n"
        "  -h, --help       this help\n");
}

/* "2,5,10" -> values; returns the count or -1. */
static int parse_list(const char *s, double *v, int cap) {
    int n = 0;
    while (*s && n < cap) {
        char *end;
        v[n] = strtod(s, &end);
        if (end == s || !(v[n] > 0) || (*end && *end != ',')) return -1;
        n++;
        s = *end ? end + 1 : end;
    }
    return *s ? -1 : n;
}

static void print_table(const char *path, const k3_route_trace *t, const int *slots, int nb) {
    int traced_layers = 0;
    uint8_t *seen = calloc((size_t)t->n_layers, 1);
    for (int r = 0; seen && r < t->n_req; r++) seen[t->key[(size_t)r * t->k] / t->n_experts] = 1;
    for (int l = 0; seen && l < t->n_layers; l++) traced_layers += seen[l];
    free(seen);
    double all = (double)traced_layers * t->n_experts, req = (double)t->n_req * t->k;
    printf("replay of %s: %d requests (top-%d) over %d layers of %d experts, %.0f expert "
           "lookups\n\n", path, t->n_req, t->k, traced_layers, t->n_experts, req);
    printf("| budget (slots) | %% of experts | LRU | S3-FIFO | static top-N oracle | Belady MIN "
           "| LRU / MIN | S3-FIFO / MIN |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int b = 0; b < nb; b++) {
        int64_t lru = k3_replay(t, K3_POLICY_LRU, slots[b]);
        int64_t s3 = k3_replay(t, K3_POLICY_S3FIFO, slots[b]);
        int64_t min = k3_replay(t, K3_POLICY_BELADY, slots[b]);
        int64_t top = k3_replay_static(t, slots[b]);
        if (lru < 0 || s3 < 0 || min < 0) {
            printf("| %d | (needs at least top-k + 1 = %d slots) |\n", slots[b], t->k + 1);
            continue;
        }
        printf("| %d | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.2f | %.2f |\n", slots[b],
               100 * slots[b] / all, 100 * lru / req, 100 * s3 / req, 100 * top / req,
               100 * min / req,
               min ? (double)lru / min : 0, min ? (double)s3 / min : 0);
    }
}

int k3_cmd_replay(int argc, char **argv) {
    const char *path = NULL;
    double pct[16] = {2, 5, 10, 25}, sl[16];
    int npct = 4, nsl = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { replay_usage(stdout); return 0; }
        if (!strcmp(a, "--percent") && v) { npct = parse_list(v, pct, 16); i++; if (npct < 0) goto bad; }
        else if (!strcmp(a, "--slots") && v) { nsl = parse_list(v, sl, 16); i++; if (nsl < 0) goto bad; }
        else if (a[0] != '-' && !path) path = a;
        else goto bad;
    }
    if (!path) goto bad;
    k3_route_trace t;
    k3_err err = {0};
    int rc = k3_route_trace_read(path, &t, &err);
    if (rc) {
        fprintf(stderr, "k3-lab replay: %s\n", err.msg);
        return rc;
    }
    int slots[16], nb = nsl ? nsl : npct, traced = 0;
    for (int l = 0; l < t.n_layers; l++)
        for (int r = 0; r < t.n_req; r++)
            if (t.key[(size_t)r * t.k] / t.n_experts == l) { traced++; break; }
    for (int b = 0; b < nb; b++) {
        slots[b] = nsl ? (int)sl[b] : (int)(pct[b] / 100 * traced * t.n_experts + 0.5);
        if (slots[b] < t.k + 1) slots[b] = t.k + 1;
    }
    print_table(path, &t, slots, nb);
    k3_route_trace_free(&t);
    return 0;
bad:
    fprintf(stderr, "k3-lab replay: bad arguments (see k3-lab replay --help)\n");
    return K3_ERR_USAGE;
}

int k3_cmd_tracegen(int argc, char **argv) {
    k3_tracegen_opts o = {.tokens = 1000, .layers = 92, .experts = 896, .top_k = 16, .hot = 16,
                          .overlap = 0.31, .hot_mass = 0.41, .seed = 1};
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *iv = !strcmp(a, "--tokens") ? &o.tokens : !strcmp(a, "--layers") ? &o.layers :
                  !strcmp(a, "--experts") ? &o.experts : !strcmp(a, "--top-k") ? &o.top_k :
                  !strcmp(a, "--hot") ? &o.hot : NULL;
        double *dv = !strcmp(a, "--overlap") ? &o.overlap : !strcmp(a, "--hot-mass") ? &o.hot_mass
                                                                                     : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { tracegen_usage(stdout); return 0; }
        if ((iv || dv || !strcmp(a, "--seed")) && !v) goto bad;
        if (iv) *iv = atoi(argv[++i]);
        else if (dv) *dv = atof(argv[++i]);
        else if (!strcmp(a, "--seed")) o.seed = strtoull(argv[++i], NULL, 10);
        else if (a[0] != '-' && !path) path = a;
        else goto bad;
    }
    if (!path) goto bad;
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "k3-lab trace-gen: %s: cannot create\n", path);
        return K3_ERR_IO;
    }
    k3_tracegen_stats st;
    k3_err err = {0};
    int rc = k3_tracegen(&o, f, &st, &err);
    if (fclose(f) != 0 && !rc) rc = k3_fail(&err, K3_ERR_IO, "%s: write failed", path);
    if (rc) {
        fprintf(stderr, "k3-lab trace-gen: %s\n", err.msg);
        return rc;
    }
    printf("k3-lab trace-gen: wrote %s: %d tokens x %d layers, top-%d of %d; calibrated zipf s = "
           "%.3f, reuse p = %.3f; measured overlap %.1f%% (target %.1f%%), top-%d mass %.1f%% "
           "(target %.1f%%)\n", path, o.tokens, o.layers, o.top_k, o.experts, st.zipf_s,
           st.reuse, 100 * st.overlap, 100 * o.overlap, o.hot, 100 * st.hot_mass,
           100 * o.hot_mass);
    return 0;
bad:
    fprintf(stderr, "k3-lab trace-gen: bad arguments (see k3-lab trace-gen --help)\n");
    return K3_ERR_USAGE;
}
