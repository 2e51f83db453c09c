/* packed.c — reader and writer of the packed spine file (see packed.h, docs/PACKED-SPINE.md).
 * Serialization is explicit little-endian field by field, never a struct memcpy. */
#include "packed.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cjson/cJSON.h>

#include "../util/bf16lx.h"
#include "../util/fileio.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the pack format is little-endian");

static const uint8_t MAGIC[8] = {'K', '3', 'P', 'A', 'C', 'K', '\r', '\n'};
#define SAMPLE_BYTES 4096
#define MAX_TENSORS (1u << 20)

/* ---- little-endian fields ------------------------------------------------------------------ */

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* ---- selection and canonical layout -------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

int k3_pack_selects(const k3_tensor *t, uint32_t scheme) {
    return t->dtype == K3_DT_BF16 && t->ndim == 2 && t->shape[0] > 1 &&
           strncmp(t->name, "language_model.", 15) == 0 && !strstr(t->name, "embed_tokens") &&
           !ends_with(t->name, "_res_proj.weight") &&
           !ends_with(t->name, "block_sparse_moe.gate.weight") &&
           !(scheme == K3_PACK_SCHEME_BF16LX && ends_with(t->name, "kv_b_proj.weight"));
}

/* Checkpoint data order: by shard, then by offset (sequential reads while packing). */
static int cmp_data_order(const void *a, const void *b) {
    const k3_tensor *x = *(const k3_tensor *const *)a, *y = *(const k3_tensor *const *)b;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    return x->file_offset < y->file_offset ? -1 : x->file_offset > y->file_offset;
}

void k3_pack_parts(uint32_t scheme, const k3_pack_entry *e, uint64_t *q_bytes,
                   uint64_t *second_bytes) {
    uint64_t rows = (uint64_t)e->rows;
    if (scheme == K3_PACK_SCHEME_BF16LX) {
        *q_bytes = rows * k3_lx_row_bytes(e->cols);
        *second_bytes = 4 * (rows + 1 + e->n_esc);
    } else {
        *q_bytes = rows * (uint64_t)e->cols;
        *second_bytes = 4 * rows;
    }
}

/* Offsets of entries [0, n) from their shapes (and escape counts); returns the file size. */
static uint64_t layout(uint32_t scheme, k3_pack_entry *e, uint32_t n) {
    uint64_t off = align_up(K3_PACK_HEADER_BYTES + (uint64_t)n * K3_PACK_ENTRY_BYTES,
                            K3_PACK_ALIGN);
    uint64_t end = off;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t a, b;
        k3_pack_parts(scheme, &e[i], &a, &b);
        e[i].q_offset = off;
        e[i].scale_offset = align_up(off + a, 64);
        end = e[i].scale_offset + b;
        off = align_up(end, K3_PACK_ALIGN);
    }
    return end;
}

/* Lossless: the high-byte histogram of t (every weight read once) gives its table and its
 * escape count, so the layout is known before any payload is written. */
static int survey(const k3_tensor *t, k3_pack_entry *e, const char *dir, k3_err *err) {
    uint64_t hist[256] = {0}, n = (uint64_t)e->rows * (uint64_t)e->cols, hits = 0;
    uint8_t code_of[256];
    const uint16_t *w = t->data;
    if (e->cols > K3_LX_MAX_COLS)
        return k3_fail(err, K3_ERR_CHECKPOINT, "%s: %s has %lld columns; the lossless pack "
                       "takes at most %d", dir, e->name, (long long)e->cols, K3_LX_MAX_COLS);
    for (uint64_t i = 0; i < n; i++) hist[w[i] >> 8]++;
    k3_lx_table(hist, e->xtab, code_of);
    for (int b = 0; b < 256; b++)
        if (code_of[b] != K3_LX_ESCAPE) hits += hist[b];
    if (n - hits + (uint64_t)e->rows + 1 > UINT32_MAX)
        return k3_fail(err, K3_ERR_CHECKPOINT, "%s: %s: %llu escapes, more than the lossless "
                       "pack's 32-bit index holds", dir, e->name, (unsigned long long)(n - hits));
    e->n_esc = (uint32_t)(n - hits);
    return K3_OK;
}

