/* local.c — the install on disk: byte-range sets, journals, the manifest, shard headers,
 * expert spans, checksums, free space and atomic writes (layout in setup.h). */
#include "setup_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* ---- byte-range sets ------------------------------------------------------------------ */

int sn_ranges_add(sn_ranges *s, uint64_t a, uint64_t b) {
    if (a >= b) return 0;
    /* find the first range whose end reaches a, merge everything that touches [a, b) */
    int i = 0;
    while (i < s->n && s->r[i][1] < a) i++;
    int j = i;
    while (j < s->n && s->r[j][0] <= b) {
        if (s->r[j][0] < a) a = s->r[j][0];
        if (s->r[j][1] > b) b = s->r[j][1];
        j++;
    }
    if (j == i) { /* insert */
        if (s->n == s->cap) {
            int nc = s->cap ? s->cap * 2 : 16;
            void *nr = realloc(s->r, (size_t)nc * sizeof *s->r);
            if (!nr) return ENOMEM;
            s->r = nr, s->cap = nc;
        }
        memmove(&s->r[i + 1], &s->r[i], (size_t)(s->n - i) * sizeof *s->r);
        s->n++;
    } else if (j > i + 1) { /* several merged into one */
        memmove(&s->r[i + 1], &s->r[j], (size_t)(s->n - j) * sizeof *s->r);
        s->n -= j - i - 1;
    }
    s->r[i][0] = a, s->r[i][1] = b;
    return 0;
}

bool sn_ranges_covers(const sn_ranges *s, uint64_t a, uint64_t b) {
    if (a >= b) return true;
    int lo = 0, hi = s->n - 1;
    while (lo <= hi) { /* the range starting at or before a */
        int mid = (lo + hi) / 2;
        if (s->r[mid][0] <= a) lo = mid + 1;
        else hi = mid - 1;
    }
    return hi >= 0 && s->r[hi][1] >= b;
}

uint64_t sn_ranges_bytes(const sn_ranges *s) {
    uint64_t t = 0;
    for (int i = 0; i < s->n; i++) t += s->r[i][1] - s->r[i][0];
    return t;
}

int sn_ranges_missing(const sn_ranges *s, uint64_t a, uint64_t b, sn_ranges *out) {
    out->n = 0;
    uint64_t cur = a;
    for (int i = 0; i < s->n && cur < b; i++) {
        if (s->r[i][1] <= cur) continue;
        if (s->r[i][0] >= b) break;
        if (s->r[i][0] > cur && sn_ranges_add(out, cur, s->r[i][0])) return ENOMEM;
        cur = s->r[i][1];
    }
    if (cur < b && sn_ranges_add(out, cur, b)) return ENOMEM;
    return 0;
}

void sn_ranges_free(sn_ranges *s) {
    free(s->r);
    *s = (sn_ranges){0};
}

/* ---- paths ---------------------------------------------------------------------------- */

char *sn_path(char *buf, size_t cap, const char *dest, const char *name, const char *suffix) {
    if (snprintf(buf, cap, "%s/%s%s", dest, name, suffix ? suffix : "") >= (int)cap) buf[0] = 0;
    return buf;
}

char *sn_partial_path(char *buf, size_t cap, const char *dest, const char *shard) {
    if (snprintf(buf, cap, "%s/" SN_PARTIAL_DIR "/%s", dest, shard) >= (int)cap) buf[0] = 0;
    return buf;
}

char *sn_journal_path(char *buf, size_t cap, const char *dest, const char *shard) {
    if (snprintf(buf, cap, "%s/" SN_DIR "/%s.done", dest, shard) >= (int)cap) buf[0] = 0;
    return buf;
}

char *sn_span_path(char *buf, size_t cap, const char *dest, int layer, int expert) {
    if (snprintf(buf, cap, "%s/" SN_DIR "/experts/%d/%d.bin", dest, layer, expert) >= (int)cap)
        buf[0] = 0;
    return buf;
}

