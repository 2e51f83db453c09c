/* install.c — `k3 setup DEST [--full | --stream | --finish]`: fetch the metadata and every
 * shard's header into memory, plan, check free space, then fill each shard's .partial range
 * by range (journaled) and rename it into place once complete and checked. */
#include "setup_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../util/fileio.h"
#include "../util/clock.h"

#define DEFAULT_CHUNK_BYTES (64ull << 20)

typedef struct meta_file {
    const char *name;
    bool optional;
    char *body;               /* fetched, not yet written (NULL: already on disk or absent) */
    uint64_t bytes;
    char sha256[65];
    bool present;
} meta_file;

typedef struct ctx {
    const k3_setup_opts *o;
    FILE *log;
    k3_http *http;
    sn_install in;
    sn_progress prog;
    uint64_t chunk_bytes;
    meta_file meta[6];
    int n_meta;
} ctx;

static void ctx_free(ctx *c) {
    k3_http_free(c->http);
    sn_install_free(&c->in);
    for (int i = 0; i < c->n_meta; i++) free(c->meta[i].body);
}

static char *shard_url(const ctx *c, char *buf, size_t cap, const char *name) {
    return k3_hub_url(buf, cap, c->in.endpoint, c->in.repo, c->in.revision, name);
}

static int http_open(ctx *c, k3_err *err) {
    k3_http_opts ho = {.endpoint = c->in.endpoint, .token = c->o->token,
                       .connections = c->in.net_connections, .retries = c->in.net_retries,
                       .backoff_s = c->in.net_backoff_s, .timeout_s = c->in.net_timeout_s,
                       .interrupt = c->o->interrupt, .on_bytes = sn_progress_add,
                       .user = &c->prog, .log = c->log};
    return k3_http_new(&ho, &c->http, err);
}

/* Source from the flags, else the manifest, else the defaults; the install must not change
 * repository or revision under an existing DEST. */
static int resolve_source(ctx *c, const sn_install *old, bool found, k3_err *err) {
    const k3_setup_opts *o = c->o;
    const char *ep = o->endpoint ? o->endpoint : found ? old->endpoint : K3_HF_ENDPOINT;
    const char *repo = o->repo ? o->repo : found ? old->repo : K3_HF_REPO;
    const char *rev = o->revision ? o->revision : found ? old->ref : K3_HF_REVISION;
    if (found && (strcmp(repo, old->repo) || (strcmp(rev, old->ref) && strcmp(rev, old->revision))))
        return k3_fail(err, K3_ERR_USAGE, "%s holds %s at revision %s, not %s at %s: use "
                       "another folder", o->dest, old->repo, old->ref, repo, rev);
    if (!repo[0] || strstr(repo, "..") || repo[0] == '/' || !rev[0] || strchr(rev, '/'))
        return k3_fail(err, K3_ERR_USAGE, "bad --repo '%s' or --revision '%s'", repo, rev);
    c->in.net_connections = o->connections ? o->connections : found ? old->net_connections : 0;
    c->in.net_retries = o->retries ? o->retries : found ? old->net_retries : 0;
    c->in.net_backoff_s = o->backoff_s > 0 ? o->backoff_s : found ? old->net_backoff_s : 0;
    c->in.net_timeout_s = o->timeout_s > 0 ? o->timeout_s : found ? old->net_timeout_s : 0;
    c->in.dest = strdup(o->dest);
    c->in.endpoint = strdup(ep);
    c->in.repo = strdup(repo);
    c->in.ref = strdup(found ? old->ref : rev);
    c->in.revision = strdup(found ? old->revision : rev); /* stays pinned once pinned */
    if (!c->in.dest || !c->in.endpoint || !c->in.repo || !c->in.revision || !c->in.ref)
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    return K3_OK;
}

/* ---- 1. metadata ------------------------------------------------------------------------- */

static const sn_file *old_file(const sn_install *old, const char *name) {
    for (int i = 0; i < old->n_files; i++)
        if (!strcmp(old->files[i].name, name)) return &old->files[i];
    return NULL;
}

/* A hub answers /resolve/<branch>/ with the commit the branch points to (X-Repo-Commit). From
 * then on every URL names that commit, so an install (and the experts it streams later) never
 * mixes two versions of the repository when the branch moves. */
