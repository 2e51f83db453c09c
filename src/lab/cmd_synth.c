/* cmd_synth.c — `k3-lab synth`: writes a synthetic snapshot in the exact K3 layout (config.json,
 * model.safetensors.index.json, shards, tokenizer files) with random weights, for tests and
 * benchmarks of the expert store at real expert sizes on a small machine. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../cli/model_dir.h"
#include "../util/err.h"
#include "../util/fileio.h"
#include "../cli/opts.h"
#include "lab.h"

typedef struct synth_opts {
    const char *out;
    int layers, experts, top_k, hidden, vocab, inter, moe_inter, latent, shared;
    int kda_heads, kda_head_dim, kda_rank, mla_heads, q_rank, kv_rank, nope, rope, v_dim;
    int expert_shards; /* shards the experts of one layer are spread over */
    bool scatter;      /* break the six-tensors-back-to-back layout (per-tensor fallback) */
    bool sparse;       /* headers only: the data are holes (reads give zeros), for k3 plan */
    bool real, real_experts; /* K3's widths everywhere / K3's expert dims (unset fields) */
    uint64_t seed;
} synth_opts;

#define SYN(f) K3_OPT_CMD(synth_opts, f), .field = #f
#define SYN_INT(flag_, f, lo_, text) \
    {.flag = flag_, SYN(f), .type = K3_OPT_INT, .lo = lo_, .hi = 1 << 30, .meta = "N", .help = text}
static const k3_opt synth_rows[] = {
    SYN_INT("--layers", layers, 2, "layers (default 4)"),
    SYN_INT("--experts", experts, 1, "routed experts per MoE layer (default 8)"),
    SYN_INT("--top-k", top_k, 1, "experts per token (default min(4, experts))"),
    SYN_INT("--hidden", hidden, 32, "hidden size (default 64)"),
    SYN_INT("--vocab", vocab, 2048, "vocabulary, >= 2048 (default 2048)"),
    SYN_INT("--moe-inter", moe_inter, 32, "routed expert intermediate size (default 32)"),
    SYN_INT("--latent", latent, 32, "routed expert (latent) width (default 32)"),
    {.flag = "--real-experts", SYN(real_experts), .type = K3_OPT_SWITCH, .value = 1,
     .help = "K3's expert dims: moe-inter 3072, latent 3584 (17,547,264 B each)"},
    {.flag = "--real", SYN(real), .type = K3_OPT_SWITCH, .value = 1,
     .help = "K3's widths everywhere (hidden 7168, heads, ranks, experts), with the\n"
             "layer/expert/vocab counts given"},
    SYN_INT("--expert-shards", expert_shards, 1,
            "spread each layer's experts over N shards (default 1)"),
    {.flag = "--scatter", SYN(scatter), .type = K3_OPT_SWITCH, .value = 1,
     .help = "interleave the experts' tensors (not back to back): exercises the store's\n"
             "per-tensor fallback"},
    {.flag = "--seed", SYN(seed), .type = K3_OPT_U64, .def = "1", .meta = "N",
     .help = "random seed"},
    {.flag = "--sparse", SYN(sparse), .type = K3_OPT_SWITCH, .value = 1,
     .help = "write each shard's header and leave its data a hole (a sparse file: no\n"
             "disk, zeros when read): a full-size K3 snapshot for k3 plan, which reads\n"
             "headers only"},
};

static const k3_cli_command synth_cmd = {
    .name = "synth", .prog = "k3-lab",
    .usage =
        "usage: k3-lab synth OUT_DIR [options]\n"
        "\n"
        "Writes a synthetic Kimi K3 snapshot with random weights in the exact checkpoint layout\n"
        "(spec §10: names, dtypes, shapes, MXFP4 experts whose six tensors lie back to back,\n"
        "experts in lexicographic name order). Layer 0 is dense, layers l with (l+1) % 4 == 0\n"
        "and the last are MLA, the rest KDA. The tokenizer is the bundled fixture's.\n",
    .rows = synth_rows, .n_rows = sizeof synth_rows / sizeof *synth_rows,
    .max_positional = 1,
};

/* ---- random weights ---------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

enum kind { K_BF16, K_NORM, K_F32, K_NORMF, K_ALOG, K_PACKED, K_SCALE };

typedef struct tensor_spec {
    char name[160];
    int kind, ndim, shard;
    int64_t shape[3];
    uint64_t nbytes, offset; /* offset within the shard's data section */
} tensor_spec;

