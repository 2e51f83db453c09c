/* forward_batch.c — n tokens through K3 in one pass (prefill chunks, speculative verification),
 * and rows of several sessions in one pass (k3_forward_multi: batched decoding across requests).
 *
 * The same spec §3 loop as forward.c, with every token of the pass carried through a layer
 * before the next layer starts, so each spine matrix and each routed expert is read once per
 * pass instead of once per token:
 *  - the linears are k3_matmul over the pass's rows; row t equals k3_matvec of that row bit
 *    for bit (kernels.h), so nothing here changes a result;
 *  - KDA keeps its recurrence: the conv windows advance token by token and each head runs the
 *    delta rule over the tokens in order (heads in parallel);
 *  - MLA appends a group's positions to the latent cache, then attends each session's queries
 *    causally over 0..t in the absorbed form (mla.c: per query the same bits at any batch);
 *  - the MoE asks the store for the union of the pass's chosen experts, runs each expert once
 *    over the tokens that chose it, and sums each token's experts in its router order.
 * Every step but the routed experts runs over the rows a group of at most K3_BATCH_GROUP at a
 * time (batch.h: why 256), groups in row order, so the pass's scratch per row is only what
 * lives across a layer; the mixer half of a layer runs over all groups before the FFN half (a
 * streamed spine layer holds one half at a time).
 * The result is therefore bit-identical to feeding the tokens one by one with k3_forward
 * (tests/test_prefill.c checks logits and state; tests/test_passgroups.c passes over groups).
 *
 * A pass is a list of segments, each the rows of one session (k3_batch_seg): a prefill chunk
 * is one segment, a multistep pass several. Rows are laid out segment after segment; the
 * linears and the MoE see all rows at once, while everything that touches a session's state
 * (KDA conv windows and recurrence, the MLA cache and attention, positions, traces, the
 * store's per-session prediction history) goes through the row's own segment, in the
 * segment's token order. Sessions share nothing in a pass but the weights read, so each
 * segment's result is the one it would get alone (tests/test_multistep.c).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batch.h"
#include "layers.h"
#include "spine.h"
#include "../util/clock.h"

/* ==== scratch ============================================================================= */

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

void k3_batch_free(k3_batch *b) {
    if (!b) return;
    float *f[] = {b->P, b->x, b->xn, b->a, b->f, b->tmp, b->blocks, b->q, b->k, b->v, b->kf,
                  b->fa, b->beta, b->o, b->g, b->xm, b->cq, b->Q, b->ckv, b->gate,
                  b->up, b->router, b->biased, b->lat, b->lat_acc, b->exp_outs, b->topk_w, b->z,
                  b->eg, b->eu, b->eo, b->rw.S, b->rw.conv, b->rw.k, b->rw.v, b->rw.alpha,
                  b->rw.beta, b->rw.raw};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(f[i]);
    int *ip[] = {b->topk, b->uni, b->own_uni, b->own_u, b->slot_of, b->first, b->fill,
                 b->member_tok, b->member_j, b->row_seg, b->row_pos, b->seg_first};
    for (size_t i = 0; i < sizeof ip / sizeof ip[0]; i++) free(ip[i]);
    free(b->undo.buf), free(b->undo.at);
    k3_mla_ws_free(b->mla_ws);
    free(b);
}

/* Lays out the buffers of a k3_batch for cap tokens and returns their bytes: allocates them
 * into b, or (b NULL) only counts. *ok is cleared when an allocation fails. */
static size_t batch_layout(const k3_model *m, int max_blocks, int cap, k3_batch *b, int *ok) {
    const k3_config *c = &m->cfg;
    k3_batch count;
    size_t bytes = 0;
    bool dry = b == NULL;
    if (dry) b = &count;
    size_t n = (size_t)cap, hd = (size_t)c->hidden_size;
    size_t P = (size_t)c->kda_num_heads * c->kda_head_dim, H = (size_t)c->num_attention_heads;
    size_t qk = (size_t)(c->qk_nope_head_dim + c->qk_rope_head_dim);
    size_t mla_o = H * (size_t)c->v_head_dim, E = (size_t)c->num_experts;
    size_t K = (size_t)c->num_experts_per_token, lat = (size_t)c->routed_expert_hidden_size;
    size_t inter = max_sz(max_sz((size_t)c->intermediate_size, (size_t)c->moe_intermediate_size *
                                 c->num_shared_experts), (size_t)c->moe_intermediate_size);
    size_t g = (size_t)(cap < K3_BATCH_GROUP ? cap : K3_BATCH_GROUP); /* rows of a group */
    b->cap = cap;
    b->group = (int)g;
    b->max_blocks = max_blocks;
#define ALLOC(p, count)                                                                       \
    do {                                                                                      \
        bytes += ((size_t)(count) + 1) * sizeof *(p);                                         \
        if (!dry) *ok &= ((p) = calloc((size_t)(count) + 1, sizeof *(p))) != NULL;            \
    } while (0)
    /* across the pass: [cap][...] */
    ALLOC(b->P, n * hd); ALLOC(b->blocks, n * (size_t)max_blocks * hd); ALLOC(b->xm, n * hd);
    ALLOC(b->lat, n * lat); ALLOC(b->exp_outs, n * K * lat);
    ALLOC(b->topk_w, n * K); ALLOC(b->topk, n * K);
    ALLOC(b->member_tok, n * K); ALLOC(b->member_j, n * K);
    ALLOC(b->row_seg, n); ALLOC(b->row_pos, n); ALLOC(b->seg_first, n + 1);
    ALLOC(b->uni, E); ALLOC(b->slot_of, E); ALLOC(b->first, E + 1); ALLOC(b->fill, E);
    ALLOC(b->own_uni, E); ALLOC(b->own_u, E);
    /* one group: [group][...] */
    ALLOC(b->x, g * hd); ALLOC(b->xn, g * hd); ALLOC(b->a, g * hd);
    ALLOC(b->f, g * hd); ALLOC(b->tmp, g * hd);
    ALLOC(b->q, g * P); ALLOC(b->k, g * P); ALLOC(b->v, g * P); ALLOC(b->kf, g * P);
    ALLOC(b->fa, g * (size_t)m->kda_rank); ALLOC(b->beta, g * (size_t)c->kda_num_heads);
    ALLOC(b->o, g * max_sz(P, mla_o)); ALLOC(b->g, g * max_sz(P, mla_o));
    ALLOC(b->cq, g * (size_t)c->q_lora_rank); ALLOC(b->Q, g * H * qk);
    ALLOC(b->ckv, g * (size_t)(c->kv_lora_rank + c->qk_rope_head_dim));
    ALLOC(b->gate, g * inter); ALLOC(b->up, g * inter);
    ALLOC(b->router, g * E); ALLOC(b->biased, g * E); ALLOC(b->lat_acc, g * lat);
    ALLOC(b->z, g * lat); ALLOC(b->eg, g * (size_t)c->moe_intermediate_size);
    ALLOC(b->eu, g * (size_t)c->moe_intermediate_size); ALLOC(b->eo, g * lat);
#undef ALLOC
    int ws_rows = k3_mla_ws_rows(c, (int)g);
    bytes += k3_mla_ws_bytes(c, ws_rows);
    if (!dry) *ok &= (b->mla_ws = k3_mla_ws_new(c, ws_rows)) != NULL;
    return bytes;
}

