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

/* Gated NoPE MLA (spec §7), one token at position s->pos, appending to the KV cache. */
void k3_mla_forward(const k3_model *m, const k3_layer *L, k3_state *s, const float *x,
                    float *out);

/* Dense SiTU MLP (spec §8.2). */
void k3_dense_forward(const k3_model *m, const k3_layer *L, k3_state *s, const float *x,
                      float *out);

/* Stable LatentMoE (spec §8.3). Leaves the chosen ids / weights in s->topk / s->topk_w.
 * Routed experts come from m->store. Errors: K3_ERR_EXPERT_IO (an expert read failed). */
int k3_moe_forward(const k3_model *m, const k3_layer *L, k3_state *s, const float *x,
                   float *out, k3_err *err);

#endif