typedef struct tlist {
    tensor_spec *t;
    size_t n, cap;
} tlist;

static const char *dtype_of(int kind) {
    return kind == K_BF16 || kind == K_NORM ? "BF16" : kind >= K_PACKED ? "U8" : "F32";
}

static int add(tlist *l, int shard, int kind, const char *name, int ndim, int64_t d0, int64_t d1,
               int64_t d2) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        tensor_spec *nt = realloc(l->t, l->cap * sizeof *nt);
        if (!nt) return -1;
        l->t = nt;
    }
    tensor_spec *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind, t->ndim = ndim, t->shard = shard;
    t->shape[0] = d0, t->shape[1] = d1, t->shape[2] = d2;
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (uint64_t)t->shape[i];
    t->nbytes = n * (kind == K_BF16 || kind == K_NORM ? 2 : kind >= K_PACKED ? 1 : 4);
    return 0;
}

/* Fills buf with n bytes of a tensor: BF16 uniform in ±1/sqrt(cols), norms near 1, small F32,
 * MXFP4 codes uniform and E8M0 scales 2^-7..2^-5 so activations stay finite. */
static void fill(const tensor_spec *t, uint8_t *buf, size_t n, uint64_t *rng) {
    int64_t cols = t->ndim >= 2 ? t->shape[t->ndim - 1] : t->shape[0];
    float amp = 1.0f / sqrtf((float)(cols > 0 ? cols : 1));
    for (size_t i = 0; i < n;) {
        uint64_t r = rng_next(rng);
        if (t->kind == K_PACKED) {
            size_t k = n - i < 8 ? n - i : 8;
            memcpy(buf + i, &r, k);
            i += k;
        } else if (t->kind == K_SCALE) {
            buf[i++] = (uint8_t)(120 + r % 3);
        } else if (t->kind == K_BF16 || t->kind == K_NORM) {
            float u = (float)(r >> 40) / (float)(1 << 24) * 2 - 1;
            float v = t->kind == K_NORM ? 1.0f + 0.1f * u : amp * u;
            uint32_t bits;
            memcpy(&bits, &v, 4);
            uint16_t h = (uint16_t)(bits >> 16);
            memcpy(buf + i, &h, 2);
            i += 2;
        } else {
            float u = (float)(r >> 40) / (float)(1 << 24) * 2 - 1;
            float v = t->kind == K_ALOG ? 0.5f * u : t->kind == K_NORMF ? 1.0f + 0.1f * u : 0.1f * u;
            memcpy(buf + i, &v, 4);
            i += 4;
        }
    }
}

/* ---- the tensor inventory (spec §10.3) ------------------------------------------------ */

#define PFX "language_model.model.layers.%d."

