/* plan.h — the memory planner: one pure function from the machine's memory (RAM and the
 * process's own cgroup limits), the model's sizes, the number of sessions and the user's
 * overrides to a plan (spine resident or budgeted, staging, expert cache, session state,
 * headroom), plus the probe that reads the machine's figures from /proc and /sys.
 *
 * Invariants:
 *  - k3_plan_memory is pure: same inputs, same plan; it reads no file and no environment.
 *  - The plan never exceeds the limit it obeys: base + sessions + pass-start copies + spine
 *    RAM + expert cache + prompt passes + headroom <= limit (the limit: the tightest of RAM, cgroup v1 memory.limit_in_bytes, v2
 *    memory.max and memory.high, and what the OS says is available now plus our own base).
 *  - A user override fixes its own part only; the other parts are re-planned around it
 *    (a spine budget with no expert budget shrinks the expert cache to fit).
 *  - When the model cannot run within the limit at all (below staging + top-k + 1 expert
 *    slots + the sessions), planning fails before anything is loaded, with the numbers.
 *  - The minimum limit (k3_plan.min_limit_bytes) is exact: limits are counted in whole 4 KiB
 *    pages (as the kernel counts a cgroup's), a limit at the minimum plans, one page less is
 *    refused.
 *  - Nothing in the plan is measured while the process runs: the base (what the process holds
 *    before weights) is k3_plan_base_bytes of the metadata's size, an allowance that bounds the
 *    measured RSS, so `k3 plan` and `k3 run` on the same snapshot and machine make the same plan
 *    every time (only the probe's MemAvailable moves with the machine).
 *  - Spine bytes come first: a resident spine byte saves one byte read per token, a cached
 *    expert byte at most that (an expert is used by a fraction of tokens), so the expert cache
 *    gets its minimum for prefetch (2 x top-k slots) and the spine the rest, then any RAM the
 *    spine does not need goes to the expert cache.
 *  - Prompt passes (prefill_rows): up to an eighth of the RAM after base, sessions and
 *    headroom is set aside before the spine and the expert cache are planned (a budgeted
 *    spine streams more layers for it), then RAM nothing else was planned to use and at most
 *    half of the expert cache above its prefetch minimum (never a cache the user fixed) add
 *    rows. A pass of R prompt ids reads each routed expert its ids chose once, where passes of
 *    32 read it up to R / 32 times, and a streamed spine layer once per pass: for a long
 *    prompt a row of activations saves far more reading than a cached expert or a resident
 *    spine byte, which decoding keeps most of.
 *
 * Sessions: each session is counted at the context it is opened with (k3_plan_request.ctx:
 * --ctx, or the default min(max_position_embeddings, 4096); k3 run, which knows a raw
 * prompt's bytes or ids and --max-new before loading, opens its session with just what they
 * can need when neither a chat template, a loaded state nor --spec adds positions). Not at the
 * model's full context (1M positions of MLA KV on K3: terabytes), and not at a guess of the
 * positions a session will use: the context a session is opened with is the one bound that
 * holds for every caller (a chat or a server session grows to it, a loaded state starts part
 * way in), and the engine refuses a session opened with more positions than the plan counted
 * (k3_session_new), so the KV cache can never outgrow the plan. The KV cache is committed as
 * positions are used, so peak RSS sits below the plan by the positions not reached; what
 * that costs is room the expert cache could have had, never an OOM kill. A smaller --ctx
 * gives that room back.
 */
#ifndef K3_PLAN_H
#define K3_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "../util/err.h"

/* The machine's memory as the process sees it. All sizes in bytes; 0 = unknown / no limit. */
typedef struct k3_machine_mem {
    uint64_t ram_total_bytes;     /* MemTotal */
    uint64_t ram_available_bytes; /* MemAvailable (0 = unknown: RAM total is used) */
    uint64_t cgroup_limit_bytes;  /* the tightest cgroup limit of this process, 0 = none */
    char cgroup_source[320];      /* the file that set cgroup_limit_bytes, "" when none */
    char ram_source[48];          /* what set ram_total_bytes when not MemTotal (a machine
                                     described by the user: "memory_gb given"), else "" */
} k3_machine_mem;

