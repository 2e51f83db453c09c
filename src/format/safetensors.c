/* safetensors.c — index + shard header parsing, validation and mmap (spec §10.1, §10.6). */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../util/fileio.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define MAX_HEADER_BYTES (512ull << 20)

const char *k3_dtype_name(int dtype) {
    switch (dtype) {
    case K3_DT_F32: return "F32";
    case K3_DT_BF16: return "BF16";
    case K3_DT_U8: return "U8";
    case K3_DT_I8: return "I8";
    case K3_DT_I8_Q8: return "I8 (int8 activations)";
    }
    return "?";
}

size_t k3_dtype_size(int dtype) { return dtype == K3_DT_F32 ? 4 : dtype == K3_DT_BF16 ? 2 : 1; }

static int parse_dtype(const char *s) {
    if (strcmp(s, "F32") == 0) return K3_DT_F32;
    if (strcmp(s, "BF16") == 0) return K3_DT_BF16;
    if (strcmp(s, "U8") == 0) return K3_DT_U8;
    return -1;
}

/* Tensors a text engine never touches (spec §10.6). */
static bool is_skipped_name(const char *name) {
    return strncmp(name, "vision_tower.", 13) == 0 || strncmp(name, "mm_projector.", 13) == 0;
}

/* ---- name → tensor hash (FNV-1a, open addressing) ---------------------------------- */

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int build_hash(k3_checkpoint *c, k3_err *err) {
    size_t n = 16;
    while (n < 2 * c->n_tensors) n <<= 1;
    c->slots = calloc(n, sizeof *c->slots);
    if (!c->slots) return k3_fail(err, K3_ERR_GENERIC, "out of memory (tensor index)");
    c->n_slots = n;
    for (size_t i = 0; i < c->n_tensors; i++) {
        size_t j = hash_name(c->tensors[i].name) & (n - 1);
        while (c->slots[j]) {
            const k3_tensor *o = &c->tensors[c->slots[j] - 1];
            if (strcmp(o->name, c->tensors[i].name) == 0)
                return o->shard == c->tensors[i].shard
                           ? k3_fail(err, K3_ERR_CHECKPOINT, "%s: tensor %s appears twice in the "
                                     "header", c->shards[o->shard].path, o->name)
                           : k3_fail(err, K3_ERR_CHECKPOINT, "tensor %s appears in both %s and %s",
                                     o->name, c->shards[o->shard].path,
                                     c->shards[c->tensors[i].shard].path);
            j = (j + 1) & (n - 1);
        }
        c->slots[j] = i + 1;
    }
    return K3_OK;
}

const k3_tensor *k3_checkpoint_find(const k3_checkpoint *c, const char *name) {
    if (!c->n_slots) return NULL;
    size_t j = hash_name(name) & (c->n_slots - 1);
    while (c->slots[j]) {
        const k3_tensor *t = &c->tensors[c->slots[j] - 1];
        if (strcmp(t->name, name) == 0) return t;
        j = (j + 1) & (c->n_slots - 1);
    }
    return NULL;
}

/* ---- one shard header --------------------------------------------------------------- */

static int add_tensor(k3_checkpoint *c, size_t *cap, const k3_tensor *t, k3_err *err) {
    if (c->n_tensors == *cap) {
        size_t ncap = *cap ? *cap * 2 : 1024;
        k3_tensor *nt = realloc(c->tensors, ncap * sizeof *nt);
        if (!nt) return k3_fail(err, K3_ERR_GENERIC, "out of memory (tensor table)");
        c->tensors = nt;
        *cap = ncap;
    }
    c->tensors[c->n_tensors++] = *t;
    return K3_OK;
}

