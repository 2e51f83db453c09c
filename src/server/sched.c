/* sched.c — the scheduler (worker.h): each round of the worker is one engine pass.
 *
 * Jobs are admitted into free slots in arrival order. Each round builds one multistep pass
 * (k3.h: several sessions in one pass) of every decoding slot's next id and, within the row
 * budget left, the next prompt chunk of the prefilling slots, oldest first: a long prefill
 * joins passes beside the others' decode rows instead of stalling them. Each row of a pass is
 * bit-identical to feeding its session alone, so a job's ids and text do not depend on what
 * else runs. A job that ends (stop, cancel, failure: a segment fails alone) leaves its slot
 * between passes; the others go on untouched. Slots with --spec step alone (k3_gen_step). */

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

/* One round: every decoding slot's next id (but those that sit out, k3_clients_mark_waiting) and the
 * prefill chunks that fit the row budget, in one multistep pass; then each slot takes its
 * result. Returns true when nothing ran because every running slot sits out. */
bool k3_sched_round(k3_server *s) {
    k3_worker_state *ws = s->ws;
    unsigned long long round = ++ws->rounds;
    int n = 0, rows = 0, stepped = 0, waiting = k3_clients_mark_waiting(s);
    for (int i = 0; i < ws->n_slots; i++) {
        k3_slot *w = &ws->slots[i];
        if (!w->j || w->done || w->phase != K3_SLOT_DECODE || w->waiting) continue;
        if (!w->batched) { /* --spec: alone, with its drafts */
            stepped++;
            int rc = k3_gen_step(&w->g, &w->err);
            if (rc) {
                k3_kept_feed_failed(w->c, rc);
                w->failed = true;
            }
            w->done = w->g.end != K3_GEN_RUNNING;
            continue;
        }
        if (!k3_gen_next(&w->g, &w->next)) { /* ended at this id, or cancelled */
            w->done = true;
            continue;
        }
        ws->segs[n] = (k3_multistep_seg){.session = w->c->sess, .ids = &w->next, .n_ids = 1,
                                         .flags = K3_MS_LAST_LOGITS};
        ws->seg_slot[n++] = w;
        rows++;
    }
    int budget = ws->chunk; /* prompt ids this pass, over all prefilling slots */
    for (k3_slot *w; budget > 0 && rows < ws->max_rows && (w = oldest_prefill(ws, round));) {
        w->round = round;
        if (k3_job_abandoned(s, w->j)) { /* the ids fed so far stay in its conversation */
            w->done = true;
            continue;
        }
        size_t at = (size_t)k3_session_pos(w->c->sess), left = w->j->n_prompt - at;
        int k = budget < ws->max_rows - rows ? budget : ws->max_rows - rows;
        if ((size_t)k > left) k = (int)left;
        ws->segs[n] = (k3_multistep_seg){
            .session = w->c->sess, .ids = w->j->prompt + at, .n_ids = k,
            .flags = (size_t)k == left ? K3_MS_LAST_LOGITS : K3_MS_NO_LOGITS};
        ws->seg_slot[n++] = w;
        rows += k;
        budget -= k;
    }
    if (!n) return waiting > 0 && !stepped;
    k3_err err;
    k3_multistep_run(ws->ms, ws->segs, n, ws->rows, &err); /* statuses are per segment */
    int ran = 0; /* a segment that was in the pass (a refused one was left out of it) */
    while (ran < n - 1 && ws->segs[ran].status) ran++;
    k3_srv_count_pass(s, rows, ws->segs[ran].session);
    for (int i = 0; i < n; i++) {
        k3_multistep_seg *g = &ws->segs[i];
        k3_slot *w = ws->seg_slot[i];
        if (g->status) {
            w->err = g->err;
            k3_kept_feed_failed(w->c, g->status);
        } else if (g->logits_row >= 0) {
            memcpy(w->c->logits, ws->rows + (size_t)g->logits_row * (size_t)ws->vocab,
                   (size_t)ws->vocab * sizeof *ws->rows);
        }
        if (w->phase == K3_SLOT_DECODE) {
            if (k3_gen_fed(&w->g, g->status, &w->err)) w->failed = true;
            w->done = w->g.end != K3_GEN_RUNNING;
        } else if (g->status) {
            k3_slot_failed(w);
        } else if (g->flags == K3_MS_LAST_LOGITS) {
            k3_slot_start_decode(s, w);
        }
    }
    return false;
}
