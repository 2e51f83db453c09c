/* dist.c — expert parallelism over MPI: see dist.h. */
#include "dist.h"

#include <mpi.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "../model/model.h" /* K3_BATCH_* flags of a pass's segments */
#include "../util/clock.h"

enum { TAG_OP = 11, TAG_EXCHANGE = 12, TAG_STATS = 13, TAG_STUCK = 14 };
enum { HOST_CAP = 64, LINE_CAP = 1536, MSG_CAP = 1024, MAX_SESSIONS = 8 };
enum { OP_QUIT = 100, OP_STATS = 101 };
/* An op on the wire: kind, session (2 ints), arg, flags, n, then n ids. */
enum { OP_HDR = 6, OP_INTS = OP_HDR + K3_ROP_PASS_INTS };
/* An exchange message: status, layer, floats that follow, bytes of message that follow. */
enum { XH_STATUS, XH_LAYER, XH_COUNT, XH_MSGLEN, XH_INTS };
/* The per-rank counters sent for the summary. */
enum { ST_REQ, ST_HITS, ST_PF_HITS, ST_BYTES, ST_READ_S, ST_BUSY_S, ST_COMM_S, ST_TOKENS,
       ST_SENT, ST_EXCH, ST_N };
/* A follower's report to rank 0 that an exchange is late: its index, the MoE layer, and the
 * peer it still waits on. */
enum { SR_EXCH, SR_LAYER, SR_ON, SR_INTS };

struct k3_dist {
    int rank, size;
    double timeout_s;
    char (*hosts)[HOST_CAP];
    k3_expert_ranks xr;
    k3_rank_ops ops;
    int broken;               /* an exchange or op failed mid-way: abort at close */
    int started;              /* every rank loaded: the followers wait for ops */
    /* exchange buffers: one send, one receive per peer, grown on need */
    int32_t *sbuf;
    size_t scap;              /* bytes */
    int32_t **rbuf;
    size_t *rcap;
    MPI_Request *req;         /* [2 * size]: receives, then sends */
    int *count, *cursor;      /* [size] */
    /* late exchanges: a follower's report in flight; rank 0's latest report per rank */
    int32_t stuck_out[SR_INTS];
    MPI_Request stuck_req;
    int32_t (*stuck)[SR_INTS]; /* [size], SR_EXCH -1: none */
    int stall_layer;          /* tests: k3_dist_test_stall's layer, -1: none */
    int32_t opbuf[OP_INTS];
    /* counters */
    double comm_s;            /* time inside exchanges */
    long tokens, exchanges;
    uint64_t bytes_sent;
    /* a follower's sessions, by rank 0's name for them */
    unsigned long long sid[MAX_SESSIONS];
    k3_session *sess[MAX_SESSIONS];
    k3_multistep *ms;        /* a follower's scratch for the passes rank 0 ran on one */
};

static int mpi_fail(k3_err *err, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
    return k3_fail(err, K3_ERR_DIST, "MPI: %s failed: %s", what, msg);
}

static void dist_free(k3_dist *d) {
    if (!d) return;
    for (int i = 0; d->rbuf && i < d->size; i++) free(d->rbuf[i]);
    free(d->rbuf);
    free(d->rcap);
    free(d->req);
    free(d->count);
    free(d->cursor);
    free(d->stuck);
    free(d->sbuf);
    free(d->hosts);
    free(d);
}

