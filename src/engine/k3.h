/* k3.h — the engine's public API: an immutable loaded model (k3_engine) and one mutable
 * timeline over it (k3_session). The CLI, and later the REPL and server, are thin clients.
 *
 * Invariants:
 *  - k3_engine is read-only after k3_engine_load; several sessions may share it.
 *  - A session holds all per-sequence state: KDA recurrent + conv state, the MLA KV cache,
 *    the position, and scratch buffers sized at creation. k3_session_step allocates nothing.
 *  - Weights are used in place from memory-mapped shards; nothing is widened to f32 at load.
 *    With a spine budget (k3_engine_opts.spine_gb) the layers that do not fit are read per
 *    pass with pread into staging buffers instead (src/model/spine.h): same bytes, same output.
 *  - Logits are exact float32 per spec §2 unless the engine was loaded with the int8 spine
 *    (k3_engine_opts.spine; built by `k3 pack`, docs/PACKED-SPINE.md) or, on top of it, with
 *    int8 activations (k3_engine_opts.approx): the two lossy modes, both opt-in.
 */
#ifndef K3_H
#define K3_H

#include <signal.h>
#include <stdint.h>
#include <stddef.h>
#include "../util/err.h"
#include "../format/config.h"
#include "plan.h"          /* k3_plan, k3_plan_model (k3_engine_plan) */
#include "../model/pass.h" /* k3_trace, k3_trace_point, k3_phase_times, k3_spine_stats,
                             * K3_DEFAULT_CHUNK, K3_MAX_CHUNK (re-exported) */

typedef struct k3_engine k3_engine;
typedef struct k3_session k3_session;
typedef struct k3_tokenizer k3_tokenizer;

/* Which copy of the spine's BF16 matrices the engine multiplies with. */
enum k3_spine_mode {
    K3_SPINE_BF16 = 0, /* the checkpoint's BF16 weights: exact (the library default) */
    K3_SPINE_AUTO = 1, /* the lossless pack when it exists, else the int8 pack when that exists
                        * (building it was the opt-in), else BF16 (the CLI default); on
                        * --device cuda the lossless pack is passed over (a CPU format) */
    K3_SPINE_INT8 = 2, /* the packed int8 spine; NOT exact; an error when it does not exist */
    K3_SPINE_LOSSLESS = 3, /* the lossless pack (k3 pack --lossless): exact, the BF16 bits in
                            * 12 per weight decoded in the kernels; an error when it does not
                            * exist; CPU only */
};

struct k3_expert_source; /* src/store/store.h */

/* What k3_engine_load is told. Every field is an explicit value: the library reads no
 * environment (the CLI's option table, src/cli/opts.h, maps flags and K3_* variables onto
 * these fields). Start from k3_engine_opts_default(); errors name the fields (e.g.
 * "expert_gb"), which the CLI maps back to its flags. */
struct k3_machine_mem; /* src/engine/plan.h */

/* Expert parallelism (src/dist/dist.h): what rank 0's engine tells the other ranks before it
 * changes a session, so that they replay the same passes on their copies. */
enum k3_rank_op_kind {
    K3_ROP_NEW = 1,  /* arg = max_ctx */
    K3_ROP_FREE,
    K3_ROP_RESET,
    K3_ROP_REWIND,   /* arg = the position */
    K3_ROP_PASS,     /* one pass: arg = its segments, flags = 1 when it ran on a multistep's
                      * scratch (k3_multistep_run: the followers replay it there) else 0 (one
                      * session's step or forward); ids[n] = per segment K3_ROP_SEG_INTS ints
                      * (session low, high 32 bits; its K3_BATCH_* flags, model.h; its id
                      * count m) then
                      * its m ids */
};
#define K3_ROP_SEG_INTS 4
#define K3_ROP_PASS_INTS (K3_MAX_CHUNK * (K3_ROP_SEG_INTS + 1)) /* the largest pass's ids[] */
typedef struct k3_rank_op {
    int kind;                /* enum k3_rank_op_kind */
    unsigned long long session; /* which session (rank 0's own name for it) */
    int arg, flags, n;
    const int32_t *ids;
} k3_rank_op;
typedef struct k3_rank_ops {
    void *user;
    /* Sends op to every other rank. Errors: K3_ERR_DIST naming the rank that did not take it. */
    int (*send)(void *user, const k3_rank_op *op, k3_err *err);
} k3_rank_ops;
#define K3_SPINE_GB_PLAN (-1.0) /* k3_engine_opts.spine_gb: planned */
struct k3_lab_opts;             /* src/engine/k3_lab.h: k3-lab's and the tests' controls */