/* Parses one header entry into t (name not yet set). */
static int parse_entry(const k3_shard *sh, const cJSON *e, k3_tensor *t, k3_err *err) {
    const char *p = sh->path, *name = e->string;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) ||
        cJSON_GetArraySize(offs) != 2)
        return k3_fail(err, K3_ERR_CHECKPOINT,
                       "%s: tensor %s: header entry needs dtype, shape and data_offsets[2]", p,
                       name);
    t->dtype = parse_dtype(dt->valuestring);
    if (t->dtype < 0)
        return k3_fail(err, K3_ERR_CHECKPOINT, "%s: tensor %s: unsupported dtype %s", p, name,
                       dt->valuestring);
    t->ndim = cJSON_GetArraySize(shape);
    if (t->ndim > K3_MAX_DIMS)
        return k3_fail(err, K3_ERR_CHECKPOINT, "%s: tensor %s: %d dimensions (max %d)", p, name,
                       t->ndim, K3_MAX_DIMS);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        const cJSON *dim = cJSON_GetArrayItem(shape, d);
        double v = dim->valuedouble;
        /* Integers only, and an element count that cannot wrap 64 bits (a wrapped count
         * would let a huge shape pass the byte-span check below as a tiny tensor). */
        if (!cJSON_IsNumber(dim) || v < 0 || v > 1e15 || v != (double)(int64_t)v ||
            __builtin_mul_overflow(numel, (uint64_t)v, &numel) ||
            numel > (UINT64_MAX >> 3))
            return k3_fail(err, K3_ERR_CHECKPOINT, "%s: tensor %s: bad shape: dimensions must "
                           "be non-negative integers with a representable element count", p,
                           name);
        t->shape[d] = (int64_t)v;
    }
    const cJSON *ob = cJSON_GetArrayItem(offs, 0), *oe = cJSON_GetArrayItem(offs, 1);
    double b = ob->valuedouble, en = oe->valuedouble;
    if (!cJSON_IsNumber(ob) || !cJSON_IsNumber(oe) || b < 0 || en < b || en > 1e18 ||
        b != (double)(uint64_t)b || en != (double)(uint64_t)en)
        return k3_fail(err, K3_ERR_CHECKPOINT, "%s: tensor %s: bad data_offsets: need two "
                       "integers 0 <= begin <= end <= 1e18", p, name);
    uint64_t ub = (uint64_t)b, ue = (uint64_t)en;
    t->nbytes = ue - ub;
    if (t->nbytes != numel * k3_dtype_size(t->dtype))
        return k3_fail(err, K3_ERR_CHECKPOINT,
                       "%s: tensor %s: data_offsets span %llu bytes but shape and %s need %llu",
                       p, name, (unsigned long long)t->nbytes, k3_dtype_name(t->dtype),
                       (unsigned long long)(numel * k3_dtype_size(t->dtype)));
    t->file_offset = sh->data_start + ub;
    if (t->file_offset + t->nbytes > sh->file_bytes)
        return k3_fail(err, K3_ERR_CHECKPOINT,
                       "%s: tensor %s: data ends at byte %llu but the file has %llu bytes: the "
                       "shard is truncated or its header is corrupt (re-download it)",
                       p, name, (unsigned long long)(t->file_offset + t->nbytes),
                       (unsigned long long)sh->file_bytes);
    /* The kernels load BF16/F32 elements directly from the mapping. */
    if (t->file_offset % k3_dtype_size(t->dtype))
        return k3_fail(err, K3_ERR_CHECKPOINT,
                       "%s: tensor %s starts at byte %llu, not aligned to its %zu-byte %s "
                       "elements (re-save the shard with safetensors' 8-byte header padding)",
                       p, name, (unsigned long long)t->file_offset, k3_dtype_size(t->dtype),
                       k3_dtype_name(t->dtype));
    return K3_OK;
}

