/* replay.h — router traces replayed against the cache policies and Belady's MIN, and a
 * generator of synthetic traces with K3's published routing locality (issue 3, item 8).
 *
 * Invariants:
 *  - A trace is a sequence of requests, one per (step, layer), each the router's k expert ids
 *    (the --router-trace jsonl format). Keys are layer * n_experts + id.
 *  - The replay models the store exactly as it caches: a request's experts are pinned until the
 *    request ends, misses fill free slots first, then the policy's victim (src/store/policy.c,
 *    the same code the store runs). Belady evicts the key whose next use is farthest (offline
 *    MIN), never one of the current request. Budgets are at least k + 1 slots.
 *  - The generator is deterministic for a seed; its calibrated parameters and the statistics
 *    measured on what it wrote are reported, never assumed.
 */
#ifndef K3_REPLAY_H
#define K3_REPLAY_H

#include <stdint.h>
#include <stdio.h>
#include "../util/err.h"

typedef struct k3_route_trace {
    int n_req, k, n_layers, n_experts; /* n_layers / n_experts: largest seen + 1 */
    int32_t *key;                      /* [n_req][k] */
} k3_route_trace;

/* Reads a router trace (jsonl: {"step","layer","ids":[...]} per line; every line the same k).
 * Errors: K3_ERR_IO (unreadable), K3_ERR_INPUT (a malformed line, named by number). */
int k3_route_trace_read(const char *path, k3_route_trace *t, k3_err *err);
void k3_route_trace_free(k3_route_trace *t);

#define K3_POLICY_BELADY 100
/* Hits of the trace against a cache of n_slots (>= k + 1) under policy (enum
 * k3_cache_policy, or K3_POLICY_BELADY). Returns -1 when out of memory. */
int64_t k3_replay(const k3_route_trace *t, int policy, int n_slots);

/* Hits of an oracle that holds the n_slots most requested keys of the whole trace from their
 * first use on: the best a policy can do that knows only popularity (what LFU estimates),
 * not when each expert will come back. Returns -1 when out of memory. */
int64_t k3_replay_static(const k3_route_trace *t, int n_slots);

typedef struct k3_tracegen_opts {
    int tokens, layers, experts, top_k, hot;
    double overlap;   /* target share of a layer's choice repeated from the previous token */
    double hot_mass;  /* target share of selections taken by the `hot` most chosen experts */
    uint64_t seed;
} k3_tracegen_opts;

typedef struct k3_tracegen_stats {
    double zipf_s, reuse;          /* calibrated popularity exponent and reuse probability */
    double overlap, hot_mass;      /* measured on the written trace */
} k3_tracegen_stats;

/* Writes a synthetic trace to out. Each layer has its own popularity order (Zipf with
 * exponent s over a random permutation); each of a token's k slots repeats a not yet chosen
 * expert of the previous token with probability `reuse`, else draws by popularity without
 * replacement. s and reuse are calibrated by simulation to hit hot_mass and overlap.
 * Errors: K3_ERR_USAGE (inconsistent options), K3_ERR_IO (write failed). */
int k3_tracegen(const k3_tracegen_opts *o, FILE *out, k3_tracegen_stats *st, k3_err *err);

#endif
