/* worker.c — the worker thread (worker.h lists the files of the worker): it admits queued
 * jobs into free slots, runs the scheduler's rounds (sched.c) and ends the slots' jobs; it
 * owns every session. Connection threads hand it jobs through s->head/tail under s->mu and
 * wait on s->progress; it signals s->progress after every change a connection may wait for.
 * A slow streaming client never makes it wait (clients.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tok/tokenizer.h"
#include "worker.h"

/* ---- the worker thread ------------------------------------------------------------------------ */

static void *worker_main(void *arg) {
    k3_server *s = arg;
    k3_worker_state *ws = s->ws;
    k3_slot *admitted[K3_SRV_MAX_PARALLEL];
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->n_active && !s->head && !s->stopping) pthread_cond_wait(&s->work, &s->mu);
        if (s->stopping) break;
        int na = 0; /* admission: free slots take queued jobs in arrival order */
        for (int i = 0; i < ws->n_slots && s->head; i++) {
            k3_slot *w = &ws->slots[i];
            if (w->j) continue;
            k3_job *j = s->head;
            s->head = j->next;
            if (!s->head) s->tail = NULL;
            s->n_queued--;
            s->n_active++;
            j->state = K3_JOB_RUNNING;
            w->j = j;
            w->admitted = ++ws->admissions;
            admitted[na++] = w;
        }
        if (na) pthread_cond_broadcast(&s->progress);
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < na; i++) k3_slot_begin(s, admitted[i], admitted[i]->j);
        bool idle = k3_sched_round(s);
        for (int i = 0; i < ws->n_slots; i++)
            if (ws->slots[i].j && ws->slots[i].done) k3_slot_finish(s, &ws->slots[i]);
        pthread_mutex_lock(&s->mu);
        if (idle) k3_clients_wait_locked(s); /* no spinning while every client is behind */
    }
    /* Stopping: running jobs end where they are (their clients get what was sent, or 503),
     * queued ones unserved. */
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < ws->n_slots; i++)
        if (ws->slots[i].j) {
            ws->slots[i].failed = false;
            if (ws->slots[i].phase == K3_SLOT_DECODE) ws->slots[i].g.end = K3_GEN_INTERRUPTED;
            k3_slot_finish(s, &ws->slots[i]);
        }
    pthread_mutex_lock(&s->mu);
    for (k3_job *j = s->head, *next; j; j = next) {
        next = j->next;
        j->cancel = true;
        j->state = K3_JOB_DONE;
    }
    s->head = s->tail = NULL;
    s->n_queued = 0;
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void worker_state_free(k3_worker_state *w) {
    if (!w) return;
    k3_pcache_close(w->pc);
    for (int i = 0; i < w->n_slots; i++) k3_slot_free(&w->slots[i]);
    free(w->slots);
    for (int i = 0; i < w->n_convs; i++) k3_kept_free(&w->convs[i]);
    free(w->convs);
    k3_multistep_free(w->ms);
    free(w->segs);
    free(w->seg_slot);
    free(w->rows);
    k3_srv_test_free(w);
    free(w);
}



/* The pass of n slots: the prompt ids of --chunk, by default as many as the memory plan gives
 * a prompt pass (the session's chunk: expert-major prefill, each expert its ids chose read
 * once per pass), beside every slot's decode row and its --spec drafts (drafts beyond the
 * largest pass are not proposed: the scheduler gives them the rows left). */
