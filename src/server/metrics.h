/* metrics.h — the counters of GET /metrics, in the Prometheus text exposition format
 * (version 0.0.4: "# HELP", "# TYPE", then `name{label="v"} value` lines).
 *
 * Invariants:
 *  - One k3_metrics lives in each k3_server (no global state); every function here is called
 *    with that server's mu held, so a scrape sees one consistent snapshot.
 *  - Counters only grow. Request counts are kept per (endpoint, status) from fixed tables: a
 *    URL outside the routes counts as endpoint "other" and a status outside the table as
 *    "other", so no client can grow the label set.
 *  - The engine's own counters (expert store, streamed spine) are engine-wide since load; the
 *    worker copies them in after every finished generation (k3_session_stats belongs to the
 *    worker's thread), so between generations they are those of the last one's end.
 */
#ifndef K3_METRICS_H
#define K3_METRICS_H

#include <stdint.h>

struct k3_sbuf;

/* The routes counted by endpoint (the canonical paths of http.c), then "other". */
#define K3_METRICS_ENDPOINTS 10
/* The HTTP statuses the server answers (499: the client went away before the answer, as
 * nginx counts it; issue 32, D16), then "other". */
#define K3_METRICS_CODES 15
/* Upper bounds of the rows-per-pass histogram's buckets (then +Inf). */
#define K3_METRICS_ROW_BUCKETS 11

typedef struct k3_metrics {
    unsigned long long requests[K3_METRICS_ENDPOINTS][K3_METRICS_CODES];
    unsigned long long prompt_tokens;     /* prompt tokens prefilled (reused ones excluded) */
    unsigned long long cached_tokens;     /* prompt tokens whose state was reused */
    unsigned long long completion_tokens; /* tokens generated */
    unsigned long long pass_rows[K3_METRICS_ROW_BUCKETS + 1]; /* passes per bucket (not
                                             cumulative; the last one is +Inf) */
    unsigned long long passes, rows;      /* the histogram's _count and _sum */
    unsigned long long state_hits, state_misses; /* generations that did / did not reuse a
                                             kept conversation state (echo and --no-reuse
                                             requests count as misses) */
    /* --prompt-cache (pcache.h): snapshots restored, their prompt ids and file bytes;
     * snapshots written and their bytes; files removed for the budget; files refused */
    unsigned long long pcache_hits, pcache_ram_hits, pcache_tokens, pcache_bytes_read;
    unsigned long long pcache_saves, pcache_bytes_written, pcache_evicted, pcache_skipped;
    double pcache_read_s, pcache_write_s; /* seconds restoring and writing snapshots */
    double expert_wait_s;                 /* seconds passes waited for expert reads (summed
                                             over the generations' steps) */
    /* engine-wide, copied in by the worker (see above) */
    uint64_t expert_requests, expert_hits, expert_misses; /* hits include prefetch hits;
                                             misses: waited for a read (demand or late
                                             prefetch); hits + misses = requests */
    uint64_t expert_bytes, spine_bytes;   /* bytes read from storage since load */
    double spine_wait_s;                  /* seconds passes waited for streamed spine layers */
} k3_metrics;

/* What the exposition shows beside the counters (gauges read under the same lock). */
typedef struct k3_metrics_gauges {
    int active, queued;      /* generations running / waiting in the FIFO */
    int slots, queue_limit;  /* --parallel and --queue */
    int states_kept;         /* conversation states held by the state cache */
    int states_cap;          /* its capacity (--state-cache) */
    int streams_waiting;     /* generations sitting out until their streaming client reads */
    unsigned long long backlog_peak; /* the most unread bytes a streamed reply has held */
} k3_metrics_gauges;

/* Counts one answered request: endpoint is a route's canonical path ("/v1/chat/completions",
 * "/health", ...; anything else, NULL included, is "other"), status its HTTP status. */
void k3_metrics_request(k3_metrics *m, const char *endpoint, int status);

/* Counts one forward pass of `rows` token rows (a prefill chunk, a decode step, or later
 * several sessions' rows in one pass). */
void k3_metrics_pass(k3_metrics *m, int rows);

/* Appends the whole exposition (text/plain; version=0.0.4) to b. */
void k3_metrics_text(const k3_metrics *m, const k3_metrics_gauges *g, struct k3_sbuf *b);

#endif