typedef struct k3_engine_opts {
    int threads;      /* OpenMP threads for the kernels (>= 1); 0 leaves the OpenMP runtime's
                         own count. Default: the physical cores (k3_cpu_physical_cores) */
    const char *kernels; /* kernel path ("scalar", "avx2", "avx512", "neon"); NULL = the
                            fastest this CPU runs (kernels.h) */
    int verbose;      /* 1: print the load summary line to stderr */
    int spine;        /* enum k3_spine_mode (default K3_SPINE_BF16) */
    const char *pack_dir; /* folder holding the packed spine; NULL = MODEL_DIR */
    int approx;       /* 1: multiply the int8 spine with int8 activations (blocks of 32):
                         faster, NOT exact; needs the int8 spine (an error otherwise). 0: off */
    /* Expert store (src/store/store.h): routed experts are read on demand into a
     * byte-budgeted cache. */
    double expert_gb;         /* cache budget in GB; 0 = the memory plan's default */
    int load_threads;         /* expert reader threads (default 4); reads in flight with
                               * the io_uring engine */
    int io_engine;            /* enum k3_io_engine: K3_IO_ENGINE_DEFAULT (0 = threads),
                               * K3_IO_ENGINE_THREADS, K3_IO_ENGINE_URING */
    int direct;               /* enum k3_io_mode: K3_IO_AUTO (0, the default: O_DIRECT when the
                               * experts do not fit beside the plan in RAM or in the plan's
                               * limit, a cgroup), K3_IO_DIRECT, K3_IO_BUFFERED */
    int pipe;                 /* prefetch predictors: K3_PIPE_AUTO (0, the default: all when
                               * the cache holds 2 x top-k slots), _PREV, _LOOKAHEAD, _ALL, _OFF */
    const char *cache_policy; /* "lru" or "s3fifo"; NULL = s3fifo */
    const char *dirs;         /* extra ':'-separated folders holding shards; NULL = none */
    int experts_in_place;     /* 1: no cache, experts used from the mapping */
    /* Where the bytes of experts missing from the local shards come from (a streaming
     * install: the CLI wires src/setup's fetcher in); NULL = every expert is on disk. Copied
     * at load; its user pointer must outlive the engine. */
    const struct k3_expert_source *expert_source;
    /* Where sessions run (src/engine/backend.h): "cpu", "cuda" or "auto" (the GPU when this
     * build has CUDA and a device answers); NULL = "cpu". */
    const char *device;
    double gpu_gb;            /* device memory budget in GB (0 = free memory less a margin);
                               * the GPU backend only */
    /* Resident spine budget (the CPU backend; src/model/spine.h): the head and the first
     * layers that fit stay resident, the rest are streamed from the files per pass (double
     * buffered); the output is identical for every budget. */
    double spine_gb;          /* RAM for the spine in GB (resident + staging), 0 to 1e6; 0
                               * streams every layer; K3_SPINE_GB_PLAN (the default): the
                               * memory planner's choice (src/engine/plan.h: in place when it
                               * fits beside the expert cache's minimum, else a budget) */
    int sessions;             /* sessions that will be open at once, for the plan (default 1) */
    int pass_sessions;        /* sessions one pass may carry (the server's --parallel), for the
                               * plan: a prompt pass that may be stopped keeps a copy of each
                               * one's KDA state (k3_plan.undo_bytes); 0 = 1 */
    int ctx;                  /* positions each session is opened with, for the plan (0: the
                               * default min(max_position_embeddings, 4096)); k3_session_new
                               * refuses a larger session (plan.h, "Sessions") */
    int prompt_rows;          /* ids per prompt pass the plan counts: 0 = as many as it can give
                               * (up to ctx), > 0 at most this (a --chunk given), < 0 none beyond
                               * K3_DEFAULT_CHUNK (the server, whose passes hold 32 ids) */
    double memory_gb;         /* > 0: plan for a machine of this many GB (RAM, all available,
                               * no cgroup) instead of probing this one; 0: probe */
    const struct k3_machine_mem *machine; /* the machine's memory (plan.h); NULL = probed from
                                           * /proc and the process's cgroup (tests give one) */
    /* Expert parallelism (src/dist): the MoE's exchange with the other ranks (every rank), and
     * the op mirror (rank 0 only); NULL = one process. Must outlive the engine. With
     * rank_ops, k3_session_load is refused (the other ranks could not follow it). */
    const k3_expert_ranks *expert_ranks;
    const k3_rank_ops *rank_ops;
    /* k3-lab's and the tests' controls (exact cache sizes, GPU profiling, ...: k3_lab.h);
     * NULL in the product. Must outlive k3_engine_load. */
    const struct k3_lab_opts *lab;
} k3_engine_opts;

