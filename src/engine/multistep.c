/* multistep.c — several sessions in one pass (k3.h "several sessions in one pass", issue 18).
 *
 * The call checks everything it can before the pass, so that a segment that cannot run (an id
 * out of range, a full context) is left out and reported alone; then the segments that can run
 * go through the model in one pass. A device backend, and rank 0 of an MPI run, step them
 * one after another instead (shared_pass). */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "../store/store.h"
#include "../util/clock.h"
#include "../util/sigbus.h"

struct k3_multistep {
    const k3_engine *e;
    int max_rows;
    int moe_layers;
    k3_multistep_stats stats;
    k3_multistep_seg *step_segs; /* [max_rows] k3_sessions_step's segments (off the stack) */
    k3_batch *b;                 /* the pass's scratch for max_rows rows (CPU) */
    k3_store_client *client;     /* asks the store for each MoE layer's union */
    k3_batch_seg *bsegs;         /* [max_rows] the segments that run */
    int *live;                   /* [max_rows] their indices in the call's segments */
};

/* Whether segments share one pass: on the CPU, and not as rank 0 of an MPI run, whose
 * followers replay session ops one by one (each session's step or pass, engine.c) and know
 * nothing of a pass over several sessions. Otherwise the segments go one after another. */
static bool shared_pass(const k3_engine *e) {
    return !strcmp(k3_backend_name(e->backend), "cpu") && !e->rank_ops;
}

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
    ms->bsegs = calloc((size_t)max_rows, sizeof *ms->bsegs);
    ms->live = calloc((size_t)max_rows, sizeof *ms->live);
    bool cpu = shared_pass(e);
    if (cpu) ms->b = k3_batch_new(&e->model, max_rows);
    int rc = K3_OK;
    if (!ms->step_segs || !ms->bsegs || !ms->live || (cpu && !ms->b))
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory for a %d-row pass", max_rows);
    if (!rc && e->store) rc = k3_store_client_new(e->store, &ms->client, err);
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
    free(ms->bsegs);
    free(ms->live);
    k3_batch_free(ms->b);
    k3_store_client_free(ms->client);
    free(ms);
}

int k3_multistep_max_rows(const k3_multistep *ms) { return ms->max_rows; }

uint64_t k3_multistep_plan_bytes(const k3_engine *e, int max_rows) {
    if (max_rows < 1) max_rows = 1;
    uint64_t segs = (uint64_t)max_rows * (sizeof(k3_multistep_seg) + sizeof(k3_batch_seg) +
                                          sizeof(int));
    bool cpu = shared_pass(e);
    return sizeof(k3_multistep) + segs + (cpu ? k3_batch_bytes(&e->model, max_rows) : 0);
}

