/* store.h — the expert streaming store: routed experts read from the shards on demand into a
 * byte-budgeted cache of equal slots, with prefetch (issue 3; spec §10.5 for the layout).
 *
 * The model asks for the experts a layer's router chose (k3_store_begin), takes them one by
 * one as they become ready (k3_store_next, in completion order, not router order) and hands
 * each back once computed (k3_store_done). It never learns whether an expert came from the
 * cache or the disk.
 *
 * Invariants:
 *  - Routed experts are never read at load time: the expert map comes from the safetensors
 *    headers alone and k3_store_open touches no expert page (the arena is committed lazily).
 *  - Bytes are copied verbatim, so an expert from the store is bit-identical to the mapped
 *    one (tests/test_store.c compares logits bit for bit with the in-place path).
 *  - A slot is published (READY) only when its whole span arrived; short reads and EINTR are
 *    retried; a failed read fails the request with K3_ERR_EXPERT_IO naming shard, layer and
 *    expert and nothing is computed from the partial bytes.
 *  - One read per (layer, expert) at a time: a request for an expert already in flight waits
 *    for that read instead of issuing another.
 *  - A slot pinned by a layer in progress (requested and not yet handed back) is never
 *    evicted. The arena holds n_slots × slot_bytes ≤ budget, allocated once: the budget is a
 *    hard ceiling, and a budget below one layer's working set still completes (the layer's
 *    experts pass through the free slots in turns).
 *  - Prefetch never delays a demand read: demand reads are always dequeued first, queued
 *    prefetches are cancelled when their slot is wanted or their layer arrives unchosen, at
 *    most load_threads - 1 prefetch reads run at once, and a prefetch never takes one of the
 *    top-k slots the next layer's demand needs.
 *  - Thread safety: one mutex guards slots, queues and counters; several sessions (clients)
 *    may share one store.
 */
#ifndef K3_STORE_H
#define K3_STORE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "../format/config.h"
#include "../format/safetensors.h"
#include "../kernels/kernels.h"
#include "../util/err.h"

/* One routed expert (spec §10.3): gate w1 [inter, latent], down w2 [latent, inter],
 * up w3 [inter, latent], each MXFP4. */
typedef struct k3_expert {
    k3_mxfp4 w1, w2, w3;
} k3_expert;

enum k3_io_mode { K3_IO_AUTO = 0, K3_IO_DIRECT = 1, K3_IO_BUFFERED = -1 };
/* How the store reads (k3_store_settings.io_engine): a pool of load_threads pthreads, each
 * with blocking preads, or one thread keeping load_threads reads in flight on an io_uring
 * (liburing; falls back to the pool, with a note, where the kernel refuses a ring). */
enum k3_io_engine { K3_IO_ENGINE_DEFAULT = 0, K3_IO_ENGINE_THREADS = 1, K3_IO_ENGINE_URING = 2 };
enum k3_cache_policy { K3_POLICY_DEFAULT = 0, K3_POLICY_LRU = 1, K3_POLICY_S3FIFO = 2 };
/* Prefetch predictors (K3_PIPE); K3_PIPE_OFF is an explicit "none". */
enum { K3_PIPE_AUTO = 0, K3_PIPE_PREV = 1, K3_PIPE_LOOKAHEAD = 2, K3_PIPE_ALL = 3,
       K3_PIPE_OFF = -1 };

/* The knobs a user sets (k3_engine_opts passes them on; the store reads no environment).
 * Zero fields take the default. */