int sn_mkdirs(const char *path, k3_err *err) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p)
        return k3_fail(err, K3_ERR_IO, "%s: path too long", path);
    for (char *s = p + 1;; s++) {
        if (*s == '/' || !*s) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return k3_fail(err, K3_ERR_IO, "%s: cannot create folder: %s", p,
                               strerror(errno));
            *s = c;
            if (!c) break;
        }
    }
    return K3_OK;
}

static int fsync_dir(const char *dest) {
    int fd = open(dest, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int sn_write_atomic(const char *dest, const char *name, const void *buf, size_t n, k3_err *err) {
    char fin[4096], tmp[4200];
    sn_path(fin, sizeof fin, dest, name, NULL);
    snprintf(tmp, sizeof tmp, "%s.k3tmp", fin);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return k3_fail(err, K3_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    const char *p = buf;
    size_t left = n;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            close(fd);
            unlink(tmp);
            return k3_fail(err, K3_ERR_IO, "%s: write failed: %s", tmp, strerror(e));
        }
        p += w, left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        unlink(tmp);
        return k3_fail(err, K3_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    }
    if (rename(tmp, fin) != 0) {
        unlink(tmp);
        return k3_fail(err, K3_ERR_IO, "%s: cannot rename into place: %s", fin, strerror(errno));
    }
    fsync_dir(dest);
    return K3_OK;
}

int sn_free_bytes(const char *dir, uint64_t *out, k3_err *err) {
    struct statvfs v;
    if (statvfs(dir, &v) != 0)
        return k3_fail(err, K3_ERR_IO, "%s: cannot read free space: %s", dir, strerror(errno));
    *out = (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
    return K3_OK;
}

/* ---- checksums ------------------------------------------------------------------------ */

static void hex(const unsigned char *d, int n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < n; i++) out[2 * i] = digits[d[i] >> 4], out[2 * i + 1] = digits[d[i] & 15];
    out[2 * n] = 0;
}

void sn_sha256_mem(const void *p, size_t n, char out[65]) {
    unsigned char d[32];
    unsigned int dn = 0;
    EVP_Digest(p, n, d, &dn, EVP_sha256(), NULL);
    hex(d, 32, out);
}

int sn_sha256_file(const char *path, char out[65], void (*on_bytes)(void *, uint64_t),
                   void *user, k3_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return k3_fail(err, K3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    size_t cap = 4u << 20;
    unsigned char *buf = malloc(cap);
    int rc = K3_OK;
    if (!ctx || !buf || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory (sha256)");
    } else {
        for (;;) {
            ssize_t r = read(fd, buf, cap);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                rc = k3_fail(err, K3_ERR_IO, "%s: read failed: %s", path, strerror(errno));
                break;
            }
            if (r == 0) break;
            EVP_DigestUpdate(ctx, buf, (size_t)r);
            if (on_bytes) on_bytes(user, (uint64_t)r);
        }
        if (!rc) {
            unsigned char d[32];
            unsigned int dn = 0;
            EVP_DigestFinal_ex(ctx, d, &dn);
            hex(d, 32, out);
        }
    }
    EVP_MD_CTX_free(ctx);
    free(buf);
    close(fd);
    return rc;
}

/* ---- manifest ------------------------------------------------------------------------- */

void sn_install_free(sn_install *in) {
    if (!in) return;
    free(in->dest);
    free(in->endpoint);
    free(in->repo);
    free(in->revision);
    free(in->ref);
    for (int i = 0; i < in->n_files; i++) free(in->files[i].name);
    free(in->files);
    for (int i = 0; i < in->n_shards; i++) {
        sn_shard *sh = &in->shards[i];
        free(sh->name);
        free(sh->header);
        for (int k = 0; k < sh->nt; k++) free(sh->t[k].name);
        free(sh->t);
        sn_ranges_free(&sh->done);
    }
    free(in->shards);
    free(in->spans);
    *in = (sn_install){0};
}

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool juint(const cJSON *o, const char *k, uint64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9.0e15 ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return false;
    *out = (uint64_t)v->valuedouble;
    return true;
}

static bool plain_name(const char *s) {
    return s && s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

static void take_sha(char dst[65], const char *s) {
    dst[0] = 0;
    if (s && strlen(s) == 64) memcpy(dst, s, 65);
}

int sn_manifest_read(const char *dest, sn_install *in, bool *found, k3_err *err) {
    char path[4096], *json = NULL;
    sn_path(path, sizeof path, dest, SN_MANIFEST, NULL);
    *found = false;
    if (access(path, F_OK) != 0) return K3_OK;
    FILE *f = fopen(path, "rb");
    if (!f) return k3_fail(err, K3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    json = malloc(cap);
    for (size_t r; json && (r = fread(json + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (n + 1 == cap) {
            char *nj = realloc(json, cap *= 2);
            if (!nj) free(json);
            json = nj;
        }
    }
    fclose(f);
    if (!json) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    json[n] = 0;
    cJSON *root = cJSON_Parse(json);
    free(json);
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(root, "shards");
    const char *ep = jstr(root, "endpoint"), *repo = jstr(root, "repo");
    const char *rev = jstr(root, "revision"), *mode = jstr(root, "mode");
    int rc = K3_OK;
    if (!cJSON_IsObject(root) || !cJSON_IsArray(files) || !cJSON_IsArray(shards) || !ep ||
        !repo || !rev || !mode) {
        rc = k3_fail(err, K3_ERR_CHECKPOINT, "%s: not a k3 setup manifest (needs endpoint, repo, "
                     "revision, mode, files, shards); delete it and run k3 setup again", path);
        goto out;
    }
    in->dest = strdup(dest);
    in->endpoint = strdup(ep), in->repo = strdup(repo), in->revision = strdup(rev);
    in->ref = strdup(jstr(root, "ref") ? jstr(root, "ref") : rev);
    snprintf(in->mode, sizeof in->mode, "%s", mode);
    const cJSON *net = cJSON_GetObjectItemCaseSensitive(root, "network"), *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(net, "connections")) && cJSON_IsNumber(v) &&
        v->valuedouble >= 0 && v->valuedouble <= 64)
        in->net_connections = (int)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(net, "retries")) && cJSON_IsNumber(v) &&
        v->valuedouble >= -1 && v->valuedouble <= 100)
        in->net_retries = (int)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(net, "backoff_s")) && cJSON_IsNumber(v) &&
        v->valuedouble >= 0 && v->valuedouble <= 600)
        in->net_backoff_s = v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(net, "timeout_s")) && cJSON_IsNumber(v) &&
        v->valuedouble >= 0 && v->valuedouble <= 3600)
        in->net_timeout_s = v->valuedouble;
    in->files = calloc((size_t)cJSON_GetArraySize(files) + 1, sizeof *in->files);
    in->shards = calloc((size_t)cJSON_GetArraySize(shards) + 1, sizeof *in->shards);
    if (!in->dest || !in->endpoint || !in->repo || !in->revision || !in->ref || !in->files ||
        !in->shards) {
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
        goto out;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, files) {
        sn_file *fl = &in->files[in->n_files];
        const char *nm = jstr(e, "name");
        if (!plain_name(nm) || !juint(e, "bytes", &fl->bytes)) {
            rc = k3_fail(err, K3_ERR_CHECKPOINT, "%s: a files[] entry needs a plain name and "
                         "bytes", path);
            goto out;
        }
        fl->name = strdup(nm);
        take_sha(fl->sha256, jstr(e, "sha256"));
        in->n_files++;
    }
    cJSON_ArrayForEach(e, shards) {
        sn_shard *sh = &in->shards[in->n_shards];
        const char *nm = jstr(e, "name");
        if (!plain_name(nm) || !juint(e, "bytes", &sh->bytes) ||
            !juint(e, "header_bytes", &sh->header_bytes) || sh->header_bytes > sh->bytes) {
            rc = k3_fail(err, K3_ERR_CHECKPOINT, "%s: a shards[] entry needs a plain name, "
                         "bytes and header_bytes", path);
            goto out;
        }
        sh->name = strdup(nm);
        take_sha(sh->sha256, jstr(e, "sha256"));
        in->n_shards++;
    }
    *found = true;
