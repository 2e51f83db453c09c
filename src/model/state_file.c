/* state_file.c — saving and loading a session's timeline (layout in state_file.h). */
#include "state_file.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "../util/fileio.h"
#include "../util/version.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "state files are little-endian; this host is not"
#endif

_Static_assert(sizeof(k3_state_file_header) == 88, "state file header must be 88 bytes");

#define SAMPLE_BYTES 4096

/* ---- fingerprint --------------------------------------------------------------------------- */

int k3_model_fingerprint(const k3_checkpoint *ck, int spine_int8, uint8_t out[16], k3_err *err) {
    char path[PATH_MAX], *cfg;
    size_t cfg_len;
    k3_path_join(path, sizeof path, ck->dir, "config.json");
    int rc = k3_read_file(path, (size_t)16 << 20, &cfg, &cfg_len, err);
    if (rc) return rc;
    XXH3_state_t *st = XXH3_createState();
    if (!st) {
        free(cfg);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, "k3-state-fingerprint-1", 22);
    XXH3_128bits_update(st, &spine_int8, sizeof spine_int8);
    XXH3_128bits_update(st, cfg, cfg_len);
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const k3_tensor *t = &ck->tensors[i];
        int64_t meta[2 + K3_MAX_DIMS] = {t->dtype, t->ndim};
        for (int d = 0; d < t->ndim && d < K3_MAX_DIMS; d++) meta[2 + d] = t->shape[d];
        XXH3_128bits_update(st, t->name, strlen(t->name) + 1);
        XXH3_128bits_update(st, meta, sizeof meta);
        if (strstr(t->name, ".experts.") || !t->data) continue; /* routed experts: metadata */
        /* the same head-and-tail sample as packed.c's fingerprint, kept apart: each hash is
         * part of its own file format and must not change with the other */
        uint64_t k = t->nbytes < SAMPLE_BYTES ? t->nbytes : SAMPLE_BYTES;
        XXH3_128bits_update(st, t->data, k);
        XXH3_128bits_update(st, (const uint8_t *)t->data + t->nbytes - k, k);
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
    memcpy(out, c.digest, 16);
    XXH3_freeState(st);
    free(cfg);
    return K3_OK;
}

uint64_t k3_state_engine_stamp(void) {
    static const char id[] = "k3-engine " K3_VERSION;
    return XXH3_64bits(id, sizeof id - 1);
}