int k3_dist_open(double timeout_s, k3_dist **out, k3_err *err) {
    *out = NULL;
    if (!(timeout_s > 0))
        return k3_fail(err, K3_ERR_USAGE, "mpi_timeout %g: expected seconds > 0", timeout_s);
    int provided = 0, rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return k3_fail(err, K3_ERR_DIST, "MPI_Init_thread failed (%d)", rc);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (provided < MPI_THREAD_SERIALIZED) {
        MPI_Finalize();
        return k3_fail(err, K3_ERR_DIST, "this MPI gives thread level %d; k3 serve's worker "
                       "thread needs MPI_THREAD_SERIALIZED", provided);
    }
    int size = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (size < 2) {
        MPI_Finalize();
        return K3_OK;
    }
    k3_dist *d = calloc(1, sizeof *d);
    if (d) {
        d->hosts = calloc((size_t)size, sizeof *d->hosts);
        d->rbuf = calloc((size_t)size, sizeof *d->rbuf);
        d->rcap = calloc((size_t)size, sizeof *d->rcap);
        d->req = calloc(2 * (size_t)size, sizeof *d->req);
        d->count = calloc((size_t)size, sizeof *d->count);
        d->cursor = calloc((size_t)size, sizeof *d->cursor);
        d->stuck = calloc((size_t)size, sizeof *d->stuck);
    }
    if (!d || !d->hosts || !d->rbuf || !d->rcap || !d->req || !d->count || !d->cursor ||
        !d->stuck) {
        dist_free(d);
        MPI_Finalize();
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    d->rank = rank, d->size = size, d->timeout_s = timeout_s;
    d->stuck_req = MPI_REQUEST_NULL, d->stall_layer = -1;
    for (int r = 0; r < size; r++) d->stuck[r][SR_EXCH] = -1;
    char host[HOST_CAP] = "";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
    if ((rc = MPI_Allgather(host, HOST_CAP, MPI_CHAR, d->hosts, HOST_CAP, MPI_CHAR,
                            MPI_COMM_WORLD)) != MPI_SUCCESS) {
        dist_free(d);
        MPI_Abort(MPI_COMM_WORLD, K3_ERR_DIST);
        return mpi_fail(err, rc, "MPI_Allgather of the host names");
    }
    for (int r = 0; r < size; r++) d->hosts[r][HOST_CAP - 1] = 0;
    *out = d;
    return K3_OK;
}

int k3_dist_rank(const k3_dist *d) { return d->rank; }
int k3_dist_size(const k3_dist *d) { return d->size; }
const char *k3_dist_host(const k3_dist *d, int rank) { return d->hosts[rank]; }

/* ---- waiting with a deadline ----------------------------------------------------------- */

/* Backs off from spinning to short sleeps, so that an idle rank leaves the cores to the
 * kernels of the ranks that compute (one host often runs several). */
static void pause_for(int *idle) {
    if (++*idle < 64) {
        sched_yield();
        return;
    }
    long ns = *idle < 1000 ? 20000 : 200000; /* 20 µs, then 0.2 ms once it has been a while */
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* Tests reqs[n] until all complete or deadline (seconds; < 0 = none). done[i] is set per
 * completed request. Returns 1 when all completed, 0 at the deadline, -rc on an MPI error. */
static int wait_all(MPI_Request *reqs, int n, char *done, double deadline) {
    int left = 0, idle = 0;
    for (int i = 0; i < n; i++) left += !done[i];
    while (left) {
        int progressed = 0;
        for (int i = 0; i < n; i++) {
            if (done[i]) continue;
            int flag = 0, rc = MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) return -rc;
            if (flag) done[i] = 1, left--, progressed = 1;
        }
        if (!left) break;
        if (progressed) idle = 0;
        else pause_for(&idle);
        if (deadline >= 0 && k3_now_s() > deadline) return 0;
    }
    return 1;
}

static int grow(void **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    void *q = realloc(*p, need);
    if (!q) return -1;
    *p = q, *cap = need;
    return 0;
}

/* ---- the MoE exchange (model/pass.h) ----------------------------------------------------- */

/* Waits, at most 5 s, until the launcher has read what this rank wrote to fd: mpirun forwards
 * a rank's output through a pipe and drops what it has not yet read when an abort tears the
 * job down (a fixed pause was outrun on a loaded machine). A file or a terminal, where
 * FIONREAD fails or finds nothing pending, returns at once. */
static void wait_taken(int fd) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    for (int i = 0; i < 500; i++) {
        int pending = 0;
        if (ioctl(fd, FIONREAD, &pending) != 0 || pending <= 0) return;
        nanosleep(&ts, NULL);
    }
}

/* A rank that finds another lost (a deadline passed, MPI failed, the ranks diverged) ends the
 * whole job at once: the message goes to stderr here, because MPI_Abort is the one way to stop
 * ranks that are waiting on the lost one (a rank that returned its error and exited would
 * leave them, and a stopped rank, to mpirun's mercy) and the job is gone before main. */
static void lost(k3_dist *d, const k3_err *err) {
    fprintf(stderr, "k3: rank %d of %d (host %s): %s\n", d->rank, d->size, d->hosts[d->rank],
            err->msg);
    fflush(stdout);
    fflush(stderr);
    wait_taken(STDOUT_FILENO);
    wait_taken(STDERR_FILENO);
    /* and a moment for mpirun to write out what it read */
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
    MPI_Abort(MPI_COMM_WORLD, K3_ERR_DIST);
}

/* ---- who is lost ------------------------------------------------------------------------ */
/* A rank missing from an exchange may itself be waiting on another: rank 2 stopped after
 * sending layer L to rank 0 leaves rank 1 in layer L, and rank 0, already in layer L+1, would
 * blame rank 1. So a follower whose exchange is late (half its deadline) tells rank 0 whom it
 * waits on, and rank 0 follows those reports to the rank that is really lost. */