static int add_layer_spine(tlist *l, const synth_opts *o, int layer, int is_mla, int shard) {
    char n[160];
    int64_t H = o->hidden, P = (int64_t)o->kda_heads * o->kda_head_dim;
    int rc = 0;
#define T(kind, nd, d0, d1, d2, fmt) \
    (snprintf(n, sizeof n, PFX fmt, layer), rc |= add(l, shard, kind, n, nd, d0, d1, d2))
    T(K_NORM, 1, H, 0, 0, "input_layernorm.weight");
    T(K_NORM, 1, H, 0, 0, "post_attention_layernorm.weight");
    T(K_NORM, 1, H, 0, 0, "self_attention_res_norm.weight");
    T(K_BF16, 2, 1, H, 0, "self_attention_res_proj.weight");
    T(K_NORM, 1, H, 0, 0, "mlp_res_norm.weight");
    T(K_BF16, 2, 1, H, 0, "mlp_res_proj.weight");
    if (is_mla) {
        int64_t h = o->mla_heads;
        T(K_BF16, 2, o->q_rank, H, 0, "self_attn.q_a_proj.weight");
        T(K_NORM, 1, o->q_rank, 0, 0, "self_attn.q_a_layernorm.weight");
        T(K_BF16, 2, h * (o->nope + o->rope), o->q_rank, 0, "self_attn.q_b_proj.weight");
        T(K_BF16, 2, o->kv_rank + o->rope, H, 0, "self_attn.kv_a_proj_with_mqa.weight");
        T(K_NORM, 1, o->kv_rank, 0, 0, "self_attn.kv_a_layernorm.weight");
        T(K_BF16, 2, h * (o->nope + o->v_dim), o->kv_rank, 0, "self_attn.kv_b_proj.weight");
        T(K_BF16, 2, h * o->v_dim, H, 0, "self_attn.g_proj.weight");
        T(K_BF16, 2, H, h * o->v_dim, 0, "self_attn.o_proj.weight");
    } else {
        T(K_BF16, 2, P, H, 0, "self_attn.q_proj.weight");
        T(K_BF16, 2, P, H, 0, "self_attn.k_proj.weight");
        T(K_BF16, 2, P, H, 0, "self_attn.v_proj.weight");
        T(K_BF16, 2, P, H, 0, "self_attn.g_proj.weight");
        T(K_BF16, 2, H, P, 0, "self_attn.o_proj.weight");
        T(K_BF16, 2, o->kda_rank, H, 0, "self_attn.f_a_proj.weight");
        T(K_BF16, 2, P, o->kda_rank, 0, "self_attn.f_b_proj.weight");
        T(K_BF16, 2, o->kda_heads, H, 0, "self_attn.b_proj.weight");
        T(K_F32, 3, P, 1, 4, "self_attn.q_conv1d.weight");
        T(K_F32, 3, P, 1, 4, "self_attn.k_conv1d.weight");
        T(K_F32, 3, P, 1, 4, "self_attn.v_conv1d.weight");
        T(K_ALOG, 1, o->kda_heads, 0, 0, "self_attn.A_log");
        T(K_F32, 1, P, 0, 0, "self_attn.dt_bias");
        T(K_NORMF, 1, o->kda_head_dim, 0, 0, "self_attn.o_norm.weight");
    }
    if (layer == 0) {
        T(K_BF16, 2, o->inter, H, 0, "mlp.gate_proj.weight");
        T(K_BF16, 2, o->inter, H, 0, "mlp.up_proj.weight");
        T(K_BF16, 2, H, o->inter, 0, "mlp.down_proj.weight");
    } else {
        int64_t sh = (int64_t)o->moe_inter * o->shared, lat = o->latent;
        T(K_BF16, 2, o->experts, H, 0, "block_sparse_moe.gate.weight");
        T(K_F32, 1, o->experts, 0, 0, "block_sparse_moe.gate.e_score_correction_bias");
        T(K_BF16, 2, lat, H, 0, "block_sparse_moe.routed_expert_down_proj.weight");
        T(K_BF16, 2, H, lat, 0, "block_sparse_moe.routed_expert_up_proj.weight");
        T(K_NORM, 1, lat, 0, 0, "block_sparse_moe.routed_expert_norm.weight");
        T(K_BF16, 2, sh, H, 0, "block_sparse_moe.shared_experts.gate_proj.weight");
        T(K_BF16, 2, sh, H, 0, "block_sparse_moe.shared_experts.up_proj.weight");
        T(K_BF16, 2, H, sh, 0, "block_sparse_moe.shared_experts.down_proj.weight");
    }
#undef T
    return rc;
}

static int by_decimal_string(const void *a, const void *b) {
    char x[16], y[16];
    snprintf(x, sizeof x, "%d", *(const int *)a);
    snprintf(y, sizeof y, "%d", *(const int *)b);
    return strcmp(x, y);
}

/* The experts of one layer in lexicographic name order (0, 1, 10, 100, ...) as in the real
 * checkpoint, each one's six tensors back to back (or, with --scatter, part by part). */
static int add_layer_experts(tlist *l, const synth_opts *o, int layer, int first_shard) {
    static const char *part[6] = {"w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
                                  "w2.weight_scale",  "w3.weight_packed", "w3.weight_scale"};
    int64_t I = o->moe_inter, lat = o->latent;
    int64_t rows[6] = {I, I, lat, lat, I, I};
    int64_t cols[6] = {lat / 2, lat / 32, I / 2, I / 32, lat / 2, lat / 32};
    int *ids = malloc((size_t)o->experts * sizeof *ids);
    if (!ids) return -1;
    for (int e = 0; e < o->experts; e++) ids[e] = e;
    qsort(ids, (size_t)o->experts, sizeof *ids, by_decimal_string);
    int rc = 0, per = (o->experts + o->expert_shards - 1) / o->expert_shards;
    for (int outer = 0; outer < (o->scatter ? 6 : o->experts); outer++)
        for (int inner = 0; inner < (o->scatter ? o->experts : 6); inner++) {
            int i = o->scatter ? inner : outer, p = o->scatter ? outer : inner;
            char n[160];
            snprintf(n, sizeof n, PFX "block_sparse_moe.experts.%d.%s", layer, ids[i], part[p]);
            rc |= add(l, first_shard + i / per, p % 2 ? K_SCALE : K_PACKED, n, 2, rows[p],
                      cols[p], 0);
        }
    free(ids);
    return rc;
}

