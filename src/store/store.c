/* store.c — the expert cache: slots, the demand and prefetch queues, the reader threads and
 * the client calls the MoE makes (see store.h for the invariants). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "store_internal.h"
#include "../util/clock.h"

enum client_stage { ST_IDLE, ST_DEFERRED, ST_WAITING, ST_HANDED, ST_DONE };

/* ==== settings ========================================================================= */

int k3_store_settings_check(const k3_store_settings *s, k3_err *err) {
    if (!(s->expert_gb >= 0 && s->expert_gb <= 1e6)) /* also nan */
        return k3_fail_field(err, K3_ERR_USAGE, "expert_gb",
                             " %g: expected a number of GB in [0, 1e6] "
                       "(0 = the memory plan)", s->expert_gb);
    if (s->load_threads < 0 || s->load_threads > 256)
        return k3_fail_field(err, K3_ERR_USAGE, "load_threads",
                             " %d: expected an integer in [1, 256] (0 = "
                       "4)", s->load_threads);
    if (s->direct != K3_IO_AUTO && s->direct != K3_IO_DIRECT && s->direct != K3_IO_BUFFERED)
        return k3_fail_field(err, K3_ERR_USAGE, "direct",
                             " %d: expected K3_IO_AUTO, K3_IO_DIRECT or "
                       "K3_IO_BUFFERED", s->direct);
    if (s->pipe < K3_PIPE_OFF || s->pipe > K3_PIPE_ALL)
        return k3_fail_field(err, K3_ERR_USAGE, "pipe",
                             " %d: expected K3_PIPE_AUTO, _PREV, _LOOKAHEAD, "
                       "_ALL or _OFF", s->pipe);
    return K3_OK;
}

/* ==== memory plan ======================================================================= */

static void read_meminfo(uint64_t *total, uint64_t *avail) {
    *total = *avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return;
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) *total = kb * 1024;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) *avail = kb * 1024;
    }
    fclose(f);
}

/* Default budget: what is available after the spine, one session's state and a headroom of
 * max(2 GB, 10% of RAM); at least top-k + 1 slots, at most every expert. */
static int plan_slots(k3_store *st, const k3_store_settings *set, k3_err *err) {
    k3_mem_plan *p = &st->plan;
    read_meminfo(&p->mem_total, &p->mem_available);
    if (!p->headroom_bytes) /* else the engine's plan gave it, with its limit */
        p->headroom_bytes = p->mem_total / 10 > 2000000000ull ? p->mem_total / 10
                                                              : 2000000000ull;
    uint64_t want;
    if (set->expert_slots > 0) {
        want = (uint64_t)set->expert_slots;
    } else if (set->expert_gb > 0) {
        want = (uint64_t)(set->expert_gb * 1e9) / st->slot_bytes;
        if (want == 0)
            return k3_fail(err, K3_ERR_USAGE, "expert cache budget %.6g GB is below one expert "
                           "slot (%.3f MB): raise expert_gb", set->expert_gb,
                           (double)st->slot_bytes / 1e6);
    } else {
        uint64_t other = p->spine_bytes + p->state_bytes + p->headroom_bytes;
        want = p->mem_available > other ? (p->mem_available - other) / st->slot_bytes : 0;
        if (want < (uint64_t)st->top_k + 1) want = (uint64_t)st->top_k + 1;
    }
    if (want > st->n_mapped) want = st->n_mapped ? st->n_mapped : 1;
    st->n_slots = (int)want;
    p->cache_bytes = want * st->slot_bytes;
    return K3_OK;
}

/* ==== queues ============================================================================ */

static void q_push(k3_store *st, k3_queue *q, int s) {
    st->slots[s].qnext = -1;
    st->slots[s].qprev = q->tail;
    if (q->tail >= 0) st->slots[q->tail].qnext = s;
    else q->head = s;
    q->tail = s;
}

static void q_remove(k3_store *st, k3_queue *q, int s) {
    k3_slot *sl = &st->slots[s];
    if (sl->qprev >= 0) st->slots[sl->qprev].qnext = sl->qnext;
    else q->head = sl->qnext;
    if (sl->qnext >= 0) st->slots[sl->qnext].qprev = sl->qprev;
    else q->tail = sl->qprev;
    sl->qprev = sl->qnext = -1;
}

/* Orders slots by (shard, offset) of their experts (for k3_store_order_reads). */
static int by_file_offset(const void *a, const void *b, void *ctx) {
    const k3_store *st = ctx;
    const k3_expert_loc *x = &st->loc[st->slots[*(const int *)a].key];
    const k3_expert_loc *y = &st->loc[st->slots[*(const int *)b].key];
    if (x->shard[0] != y->shard[0]) return x->shard[0] < y->shard[0] ? -1 : 1;
    return x->off[0] < y->off[0] ? -1 : x->off[0] > y->off[0];
}