/* A k3_batch for cap tokens; NULL when out of memory. */
static k3_batch *batch_new(const k3_model *m, int max_blocks, int cap) {
    k3_batch *b = calloc(1, sizeof *b);
    int ok = 1;
    if (!b) return NULL;
    batch_layout(m, max_blocks, cap, b, &ok);
    if (!ok) {
        k3_batch_free(b);
        return NULL;
    }
    return b;
}

/* AttnRes blocks a pass holds, as k3_state_new counts them. */
static int max_blocks_of(const k3_model *m) {
    const k3_config *c = &m->cfg;
    return (c->num_hidden_layers + c->attn_res_block_size - 1) / c->attn_res_block_size + 1;
}

k3_batch *k3_batch_new(const k3_model *m, int cap) { return batch_new(m, max_blocks_of(m), cap); }

size_t k3_batch_bytes(const k3_model *m, int cap) {
    return k3_batch_plan_bytes(m, max_blocks_of(m), cap);
}

uint64_t k3_batch_experts(const k3_batch *b) { return b->experts; }

size_t k3_batch_plan_bytes(const k3_model *m, int max_blocks, int cap) {
    int ok = 1;
    return batch_layout(m, max_blocks, cap, NULL, &ok);
}

/* Rows beyond a group grow only the [cap][...] buffers (batch_layout), by the same bytes each. */
size_t k3_prefill_row_bytes(const k3_model *m) {
    int mb = max_blocks_of(m);
    return k3_batch_plan_bytes(m, mb, K3_BATCH_GROUP + 2) -
           k3_batch_plan_bytes(m, mb, K3_BATCH_GROUP + 1);
}

size_t k3_prefill_group_bytes(const k3_model *m, int rows_min) {
    int mb = max_blocks_of(m);
    if (rows_min >= K3_BATCH_GROUP) return 0;
    return k3_batch_plan_bytes(m, mb, K3_BATCH_GROUP) - k3_batch_plan_bytes(m, mb, rows_min) -
           (size_t)(K3_BATCH_GROUP - rows_min) * k3_prefill_row_bytes(m);
}

int k3_prefill_group_rows(void) { return K3_BATCH_GROUP; }

/* The rewind buffers for cap tokens (on the first rewindable pass). 0 when out of memory. */
static int rewind_alloc(const k3_model *m, const k3_state *s, k3_rewind *r, int cap) {
    const k3_config *c = &m->cfg;
    size_t L = (size_t)m->n_kda, n = (size_t)cap;
    size_t P = (size_t)c->kda_num_heads * c->kda_head_dim;
    int ok = 1;
#define ALLOC(p, count) ok &= ((p) = calloc((size_t)(count) + 1, sizeof *(p))) != NULL
    ALLOC(r->S, L * s->kda_S_floats); ALLOC(r->conv, L * s->kda_conv_floats);
    ALLOC(r->k, L * n * P); ALLOC(r->v, L * n * P); ALLOC(r->alpha, L * n * P);
    ALLOC(r->beta, L * n * (size_t)c->kda_num_heads); ALLOC(r->raw, L * 3 * n * P);
#undef ALLOC
    r->cap = cap;
    return ok;
}

/* ==== the pass's rows ===================================================================== */

/* One pass: its segments (rows seg_first[i]..seg_first[i+1]-1 of b belong to segs[i]), the
 * store client that asks for the union of experts, and the state that keeps the pass's phase
 * times while it runs (segment 0's; copied to the others at the end). */
typedef struct pass {
    const k3_model *m;
    k3_batch *b;
    const k3_batch_seg *segs;
    int nseg, n;          /* segments, rows */
    int n_blocks;         /* AttnRes blocks so far (the same for every row) */
    bool keep;            /* some segment is K3_BATCH_REWINDABLE (its rewind data goes to its
                           * own session's buffers, s->batch->rw) */
    bool stoppable;       /* on_layer may stop it: b->undo holds what a stop puts back */
    k3_store_client *client;
    k3_state *acct;
    k3_spine_pass *sp;
} pass;

/* Calls each row's segment's trace hook for rows r0..r1-1 of the pass, whose vectors are x
 * [r1 - r0][hd] (row r0 first). */
static void trace_rows(const pass *p, int layer, enum k3_trace_point pt, const float *x, int r0,
                       int r1) {
    int hd = p->m->cfg.hidden_size;
    const k3_batch *b = p->b;
    for (int t = r0; t < r1; t++) {
        const k3_trace *tr = p->segs[b->row_seg[t]].trace;
        if (tr && tr->on_vector)
            tr->on_vector(tr->user, b->row_pos[t], layer, pt, x + (size_t)(t - r0) * hd, hd);
    }
}

/* The part of segment g in rows r0..r1-1: rows *a..*z-1. */
static void seg_part(const k3_batch *b, int g, int r0, int r1, int *a, int *z) {
    *a = b->seg_first[g] > r0 ? b->seg_first[g] : r0;
    *z = b->seg_first[g + 1] < r1 ? b->seg_first[g + 1] : r1;
}

/* ==== mixers ============================================================================== */

/* What a rewindable segment's pass keeps of KDA layer slot (batch.h) for its rows a..z-1 in
 * the group starting at r0: the state before the pass (at the segment's first group) and the
 * raw conv inputs (before the conv runs: raw true), or k after its L2 norm and v after its
 * conv (after the delta rule: raw false). */