static int build_inventory(const synth_opts *o, tlist *l, int *n_shards) {
    int rc = 0, shard = 1;
    char n[160];
    int64_t V = o->vocab, H = o->hidden;
    for (int layer = 0; layer < o->layers && !rc; layer++) {
        int is_mla = (layer + 1) % 4 == 0 || layer == o->layers - 1;
        int s = layer == 0 ? 0 : shard;
        rc |= add_layer_spine(l, o, layer, is_mla, s);
        if (layer > 0) {
            rc |= add_layer_experts(l, o, layer, s);
            shard += o->expert_shards;
        }
    }
#define M(kind, nd, d0, d1, name) \
    (snprintf(n, sizeof n, "language_model.%s", name), rc |= add(l, 0, kind, n, nd, d0, d1, 0))
    M(K_BF16, 2, V, H, "model.embed_tokens.weight");
    M(K_NORM, 1, H, 0, "model.norm.weight");
    M(K_NORM, 1, H, 0, "model.output_attn_res_norm.weight");
    M(K_BF16, 2, 1, H, "model.output_attn_res_proj.weight");
    M(K_BF16, 2, V, H, "lm_head.weight");
#undef M
    *n_shards = shard;
    return rc;
}

/* ---- writing ---------------------------------------------------------------------------- */

static void shard_name(char *buf, size_t cap, int i, int n) {
    snprintf(buf, cap, "model-%05d-of-%06d.safetensors", i + 1, n);
}

/* Header JSON of shard s (offsets relative to the data section), padded to 8 bytes. */
static char *shard_header(const tlist *l, int s) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    for (size_t i = 0; i < l->n; i++) {
        const tensor_spec *t = &l->t[i];
        if (t->shard != s) continue;
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON_AddStringToObject(e, "dtype", dtype_of(t->kind));
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *off = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)t->offset));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(t->offset + t->nbytes)));
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return NULL;
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    char *out = realloc(json, padded + 1);
    if (!out) { free(json); return NULL; }
    memset(out + n, ' ', padded - n);
    out[padded] = 0;
    return out;
}

