/* gpu.h — the CUDA backend: K3's forward pass on one NVIDIA GPU (built with `make CUDA=1`).
 *
 * The engine (src/engine/backend.c) opens it for a bound model; src/model never learns that
 * it exists. The forward pass here is spec §3 exactly as src/model/forward.c runs it, layer
 * by layer with the kernels of kern.h, and is checked against the same fixtures.
 *
 * Invariants:
 *  - Memory plan (decided once at open, within the byte budget --gpu-gb / K3_GPU_GB):
 *    lm_head and the final norms stay resident; as many spine layers as fit are resident in
 *    device memory, in layer order; the rest live in pinned host memory and are uploaded per
 *    token into two staging buffers on their own stream, each upload overlapping the
 *    previous layer's compute (double buffering, ordered by events). The rest of the budget
 *    is the GPU expert cache: equal slots, one routed expert (w1, w3, w2 with their scales)
 *    each, LRU eviction, never evicting an expert of the layer being computed, plus one
 *    staging slot: an upload lands there as in the checkpoint and k3k_experts_prepare re-lays
 *    it into its slot in the experts kernels' own layout (same bytes, kern.h).
 *  - Routed experts reach the device only through the expert store (src/store): per MoE
 *    layer the router runs on the device, its top-k ids come back to the host, the experts
 *    already on the device are hits, and only the misses are asked of the store
 *    (k3_store_begin with the misses alone), copied into evicted slots and handed back.
 *  - Per-session device state (KDA state, conv windows, the MLA cache in the CPU's
 *    latent layout (state.h), attention scratch) is allocated at session creation; a step never
 *    allocates. The embedding stays in host memory (one row is widened and copied per token).
 *  - One step runs at a time per GPU (a mutex): sessions may share the engine from several
 *    threads; the scratch and the expert cache are the GPU's.
 *  - Errors from CUDA become K3_ERR_DEVICE with the call and CUDA's message; after a failed
 *    step the session must be reset (as after K3_ERR_EXPERT_IO).
 */
#ifndef K3_CUDA_GPU_H
#define K3_CUDA_GPU_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../model/model.h"

typedef struct k3_gpu k3_gpu;
typedef struct k3_gpu_session k3_gpu_session;

typedef struct k3_gpu_opts {
    double gpu_gb;    /* device memory budget in GB (1e9 bytes); <= 0: the free memory less
                       * max(1 GiB, 5% of the card) */
    int max_layers;   /* < 0: as many resident spine layers as fit; >= 0: at most this many
                       * (the rest streamed; tests and benchmarks) */
    int expert_slots; /* > 0: exactly this many expert cache slots (tests); 0: the budget */
    int profile;      /* 1: time every layer with device events (k3_gpu_layer_profile) */
    int plan_ctx;     /* context the plan reserves for one session's state (0 = default) */
} k3_gpu_opts;

/* Number of CUDA devices, or 0 when there is none or no usable driver (never an error);
 * why (NUL-terminated) goes to reason when it is 0 and reason is non-NULL. */
int k3_gpu_device_count(char *reason, size_t cap);

/* Plans memory, uploads the resident spine and the head, allocates the expert cache, and
 * writes the startup line (device, memory plan) to line.
 * Errors: K3_ERR_DEVICE (no device, a CUDA call failed, the budget cannot hold the head, one
 * session's state and one layer's experts), K3_ERR_USAGE (budget above the free memory). */
int k3_gpu_open(const k3_model *m, const k3_gpu_opts *o, k3_gpu **out, char *line, size_t cap,
                k3_err *err);
void k3_gpu_close(k3_gpu *g);

/* Device state for one session of max_ctx positions, zeroed. Errors: K3_ERR_DEVICE. */
int k3_gpu_session_new(k3_gpu *g, int max_ctx, k3_gpu_session **out, k3_err *err);
void k3_gpu_session_free(k3_gpu_session *s);
/* Zeroes the KDA and conv state (the KV cache is written before it is read). */
void k3_gpu_session_reset(k3_gpu_session *s);

/* One token at position k3_state_pos(st) (spec §3) on the device; writes vocab_size logits to
 * the host buffer `logits` when non-NULL; calls trace hooks (copying vectors back) when tr is
 * non-NULL; then k3_state_advance(st) with the step's times. st is the session's host state,
 * used only through model.h's host-state functions (position, store client, times).
 * Errors: K3_ERR_DEVICE, K3_ERR_EXPERT_IO (from the store). */
int k3_gpu_step(k3_gpu_session *s, k3_state *st, int32_t token, float *logits,
                const k3_trace *tr, k3_err *err);

/* Copies the recurrent state between the device and st's host buffers (KDA state, conv
 * windows, KV cache positions [0, k3_state_pos(st))): to_host 1 before a state file is written, 0
 * after one was read. Errors: K3_ERR_DEVICE. */
int k3_gpu_sync_state(k3_gpu_session *s, k3_state *st, int to_host, k3_err *err);

/* Mean device time of each layer over the profiled steps, in ms, into ms [layers + 1] (the
 * last entry: the head — output mix, final norm, lm_head and the logits' copy), and the
 * weight bytes each reads per token into bytes [layers + 1] when non-NULL (the layer's spine
 * matrices, plus top-k routed experts in a MoE layer; lm_head and norms for the head).
 * Returns the number of steps (0 when profiling is off or nothing ran yet). */
int k3_gpu_layer_profile(const k3_gpu *g, double *ms, uint64_t *bytes, int layers);

typedef struct k3_gpu_stats {
    uint64_t expert_hits, expert_misses, evictions, bytes_uploaded;
    int n_slots, resident_layers, streamed_layers;
} k3_gpu_stats;
void k3_gpu_get_stats(const k3_gpu *g, k3_gpu_stats *out);

#endif