static int read_header(k3_shard *sh, char **json, k3_err *err) {
    unsigned char len8[8];
    ssize_t got = pread(sh->fd, len8, 8, 0);
    if (got != 8)
        return k3_fail(err, K3_ERR_CHECKPOINT, "%s: too short for a safetensors header (%llu bytes)",
                       sh->path, (unsigned long long)sh->file_bytes);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | len8[i];
    if (n > MAX_HEADER_BYTES || 8 + n > sh->file_bytes)
        return k3_fail(err, K3_ERR_CHECKPOINT,
                       "%s: header length %llu does not fit in the %llu-byte file: truncated or "
                       "not a safetensors file", sh->path, (unsigned long long)n,
                       (unsigned long long)sh->file_bytes);
    char *buf = malloc(n + 1);
    if (!buf) return k3_fail(err, K3_ERR_GENERIC, "%s: out of memory for header", sh->path);
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(sh->fd, buf + done, n - done, (off_t)(8 + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(buf);
            return k3_fail(err, K3_ERR_IO, "%s: cannot read header: %s", sh->path,
                           r < 0 ? strerror(errno) : "unexpected end of file");
        }
        done += (size_t)r;
    }
    buf[n] = 0;
    sh->data_start = 8 + n;
    *json = buf;
    return K3_OK;
}

static int cmp_offset(const void *a, const void *b) {
    const k3_tensor *x = *(const k3_tensor *const *)a, *y = *(const k3_tensor *const *)b;
    return x->file_offset < y->file_offset ? -1 : x->file_offset > y->file_offset;
}

/* safetensors forbids overlapping data; two tensors sharing bytes means a corrupt header. */
static int check_overlap(const k3_checkpoint *c, size_t first, k3_err *err) {
    size_t n = c->n_tensors - first;
    if (n < 2) return K3_OK;
    const k3_tensor **v = malloc(n * sizeof *v);
    if (!v) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (size_t i = 0; i < n; i++) v[i] = &c->tensors[first + i];
    qsort(v, n, sizeof *v, cmp_offset);
    int rc = K3_OK;
    for (size_t i = 1; i < n && !rc; i++)
        if (v[i - 1]->file_offset + v[i - 1]->nbytes > v[i]->file_offset)
            rc = k3_fail(err, K3_ERR_CHECKPOINT, "%s: tensors %s and %s overlap in the file: "
                         "corrupt header", c->shards[v[i]->shard].path, v[i - 1]->name,
                         v[i]->name);
    free(v);
    return rc;
}

static int open_shard(k3_checkpoint *c, int idx, size_t *cap, k3_err *err) {
    k3_shard *sh = &c->shards[idx];
    /* O_NONBLOCK: a FIFO must not hang the open before the regular-file check. */
    sh->fd = open(sh->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (sh->fd < 0) return k3_fail(err, K3_ERR_IO, "%s: cannot open: %s", sh->path, strerror(errno));
    struct stat st;
    if (fstat(sh->fd, &st) != 0 || !S_ISREG(st.st_mode))
        return k3_fail(err, K3_ERR_IO, "%s: not a regular file", sh->path);
    sh->file_bytes = (uint64_t)st.st_size;
    char *json = NULL;
    size_t first = c->n_tensors;
    int rc = read_header(sh, &json, err);
    if (rc) return rc;
    cJSON *root = cJSON_Parse(json);
    free(json);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return k3_fail(err, K3_ERR_CHECKPOINT, "%s: header is not a JSON object", sh->path);
    }
    for (const cJSON *e = root->child; e && !rc; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0 || is_skipped_name(e->string)) continue;
        k3_tensor t = {0};
        t.shard = idx;
        rc = parse_entry(sh, e, &t, err);
        if (!rc && !(t.name = strdup(e->string))) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
        if (!rc) rc = add_tensor(c, cap, &t, err);
    }
    cJSON_Delete(root);
    if (!rc) rc = check_overlap(c, first, err);
    if (rc) return rc;
    sh->map = mmap(NULL, sh->file_bytes, PROT_READ, MAP_SHARED, sh->fd, 0);
    if (sh->map == MAP_FAILED) {
        sh->map = NULL;
        return k3_fail(err, K3_ERR_IO, "%s: mmap failed: %s", sh->path, strerror(errno));
    }
    return K3_OK;
}