static void kda_keep(const pass *p, size_t slot, int r0, int r1, bool raw_part) {
    const k3_batch *b = p->b;
    size_t P = (size_t)p->m->cfg.kda_num_heads * p->m->cfg.kda_head_dim;
    for (int g = b->row_seg[r0]; g <= b->row_seg[r1 - 1]; g++) {
        if (!(p->segs[g].flags & K3_BATCH_REWINDABLE)) continue;
        k3_state *s = p->segs[g].s;
        k3_rewind *r = &s->batch->rw;
        int a, z;
        seg_part(b, g, r0, r1, &a, &z);
        size_t rcap = (size_t)r->cap, u0 = (size_t)(a - b->seg_first[g]);
        size_t at = (size_t)(a - r0) * P, bytes = (size_t)(z - a) * P * sizeof(float);
        if (!raw_part) {
            memcpy(r->k + (slot * rcap + u0) * P, b->k + at, bytes);
            memcpy(r->v + (slot * rcap + u0) * P, b->v + at, bytes);
            continue;
        }
        if (a == b->seg_first[g]) { /* the segment's first rows: its state before the pass */
            memcpy(r->S + slot * s->kda_S_floats, s->kda_S + s->kda_S_floats * slot,
                   s->kda_S_floats * sizeof(float));
            memcpy(r->conv + slot * s->kda_conv_floats, s->kda_conv + s->kda_conv_floats * slot,
                   s->kda_conv_floats * sizeof(float));
        }
        float *raw = r->raw + slot * 3 * rcap * P + u0 * P;
        memcpy(raw, b->q + at, bytes);
        memcpy(raw + rcap * P, b->k + at, bytes);
        memcpy(raw + 2 * rcap * P, b->v + at, bytes);
    }
}

/* KDA over rows r0..r1-1 of the pass (spec §6; input b->xn, output out, one group's rows):
 * batched projections, then each segment's recurrence token by token on its own state: the
 * conv windows in row order, and every (segment, head) pair's delta rule over the segment's
 * rows here in order (the pairs in parallel). The groups come in row order, so each state
 * goes through its segment's tokens in order. */
static void kda_batch(const pass *p, const k3_layer *L, int r0, int r1, float *out) {
    const k3_model *m = p->m;
    const k3_config *c = &m->cfg;
    const k3_kda_weights *w = &L->kda;
    k3_batch *b = p->b;
    int H = c->kda_num_heads, D = c->kda_head_dim, n = r1 - r0;
    size_t P = (size_t)H * D, slot = (size_t)L->state_slot;
    const float *x = b->xn;
    k3_matmul(m->kr, &w->q_proj, x, n, b->q);
    k3_matmul(m->kr, &w->k_proj, x, n, b->k);
    k3_matmul(m->kr, &w->v_proj, x, n, b->v);
    k3_matmul(m->kr, &w->f_a_proj, x, n, b->fa);
    k3_matmul(m->kr, &w->f_b_proj, b->fa, n, b->kf);
    k3_matmul(m->kr, &w->b_proj, x, n, b->beta);
    k3_matmul(m->kr, &w->g_proj, x, n, b->g);
    if (p->keep) kda_keep(p, slot, r0, r1, true);
    for (int t = r0; t < r1; t++) {
        size_t at = (size_t)(t - r0) * P;
        k3_kda_conv(m, L, p->segs[b->row_seg[t]].s, b->q + at, b->k + at, b->v + at);
    }
    int g0 = b->row_seg[r0], pairs = (b->row_seg[r1 - 1] - g0 + 1) * H;
#pragma omp parallel for schedule(static) if ((int64_t)P * n >= 4096)
    for (int i = 0; i < pairs; i++) {
        int g = g0 + i / H, h = i % H, a, z;
        seg_part(b, g, r0, r1, &a, &z);
        k3_state *s = p->segs[g].s;
        float *S0 = s->kda_S + s->kda_S_floats * slot;
        float alpha_local[1024];
        /* a rewindable segment keeps what its delta rule consumed, in its session's buffers */
        k3_rewind *r = p->segs[g].flags & K3_BATCH_REWINDABLE ? &s->batch->rw : NULL;
        size_t rcap = r ? (size_t)r->cap : 0;
        for (int t = a; t < z; t++) {
            size_t at = (size_t)(t - r0) * P + (size_t)h * D, u = (size_t)(t - b->seg_first[g]);
            float *alpha = r ? r->alpha + (slot * rcap + u) * P + (size_t)h * D : alpha_local;
            float *beta = r ? r->beta + (slot * rcap + u) * H + h : NULL;
            k3_kda_head(m, L, S0 + (size_t)h * D * D, h, b->q + at, b->k + at, b->v + at,
                        b->kf + at, b->beta[(size_t)(t - r0) * H + h], b->g + at, b->o + at,
                        alpha, beta);
        }
    }
    if (p->keep) kda_keep(p, slot, r0, r1, false);
    k3_matmul(m->kr, &w->o_proj, b->o, n, out);
}

/* Gated NoPE MLA over rows r0..r1-1 of the pass (spec §7; input b->xn, output out, one
 * group's rows): every row's position enters its session's latent cache, then each segment's
 * queries here attend causally to its session's positions 0..their own (earlier groups have
 * written the earlier positions). */
static void mla_batch(const pass *p, const k3_layer *L, int r0, int r1, float *out) {
    const k3_model *m = p->m;
    const k3_config *c = &m->cfg;
    const k3_mla_weights *w = &L->mla;
    k3_batch *b = p->b;
    int H = c->num_attention_heads, vd = c->v_head_dim, lora = c->kv_lora_rank, n = r1 - r0;
    int qr = c->q_lora_rank, ckv_w = lora + c->qk_rope_head_dim;
    size_t qk = (size_t)(c->qk_nope_head_dim + c->qk_rope_head_dim), mla_o = (size_t)H * vd;
    const float *x = b->xn;
    k3_matmul(m->kr, &w->q_a_proj, x, n, b->cq);
    for (int t = 0; t < n; t++)
        k3_rmsnorm(b->cq + t * qr, &w->q_a_layernorm, qr, K3_MLA_LORA_EPS, b->cq + t * qr);
    k3_matmul(m->kr, &w->q_b_proj, b->cq, n, b->Q);
    k3_matmul(m->kr, &w->kv_a_proj, x, n, b->ckv);
    for (int t = r0; t < r1; t++) { /* latent part only; the row enters the cache as it is */
        float *ckv = b->ckv + (size_t)(t - r0) * ckv_w;
        k3_rmsnorm(ckv, &w->kv_a_layernorm, lora, K3_MLA_LORA_EPS, ckv);
        k3_mla_append(m, L, p->segs[b->row_seg[t]].s, b->row_pos[t], ckv);
    }
    for (int i = b->row_seg[r0]; i <= b->row_seg[r1 - 1]; i++) {
        int a, z;
        seg_part(b, i, r0, r1, &a, &z);
        k3_mla_attend(m, L, p->segs[i].s, b->row_pos[a], z - a, b->Q + (size_t)(a - r0) * H * qk,
                      b->mla_ws, b->o + (size_t)(a - r0) * mla_o);
    }
    /* Output gate on the normed layer input, then o_proj (spec §7.4). */
    k3_matmul(m->kr, &w->g_proj, x, n, b->g);
    for (size_t i = 0; i < (size_t)n * mla_o; i++) b->o[i] = b->o[i] * k3_sigmoid(b->g[i]);
    k3_matmul(m->kr, &w->o_proj, b->o, n, out);
}