out:
    cJSON_Delete(root);
    return rc;
}

int sn_manifest_write(const sn_install *in, k3_err *err) {
    cJSON *root = cJSON_CreateObject(), *files = cJSON_CreateArray(), *shards = cJSON_CreateArray();
    cJSON_AddNumberToObject(root, "format", 1);
    cJSON_AddStringToObject(root, "endpoint", in->endpoint);
    cJSON_AddStringToObject(root, "repo", in->repo);
    cJSON_AddStringToObject(root, "revision", in->revision);
    cJSON_AddStringToObject(root, "ref", in->ref ? in->ref : in->revision);
    cJSON_AddStringToObject(root, "mode", in->mode);
    cJSON *net = cJSON_AddObjectToObject(root, "network");
    cJSON_AddNumberToObject(net, "connections", in->net_connections);
    cJSON_AddNumberToObject(net, "retries", in->net_retries);
    cJSON_AddNumberToObject(net, "backoff_s", in->net_backoff_s);
    cJSON_AddNumberToObject(net, "timeout_s", in->net_timeout_s);
    cJSON_AddItemToObject(root, "files", files);
    cJSON_AddItemToObject(root, "shards", shards);
    for (int i = 0; i < in->n_files; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", in->files[i].name);
        cJSON_AddNumberToObject(o, "bytes", (double)in->files[i].bytes);
        if (in->files[i].sha256[0]) cJSON_AddStringToObject(o, "sha256", in->files[i].sha256);
        else cJSON_AddNullToObject(o, "sha256");
        cJSON_AddItemToArray(files, o);
    }
    for (int i = 0; i < in->n_shards; i++) {
        const sn_shard *sh = &in->shards[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", sh->name);
        cJSON_AddNumberToObject(o, "bytes", (double)sh->bytes);
        if (sh->sha256[0]) cJSON_AddStringToObject(o, "sha256", sh->sha256);
        else cJSON_AddNullToObject(o, "sha256");
        cJSON_AddNumberToObject(o, "header_bytes", (double)sh->header_bytes);
        cJSON_AddItemToArray(shards, o);
    }
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    if (!txt) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    char dir[4096];
    sn_path(dir, sizeof dir, in->dest, SN_DIR, NULL);
    int rc = sn_write_atomic(dir, "setup.json", txt, strlen(txt), err);
    free(txt);
    return rc;
}

/* ---- shard headers and expert spans ---------------------------------------------------- */

/* "…layers.L.….experts.E.…" → layer L, expert E (the routed experts; shared_experts is not). */
static bool expert_of(const char *name, int *layer, int *expert) {
    const char *l = strstr(name, "layers."), *e = strstr(name, ".experts.");
    if (!l || !e || e < l) return false;
    char *end;
    long lv = strtol(l + 7, &end, 10);
    if (end == l + 7 || *end != '.') return false;
    long ev = strtol(e + 9, &end, 10);
    if (end == e + 9 || *end != '.' || lv < 0 || ev < 0 || lv > 1 << 20 || ev > 1 << 20)
        return false;
    *layer = (int)lv, *expert = (int)ev;
    return true;
}

int sn_parse_header(sn_shard *sh, char *hdr, uint64_t hdr_bytes, k3_err *err) {
    free(sh->header);
    sh->header = hdr;
    uint64_t n = 0;
    for (int i = 7; i >= 0 && hdr_bytes >= 8; i--) n = (n << 8) | (unsigned char)hdr[i];
    if (hdr_bytes < 8 || n + 8 != hdr_bytes || hdr_bytes > sh->bytes)
        return k3_fail(err, K3_ERR_CHECKPOINT, "%s: safetensors header length %llu does not fit "
                       "the %llu-byte file", sh->name, (unsigned long long)n,
                       (unsigned long long)sh->bytes);
    cJSON *root = cJSON_ParseWithLength(hdr + 8, (size_t)n);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return k3_fail(err, K3_ERR_CHECKPOINT, "%s: safetensors header is not a JSON object",
                       sh->name);
    }
    int cap = cJSON_GetArraySize(root), rc = K3_OK;
    sh->t = calloc((size_t)cap + 1, sizeof *sh->t);
    sh->nt = 0;
    if (!sh->t) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (const cJSON *e = root->child; e && !rc; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) continue;
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        const cJSON *b = cJSON_GetArrayItem(offs, 0), *en = cJSON_GetArrayItem(offs, 1);
        if (!cJSON_IsNumber(b) || !cJSON_IsNumber(en) || b->valuedouble < 0 ||
            en->valuedouble < b->valuedouble || en->valuedouble > 9e15 ||
            hdr_bytes + (uint64_t)en->valuedouble > sh->bytes) {
            rc = k3_fail(err, K3_ERR_CHECKPOINT, "%s: tensor %s: data_offsets missing or past "
                         "the end of the %llu-byte file", sh->name, e->string,
                         (unsigned long long)sh->bytes);
            break;
        }
        sn_tensor *t = &sh->t[sh->nt++];
        t->name = strdup(e->string);
        t->begin = hdr_bytes + (uint64_t)b->valuedouble;
        t->end = hdr_bytes + (uint64_t)en->valuedouble;
        if (!strncmp(t->name, "vision_tower.", 13) || !strncmp(t->name, "mm_projector.", 13))
            t->kind = SN_VISION;
        else if (expert_of(t->name, &t->layer, &t->expert))
            t->kind = SN_EXPERT;
        else
            t->kind = SN_SPINE;
        if (!t->name) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    cJSON_Delete(root);
    sh->header_bytes = hdr_bytes;
    return rc;
}

