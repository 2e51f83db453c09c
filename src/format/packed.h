/* packed.h — the packed spine files (`k3 pack`): a checkpoint's spine BF16 matrices re-stored
 * as int8 with one f32 scale per output row (scheme 1, issue 8; NOT exact, opt-in), or
 * losslessly in 12 bits per weight plus escapes (scheme 2, `k3 pack --lossless`, issue 33;
 * decodes to the identical BF16 bits, kernels.h "lossless BF16"). Byte layout, version history
 * and the rules: docs/PACKED-SPINE.md.
 *
 * Invariants:
 *  - Which tensors are packed is decided by k3_pack_selects() alone (writer and reader agree):
 *    BF16, 2-D, more than one row, under language_model., except the embedding (read one row
 *    per token, so int8 saves no per-token bytes), the AttnRes projections ([1, hidden]) and
 *    the MoE router gate.weight (expert selection is discrete; 1% of the spine). The lossless
 *    scheme also leaves kv_b_proj: the latent MLA reads it as per-head blocks of rows (W_uk,
 *    W_uv), and a BF16LX matrix's escape list is indexed from the whole matrix's rows, so no
 *    row block of it is a matrix of its own (at K3 widths 25 MB per MLA layer, 2% of the spine).
 *  - The layout is canonical: given the selected tensors (in checkpoint data order) every
 *    offset follows from the shapes (and, for scheme 2, each tensor's escape count), so the
 *    same snapshot always packs to the same bytes and a reader rejects any table that deviates
 *    from it. Both schemes select the same tensors.
 *  - Every byte is covered by a checksum (XXH3-64): the header by its own, the table by one in
 *    the header, each tensor's payload (int8 values, then scales) by one in its entry. Load
 *    checks header, table and file size; payloads are checked by `k3 pack --verify`.
 *  - The header carries a fingerprint of the source snapshot (XXH3-128 over each packed
 *    tensor's name, shape, first and last 4 KiB of BF16 data); a file packed from another
 *    model is refused at load.
 *  - Little-endian hosts only (checked at compile time).
 */
#ifndef K3_PACKED_H
#define K3_PACKED_H

#include <stdint.h>
#include "safetensors.h"

#define K3_PACK_VERSION 1
#define K3_PACK_SCHEME_INT8_ROW 1  /* int8, symmetric absmax, one f32 scale per row, RNE */
#define K3_PACK_SCHEME_BF16LX 2    /* lossless BF16: 4-bit high-byte code + low byte, escapes */
#define K3_PACK_HEADER_BYTES 128
#define K3_PACK_ENTRY_BYTES 256
#define K3_PACK_NAME_BYTES 192
#define K3_PACK_ALIGN 4096         /* every tensor's int8 values start on a page boundary */
#define K3_PACK_FILE "k3-spine-int8.k3pack"
#define K3_PACK_QUALITY_FILE "k3-spine-int8.quality.json"
#define K3_PACK_LX_FILE "k3-spine-lossless.k3pack"

typedef struct k3_pack_entry {
    char name[K3_PACK_NAME_BYTES]; /* the checkpoint tensor name, NUL-terminated */
    int64_t rows, cols;
    uint64_t q_offset;             /* int8 [rows, cols] row-major; scheme 2: the groups,
                                    * rows × k3_lx_row_bytes(cols) */
    uint64_t scale_offset;         /* f32 [rows]; scheme 2: u32 escape index [rows + 1], then
                                    * the n_esc escapes */
    uint64_t checksum;             /* XXH3-64 of the first part's bytes followed by the second's */
    int done;                      /* payload written and synced (resume point) */
    uint8_t xtab[16];              /* scheme 2: the high byte of each code (kernels.h) */
    uint32_t n_esc;                /* scheme 2: escapes */
} k3_pack_entry;

typedef struct k3_pack {
    char *path;
    uint32_t version, scheme, n_tensors;
    int complete;                  /* 1 once every payload is written (set last) */
    uint64_t file_bytes;
    uint8_t fingerprint[16];
    uint64_t header_checksum;      /* identifies this exact file (quality figures refer to it) */
    k3_pack_entry *entries;        /* [n_tensors], in file order */
    const uint8_t *map;            /* whole file, read-only; NULL unless from k3_pack_open */
} k3_pack;

/* Whether the packer converts tensor t in a pack of scheme (K3_PACK_SCHEME_*; the rule in
 * the header comment). */
int k3_pack_selects(const k3_tensor *t, uint32_t scheme);

