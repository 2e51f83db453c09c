/* state.c — allocation of the per-sequence state (see state.h for the layout). */
#include "state.h"
#include "batch.h"
#include "layers.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static size_t max3(size_t a, size_t b, size_t c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

/* Allocates every buffer; returns 0 when one allocation failed. */
static int alloc_all(k3_state *s, const k3_model *m) {
    const k3_config *c = &m->cfg;
    size_t hd = (size_t)c->hidden_size, P = (size_t)c->kda_num_heads * c->kda_head_dim;
    size_t H = (size_t)c->num_attention_heads, qk = (size_t)(c->qk_nope_head_dim + c->qk_rope_head_dim);
    size_t mla_o = H * (size_t)c->v_head_dim;
    size_t inter = max3((size_t)c->intermediate_size,
                        (size_t)c->moe_intermediate_size * c->num_shared_experts,
                        (size_t)c->moe_intermediate_size);
    size_t lat = (size_t)c->routed_expert_hidden_size;
    int ok = 1;
#define ALLOC(p, count) ok &= ((p) = calloc((size_t)(count) + 1, sizeof *(p))) != NULL
    ALLOC(s->kda_S, s->kda_S_floats * (size_t)m->n_kda);
    ALLOC(s->kda_conv, s->kda_conv_floats * (size_t)m->n_kda);
    ALLOC(s->blocks, (size_t)s->max_blocks * hd);
    ALLOC(s->partial, hd); ALLOC(s->x, hd); ALLOC(s->xn, hd);
    ALLOC(s->mix, hd); ALLOC(s->ffn_out, hd); ALLOC(s->logit_in, hd);
    ALLOC(s->q, P); ALLOC(s->k, P); ALLOC(s->v, P); ALLOC(s->g, P > mla_o ? P : mla_o);
    ALLOC(s->f, P); ALLOC(s->fa, (size_t)m->kda_rank); ALLOC(s->beta, (size_t)c->kda_num_heads);
    ALLOC(s->o, P > mla_o ? P : mla_o);
    ALLOC(s->cq, (size_t)c->q_lora_rank); ALLOC(s->Q, H * qk);
    ALLOC(s->ckv, (size_t)(c->kv_lora_rank + c->qk_rope_head_dim));
    ALLOC(s->gate, inter); ALLOC(s->up, inter);
    ALLOC(s->router, (size_t)c->num_experts); ALLOC(s->biased, (size_t)c->num_experts);
    ALLOC(s->ffn_tmp, hd);
    ALLOC(s->lat, lat); ALLOC(s->lat_acc, lat); ALLOC(s->exp_out, lat);
    ALLOC(s->exp_outs, lat * (size_t)c->num_experts_per_token);
    ALLOC(s->exp_gate, (size_t)c->moe_intermediate_size * c->num_experts_per_token);
    ALLOC(s->exp_up, (size_t)c->moe_intermediate_size * c->num_experts_per_token);
    ALLOC(s->ready, (size_t)c->num_experts_per_token);
    ALLOC(s->ready_j, (size_t)c->num_experts_per_token);
    ALLOC(s->mx_w, 2 * (size_t)c->num_experts_per_token);
    ALLOC(s->mx_x, 2 * (size_t)c->num_experts_per_token);
    ALLOC(s->mx_y, 2 * (size_t)c->num_experts_per_token);
    ALLOC(s->la_router, (size_t)c->num_experts); ALLOC(s->la_biased, (size_t)c->num_experts);
    ALLOC(s->la_topk, (size_t)c->num_experts_per_token);
    ALLOC(s->la_topk_w, (size_t)c->num_experts_per_token);
    ALLOC(s->own_ids, (size_t)c->num_experts_per_token);
    ALLOC(s->own_at, (size_t)c->num_experts_per_token);
    ALLOC(s->own_pf, (size_t)c->num_experts_per_token);
    ALLOC(s->layer_eload_s, (size_t)c->num_hidden_layers);
    ALLOC(s->layer_expert_s, (size_t)c->num_hidden_layers);
    ALLOC(s->topk, (size_t)c->num_experts_per_token);
    ALLOC(s->topk_w, (size_t)c->num_experts_per_token);
#undef ALLOC
    ok &= (s->mla_ws = k3_mla_ws_new(c, k3_mla_ws_rows(c, 1))) != NULL;
    return ok;
}

