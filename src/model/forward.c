/* forward.c — one token through K3 (spec §3): AttnRes around every mixer and FFN, the block
 * bookkeeping, the final mix, norm and lm_head. Read top to bottom next to spec §3. */
#include <string.h>
#include <time.h>

#include "layers.h"
#include "spine.h"
#include "../util/clock.h"

static void trace_vec(const k3_trace *tr, int pos, int layer, enum k3_trace_point pt,
                      const float *x, int n) {
    if (tr && tr->on_vector) tr->on_vector(tr->user, pos, layer, pt, x, n);
}

/* AR(R ++ [last]) with the layer's folded score weights. */
static void mix(const k3_state *s, const float *last, const float *sw, const k3_config *c,
                float *out) {
    const float *vals[K3_MAX_RES_VALUES];
    int n = 0;
    for (int j = 0; j < s->n_blocks; j++) vals[n++] = s->blocks + (size_t)j * c->hidden_size;
    vals[n++] = last;
    k3_attn_res(vals, n, sw, c->hidden_size, c->rms_norm_eps, out);
}

static int forward(const k3_model *m, k3_state *s, int32_t token, float *logits,
                   const k3_trace *tr, k3_spine_pass *sp, k3_err *err) {
    const k3_config *c = &m->cfg;
    int hd = c->hidden_size, pos = s->pos;
    size_t vec = (size_t)hd * sizeof(float);
    float *P = s->partial, *x = s->x, *xn = s->xn, *a = s->mix, *f = s->ffn_out;
    double t_start = k3_now_s(), t0;
    s->tok = (k3_phase_times){.tokens = 1};
    memset(s->layer_eload_s, 0, (size_t)c->num_hidden_layers * sizeof *s->layer_eload_s);
    memset(s->layer_expert_s, 0, (size_t)c->num_hidden_layers * sizeof *s->layer_expert_s);
    s->n_blocks = 0;
    int rc = k3_spine_embed(m, token, P, err); /* the first h_in; it becomes block 0 */
    if (rc) return rc;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const k3_layer *L;
        if ((rc = k3_spine_layer(m, sp, l, K3_SPINE_MIXER, &L, err))) return rc; /* or streamed */
        if (s->n_blocks > 0)
            mix(s, P, L->attn_res_sw, c, x);
        else
            memcpy(x, P, vec);
        trace_vec(tr, pos, l, K3_TRACE_ATTN_IN, x, hd);
        bool fresh_block = l % c->attn_res_block_size == 0;
        if (fresh_block) memcpy(s->blocks + (size_t)s->n_blocks++ * hd, P, vec);

        k3_rmsnorm(x, &L->input_layernorm, hd, c->rms_norm_eps, xn);
        t0 = k3_now_s();
        if (L->is_mla)
            k3_mla_forward(m, L, s, xn, a);
        else
            k3_kda_forward(m, L, s, xn, a);
        s->tok.attn_s += k3_now_s() - t0;
        trace_vec(tr, pos, l, K3_TRACE_ATTN_OUT, a, hd);
        if (fresh_block)
            memcpy(P, a, vec); /* first contribution after a reset is a copy, not 0 + a */
        else
            for (int i = 0; i < hd; i++) P[i] = P[i] + a[i];

        if ((rc = k3_spine_layer(m, sp, l, K3_SPINE_FFN, &L, err))) return rc;
        mix(s, P, L->mlp_res_sw, c, x);
        trace_vec(tr, pos, l, K3_TRACE_MLP_IN, x, hd);
        k3_rmsnorm(x, &L->post_attention_layernorm, hd, c->rms_norm_eps, xn);
        if (L->is_moe) {
            t0 = k3_now_s();
            rc = k3_moe_forward(m, L, s, xn, f, err);
            s->tok.moe_s += k3_now_s() - t0;
            if (rc) return rc; /* no token from a layer with a missing expert */
            if (tr && tr->on_routing)
                tr->on_routing(tr->user, pos, l, s->topk, s->topk_w, c->num_experts_per_token);
        } else {
            k3_dense_forward(m, L, s, xn, f);
        }
        trace_vec(tr, pos, l, K3_TRACE_MLP_OUT, f, hd);
        for (int i = 0; i < hd; i++) P[i] = P[i] + f[i];
        trace_vec(tr, pos, l, K3_TRACE_PARTIAL_SUM, P, hd);
    }
    mix(s, P, m->out_res_sw, c, x);
    trace_vec(tr, pos, -1, K3_TRACE_FINAL_HIDDEN, x, hd);
    k3_rmsnorm(x, &m->norm, hd, c->rms_norm_eps, xn);
    trace_vec(tr, pos, -1, K3_TRACE_FINAL_NORMED, xn, hd);
    t0 = k3_now_s();
    const k3_mat *head = &m->lm_head;
    if (logits && (rc = k3_spine_head(m, sp, &head, err))) return rc;
    if (logits) k3_matvec(m->kr, head, xn, logits);
    s->pos++;
    double t_end = k3_now_s();
    s->tok.head_s = t_end - t0;
    s->tok.total_s = t_end - t_start;
    k3_state_sum_times(s);
    if (tr && tr->on_step) tr->on_step(tr->user, pos);
    return K3_OK;
}

int k3_forward(const k3_model *m, k3_state *s, int32_t token, float *logits,
               const k3_trace *tr, k3_err *err) {
    k3_spine_pass sp = {.want_head = logits != NULL};
    int rc = forward(m, s, token, logits, tr, &sp, err);
    k3_spine_end(m, &sp);
    return rc;
}
