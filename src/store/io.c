/* io.c — reading experts from the shards: O_DIRECT when asked and accepted, else buffered
 * reads (+ POSIX_FADV_DONTNEED when O_DIRECT was refused, so the page cache does not hold a
 * second copy of what the cache holds). Whole aligned spans, retried until complete. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store_internal.h"

static uint64_t align_down(uint64_t x) { return x / K3_IO_ALIGN * K3_IO_ALIGN; }
static uint64_t align_up(uint64_t x) { return align_down(x + K3_IO_ALIGN - 1); }

/* Does a direct read of the first block of fd work? Some file systems accept O_DIRECT at
 * open and refuse the read (EINVAL); find out at open, not mid-generation. */
static int direct_read_works(int fd) {
    void *buf = NULL;
    if (posix_memalign(&buf, K3_IO_ALIGN, K3_IO_ALIGN)) return 0;
    ssize_t r = pread(fd, buf, K3_IO_ALIGN, 0);
    free(buf);
    return r >= 0;
}

static int open_all(k3_store *st, int flags, k3_err *err) {
    for (int i = 0; i < st->ck->n_shards; i++) {
        const char *path = st->ck->shards[i].path;
        st->fd[i] = open(path, O_RDONLY | O_CLOEXEC | flags);
        if (st->fd[i] < 0) {
            int e = errno;
            if ((flags & O_DIRECT) && e == EINVAL) return EINVAL;
            return k3_fail(err, K3_ERR_IO, "%s: cannot open for expert reads: %s", path, strerror(e));
        }
        if ((flags & O_DIRECT) && !direct_read_works(st->fd[i])) return EINVAL;
        struct stat sb;
        st->dev[i] = fstat(st->fd[i], &sb) == 0 ? sb.st_dev : 0;
    }
    return K3_OK;
}

int k3_store_open_files(k3_store *st, k3_err *err) {
    int n = st->ck->n_shards;
    st->fd = malloc((size_t)n * sizeof *st->fd);
    st->dev = calloc((size_t)n, sizeof *st->dev);
    if (!st->fd || !st->dev) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (int i = 0; i < n; i++) st->fd[i] = -1;
    if (st->direct) {
        int rc = open_all(st, O_DIRECT, err);
        if (rc != EINVAL) return rc;
        k3_store_close_files(st); /* the file system refused O_DIRECT: buffered + DONTNEED */
        for (int i = 0; i < n; i++) st->fd[i] = -1;
        st->direct = 0;
        st->direct_refused = 1;
        st->dontneed = 1;
    }
    return open_all(st, 0, err);
}

void k3_store_close_files(k3_store *st) {
    if (!st->fd) return;
    for (int i = 0; i < st->ck->n_shards; i++)
        if (st->fd[i] >= 0) close(st->fd[i]);
}

/* Reads [off, off+len) into dst until at least `need` bytes arrived. A short read continues
 * where it stopped (from the block boundary below it under O_DIRECT); EINTR is retried; a
 * read that brings nothing new is end of file. Returns 0 or an errno (-1 = end of file). */
static int read_span(k3_store *st, int shard, uint8_t *dst, uint64_t off, uint64_t len,
                     uint64_t need, uint64_t *at, uint64_t *bytes) {
    uint64_t done = 0, reached = 0;
    while (reached < need) {
        size_t want = (size_t)(len - done);
        if (st->hook) {
            int e = st->hook(st->hook_user, shard, off + done, &want);
            if (st->direct && want < len - done) want = (size_t)align_up(want);
            if (e == EINTR) continue;
            if (e) { *at = off + done; return e; }
        }
        ssize_t r = pread(st->fd[shard], dst + done, want, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { *at = off + done; return errno; }
        uint64_t end = done + (uint64_t)r;
        *bytes += (uint64_t)r;
        if (end <= reached || r == 0) { *at = off + reached; return -1; }
        reached = end;
        done = st->direct ? align_down(end) : end;
    }
    if (st->dontneed) posix_fadvise(st->fd[shard], (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
    return 0;
}

/* A streaming install: an expert whose bytes are not all on disk comes from st->source, each
 * part copied where the shard reads below would put it. Returns 1 when the expert is local
 * (read it from the shard), 0 when the source filled it, or K3_STORE_ESOURCE. */
/* The file name of shard i (no folder), as the source knows it. */
static const char *shard_file(const k3_store *st, int i) {
    const char *p = st->ck->shards[i].path, *slash = strrchr(p, '/');
    return slash ? slash + 1 : p;
}

int k3_store_read_source(k3_store *st, int key, uint8_t *buf, int *shard, uint64_t *at,
                            uint64_t *bytes) {
    const k3_expert_loc *L = &st->loc[key];
    int n = L->contig ? 1 : K3_EXPERT_PARTS, local = 1;
    for (int i = 0; i < n && local; i++)
        local = st->source.local(st->source.user, shard_file(st, L->shard[i]), L->off[i],
                                 L->contig ? st->expert_bytes : st->part_bytes[i]);
    if (local) return 1;
    size_t region = 0;
    for (int i = 0; i < n; i++) {
        uint64_t len = L->contig ? st->expert_bytes : st->part_bytes[i];
        k3_err e = {0};
        *shard = L->shard[i];
        if (st->source.read(st->source.user, key / st->n_experts, key % st->n_experts,
                            shard_file(st, L->shard[i]), L->off[i], len,
                            buf + region + (L->off[i] - align_down(L->off[i])), &e)) {
            pthread_mutex_lock(&st->mu);
            st->source_err = e;
            pthread_mutex_unlock(&st->mu);
            *at = L->off[i];
            return K3_STORE_ESOURCE;
        }
        *bytes += len;
        region += (size_t)(align_up(st->part_bytes[i]) + K3_IO_ALIGN);
    }
    return 0;
}

int k3_store_expert_spans(const k3_store *st, int key, k3_span out[K3_EXPERT_PARTS]) {
    const k3_expert_loc *L = &st->loc[key];
    int n = L->contig ? 1 : K3_EXPERT_PARTS;
    size_t region = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = L->contig ? st->expert_bytes : st->part_bytes[i];
        uint64_t start = align_down(L->off[i]), need = L->off[i] + bytes - start;
        out[i] = (k3_span){L->shard[i], start, align_up(need), need, region};
        region += (size_t)(align_up(st->part_bytes[i]) + K3_IO_ALIGN);
    }
    return n;
}

int k3_store_read_expert(k3_store *st, int key, uint8_t *buf, int *shard, uint64_t *at,
                         uint64_t *bytes) {
    if (st->source.read) {
        int e = k3_store_read_source(st, key, buf, shard, at, bytes);
        if (e != 1) return e;
    }
    k3_span sp[K3_EXPERT_PARTS];
    int n = k3_store_expert_spans(st, key, sp);
    for (int i = 0; i < n; i++) {
        *shard = sp[i].shard;
        int e = read_span(st, sp[i].shard, buf + sp[i].region, sp[i].start, sp[i].len,
                          sp[i].need, at, bytes);
        if (e) return e;
    }
    return 0;
}
