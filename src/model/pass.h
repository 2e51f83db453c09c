/* pass.h — the forward pass's own terms that the engine's clients see too: how many ids a
 * batched pass takes, what a pass reports as it runs (trace hooks at the spec §3 points,
 * wall time per phase) and the spine budget's counters. Declared here, in the model layer
 * that produces them; the engine's public header (src/engine/k3.h) re-exports them.
 *
 * Invariant: hooks only observe: a pass with a trace hook computes the same bits as one
 * without (on_layer may stop a pass; it never changes what a finished pass computes). */
#ifndef K3_PASS_H
#define K3_PASS_H

#include <stdint.h>

/* Tokens per pass where no plan decides (the server's prompt passes, multistep rows); a
 * prompt of k3_session_prefill goes in passes of the memory plan's prefill_rows (plan.h:
 * expert-major, each routed expert read once per pass), at least this. BENCHMARKS.md
 * "Batched prefill", "Expert-major prefill". */
#define K3_DEFAULT_CHUNK 32
#define K3_MAX_CHUNK 16384 /* most ids in one pass (--chunk, the plan's prefill_rows) */
/* Most drafted ids one speculative pass verifies (--spec): its logit rows (spec + 1 of the
 * vocabulary, 168 MB at K3's) are held at once, so this stays the old pass bound, not
 * K3_MAX_CHUNK's 16383. */
#define K3_MAX_SPEC 255

/* What a trace hook sees (spec §3 names; fixtures' trace_len*.json use the same points). */
enum k3_trace_point {
    K3_TRACE_ATTN_IN,     /* AttnRes-mixed input of the mixer, before input_layernorm */
    K3_TRACE_ATTN_OUT,    /* mixer output after o_proj */
    K3_TRACE_MLP_IN,      /* AttnRes-mixed input of the FFN, before post_attention_layernorm */
    K3_TRACE_MLP_OUT,     /* dense MLP or MoE output */
    K3_TRACE_PARTIAL_SUM, /* block partial sum P after the layer */
    K3_TRACE_FINAL_HIDDEN,/* output AttnRes mix (layer = -1) */
    K3_TRACE_FINAL_NORMED,/* after model.norm (layer = -1) */
};

typedef struct k3_trace {
    void *user;
    /* x has n floats (hidden_size); called for every point of every layer, each row's calls
     * in the spec's order. A pass of more than 256 rows (batch.h K3_BATCH_GROUP) runs a
     * layer's steps a row group at a time, so its rows' calls interleave group by group. */
    void (*on_vector)(void *user, int pos, int layer, enum k3_trace_point point,
                      const float *x, int n);
    /* The router's choice at a MoE layer: k expert ids in canonical order (descending biased
     * score, ties to the lower id) and their renormalised unbiased weights. */
    void (*on_routing)(void *user, int pos, int layer, const int *ids, const float *weights,
                       int k);
    /* Called once the step at pos is complete (logits written), e.g. for a profile line. */
    void (*on_step)(void *user, int pos);
    /* A prompt pass has taken its n ids at positions pos.. through layer `layer` of n_layers:
     * progress within a long pass, and the place to stop it. Nonzero stops the pass before the
     * next layer with K3_ERR_INTERRUPTED, and every session in it is then exactly as before
     * the pass (KDA state, conv windows, position, ids: forward_batch.c, "stopping a pass"),
     * so the passes before it are kept; a pass of several sessions stops for all of them (a
     * server stops one only when all its rows are unwanted). Called only in a pass that holds
     * a prompt chunk (a segment of more than one id that is not a speculative verification):
     * not for single steps or passes of decode rows (they last one step), nor under expert
     * parallelism (MPI: every rank would have to agree), nor on the CUDA backend (it steps a
     * pass id by id). */
    int (*on_layer)(void *user, int pos, int n, int layer, int n_layers);
} k3_trace;

/* Wall time per phase in seconds; moe includes router, eload (waiting for expert reads) and
 * expert (computing the routed experts). */
typedef struct k3_phase_times {
    double total_s, attn_s, moe_s, router_s, eload_s, expert_s, head_s;
    long tokens;
} k3_phase_times;

/* The spine budget's plan and its counters since load (all zero without a budget). */
typedef struct k3_spine_stats {
    int budgeted;                          /* 1 when a budget is in effect */
    uint64_t budget_bytes;
    int n_layers, resident_layers, streamed_layers; /* layers 0..resident_layers-1 resident */
    int head_resident;                     /* lm_head resident (else streamed) */
    uint64_t resident_bytes;               /* used in place from the mappings */
    uint64_t streamed_bytes;               /* read per pass through the streamed part */
    uint64_t staging_bytes, pinned_bytes;  /* both staging buffers; pinned small tensors */
    int direct;                            /* streamed reads use O_DIRECT */
    uint64_t bytes_read, units_read;       /* streamed since load (layers and head) */
    double read_s, wait_s;                 /* time reading; time passes waited for reads */
} k3_spine_stats;

/* Expert parallelism (src/dist, `make MPI=1`): the routed experts of every MoE layer are
 * partitioned among n_ranks processes that all run the same spine on the same inputs. Rank r
 * owns expert e of MoE layer l when (e + l) mod n_ranks == r (k3_expert_owner): any 16 of a
 * layer's experts spread over the ranks as evenly as ids fall, and the shift by l makes
 * expert 0..n-1's position differ per layer, so no rank owns the same low ids everywhere.
 * At each MoE layer a rank computes only the chosen experts it owns; exchange then gives
 * every rank every chosen expert's output, and each sums them in router order itself, so
 * every rank computes exactly the single-process bits (an MPI reduction would fix no order).
 *
 * Invariant: with ranks NULL (one process) the MoE runs exactly as without this type. */
typedef struct k3_expert_ranks {
    void *user;
    int rank, n_ranks;   /* this process, of n_ranks >= 2 */
    /* At MoE layer `layer`, rows x k router slots with expert ids ids[rows * k]: outs
     * [rows * k][dim] holds this rank's own experts' outputs (k3_expert_owner(layer, id) ==
     * rank) and receives every other slot's from its owner, bit for bit. status is this
     * rank's own result for the layer (K3_OK, or an error with err filled: it is sent to the
     * peers instead of data so that no one waits for it). Returns K3_OK, or the first failing
     * rank's status with err naming that rank, its host and what failed; a peer that sends
     * nothing within the deadline is an error naming it (no call waits forever). */
    int (*exchange)(void *user, int layer, const int *ids, int rows, int k, float *outs,
                    int dim, int status, struct k3_err *err);
} k3_expert_ranks;

static inline int k3_expert_owner(int layer, int expert, int n_ranks) {
    return (expert + layer) % n_ranks;
}

#endif