/* ==== FFN ================================================================================= */

static void dense_batch(const k3_model *m, const k3_layer *L, k3_batch *b, int n, float *out) {
    const k3_config *c = &m->cfg;
    k3_matmul(m->kr, &L->dense.gate_proj, b->xn, n, b->gate);
    k3_matmul(m->kr, &L->dense.up_proj, b->xn, n, b->up);
    k3_situ_vec(b->gate, b->up, n * c->intermediate_size, c->situ_beta, c->situ_linear_beta,
                b->gate);
    k3_matmul(m->kr, &L->dense.down_proj, b->gate, n, out);
}

/* The union of the pass's chosen experts (b->uni, in first-chosen order) and, for each, the
 * tokens that chose it with their router slot. Returns the union's size. */
static int gather_union(const k3_config *c, k3_batch *b, int n) {
    int E = c->num_experts, K = c->num_experts_per_token, nu = 0;
    for (int e = 0; e < E; e++) b->slot_of[e] = -1;
    for (int i = 0; i < n * K; i++) {
        int e = b->topk[i];
        if (b->slot_of[e] < 0) {
            b->slot_of[e] = nu;
            b->uni[nu] = e;
            b->fill[nu++] = 0;
        }
        b->fill[b->slot_of[e]]++;
    }
    b->first[0] = 0;
    for (int u = 0; u < nu; u++) b->first[u + 1] = b->first[u] + b->fill[u], b->fill[u] = 0;
    for (int i = 0; i < n * K; i++) {
        int u = b->slot_of[b->topk[i]], at = b->first[u] + b->fill[u]++;
        b->member_tok[at] = i / K;
        b->member_j[at] = i % K;
    }
    return nu;
}

/* Routed expert u of the union over its tokens, a group of them at a time: gather their
 * latents, E(z) = W2 · SiTU(W1 z, W3 z) as batched MXFP4 products, scatter into each token's
 * row of exp_outs (rows are independent: any grouping gives the same bits). */
static void expert_batch(const k3_model *m, k3_batch *b, int u, const k3_expert *ex) {
    const k3_config *c = &m->cfg;
    size_t lat = (size_t)c->routed_expert_hidden_size, K = (size_t)c->num_experts_per_token;
    for (int n0 = b->first[u]; n0 < b->first[u + 1]; n0 += b->group) {
        int mt = b->first[u + 1] - n0 < b->group ? b->first[u + 1] - n0 : b->group;
        for (int i = 0; i < mt; i++)
            memcpy(b->z + i * lat, b->lat + (size_t)b->member_tok[n0 + i] * lat,
                   lat * sizeof(float));
        k3_matmul_mxfp4(m->kr, &ex->w1, b->z, mt, b->eg);
        k3_matmul_mxfp4(m->kr, &ex->w3, b->z, mt, b->eu);
        k3_situ_vec(b->eg, b->eu, mt * c->moe_intermediate_size, c->situ_beta,
                    c->situ_linear_beta, b->eg);
        k3_matmul_mxfp4(m->kr, &ex->w2, b->eg, mt, b->eo);
        for (int i = 0; i < mt; i++) {
            size_t t = (size_t)b->member_tok[n0 + i], j = (size_t)b->member_j[n0 + i];
            memcpy(b->exp_outs + (t * K + j) * lat, b->eo + i * lat, lat * sizeof(float));
        }
    }
}

/* Stable LatentMoE (spec §8.3), the router's part for rows r0..r1-1 (their FFN inputs in
 * b->xm): each row's choice into topk / topk_w and its latent z (down_proj) into lat. */
static void moe_route(pass *p, const k3_layer *L, int r0, int r1) {
    const k3_model *m = p->m;
    const k3_config *c = &m->cfg;
    const k3_moe_weights *w = &L->moe;
    k3_batch *b = p->b;
    int K = c->num_experts_per_token, E = c->num_experts, n = r1 - r0;
    size_t hd = (size_t)c->hidden_size, lat = (size_t)c->routed_expert_hidden_size;
    const float *xm = b->xm + (size_t)r0 * hd;
    double t0 = k3_now_s();
    k3_matmul(m->kr, &w->router, xm, n, b->router);
    for (int t = r0; t < r1; t++)
        k3_moe_select(m, w, b->router + (size_t)(t - r0) * E, b->biased + (size_t)(t - r0) * E,
                      b->topk + t * K, b->topk_w + t * K);
    p->acct->tok.router_s += k3_now_s() - t0;
    k3_matmul(m->kr, &w->down_proj, xm, n, b->lat + (size_t)r0 * lat);
}

/* The routed experts of the pass (every row routed), each expert of the union read once, its
 * output per row and router slot into exp_outs. */
static int moe_experts(pass *p, const k3_layer *L, k3_err *err) {
    const k3_model *m = p->m;
    const k3_config *c = &m->cfg;
    k3_batch *b = p->b;
    k3_state *acct = p->acct;
    int K = c->num_experts_per_token, hd = c->hidden_size, n = p->n, layer = L->index;
    size_t lat = (size_t)c->routed_expert_hidden_size;
    double t0 = k3_now_s();
    int nu = gather_union(c, b, n), own = nu;
    b->experts += (uint64_t)nu;
    if (m->ranks) { /* this rank's experts of the union only */
        own = k3_moe_owned(m, layer, b->uni, nu, b->own_uni, b->own_u);
        k3_store_begin(p->client, layer, b->own_uni, own);
    } else {
        k3_store_begin(p->client, layer, b->uni, nu); /* misses start reading now */
    }
    for (int i = 0; i < p->nseg; i++) { /* each session's history: its last row's choice */
        int last = b->seg_first[i + 1] - 1;
        k3_state *s = p->segs[i].s;
        k3_store_set_choice(s->store, layer, b->topk + last * K, K);
        k3_moe_prefetch_next(m, layer, s, b->xm + (size_t)last * hd);
    }
    acct->tok.router_s += k3_now_s() - t0;
    int rc = K3_OK;
    for (int done = 0; done < own && !rc; done++) {
        int u;
        k3_expert ex;
        double t1 = k3_now_s();
        rc = k3_store_next(p->client, &u, &ex, err);
        double t2 = k3_now_s();
        acct->tok.eload_s += t2 - t1;
        acct->layer_eload_s[layer] += t2 - t1;
        if (rc) break;
        expert_batch(m, b, m->ranks ? b->own_u[u] : u, &ex);
        k3_store_done(p->client, u);
        double dt = k3_now_s() - t2;
        acct->tok.expert_s += dt;
        acct->layer_expert_s[layer] += dt;
    }
    k3_store_end(p->client);
    if (m->ranks) /* also after a failure: the peers learn it instead of waiting */
        rc = m->ranks->exchange(m->ranks->user, layer, b->topk, n, K, b->exp_outs, (int)lat, rc,
                                err);
    return rc;
}

