/* spine.h — the resident spine budget (issue 8 item 4): with a RAM budget for the spine, the
 * first layers stay resident and the rest are streamed from the files half a layer at a time,
 * each read overlapping the previous half's compute (double buffering). Internal to src/model;
 * the engine opens it (k3_engine_opts.spine_gb / K3_SPINE_GB) and the forward passes ask it
 * for every layer's weights.
 *
 * Invariants:
 *  - Plan (decided once at open, src/model/spine.c plan()): lm_head ("the head") is resident
 *    when the budget holds it (it is read for every token that produces logits), then layers
 *    0, 1, ... in order while they fit; the rest are streamed. A streamed layer is read in two
 *    units, its token mixer and its FFN, so a staging buffer holds half a layer. The budget
 *    counts the resident layers in place, the pinned copies and the two staging buffers (each
 *    as large as the largest streamed unit); a budget below that floor streams everything and
 *    says so. While anything streams, the embedding is not resident either: its row is read
 *    with pread per token (hidden_size x 2 bytes).
 *  - Resident units are used in place from the MAP_SHARED mappings, exactly as without a
 *    budget. Streamed units are never touched through the mappings (mapped pages count in
 *    RSS): their k3_mat pointers in m->layers are cleared at open, so an access that bypasses
 *    k3_spine_layer faults instead of silently growing RSS. They are read with pread (64 MB
 *    requests), O_DIRECT when asked and the file system takes it, else buffered with
 *    POSIX_FADV_DONTNEED (so the page cache does not keep a copy), into one of two staging
 *    buffers; each tensor lands at the same
 *    address modulo 4096 as in the mapping, so every kernel sees the same bytes in the same
 *    alignment and the output is bit-identical for every budget.
 *  - Pinned: the small tensors of streamed units that the passes read outside the layer's own
 *    turn — the MoE router and its bias (K3_PIPE's lookahead routes layer l+1 while layer l
 *    computes), the KDA conv taps (k3_state_rewind replays the conv windows) and the final
 *    norm (applied also when no logits are wanted) — are copied into anonymous memory at open.
 *  - One background thread per engine reads the next streamed unit while the current one
 *    computes; nothing is allocated and no thread is created per token. The order is cyclic:
 *    mixer and FFN of each streamed layer, then the head (when the pass wants logits and the
 *    head is streamed), then the first streamed layer of the next pass.
 *  - Sessions may share the engine from several threads: a pass holds the spine's section
 *    lock from its first streamed unit until k3_spine_end, so one pass at a time runs through
 *    the streamed part (resident layers run concurrently).
 *  - A failed read (I/O error, short file) fails the pass with K3_ERR_IO naming the file and
 *    the layer; the session must then be reset (as after K3_ERR_EXPERT_IO). The failed unit
 *    is read again by the next pass that needs it.
 */
#ifndef K3_SPINE_H
#define K3_SPINE_H

#include <stdbool.h>
#include <stdint.h>
#include "model.h"

typedef struct k3_spine k3_spine;

/* A pass's hold on the streamed part; zero-initialise with want_head set, and always end it
 * with k3_spine_end (also on errors). */
typedef struct k3_spine_pass {
    bool want_head;  /* the pass computes logits (lm_head is needed after the last layer) */
    bool held;       /* the section lock is held */
} k3_spine_pass;

/* Plans the budget for bound model m (checkpoint ck, int8 pack or NULL) and, when anything
 * is streamed, opens the files (O_DIRECT when direct and the file system takes it, else
 * buffered), copies the pinned tensors, allocates the staging buffers, starts the reader
 * thread and reads the first streamed unit. budget_bytes is in bytes. m must stay at the same
 * address while the spine is open. *out is set (never NULL on success).
 * Errors: K3_ERR_IO (a file cannot be opened or read), K3_ERR_GENERIC (memory, thread). */
int k3_spine_open(k3_model *m, const k3_checkpoint *ck, const k3_pack *pack,
                  uint64_t budget_bytes, bool direct, k3_spine **out, k3_err *err);
void k3_spine_close(k3_spine *sp);

/* The RAM a budget needs when it streams every layer and the head (both staging buffers of
 * the largest half-layer plus the pinned small tensors) into *floor_bytes, without opening or
 * reading anything: the memory planner's staging figure (src/engine/plan.h).
 * Errors: K3_ERR_GENERIC (memory), those of the layout (K3_ERR_CHECKPOINT). */
int k3_spine_floor_bytes(const k3_model *m, const k3_checkpoint *ck, const k3_pack *pack,
                         uint64_t *floor_bytes, k3_err *err);

/* The plan k3_spine_open would make for budget_bytes (same code, same result), without
 * opening a file, pinning, allocating staging or reading a byte: for `k3 plan`. The returned
 * spine answers k3_spine_get_stats, k3_spine_ram_bytes and k3_spine_describe (direct: what
 * open would try first) and must only be closed. Errors: those of k3_spine_floor_bytes. */
int k3_spine_plan_only(const k3_model *m, const k3_checkpoint *ck, const k3_pack *pack,
                       uint64_t budget_bytes, bool direct, k3_spine **out, k3_err *err);

enum { K3_SPINE_MIXER = 0, K3_SPINE_FFN = 1 }; /* the two halves of a layer */

/* Layer l's weights for one half of it (part: its token mixer with input_layernorm, or its FFN
 * with post_attention_layernorm) for this pass: &m->layers[l] when resident (or m->spine is
 * NULL: no budget), else a staging buffer's view (waiting for its read, or reading it now)
 * whose other half is cleared. Ask for the mixer, then the FFN. Valid until the next
 * k3_spine_layer / k3_spine_head / k3_spine_end of this pass.
 * Errors: K3_ERR_IO (the read failed; see the header). */
int k3_spine_layer(const k3_model *m, k3_spine_pass *p, int l, int part, const k3_layer **out,
                   k3_err *err);
/* lm_head [vocab, hidden] for this pass, as k3_spine_layer. */
int k3_spine_head(const k3_model *m, k3_spine_pass *p, const k3_mat **out, k3_err *err);
/* Leaves the streamed part (releases the section); a no-op when nothing was held. */
void k3_spine_end(const k3_model *m, k3_spine_pass *p);

/* The embedding row of token into out [hidden] (f32): from the mapping when nothing is
 * streamed, else by pread. Errors: K3_ERR_IO. */
int k3_spine_embed(const k3_model *m, int32_t token, float *out, k3_err *err);

/* The plan and counters (k3.h k3_spine_stats); zeros when sp is NULL. */
void k3_spine_get_stats(const k3_spine *sp, k3_spine_stats *out);
/* RAM the spine takes under the plan: resident units + pinned copies + staging (for the
 * memory plan); without sp, m->spine_bytes. */
uint64_t k3_spine_ram_bytes(const k3_spine *sp, const k3_model *m);
/* One line (no newline): the plan — resident layers and head, streamed layers, bytes of
 * each, staging and pinned bytes, the I/O mode. */
void k3_spine_describe(const k3_spine *sp, char *buf, size_t cap);

#endif
