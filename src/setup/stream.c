/* stream.c — the run-time side of a streaming install (setup.h part 3): which experts are
 * local, and one checked HTTP range request per missing expert, kept as a raw-span file.
 * Thread-safe: each caller borrows one of a few HTTP clients (one keep-alive connection
 * each), so the reader threads of the expert store fetch a layer's misses in parallel. */
#include "setup_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>


struct k3_stream {
    sn_install in;
    k3_http_opts http_opts;
    char *token;
    int *span_of;             /* [n_layers_seen * key_experts]: index into in.spans, or -1 */
    int key_experts;          /* 1 + the largest expert id */
    k3_http **clients;        /* created on first use */
    bool *busy;
    int n_clients;
    pthread_mutex_t mu;
    pthread_cond_t freed;
    uint64_t fetched;         /* experts fetched over HTTP since open */
    /* the raw-span cache's budget: disk is guarded by disk_mu (held for bookkeeping and
     * unlinks, never across a fetch or a read) */
    pthread_mutex_t disk_mu;
    sn_disk disk;
    uint64_t *span_bytes;     /* [n_spans]: each raw-span file's size (disk.bytes) */
    bool budget_default;      /* the budget came from the free-space margin */
    uint64_t fs_bytes, margin_bytes; /* that file system's size and the margin kept free */
};

/* ---- the disk budget's bookkeeping (setup_internal.h) ---------------------------------- */

int sn_disk_init(sn_disk *d, int n, const uint64_t *bytes, uint64_t budget, k3_err *err) {
    *d = (sn_disk){.bytes = bytes, .n = n, .budget = budget, .head = -1, .tail = -1};
    d->prev = malloc(((size_t)n + 1) * sizeof *d->prev);
    d->next = malloc(((size_t)n + 1) * sizeof *d->next);
    d->pins = calloc((size_t)n + 1, sizeof *d->pins);
    d->state = calloc((size_t)n + 1, 1);
    if (!d->prev || !d->next || !d->pins || !d->state) {
        sn_disk_free(d);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory (expert disk budget)");
    }
    return K3_OK;
}

void sn_disk_free(sn_disk *d) {
    free(d->prev);
    free(d->next);
    free(d->pins);
    free(d->state);
    *d = (sn_disk){0};
}

static void lru_push_head(sn_disk *d, int i) {
    d->prev[i] = -1;
    d->next[i] = d->head;
    if (d->head >= 0) d->prev[d->head] = i;
    else d->tail = i;
    d->head = i;
}

static void lru_unlink(sn_disk *d, int i) {
    if (d->prev[i] >= 0) d->next[d->prev[i]] = d->next[i];
    else d->head = d->next[i];
    if (d->next[i] >= 0) d->prev[d->next[i]] = d->prev[i];
    else d->tail = d->prev[i];
}

static void disk_note_peak(sn_disk *d) {
    if (d->kept_bytes > d->peak_bytes) d->peak_bytes = d->kept_bytes;
}

void sn_disk_found(sn_disk *d, int i) {
    if (d->state[i] != SN_DISK_EMPTY) return;
    d->state[i] = SN_DISK_KEPT;
    d->kept_bytes += d->bytes[i];
    lru_push_head(d, i);
    disk_note_peak(d);
}

int sn_disk_make_room(sn_disk *d, uint64_t extra, void (*evict)(void *user, int i), void *user) {
    int v = d->tail;
    while (d->kept_bytes + extra > d->budget) {
        while (v >= 0 && d->pins[v] > 0) v = d->prev[v]; /* pinned: being read or fetched */
        if (v < 0) return 0;
        int older = d->prev[v];
        lru_unlink(d, v);
        d->state[v] = SN_DISK_EMPTY;
        d->kept_bytes -= d->bytes[v];
        d->evicted++;
        if (evict) evict(user, v);
        v = older;
    }
    return 1;
}

int sn_disk_reserve(sn_disk *d, int i, void (*evict)(void *user, int i), void *user) {
    if (d->state[i] != SN_DISK_EMPTY || d->bytes[i] > d->budget ||
        !sn_disk_make_room(d, d->bytes[i], evict, user))
        return 0;
    d->state[i] = SN_DISK_WRITING;
    d->kept_bytes += d->bytes[i];
    disk_note_peak(d);
    return 1;
}

