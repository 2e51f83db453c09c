/* gpu.c — the CUDA backend (see gpu.h): memory plan, weight upload, the GPU expert cache,
 * per-session device state, and the forward pass, mirroring src/model/forward.c. */
#include "gpu.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kern.h"
#include "../util/clock.h"

#define ALIGN 256u
#define MLA_LORA_EPS 1e-6f /* spec §4, as src/model/mla.c */
#define MAX_MATS 32        /* weight matrices of one layer */

static uint64_t align_up(uint64_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

static int cuda_fail(k3_err *err, cudaError_t e, const char *what) {
    return k3_fail(err, K3_ERR_DEVICE, "CUDA: %s failed: %s", what, cudaGetErrorString(e));
}

/* Runs a CUDA call or kernel launcher; on failure returns K3_ERR_DEVICE naming it. */
#define CK(call)                                                                            \
    do {                                                                                    \
        cudaError_t ck_ = (call);                                                           \
        if (ck_ != cudaSuccess) return cuda_fail(err, ck_, #call);                          \
    } while (0)

typedef struct gpu_layer {
    k3_layer w;       /* the model's layer with every weight pointer rewritten to the device */
    int resident;     /* 1: own device buffer; 0: uploaded per token into staging[slot] */
    int slot;         /* staging slot of a streamed layer */
    uint64_t bytes;   /* the layer's blob */
    void *dev, *host; /* resident blob / pinned host copy of a streamed layer */
} gpu_layer;

typedef struct expert_cache {
    int n_slots, n_experts;  /* slots; experts per layer (E) */
    uint64_t slot_bytes;
    uint64_t off[7];         /* w1 packed, w1 scale, w3 packed, w3 scale, w2 packed, w2 scale,
                              * the prepared slot's flag word (kern.h) */
    uint8_t *dev;            /* n_slots × slot_bytes, then one more: the upload staging slot,
                              * from which k3k_experts_prepare re-lays an expert into its slot */
    int *slot_of;            /* [layers × E]: slot holding (layer, expert), or -1 */
    int *key;                /* [n_slots]: layer × E + expert, or -1 when empty */
    uint64_t *stamp, tick;   /* last use (LRU) */
    uint64_t hits, misses, evictions, bytes_up;
} expert_cache;

/* Device scratch of one step (shared by the sessions: steps are serialized). */
typedef struct scratch {
    float *P, *x, *xn, *a, *f, *ffn_tmp, *blocks;
    float *q, *k, *v, *g, *fv, *o, *fa, *beta;
    float *cq, *Q, *ckv, *mqa, *macc; /* mqa [H][lora + rope], macc [H][lora] (mla_forward) */
    float *gate, *up, *router, *w, *lat, *lat_acc, *h, *eo, *logits, *res_scores;
    int *ids;
} scratch;

struct k3_gpu {
    const k3_model *m;
    int profile;                          /* 1: per-layer device events (K3_GPU_PROFILE) */
    pthread_mutex_t mu;
    cudaStream_t cs, us, es, rs;          /* compute, spine uploads, expert uploads, router */
    cudaEvent_t ready[2], freed[2], routed, normed;
    cudaEvent_t *ev;                      /* [layers + 2] when profiling: layer starts, head, end */
    double *layer_ms_sum;
    int profiled_steps;
    gpu_layer *layers;
    int *stream_order, n_streamed;        /* streamed layers in order */
    void *staging[2];
    void *head;                           /* lm_head, final norm, output AttnRes weights */
    k3_mat lm_head, norm;
    float *out_res_sw;
    void *scratch_mem;
    scratch d;
    float *h_embed, *h_vec, *h_w;         /* pinned host buffers */
    int *h_ids;
    expert_cache ec;
    int max_blocks;
    uint64_t head_bytes;
};

struct k3_gpu_session {
    k3_gpu *g;
    int max_ctx;
    float *kda_S, *kda_conv, *scores; /* scores: attention scratch (k3k_mla_latent_attend) */
    size_t S_floats, conv_floats;     /* per layer */
    /* The MLA cache is LATENT, as the host state's (lat [n_mla][max_ctx][lora + rope], state.h,
     * attended in the absorbed form, k3k_mla_latent_attend), so a state file moves between
     * backends as a plain copy. */
    float *lat;
    size_t lat_floats;
    void *mem;
    size_t kda_bytes;                        /* kda_S + kda_conv, zeroed on reset */
};

int k3_gpu_device_count(char *reason, size_t cap) {
    int n = 0;
    int drv = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* with no driver at all CUDA says "driver version is insufficient", which sends the
         * user to upgrade a driver they do not have */
        if (reason && cudaDriverGetVersion(&drv) == cudaSuccess && drv == 0)
            snprintf(reason, cap, "no NVIDIA driver is installed (nvidia-smi should list the GPU)");
        else if (reason)
            snprintf(reason, cap, "%s", cudaGetErrorString(e));
        cudaGetLastError(); /* clear it so that later calls start clean */
        return 0;
    }
    if (n == 0 && reason) snprintf(reason, cap, "the driver reports no CUDA device");
    return n;
}

/* ---- weights: one contiguous blob per layer ------------------------------------------- */

static size_t dtype_size(int dt) { return dt == K3_DT_F32 ? 4 : dt == K3_DT_BF16 ? 2 : 1; }

static uint64_t mat_bytes(const k3_mat *m) {
    uint64_t n = align_up((uint64_t)m->rows * (uint64_t)m->cols * dtype_size(m->dtype));
    if (m->dtype == K3_DT_I8) n += align_up((uint64_t)m->rows * sizeof(float));
    return n;
}

/* Every weight matrix/vector the forward pass reads from layer L (the fields of k3_layer). */
static int layer_mats(k3_layer *L, k3_mat **out) {
    int n = 0;
    out[n++] = &L->input_layernorm;
    out[n++] = &L->post_attention_layernorm;
    if (L->is_mla) {
        k3_mla_weights *w = &L->mla;
        k3_mat *list[] = {&w->q_a_proj, &w->q_a_layernorm, &w->q_b_proj, &w->kv_a_proj,
                          &w->kv_a_layernorm, &w->kv_b_proj, &w->g_proj, &w->o_proj};
        for (size_t i = 0; i < sizeof list / sizeof *list; i++) out[n++] = list[i];
    } else {
        k3_kda_weights *w = &L->kda;
        k3_mat *list[] = {&w->q_proj, &w->k_proj, &w->v_proj, &w->g_proj, &w->o_proj,
                          &w->f_a_proj, &w->f_b_proj, &w->b_proj, &w->q_conv, &w->k_conv,
                          &w->v_conv, &w->A_log, &w->dt_bias, &w->o_norm};
        for (size_t i = 0; i < sizeof list / sizeof *list; i++) out[n++] = list[i];
    }
    if (L->is_moe) {
        k3_moe_weights *w = &L->moe;
        k3_mat *list[] = {&w->router, &w->router_bias, &w->down_proj, &w->up_proj, &w->norm,
                          &w->shared_gate, &w->shared_up, &w->shared_down};
        for (size_t i = 0; i < sizeof list / sizeof *list; i++) out[n++] = list[i];
    } else {
        k3_mat *list[] = {&L->dense.gate_proj, &L->dense.up_proj, &L->dense.down_proj};
        for (size_t i = 0; i < sizeof list / sizeof *list; i++) out[n++] = list[i];
    }
    return n;
}

static uint64_t layer_bytes(const k3_model *m, int l) {
    k3_layer L = m->layers[l];
    k3_mat *mats[MAX_MATS];
    int n = layer_mats(&L, mats);
    uint64_t b = 2 * align_up((uint64_t)m->cfg.hidden_size * sizeof(float)); /* AttnRes sw */
    for (int i = 0; i < n; i++) b += mat_bytes(mats[i]);
    return b;
}

/* Copies n bytes from host src to blob + off: into device memory (dev) or pinned host. */
static int put(void *blob, int dev, uint64_t off, const void *src, uint64_t n, k3_err *err) {
    if (!n) return K3_OK;
    if (dev)
        CK(cudaMemcpy((char *)blob + off, src, n, cudaMemcpyHostToDevice));
    else
        memcpy((char *)blob + off, src, n);
    return K3_OK;
}

/* Fills blob (device when dev, else pinned host) with layer l's weights and rewrites the
 * pointers of gl->w to base (where the blob will be on the device) plus their offsets. */
static int fill_layer(const k3_model *m, int l, gpu_layer *gl, void *blob, int dev, char *base,
                      k3_err *err) {
    gl->w = m->layers[l];
    k3_mat *mats[MAX_MATS];
    int n = layer_mats(&gl->w, mats), rc;
    uint64_t off = 0, hd = (uint64_t)m->cfg.hidden_size * sizeof(float);
    for (int i = 0; i < n; i++) {
        k3_mat *w = mats[i];
        uint64_t nb = (uint64_t)w->rows * (uint64_t)w->cols * dtype_size(w->dtype);
        if ((rc = put(blob, dev, off, w->data, nb, err))) return rc;
        w->data = base + off;
        off += align_up(nb);
        if (w->dtype == K3_DT_I8) {
            uint64_t ns = (uint64_t)w->rows * sizeof(float);
            if ((rc = put(blob, dev, off, w->scale, ns, err))) return rc;
            w->scale = (const float *)(base + off);
            off += align_up(ns);
        }
    }
    if ((rc = put(blob, dev, off, m->layers[l].attn_res_sw, hd, err))) return rc;
    gl->w.attn_res_sw = (float *)(base + off);
    off += align_up(hd);
    if ((rc = put(blob, dev, off, m->layers[l].mlp_res_sw, hd, err))) return rc;
    gl->w.mlp_res_sw = (float *)(base + off);
    return K3_OK;
}

static int upload_head(k3_gpu *g, k3_err *err) {
    const k3_model *m = g->m;
    uint64_t hd = (uint64_t)m->cfg.hidden_size;
    uint64_t b_lm = mat_bytes(&m->lm_head), b_norm = mat_bytes(&m->norm);
    g->head_bytes = b_lm + b_norm + align_up(hd * 4);
    CK(cudaMalloc(&g->head, b_lm + b_norm + align_up(hd * 4)));
    char *base = g->head;
    g->lm_head = m->lm_head;
    g->norm = m->norm;
    k3_mat *mats[2] = {&g->lm_head, &g->norm};
    uint64_t off = 0;
    for (int i = 0; i < 2; i++) {
        k3_mat *w = mats[i];
        uint64_t nb = (uint64_t)w->rows * (uint64_t)w->cols * dtype_size(w->dtype);
        CK(cudaMemcpy(base + off, w->data, nb, cudaMemcpyHostToDevice));
        w->data = base + off;
        off += align_up(nb);
        if (w->dtype == K3_DT_I8) {
            CK(cudaMemcpy(base + off, w->scale, (size_t)w->rows * 4, cudaMemcpyHostToDevice));
            w->scale = (const float *)(base + off);
            off += align_up((uint64_t)w->rows * 4);
        }
    }
    CK(cudaMemcpy(base + off, m->out_res_sw, hd * 4, cudaMemcpyHostToDevice));
    g->out_res_sw = (float *)(base + off);
    return K3_OK;
}

/* ---- the plan ---------------------------------------------------------------------------- */

static uint64_t scratch_floats(const k3_model *m, int max_blocks) {
    const k3_config *c = &m->cfg;
    uint64_t hd = c->hidden_size, P = (uint64_t)c->kda_num_heads * c->kda_head_dim;
    uint64_t H = c->num_attention_heads, mo = H * c->v_head_dim, big = P > mo ? P : mo;
    uint64_t qk = c->qk_nope_head_dim + c->qk_rope_head_dim, K = c->num_experts_per_token;
    uint64_t inter = c->intermediate_size, sh = (uint64_t)c->moe_intermediate_size * c->num_shared_experts;
    inter = inter > sh ? inter : sh;
    inter = inter > (uint64_t)c->moe_intermediate_size ? inter : (uint64_t)c->moe_intermediate_size;
    /* generously: every vector rounded up to a whole ALIGN, counted in floats */
    uint64_t pad = ALIGN / 4;
    return 6 * (hd + pad) + (uint64_t)max_blocks * hd + pad + 6 * (big + pad) +
           (uint64_t)m->kda_rank + (uint64_t)c->kda_num_heads + 2 * pad + c->q_lora_rank + pad +
           H * qk + pad + (uint64_t)(c->kv_lora_rank + c->qk_rope_head_dim) + pad +
           H * (uint64_t)(2 * c->kv_lora_rank + c->qk_rope_head_dim) + 2 * pad + 2 * (inter + pad) +
           (uint64_t)c->num_experts + pad + 2 * (K + pad) +
           2 * ((uint64_t)c->routed_expert_hidden_size + pad) +
           K * (uint64_t)c->moe_intermediate_size + pad + K * (uint64_t)c->routed_expert_hidden_size +
           pad + (uint64_t)c->vocab_size + pad + K3K_MAX_RES + pad;
}

static void *carve(char **p, uint64_t count, size_t es) {
    void *r = *p;
    *p += align_up(count * es);
    return r;
}

static int alloc_scratch(k3_gpu *g, k3_err *err) {
    const k3_model *m = g->m;
    const k3_config *c = &m->cfg;
    uint64_t hd = c->hidden_size, P = (uint64_t)c->kda_num_heads * c->kda_head_dim;
    uint64_t H = c->num_attention_heads, mo = H * c->v_head_dim, big = P > mo ? P : mo;
    uint64_t K = c->num_experts_per_token, lat = c->routed_expert_hidden_size;
    uint64_t inter = c->intermediate_size, sh = (uint64_t)c->moe_intermediate_size * c->num_shared_experts;
    inter = inter > sh ? inter : sh;
    inter = inter > (uint64_t)c->moe_intermediate_size ? inter : (uint64_t)c->moe_intermediate_size;
    CK(cudaMalloc(&g->scratch_mem, scratch_floats(m, g->max_blocks) * 4 + 64 * ALIGN));
    char *p = g->scratch_mem;
    scratch *d = &g->d;
    d->P = carve(&p, hd, 4), d->x = carve(&p, hd, 4), d->xn = carve(&p, hd, 4);
    d->a = carve(&p, hd, 4), d->f = carve(&p, hd, 4), d->ffn_tmp = carve(&p, hd, 4);
    d->blocks = carve(&p, (uint64_t)g->max_blocks * hd, 4);
    d->q = carve(&p, big, 4), d->k = carve(&p, big, 4), d->v = carve(&p, big, 4);
    d->g = carve(&p, big, 4), d->fv = carve(&p, big, 4), d->o = carve(&p, big, 4);
    d->fa = carve(&p, (uint64_t)m->kda_rank + 1, 4), d->beta = carve(&p, c->kda_num_heads + 1, 4);
    d->cq = carve(&p, c->q_lora_rank, 4);
    d->Q = carve(&p, H * (c->qk_nope_head_dim + c->qk_rope_head_dim), 4);
    d->ckv = carve(&p, c->kv_lora_rank + c->qk_rope_head_dim, 4);
    d->mqa = carve(&p, H * (c->kv_lora_rank + c->qk_rope_head_dim), 4);
    d->macc = carve(&p, H * c->kv_lora_rank, 4);
    d->gate = carve(&p, inter, 4), d->up = carve(&p, inter, 4);
    d->router = carve(&p, c->num_experts, 4);
    d->ids = carve(&p, K, 4), d->w = carve(&p, K, 4);
    d->lat = carve(&p, lat, 4), d->lat_acc = carve(&p, lat, 4);
    d->h = carve(&p, K * c->moe_intermediate_size, 4), d->eo = carve(&p, K * lat, 4);
    d->logits = carve(&p, c->vocab_size, 4), d->res_scores = carve(&p, K3K_MAX_RES, 4);
    return K3_OK;
}

static uint64_t state_bytes(const k3_model *m, int max_ctx) {
    const k3_config *c = &m->cfg;
    uint64_t P = (uint64_t)c->kda_num_heads * c->kda_head_dim;
    uint64_t S = (uint64_t)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim;
    uint64_t conv = 3 * P * (uint64_t)(c->kda_conv_size - 1);
    uint64_t latf = (uint64_t)c->kv_lora_rank + (uint64_t)c->qk_rope_head_dim;
    return align_up((uint64_t)m->n_kda * S * 4) + align_up((uint64_t)m->n_kda * conv * 4) +
           align_up((uint64_t)m->n_mla * (uint64_t)max_ctx * latf * 4) +
           align_up(k3k_mla_latent_scratch_floats(c->num_attention_heads, c->kv_lora_rank) * 4);
}

static int default_ctx(const k3_config *c) {
    return c->max_position_embeddings < 4096 ? c->max_position_embeddings : 4096;
}

/* Slot layout of one routed expert: w1, w3 ([inter, latent]) and w2 ([latent, inter]), then
 * the flag word of the prepared layout. */
static void expert_layout(const k3_config *c, expert_cache *ec) {
    uint64_t packed = (uint64_t)c->moe_intermediate_size * c->routed_expert_hidden_size / 2;
    uint64_t scale = (uint64_t)c->moe_intermediate_size * c->routed_expert_hidden_size / 32;
    uint64_t off = 0;
    for (int i = 0; i < 7; i++) {
        ec->off[i] = off;
        off += align_up(i == 6 ? 4 : i % 2 ? scale : packed);
    }
    ec->slot_bytes = off;
    ec->n_experts = c->num_experts;
}

static int check_shapes(const k3_config *c, k3_err *err) {
    if (c->kda_head_dim > 1024 || c->num_experts_per_token > K3K_MAX_EXPERTS ||
        c->num_experts > 8192 || c->routed_expert_hidden_size % 32 ||
        c->moe_intermediate_size % 32 || c->routed_expert_hidden_size > 8192 ||
        c->moe_intermediate_size > 8192)
        return k3_fail(err, K3_ERR_DEVICE, "the CUDA backend does not support this model's shapes "
                       "(needs kda_head_dim <= 1024, top-k <= %d, <= 8192 experts, expert widths "
                       "multiples of 32 up to 8192)", K3K_MAX_EXPERTS);
    return K3_OK;
}

typedef struct plan {
    uint64_t budget, head, scratch, state, staging, resident, cache, free_b, total_b;
    int n_resident, n_slots, all_experts;
} plan;

static int make_plan(k3_gpu *g, const k3_gpu_opts *o, plan *p, k3_err *err) {
    const k3_model *m = g->m;
    const k3_config *c = &m->cfg;
    int L = c->num_hidden_layers;
    size_t fr = 0, tot = 0;
    CK(cudaMemGetInfo(&fr, &tot));
    *p = (plan){.free_b = fr, .total_b = tot};
    uint64_t margin = tot / 20 > (1ull << 30) ? tot / 20 : (1ull << 30);
    if (o->gpu_gb > 0) {
        p->budget = (uint64_t)(o->gpu_gb * 1e9);
        if (p->budget > fr)
            return k3_fail_field(err, K3_ERR_USAGE, "gpu_gb",
                                 " %.3g exceeds the %.3g GB of free device "
                           "memory", o->gpu_gb, fr / 1e9);
    } else {
        p->budget = fr > margin ? fr - margin : 0;
    }
    p->head = mat_bytes(&m->lm_head) + mat_bytes(&m->norm) + align_up((uint64_t)c->hidden_size * 4);
    p->scratch = scratch_floats(m, g->max_blocks) * 4 + 64 * ALIGN;
    p->state = state_bytes(m, o->plan_ctx > 0 ? o->plan_ctx : default_ctx(c));
    int n_moe = 0;
    for (int l = 0; l < L; l++) n_moe += m->layers[l].is_moe;
    uint64_t all_experts = (uint64_t)n_moe * c->num_experts;
    /* top-k slots and the upload staging slot */
    uint64_t min_cache = n_moe ? ((uint64_t)c->num_experts_per_token + 1) * g->ec.slot_bytes : 0;
    uint64_t fixed = p->head + p->scratch + p->state;
    if (fixed + min_cache > p->budget)
        return k3_fail_opts(err, K3_ERR_DEVICE, "gpu_gb,ctx", "a device budget of %.3g GB cannot "
                       "hold the head (%.3g GB), one session's state (%.3g GB) and one layer's "
                       "%d experts (%.3g GB); raise gpu_gb or lower ctx", p->budget / 1e9, p->head / 1e9,
                       p->state / 1e9, c->num_experts_per_token, min_cache / 1e9);
    uint64_t avail = p->budget - fixed - min_cache, all = 0, biggest = 0;
    for (int l = 0; l < L; l++) {
        uint64_t b = g->layers[l].bytes;
        all += b;
        biggest = b > biggest ? b : biggest;
    }
    int max_layers = o->max_layers < 0 || o->max_layers > L ? L : o->max_layers;
    if (all <= avail && max_layers == L) {
        p->n_resident = L;
        p->resident = all;
    } else {
        p->staging = 2 * biggest;
        if (p->staging > avail)
            return k3_fail(err, K3_ERR_DEVICE, "a device budget of %.3g GB cannot hold two "
                           "staging buffers of %.3g GB for streamed layers; raise gpu_gb",
                           p->budget / 1e9, biggest / 1e9);
        avail -= p->staging;
        for (int l = 0; l < max_layers && p->resident + g->layers[l].bytes <= avail; l++) {
            p->resident += g->layers[l].bytes;
            p->n_resident++;
        }
    }
    uint64_t left = p->budget - fixed - p->staging - p->resident;
    uint64_t slots = g->ec.slot_bytes ? left / g->ec.slot_bytes : 0;
    slots = slots > 0 ? slots - 1 : 0; /* the staging slot */
    if (slots > all_experts) slots = all_experts;
    if (o->expert_slots > 0) {
        if (((uint64_t)o->expert_slots + 1) * g->ec.slot_bytes > left)
            return k3_fail(err, K3_ERR_USAGE, "%d expert slots exceed the device budget",
                           o->expert_slots);
        slots = (uint64_t)o->expert_slots;
        if (slots < (uint64_t)c->num_experts_per_token)
            return k3_fail(err, K3_ERR_USAGE, "the GPU expert cache needs at least top-k = %d "
                           "slots, got %d", c->num_experts_per_token, o->expert_slots);
    }
    p->n_slots = n_moe ? (int)slots : 0;
    p->cache = p->n_slots ? ((uint64_t)p->n_slots + 1) * g->ec.slot_bytes : 0;
    p->all_experts = (int)all_experts;
    return K3_OK;
}

/* ---- open / close ----------------------------------------------------------------------- */

static int alloc_layers(k3_gpu *g, int n_resident, uint64_t staging, k3_err *err) {
    const k3_model *m = g->m;
    int L = m->cfg.num_hidden_layers, rc;
    if (staging) {
        CK(cudaMalloc(&g->staging[0], staging / 2));
        CK(cudaMalloc(&g->staging[1], staging / 2));
    }
    for (int l = 0; l < L; l++) {
        gpu_layer *gl = &g->layers[l];
        gl->resident = l < n_resident;
        if (gl->resident) {
            CK(cudaMalloc(&gl->dev, gl->bytes));
            rc = fill_layer(m, l, gl, gl->dev, 1, gl->dev, err);
        } else {
            gl->slot = g->n_streamed % 2;
            g->stream_order[g->n_streamed++] = l;
            CK(cudaHostAlloc(&gl->host, gl->bytes, cudaHostAllocWriteCombined));
            rc = fill_layer(m, l, gl, gl->host, 0, g->staging[gl->slot], err);
        }
        if (rc) return rc;
    }
    return K3_OK;
}

static int alloc_cache(k3_gpu *g, int n_slots, k3_err *err) {
    expert_cache *ec = &g->ec;
    int L = g->m->cfg.num_hidden_layers;
    ec->n_slots = n_slots;
    if (!n_slots) return K3_OK;
    CK(cudaMalloc((void **)&ec->dev, ((size_t)n_slots + 1) * ec->slot_bytes));
    ec->slot_of = malloc((size_t)L * ec->n_experts * sizeof *ec->slot_of);
    ec->key = malloc((size_t)n_slots * sizeof *ec->key);
    ec->stamp = calloc((size_t)n_slots, sizeof *ec->stamp);
    if (!ec->slot_of || !ec->key || !ec->stamp) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (size_t i = 0; i < (size_t)L * ec->n_experts; i++) ec->slot_of[i] = -1;
    for (int i = 0; i < n_slots; i++) ec->key[i] = -1;
    return K3_OK;
}

static int create_streams(k3_gpu *g, k3_err *err) {
    CK(cudaStreamCreateWithFlags(&g->cs, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&g->us, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&g->es, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&g->rs, cudaStreamNonBlocking));
    for (int i = 0; i < 2; i++) {
        CK(cudaEventCreateWithFlags(&g->ready[i], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&g->freed[i], cudaEventDisableTiming));
    }
    CK(cudaEventCreateWithFlags(&g->routed, cudaEventDisableTiming)); /* spin: latency */
    CK(cudaEventCreateWithFlags(&g->normed, cudaEventDisableTiming));
    int L = g->m->cfg.num_hidden_layers;
    if (g->profile) {
        g->ev = calloc((size_t)L + 2, sizeof *g->ev); /* layer starts, head start, end */
        g->layer_ms_sum = calloc((size_t)L + 1, sizeof *g->layer_ms_sum);
        if (!g->ev || !g->layer_ms_sum) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
        for (int l = 0; l <= L + 1; l++) CK(cudaEventCreate(&g->ev[l]));
    }
    size_t hd = (size_t)g->m->cfg.hidden_size, K = (size_t)g->m->cfg.num_experts_per_token;
    CK(cudaMallocHost((void **)&g->h_embed, hd * 4));
    CK(cudaMallocHost((void **)&g->h_vec, hd * 4));
    CK(cudaMallocHost((void **)&g->h_ids, K * 4));
    CK(cudaMallocHost((void **)&g->h_w, K * 4));
    return K3_OK;
}

static void describe(const k3_gpu *g, const plan *p, const struct cudaDeviceProp *pr, int ctx,
                     char *line, size_t cap) {
    int L = g->m->cfg.num_hidden_layers, drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    double gb = 1e9;
    size_t n = (size_t)snprintf(line, cap,
        "device: %s (sm_%d%d, %d SMs, %.1f GB, CUDA driver %d.%d, runtime %d.%d); budget %.2f GB: "
        "spine %d/%d layers resident (%.2f GB)", pr->name, pr->major, pr->minor,
        pr->multiProcessorCount, p->total_b / gb, drv / 1000, drv % 1000 / 10, rt / 1000,
        rt % 1000 / 10, p->budget / gb, p->n_resident, L, p->resident / gb);
    if (g->n_streamed && n < cap)
        n += (size_t)snprintf(line + n, cap - n, ", %d streamed from pinned host memory through "
                              "2 x %.2f GB staging", g->n_streamed, p->staging / 2 / gb);
    if (n < cap)
        n += (size_t)snprintf(line + n, cap - n, "; head %.2f GB; expert cache %d slots = %.2f GB "
                              "(of %d routed experts, %.1f MB each); KV/state %.2f GB per session "
                              "at ctx %d; scratch %.3f GB", p->head / gb, p->n_slots, p->cache / gb,
                              p->all_experts, g->ec.slot_bytes / 1e6, p->state / gb, ctx,
                              p->scratch / gb);
}

int k3_gpu_open(const k3_model *m, const k3_gpu_opts *o, k3_gpu **out, char *line, size_t cap,
                k3_err *err) {
    char why[256] = "";
    *out = NULL;
    if (k3_gpu_device_count(why, sizeof why) <= 0)
        return k3_fail(err, K3_ERR_DEVICE, "no CUDA device: %s", why);
    int rc = check_shapes(&m->cfg, err);
    if (rc) return rc;
    k3_gpu *g = calloc(1, sizeof *g);
    if (!g) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    const k3_config *c = &m->cfg;
    int L = c->num_hidden_layers;
    g->m = m;
    g->profile = o->profile;
    g->max_blocks = (L + c->attn_res_block_size - 1) / c->attn_res_block_size + 1;
    pthread_mutex_init(&g->mu, NULL);
    g->layers = calloc((size_t)L, sizeof *g->layers);
    g->stream_order = calloc((size_t)L, sizeof *g->stream_order);
    if (!g->layers || !g->stream_order) {
        k3_gpu_close(g);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    if (g->max_blocks + 1 > K3K_MAX_RES) {
        k3_gpu_close(g);
        return k3_fail(err, K3_ERR_DEVICE, "too many AttnRes blocks for the CUDA backend");
    }
    expert_layout(c, &g->ec);
    for (int l = 0; l < L; l++) {
        g->layers[l].bytes = layer_bytes(m, l);
    }
    struct cudaDeviceProp pr;
    memset(&pr, 0, sizeof pr);
    plan p = {0};
    cudaError_t ce = cudaSetDevice(0);
    if (ce == cudaSuccess) ce = cudaGetDeviceProperties(&pr, 0);
    if (ce != cudaSuccess) rc = cuda_fail(err, ce, "cudaGetDeviceProperties");
    if (!rc) rc = make_plan(g, o, &p, err);
    if (!rc) rc = create_streams(g, err);
    if (!rc) rc = alloc_scratch(g, err);
    if (!rc) rc = upload_head(g, err);
    if (!rc) rc = alloc_layers(g, p.n_resident, p.staging, err);
    if (!rc) rc = alloc_cache(g, p.n_slots, err);
    /* cudaMemcpy from pageable memory may return before its DMA lands, and our streams do
     * not order against the legacy stream: wait for every upload here. */
    if (!rc && (ce = cudaDeviceSynchronize()) != cudaSuccess) rc = cuda_fail(err, ce, "upload");
    if (rc) {
        k3_gpu_close(g);
        return rc;
    }
    describe(g, &p, &pr, o->plan_ctx > 0 ? o->plan_ctx : default_ctx(c), line, cap);
    *out = g;
    return K3_OK;
}

void k3_gpu_close(k3_gpu *g) {
    if (!g) return;
    if (g->cs) cudaStreamSynchronize(g->cs);
    int L = g->m->cfg.num_hidden_layers;
    for (int l = 0; g->layers && l < L; l++) {
        cudaFree(g->layers[l].dev);
        cudaFreeHost(g->layers[l].host);
    }
    cudaFree(g->staging[0]);
    cudaFree(g->staging[1]);
    cudaFree(g->head);
    cudaFree(g->scratch_mem);
    cudaFree(g->ec.dev);
    cudaFreeHost(g->h_embed);
    cudaFreeHost(g->h_vec);
    cudaFreeHost(g->h_ids);
    cudaFreeHost(g->h_w);
    if (g->ev)
        for (int l = 0; l <= L + 1; l++)
            if (g->ev[l]) cudaEventDestroy(g->ev[l]);
    for (int i = 0; i < 2; i++) {
        if (g->ready[i]) cudaEventDestroy(g->ready[i]);
        if (g->freed[i]) cudaEventDestroy(g->freed[i]);
    }
    if (g->routed) cudaEventDestroy(g->routed);
    if (g->normed) cudaEventDestroy(g->normed);
    if (g->cs) cudaStreamDestroy(g->cs);
    if (g->us) cudaStreamDestroy(g->us);
    if (g->es) cudaStreamDestroy(g->es);
    if (g->rs) cudaStreamDestroy(g->rs);
    free(g->ev);
    free(g->layer_ms_sum);
    free(g->ec.slot_of);
    free(g->ec.key);
    free(g->ec.stamp);
    free(g->layers);
    free(g->stream_order);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* ---- sessions -------------------------------------------------------------------------- */

int k3_gpu_session_new(k3_gpu *g, int max_ctx, k3_gpu_session **out, k3_err *err) {
    const k3_model *m = g->m;
    const k3_config *c = &m->cfg;
    k3_gpu_session *s = calloc(1, sizeof *s);
    if (!s) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    s->g = g;
    s->max_ctx = max_ctx;
    uint64_t P = (uint64_t)c->kda_num_heads * c->kda_head_dim;
    s->S_floats = (size_t)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim;
    s->conv_floats = 3 * P * (size_t)(c->kda_conv_size - 1);
    s->lat_floats = (size_t)c->kv_lora_rank + (size_t)c->qk_rope_head_dim;
    uint64_t total = state_bytes(m, max_ctx);
    cudaSetDevice(0);
    cudaError_t e = cudaMalloc(&s->mem, total);
    if (e != cudaSuccess) {
        free(s);
        cudaGetLastError();
        return k3_fail_opts(err, K3_ERR_DEVICE, "ctx,gpu_gb", "out of device memory for a "
                       "session's state (%.3g GB at a context of %d): %s; lower ctx or gpu_gb", total / 1e9, max_ctx,
                       cudaGetErrorString(e));
    }
    char *p = s->mem;
    s->kda_S = carve(&p, (uint64_t)m->n_kda * s->S_floats, 4);
    s->kda_conv = carve(&p, (uint64_t)m->n_kda * s->conv_floats, 4);
    s->kda_bytes = (size_t)(p - (char *)s->mem);
    s->lat = carve(&p, (uint64_t)m->n_mla * (uint64_t)max_ctx * s->lat_floats, 4);
    s->scores = carve(&p, k3k_mla_latent_scratch_floats(c->num_attention_heads, c->kv_lora_rank), 4);
    if ((e = cudaMemset(s->mem, 0, total)) != cudaSuccess || (e = cudaDeviceSynchronize())) {
        k3_gpu_session_free(s);
        return cuda_fail(err, e, "cudaMemset (session state)");
    }
    *out = s;
    return K3_OK;
}

void k3_gpu_session_free(k3_gpu_session *s) {
    if (!s) return;
    cudaFree(s->mem);
    free(s);
}

void k3_gpu_session_reset(k3_gpu_session *s) {
    pthread_mutex_lock(&s->g->mu);
    cudaMemsetAsync(s->mem, 0, s->kda_bytes, s->g->cs);
    cudaStreamSynchronize(s->g->cs);
    pthread_mutex_unlock(&s->g->mu);
}

static cudaError_t mv(const k3_gpu *g, const k3_mat *w, const float *x, float *y);

static int sync_locked(k3_gpu_session *s, k3_state *st, int to_host, k3_err *err) {
    const k3_model *m = s->g->m;
    enum cudaMemcpyKind dir = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    size_t nS = (size_t)m->n_kda * s->S_floats * 4, nC = (size_t)m->n_kda * s->conv_floats * 4;
    k3_state_buffers h;
    k3_state_buffers_of(st, &h);
    if (h.max_ctx != s->max_ctx || h.kv_floats != s->lat_floats)
        return k3_fail(err, K3_ERR_DEVICE, "host and device session states differ in shape");
    CK(to_host ? cudaMemcpy(h.kda_S, s->kda_S, nS, dir) : cudaMemcpy(s->kda_S, h.kda_S, nS, dir));
    CK(to_host ? cudaMemcpy(h.kda_conv, s->kda_conv, nC, dir)
               : cudaMemcpy(s->kda_conv, h.kda_conv, nC, dir));
    size_t used = (size_t)h.pos * s->lat_floats * 4;
    for (int i = 0; i < m->n_mla && used; i++) {
        size_t off = (size_t)i * s->max_ctx * s->lat_floats;
        CK(to_host ? cudaMemcpy(h.kv + off, s->lat + off, used, dir)
                   : cudaMemcpy(s->lat + off, h.kv + off, used, dir));
    }
    CK(cudaDeviceSynchronize()); /* see k3_gpu_open */
    return K3_OK;
}

int k3_gpu_sync_state(k3_gpu_session *s, k3_state *st, int to_host, k3_err *err) {
    pthread_mutex_lock(&s->g->mu);
    int rc = sync_locked(s, st, to_host, err);
    pthread_mutex_unlock(&s->g->mu);
    return rc;
}

/* ---- the forward pass --------------------------------------------------------------------- */

static k3k_mat km(const k3_mat *w) {
    return (k3k_mat){w->data, w->scale, w->dtype, w->rows, w->cols};
}

static cudaError_t mv(const k3_gpu *g, const k3_mat *w, const float *x, float *y) {
    k3k_mat k = km(w);
    return k3k_matvec(&k, x, y, g->cs);
}

/* y[i] = W[i] x for n matrices of one input, in one launch. */
static cudaError_t mv_multi(const k3_gpu *g, const k3_mat *const *w, float *const *y, int n,
                            const float *x) {
    k3k_mat k[K3K_MAX_MULTI];
    const k3k_mat *kp[K3K_MAX_MULTI];
    for (int i = 0; i < n; i++) k[i] = km(w[i]), kp[i] = &k[i];
    return k3k_matvec_multi(kp, y, n, x, g->cs);
}

/* Copies a device vector back and hands it to the trace hook (tests only: synchronizes). */
static int trace_vec(k3_gpu *g, const k3_trace *tr, int pos, int layer, enum k3_trace_point pt,
                     const float *d, k3_err *err) {
    if (!tr || !tr->on_vector) return K3_OK;
    int hd = g->m->cfg.hidden_size;
    CK(cudaMemcpyAsync(g->h_vec, d, (size_t)hd * 4, cudaMemcpyDeviceToHost, g->cs));
    CK(cudaStreamSynchronize(g->cs));
    tr->on_vector(tr->user, pos, layer, pt, g->h_vec, hd);
    return K3_OK;
}

/* AR(R ++ [last]) with score weights sw into out (spec §5). */
static int mix(k3_gpu *g, int n_blocks, const float *last, const float *sw, float *out,
               k3_err *err) {
    const k3_config *c = &g->m->cfg;
    const float *vals[K3K_MAX_RES];
    for (int j = 0; j < n_blocks; j++) vals[j] = g->d.blocks + (size_t)j * c->hidden_size;
    vals[n_blocks] = last;
    CK(k3k_attn_res(vals, n_blocks + 1, sw, c->hidden_size, c->rms_norm_eps, g->d.res_scores,
                    out, g->cs));
    return K3_OK;
}

static int kda_forward(k3_gpu *g, k3_gpu_session *s, const k3_layer *L, k3_err *err) {
    const k3_config *c = &g->m->cfg;
    const k3_kda_weights *w = &L->kda;
    scratch *d = &g->d;
    int H = c->kda_num_heads, D = c->kda_head_dim, conv = c->kda_conv_size, P = H * D;
    const k3_mat *in[6] = {&w->q_proj, &w->k_proj, &w->v_proj, &w->g_proj, &w->f_a_proj,
                           &w->b_proj};
    float *out[6] = {d->q, d->k, d->v, d->g, d->fa, d->beta};
    CK(mv_multi(g, in, out, 6, d->xn));
    CK(mv(g, &w->f_b_proj, d->fa, d->fv));
    float *hist = s->kda_conv + s->conv_floats * (size_t)L->state_slot;
    size_t per = (size_t)P * (size_t)(conv - 1);
    CK(k3k_short_conv(d->q, w->q_conv.data, hist, P, conv, g->cs));
    CK(k3k_short_conv(d->k, w->k_conv.data, hist + per, P, conv, g->cs));
    CK(k3k_short_conv(d->v, w->v_conv.data, hist + 2 * per, P, conv, g->cs));
    CK(k3k_kda_heads(d->q, d->k, d->v, d->fv, d->beta, d->g, w->A_log.data, w->dt_bias.data,
                     w->o_norm.data, s->kda_S + s->S_floats * (size_t)L->state_slot, H, D,
                     c->kda_gate_lower_bound, c->rms_norm_eps, d->o, g->cs));
    CK(mv(g, &w->o_proj, d->o, d->a));
    return K3_OK;
}

static int mla_forward(k3_gpu *g, k3_gpu_session *s, const k3_layer *L, int t, k3_err *err) {
    const k3_config *c = &g->m->cfg;
    const k3_mla_weights *w = &L->mla;
    scratch *d = &g->d;
    int H = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int vd = c->v_head_dim, lora = c->kv_lora_rank;
    const k3_mat *in[3] = {&w->q_a_proj, &w->kv_a_proj, &w->g_proj};
    float *out[3] = {d->cq, d->ckv, d->g};
    CK(mv_multi(g, in, out, 3, d->xn));
    CK(k3k_rmsnorm(d->cq, w->q_a_layernorm.data, w->q_a_layernorm.dtype, c->q_lora_rank,
                   MLA_LORA_EPS, d->cq, g->cs));
    CK(mv(g, &w->q_b_proj, d->cq, d->Q));
    CK(k3k_rmsnorm(d->ckv, w->kv_a_layernorm.data, w->kv_a_layernorm.dtype, lora, MLA_LORA_EPS,
                   d->ckv, g->cs)); /* the latent part only */
    /* this position's latent row, then attention over rows 0..t in the absorbed form */
    float *layer_lat = s->lat + (size_t)L->state_slot * s->max_ctx * s->lat_floats;
    CK(cudaMemcpyAsync(layer_lat + (size_t)t * s->lat_floats, d->ckv, s->lat_floats * 4,
                       cudaMemcpyDeviceToDevice, g->cs));
    k3k_mat kvb = km(&w->kv_b_proj);
    CK(k3k_mla_latent_attend(d->Q, &kvb, layer_lat, t, H, nope, rope, vd, lora, d->mqa, d->macc,
                             s->scores, d->o, g->cs));
    CK(k3k_sigmoid_gate(d->o, d->g, H * vd, g->cs));
    CK(mv(g, &w->o_proj, d->o, d->a));
    return K3_OK;
}

static int dense_forward(k3_gpu *g, const k3_layer *L, k3_err *err) {
    const k3_config *c = &g->m->cfg;
    scratch *d = &g->d;
    const k3_mat *in[2] = {&L->dense.gate_proj, &L->dense.up_proj};
    float *out[2] = {d->gate, d->up};
    CK(mv_multi(g, in, out, 2, d->xn));
    CK(k3k_situ(d->gate, d->up, c->intermediate_size, c->situ_beta, c->situ_linear_beta, d->gate,
                g->cs));
    CK(mv(g, &L->dense.down_proj, d->gate, d->f));
    return K3_OK;
}

/* A slot for (layer, expert) that is not used by the layer in progress (stamp < tick). */
static int victim(expert_cache *ec) {
    int best = -1;
    for (int i = 0; i < ec->n_slots; i++) {
        if (ec->key[i] < 0) return i;
        if (ec->stamp[i] < ec->tick && (best < 0 || ec->stamp[i] < ec->stamp[best])) best = i;
    }
    return best;
}

/* The kernels' slot description with every offset but no bases (n = 0). */
static k3k_experts expert_desc(const k3_gpu *g) {
    const k3_config *c = &g->m->cfg;
    const expert_cache *ec = &g->ec;
    return (k3k_experts){.inter = c->moe_intermediate_size,
                         .latent = c->routed_expert_hidden_size,
                         .off_w1p = ec->off[0], .off_w1s = ec->off[1], .off_w3p = ec->off[2],
                         .off_w3s = ec->off[3], .off_w2p = ec->off[4], .off_w2s = ec->off[5],
                         .off_flag = ec->off[6]};
}

/* Copies one expert's tensors into the staging slot and prepares them into `slot` (on the
 * expert stream; the caller synchronizes it before the store may reuse the host bytes and
 * before the next upload reuses the staging slot). */
static int upload_expert(k3_gpu *g, int slot, const k3_expert *ex, k3_err *err) {
    expert_cache *ec = &g->ec;
    uint8_t *base = ec->dev + (size_t)slot * ec->slot_bytes;
    uint8_t *stage = ec->dev + (size_t)ec->n_slots * ec->slot_bytes;
    const k3_mxfp4 *mats[3] = {&ex->w1, &ex->w3, &ex->w2};
    for (int i = 0; i < 3; i++) {
        uint64_t np = (uint64_t)mats[i]->rows * (uint64_t)mats[i]->cols / 2;
        uint64_t ns = (uint64_t)mats[i]->rows * (uint64_t)mats[i]->cols / 32;
        CK(cudaMemcpyAsync(stage + ec->off[2 * i], mats[i]->packed, np, cudaMemcpyHostToDevice, g->es));
        CK(cudaMemcpyAsync(stage + ec->off[2 * i + 1], mats[i]->scale, ns, cudaMemcpyHostToDevice, g->es));
        ec->bytes_up += np + ns;
    }
    k3k_experts d = expert_desc(g);
    CK(k3k_experts_prepare(&d, stage, base, g->es));
    return K3_OK;
}

/* Hits stay; misses get slots (LRU, never one of this layer's) and are read through the
 * store and copied up. slots[j] receives the slot of ids[j]. */
static int place_experts(k3_gpu *g, k3_state *st, int layer, const int *ids, int K, int *slots,
                         k3_err *err) {
    expert_cache *ec = &g->ec;
    int miss_ids[K3K_MAX_EXPERTS], miss_j[K3K_MAX_EXPERTS], n_miss = 0;
    ec->tick++;
    for (int j = 0; j < K; j++) {
        int key = layer * ec->n_experts + ids[j], s = ec->slot_of[key];
        if (s >= 0) {
            ec->hits++;
            ec->stamp[s] = ec->tick;
            slots[j] = s;
            continue;
        }
        ec->misses++;
        s = victim(ec);
        if (ec->key[s] >= 0) {
            ec->slot_of[ec->key[s]] = -1;
            ec->evictions++;
        }
        ec->key[s] = key;
        ec->slot_of[key] = s;
        ec->stamp[s] = ec->tick;
        slots[j] = s;
        miss_ids[n_miss] = ids[j];
        miss_j[n_miss++] = j;
    }
    if (!n_miss) return K3_OK;
    k3_store_begin(k3_state_store(st), layer, miss_ids, n_miss);
    int rc = K3_OK;
    for (int n = 0; n < n_miss && !rc; n++) {
        int i;
        k3_expert ex;
        rc = k3_store_next(k3_state_store(st), &i, &ex, err);
        if (!rc) rc = upload_expert(g, slots[miss_j[i]], &ex, err);
        cudaError_t e = cudaStreamSynchronize(g->es); /* before the store may reuse the bytes */
        if (!rc && e != cudaSuccess) rc = cuda_fail(err, e, "expert upload");
        if (!rc) k3_store_done(k3_state_store(st), i);
    }
    k3_store_end(k3_state_store(st));
    if (rc) /* forget every slot of this layer's misses: none may be trusted */
        for (int n = 0; n < n_miss; n++) {
            int s = slots[miss_j[n]];
            ec->slot_of[ec->key[s]] = -1;
            ec->key[s] = -1;
        }
    return rc;
}

static int moe_forward(k3_gpu *g, k3_state *st, const k3_layer *L, int layer, int pos,
                       const k3_trace *tr, k3_err *err) {
    const k3_config *c = &g->m->cfg;
    const k3_moe_weights *w = &L->moe;
    scratch *d = &g->d;
    int K = c->num_experts_per_token, E = c->num_experts, lat = c->routed_expert_hidden_size;
    int sh = c->moe_intermediate_size * c->num_shared_experts;
    /* The router runs on its own stream, beside the latent down-projection and the shared
     * experts (independent of the choice), which keep the GPU busy while the router's
     * choice travels to the host and the host places the routed experts. */
    k3k_mat router = km(&w->router);
    CK(cudaEventRecord(g->normed, g->cs));
    CK(cudaStreamWaitEvent(g->rs, g->normed, 0));
    CK(k3k_matvec(&router, d->xn, d->router, g->rs));
    CK(k3k_router_topk(d->router, w->router_bias.data, E, K, c->routed_scaling_factor, d->ids,
                       d->w, g->rs));
    CK(cudaMemcpyAsync(g->h_ids, d->ids, (size_t)K * 4, cudaMemcpyDeviceToHost, g->rs));
    CK(cudaMemcpyAsync(g->h_w, d->w, (size_t)K * 4, cudaMemcpyDeviceToHost, g->rs));
    CK(cudaEventRecord(g->routed, g->rs));
    const k3_mat *in[3] = {&w->down_proj, &w->shared_gate, &w->shared_up};
    float *out[3] = {d->lat, d->gate, d->up};
    CK(mv_multi(g, in, out, 3, d->xn));
    CK(k3k_situ(d->gate, d->up, sh, c->situ_beta, c->situ_linear_beta, d->gate, g->cs));
    CK(mv(g, &w->shared_down, d->gate, d->ffn_tmp));
    CK(cudaEventSynchronize(g->routed));
    for (int j = 0; j < K; j++)
        if (g->h_ids[j] < 0 || g->h_ids[j] >= E)
            return k3_fail(err, K3_ERR_DEVICE, "layer %d: the router chose no valid expert "
                           "(non-finite router scores?)", layer);
    int slots[K3K_MAX_EXPERTS];
    int rc = place_experts(g, st, layer, g->h_ids, K, slots, err);
    if (rc) return rc;
    CK(cudaStreamWaitEvent(g->cs, g->routed, 0)); /* the weights d->w */
    k3k_experts ex = expert_desc(g);
    expert_cache *ec = &g->ec;
    ex.n = K;
    for (int j = 0; j < K; j++) ex.base[j] = ec->dev + (size_t)slots[j] * ec->slot_bytes;
    CK(k3k_experts_gate_up(&ex, d->lat, c->situ_beta, c->situ_linear_beta, d->h, g->cs));
    CK(k3k_experts_down(&ex, d->h, d->eo, g->cs));
    CK(k3k_moe_sum(d->eo, d->w, K, lat, d->lat_acc, g->cs));
    CK(k3k_rmsnorm(d->lat_acc, w->norm.data, w->norm.dtype, lat, c->rms_norm_eps, d->lat_acc,
                   g->cs)); /* on the sum (spec §8.3) */
    CK(mv(g, &w->up_proj, d->lat_acc, d->f));
    CK(k3k_add(d->f, d->ffn_tmp, d->f, c->hidden_size, g->cs)); /* routed term first */
    if (tr && tr->on_routing) tr->on_routing(tr->user, pos, layer, g->h_ids, g->h_w, K);
    return K3_OK;
}

/* Streamed layer i of stream_order into staging[i % 2], after that slot's last user. */
static int enqueue_upload(k3_gpu *g, int i, k3_err *err) {
    gpu_layer *gl = &g->layers[g->stream_order[i]];
    CK(cudaStreamWaitEvent(g->us, g->freed[gl->slot], 0));
    CK(cudaMemcpyAsync(g->staging[gl->slot], gl->host, gl->bytes, cudaMemcpyHostToDevice, g->us));
    CK(cudaEventRecord(g->ready[gl->slot], g->us));
    return K3_OK;
}

static int layer_forward(k3_gpu *g, k3_gpu_session *s, k3_state *st, int l, int *n_blocks,
                         const k3_trace *tr, k3_err *err) {
    const k3_config *c = &g->m->cfg;
    const gpu_layer *gl = &g->layers[l];
    const k3_layer *L = &gl->w;
    scratch *d = &g->d;
    int hd = c->hidden_size, pos = k3_state_pos(st), rc;
    size_t vec = (size_t)hd * 4;
    if (!gl->resident) CK(cudaStreamWaitEvent(g->cs, g->ready[gl->slot], 0));
    if (*n_blocks > 0) {
        if ((rc = mix(g, *n_blocks, d->P, L->attn_res_sw, d->x, err))) return rc;
    } else {
        CK(cudaMemcpyAsync(d->x, d->P, vec, cudaMemcpyDeviceToDevice, g->cs));
    }
    if ((rc = trace_vec(g, tr, pos, l, K3_TRACE_ATTN_IN, d->x, err))) return rc;
    int fresh = l % c->attn_res_block_size == 0;
    if (fresh)
        CK(cudaMemcpyAsync(d->blocks + (size_t)(*n_blocks)++ * hd, d->P, vec,
                           cudaMemcpyDeviceToDevice, g->cs));
    CK(k3k_rmsnorm(d->x, L->input_layernorm.data, L->input_layernorm.dtype, hd, c->rms_norm_eps,
                   d->xn, g->cs));
    rc = L->is_mla ? mla_forward(g, s, L, pos, err) : kda_forward(g, s, L, err);
    if (rc || (rc = trace_vec(g, tr, pos, l, K3_TRACE_ATTN_OUT, d->a, err))) return rc;
    if (fresh) /* the first contribution after a reset is a copy, not 0 + a */
        CK(cudaMemcpyAsync(d->P, d->a, vec, cudaMemcpyDeviceToDevice, g->cs));
    else
        CK(k3k_add(d->P, d->a, d->P, hd, g->cs));
    if ((rc = mix(g, *n_blocks, d->P, L->mlp_res_sw, d->x, err))) return rc;
    if ((rc = trace_vec(g, tr, pos, l, K3_TRACE_MLP_IN, d->x, err))) return rc;
    CK(k3k_rmsnorm(d->x, L->post_attention_layernorm.data, L->post_attention_layernorm.dtype, hd,
                   c->rms_norm_eps, d->xn, g->cs));
    rc = L->is_moe ? moe_forward(g, st, L, l, pos, tr, err) : dense_forward(g, L, err);
    if (rc || (rc = trace_vec(g, tr, pos, l, K3_TRACE_MLP_OUT, d->f, err))) return rc;
    CK(k3k_add(d->P, d->f, d->P, hd, g->cs));
    if ((rc = trace_vec(g, tr, pos, l, K3_TRACE_PARTIAL_SUM, d->P, err))) return rc;
    if (!gl->resident) CK(cudaEventRecord(g->freed[gl->slot], g->cs));
    return K3_OK;
}

static int step_locked(k3_gpu_session *s, k3_state *st, int32_t token, float *logits,
                       const k3_trace *tr, double *head_s, k3_err *err) {
    k3_gpu *g = s->g;
    const k3_model *m = g->m;
    const k3_config *c = &m->cfg;
    int hd = c->hidden_size, L = c->num_hidden_layers, rc, n_blocks = 0, next_stream = 0;
    CK(cudaSetDevice(0));
    for (int i = 0; i < hd; i++) /* the embedding row, widened exactly on the host */
        g->h_embed[i] = k3_mat_at(&m->embed, (int64_t)token * hd + i);
    CK(cudaMemcpyAsync(g->d.P, g->h_embed, (size_t)hd * 4, cudaMemcpyHostToDevice, g->cs));
    for (; next_stream < 2 && next_stream < g->n_streamed; next_stream++)
        if ((rc = enqueue_upload(g, next_stream, err))) return rc;
    for (int l = 0; l < L; l++) {
        if (g->profile) CK(cudaEventRecord(g->ev[l], g->cs));
        if ((rc = layer_forward(g, s, st, l, &n_blocks, tr, err))) return rc;
        if (!g->layers[l].resident && next_stream < g->n_streamed)
            if ((rc = enqueue_upload(g, next_stream++, err))) return rc;
    }
    if (g->profile) CK(cudaEventRecord(g->ev[L], g->cs));
    if ((rc = mix(g, n_blocks, g->d.P, g->out_res_sw, g->d.x, err))) return rc;
    if ((rc = trace_vec(g, tr, k3_state_pos(st), -1, K3_TRACE_FINAL_HIDDEN, g->d.x, err))) return rc;
    CK(k3k_rmsnorm(g->d.x, g->norm.data, g->norm.dtype, hd, c->rms_norm_eps, g->d.xn, g->cs));
    if ((rc = trace_vec(g, tr, k3_state_pos(st), -1, K3_TRACE_FINAL_NORMED, g->d.xn, err))) return rc;
    double t_head = k3_now_s();
    if (logits) {
        CK(mv(g, &g->lm_head, g->d.xn, g->d.logits));
        CK(cudaMemcpyAsync(logits, g->d.logits, (size_t)c->vocab_size * 4, cudaMemcpyDeviceToHost,
                           g->cs));
    }
    if (g->profile) CK(cudaEventRecord(g->ev[L + 1], g->cs));
    CK(cudaStreamSynchronize(g->cs));
    *head_s = k3_now_s() - t_head;
    if (g->profile) {
        for (int l = 0; l <= L; l++) {
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, g->ev[l], g->ev[l + 1]));
            g->layer_ms_sum[l] += ms;
        }
        g->profiled_steps++;
    }
    return K3_OK;
}

int k3_gpu_step(k3_gpu_session *s, k3_state *st, int32_t token, float *logits,
                const k3_trace *tr, k3_err *err) {
    double t0 = k3_now_s();
    k3_phase_times t = {.tokens = 1};
    pthread_mutex_lock(&s->g->mu);
    int rc = step_locked(s, st, token, logits, tr, &t.head_s, err);
    pthread_mutex_unlock(&s->g->mu);
    if (rc) return rc;
    t.total_s = k3_now_s() - t0;
    k3_state_advance(st, &t);
    return K3_OK;
}

int k3_gpu_layer_profile(const k3_gpu *g, double *ms, uint64_t *bytes, int layers) {
    const k3_config *c = &g->m->cfg;
    int L = c->num_hidden_layers;
    if (!g->profile || !g->profiled_steps) return 0;
    for (int l = 0; l <= layers && l <= L; l++) {
        ms[l] = g->layer_ms_sum[l] / g->profiled_steps;
        if (!bytes) continue;
        if (l == L) {
            bytes[l] = g->head_bytes;
        } else {
            bytes[l] = g->layers[l].bytes;
            if (g->layers[l].w.is_moe) bytes[l] += (uint64_t)c->num_experts_per_token * g->ec.slot_bytes;
        }
    }
    return g->profiled_steps;
}

void k3_gpu_get_stats(const k3_gpu *g, k3_gpu_stats *out) {
    *out = (k3_gpu_stats){.expert_hits = g->ec.hits, .expert_misses = g->ec.misses,
                          .evictions = g->ec.evictions, .bytes_uploaded = g->ec.bytes_up,
                          .n_slots = g->ec.n_slots, .streamed_layers = g->n_streamed,
                          .resident_layers = g->m->cfg.num_hidden_layers - g->n_streamed};
}
