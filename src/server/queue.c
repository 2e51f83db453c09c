/* queue.c — admission: N slots (--parallel) and a bounded FIFO (--queue) of jobs that
 * connection threads submit, cancel and wait on (worker.h). */
#include <stdlib.h>

#include "worker.h"

int k3_job_submit(k3_server *s, k3_job *j, k3_api_error *e) {
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return k3_api_fail(e, 503, "server_error", NULL, NULL, "the server is shutting down");
    }
    int busy = s->n_active + s->n_queued;
    if (busy >= s->slots + s->o.queue) {
        pthread_mutex_unlock(&s->mu);
        if (s->o.queue)
            return k3_api_fail(e, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
                               "k3 is generating and its queue of %d is full; retry later",
                               s->o.queue);
        if (s->slots > 1)
            return k3_api_fail(e, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
                               "k3 is generating %d replies (--parallel %d); retry later",
                               s->slots, s->slots);
        return k3_api_fail(e, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
                           "k3 is generating another reply (one at a time); retry later");
    }
    j->state = K3_JOB_QUEUED;
    j->next = NULL;
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    s->n_queued++;
    s->n_requests++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void k3_job_cancel_locked(k3_server *s, k3_job *j) {
    j->cancel = true;
    if (j->state != K3_JOB_QUEUED) return;
    k3_job **pp = &s->head, *prev = NULL;
    while (*pp && *pp != j) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (*pp) {
        *pp = j->next;
        if (s->tail == j) s->tail = prev;
        s->n_queued--;
    }
    j->state = K3_JOB_DONE;
    pthread_cond_broadcast(&s->progress);
}

void k3_job_wait_done(k3_server *s, k3_job *j, bool cancel) {
    pthread_mutex_lock(&s->mu);
    if (cancel) k3_job_cancel_locked(s, j);
    while (j->state != K3_JOB_DONE) pthread_cond_wait(&s->progress, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

void k3_job_free(k3_job *j) {
    if (!j) return;
    k3_srv_params_free(&j->p);
    cJSON_Delete(j->root);
    free(j->prompt);
    k3_sbuf_free(&j->out);
    k3_sbuf_free(&j->content);
    k3_sbuf_free(&j->reasoning);
    k3_sbuf_free(&j->tool_calls);
    k3_logprobs_free(&j->lp);
    free(j);
}