void sn_disk_commit(sn_disk *d, int i, bool ok) {
    if (d->state[i] != SN_DISK_WRITING) return;
    if (ok) {
        d->state[i] = SN_DISK_KEPT;
        lru_push_head(d, i);
    } else {
        d->state[i] = SN_DISK_EMPTY;
        d->kept_bytes -= d->bytes[i];
    }
}

void sn_disk_hit(sn_disk *d, int i) {
    if (d->state[i] != SN_DISK_KEPT || d->head == i) return;
    lru_unlink(d, i);
    lru_push_head(d, i);
}

uint64_t sn_disk_margin(uint64_t fs_bytes) {
    uint64_t tenth = fs_bytes / 10, quarter = fs_bytes / 4, floor_ = 20000000000ull;
    if (floor_ > quarter) floor_ = quarter;
    return tenth > floor_ ? tenth : floor_;
}

static void stream_free(k3_stream *s) {
    for (int i = 0; i < s->n_clients; i++) k3_http_free(s->clients[i]);
    free(s->clients);
    free(s->busy);
    free(s->span_of);
    free(s->token);
    sn_disk_free(&s->disk);
    free(s->span_bytes);
    sn_install_free(&s->in);
    pthread_mutex_destroy(&s->disk_mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->freed);
    free(s);
}

void k3_stream_close(k3_stream *s) {
    if (s) stream_free(s);
}

/* The victim's raw-span file goes (disk_mu held). Unlinking a file a reader has open is safe
 * (the reader keeps its bytes), but readers pin their span, so none is chosen. */
static void evict_span(void *user, int i) {
    k3_stream *s = user;
    char path[4096];
    unlink(sn_span_path(path, sizeof path, s->in.dest, s->in.spans[i].layer,
                        s->in.spans[i].expert));
}

typedef struct { int64_t mtime_ns; int span; } found_span;

static int by_mtime(const void *a, const void *b) {
    const found_span *x = a, *y = b;
    return x->mtime_ns < y->mtime_ns ? -1 : x->mtime_ns > y->mtime_ns ? 1 : x->span - y->span;
}

/* The budget, and the raw-span files already kept, oldest (by mtime: the fetch; atime is
 * often not kept) first into the LRU list, so eviction starts with them; then evicted down to
 * the budget. */
