/* pass.c — the one operation that runs the model (engine_internal.h, k3_engine_pass) and its
 * envelope: the checks of each segment, the MPI mirror, the token history, SIGBUS arming and
 * the mapped-fault check, the reset of a failed pass, the store's note of the pass, and the
 * logits check. k3_session_step, k3_session_forward and k3_multistep_run are its callers; this
 * is the only file of the engine that calls k3_backend_pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine_internal.h"
#include "../store/store.h"
#include "../model/spine.h"
#include "../util/clock.h"
#include "../util/sigbus.h"

void k3_engine_note_pass(const k3_engine *e) {
    if (!e->model.spine || !e->store) return;
    k3_spine_stats sp;
    k3_spine_get_stats(e->model.spine, &sp);
    if (sp.staging_bytes) k3_store_note_spine(e->store, sp.read_s, k3_now_s());
}

/* Corrupt weights (a damaged shard, a bad int8 pack) or an --approx overflow give NaN/Inf
 * logits, from which the sampler would still pick ids. One pass over the rows written (rows x
 * vocab_size floats, after lm_head read vocab_size x hidden_size weights: <0.1% of a step)
 * catches them wherever they arose; the final hidden state would be cheaper but misses a
 * corrupt lm_head row. first_pos = the position of row 0. Errors: K3_ERR_CHECKPOINT. */