/* The MoE's output for rows r0..r1-1 into out [r1 - r0][hidden]: each row's weighted sum of
 * its experts in its router order, normed, up_proj; plus the shared experts on the row's
 * full-width input (b->xm), the routed term first in the final add. */
static void moe_out(pass *p, const k3_layer *L, int r0, int r1, float *out) {
    const k3_model *m = p->m;
    const k3_config *c = &m->cfg;
    const k3_moe_weights *w = &L->moe;
    k3_batch *b = p->b;
    int K = c->num_experts_per_token, hd = c->hidden_size, n = r1 - r0;
    size_t lat = (size_t)c->routed_expert_hidden_size;
    for (int t = r0; t < r1; t++) {
        float *acc = b->lat_acc + (size_t)(t - r0) * lat;
        const float *wt = b->topk_w + t * K;
        for (size_t i = 0; i < lat; i++) acc[i] = 0;
        for (int j = 0; j < K; j++) {
            const float *e_out = b->exp_outs + ((size_t)t * K + j) * lat;
            for (size_t i = 0; i < lat; i++) acc[i] += e_out[i] * wt[j];
        }
        k3_rmsnorm(acc, &w->norm, (int)lat, c->rms_norm_eps, acc); /* on the sum */
    }
    k3_matmul(m->kr, &w->up_proj, b->lat_acc, n, out);
    int sh = c->moe_intermediate_size * c->num_shared_experts;
    const float *xm = b->xm + (size_t)r0 * hd;
    k3_matmul(m->kr, &w->shared_gate, xm, n, b->gate);
    k3_matmul(m->kr, &w->shared_up, xm, n, b->up);
    k3_situ_vec(b->gate, b->up, n * sh, c->situ_beta, c->situ_linear_beta, b->gate);
    k3_matmul(m->kr, &w->shared_down, b->gate, n, b->tmp);
    for (size_t i = 0; i < (size_t)n * hd; i++) out[i] = out[i] + b->tmp[i];
}

/* ==== the spine =========================================================================== */

/* AR(R_t ++ [last]) for row t over its first nb blocks with the layer's folded score
 * weights. */
static void mix(const pass *p, int t, int nb, const float *last, const float *sw, float *out) {
    const k3_config *c = &p->m->cfg;
    const float *vals[K3_MAX_RES_VALUES];
    size_t hd = (size_t)c->hidden_size;
    int n = 0;
    const float *R = p->b->blocks + (size_t)t * p->b->max_blocks * hd;
    for (int j = 0; j < nb; j++) vals[n++] = R + (size_t)j * hd;
    vals[n++] = last;
    k3_attn_res(vals, n, sw, c->hidden_size, c->rms_norm_eps, out);
}

/* Makes s->batch hold n tokens (and the rewind buffers when keep). */
static int reserve(const k3_model *m, k3_state *s, int n, bool keep, k3_err *err) {
    k3_batch *b = s->batch;
    if (!b || b->cap < n) {
        k3_batch_free(b);
        if (!(s->batch = b = batch_new(m, s->max_blocks, n)))
            return k3_fail(err, K3_ERR_GENERIC, "out of memory for a %d-token pass", n);
    }
    if (keep && b->rw.cap < n) {
        k3_rewind none = {0};
        float *old[] = {b->rw.S, b->rw.conv, b->rw.k, b->rw.v, b->rw.alpha, b->rw.beta, b->rw.raw};
        for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) free(old[i]);
        b->rw = none;
        if (!rewind_alloc(m, s, &b->rw, n)) {
            k3_batch_free(b);
            s->batch = NULL;
            return k3_fail(err, K3_ERR_GENERIC, "out of memory for the rewind buffers of a "
                           "%d-token pass", n);
        }
    }
    b->rw.pass_n = 0; /* any pass ends what an earlier pass could rewind */
    return K3_OK;
}

/* ==== stopping a pass ===================================================================== */

/* A pass may be stopped by an on_layer hook when it holds a prompt chunk (a segment of more
 * than one id that is not a speculative verification) and some segment has a hook; not under
 * expert parallelism (the other ranks would wait for this one at the next layer's exchange
 * until their deadline: a stop there would have to be agreed by every rank). A pass of decode
 * rows (single ids, verifications) lasts one step and runs to its end, as a single step does.
 * What a stop must undo is the KDA state and conv windows of the layers that ran: they cannot
 * be rewound, so each is copied before the pass runs its layer (undo_keep: at K3's widths 465
 * MB per segment over a whole pass, one memcpy per layer beside minutes of compute; a
 * rewindable segment's copy is already in its k3_rewind). The position moves only when the
 * pass ends, and the MLA rows written at the pass's positions are never read at or past the
 * position (state.h), so with those restored every session is exactly where the pass began.
 * When the copies cannot be allocated, the pass runs to its end (on_layer is not called). */
static bool pass_stoppable(pass *p) {
    const k3_model *m = p->m;
    k3_undo *u = &p->b->undo;
    bool hook = false, prompt = false;
    int need = 0;
    for (int i = 0; i < p->nseg; i++) {
        const k3_batch_seg *g = &p->segs[i];
        hook |= g->trace && g->trace->on_layer;
        prompt |= g->n > 1 && !(g->flags & K3_BATCH_REWINDABLE);
        need += !(g->flags & K3_BATCH_REWINDABLE);
    }
    if (m->ranks || !hook || !prompt) return false;
    const k3_state *s0 = p->segs[0].s;
    size_t per = (size_t)m->n_kda * (s0->kda_S_floats + s0->kda_conv_floats);
    if (!u->at && !(u->at = malloc((size_t)p->b->cap * sizeof *u->at))) return false;
    if (u->cap < need) {
        float *buf = malloc((size_t)need * per * sizeof *buf + 1);
        if (!buf) return false;
        free(u->buf);
        u->buf = buf, u->cap = need;
    }
    for (int i = 0, k = 0; i < p->nseg; i++)
        u->at[i] = p->segs[i].flags & K3_BATCH_REWINDABLE ? -1 : k++;
    return true;
}

