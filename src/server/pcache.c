/* pcache.c — the prompt cache's folder, keys, lookup, writes and budget (pcache.h). */
#include "pcache.h"
#include "../util/clock.h"
#include "../util/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define BLOCK 64             /* ids per link of the hash chain */
#define PREFIX "k3pc-"
#define SUFFIX ".state"
#define NAME_LEN (5 + 32 + 6) /* k3pc- + hex + .state */
#define STALE_TEMP_S 3600    /* a temp file this old was left by a writer that died */

enum { OWN, FOREIGN, BAD }; /* this model's snapshot; another model's or build's; refused */

typedef struct entry {
    char name[NAME_LEN + 1];
    ino_t ino;
    off_t size;
    struct timespec mtime;
    int kind, pos;
    bool seen, gone;
} entry;

/* A snapshot file's bytes kept in RAM (the RAM tier), by name. */
typedef struct ram_entry {
    char name[NAME_LEN + 1];
    int pos;
    void *data;
    size_t size;
    unsigned long long used;
} ram_entry;

struct k3_pcache {
    char *dir;
    uint8_t fp[16];
    uint64_t budget;
    bool no_load;  /* this engine cannot load states (an MPI run): restore finds nothing */
    entry *e;       /* sorted by name (find: a binary search) */
    size_t n, cap;
    ram_entry *ram; /* the RAM tier: ram_cap snapshots at most, the least recently used out */
    int ram_n, ram_cap;
    unsigned long long clock;
};

/* ---- the RAM tier -------------------------------------------------------------------------- */

static void ram_drop(k3_pcache *pc, ram_entry *r) {
    free(r->data);
    *r = pc->ram[--pc->ram_n];
}

/* Keeps data (size bytes of the snapshot `name` of pos ids; taken over) in RAM. */
static void ram_put(k3_pcache *pc, const char *name, int pos, void *data, size_t size) {
    ram_entry *r = NULL;
    for (int i = 0; i < pc->ram_n && !r; i++)
        if (!strcmp(pc->ram[i].name, name)) r = &pc->ram[i];
    if (r) { /* the same name holds the same bytes: keep the one we have */
        free(data);
        r->used = ++pc->clock;
        return;
    }
    if (!pc->ram_cap) {
        free(data);
        return;
    }
    if (pc->ram_n == pc->ram_cap) {
        ram_entry *old = &pc->ram[0];
        for (int i = 1; i < pc->ram_n; i++)
            if (pc->ram[i].used < old->used) old = &pc->ram[i];
        ram_drop(pc, old);
    }
    r = &pc->ram[pc->ram_n++];
    *r = (ram_entry){.pos = pos, .data = data, .size = size, .used = ++pc->clock};
    snprintf(r->name, sizeof r->name, "%s", name);
}

/* The whole regular file at path in a malloc'd buffer (*n bytes), or NULL with err. */
static void *read_all(const char *path, size_t *n, k3_err *err) {
    int fd = k3_open_regular(path, err);
    if (fd < 0) return NULL;
    struct stat st;
    char *buf = fstat(fd, &st) == 0 && st.st_size > 0 ? malloc((size_t)st.st_size) : NULL;
    size_t got = 0;
    while (buf && got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (!buf || got != (size_t)st.st_size) {
        free(buf);
        k3_fail(err, K3_ERR_IO, "%s: cannot read it whole (out of memory, or it changed)", path);
        return NULL;
    }
    *n = got;
    return buf;
}

/* ---- keys ---------------------------------------------------------------------------------- */

/* The chain h_0 .. h_{n/64} of ids[0, n) (pcache.h); malloc'd, NULL when out of memory. */
static uint64_t *chain(const k3_pcache *pc, const int32_t *ids, size_t n) {
    uint64_t *h = malloc((n / BLOCK + 1) * sizeof *h);
    if (!h) return NULL;
    h[0] = XXH3_64bits(pc->fp, sizeof pc->fp);
    for (size_t b = 0; b < n / BLOCK; b++)
        h[b + 1] = XXH3_64bits_withSeed(ids + b * BLOCK, BLOCK * sizeof *ids, h[b]);
    return h;
}

/* The file name of ids[0, L) given its chain h. */
static void key_name(const uint64_t *h, const int32_t *ids, size_t L, char out[NAME_LEN + 1]) {
    size_t b = L / BLOCK;
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_withSeed(ids + b * BLOCK,
                                                       (L - b * BLOCK) * sizeof *ids, h[b]));
    char *p = out + sprintf(out, PREFIX);
    for (int i = 0; i < 16; i++) p += sprintf(p, "%02x", c.digest[i]);
    strcpy(p, SUFFIX);
}

