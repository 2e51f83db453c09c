/* mla.c — gated multi-head latent attention without positional encoding (spec §7). */
#include <math.h>

#include "layers.h"

/* The MLA LoRA norms are built without eps in the official code: KimiRMSNorm's 1e-6 (§4). */
#define MLA_LORA_EPS K3_MLA_LORA_EPS

void k3_mla_append(const k3_model *m, const k3_layer *L, k3_state *s, int t, const float *KV,
                   const float *ckv) {
    const k3_config *c = &m->cfg;
    int H = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int vd = c->v_head_dim, lora = c->kv_lora_rank;
    /* k_nope [H][nope], k_pe [rope] (shared, unrotated), v [H][vd]. */
    float *e = s->kv + ((size_t)L->state_slot * s->max_ctx + (size_t)t) * s->kv_floats;
    for (int h = 0; h < H; h++)
        for (int d = 0; d < nope; d++) e[h * nope + d] = KV[h * (nope + vd) + d];
    float *kpe = e + (size_t)H * nope, *vals = kpe + rope;
    for (int d = 0; d < rope; d++) kpe[d] = ckv[lora + d];
    for (int h = 0; h < H; h++)
        for (int d = 0; d < vd; d++) vals[h * vd + d] = KV[h * (nope + vd) + nope + d];
}

void k3_mla_attend(const k3_model *m, const k3_layer *L, k3_state *s, int t, const float *Q,
                   float *out_o) {
    const k3_config *c = &m->cfg;
    int H = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int vd = c->v_head_dim, qk = nope + rope;
    const float *layer_kv = s->kv + (size_t)L->state_slot * s->max_ctx * s->kv_floats;
    const float scale = (float)(1.0 / sqrt((double)qk));
#pragma omp parallel for schedule(static) if ((int64_t)H * (t + 1) * qk >= 65536)
    for (int h = 0; h < H; h++) {
        const float *q = Q + (size_t)h * qk;
        float mx = -INFINITY, sum = 0;
        float *sc = s->scores + (size_t)h * (size_t)s->max_ctx;
        for (int j = 0; j <= t; j++) {
            const float *ej = layer_kv + (size_t)j * s->kv_floats;
            const float *kn = ej + (size_t)h * nope, *kp = ej + (size_t)H * nope;
            float dot = k3_dot(m->kr, q, kn, nope) + k3_dot(m->kr, q + nope, kp, rope);
            sc[j] = dot * scale;
            mx = sc[j] > mx ? sc[j] : mx;
        }
        for (int j = 0; j <= t; j++) sum += (sc[j] = expf(sc[j] - mx));
        for (int j = 0; j <= t; j++) sc[j] = sc[j] / sum;
        float *o = out_o + (size_t)h * vd;
        for (int d = 0; d < vd; d++) o[d] = 0;
        for (int j = 0; j <= t; j++) /* o += p_j · v_j, exact on every path */
            k3_axpy(m->kr, sc[j], layer_kv + (size_t)j * s->kv_floats + (size_t)H * nope + rope +
                    h * vd, o, vd);
    }
}

void k3_mla_forward(const k3_model *m, const k3_layer *L, k3_state *s, const float *x,
                    float *out) {
    const k3_config *c = &m->cfg;
    const k3_mla_weights *w = &L->mla;
    int H = c->num_attention_heads, vd = c->v_head_dim, lora = c->kv_lora_rank, t = s->pos;

    k3_matvec(m->kr, &w->q_a_proj, x, s->cq);
    k3_rmsnorm(s->cq, &w->q_a_layernorm, c->q_lora_rank, MLA_LORA_EPS, s->cq);
    k3_matvec(m->kr, &w->q_b_proj, s->cq, s->Q);
    k3_matvec(m->kr, &w->kv_a_proj, x, s->ckv);
    k3_rmsnorm(s->ckv, &w->kv_a_layernorm, lora, MLA_LORA_EPS, s->ckv); /* latent part only */
    k3_matvec(m->kr, &w->kv_b_proj, s->ckv, s->KV);
    k3_mla_append(m, L, s, t, s->KV, s->ckv); /* this position, then attend over 0..t */
    k3_mla_attend(m, L, s, t, s->Q, s->o);
    /* Output gate on the normed layer input, then o_proj (spec §7.4). */
    k3_matvec(m->kr, &w->g_proj, x, s->g);
    for (int i = 0; i < H * vd; i++) s->o[i] = s->o[i] * k3_sigmoid(s->g[i]);
    k3_matvec(m->kr, &w->o_proj, s->o, out);
}