static int cmp_span_id(const void *a, const void *b) {
    const k3_expert_span *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    if (x->expert != y->expert) return x->expert < y->expert ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int cmp_span_pos(const void *a, const void *b) {
    const k3_expert_span *x = a, *y = b;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

int sn_build_spans(sn_install *in, k3_err *err) {
    size_t n = 0;
    for (int s = 0; s < in->n_shards; s++)
        for (int k = 0; k < in->shards[s].nt; k++) n += in->shards[s].t[k].kind == SN_EXPERT;
    k3_expert_span *all = calloc(n + 1, sizeof *all);
    if (!all) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    size_t m = 0;
    for (int s = 0; s < in->n_shards; s++)
        for (int k = 0; k < in->shards[s].nt; k++) {
            const sn_tensor *t = &in->shards[s].t[k];
            if (t->kind == SN_EXPERT)
                all[m++] = (k3_expert_span){t->layer, t->expert, s, t->begin, t->end - t->begin};
        }
    qsort(all, m, sizeof *all, cmp_span_id);
    size_t out = 0;
    in->n_layers_seen = 0;
    for (size_t i = 0; i < m;) { /* one span per (layer, expert): [min begin, max end) */
        size_t j = i;
        uint64_t end = all[i].offset + all[i].nbytes;
        while (j + 1 < m && all[j + 1].layer == all[i].layer && all[j + 1].expert == all[i].expert) {
            j++;
            if (all[j].shard != all[i].shard) {
                int rc = k3_fail(err, K3_ERR_CHECKPOINT, "expert %d of layer %d has tensors in "
                                 "two shards (%s and %s): it cannot be fetched as one span",
                                 all[i].expert, all[i].layer, in->shards[all[i].shard].name,
                                 in->shards[all[j].shard].name);
                free(all);
                return rc;
            }
            if (all[j].offset + all[j].nbytes > end) end = all[j].offset + all[j].nbytes;
        }
        all[out] = all[i];
        all[out].nbytes = end - all[i].offset;
        if (all[i].layer + 1 > in->n_layers_seen) in->n_layers_seen = all[i].layer + 1;
        out++;
        i = j + 1;
    }
    qsort(all, out, sizeof *all, cmp_span_pos);
    free(in->spans);
    in->spans = all;
    in->n_spans = (int)out;
    return K3_OK;
}

/* ---- the local state ------------------------------------------------------------------- */

int sn_journal_load(const char *dest, sn_shard *sh, k3_err *err) {
    char path[4096];
    sn_journal_path(path, sizeof path, dest, sh->name);
    sh->done.n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? K3_OK : k3_fail(err, K3_ERR_IO, "%s: cannot open: %s",
                                                         path, strerror(errno));
    unsigned char rec[16];
    for (;;) {
        ssize_t r = read(fd, rec, sizeof rec);
        if (r < 0 && errno == EINTR) continue;
        if (r != (ssize_t)sizeof rec) break; /* end, or a torn last record */
        uint64_t off = 0, len = 0;
        for (int i = 7; i >= 0; i--) off = (off << 8) | rec[i], len = (len << 8) | rec[8 + i];
        if (off > sh->bytes || len > sh->bytes - off) { /* not ours: trust none of it */
            sh->done.n = 0;
            break;
        }
        if (sn_ranges_add(&sh->done, off, off + len)) {
            close(fd);
            return k3_fail(err, K3_ERR_GENERIC, "out of memory");
        }
    }
    close(fd);
    return K3_OK;
}

static int read_at(const char *path, int fd, void *buf, size_t n, uint64_t off, k3_err *err) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return k3_fail(err, K3_ERR_IO, "%s: read failed: %s", path,
                           r < 0 ? strerror(errno) : "unexpected end of file");
        done += (size_t)r;
    }
    return K3_OK;
}