static bool is_name(const char *s) {
    if (strlen(s) != NAME_LEN || strncmp(s, PREFIX, 5) || strcmp(s + 37, SUFFIX)) return false;
    for (int i = 5; i < 37; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

/* ---- the index: the folder, re-read ------------------------------------------------------- */

static void path_of(const k3_pcache *pc, const char *name, char out[PATH_MAX]) {
    snprintf(out, PATH_MAX, "%s/%s", pc->dir, name);
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

/* The entry of that name among the first n (sorted by name), or NULL. */
static entry *find_in(k3_pcache *pc, size_t n, const char *name) {
    entry key;
    snprintf(key.name, sizeof key.name, "%s", name);
    return n ? bsearch(&key, pc->e, n, sizeof *pc->e, by_name) : NULL;
}

static entry *find(k3_pcache *pc, const char *name) { return find_in(pc, pc->n, name); }

/* Drops the entries marked gone (or not seen by a rescan, when `unseen`), then sorts by name:
 * O(n log n), so that a folder of many small snapshots costs no quadratic scan. */
static void compact(k3_pcache *pc, bool unseen) {
    size_t k = 0;
    for (size_t i = 0; i < pc->n; i++)
        if (!pc->e[i].gone && (!unseen || pc->e[i].seen)) pc->e[k++] = pc->e[i];
    pc->n = k;
    if (pc->n) qsort(pc->e, pc->n, sizeof *pc->e, by_name); /* e is NULL while empty */
}

/* Looks at a file new to the index (or changed): this model's snapshot, or one log line. */
static void classify(k3_pcache *pc, entry *e, const struct stat *st) {
    char path[PATH_MAX];
    path_of(pc, e->name, path);
    e->ino = st->st_ino, e->size = st->st_size, e->mtime = st->st_mtim;
    k3_err err = {0};
    uint64_t bytes = 0;
    if (!S_ISREG(st->st_mode)) {
        e->kind = BAD;
        fprintf(stderr, "k3: prompt cache: %s skipped: not a regular file (a link, FIFO "
                "or folder)\n", path);
        return;
    }
    int rc = k3_state_peek(pc->fp, path, &e->pos, &bytes, &err);
    e->kind = !rc ? OWN : rc == K3_ERR_INPUT ? FOREIGN : BAD;
    if (rc) fprintf(stderr, "k3: prompt cache: skipped: %s\n", err.msg);
}

static void drop_stale_temp(const k3_pcache *pc, const char *name, const struct stat *st) {
    char path[PATH_MAX];
    if (strncmp(name, PREFIX, 5) || !strstr(name, SUFFIX ".tmp-") || !S_ISREG(st->st_mode) ||
        time(NULL) - st->st_mtime < STALE_TEMP_S)
        return;
    path_of(pc, name, path);
    unlink(path);
}

/* Re-reads the folder: new files classified, changed ones again, vanished ones dropped. */
static void rescan(k3_pcache *pc) {
    DIR *d = opendir(pc->dir);
    if (!d) {
        fprintf(stderr, "k3: prompt cache: %s: %s\n", pc->dir, strerror(errno));
        return;
    }
    size_t known = pc->n; /* sorted; new names are appended after them */
    for (size_t i = 0; i < pc->n; i++) pc->e[i].seen = false;
    for (struct dirent *de; (de = readdir(d));) {
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW)) continue;
        if (!is_name(de->d_name)) {
            drop_stale_temp(pc, de->d_name, &st);
            continue;
        }
        entry *e = find_in(pc, known, de->d_name);
        if (!e) {
            if (pc->n == pc->cap) {
                size_t cap = pc->cap ? 2 * pc->cap : 64;
                entry *ne = realloc(pc->e, cap * sizeof *ne);
                if (!ne) break;
                pc->e = ne, pc->cap = cap;
            }
            e = &pc->e[pc->n++];
            *e = (entry){0};
            strcpy(e->name, de->d_name);
            classify(pc, e, &st);
        } else if (e->ino != st.st_ino || e->size != st.st_size ||
                   e->mtime.tv_sec != st.st_mtim.tv_sec || e->mtime.tv_nsec != st.st_mtim.tv_nsec) {
            if (e->kind == OWN && e->ino == st.st_ino && e->size == st.st_size)
                e->mtime = st.st_mtim; /* a hit elsewhere refreshed it: still the same file */
            else
                classify(pc, e, &st);
        }
        e->seen = true;
    }
    closedir(d);
    compact(pc, true);
}

/* ---- budget -------------------------------------------------------------------------------- */

static bool older(const entry *a, const entry *b) {
    return a->mtime.tv_sec != b->mtime.tv_sec ? a->mtime.tv_sec < b->mtime.tv_sec
                                              : a->mtime.tv_nsec < b->mtime.tv_nsec;
}

/* Removes this model's least recently used file other than `keep`; false when none is left. */
static bool evict_one(k3_pcache *pc, const char *keep, k3_pcache_stats *st) {
    entry *victim = NULL;
    for (size_t i = 0; i < pc->n; i++) {
        entry *e = &pc->e[i];
        if (e->kind == OWN && (!keep || strcmp(e->name, keep)) && (!victim || older(e, victim)))
            victim = e;
    }
    if (!victim) return false;
    char path[PATH_MAX];
    path_of(pc, victim->name, path);
    unlink(path); /* gone already (another server evicted it) is as good */
    st->evicted++;
    victim->gone = true;
    compact(pc, false);
    return true;
}

static int by_age(const void *a, const void *b) {
    const entry *x = *(entry *const *)a, *y = *(entry *const *)b;
    return older(x, y) ? -1 : older(y, x) ? 1 : 0;
}

/* Removes this model's least recently used files but `keep` until they fit the budget, in
 * one sort (O(n log n), however many go). */
static void fit_budget(k3_pcache *pc, const char *keep, k3_pcache_stats *st) {
    uint64_t total = 0;
    size_t k = 0;
    entry **own = malloc((pc->n + 1) * sizeof *own);
    for (size_t i = 0; i < pc->n; i++) {
        if (pc->e[i].kind != OWN) continue;
        total += (uint64_t)pc->e[i].size;
        if (own && strcmp(pc->e[i].name, keep)) own[k++] = &pc->e[i];
    }
    if (!own || total <= pc->budget) {
        free(own);
        return;
    }
    qsort(own, k, sizeof *own, by_age);
    char path[PATH_MAX];
    for (size_t i = 0; i < k && total > pc->budget; i++) {
        path_of(pc, own[i]->name, path);
        unlink(path); /* gone already (another server evicted it) is as good */
        st->evicted++;
        total -= (uint64_t)own[i]->size;
        own[i]->gone = true;
    }
    free(own);
    compact(pc, false);
}

/* ---- the API ------------------------------------------------------------------------------- */

int k3_pcache_open(const k3_engine *e, const char *dir, double gb, int ram, k3_pcache **out,
                   k3_err *err) {
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode) || access(dir, W_OK | X_OK))
        return k3_fail(err, K3_ERR_USAGE, "--prompt-cache %s: not a folder this process can "
                       "write (create it first: mkdir -p %s)", dir, dir);
    k3_pcache *pc = calloc(1, sizeof *pc);
    if (!pc || !(pc->dir = strdup(dir))) {
        free(pc);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    pc->budget = (uint64_t)(gb * 1e9);
    pc->ram_cap = ram > 0 ? ram : 0;
    if (pc->ram_cap && !(pc->ram = calloc((size_t)pc->ram_cap, sizeof *pc->ram))) {
        k3_pcache_close(pc);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    int rc = k3_engine_state_fingerprint(e, pc->fp, err);
    if (rc) {
        k3_pcache_close(pc);
        return rc;
    }
    rescan(pc);
    *out = pc;
    return 0;
}

void k3_pcache_close(k3_pcache *pc) {
    if (!pc) return;
    while (pc->ram_n) ram_drop(pc, &pc->ram[0]);
    free(pc->ram);
    free(pc->dir);
    free(pc->e);
    free(pc);
}

/* The longest candidate of the RAM tier and of the folder: pos in (more_than, max] and the
 * name the request's ids give at that length (h: their chain). */
static ram_entry *best_ram(k3_pcache *pc, const uint64_t *h, const int32_t *ids,
                           size_t more_than, size_t max) {
    ram_entry *best = NULL;
    char want[NAME_LEN + 1];
    for (int i = 0; i < pc->ram_n; i++) {
        ram_entry *r = &pc->ram[i];
        if ((size_t)r->pos <= more_than || (size_t)r->pos > max || (best && r->pos <= best->pos))
            continue;
        key_name(h, ids, (size_t)r->pos, want);
        if (!strcmp(want, r->name)) best = r;
    }
    return best;
}

static entry *best_disk(k3_pcache *pc, const uint64_t *h, const int32_t *ids, size_t more_than,
                        size_t max) {
    entry *best = NULL;
    char want[NAME_LEN + 1];
    for (size_t i = 0; i < pc->n; i++) {
        entry *e = &pc->e[i];
        if (e->kind != OWN || (size_t)e->pos <= more_than || (size_t)e->pos > max ||
            (best && e->pos <= best->pos))
            continue;
        key_name(h, ids, (size_t)e->pos, want);
        if (!strcmp(want, e->name)) best = e;
    }
    return best;
}

/* Loads candidate r (RAM) or e (its file; with a RAM tier read whole and then kept there) into
 * sess. Returns 0, or the load's error (logged; the candidate is dropped or marked BAD). */
static int load_one(k3_pcache *pc, k3_session *sess, const int32_t *ids, ram_entry *r,
                    entry *e, k3_pcache_stats *st) {
    char path[PATH_MAX];
    path_of(pc, r ? r->name : e->name, path);
    k3_err err = {0};
    int rc, pos = r ? r->pos : e->pos;
    size_t bytes = 0;
    void *buf = NULL;
    if (r) {
        rc = k3_session_load_prefix_mem(sess, r->data, r->size, path, ids, pos, &err);
        bytes = r->size;
    } else if (pc->ram_cap && (buf = read_all(path, &bytes, &err))) {
        rc = k3_session_load_prefix_mem(sess, buf, bytes, path, ids, pos, &err);
    } else {
        rc = pc->ram_cap ? K3_ERR_IO : k3_session_load_prefix(sess, path, ids, pos, &err);
        bytes = (size_t)e->size;
    }
    if (rc == K3_ERR_USAGE) { /* the engine's refusal, not the file's: say so once */
        fprintf(stderr, "k3: prompt cache: snapshots are written, not read: %s\n", err.msg);
        pc->no_load = true;
    } else if (rc) {
        fprintf(stderr, "k3: prompt cache: skipped: %s\n", err.msg);
        st->skipped++;
        if (r) ram_drop(pc, r);
        else e->kind = BAD;
    } else {
        st->hits++;
        st->ram_hits += r != NULL;
        st->tokens_restored += (unsigned long long)pos;
        st->bytes_read += (unsigned long long)bytes;
        /* a hit makes it the most recently used (of every server sharing the folder) */
        utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW);
        if (e) clock_gettime(CLOCK_REALTIME, &e->mtime);
        if (r) r->used = ++pc->clock;
        if (buf) ram_put(pc, e->name, pos, buf, bytes), buf = NULL;
    }
    free(buf);
    return rc;
}