int k3_state_new(const k3_model *m, int max_ctx, k3_state **out, k3_err *err) {
    const k3_config *c = &m->cfg;
    if (max_ctx <= 0) max_ctx = c->max_position_embeddings < 4096 ? c->max_position_embeddings : 4096;
    if (max_ctx > c->max_position_embeddings)
        return k3_fail(err, K3_ERR_INPUT, "context %d exceeds max_position_embeddings %d",
                       max_ctx, c->max_position_embeddings);
    if (m->n_mla && (c->kv_lora_rank < 1 || c->kv_lora_rank > K3_MLA_MAX_LORA))
        return k3_fail(err, K3_ERR_CONFIG, "kv_lora_rank %d is outside 1..%d, the latent MLA "
                       "cache's range", c->kv_lora_rank, K3_MLA_MAX_LORA);
    k3_state *s = calloc(1, sizeof *s);
    if (!s) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    s->max_ctx = max_ctx;
    s->n_kda = m->n_kda;
    size_t P = (size_t)c->kda_num_heads * c->kda_head_dim;
    s->kda_S_floats = (size_t)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim;
    s->kda_conv_floats = 3 * P * (size_t)(c->kda_conv_size - 1);
    s->kv_floats = (size_t)c->kv_lora_rank + (size_t)c->qk_rope_head_dim; /* latent row */
    s->max_blocks = (c->num_hidden_layers + c->attn_res_block_size - 1) / c->attn_res_block_size + 1;
    s->kv_bytes = s->kv_floats * sizeof(float) * (size_t)max_ctx * (size_t)m->n_mla;
    if (s->kv_bytes) {
        s->kv = mmap(NULL, s->kv_bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (s->kv == MAP_FAILED) s->kv = NULL;
    }
    if (m->store && k3_store_client_new(m->store, &s->store, err)) {
        k3_state_free(s);
        return err ? err->code : K3_ERR_GENERIC;
    }
    if ((s->kv_bytes && !s->kv) || !alloc_all(s, m)) {
        k3_state_free(s);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory for the session state (context %d)",
                       max_ctx);
    }
    *out = s;
    return K3_OK;
}

void k3_state_reset(k3_state *s) {
    s->pos = 0;
    if (s->batch) s->batch->rw.pass_n = 0; /* nothing left to rewind */
    s->n_blocks = 0;
    /* KDA and conv state start at zero; KV cache entries are written before they are read. */
    memset(s->kda_S, 0, s->kda_S_floats * (size_t)s->n_kda * sizeof(float));
    memset(s->kda_conv, 0, s->kda_conv_floats * (size_t)s->n_kda * sizeof(float));
    if (s->store) k3_store_client_reset(s->store); /* the previous token is no predictor now */
}

void k3_state_free(k3_state *s) {
    if (!s) return;
    if (s->kv) munmap(s->kv, s->kv_bytes);
    float *bufs[] = {s->kda_S, s->kda_conv, s->blocks, s->partial, s->x, s->xn, s->mix,
                     s->ffn_out, s->logit_in, s->biased, s->ffn_tmp, s->q, s->k, s->v, s->g, s->f, s->fa, s->beta,
                     s->o, s->cq, s->Q, s->ckv, s->gate, s->up, s->router,
                     s->lat, s->lat_acc, s->exp_out, s->topk_w, s->exp_outs, s->la_router,
                     s->la_biased, s->la_topk_w, s->exp_gate, s->exp_up};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(s->topk);
    free(s->la_topk);
    free(s->own_ids);
    free(s->own_at);
    free(s->own_pf);
    free(s->ready);
    free(s->ready_j);
    free(s->mx_w);
    free(s->mx_x);
    free(s->mx_y);
    free(s->layer_eload_s);
    free(s->layer_expert_s);
    k3_store_client_free(s->store);
    k3_mla_ws_free(s->mla_ws);
    k3_batch_free(s->batch);
    free(s);
}