static void fingerprint(const k3_tensor *const *sel, uint32_t n, uint8_t out[16]) {
    XXH3_state_t *st = XXH3_createState();
    XXH3_128bits_reset(st);
    for (uint32_t i = 0; i < n; i++) {
        const k3_tensor *t = sel[i];
        uint8_t dims[16];
        put64(dims, (uint64_t)t->shape[0]);
        put64(dims + 8, (uint64_t)t->shape[1]);
        XXH3_128bits_update(st, t->name, strlen(t->name) + 1);
        XXH3_128bits_update(st, dims, sizeof dims);
        uint64_t k = t->nbytes < SAMPLE_BYTES ? t->nbytes : SAMPLE_BYTES;
        XXH3_128bits_update(st, t->data, k);
        XXH3_128bits_update(st, (const uint8_t *)t->data + t->nbytes - k, k);
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
    memcpy(out, c.digest, 16);
    XXH3_freeState(st);
}

/* The plan without the lossless survey (names, shapes, fingerprint: enough to compare). */
static int plan(const k3_checkpoint *ck, uint32_t scheme, int do_survey, k3_pack *out,
                k3_err *err) {
    memset(out, 0, sizeof *out);
    const k3_tensor **sel = malloc((ck->n_tensors + 1) * sizeof *sel);
    if (!sel) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    uint32_t n = 0;
    for (size_t i = 0; i < ck->n_tensors; i++)
        if (k3_pack_selects(&ck->tensors[i], scheme)) sel[n++] = &ck->tensors[i];
    qsort(sel, n, sizeof *sel, cmp_data_order);
    int rc = K3_OK;
    if (n == 0)
        rc = k3_fail(err, K3_ERR_CHECKPOINT, "%s: no BF16 spine matrix to pack", ck->dir);
    else if (!(out->entries = calloc(n, sizeof *out->entries)))
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (uint32_t i = 0; i < n && !rc; i++) {
        k3_pack_entry *e = &out->entries[i];
        if (strlen(sel[i]->name) >= sizeof e->name)
            rc = k3_fail(err, K3_ERR_CHECKPOINT, "%s: tensor name longer than %d bytes: %s",
                         ck->dir, K3_PACK_NAME_BYTES - 1, sel[i]->name);
        else
            strcpy(e->name, sel[i]->name);
        e->rows = sel[i]->shape[0];
        e->cols = sel[i]->shape[1];
        if (!rc && do_survey && scheme == K3_PACK_SCHEME_BF16LX) rc = survey(sel[i], e, ck->dir, err);
    }
    if (!rc) {
        out->version = K3_PACK_VERSION;
        out->scheme = scheme;
        out->n_tensors = n;
        out->file_bytes = layout(scheme, out->entries, n);
        fingerprint(sel, n, out->fingerprint);
    }
    free(sel);
    if (rc) k3_pack_clear(out);
    return rc;
}

int k3_pack_plan(const k3_checkpoint *ck, uint32_t scheme, k3_pack *out, k3_err *err) {
    return plan(ck, scheme, 1, out, err);
}

const char *k3_pack_scheme_name(uint32_t scheme) {
    return scheme == K3_PACK_SCHEME_BF16LX ? "lossless" : "int8";
}

int k3_pack_check_scheme(const k3_pack *p, uint32_t scheme, k3_err *err) {
    if (p->scheme == scheme) return K3_OK;
    return k3_fail(err, K3_ERR_PACK, "%s holds the %s spine, not the %s one (a renamed file?); "
                   "re-run k3 pack%s", p->path, k3_pack_scheme_name(p->scheme),
                   k3_pack_scheme_name(scheme), scheme == K3_PACK_SCHEME_BF16LX ? " --lossless" : "");
}

/* ---- header and table bytes ---------------------------------------------------------------- */

/* Header fields (byte offsets); docs/PACKED-SPINE.md has the same table. */
enum { H_MAGIC = 0, H_VERSION = 8, H_SCHEME = 12, H_NTENSORS = 16, H_COMPLETE = 20,
       H_TABLE = 24, H_FILE_BYTES = 32, H_FINGERPRINT = 40, H_TABLE_SUM = 56, H_SUM = 120 };
enum { E_NAME = 0, E_ROWS = 192, E_COLS = 200, E_Q = 208, E_SCALE = 216, E_SUM = 224,
       E_DONE = 232, E_XTAB = 236, E_NESC = 252 };

static void encode_entry(const k3_pack_entry *e, uint8_t *b) {
    memset(b, 0, K3_PACK_ENTRY_BYTES);
    memcpy(b + E_NAME, e->name, strlen(e->name));
    put64(b + E_ROWS, (uint64_t)e->rows);
    put64(b + E_COLS, (uint64_t)e->cols);
    put64(b + E_Q, e->q_offset);
    put64(b + E_SCALE, e->scale_offset);
    put64(b + E_SUM, e->checksum);
    put32(b + E_DONE, (uint32_t)e->done);
    memcpy(b + E_XTAB, e->xtab, 16); /* zero for int8 */
    put32(b + E_NESC, e->n_esc);
}

/* Header + table as one buffer of meta_bytes(n). */
static size_t meta_bytes(uint32_t n) {
    return K3_PACK_HEADER_BYTES + (size_t)n * K3_PACK_ENTRY_BYTES;
}

static uint8_t *encode_meta(const k3_pack *p) {
    uint8_t *b = calloc(1, meta_bytes(p->n_tensors));
    if (!b) return NULL;
    uint8_t *table = b + K3_PACK_HEADER_BYTES;
    for (uint32_t i = 0; i < p->n_tensors; i++)
        encode_entry(&p->entries[i], table + (size_t)i * K3_PACK_ENTRY_BYTES);
    memcpy(b + H_MAGIC, MAGIC, 8);
    put32(b + H_VERSION, p->version);
    put32(b + H_SCHEME, p->scheme);
    put32(b + H_NTENSORS, p->n_tensors);
    put32(b + H_COMPLETE, (uint32_t)p->complete);
    put64(b + H_TABLE, K3_PACK_HEADER_BYTES);
    put64(b + H_FILE_BYTES, p->file_bytes);
    memcpy(b + H_FINGERPRINT, p->fingerprint, 16);
    put64(b + H_TABLE_SUM, XXH3_64bits(table, (size_t)p->n_tensors * K3_PACK_ENTRY_BYTES));
    put64(b + H_SUM, XXH3_64bits(b, H_SUM));
    return b;
}

int k3_pack_write_meta(int fd, const char *path, const k3_pack *p, k3_err *err) {
    uint8_t *b = encode_meta(p);
    if (!b) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    size_t n = meta_bytes(p->n_tensors);
    ssize_t w = pwrite(fd, b, n, 0);
    free(b);
    if (w != (ssize_t)n)
        return k3_fail(err, K3_ERR_IO, "%s: write failed: %s", path,
                       w < 0 ? strerror(errno) : "short write");
    return K3_OK;
}

/* ---- reading ------------------------------------------------------------------------------- */

static int read_at(int fd, const char *path, void *buf, size_t n, uint64_t off, k3_err *err) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (uint8_t *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return k3_fail(err, K3_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        if (r == 0)
            return k3_fail(err, K3_ERR_PACK, "%s: truncated: ends at byte %llu inside the "
                           "header or tensor table (re-run k3 pack)", path,
                           (unsigned long long)(off + got));
        got += (size_t)r;
    }
    return K3_OK;
}

static int decode_header(const uint8_t *h, const char *path, k3_pack *p, k3_err *err) {
    if (memcmp(h + H_MAGIC, MAGIC, 8) != 0)
        return k3_fail(err, K3_ERR_PACK, "%s: not a k3 packed spine file (bad magic)", path);
    p->version = get32(h + H_VERSION);
    if (p->version != K3_PACK_VERSION)
        return k3_fail(err, K3_ERR_PACK, "%s: format version %u, this k3 reads version %d "
                       "(re-run k3 pack)", path, p->version, K3_PACK_VERSION);
    p->header_checksum = get64(h + H_SUM);
    if (XXH3_64bits(h, H_SUM) != p->header_checksum)
        return k3_fail(err, K3_ERR_PACK, "%s: header checksum mismatch (file corrupt; re-run "
                       "k3 pack)", path);
    p->scheme = get32(h + H_SCHEME);
    p->n_tensors = get32(h + H_NTENSORS);
    p->complete = get32(h + H_COMPLETE) == 1;
    p->file_bytes = get64(h + H_FILE_BYTES);
    memcpy(p->fingerprint, h + H_FINGERPRINT, 16);
    if (p->scheme != K3_PACK_SCHEME_INT8_ROW && p->scheme != K3_PACK_SCHEME_BF16LX)
        return k3_fail(err, K3_ERR_PACK, "%s: unknown packing scheme %u (a newer k3 wrote it?)",
                       path, p->scheme);
    if (p->n_tensors == 0 || p->n_tensors > MAX_TENSORS ||
        get64(h + H_TABLE) != K3_PACK_HEADER_BYTES)
        return k3_fail(err, K3_ERR_PACK, "%s: malformed header (%u tensors)", path, p->n_tensors);
    return K3_OK;
}

/* Decodes the table and checks it is the canonical layout for its own shapes. */
static int decode_table(const uint8_t *t, const char *path, k3_pack *p, k3_err *err) {
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const uint8_t *b = t + (size_t)i * K3_PACK_ENTRY_BYTES;
        k3_pack_entry *e = &p->entries[i];
        if (!memchr(b + E_NAME, 0, K3_PACK_NAME_BYTES))
            return k3_fail(err, K3_ERR_PACK, "%s: tensor %u: name not terminated", path, i);
        memcpy(e->name, b + E_NAME, K3_PACK_NAME_BYTES);
        e->rows = (int64_t)get64(b + E_ROWS);
        e->cols = (int64_t)get64(b + E_COLS);
        e->checksum = get64(b + E_SUM);
        e->done = get32(b + E_DONE) == 1;
        memcpy(e->xtab, b + E_XTAB, 16);
        e->n_esc = get32(b + E_NESC);
        if (e->rows <= 0 || e->cols <= 0 || e->rows > (1ll << 31) || e->cols > (1ll << 31))
            return k3_fail(err, K3_ERR_PACK, "%s: %s: bad shape", path, e->name);
        int lx = p->scheme == K3_PACK_SCHEME_BF16LX;
        if (lx && (e->cols > K3_LX_MAX_COLS || e->xtab[15] != 0 ||
                   (uint64_t)e->n_esc > (uint64_t)e->rows * (uint64_t)e->cols))
            return k3_fail(err, K3_ERR_PACK, "%s: %s: bad lossless table entry", path, e->name);
        for (int k = E_XTAB; !lx && k < K3_PACK_ENTRY_BYTES; k++)
            if (b[k]) return k3_fail(err, K3_ERR_PACK, "%s: %s: reserved bytes set", path, e->name);
    }
    uint64_t end = layout(p->scheme, p->entries, p->n_tensors);
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const uint8_t *b = t + (size_t)i * K3_PACK_ENTRY_BYTES;
        if (get64(b + E_Q) != p->entries[i].q_offset ||
            get64(b + E_SCALE) != p->entries[i].scale_offset)
            return k3_fail(err, K3_ERR_PACK, "%s: %s: payload offset is not the canonical "
                           "layout", path, p->entries[i].name);
    }
    if (end != p->file_bytes)
        return k3_fail(err, K3_ERR_PACK, "%s: header says %llu bytes, the table %llu", path,
                       (unsigned long long)p->file_bytes, (unsigned long long)end);
    return K3_OK;
}