/* The first peer whose receive (else send) is still open in done[2 * N], or -1. */
static int first_missing(const k3_dist *d, const char *done) {
    for (int p = 0; p < 2 * d->size; p++)
        if (!done[p]) return p % d->size;
    return -1;
}

/* Follower: reports exchange d->exchanges (the one under way) at layer as late, waiting on peer `on`. One report
 * at a time; a report still in flight (rank 0 has not taken the last) skips this one. */
static void report_late(k3_dist *d, int layer, int on) {
    int flag = 1;
    if (d->stuck_req != MPI_REQUEST_NULL) MPI_Test(&d->stuck_req, &flag, MPI_STATUS_IGNORE);
    if (!flag) return;
    d->stuck_out[SR_EXCH] = (int32_t)d->exchanges, d->stuck_out[SR_LAYER] = layer;
    d->stuck_out[SR_ON] = on;
    if (MPI_Isend(d->stuck_out, SR_INTS, MPI_INT32_T, 0, TAG_STUCK, MPI_COMM_WORLD,
                  &d->stuck_req) != MPI_SUCCESS)
        d->stuck_req = MPI_REQUEST_NULL;
}

/* Rank 0: takes every report that has arrived, keeping the latest per rank. */
static void take_reports(k3_dist *d) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_STUCK, MPI_COMM_WORLD, &flag, &st) != MPI_SUCCESS ||
            !flag)
            return;
        int32_t r[SR_INTS];
        if (MPI_Recv(r, SR_INTS, MPI_INT32_T, st.MPI_SOURCE, TAG_STUCK, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return;
        if (st.MPI_SOURCE > 0 && st.MPI_SOURCE < d->size)
            memcpy(d->stuck[st.MPI_SOURCE], r, sizeof r);
    }
}

/* Rank 0: the rank to blame for missing peer p in exchange `exch` (done[2 * N] its requests):
 * p, unless p reported waiting (in this exchange or the one before) on another follower that
 * is missing here too, which is then followed (a report about a peer that has since been
 * heard from is stale). */
static int lost_rank(k3_dist *d, int p, long exch, const char *done) {
    take_reports(d);
    for (int hops = 0; hops < d->size; hops++) {
        const int32_t *r = d->stuck[p];
        int q = r[SR_ON];
        if (r[SR_EXCH] < exch - 1 || q <= 0 || q >= d->size || q == p ||
            (done[q] && done[d->size + q]))
            break;
        p = q;
    }
    return p;
}

void k3_dist_test_stall(k3_dist *d, int layer) { d->stall_layer = layer; }

/* k3_dist_test_stall: the send to rank 0 (d->req[i]) delivered and rank 0's message to this
 * rank (d->req[0]) taken, this rank stops itself. Taking rank 0's message too lets rank 0
 * finish this layer whatever the transport (a large send over shared memory completes only
 * once the receiver has moved it), so the test always sees rank 0 a layer ahead. */
static void stall(k3_dist *d, int i) {
    char one = 0, zero = 0;
    wait_all(&d->req[i], 1, &one, k3_now_s() + d->timeout_s);
    wait_all(&d->req[0], 1, &zero, k3_now_s() + d->timeout_s);
    d->stall_layer = -1;
    raise(SIGSTOP);
}