size_t k3_state_plan_bytes(const k3_model *m, int max_ctx) {
    const k3_config *c = &m->cfg;
    if (max_ctx <= 0) max_ctx = c->max_position_embeddings < 4096 ? c->max_position_embeddings : 4096;
    size_t P = (size_t)c->kda_num_heads * c->kda_head_dim;
    size_t kda = (size_t)m->n_kda * ((size_t)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim +
                                     3 * P * (size_t)(c->kda_conv_size - 1));
    size_t kv = (size_t)m->n_mla * (size_t)max_ctx *
                ((size_t)c->kv_lora_rank + (size_t)c->qk_rope_head_dim); /* latent rows */
    size_t scratch = 32 * (size_t)c->hidden_size + 16 * P + 4 * (size_t)c->num_experts +
                     2 * (size_t)c->intermediate_size +
                     (size_t)c->routed_expert_hidden_size * (c->num_experts_per_token + 3) +
                     2 * (size_t)c->moe_intermediate_size * c->num_experts_per_token;
    int max_blocks = (c->num_hidden_layers + c->attn_res_block_size - 1) / c->attn_res_block_size + 1;
    /* + the batched pass's scratch at the default prefill chunk (forward_batch.c) */
    return (kda + kv + scratch) * sizeof(float) + k3_mla_ws_bytes(c, k3_mla_ws_rows(c, 1)) +
           k3_batch_plan_bytes(m, max_blocks, K3_DEFAULT_CHUNK);
}

size_t k3_state_undo_bytes(const k3_model *m) {
    const k3_config *c = &m->cfg;
    size_t P = (size_t)c->kda_num_heads * c->kda_head_dim;
    return (size_t)m->n_kda * ((size_t)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim +
                               3 * P * (size_t)(c->kda_conv_size - 1)) * sizeof(float);
}

void k3_state_times(const k3_state *s, k3_phase_times *sum, k3_phase_times *last) {
    *sum = s->sum;
    *last = s->tok;
}

void k3_state_layer_times(const k3_state *s, const double **eload_s, const double **expert_s) {
    *eload_s = s->layer_eload_s;
    *expert_s = s->layer_expert_s;
}

int k3_state_pos(const k3_state *s) { return s->pos; }
int k3_state_max_ctx(const k3_state *s) { return s->max_ctx; }

k3_store_client *k3_state_store(k3_state *s) { return s->store; }

void k3_state_sum_times(k3_state *s) {
    k3_phase_times *sum = &s->sum;
    const k3_phase_times *t = &s->tok;
    sum->total_s += t->total_s, sum->attn_s += t->attn_s, sum->moe_s += t->moe_s;
    sum->router_s += t->router_s, sum->eload_s += t->eload_s, sum->expert_s += t->expert_s;
    sum->head_s += t->head_s, sum->tokens += t->tokens;
}

void k3_state_advance(k3_state *s, const k3_phase_times *t) {
    s->tok = *t;
    k3_state_sum_times(s);
    s->pos++;
}

void k3_state_buffers_of(k3_state *s, k3_state_buffers *out) {
    *out = (k3_state_buffers){.kda_S = s->kda_S, .kda_conv = s->kda_conv, .kv = s->kv,
                              .kda_S_floats = s->kda_S_floats,
                              .kda_conv_floats = s->kda_conv_floats, .kv_floats = s->kv_floats,
                              .pos = s->pos, .max_ctx = s->max_ctx};
}