static int seg_rows(const k3_multistep_seg *g) {
    return g->flags == K3_MS_ALL_LOGITS ? g->n_ids : g->flags == K3_MS_NO_LOGITS ? 0 : 1;
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
        else if (g->flags != K3_MS_LAST_LOGITS && g->flags != K3_MS_ALL_LOGITS &&
                 g->flags != K3_MS_NO_LOGITS)
            k3_fail(&e, K3_ERR_USAGE, "segment %d: flags %d (expected K3_MS_LAST_LOGITS, "
                    "K3_MS_ALL_LOGITS or K3_MS_NO_LOGITS)", i, g->flags);
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

/* Checks of one segment against its session (its ids, its context): K3_ERR_INPUT leaves the
 * segment out of the pass. */
static int check_seg(k3_multistep_seg *g) {
    const k3_config *c = &g->session->e->cfg;
    const k3_state *st = g->session->state;
    for (int i = 0; i < g->n_ids; i++)
        if (g->ids[i] < 0 || g->ids[i] >= c->vocab_size)
            return k3_fail(&g->err, K3_ERR_INPUT, "token id %d is outside the vocabulary "
                           "[0, %d)", g->ids[i], c->vocab_size);
    if (k3_state_pos(st) + g->n_ids > k3_state_max_ctx(st))
        return k3_fail(&g->err, K3_ERR_INPUT, "the context is full (%d positions, %d used, %d "
                       "more asked); start a new session or raise --ctx", k3_state_max_ctx(st),
                       k3_state_pos(st), g->n_ids);
    return K3_OK;
}

/* Segment by segment, each as its session alone (a device backend, or a pass of one id): a
 * single id through k3_session_step, several through k3_session_forward. The same results. */
static void run_one_by_one(k3_multistep_seg *segs, int n, float *logits, size_t V) {
    for (int i = 0; i < n; i++) {
        k3_multistep_seg *g = &segs[i];
        if (g->status) continue;
        float *rows = logits && g->logits_row >= 0 ? logits + (size_t)g->logits_row * V : NULL;
        g->status = g->n_ids == 1
                        ? k3_session_step(g->session, g->ids[0], rows, &g->err)
                        : k3_session_forward(g->session, g->ids, g->n_ids, rows,
                                             g->flags == K3_MS_ALL_LOGITS ? K3_FWD_ALL_LOGITS : 0,
                                             &g->err);
    }
}

/* The segments that passed check_seg, in one pass through the model (the CPU). Their logits
 * come out packed, live segment after live segment, and are then moved to their rows of the
 * call's layout (back to front: every row moves to the same or a later row). */
static void run_pass(k3_multistep *ms, k3_multistep_seg *segs, int n, float *logits, size_t V) {
    const k3_engine *e = ms->e;
    int nl = 0, packed = 0;
    for (int i = 0; i < n; i++) {
        k3_multistep_seg *g = &segs[i];
        if (g->status) continue;
        k3_session *s = g->session;
        memcpy(s->tokens + k3_state_pos(s->state), g->ids, (size_t)g->n_ids * sizeof *g->ids);
        ms->bsegs[nl] = (k3_batch_seg){
            .s = s->state, .tokens = g->ids, .n = g->n_ids,
            .flags = g->flags == K3_MS_ALL_LOGITS ? K3_BATCH_ALL_LOGITS
                   : g->flags == K3_MS_NO_LOGITS ? K3_BATCH_NO_LOGITS : 0,
            .trace = s->has_trace ? &s->trace : NULL};
        ms->live[nl++] = i;
    }
    int pos0[K3_MULTISTEP_MAX_ROWS];
    for (int j = 0; j < nl; j++) pos0[j] = k3_state_pos(ms->bsegs[j].s);
    k3_err perr = {0};
    uint64_t faults = k3_sigbus_faults();
    k3_sigbus_arm();
    int rc = k3_forward_multi(&e->model, ms->b, ms->client, ms->bsegs, nl, logits, &perr);
    k3_sigbus_disarm();
    int fault = k3_engine_mapped_fault(e, faults, rc ? NULL : &perr);
    if (!rc) rc = fault;
    if (rc) { /* the shared pass failed: every session in it has a half-fed state */
        for (int j = 0; j < nl; j++) {
            k3_multistep_seg *g = &segs[ms->live[j]];
            g->status = rc;
            g->err = perr;
            k3_session_reset(g->session); /* see failed_pass in engine.c */
        }
        return;
    }
    for (int j = 0; j < nl; j++) packed += seg_rows(&segs[ms->live[j]]);
    for (int j = nl - 1; j >= 0 && logits; j--) {
        const k3_multistep_seg *g = &segs[ms->live[j]];
        int r = seg_rows(g);
        packed -= r;
        if (r && packed != g->logits_row)
            memmove(logits + (size_t)g->logits_row * V, logits + (size_t)packed * V,
                    (size_t)r * V * sizeof *logits);
    }
    for (int j = 0; j < nl && logits; j++) { /* non-finite rows fail their own segment */
        k3_multistep_seg *g = &segs[ms->live[j]];
        int r = seg_rows(g);
        if (r) g->status = k3_engine_check_logits(e, logits + (size_t)g->logits_row * V, r,
                                                  pos0[j] + g->n_ids - r, &g->err);
    }
}

int k3_multistep_run(k3_multistep *ms, k3_multistep_seg *segs, int n, float *logits,
                     k3_err *err) {
    int rc = check_call(ms, segs, n, err);
    if (rc) return rc;
    size_t V = (size_t)ms->e->cfg.vocab_size;
    int row = 0, live = 0, rows = 0;
    for (int i = 0; i < n; i++) {
        k3_multistep_seg *g = &segs[i];
        int r = seg_rows(g);
        g->logits_row = r ? row : -1;
        row += r;
        g->err = (k3_err){0};
        g->status = check_seg(g);
        if (!g->status) live++, rows += g->n_ids;
    }
    double t0 = k3_now_s();
    uint64_t experts = ms->b ? k3_batch_experts(ms->b) : 0;
    uint64_t row_experts = (uint64_t)rows * (uint64_t)ms->moe_layers *
                           (uint64_t)ms->e->cfg.num_experts_per_token;
    /* one id alone takes the single-step path (its products are matrix-vector ones, its
     * experts one parallel region): the same bits, less overhead */
    bool pass = ms->b && rows > 1;
    if (live && pass) {
        run_pass(ms, segs, n, logits, V);
        k3_engine_note_pass(ms->e);
    } else if (live) run_one_by_one(segs, n, logits, V);
    if (live) {
        ms->stats.experts += pass ? k3_batch_experts(ms->b) - experts : row_experts;
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