/* Reads root/proc/meminfo, root/proc/self/cgroup and the memory limits of the process's cgroup
 * and of its ancestors (v1: root/sys/fs/cgroup/memory/PATH/memory.limit_in_bytes; v2:
 * memory.max and memory.high under root/sys/fs/cgroup or root/sys/fs/cgroup/unified), keeping
 * the smallest. root is "" for the real machine (tests pass a fake tree). A missing cgroup file
 * is no limit; "max" and v1's 'unlimited' 2^63-ish values are no limit.
 * Errors: K3_ERR_IO when root/proc/meminfo cannot be read or has no MemTotal. */
int k3_machine_mem_probe(const char *root, k3_machine_mem *out, k3_err *err);

/* What the model needs, in bytes, as the engine will run it (BF16 or int8 spine). */
typedef struct k3_plan_model {
    uint64_t spine_bytes;       /* every non-expert weight a pass reads, lm_head included */
    uint64_t staging_bytes;     /* RAM a spine budget needs even when it streams every layer:
                                   both staging buffers and the pinned small tensors */
    uint64_t expert_slot_bytes; /* one routed expert (one cache slot) */
    uint64_t experts_bytes;     /* all routed experts (the cache is never larger) */
    int top_k;                  /* experts per token per layer */
    uint64_t session_bytes;     /* one session's KDA/conv state and KV cache at its context
                                   (k3_plan_request.ctx positions: see "Sessions" above) */
    uint64_t prefill_row_bytes; /* scratch per row of a pass beyond prefill_rows_min (the rows'
                                   hidden state, AttnRes blocks, routed experts' buffers) */
    int prefill_rows_min;       /* rows session_bytes already counts (K3_DEFAULT_CHUNK) */
    int prefill_group_rows;     /* the steps other than the routed experts run over groups of
                                   this many rows (K3_BATCH_GROUP; 0: none) */
    uint64_t prefill_group_bytes; /* what those steps' [group] buffers add from prefill_rows_min
                                   rows to a whole group: a pass of R rows takes (R - min) x
                                   prefill_row_bytes + this (R >= group rows; below, the part
                                   (R - min) / (group - min) of it, rounded up) */
    int prefill_rows_max;       /* most rows a prompt pass may take (K3_MAX_CHUNK); 0: no
                                   prompt passes planned (prefill_rows = prefill_rows_min) */
    uint64_t undo_bytes;        /* the copy of one session's KDA state and conv windows that a
                                   prompt pass which may be stopped keeps, to go back to where
                                   it began (k3_state_undo_bytes; 0: no pass stops: the GPU,
                                   expert parallelism) */
} k3_plan_model;

#define K3_PLAN_PAGE_BYTES 4096ull /* limits are counted in whole pages */
/* The base allowance's fixed part: code, libraries, OpenMP's threads, allocator (k3 version's
 * peak RSS on the reference machine is 9.2 MB). */
#define K3_PLAN_PROCESS_BYTES (16ull << 20)

/* The base allowance, bytes: K3_PLAN_PROCESS_BYTES + 2 x metadata_bytes (the bytes of the files
 * read before weights: config.json, the tokenizer's files, the index and every shard's header;
 * the parsed tensor table, the tokenizer's tables and the JSON parsed on the way take less than
 * twice their text: the full-size K3 snapshot's 134.5 MB of metadata measure 230 MB of RSS at
 * plan time, the allowance is 285 MB). */
uint64_t k3_plan_base_bytes(uint64_t metadata_bytes);

