/* multistep.c — several sessions in one pass (k3.h "several sessions in one pass", issue 18).
 *
 * The call checks the call as a whole, then hands its segments to the engine's one pass
 * (pass.c, k3_engine_pass) with the multistep's scratch: a segment that cannot run (an id out
 * of range, a full context) is left out there and reported alone; the others run in one pass
 * of the backend (the CPU: one batched pass over all rows; a device backend steps them one
 * after another). Rank 0 of an MPI run sends the pass to the other ranks, which replay it. */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "../util/clock.h"

struct k3_multistep {
    const k3_engine *e;
    int max_rows;
    int moe_layers;
    k3_multistep_stats stats;
    k3_multistep_seg *step_segs; /* [max_rows] k3_sessions_step's segments (off the stack) */
    k3_pass_seg *psegs;          /* [max_rows] the call's segments as the pass takes them */
    float *packed;               /* NULL: the pass's rows are moved in place in the caller's */
    k3_backend_scratch *sc;      /* the backend's scratch for max_rows rows */
};

int k3_multistep_new(const k3_engine *e, int max_rows, k3_multistep **out, k3_err *err) {
    if (max_rows < 1 || max_rows > K3_MULTISTEP_MAX_ROWS)
        return k3_fail(err, K3_ERR_INPUT, "a multistep pass holds 1 to %d rows, not %d",
                       K3_MULTISTEP_MAX_ROWS, max_rows);
    k3_multistep *ms = calloc(1, sizeof *ms);
    if (!ms) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    ms->e = e;
    ms->max_rows = max_rows;
    for (int l = 0; l < e->cfg.num_hidden_layers; l++) ms->moe_layers += e->model.layers[l].is_moe;
    ms->step_segs = calloc((size_t)max_rows, sizeof *ms->step_segs);
    ms->psegs = calloc((size_t)max_rows, sizeof *ms->psegs);
    int rc = K3_OK;
    if (!ms->step_segs || !ms->psegs)
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory for a %d-row pass", max_rows);
    if (!rc) rc = k3_backend_scratch_new(e->backend, max_rows, &ms->sc, err);
    if (rc) {
        k3_multistep_free(ms);
        return rc;
    }
    *out = ms;
    return K3_OK;
}

void k3_multistep_free(k3_multistep *ms) {
    if (!ms) return;
    free(ms->step_segs);
    free(ms->psegs);
    k3_backend_scratch_free(ms->sc);
    free(ms);
}

int k3_multistep_max_rows(const k3_multistep *ms) { return ms->max_rows; }

uint64_t k3_multistep_plan_bytes(const k3_engine *e, int max_rows) {
    if (max_rows < 1) max_rows = 1;
    uint64_t segs = (uint64_t)max_rows * (sizeof(k3_multistep_seg) + sizeof(k3_pass_seg));
    return sizeof(k3_multistep) + segs + k3_backend_scratch_bytes(e->backend, max_rows);
}

#define LOGITS_MODE 3 /* the logits bits of k3_multistep_seg.flags */

static int seg_rows(const k3_multistep_seg *g) {
    int f = g->flags & LOGITS_MODE;
    return f == K3_MS_ALL_LOGITS ? g->n_ids : f == K3_MS_NO_LOGITS ? 0 : 1;
}

int k3_multistep_logit_rows(const k3_multistep_seg *segs, int n) {
    int rows = 0;
    for (int i = 0; i < n; i++) rows += seg_rows(&segs[i]);
    return rows;
}

void k3_multistep_get_stats(const k3_multistep *ms, k3_multistep_stats *out) { *out = ms->stats; }

/* The whole call refused: every segment gets the same status and message. */
static int refuse_all(k3_multistep_seg *segs, int n, k3_err *err, int code, const char *msg) {
    for (int i = 0; i < n; i++) {
        segs[i].status = code;
        k3_fail(&segs[i].err, code, "%s", msg);
    }
    return k3_fail(err, code, "%s", msg);
}

/* Checks of the call as a whole (caller errors): nothing runs when one fails. */
static int check_call(const k3_multistep *ms, k3_multistep_seg *segs, int n, k3_err *err) {
    k3_err e = {0};
    int rows = 0;
    if (n < 1) return k3_fail(err, K3_ERR_USAGE, "a multistep pass needs at least one segment");
    for (int i = 0; i < n && !e.code; i++) {
        const k3_multistep_seg *g = &segs[i];
        if (!g->session || g->session->e != ms->e)
            k3_fail(&e, K3_ERR_USAGE, "segment %d: %s", i, g->session ? "a session of another "
                    "engine" : "no session");
        else if (g->n_ids < 1 || !g->ids)
            k3_fail(&e, K3_ERR_USAGE, "segment %d: %d ids (a segment feeds at least one)", i,
                    g->n_ids);
        else if ((g->flags & ~(LOGITS_MODE | K3_MS_REWINDABLE)) ||
                 (g->flags & LOGITS_MODE) == LOGITS_MODE)
            k3_fail(&e, K3_ERR_USAGE, "segment %d: flags %d (expected K3_MS_LAST_LOGITS, "
                    "K3_MS_ALL_LOGITS or K3_MS_NO_LOGITS, maybe with K3_MS_REWINDABLE)", i,
                    g->flags);
        else if ((rows += g->n_ids) > ms->max_rows)
            k3_fail(&e, K3_ERR_USAGE, "the segments hold more than the pass's %d rows "
                    "(k3_multistep_new's max_rows)", ms->max_rows);
        for (int j = 0; j < i && !e.code; j++)
            if (segs[j].session == g->session)
                k3_fail(&e, K3_ERR_USAGE, "segments %d and %d feed the same session (one "
                        "segment per session and pass)", j, i);
    }
    return e.code ? refuse_all(segs, n, err, e.code, e.msg) : K3_OK;
}