static void hex16(const uint8_t *b, char out[33]) {
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* ---- the header both sides agree on ------------------------------------------------------- */

static int make_header(const k3_state *s, const k3_model *m, const k3_checkpoint *ck,
                       int spine_int8, int pos, k3_state_file_header *h, k3_err *err) {
    memset(h, 0, sizeof *h);
    memcpy(h->magic, K3_STATE_MAGIC, 8);
    h->version = K3_STATE_VERSION;
    h->header_bytes = sizeof *h;
    h->pos = pos;
    h->n_kda = (uint32_t)s->n_kda;
    h->n_mla = (uint32_t)m->n_mla;
    h->spine_int8 = (uint32_t)spine_int8;
    h->kda_S_floats = s->kda_S_floats;
    h->kda_conv_floats = s->kda_conv_floats;
    h->kv_floats = s->kv_floats;
    h->engine = k3_state_engine_stamp();
    h->payload_bytes = (uint64_t)pos * sizeof(int32_t) +
                       (h->kda_S_floats + h->kda_conv_floats) * h->n_kda * sizeof(float) +
                       (uint64_t)pos * h->kv_floats * h->n_mla * sizeof(float);
    return k3_model_fingerprint(ck, spine_int8, h->fingerprint, err);
}

/* ---- save ---------------------------------------------------------------------------------- */

typedef struct writer {
    FILE *f;
    XXH3_state_t *h;
    int failed;
} writer;

static void put(writer *w, const void *p, size_t n) {
    if (w->failed || n == 0) return;
    XXH3_64bits_update(w->h, p, n);
    if (fwrite(p, 1, n, w->f) != n) w->failed = 1;
}

int k3_state_file_save(const k3_state *s, const k3_model *m, const k3_checkpoint *ck,
                       int spine_int8, const int32_t *tokens, const char *path, k3_err *err) {
    k3_state_file_header h;
    int rc = make_header(s, m, ck, spine_int8, s->pos, &h, err);
    if (rc) return rc;
    /* a new file of a random name (never an existing one, nor a link's target), renamed
     * into place: a link planted at a guessable name cannot redirect the write (D14) */
    char tmp[PATH_MAX];
    int fd = k3_create_temp(path, tmp, sizeof tmp, err);
    if (fd < 0) return K3_ERR_IO;
    writer w = {fdopen(fd, "wb"), XXH3_createState(), 0};
    if (!w.f || !w.h) {
        if (!w.f) close(fd);
        unlink(tmp);
        rc = k3_fail(err, K3_ERR_IO, "%s: cannot create: out of memory", path);
        goto done;
    }
    XXH3_64bits_reset(w.h);
    put(&w, &h, sizeof h);
    put(&w, tokens, (size_t)s->pos * sizeof *tokens);
    put(&w, s->kda_S, s->kda_S_floats * (size_t)s->n_kda * sizeof(float));
    put(&w, s->kda_conv, s->kda_conv_floats * (size_t)s->n_kda * sizeof(float));
    for (uint32_t l = 0; l < h.n_mla; l++)
        put(&w, s->kv + (size_t)l * s->max_ctx * s->kv_floats,
            (size_t)s->pos * s->kv_floats * sizeof(float));
    uint64_t sum = XXH3_64bits_digest(w.h);
    if (!w.failed && fwrite(&sum, sizeof sum, 1, w.f) != 1) w.failed = 1;
    /* on disk before the rename: a crash leaves the old file or the whole new one */
    if (!w.failed && (fflush(w.f) != 0 || fsync(fileno(w.f)) != 0)) w.failed = 1;
    if (fclose(w.f) != 0) w.failed = 1;
    w.f = NULL;
    if (w.failed || rename(tmp, path) != 0) {
        rc = k3_fail(err, K3_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        unlink(tmp);
    }
done:
    if (w.f) {
        fclose(w.f);
        unlink(tmp);
    }
    if (w.h) XXH3_freeState(w.h);
    return rc;
}

/* ---- load ---------------------------------------------------------------------------------- */

/* Everything that can be checked before the session is touched. */
static int check_header(const k3_state_file_header *got, const k3_state_file_header *want,
                        const k3_state *s, uint64_t file_bytes, const char *path, k3_err *err) {
    if (memcmp(got->magic, K3_STATE_MAGIC, 8) != 0)
        return k3_fail_opts(err, K3_ERR_IO, "save_state", "%s: not a k3 state file (made by "
                            "save_state)", path);
    if (got->version == 1) /* the expanded MLA cache: its rows cannot become latent ones */
        return k3_fail(err, K3_ERR_IO, "%s: state file version 1 holds the expanded MLA cache of "
                       "an older k3; this k3 keeps the latent cache (version %d) and cannot "
                       "convert it: run the prompt again and save a new state", path,
                       K3_STATE_VERSION);
    if (got->version != K3_STATE_VERSION || got->header_bytes != sizeof *got)
        return k3_fail(err, K3_ERR_IO, "%s: state file version %u; this k3 reads version %d",
                       path, got->version, K3_STATE_VERSION);
    if (memcmp(got->fingerprint, want->fingerprint, 16) != 0) {
        char a[33], b[33];
        hex16(got->fingerprint, a);
        hex16(want->fingerprint, b);
        return k3_fail(err, K3_ERR_INPUT, "%s was saved from another model%s (fingerprint %s; "
                       "this model is %s): a state loads only into the model and spine mode "
                       "that made it", path, got->spine_int8 != want->spine_int8 ?
                       " or another spine mode (int8 vs BF16)" : "", a, b);
    }
    if (got->n_kda != want->n_kda || got->n_mla != want->n_mla ||
        got->kda_S_floats != want->kda_S_floats || got->kda_conv_floats != want->kda_conv_floats ||
        got->kv_floats != want->kv_floats)
        return k3_fail(err, K3_ERR_INPUT, "%s: state sizes do not match this model", path);
    if (got->pos < 0 || got->pos > s->max_ctx)
        return k3_fail_opts(err, K3_ERR_INPUT, "ctx", "%s holds %d positions but the context "
                            "is %d (raise ctx)", path, got->pos, s->max_ctx);
    uint64_t want_bytes = sizeof *got + got->payload_bytes + sizeof(uint64_t);
    if (got->payload_bytes != want->payload_bytes || file_bytes != want_bytes)
        return k3_fail(err, K3_ERR_IO, "%s: %llu bytes, expected %llu: the file is truncated or "
                       "damaged", path, (unsigned long long)file_bytes,
                       (unsigned long long)want_bytes);
    return K3_OK;
}

static int get(FILE *f, XXH3_state_t *h, void *p, size_t n) {
    if (n == 0) return 0;
    if (fread(p, 1, n, f) != n) return -1;
    XXH3_64bits_update(h, p, n);
    return 0;
}

/* The ids the file holds (read first, into a buffer of their own: a file that claims another
 * prefix than the one asked for is refused before the session is touched). */
static int read_tokens(FILE *f, XXH3_state_t *h, int pos, const k3_state_want *want,
                       const char *path, int32_t **out, k3_err *err) {
    int32_t *ids = malloc(((size_t)pos + 1) * sizeof *ids);
    if (!ids) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    if (get(f, h, ids, (size_t)pos * sizeof *ids)) {
        free(ids);
        return k3_fail(err, K3_ERR_IO, "%s: read error: the file is truncated", path);
    }
    if (want && (pos != want->n || memcmp(ids, want->tokens, (size_t)pos * sizeof *ids))) {
        free(ids);
        return k3_fail(err, K3_ERR_INPUT, "%s holds another token prefix (%d ids) than the "
                       "%d it was written for: not this conversation's state", path, pos,
                       want->n);
    }
    *out = ids;
    return K3_OK;
}

/* The load from stream f of `size` bytes (a file or a buffer), named path in messages. */
static int load_stream(k3_state *s, const k3_model *m, const k3_checkpoint *ck, int spine_int8,
                       int32_t *tokens, FILE *f, uint64_t size, const char *path,
                       const k3_state_want *want, k3_err *err) {
    k3_state_file_header got, want_h;
    int rc = fread(&got, sizeof got, 1, f) != 1
                 ? k3_fail(err, K3_ERR_IO, "%s: not a k3 state file (too short)", path)
                 : K3_OK;
    if (!rc) rc = make_header(s, m, ck, spine_int8, got.pos, &want_h, err);
    if (!rc) rc = check_header(&got, &want_h, s, size, path, err);
    if (!rc && want && got.engine != want_h.engine)
        rc = k3_fail(err, K3_ERR_INPUT, "%s was written by another k3 build (engine stamp "
                     "%016llx, this one %016llx): a cache holds only this build's states", path,
                     (unsigned long long)got.engine, (unsigned long long)want_h.engine);
    XXH3_state_t *h = rc ? NULL : XXH3_createState();
    if (!rc && !h) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    int32_t *ids = NULL;
    if (!rc) {
        XXH3_64bits_reset(h);
        XXH3_64bits_update(h, &got, sizeof got);
        rc = read_tokens(f, h, got.pos, want, path, &ids, err);
    }
    if (rc) {
        if (h) XXH3_freeState(h);
        return rc;
    }
    k3_state_reset(s);
    memcpy(tokens, ids, (size_t)got.pos * sizeof *tokens);
    free(ids);
    int bad = get(f, h, s->kda_S, s->kda_S_floats * (size_t)s->n_kda * sizeof(float));
    bad |= get(f, h, s->kda_conv, s->kda_conv_floats * (size_t)s->n_kda * sizeof(float));
    for (uint32_t l = 0; l < got.n_mla && !bad; l++)
        bad |= get(f, h, s->kv + (size_t)l * s->max_ctx * s->kv_floats,
                   (size_t)got.pos * s->kv_floats * sizeof(float));
    uint64_t sum = 0;
    if (!bad && fread(&sum, sizeof sum, 1, f) != 1) bad = 1;
    if (bad || sum != XXH3_64bits_digest(h)) {
        k3_state_reset(s);
        rc = k3_fail(err, K3_ERR_IO, "%s: checksum mismatch or read error: the file is damaged "
                     "(the session was reset)", path);
    } else {
        s->pos = got.pos;
    }
    XXH3_freeState(h);
    return rc;
}

int k3_state_file_load(k3_state *s, const k3_model *m, const k3_checkpoint *ck, int spine_int8,
                       int32_t *tokens, const char *path, const k3_state_want *want,
                       k3_err *err) {
    int fd = k3_open_regular(path, err); /* never blocks on a FIFO, never follows a link */
    if (fd < 0) return K3_ERR_IO;
    struct stat st;
    FILE *f = fstat(fd, &st) == 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        close(fd);
        return k3_fail(err, K3_ERR_GENERIC, "%s: out of memory", path);
    }
    int rc = load_stream(s, m, ck, spine_int8, tokens, f, (uint64_t)st.st_size, path, want, err);
    fclose(f);
    return rc;
}

int k3_state_file_load_mem(k3_state *s, const k3_model *m, const k3_checkpoint *ck,
                           int spine_int8, int32_t *tokens, const void *buf, size_t n,
                           const char *name, const k3_state_want *want, k3_err *err) {
    FILE *f = n ? fmemopen((void *)buf, n, "rb") : NULL;
    if (!f) return k3_fail(err, K3_ERR_IO, "%s: not a k3 state file (empty)", name);
    int rc = load_stream(s, m, ck, spine_int8, tokens, f, n, name, want, err);
    fclose(f);
    return rc;
}

int k3_state_file_peek(const char *path, const uint8_t fingerprint[16], int *pos,
                       uint64_t *bytes, k3_err *err) {
    int fd = k3_open_regular(path, err);
    if (fd < 0) return K3_ERR_IO;
    k3_state_file_header h;
    struct stat st;
    int rc = K3_OK;
    if (fstat(fd, &st) != 0 || read(fd, &h, sizeof h) != (ssize_t)sizeof h ||
        memcmp(h.magic, K3_STATE_MAGIC, 8) != 0 || h.version != K3_STATE_VERSION ||
        h.header_bytes != sizeof h || h.pos < 0)
        rc = k3_fail(err, K3_ERR_IO, "%s: not a k3 state file of version %d", path,
                     K3_STATE_VERSION);
    else if (memcmp(h.fingerprint, fingerprint, 16) != 0 || h.engine != k3_state_engine_stamp())
        rc = k3_fail(err, K3_ERR_INPUT, "%s: written for another model, spine mode or k3 build",
                     path);
    else if ((uint64_t)st.st_size != sizeof h + h.payload_bytes + sizeof(uint64_t))
        rc = k3_fail(err, K3_ERR_IO, "%s: %llu bytes, its header says %llu: truncated or "
                     "damaged", path, (unsigned long long)st.st_size,
                     (unsigned long long)(sizeof h + h.payload_bytes + sizeof(uint64_t)));
    close(fd);
    if (!rc) *pos = h.pos, *bytes = (uint64_t)st.st_size;
    return rc;
}
