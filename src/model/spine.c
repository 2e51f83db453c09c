/* spine.c — the resident spine budget: plan, pinned copies, staging buffers and the reader
 * thread that streams layers with pread while the previous layer computes (see spine.h). */
#include "spine.h"
#include "../util/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define ALIGN 4096u                 /* O_DIRECT granularity; also the alignment kept */
#define MERGE_GAP (64u << 10)       /* tensors this close share one read */
#define READ_CHUNK ((uint64_t)64 << 20) /* bytes per pread (and per DONTNEED) */
/* Units: each layer is two, its mixer (u = 2l) and its FFN (u = 2l + 1), so a staging buffer
 * holds half a layer; lm_head is the last unit. */
#define N_UNITS(sp) (2 * (sp)->n_layers + 1)
#define HEAD_UNIT(sp) (2 * (sp)->n_layers)
#define LAYER_OF(u) ((u) / 2)

/* Every k3_mat of a layer, by offset, for its mixer half and its FFN half: the forward pass
 * reads these. PINNED are the small ones read outside the layer's turn (spine.h). The asserts
 * make a new weight field fail to compile until it is listed here. */
#define LM(f) offsetof(k3_layer, f)
static const size_t MIXER[] = {
    LM(input_layernorm),
    LM(kda.q_proj), LM(kda.k_proj), LM(kda.v_proj), LM(kda.g_proj), LM(kda.o_proj),
    LM(kda.f_a_proj), LM(kda.f_b_proj), LM(kda.b_proj), LM(kda.A_log), LM(kda.dt_bias),
    LM(kda.o_norm),
    LM(mla.q_a_proj), LM(mla.q_a_layernorm), LM(mla.q_b_proj), LM(mla.kv_a_proj),
    LM(mla.kv_a_layernorm), LM(mla.kv_b_proj), LM(mla.g_proj), LM(mla.o_proj),
};
static const size_t FFN[] = {
    LM(post_attention_layernorm),
    LM(dense.gate_proj), LM(dense.up_proj), LM(dense.down_proj),
    LM(moe.down_proj), LM(moe.up_proj), LM(moe.norm), LM(moe.shared_gate), LM(moe.shared_up),
    LM(moe.shared_down),
};
static const size_t MIXER_PINNED[] = {LM(kda.q_conv), LM(kda.k_conv), LM(kda.v_conv)};
static const size_t FFN_PINNED[] = {LM(moe.router), LM(moe.router_bias)};
#undef LM
#define COUNT(a) (sizeof(a) / sizeof(a)[0])
_Static_assert(sizeof(k3_kda_weights) == 14 * sizeof(k3_mat), "list every KDA matrix above");
_Static_assert(sizeof(k3_mla_weights) == 8 * sizeof(k3_mat), "list every MLA matrix above");
_Static_assert(sizeof(k3_moe_weights) == 8 * sizeof(k3_mat), "list every MoE matrix above");
_Static_assert(sizeof(k3_dense_weights) == 3 * sizeof(k3_mat), "list every dense matrix above");

typedef struct sfile {
    const char *path;
    const uint8_t *map;
    uint64_t size;
    int fd;                 /* -1 until a unit needs it */
} sfile;

/* One pointer field of a unit (data or scale of a k3_mat) and where its bytes live. */
typedef struct item {
    size_t field;           /* byte offset of the pointer inside the unit (k3_layer / k3_mat) */
    int file;
    uint64_t off, len;      /* in the file */
    uint64_t dst;           /* in the staging buffer (or the pinned arena) */
} item;

/* A read: [off, off + len) of file, aligned, into dst; `need` bytes of it must exist. */
typedef struct extent {
    int file;
    uint64_t off, len, need, dst;
} extent;

typedef struct unit {
    item *items, *pins;
    int n_items, n_pins;
    extent *ext, *pin_ext;
    int n_ext, n_pin_ext;
    uint64_t bytes;         /* every tensor of the unit (resident in place) */
    uint64_t stage_bytes;   /* its extents, aligned (one staging buffer) */
    uint64_t pin_bytes;     /* its pinned extents, aligned */
} unit;

enum { EMPTY, READING, READY, FAILED };

struct k3_spine {
    k3_model *m;
    int n_layers, first;    /* layers first..n_layers-1 are streamed (both halves) */
    bool head_streamed, streaming, direct;
    uint64_t budget, resident_bytes, streamed_bytes, pinned_bytes, slot_bytes;
    sfile *files;
    int n_files;
    unit *units;            /* [N_UNITS]: mixer and FFN of each layer, the head last */
    uint8_t *slot[2], *pinned;
    k3_layer *views[2];     /* [2 n_layers] per staging buffer: unit u's pointers into it
                             * (the other half's cleared); streamed units only */
    k3_mat head_view[2];
    int embed_fd;
    uint64_t embed_off;
    const char *embed_path; /* the shard holding the embedding, for messages */
    /* reader state, under mu */
    pthread_mutex_t section, mu;
    pthread_cond_t cv;
    int tag[2], status[2], job;
    k3_err slot_err[2];
    bool stop, thread_started, locks_made;
    pthread_t thread;
    uint64_t bytes_read, units_read;
    double read_s, wait_s;
};

