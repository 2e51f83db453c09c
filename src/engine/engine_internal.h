/* engine_internal.h — the engine's and session's structs and the step checks shared by the
 * files of src/engine (engine.c, multistep.c); nothing outside src/engine includes it. */
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
