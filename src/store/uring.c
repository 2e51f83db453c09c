/* uring.c — the io_uring engine (issue 16): one thread keeps up to load_threads expert reads
 * in flight on one ring instead of load_threads threads each blocked in pread. It takes and
 * finishes reads through store.c's k3_store_take_read / k3_store_finish_read, so the queue
 * rules (demand first, at most load_threads - 1 prefetches) and publishing (READY only when
 * every span arrived) are the thread pool's, and each span is completed as io.c's read_span
 * does: a short read resubmits the rest (from the block boundary below under O_DIRECT),
 * -EINTR / -EAGAIN are resubmitted, a read that brings nothing new is end of file.
 *
 * The thread sleeps on st->work when nothing is in flight, else in io_uring_wait_cqe; an
 * eventfd polled on the ring wakes it there when a demand read is queued meanwhile, so a
 * demand read never waits for an in-flight read to complete before it is submitted. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "store_internal.h"

#define WAKE_TAG ((uint64_t)-1) /* user_data of the eventfd poll */

enum req_state { REQ_FREE, REQ_START, REQ_FLYING, REQ_DONE };

/* One expert read in flight: its slot, which span, and that span's progress. */
typedef struct uring_req {
    int state, slot, is_pf, key, n_spans, span, err, shard;
    double t0;
    k3_span sp[K3_EXPERT_PARTS];
    uint64_t done, reached, at, bytes; /* as in read_span: bytes of the span done / arrived */
} uring_req;

struct k3_uring {
    struct io_uring ring;
    int efd;
    uint64_t efd_buf;
    pthread_t thr;
    int depth;
    uring_req *req; /* [depth] */
};

static uint64_t align_down(uint64_t x) { return x / K3_IO_ALIGN * K3_IO_ALIGN; }
static uint64_t align_up(uint64_t x) { return align_down(x + K3_IO_ALIGN - 1); }

static void arm_wake(struct k3_uring *u) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (!sqe) return; /* cannot happen: the ring holds depth reads + this poll */
    io_uring_prep_poll_add(sqe, u->efd, POLLIN);
    io_uring_sqe_set_data64(sqe, WAKE_TAG);
}

static void fail(uring_req *r, int e, uint64_t at) {
    r->err = e;
    r->at = at;
    r->state = REQ_DONE;
}

/* Queues the read of what remains of r's current span (the hook may shrink it or inject an
 * errno, as before a pread), or finishes r when its last span is complete. */
static void next_sqe(k3_store *st, struct k3_uring *u, int i) {
    uring_req *r = &u->req[i];
    for (;;) {
        const k3_span *sp = &r->sp[r->span];
        if (r->reached >= sp->need) { /* span complete */
            if (st->dontneed)
                posix_fadvise(st->fd[sp->shard], (off_t)sp->start, (off_t)sp->len,
                              POSIX_FADV_DONTNEED);
            if (++r->span == r->n_spans) { r->state = REQ_DONE; return; }
            r->done = r->reached = 0;
            continue;
        }
        r->shard = sp->shard;
        size_t want = (size_t)(sp->len - r->done);
        if (st->hook) {
            int e = st->hook(st->hook_user, sp->shard, sp->start + r->done, &want);
            if (st->direct && want < sp->len - r->done) want = (size_t)align_up(want);
            if (e == EINTR) continue;
            if (e) { fail(r, e, sp->start + r->done); return; }
        }
        struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
        if (!sqe) { fail(r, EBUSY, sp->start + r->done); return; } /* cannot happen */
        uint8_t *dst = st->arena + (size_t)r->slot * st->slot_bytes + sp->region + r->done;
        io_uring_prep_read(sqe, st->fd[sp->shard], dst, (unsigned)want, sp->start + r->done);
        io_uring_sqe_set_data64(sqe, (uint64_t)i);
        r->state = REQ_FLYING;
        return;
    }
}

/* A completion of r's read: res bytes, or -errno. */
static void on_cqe(k3_store *st, struct k3_uring *u, int i, int res) {
    uring_req *r = &u->req[i];
    const k3_span *sp = &r->sp[r->span];
    if (res == -EINTR || res == -EAGAIN) { next_sqe(st, u, i); return; }
    if (res < 0) { fail(r, -res, sp->start + r->done); return; }
    uint64_t end = r->done + (uint64_t)res;
    r->bytes += (uint64_t)res;
    if (end <= r->reached || res == 0) { fail(r, -1, sp->start + r->reached); return; }
    r->reached = end;
    r->done = st->direct ? align_down(end) : end;
    next_sqe(st, u, i);
}

