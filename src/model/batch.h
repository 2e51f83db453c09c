/* batch.h — scratch of the batched forward pass (forward_batch.c; internal to src/model).
 *
 * Invariants:
 *  - Row t of every [cap][...] buffer belongs to the t-th token of the pass; a pass holds at
 *    most cap tokens. Row i of a [group][...] buffer belongs to row g0 + i of the group that
 *    starts at row g0 (forward_batch.c). The buffers are (re)allocated only when a pass needs more tokens than
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

/* What a pass that may be stopped keeps to go back to where it began (forward_batch.c,
 * "stopping a pass"): for each of its segments that is not rewindable (a rewindable one has
 * the same copy in its k3_rewind), the KDA state and conv windows of every KDA layer as they
 * were before the pass ran that layer. Grown, never shrunk, to the segments a pass needs. */
typedef struct k3_undo {
    int cap;            /* segments buf holds */
    float *buf;         /* [cap][n_kda][S floats + conv floats] */
    int *at;            /* [rows cap] segment i's entry of buf (-1: none: it is rewindable) */
} k3_undo;

typedef struct k3_rewind {
    int cap;            /* tokens per pass these buffers hold */
    int pass_pos, pass_n; /* the last rewindable pass: its first position and length; n 0 = none */
    float *S, *conv;    /* [n_kda][S floats], [n_kda][conv floats]: state before the pass */
    float *k, *v, *alpha; /* [n_kda][cap][P] */
    float *beta;        /* [n_kda][cap][heads] */
    float *raw;         /* [n_kda][3][cap][P]: q, k, v before the conv */
} k3_rewind;

/* Rows per group: within a layer every step but the routed experts (AttnRes mixing, norms,
 * the KDA / MLA mixer with its projections, the dense FFN, the router and the latent
 * down-projection, the shared experts) runs over the pass's rows in groups of at most this
 * many, so those steps' buffers are [group][...] (group = min(cap, K3_BATCH_GROUP)) instead
 * of [cap][...]: at K3's widths they are ~1.9 MB per row, 0.49 GB at 256 rows, a fixed cost
 * where they used to grow with every id of a prompt pass. 256 rows keep the batched products
 * at their tiles' full width (the kernels reach their peak from 64 rows; BENCHMARKS.md) and
 * each spine matrix a group reads from RAM is used by 256 rows. Only the routed experts need
 * every row of the pass at once (each expert read once per pass); their members also run in
 * groups of at most this many rows. Each row's operations are the same at any grouping
 * (k3_matmul row t == k3_matvec of row t; KDA and MLA go through the rows in order), so the
 * group size changes no result. */
#define K3_BATCH_GROUP 256

typedef struct k3_batch {
    int cap, group, max_blocks; /* rows of a pass; rows of a group (min(cap, K3_BATCH_GROUP)) */
    /* across the pass, [cap][hidden]: P, the block partial sums; blocks [cap][max_blocks][hidden]
     * the AttnRes blocks; xm, the FFN's normed input, kept from the router to the shared
     * experts (which run after the routed experts, as in forward.c) */
    float *P, *blocks, *xm;
    /* one group, [group][hidden]: x, xn (mixer input), a (mixer output), f (FFN output), tmp */
    float *x, *xn, *a, *f, *tmp;
    /* KDA: [group][P] (fa [group][rank], beta [group][heads]); o and g [group][max(P, MLA
     * heads·v)] */
    float *q, *k, *v, *kf, *fa, *beta, *o, *g;
    /* MLA: cq [group][q_lora], Q [group][H·qk], ckv [group][lora+rope]; the attention's scratch
     * (layers.h: rows for min(group, 1024 / heads) queries, never the context) */
    float *cq, *Q, *ckv;
    struct k3_mla_ws *mla_ws;
    /* FFN, one group: gate, up [group][max intermediate]; router, biased [group][E]; lat_acc
     * [group][latent]. Across the pass (the routed experts' inputs and outputs): lat
     * [cap][latent]; exp_outs [cap][K][latent] (each row's router slots, summed in slot order);
     * topk / topk_w [cap][K] */
    float *gate, *up, *router, *biased, *lat, *lat_acc, *exp_outs, *topk_w;
    int *topk;
    /* the union of the chunk's experts: uni [E] in first-chosen order, slot_of [E] (index in
     * uni or -1), and for union entry u its members first[u]..first[u+1]-1 in member_tok /
     * member_j (token index and its router slot) */
    int *uni, *slot_of, *first, *fill, *member_tok, *member_j;
    /* expert parallelism (pass.h): this rank's entries of uni [E] and their indices in uni */
    int *own_uni, *own_u;
    /* one expert over a group of its members: z [group][latent], eg, eu [group][moe_inter],
     * eo [group][latent] */
    float *z, *eg, *eu, *eo;
    /* the pass's segments (forward_batch.c): row t belongs to segment row_seg[t] at position
     * row_pos[t]; segment i holds rows seg_first[i]..seg_first[i+1]-1 */
    int *row_seg, *row_pos, *seg_first;
    uint64_t experts;   /* union entries requested since creation (k3_batch_experts) */
    k3_rewind rw;
    k3_undo undo;       /* the pass-start copies of a pass that may be stopped */
} k3_batch;

/* Bytes of a k3_batch for cap tokens (without rewind buffers), for the memory plan. */
size_t k3_batch_plan_bytes(const k3_model *m, int max_blocks, int cap);

#endif