static int pin_commit(ctx *c, const k3_http_req *reqs, int n, k3_err *err) {
    const char *commit = NULL;
    for (int i = 0; i < n; i++) {
        if (!reqs[i].repo_commit[0]) continue;
        if (commit && strcmp(commit, reqs[i].repo_commit))
            return k3_fail(err, K3_ERR_NETWORK, "%s moved from commit %s to %s during the "
                           "download: run the same command again", c->in.ref, commit,
                           reqs[i].repo_commit);
        commit = reqs[i].repo_commit;
    }
    if (!commit || !strcmp(commit, c->in.revision)) return K3_OK;
    if (strlen(c->in.revision) == 40 && strspn(c->in.revision, "0123456789abcdef") == 40)
        return k3_fail(err, K3_ERR_NETWORK, "%s is pinned to commit %s but the server now "
                       "answers with commit %s: the repository changed upstream (use a new "
                       "folder)", c->o->dest, c->in.revision, commit);
    char *pinned = strdup(commit);
    if (!pinned) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    fprintf(c->log, "k3 setup: %s of %s is commit %s: pinned for this install\n", c->in.ref,
            c->in.repo, commit);
    free(c->in.revision);
    c->in.revision = pinned;
    return K3_OK;
}

/* config.json, the index, the tokenizer files: taken from DEST when a previous run wrote
 * them (the manifest lists them with the same size), else fetched whole into memory. */
static int fetch_metadata(ctx *c, const sn_install *old, k3_err *err) {
    static const struct { const char *name; bool optional; } names[] = {
        {"config.json", false}, {SN_INDEX, true}, {"tiktoken.model", false},
        {"tokenizer_config.json", false}, {"generation_config.json", true},
    };
    k3_http_req reqs[6];
    meta_file *which[6];
    int nr = 0;
    char urls[6][2048];
    c->n_meta = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        meta_file *m = &c->meta[c->n_meta++];
        *m = (meta_file){.name = names[i].name, .optional = names[i].optional};
        const sn_file *of = old_file(old, m->name);
        char path[4096];
        struct stat st;
        if (of && stat(sn_path(path, sizeof path, c->o->dest, m->name, NULL), &st) == 0 &&
            (uint64_t)st.st_size == of->bytes) {
            m->present = true, m->bytes = of->bytes;
            memcpy(m->sha256, of->sha256, sizeof m->sha256);
            continue;
        }
        reqs[nr] = (k3_http_req){.url = shard_url(c, urls[nr], sizeof urls[nr], m->name),
                                 .fd = -1, .max_bytes = SN_MAX_SMALL_BYTES, .what = m->name,
                                 .not_found_ok = m->optional};
        which[nr++] = m;
    }
    int rc = k3_http_fetch(c->http, reqs, nr, NULL, NULL, err);
    if (rc) return rc;
    if ((rc = pin_commit(c, reqs, nr, err))) return rc;
    for (int i = 0; i < nr; i++) {
        meta_file *m = which[i];
        if (reqs[i].status == 404) { /* optional and absent */
            free(reqs[i].body);
            continue;
        }
        m->body = reqs[i].body ? reqs[i].body : strdup("");
        m->bytes = reqs[i].done;
        m->present = true;
        if (reqs[i].sha256[0]) {
            char got[65];
            sn_sha256_mem(m->body, m->bytes, got);
            if (strcmp(got, reqs[i].sha256))
                return k3_fail(err, K3_ERR_NETWORK, "%s: sha256 %s, but the server says %s: "
                               "the download is corrupt (run again)", m->name, got,
                               reqs[i].sha256);
            memcpy(m->sha256, reqs[i].sha256, sizeof m->sha256);
        }
    }
    return K3_OK;
}

static const meta_file *meta(const ctx *c, const char *name) {
    for (int i = 0; i < c->n_meta; i++)
        if (!strcmp(c->meta[i].name, name)) return c->meta[i].present ? &c->meta[i] : NULL;
    return NULL;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The shard names: the index's weight_map values (unique, sorted), or model.safetensors. */
static int shard_names(ctx *c, char ***names, int *n, k3_err *err) {
    const meta_file *ix = meta(c, SN_INDEX);
    char *owned = NULL;
    const char *txt = ix ? ix->body : NULL;
    if (ix && !txt) { /* on disk from an earlier run */
        char path[4096];
        int rc = k3_read_file(sn_path(path, sizeof path, c->o->dest, SN_INDEX, NULL),
                              SN_MAX_SMALL_BYTES, &owned, NULL, err);
        if (rc) return rc;
        txt = owned;
    }
    *n = 0;
    *names = calloc(1, sizeof **names);
    if (!*names) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    if (!txt) { /* no index: a single unsharded file */
        (*names)[0] = strdup(SN_SINGLE);
        *n = 1;
        return (*names)[0] ? K3_OK : k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    cJSON *root = cJSON_Parse(txt);
    free(owned);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    int rc = K3_OK;
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return k3_fail(err, K3_ERR_CHECKPOINT, SN_INDEX " from the server has no weight_map");
    }
    int cap = cJSON_GetArraySize(wm) + 1;
    char **v = realloc(*names, (size_t)cap * sizeof *v);
    if (!v) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    else *names = v;
    for (const cJSON *e = wm->child; e && !rc; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || e->valuestring[0] == '.' ||
            strchr(e->valuestring, '/')) {
            rc = k3_fail(err, K3_ERR_CHECKPOINT, SN_INDEX ": tensor %s: shard name is not a "
                         "plain file name", e->string);
            break;
        }
        (*names)[(*n)++] = e->valuestring;
    }
    if (!rc) {
        qsort(*names, (size_t)*n, sizeof **names, cmp_str);
        int u = 0;
        for (int i = 0; i < *n; i++)
            if (!u || strcmp((*names)[u - 1], (*names)[i])) (*names)[u++] = (*names)[i];
        *n = u;
        for (int i = 0; i < u && !rc; i++)
            if (!((*names)[i] = strdup((*names)[i]))) rc = k3_fail(err, K3_ERR_GENERIC, "oom");
    }
    cJSON_Delete(root);
    return rc;
}