static uint64_t align_down(uint64_t x) { return x / ALIGN * ALIGN; }
static uint64_t align_up(uint64_t x) { return align_down(x + ALIGN - 1); }

/* ---- where a unit's bytes live -------------------------------------------------------------- */

static uint64_t mat_bytes(const k3_mat *w) {
    if (w->dtype == K3_DT_BF16LX) return (uint64_t)w->rows * k3_lx_row_bytes(w->cols);
    size_t el = w->dtype == K3_DT_F32 ? 4 : w->dtype == K3_DT_BF16 ? 2 : 1;
    return (uint64_t)w->rows * (uint64_t)w->cols * el;
}

static int locate(const k3_spine *sp, const void *p, uint64_t len, item *it) {
    const uint8_t *b = p;
    for (int f = 0; f < sp->n_files; f++)
        if (b >= sp->files[f].map && b + len <= sp->files[f].map + sp->files[f].size) {
            it->file = f;
            it->off = (uint64_t)(b - sp->files[f].map);
            it->len = len;
            return 1;
        }
    return 0;
}

/* Appends the item(s) of matrix w found at byte offset at inside the unit. */
static int add_mat(k3_spine *sp, const k3_mat *w, size_t at, item *list, int *n, k3_err *err) {
    if (!w->data) return K3_OK;
    item it = {.field = at + offsetof(k3_mat, data)};
    if (!locate(sp, w->data, mat_bytes(w), &it))
        return k3_fail(err, K3_ERR_GENERIC, "spine: a weight lies outside every mapped file");
    list[(*n)++] = it;
    if (w->scale) { /* int8 pack: one f32 scale per row */
        item sc = {.field = at + offsetof(k3_mat, scale)};
        if (!locate(sp, w->scale, (uint64_t)w->rows * 4, &sc))
            return k3_fail(err, K3_ERR_GENERIC, "spine: a scale lies outside every mapped file");
        list[(*n)++] = sc;
    }
    if (w->esc) { /* lossless pack: the escape index and list after it */
        item ex = {.field = at + offsetof(k3_mat, esc)};
        if (!locate(sp, w->esc, 4 * ((uint64_t)w->rows + 1 + w->n_esc), &ex))
            return k3_fail(err, K3_ERR_GENERIC, "spine: an escape list lies outside every "
                           "mapped file");
        list[(*n)++] = ex;
    }
    return K3_OK;
}