/* ---- index ------------------------------------------------------------------------- */

/* dir/file, else the first of c->dirs holding file (K3_DIRS), else dir/file (so that the
 * open error names the snapshot folder). malloc'd; NULL when out of memory. */
static char *shard_path(const k3_checkpoint *c, const char *file) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", c->dir, file);
    for (const char *d = c->dirs; d && *d && access(path, F_OK) != 0;) {
        size_t n = strcspn(d, ":");
        snprintf(path, sizeof path, "%.*s/%s", (int)n, d, file);
        d += n + (d[n] == ':');
    }
    if (access(path, F_OK) != 0) snprintf(path, sizeof path, "%s/%s", c->dir, file);
    return strdup(path);
}

static int shard_index(k3_checkpoint *c, const char *file, int *cap, k3_err *err) {
    for (int i = c->n_shards - 1; i >= 0; i--) /* recent first: the index is grouped */
        if (strcmp(strrchr(c->shards[i].path, '/') + 1, file) == 0) return i;
    if (strchr(file, '/') || strcmp(file, "..") == 0)
        return -k3_fail(err, K3_ERR_CHECKPOINT, "%s/" INDEX_NAME ": shard name '%s' is not a "
                        "plain file name", c->dir, file);
    if (c->n_shards == *cap) {
        *cap = *cap ? *cap * 2 : 16;
        k3_shard *ns = realloc(c->shards, (size_t)*cap * sizeof *ns);
        if (!ns) return -k3_fail(err, K3_ERR_GENERIC, "out of memory");
        c->shards = ns;
    }
    k3_shard *sh = &c->shards[c->n_shards];
    memset(sh, 0, sizeof *sh);
    sh->fd = -1;
    if (!(sh->path = shard_path(c, file)))
        return -k3_fail(err, K3_ERR_GENERIC, "out of memory");
    return c->n_shards++;
}

/* Reads the index: registers the shards that hold text tensors. *map keeps the weight_map
 * (borrowed from *root) for the later cross-check. */
static int read_index(k3_checkpoint *c, cJSON **root, k3_err *err) {
    char path[4096], *json = NULL;
    k3_path_join(path, sizeof path, c->dir, INDEX_NAME);
    int shard_cap = 0;
    if (access(path, F_OK) != 0) { /* a small model may ship one unindexed file */
        k3_path_join(path, sizeof path, c->dir, SINGLE_NAME);
        if (access(path, F_OK) != 0)
            return k3_fail(err, K3_ERR_IO, "%s: no " INDEX_NAME " and no " SINGLE_NAME
                           ": is this a Hugging Face snapshot folder?", c->dir);
        *root = NULL;
        int i = shard_index(c, SINGLE_NAME, &shard_cap, err);
        return i < 0 ? -i : K3_OK;
    }
    int rc = k3_read_file(path, MAX_HEADER_BYTES, &json, NULL, err);
    if (rc) return rc;
    *root = cJSON_Parse(json);
    free(json);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(*root, "weight_map");
    if (!cJSON_IsObject(wm))
        return k3_fail(err, K3_ERR_CHECKPOINT, "%s: malformed JSON or no \"weight_map\" object",
                       path);
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e))
            return k3_fail(err, K3_ERR_CHECKPOINT, "%s: weight_map[%s] is not a string", path,
                           e->string);
        if (is_skipped_name(e->string)) continue;
        int i = shard_index(c, e->valuestring, &shard_cap, err);
        if (i < 0) return -i;
    }
    /* Shards named only by skipped tensors are never opened; count them for the log. */
    const char *last = NULL;
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (last && strcmp(last, e->valuestring) == 0) continue;
        last = e->valuestring;
        bool known = false;
        for (int i = 0; i < c->n_shards && !known; i++)
            known = strcmp(strrchr(c->shards[i].path, '/') + 1, last) == 0;
        c->n_skipped_shards += !known;
    }
    return K3_OK;
}