/* The library's defaults: threads = physical cores, BF16 spine, expert store on its memory
 * plan (4 readers, auto I/O, auto prefetch, s3fifo), device "cpu", the planned spine
 * (spine_gb K3_SPINE_GB_PLAN), one session; everything else 0 / NULL. */
k3_engine_opts k3_engine_opts_default(void);

/* Loads MODEL_DIR (a Hugging Face snapshot: config.json, model.safetensors.index.json,
 * shards, tiktoken.model, tokenizer_config.json). Parses headers only and maps the shards;
 * load time is proportional to header sizes. vision_tower.* / mm_projector.* are skipped and
 * shards holding only them are never opened.
 * With opts->spine INT8 (or AUTO and a pack present) the packed spine is opened, its header and
 * table checksums and size checked, and it must have been packed from this checkpoint.
 * Errors: K3_ERR_IO, K3_ERR_CONFIG, K3_ERR_CHECKPOINT, K3_ERR_TOKENIZER, K3_ERR_PACK; the
 * message names the file and tensor. */
int k3_engine_load(const char *model_dir, const k3_engine_opts *opts, k3_engine **out,
                   k3_err *err);

/* What k3_engine_plan reports: the memory plan k3_engine_load would make with the same opts
 * on the same machine, and what it was made for. All sizes in bytes. */
typedef struct k3_engine_plan_info {
    k3_plan plan;             /* the plan, settled at the spine's layer granularity */
    k3_plan_model model;      /* its inputs: spine, staging, expert slot, all experts, top-k,
                               * one session at plan.ctx positions */
    k3_spine_stats spine;     /* the spine budget's layers and bytes (budgeted 0: in place) */
    uint64_t spine_mapped_bytes; /* the spine as mapped (every non-expert weight) */
    int n_layers, moe_layers, n_experts;
    char line[1024];          /* "memory planner: ...", the line k3_engine_load prints */
    char spine_line[1024];    /* "spine budget ...": the spine plan's line */
    char spine_mode[5120];    /* "spine: BF16 ..." / "spine: int8 ..." */
} k3_engine_plan_info;

/* Plans memory for MODEL_DIR exactly as k3_engine_load would (same code: config, tokenizer,
 * headers, pack, binding, memory plan, the spine's layer-granular plan) without reading a
 * weight: the shards are mapped, never touched, so a snapshot whose shards hold only their
 * headers (sparse files) plans too. Errors: those of k3_engine_load before any read, and
 * K3_ERR_USAGE when the model cannot run within the limit (the message has the numbers). */
int k3_engine_plan(const char *model_dir, const k3_engine_opts *opts, k3_engine_plan_info *out,
                   k3_err *err);
void k3_engine_free(k3_engine *e);
const k3_config *k3_engine_config(const k3_engine *e);
const k3_tokenizer *k3_engine_tokenizer(const k3_engine *e);
/* Bytes of the mapped weights the forward pass reads (spine + routed experts). */
uint64_t k3_engine_weight_bytes(const k3_engine *e);
/* 1 when the engine multiplies with the int8 packed spine (not exact), 0 for BF16. */
int k3_engine_spine_int8(const k3_engine *e);
/* 1 when --approx (int8 activations) is on. */
int k3_engine_approx(const k3_engine *e);
/* The kernel path the engine runs ("scalar", "avx2", "avx512", "neon"): opts->kernels when
 * given, else the fastest this CPU runs (kernels.h). Tests that run every path assert it. */
const char *k3_engine_kernels(const k3_engine *e);
/* The spine budget's plan and its counters since load (k3_spine_stats: src/model/pass.h; all
 * zero without a budget). */
void k3_engine_spine_stats(const k3_engine *e, k3_spine_stats *out);

/* What k3_engine_describe tells, one line per part (the lines the load prints with
 * opts->verbose): */
