/* ffn.c — the dense SiTU MLP of the first layers and the Stable LatentMoE (spec §8). */
#include <float.h>
#include <math.h>
#include <time.h>

#include "layers.h"
#include "../util/clock.h"

void k3_dense_forward(const k3_model *m, const k3_layer *L, k3_state *s, const float *x,
                      float *out) {
    const k3_config *c = &m->cfg;
    k3_matvec(m->kr, &L->dense.gate_proj, x, s->gate);
    k3_matvec(m->kr, &L->dense.up_proj, x, s->up);
    k3_situ_vec(s->gate, s->up, c->intermediate_size, c->situ_beta, c->situ_linear_beta, s->gate);
    k3_matvec(m->kr, &L->dense.down_proj, s->gate, out);
}

void k3_moe_select(const k3_model *m, const k3_moe_weights *w, float *scores, float *biased,
                   int *ids, float *weights) {
    const k3_config *c = &m->cfg;
    int E = c->num_experts, K = c->num_experts_per_token;
    const float *bias = w->router_bias.data;
    for (int e = 0; e < E; e++) {
        scores[e] = k3_sigmoid(scores[e]);
        biased[e] = scores[e] + bias[e];
        /* NaN or -Inf (corrupt weights) ranks last but stays apart from the "taken" mark, so
         * the K ids are distinct (the store needs that); a NaN score still reaches the logits,
         * where the engine reports it (k3_session_step). */
        if (!(biased[e] > -FLT_MAX)) biased[e] = -FLT_MAX;
    }
    for (int j = 0; j < K; j++) {
        int best = 0;
        while (biased[best] == -INFINITY) best++; /* the first not taken (K < E) */
        for (int e = best + 1; e < E; e++)
            if (biased[e] > biased[best]) best = e;
        ids[j] = best;
        biased[best] = -INFINITY; /* taken */
    }
    float sum = 0;
    for (int j = 0; j < K; j++) sum += scores[ids[j]];
    sum = sum + 1e-20f;
    for (int j = 0; j < K; j++)
        weights[j] = scores[ids[j]] / sum * c->routed_scaling_factor;
}

/* Router (spec §8.3) on x: the gate's logits into scores, then k3_moe_select. */
static void route(const k3_model *m, const k3_moe_weights *w, const float *x, float *scores,
                  float *biased, int *ids, float *weights) {
    k3_matvec(m->kr, &w->router, x, scores);
    k3_moe_select(m, w, scores, biased, ids, weights);
}

/* E(z) = W2 · SiTU(W1 z, W3 z) for the n ready MXFP4 experts in the latent space, each into
 * its row of s->exp_outs. All n experts' W1 and W3 (they share z) run in one parallel region,
 * then all their W2: a MoE layer's experts are short products (6 MB each), so one fork/join
 * for all of them is what lets the threads stream long runs. Each product equals its own
 * k3_matvec_mxfp4 bit for bit, so how many were ready cannot change the result. */
static void experts_forward(const k3_model *m, k3_state *s, const float *z, int n) {
    const k3_config *c = &m->cfg;
    size_t inter = (size_t)c->moe_intermediate_size, lat = (size_t)c->routed_expert_hidden_size;
    k3_mxfp4 *w = s->mx_w;
    const float **xs = s->mx_x;
    float **ys = s->mx_y;
    for (int e = 0; e < n; e++) {
        w[2 * e] = s->ready[e].w1, w[2 * e + 1] = s->ready[e].w3;
        xs[2 * e] = xs[2 * e + 1] = z;
        ys[2 * e] = s->exp_gate + e * inter, ys[2 * e + 1] = s->exp_up + e * inter;
    }
    k3_matvec_mxfp4_many(m->kr, 2 * n, w, xs, ys);
    for (int e = 0; e < n; e++) {
        float *g = s->exp_gate + e * inter;
        k3_situ_vec(g, s->exp_up + e * inter, (int)inter, c->situ_beta, c->situ_linear_beta, g);
        w[e] = s->ready[e].w2;
        xs[e] = g;
        /* the expert's router slot: its index in topk, through own_at when this rank
         * asked the store for its own experts only */
        int j = m->ranks ? s->own_at[s->ready_j[e]] : s->ready_j[e];
        ys[e] = s->exp_outs + (size_t)j * lat;
    }
    k3_matvec_mxfp4_many(m->kr, n, w, xs, ys);
}

/* K3_PIPE: while this layer computes, fetch what the next MoE layer will probably choose —
 * its router applied to this layer's input (lookahead), and its choice for the previous
 * token. The store also scores both guesses when the next layer routes (recall). Next to an
 * MLA layer the store reads only the previous token's choice (k3_store_layer_pipe), so the
 * lookahead is not routed there. */