/* ---- 2. shard headers ------------------------------------------------------------------- */

/* Fetches, for every shard whose header is not local, bytes 0-7 (the header length, the file
 * size from Content-Range and the sha256 from the ETag), then the header itself. */
static int fetch_headers(ctx *c, k3_err *err) {
    int n = c->in.n_shards, m = 0, rc = K3_OK;
    k3_http_req *reqs = calloc((size_t)n + 1, sizeof *reqs);
    int *which = calloc((size_t)n + 1, sizeof *which);
    unsigned char (*len8)[8] = calloc((size_t)n + 1, 8);
    char (*urls)[2048] = calloc((size_t)n + 1, sizeof *urls);
    if (!reqs || !which || !len8 || !urls) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        sn_shard *sh = &c->in.shards[i];
        if (sh->header) continue;
        reqs[m] = (k3_http_req){.url = shard_url(c, urls[m], sizeof urls[m], sh->name),
                                .offset = 0, .nbytes = 8, .dst = len8[m], .fd = -1,
                                .what = sh->name, .expect_total = sh->bytes};
        which[m++] = i;
    }
    if (!rc) rc = k3_http_fetch(c->http, reqs, m, NULL, NULL, err);
    for (int k = 0; k < m && !rc; k++) {
        sn_shard *sh = &c->in.shards[which[k]];
        uint64_t hn = 0;
        for (int b = 7; b >= 0; b--) hn = (hn << 8) | len8[k][b];
        if (!sh->bytes) memcpy(sh->sha256, reqs[k].sha256, sizeof sh->sha256);
        sh->bytes = reqs[k].total_bytes;
        if (hn > SN_MAX_HEADER_BYTES || 8 + hn > sh->bytes)
            rc = k3_fail(err, K3_ERR_CHECKPOINT, "%s: header length %llu does not fit the "
                         "%llu-byte file: not a safetensors file", sh->name,
                         (unsigned long long)hn, (unsigned long long)sh->bytes);
        sh->header_bytes = 8 + hn;
        if (!rc && !(sh->header = malloc(sh->header_bytes + 1)))
            rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
        if (!rc) {
            memcpy(sh->header, len8[k], 8);
            reqs[k] = (k3_http_req){.url = reqs[k].url, .offset = 8, .nbytes = hn,
                                    .dst = sh->header + 8, .fd = -1, .what = sh->name,
                                    .expect_total = sh->bytes};
        }
    }
    if (!rc) rc = k3_http_fetch(c->http, reqs, m, NULL, NULL, err);
    for (int k = 0; k < m && !rc; k++) {
        sn_shard *sh = &c->in.shards[which[k]];
        char *h = sh->header;
        sh->header = NULL;
        rc = sn_parse_header(sh, h, sh->header_bytes, err);
    }
    free(reqs);
    free(which);
    free(len8);
    free(urls);
    return rc;
}

/* ---- 3. planning ------------------------------------------------------------------------ */

/* The bytes a shard must hold: all of it (full), or its header and text spine (stream). */
static int shard_need(const sn_shard *sh, bool full, sn_ranges *need) {
    need->n = 0;
    if (full) return sn_ranges_add(need, 0, sh->bytes);
    int rc = sn_ranges_add(need, 0, sh->header_bytes);
    for (int k = 0; k < sh->nt && !rc; k++)
        if (sh->t[k].kind == SN_SPINE) rc = sn_ranges_add(need, sh->t[k].begin, sh->t[k].end);
    return rc;
}

static bool span_cached(const ctx *c, const k3_expert_span *sp) {
    char path[4096];
    struct stat st;
    return stat(sn_span_path(path, sizeof path, c->in.dest, sp->layer, sp->expert), &st) == 0 &&
           (uint64_t)st.st_size == sp->nbytes;
}