enum k3_describe_part {
    K3_DESCRIBE_SPINE = 1,      /* which spine is used and, for int8, that it is not exact and
                                 * the quality figures `k3 pack` stored for it (or none) */
    K3_DESCRIBE_SPINE_PLAN = 2, /* the spine budget's plan (resident and streamed layers, bytes
                                 * of each, staging), or "spine budget: none" */
    K3_DESCRIBE_STORE = 4,      /* the expert store: memory plan, I/O mode, policy, prefetch */
    K3_DESCRIBE_DEVICE = 8,     /* the device sessions run on and, for a GPU, its memory plan
                                 * (resident and streamed layers, expert cache, state) */
};
#define K3_DESCRIBE_CAP 8192 /* bytes that hold every part */
/* Writes the parts selected by the bit set `parts` into buf (cap bytes, NUL-terminated,
 * truncated to fit) in the order above, separated by '\n', without a final newline. */
void k3_engine_describe(const k3_engine *e, int parts, char *buf, size_t cap);
/* When the GPU backend profiles (k3_lab_opts.gpu_profile, k3_lab.h): the mean device
 * milliseconds of each layer over the steps so far into ms [num_hidden_layers + 1] (the last
 * entry: the head) and, when bytes is non-NULL, the weight bytes each reads per token (spine +
 * top-k experts).
 * Returns the number of steps averaged, else 0. */
int k3_engine_layer_profile(const k3_engine *e, double *ms, uint64_t *bytes);

/* Trace hooks (enum k3_trace_point, k3_trace) and per-phase times (k3_phase_times) are
 * declared in src/model/pass.h, included above. */

/* Creates a session able to hold max_ctx positions (0 = min(max_position_embeddings, 4096)).
 * The KV cache is reserved virtually and committed as positions are used.
 * Errors: K3_ERR_GENERIC (out of memory), K3_ERR_INPUT (max_ctx out of range). */
int k3_session_new(const k3_engine *e, int max_ctx, k3_session **out, k3_err *err);
void k3_session_free(k3_session *s);
/* Forgets every position: zero KDA/conv state, empty KV cache. */
void k3_session_reset(k3_session *s);
/* Number of positions processed so far. */
int k3_session_pos(const k3_session *s);
int k3_session_max_ctx(const k3_session *s);
/* Installs (or with NULL removes) a trace hook; the struct is copied. */
void k3_session_set_trace(k3_session *s, const k3_trace *trace);

/* Runs the forward pass (spec §3) for `token` at position k3_session_pos(s), updating the
 * KDA/conv state and KV cache. Writes vocab_size float32 logits to `logits` when non-NULL
 * (prefill may pass NULL to skip lm_head).
 * Errors: K3_ERR_INPUT (token outside [0, vocab_size), context full); K3_ERR_CHECKPOINT (the
 * logits written hold a NaN or Inf: corrupt weights, int8 pack or --approx; the message names
 * the position and the vocab id); K3_ERR_EXPERT_IO / K3_ERR_IO (a routed expert / a streamed
 * spine layer could not be read: the session is reset, k3_session_pos 0). */
int k3_session_step(k3_session *s, int32_t token, float *logits, k3_err *err);

/* ---- observability (issue 3) -------------------------------------------------------- */

typedef struct k3_run_stats {
    k3_phase_times time, last;      /* the session's steps summed; its last step */
    uint64_t expert_requests, hits, prefetch_hits, prefetch_late, misses; /* engine-wide */
    uint64_t prefetch_reads, prefetch_wasted, reads, bytes_read;
    uint64_t prefetch_skipped;      /* predictions not read: their predictor paused (auto) */
    double spine_busy;              /* share of time the streamed spine's reader reads */
    double read_s;                  /* summed over reader threads */
    double read_busy_s;             /* wall time with an expert read in progress */
    double recall_prev, recall_lookahead; /* fraction of chosen experts predicted; -1 = none */
    uint64_t cache_bytes, peak_cache_bytes; /* expert arena; most of it ever occupied */
    uint64_t plan_bytes, peak_rss_bytes;    /* the startup memory plan; measured peak RSS */
    int n_layers;                           /* the last step per layer, valid until the next */
    const double *layer_eload_s, *layer_expert_s; /* step: MoE wait and expert compute */
    int spine_streams;                      /* a spine budget streams layers (engine-wide: */
    uint64_t spine_bytes_read;              /*  bytes read, time reading, time passes    */
    double spine_read_s, spine_wait_s;      /*  waited for them; src/model/spine.h)      */
} k3_run_stats;

