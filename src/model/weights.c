/* weights.c — binds checkpoint tensors to layers (spec §10.3), checking every shape against
 * the config so that a wrong snapshot fails at load, never mid-generation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

typedef struct binder {
    const k3_checkpoint *ck;
    k3_err *err;
    int layer; /* -1 for model-level tensors */
    int rc;
    uint64_t *bytes; /* accumulates into spine or expert bytes */
    const k3_pack *pack; /* int8 spine (issue 8), or NULL: BF16 as stored */
    int *n_packed;       /* matrices bound to their int8 copy */
    int i8_dtype;        /* K3_DT_I8, or K3_DT_I8_Q8 with int8 activations (--approx) */
} binder;

static const k3_tensor *get(binder *b, const char *suffix, int dtype, int ndim, int64_t d0,
                            int64_t d1, int64_t d2) {
    if (b->rc) return NULL;
    char name[256];
    if (b->layer >= 0)
        snprintf(name, sizeof name, "language_model.model.layers.%d.%s", b->layer, suffix);
    else
        snprintf(name, sizeof name, "language_model.%s", suffix);
    int64_t shape[3] = {d0, d1, d2};
    const k3_tensor *t = NULL;
    b->rc = k3_checkpoint_get(b->ck, name, dtype, ndim, shape, &t, b->err);
    if (t) *b->bytes += t->nbytes;
    return t;
}

/* With a packed spine, a matrix the pack holds is bound to its packed copy instead (the pack
 * was checked against this checkpoint at load, so shapes agree): int8 with its scales, or
 * lossless with its escape index and table. The spine's bytes count the packed sizes. */
static void use_packed(binder *b, const k3_tensor *t, k3_mat *m) {
    const k3_pack_entry *e = b->pack ? k3_pack_find(b->pack, t->name) : NULL;
    if (!e) return;
    uint64_t q_bytes, second_bytes;
    k3_pack_parts(b->pack->scheme, e, &q_bytes, &second_bytes);
    m->data = b->pack->map + e->q_offset;
    if (b->pack->scheme == K3_PACK_SCHEME_BF16LX) {
        m->dtype = K3_DT_BF16LX;
        m->esc = (const uint32_t *)(b->pack->map + e->scale_offset);
        m->n_esc = e->n_esc;
        memcpy(m->xtab, e->xtab, sizeof m->xtab);
    } else {
        m->dtype = b->i8_dtype;
        m->scale = (const float *)(b->pack->map + e->scale_offset);
    }
    *b->bytes = *b->bytes - t->nbytes + q_bytes + second_bytes;
    (*b->n_packed)++;
}

/* A BF16 (or F32) matrix [rows, cols]; vectors pass cols = 0 and get rows = 1. */
static k3_mat mat(binder *b, const char *suffix, int dtype, int64_t rows, int64_t cols) {
    k3_mat m = {0};
    const k3_tensor *t = cols ? get(b, suffix, dtype, 2, rows, cols, 0)
                              : get(b, suffix, dtype, 1, rows, 0, 0);
    if (!t) return m;
    m.data = t->data;
    m.dtype = t->dtype;
    m.rows = cols ? t->shape[0] : 1;
    m.cols = cols ? t->shape[1] : t->shape[0];
    if (cols) use_packed(b, t, &m);
    return m;
}

static k3_mat conv_taps(binder *b, const char *suffix, int64_t p, int64_t k) {
    k3_mat m = {0};
    const k3_tensor *t = get(b, suffix, K3_DT_F32, 3, p, 1, k);
    if (t) m = (k3_mat){.data = t->data, .dtype = t->dtype, .rows = p, .cols = k};
    return m;
}