typedef struct plan {
    uint64_t fetch_bytes;     /* to write into shards (network, or headers already in memory) */
    uint64_t net_bytes;       /* of which from the network */
    uint64_t cached_bytes;    /* raw spans copied into shards (their files are then removed) */
    uint64_t experts_missing, experts_cached;
} plan;

/* What a full or stream install still needs. Raw spans already cached are not refetched. */
static int make_plan(const ctx *c, bool full, plan *p, k3_err *err) {
    *p = (plan){0};
    sn_ranges need = {0}, miss = {0};
    int rc = K3_OK, si = 0;
    for (int s = 0; s < c->in.n_shards && !rc; s++) {
        const sn_shard *sh = &c->in.shards[s];
        if (sh->complete) {
            while (si < c->in.n_spans && c->in.spans[si].shard == s) si++;
            continue;
        }
        uint64_t m = 0;
        if (shard_need(sh, full, &need)) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
        for (int i = 0; i < need.n && !rc; i++) { /* the needed bytes not yet journaled */
            if (sn_ranges_missing(&sh->done, need.r[i][0], need.r[i][1], &miss))
                rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
            m += sn_ranges_bytes(&miss);
        }
        for (; si < c->in.n_spans && c->in.spans[si].shard == s; si++) {
            const k3_expert_span *sp = &c->in.spans[si];
            if (sn_ranges_covers(&sh->done, sp->offset, sp->offset + sp->nbytes)) continue;
            p->experts_missing++;
            if (full && span_cached(c, sp)) {
                p->experts_cached++;
                p->cached_bytes += sp->nbytes;
                m -= sp->nbytes;
            }
        }
        p->fetch_bytes += m;
        p->net_bytes += m;
        if (sh->header && !sn_ranges_covers(&sh->done, 0, sh->header_bytes))
            p->net_bytes -= sh->header_bytes; /* fetched with the plan, written from memory */
    }
    sn_ranges_free(&need);
    sn_ranges_free(&miss);
    return rc;
}

static int refuse_space(const ctx *c, const char *what, uint64_t need, uint64_t avail,
                        const char *hint, k3_err *err) {
    char hn[32], ha[32], hf[32];
    return k3_fail(err, K3_ERR_NO_SPACE, "%s needs %llu bytes (%s) in %s but %llu bytes (%s) "
                   "are free: free at least %llu bytes (%s)%s", what, (unsigned long long)need,
                   sn_human(hn, sizeof hn, need), c->o->dest, (unsigned long long)avail,
                   sn_human(ha, sizeof ha, avail), (unsigned long long)(need - avail),
                   sn_human(hf, sizeof hf, need - avail), hint);
}

/* ---- 4. writing ------------------------------------------------------------------------- */

typedef struct shard_io {
    ctx *c;
    sn_shard *sh;
    int fd, jfd;
    char part[4200];
} shard_io;

static int journal_add(shard_io *io, uint64_t off, uint64_t len, k3_err *err) {
    /* the data first, then the record that vouches for it */
    if (fdatasync(io->fd) != 0)
        return k3_fail(err, K3_ERR_IO, "%s: fdatasync failed: %s", io->part, strerror(errno));
    unsigned char rec[16];
    for (int i = 0; i < 8; i++) rec[i] = (unsigned char)(off >> (8 * i));
    for (int i = 0; i < 8; i++) rec[8 + i] = (unsigned char)(len >> (8 * i));
    if (write(io->jfd, rec, sizeof rec) != (ssize_t)sizeof rec)
        return k3_fail(err, K3_ERR_IO, "%s journal: write failed: %s", io->sh->name,
                       strerror(errno));
    if (sn_ranges_add(&io->sh->done, off, off + len))
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    return K3_OK;
}

static int chunk_done(void *user, k3_http_req *r, k3_err *err) {
    shard_io *io = user;
    return journal_add(io, r->offset, r->nbytes, err);
}

static int io_open(shard_io *io, k3_err *err) {
    ctx *c = io->c;
    sn_shard *sh = io->sh;
    char jpath[4096];
    sn_partial_path(io->part, sizeof io->part, c->in.dest, sh->name);
    sn_journal_path(jpath, sizeof jpath, c->in.dest, sh->name);
    int fresh = sh->has_partial ? 0 : O_TRUNC;
    io->fd = open(io->part, O_RDWR | O_CREAT | O_CLOEXEC | fresh, 0644);
    if (io->fd < 0)
        return k3_fail(err, K3_ERR_IO, "%s: cannot create: %s", io->part, strerror(errno));
    if (!sh->has_partial && ftruncate(io->fd, (off_t)sh->bytes) != 0)
        return k3_fail(err, K3_ERR_IO, "%s: cannot size to %llu bytes: %s", io->part,
                       (unsigned long long)sh->bytes, strerror(errno));
    io->jfd = open(jpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | fresh, 0644);
    if (io->jfd < 0)
        return k3_fail(err, K3_ERR_IO, "%s: cannot create: %s", jpath, strerror(errno));
    if (!sh->has_partial) sh->done.n = 0;
    sh->has_partial = true;
    return K3_OK;
}