static int pass_new(k3_server *s, k3_worker_state *w, int n, k3_err *err) {
    int decode = n * (1 + (s->o.spec > 0 ? s->o.spec : 0));
    w->chunk = s->o.chunk > 0 ? s->o.chunk : k3_session_chunk(w->convs[0].sess) - decode;
    if (w->chunk < K3_DEFAULT_CHUNK) w->chunk = K3_DEFAULT_CHUNK;
    if (w->chunk > K3_MULTISTEP_MAX_ROWS - n) w->chunk = K3_MULTISTEP_MAX_ROWS - n;
    long rows = (long)w->chunk + decode;
    w->max_rows = rows < K3_MULTISTEP_MAX_ROWS ? (int)rows : K3_MULTISTEP_MAX_ROWS;
    /* logits rows: one per decode row (a verification wants one per id), one echo chunk of
     * K3_DEFAULT_CHUNK positions and each prompt's last position, not one per prompt id (a
     * row is vocab_size floats: 655 KB at K3's vocabulary) */
    rows = (long)decode + K3_DEFAULT_CHUNK + n;
    w->logit_rows = rows < w->max_rows ? (int)rows : w->max_rows;
    w->segs = calloc((size_t)w->max_rows, sizeof *w->segs);
    w->seg_slot = calloc((size_t)w->max_rows, sizeof *w->seg_slot);
    w->rows = malloc((size_t)w->logit_rows * (size_t)w->vocab * sizeof *w->rows);
    if (!w->segs || !w->seg_slot || !w->rows) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    return k3_multistep_new(s->eng, w->max_rows, &w->ms, err);
}

int k3_worker_start(k3_server *s, k3_err *err) {
    k3_worker_state *w = calloc(1, sizeof *w);
    if (!w) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    s->ws = w;
    const k3_config *c = k3_engine_config(s->eng);
    const k3_tokenizer *tok = k3_engine_tokenizer(s->eng);
    w->vocab = c->vocab_size;
    int n = s->o.parallel > 0 ? s->o.parallel : 1;
    if (n > K3_SRV_MAX_PARALLEL)
        return k3_fail(err, K3_ERR_USAGE, "parallel %d: at most %d generations at once", n,
                       K3_SRV_MAX_PARALLEL);
    w->n_slots = n;
    /* every slot needs a conversation of its own; the rest is the cache's */
    w->cap_convs = s->o.state_cache > n ? s->o.state_cache : n;
    w->convs = calloc((size_t)w->cap_convs, sizeof *w->convs);
    w->slots = calloc((size_t)n, sizeof *w->slots);
    if (!w->convs || !w->slots) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    w->trace = (k3_trace){.user = s, .on_layer = k3_sched_pass_unwanted};
    /* The first conversation now: it tells the context, and a bad --ctx fails the start. */
    int rc = k3_kept_new(s, &w->convs[0], err);
    if (rc) return rc;
    w->n_convs = 1;
    if ((rc = pass_new(s, w, n, err))) return rc;
    if (s->o.prompt_cache &&
        (rc = k3_pcache_open(s->eng, s->o.prompt_cache, s->o.prompt_cache_gb > 0
                             ? s->o.prompt_cache_gb : K3_PCACHE_DEFAULT_GB,
                             s->o.prompt_cache_ram, &w->pc, err)))
        return rc;
    w->eom = k3_tokenizer_special_id(tok, K3_TOK_END_OF_MSG);
    k3_stops_init(&w->stops, tok, c->eos_token_id);
    s->ctx = k3_session_max_ctx(w->convs[0].sess);
    s->slots = n;
    s->states_cap = w->cap_convs;
    for (int i = 0; i < n; i++) {
        k3_slot *sl = &w->slots[i];
        k3_reply_parser_init(&sl->parser, tok, &w->stops, false);
        sl->text_cap = k3_reply_parser_out_cap(tok);
        sl->text = malloc(sl->text_cap);
        sl->em = k3_emitter_new();
        if (!sl->text || !sl->em) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    if ((rc = k3_srv_test_start(w, tok, err))) return rc;
    if (pthread_create(&s->worker, NULL, worker_main, s))
        return k3_fail(err, K3_ERR_GENERIC, "cannot start the worker thread");
    s->worker_started = true;
    return 0;
}

void k3_worker_stop(k3_server *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->work);
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->mu);
    if (s->worker_started) pthread_join(s->worker, NULL);
    s->worker_started = false;
    worker_state_free(s->ws);
    s->ws = NULL;
}
