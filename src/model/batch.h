/* batch.h — scratch of the batched forward pass (forward_batch.c; internal to src/model).
 *
 * Invariants:
 *  - Row t of every [cap][...] buffer belongs to the t-th token of the pass; a pass holds at
 *    most cap tokens. The buffers are (re)allocated only when a pass needs more tokens than
 *    cap, i.e. once per session for a fixed chunk size, never per token.
 *  - Rewind data (k3_rewind) exists only for a pass made with K3_BATCH_REWINDABLE and describes
 *    that pass alone: the KDA state and conv windows of every KDA layer as they were before the
 *    pass, and per KDA layer and token what the delta rule consumed (k after its L2 norm, v
 *    after its conv, the decay alpha, sigmoid(beta)) and the raw conv inputs. Replaying the
 *    first a tokens from the saved state repeats exactly the operations of the pass on exactly
 *    the same values, so the state ends bit-identical to feeding those a tokens alone.
 */
#ifndef K3_BATCH_H
#define K3_BATCH_H

#include "state.h"

typedef struct k3_rewind {
    int cap;            /* tokens per pass these buffers hold */
    int pass_pos, pass_n; /* the last rewindable pass: its first position and length; n 0 = none */
    float *S, *conv;    /* [n_kda][S floats], [n_kda][conv floats]: state before the pass */
    float *k, *v, *alpha; /* [n_kda][cap][P] */
    float *beta;        /* [n_kda][cap][heads] */
    float *raw;         /* [n_kda][3][cap][P]: q, k, v before the conv */
} k3_rewind;

typedef struct k3_batch {
    int cap, max_blocks;
    /* spine, [cap][hidden] each; blocks [cap][max_blocks][hidden] */
    float *P, *x, *xn, *a, *f, *tmp, *blocks;
    /* KDA: [cap][P] (fa [cap][rank], beta [cap][heads]); o and g [cap][max(P, MLA heads·v)] */
    float *q, *k, *v, *kf, *fa, *beta, *o, *g;
    /* MLA: cq [cap][q_lora], Q [cap][H·qk], ckv [cap][lora+rope]; the attention's scratch
     * (layers.h: rows for min(cap, 1024 / heads) queries, never the context) */
    float *cq, *Q, *ckv;
    struct k3_mla_ws *mla_ws;
    /* FFN: gate, up [cap][max intermediate]; router, biased [cap][E]; lat, lat_acc
     * [cap][latent]; exp_outs [cap][K][latent]; topk / topk_w [cap][K] */
    float *gate, *up, *router, *biased, *lat, *lat_acc, *exp_outs, *topk_w;
    int *topk;
    /* the union of the chunk's experts: uni [E] in first-chosen order, slot_of [E] (index in
     * uni or -1), and for union entry u its members first[u]..first[u+1]-1 in member_tok /
     * member_j (token index and its router slot) */
    int *uni, *slot_of, *first, *fill, *member_tok, *member_j;
    /* expert parallelism (pass.h): this rank's entries of uni [E] and their indices in uni */
    int *own_uni, *own_u;
    /* one expert over its tokens: z [cap][latent], eg, eu [cap][moe_inter], eo [cap][latent] */
    float *z, *eg, *eu, *eo;
    /* the pass's segments (forward_batch.c): row t belongs to segment row_seg[t] at position
     * row_pos[t]; segment i holds rows seg_first[i]..seg_first[i+1]-1 */
    int *row_seg, *row_pos, *seg_first;
    uint64_t experts;   /* union entries requested since creation (k3_batch_experts) */
    k3_rewind rw;
} k3_batch;

/* Bytes of a k3_batch for cap tokens (without rewind buffers), for the memory plan. */
size_t k3_batch_plan_bytes(const k3_model *m, int max_blocks, int cap);

#endif