static int open_disk(k3_stream *s, const k3_stream_opts *o, k3_err *err) {
    int n = s->in.n_spans;
    found_span *found = calloc((size_t)n + 1, sizeof *found);
    if (!found || !(s->span_bytes = calloc((size_t)n + 1, sizeof *s->span_bytes))) {
        free(found);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    int n_found = 0;
    uint64_t kept = 0;
    for (int i = 0; i < n; i++) {
        const k3_expert_span *sp = &s->in.spans[i];
        char path[4096];
        struct stat st;
        s->span_bytes[i] = sp->nbytes;
        if (stat(sn_span_path(path, sizeof path, s->in.dest, sp->layer, sp->expert), &st) == 0 &&
            (uint64_t)st.st_size == sp->nbytes) {
            found[n_found++] = (found_span){(int64_t)st.st_mtim.tv_sec * 1000000000 +
                                            st.st_mtim.tv_nsec, i};
            kept += sp->nbytes;
        }
    }
    uint64_t budget = o && o->disk_budget_bytes >= 0 ? (uint64_t)o->disk_budget_bytes : 0;
    if (!o || o->disk_budget_bytes < 0) {
        char dir[4096];
        struct statvfs v;
        snprintf(dir, sizeof dir, "%s/" SN_DIR, s->in.dest);
        if (statvfs(dir, &v) != 0) {
            free(found);
            return k3_fail(err, K3_ERR_IO, "%s: cannot read free space for the expert disk "
                           "budget: %s (give one with --expert-disk-gb)", dir, strerror(errno));
        }
        uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize;
        s->budget_default = true;
        s->fs_bytes = (uint64_t)v.f_blocks * v.f_frsize;
        s->margin_bytes = sn_disk_margin(s->fs_bytes);
        budget = kept + (avail > s->margin_bytes ? avail - s->margin_bytes : 0);
    }
    int rc = sn_disk_init(&s->disk, n, s->span_bytes, budget, err);
    qsort(found, (size_t)n_found, sizeof *found, by_mtime);
    for (int i = 0; !rc && i < n_found; i++) sn_disk_found(&s->disk, found[i].span);
    free(found);
    if (!rc) sn_disk_make_room(&s->disk, 0, evict_span, s);
    return rc;
}

int k3_stream_open(const char *dir, const k3_http_opts *http, k3_stream **out, k3_err *err) {
    k3_stream_opts o = {.http = http, .disk_budget_bytes = -1};
    return k3_stream_open_opts(dir, &o, out, err);
}

int k3_stream_open_opts(const char *dir, const k3_stream_opts *o, k3_stream **out, k3_err *err) {
    const k3_http_opts *http = o ? o->http : NULL;
    *out = NULL;
    k3_stream *s = calloc(1, sizeof *s);
    if (!s) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->disk_mu, NULL);
    pthread_cond_init(&s->freed, NULL);
    bool found = false;
    int rc = sn_manifest_read(dir, &s->in, &found, err);
    if (!rc && found) rc = sn_load_local(&s->in, err);
    bool complete = true;
    for (int i = 0; !rc && found && i < s->in.n_shards; i++) {
        const sn_shard *sh = &s->in.shards[i];
        if (!sh->complete && sh->has_partial && !sh->header)
            rc = k3_fail(err, K3_ERR_CHECKPOINT, "%s/" SN_PARTIAL_DIR "/%s: its header was never "
                         "fetched: run k3 setup %s again", dir, sh->name, dir);
        complete &= sh->complete;
    }
    if (rc || !found || complete) {
        stream_free(s);
        return rc;
    }
    rc = sn_build_spans(&s->in, err);
    for (int i = 0; !rc && i < s->in.n_spans; i++)
        if (s->in.spans[i].expert + 1 > s->key_experts) s->key_experts = s->in.spans[i].expert + 1;
    size_t nkeys = (size_t)s->in.n_layers_seen * (size_t)s->key_experts;
    if (!rc && !(s->span_of = malloc((nkeys + 1) * sizeof *s->span_of)))
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (size_t i = 0; !rc && i < nkeys; i++) s->span_of[i] = -1;
    for (int i = 0; !rc && i < s->in.n_spans; i++)
        s->span_of[s->in.spans[i].layer * s->key_experts + s->in.spans[i].expert] = i;
    /* the network settings of the last `k3 setup`; token, interrupt and progress from http */
    s->http_opts = (k3_http_opts){.endpoint = s->in.endpoint,
                                  .connections = s->in.net_connections,
                                  .retries = s->in.net_retries,
                                  .backoff_s = s->in.net_backoff_s,
                                  .timeout_s = s->in.net_timeout_s};
    if (http) {
        s->http_opts.interrupt = http->interrupt;
        s->http_opts.on_bytes = http->on_bytes;
        s->http_opts.user = http->user;
    }
    if (http && http->token && !(s->token = strdup(http->token)))
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    s->http_opts.token = s->token;
    s->n_clients = s->http_opts.connections > 0 ? s->http_opts.connections : 4;
    s->http_opts.connections = 1;
    s->clients = calloc((size_t)s->n_clients, sizeof *s->clients);
    s->busy = calloc((size_t)s->n_clients, sizeof *s->busy);
    if (!rc && (!s->clients || !s->busy)) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    if (!rc) rc = open_disk(s, o, err);
    if (rc) {
        stream_free(s);
        return rc;
    }
    *out = s;
    return K3_OK;
}

static const sn_shard *shard_by_name(const k3_stream *s, const char *name) {
    for (int i = 0; i < s->in.n_shards; i++)
        if (!strcmp(s->in.shards[i].name, name)) return &s->in.shards[i];
    return NULL;
}