int k3_engine_check_logits(const k3_engine *e, const float *logits, int rows, int first_pos,
                           k3_err *err) {
    if (!logits) return K3_OK;
    size_t V = (size_t)e->cfg.vocab_size;
    for (int r = 0; r < rows; r++) {
        const float *row = logits + (size_t)r * V;
        uint32_t bad = 0; /* exponent all ones: Inf or NaN; branch-free so it vectorizes */
        for (size_t i = 0; i < V; i++) {
            uint32_t u;
            memcpy(&u, &row[i], sizeof u);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
        if (!bad) continue;
        size_t id = 0;
        while (id < V && isfinite(row[id])) id++;
        return k3_fail_opts(err, K3_ERR_CHECKPOINT, e->approx ? "approx" : "spine",
                            "non-finite logits (%s at vocab id %zu) after position %d: %s",
                            isnan(row[id]) ? "NaN" : "Inf", id, first_pos + r,
                            e->approx ? "the int8 activations overflowed or the int8 spine "
                            "pack is corrupt: run without approx, or rebuild with k3 pack"
                            : k3_engine_spine_int8(e) ? "the int8 spine pack or the checkpoint's "
                            "weights are likely corrupt (run with spine bf16 to tell; rebuild "
                            "the pack with k3 pack)" : "the checkpoint's weights are likely "
                            "corrupt (a damaged or modified shard: compare it with the "
                            "original, e.g. k3 setup --check)");
    }
    return K3_OK;
}

/* ---- a mapped file truncated under a pass (issue 20, D2) ------------------------------------ */

/* Puts the file's pages back where the SIGBUS handler mapped zeros (sigbus.h): the whole
 * mapping again, MAP_FIXED at the same address. 0, or -1 when it could not be redone. */
static int remap(const void *map, uint64_t bytes, int fd, const char *path) {
    int own = fd < 0 ? (fd = open(path, O_RDONLY)) >= 0 : 0;
    if (fd < 0) return -1;
    void *m = mmap((void *)map, bytes, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
    if (own) close(fd);
    return m == MAP_FAILED ? -1 : 0;
}

/* After a pass: when a fault was survived since `before`, the pass's output is garbage.
 * Names the file the fault was in, restores every mapping and returns K3_ERR_IO. */
int k3_engine_mapped_fault(const k3_engine *e, uint64_t before, k3_err *err) {
    if (k3_sigbus_faults() == before) return K3_OK;
    const uint8_t *a = k3_sigbus_last_addr();
    const char *path = "a mapped model file";
    uint64_t bytes = 0;
    int ok = 0;
    for (int i = 0; i < e->ck->n_shards; i++) {
        const k3_shard *sh = &e->ck->shards[i];
        if (!sh->map) continue;
        const uint8_t *m = sh->map;
        if (a >= m && a < m + sh->file_bytes) path = sh->path, bytes = sh->file_bytes;
        ok |= remap(sh->map, sh->file_bytes, sh->fd, sh->path);
    }
    if (e->pack && e->pack->map) {
        if (a >= e->pack->map && a < e->pack->map + e->pack->file_bytes)
            path = e->pack->path, bytes = e->pack->file_bytes;
        ok |= remap(e->pack->map, e->pack->file_bytes, -1, e->pack->path);
    }
    struct stat st;
    long long now = bytes && stat(path, &st) == 0 ? (long long)st.st_size : -1;
    return k3_fail(err, K3_ERR_IO, "%s: read past its end while mapped (%lld bytes now, %llu "
                   "when loaded: the file was truncated or replaced while k3 ran); the step was "
                   "discarded%s. Restore the file (k3 setup --check names what changed)",
                   path, now, (unsigned long long)bytes,
                   ok ? ", and its mapping could not be restored: restart k3" : "");
}

/* ---- the MPI mirror -------------------------------------------------------------------------- */

int k3_engine_mirror(const k3_session *s, int kind, int arg, int flags, const int32_t *ids,
                     int n, k3_err *err) {
    const k3_rank_ops *o = s->e->rank_ops;
    if (!o) return K3_OK;
    k3_rank_op op = {.kind = kind, .session = (unsigned long long)(uintptr_t)s, .arg = arg,
                     .flags = flags, .n = n, .ids = ids};
    return o->send(o->user, &op, err);
}

/* Rank 0 of an MPI run: the pass's live segments as one K3_ROP_PASS op (k3.h's wire layout),
 * sent before this rank runs it, so that every rank runs the same pass. */
static int mirror_pass(const k3_engine *e, bool shared, const k3_pass_seg *segs, int n,
                       k3_err *err) {
    const k3_rank_ops *o = e->rank_ops;
    if (!o) return K3_OK;
    int32_t *w = e->pass_wire, len = 0, live = 0;
    for (int i = 0; i < n; i++) {
        const k3_pass_seg *g = &segs[i];
        if (g->status) continue;
        if (len + K3_ROP_SEG_INTS + g->n > K3_ROP_PASS_INTS)
            return k3_fail(err, K3_ERR_INPUT, "a pass of more than %d ids and segments",
                           K3_ROP_PASS_INTS);
        uint64_t id = (uint64_t)(uintptr_t)g->s;
        w[len++] = (int32_t)(id & 0xffffffffu), w[len++] = (int32_t)(id >> 32);
        w[len++] = g->flags, w[len++] = g->n;
        memcpy(w + len, g->ids, (size_t)g->n * sizeof *w);
        len += g->n;
        live++;
    }
    k3_rank_op op = {.kind = K3_ROP_PASS, .arg = live, .flags = shared, .n = len, .ids = w};
    return o->send(o->user, &op, err);
}

/* ---- the pass -------------------------------------------------------------------------------- */

int k3_pass_seg_rows(int flags, int n) {
    return flags & K3_BATCH_NO_LOGITS ? 0 : flags & K3_BATCH_ALL_LOGITS ? n : 1;
}

/* Checks of one segment against its session (K3_ERR_INPUT, K3_ERR_USAGE): a segment that
 * fails them is left out of the pass. */
static int check_seg(const k3_engine *e, k3_pass_seg *g) {
    const k3_state *st = g->s->state;
    for (int i = 0; i < g->n; i++)
        if (g->ids[i] < 0 || g->ids[i] >= e->cfg.vocab_size)
            return k3_fail(&g->err, K3_ERR_INPUT, "token id %d is outside the vocabulary "
                           "[0, %d)", g->ids[i], e->cfg.vocab_size);
    if (k3_state_pos(st) + g->n > k3_state_max_ctx(st))
        return k3_fail_opts(&g->err, K3_ERR_INPUT, "ctx", "the context is full (%d positions, "
                            "%d used, %d more asked); start a new session or raise ctx",
                            k3_state_max_ctx(st), k3_state_pos(st), g->n);
    if ((g->flags & K3_BATCH_REWINDABLE) && !k3_backend_can_rewind(e->backend))
        return k3_fail(&g->err, K3_ERR_USAGE, "this backend cannot rewind a pass");
    return K3_OK;
}

/* failed_pass: a pass that fails part-way (an expert or a streamed spine layer that cannot be
 * read) has already folded its ids into the KDA and conv state of the layers before the
 * failure, while the position did not move. The history would still look like a prefix of
 * a retried prompt and k3_session_prefill would build on that state, so every session in the
 * pass is reset: its next prefill starts again from an empty state (tests/test_spinefail.c).
 * A pass stopped by an on_layer hook (K3_ERR_INTERRUPTED) is not reset: the model put every
 * session in it back where the pass began (forward_batch.c, "stopping a pass"), so the passes
 * before it stay (tests/test_keepstate.c). */
static void failed_pass(k3_pass_seg *segs, int n, int rc, const k3_err *perr) {
    for (int i = 0; i < n; i++) {
        if (segs[i].status) continue;
        segs[i].status = rc;
        segs[i].err = *perr;
        if (rc != K3_ERR_INTERRUPTED) k3_session_reset(segs[i].s);
    }
}

int k3_engine_pass(const k3_engine *e, k3_backend_scratch *sc, k3_pass_seg *segs, int n,
                   float *logits, k3_err *err) {
    if (n < 1 || n > K3_MAX_CHUNK)
        return k3_fail(err, K3_ERR_USAGE, "a pass of %d segments (1 to %d)", n, K3_MAX_CHUNK);
    /* on the heap: K3_MAX_CHUNK segments are ~1 MB, too much for a worker thread's stack */
    k3_backend_seg *bs = malloc((size_t)n * sizeof *bs);
    int live = 0, *pos0 = malloc((size_t)n * sizeof *pos0);
    if (!bs || !pos0) {
        free(bs), free(pos0);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        k3_pass_seg *g = &segs[i];
        g->err = (k3_err){0};
        g->in_pass = false;
        if ((g->status = check_seg(e, g))) continue;
        g->in_pass = true;
        k3_session *s = g->s;
        pos0[i] = k3_state_pos(s->state);
        bs[live++] = (k3_backend_seg){.st = s->state, .sess = s->dev, .ids = g->ids, .n = g->n,
                                      .flags = g->flags,
                                      .trace = s->has_trace ? &s->trace : NULL};
    }
    k3_err perr = {0};
    int rc = live ? mirror_pass(e, sc != NULL, segs, n, &perr) : K3_OK;
    if (rc) { /* the other ranks did not take it: nothing ran */
        for (int i = 0; i < n; i++)
            if (!segs[i].status) segs[i].status = rc, segs[i].err = perr;
    } else if (live) {
        for (int i = 0; i < n; i++)
            if (!segs[i].status)
                memcpy(segs[i].s->tokens + pos0[i], segs[i].ids, (size_t)segs[i].n * sizeof(int32_t));
        uint64_t faults = k3_sigbus_faults();
        k3_sigbus_arm();
        rc = k3_backend_pass(e->backend, sc, bs, live, logits, &perr);
        k3_sigbus_disarm();
        int fault = k3_engine_mapped_fault(e, faults, rc ? NULL : &perr);
        if (!rc) rc = fault;
        if (rc) failed_pass(segs, n, rc, &perr);
        else k3_engine_note_pass(e);
    }
    size_t V = (size_t)e->cfg.vocab_size;
    float *row = logits;
    for (int i = 0; i < n && !rc && logits; i++) { /* non-finite rows fail their own segment */
        k3_pass_seg *g = &segs[i];
        if (g->status) continue;
        int r = k3_pass_seg_rows(g->flags, g->n);
        if (r) g->status = k3_engine_check_logits(e, row, r, pos0[i] + g->n - r, &g->err);
        row += (size_t)r * V;
    }
    free(bs), free(pos0);
    for (int i = 0; i < n; i++)
        if (segs[i].status) {
            if (err) *err = segs[i].err;
            return segs[i].status;
        }
    return K3_OK;
}