static dev_t slot_dev(const k3_store *st, int s) {
    return st->dev[st->loc[st->slots[s].key].shard[0]];
}

void k3_store_order_reads(const k3_store *st, int *batch, int *rank, int n) {
    qsort_r(batch, (size_t)n, sizeof *batch, by_file_offset, (void *)st);
    for (int i = 0; i < n; i++) {
        rank[i] = 0;
        for (int j = 0; j < i; j++) rank[i] += slot_dev(st, batch[j]) == slot_dev(st, batch[i]);
    }
    for (int i = 1; i < n; i++) { /* stable insertion sort by rank: keeps (shard, offset) order
                                   * within a rank; n is one layer's misses, small */
        int r = rank[i], b = batch[i], j = i;
        for (; j > 0 && rank[j - 1] > r; j--) rank[j] = rank[j - 1], batch[j] = batch[j - 1];
        rank[j] = r, batch[j] = b;
    }
}

static void submit(k3_store *st, int *batch, int *rank, int n, int job) {
    if (!n) return;
    k3_store_order_reads(st, batch, rank, n);
    for (int i = 0; i < n; i++) {
        st->slots[batch[i]].job = (uint8_t)job;
        q_push(st, job == JOB_DEMAND ? &st->dq : &st->pq, batch[i]);
    }
    pthread_cond_broadcast(&st->work);
    if (st->uring) k3_uring_wake(st); /* it may be blocked on its ring, not on `work` */
}

/* ==== slots ============================================================================= */

static void pin(k3_store *st, int s) {
    if (st->pins[s]++ == 0) {
        st->n_pinned++;
        if (st->slots[s].state == SLOT_INFLIGHT) st->n_pf_inflight--;
    }
}

static void release_slot(k3_store *st, int s) {
    k3_slot *sl = &st->slots[s];
    if (sl->key >= 0) st->where[sl->key] = -1;
    k3_policy_remove(&st->pol, s);
    *sl = (k3_slot){.key = -1, .state = SLOT_EMPTY, .qprev = -1, .qnext = -1};
    st->free_slots[st->n_free++] = s;
}

static void unpin(k3_store *st, int s) {
    if (--st->pins[s] > 0) return;
    st->n_pinned--;
    if (st->slots[s].state == SLOT_INFLIGHT) st->n_pf_inflight++;
    if (st->slots[s].state == SLOT_FAILED) release_slot(st, s);
}

/* A queued prefetch whose slot is wanted elsewhere or whose layer arrived without it. */
static void cancel_prefetch(k3_store *st, int s) {
    q_remove(st, &st->pq, s);
    st->n_pf_inflight--;
    st->stats.prefetch_wasted++;
    release_slot(st, s);
}

/* A free slot, else the policy's victim, else (demand only) a queued prefetch's slot. */
static int claim_slot(k3_store *st, int for_prefetch) {
    if (st->n_free) return st->free_slots[--st->n_free];
    int v = k3_policy_victim(&st->pol, st->pins);
    if (v >= 0) {
        st->stats.evictions++;
        if (st->slots[v].by_prefetch) st->stats.prefetch_wasted++;
        st->where[st->slots[v].key] = -1;
        st->slots[v] = (k3_slot){.key = -1, .state = SLOT_EMPTY, .qprev = -1, .qnext = -1};
        return v;
    }
    if (!for_prefetch && st->pq.tail >= 0) {
        cancel_prefetch(st, st->pq.tail);
        return st->free_slots[--st->n_free];
    }
    return -1;
}

static void assign(k3_store *st, int s, int key, int by_prefetch) {
    st->slots[s] = (k3_slot){.key = key, .state = SLOT_INFLIGHT, .by_prefetch = (uint8_t)by_prefetch,
                             .qprev = -1, .qnext = -1};
    st->where[key] = s;
    uint64_t used = (uint64_t)(st->n_slots - st->n_free);
    if (used > st->stats.peak_slots_used) st->stats.peak_slots_used = used;
}

/* ==== reader threads ==================================================================== */

int k3_store_take_read(k3_store *st, int *is_pf, double *t0) {
    int s = -1;
    *is_pf = 0;
    if (st->dq.head >= 0) {
        s = st->dq.head;
        q_remove(st, &st->dq, s);
    } else if (st->pq.head >= 0 && st->pf_running < st->max_pf_running) {
        s = st->pq.head;
        q_remove(st, &st->pq, s);
        *is_pf = 1;
        st->pf_running++;
    }
    if (s < 0) return -1;
    st->slots[s].job = JOB_RUNNING;
    *t0 = k3_now_s();
    if (st->n_running++ == 0) st->busy_since = *t0;
    return s;
}