typedef struct k3_store_settings {
    double expert_gb;   /* expert_gb: cache budget in GB (1e9 bytes); <= 0 = plan default */
    int expert_slots;   /* > 0: exactly this many slots (tests, benchmarks); beats expert_gb */
    int load_threads;   /* reader threads; <= 0 = 4 */
    int direct;         /* enum k3_io_mode; AUTO = direct iff experts do not
                         * fit beside the spine and headroom in RAM, or in the
                         * plan's limit (k3_mem_plan.limit_bytes) when lower */
    int pipe;           /* predictor mask or AUTO (= all when the cache
                         * holds at least 2 × top-k slots, else off) */
    int policy;         /* enum k3_cache_policy; default S3-FIFO */
    int in_place;       /* 1: no cache, experts used in place from the mapped
                         * shards (the in-memory reference path) */
    const char *dirs;   /* extra ':'-separated folders holding shards (src/format) */
    int io_engine;      /* enum k3_io_engine; DEFAULT = threads (BENCHMARKS.md, io_uring) */
} k3_store_settings;

/* Checks the fields' ranges. Errors: K3_ERR_USAGE naming the field ("expert_gb", ...). */
int k3_store_settings_check(const k3_store_settings *s, k3_err *err);

/* Sizes of everything else in memory, for the default budget and the plan line. */
typedef struct k3_mem_plan {
    uint64_t mem_total, mem_available; /* /proc/meminfo at open */
    uint64_t limit_bytes;  /* the memory this process may use (the engine's plan: a cgroup
                            * limit, RAM); 0 = mem_total */
    uint64_t base_bytes;   /* resident before the store opened (code, tokenizer, headers) */
    uint64_t spine_bytes;  /* mapped non-expert weights (counted as resident) */
    uint64_t state_bytes;  /* the sessions' state and the prompt passes' scratch (plan.h) */
    uint64_t headroom_bytes; /* the engine's plan's, else max(2 GB, 10% of RAM) */
    uint64_t cache_bytes;  /* n_slots × slot_bytes */
} k3_mem_plan;

typedef struct k3_store k3_store;
typedef struct k3_store_client k3_store_client;

/* Builds the expert map of every MoE layer from ck's headers (checking each tensor's dtype
 * and shape against cfg), opens the shards for reading, sizes and maps the arena, starts the
 * reader threads. plan carries base/spine/state sizes in; the rest is filled in.
 * Errors: K3_ERR_CHECKPOINT (missing/mis-shaped expert tensor), K3_ERR_IO (a shard cannot be
 * opened), K3_ERR_USAGE (budget below one slot), K3_ERR_GENERIC (out of memory, threads). */
int k3_store_open(const k3_checkpoint *ck, const k3_config *cfg, const k3_store_settings *set,
                  k3_mem_plan *plan, k3_store **out, k3_err *err);
void k3_store_close(k3_store *st);

/* One line (no newline) describing the memory plan, I/O mode, policy and prefetch, and any
 * one-time notes (per-tensor fallback, O_DIRECT refused). */
void k3_store_describe(const k3_store *st, char *buf, size_t cap);

uint64_t k3_store_expert_bytes(const k3_store *st); /* bytes of all routed experts */
uint64_t k3_store_slot_bytes(const k3_store *st);   /* 0 in the in-place mode */
int k3_store_n_slots(const k3_store *st);
int k3_store_pipe(const k3_store *st);              /* resolved K3_PIPE mask (0 = off) */
/* The predictors whose prefetches are read for MoE layer `layer` (a K3_PIPE mask). The
 * lookahead (layer l+1's router on layer l's MoE input) is blind next to an MLA layer: on
 * real K3 its recall@16 is 59% elsewhere but 1-2% when layer l+1 or layer l is MLA
 * (full_attn_layers), so there the previous token's choice is read instead, also when
 * K3_PIPE asks for the lookahead alone. 0 for a layer outside [0, n_layers). */
int k3_store_layer_pipe(const k3_store *st, int layer);

/* Per-session handle (pins of the layer in progress, prediction history).
 * Errors: K3_ERR_GENERIC (out of memory). */
int k3_store_client_new(k3_store *st, k3_store_client **out, k3_err *err);
void k3_store_client_free(k3_store_client *c);
/* Forgets the previous token's choices (a new sequence). */
void k3_store_client_reset(k3_store_client *c);