static void io_close(shard_io *io) {
    if (io->fd >= 0) close(io->fd);
    if (io->jfd >= 0) close(io->jfd);
    io->fd = io->jfd = -1;
}

static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w, n -= (size_t)w, off += (uint64_t)w;
    }
    return 0;
}

/* Copies the cached raw spans of this shard that `need` wants into the .partial, journals
 * them, then removes the span files (the shard now holds the bytes). */
static int copy_cached_spans(shard_io *io, int shard, const sn_ranges *need, k3_err *err) {
    ctx *c = io->c;
    char path[4096];
    for (int i = 0; i < c->in.n_spans; i++) {
        const k3_expert_span *sp = &c->in.spans[i];
        if (sp->shard != shard || !sn_ranges_covers(need, sp->offset, sp->offset + sp->nbytes) ||
            sn_ranges_covers(&io->sh->done, sp->offset, sp->offset + sp->nbytes) ||
            !span_cached(c, sp))
            continue;
        char *buf = NULL;
        size_t len = 0;
        int rc = k3_read_file(sn_span_path(path, sizeof path, c->in.dest, sp->layer, sp->expert),
                              sp->nbytes + 1, &buf, &len, err);
        if (rc) return rc;
        if (len != sp->nbytes || pwrite_all(io->fd, buf, len, sp->offset)) {
            free(buf);
            return k3_fail(err, K3_ERR_IO, "%s: cannot copy %s into it: %s", io->part, path,
                           strerror(errno));
        }
        free(buf);
        rc = journal_add(io, sp->offset, sp->nbytes, err);
        if (rc) return rc;
        unlink(path);
    }
    return K3_OK;
}

/* A name for the bytes [a, b) of shard s in messages: the experts it covers, if any. */
static void describe(const ctx *c, int s, uint64_t a, uint64_t b, char *buf, size_t cap) {
    const k3_expert_span *first = NULL, *last = NULL;
    int n = 0, lo = 0, hi = c->in.n_spans;
    while (lo < hi) { /* the first span of shard s ending after a (spans sort by shard, offset) */
        int mid = (lo + hi) / 2;
        const k3_expert_span *sp = &c->in.spans[mid];
        if (sp->shard < s || (sp->shard == s && sp->offset + sp->nbytes <= a)) lo = mid + 1;
        else hi = mid;
    }
    for (int i = lo; i < c->in.n_spans; i++) {
        const k3_expert_span *sp = &c->in.spans[i];
        if (sp->shard != s || sp->offset >= b) break;
        if (!first) first = sp;
        last = sp, n++;
    }
    if (n == 1)
        snprintf(buf, cap, "expert %d of layer %d (%s)", first->expert, first->layer,
                 c->in.shards[s].name);
    else if (n > 1)
        snprintf(buf, cap, "%d experts, expert %d of layer %d to expert %d of layer %d (%s)", n,
                 first->expert, first->layer, last->expert, last->layer, c->in.shards[s].name);
    else
        snprintf(buf, cap, "%s", c->in.shards[s].name);
}

