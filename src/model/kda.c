/* kda.c — Kimi Delta Attention, one token (spec §6); the per-token pieces are shared with the
 * batched pass (forward_batch.c). */
#include <math.h>

#include "layers.h"

/* Depthwise causal conv + SiLU for one of q/k/v (spec §6.2): x[P] in place; hist holds the
 * last conv-1 raw inputs per channel, oldest first. */
static void short_conv(float *x, const k3_mat *taps, float *hist, int64_t P, int conv) {
    const float *w = taps->data;
    int nh = conv - 1;
    for (int64_t c = 0; c < P; c++) {
        float *h = hist + c * nh;
        const float *wc = w + c * conv;
        float y = 0;
        for (int i = 0; i < nh; i++) y += wc[i] * h[i];
        y += wc[nh] * x[c];
        for (int i = 0; i + 1 < nh; i++) h[i] = h[i + 1];
        if (nh > 0) h[nh - 1] = x[c];
        x[c] = k3_silu(y);
    }
}

/* x / sqrt(Σx² + 1e-6) per head (fla's in-kernel L2 norm, spec §6.3), then × scale. */
static void l2norm_head(float *x, int d, float scale) {
    float ss = 0;
    for (int i = 0; i < d; i++) ss += x[i] * x[i];
    float n = sqrtf(ss + 1e-6f);
    for (int i = 0; i < d; i++) x[i] = x[i] / n;
    if (scale != 1.0f)
        for (int i = 0; i < d; i++) x[i] = x[i] * scale;
}

void k3_kda_conv(const k3_model *m, const k3_layer *L, k3_state *s, float *q, float *k,
                 float *v) {
    const k3_config *c = &m->cfg;
    int conv = c->kda_conv_size;
    int64_t P = (int64_t)c->kda_num_heads * c->kda_head_dim;
    float *hist = s->kda_conv + s->kda_conv_floats * (size_t)L->state_slot;
    size_t per = (size_t)P * (size_t)(conv - 1);
    short_conv(q, &L->kda.q_conv, hist, P, conv);
    short_conv(k, &L->kda.k_conv, hist + per, P, conv);
    short_conv(v, &L->kda.v_conv, hist + 2 * per, P, conv);
}

void k3_kda_head(const k3_model *m, const k3_layer *L, float *S, int h, float *q, float *k,
                 const float *v, const float *f, float beta_raw, const float *g, float *o,
                 float *alpha, float *beta_out) {
    const k3_config *c = &m->cfg;
    const k3_kda_weights *w = &L->kda;
    int D = c->kda_head_dim;
    float u[1024]; /* head_dim <= 1024, checked at load */
    const float q_scale = (float)(1.0 / sqrt((double)D));
    const float *A_log = w->A_log.data, *dt_bias = w->dt_bias.data, *o_norm = w->o_norm.data;
    l2norm_head(q, D, q_scale);
    l2norm_head(k, D, 1.0f);
    for (int d = 0; d < D; d++) /* A_log per head (spec §6.4, §14.1) */
        alpha[d] = k3_kda_gate(f[d], dt_bias[h * D + d], A_log[h], c->kda_gate_lower_bound);
    float beta = k3_sigmoid(beta_raw);
    if (beta_out) *beta_out = beta;
    /* delta rule (spec §6.6), vectorised over the value index; exact on every path */
    k3_kda_delta_rule(m->kr, S, q, k, v, alpha, beta, D, u, o);
    /* gated per-head RMSNorm: normalise, weight, gate (spec §6.7) */
    float ss = 0;
    for (int d = 0; d < D; d++) ss += o[d] * o[d];
    float r = 1.0f / sqrtf(ss / (float)D + c->rms_norm_eps);
    for (int d = 0; d < D; d++) {
        float y = o_norm[d] * (o[d] * r);
        o[d] = y * k3_sigmoid(g[d]);
    }
}

void k3_kda_forward(const k3_model *m, const k3_layer *L, k3_state *s, const float *x,
                    float *out) {
    const k3_config *c = &m->cfg;
    const k3_kda_weights *w = &L->kda;
    int H = c->kda_num_heads, D = c->kda_head_dim;
    int64_t P = (int64_t)H * D;
    k3_matvec(m->kr, &w->q_proj, x, s->q);
    k3_matvec(m->kr, &w->k_proj, x, s->k);
    k3_matvec(m->kr, &w->v_proj, x, s->v);
    k3_matvec(m->kr, &w->f_a_proj, x, s->fa);
    k3_matvec(m->kr, &w->f_b_proj, s->fa, s->f);
    k3_matvec(m->kr, &w->b_proj, x, s->beta);
    k3_matvec(m->kr, &w->g_proj, x, s->g);
    k3_kda_conv(m, L, s, s->q, s->k, s->v);

    float *S0 = s->kda_S + s->kda_S_floats * (size_t)L->state_slot;
#pragma omp parallel for schedule(static) if (P >= 4096)
    for (int h = 0; h < H; h++) {
        float alpha[1024];
        k3_kda_head(m, L, S0 + (size_t)h * D * D, h, s->q + h * D, s->k + h * D, s->v + h * D,
                    s->f + h * D, s->beta[h], s->g + h * D, s->o + h * D, alpha, NULL);
    }
    k3_matvec(m->kr, &w->o_proj, s->o, out);
}
