/* model.h — K3's weights bound to layers, the per-sequence state, and the forward pass.
 *
 * Invariants (each tied to a fixture test that fails when broken):
 *  - Layer kinds: zero-based layer i is MLA iff i+1 is in full_attn_layers (config.h).
 *  - A_log is PER HEAD: A_log[h] for h < kda_num_heads; trailing entries are padding (§6.4).
 *  - MLA is NoPE: the qk_rope_head_dim "pe" dims are used unrotated; k_pe is shared by all
 *    heads (§7.2). The two MLA LoRA norms use eps 1e-6, not rms_norm_eps (§4).
 *  - The router bias (e_score_correction_bias) affects selection only; weights are the
 *    renormalised UNBIASED sigmoid scores (§8.3).
 *  - AttnRes folds w_norm ⊙ w_proj once at load and dots it with the unweighted RMS-normed
 *    value; the mix is over raw values (§5). Blocks start at layers l % attn_res_block_size
 *    == 0 and the embedding is block 0.
 *  - The latent RMSNorm is applied to the weighted SUM of experts, never per expert (§8.3).
 *  - Routed experts come from the expert store (src/store/store.h, model->store): the MoE
 *    asks for the router's choice, computes each expert as its read completes into its own
 *    output row, and sums the rows in router order, so results do not depend on where an
 *    expert came from or when it arrived.
 */
#ifndef K3_MODEL_H
#define K3_MODEL_H

#include <stdbool.h>
#include <stdint.h>
#include "../format/config.h"
#include "../format/packed.h"
#include "../format/safetensors.h"
#include "../kernels/kernels.h"
#include "../store/store.h"
#include "pass.h"

typedef struct k3_kda_weights {
    k3_mat q_proj, k_proj, v_proj, g_proj, o_proj; /* [P, hidden] / o_proj [hidden, P] */
    k3_mat f_a_proj, f_b_proj;                     /* [rank, hidden], [P, rank] */
    k3_mat b_proj;                                 /* [heads, hidden] */
    k3_mat q_conv, k_conv, v_conv;                 /* F32 [P, 1, conv] viewed as [P, conv] */
    k3_mat A_log, dt_bias, o_norm;                 /* F32 [>= heads], [P], [head_dim] */
} k3_kda_weights;

typedef struct k3_mla_weights {
    k3_mat q_a_proj, q_a_layernorm, q_b_proj;
    k3_mat kv_a_proj, kv_a_layernorm, kv_b_proj;
    k3_mat g_proj, o_proj;
} k3_mla_weights;

typedef struct k3_moe_weights {
    k3_mat router, router_bias;          /* gate.weight [E, hidden], bias F32 [E] */
    k3_mat down_proj, up_proj, norm;     /* latent projections and routed_expert_norm */
    k3_mat shared_gate, shared_up, shared_down;
    /* Routed experts are not bound here: the MoE asks the expert store (src/store). */
} k3_moe_weights;

typedef struct k3_dense_weights {
    k3_mat gate_proj, up_proj, down_proj;
} k3_dense_weights;

typedef struct k3_layer {
    bool is_mla, is_moe;
    int index;                            /* l: this layer's position (views share it) */
    int state_slot;                       /* index among KDA layers or among MLA layers */
    k3_mat input_layernorm, post_attention_layernorm;
    float *attn_res_sw, *mlp_res_sw;      /* folded AttnRes score weights [hidden] */
    k3_kda_weights kda;
    k3_mla_weights mla;
    k3_dense_weights dense;
    k3_moe_weights moe;
} k3_layer;