/* s_w = f32(w_norm) ⊙ f32(w_proj), folded once (spec §5 step 1). */
static float *fold_res(binder *b, const char *norm, const char *proj, int64_t hidden) {
    k3_mat n = mat(b, norm, K3_DT_BF16, hidden, 0), p = mat(b, proj, K3_DT_BF16, 1, hidden);
    if (b->rc) return NULL;
    float *sw = malloc((size_t)hidden * sizeof *sw);
    if (!sw) {
        b->rc = k3_fail(b->err, K3_ERR_GENERIC, "out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < hidden; i++) sw[i] = k3_mat_at(&n, i) * k3_mat_at(&p, i);
    return sw;
}

static void bind_kda(binder *b, const k3_config *c, k3_kda_weights *w, int64_t rank) {
    int64_t hd = c->hidden_size, p = (int64_t)c->kda_num_heads * c->kda_head_dim;
    w->q_proj = mat(b, "self_attn.q_proj.weight", K3_DT_BF16, p, hd);
    w->k_proj = mat(b, "self_attn.k_proj.weight", K3_DT_BF16, p, hd);
    w->v_proj = mat(b, "self_attn.v_proj.weight", K3_DT_BF16, p, hd);
    w->g_proj = mat(b, "self_attn.g_proj.weight", K3_DT_BF16, p, hd);
    w->o_proj = mat(b, "self_attn.o_proj.weight", K3_DT_BF16, hd, p);
    w->f_a_proj = mat(b, "self_attn.f_a_proj.weight", K3_DT_BF16, rank, hd);
    w->f_b_proj = mat(b, "self_attn.f_b_proj.weight", K3_DT_BF16, p, rank);
    w->b_proj = mat(b, "self_attn.b_proj.weight", K3_DT_BF16, c->kda_num_heads, hd);
    w->q_conv = conv_taps(b, "self_attn.q_conv1d.weight", p, c->kda_conv_size);
    w->k_conv = conv_taps(b, "self_attn.k_conv1d.weight", p, c->kda_conv_size);
    w->v_conv = conv_taps(b, "self_attn.v_conv1d.weight", p, c->kda_conv_size);
    w->A_log = mat(b, "self_attn.A_log", K3_DT_F32, -1, 0);
    w->dt_bias = mat(b, "self_attn.dt_bias", K3_DT_F32, p, 0);
    w->o_norm = mat(b, "self_attn.o_norm.weight", K3_DT_F32, c->kda_head_dim, 0);
    if (!b->rc && w->A_log.cols < c->kda_num_heads)
        b->rc = k3_fail(b->err, K3_ERR_CHECKPOINT, "layer %d: self_attn.A_log has %lld entries, "
                        "fewer than the %d KDA heads", b->layer, (long long)w->A_log.cols,
                        c->kda_num_heads);
}

static void bind_mla(binder *b, const k3_config *c, k3_mla_weights *w) {
    int64_t hd = c->hidden_size, h = c->num_attention_heads;
    int64_t qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    w->q_a_proj = mat(b, "self_attn.q_a_proj.weight", K3_DT_BF16, c->q_lora_rank, hd);
    w->q_a_layernorm = mat(b, "self_attn.q_a_layernorm.weight", K3_DT_BF16, c->q_lora_rank, 0);
    w->q_b_proj = mat(b, "self_attn.q_b_proj.weight", K3_DT_BF16, h * qk, c->q_lora_rank);
    w->kv_a_proj = mat(b, "self_attn.kv_a_proj_with_mqa.weight", K3_DT_BF16,
                       c->kv_lora_rank + c->qk_rope_head_dim, hd);
    w->kv_a_layernorm = mat(b, "self_attn.kv_a_layernorm.weight", K3_DT_BF16, c->kv_lora_rank, 0);
    w->kv_b_proj = mat(b, "self_attn.kv_b_proj.weight", K3_DT_BF16,
                       h * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank);
    w->g_proj = mat(b, "self_attn.g_proj.weight", K3_DT_BF16, h * c->v_head_dim, hd);
    w->o_proj = mat(b, "self_attn.o_proj.weight", K3_DT_BF16, hd, h * c->v_head_dim);
}

/* The routed experts are mapped by the expert store (src/store/map.c), never bound here. */
static void bind_moe(binder *b, const k3_config *c, k3_moe_weights *w) {
    int64_t hd = c->hidden_size, lat = c->routed_expert_hidden_size;
    int64_t sh = (int64_t)c->moe_intermediate_size * c->num_shared_experts;
    w->router = mat(b, "block_sparse_moe.gate.weight", K3_DT_BF16, c->num_experts, hd);
    w->router_bias = mat(b, "block_sparse_moe.gate.e_score_correction_bias", K3_DT_F32,
                         c->num_experts, 0);
    w->down_proj = mat(b, "block_sparse_moe.routed_expert_down_proj.weight", K3_DT_BF16, lat, hd);
    w->up_proj = mat(b, "block_sparse_moe.routed_expert_up_proj.weight", K3_DT_BF16, hd, lat);
    w->norm = mat(b, "block_sparse_moe.routed_expert_norm.weight", K3_DT_BF16, lat, 0);
    w->shared_gate = mat(b, "block_sparse_moe.shared_experts.gate_proj.weight", K3_DT_BF16, sh, hd);
    w->shared_up = mat(b, "block_sparse_moe.shared_experts.up_proj.weight", K3_DT_BF16, sh, hd);
    w->shared_down = mat(b, "block_sparse_moe.shared_experts.down_proj.weight", K3_DT_BF16, hd, sh);
}

static int bind_layer(k3_model *m, const k3_checkpoint *ck, const k3_pack *pack, int i8_dtype,
                      int l, k3_err *err) {
    const k3_config *c = &m->cfg;
    k3_layer *L = &m->layers[l];
    binder b = {ck, err, l, 0, &m->spine_bytes, pack, &m->n_packed, i8_dtype};
    int64_t hd = c->hidden_size;
    L->is_mla = c->layer_is_mla[l];
    L->is_moe = c->layer_is_moe[l];
    L->index = l;
    L->state_slot = L->is_mla ? m->n_mla++ : m->n_kda++;
    L->input_layernorm = mat(&b, "input_layernorm.weight", K3_DT_BF16, hd, 0);
    L->post_attention_layernorm = mat(&b, "post_attention_layernorm.weight", K3_DT_BF16, hd, 0);
    L->attn_res_sw = fold_res(&b, "self_attention_res_norm.weight",
                              "self_attention_res_proj.weight", hd);
    L->mlp_res_sw = fold_res(&b, "mlp_res_norm.weight", "mlp_res_proj.weight", hd);
    if (L->is_mla)
        bind_mla(&b, c, &L->mla);
    else
        bind_kda(&b, c, &L->kda, m->kda_rank);
    if (L->is_moe) {
        bind_moe(&b, c, &L->moe);
    } else {
        int64_t in = c->intermediate_size;
        L->dense.gate_proj = mat(&b, "mlp.gate_proj.weight", K3_DT_BF16, in, hd);
        L->dense.up_proj = mat(&b, "mlp.up_proj.weight", K3_DT_BF16, in, hd);
        L->dense.down_proj = mat(&b, "mlp.down_proj.weight", K3_DT_BF16, hd, in);
    }
    return b.rc;
}

/* f_a_proj's rank is not in config.json; take it from the first KDA layer's tensor. */
static int kda_rank(const k3_config *c, const k3_checkpoint *ck, k3_err *err) {
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (c->layer_is_mla[l]) continue;
        char name[128];
        snprintf(name, sizeof name, "language_model.model.layers.%d.self_attn.f_a_proj.weight", l);
        const k3_tensor *t = k3_checkpoint_find(ck, name);
        if (!t || t->ndim != 2)
            return -k3_fail(err, K3_ERR_CHECKPOINT, "%s: tensor %s is missing or not 2-D", ck->dir,
                            name);
        return (int)t->shape[0];
    }
    return 0;
}

int k3_model_bind(k3_model *m, const k3_config *cfg, const k3_checkpoint *ck, k3_err *err) {
    return k3_model_bind_packed(m, cfg, ck, NULL, false, err);
}

int k3_model_bind_packed(k3_model *m, const k3_config *cfg, const k3_checkpoint *ck,
                         const k3_pack *pack, bool q8_act, k3_err *err) {
    int i8_dtype = q8_act ? K3_DT_I8_Q8 : K3_DT_I8;
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    int rank = kda_rank(cfg, ck, err);
    if (rank < 0) return -rank;
    m->kda_rank = rank;
    m->layers = calloc((size_t)cfg->num_hidden_layers, sizeof *m->layers);
    if (!m->layers) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    binder b = {ck, err, -1, 0, &m->spine_bytes, pack, &m->n_packed, i8_dtype};
    int64_t hd = cfg->hidden_size, v = cfg->vocab_size;
    m->embed = mat(&b, "model.embed_tokens.weight", K3_DT_BF16, v, hd);
    m->norm = mat(&b, "model.norm.weight", K3_DT_BF16, hd, 0);
    m->lm_head = mat(&b, "lm_head.weight", K3_DT_BF16, v, hd);
    m->out_res_sw = fold_res(&b, "model.output_attn_res_norm.weight",
                             "model.output_attn_res_proj.weight", hd);
    int rc = b.rc;
    for (int l = 0; l < cfg->num_hidden_layers && !rc; l++) rc = bind_layer(m, ck, pack, i8_dtype, l, err);
    if (rc) k3_model_free(m);
    return rc;
}

void k3_model_free(k3_model *m) {
    if (m->layers) {
        for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
            free(m->layers[l].attn_res_sw);
            free(m->layers[l].mlp_res_sw);
        }
    }
    free(m->layers);
    free(m->out_res_sw);
    memset(m, 0, sizeof *m);
}