/* Reads and parses the header of one local shard file. */
static int load_header(sn_shard *sh, const char *path, k3_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return k3_fail(err, K3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = malloc(sh->header_bytes + 1);
    int rc = buf ? read_at(path, fd, buf, sh->header_bytes, 0, err)
                 : k3_fail(err, K3_ERR_GENERIC, "out of memory");
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    return sn_parse_header(sh, buf, sh->header_bytes, err);
}

int sn_load_shard(const char *dest, sn_shard *sh, k3_err *err) {
    char fin[4096], part[4200];
    sn_path(fin, sizeof fin, dest, sh->name, NULL);
    sn_partial_path(part, sizeof part, dest, sh->name);
    struct stat st;
    sh->complete = sh->has_partial = false;
    sh->done.n = 0;
    if (stat(fin, &st) == 0) {
        if ((uint64_t)st.st_size != sh->bytes)
            return k3_fail(err, K3_ERR_CHECKPOINT, "%s: %llu bytes, but the source has %llu: "
                           "delete it and run k3 setup again", fin,
                           (unsigned long long)st.st_size, (unsigned long long)sh->bytes);
        sh->complete = true;
        return load_header(sh, fin, err);
    }
    if (stat(part, &st) != 0) return K3_OK;
    if ((uint64_t)st.st_size != sh->bytes) return K3_OK; /* not ours: rewritten from scratch */
    sh->has_partial = true;
    int rc = sn_journal_load(dest, sh, err);
    if (!rc && sn_ranges_covers(&sh->done, 0, sh->header_bytes)) rc = load_header(sh, part, err);
    return rc;
}

int sn_load_local(sn_install *in, k3_err *err) {
    int rc = K3_OK;
    for (int i = 0; i < in->n_shards && !rc; i++) rc = sn_load_shard(in->dest, &in->shards[i], err);
    return rc;
}
