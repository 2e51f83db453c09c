/* engine_internal.h — the engine's and session's structs and the one pass (pass.c) shared by
 * the files of src/engine (engine.c, pass.c, multistep.c); nothing outside src/engine
 * includes it. */
#ifndef K3_ENGINE_INTERNAL_H
#define K3_ENGINE_INTERNAL_H

#include <limits.h>
#include <stdbool.h>

#include "k3.h"
#include "backend.h"
#include "plan.h"
#include "../format/packed.h"
#include "../format/safetensors.h"
#include "../model/model.h"

struct k3_engine {
    k3_config cfg;
    k3_checkpoint *ck;
    k3_model model;
    k3_tokenizer *tok;
    k3_pack *pack;          /* int8 spine, or NULL (BF16, exact) */
    bool approx;            /* --approx: int8 activations in the int8 products */
    char spine_line[PATH_MAX + 1024]; /* what k3_engine_spine_line returns */
    k3_store *store;        /* routed experts (src/store) */
    k3_mem_plan plan;       /* the startup memory plan */
    char store_line[1536];  /* what k3_engine_store_line returns */
    k3_backend *backend;    /* where sessions run: CPU or CUDA (backend.h) */
    char spine_plan_line[1024]; /* the spine budget's plan (src/model/spine.h) */
    k3_plan mplan;          /* the memory planner's plan (plan.h) */
    k3_plan_model mplan_model; /* what it planned for */
    char mplan_line[1024];
    int plan_ctx;           /* positions each session was planned with: none may be larger */
    const k3_rank_ops *rank_ops; /* rank 0 of an MPI run: the followers replay its ops */
    int32_t *pass_wire;     /* [K3_ROP_PASS_INTS] with rank_ops: a pass's op (pass.c) */
};

struct k3_session {
    const k3_engine *e;
    int chunk;                                /* tokens per prefill pass (k3_session_set_chunk) */
    k3_state *state;
    k3_trace trace;
    int has_trace;
    int32_t *tokens;                          /* [max_ctx] the ids fed so far, in order */
    const volatile sig_atomic_t *interrupt;   /* checked by k3_session_prefill, or NULL */
    void *dev;                                /* the backend's session state (NULL: CPU) */
};

/* ---- the one pass (pass.c) ------------------------------------------------------------------
 * Every forward pass of the engine — k3_session_step, k3_session_forward, k3_multistep_run —
 * is one k3_engine_pass: the envelope around k3_backend_pass lives there and only there. */

/* One session's segment of a pass. In: s, ids, n (>= 1), flags (K3_BATCH_*: logits wanted,
 * K3_BATCH_REWINDABLE). Out: status (K3_OK, or why this segment failed: err). */
typedef struct k3_pass_seg {
    k3_session *s;
    const int32_t *ids;
    int n, flags;
    int status;
    k3_err err;
    bool in_pass;  /* out: it passed the checks and went into the pass (its logits rows, when
                    * the pass succeeded, are among the packed ones) */
} k3_pass_seg;

/* Runs segs[0, n) (distinct sessions of e) as ONE pass of the backend, with scratch sc (NULL:
 * one segment on its session's own scratch). In order: each segment is checked (ids in the
 * vocabulary, the context holds them, K3_BATCH_REWINDABLE on a backend that rewinds; a
 * segment that fails is left out with K3_ERR_INPUT / K3_ERR_USAGE); rank 0 of an MPI run
 * sends the segments that run to the other ranks (K3_ROP_PASS), which replay the same pass;
 * the ids join each session's history; the pass runs with SIGBUS armed (a mapped shard
 * truncated under it fails it with K3_ERR_IO naming the file); a failed pass resets every
 * session in it (failed_pass, pass.c), but one that an on_layer hook stopped
 * (K3_ERR_INTERRUPTED), whose sessions the model put back where the pass began; the store is told of the pass; each segment's logits
 * rows are checked for NaN/Inf (K3_ERR_CHECKPOINT, that segment alone).
 * logits: the rows of the segments that ran, packed in segment order (may be NULL).
 * Returns K3_OK, or the first failed segment's status with err = its message. */
int k3_engine_pass(const k3_engine *e, k3_backend_scratch *sc, k3_pass_seg *segs, int n,
                   float *logits, k3_err *err);
/* Rank 0 of an MPI run: the other ranks replay op (kind K3_ROP_NEW, _FREE, _RESET, _REWIND)
 * before this rank runs it (dist.h); K3_OK without MPI. Errors: K3_ERR_DIST. */
int k3_engine_mirror(const k3_session *s, int kind, int arg, int flags, const int32_t *ids,
                     int n, k3_err *err);
/* Rows of logits a segment of flags and n ids writes. */
int k3_pass_seg_rows(int flags, int n);

/* After a pass: tells the store how busy the streamed spine's reader keeps the disk, for auto
 * prefetch (k3_store_note_spine); nothing when no spine layer streams. */
void k3_engine_note_pass(const k3_engine *e);

/* Non-finite logits in rows x vocab_size floats (row 0 after position first_pos): corrupt
 * weights, a bad int8 pack or an --approx overflow. Errors: K3_ERR_CHECKPOINT naming the
 * position and vocab id. */
int k3_engine_check_logits(const k3_engine *e, const float *logits, int rows, int first_pos,
                           k3_err *err);
/* After a step: when a SIGBUS on a mapped file was survived since the fault count `before`
 * (sigbus.h), restores the mappings and returns K3_ERR_IO naming the file; else K3_OK. */
int k3_engine_mapped_fault(const k3_engine *e, uint64_t before, k3_err *err);

#endif