/* Starts MoE layer `layer` with the router's k chosen expert ids (router order): pins those
 * cached, claims slots for the misses and submits their reads together, sorted by file and
 * offset (interleaved across drives). Records each predictor's recall for this layer.
 * Must be followed by k calls of k3_store_next/k3_store_done, then k3_store_end.
 * A batched layer (a prefill chunk) passes the UNION of its tokens' choices, k distinct ids
 * up to num_experts, so each expert is read once for the chunk; for k > top-k no recall is
 * scored and no previous choice is kept (k3_store_set_choice sets one). */
void k3_store_begin(k3_store_client *c, int layer, const int *ids, int k);

/* Remembers ids[k] (k = top-k) as the previous token's choice at layer, for K3_PIPE's
 * previous-token predictor: a batched layer passes its last token's choice. */
void k3_store_set_choice(k3_store_client *c, int layer, const int *ids, int k);

/* Waits until one not yet handed-out expert of the layer is ready and returns it: *j its
 * index in ids, *ex its weights (valid until k3_store_done(c, *j)). Experts come in the order
 * their reads complete. Errors: K3_ERR_EXPERT_IO (message names shard, layer, expert). */
int k3_store_next(k3_store_client *c, int *j, k3_expert *ex, k3_err *err);

/* As k3_store_next, but hands out every expert of the layer that is ready now, up to max
 * (at least one; waits only while none is): js[*n] their indices in ids, exs[*n] their
 * weights, each valid until its k3_store_done. Taking only ready experts means nothing is
 * waited for while these stay pinned, so a cache of top-k + 1 slots cannot deadlock. Lets the
 * MoE run all cached experts of a layer in one parallel region. Errors: as k3_store_next. */
int k3_store_next_many(k3_store_client *c, int max, int *js, k3_expert *exs, int *n,
                       k3_err *err);

/* Hands expert j back (unpins it). */
void k3_store_done(k3_store_client *c, int j);

/* Ends the layer (releases anything still pinned, e.g. after an error). */
void k3_store_end(k3_store_client *c);

/* Asks for layer's experts ids[k] ahead of need (source: K3_PIPE_PREV or K3_PIPE_LOOKAHEAD):
 * queues reads for those neither cached nor in flight, within the prefetch rules above, when
 * source is in k3_store_layer_pipe(layer). The prediction is also remembered for recall when
 * `layer` begins. */
void k3_store_prefetch(k3_store_client *c, int layer, const int *ids, int k, int source);

/* Whether a predictor reads, under K3_PIPE_AUTO: `cands` of its recent predictions were
 * neither cached nor in flight when made, and the router then chose `useful` of them.
 * busy (0..1) is the share of time the disk is already busy streaming the spine
 * (k3_store_note_spine). A prefetch saves a wait only where the disk would otherwise idle
 * (1 - busy of the time) and an unused one delays what the disk is busy with (busy of the
 * time), so a predictor pays while its used share u satisfies u (1 - busy) >= (1 - u) busy,
 * i.e. u >= busy, and at least half: a reading one pauses below max(50%, busy) - 5 points, a
 * paused one (whose predictions are still scored) resumes above it + 5 (no flapping at the
 * line); every predictor reads until 64 predictions are scored. Pure. */
int k3_prefetch_keeps(uint64_t useful, uint64_t cands, int reading, double busy);

/* Tells the store how much of the time the spine's reader has been reading: spine_read_s,
 * its total reading time so far (seconds, k3_spine_stats.read_s), at now_s (a monotonic
 * clock, seconds). The share over the interval since the last note, averaged with the
 * previous share, is the `busy` of k3_prefetch_keeps. Called after each pass when the spine
 * streams; never called: busy 0. */
void k3_store_note_spine(k3_store *st, double spine_read_s, double now_s);