/* The canonical pack of checkpoint ck in scheme (K3_PACK_SCHEME_*): entries (done = 0,
 * checksum 0), offsets, file size and fingerprint; complete = 0, map = NULL, path = NULL.
 * Int8 reads 8 KiB of each packed tensor; lossless reads every selected weight once (the
 * high-byte histogram gives each tensor's table and escape count, hence the layout).
 * Errors: K3_ERR_CHECKPOINT (nothing to pack, a name too long, a lossless matrix wider than
 * K3_LX_MAX_COLS or with 2^32 escapes or more), K3_ERR_GENERIC (memory). */
int k3_pack_plan(const k3_checkpoint *ck, uint32_t scheme, k3_pack *out, k3_err *err);
/* The payload's two parts of entry e in scheme: bytes at q_offset and at scale_offset. */
void k3_pack_parts(uint32_t scheme, const k3_pack_entry *e, uint64_t *q_bytes,
                   uint64_t *second_bytes);
/* Checks that p holds scheme. Errors: K3_ERR_PACK naming the file and both schemes. */
int k3_pack_check_scheme(const k3_pack *p, uint32_t scheme, k3_err *err);
/* "int8" or "lossless". */
const char *k3_pack_scheme_name(uint32_t scheme);

/* Writes header + table of p at offset 0 of fd (pwrite). Errors: K3_ERR_IO naming path. */
int k3_pack_write_meta(int fd, const char *path, const k3_pack *p, k3_err *err);

/* Reads and validates header and table from fd (checksums, version, canonical layout); the
 * file may be incomplete. Fills p (map = NULL; p->path = strdup(path)).
 * Errors: K3_ERR_PACK naming path and what is wrong; K3_ERR_IO on a read failure. */
int k3_pack_read_meta(int fd, const char *path, k3_pack *p, k3_err *err);

/* Opens a complete pack for use: k3_pack_read_meta, complete flag, exact file size, mmap.
 * Errors: K3_ERR_IO (missing/unreadable), K3_ERR_PACK (corrupt, truncated, incomplete,
 * unsupported version). */
int k3_pack_open(const char *path, k3_pack **out, k3_err *err);
/* Frees what k3_pack_plan / k3_pack_read_meta put in *p (unmaps too) and zeroes it. */
void k3_pack_clear(k3_pack *p);
/* Clears and frees a pack from k3_pack_open; NULL is a no-op. */
void k3_pack_close(k3_pack *p);

/* Checks that p was packed from ck (same tensors, shapes, fingerprint).
 * Errors: K3_ERR_PACK ("packed from another model"). */
int k3_pack_check_model(const k3_pack *p, const k3_checkpoint *ck, k3_err *err);

/* Recomputes every payload checksum of an opened pack; names the first bad tensor.
 * Errors: K3_ERR_PACK. */
int k3_pack_verify(const k3_pack *p, k3_err *err);

/* The entry named name, or NULL (linear scan; used at load only). */
const k3_pack_entry *k3_pack_find(const k3_pack *p, const char *name);

/* One mode's figures against the exact path (definitions in src/cli/quality.h). */
typedef struct k3_pack_figures {
    double nll, ppl;         /* mean negative log-likelihood per token (nats), exp(nll) */
    double mean_kl;          /* mean KL(exact || mode), nats */
    double top1;             /* fraction of positions with the same argmax */
    double max_abs_dlogit;   /* max |logit_mode - logit_exact| */
} k3_pack_figures;

/* What `k3 pack` measured for its pack (teacher-forced against the exact path), stored as
 * JSON in K3_PACK_QUALITY_FILE beside the pack (format "k3-pack-quality/1"; the "approx"
 * object is optional). */
typedef struct k3_pack_quality {
    uint64_t pack_checksum;  /* header_checksum of the pack the figures belong to */
    int predictions;         /* next-token predictions evaluated */
    double nll_exact, ppl_exact;
    k3_pack_figures int8;    /* the int8 spine */
    int has_approx;
    k3_pack_figures approx;  /* the int8 spine with int8 activations (--approx) */
} k3_pack_quality;

/* Writes q as JSON to path. Errors: K3_ERR_IO. */
int k3_pack_quality_write(const char *path, const k3_pack_quality *q, k3_err *err);
/* Reads path. Errors: K3_ERR_IO (missing), K3_ERR_PACK (malformed). */
int k3_pack_quality_read(const char *path, k3_pack_quality *q, k3_err *err);

/* Payload checksum (XXH3-64) of a[na bytes] followed by b[nb bytes] (the entry's two parts:
 * int8 values then scales, or lossless groups then escape index and list). */
uint64_t k3_pack_checksum(const void *a, uint64_t na, const void *b, uint64_t nb);

#endif