/* Every text tensor the index lists must be in the header of the shard it names. */
static int check_index(const k3_checkpoint *c, const cJSON *root, k3_err *err) {
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (is_skipped_name(e->string)) continue;
        const k3_tensor *t = k3_checkpoint_find(c, e->string);
        if (!t)
            return k3_fail(err, K3_ERR_CHECKPOINT,
                           "%s/" INDEX_NAME " lists tensor %s in %s, but that shard's header "
                           "does not contain it", c->dir, e->string, e->valuestring);
        if (strcmp(strrchr(c->shards[t->shard].path, '/') + 1, e->valuestring) != 0)
            return k3_fail(err, K3_ERR_CHECKPOINT, "%s/" INDEX_NAME ": tensor %s: index says "
                           "%s, but it is in %s", c->dir, e->string, e->valuestring,
                           c->shards[t->shard].path);
    }
    return K3_OK;
}

int k3_checkpoint_open(const char *dir, k3_checkpoint **out, k3_err *err) {
    return k3_checkpoint_open_dirs(dir, NULL, out, err);
}

int k3_checkpoint_open_dirs(const char *dir, const char *dirs, k3_checkpoint **out,
                            k3_err *err) {
    k3_checkpoint *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(dir)) || (dirs && !(c->dirs = strdup(dirs)))) {
        if (c) free(c->dir);
        free(c);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    cJSON *root = NULL;
    size_t cap = 0;
    int rc = read_index(c, &root, err);
    for (int i = 0; !rc && i < c->n_shards; i++) rc = open_shard(c, i, &cap, err);
    if (!rc) rc = build_hash(c, err);
    if (!rc && root) rc = check_index(c, root, err);
    cJSON_Delete(root);
    if (rc) {
        k3_checkpoint_close(c);
        return rc;
    }
    for (size_t i = 0; i < c->n_tensors; i++) {
        k3_tensor *t = &c->tensors[i];
        t->data = (const char *)c->shards[t->shard].map + t->file_offset;
    }
    *out = c;
    return K3_OK;
}

void k3_checkpoint_close(k3_checkpoint *c) {
    if (!c) return;
    for (int i = 0; i < c->n_shards; i++) {
        if (c->shards[i].map) munmap(c->shards[i].map, c->shards[i].file_bytes);
        if (c->shards[i].fd >= 0) close(c->shards[i].fd);
        free(c->shards[i].path);
    }
    for (size_t i = 0; i < c->n_tensors; i++) free((char *)c->tensors[i].name);
    free(c->shards);
    free(c->tensors);
    free(c->slots);
    free(c->dir);
    free(c->dirs);
    free(c);
}

int k3_checkpoint_get(const k3_checkpoint *c, const char *name, int dtype, int ndim,
                      const int64_t *shape, const k3_tensor **out, k3_err *err) {
    const k3_tensor *t = k3_checkpoint_find(c, name);
    if (!t)
        return k3_fail(err, K3_ERR_CHECKPOINT, "%s: tensor %s is missing from the checkpoint "
                       "(not in the index or any shard): incomplete or wrong snapshot", c->dir,
                       name);
    const char *file = c->shards[t->shard].path;
    if (t->dtype != dtype)
        return k3_fail(err, K3_ERR_CHECKPOINT, "%s: tensor %s has dtype %s, expected %s", file,
                       name, k3_dtype_name(t->dtype), k3_dtype_name(dtype));
    bool ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = shape[d] < 0 || shape[d] == t->shape[d];
    if (!ok) {
        char want[128] = "", got[128] = "";
        for (int d = 0; d < ndim; d++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? "," : "",
                     (long long)shape[d]);
        for (int d = 0; d < t->ndim; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? "," : "",
                     (long long)t->shape[d]);
        return k3_fail(err, K3_ERR_CHECKPOINT,
                       "%s: tensor %s has shape [%s], config.json implies [%s]", file, name, got,
                       want);
    }
    *out = t;
    return K3_OK;
}
