/* sched.c — the scheduler (worker.h): each round of the worker is one engine pass.
 *
 * Jobs are admitted into free slots in arrival order. Each round builds one multistep pass
 * (k3.h: several sessions in one pass) of every decoding slot's next id and, within the row
 * budget left, the next prompt chunk of the prefilling slots, oldest first: a long prefill
 * joins passes beside the others' decode rows instead of stalling them. Each row of a pass is
 * bit-identical to feeding its session alone, so a job's ids and text do not depend on what
 * else runs. A job that ends (stop, cancel, failure: a segment fails alone) leaves its slot
 * between passes; the others go on untouched. With --spec a decoding slot's row is a
 * verification (its id and its drafts, rewindable) in the same pass; an echo prompt is
 * prefilled in the same passes with the logits of every position. Nothing runs alone. */

#include <string.h>

#include "worker.h"

/* The prefilling slot admitted first among those not yet given a chunk this round. */
static k3_slot *oldest_prefill(k3_worker_state *ws, unsigned long long round) {
    k3_slot *best = NULL;
    for (int i = 0; i < ws->n_slots; i++) {
        k3_slot *w = &ws->slots[i];
        if (w->j && w->phase == K3_SLOT_PREFILL && !w->done && w->round != round &&
            (!best || w->admitted < best->admitted))
            best = w;
    }
    return best;
}

/* Adds slot w's segment (n ids from ids, K3_MS_* flags) to the round's pass. */
static void add_seg(k3_worker_state *ws, int *n, k3_slot *w, const int32_t *ids, int k,
                    int flags) {
    ws->segs[*n] = (k3_multistep_seg){.session = w->c->sess, .ids = ids, .n_ids = k,
                                      .flags = flags};
    ws->seg_slot[(*n)++] = w;
    w->fed_n = k;
}

/* The decoding slots' rows (but those that sit out, k3_clients_mark_waiting): each one's next
 * id and, with --spec, its drafts as a verification. Returns the rows added. */
static int decode_rows(k3_server *s, int *n) {
    k3_worker_state *ws = s->ws;
    int rows = 0;
    for (int i = 0; i < ws->n_slots; i++) {
        k3_slot *w = &ws->slots[i];
        int32_t id;
        if (!w->j || w->done || w->phase != K3_SLOT_DECODE || w->waiting) continue;
        if (!k3_gen_next(&w->g, &id)) { /* ended at this id, or cancelled */
            w->done = true;
            continue;
        }
        const int32_t *ids;
        int k = k3_gen_feed_ids(&w->g, id, ws->max_rows - rows - 1, &ids);
        add_seg(ws, n, w, ids, k,
                k > 1 ? K3_MS_ALL_LOGITS | K3_MS_REWINDABLE : K3_MS_LAST_LOGITS);
        rows += k;
    }
    return rows;
}

/* The prefilling slots' next prompt chunks within the chunk budget, the rows left and the
 * logits rows left (logits: those the decode rows took), oldest first (the one prefill path,
 * k3_prefill_next). An echo prompt wants a logits row per id: its chunks are at most
 * K3_DEFAULT_CHUNK ids. Returns the rows added. */
static int prefill_rows(k3_server *s, int *n, int rows, int logits, unsigned long long round) {
    k3_worker_state *ws = s->ws;
    int budget = ws->chunk, added = 0; /* prompt ids this pass, over all prefilling slots */
    for (k3_slot *w; budget > 0 && rows + added < ws->max_rows && logits < ws->logit_rows &&
                     (w = oldest_prefill(ws, round));) {
        w->round = round;
        if (k3_job_abandoned(s, w->j)) { /* the ids fed so far stay in its conversation */
            w->done = true;
            continue;
        }
        const int32_t *ids;
        int room = ws->max_rows - rows - added, max = budget < room ? budget : room;
        if (w->echo && max > ws->logit_rows - logits) max = ws->logit_rows - logits;
        if (w->echo && max > K3_DEFAULT_CHUNK) max = K3_DEFAULT_CHUNK;
        if (w->next_mark < w->n_marks && w->marks[w->next_mark] - w->pf.at < (size_t)max)
            max = (int)(w->marks[w->next_mark] - w->pf.at); /* the chunk ends at a snapshot */
        int k = k3_prefill_next(&w->pf, max, &ids);
        bool last = w->pf.at + (size_t)k == w->pf.n;
        add_seg(ws, n, w, ids, k, w->echo ? K3_MS_ALL_LOGITS
                                  : last ? K3_MS_LAST_LOGITS : K3_MS_NO_LOGITS);
        logits += w->echo ? k : last;
        added += k;
        budget -= k;
    }
    return added;
}