/* Segment i's copy of KDA layer slot's S (then its conv windows right after it). */
static float *undo_slot(const pass *p, int i, size_t slot) {
    const k3_state *s = p->segs[i].s;
    size_t per = s->kda_S_floats + s->kda_conv_floats;
    return p->b->undo.buf + ((size_t)p->b->undo.at[i] * (size_t)p->m->n_kda + slot) * per;
}

/* Before the pass runs KDA layer slot: each non-rewindable segment's state and conv windows. */
static void undo_keep(const pass *p, size_t slot) {
    for (int i = 0; i < p->nseg; i++) {
        if (p->b->undo.at[i] < 0) continue;
        const k3_state *s = p->segs[i].s;
        float *u = undo_slot(p, i, slot);
        memcpy(u, s->kda_S + s->kda_S_floats * slot, s->kda_S_floats * sizeof(float));
        memcpy(u + s->kda_S_floats, s->kda_conv + s->kda_conv_floats * slot,
               s->kda_conv_floats * sizeof(float));
    }
}

/* The pass stopped after layer `last`: every segment's KDA layers 0..last back as they were
 * before the pass (from its copy, or a rewindable one's k3_rewind). Nothing of the pass can be
 * rewound after it. */
static void undo_restore(const pass *p, int last) {
    for (int i = 0; i < p->nseg; i++) {
        k3_state *s = p->segs[i].s;
        const k3_rewind *r = s->batch ? &s->batch->rw : NULL;
        bool rw = p->b->undo.at[i] < 0; /* rewindable: kda_keep made the copy */
        for (int l = 0; l <= last; l++) {
            const k3_layer *L = &p->m->layers[l];
            if (L->is_mla) continue;
            size_t slot = (size_t)L->state_slot;
            const float *S = rw ? r->S + slot * s->kda_S_floats : undo_slot(p, i, slot);
            const float *cv = rw ? r->conv + slot * s->kda_conv_floats : S + s->kda_S_floats;
            memcpy(s->kda_S + s->kda_S_floats * slot, S, s->kda_S_floats * sizeof(float));
            memcpy(s->kda_conv + s->kda_conv_floats * slot, cv,
                   s->kda_conv_floats * sizeof(float));
        }
        if (s->batch) s->batch->rw.pass_n = 0;
    }
}

/* The row after the group that starts at r0. */
static int group_end(const pass *p, int r0) {
    return p->n - r0 < p->b->group ? p->n : r0 + p->b->group;
}

/* The mixer half of layer l for all rows, a group at a time: AttnRes mix of the layer input,
 * input_layernorm, the mixer, and its output added into the rows' partial sums P. */
static void mixer_half(pass *p, const k3_layer *L, int l) {
    const k3_config *c = &p->m->cfg;
    k3_batch *b = p->b;
    int hd = c->hidden_size, nb = p->n_blocks;
    size_t vec = (size_t)hd * sizeof(float);
    bool fresh_block = l % c->attn_res_block_size == 0;
    if (p->stoppable && !L->is_mla) undo_keep(p, (size_t)L->state_slot);
    for (int r0 = 0, r1; r0 < p->n; r0 = r1) {
        r1 = group_end(p, r0);
        for (int t = r0; t < r1; t++) {
            float *P = b->P + (size_t)t * hd, *x = b->x + (size_t)(t - r0) * hd;
            if (nb > 0) mix(p, t, nb, P, L->attn_res_sw, x);
            else memcpy(x, P, vec);
            if (fresh_block) memcpy(b->blocks + ((size_t)t * b->max_blocks + nb) * hd, P, vec);
            k3_rmsnorm(x, &L->input_layernorm, hd, c->rms_norm_eps, b->xn + (size_t)(t - r0) * hd);
        }
        trace_rows(p, l, K3_TRACE_ATTN_IN, b->x, r0, r1);
        double t0 = k3_now_s();
        if (L->is_mla) mla_batch(p, L, r0, r1, b->a);
        else kda_batch(p, L, r0, r1, b->a);
        p->acct->tok.attn_s += k3_now_s() - t0;
        trace_rows(p, l, K3_TRACE_ATTN_OUT, b->a, r0, r1);
        for (int t = r0; t < r1; t++) {
            float *P = b->P + (size_t)t * hd, *a = b->a + (size_t)(t - r0) * hd;
            if (fresh_block) memcpy(P, a, vec); /* first contribution after a reset is a copy */
            else for (int i = 0; i < hd; i++) P[i] = P[i] + a[i];
        }
    }
    if (fresh_block) p->n_blocks++;
}

/* The FFN's input for rows r0..r1-1 (AttnRes mix, post_attention_layernorm) into out
 * [r1 - r0][hidden], traced. */
static void ffn_input(pass *p, const k3_layer *L, int l, int r0, int r1, float *out) {
    const k3_config *c = &p->m->cfg;
    k3_batch *b = p->b;
    int hd = c->hidden_size;
    for (int t = r0; t < r1; t++) {
        float *x = b->x + (size_t)(t - r0) * hd;
        mix(p, t, p->n_blocks, b->P + (size_t)t * hd, L->mlp_res_sw, x);
        k3_rmsnorm(x, &L->post_attention_layernorm, hd, c->rms_norm_eps, out + (size_t)(t - r0) * hd);
    }
    trace_rows(p, l, K3_TRACE_MLP_IN, b->x, r0, r1);
}

/* The FFN's output f [r1 - r0][hidden] for rows r0..r1-1 added into their partial sums. */
static void ffn_add(pass *p, int l, int r0, int r1) {
    k3_batch *b = p->b;
    size_t hd = (size_t)p->m->cfg.hidden_size;
    trace_rows(p, l, K3_TRACE_MLP_OUT, b->f, r0, r1);
    float *P = b->P + (size_t)r0 * hd;
    for (size_t i = 0; i < (size_t)(r1 - r0) * hd; i++) P[i] = P[i] + b->f[i];
    trace_rows(p, l, K3_TRACE_PARTIAL_SUM, P, r0, r1);
}

/* The FFN half of layer l for all rows: a dense FFN a group at a time; a MoE routes every row
 * (a group at a time), runs the pass's routed experts, then adds each group's output. */