/* Checks a complete .partial (sha256 when known) and renames it into place. */
static int finalize(shard_io *io, k3_err *err) {
    ctx *c = io->c;
    sn_shard *sh = io->sh;
    char fin[4096], jpath[4096];
    sn_path(fin, sizeof fin, c->in.dest, sh->name, NULL);
    sn_journal_path(jpath, sizeof jpath, c->in.dest, sh->name);
    io_close(io);
    if (sh->sha256[0]) {
        char got[65];
        int rc = sn_sha256_file(io->part, got, NULL, NULL, err);
        if (rc) return rc;
        if (strcmp(got, sh->sha256)) {
            unlink(io->part);
            unlink(jpath);
            sh->has_partial = false;
            sh->done.n = 0;
            return k3_fail(err, K3_ERR_NETWORK, "%s: sha256 of the downloaded shard is %s but the "
                           "server says %s: it was deleted; run the same command again",
                           sh->name, got, sh->sha256);
        }
    }
    if (rename(io->part, fin) != 0)
        return k3_fail(err, K3_ERR_IO, "%s: cannot rename into place: %s", fin, strerror(errno));
    int dfd = open(c->in.dest, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    unlink(jpath);
    sh->complete = true;
    sh->has_partial = false;
    return K3_OK;
}

/* Brings shard s up to `full` (every byte) or to its stream needs. */
static int fill_shard(ctx *c, int s, bool full, k3_err *err) {
    sn_shard *sh = &c->in.shards[s];
    if (sh->complete) return K3_OK;
    shard_io io = {.c = c, .sh = sh, .fd = -1, .jfd = -1};
    sn_ranges need = {0}, miss = {0}, part = {0};
    k3_http_req *reqs = NULL;
    char (*whats)[200] = NULL;
    char url[2048];
    int rc = shard_need(sh, full, &need) ? k3_fail(err, K3_ERR_GENERIC, "out of memory") : 0;
    if (!rc) rc = io_open(&io, err);
    if (!rc && !sn_ranges_covers(&sh->done, 0, sh->header_bytes)) { /* fetched already */
        if (pwrite_all(io.fd, sh->header, sh->header_bytes, 0))
            rc = k3_fail(err, K3_ERR_IO, "%s: write failed: %s", io.part, strerror(errno));
        if (!rc) rc = journal_add(&io, 0, sh->header_bytes, err);
    }
    if (!rc) rc = copy_cached_spans(&io, s, &need, err);
    /* what is still missing, in file-offset order, in requests of at most chunk_bytes */
    int nreq = 0, cap = 0;
    for (int i = 0; i < need.n && !rc; i++) {
        if (sn_ranges_missing(&sh->done, need.r[i][0], need.r[i][1], &part)) {
            rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
            break;
        }
        for (int k = 0; k < part.n && !rc; k++)
            for (uint64_t a = part.r[k][0]; a < part.r[k][1]; a += c->chunk_bytes) {
                uint64_t b = part.r[k][1] - a > c->chunk_bytes ? a + c->chunk_bytes
                                                               : part.r[k][1];
                if (nreq == cap) {
                    cap = cap ? cap * 2 : 16;
                    void *nr = realloc(reqs, (size_t)cap * sizeof *reqs);
                    void *nw = nr ? realloc(whats, (size_t)cap * sizeof *whats) : NULL;
                    if (nr) reqs = nr;
                    if (nw) whats = nw;
                    if (!nr || !nw) {
                        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
                        break;
                    }
                }
                describe(c, s, a, b, whats[nreq], sizeof whats[nreq]);
                reqs[nreq] = (k3_http_req){.url = url, .offset = a, .nbytes = b - a, .fd = io.fd,
                                           .file_offset = a, .expect_total = sh->bytes,
                                           .what = whats[nreq]};
                nreq++;
            }
    }
    shard_url(c, url, sizeof url, sh->name);
    if (!rc) rc = k3_http_fetch(c->http, reqs, nreq, chunk_done, &io, err);
    if (!rc && sn_ranges_covers(&sh->done, 0, sh->bytes)) rc = finalize(&io, err);
    io_close(&io);
    sn_ranges_free(&need);
    sn_ranges_free(&miss);
    sn_ranges_free(&part);
    free(reqs);
    free(whats);
    return rc;
}

static int write_metadata(ctx *c, k3_err *err) {
    for (int i = 0; i < c->n_meta; i++) {
        meta_file *m = &c->meta[i];
        if (!m->body) continue;
        int rc = sn_write_atomic(c->in.dest, m->name, m->body, m->bytes, err);
        if (rc) return rc;
        free(m->body);
        m->body = NULL;
    }
    return K3_OK;
}

/* The manifest's files[] from what is present. */
static int set_manifest_files(ctx *c, k3_err *err) {
    for (int i = 0; i < c->in.n_files; i++) free(c->in.files[i].name);
    free(c->in.files);
    c->in.n_files = 0;
    c->in.files = calloc((size_t)c->n_meta + 1, sizeof *c->in.files);
    if (!c->in.files) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (int i = 0; i < c->n_meta; i++) {
        const meta_file *m = &c->meta[i];
        if (!m->present) continue;
        sn_file *f = &c->in.files[c->in.n_files++];
        if (!(f->name = strdup(m->name))) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
        f->bytes = m->bytes;
        memcpy(f->sha256, m->sha256, sizeof f->sha256);
    }
    return K3_OK;
}

static bool all_complete(const sn_install *in) {
    for (int i = 0; i < in->n_shards; i++)
        if (!in->shards[i].complete) return false;
    return true;
}

/* Fills every shard (full or stream needs), with one progress display for all of it. */
static int fill_all(ctx *c, bool full, uint64_t total, const char *label, k3_err *err) {
    sn_progress_begin(&c->prog, c->log, c->o->progress_bar, label, total);
    int rc = K3_OK;
    for (int s = 0; s < c->in.n_shards && !rc; s++) rc = fill_shard(c, s, full, err);
    if (!rc) sn_progress_end(&c->prog);
    else if (c->o->progress_bar) fputc('\n', c->log);
    return rc;
}

static uint64_t local_experts(const ctx *c) {
    uint64_t n = 0;
    for (int i = 0; i < c->in.n_spans; i++) {
        const k3_expert_span *sp = &c->in.spans[i];
        const sn_shard *sh = &c->in.shards[sp->shard];
        n += sh->complete || sn_ranges_covers(&sh->done, sp->offset, sp->offset + sp->nbytes) ||
             span_cached(c, sp);
    }
    return n;
}

/* Total bytes of the snapshot's shards. */
static uint64_t shard_bytes(const sn_install *in) {
    uint64_t t = 0;
    for (int i = 0; i < in->n_shards; i++) t += in->shards[i].bytes;
    return t;
}

/* ---- the commands ---------------------------------------------------------------------- */

/* Shards from the index, with what an earlier run recorded about them. */
static int init_shards(ctx *c, const sn_install *old, k3_err *err) {
    char **names = NULL;
    int n = 0;
    int rc = shard_names(c, &names, &n, err);
    if (!rc && !(c->in.shards = calloc((size_t)n + 1, sizeof *c->in.shards)))
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        sn_shard *sh = &c->in.shards[c->in.n_shards++];
        sh->name = names[i];
        names[i] = NULL;
        for (int k = 0; k < old->n_shards; k++)
            if (!strcmp(old->shards[k].name, sh->name)) {
                sh->bytes = old->shards[k].bytes;
                sh->header_bytes = old->shards[k].header_bytes;
                memcpy(sh->sha256, old->shards[k].sha256, sizeof sh->sha256);
            }
    }
    for (int i = 0; i < n; i++) free(names ? names[i] : NULL);
    free(names);
    return rc;
}