static int batch_flags(int ms_flags) {
    int f = ms_flags & LOGITS_MODE;
    return (f == K3_MS_ALL_LOGITS ? K3_BATCH_ALL_LOGITS : f == K3_MS_NO_LOGITS ? K3_BATCH_NO_LOGITS
                                                                              : 0) |
           (ms_flags & K3_MS_REWINDABLE ? K3_BATCH_REWINDABLE : 0);
}

/* The pass writes the rows of the segments in it packed, segment after segment; they are
 * moved to their rows of the call's layout (back to front: every row moves to the same or a
 * later row). */
static void unpack(const k3_multistep *ms, const k3_multistep_seg *segs, int n, float *logits,
                   size_t V) {
    int packed = 0;
    for (int i = 0; i < n; i++)
        if (ms->psegs[i].in_pass) packed += seg_rows(&segs[i]);
    for (int i = n - 1; i >= 0; i--) {
        const k3_multistep_seg *g = &segs[i];
        if (!ms->psegs[i].in_pass) continue;
        int r = seg_rows(g);
        packed -= r;
        if (r && packed != g->logits_row)
            memmove(logits + (size_t)g->logits_row * V, logits + (size_t)packed * V,
                    (size_t)r * V * sizeof *logits);
    }
}

int k3_multistep_run(k3_multistep *ms, k3_multistep_seg *segs, int n, float *logits,
                     k3_err *err) {
    int rc = check_call(ms, segs, n, err);
    if (rc) return rc;
    size_t V = (size_t)ms->e->cfg.vocab_size;
    int row = 0;
    for (int i = 0; i < n; i++) {
        k3_multistep_seg *g = &segs[i];
        int r = seg_rows(g);
        g->logits_row = r ? row : -1;
        row += r;
        ms->psegs[i] = (k3_pass_seg){.s = g->session, .ids = g->ids, .n = g->n_ids,
                                     .flags = batch_flags(g->flags)};
    }
    double t0 = k3_now_s();
    uint64_t experts = k3_backend_scratch_experts(ms->sc);
    k3_engine_pass(ms->e, ms->sc, ms->psegs, n, logits, NULL);
    int live = 0, rows = 0;
    bool ok = false; /* the pass itself succeeded (a segment failed by its logits counts) */
    for (int i = 0; i < n; i++) {
        segs[i].status = ms->psegs[i].status;
        segs[i].err = ms->psegs[i].err;
        if (!ms->psegs[i].in_pass) continue;
        live++, rows += segs[i].n_ids;
        ok |= !segs[i].status || segs[i].status == K3_ERR_CHECKPOINT;
    }
    if (ok && logits) unpack(ms, segs, n, logits, V);
    if (live) {
        uint64_t row_experts = (uint64_t)rows * (uint64_t)ms->moe_layers *
                               (uint64_t)ms->e->cfg.num_experts_per_token;
        uint64_t d = k3_backend_scratch_experts(ms->sc) - experts;
        ms->stats.experts += d ? d : row_experts;
        ms->stats.row_experts += row_experts;
        ms->stats.passes++;
        ms->stats.rows += (uint64_t)rows;
        ms->stats.segments += (uint64_t)live;
        ms->stats.pass_s += k3_now_s() - t0;
    }
    for (int i = 0; i < n; i++)
        if (segs[i].status) {
            if (!err) return segs[i].status;
            *err = segs[i].err;
            return k3_err_prefix(err, "segment %d", i);
        }
    return K3_OK;
}

int k3_sessions_step(k3_multistep *ms, k3_session *const *ss, const int32_t *ids, int n,
                     float *logits, int *status, k3_err *err) {
    if (n < 1 || n > ms->max_rows)
        return k3_fail(err, K3_ERR_USAGE, "k3_sessions_step: %d sessions (1 to %d, the pass's "
                       "rows)", n, ms->max_rows);
    k3_multistep_seg *segs = ms->step_segs;
    for (int i = 0; i < n; i++)
        segs[i] = (k3_multistep_seg){.session = ss[i], .ids = &ids[i], .n_ids = 1,
                                     .flags = K3_MS_LAST_LOGITS};
    int rc = k3_multistep_run(ms, segs, n, logits, err);
    for (int i = 0; status && i < n; i++) status[i] = segs[i].status;
    return rc;
}