void k3_session_stats(const k3_session *s, k3_run_stats *out);
/* The end-of-run line (no newline): time total / attn / moe (eload) / head, expert requests,
 * hit rate without and with prefetch hits, GB streamed, GB/s, prefetch recall, peak RSS, and
 * the share of read time hidden behind compute: 1 - waited / read, for the experts (eload
 * against read_busy_s), the streamed spine (spine_wait_s against spine_read_s) and both. */
void k3_run_stats_summary(const k3_run_stats *st, char *buf, size_t cap);
/* The K3_PROFILE line for the last step, or for the last batched pass as a whole (its tokens
 * and the time per token: the phases of a pass are not per token) (no newline). */
void k3_run_stats_profile(const k3_run_stats *st, char *buf, size_t cap);

/* ---- token history, prefill with reuse, state files ----------------------------------------
 * A session remembers the ids it was fed. Callers hand it a whole token sequence (e.g. a
 * re-rendered conversation) and it computes only what is new; the KDA recurrence cannot be
 * rewound, so anything but an exact extension starts again from an empty state. */

/* The ids fed so far (k3_session_pos of them), oldest first; valid until the next step. */
const int32_t *k3_session_tokens(const k3_session *s);

/* Makes the session hold exactly ids[0, n): when the ids fed so far are a strict prefix of
 * ids, only the rest is fed; otherwise (a different or equal sequence) the session is reset
 * and all of ids is fed. Writes the logits after ids[n-1] (vocab_size floats) when `logits`
 * is non-NULL. *reused (may be NULL) receives the number of positions kept.
 * Errors: those of k3_session_step; K3_ERR_INPUT (n exceeds the context);
 * K3_ERR_INTERRUPTED (the interrupt flag was raised, or the trace's on_layer stopped a pass:
 * the ids fed so far, in the passes before it, are kept; the stopped pass left no trace). */
int k3_session_prefill(k3_session *s, const int32_t *ids, size_t n, float *logits, int *reused,
                       k3_err *err);

/* What k3_session_prefill_with calls after each pass (--dump-logits, progress, a cancel). */
typedef struct k3_prefill_hook {
    void *user;
    /* The pass just fed ids at positions [pos, pos + n); rows = their logits [n][vocab_size]
     * when all_logits, else NULL; left = ids still to feed after it. A nonzero status stops
     * the prefill with it (the ids fed so far are kept, as after an interrupt). */
    int (*on_pass)(void *user, int pos, int n, const float *rows, size_t left, k3_err *err);
    int all_logits; /* 1: the logits at every position (lm_head for each id), for on_pass */
} k3_prefill_hook;

/* k3_session_prefill, calling hook (may be NULL) after each pass of k3_session_chunk ids.
 * This is the one prefill path: k3_session_prefill is it with no hook.
 * Errors: those of k3_session_prefill; K3_ERR_GENERIC (out of memory for all_logits rows);
 * what on_pass returned. */
int k3_session_prefill_with(k3_session *s, const int32_t *ids, size_t n, float *logits,
                            int *reused, const k3_prefill_hook *hook, k3_err *err);

/* The one prefill path in steps, for a caller that runs the passes itself (k3 serve: prompt
 * chunks beside other sessions' rows in one pass); k3_session_prefill_with is these steps
 * with k3_session_forward. k3_prefill_begin: makes s ready to hold ids[0, n) as
 * k3_session_prefill decides (the fed history kept when it is a strict prefix, else a reset;
 * *reused may be NULL); ids must outlive p. Errors: K3_ERR_INPUT (n exceeds the context).
 * k3_prefill_next: the next chunk (*ids, the count returned: at most max and the session's
 * chunk, 0 when all is fed), to feed at the session's position. k3_prefill_fed: after the
 * pass that fed n of them. */
typedef struct k3_prefill {
    k3_session *s;
    const int32_t *ids;
    size_t n, at, first; /* ids fed up to at; first = the ids kept */
} k3_prefill;
int k3_prefill_begin(k3_prefill *p, k3_session *s, const int32_t *ids, size_t n, int *reused,
                     k3_err *err);
int k3_prefill_next(const k3_prefill *p, int max, const int32_t **ids);
void k3_prefill_fed(k3_prefill *p, int n);

/* A flag that k3_session_prefill checks before each chunk (set it from a SIGINT handler or
 * another thread to stop a long prefill); NULL removes it. */