size_t k3_pcache_restore(k3_pcache *pc, k3_session *sess, const int32_t *ids, size_t n,
                         size_t more_than, size_t max, k3_pcache_stats *st) {
    if (max > n) max = n;
    if (max <= more_than || pc->no_load) return 0;
    double t0 = k3_now_s();
    uint64_t *h = chain(pc, ids, max);
    if (!h) return 0;
    rescan(pc);
    size_t got = 0;
    for (;;) { /* the longest candidate first, RAM before the folder at equal length */
        ram_entry *r = best_ram(pc, h, ids, more_than, max);
        entry *e = best_disk(pc, h, ids, more_than, max);
        if (!r && !e) break;
        if (r && e && e->pos > r->pos) r = NULL;
        if (r) e = NULL;
        int before = k3_session_pos(sess), pos = r ? r->pos : e->pos;
        int rc = load_one(pc, sess, ids, r, e, st);
        if (!rc) got = (size_t)pos;
        if (!rc || pc->no_load || k3_session_pos(sess) != before)
            break; /* a hit, or the session was reset: the caller prefills from empty */
    }
    free(h);
    st->read_s += k3_now_s() - t0;
    return got;
}

bool k3_pcache_save(k3_pcache *pc, const k3_session *sess, k3_pcache_stats *st) {
    size_t L = (size_t)k3_session_pos(sess);
    const int32_t *ids = k3_session_tokens(sess);
    uint64_t *h = L ? chain(pc, ids, L) : NULL;
    if (!h) return false;
    char name[NAME_LEN + 1], path[PATH_MAX];
    key_name(h, ids, L, name);
    free(h);
    rescan(pc);
    entry *have = find(pc, name);
    if (have && have->kind == OWN) return false; /* stored already (by us or another server) */
    path_of(pc, name, path);
    k3_err err = {0};
    double t0 = k3_now_s();
    int rc = k3_session_save(sess, path, &err);
    if (rc && evict_one(pc, NULL, st)) /* a full disk: make room once */
        rc = k3_session_save(sess, path, &err);
    st->write_s += k3_now_s() - t0;
    if (rc) {
        fprintf(stderr, "k3: prompt cache: a snapshot of %zu ids was not stored: %s\n",
                L, err.msg);
        return false;
    }
    rescan(pc);
    have = find(pc, name);
    if (!have || have->kind != OWN) return false;
    st->saves++;
    st->bytes_written += (unsigned long long)have->size;
    if ((uint64_t)have->size > pc->budget) { /* larger than the whole budget: not kept */
        fprintf(stderr, "k3: prompt cache: a snapshot of %zu ids (%lld bytes) exceeds "
                "--prompt-cache-gb; not kept\n", L, (long long)have->size);
        unlink(path);
        have->gone = true;
        compact(pc, false);
        return false;
    }
    fit_budget(pc, name, st);
    return true;
}