static int exchange_once(k3_dist *d, int layer, const int *ids, int rows, int k, float *outs,
                         int dim, int status, k3_err *err) {
    double t0 = k3_now_s();
    int N = d->size, me = d->rank, slots = rows * k;
    char own_msg[MSG_CAP] = "";
    if (status) snprintf(own_msg, sizeof own_msg, "%s", err && err->msg[0] ? err->msg : "failed");
    for (int r = 0; r < N; r++) d->count[r] = 0;
    for (int i = 0; i < slots; i++) d->count[k3_expert_owner(layer, ids[i], N)]++;
    /* my message: header, then my outputs in slot order (or my error's text) */
    size_t fl = (size_t)d->count[me] * (size_t)dim, msglen = status ? strlen(own_msg) + 1 : 0;
    size_t sbytes = XH_INTS * 4 + (status ? msglen : fl * sizeof(float));
    if (grow((void **)&d->sbuf, &d->scap, sbytes))
        return k3_fail(err, K3_ERR_GENERIC, "out of memory for the MPI exchange");
    d->sbuf[XH_STATUS] = status, d->sbuf[XH_LAYER] = layer;
    d->sbuf[XH_COUNT] = status ? 0 : d->count[me], d->sbuf[XH_MSGLEN] = (int32_t)msglen;
    if (status) {
        memcpy(d->sbuf + XH_INTS, own_msg, msglen);
    } else {
        float *dst = (float *)(d->sbuf + XH_INTS);
        for (int i = 0; i < slots; i++)
            if (k3_expert_owner(layer, ids[i], N) == me)
                memcpy(dst, outs + (size_t)i * dim, (size_t)dim * sizeof *dst), dst += dim;
    }
    char done[2 * 256] = {0};
    int nreq = 0, rc;
    if (N > 256) return k3_fail(err, K3_ERR_DIST, "%d ranks: at most 256", N);
    for (int p = 0; p < N; p++) {
        if (p == me) {
            d->req[nreq] = MPI_REQUEST_NULL, done[nreq++] = 1;
            continue;
        }
        size_t cap = XH_INTS * 4 + ((size_t)d->count[p] * dim * sizeof(float) > MSG_CAP
                                        ? (size_t)d->count[p] * dim * sizeof(float) : MSG_CAP);
        if (grow((void **)&d->rbuf[p], &d->rcap[p], cap))
            return k3_fail(err, K3_ERR_GENERIC, "out of memory for the MPI exchange");
        if ((rc = MPI_Irecv(d->rbuf[p], (int)cap, MPI_BYTE, p, TAG_EXCHANGE, MPI_COMM_WORLD,
                            &d->req[nreq++])) != MPI_SUCCESS) {
            d->broken = 1;
            return mpi_fail(err, rc, "MPI_Irecv");
        }
    }
    for (int p = 0; p < N; p++) {
        if (p == me) {
            d->req[nreq] = MPI_REQUEST_NULL, done[nreq++] = 1;
            continue;
        }
        if ((rc = MPI_Isend(d->sbuf, (int)sbytes, MPI_BYTE, p, TAG_EXCHANGE, MPI_COMM_WORLD,
                            &d->req[nreq++])) != MPI_SUCCESS) {
            d->broken = 1;
            return mpi_fail(err, rc, "MPI_Isend");
        }
        d->bytes_sent += sbytes;
        if (p == 0 && me == N - 1 && layer == d->stall_layer) stall(d, nreq - 1);
    }
    /* the followers wait twice as long, so that rank 0, which talks to the user, is the one
     * that names a lost rank; at half their deadline they tell rank 0 whom they wait on */
    double limit = me == 0 ? d->timeout_s : 2 * d->timeout_s;
    if (me == 0) take_reports(d);
    int all = wait_all(d->req, 2 * N, done, t0 + (me == 0 ? limit : d->timeout_s / 2));
    if (all == 0 && me != 0) {
        report_late(d, layer, first_missing(d, done));
        all = wait_all(d->req, 2 * N, done, t0 + limit);
    }
    d->comm_s += k3_now_s() - t0;
    long exch = d->exchanges++;
    if (all <= 0) {
        d->broken = 1;
        if (all < 0) return mpi_fail(err, -all, "the expert exchange");
        /* a receive still open: that peer sent nothing; else a send: that peer took nothing */
        int p = first_missing(d, done), silent = 0;
        for (int q = 0; q < N; q++) silent |= !done[q];
        int who = me == 0 ? lost_rank(d, p, exch, done) : p;
        if (who != p)
            return k3_fail(err, K3_ERR_DIST, "rank %d (host %s) sent nothing for MoE layer %d "
                           "within %.0f s: rank %d (host %s) waits on it (killed, hung, or its "
                           "host lost?); ending the run", who, d->hosts[who], layer, limit, p,
                           d->hosts[p]);
        return k3_fail(err, K3_ERR_DIST, "rank %d (host %s) %s MoE layer %d within %.0f s "
                       "(killed, hung, or its host lost?); ending the run", p, d->hosts[p],
                       silent ? "sent nothing for" : "took nothing of", layer, limit);
    }
    /* the first failed rank, the same on every rank */
    for (int p = 0; p < N; p++) {
        const int32_t *h = p == me ? d->sbuf : d->rbuf[p];
        if (h[XH_LAYER] != layer) {
            d->broken = 1;
            return k3_fail(err, K3_ERR_DIST, "rank %d (host %s) is at MoE layer %d, rank %d at "
                           "%d: the ranks ran different passes", p, d->hosts[p], h[XH_LAYER],
                           me, layer);
        }
        if (!h[XH_STATUS]) continue;
        char msg[MSG_CAP];
        size_t len = (size_t)h[XH_MSGLEN] < sizeof msg ? (size_t)h[XH_MSGLEN] : sizeof msg;
        memcpy(msg, h + XH_INTS, len);
        msg[len ? len - 1 : 0] = 0;
        return k3_fail(err, h[XH_STATUS], "rank %d (host %s) failed at MoE layer %d: %s", p,
                       d->hosts[p], layer, msg);
    }
    for (int p = 0; p < N; p++) {
        if (p != me && d->rbuf[p][XH_COUNT] != d->count[p]) {
            d->broken = 1;
            return k3_fail(err, K3_ERR_DIST, "rank %d (host %s) sent %d experts for MoE layer "
                           "%d, rank %d expected %d: the ranks routed differently", p,
                           d->hosts[p], d->rbuf[p][XH_COUNT], layer, me, d->count[p]);
        }
        d->cursor[p] = 0;
    }
    for (int i = 0; i < slots; i++) { /* every other rank's outputs into their router slots */
        int p = k3_expert_owner(layer, ids[i], N);
        if (p == me) continue;
        const float *src = (const float *)(d->rbuf[p] + XH_INTS) + (size_t)d->cursor[p]++ * dim;
        memcpy(outs + (size_t)i * dim, src, (size_t)dim * sizeof *outs);
    }
    return K3_OK;
}