/* Reads local headers/journals of shards an earlier run knew; fetches the other headers. */
static int know_shards(ctx *c, k3_err *err) {
    int rc = K3_OK;
    for (int i = 0; i < c->in.n_shards && !rc; i++)
        if (c->in.shards[i].bytes) rc = sn_load_shard(c->in.dest, &c->in.shards[i], err);
    if (!rc) rc = fetch_headers(c, err);
    if (!rc) rc = sn_build_spans(&c->in, err);
    return rc;
}

static int install(ctx *c, const sn_install *old, bool found, k3_err *err) {
    const k3_setup_opts *o = c->o;
    char h1[32], h2[32], h3[32];
    int rc = resolve_source(c, old, found, err);
    if (!rc) rc = http_open(c, err);
    if (!rc) rc = fetch_metadata(c, old, err);
    if (!rc) rc = init_shards(c, old, err);
    if (!rc) rc = know_shards(c, err);
    if (rc) return rc;
    plan pf, ps;
    if ((rc = make_plan(c, true, &pf, err)) || (rc = make_plan(c, false, &ps, err))) return rc;
    uint64_t small = 0, avail;
    for (int i = 0; i < c->n_meta; i++) small += c->meta[i].body ? c->meta[i].bytes : 0;
    if (o->free_bytes >= 0) avail = (uint64_t)o->free_bytes;
    else if ((rc = sn_free_bytes(o->dest, &avail, err))) return rc;
    uint64_t need_full = small + pf.fetch_bytes, need_stream = small + ps.fetch_bytes;
    fprintf(c->log, "k3 setup: %s@%s: %d shards, %s; a full install needs %s more, the spine "
            "only (--stream) %s more; %s free\n", c->in.repo, c->in.revision, c->in.n_shards,
            sn_human(h1, sizeof h1, shard_bytes(&c->in)), sn_human(h2, sizeof h2, need_full),
            sn_human(h3, sizeof h3, need_stream), sn_human((char[32]){0}, 32, avail));
    enum k3_setup_mode mode = o->mode;
    if (mode == K3_SETUP_AUTO) {
        mode = avail >= need_full ? K3_SETUP_FULL : K3_SETUP_STREAM;
        if (mode == K3_SETUP_STREAM && avail >= need_stream)
            fprintf(c->log, "k3 setup: not enough room for a full install (%llu more bytes, %s): "
                    "installing the spine only; experts are fetched when first used, and "
                    "`k3 setup %s --finish` completes the install\n",
                    (unsigned long long)(need_full - avail),
                    sn_human(h1, sizeof h1, need_full - avail), o->dest);
    }
    bool full = mode == K3_SETUP_FULL;
    uint64_t need = full ? need_full : need_stream;
    if (avail < need)
        return refuse_space(c, full ? "a full install" : "a streaming install (--stream)", need,
                            avail, full ? " (or use --stream for the spine only)" : "", err);
    snprintf(c->in.mode, sizeof c->in.mode, "%s", full ? "full" : "stream");
    if ((rc = set_manifest_files(c, err)) || (rc = sn_manifest_write(&c->in, err)) ||
        (rc = write_metadata(c, err)))
        return rc;
    double t0 = k3_now_s();
    rc = fill_all(c, full, full ? pf.net_bytes : ps.net_bytes,
                  full ? "full" : "spine", err);
    if (rc) return rc;
    if (all_complete(&c->in)) snprintf(c->in.mode, sizeof c->in.mode, "full");
    if ((rc = sn_manifest_write(&c->in, err))) return rc;
    double dt = k3_now_s() - t0;
    uint64_t got = c->prog.done;
    fprintf(c->log, "k3 setup: %s install in %s: %s fetched in %.1f s (%s/s)\n", c->in.mode,
            o->dest, sn_human(h1, sizeof h1, got), dt,
            sn_human(h2, sizeof h2, dt > 0 ? (uint64_t)((double)got / dt) : got));
    if (!full && (rc = make_plan(c, true, &pf, err)) == K3_OK)
        fprintf(c->log, "k3 setup: %llu of %d experts local; finishing costs %s: "
                "k3 setup %s --finish\n", (unsigned long long)local_experts(c), c->in.n_spans,
                sn_human(h1, sizeof h1, pf.fetch_bytes), o->dest);
    return rc;
    return K3_OK;
}

