/* backend.h — where a session's forward pass runs, chosen once at engine load: the CPU
 * (src/model's k3_forward, the reference) or one CUDA GPU (src/cuda, built with
 * `make CUDA=1`). The model code does not know which runs it. Every forward pass — a single
 * step, a prefill chunk, a speculative verification, several sessions' rows together — is one
 * call of k3_backend_pass (llama.cpp's llama_decode over a batch whose tokens carry a sequence
 * id is the model); rewinds go through here too. Nothing else calls the forward pass
 * (tests/test_arch.c checks it by grep).
 *
 * Invariants:
 *  - Every session keeps its host k3_state: the position, token-facing bookkeeping and the
 *    store client live there whatever the backend; a device backend adds its own per-session
 *    state (void *), reaches the host state only through model.h's host-state functions, and
 *    copies the recurrent state to and from k3_state only for state files (k3_backend_sync).
 *  - Choice: opts->device, else "cpu" (no environment is read). "auto" takes the GPU when this build
 *    has CUDA and a device answers, and otherwise the CPU; the startup line says which and
 *    why. "cuda" without CUDA support or without a device is an error (K3_ERR_DEVICE), never
 *    a silent fallback.
 *  - GPU knobs: opts->gpu_gb (device memory budget, GB); for tests and benchmarks, through
 *    opts->lab (k3_lab.h): gpu_max_layers (most resident spine layers; the rest are
 *    streamed), gpu_expert_slots (exact expert cache size) and gpu_profile (per-layer times).
 */
#ifndef K3_BACKEND_H
#define K3_BACKEND_H

#include "../model/model.h"
#include "k3.h"

typedef struct k3_backend k3_backend;

/* Opens the backend for bound model m (m must outlive it). out is never NULL on success.
 * Errors: K3_ERR_USAGE (unknown device name or knob value), K3_ERR_DEVICE (see above). */
int k3_backend_open(const k3_model *m, const k3_engine_opts *opts, k3_backend **out,
                    k3_err *err);
void k3_backend_close(k3_backend *b);
const char *k3_backend_name(const k3_backend *b); /* "cpu" or "cuda" */
/* One line (no newline): the device and, for a GPU, the memory plan. */
const char *k3_backend_line(const k3_backend *b);

/* Per-session backend state for a session whose host state is st (NULL for the CPU).
 * Errors: K3_ERR_DEVICE, K3_ERR_GENERIC. */
int k3_backend_session_new(k3_backend *b, const k3_state *st, void **sess, k3_err *err);
void k3_backend_session_free(k3_backend *b, void *sess);
/* Forgets the backend's recurrent state (with k3_state_reset on the host state). */
void k3_backend_session_reset(k3_backend *b, void *sess);

/* One segment of a pass: one session's ids at its positions k3_state_pos(st).. (1 <= n),
 * with its backend state (k3_backend_session_new) and flags K3_BATCH_* (model.h): which logits
 * it wants (after its last id, after every id, none) and K3_BATCH_REWINDABLE. */
typedef struct k3_backend_seg {
    k3_state *st;
    void *sess;
    const int32_t *ids;
    int n, flags;
    const k3_trace *trace;
} k3_backend_seg;

/* The scratch of passes over several sessions (a multistep's): the CPU's k3_batch for
 * max_rows rows and a store client of the pass's own. Errors: K3_ERR_GENERIC (memory). */
typedef struct k3_backend_scratch k3_backend_scratch;
int k3_backend_scratch_new(k3_backend *b, int max_rows, k3_backend_scratch **out, k3_err *err);
void k3_backend_scratch_free(k3_backend_scratch *sc);
/* Bytes k3_backend_scratch_new(b, max_rows) allocates, for a memory plan. */
uint64_t k3_backend_scratch_bytes(const k3_backend *b, int max_rows);
/* Routed experts the scratch's passes asked the store for (each MoE layer's union, summed). */
uint64_t k3_backend_scratch_experts(const k3_backend_scratch *sc);

/* THE forward pass (spec §3): segs[0, nseg) (distinct sessions, each checked by the caller:
 * ids in the vocabulary, the context holds them), their logits rows packed in segment order
 * into logits (may be NULL). Every segment ends bit-identical to feeding its ids to its
 * session alone, one by one (logits, state, routing).
 *  - The CPU: with a scratch, one batched pass over all rows (k3_forward_multi: each spine
 *    matrix and each routed expert of the rows' union read once), except one segment of one
 *    id that is not rewindable, which takes the single-step path (k3_forward: the same bits,
 *    less overhead); without a scratch (one segment only) the session's own batched pass
 *    (k3_forward_batch) or single step.
 *  - A device backend (CUDA) steps the segments one after another, id by id (the same
 *    results, no sharing of reads), and refuses K3_BATCH_REWINDABLE.
 * Errors: K3_ERR_USAGE (several segments without a scratch; rewindable on a device backend);
 * K3_ERR_INPUT (more rows than the scratch holds); K3_ERR_GENERIC (memory); K3_ERR_EXPERT_IO,
 * K3_ERR_IO, K3_ERR_DEVICE (the pass failed part-way: every segment's session must be reset). */
int k3_backend_pass(k3_backend *b, k3_backend_scratch *sc, const k3_backend_seg *segs, int nseg,
                    float *logits, k3_err *err);
/* 1 when this backend runs batched passes that can be rewound (the CPU), else 0. */
int k3_backend_can_rewind(const k3_backend *b);
/* Goes back to position pos inside the last rewindable pass (k3_state_rewind).
 * Errors: K3_ERR_INPUT (pos outside that pass), K3_ERR_USAGE (a device backend). */
int k3_backend_rewind(k3_backend *b, void *sess, k3_state *st, int pos, k3_err *err);

/* Copies the recurrent state to st (to_host 1, before a state file is written) or from st
 * (0, after one was read); a no-op for the CPU. Errors: K3_ERR_DEVICE. */
int k3_backend_sync(k3_backend *b, void *sess, k3_state *st, int to_host, k3_err *err);

/* Per-layer device time and weight bytes of the profiled steps (k3_gpu_layer_profile):
 * ms and bytes [layers + 1], the last entry the head. Returns the number of steps, 0 when not
 * profiling or on the CPU. */
int k3_backend_layer_profile(const k3_backend *b, double *ms, uint64_t *bytes, int layers);

#endif