/* The previous token's choice at layer, or NULL when there is none yet. */
const int *k3_store_prev_choice(const k3_store_client *c, int layer);

/* Counters since open (store-wide). */
typedef struct k3_store_stats {
    uint64_t requests;       /* experts asked for by k3_store_begin */
    uint64_t hits;           /* ready in the cache, not brought by a prefetch still unused */
    uint64_t prefetch_hits;  /* ready because a prefetch brought it */
    uint64_t prefetch_late;  /* a prefetch was still reading it (waited, partly hidden) */
    uint64_t misses;         /* read on demand */
    uint64_t prefetch_reads, prefetch_wasted; /* issued; evicted or cancelled unused */
    uint64_t prefetch_skipped; /* predictions not read: their predictor paused (auto) */
    double spine_busy;         /* share of time the spine's reader reads (k3_store_note_spine) */
    uint64_t reads;          /* completed expert reads (demand + prefetch) */
    uint64_t bytes_read;     /* bytes transferred from the shards */
    double read_s;           /* summed duration of the reads (over all reader threads) */
    double read_busy_s;      /* wall time during which at least one read was in progress
                              * (the share hidden behind compute is 1 - waited / this) */
    uint64_t recall_hits[3], recall_total[3]; /* by source (K3_PIPE_PREV, _LOOKAHEAD) */
    uint64_t peak_slots_used;/* most slots ever holding or awaiting an expert */
    uint64_t evictions;
} k3_store_stats;

void k3_store_get_stats(k3_store *st, k3_store_stats *out);

/* The engine reading: K3_IO_ENGINE_THREADS or K3_IO_ENGINE_URING (after any fallback). */
int k3_store_io_engine(const k3_store *st);

/* Test hook, called by a reader before each pread (or io_uring read) of [off, off+*len) on shard: may shrink
 * *len (a short read) or return an errno to inject (EINTR is retried, others fail the read).
 * Returns 0 to proceed. */
typedef int (*k3_store_read_hook)(void *user, int shard, uint64_t off, size_t *len);
void k3_store_set_read_hook(k3_store *st, k3_store_read_hook hook, void *user);

/* ---- streaming installs (issue 7): experts that are not on local disk yet ------------ */

/* Where the bytes of experts missing from the local shards come from: src/setup's k3_stream
 * for an install made by `k3 setup --stream` (the store knows nothing of HTTP).
 * shard is the shard's file name without its folder (e.g. "model-00001-of-00064.safetensors").
 *  local(user, shard, off, len): are bytes [off, off+len) of shard on disk? Asked by a
 *    reader before each expert read; when false, the expert comes from read().
 *  read(user, layer, expert, shard, off, len, dst, err): fills dst with bytes [off, off+len)
 *    of shard, which lie inside that expert's span; returns 0 or a k3_status with err filled.
 *    Called concurrently by the reader threads; the bytes must be verbatim, so an expert
 *    from the source is bit-identical to one read from the shard. */
typedef struct k3_expert_source {
    void *user;
    bool (*local)(void *user, const char *shard, uint64_t off, uint64_t len);
    int (*read)(void *user, int layer, int expert, const char *shard, uint64_t off,
                uint64_t len, void *dst, k3_err *err);
} k3_expert_source;

/* Installs src (copied) before the first request. A failed source read fails the request
 * with the source's own status and message (e.g. K3_ERR_NETWORK naming the expert and URL).
 * Errors: K3_ERR_USAGE in the in-place mode (in_place), which would read the
 * missing experts' holes in the mapped shards as weights. */
int k3_store_set_source(k3_store *st, const k3_expert_source *src, k3_err *err);

/* ---- replay support: the cache policies without the I/O (src/store/policy.c) ---------- */

/* Parses "lru" / "s3fifo" into enum k3_cache_policy; -1 when unknown. */
int k3_cache_policy_parse(const char *name);
const char *k3_cache_policy_name(int policy);

#endif
