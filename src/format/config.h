/* config.h — the model configuration read from a snapshot's config.json (spec §1.2).
 *
 * Invariants:
 *  - Every dimension comes from config.json; nothing about the real K3 sizes is hard-coded.
 *  - The reader refuses rather than guesses: every missing, mistyped or inconsistent field is
 *    listed in one error (K3_ERR_CONFIG) that names config.json and the field.
 *  - Layer kinds come from linear_attn_config.full_attn_layers / kda_layers, which are
 *    ONE-based; k3_config.layer_is_mla[] is ZERO-based (layer i is MLA iff i+1 is listed).
 *  - The MLA "rope" dims (qk_rope_head_dim) are kept but never rotated: K3 is NoPE.
 */
#ifndef K3_CONFIG_H
#define K3_CONFIG_H

#include <stdbool.h>
#include "../util/err.h"

#define K3_MAX_LAYERS 256
/* AttnRes mixes at most this many values (closed blocks + the partial sum). */
#define K3_MAX_RES_VALUES 64

typedef struct k3_config {
    /* top level / text_config */
    int vocab_size;
    int hidden_size;
    int intermediate_size;        /* dense MLP (layers < first_k_dense_replace) */
    int num_hidden_layers;
    int num_attention_heads;      /* MLA heads */
    float rms_norm_eps;           /* 1e-5 in K3; the two MLA LoRA norms use 1e-6 (spec §4) */
    float situ_beta;              /* activation_situ_beta (gate), 4 */
    float situ_linear_beta;       /* activation_situ_linear_beta (up), 25 */
    int max_position_embeddings;
    int attn_res_block_size;
    int bos_token_id, eos_token_id, pad_token_id;
    /* MLA */
    int q_lora_rank, kv_lora_rank;
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    /* MoE */
    int num_experts, num_experts_per_token, num_shared_experts;
    int moe_intermediate_size;    /* per routed expert; shared width = this * num_shared */
    int routed_expert_hidden_size;/* latent width */
    float routed_scaling_factor;
    int first_k_dense_replace, moe_layer_freq;
    /* KDA (linear_attn_config) */
    int kda_num_heads, kda_head_dim, kda_conv_size;
    float kda_gate_lower_bound;
    /* derived */
    bool layer_is_mla[K3_MAX_LAYERS]; /* zero-based */
    bool layer_is_moe[K3_MAX_LAYERS];
    int mxfp4_group_size;          /* quantization_config group_size, 32 */
} k3_config;

/* Parses and validates MODEL_DIR/config.json into cfg.
 * Errors: K3_ERR_IO (file missing/unreadable), K3_ERR_CONFIG (malformed JSON, missing or
 * inconsistent fields; the message lists all of them). */
int k3_config_load(const char *model_dir, k3_config *cfg, k3_err *err);

/* Same, from a JSON text already in memory; `name` is used in messages. */
int k3_config_parse(const char *json, const char *name, k3_config *cfg, k3_err *err);

#endif