static int ffn_half(pass *p, const k3_layer *L, int l, k3_err *err) {
    const k3_config *c = &p->m->cfg;
    k3_batch *b = p->b;
    int hd = c->hidden_size, r0, r1;
    if (!L->is_moe) {
        for (r0 = 0; r0 < p->n; r0 = r1) {
            r1 = group_end(p, r0);
            ffn_input(p, L, l, r0, r1, b->xn);
            dense_batch(p->m, L, b, r1 - r0, b->f);
            ffn_add(p, l, r0, r1);
        }
        return K3_OK;
    }
    double moe_s = 0, t0;
    for (r0 = 0; r0 < p->n; r0 = r1) {
        r1 = group_end(p, r0);
        ffn_input(p, L, l, r0, r1, b->xm + (size_t)r0 * hd);
        t0 = k3_now_s();
        moe_route(p, L, r0, r1);
        moe_s += k3_now_s() - t0;
    }
    t0 = k3_now_s();
    int rc = moe_experts(p, L, err);
    moe_s += k3_now_s() - t0;
    if (!rc) {
        int K = c->num_experts_per_token;
        for (int t = 0; t < p->n; t++) {
            const k3_trace *tr = p->segs[b->row_seg[t]].trace;
            if (tr && tr->on_routing)
                tr->on_routing(tr->user, b->row_pos[t], l, b->topk + t * K, b->topk_w + t * K, K);
        }
        for (r0 = 0; r0 < p->n; r0 = r1) {
            r1 = group_end(p, r0);
            t0 = k3_now_s();
            moe_out(p, L, r0, r1, b->f);
            moe_s += k3_now_s() - t0;
            ffn_add(p, l, r0, r1);
        }
    }
    p->acct->tok.moe_s += moe_s;
    return rc;
}

/* One layer (spec §3) for all rows of the pass: its mixer half, then its FFN half (a
 * streamed spine holds one half at a time). */
static int layer_batch(pass *p, int l, k3_err *err) {
    const k3_model *m = p->m;
    const k3_layer *L;
    int rc = k3_spine_layer(m, p->sp, l, K3_SPINE_MIXER, &L, err); /* streamed: once per pass */
    if (rc) return rc;
    mixer_half(p, L, l);
    if ((rc = k3_spine_layer(m, p->sp, l, K3_SPINE_FFN, &L, err))) return rc;
    return ffn_half(p, L, l, err);
}

/* Whether row t wants logits. */
static bool wants_logits(const pass *p, int t) {
    int g = p->b->row_seg[t], f = p->segs[g].flags;
    return !(f & K3_BATCH_NO_LOGITS) && ((f & K3_BATCH_ALL_LOGITS) || t == p->b->seg_first[g + 1] - 1);
}

/* The output AttnRes mix and model.norm of every row (traced), a group at a time, and
 * lm_head over the rows that want logits: each group's such rows gathered (row order) into
 * b->x (free by then), their logits into logits [rows][vocab] in row order. */
static int final_batch(pass *p, float *logits, k3_err *err) {
    const k3_model *m = p->m;
    const k3_config *c = &m->cfg;
    k3_batch *b = p->b;
    size_t hd = (size_t)c->hidden_size, vocab = (size_t)c->vocab_size;
    const k3_mat *head = NULL;
    int want = 0, done = 0, rc;
    for (int t = 0; t < p->n; t++) want += wants_logits(p, t);
    double head_s = 0, t0 = k3_now_s();
    if (want && logits) {
        head = &m->lm_head;
        if ((rc = k3_spine_head(m, p->sp, &head, err))) return rc;
    }
    head_s += k3_now_s() - t0;
    for (int r0 = 0, r1; r0 < p->n; r0 = r1) {
        r1 = group_end(p, r0);
        for (int t = r0; t < r1; t++) {
            float *x = b->x + (size_t)(t - r0) * hd;
            mix(p, t, p->n_blocks, b->P + (size_t)t * hd, m->out_res_sw, x);
            k3_rmsnorm(x, &m->norm, (int)hd, c->rms_norm_eps, b->xn + (size_t)(t - r0) * hd);
        }
        trace_rows(p, -1, K3_TRACE_FINAL_HIDDEN, b->x, r0, r1);
        trace_rows(p, -1, K3_TRACE_FINAL_NORMED, b->xn, r0, r1);
        if (!head) continue;
        t0 = k3_now_s();
        int rows = 0;
        for (int t = r0; t < r1; t++)
            if (wants_logits(p, t))
                memcpy(b->x + rows++ * hd, b->xn + (size_t)(t - r0) * hd, hd * sizeof(float));
        if (rows == 1) k3_matvec(m->kr, head, b->x, logits + (size_t)done * vocab);
        else if (rows > 1) k3_matmul(m->kr, head, b->x, rows, logits + (size_t)done * vocab);
        done += rows;
        head_s += k3_now_s() - t0;
    }
    p->acct->tok.head_s = head_s;
    return K3_OK;
}

/* Each segment's on_layer hook after layer l of a pass that may stop (pass_stoppable);
 * K3_ERR_INTERRUPTED when one asks to stop. */
static int layer_done(const pass *p, int l, k3_err *err) {
    int L = p->m->cfg.num_hidden_layers;
    if (!p->stoppable) return K3_OK;
    for (int i = 0; i < p->nseg; i++) {
        const k3_trace *tr = p->segs[i].trace;
        int n = p->b->seg_first[i + 1] - p->b->seg_first[i];
        if (tr && tr->on_layer && tr->on_layer(tr->user, p->segs[i].s->pos, n, l, L))
            return k3_fail(err, K3_ERR_INTERRUPTED, "stopped after layer %d of %d of a pass of "
                           "%d ids", l + 1, L, n);
    }
    return K3_OK;
}

