/* config.c — config.json reader (spec §1.2). Refuses, never guesses: all problems found are
 * collected into one message. */
#include "config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../util/fileio.h"

typedef struct problems {
    char text[900];
    int n;
} problems;

static void note(problems *p, const char *fmt, const char *field) {
    p->n++;
    size_t len = strlen(p->text);
    if (len + 80 >= sizeof p->text) return;
    if (len) snprintf(p->text + len, sizeof p->text - len, "; ");
    len = strlen(p->text);
    snprintf(p->text + len, sizeof p->text - len, fmt, field);
}

static const cJSON *obj(const cJSON *o, const char *k, problems *p) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsObject(v)) {
        note(p, "missing object \"%s\"", k);
        return NULL;
    }
    return v;
}

static int get_int(const cJSON *o, const char *k, problems *p) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    if (!o) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble > 1e9) {
        note(p, v ? "\"%s\" is not a non-negative integer" : "missing \"%s\"", k);
        return 0;
    }
    return (int)v->valuedouble;
}

static float get_float(const cJSON *o, const char *k, problems *p) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    if (!o) return 0;
    if (!cJSON_IsNumber(v)) {
        note(p, v ? "\"%s\" is not a number" : "missing \"%s\"", k);
        return 0;
    }
    return (float)v->valuedouble;
}

static void expect_str(const cJSON *o, const char *k, const char *want, problems *p) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    if (!o) return;
    if (!cJSON_IsString(v)) note(p, "missing string \"%s\"", k);
    else if (strcmp(v->valuestring, want) != 0) note(p, "\"%s\" has a value k3 does not support", k);
}

static void expect_bool(const cJSON *o, const char *k, int want, problems *p) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    if (!o) return;
    if (!cJSON_IsBool(v)) note(p, "missing boolean \"%s\"", k);
    else if (cJSON_IsTrue(v) != want) note(p, "\"%s\" has a value k3 does not support", k);
}

/* Marks the one-based layers listed in linear_attn_config[key] into out[] (zero-based). */
static void layer_list(const cJSON *lac, const char *key, int n_layers, bool *out, problems *p) {
    const cJSON *v = lac ? cJSON_GetObjectItemCaseSensitive(lac, key) : NULL;
    if (!lac) return;
    if (!cJSON_IsArray(v)) {
        note(p, "missing array linear_attn_config.\"%s\"", key);
        return;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        /* range-checked on the double: converting 1e30 to int is undefined behaviour */
        double d = cJSON_IsNumber(e) ? e->valuedouble : 0;
        int l = d == floor(d) && d >= 1 && d <= n_layers ? (int)d : 0;
        if (l < 1) {
            note(p, "linear_attn_config.\"%s\" has a layer outside 1..num_hidden_layers", key);
            return;
        }
        if (out[l - 1]) note(p, "linear_attn_config.\"%s\" repeats a layer", key);
        out[l - 1] = true;
    }
}