void k3_session_set_interrupt(k3_session *s, const volatile sig_atomic_t *flag);

/* ---- batched passes: prefill chunks and speculative verification ---------------------------
 * A pass feeds several tokens at once: each spine matrix and each routed expert chosen by any
 * of them is read once per pass (matrix-matrix products; the MoE runs each expert of the
 * tokens' union once over the tokens that chose it). KDA still runs its recurrence token by
 * token and MLA attends causally, so a pass is BIT-IDENTICAL to feeding its tokens one by one
 * with k3_session_step (logits, state, routing); tests/test_prefill.c checks it. */

/* K3_DEFAULT_CHUNK, K3_MAX_CHUNK and K3_MAX_SPEC: src/model/pass.h. */

/* Tokens per pass of k3_session_prefill (clamped to 1..K3_MAX_CHUNK; 1 = token by token).
 * Default: the memory plan's prefill_rows (plan.h), at least K3_DEFAULT_CHUNK: a pass reads
 * each routed expert its ids chose once, so a prompt that fits one pass reads each (layer,
 * expert) pair it routes to once, whatever the expert cache holds. A prefill hook that wants
 * every position's logits gets passes of at most K3_DEFAULT_CHUNK (the logit rows). */
void k3_session_set_chunk(k3_session *s, int chunk);
int k3_session_chunk(const k3_session *s);

/* k3_session_forward flags: logits at every position ([n][vocab_size]) instead of after the
 * last id only ([vocab_size]); keep what k3_session_rewind needs to undo part of the pass. */
enum { K3_FWD_ALL_LOGITS = 1, K3_FWD_REWINDABLE = 2 };

/* Feeds ids[0, n) (1 <= n <= K3_MAX_CHUNK) at positions k3_session_pos(s).. in one pass and
 * writes logits (may be NULL) as flags say. On a device backend (k3_session_can_rewind 0) the
 * ids are stepped one by one and K3_FWD_REWINDABLE is refused (K3_ERR_USAGE).
 * Errors: those of k3_session_step; K3_ERR_INPUT (n out of range). */
int k3_session_forward(k3_session *s, const int32_t *ids, int n, float *logits, int flags,
                       k3_err *err);

/* Goes back to position pos inside the last k3_session_forward pass made with
 * K3_FWD_REWINDABLE (and nothing fed since): the session ends exactly — bit for bit: KDA
 * state, conv windows, MLA cache, history — as if only the ids before pos had been fed. Costs
 * a copy of the KDA state plus the recurrence of the kept ids; no weight is read.
 * Errors: K3_ERR_INPUT (pos outside that pass), K3_ERR_USAGE (a device backend). */
int k3_session_rewind(k3_session *s, int pos, k3_err *err);
/* 1 when this session's backend runs batched passes and rewinds (the CPU), else 0. */
int k3_session_can_rewind(const k3_session *s);

/* Writes the session's timeline to path: the ids, the KDA and conv state, the used part of
 * the latent MLA cache, a fingerprint of the model (config.json, every tensor's name, dtype and
 * shape, the first and last 4 KiB of every non-expert tensor, the spine mode) and a
 * checksum. Size at K3 widths: ~465 MB of KDA and conv state plus 55 KB per position (the
 * latent MLA rows, state.h).
 * Format: src/model/state_file.h.
 * Errors: K3_ERR_IO naming path. */
int k3_session_save(const k3_session *s, const char *path, k3_err *err);

/* Replaces the session's timeline with the one saved in path.
 * Errors: K3_ERR_IO (unreadable, not a k3 state file, truncated, checksum mismatch: the
 * session is then reset), K3_ERR_INPUT (saved from another model or another spine mode, or
 * more positions than this session's context); the session is unchanged for these. */
int k3_session_load(k3_session *s, const char *path, k3_err *err);

/* k3_session_load for a cache of states (serve's --state-dir): loads only a file that holds
 * exactly ids[0, n) and was written by this k3 build; K3_ERR_INPUT otherwise (another
 * process's file under the same name, another conversation), the session unchanged. The file
 * is never followed through a link nor waited on (a FIFO): K3_ERR_IO. */
int k3_session_load_prefix(k3_session *s, const char *path, const int32_t *ids, int n,
                           k3_err *err);

/* k3_session_load_prefix from a state file's `bytes` bytes held in memory at buf (a cache's
 * copy in RAM; name: what messages call it). Errors: those of k3_session_load_prefix. */