char *k3_stream_shard_path(const k3_stream *s, const char *name, char *buf, size_t cap) {
    const sn_shard *sh = shard_by_name(s, name);
    if (sh && !sh->complete) return sn_partial_path(buf, cap, s->in.dest, name);
    return sn_path(buf, cap, s->in.dest, name, NULL);
}

bool k3_stream_in_shard(const k3_stream *s, const char *shard_name, uint64_t offset,
                        uint64_t nbytes) {
    const sn_shard *sh = shard_by_name(s, shard_name);
    return sh && (sh->complete || sn_ranges_covers(&sh->done, offset, offset + nbytes));
}

/* Reads [at, at + n) of the file at path, which must be exactly file_bytes long.
 * Returns 1 read, 0 absent (or another length: a stale span, fetched again), or -status. */
static int read_file_range(const char *path, uint64_t file_bytes, uint64_t at, void *dst,
                           uint64_t n, k3_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != file_bytes) {
        close(fd);
        return 0;
    }
    uint64_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)dst + done, n - done, (off_t)(at + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            close(fd);
            return -k3_fail(err, K3_ERR_IO, "%s: read failed: %s", path,
                            r < 0 ? strerror(errno) : "unexpected end of file");
        }
        done += (uint64_t)r;
    }
    close(fd);
    return 1;
}

/* Keeps the fetched bytes as the expert's raw-span file: temporary name, fdatasync, rename.
 * *full is set when the file system is full (ENOSPC, EDQUOT): the caller serves the bytes
 * without keeping them rather than failing a read whose bytes arrived. */
static int keep_span(const k3_stream *s, int layer, const char *path, const void *buf,
                     uint64_t n, bool *full, k3_err *err) {
    char dir[4096], tmp[4200];
    snprintf(dir, sizeof dir, "%s/" SN_DIR "/experts/%d", s->in.dest, layer);
    int rc = sn_mkdirs(dir, err);
    if (rc) return rc;
    snprintf(tmp, sizeof tmp, "%s.tmp%ld.%lx", path, (long)getpid(), (unsigned long)pthread_self());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return k3_fail(err, K3_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    const char *p = buf;
    uint64_t left = n;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        p += w, left -= (uint64_t)w;
    }
    if (left || fdatasync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        *full = e == ENOSPC || e == EDQUOT;
        return k3_fail(err, K3_ERR_IO, "%s: write failed: %s", tmp, strerror(e ? e : EIO));
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return k3_fail(err, K3_ERR_IO, "%s: cannot rename into place: %s", path, strerror(errno));
    }
    return K3_OK;
}

static int borrow(k3_stream *s, k3_err *err) {
    pthread_mutex_lock(&s->mu);
    int i;
    for (;;) {
        for (i = 0; i < s->n_clients && s->busy[i]; i++) {}
        if (i < s->n_clients) break;
        pthread_cond_wait(&s->freed, &s->mu);
    }
    s->busy[i] = true;
    int rc = s->clients[i] ? K3_OK : k3_http_new(&s->http_opts, &s->clients[i], err);
    if (rc) s->busy[i] = false;
    pthread_mutex_unlock(&s->mu);
    return rc ? -rc : i;
}

static void give_back(k3_stream *s, int i) {
    pthread_mutex_lock(&s->mu);
    s->busy[i] = false;
    pthread_cond_signal(&s->freed);
    pthread_mutex_unlock(&s->mu);
}