/* The user's side: overrides and what runs. */
typedef struct k3_plan_request {
    uint64_t base_bytes; /* the process before weights (code, tokenizer, headers): the
                            allowance k3_plan_base_bytes, never a measurement */
    int sessions;        /* sessions that will be open at once (>= 1) */
    int pass_sessions;   /* sessions one pass may carry (the server's slots), each keeping
                            an undo_bytes copy through a prompt pass; 0 = 1 */
    int gpu;             /* 1: the GPU backend (it plans device memory itself; the spine stays
                            mapped in host RAM and is not given a budget) */
    double spine_gb;     /* < 0: planned; else the user's spine budget in GB (1e9 bytes),
                            0 = stream every layer */
    double expert_gb;    /* <= 0: planned; else the user's expert cache in GB */
    int ctx;             /* positions each session is opened with (session_bytes is counted
                            at it); informative: said in the line */
} k3_plan_request;

typedef struct k3_plan {
    uint64_t limit_bytes;        /* the limit obeyed */
    char limit_source[352];      /* where it came from ("cgroup v1 /sys/...", "MemAvailable") */
    uint64_t headroom_bytes;     /* left to the OS, page cache and allocator slack */
    uint64_t base_bytes;
    uint64_t sessions_bytes;     /* all sessions' state */
    uint64_t undo_bytes;         /* the pass-start copies of a prompt pass that may be stopped:
                                    pass_sessions x k3_plan_model.undo_bytes */
    int spine_budgeted;          /* 0: the spine is used in place (all of it resident);
                                    1: k3_spine with spine_budget_bytes (resident + staging) */
    uint64_t spine_budget_bytes; /* with spine_budgeted: RAM for the spine, staging included */
    uint64_t spine_ram_bytes;    /* RAM the spine takes in the plan (in place: spine_bytes) */
    uint64_t expert_cache_bytes; /* the expert cache budget (a multiple of the slot size) */
    uint64_t total_bytes;        /* base + sessions + undo + spine + experts + prompt passes: peak
                                    RSS should stay within this + 5% */
    uint64_t min_limit_bytes;    /* the smallest limit this model and these sessions run in
                                    (whole pages; one page less is refused) */
    int spine_from_user, experts_from_user; /* which parts the user fixed */
    int sessions, ctx;           /* as requested: sessions_bytes = sessions x session_bytes */
    int pass_sessions;           /* as requested (at least 1) */
    uint64_t over_limit_bytes;   /* how far the user's own spine_gb / expert_gb take the plan
                                    past the limit less headroom (obeyed, and said), else 0 */
    int prefill_rows;            /* ids per prompt pass (expert-major prefill: each routed
                                    expert read once per pass); >= prefill_rows_min */
    uint64_t prefill_bytes;      /* (prefill_rows - prefill_rows_min) x prefill_row_bytes +
                                    the group's part (k3_plan_model): counted once (one
                                    session prefills in plan-sized passes) */
} k3_plan;

/* Plans memory for model mod on machine m as req asks (see the invariants above).
 * Errors: K3_ERR_USAGE when the model cannot run within the limit (the message gives the
 * minimum, the limit and its source, and what to change) or when the user's overrides do not
 * fit beside each other's minimum (naming the field spine_gb / expert_gb; given figures that
 * only pass the limit are obeyed: over_limit_bytes); K3_ERR_USAGE for a request
 * out of range (sessions < 1, non-finite GB). */
int k3_plan_memory(const k3_machine_mem *m, const k3_plan_model *mod, const k3_plan_request *req,
                   k3_plan *out, k3_err *err);

/* After the spine budget was applied at layer granularity (spine_ram_bytes: what the spine
 * really holds, staging included), gives the unused part of its budget to the expert cache
 * when the user did not fix it. */
void k3_plan_settle(k3_plan *p, const k3_plan_model *mod, uint64_t spine_ram_bytes);

/* One line (no newline): limit and source, headroom, base, spine (in place / budget), expert
 * cache, sessions (count x positions), total; the line k3 run and k3 plan print. */
void k3_plan_describe(const k3_plan *p, char *buf, size_t cap);

#endif
