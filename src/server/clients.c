/* clients.c — client polling (worker.h): a client that hung up, and a slow streaming client
 * whose backlog makes its slot sit out the rounds. Called by the worker and by http.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* POLLRDHUP; the Makefile passes it too, but not every build does */
#endif
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

#include "../util/clock.h"
#include "worker.h"

static short poll_now(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    int r;
    do r = poll(&p, 1, 0);
    while (r < 0 && errno == EINTR);
    return r > 0 ? p.revents : 0;
}

/* A FIN alone (POLLRDHUP) is also what a client that half-closes after its request sends
 * (issue 20, D6): only a reset or a dead socket says the client is gone. */
bool k3_srv_client_gone(int fd) { return poll_now(fd) & (POLLHUP | POLLERR | POLLNVAL); }

bool k3_srv_client_read_closed(int fd) { return poll_now(fd) & POLLRDHUP; }

bool k3_job_client_gone(const k3_job *j) {
    short ev = poll_now(j->fd);
    return (ev & (POLLHUP | POLLERR | POLLNVAL)) || (j->fin_gone && (ev & POLLRDHUP));
}

/* True when the job must end now: its client hung up, or the server is stopping. */
bool k3_job_abandoned(k3_server *s, k3_job *j) {
    pthread_mutex_lock(&s->mu);
    bool stop = j->cancel || s->stopping;
    pthread_mutex_unlock(&s->mu);
    if (!stop && k3_job_client_gone(j)) stop = true;
    return stop;
}

/* ---- slow clients -----------------------------------------------------------------------
 * A streamed reply's events wait in j->out until its connection hands them to the socket
 * (http.c, sse_read); emit.c appends without waiting. A decoding slot whose client has more
 * than s->stream_backlog bytes unread (K3_STREAM_BACKLOG_BYTES, 1 MiB) sits out the rounds
 * instead: it stays decoding and is not stepped, so its session, logits and next id are as it
 * left them, and it rejoins the pass where it was once the client has read below the limit.
 * The other slots go on meanwhile. Its backlog stays under the limit plus one round's events
 * (one id's, several with --spec, or a finish's last chunks). A sitting-out slot whose client
 * is gone (cancelled, hung up) or whose server stops ends at the next round, which comes
 * within K3_CLIENT_TICK_MS even when every slot sits out (k3_clients_wait_locked). A client
 * that stays connected without reading keeps its slot for o.stall_timeout_s at most (D21: with
 * one slot it would lock every other request out): then its job ends (cancelled, "stalled")
 * and its connection is shut down. /metrics counts slots sitting out (k3_streams_waiting). */

#define K3_CLIENT_TICK_MS 20 /* how often a worker with every slot sitting out looks again */

/* Unread stream bytes of slot w's job over the limit (s->stream_backlog, by default
 * K3_STREAM_BACKLOG_BYTES). Call with s->mu held. */
static bool client_behind_locked(const k3_server *s, const k3_slot *w) {
    const k3_job *j = w->j;
    return j->p.stream && j->out.len - j->out_taken > s->stream_backlog;
}

/* A sitting-out slot whose client has taken nothing for o.stall_timeout_s, counted from when
 * it began to sit out or the client's last read, whichever is later. Call with s->mu held. */
static bool stalled_locked(k3_server *s, k3_slot *w, bool was_waiting, double now) {
    if (!was_waiting) w->wait_since = now;
    double since = w->j->t_read > w->wait_since ? w->j->t_read : w->wait_since;
    return s->o.stall_timeout_s > 0 && now - since >= s->o.stall_timeout_s;
}

/* Before a round: marks the decoding slots that sit out it (w->waiting), ends those whose
 * client is gone or stalled, and publishes their count for /metrics. Returns that count. */
int k3_clients_mark_waiting(k3_server *s) {
    k3_worker_state *ws = s->ws;
    double now = k3_now_s();
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < ws->n_slots; i++) {
        k3_slot *w = &ws->slots[i];
        bool was = w->waiting;
        w->waiting = w->j && !w->done && w->phase == K3_SLOT_DECODE && client_behind_locked(s, w);
        if (w->waiting && stalled_locked(s, w, was, now)) w->j->stalled = true;
    }
    pthread_mutex_unlock(&s->mu);
    int n = 0;
    for (int i = 0; i < ws->n_slots; i++) {
        k3_slot *w = &ws->slots[i];
        if (w->waiting && w->j->stalled) /* its connection thread waits on the socket: wake it */
            shutdown(w->j->fd, SHUT_RDWR);
        if (w->waiting && (w->j->stalled || k3_job_abandoned(s, w->j))) { /* the job ends */
            w->waiting = false;
            w->g.end = K3_GEN_INTERRUPTED;
            w->done = true;
        }
        n += w->waiting;
    }
    pthread_mutex_lock(&s->mu);
    s->n_waiting = n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* With s->mu held, after a round in which every running slot sat out: sleeps until a
 * connection takes data (sse_read broadcasts s->progress) or K3_CLIENT_TICK_MS pass (a gone
 * client tells only a poll of its socket, a queued job only s->work), unless a client has
 * read below the limit already, the server stops or a queued job finds a free slot. */
void k3_clients_wait_locked(k3_server *s) {
    k3_worker_state *ws = s->ws;
    bool free_slot = false;
    for (int i = 0; i < ws->n_slots; i++) {
        const k3_slot *w = &ws->slots[i];
        if (w->waiting && !client_behind_locked(s, w)) return;
        free_slot |= !w->j;
    }
    if (s->stopping || (s->head && free_slot)) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* s->progress waits on the default clock */
    ts.tv_nsec += K3_CLIENT_TICK_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&s->progress, &s->mu, &ts);
}