/* One HTTP request for span idx's bytes; kept as its raw-span file when the budget has room. */
static int fetch_span(k3_stream *s, int idx, const char *path, uint64_t offset,
                      uint64_t nbytes, void *dst, k3_err *err) {
    const k3_expert_span *sp = &s->in.spans[idx];
    const sn_shard *sh = &s->in.shards[sp->shard];
    int layer = sp->layer, expert = sp->expert;
    char url[2048], what[96];
    /* one request for the whole span; dst takes it directly when that is what was asked */
    bool whole = offset == sp->offset && nbytes == sp->nbytes;
    void *buf = whole ? dst : malloc(sp->nbytes ? sp->nbytes : 1);
    if (!buf) return k3_fail(err, K3_ERR_GENERIC, "out of memory (expert span)");
    snprintf(what, sizeof what, "expert %d of layer %d", expert, layer);
    k3_http_req r = {.url = k3_hub_url(url, sizeof url, s->in.endpoint, s->in.repo,
                                       s->in.revision, sh->name),
                     .offset = sp->offset, .nbytes = sp->nbytes, .dst = buf, .fd = -1,
                     .expect_total = sh->bytes, .what = what};
    int c = borrow(s, err), rc = c < 0 ? -c : K3_OK;
    if (!rc) {
        rc = k3_http_fetch(s->clients[c], &r, 1, NULL, NULL, err);
        give_back(s, c);
    }
    if (!rc) {
        __atomic_add_fetch(&s->fetched, 1, __ATOMIC_RELAXED);
        pthread_mutex_lock(&s->disk_mu);
        int room = sn_disk_reserve(&s->disk, idx, evict_span, s);
        pthread_mutex_unlock(&s->disk_mu);
        bool full = false;
        if (room) rc = keep_span(s, layer, path, buf, sp->nbytes, &full, err);
        if (full) rc = K3_OK; /* served, not kept */
        pthread_mutex_lock(&s->disk_mu);
        if (room) sn_disk_commit(&s->disk, idx, !rc && !full);
        pthread_mutex_unlock(&s->disk_mu);
    }
    if (!rc && !whole) memcpy(dst, (char *)buf + (offset - sp->offset), nbytes);
    if (!whole) free(buf);
    return rc;
}

int k3_stream_read(k3_stream *s, int layer, int expert, const char *shard_name,
                   uint64_t offset, uint64_t nbytes, void *dst, k3_err *err) {
    char path[4096];
    int idx = layer >= 0 && layer < s->in.n_layers_seen && expert >= 0 &&
                      expert < s->key_experts ? s->span_of[layer * s->key_experts + expert] : -1;
    const k3_expert_span *sp = idx >= 0 ? &s->in.spans[idx] : NULL;
    const sn_shard *sh = sp ? &s->in.shards[sp->shard] : NULL;
    if (!sp || strcmp(sh->name, shard_name) || offset < sp->offset ||
        offset + nbytes > sp->offset + sp->nbytes)
        return k3_fail(err, K3_ERR_CHECKPOINT, "expert %d of layer %d: bytes %llu-%llu of %s "
                       "are not that expert's span in the install's headers", expert, layer,
                       (unsigned long long)offset, (unsigned long long)(offset + nbytes),
                       shard_name);
    if (sh->complete || sn_ranges_covers(&sh->done, offset, offset + nbytes)) {
        k3_stream_shard_path(s, shard_name, path, sizeof path);
        int got = read_file_range(path, sh->bytes, offset, dst, nbytes, err);
        if (got) return got < 0 ? -got : K3_OK;
    }
    sn_span_path(path, sizeof path, s->in.dest, layer, expert);
    /* pinned from here to the end: neither its file nor its write in progress is evicted */
    pthread_mutex_lock(&s->disk_mu);
    s->disk.pins[idx]++;
    pthread_mutex_unlock(&s->disk_mu);
    int got = read_file_range(path, sp->nbytes, offset - sp->offset, dst, nbytes, err);
    if (got > 0) {
        pthread_mutex_lock(&s->disk_mu);
        if (s->disk.state[idx] == SN_DISK_EMPTY) { /* kept by another process meanwhile */
            sn_disk_found(&s->disk, idx);
            sn_disk_make_room(&s->disk, 0, evict_span, s);
        }
        sn_disk_hit(&s->disk, idx);
        s->disk.pins[idx]--;
        pthread_mutex_unlock(&s->disk_mu);
        return K3_OK;
    }
    int rc = got < 0 ? -got : fetch_span(s, idx, path, offset, nbytes, dst, err);
    pthread_mutex_lock(&s->disk_mu);
    s->disk.pins[idx]--;
    pthread_mutex_unlock(&s->disk_mu);
    return rc;
}

