/* map.c — the expert map: for every (MoE layer, expert) where its six tensors lie (spec §10.5),
 * from the safetensors headers alone. No expert byte is read here. */
#include <stdio.h>
#include <stdlib.h>

#include "store_internal.h"

static const char *const PART[K3_EXPERT_PARTS] = {
    "w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
    "w2.weight_scale",  "w3.weight_packed", "w3.weight_scale",
};

static uint64_t align_up(uint64_t x) { return (x + K3_IO_ALIGN - 1) / K3_IO_ALIGN * K3_IO_ALIGN; }

/* The checkpoint shapes of the six parts: w1, w3 [inter, latent], w2 [latent, inter], packed
 * two codes per byte, one E8M0 scale per 32 columns (spec §10.3-10.4). */
static void part_shapes(int64_t inter, int64_t lat, int64_t shape[K3_EXPERT_PARTS][2]) {
    int64_t rows[3] = {inter, lat, inter}, cols[3] = {lat, inter, lat};
    for (int w = 0; w < 3; w++) {
        shape[2 * w][0] = shape[2 * w + 1][0] = rows[w];
        shape[2 * w][1] = cols[w] / 2;
        shape[2 * w + 1][1] = cols[w] / 32;
    }
}

static int map_expert(k3_store *st, int layer, int e, int64_t shape[K3_EXPERT_PARTS][2],
                      k3_err *err) {
    k3_expert_loc *L = &st->loc[(size_t)layer * st->n_experts + e];
    for (int i = 0; i < K3_EXPERT_PARTS; i++) {
        char name[160];
        snprintf(name, sizeof name, "language_model.model.layers.%d.block_sparse_moe.experts.%d.%s",
                 layer, e, PART[i]);
        const k3_tensor *t = NULL;
        int rc = k3_checkpoint_get(st->ck, name, K3_DT_U8, 2, shape[i], &t, err);
        if (rc) return rc;
        L->shard[i] = t->shard;
        L->off[i] = t->file_offset;
    }
    L->mapped = 1;
    L->contig = 1;
    for (int i = 1; i < K3_EXPERT_PARTS; i++)
        L->contig &= L->shard[i] == L->shard[0] &&
                     L->off[i] == L->off[i - 1] + st->part_bytes[i - 1];
    if (!L->contig && st->n_fallback++ == 0) st->first_fallback_key = layer * st->n_experts + e;
    st->n_mapped++;
    return K3_OK;
}

int k3_store_build_map(k3_store *st, const k3_config *c, k3_err *err) {
    int64_t shape[K3_EXPERT_PARTS][2];
    part_shapes(st->inter, st->latent, shape);
    st->expert_bytes = 0;
    for (int i = 0; i < K3_EXPERT_PARTS; i++) {
        st->part_bytes[i] = (uint64_t)(shape[i][0] * shape[i][1]);
        st->expert_bytes += st->part_bytes[i];
    }
    st->loc = calloc((size_t)st->n_layers * st->n_experts, sizeof *st->loc);
    if (!st->loc) return k3_fail(err, K3_ERR_GENERIC, "out of memory (expert map)");
    for (int l = 0; l < st->n_layers; l++) {
        if (!c->layer_is_moe[l]) continue;
        for (int e = 0; e < st->n_experts; e++) {
            int rc = map_expert(st, l, e, shape, err);
            if (rc) return rc;
        }
    }
    return K3_OK;
}

size_t k3_store_slot_size(const k3_store *st) {
    if (!st->n_fallback) return (size_t)(align_up(st->expert_bytes) + K3_IO_ALIGN);
    size_t n = 0;
    for (int i = 0; i < K3_EXPERT_PARTS; i++) n += (size_t)(align_up(st->part_bytes[i]) + K3_IO_ALIGN);
    return n;
}

/* Contiguous: one span read from align_down(off[0]), so part i sits at the same distance from
 * the span start as in the file. Per-tensor: part i gets its own aligned region. */
void k3_store_part_offsets(const k3_store *st, int key, size_t off[K3_EXPERT_PARTS]) {
    const k3_expert_loc *L = &st->loc[key];
    if (L->contig) {
        uint64_t start = L->off[0] / K3_IO_ALIGN * K3_IO_ALIGN;
        for (int i = 0; i < K3_EXPERT_PARTS; i++) off[i] = (size_t)(L->off[i] - start);
        return;
    }
    size_t region = 0;
    for (int i = 0; i < K3_EXPERT_PARTS; i++) {
        off[i] = region + (size_t)(L->off[i] % K3_IO_ALIGN);
        region += (size_t)(align_up(st->part_bytes[i]) + K3_IO_ALIGN);
    }
}