typedef struct k3_model {
    k3_config cfg;
    int kda_rank;                         /* f_a_proj rows (from the checkpoint) */
    int n_kda, n_mla;
    k3_layer *layers;
    k3_mat embed, norm, lm_head;
    float *out_res_sw;
    uint64_t spine_bytes, expert_bytes;
    const k3_kernels *kr;                 /* kernel path, chosen at engine load (kernels.h) */
    k3_store *store;                      /* routed experts; set by the engine after binding */
    int n_packed;                         /* spine matrices bound to a pack (int8 or lossless) */
    struct k3_spine *spine;               /* the spine budget (spine.h), or NULL: all in place.
                                           * Passes get layers via k3_spine_layer, not layers[] */
    const k3_expert_ranks *ranks;         /* expert parallelism (pass.h), or NULL: this
                                           * process computes every routed expert */
    /* Tests only (tests/test_latent.c), NULL in the product: the MLA attention through this
     * instead of the latent absorbed form, so the expanded oracle runs the same passes. It
     * gets the layer's latent cache rows [pos0 + n][lora + rope] and writes o [n][H][v] for
     * Q [n][H][nope + rope] at positions pos0.. (the contract of k3_mla_attend, layers.h). */
    void (*mla_oracle)(void *user, const struct k3_model *m, const k3_layer *L,
                       const float *cache, int pos0, int n, const float *Q, float *o);
    void *mla_oracle_user;
} k3_model;

/* Binds every tensor the forward pass needs, checking dtype and shape against cfg.
 * Errors: K3_ERR_CHECKPOINT naming the tensor and shard; K3_ERR_GENERIC (out of memory). */
int k3_model_bind(k3_model *m, const k3_config *cfg, const k3_checkpoint *ck, k3_err *err);
/* The same, binding every spine matrix that pack holds to its int8 copy (NOT exact; pack must
 * have passed k3_pack_check_model for ck and stay open while m is used). pack may be NULL.
 * q8_act (--approx): those matrices are multiplied with int8-quantized activations
 * (K3_DT_I8_Q8, kernels.h), a second non-exact mode. */
int k3_model_bind_packed(k3_model *m, const k3_config *cfg, const k3_checkpoint *ck,
                         const k3_pack *pack, bool q8_act, k3_err *err);
void k3_model_free(k3_model *m);

/* Per-sequence state + scratch, sized from the config at creation. */
typedef struct k3_state k3_state;

int k3_state_new(const k3_model *m, int max_ctx, k3_state **out, k3_err *err);
void k3_state_free(k3_state *s);
void k3_state_reset(k3_state *s);
int k3_state_pos(const k3_state *s);
int k3_state_max_ctx(const k3_state *s);
/* Bytes a session's state takes at max_ctx positions (0 = the default), for the memory plan;
 * counts a pass's scratch at K3_DEFAULT_CHUNK rows. */
size_t k3_state_plan_bytes(const k3_model *m, int max_ctx);
/* Bytes of the copy a prompt pass that may be stopped keeps for each session in it, to go back
 * to where the pass began (forward_batch.c, "stopping a pass"): the KDA state and conv windows
 * of every KDA layer, independent of the context (465 MB at K3's widths). */
size_t k3_state_undo_bytes(const k3_model *m);
/* Bytes each further row of a pass adds to its scratch once the pass has more rows than a
 * group (batch.h K3_BATCH_GROUP, k3_prefill_group_rows): the rows' block partial sums, AttnRes
 * blocks, FFN input and the routed experts' inputs and per-slot outputs. The other buffers
 * are one group's: k3_prefill_group_bytes is what they add from rows_min rows to a whole
 * group beyond rows_min x k3_prefill_row_bytes, so a pass of R >= group rows takes exactly
 * k3_batch_plan_bytes(rows_min) + k3_prefill_group_bytes + (R - rows_min) x
 * k3_prefill_row_bytes. For the plan's prompt passes. */
size_t k3_prefill_row_bytes(const k3_model *m);
size_t k3_prefill_group_bytes(const k3_model *m, int rows_min);
int k3_prefill_group_rows(void);
/* Phase times summed over every step so far, and of the last step. */
void k3_state_times(const k3_state *s, k3_phase_times *sum, k3_phase_times *last);
/* The last step's MoE wait and routed-expert compute per layer ([num_hidden_layers] each,
 * zero for dense layers), valid until the next step. */