static int exchange(void *user, int layer, const int *ids, int rows, int k, float *outs, int dim,
                    int status, k3_err *err) {
    k3_dist *d = user;
    int rc = exchange_once(d, layer, ids, rows, k, outs, dim, status, err);
    if (d->broken) lost(d, err);
    return rc;
}

const k3_expert_ranks *k3_dist_expert_ranks(k3_dist *d) {
    d->xr = (k3_expert_ranks){.user = d, .rank = d->rank, .n_ranks = d->size,
                              .exchange = exchange};
    return &d->xr;
}

/* ---- rank 0's ops ------------------------------------------------------------------------ */

static int send_ints_once(k3_dist *d, const int32_t *buf, int n, k3_err *err) {
    MPI_Request req[256];
    char done[256] = {0};
    int rc, nreq = 0;
    for (int p = 1; p < d->size && p < 256; p++)
        if ((rc = MPI_Isend(buf, n, MPI_INT32_T, p, TAG_OP, MPI_COMM_WORLD, &req[nreq++])) !=
            MPI_SUCCESS) {
            d->broken = 1;
            return mpi_fail(err, rc, "MPI_Isend of an op");
        }
    int all = wait_all(req, nreq, done, k3_now_s() + d->timeout_s);
    if (all > 0) return K3_OK;
    d->broken = 1;
    if (all < 0) return mpi_fail(err, -all, "sending an op");
    for (int i = 0; i < nreq; i++)
        if (!done[i])
            return k3_fail(err, K3_ERR_DIST, "rank %d (host %s) took no op within %.0f s "
                           "(killed, hung, or its host lost?); ending the run", i + 1,
                           d->hosts[i + 1], d->timeout_s);
    return k3_fail(err, K3_ERR_DIST, "an op was not delivered");
}

static int send_ints(k3_dist *d, const int32_t *buf, int n, k3_err *err) {
    int rc = send_ints_once(d, buf, n, err);
    if (d->broken) lost(d, err);
    return rc;
}

static int send_op(void *user, const k3_rank_op *op, k3_err *err) {
    k3_dist *d = user;
    if (d->broken)
        return k3_fail(err, K3_ERR_DIST, "the MPI run has lost a rank; restart it");
    int32_t *b = d->opbuf;
    int n = op->kind == K3_ROP_PASS ? op->n : 0;
    if (n < 0 || n > K3_ROP_PASS_INTS) return k3_fail(err, K3_ERR_INPUT, "a pass of %d ints", n);
    b[0] = op->kind, b[1] = (int32_t)(op->session & 0xffffffffu);
    b[2] = (int32_t)(op->session >> 32), b[3] = op->arg, b[4] = op->flags, b[5] = n;
    if (n) memcpy(b + OP_HDR, op->ids, (size_t)n * sizeof *b);
    for (int at = 0, i = 0; op->kind == K3_ROP_PASS && i < op->arg; i++) { /* its rows */
        d->tokens += op->ids[at + 3];
        at += K3_ROP_SEG_INTS + op->ids[at + 3];
    }
    k3_err local;
    return send_ints(d, b, OP_HDR + n, err ? err : &local);
}

const k3_rank_ops *k3_dist_rank_ops(k3_dist *d) {
    if (d->rank != 0) return NULL;
    d->ops = (k3_rank_ops){.user = d, .send = send_op};
    return &d->ops;
}

/* ---- startup ------------------------------------------------------------------------------ */

typedef struct start_msg {
    int32_t status;
    char line[LINE_CAP];
} start_msg;

