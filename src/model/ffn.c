/* ffn.c — the dense SiTU MLP of the first layers and the Stable LatentMoE (spec §8). */
#include <math.h>

#include "layers.h"

void k3_dense_forward(const k3_model *m, const k3_layer *L, k3_state *s, const float *x,
                      float *out) {
    const k3_config *c = &m->cfg;
    k3_matvec(m->kr, &L->dense.gate_proj, x, s->gate);
    k3_matvec(m->kr, &L->dense.up_proj, x, s->up);
    k3_situ_vec(s->gate, s->up, c->intermediate_size, c->situ_beta, c->situ_linear_beta, s->gate);
    k3_matvec(m->kr, &L->dense.down_proj, s->gate, out);
}

/* Router (spec §8.3 steps 1-5): picks s->topk in canonical order (descending biased score,
 * ties to the lower id) and sets s->topk_w to the renormalised UNBIASED scores. */
static void route(const k3_model *m, const k3_moe_weights *w, k3_state *s, const float *x) {
    const k3_config *c = &m->cfg;
    int E = c->num_experts, K = c->num_experts_per_token;
    const float *bias = w->router_bias.data;
    k3_matvec(m->kr, &w->router, x, s->router);
    for (int e = 0; e < E; e++) {
        s->router[e] = k3_sigmoid(s->router[e]);
        s->biased[e] = s->router[e] + bias[e];
    }
    for (int j = 0; j < K; j++) {
        int best = 0;
        for (int e = 1; e < E; e++)
            if (s->biased[e] > s->biased[best]) best = e;
        s->topk[j] = best;
        s->biased[best] = -INFINITY; /* taken */
    }
    float sum = 0;
    for (int j = 0; j < K; j++) sum += s->router[s->topk[j]];
    sum = sum + 1e-20f;
    for (int j = 0; j < K; j++)
        s->topk_w[j] = s->router[s->topk[j]] / sum * c->routed_scaling_factor;
}

/* E(z) = W2 · SiTU(W1 z, W3 z) for one MXFP4 expert in the latent space. */
static void expert_forward(const k3_model *m, const k3_expert *ex, k3_state *s, const float *z,
                           float *out) {
    const k3_config *c = &m->cfg;
    k3_matvec_mxfp4(m->kr, &ex->w1, z, s->gate);
    k3_matvec_mxfp4(m->kr, &ex->w3, z, s->up);
    k3_situ_vec(s->gate, s->up, c->moe_intermediate_size, c->situ_beta, c->situ_linear_beta,
                s->gate);
    k3_matvec_mxfp4(m->kr, &ex->w2, s->gate, out);
}

void k3_moe_forward(const k3_model *m, const k3_layer *L, k3_state *s, const float *x,
                    float *out) {
    const k3_config *c = &m->cfg;
    const k3_moe_weights *w = &L->moe;
    int K = c->num_experts_per_token, lat = c->routed_expert_hidden_size, hd = c->hidden_size;
    route(m, w, s, x);
    k3_matvec(m->kr, &w->down_proj, x, s->lat);
    for (int i = 0; i < lat; i++) s->lat_acc[i] = 0;
    for (int j = 0; j < K; j++) { /* weighted sum in slot order */
        expert_forward(m, &w->experts[s->topk[j]], s, s->lat, s->exp_out);
        for (int i = 0; i < lat; i++) s->lat_acc[i] += s->exp_out[i] * s->topk_w[j];
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
}