/* Starts a taken read: a streaming install's missing expert comes from the source first
 * (synchronously, on this thread: rare, and the source is network-bound anyway). */
static void start_req(k3_store *st, struct k3_uring *u, int i) {
    uring_req *r = &u->req[i];
    if (st->source.read) {
        int e = k3_store_read_source(st, r->key, st->arena + (size_t)r->slot * st->slot_bytes,
                                     &r->shard, &r->at, &r->bytes);
        if (e != 1) { r->err = e; r->state = REQ_DONE; return; }
    }
    r->n_spans = k3_store_expert_spans(st, r->key, r->sp);
    r->shard = r->sp[0].shard;
    next_sqe(st, u, i);
}

static void *uring_main(void *arg) {
    k3_store *st = arg;
    struct k3_uring *u = st->uring;
    int active = 0;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        for (int i = 0; i < u->depth; i++) /* publish what completed (under mu) */
            if (u->req[i].state == REQ_DONE) {
                uring_req *r = &u->req[i];
                k3_store_finish_read(st, r->slot, r->is_pf, r->err, r->shard, r->at, r->bytes,
                                     r->t0);
                r->state = REQ_FREE;
                active--;
            }
        if (st->stop && !active) break; /* in-flight reads land in the arena: drain first */
        for (int i = 0; i < u->depth && !st->stop; i++) {
            if (u->req[i].state != REQ_FREE) continue;
            int is_pf;
            double t0;
            int s = k3_store_take_read(st, &is_pf, &t0);
            if (s < 0) break;
            u->req[i] = (uring_req){.state = REQ_START, .slot = s, .is_pf = is_pf,
                                    .key = st->slots[s].key, .t0 = t0};
            active++;
        }
        if (!active) {
            pthread_cond_wait(&st->work, &st->mu);
            continue;
        }
        pthread_mutex_unlock(&st->mu);
        int flying = 0, done = 0;
        for (int i = 0; i < u->depth; i++) {
            if (u->req[i].state == REQ_START) start_req(st, u, i);
            flying += u->req[i].state == REQ_FLYING;
            done += u->req[i].state == REQ_DONE;
        }
        int rc = io_uring_submit(&u->ring);
        /* -EINTR / -EAGAIN / -EBUSY: the queued entries stay in the ring, submitted next
         * time round; wait only when nothing is left to publish */
        struct io_uring_cqe *cqe;
        if (flying && !done && (rc >= 0 || rc == -EBUSY) &&
            io_uring_wait_cqe(&u->ring, &cqe) == 0) {
            unsigned head, n = 0;
            io_uring_for_each_cqe(&u->ring, head, cqe) {
                uint64_t tag = io_uring_cqe_get_data64(cqe);
                n++;
                if (tag == WAKE_TAG) {
                    if (read(u->efd, &u->efd_buf, sizeof u->efd_buf) < 0) { /* EAGAIN: none */ }
                    arm_wake(u);
                } else {
                    on_cqe(st, u, (int)tag, cqe->res);
                }
            }
            io_uring_cq_advance(&u->ring, n);
        }
        pthread_mutex_lock(&st->mu);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

int k3_uring_start(k3_store *st) {
    struct k3_uring *u = calloc(1, sizeof *u);
    if (!u) return ENOMEM;
    u->depth = st->n_threads;
    u->req = calloc((size_t)u->depth, sizeof *u->req);
    u->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int e = !u->req ? ENOMEM : u->efd < 0 ? errno : 0;
    if (!e) e = -io_uring_queue_init((unsigned)u->depth + 1, &u->ring, 0);
    if (e) {
        if (u->efd >= 0) close(u->efd);
        free(u->req);
        free(u);
        return e;
    }
    st->uring = u;
    arm_wake(u);
    if (pthread_create(&u->thr, NULL, uring_main, st)) {
        st->uring = NULL;
        io_uring_queue_exit(&u->ring);
        close(u->efd);
        free(u->req);
        free(u);
        return EAGAIN;
    }
    return 0;
}

void k3_uring_wake(k3_store *st) {
    uint64_t one = 1;
    if (write(st->uring->efd, &one, sizeof one) < 0) { /* EAGAIN: already signalled */ }
}

void k3_uring_stop(k3_store *st) {
    struct k3_uring *u = st->uring;
    k3_uring_wake(st); /* st->stop is set: wake it from io_uring_wait_cqe */
    pthread_join(u->thr, NULL);
    io_uring_queue_exit(&u->ring);
    close(u->efd);
    free(u->req);
    free(u);
    st->uring = NULL;
}
