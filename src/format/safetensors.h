/* safetensors.h — a checkpoint made of safetensors shards (spec §10), memory-mapped.
 *
 * Invariants:
 *  - Offsets and sizes are 64-bit everywhere (real shards pass 4 GiB).
 *  - Every tensor's [offset, offset+nbytes) lies inside its mapped file and nbytes equals
 *    numel * dtype size; a header that says otherwise is rejected at open (a truncated shard
 *    is caught here, before any weight is touched).
 *  - model.safetensors.index.json is authoritative for which shard holds a tensor. Tensors
 *    named vision_tower.* / mm_projector.* are skipped; a shard holding only those is never
 *    opened.
 *  - Weights are never copied: k3_tensor.data points into a read-only MAP_SHARED mapping.
 */
#ifndef K3_SAFETENSORS_H
#define K3_SAFETENSORS_H

#include <stdint.h>
#include <stddef.h>
#include "../util/dtype.h" /* enum k3_dtype */
#include "../util/err.h"

#define K3_MAX_DIMS 4

typedef struct k3_tensor {
    const char *name;
    int dtype;                  /* enum k3_dtype */
    int ndim;
    int64_t shape[K3_MAX_DIMS];
    int shard;                  /* index into k3_checkpoint.shards */
    uint64_t file_offset;       /* absolute byte offset of the first byte in the shard file */
    uint64_t nbytes;
    const void *data;           /* into the mapping */
} k3_tensor;

typedef struct k3_shard {
    char *path;
    uint64_t file_bytes;
    uint64_t data_start;        /* 8 + header length */
    void *map;
    int fd;
} k3_shard;

typedef struct k3_checkpoint {
    char *dir;
    k3_shard *shards;
    int n_shards;
    k3_tensor *tensors;
    size_t n_tensors;
    size_t *slots;              /* open-addressing hash: index+1 into tensors, 0 = empty */
    size_t n_slots;             /* power of two */
    int n_skipped_shards;       /* shards listed only for vision tensors, never opened */
    char *dirs;                 /* extra ':'-separated folders searched for shards, or NULL */
} k3_checkpoint;

/* Opens the snapshot in dir: reads model.safetensors.index.json (or a lone
 * model.safetensors), parses and validates every needed shard header, maps the shards.
 * Errors: K3_ERR_IO (missing/unreadable file), K3_ERR_CHECKPOINT (malformed index or header,
 * offsets past EOF, tensor in index but not in its shard); messages name file and tensor. */
int k3_checkpoint_open(const char *dir, k3_checkpoint **out, k3_err *err);
/* The same, for a snapshot whose shards are split over several folders (drives): a shard
 * missing from dir is looked up by name in each of dirs (':'-separated; NULL = none), in
 * order. config, index and tokenizer stay in dir. */
int k3_checkpoint_open_dirs(const char *dir, const char *dirs, k3_checkpoint **out,
                            k3_err *err);
void k3_checkpoint_close(k3_checkpoint *c);

/* The tensor called name, or NULL. */
const k3_tensor *k3_checkpoint_find(const k3_checkpoint *c, const char *name);

/* Looks up name and checks its dtype and shape (ndim entries of shape; -1 matches any size).
 * Errors: K3_ERR_CHECKPOINT naming the tensor, its shard, and expected vs actual. */
int k3_checkpoint_get(const k3_checkpoint *c, const char *name, int dtype, int ndim,
                      const int64_t *shape, const k3_tensor **out, k3_err *err);

const char *k3_dtype_name(int dtype);
size_t k3_dtype_size(int dtype);

#endif