void k3_state_layer_times(const k3_state *s, const double **eload_s, const double **expert_s);

/* ---- the host state seen by a device backend (src/engine/backend.h, src/cuda) -------------
 * A backend that runs the pass itself keeps this host state as the session's bookkeeping: it
 * reads the position, fetches routed experts through the store client, and after each step it
 * advances the position; it touches the recurrent state only to copy it for state files. */

/* The session's expert store client (its pins and routing history, store.h). */
k3_store_client *k3_state_store(k3_state *s);
/* Ends a step the backend ran at k3_state_pos(s): the step's phase times t (seconds) become
 * the last step's and are added to the sums, and the position advances by one. */
void k3_state_advance(k3_state *s, const k3_phase_times *t);

/* The host copies of the recurrent state, laid out as the CPU pass keeps them: per KDA layer
 * S [heads][d][d] (kda_S_floats) and conv windows [3][P][conv-1] (kda_conv_floats); per MLA
 * layer the LATENT cache [max_ctx][kv_floats] (normed c_kv ++ k_pe, state.h), of which
 * positions [0, pos) are used. */
typedef struct k3_state_buffers {
    float *kda_S, *kda_conv, *kv;
    size_t kda_S_floats, kda_conv_floats, kv_floats; /* per layer; kv per position */
    int pos, max_ctx;
} k3_state_buffers;
void k3_state_buffers_of(k3_state *s, k3_state_buffers *out);

/* One token through the whole model at position k3_state_pos(s) (spec §3); advances the
 * position. logits [vocab] may be NULL. trace may be NULL. Allocation-free.
 * Errors: K3_ERR_EXPERT_IO (a routed expert could not be read), K3_ERR_IO (a streamed spine
 * layer could not be read, spine.h): logits are not written and the session must be reset
 * before further use. */
int k3_forward(const k3_model *m, k3_state *s, int32_t token, float *logits,
               const k3_trace *trace, k3_err *err);

/* k3_forward_batch flags: logits [n][vocab] at every position (else [vocab] after the last);
 * keep what k3_state_rewind needs to undo part of this pass. K3_BATCH_NO_LOGITS: a segment
 * of k3_forward_multi that wants no logits. */
enum { K3_BATCH_ALL_LOGITS = 1, K3_BATCH_REWINDABLE = 2, K3_BATCH_NO_LOGITS = 4 };

/* tokens[0..n) through the whole model at positions k3_state_pos(s).. in ONE pass (prefill
 * chunks, speculative verification; src/model/forward_batch.c): every spine matrix and every
 * routed expert of the tokens' union is read once. Bit-identical to n calls of k3_forward
 * (state, logits, routing). logits may be NULL; trace hooks see every position (layer by
 * layer). Scratch grows to n tokens on the first pass that needs it (the only allocation).
 * Errors: K3_ERR_INPUT (n < 1 or the context is full), K3_ERR_GENERIC (out of memory),
 * K3_ERR_EXPERT_IO, K3_ERR_IO (as k3_forward; the session must then be reset);
 * K3_ERR_INTERRUPTED (on_layer stopped it: the state is as before the pass, see below). */
int k3_forward_batch(const k3_model *m, k3_state *s, const int32_t *tokens, int n,
                     float *logits, int flags, const k3_trace *trace, k3_err *err);

/* ---- several sessions in one pass (issue 18) ----------------------------------------------- */

/* The scratch of a batched pass for up to cap rows (batch.h): a session keeps its own for its
 * prefill chunks; k3_forward_multi takes one from its caller. */
typedef struct k3_batch k3_batch;
/* NULL when out of memory. */
k3_batch *k3_batch_new(const k3_model *m, int cap);
/* Bytes k3_batch_new(m, cap) allocates (without rewind buffers), for the memory plan. */
size_t k3_batch_bytes(const k3_model *m, int cap);
void k3_batch_free(k3_batch *b);
/* Routed experts the passes on b asked the store for: the union of each MoE layer's rows,
 * summed over layers and passes. */