int k3_dist_start(k3_dist *d, int status, const k3_err *load_err, const k3_engine *e,
                  const char *dirs, int verbose, FILE *f, k3_err *err) {
    start_msg mine = {.status = status};
    if (status) {
        snprintf(mine.line, sizeof mine.line, "%s", load_err->msg);
    } else {
        const k3_config *c = k3_engine_config(e);
        long owned = 0, layers = 0;
        for (int l = 0; l < c->num_hidden_layers; l++) {
            if (!c->layer_is_moe[l]) continue;
            layers++;
            for (int x = 0; x < c->num_experts; x++)
                owned += k3_expert_owner(l, x, d->size) == d->rank;
        }
        /* one routed expert: w1, w3 [inter, latent] and w2 [latent, inter] in MXFP4, a nibble
         * per weight and a scale byte per 32 (spec §10.3): 17,547,264 bytes at K3 widths */
        double per = 3.0 * c->moe_intermediate_size * c->routed_expert_hidden_size * 17 / 32;
        char store[K3_DESCRIBE_CAP];
        k3_engine_describe(e, K3_DESCRIBE_STORE, store, sizeof store);
        int lo = c->num_experts / d->size, hi = (c->num_experts + d->size - 1) / d->size;
        char span[32];
        snprintf(span, sizeof span, lo == hi ? "%d" : "%d-%d", lo, hi);
        snprintf(mine.line, sizeof mine.line, "%ld of %ld routed experts (%s per layer, %.3f GB)"
                 "; folders: %.300s; %.900s", owned, layers * c->num_experts, span,
                 owned * per / 1e9, dirs && *dirs ? dirs : "(model folder)",
                 store);
    }
    start_msg *all = d->rank == 0 ? calloc((size_t)d->size, sizeof *all) : NULL;
    if (d->rank == 0 && !all) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    int rc = MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, 0,
                        MPI_COMM_WORLD);
    int32_t verdict[2] = {0, -1}; /* status, failed rank */
    if (rc == MPI_SUCCESS && d->rank == 0) {
        for (int r = 0; r < d->size && !verdict[0]; r++)
            if (all[r].status) verdict[0] = all[r].status, verdict[1] = r;
        if (verbose && !verdict[0])
            for (int r = 0; r < d->size; r++)
                fprintf(f, "k3: rank %d of %d on %s: %s\n", r, d->size, d->hosts[r], all[r].line);
    }
    if (rc == MPI_SUCCESS)
        rc = MPI_Bcast(verdict, 2, MPI_INT32_T, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        free(all);
        d->broken = 1;
        return mpi_fail(err, rc, "the startup exchange");
    }
    d->started = !verdict[0];
    if (verdict[0] && d->rank == 0)
        k3_fail(err, verdict[0], "rank %d (host %s) could not load the model: %s", verdict[1],
                d->hosts[verdict[1]], all[verdict[1]].line);
    else if (verdict[0])
        k3_fail(err, verdict[0], "rank %d failed to load (rank 0 reports it)", verdict[1]);
    free(all);
    return verdict[0];
}

/* ---- followers ---------------------------------------------------------------------------- */

static k3_session **find(k3_dist *d, unsigned long long id, int empty) {
    for (int i = 0; i < MAX_SESSIONS; i++)
        if ((d->sess[i] && d->sid[i] == id) || (empty && !d->sess[i])) return &d->sess[i];
    return NULL;
}

static void free_sessions(k3_dist *d) {
    k3_multistep_free(d->ms);
    d->ms = NULL;
    for (int i = 0; i < MAX_SESSIONS; i++) {
        k3_session_free(d->sess[i]);
        d->sess[i] = NULL;
    }
}

/* The counters of the first live session (the store's are engine-wide), and this rank's. */
static int send_stats(k3_dist *d) {
    k3_run_stats st = {0};
    for (int i = 0; i < MAX_SESSIONS; i++)
        if (d->sess[i]) {
            k3_session_stats(d->sess[i], &st);
            break;
        }
    double v[ST_N] = {[ST_REQ] = (double)st.expert_requests, [ST_HITS] = (double)st.hits,
                      [ST_PF_HITS] = (double)st.prefetch_hits,
                      [ST_BYTES] = (double)st.bytes_read, [ST_READ_S] = st.read_s,
                      [ST_BUSY_S] = st.read_busy_s,
                      [ST_COMM_S] = d->comm_s, [ST_TOKENS] = (double)d->tokens,
                      [ST_SENT] = (double)d->bytes_sent, [ST_EXCH] = (double)d->exchanges};
    return MPI_Send(v, ST_N, MPI_DOUBLE, 0, TAG_STATS, MPI_COMM_WORLD);
}

/* K3_ROP_PASS (k3.h): the same pass as rank 0's, over this rank's copies of its sessions:
 * on a multistep's scratch when rank 0 ran it on one (shared), else as that one session's
 * step or forward, so that every rank takes the same path (and the same exchanges). The
 * followers compute no logits. Errors: those of the pass; K3_ERR_DIST with *bad (a pass this
 * rank cannot replay: an unknown session, a malformed op). */
