/* state.h — the per-sequence state and scratch of the forward pass (internal to src/model).
 *
 * Invariants:
 *  - Everything here is sized from the config in k3_state_new; k3_forward never allocates.
 *  - KDA: per layer, S[head][key i][value j] (f32, zero at start) and the last conv-1 raw
 *    inputs of q, k, v per channel, oldest first.
 *  - MLA KV cache, LATENT form (spec §7.5): per MLA layer and position, the normed c_kv
 *    [kv_lora_rank] (kv_a_layernorm's output) followed by the shared, unrotated k_pe
 *    [qk_rope_head_dim]: kv_floats = lora + rope, 2,304 B at K3's widths against the expanded
 *    form's 98.6 KB. Attention runs in the absorbed form (mla.c); the expanded form is kept
 *    only in tests as the oracle (tests/test_latent.c). The cache is reserved as virtual
 *    memory for max_ctx positions and committed page by page as used; rows at or past pos
 *    are never read (a rewind just lowers pos and the next append overwrites them).
 *  - No scratch grows with the context: the attention's workspace (mla_ws) is sized by heads
 *    and tiles only (layers.h).
 */
#ifndef K3_STATE_H
#define K3_STATE_H

#include "model.h"

typedef struct k3_mla_ws k3_mla_ws; /* the latent attention's scratch (layers.h) */

struct k3_state {
    int pos, max_ctx;
    int n_kda;
    /* KDA */
    float *kda_S;       /* [n_kda][heads][d][d] */
    float *kda_conv;    /* [n_kda][3][P][conv-1] */
    size_t kda_S_floats, kda_conv_floats; /* per layer */
    /* MLA */
    float *kv;          /* [n_mla][max_ctx][kv_floats] (mmap'd, lazily committed) */
    size_t kv_floats;   /* per position per layer: kv_lora_rank + qk_rope_head_dim */
    size_t kv_bytes;    /* total mapping size */
    /* AttnRes */
    float *blocks;      /* [max_blocks][hidden]: R */
    int n_blocks, max_blocks;
    float *partial, *x, *xn, *mix, *ffn_out, *logit_in;  /* [hidden] each */
    /* mixer scratch */
    float *q, *k, *v, *g, *f, *fa, *beta, *o;          /* KDA: [P] (fa [rank], beta [heads]) */
    float *cq, *Q, *ckv;                               /* MLA [q_lora] [H][qk] [lora+rope] */
    k3_mla_ws *mla_ws;                                 /* one token's attention scratch */
    /* FFN scratch */
    float *gate, *up;                                  /* [max(inter, shared, expert inter)] */
    float *router, *biased, *lat, *lat_acc, *exp_out;  /* [E] x2, [latent] x3 */
    float *ffn_tmp;                                    /* [hidden] shared-expert output */
    int *topk;                                         /* [k] */
    float *topk_w;                                     /* [k] */
    /* routed experts (src/store) */
    k3_store_client *store;                            /* this session's pins and history */
    float *exp_outs;                                   /* [k][latent] one row per expert */
    float *exp_gate, *exp_up;                          /* [k][expert inter]: the ready experts
                                                        * of one k3_store_next_many, together */
    k3_expert *ready;                                  /* [k] their weights */
    int *ready_j;                                      /* [k] their indices in topk */
    k3_mxfp4 *mx_w;                                    /* [2k] the products of one */
    const float **mx_x;                                /* k3_matvec_mxfp4_many call */
    float **mx_y;
    float *la_router, *la_biased, *la_topk_w;          /* lookahead router scratch [E] [E] [k] */
    int *la_topk;                                      /* [k] */
    int *own_ids, *own_at, *own_pf;                    /* [k] this rank's chosen experts,
                                                        * their router slots, its prefetches
                                                        * (expert parallelism, pass.h) */
    k3_phase_times tok, sum;                           /* this token's phases; all tokens */
    double *layer_eload_s, *layer_expert_s;            /* [layers] this token's MoE wait and
                                                        * routed-expert compute per layer */
    struct k3_batch *batch;   /* scratch of the batched pass (batch.h), NULL until first used */
};

/* Position t's row [kv_floats] of MLA layer slot's latent cache. */
static inline float *k3_mla_row(const k3_state *s, int slot, int t) {
    return s->kv + ((size_t)slot * (size_t)s->max_ctx + (size_t)t) * s->kv_floats;
}

/* Adds the last step's phase times (tok) to the sums (K3_PROFILE and the end-of-run line). */
void k3_state_sum_times(k3_state *s);

#endif
