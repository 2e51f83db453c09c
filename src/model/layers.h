/* layers.h — the per-layer pieces of the forward pass (internal to src/model). Each takes the
 * normed input x [hidden] and writes out [hidden]; state and scratch come from k3_state. */
#ifndef K3_LAYERS_H
#define K3_LAYERS_H

#include "state.h"

/* AttnRes mix (spec §5): out = Σ_j softmax_j(score_j) · values[j], with
 * score_j = Σ_i (v_j[i] / sqrt(mean(v_j²) + eps)) · sw[i]. n in 1..max_blocks+1. */
void k3_attn_res(const float *const *values, int n, const float *sw, int hidden, float eps,
                 float *out);

/* KDA token mixer (spec §6), one token, updating the layer's recurrent and conv state. */
void k3_kda_forward(const k3_model *m, const k3_layer *L, k3_state *s, const float *x,
                    float *out);
/* Its per-token pieces, shared with the batched pass (forward_batch.c), which calls them in
 * token order so the state evolves exactly as token by token.
 * k3_kda_conv: the short conv + SiLU of q, k, v [P] in place, advancing the conv windows
 * (spec §6.2). k3_kda_head: head h of one token (spec §6.3-6.7): L2-norms q and k [D] in
 * place, writes the decay alpha [D] and (when beta_out) sigmoid(beta_raw), runs the delta
 * rule on the head's state S [D][D] and writes the gated, normed read-out o [D]; f and g are
 * the head's [D] slices of the gate projections. */
void k3_kda_conv(const k3_model *m, const k3_layer *L, k3_state *s, float *q, float *k,
                 float *v);
void k3_kda_head(const k3_model *m, const k3_layer *L, float *S, int h, float *q, float *k,
                 const float *v, const float *f, float beta_raw, const float *g, float *o,
                 float *alpha, float *beta_out);

/* Gated NoPE MLA (spec §7), one token at position s->pos, appending to the latent cache. */
void k3_mla_forward(const k3_model *m, const k3_layer *L, k3_state *s, const float *x,
                    float *out);
/* Its pieces (spec §7.3-7.5), over the LATENT cache (state.h) in the absorbed form (mla.c).
 * k3_mla_append writes position t of the layer's cache: ckv [lora + rope], the kv_a output
 * with its latent part normed (c_kv, then k_pe). k3_mla_attend attends n queries of one
 * session, Q [n][H][nope + rope] at positions pos0 .. pos0 + n - 1, each causally over cache
 * positions 0..its own (all must be in the cache), into o [n][H][v]; ws is scratch (any row
 * count: results do not depend on it). Each query's result depends only on its Q row, its
 * position and the cache rows up to it: bit-identical across chunking and batching. */
void k3_mla_append(const k3_model *m, const k3_layer *L, k3_state *s, int t, const float *ckv);
void k3_mla_attend(const k3_model *m, const k3_layer *L, const k3_state *s, int pos0, int n,
                   const float *Q, k3_mla_ws *ws, float *o);
/* Largest kv_lora_rank the attention takes (one widened W_uk row lives on the stack);
 * k3_state_new refuses a larger one. */
#define K3_MLA_MAX_LORA 4096
/* Attention scratch of `rows` (query, head) rows: k3_mla_ws_rows gives the rows a pass of up
 * to `queries` queries uses (all heads of one query at least, at most max(heads, 1024)).
 * k3_mla_ws_new returns NULL when out of memory; k3_mla_ws_bytes counts for the plan. */
int k3_mla_ws_rows(const k3_config *c, int queries);
k3_mla_ws *k3_mla_ws_new(const k3_config *c, int rows);
size_t k3_mla_ws_bytes(const k3_config *c, int rows);
void k3_mla_ws_free(k3_mla_ws *ws);
/* The MLA LoRA norms' eps (KimiRMSNorm's 1e-6, spec §4). */
#define K3_MLA_LORA_EPS 1e-6f

/* Dense SiTU MLP (spec §8.2). */
void k3_dense_forward(const k3_model *m, const k3_layer *L, k3_state *s, const float *x,
                      float *out);

/* Stable LatentMoE (spec §8.3). Leaves the chosen ids / weights in s->topk / s->topk_w.
 * Routed experts come from m->store. Errors: K3_ERR_EXPERT_IO (an expert read failed). */
int k3_moe_forward(const k3_model *m, const k3_layer *L, k3_state *s, const float *x,
                   float *out, k3_err *err);
/* The router's choice from the gate's logits scores [E] (overwritten with the sigmoid scores;
 * biased [E] is scratch): ids[K] in canonical order and their weights (spec §8.3). */
void k3_moe_select(const k3_model *m, const k3_moe_weights *w, float *scores, float *biased,
                   int *ids, float *weights);
/* K3_PIPE: asks the store for the next MoE layer's likely experts, given this layer's input x. */
void k3_moe_prefetch_next(const k3_model *m, int layer, k3_state *s, const float *x);
/* This rank's share of ids[k] at MoE layer `layer` (all of them without m->ranks): writes
 * the owned ids to own[] in their order, and their indices in ids to at[] (may be NULL);
 * returns how many. */
int k3_moe_owned(const k3_model *m, int layer, const int *ids, int k, int *own, int *at);

#endif