static int cmp_item(const void *a, const void *b) {
    const item *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Sorts items by file position and covers them with aligned extents laid out back to back
 * from 0 (merging neighbours closer than gap); sets each item's dst. Returns the bytes. */
static uint64_t layout(item *it, int n, uint64_t gap, extent *ext, int *n_ext) {
    qsort(it, (size_t)n, sizeof *it, cmp_item);
    uint64_t at = 0;
    int k = -1;
    for (int i = 0; i < n; i++) {
        uint64_t a = align_down(it[i].off), b = align_up(it[i].off + it[i].len);
        extent *e = k >= 0 ? &ext[k] : NULL;
        if (e && e->file == it[i].file && a <= e->off + e->len + gap) {
            uint64_t end = e->off + e->len > b ? e->off + e->len : b;
            at += end - (e->off + e->len);
            e->len = end - e->off;
        } else {
            ext[++k] = (extent){.file = it[i].file, .off = a, .len = b - a, .dst = at};
            at += b - a;
            e = &ext[k];
        }
        if (it[i].off + it[i].len - e->off > e->need) e->need = it[i].off + it[i].len - e->off;
        it[i].dst = e->dst + (it[i].off - e->off);
    }
    *n_ext = k + 1;
    return at;
}

/* Items and extents of unit u (a layer, or the head: lm_head, with the final norm pinned). */
static int build_unit(k3_spine *sp, int u, k3_err *err) {
    unit *U = &sp->units[u];
    int cap = 3 * (int)(COUNT(MIXER) + COUNT(FFN) + COUNT(MIXER_PINNED) + COUNT(FFN_PINNED));
    U->items = calloc((size_t)cap, sizeof *U->items);
    U->pins = calloc((size_t)cap, sizeof *U->pins);
    U->ext = calloc((size_t)cap, sizeof *U->ext);
    U->pin_ext = calloc((size_t)cap, sizeof *U->pin_ext);
    if (!U->items || !U->pins || !U->ext || !U->pin_ext)
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    int rc = K3_OK;
    if (u == HEAD_UNIT(sp)) {
        rc = add_mat(sp, &sp->m->lm_head, 0, U->items, &U->n_items, err);
        if (!rc) rc = add_mat(sp, &sp->m->norm, 0, U->pins, &U->n_pins, err);
    } else {
        const uint8_t *L = (const uint8_t *)&sp->m->layers[LAYER_OF(u)];
        bool ffn = u % 2;
        const size_t *mats = ffn ? FFN : MIXER, *pins = ffn ? FFN_PINNED : MIXER_PINNED;
        size_t n_mats = ffn ? COUNT(FFN) : COUNT(MIXER);
        size_t n_pins = ffn ? COUNT(FFN_PINNED) : COUNT(MIXER_PINNED);
        for (size_t i = 0; !rc && i < n_mats; i++)
            rc = add_mat(sp, (const k3_mat *)(L + mats[i]), mats[i], U->items, &U->n_items, err);
        for (size_t i = 0; !rc && i < n_pins; i++)
            rc = add_mat(sp, (const k3_mat *)(L + pins[i]), pins[i], U->pins, &U->n_pins, err);
    }
    if (rc) return rc;
    for (int i = 0; i < U->n_items; i++) U->bytes += U->items[i].len;
    for (int i = 0; i < U->n_pins; i++) U->bytes += U->pins[i].len;
    U->stage_bytes = layout(U->items, U->n_items, MERGE_GAP, U->ext, &U->n_ext);
    U->pin_bytes = layout(U->pins, U->n_pins, 0, U->pin_ext, &U->n_pin_ext);
    return K3_OK;
}

/* ---- the plan -------------------------------------------------------------------------------- */

/* RAM of the plan (head resident or not, layers first.. streamed); *slot the staging size. */
static uint64_t plan_cost(const k3_spine *sp, bool head_res, int first, uint64_t *slot) {
    uint64_t ram = 0, big = 0;
    for (int u = 0; u < N_UNITS(sp); u++) {
        const unit *U = &sp->units[u];
        bool streamed = u == HEAD_UNIT(sp) ? !head_res : LAYER_OF(u) >= first;
        if (!streamed) {
            ram += U->bytes;
            continue;
        }
        ram += U->pin_bytes;
        if (U->stage_bytes > big) big = U->stage_bytes;
    }
    *slot = big;
    return ram + 2 * big;
}

/* The head first, then layers in order, as far as the budget holds (spine.h). */
static void plan(k3_spine *sp) {
    uint64_t slot = 0;
    for (int h = 1; h >= 0; h--)
        for (int first = sp->n_layers; first >= 0; first--)
            if (plan_cost(sp, h, first, &slot) <= sp->budget) {
                sp->head_streamed = !h;
                sp->first = first;
                goto done;
            }
    sp->head_streamed = true; /* below the floor: stream everything */
    sp->first = 0;
done:
    plan_cost(sp, !sp->head_streamed, sp->first, &slot);
    sp->slot_bytes = slot;
    sp->streaming = slot > 0;
    for (int u = 0; u < N_UNITS(sp); u++) {
        const unit *U = &sp->units[u];
        bool streamed = u == HEAD_UNIT(sp) ? sp->head_streamed : LAYER_OF(u) >= sp->first;
        if (!streamed) {
            sp->resident_bytes += U->bytes;
            continue;
        }
        for (int i = 0; i < U->n_items; i++) sp->streamed_bytes += U->items[i].len;
        sp->pinned_bytes += U->pin_bytes;
    }
}

static bool is_streamed(const k3_spine *sp, int u) {
    return sp->streaming && (u == HEAD_UNIT(sp) ? sp->head_streamed : LAYER_OF(u) >= sp->first);
}

/* ---- reading --------------------------------------------------------------------------------- */

/* Whether a failed O_DIRECT read is the file system refusing O_DIRECT (then buffered reads
 * are used instead) rather than a real error. */
static bool direct_refused(int e) {
    return e == EINVAL || e == EOPNOTSUPP; /* ENOTSUP is EOPNOTSUPP on Linux */
}

/* Opens path for spine reads; -1 with errno on failure (*probe: the failure is the read below,
 * not the open). With O_DIRECT it also checks that a direct read works: some file systems take
 * the flag at open and refuse the read (EINVAL). */
static int open_for_reads(const char *path, bool direct, bool *probe) {
    *probe = false;
    int fd = open(path, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0 || !direct) return fd;
    void *buf = NULL;
    ssize_t r = -1;
    int e = posix_memalign(&buf, ALIGN, ALIGN);
    if (!e) r = pread(fd, buf, ALIGN, 0), e = r < 0 ? errno : 0;
    free(buf);
    if (r < 0) {
        close(fd);
        errno = e;
        *probe = true;
        return -1;
    }
    return fd;
}

/* Opens every file the streamed units read: all with O_DIRECT (unless want_direct is 0), or,
 * when a file system refuses it, all buffered (read_extent then drops what it read from the
 * page cache). Any other failure, of the open or of the O_DIRECT probe read, is K3_ERR_IO
 * naming the file. */
static int open_files(k3_spine *sp, bool want_direct, k3_err *err) {
    for (int direct = want_direct; direct >= 0; direct--) {
        bool refused = false, probe;
        sp->direct = direct;
        for (int u = 0; u < N_UNITS(sp) && !refused; u++)
            for (int i = 0; is_streamed(sp, u) && i < sp->units[u].n_ext && !refused; i++) {
                sfile *F = &sp->files[sp->units[u].ext[i].file];
                if (F->fd >= 0) continue;
                if ((F->fd = open_for_reads(F->path, direct, &probe)) >= 0) continue;
                if (direct && direct_refused(errno)) refused = true;
                else
                    return k3_fail(err, K3_ERR_IO, "%s: %s: %s", F->path,
                                   probe ? "a direct (O_DIRECT) read failed"
                                         : "cannot open for spine reads", strerror(errno));
            }
        if (!refused) return K3_OK;
        for (int f = 0; f < sp->n_files; f++)
            if (sp->files[f].fd >= 0) close(sp->files[f].fd), sp->files[f].fd = -1;
    }
    return K3_OK;
}

/* "layer N" or "head (lm_head)" into buf [32]. */
static const char *unit_name(const k3_spine *sp, int u, char *buf) {
    if (u == HEAD_UNIT(sp)) return "head (lm_head)";
    snprintf(buf, 32, "layer %d (%s)", LAYER_OF(u), u % 2 ? "FFN" : "mixer");
    return buf;
}

/* Reads extent e of the files into base + e->dst. Returns K3_OK or K3_ERR_IO naming the file. */
static int read_extent(k3_spine *sp, const extent *e, uint8_t *base, int fd, bool direct,
                       int u, uint64_t *bytes, k3_err *err) {
    const sfile *F = &sp->files[e->file];
    char name[32];
    uint64_t done = 0, reached = 0; /* read from; bytes that arrived */
    while (reached < e->need) {
        uint64_t want = e->len - done > READ_CHUNK ? READ_CHUNK : e->len - done;
        ssize_t r = pread(fd, base + e->dst + done, (size_t)want, (off_t)(e->off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return k3_fail(err, K3_ERR_IO, "%s: reading spine %s at offset %llu failed: %s",
                           F->path, unit_name(sp, u, name), (unsigned long long)(e->off + done),
                           strerror(errno));
        if (r == 0 || done + (uint64_t)r <= reached)
            return k3_fail(err, K3_ERR_IO, "%s: truncated: spine %s needs bytes up to offset "
                           "%llu, the file ends at %llu", F->path, unit_name(sp, u, name),
                           (unsigned long long)(e->off + e->need),
                           (unsigned long long)(e->off + reached));
        if (!direct) posix_fadvise(fd, (off_t)(e->off + done), r, POSIX_FADV_DONTNEED);
        *bytes += done + (uint64_t)r - reached;
        reached = done + (uint64_t)r;
        done = direct ? align_down(reached) : reached; /* O_DIRECT resumes on a block */
    }
    return K3_OK;
}

/* Reads streamed unit u into staging buffer s. */
static int read_unit(k3_spine *sp, int u, int s, uint64_t *bytes, k3_err *err) {
    const unit *U = &sp->units[u];
    for (int i = 0; i < U->n_ext; i++) {
        int rc = read_extent(sp, &U->ext[i], sp->slot[s], sp->files[U->ext[i].file].fd,
                             sp->direct, u, bytes, err);
        if (rc) return rc;
    }
    return K3_OK;
}

static void *reader(void *arg) {
    k3_spine *sp = arg;
    pthread_mutex_lock(&sp->mu);
    for (;;) {
        while (sp->job < 0 && !sp->stop) pthread_cond_wait(&sp->cv, &sp->mu);
        if (sp->stop) break;
        int s = sp->job, u = sp->tag[s];
        sp->job = -1;
        pthread_mutex_unlock(&sp->mu);
        k3_err e = {0};
        uint64_t bytes = 0;
        double t0 = k3_now_s();
        int rc = read_unit(sp, u, s, &bytes, &e);
        double dt = k3_now_s() - t0;
        pthread_mutex_lock(&sp->mu);
        sp->status[s] = rc ? FAILED : READY;
        if (rc) sp->slot_err[s] = e;
        sp->bytes_read += bytes, sp->units_read++, sp->read_s += dt;
        pthread_cond_broadcast(&sp->cv);
    }
    pthread_mutex_unlock(&sp->mu);
    return NULL;
}

/* ---- open / close ---------------------------------------------------------------------------- */

static int collect_files(k3_spine *sp, const k3_checkpoint *ck, const k3_pack *pack,
                         k3_err *err) {
    sp->files = calloc((size_t)ck->n_shards + 1, sizeof *sp->files);
    if (!sp->files) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (int i = 0; i < ck->n_shards; i++)
        sp->files[sp->n_files++] = (sfile){ck->shards[i].path, ck->shards[i].map,
                                           ck->shards[i].file_bytes, -1};
    if (pack) sp->files[sp->n_files++] = (sfile){pack->path, pack->map, pack->file_bytes, -1};
    return K3_OK;
}

/* Copies the pinned tensors of streamed units into one arena (pread, as any streamed byte)
 * and points both the model and the staging views at them. */
static int pin(k3_spine *sp, k3_err *err) {
    uint64_t at = 0;
    for (int u = 0; u < N_UNITS(sp); u++)
        if (is_streamed(sp, u)) at += sp->units[u].pin_bytes;
    if (!at) return K3_OK;
    sp->pinned = mmap(NULL, at, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (sp->pinned == MAP_FAILED) {
        sp->pinned = NULL;
        return k3_fail(err, K3_ERR_GENERIC, "out of memory for %llu bytes of pinned spine "
                       "tensors", (unsigned long long)at);
    }
    uint64_t base = 0;
    for (int u = 0; u < N_UNITS(sp); u++) {
        unit *U = &sp->units[u];
        if (!is_streamed(sp, u)) continue;
        for (int i = 0; i < U->n_pin_ext; i++) {
            extent e = U->pin_ext[i];
            e.dst += base;
            int fd = open(sp->files[e.file].path, O_RDONLY | O_CLOEXEC);
            uint64_t bytes = 0;
            int rc = fd < 0 ? k3_fail(err, K3_ERR_IO, "%s: cannot open: %s",
                                      sp->files[e.file].path, strerror(errno))
                            : read_extent(sp, &e, sp->pinned, fd, false, u, &bytes, err);
            if (fd >= 0) close(fd);
            if (rc) return rc;
        }
        uint8_t *model_unit = u == HEAD_UNIT(sp) ? (uint8_t *)&sp->m->norm
                                                 : (uint8_t *)&sp->m->layers[LAYER_OF(u)];
        for (int i = 0; i < U->n_pins; i++) {
            const void *p = sp->pinned + base + U->pins[i].dst;
            memcpy(model_unit + U->pins[i].field, &p, sizeof p);
        }
        base += U->pin_bytes;
    }
    return K3_OK;
}

static uint8_t *model_unit(k3_spine *sp, int u) {
    return u == HEAD_UNIT(sp) ? (uint8_t *)&sp->m->lm_head
                              : (uint8_t *)&sp->m->layers[LAYER_OF(u)];
}

/* Staging views: copies of the streamed units pointing into each buffer. The model's own
 * pointers to streamed bytes are cleared first (spine.h), so a view of one half of a layer
 * has the other half's pointers cleared too. */
static int make_views(k3_spine *sp, k3_err *err) {
    for (int s = 0; s < 2; s++) {
        sp->slot[s] = mmap(NULL, sp->slot_bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (sp->slot[s] == MAP_FAILED) {
            sp->slot[s] = NULL;
            return k3_fail(err, K3_ERR_GENERIC, "out of memory for a %llu-byte spine staging "
                           "buffer", (unsigned long long)sp->slot_bytes);
        }
        if (!(sp->views[s] = calloc((size_t)HEAD_UNIT(sp), sizeof *sp->views[s])))
            return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    const void *none = NULL;
    for (int u = 0; u < N_UNITS(sp); u++)
        for (int i = 0; is_streamed(sp, u) && i < sp->units[u].n_items; i++)
            memcpy(model_unit(sp, u) + sp->units[u].items[i].field, &none, sizeof none);
    for (int u = 0; u < N_UNITS(sp); u++) {
        if (!is_streamed(sp, u)) continue;
        const unit *U = &sp->units[u];
        bool head = u == HEAD_UNIT(sp);
        for (int s = 0; s < 2; s++) {
            uint8_t *v = head ? (uint8_t *)&sp->head_view[s] : (uint8_t *)&sp->views[s][u];
            if (head) sp->head_view[s] = sp->m->lm_head;
            else sp->views[s][u] = sp->m->layers[LAYER_OF(u)];
            for (int i = 0; i < U->n_items; i++) {
                const void *p = sp->slot[s] + U->items[i].dst;
                memcpy(v + U->items[i].field, &p, sizeof p);
            }
        }
    }
    return K3_OK;
}

static int open_embed(k3_spine *sp, const k3_checkpoint *ck, k3_err *err) {
    const k3_tensor *t = k3_checkpoint_find(ck, "language_model.model.embed_tokens.weight");
    if (!t) return k3_fail(err, K3_ERR_CHECKPOINT, "%s: no embedding", ck->dir);
    sp->embed_off = t->file_offset;
    sp->embed_path = ck->shards[t->shard].path;
    sp->embed_fd = open(ck->shards[t->shard].path, O_RDONLY | O_CLOEXEC);
    if (sp->embed_fd < 0)
        return k3_fail(err, K3_ERR_IO, "%s: cannot open: %s", ck->shards[t->shard].path,
                       strerror(errno));
    return K3_OK;
}

static int start(k3_spine *sp, k3_err *err) {
    pthread_mutex_init(&sp->section, NULL);
    pthread_mutex_init(&sp->mu, NULL);
    pthread_cond_init(&sp->cv, NULL);
    sp->locks_made = true;
    sp->tag[0] = sp->tag[1] = -1;
    sp->job = -1;
    if (pthread_create(&sp->thread, NULL, reader, sp))
        return k3_fail(err, K3_ERR_GENERIC, "cannot start the spine reader thread");
    sp->thread_started = true;
    pthread_mutex_lock(&sp->mu); /* the first streamed unit, read while the model loads */
    sp->tag[0] = sp->first < sp->n_layers ? 2 * sp->first : HEAD_UNIT(sp);
    sp->status[0] = READING;
    sp->job = 0;
    pthread_cond_broadcast(&sp->cv);
    pthread_mutex_unlock(&sp->mu);
    return K3_OK;
}

int k3_spine_open(k3_model *m, const k3_checkpoint *ck, const k3_pack *pack,
                  uint64_t budget_bytes, bool direct, k3_spine **out, k3_err *err) {
    k3_spine *sp = calloc(1, sizeof *sp);
    if (!sp) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    sp->m = m;
    sp->n_layers = m->cfg.num_hidden_layers;
    sp->budget = budget_bytes;
    sp->embed_fd = -1;
    int rc = collect_files(sp, ck, pack, err);
    if (!rc && !(sp->units = calloc((size_t)N_UNITS(sp), sizeof *sp->units)))
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (int u = 0; !rc && u < N_UNITS(sp); u++) rc = build_unit(sp, u, err);
    if (!rc) plan(sp);
    if (!rc && sp->streaming) rc = open_files(sp, direct, err);
    if (!rc && sp->streaming) rc = open_embed(sp, ck, err);
    if (!rc && sp->streaming) rc = pin(sp, err);
    if (!rc && sp->streaming) rc = make_views(sp, err);
    if (!rc && sp->streaming) rc = start(sp, err);
    if (rc) {
        k3_spine_close(sp);
        return rc;
    }
    *out = sp;
    return K3_OK;
}

int k3_spine_floor_bytes(const k3_model *m, const k3_checkpoint *ck, const k3_pack *pack,
                         uint64_t *floor_bytes, k3_err *err) {
    k3_spine *sp = calloc(1, sizeof *sp);
    if (!sp) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    sp->m = (k3_model *)m; /* read only: nothing is opened, pinned or started */
    sp->n_layers = m->cfg.num_hidden_layers;
    sp->embed_fd = -1;
    int rc = collect_files(sp, ck, pack, err);
    if (!rc && !(sp->units = calloc((size_t)N_UNITS(sp), sizeof *sp->units)))
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (int u = 0; !rc && u < N_UNITS(sp); u++) rc = build_unit(sp, u, err);
    uint64_t slot = 0;
    if (!rc) *floor_bytes = plan_cost(sp, false, 0, &slot);
    for (int u = 0; sp->units && u < N_UNITS(sp); u++) {
        free(sp->units[u].items), free(sp->units[u].pins);
        free(sp->units[u].ext), free(sp->units[u].pin_ext);
    }
    free(sp->units);
    free(sp->files);
    free(sp);
    return rc;
}

int k3_spine_plan_only(const k3_model *m, const k3_checkpoint *ck, const k3_pack *pack,
                       uint64_t budget_bytes, bool direct, k3_spine **out, k3_err *err) {
    k3_spine *sp = calloc(1, sizeof *sp);
    if (!sp) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    sp->m = (k3_model *)m; /* read only: nothing is opened, pinned or started */
    sp->n_layers = m->cfg.num_hidden_layers;
    sp->budget = budget_bytes;
    sp->embed_fd = -1;
    int rc = collect_files(sp, ck, pack, err);
    if (!rc && !(sp->units = calloc((size_t)N_UNITS(sp), sizeof *sp->units)))
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (int u = 0; !rc && u < N_UNITS(sp); u++) rc = build_unit(sp, u, err);
    if (rc) {
        k3_spine_close(sp);
        return rc;
    }
    plan(sp);
    sp->direct = sp->streaming && direct; /* the wish: open_files may fall back */
    *out = sp;
    return K3_OK;
}

void k3_spine_close(k3_spine *sp) {
    if (!sp) return;
    if (sp->thread_started) {
        pthread_mutex_lock(&sp->mu);
        sp->stop = true;
        pthread_cond_broadcast(&sp->cv);
        pthread_mutex_unlock(&sp->mu);
        pthread_join(sp->thread, NULL);
    }
    if (sp->locks_made) {
        pthread_mutex_destroy(&sp->section);
        pthread_mutex_destroy(&sp->mu);
        pthread_cond_destroy(&sp->cv);
    }
    for (int f = 0; sp->files && f < sp->n_files; f++)
        if (sp->files[f].fd >= 0) close(sp->files[f].fd);
    if (sp->embed_fd >= 0) close(sp->embed_fd);
    uint64_t pinned = 0;
    for (int u = 0; sp->units && u < N_UNITS(sp); u++) {
        if (is_streamed(sp, u)) pinned += sp->units[u].pin_bytes;
        free(sp->units[u].items), free(sp->units[u].pins);
        free(sp->units[u].ext), free(sp->units[u].pin_ext);
    }
    if (sp->pinned) munmap(sp->pinned, pinned);
    for (int s = 0; s < 2; s++) {
        if (sp->slot[s]) munmap(sp->slot[s], sp->slot_bytes);
        free(sp->views[s]);
    }
    free(sp->units);
    free(sp->files);
    free(sp);
}

/* ---- a pass through the streamed part -------------------------------------------------------- */

/* The unit after u in the cyclic order (spine.h). */
static int next_unit(const k3_spine *sp, int u, bool want_head) {
    if (u + 1 < HEAD_UNIT(sp)) return u + 1;
    if (u + 1 == HEAD_UNIT(sp) && want_head && sp->head_streamed) return HEAD_UNIT(sp);
    return sp->first < sp->n_layers ? 2 * sp->first : HEAD_UNIT(sp);
}

/* Makes staging buffer *slot hold unit u (waiting for or doing its read) and starts reading
 * the next unit into the other buffer. Called with mu held. */
static int acquire(k3_spine *sp, const k3_spine_pass *p, int u, int *slot, k3_err *err) {
    double t0 = k3_now_s();
    int s = sp->tag[0] == u ? 0 : sp->tag[1] == u ? 1 : -1;
    while (s >= 0 && sp->status[s] == READING) pthread_cond_wait(&sp->cv, &sp->mu);
    if (s >= 0 && sp->status[s] == FAILED) {
        *err = sp->slot_err[s];
        sp->tag[s] = -1, sp->status[s] = EMPTY; /* the next pass reads it again */
        sp->wait_s += k3_now_s() - t0;
        return err->code;
    }
    if (s < 0) { /* not prefetched (first pass after an error): read it here */
        while (sp->status[0] == READING || sp->status[1] == READING)
            pthread_cond_wait(&sp->cv, &sp->mu);
        s = 0;
        sp->tag[s] = u, sp->status[s] = READING;
        pthread_mutex_unlock(&sp->mu);
        uint64_t bytes = 0;
        double t1 = k3_now_s();
        int rc = read_unit(sp, u, s, &bytes, err);
        double dt = k3_now_s() - t1;
        pthread_mutex_lock(&sp->mu);
        sp->bytes_read += bytes, sp->units_read++, sp->read_s += dt;
        sp->status[s] = rc ? EMPTY : READY;
        if (rc) sp->tag[s] = -1;
        pthread_cond_broadcast(&sp->cv);
        if (rc) {
            sp->wait_s += k3_now_s() - t0;
            return rc;
        }
    }
    sp->wait_s += k3_now_s() - t0;
    int o = 1 - s, nx = next_unit(sp, u, p->want_head);
    if (nx != u && !(sp->tag[o] == nx && sp->status[o] != FAILED)) {
        while (sp->status[o] == READING) pthread_cond_wait(&sp->cv, &sp->mu);
        sp->tag[o] = nx, sp->status[o] = READING, sp->job = o;
        pthread_cond_broadcast(&sp->cv);
    }
    *slot = s;
    return K3_OK;
}

static int enter(k3_spine *sp, k3_spine_pass *p, int u, int *slot, k3_err *err) {
    if (!p->held) {
        pthread_mutex_lock(&sp->section);
        p->held = true;
    }
    pthread_mutex_lock(&sp->mu);
    int rc = acquire(sp, p, u, slot, err);
    pthread_mutex_unlock(&sp->mu);
    return rc;
}

int k3_spine_layer(const k3_model *m, k3_spine_pass *p, int l, int part, const k3_layer **out,
                   k3_err *err) {
    k3_spine *sp = m->spine;
    int u = 2 * l + part;
    if (!sp || !is_streamed(sp, u)) {
        *out = &m->layers[l];
        return K3_OK;
    }
    int s, rc = enter(sp, p, u, &s, err);
    if (!rc) *out = &sp->views[s][u];
    return rc;
}

int k3_spine_head(const k3_model *m, k3_spine_pass *p, const k3_mat **out, k3_err *err) {
    k3_spine *sp = m->spine;
    if (!sp || !is_streamed(sp, HEAD_UNIT(sp))) {
        *out = &m->lm_head;
        return K3_OK;
    }
    int s, rc = enter(sp, p, HEAD_UNIT(sp), &s, err);
    if (!rc) *out = &sp->head_view[s];
    return rc;
}

void k3_spine_end(const k3_model *m, k3_spine_pass *p) {
    if (!p->held) return;
    pthread_mutex_unlock(&m->spine->section);
    p->held = false;
}

int k3_spine_embed(const k3_model *m, int32_t token, float *out, k3_err *err) {
    const k3_spine *sp = m->spine;
    int64_t hd = m->cfg.hidden_size;
    if (!sp || !sp->streaming) {
        for (int64_t i = 0; i < hd; i++) out[i] = k3_mat_at(&m->embed, (int64_t)token * hd + i);
        return K3_OK;
    }
    /* the BF16 row lands in the upper half of out and is widened in place, front to back:
     * out[i] overwrites the bytes of rows i - hd/2.., which were already consumed */
    uint16_t *row = (uint16_t *)(out + hd / 2);
    size_t bytes = (size_t)hd * 2, got = 0;
    off_t at = (off_t)(sp->embed_off + (uint64_t)token * bytes);
    while (got < bytes) {
        ssize_t r = pread(sp->embed_fd, (uint8_t *)row + got, bytes - got, at + (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return k3_fail(err, K3_ERR_IO, "%s: reading the embedding row of token %d failed: "
                           "%s", sp->embed_path, token, r < 0 ? strerror(errno)
                           : "the file is shorter than at load (truncated or replaced since)");
        got += (size_t)r;
    }
    for (int64_t i = 0; i < hd; i++) out[i] = k3_bf16_to_f32(row[i]);
    return K3_OK;
}

/* ---- plan and counters ---------------------------------------------------------------------- */

void k3_spine_get_stats(const k3_spine *sp, k3_spine_stats *out) {
    *out = (k3_spine_stats){0};
    if (!sp) return;
    pthread_mutex_t *mu = sp->locks_made ? (pthread_mutex_t *)&sp->mu : NULL;
    if (mu) pthread_mutex_lock(mu);
    *out = (k3_spine_stats){
        .budgeted = 1, .budget_bytes = sp->budget, .n_layers = sp->n_layers,
        .resident_layers = sp->streaming ? sp->first : sp->n_layers,
        .streamed_layers = sp->streaming ? sp->n_layers - sp->first : 0,
        .head_resident = !is_streamed(sp, HEAD_UNIT(sp)),
        .resident_bytes = sp->resident_bytes, .streamed_bytes = sp->streamed_bytes,
        .staging_bytes = sp->streaming ? 2 * sp->slot_bytes : 0,
        .pinned_bytes = sp->pinned_bytes, .direct = sp->streaming && sp->direct,
        .bytes_read = sp->bytes_read, .units_read = sp->units_read, .read_s = sp->read_s,
        .wait_s = sp->wait_s};
    if (mu) pthread_mutex_unlock(mu);
}

uint64_t k3_spine_ram_bytes(const k3_spine *sp, const k3_model *m) {
    if (!sp) return m->spine_bytes;
    return sp->resident_bytes + sp->pinned_bytes + (sp->streaming ? 2 * sp->slot_bytes : 0);
}

/* "3.210 GB" or "0.123 MB". */
static const char *size_str(uint64_t b, char *buf) {
    if (b >= 100000000) snprintf(buf, 32, "%.3f GB", (double)b / 1e9);
    else snprintf(buf, 32, "%.3f MB", (double)b / 1e6);
    return buf;
}

/* "layers 0..5" / "layer 3" / "no layers" into buf [48]. */
static const char *range_str(int from, int to, char *buf) {
    if (to < from) snprintf(buf, 48, "no layers");
    else if (to == from) snprintf(buf, 48, "layer %d", from);
    else snprintf(buf, 48, "layers %d..%d", from, to);
    return buf;
}

void k3_spine_describe(const k3_spine *sp, char *buf, size_t cap) {
    k3_spine_stats st;
    k3_spine_get_stats(sp, &st);
    if (!sp) {
        snprintf(buf, cap, "spine budget: none (the spine is used in place from the mapped "
                 "files)");
        return;
    }
    char b0[32], b1[32], b2[32], b3[32], b4[32], r0[48], r1[48];
    int nr = st.resident_layers;
    bool streams = st.staging_bytes > 0;
    snprintf(buf, cap, "spine budget %s: resident %s%s (%s in place); streamed %s%s (%s per "
             "pass%s); staging 2 x %s, pinned %s%s",
             size_str(st.budget_bytes, b0), range_str(0, nr - 1, r0),
             st.head_resident ? " + lm_head" : "", size_str(st.resident_bytes, b1),
             range_str(nr, st.n_layers - 1, r1), st.head_resident ? "" : " + lm_head",
             size_str(st.streamed_bytes, b2),
             !streams ? "" : st.direct ? ", O_DIRECT, embedding rows by pread"
                                       : ", buffered + DONTNEED, embedding rows by pread",
             size_str(st.staging_bytes / 2, b3), size_str(st.pinned_bytes, b4),
             streams && st.budget_bytes < st.staging_bytes + st.pinned_bytes
                 ? " -- the budget is below staging + pinned, so everything streams" : "");
}