/* The pass: segs[0, nseg) through the whole model, rows in b (b->cap >= their ids). */
static int forward_pass(pass *p, float *logits, k3_err *err) {
    const k3_model *m = p->m;
    const k3_config *c = &m->cfg;
    k3_batch *b = p->b;
    int hd = c->hidden_size, rc, n = 0;
    for (int i = 0; i < p->nseg; i++) {
        const k3_batch_seg *g = &p->segs[i];
        if (g->n < 1) return k3_fail(err, K3_ERR_INPUT, "a pass needs at least one token");
        if (g->s->pos + g->n > g->s->max_ctx)
            return k3_fail(err, K3_ERR_INPUT, "the context is full (%d positions)",
                           g->s->max_ctx);
        if (n + g->n > b->cap)
            return k3_fail(err, K3_ERR_INPUT, "the pass holds %d rows, not more", b->cap);
        b->seg_first[i] = n;
        for (int t = 0; t < g->n; t++)
            b->row_seg[n + t] = i, b->row_pos[n + t] = g->s->pos + t;
        n += g->n;
    }
    b->seg_first[p->nseg] = n;
    p->n = n;
    p->acct = p->segs[0].s;
    k3_state *acct = p->acct;
    double t_start = k3_now_s();
    acct->tok = (k3_phase_times){.tokens = n};
    memset(acct->layer_eload_s, 0, (size_t)c->num_hidden_layers * sizeof *acct->layer_eload_s);
    memset(acct->layer_expert_s, 0, (size_t)c->num_hidden_layers * sizeof *acct->layer_expert_s);
    p->n_blocks = 0;
    for (int t = 0; t < n; t++) { /* the embedding is the first h_in; it becomes block 0 */
        const k3_batch_seg *g = &p->segs[b->row_seg[t]];
        int32_t id = g->tokens[t - b->seg_first[b->row_seg[t]]];
        if ((rc = k3_spine_embed(m, id, b->P + (size_t)t * hd, err))) return rc;
    }
    p->stoppable = pass_stoppable(p);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if ((rc = layer_batch(p, l, err))) return rc;
        if ((rc = layer_done(p, l, err))) {
            undo_restore(p, l);
            return rc;
        }
    }
    if ((rc = final_batch(p, logits, err))) return rc;
    double t_end = k3_now_s();
    acct->tok.total_s = t_end - t_start;
    for (int i = 0; i < p->nseg; i++) { /* each session: its positions, and the pass's times */
        const k3_batch_seg *g = &p->segs[i];
        k3_state *s = g->s;
        int pos = s->pos;
        if (s != acct) {
            s->tok = acct->tok;
            memcpy(s->layer_eload_s, acct->layer_eload_s,
                   (size_t)c->num_hidden_layers * sizeof *s->layer_eload_s);
            memcpy(s->layer_expert_s, acct->layer_expert_s,
                   (size_t)c->num_hidden_layers * sizeof *s->layer_expert_s);
        }
        s->tok.tokens = g->n;
        s->n_blocks = p->n_blocks;
        s->pos += g->n;
        if (g->flags & K3_BATCH_REWINDABLE) s->batch->rw.pass_pos = pos, s->batch->rw.pass_n = g->n;
        else if (s->batch) s->batch->rw.pass_n = 0; /* nothing of it is rewindable */
        k3_state_sum_times(s);
        for (int t = 0; g->trace && g->trace->on_step && t < g->n; t++)
            g->trace->on_step(g->trace->user, pos + t);
    }
    return K3_OK;
}

int k3_forward_batch(const k3_model *m, k3_state *s, const int32_t *tokens, int n, float *logits,
                     int flags, const k3_trace *tr, k3_err *err) {
    bool keep = flags & K3_BATCH_REWINDABLE;
    if (n < 1) return k3_fail(err, K3_ERR_INPUT, "a pass needs at least one token");
    if (s->pos + n > s->max_ctx)
        return k3_fail(err, K3_ERR_INPUT, "the context is full (%d positions)", s->max_ctx);
    int rc = reserve(m, s, n, keep, err);
    if (rc) return rc;
    k3_batch_seg seg = {.s = s, .tokens = tokens, .n = n, .trace = tr,
                        .flags = (!logits ? K3_BATCH_NO_LOGITS : flags & K3_BATCH_ALL_LOGITS) |
                                 (flags & K3_BATCH_REWINDABLE)};
    k3_spine_pass sp = {.want_head = logits != NULL};
    pass p = {.m = m, .b = s->batch, .segs = &seg, .nseg = 1, .keep = keep,
              .client = s->store, .sp = &sp};
    rc = forward_pass(&p, logits, err);
    k3_spine_end(m, &sp);
    return rc;
}

int k3_forward_multi(const k3_model *m, k3_batch *b, k3_store_client *client,
                     const k3_batch_seg *segs, int nseg, float *logits, k3_err *err) {
    if (nseg < 1 || nseg > b->cap)
        return k3_fail(err, K3_ERR_INPUT, "a pass takes 1 to %d segments, not %d", b->cap, nseg);
    bool want = false, keep = false;
    int rc = K3_OK;
    for (int i = 0; i < nseg && !rc; i++) {
        want |= !(segs[i].flags & K3_BATCH_NO_LOGITS);
        keep |= (segs[i].flags & K3_BATCH_REWINDABLE) != 0;
        if (segs[i].flags & K3_BATCH_REWINDABLE) /* its session's rewind buffers */
            rc = reserve(m, segs[i].s, segs[i].n, true, err);
    }
    if (rc) return rc;
    k3_spine_pass sp = {.want_head = want && logits != NULL};
    pass p = {.m = m, .b = b, .segs = segs, .nseg = nseg, .keep = keep, .client = client,
              .sp = &sp};
    rc = forward_pass(&p, logits, err);
    k3_spine_end(m, &sp);
    return rc;
}

/* ==== rewind ============================================================================== */

int k3_state_rewind(const k3_model *m, k3_state *s, int pos, k3_err *err) {
    const k3_config *c = &m->cfg;
    k3_batch *b = s->batch;
    k3_rewind *r = b ? &b->rw : NULL;
    if (pos == s->pos) return K3_OK;
    if (!r || r->pass_n == 0 || pos < r->pass_pos || pos > s->pos || s->pos != r->pass_pos + r->pass_n)
        return k3_fail(err, K3_ERR_INPUT, "cannot rewind to position %d: only positions inside "
                       "the last rewindable pass can be restored", pos);
    int a = pos - r->pass_pos, H = c->kda_num_heads, D = c->kda_head_dim;
    size_t P = (size_t)H * D, rcap = (size_t)r->cap;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const k3_layer *L = &m->layers[l];
        if (L->is_mla) continue; /* the latent rows >= pos are simply not read again */
        size_t slot = (size_t)L->state_slot;
        float *S0 = s->kda_S + s->kda_S_floats * slot;
        memcpy(S0, r->S + slot * s->kda_S_floats, s->kda_S_floats * sizeof(float));
        memcpy(s->kda_conv + s->kda_conv_floats * slot, r->conv + slot * s->kda_conv_floats,
               s->kda_conv_floats * sizeof(float));
        float *raw = r->raw + slot * 3 * rcap * P;
        for (int t = 0; t < a; t++) /* the windows advance as in the pass (outputs unused) */
            k3_kda_conv(m, L, s, raw + t * P, raw + (rcap + t) * P, raw + (2 * rcap + t) * P);
#pragma omp parallel for schedule(static) if (P >= 4096)
        for (int h = 0; h < H; h++) {
            float u[1024], o[1024]; /* head_dim <= 1024, checked at load */
            for (int t = 0; t < a; t++) {
                size_t at = (slot * rcap + t) * P + (size_t)h * D;
                /* S's update does not read q; k stands in for it (o is discarded) */
                k3_kda_delta_rule(m->kr, S0 + (size_t)h * D * D, r->k + at, r->k + at, r->v + at,
                                  r->alpha + at, r->beta[(slot * rcap + t) * H + h], D, u, o);
            }
        }
    }
    s->pos = pos;
    r->pass_n = 0; /* the rewound pass is over */
    return K3_OK;
}