int k3_pack_read_meta(int fd, const char *path, k3_pack *p, k3_err *err) {
    memset(p, 0, sizeof *p);
    uint8_t h[K3_PACK_HEADER_BYTES];
    int rc = read_at(fd, path, h, sizeof h, 0, err);
    if (!rc) rc = decode_header(h, path, p, err);
    if (rc) return rc;
    size_t tb = (size_t)p->n_tensors * K3_PACK_ENTRY_BYTES;
    uint8_t *t = malloc(tb);
    p->entries = calloc(p->n_tensors, sizeof *p->entries);
    p->path = strdup(path);
    if (!t || !p->entries || !p->path) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    if (!rc) rc = read_at(fd, path, t, tb, K3_PACK_HEADER_BYTES, err);
    if (!rc && XXH3_64bits(t, tb) != get64(h + H_TABLE_SUM))
        rc = k3_fail(err, K3_ERR_PACK, "%s: tensor table checksum mismatch (file corrupt; "
                     "re-run k3 pack)", path);
    if (!rc) rc = decode_table(t, path, p, err);
    free(t);
    if (rc) k3_pack_clear(p);
    return rc;
}

int k3_pack_open(const char *path, k3_pack **out, k3_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return k3_fail(err, K3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    k3_pack *p = calloc(1, sizeof *p);
    struct stat st;
    int rc = p ? k3_pack_read_meta(fd, path, p, err) : k3_fail(err, K3_ERR_GENERIC, "no memory");
    if (!rc && !p->complete)
        rc = k3_fail(err, K3_ERR_PACK, "%s: incomplete (k3 pack was interrupted; re-run it to "
                     "resume)", path);
    if (!rc && fstat(fd, &st) != 0)
        rc = k3_fail(err, K3_ERR_IO, "%s: stat failed: %s", path, strerror(errno));
    if (!rc && (uint64_t)st.st_size != p->file_bytes)
        rc = k3_fail(err, K3_ERR_PACK, "%s: truncated or padded: %llu bytes, the header says "
                     "%llu (re-run k3 pack)", path, (unsigned long long)st.st_size,
                     (unsigned long long)p->file_bytes);
    if (!rc) {
        void *m = mmap(NULL, p->file_bytes, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED)
            rc = k3_fail(err, K3_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        else
            p->map = m;
    }
    close(fd);
    if (rc) {
        k3_pack_close(p);
        return rc;
    }
    *out = p;
    return K3_OK;
}

void k3_pack_clear(k3_pack *p) {
    if (!p) return;
    if (p->map) munmap((void *)p->map, p->file_bytes);
    free(p->entries);
    free(p->path);
    memset(p, 0, sizeof *p);
}

void k3_pack_close(k3_pack *p) {
    k3_pack_clear(p);
    free(p);
}

/* ---- checks -------------------------------------------------------------------------------- */

int k3_pack_check_model(const k3_pack *p, const k3_checkpoint *ck, k3_err *err) {
    k3_pack want;
    int rc = plan(ck, p->scheme, 0, &want, err);
    if (rc) return rc;
    int same = want.n_tensors == p->n_tensors &&
               memcmp(want.fingerprint, p->fingerprint, 16) == 0;
    for (uint32_t i = 0; same && i < p->n_tensors; i++)
        same = strcmp(want.entries[i].name, p->entries[i].name) == 0 &&
               want.entries[i].rows == p->entries[i].rows &&
               want.entries[i].cols == p->entries[i].cols;
    k3_pack_clear(&want);
    if (!same)
        return k3_fail(err, K3_ERR_PACK, "%s was packed from another model than %s (tensor "
                       "list or weight fingerprint differs); re-run k3 pack", p->path, ck->dir);
    return K3_OK;
}

uint64_t k3_pack_checksum(const void *a, uint64_t na, const void *b, uint64_t nb) {
    XXH3_state_t *st = XXH3_createState();
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, a, (size_t)na);
    XXH3_64bits_update(st, b, (size_t)nb);
    uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}

int k3_pack_verify(const k3_pack *p, k3_err *err) {
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        const k3_pack_entry *e = &p->entries[i];
        uint64_t a, b;
        k3_pack_parts(p->scheme, e, &a, &b);
        if (k3_pack_checksum(p->map + e->q_offset, a, p->map + e->scale_offset, b) != e->checksum)
            return k3_fail(err, K3_ERR_PACK, "%s: tensor %s: payload checksum mismatch (file "
                           "corrupt; re-run k3 pack)", p->path, e->name);
    }
    return K3_OK;
}