static void read_text(const cJSON *tc, k3_config *c, problems *p) {
    expect_str(tc, "hidden_act", "situ", p);
    c->vocab_size = get_int(tc, "vocab_size", p);
    c->hidden_size = get_int(tc, "hidden_size", p);
    c->intermediate_size = get_int(tc, "intermediate_size", p);
    c->num_hidden_layers = get_int(tc, "num_hidden_layers", p);
    c->num_attention_heads = get_int(tc, "num_attention_heads", p);
    c->rms_norm_eps = get_float(tc, "rms_norm_eps", p);
    c->situ_beta = get_float(tc, "activation_situ_beta", p);
    c->situ_linear_beta = get_float(tc, "activation_situ_linear_beta", p);
    c->max_position_embeddings = get_int(tc, "max_position_embeddings", p);
    c->attn_res_block_size = get_int(tc, "attn_res_block_size", p);
    c->bos_token_id = get_int(tc, "bos_token_id", p);
    c->eos_token_id = get_int(tc, "eos_token_id", p);
    c->pad_token_id = get_int(tc, "pad_token_id", p);
    c->q_lora_rank = get_int(tc, "q_lora_rank", p);
    c->kv_lora_rank = get_int(tc, "kv_lora_rank", p);
    c->qk_nope_head_dim = get_int(tc, "qk_nope_head_dim", p);
    c->qk_rope_head_dim = get_int(tc, "qk_rope_head_dim", p);
    c->v_head_dim = get_int(tc, "v_head_dim", p);
    expect_bool(tc, "mla_use_nope", 1, p);
    expect_bool(tc, "mla_use_output_gate", 1, p);
    expect_bool(tc, "tie_word_embeddings", 0, p);
    c->num_experts = get_int(tc, "num_experts", p);
    c->num_experts_per_token = get_int(tc, "num_experts_per_token", p);
    c->num_shared_experts = get_int(tc, "num_shared_experts", p);
    c->moe_intermediate_size = get_int(tc, "moe_intermediate_size", p);
    c->routed_expert_hidden_size = get_int(tc, "routed_expert_hidden_size", p);
    c->routed_scaling_factor = get_float(tc, "routed_scaling_factor", p);
    c->first_k_dense_replace = get_int(tc, "first_k_dense_replace", p);
    c->moe_layer_freq = get_int(tc, "moe_layer_freq", p);
    expect_bool(tc, "latent_moe_use_norm", 1, p);
    expect_bool(tc, "moe_renormalize", 1, p);
    expect_str(tc, "moe_router_activation_func", "sigmoid", p);
    /* Grouped top-k only runs when groups > 1 and groups > topk_group (spec §1.2). */
    int groups = get_int(tc, "num_expert_group", p), topk_group = get_int(tc, "topk_group", p);
    if (groups > 1 && groups > topk_group) note(p, "grouped top-k (\"%s\" > 1) is not supported", "num_expert_group");
    if (get_int(tc, "num_nextn_predict_layers", p) != 0) note(p, "\"%s\" must be 0", "num_nextn_predict_layers");
}

static void read_linear_attn(const cJSON *lac, k3_config *c, problems *p) {
    c->kda_num_heads = get_int(lac, "num_heads", p);
    c->kda_head_dim = get_int(lac, "head_dim", p);
    c->kda_conv_size = get_int(lac, "short_conv_kernel_size", p);
    c->kda_gate_lower_bound = get_float(lac, "gate_lower_bound", p);
    expect_bool(lac, "use_full_rank_gate", 1, p);
    if (c->num_hidden_layers < 1 || c->num_hidden_layers > K3_MAX_LAYERS) {
        note(p, "\"%s\" out of range", "num_hidden_layers");
        return;
    }
    bool kda[K3_MAX_LAYERS] = {0};
    layer_list(lac, "full_attn_layers", c->num_hidden_layers, c->layer_is_mla, p);
    layer_list(lac, "kda_layers", c->num_hidden_layers, kda, p);
    /* Each layer must be in exactly one list: the official rule is "KDA iff i+1 in
     * kda_layers", and a layer in neither list has no defined mixer. */
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (c->layer_is_mla[l] == kda[l]) {
            note(p, "a layer is in both or neither of full_attn_layers and %s", "kda_layers");
            break;
        }
}

static void read_quant(const cJSON *qc, k3_config *c, problems *p) {
    expect_str(qc, "quant_method", "compressed-tensors", p);
    expect_str(qc, "format", "mxfp4-pack-quantized", p);
    const cJSON *groups = obj(qc, "config_groups", p);
    const cJSON *g0 = groups ? obj(groups, "group_0", p) : NULL;
    const cJSON *w = g0 ? obj(g0, "weights", p) : NULL;
    c->mxfp4_group_size = get_int(w, "group_size", p);
    if (w && get_int(w, "num_bits", p) != 4) note(p, "quantization weights.\"%s\" must be 4", "num_bits");
    expect_str(w, "type", "float", p);
    if (w && c->mxfp4_group_size != 32) note(p, "quantization weights.\"%s\" must be 32", "group_size");
}