static int write_shard(const synth_opts *o, const tlist *l, int s, int n_shards, uint8_t *buf,
                       size_t buf_bytes, uint64_t *rng, k3_err *err) {
    char name[64], path[4096];
    shard_name(name, sizeof name, s, n_shards);
    k3_path_join(path, sizeof path, o->out, name);
    char *hdr = shard_header(l, s);
    if (!hdr) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return k3_fail(err, K3_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    uint64_t hn = strlen(hdr);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(hn >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, hn, f) == hn;
    free(hdr);
    uint64_t data = 0;
    for (size_t i = 0; o->sparse && i < l->n; i++)
        if (l->t[i].shard == s) data += l->t[i].nbytes;
    if (o->sparse && ok) { /* a hole up to the end: the file has its full size */
        ok = fflush(f) == 0 && ftruncate(fileno(f), (off_t)(8 + hn + data)) == 0;
        if (fclose(f) != 0 || !ok)
            return k3_fail(err, K3_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        return K3_OK;
    }
    for (size_t i = 0; ok && i < l->n; i++) { /* list order within a shard = offset order */
        const tensor_spec *t = &l->t[i];
        if (t->shard != s) continue;
        for (uint64_t done = 0; ok && done < t->nbytes;) {
            size_t n = t->nbytes - done < buf_bytes ? (size_t)(t->nbytes - done) : buf_bytes;
            fill(t, buf, n, rng);
            ok = fwrite(buf, 1, n, f) == n;
            done += n;
        }
    }
    if (fclose(f) != 0 || !ok) return k3_fail(err, K3_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return K3_OK;
}

static int write_json(const char *dir, const char *name, cJSON *root, k3_err *err) {
    char path[4096];
    k3_path_join(path, sizeof path, dir, name);
    char *s = cJSON_Print(root);
    FILE *f = s ? fopen(path, "w") : NULL;
    int ok = f && fputs(s, f) >= 0;
    if (f && fclose(f) != 0) ok = 0;
    free(s);
    return ok ? K3_OK : k3_fail(err, K3_ERR_IO, "%s: cannot write", path);
}

static int write_index(const synth_opts *o, const tlist *l, int n_shards, k3_err *err) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON *wm = cJSON_AddObjectToObject(root, "weight_map");
    uint64_t total = 0;
    for (size_t i = 0; i < l->n; i++) {
        char name[64];
        shard_name(name, sizeof name, l->t[i].shard, n_shards);
        cJSON_AddStringToObject(wm, l->t[i].name, name);
        total += l->t[i].nbytes;
    }
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    int rc = write_json(o->out, "model.safetensors.index.json", root, err);
    cJSON_Delete(root);
    return rc;
}

static void set_int(cJSON *obj, const char *key, int v) {
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    cJSON_AddNumberToObject(obj, key, v);
}

/* config.json from the bundled fixture's, with this model's dimensions. */
static int write_config(const synth_opts *o, const char *tmpl_dir, k3_err *err) {
    char path[4096], *json = NULL;
    k3_path_join(path, sizeof path, tmpl_dir, "config.json");
    int rc = k3_read_file(path, 1 << 20, &json, NULL, err);
    if (rc) return rc;
    cJSON *root = cJSON_Parse(json);
    free(json);
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    cJSON *lac = cJSON_GetObjectItemCaseSensitive(tc, "linear_attn_config");
    if (!lac) {
        cJSON_Delete(root);
        return k3_fail(err, K3_ERR_CONFIG, "%s: not a K3 config (no linear_attn_config)", path);
    }
    const struct { const char *k; int v; } f[] = {
        {"vocab_size", o->vocab}, {"hidden_size", o->hidden}, {"intermediate_size", o->inter},
        {"num_hidden_layers", o->layers}, {"num_attention_heads", o->mla_heads},
        {"num_key_value_heads", o->mla_heads}, {"q_lora_rank", o->q_rank},
        {"kv_lora_rank", o->kv_rank}, {"qk_nope_head_dim", o->nope},
        {"qk_rope_head_dim", o->rope}, {"v_head_dim", o->v_dim}, {"num_experts", o->experts},
        {"num_experts_per_token", o->top_k}, {"num_shared_experts", o->shared},
        {"moe_intermediate_size", o->moe_inter}, {"routed_expert_hidden_size", o->latent},
        {"first_k_dense_replace", 1},
        {"attn_res_block_size", 4}}; /* k3-nano's, whatever the bundled template model has */
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) set_int(tc, f[i].k, f[i].v);
    set_int(root, "vocab_size", o->vocab);
    set_int(cJSON_GetObjectItemCaseSensitive(root, "vision_config"), "text_hidden_size", o->hidden);
    set_int(lac, "num_heads", o->kda_heads);
    set_int(lac, "head_dim", o->kda_head_dim);
    cJSON *full = cJSON_CreateArray(), *kda = cJSON_CreateArray();
    for (int l = 0; l < o->layers; l++) {
        int is_mla = (l + 1) % 4 == 0 || l == o->layers - 1;
        cJSON_AddItemToArray(is_mla ? full : kda, cJSON_CreateNumber(l + 1));
    }
    cJSON_ReplaceItemInObjectCaseSensitive(lac, "full_attn_layers", full);
    cJSON_ReplaceItemInObjectCaseSensitive(lac, "kda_layers", kda);
    rc = write_json(o->out, "config.json", root, err);
    cJSON_Delete(root);
    return rc;
}

static int copy_file(const char *from_dir, const char *to_dir, const char *name, k3_err *err) {
    char src[4096], dst[4096], *data = NULL;
    size_t n = 0;
    k3_path_join(src, sizeof src, from_dir, name);
    k3_path_join(dst, sizeof dst, to_dir, name);
    int rc = k3_read_file(src, 64 << 20, &data, &n, err);
    if (rc) return rc;
    FILE *f = fopen(dst, "wb");
    int ok = f && fwrite(data, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    free(data);
    return ok ? K3_OK : k3_fail(err, K3_ERR_IO, "%s: cannot write", dst);
}

/* ---- options ---------------------------------------------------------------------------- */

/* Unset fields (0) take K3's real widths with --real, K3's expert dims with --real-experts,
 * else small fixture-like values. */
static void apply_defaults(synth_opts *o) {
    bool real = o->real, real_experts = o->real_experts;
#define D(f, small, big) if (!o->f) o->f = real ? (big) : (small)
    D(hidden, 64, 7168); D(inter, 96, 33792); D(shared, 2, 2);
    D(kda_heads, 4, 96); D(kda_head_dim, 16, 128); D(kda_rank, 16, 128);
    D(mla_heads, 4, 96); D(q_rank, 32, 1536); D(kv_rank, 16, 512);
    D(nope, 16, 128); D(rope, 8, 64); D(v_dim, 16, 128);
    D(moe_inter, real_experts ? 3072 : 32, 3072); D(latent, real_experts ? 3584 : 32, 3584);
#undef D
    if (!o->layers) o->layers = 4;
    if (!o->experts) o->experts = 8;
    if (!o->top_k) o->top_k = o->experts < 4 ? o->experts : 4;
    if (!o->vocab) o->vocab = 2048;
    if (!o->expert_shards) o->expert_shards = 1;
}

static int parse_args(int argc, char **argv, synth_opts *o) {
    *o = (synth_opts){0};
    k3_opts_parsed parsed;
    k3_opt_targets t = {.cmd = o};
    int rc = k3_opts_parse(&synth_cmd, argc, argv, &t, &parsed);
    if (rc) return rc;
    if (!parsed.n_positional) return k3_opts_usage_error(&synth_cmd, "give the output folder");
    o->out = parsed.positional[0];
    o->seed |= 1; /* xorshift needs a non-zero state */
    apply_defaults(o);
    if (o->top_k > o->experts || o->latent % 32 || o->moe_inter % 32 || o->hidden % 32) {
        return k3_opts_usage_error(&synth_cmd, "need top-k <= experts and latent, moe-inter, "
                                   "hidden multiples of 32");
    }
    return 0;
}

/* ---- main ------------------------------------------------------------------------------- */

static int synth(const synth_opts *o, k3_err *err) {
    tlist l = {0};
    int n_shards = 0, rc = 0;
    if (build_inventory(o, &l, &n_shards)) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    uint64_t *cursor = rc ? NULL : calloc((size_t)n_shards, sizeof *cursor), total = 0;
    for (size_t i = 0; cursor && i < l.n; i++) {
        l.t[i].offset = cursor[l.t[i].shard];
        cursor[l.t[i].shard] += l.t[i].nbytes;
        total += l.t[i].nbytes;
    }
    size_t buf_bytes = 4 << 20;
    uint8_t *buf = malloc(buf_bytes);
    if (!rc && (!cursor || !buf)) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    if (!rc && mkdir(o->out, 0755) != 0 && errno != EEXIST)
        rc = k3_fail(err, K3_ERR_IO, "%s: cannot create: %s", o->out, strerror(errno));
    const char *tmpl = k3_default_model_dir();
    if (!rc) rc = write_config(o, tmpl, err);
    if (!rc) rc = copy_file(tmpl, o->out, "tiktoken.model", err);
    if (!rc) rc = copy_file(tmpl, o->out, "tokenizer_config.json", err);
    if (!rc) rc = copy_file(tmpl, o->out, "generation_config.json", err);
    if (!rc) rc = write_index(o, &l, n_shards, err);
    uint64_t rng = o->seed;
    for (int s = 0; !rc && s < n_shards; s++)
        rc = write_shard(o, &l, s, n_shards, buf, buf_bytes, &rng, err);
    if (!rc) {
        uint64_t one = (uint64_t)o->moe_inter * o->latent / 2 * 3 +
                       (uint64_t)o->moe_inter * o->latent / 32 * 3;
        printf("k3-lab synth: wrote %s: %d layers, hidden %d, %d experts x %d MoE layers (top-%d) "
               "of %llu bytes, %.3f GB in %d shards%s\n", o->out, o->layers, o->hidden,
               o->experts, o->layers - 1, o->top_k, (unsigned long long)one, (double)total / 1e9,
               n_shards, o->scatter ? " (expert tensors scattered)"
                         : o->sparse ? " (sparse: headers only, the data are holes)" : "");
    }
    free(buf);
    free(cursor);
    free(l.t);
    return rc;
}

int k3_cmd_synth(int argc, char **argv) {
    synth_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    k3_err err = {0};
    rc = synth(&o, &err);
    if (rc) fprintf(stderr, "k3-lab synth: %s\n", err.msg);
    return rc;
}