/* A queued job whose prompt begins with all that prefilling slot w's pass feeds: the same
 * request re-sent by a client that gave up on the first copy (Claude Code re-sends after 300 s
 * without a byte). The pass then runs on: the cancelled copy's state stays in its conversation
 * (prefill_rows) and the re-sent one starts from it. */
static bool twin_queued(k3_server *s, const k3_slot *w) {
    if (w->phase != K3_SLOT_PREFILL) return false;
    size_t end = w->pf.at + (size_t)w->fed_n;
    bool found = false;
    pthread_mutex_lock(&s->mu);
    for (const k3_job *q = s->head; q && !found; q = q->next)
        found = q->n_prompt >= end && !memcmp(q->prompt, w->pf.ids, end * sizeof *q->prompt);
    pthread_mutex_unlock(&s->mu);
    return found;
}

int k3_sched_pass_unwanted(void *user, int pos, int n, int layer, int n_layers) {
    k3_server *s = user;
    k3_worker_state *ws = s->ws;
    (void)n_layers;
    k3_srv_test_hold_pass(s, pos, n, layer); /* the test build's hold, if set */
    for (int i = 0; i < ws->pass_segs; i++)
        if (!k3_job_abandoned(s, ws->seg_slot[i]->j)) return 0;
    for (int i = 0; i < ws->pass_segs; i++)
        if (twin_queued(s, ws->seg_slot[i])) return 0;
    return ws->pass_segs > 0;
}

/* After the pass: a slot's segment's status and logits rows (from ws->rows). */
static void take_result(k3_server *s, k3_slot *w, k3_multistep_seg *g) {
    k3_worker_state *ws = s->ws;
    size_t V = (size_t)ws->vocab;
    const float *rows = g->logits_row >= 0 ? ws->rows + (size_t)g->logits_row * V : NULL;
    if (g->status == K3_ERR_INTERRUPTED) { /* k3_sched_pass_unwanted: its client is gone */
        /* the session is back where the pass began (k3.h): the passes before it stay in the
         * conversation, from which the same request re-sent goes on (k3_kept_pick) */
        w->err = g->err;
        w->c->logits_valid = false;
        w->done = true;
        return;
    }
    if (g->status) {
        w->err = g->err;
        k3_kept_feed_failed(w->c, g->status);
    }
    if (w->phase == K3_SLOT_DECODE) {
        if (!g->status) /* one row after a step, one per id after a verification */
            memcpy((float *)k3_gen_rows(&w->g), rows, (size_t)w->fed_n * V * sizeof *rows);
        if (k3_gen_fed(&w->g, g->status, &w->err)) w->failed = true;
        w->done = w->g.end != K3_GEN_RUNNING;
        return;
    }
    if (g->status) return k3_slot_failed(w);
    size_t at = w->pf.at;
    k3_prefill_fed(&w->pf, w->fed_n);
    if (w->echo) k3_slot_echo_rows(s, w, at, w->fed_n, rows);
    if (w->next_mark < w->n_marks && w->pf.at == w->marks[w->next_mark])
        k3_slot_snapshot(s, w); /* --prompt-cache: the state at a boundary, as a file */
    if (w->pf.at < w->pf.n) return;
    memcpy(w->c->logits, rows + (size_t)(w->echo ? w->fed_n - 1 : 0) * V, V * sizeof *rows);
    k3_slot_start_decode(s, w);
}

/* One round: every decoding slot's rows (its next id, with --spec its drafts) and the prefill
 * chunks (echo prompts included) that fit the row budget, in ONE pass; then each slot takes
 * its result. Returns true when nothing ran because every running slot sits out. */
bool k3_sched_round(k3_server *s) {
    k3_worker_state *ws = s->ws;
    unsigned long long round = ++ws->rounds;
    int n = 0, waiting = k3_clients_mark_waiting(s);
    int rows = decode_rows(s, &n);
    rows += prefill_rows(s, &n, rows, rows, round); /* a decode row wants its logits */
    if (!n) return waiting > 0;
    k3_err err;
    ws->pass_segs = n;
    k3_multistep_run(ws->ms, ws->segs, n, ws->rows, &err); /* statuses are per segment */
    ws->pass_segs = 0;
    int ran = 0; /* a segment that was in the pass (a refused one was left out of it) */
    while (ran < n - 1 && ws->segs[ran].status) ran++;
    k3_srv_count_pass(s, rows, ws->segs[ran].session);
    for (int i = 0; i < n; i++) take_result(s, ws->seg_slot[i], &ws->segs[i]);
    return false;
}