void k3_pcache_drop(k3_pcache *pc, const int32_t *ids, size_t L, k3_pcache_stats *st) {
    uint64_t *h = L ? chain(pc, ids, L) : NULL;
    if (!h) return;
    char name[NAME_LEN + 1], path[PATH_MAX];
    key_name(h, ids, L, name);
    free(h);
    entry *e = find(pc, name);
    if (!e || e->kind != OWN) return;
    path_of(pc, name, path);
    unlink(path);
    st->evicted++;
    e->gone = true;
    compact(pc, false);
}


size_t k3_pcache_marks(const int32_t *ids, size_t n, size_t from, int32_t eom, size_t every,
                       size_t *out, size_t cap) {
    size_t k = 0, prev = 0, last_eom = 0;
    if (every < K3_PCACHE_EVERY) every = K3_PCACHE_EVERY;
    bool first = true;
    for (size_t i = 0; i < n; i++)
        if (ids[i] == eom) last_eom = i + 1;
    for (size_t p = 1; p < n && k < cap; p++) {
        bool end = ids[p - 1] == eom;
        bool spaced = p - prev >= K3_PCACHE_EVERY / 8;
        bool take = (p % every == 0 && spaced) ||
                    (end && (first || p == last_eom || spaced));
        first = first && !end;
        if (!take) continue;
        prev = p;
        if (p > from) out[k++] = p;
    }
    return k;
}