int k3_session_load_prefix_mem(k3_session *s, const void *buf, size_t bytes, const char *name,
                               const int32_t *ids, int n, k3_err *err);

/* The fingerprint a state file of this engine carries (the model's: see k3_session_save), for
 * a cache's keys: 16 bytes to out. Errors: K3_ERR_IO (config.json unreadable). */
int k3_engine_state_fingerprint(const k3_engine *e, uint8_t out[16], k3_err *err);

/* A cache's look at a state file without loading it: *pos and the file's *bytes when path is a
 * regular file (never a link or FIFO) whose header carries fingerprint (from
 * k3_engine_state_fingerprint, computed once: it reads the weights' samples) and this build, and
 * whose length is the one its header announces; the payload and checksum are checked only by
 * k3_session_load_prefix. Errors: K3_ERR_IO (unreadable, not a state file, truncated),
 * K3_ERR_INPUT (another model, spine mode or k3 build). */
int k3_state_peek(const uint8_t fingerprint[16], const char *path, int *pos, uint64_t *bytes,
                  k3_err *err);

/* ---- several sessions in one pass (issue 18: batched decoding across requests) ------------
 * A multistep pass carries rows of DIFFERENT sessions through the model together: every row
 * keeps its own session's KDA and conv state, MLA cache and position, while each spine matrix
 * (lm_head included) is applied once over all rows and the MoE runs the union of the rows'
 * experts, each expert read once and applied over the rows that chose it. Rows of a batched
 * product equal the single product bit for bit (kernels.h), KDA runs each session's recurrence
 * in its own token order and MLA attends each row over its own session's cache, so every
 * segment's logits, state and routing are BIT-IDENTICAL to feeding its ids to its session
 * alone (k3_session_step / k3_session_forward); tests/test_multistep.c checks it.
 *
 * A segment is one session's contribution to a pass: one id (a decode row) or several (a
 * prefill chunk of a new request beside other requests' decode rows: continuous batching).
 * The pass holds at most max_rows ids in all (the row budget, fixed at k3_multistep_new).
 *
 * Errors are per segment where they can be: a segment whose ids are out of range or do not
 * fit its session's context (K3_ERR_INPUT) is refused before the pass and left out of it;
 * the others run unchanged. Non-finite logits (K3_ERR_CHECKPOINT) are judged row by row, so
 * one segment's NaN fails that segment only (its session has advanced, as after
 * k3_session_step). Only a failure of the shared pass itself — a routed expert or a streamed
 * spine layer that cannot be read, a mapped shard truncated under it — fails every segment
 * that was in the pass (each of their sessions is then reset, as k3_session_step does). A pass
 * stopped by a session's on_layer hook (pass.h) gives every segment K3_ERR_INTERRUPTED and
 * leaves every session exactly as before the pass.
 *
 * Threads: one k3_multistep per thread; a session appears in at most one segment of a call
 * and is not stepped elsewhere meanwhile. Several multisteps may share the engine.
 * The engine has ONE operation that runs the model, a pass over segments (backend.h,
 * k3_backend_pass); k3_session_step and k3_session_forward are passes of one segment, and a
 * multistep call is one pass of its segments. Backends: the CPU runs one batched pass (a call
 * holding a single id in all takes the single-step path: the same bits); a device backend
 * (CUDA) steps the segments one after another (the same results, no sharing of reads). In an
 * MPI run rank 0 sends each pass to the other ranks, which replay it (k3_rank_op K3_ROP_PASS).
 * API history: added in issue 18 (commit "k3.h: k3_multistep ..."); then
 * k3_multistep_plan_bytes; then K3_MS_REWINDABLE (issue 27: speculative verification rows
 * in the shared pass). */

typedef struct k3_multistep k3_multistep;

#define K3_MULTISTEP_MAX_ROWS K3_MAX_CHUNK /* the largest row budget of one pass */

/* What logits a segment wants (k3_multistep_seg.flags). Its rows lie in the call's logits
 * array in segment order, each vocab_size float32: 1 row (the default: after its last id),
 * n_ids rows (ALL: after each id) or none (NONE: a prefill chunk that does not end a prompt).
 * K3_MS_REWINDABLE may be or'ed in: a speculative verification, which k3_session_rewind can
 * then undo in part, as after k3_session_forward with K3_FWD_REWINDABLE (a backend that cannot
 * rewind refuses the segment with K3_ERR_USAGE). */