void k3_store_finish_read(k3_store *st, int s, int is_pf, int e, int shard, uint64_t at,
                          uint64_t bytes, double t0) {
    k3_slot *sl = &st->slots[s];
    double t1 = k3_now_s();
    if (--st->n_running == 0) st->stats.read_busy_s += t1 - st->busy_since;
    st->pf_running -= is_pf;
    sl->job = JOB_NONE;
    st->stats.reads++;
    st->stats.bytes_read += bytes;
    st->stats.read_s += t1 - t0;
    if (st->pins[s] == 0) st->n_pf_inflight--;
    if (e == 0) {
        sl->state = SLOT_READY;
        k3_policy_insert(&st->pol, s, sl->key);
    } else {
        sl->state = SLOT_FAILED;
        sl->err = e;
        sl->err_at = at;
        sl->err_shard = shard;
        if (st->pins[s] == 0) release_slot(st, s); /* a failed prefetch: demand retries */
    }
    pthread_cond_broadcast(&st->done);
}

void *k3_store_reader_main(void *arg) {
    k3_store *st = arg;
    pthread_mutex_lock(&st->mu);
    while (!st->stop) {
        int is_pf;
        double t0;
        int s = k3_store_take_read(st, &is_pf, &t0);
        if (s < 0) {
            pthread_cond_wait(&st->work, &st->mu);
            continue;
        }
        int key = st->slots[s].key, shard = 0;
        uint64_t at = 0, bytes = 0;
        pthread_mutex_unlock(&st->mu);
        int e = k3_store_read_expert(st, key, st->arena + (size_t)s * st->slot_bytes, &shard, &at,
                                     &bytes);
        pthread_mutex_lock(&st->mu);
        k3_store_finish_read(st, s, is_pf, e, shard, at, bytes, t0);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* ==== open / close ====================================================================== */

static int alloc_cache(k3_store *st, k3_err *err) {
    size_t n = (size_t)st->n_slots, keys = (size_t)st->n_layers * st->n_experts;
    st->arena_bytes = n * st->slot_bytes;
    st->arena = mmap(NULL, st->arena_bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (st->arena == MAP_FAILED) {
        st->arena = NULL;
        return k3_fail(err, K3_ERR_GENERIC, "cannot reserve the expert cache (%.3f GB)",
                       (double)st->arena_bytes / 1e9);
    }
    st->slots = calloc(n, sizeof *st->slots);
    st->pins = calloc(n, sizeof *st->pins);
    st->free_slots = malloc(n * sizeof *st->free_slots);
    if (!st->slots || !st->pins || !st->free_slots ||
        k3_policy_init(&st->pol, st->policy_kind, st->n_slots, (int)keys))
        return k3_fail(err, K3_ERR_GENERIC, "out of memory (expert cache)");
    for (int i = st->n_slots - 1; i >= 0; i--) {
        st->slots[i] = (k3_slot){.key = -1, .qprev = -1, .qnext = -1};
        st->free_slots[st->n_free++] = i;
    }
    return K3_OK;
}

static int start_readers(k3_store *st, k3_err *err) {
    if (st->io_engine == K3_IO_ENGINE_URING) {
        int e = k3_uring_start(st);
        if (!e) return K3_OK;
        st->io_engine = K3_IO_ENGINE_THREADS; /* old kernel, seccomp: never fail the run */
        snprintf(st->notes + strlen(st->notes), sizeof st->notes - strlen(st->notes),
                 "; NOTE: io_uring unavailable (%s): reading with the thread pool",
                 strerror(e));
    }
    st->thr = calloc((size_t)st->n_threads, sizeof *st->thr);
    if (!st->thr) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (int i = 0; i < st->n_threads; i++) {
        if (pthread_create(&st->thr[i], NULL, k3_store_reader_main, st))
            return k3_fail(err, K3_ERR_GENERIC, "cannot start expert reader threads");
        st->n_started++;
    }
    return K3_OK;
}

static void resolve(k3_store *st, const k3_store_settings *set) {
    st->n_threads = set->load_threads > 0 ? set->load_threads : 4;
    st->max_pf_running = st->n_threads > 1 ? st->n_threads - 1 : 1;
    /* the pool by default: io_uring reads a layer's demand burst 1.3-1.5x faster alone, but
     * decode waited 1.1-1.7x longer for experts with it, its one thread competing with the
     * compute for the cores (BENCHMARKS.md, io_uring against the pool) */
    st->io_engine = set->io_engine == K3_IO_ENGINE_URING ? K3_IO_ENGINE_URING
                                                         : K3_IO_ENGINE_THREADS;
    /* S3-FIFO by default: closest to Belady of the online policies on K3-like traces
     * (BENCHMARKS.md, k3-lab replay) */
    st->policy_kind = set->policy == K3_POLICY_LRU ? K3_POLICY_LRU : K3_POLICY_S3FIFO;
    const k3_mem_plan *p = &st->plan;
    uint64_t all = st->n_mapped * st->expert_bytes;
    /* the page cache is a free second level where it fits; inside a cgroup it is charged to
     * the cgroup, so it fits only below the limit */
    uint64_t room = p->limit_bytes && p->limit_bytes < p->mem_total ? p->limit_bytes
                                                                     : p->mem_total;
    if (set->direct == K3_IO_AUTO)
        st->direct = p->base_bytes + p->spine_bytes + p->state_bytes + all + p->headroom_bytes >
                     room;
    else
        st->direct = set->direct == K3_IO_DIRECT;
    if (set->pipe == K3_PIPE_AUTO) st->pipe = st->n_slots >= 2 * st->top_k ? K3_PIPE_ALL : 0;
    else st->pipe = set->pipe == K3_PIPE_OFF ? 0 : set->pipe;
    st->pf_auto = set->pipe == K3_PIPE_AUTO; /* an explicit K3_PIPE always reads */
}

/* Per layer, the predictors that read (k3_store_layer_pipe): layer l is predicted while
 * layer l-1 computes, so its lookahead routes layer l-1's MoE input across layer l's mixer;
 * next to an MLA layer (l or l-1 is one) that guess is blind, and the previous token's
 * choice is read instead. */
static int plan_layer_pipe(k3_store *st, const k3_config *cfg, k3_err *err) {
    st->layer_pipe = calloc((size_t)st->n_layers, 1);
    if (!st->layer_pipe) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (int l = 0; l < st->n_layers; l++) {
        int blind = cfg->layer_is_mla[l] || (l > 0 && cfg->layer_is_mla[l - 1]);
        int p = st->pipe;
        if (blind && (p & K3_PIPE_LOOKAHEAD)) p = (p & ~K3_PIPE_LOOKAHEAD) | K3_PIPE_PREV;
        st->layer_pipe[l] = (uint8_t)p;
    }
    return K3_OK;
}

int k3_store_open(const k3_checkpoint *ck, const k3_config *cfg, const k3_store_settings *set,
                  k3_mem_plan *plan, k3_store **out, k3_err *err) {
    k3_store *st = calloc(1, sizeof *st);
    if (!st) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    st->ck = ck;
    st->n_layers = cfg->num_hidden_layers;
    st->n_experts = cfg->num_experts;
    st->top_k = cfg->num_experts_per_token;
    st->inter = cfg->moe_intermediate_size;
    st->latent = cfg->routed_expert_hidden_size;
    st->in_place = set->in_place;
    st->plan = *plan;
    st->dq = st->pq = (k3_queue){-1, -1};
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->work, NULL);
    pthread_cond_init(&st->done, NULL);
    int rc = k3_store_build_map(st, cfg, err);
    if (!rc && st->in_place) {
        st->pipe = 0;
        read_meminfo(&st->plan.mem_total, &st->plan.mem_available);
    } else if (!rc) {
        st->where = malloc((size_t)st->n_layers * st->n_experts * sizeof *st->where);
        if (!st->where) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
        for (size_t i = 0; !rc && i < (size_t)st->n_layers * st->n_experts; i++) st->where[i] = -1;
        st->slot_bytes = k3_store_slot_size(st);
        if (!rc) rc = plan_slots(st, set, err);
        if (!rc) resolve(st, set);
        if (!rc) rc = plan_layer_pipe(st, cfg, err);
        if (!rc) rc = k3_store_open_files(st, err);
        if (!rc) rc = alloc_cache(st, err);
        if (!rc) rc = start_readers(st, err);
    }
    if (rc) {
        k3_store_close(st);
        return rc;
    }
    if (st->n_fallback) {
        int k = st->first_fallback_key;
        snprintf(st->notes + strlen(st->notes), sizeof st->notes - strlen(st->notes),
                 "; NOTE: %llu expert(s) (first: layer %d expert %d) do not lie as six "
                 "back-to-back tensors in order: reading those tensor by tensor", (unsigned long long)st->n_fallback, k / st->n_experts, k % st->n_experts);
    }
    if (st->direct_refused)
        snprintf(st->notes + strlen(st->notes), sizeof st->notes - strlen(st->notes),
                 "; NOTE: the file system refused O_DIRECT: buffered reads + "
                 "POSIX_FADV_DONTNEED");
    *plan = st->plan;
    *out = st;
    return K3_OK;
}

void k3_store_close(k3_store *st) {
    if (!st) return;
    pthread_mutex_lock(&st->mu);
    st->stop = 1;
    pthread_cond_broadcast(&st->work);
    pthread_mutex_unlock(&st->mu);
    for (int i = 0; i < st->n_started; i++) pthread_join(st->thr[i], NULL);
    if (st->uring) k3_uring_stop(st);
    k3_store_close_files(st);
    if (st->arena) munmap(st->arena, st->arena_bytes);
    k3_policy_free(&st->pol);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->work);
    pthread_cond_destroy(&st->done);
    free(st->thr);
    free(st->fd);
    free(st->dev);
    free(st->slots);
    free(st->pins);
    free(st->free_slots);
    free(st->where);
    free(st->layer_pipe);
    free(st->loc);
    free(st);
}

void k3_store_describe(const k3_store *st, char *buf, size_t cap) {
    const k3_mem_plan *p = &st->plan;
    double gb = 1e9;
    if (st->in_place) {
        snprintf(buf, cap, "experts: %.3f GB used in place from the mapped shards (no cache)%s",
                 (double)(st->n_mapped * st->expert_bytes) / gb, st->notes);
        return;
    }
    char engine[64];
    snprintf(engine, sizeof engine, st->io_engine == K3_IO_ENGINE_URING ? "io_uring, %d in flight"
             : "%d threads", st->n_threads);
    const char *pipe = st->pipe == K3_PIPE_ALL ? "prev+lookahead" : st->pipe == K3_PIPE_PREV ?
                       "prev" : st->pipe == K3_PIPE_LOOKAHEAD ? "lookahead" : "off";
    snprintf(buf, cap, "memory plan: base %.3f GB + spine %.3f GB + expert cache %.3f GB (%d "
             "slots x %.2f MB, %s) + state %.3f GB + headroom %.2f GB; RAM %.1f GB, available "
             "%.1f GB; experts %.2f GB (%llu); reads %s, %s; prefetch %s%s%s",
             (double)p->base_bytes / gb, (double)p->spine_bytes / gb, (double)p->cache_bytes / gb,
             st->n_slots, (double)st->slot_bytes / 1e6, k3_cache_policy_name(st->policy_kind),
             (double)p->state_bytes / gb, (double)p->headroom_bytes / gb,
             (double)p->mem_total / gb, (double)p->mem_available / gb,
             (double)(st->n_mapped * st->expert_bytes) / gb, (unsigned long long)st->n_mapped,
             st->direct ? "O_DIRECT" : "buffered", engine, pipe,
             st->pf_auto && st->pipe ? " (auto: a predictor pauses while it wastes more than it "
                                       "hides)" : "", st->notes);
}

int k3_store_io_engine(const k3_store *st) { return st->io_engine; }
uint64_t k3_store_expert_bytes(const k3_store *st) { return st->n_mapped * st->expert_bytes; }
uint64_t k3_store_slot_bytes(const k3_store *st) { return st->slot_bytes; }
int k3_store_n_slots(const k3_store *st) { return st->n_slots; }
int k3_store_pipe(const k3_store *st) { return st->pipe; }
int k3_store_layer_pipe(const k3_store *st, int layer) {
    return st->layer_pipe && layer >= 0 && layer < st->n_layers ? st->layer_pipe[layer] : 0;
}

void k3_store_get_stats(k3_store *st, k3_store_stats *out) {
    pthread_mutex_lock(&st->mu);
    *out = st->stats;
    out->spine_busy = st->spine_busy;
    pthread_mutex_unlock(&st->mu);
}

void k3_store_set_read_hook(k3_store *st, k3_store_read_hook hook, void *user) {
    pthread_mutex_lock(&st->mu);
    st->hook = hook;
    st->hook_user = user;
    pthread_mutex_unlock(&st->mu);
}

int k3_store_set_source(k3_store *st, const k3_expert_source *src, k3_err *err) {
    if (st->in_place)
        return k3_fail(err, K3_ERR_USAGE, "experts cannot be used in place (experts_in_place) "
                       "from a streaming install: some are not on disk yet");
    pthread_mutex_lock(&st->mu);
    st->source = *src;
    pthread_mutex_unlock(&st->mu);
    return K3_OK;
}

/* ==== clients: what the MoE calls ======================================================= */

int k3_store_client_new(k3_store *st, k3_store_client **out, k3_err *err) {
    k3_store_client *c = calloc(1, sizeof *c);
    if (!c) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    /* ids..rank hold one request: top-k experts, or a chunk's union of up to n_experts. */
    size_t K = (size_t)st->top_k, L = (size_t)st->n_layers;
    size_t U = (size_t)(st->n_experts > st->top_k ? st->n_experts : st->top_k);
    c->st = st;
    c->ids = calloc(U, sizeof *c->ids);
    c->slot = calloc(U, sizeof *c->slot);
    c->stage = calloc(U, 1);
    c->prev_ids = calloc(L * K, sizeof *c->prev_ids);
    c->has_prev = calloc(L, 1);
    c->pred = calloc(3 * L * K, sizeof *c->pred);
    c->has_pred = calloc(3 * L, 1);
    c->cand = calloc(3 * L * K, 1);
    c->batch = calloc(U, sizeof *c->batch);
    c->rank = calloc(U, sizeof *c->rank);
    if (!c->ids || !c->slot || !c->stage || !c->prev_ids || !c->has_prev || !c->pred ||
        !c->has_pred || !c->cand || !c->batch || !c->rank) {
        k3_store_client_free(c);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    *out = c;
    return K3_OK;
}

void k3_store_client_free(k3_store_client *c) {
    if (!c) return;
    if (c->k) k3_store_end(c);
    free(c->ids);
    free(c->slot);
    free(c->stage);
    free(c->prev_ids);
    free(c->has_prev);
    free(c->pred);
    free(c->has_pred);
    free(c->cand);
    free(c->batch);
    free(c->rank);
    free(c);
}

void k3_store_client_reset(k3_store_client *c) {
    memset(c->has_prev, 0, (size_t)c->st->n_layers);
    memset(c->has_pred, 0, 3 * (size_t)c->st->n_layers);
}

void k3_store_set_choice(k3_store_client *c, int layer, const int *ids, int k) {
    if (k != c->st->top_k) return;
    memcpy(c->prev_ids + (size_t)layer * c->st->top_k, ids, (size_t)k * sizeof *ids);
    c->has_prev[layer] = 1;
}

const int *k3_store_prev_choice(const k3_store_client *c, int layer) {
    return c->has_prev[layer] ? c->prev_ids + (size_t)layer * c->st->top_k : NULL;
}

static int chosen(const k3_store_client *c, int expert) {
    for (int j = 0; j < c->k; j++)
        if (c->ids[j] == expert) return 1;
    return 0;
}

enum { PF_MIN = 64, PF_WINDOW = 1024 };

int k3_prefetch_keeps(uint64_t useful, uint64_t cands, int reading, double busy) {
    if (cands < PF_MIN) return 1;
    double need = busy > 0.5 ? busy : 0.5, u = (double)useful / (double)cands;
    return reading ? u >= need - 0.05 : u > need + 0.05;
}

void k3_store_note_spine(k3_store *st, double spine_read_s, double now_s) {
    pthread_mutex_lock(&st->mu);
    double dt = now_s - st->spine_note_s, dr = spine_read_s - st->spine_read_s;
    if (st->spine_notes++ && dt > 0) { /* the first note only starts the clock */
        double share = dr / dt < 0 ? 0 : dr / dt > 1 ? 1 : dr / dt;
        st->spine_busy = st->spine_notes > 2 ? (st->spine_busy + share) / 2 : share;
    }
    st->spine_read_s = spine_read_s, st->spine_note_s = now_s;
    pthread_mutex_unlock(&st->mu);
}

/* Each predictor's guess for this layer against the router's choice; under auto prefetch,
 * whether the predictor goes on reading (k3_prefetch_keeps). */
static void score_predictions(k3_store *st, k3_store_client *c, int layer) {
    for (int src = K3_PIPE_PREV; src <= K3_PIPE_LOOKAHEAD; src++) {
        size_t at = (size_t)src * st->n_layers + layer;
        if (!c->has_pred[at]) continue;
        const int *p = c->pred + at * st->top_k;
        const uint8_t *cand = c->cand + at * st->top_k;
        for (int j = 0; j < c->k; j++) {
            int hit = chosen(c, p[j]);
            st->stats.recall_hits[src] += (uint64_t)hit;
            st->pf_cands[src] += cand[j];
            st->pf_useful[src] += (uint64_t)(cand[j] && hit);
        }
        st->stats.recall_total[src] += (uint64_t)c->k;
        c->has_pred[at] = 0;
        if (st->pf_cands[src] >= PF_WINDOW) /* forget slowly: the routing drifts */
            st->pf_cands[src] /= 2, st->pf_useful[src] /= 2;
        if (st->pf_auto)
            st->pf_paused[src] = !k3_prefetch_keeps(st->pf_useful[src], st->pf_cands[src],
                                                    !st->pf_paused[src], st->spine_busy);
    }
}

/* Gives every deferred expert of the layer a slot while slots can be had: one already
 * holding or reading it (a queued prefetch is promoted to a demand read), else a claimed
 * slot with a new demand read. Submits the new reads together. */
static void assign_deferred(k3_store *st, k3_store_client *c) {
    int nb = 0;
    for (int j = 0; j < c->k; j++) {
        if (c->stage[j] != ST_DEFERRED) continue;
        int key = c->layer * st->n_experts + c->ids[j], s = st->where[key];
        if (s >= 0) {
            if (st->slots[s].job == JOB_PREFETCH) {
                q_remove(st, &st->pq, s);
                c->batch[nb++] = s;
            }
            pin(st, s);
        } else {
            if ((s = claim_slot(st, 0)) < 0) break;
            assign(st, s, key, 0);
            st->pins[s] = 1;
            st->n_pinned++;
            c->batch[nb++] = s;
        }
        c->slot[j] = s;
        c->stage[j] = ST_WAITING;
    }
    submit(st, c->batch, c->rank, nb, JOB_DEMAND);
}

void k3_store_begin(k3_store_client *c, int layer, const int *ids, int k) {
    k3_store *st = c->st;
    pthread_mutex_lock(&st->mu);
    c->layer = layer;
    c->k = k;
    memcpy(c->ids, ids, (size_t)k * sizeof *ids);
    if (k <= st->top_k) { /* one token's choice: score the guesses, remember it */
        score_predictions(st, c, layer);
        memcpy(c->prev_ids + (size_t)layer * st->top_k, ids, (size_t)k * sizeof *ids);
        c->has_prev[layer] = 1;
    } else { /* a chunk's union: no one token's choice (see k3_store_set_choice) */
        c->has_pred[(size_t)K3_PIPE_PREV * st->n_layers + layer] = 0;
        c->has_pred[(size_t)K3_PIPE_LOOKAHEAD * st->n_layers + layer] = 0;
        c->has_prev[layer] = 0;
    }
    st->stats.requests += (uint64_t)k;
    if (st->in_place) {
        st->stats.hits += (uint64_t)k;
        memset(c->stage, ST_WAITING, (size_t)k);
        pthread_mutex_unlock(&st->mu);
        return;
    }
    for (int s = st->pq.head, nx; s >= 0; s = nx) { /* this layer's unchosen prefetches */
        nx = st->slots[s].qnext;
        int key = st->slots[s].key;
        if (key / st->n_experts == layer && !chosen(c, key % st->n_experts))
            cancel_prefetch(st, s);
    }
    for (int j = 0; j < k; j++) {
        int s = st->where[layer * st->n_experts + ids[j]];
        k3_slot *sl = s >= 0 ? &st->slots[s] : NULL;
        if (!sl) st->stats.misses++;
        else if (sl->state == SLOT_READY) {
            if (sl->by_prefetch) st->stats.prefetch_hits++;
            else st->stats.hits++;
            k3_policy_hit(&st->pol, s);
        } else if (sl->by_prefetch) st->stats.prefetch_late++;
        else st->stats.misses++;
        if (sl) sl->by_prefetch = 0;
        c->stage[j] = ST_DEFERRED;
    }
    assign_deferred(st, c);
    pthread_mutex_unlock(&st->mu);
}

static void make_expert(const k3_store *st, const uint8_t *const part[K3_EXPERT_PARTS],
                        k3_expert *ex) {
    ex->w1 = (k3_mxfp4){part[0], part[1], st->inter, st->latent};
    ex->w2 = (k3_mxfp4){part[2], part[3], st->latent, st->inter};
    ex->w3 = (k3_mxfp4){part[4], part[5], st->inter, st->latent};
}

static void expert_in_place(const k3_store *st, int key, k3_expert *ex) {
    const k3_expert_loc *L = &st->loc[key];
    const uint8_t *part[K3_EXPERT_PARTS];
    for (int i = 0; i < K3_EXPERT_PARTS; i++)
        part[i] = (const uint8_t *)st->ck->shards[L->shard[i]].map + L->off[i];
    make_expert(st, part, ex);
}

static void expert_in_slot(const k3_store *st, int s, k3_expert *ex) {
    size_t off[K3_EXPERT_PARTS];
    const uint8_t *base = st->arena + (size_t)s * st->slot_bytes, *part[K3_EXPERT_PARTS];
    k3_store_part_offsets(st, st->slots[s].key, off);
    for (int i = 0; i < K3_EXPERT_PARTS; i++) part[i] = base + off[i];
    make_expert(st, part, ex);
}

static int read_error(const k3_store *st, const k3_slot *sl, k3_err *err) {
    const char *path = st->ck->shards[sl->err_shard].path;
    int layer = sl->key / st->n_experts, e = sl->key % st->n_experts;
    if (sl->err == K3_STORE_ESOURCE) { /* the source's own message (URL, expert) */
        if (err) *err = st->source_err;
        return st->source_err.code;
    }
    if (sl->err == -1)
        return k3_fail(err, K3_ERR_EXPERT_IO, "%s: layer %d expert %d: the file ends at byte "
                       "%llu, inside this expert's bytes: the shard is truncated or was "
                       "rewritten after load (re-download it)", path, layer, e,
                       (unsigned long long)sl->err_at);
    return k3_fail(err, K3_ERR_EXPERT_IO, "%s: layer %d expert %d: read failed at byte %llu: %s",
                   path, layer, e, (unsigned long long)sl->err_at, strerror(sl->err));
}

int k3_store_next_many(k3_store_client *c, int max, int *js, k3_expert *exs, int *n,
                       k3_err *err) {
    k3_store *st = c->st;
    *n = 0;
    if (st->in_place) {
        for (int i = 0; i < c->k && *n < max; i++)
            if (c->stage[i] == ST_WAITING) {
                c->stage[i] = ST_HANDED;
                js[*n] = i;
                expert_in_place(st, c->layer * st->n_experts + c->ids[i], &exs[(*n)++]);
            }
        return *n ? K3_OK : k3_fail(err, K3_ERR_GENERIC, "internal: no expert left in this layer");
    }
    pthread_mutex_lock(&st->mu);
    for (;;) {
        int waiting = 0, deferred = 0;
        for (int i = 0; i < c->k; i++) deferred += c->stage[i] == ST_DEFERRED;
        if (deferred) assign_deferred(st, c);
        for (int i = 0; i < c->k && *n < max; i++) {
            if (c->stage[i] != ST_WAITING) continue;
            const k3_slot *sl = &st->slots[c->slot[i]];
            waiting++;
            if (sl->state == SLOT_FAILED) { /* those already handed out stay pinned until
                                             * k3_store_end, and nothing is computed */
                int rc = read_error(st, sl, err);
                pthread_mutex_unlock(&st->mu);
                return rc;
            }
            if (sl->state != SLOT_READY) continue;
            c->stage[i] = ST_HANDED;
            js[*n] = i;
            expert_in_slot(st, c->slot[i], &exs[(*n)++]);
        }
        if (*n) {
            pthread_mutex_unlock(&st->mu);
            return K3_OK;
        }
        if (!waiting && !deferred) {
            pthread_mutex_unlock(&st->mu);
            return k3_fail(err, K3_ERR_GENERIC, "internal: no expert left in this layer");
        }
        pthread_cond_wait(&st->done, &st->mu);
    }
}

int k3_store_next(k3_store_client *c, int *j, k3_expert *ex, k3_err *err) {
    int n;
    return k3_store_next_many(c, 1, j, ex, &n, err);
}

void k3_store_done(k3_store_client *c, int j) {
    k3_store *st = c->st;
    c->stage[j] = ST_DONE;
    if (st->in_place) return;
    pthread_mutex_lock(&st->mu);
    unpin(st, c->slot[j]);
    pthread_cond_broadcast(&st->done); /* a freed slot may unblock a deferred expert */
    pthread_mutex_unlock(&st->mu);
}

void k3_store_end(k3_store_client *c) {
    k3_store *st = c->st;
    if (!st->in_place) pthread_mutex_lock(&st->mu);
    for (int j = 0; j < c->k; j++) {
        if (!st->in_place && (c->stage[j] == ST_WAITING || c->stage[j] == ST_HANDED))
            unpin(st, c->slot[j]);
        c->stage[j] = ST_IDLE;
    }
    c->k = 0;
    if (!st->in_place) {
        pthread_cond_broadcast(&st->done);
        pthread_mutex_unlock(&st->mu);
    }
}

void k3_store_prefetch(k3_store_client *c, int layer, const int *ids, int k, int source) {
    k3_store *st = c->st;
    if (k > st->top_k || source < K3_PIPE_PREV || source > K3_PIPE_LOOKAHEAD) return;
    pthread_mutex_lock(&st->mu);
    size_t at = (size_t)source * st->n_layers + layer;
    memcpy(c->pred + at * st->top_k, ids, (size_t)k * sizeof *ids);
    c->has_pred[at] = 1;
    uint8_t *cand = c->cand + at * st->top_k;
    int reads = k3_store_layer_pipe(st, layer) & source, nb = 0;
    memset(cand, 0, (size_t)st->top_k);
    for (int j = 0; reads && j < k; j++) /* what it asks to read, read or not */
        cand[j] = st->where[layer * st->n_experts + ids[j]] < 0;
    if (reads && st->pf_paused[source]) {
        for (int j = 0; j < k; j++) st->stats.prefetch_skipped += cand[j];
        reads = 0;
    }
    for (int j = 0; reads && j < k; j++) {
        int key = layer * st->n_experts + ids[j];
        if (st->where[key] >= 0) continue;
        /* leave the next layer's demand its top-k claimable slots */
        if (st->n_slots - st->n_pinned - st->n_pf_inflight <= st->top_k) break;
        int s = claim_slot(st, 1);
        if (s < 0) break;
        assign(st, s, key, 1);
        st->n_pf_inflight++;
        st->stats.prefetch_reads++;
        c->batch[nb++] = s;
    }
    submit(st, c->batch, c->rank, nb, JOB_PREFETCH);
    pthread_mutex_unlock(&st->mu);
}
