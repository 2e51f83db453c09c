/* store_internal.h — the store's private structures, shared by map.c, io.c and store.c. */
#ifndef K3_STORE_INTERNAL_H
#define K3_STORE_INTERNAL_H

#include <pthread.h>
#include <sys/types.h>

#include "policy.h"
#include "store.h"

/* O_DIRECT needs offsets, lengths and buffers aligned to the logical block size; 4096 covers
 * every common device. Spans are widened to this alignment and read whole. */
#define K3_IO_ALIGN 4096u
/* k3_store_read_expert's "the expert source failed; see st->source_err" (not an errno). */
#define K3_STORE_ESOURCE (-2)
#define K3_EXPERT_PARTS 6 /* w1 packed, w1 scale, w2 packed, w2 scale, w3 packed, w3 scale */

enum slot_state { SLOT_EMPTY, SLOT_INFLIGHT, SLOT_READY, SLOT_FAILED };
enum slot_job { JOB_NONE, JOB_DEMAND, JOB_PREFETCH, JOB_RUNNING };

typedef struct k3_slot {
    int key;            /* layer * n_experts + expert, -1 when empty */
    uint8_t state;      /* enum slot_state */
    uint8_t job;        /* enum slot_job: queued (which queue), being read, or none */
    uint8_t by_prefetch;/* brought by a prefetch and not yet used by a demand */
    int pins;           /* requests holding it (waiting for it or computing with it) */
    int qprev, qnext;   /* links in the demand or prefetch queue */
    int err;            /* failed read: errno, or -1 for end of file */
    int err_shard;      /* the shard it was reading */
    uint64_t err_at;    /* file offset where the failed read stopped */
} k3_slot;

typedef struct k3_queue {
    int head, tail;
} k3_queue;

/* Where one expert's six tensors are; `contig` when they lie back to back in order in one
 * shard, so that one read of [off[0], off[0] + expert_bytes) brings all of them. */
typedef struct k3_expert_loc {
    int32_t shard[K3_EXPERT_PARTS];
    uint64_t off[K3_EXPERT_PARTS];
    uint8_t contig;
    uint8_t mapped; /* 0 for keys of non-MoE layers */
} k3_expert_loc;

struct k3_store {
    const k3_checkpoint *ck;
    int n_layers, n_experts, top_k;
    int64_t inter, latent;
    /* expert map */
    k3_expert_loc *loc;                 /* [n_layers * n_experts] */
    uint64_t part_bytes[K3_EXPERT_PARTS];
    uint64_t expert_bytes;              /* one expert: the sum of part_bytes */
    uint64_t n_mapped;                  /* experts in the map */
    uint64_t n_fallback;                /* experts needing per-tensor reads */
    int first_fallback_key;
    /* files */
    int *fd;                            /* [ck->n_shards] read descriptors */
    dev_t *dev;                         /* device of each shard (drives read in parallel) */
    int direct, dontneed, direct_refused;
    /* settings, resolved */
    int in_place, pipe, policy_kind, n_threads;
    uint8_t *layer_pipe;                /* [n_layers] predictors read for each layer: pipe,
                                         * with lookahead replaced by prev next to MLA layers */
    /* cache */
    uint8_t *arena;
    size_t arena_bytes, slot_bytes;
    int n_slots;
    k3_slot *slots;
    int *pins;                          /* [n_slots] copy of slots[].pins for the policy */
    int32_t *where;                     /* [n_keys] slot holding / reading the key, or -1 */
    int *free_slots, n_free;
    int n_pinned, n_pf_inflight, n_used;
    k3_policy pol;
    k3_queue dq, pq;                    /* demand and prefetch queues */
    int pf_running, max_pf_running;
    /* auto prefetch (K3_PIPE_AUTO): per predictor, of its recent read-worthy predictions
     * (cand) how many the router then chose, halved every PF_WINDOW; paused while too few */
    int pf_auto;
    uint64_t pf_cands[3], pf_useful[3];
    uint8_t pf_paused[3];
    double spine_busy;                  /* share of time the spine's reader reads, 0..1 */
    double spine_read_s, spine_note_s;  /* at the last k3_store_note_spine */
    long spine_notes;
    /* readers */
    int io_engine;                      /* enum k3_io_engine, resolved (after any fallback) */
    struct k3_uring *uring;             /* uring.c's ring, when io_engine is URING */
    pthread_t *thr;
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    int stop;
    k3_store_stats stats;
    int n_running;                      /* reads in progress (for stats.read_busy_s) */
    double busy_since;                  /* when n_running last went from 0 to 1 */
    k3_expert_source source;            /* experts not on disk yet (streaming install) */
    k3_err source_err;                  /* the last failed source read (guarded by mu) */
    k3_store_read_hook hook;
    void *hook_user;
    k3_mem_plan plan;
    char notes[512];
};