enum { K3_MS_LAST_LOGITS = 0, K3_MS_ALL_LOGITS = 1, K3_MS_NO_LOGITS = 2, K3_MS_REWINDABLE = 4 };

typedef struct k3_multistep_seg {
    k3_session *session; /* in: a session of the multistep's engine */
    const int32_t *ids;  /* in: n_ids ids, fed at positions k3_session_pos(session).. */
    int n_ids;           /* in: >= 1 */
    int flags;           /* in: K3_MS_LAST_LOGITS, K3_MS_ALL_LOGITS or K3_MS_NO_LOGITS */
    int logits_row;      /* out: index of its first row in the call's logits (-1: none); set
                          * for every segment, failed or not, so the layout never depends on
                          * which segments failed */
    int status;          /* out: K3_OK, or why this segment failed (err says) */
    k3_err err;          /* out: the segment's message when status != K3_OK */
} k3_multistep_seg;

/* A multistep for engine e whose passes hold up to max_rows ids (1..K3_MULTISTEP_MAX_ROWS):
 * the batched pass's scratch for max_rows rows (allocated here, once) and its own expert
 * store client. Errors: K3_ERR_INPUT (max_rows out of range), K3_ERR_GENERIC (memory). */
int k3_multistep_new(const k3_engine *e, int max_rows, k3_multistep **out, k3_err *err);
/* Frees ms (NULL is ignored); before its engine. */
void k3_multistep_free(k3_multistep *ms);
int k3_multistep_max_rows(const k3_multistep *ms);
/* Bytes a multistep of max_rows rows allocates on e's backend, for a memory plan: its pass
 * scratch: per row 0.30 MB at K3's widths (partial sums, FFN input, the routed experts' input
 * and 16 outputs) plus 28 KB for each AttnRes block (K3: 25 blocks, 1.02 MB per row), and
 * ~0.87 MB per row up to 256 rows for one row group's buffers (src/model/batch.h); lm_head's
 * output is the caller's logits array. */
uint64_t k3_multistep_plan_bytes(const k3_engine *e, int max_rows);

/* The logits rows that segs[0, n) write (the size of run's logits array in vocab_size-float
 * rows), counting failed segments too. */
int k3_multistep_logit_rows(const k3_multistep_seg *segs, int n);

/* Feeds every segment's ids to its session in ONE pass (see above) and writes their logits
 * into logits [k3_multistep_logit_rows(segs, n)][vocab_size] (may be NULL when no segment
 * wants any), each segment from row segs[i].logits_row. Sets every segment's status, err and
 * logits_row.
 * Returns K3_OK when every segment succeeded; otherwise the status of the first failed
 * segment, with err = "segment i: ..." (the segments whose status is K3_OK are complete and
 * valid all the same). Whole-call errors, which run nothing and give every segment that
 * status: K3_ERR_USAGE (n < 1; more than max_rows ids in all; a session twice or of another
 * engine; n_ids < 1 or unknown flags). Pass failures (K3_ERR_EXPERT_IO, K3_ERR_IO) fail every
 * segment in the pass and reset their sessions. Allocation-free. */
int k3_multistep_run(k3_multistep *ms, k3_multistep_seg *segs, int n, float *logits,
                     k3_err *err);

/* The decode case: one id per session, ids[i] fed to ss[i] (n sessions, n <= max_rows), the
 * logits after it into logits + i * vocab_size ([n][vocab_size]); status[n] (may be NULL)
 * receives each session's status. Returns as k3_multistep_run. */
int k3_sessions_step(k3_multistep *ms, k3_session *const *ss, const int32_t *ids, int n,
                     float *logits, int *status, k3_err *err);

/* Counters since k3_multistep_new (for /metrics and benchmarks). */
typedef struct k3_multistep_stats {
    uint64_t passes;         /* passes run (one per call that ran any row) */
    uint64_t rows;           /* ids fed by those passes */
    uint64_t segments;       /* segments in those passes */
    uint64_t experts;        /* routed experts requested: each MoE layer's union, summed
                              * (stepped one by one: top-k per row and layer) */
    uint64_t row_experts;    /* top-k x MoE layers x rows: what stepping alone requests */
    double pass_s;           /* wall seconds inside the passes */
} k3_multistep_stats;
void k3_multistep_get_stats(const k3_multistep *ms, k3_multistep_stats *out);

#endif