static int replay_segs(k3_dist *d, const k3_engine *e, k3_multistep_seg *segs, int nseg,
                       int shared, const int32_t *w, int len, bool *bad, k3_err *err) {
    int rows = 0, at = 0;
    for (int i = 0; i < nseg; i++) {
        if (at + K3_ROP_SEG_INTS > len || w[at + 3] < 1 || at + K3_ROP_SEG_INTS + w[at + 3] > len)
            return k3_fail(err, K3_ERR_DIST, "rank 0 sent a truncated pass");
        unsigned long long id = (unsigned long long)(uint32_t)w[at] |
                                (unsigned long long)(uint32_t)w[at + 1] << 32;
        k3_session **s = find(d, id, 0);
        if (!s) return k3_fail(err, K3_ERR_DIST, "rank 0 named an unknown session in a pass");
        int f = w[at + 2];
        segs[i] = (k3_multistep_seg){
            .session = *s, .ids = w + at + K3_ROP_SEG_INTS, .n_ids = w[at + 3],
            .flags = (f & K3_BATCH_ALL_LOGITS ? K3_MS_ALL_LOGITS
                      : f & K3_BATCH_NO_LOGITS ? K3_MS_NO_LOGITS : K3_MS_LAST_LOGITS) |
                     (f & K3_BATCH_REWINDABLE ? K3_MS_REWINDABLE : 0)};
        rows += w[at + 3];
        at += K3_ROP_SEG_INTS + w[at + 3];
    }
    *bad = false;
    d->tokens += rows;
    if (!shared) {
        const k3_multistep_seg *g = &segs[0];
        if (g->n_ids == 1 && !(g->flags & K3_MS_REWINDABLE))
            return k3_session_step(g->session, g->ids[0], NULL, err);
        return k3_session_forward(g->session, g->ids, g->n_ids, NULL,
                                  g->flags & K3_MS_REWINDABLE ? K3_FWD_REWINDABLE : 0, err);
    }
    if (d->ms && k3_multistep_max_rows(d->ms) < rows) { /* a larger pass: a larger scratch */
        k3_multistep_free(d->ms);
        d->ms = NULL;
    }
    int rc = d->ms ? K3_OK : k3_multistep_new(e, rows, &d->ms, err);
    return rc ? rc : k3_multistep_run(d->ms, segs, nseg, NULL, err);
}

/* replay_segs over segments on the heap (up to K3_MAX_CHUNK of them: ~400 KB). */
static int replay_pass(k3_dist *d, const k3_engine *e, int nseg, int shared, const int32_t *w,
                       int len, bool *bad, k3_err *err) {
    *bad = true;
    if (nseg < 1 || nseg > K3_MAX_CHUNK)
        return k3_fail(err, K3_ERR_DIST, "rank 0 sent a pass of %d segments", nseg);
    k3_multistep_seg *segs = malloc((size_t)nseg * sizeof *segs);
    if (!segs) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    int rc = replay_segs(d, e, segs, nseg, shared, w, len, bad, err);
    free(segs);
    return rc;
}