struct k3_store_client {
    k3_store *st;
    int layer, k;
    int *ids, *slot;                    /* [top_k] this layer's choice and its slots */
    uint8_t *stage;                     /* [top_k] enum client_stage */
    int *prev_ids;                      /* [n_layers][top_k] previous token's choice */
    uint8_t *has_prev;                  /* [n_layers] */
    int *pred;                          /* [3][n_layers][top_k] predictions by source */
    uint8_t *has_pred;                  /* [3][n_layers] */
    uint8_t *cand;                      /* [3][n_layers][top_k] 1: the prediction was neither
                                         * cached nor in flight when made (it asked for a read,
                                         * or would have, had its predictor not paused) */
    int *batch, *rank;                  /* [top_k] scratch: slots to submit, their drive rank */
};

/* store.c: orders one burst of reads, batch[n] (slot indices), for the readers: sorted by
 * (shard, offset) of each slot's expert, then interleaved across drives (st->dev): the i-th
 * read of every drive before the (i+1)-th of any, so that all drives read at once. rank is
 * scratch of n ints. */
void k3_store_order_reads(const k3_store *st, int *batch, int *rank, int n);

/* map.c */
int k3_store_build_map(k3_store *st, const k3_config *cfg, k3_err *err);
/* Slot offsets of the six parts of key's tensors (when read by k3_store_read_expert). */
void k3_store_part_offsets(const k3_store *st, int key, size_t off[K3_EXPERT_PARTS]);
/* The slot layout needs this many bytes per slot. */
size_t k3_store_slot_size(const k3_store *st);

/* io.c */
int k3_store_open_files(k3_store *st, k3_err *err);
void k3_store_close_files(k3_store *st);
/* Reads key's expert into buf (a slot). Returns 0, or an errno (-1 = end of file) with
 * *shard and *at set to where it stopped. Retries EINTR and short reads. Adds to *bytes. */
int k3_store_read_expert(k3_store *st, int key, uint8_t *buf, int *shard, uint64_t *at,
                         uint64_t *bytes);
/* One aligned span of an expert's read: bytes [start, start + len) of shard land at slot
 * offset `region`; the read is complete once `need` (<= len) bytes arrived. */
typedef struct k3_span {
    int shard;
    uint64_t start, len, need;
    size_t region;
} k3_span;
/* key's spans when it is read from the shards: 1 for a contiguous expert, else 6. */
int k3_store_expert_spans(const k3_store *st, int key, k3_span out[K3_EXPERT_PARTS]);
/* A streaming install (st->source.read set): fills buf from the source when some of key's
 * bytes are not on disk. Returns 1 when all are local (read them from the shards), 0 when
 * the source filled buf, or K3_STORE_ESOURCE (*shard, *at set). */
int k3_store_read_source(k3_store *st, int key, uint8_t *buf, int *shard, uint64_t *at,
                         uint64_t *bytes);
/* Reader thread body (store.c owns the queues). */
void *k3_store_reader_main(void *arg);
/* Both engines take and finish reads through these, under st->mu, so the queue rules
 * (demand first, at most max_pf_running prefetches) and the publishing are one code.
 * take: the next slot to read, or -1 when none may start now; *is_pf, *t0 (k3_now_s) out.
 * finish: records the read's outcome (e: 0 or as k3_store_read_expert) and wakes waiters. */
int k3_store_take_read(k3_store *st, int *is_pf, double *t0);
void k3_store_finish_read(k3_store *st, int s, int is_pf, int e, int shard, uint64_t at,
                          uint64_t bytes, double t0);

/* uring.c: the io_uring engine. start: creates the ring and its thread; returns 0, or an
 * errno when the kernel refuses a ring (the caller falls back to the thread pool).
 * wake: tells the thread new work is queued (called under st->mu after queueing).
 * stop: joins the thread (after st->stop is set) and frees the ring. */
int k3_uring_start(k3_store *st);
void k3_uring_wake(k3_store *st);
void k3_uring_stop(k3_store *st);

#endif