const k3_pack_entry *k3_pack_find(const k3_pack *p, const char *name) {
    for (uint32_t i = 0; i < p->n_tensors; i++)
        if (strcmp(p->entries[i].name, name) == 0) return &p->entries[i];
    return NULL;
}

/* ---- quality figures ----------------------------------------------------------------------- */

int k3_pack_quality_write(const char *path, const k3_pack_quality *q, k3_err *err) {
    char sum[17];
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)q->pack_checksum);
    FILE *f = fopen(path, "w");
    if (!f) return k3_fail(err, K3_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    fprintf(f, "{\n  \"format\": \"k3-pack-quality/1\",\n  \"pack_header_checksum\": \"%s\",\n"
            "  \"predictions\": %d,\n"
            "  \"exact\": {\"nll\": %.9g, \"perplexity\": %.9g},\n",
            sum, q->predictions, q->nll_exact, q->ppl_exact);
    for (int m = 0; m < 1 + q->has_approx; m++) {
        const k3_pack_figures *g = m ? &q->approx : &q->int8;
        fprintf(f, "  \"%s\": {\"nll\": %.9g, \"perplexity\": %.9g, \"mean_kl\": %.9g, "
                "\"top1_agreement\": %.9g, \"max_abs_dlogit\": %.9g}%s\n", m ? "approx" : "int8",
                g->nll, g->ppl, g->mean_kl, g->top1, g->max_abs_dlogit,
                m + 1 < 1 + q->has_approx ? "," : "");
    }
    fprintf(f, "}\n");
    if (fclose(f) != 0) return k3_fail(err, K3_ERR_IO, "%s: write failed", path);
    return K3_OK;
}