static int finish(ctx *c, const sn_install *old, bool found, k3_err *err) {
    const k3_setup_opts *o = c->o;
    char h1[32], h2[32];
    if (!found)
        return k3_fail(err, K3_ERR_USAGE, "%s has no k3 setup manifest (" SN_MANIFEST "): run "
                       "k3 setup %s first", o->dest, o->dest);
    int rc = resolve_source(c, old, found, err);
    if (!rc) rc = http_open(c, err);
    for (int i = 0; i < old->n_files && !rc; i++) { /* metadata is complete already */
        meta_file *m = &c->meta[c->n_meta++];
        *m = (meta_file){.name = old->files[i].name, .present = true,
                         .bytes = old->files[i].bytes};
        memcpy(m->sha256, old->files[i].sha256, sizeof m->sha256);
    }
    if (!rc) rc = init_shards(c, old, err);
    if (!rc) rc = know_shards(c, err);
    plan pf;
    if (!rc) rc = make_plan(c, true, &pf, err);
    if (rc) return rc;
    uint64_t avail;
    if (o->free_bytes >= 0) avail = (uint64_t)o->free_bytes;
    else if ((rc = sn_free_bytes(o->dest, &avail, err))) return rc;
    fprintf(c->log, "k3 setup: finishing %s: %llu of %d experts missing, %llu of them in the "
            "raw-span cache (copied, not fetched); %s to fetch\n", o->dest,
            (unsigned long long)pf.experts_missing, c->in.n_spans,
            (unsigned long long)pf.experts_cached, sn_human(h1, sizeof h1, pf.fetch_bytes));
    if (avail < pf.fetch_bytes)
        return refuse_space(c, "finishing the install", pf.fetch_bytes, avail, "", err);
    double t0 = k3_now_s();
    if ((rc = fill_all(c, true, pf.net_bytes, "finish", err))) return rc;
    snprintf(c->in.mode, sizeof c->in.mode, "full");
    if ((rc = set_manifest_files(c, err)) || (rc = sn_manifest_write(&c->in, err))) return rc;
    double dt = k3_now_s() - t0;
    fprintf(c->log, "k3 setup: %s is complete: %s fetched in %.1f s (%s/s)\n", o->dest,
            sn_human(h1, sizeof h1, c->prog.done), dt,
            sn_human(h2, sizeof h2, dt > 0 ? (uint64_t)((double)c->prog.done / dt) : 0));
    return K3_OK;
}

int k3_setup_run(const k3_setup_opts *o, k3_err *err) {
    ctx c = {.o = o, .log = o->log ? o->log : stderr,
             .chunk_bytes = o->chunk_bytes ? o->chunk_bytes : DEFAULT_CHUNK_BYTES};
    sn_install old = {0};
    bool found = false;
    char dir[4096];
    int rc = o->mode == K3_SETUP_CHECK
                 ? K3_OK
                 : sn_mkdirs(sn_path(dir, sizeof dir, o->dest, SN_PARTIAL_DIR, NULL), err);
    if (!rc) rc = sn_manifest_read(o->dest, &old, &found, err);
    if (!rc) {
        if (o->mode == K3_SETUP_CHECK) rc = sn_check(o, found, err);
        else if (o->mode == K3_SETUP_FINISH) rc = finish(&c, &old, found, err);
        else rc = install(&c, &old, found, err);
    }
    sn_install_free(&old);
    ctx_free(&c);
    return rc;
}