void k3_moe_prefetch_next(const k3_model *m, int layer, k3_state *s, const float *x) {
    const k3_config *c = &m->cfg;
    int next = layer + 1, K = c->num_experts_per_token;
    if (next >= c->num_hidden_layers || !m->layers[next].is_moe) return;
    if (k3_store_layer_pipe(m->store, next) & K3_PIPE_LOOKAHEAD) {
        route(m, &m->layers[next].moe, x, s->la_router, s->la_biased, s->la_topk, s->la_topk_w);
        int n = k3_moe_owned(m, next, s->la_topk, K, s->own_pf, NULL);
        k3_store_prefetch(s->store, next, s->own_pf, n, K3_PIPE_LOOKAHEAD);
    }
    const int *prev = k3_store_prev_choice(s->store, next);
    if (prev) {
        int n = k3_moe_owned(m, next, prev, K, s->own_pf, NULL);
        k3_store_prefetch(s->store, next, s->own_pf, n, K3_PIPE_PREV);
    }
}

int k3_moe_owned(const k3_model *m, int layer, const int *ids, int k, int *own, int *at) {
    const k3_expert_ranks *r = m->ranks;
    int n = 0;
    for (int j = 0; j < k; j++) {
        if (r && k3_expert_owner(layer, ids[j], r->n_ranks) != r->rank) continue;
        if (at) at[n] = j;
        own[n++] = ids[j];
    }
    return n;
}

/* The routed experts of the layer, computed in groups as the store has them ready (all at
 * once when cached), each into its own row of s->exp_outs (so arrival order cannot change the
 * result). */
static int routed_experts(const k3_model *m, int layer, k3_state *s, int K, k3_err *err) {
    for (int done = 0; done < K;) {
        int n;
        double t0 = k3_now_s();
        int rc = k3_store_next_many(s->store, K - done, s->ready_j, s->ready, &n, err);
        double t1 = k3_now_s();
        s->tok.eload_s += t1 - t0;
        s->layer_eload_s[layer] += t1 - t0;
        if (rc) return rc;
        experts_forward(m, s, s->lat, n);
        for (int e = 0; e < n; e++) k3_store_done(s->store, s->ready_j[e]);
        done += n;
        double dt = k3_now_s() - t1;
        s->tok.expert_s += dt;
        s->layer_expert_s[layer] += dt;
    }
    return K3_OK;
}

int k3_moe_forward(const k3_model *m, const k3_layer *L, k3_state *s, const float *x,
                   float *out, k3_err *err) {
    const k3_config *c = &m->cfg;
    const k3_moe_weights *w = &L->moe;
    int K = c->num_experts_per_token, lat = c->routed_expert_hidden_size, hd = c->hidden_size;
    int layer = L->index;
    double t0 = k3_now_s();
    route(m, w, x, s->router, s->biased, s->topk, s->topk_w);
    int own = K;
    if (m->ranks) { /* this rank's experts only; every rank remembers the whole choice */
        own = k3_moe_owned(m, layer, s->topk, K, s->own_ids, s->own_at);
        k3_store_begin(s->store, layer, s->own_ids, own);
        k3_store_set_choice(s->store, layer, s->topk, K);
    } else {
        k3_store_begin(s->store, layer, s->topk, K); /* misses start reading now */
    }
    k3_moe_prefetch_next(m, layer, s, x);
    s->tok.router_s += k3_now_s() - t0;
    k3_matvec(m->kr, &w->down_proj, x, s->lat);
    int rc = routed_experts(m, layer, s, own, err);
    k3_store_end(s->store);
    if (m->ranks) /* also after a failure: the peers learn it instead of waiting */
        rc = m->ranks->exchange(m->ranks->user, layer, s->topk, 1, K, s->exp_outs, lat, rc, err);
    if (rc) return rc;
    for (int i = 0; i < lat; i++) s->lat_acc[i] = 0;
    for (int j = 0; j < K; j++) { /* weighted sum in slot order */
        const float *e_out = s->exp_outs + (size_t)j * lat;
        for (int i = 0; i < lat; i++) s->lat_acc[i] += e_out[i] * s->topk_w[j];
    }
    k3_rmsnorm(s->lat_acc, &w->norm, lat, c->rms_norm_eps, s->lat_acc); /* on the sum */
    k3_matvec(m->kr, &w->up_proj, s->lat_acc, out);
    /* Shared experts on the full-width input; routed term first in the final add. */
    int sh = c->moe_intermediate_size * c->num_shared_experts;
    k3_matvec(m->kr, &w->shared_gate, x, s->gate);
    k3_matvec(m->kr, &w->shared_up, x, s->up);
    k3_situ_vec(s->gate, s->up, sh, c->situ_beta, c->situ_linear_beta, s->gate);
    k3_matvec(m->kr, &w->shared_down, s->gate, s->ffn_tmp);
    for (int i = 0; i < hd; i++) out[i] = out[i] + s->ffn_tmp[i];
    return K3_OK;
}