void k3_stream_summary_get(const k3_stream *s, k3_stream_summary *out) {
    *out = (k3_stream_summary){.experts_total = (uint64_t)s->in.n_spans};
    for (int i = 0; i < s->in.n_spans; i++) {
        const k3_expert_span *sp = &s->in.spans[i];
        const sn_shard *sh = &s->in.shards[sp->shard];
        char path[4096];
        struct stat st;
        if (sh->complete || sn_ranges_covers(&sh->done, sp->offset, sp->offset + sp->nbytes) ||
            (stat(sn_span_path(path, sizeof path, s->in.dest, sp->layer, sp->expert), &st) == 0 &&
             (uint64_t)st.st_size == sp->nbytes))
            out->experts_local++;
    }
    sn_ranges miss = {0};
    for (int i = 0; i < s->in.n_shards; i++) { /* every byte not yet in a shard */
        const sn_shard *sh = &s->in.shards[i];
        if (sh->complete) continue;
        if (sn_ranges_missing(&sh->done, 0, sh->bytes, &miss) == 0)
            out->finish_bytes += sn_ranges_bytes(&miss);
    }
    sn_ranges_free(&miss);
    /* raw spans are copied by --finish, not fetched */
    for (int i = 0; i < s->in.n_spans; i++) {
        const k3_expert_span *sp = &s->in.spans[i];
        const sn_shard *sh = &s->in.shards[sp->shard];
        char path[4096];
        struct stat st;
        if (!sh->complete && !sn_ranges_covers(&sh->done, sp->offset, sp->offset + sp->nbytes) &&
            stat(sn_span_path(path, sizeof path, s->in.dest, sp->layer, sp->expert), &st) == 0 &&
            (uint64_t)st.st_size == sp->nbytes)
            out->finish_bytes -= sp->nbytes;
    }
}

uint64_t k3_stream_fetched(const k3_stream *s) {
    return __atomic_load_n(&s->fetched, __ATOMIC_RELAXED);
}

void k3_stream_describe(const k3_stream *s, char *buf, size_t cap) {
    k3_stream_summary sum;
    char h[32];
    k3_stream_summary_get(s, &sum);
    k3_stream_disk d;
    k3_stream_disk_get(s, &d);
    char kept[32], budget[32], why[160] = "", margin[32], fs[32];
    if (s->budget_default)
        snprintf(why, sizeof why, " (what leaves %s of the %s file system free: max(10%%, "
                 "min(20 GB, 25%%)); --expert-disk-gb sets it)",
                 sn_human(margin, sizeof margin, s->margin_bytes),
                 sn_human(fs, sizeof fs, s->fs_bytes));
    int n = snprintf(buf, cap, "streaming install: %llu of %llu experts local, the others are "
                     "fetched when first used (one range request each) and kept; finishing "
                     "fetches %s: k3 setup %s --finish", (unsigned long long)sum.experts_local,
                     (unsigned long long)sum.experts_total,
                     sn_human(h, sizeof h, sum.finish_bytes), s->in.dest);
    if (n >= 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, "; fetched experts on disk: %s of a %s budget%s, "
                 "least recently used evicted first", sn_human(kept, sizeof kept, d.kept_bytes),
                 sn_human(budget, sizeof budget, d.budget_bytes), why);
}

void k3_stream_disk_get(const k3_stream *s, k3_stream_disk *out) {
    /* the lock is not part of the stream's value: taking it keeps the reader const */
    pthread_mutex_lock((pthread_mutex_t *)&s->disk_mu);
    *out = (k3_stream_disk){.kept_bytes = s->disk.kept_bytes, .peak_bytes = s->disk.peak_bytes,
                            .budget_bytes = s->disk.budget, .evicted = s->disk.evicted};
    pthread_mutex_unlock((pthread_mutex_t *)&s->disk_mu);
}

uint64_t k3_stream_requests(const k3_stream *s) {
    uint64_t total = 0;
    for (int i = 0; i < s->n_clients; i++) {
        uint64_t r = 0;
        if (s->clients[i]) k3_http_stats(s->clients[i], &r, NULL);
        total += r;
    }
    return total;
}

const k3_expert_span *k3_stream_spans(const k3_stream *s, int *n) {
    *n = s->in.n_spans;
    return s->in.spans;
}

const char *k3_stream_shard_name(const k3_stream *s, int shard) {
    return shard >= 0 && shard < s->in.n_shards ? s->in.shards[shard].name : NULL;
}
