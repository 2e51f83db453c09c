/* backend.h — where a session's forward pass runs, chosen once at engine load: the CPU
 * (src/model's k3_forward, the reference) or one CUDA GPU (src/cuda, built with
 * `make CUDA=1`). The model code does not know which runs it. Single steps, batched passes
 * and rewinds all go through here; the engine never calls the forward pass directly.
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

/* One token at position k3_state_pos(st) (spec §3); see k3_forward for the contract. */
int k3_backend_step(k3_backend *b, void *sess, k3_state *st, int32_t token, float *logits,
                    const k3_trace *trace, k3_err *err);

/* ids[0, n) at positions k3_state_pos(st).. (1 <= n <= K3_MAX_CHUNK, checked by the caller);
 * flags are K3_BATCH_* (model.h); logits as k3_forward_batch. The CPU runs one batched pass
 * (k3_forward_batch); a device backend steps the ids one by one (the same result) and refuses
 * K3_BATCH_REWINDABLE. Errors: those of k3_backend_step; K3_ERR_USAGE (rewindable on a
 * device backend). */
int k3_backend_forward(k3_backend *b, void *sess, k3_state *st, const int32_t *ids, int n,
                       float *logits, int flags, const k3_trace *trace, k3_err *err);
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