int k3_dist_follow(k3_dist *d, const k3_engine *e, k3_err *err) {
    int32_t *b = d->opbuf;
    for (;;) {
        MPI_Request req;
        char done = 0;
        int rc = MPI_Irecv(b, OP_INTS, MPI_INT32_T, 0, TAG_OP, MPI_COMM_WORLD, &req);
        if (rc == MPI_SUCCESS) rc = wait_all(&req, 1, &done, -1) > 0 ? MPI_SUCCESS : rc;
        if (rc != MPI_SUCCESS) {
            d->broken = 1;
            mpi_fail(err, rc, "waiting for rank 0");
            lost(d, err);
            return err->code;
        }
        unsigned long long id = (unsigned long long)(uint32_t)b[1] |
                                (unsigned long long)(uint32_t)b[2] << 32;
        k3_session **s = b[0] == K3_ROP_NEW ? find(d, id, 1) : find(d, id, 0);
        k3_err e2;
        switch (b[0]) {
        case OP_QUIT:
            free_sessions(d);
            return K3_OK;
        case OP_STATS:
            if ((rc = send_stats(d)) != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Send");
            continue;
        case K3_ROP_NEW:
            if (!s) return k3_fail(err, K3_ERR_GENERIC, "more than %d sessions", MAX_SESSIONS);
            if ((rc = k3_session_new(e, b[3], s, &e2))) {
                *err = e2;
                free_sessions(d);
                return rc;
            }
            d->sid[s - d->sess] = id;
            continue;
        }
        if (b[0] == K3_ROP_PASS) {
            bool bad = false; /* rank 0 named what this rank lacks: the ranks disagree */
            rc = replay_pass(d, e, b[3], b[4], b + OP_HDR, b[5], &bad, &e2);
            if (bad) {
                *err = e2;
                free_sessions(d);
                return rc;
            }
        } else if (!s) {
            return k3_fail(err, K3_ERR_DIST, "rank 0 named an unknown session (op %d)", b[0]);
        } else {
            switch (b[0]) {
            case K3_ROP_FREE:
                k3_session_free(*s);
                *s = NULL;
                break;
            case K3_ROP_RESET:
                k3_session_reset(*s);
                break;
            case K3_ROP_REWIND:
                rc = k3_session_rewind(*s, b[3], &e2);
                break;
            default:
                return k3_fail(err, K3_ERR_DIST, "rank 0 sent an unknown op %d", b[0]);
            }
        }
        /* a failed pass failed on rank 0 too, which reports it; a broken exchange ends here */
        if (rc && d->broken) {
            *err = e2;
            free_sessions(d);
            return rc;
        }
    }
}

/* ---- the end ------------------------------------------------------------------------------ */

void k3_dist_summary(k3_dist *d, const k3_run_stats *mine, FILE *f) {
    if (!d || d->rank != 0 || d->broken) return;
    int32_t op[OP_HDR] = {OP_STATS};
    k3_err err;
    if (send_ints(d, op, OP_HDR, &err)) {
        fprintf(f, "k3: per-rank summary: %s\n", err.msg);
        return;
    }
    for (int r = 0; r < d->size; r++) {
        double v[ST_N] = {0};
        if (r == 0) {
            v[ST_REQ] = (double)mine->expert_requests, v[ST_HITS] = (double)mine->hits;
            v[ST_PF_HITS] = (double)mine->prefetch_hits, v[ST_BYTES] = (double)mine->bytes_read;
            v[ST_READ_S] = mine->read_s, v[ST_BUSY_S] = mine->read_busy_s;
            v[ST_COMM_S] = d->comm_s;
            v[ST_TOKENS] = (double)d->tokens, v[ST_SENT] = (double)d->bytes_sent;
            v[ST_EXCH] = (double)d->exchanges;
        } else {
            MPI_Request req;
            char done = 0;
            if (MPI_Irecv(v, ST_N, MPI_DOUBLE, r, TAG_STATS, MPI_COMM_WORLD, &req) !=
                    MPI_SUCCESS || wait_all(&req, 1, &done, k3_now_s() + d->timeout_s) <= 0) {
                d->broken = 1;
                k3_fail(&err, K3_ERR_DIST, "rank %d (host %s) sent no summary within %.0f s", r,
                        d->hosts[r], d->timeout_s);
                lost(d, &err);
                return;
            }
        }
        double tok = v[ST_TOKENS] > 0 ? v[ST_TOKENS] : 1;
        fprintf(f, "k3: rank %d on %s: %.0f expert requests, hit rate %.1f%% (%.1f%% with "
                "prefetch), %.3f GB read in %.2f s with a read in flight (%.2f GB/s; %.2f s "
                "summed over readers), communication %.3f ms/token (%.0f exchanges, %.1f KB "
                "sent/token) over %.0f tokens\n", r, d->hosts[r], v[ST_REQ],
                v[ST_REQ] ? 100 * v[ST_HITS] / v[ST_REQ] : 0,
                v[ST_REQ] ? 100 * (v[ST_HITS] + v[ST_PF_HITS]) / v[ST_REQ] : 0,
                v[ST_BYTES] / 1e9, v[ST_BUSY_S], v[ST_BUSY_S] > 0 ? v[ST_BYTES] / 1e9 /
                v[ST_BUSY_S] : 0, v[ST_READ_S], 1e3 * v[ST_COMM_S] / tok, v[ST_EXCH],
                v[ST_SENT] / 1e3 / tok,
                v[ST_TOKENS]);
    }
}

void k3_dist_close(k3_dist *d) {
    if (!d) return;
    if (d->broken) { /* not reached (lost() aborts); finalizing would wait for the lost rank */
        dist_free(d);
        return;
    }
    if (d->rank == 0 && d->started) {
        int32_t op[OP_HDR] = {OP_QUIT};
        k3_err err;
        if (send_ints(d, op, OP_HDR, &err)) MPI_Abort(MPI_COMM_WORLD, K3_ERR_DIST);
    }
    if (d->stuck_req != MPI_REQUEST_NULL) MPI_Wait(&d->stuck_req, MPI_STATUS_IGNORE);
    if (d->rank == 0) take_reports(d);
    MPI_Finalize();
    dist_free(d);
}