uint64_t k3_batch_experts(const k3_batch *b);

/* Positions per tile of the latent MLA attention (mla.c): tiles start at multiples of it, so
 * it fixes the online softmax's order (changing it changes results within rounding). */
#define K3_MLA_TILE 512

/* Benchmarks only (k3-lab bench mla): the attention of MLA layer `layer` (an index of
 * m->layers, in place: no spine budget) for n queries Q [n][H][nope + rope] at positions
 * pos0.. over s's latent cache, whose rows 0..pos0+n-1 the caller filled (k3_state_buffers_of),
 * into o [n][H][v] (spec §7.5, absorbed form, as the passes run it). b (cap >= n) gives the
 * scratch of a pass of n rows; NULL takes the session's one-token scratch. */
void k3_mla_attend_rows(const k3_model *m, int layer, k3_state *s, k3_batch *b, int pos0, int n,
                        const float *Q, float *o);

/* One session's rows of a k3_forward_multi pass: tokens[0, n) at positions k3_state_pos(s)..;
 * flags K3_BATCH_ALL_LOGITS (logits after every row), K3_BATCH_NO_LOGITS (none), else 0 (after
 * the last row), plus K3_BATCH_REWINDABLE (speculative verification: the session keeps what
 * k3_state_rewind needs, in its own rewind buffers); trace may be NULL. */
typedef struct k3_batch_seg {
    k3_state *s;
    const int32_t *tokens;
    int n;
    int flags;
    const k3_trace *trace;
} k3_batch_seg;

/* A pass whose trace's on_layer asks to stop (pass.h) returns K3_ERR_INTERRUPTED with every
 * segment's state exactly as before the pass; to that end a pass holding a prompt chunk copies
 * each session's KDA state and conv windows of a layer before running it, into the pass's
 * scratch (grown, the first time, to the segments that need a copy: k3_state_undo_bytes each;
 * when that allocation fails the pass runs to its end without asking on_layer). */

/* segs[0, nseg) (distinct states) through the whole model in ONE pass over all their rows,
 * laid out segment after segment in b (at most b's cap rows): each spine matrix is applied
 * once over all rows, the MoE reads the union of the rows' experts once through `client` (a
 * store client of the pass's own, not a session's), and every state-touching step (KDA conv
 * and recurrence, MLA cache and attention, positions, traces, each session's store history)
 * goes through the row's own segment in its token order. Each segment ends bit-identical to
 * k3_forward_batch of its tokens on its state alone (logits, state, routing). logits
 * [rows][vocab]: the rows the segments want, in segment order (may be NULL). Every state's
 * phase times become the pass's (with tokens = its rows). Allocation-free, but for the rewind
 * buffers of a rewindable segment's session on its first such pass (as k3_forward_batch).
 * Errors: K3_ERR_INPUT (a segment of no tokens, a context too small, more rows than b's cap:
 * nothing has run); K3_ERR_GENERIC (out of memory for rewind buffers); K3_ERR_EXPERT_IO,
 * K3_ERR_IO (as k3_forward: every segment's state must then be reset); K3_ERR_INTERRUPTED
 * (a segment's on_layer stopped the pass: every state is as before it). */
int k3_forward_multi(const k3_model *m, k3_batch *b, k3_store_client *client,
                     const k3_batch_seg *segs, int nseg, float *logits, k3_err *err);

/* Moves the position back to pos inside the last pass, made with K3_BATCH_REWINDABLE and not
 * followed by any other step: the KDA state and conv windows are restored to before that pass
 * and its first pos - start tokens are replayed through the recurrence alone (no weights
 * read), so they end bit-identical to feeding only those tokens; the MLA cache is truncated
 * to pos. Errors: K3_ERR_INPUT (pos outside that pass). */
int k3_state_rewind(const k3_model *m, k3_state *s, int pos, k3_err *err);

#endif