/* Dimensions that must agree with each other for the forward pass to be well defined. */
static void check_consistency(k3_config *c, problems *p) {
    if (c->kda_num_heads == 0 || c->kda_head_dim == 0 || c->kda_head_dim > 1024 ||
        c->kda_num_heads > 1024 || c->kda_conv_size < 1) /* each alone: the product overflows */
        note(p, "%s: KDA num_heads/head_dim/short_conv_kernel_size out of range", "linear_attn_config");
    if (c->num_experts_per_token < 1 || c->num_experts_per_token > c->num_experts)
        note(p, "\"%s\" must be in 1..num_experts", "num_experts_per_token");
    if (c->routed_expert_hidden_size % 32 || c->moe_intermediate_size % 32)
        note(p, "%s must be multiples of the MXFP4 group (32)", "routed_expert_hidden_size/moe_intermediate_size");
    if (c->attn_res_block_size < 1 ||
        (c->num_hidden_layers + c->attn_res_block_size - 1) / c->attn_res_block_size + 1 >
            K3_MAX_RES_VALUES)
        note(p, "\"%s\" is too small for num_hidden_layers", "attn_res_block_size");
    if (c->moe_layer_freq < 1) note(p, "\"%s\" must be >= 1", "moe_layer_freq");
    if (c->eos_token_id >= c->vocab_size || c->bos_token_id >= c->vocab_size)
        note(p, "%s outside vocab_size", "bos/eos_token_id");
    if (!(c->rms_norm_eps > 0)) note(p, "\"%s\" must be > 0", "rms_norm_eps");
    if (c->max_position_embeddings < 1) note(p, "\"%s\" must be >= 1", "max_position_embeddings");
    if (!(c->situ_beta > 0) || !(c->situ_linear_beta > 0)) note(p, "%s must be > 0", "activation_situ_*beta");
    for (int l = 0; l < c->num_hidden_layers && l < K3_MAX_LAYERS; l++)
        c->layer_is_moe[l] = l >= c->first_k_dense_replace && c->moe_layer_freq > 0 &&
                             l % c->moe_layer_freq == 0;
}

int k3_config_parse(const char *json, const char *name, k3_config *cfg, k3_err *err) {
    memset(cfg, 0, sizeof *cfg);
    cJSON *root = cJSON_Parse(json);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return k3_fail(err, K3_ERR_CONFIG, "%s: malformed JSON (not an object)", name);
    }
    problems p = {{0}, 0};
    expect_str(root, "model_type", "kimi_k3", &p);
    const cJSON *tc = obj(root, "text_config", &p);
    read_text(tc, cfg, &p);
    read_linear_attn(tc ? obj(tc, "linear_attn_config", &p) : NULL, cfg, &p);
    read_quant(tc ? obj(tc, "quantization_config", &p) : NULL, cfg, &p);
    if (!p.n) check_consistency(cfg, &p);
    cJSON_Delete(root);
    if (p.n)
        return k3_fail(err, K3_ERR_CONFIG, "%s: %d problem%s: %s", name, p.n, p.n > 1 ? "s" : "",
                       p.text);
    return K3_OK;
}

int k3_config_load(const char *model_dir, k3_config *cfg, k3_err *err) {
    char path[4096], *json;
    k3_path_join(path, sizeof path, model_dir, "config.json");
    int rc = k3_read_file(path, 16u << 20, &json, NULL, err);
    if (rc && access(path, F_OK) != 0) /* the folder is not a snapshot: say what one holds */
        return k3_fail(err, rc, "%s: cannot open: %s. A model folder is a Hugging Face snapshot "
                       "of Kimi K3: config.json, model.safetensors.index.json, the "
                       "safetensors shards it names, tiktoken.model and "
                       "tokenizer_config.json (k3 setup DEST installs one)", path,
                       strerror(errno));
    if (rc) return rc;
    rc = k3_config_parse(json, path, cfg, err);
    free(json);
    return rc;
}