static int num(const cJSON *o, const char *k, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v)) return 0;
    *out = v->valuedouble;
    return 1;
}

static int figures(const cJSON *o, k3_pack_figures *g) {
    return num(o, "nll", &g->nll) && num(o, "perplexity", &g->ppl) &&
           num(o, "mean_kl", &g->mean_kl) && num(o, "top1_agreement", &g->top1) &&
           num(o, "max_abs_dlogit", &g->max_abs_dlogit);
}

int k3_pack_quality_read(const char *path, k3_pack_quality *q, k3_err *err) {
    char *text = NULL;
    size_t len;
    int rc = k3_read_file(path, 1 << 20, &text, &len, err);
    if (rc) return rc;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(j, "exact");
    const cJSON *i8 = cJSON_GetObjectItemCaseSensitive(j, "int8");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(j, "approx");
    const cJSON *sum = cJSON_GetObjectItemCaseSensitive(j, "pack_header_checksum");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    double pred = 0;
    memset(q, 0, sizeof *q);
    int ok = cJSON_IsString(fmt) && strcmp(fmt->valuestring, "k3-pack-quality/1") == 0 &&
             cJSON_IsString(sum) && num(j, "predictions", &pred) && num(ex, "nll", &q->nll_exact) &&
             num(ex, "perplexity", &q->ppl_exact) && figures(i8, &q->int8) &&
             (!ap || (q->has_approx = figures(ap, &q->approx)));
    if (ok) {
        q->predictions = (int)pred;
        q->pack_checksum = strtoull(sum->valuestring, NULL, 16);
    }
    cJSON_Delete(j);
    return ok ? K3_OK : k3_fail(err, K3_ERR_PACK, "%s: not a k3-pack-quality/1 file", path);
}
