/* cmd_pack.c — `k3 pack`: writes the int8 packed spine beside a snapshot (format and rule in
 * docs/PACKED-SPINE.md and src/format/packed.h), resumably, then measures what it costs with the
 * quality harness and stores the figures beside it; `--lossless` writes the exact 12-bit spine
 * instead (every tensor decoded and compared with its source before it is marked done) and
 * prints its size and exponent statistics. `--verify` re-checks every checksum. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../format/config.h"
#include "../format/packed.h"
#include "../kernels/kernels.h"
#include "../tok/tokenizer.h"
#include "../util/fileio.h"
#include "../util/parse.h"
#include "cli.h"
#include "interrupt.h"
#include "opts.h"
#include "quality.h"
#include "../util/clock.h"


typedef struct pack_args {
    const char *model_dir, *out_dir, *spine;
    bool verify, quality, verbose, lossless;
    bool out_given;    /* --out DIR (else out_dir is MODEL_DIR) */
    int threads, quality_tokens, limit;
} pack_args;

static const k3_opt_choice pack_schemes[] = {{"int8", 0}, {"lossless", 1}, {NULL, 0}};

#define PACK(f) K3_OPT_CMD(pack_args, f), .field = #f
static const k3_opt pack_rows[] = {
    {.flag = "--spine", PACK(spine), .type = K3_OPT_WORD, .choices = pack_schemes, .def = "int8",
     .meta = "int8|lossless", .help = "int8 (one f32 scale per row, NOT exact) or lossless"},
    {.flag = "--lossless", PACK(lossless), .type = K3_OPT_SWITCH, .value = 1,
     .help = "(= --spine lossless) the exact spine instead: the same matrices in 12 bits per\n"
             "weight (a 4-bit code for the high byte from a table of the 15 most frequent, the\n"
             "low byte, escapes for the rest), decoded inside the kernels to the identical BF16\n"
             "bits; writes " K3_PACK_LX_FILE ", which --spine auto then prefers"},
    {.flag = "--out", PACK(out_dir), .type = K3_OPT_STR, .flags = K3_OPTF_NONEMPTY, .meta = "DIR",
     .help = "write into DIR instead of MODEL_DIR (e.g. a read-only snapshot); then pass\n"
             "--pack-dir DIR to k3 run / k3 quality"},
    {.flag = "--verify", PACK(verify), .type = K3_OPT_SWITCH, .value = 1,
     .help = "check an existing pack: header, table, every tensor's checksum, and that it\n"
             "was packed from MODEL_DIR; writes nothing"},
    {.flag = "--no-quality", PACK(quality), .type = K3_OPT_SWITCH, .value = 0,
     .help = "skip the quality measurement at the end (a re-run also skips it when figures\n"
             "for this very pack are stored; delete " K3_PACK_QUALITY_FILE " to measure again)"},
    {.flag = "--quality-tokens", PACK(quality_tokens), .type = K3_OPT_INT, .lo = 2,
     .hi = 1 << 30, .def = "64", .meta = "N",
     .help = "evaluate the first N tokens of the built-in text"},
    {.flag = "--limit", PACK(limit), .type = K3_OPT_INT, .lo = 1, .hi = 1 << 30, .meta = "N",
     .help = "stop after packing N more tensors (the file stays resumable)"},
};

static const k3_cli_command pack_cmd = {
    .name = "pack",
    .usage =
        "usage: k3 pack MODEL_DIR [--spine int8|lossless] [--lossless] [options]\n"
        "\n"
        "Converts the spine's BF16 matrices (attention, dense and shared-expert projections, the\n"
        "latent projections and lm_head) to int8 with one f32 scale per output row (symmetric\n"
        "absmax, round half to even) and writes " K3_PACK_FILE " beside the snapshot.\n"
        "Norms, conv taps, A_log, dt_bias, the router (weights and bias), the AttnRes\n"
        "projections, the embedding and the routed experts stay as they are. The int8 spine is\n"
        "NOT exact: at the end k3 pack measures it against the exact path on a short built-in\n"
        "text and stores the figures in " K3_PACK_QUALITY_FILE ";\n"
        "k3 run then uses the int8 spine by default (--spine auto, when no lossless pack is\n"
        "there) and prints those figures.\n"
        "An interrupted run (Ctrl-C, crash) resumes where it stopped.\n"
        "Format and rule: docs/PACKED-SPINE.md\n",
    .rows = pack_rows, .n_rows = sizeof pack_rows / sizeof *pack_rows,
    .groups = K3_OG_THREADS | K3_OG_QUIET,
    .max_positional = 1,
};

/* Parses argv through the option table into a. Returns 0, -1 after printing help, or
 * K3_ERR_USAGE. */
static int parse_pack(int argc, char **argv, pack_args *a) {
    *a = (pack_args){.quality = true};
    k3_engine_opts eo; /* --threads: the quality measurement's engines */
    k3_cli_common cc;
    k3_opts_parsed parsed;
    k3_opt_targets t = {.eo = &eo, .cc = &cc, .cmd = a};
    int rc = k3_opts_parse(&pack_cmd, argc, argv, &t, &parsed);
    if (rc) return rc;
    if (!parsed.n_positional) return k3_opts_usage_error(&pack_cmd, "give MODEL_DIR");
    a->model_dir = parsed.positional[0];
    a->threads = eo.threads;
    a->verbose = !cc.quiet;
    if (a->lossless) a->spine = "lossless";
    a->lossless = !strcmp(a->spine, "lossless");
    a->out_given = a->out_dir != NULL;
    if (!a->out_dir) a->out_dir = a->model_dir;
    return 0;
}

/* ---- packing ------------------------------------------------------------------------------- */

/* Quantizes tensor t into q/scale (rows in parallel: each row is independent, so the bytes do
 * not depend on the thread count). Errors: K3_ERR_CHECKPOINT on a non-finite weight. */
static int quantize(const k3_tensor *t, int8_t *q, float *scale, k3_err *err) {
    int64_t rows = t->shape[0], cols = t->shape[1], bad = -1;
    const uint16_t *w = t->data;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        scale[r] = k3_quantize_row_i8(w + r * cols, cols, q + r * cols);
        if (isnan(scale[r])) {
#pragma omp critical
            bad = bad < 0 || r < bad ? r : bad;
        }
    }
    if (bad >= 0)
        return k3_fail(err, K3_ERR_CHECKPOINT, "tensor %s row %lld holds a non-finite value; "
                       "refusing to pack it", t->name, (long long)bad);
    return K3_OK;
}

static int write_all(int fd, const char *path, const void *buf, uint64_t n, uint64_t off,
                     k3_err *err) {
    uint64_t done = 0;
    while (done < n) {
        size_t chunk = n - done > (1u << 30) ? (1u << 30) : (size_t)(n - done);
        ssize_t w = pwrite(fd, (const uint8_t *)buf + done, chunk, (off_t)(off + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return k3_fail(err, K3_ERR_IO, "%s: write failed: %s", path,
                           w < 0 ? strerror(errno) : "no space?");
        done += (uint64_t)w;
    }
    return K3_OK;
}

/* What the lossless packer saw in the tensors it packed in this run (k3 pack prints it). */
typedef struct lx_stats {
    uint64_t weights, escapes, bf16_bytes, packed_bytes;
    uint64_t exp_hist[256], hi_hist[256]; /* exponent (bits 14..7), high byte */
    uint64_t top15_exp;                   /* weights whose exponent is among its tensor's 15 most
                                           * frequent: the exponent-code scheme's coverage */
    uint32_t tensors;
} lx_stats;

static void lx_count(const k3_tensor *t, const k3_pack_entry *e, lx_stats *st) {
    uint64_t n = (uint64_t)e->rows * (uint64_t)e->cols, eh[256] = {0};
    const uint16_t *w = t->data;
    for (uint64_t i = 0; i < n; i++) eh[(w[i] >> 7) & 255]++, st->hi_hist[w[i] >> 8]++;
    uint8_t tab[16], code_of[256];
    k3_lx_table(eh, tab, code_of); /* the same top-15 rule, applied to exponents */
    for (int b = 0; b < 256; b++) {
        st->exp_hist[b] += eh[b];
        if (code_of[b] != K3_LX_ESCAPE) st->top15_exp += eh[b];
    }
    st->weights += n, st->escapes += e->n_esc, st->tensors++;
}

/* Encodes t as entry e says (table and escape count from k3_pack_plan): escape counts per row
 * first, so the rows can then be encoded in parallel into their places; then every row is
 * decoded again and compared with its source (the pack is exact, or it is not written). */
static int encode_lx(const k3_tensor *t, const k3_pack_entry *e, uint8_t *data, uint32_t *esc,
                     k3_err *err) {
    int64_t rows = e->rows, cols = e->cols, bad = -1;
    uint64_t rb = k3_lx_row_bytes(cols), total = 0;
    const uint16_t *w = t->data;
    uint64_t hist[256] = {0};
    uint8_t code_of[256], xtab[16];
    for (uint64_t i = 0; i < (uint64_t)rows * (uint64_t)cols; i++) hist[w[i] >> 8]++;
    k3_lx_table(hist, xtab, code_of); /* the plan's table again: the same rule on the same data */
    if (memcmp(xtab, e->xtab, 16) != 0)
        return k3_fail(err, K3_ERR_CHECKPOINT, "tensor %s changed while packing (its table "
                       "differs from the plan's); run k3 pack again", t->name);
    for (int64_t r = 0; r < rows; r++) {
        esc[r] = (uint32_t)total;
        for (int64_t i = 0; i < cols; i++) total += code_of[w[r * cols + i] >> 8] == K3_LX_ESCAPE;
    }
    esc[rows] = (uint32_t)total;
    if (total != e->n_esc)
        return k3_fail(err, K3_ERR_CHECKPOINT, "tensor %s changed while packing (%llu escapes, "
                       "%u planned)", t->name, (unsigned long long)total, e->n_esc);
    k3_mat m = {.data = data, .dtype = K3_DT_BF16LX, .rows = rows, .cols = cols, .esc = esc,
                .n_esc = e->n_esc};
    memcpy(m.xtab, e->xtab, 16);
#pragma omp parallel
    {
        uint16_t *back = malloc((size_t)cols * sizeof *back);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            k3_lx_encode_row(w + r * cols, cols, code_of, data + (uint64_t)r * rb,
                             esc + rows + 1 + esc[r]);
            if (back) k3_lx_decode_row(&m, r, back);
            if (!back || memcmp(back, w + r * cols, (size_t)cols * sizeof *back) != 0) {
#pragma omp critical
                bad = bad < 0 || r < bad ? r : bad;
            }
        }
        free(back);
    }
    if (bad >= 0)
        return k3_fail(err, K3_ERR_GENERIC, "tensor %s row %lld does not decode to its BF16 "
                       "bits (a bug: please report it); nothing written", t->name, (long long)bad);
    return K3_OK;
}

/* Packs entry e from the checkpoint, syncs it, marks it done in the table. */
static int pack_one(int fd, const char *path, const k3_checkpoint *ck, k3_pack *p,
                    k3_pack_entry *e, lx_stats *st, k3_err *err) {
    const k3_tensor *t = k3_checkpoint_find(ck, e->name);
    if (!t) return k3_fail(err, K3_ERR_CHECKPOINT, "%s: tensor %s vanished", ck->dir, e->name);
    uint64_t na, nb;
    k3_pack_parts(p->scheme, e, &na, &nb);
    void *a = malloc(na ? na : 1), *b = malloc(nb);
    int rc = a && b ? K3_OK : k3_fail(err, K3_ERR_GENERIC, "out of memory");
    if (!rc && p->scheme == K3_PACK_SCHEME_BF16LX) {
        rc = encode_lx(t, e, a, b, err);
        if (!rc) lx_count(t, e, st);
    } else if (!rc) {
        rc = quantize(t, a, b, err);
    }
    if (!rc) rc = write_all(fd, path, a, na, e->q_offset, err);
    if (!rc) rc = write_all(fd, path, b, nb, e->scale_offset, err);
    if (!rc && fdatasync(fd) != 0)
        rc = k3_fail(err, K3_ERR_IO, "%s: sync failed: %s", path, strerror(errno));
    if (!rc) {
        e->checksum = k3_pack_checksum(a, na, b, nb);
        e->done = 1;
        rc = k3_pack_write_meta(fd, path, p, err);
    }
    free(a);
    free(b);
    return rc;
}

/* Opens path.partial, resuming when it holds a plan identical to p (same tensors and source
 * fingerprint): entries already done keep their checksums. Otherwise starts a fresh file. */
static int open_partial(const char *path, k3_pack *p, bool verbose, int *fd_out, k3_err *err) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return k3_fail(err, K3_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    k3_pack old;
    k3_err ignored;
    uint32_t done = 0;
    if (k3_pack_read_meta(fd, path, &old, &ignored) == K3_OK) {
        int same = old.n_tensors == p->n_tensors && !memcmp(old.fingerprint, p->fingerprint, 16);
        for (uint32_t i = 0; same && i < p->n_tensors; i++)
            same = !strcmp(old.entries[i].name, p->entries[i].name) &&
                   old.entries[i].rows == p->entries[i].rows &&
                   old.entries[i].cols == p->entries[i].cols &&
                   old.entries[i].n_esc == p->entries[i].n_esc &&
                   !memcmp(old.entries[i].xtab, p->entries[i].xtab, 16);
        same = same && old.scheme == p->scheme;
        for (uint32_t i = 0; same && i < p->n_tensors; i++)
            if (old.entries[i].done) {
                p->entries[i].done = 1;
                p->entries[i].checksum = old.entries[i].checksum;
                done++;
            }
        k3_pack_clear(&old);
    }
    if (verbose && done)
        fprintf(stderr, "k3 pack: resuming %s: %u of %u tensors already packed\n", path, done,
                p->n_tensors);
    int rc = K3_OK;
    if (ftruncate(fd, (off_t)p->file_bytes) != 0)
        rc = k3_fail(err, K3_ERR_IO, "%s: cannot size to %llu bytes: %s", path,
                     (unsigned long long)p->file_bytes, strerror(errno));
    if (!rc) rc = k3_pack_write_meta(fd, path, p, err);
    if (rc) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return K3_OK;
}

/* Writes every tensor not yet done, then marks the file complete and renames it into place.
 * Returns K3_ERR_INTERRUPTED (file resumable) on SIGINT or when --limit is reached. */
static int pack_all(const pack_args *a, const k3_checkpoint *ck, k3_pack *p, const char *final,
                    lx_stats *st, k3_err *err) {
    char partial[PATH_MAX + 16];
    snprintf(partial, sizeof partial, "%s.partial", final);
    int fd = -1, rc = open_partial(partial, p, a->verbose, &fd, err), packed = 0;
    bool progress = a->verbose && isatty(STDERR_FILENO);
    uint64_t total = 0, done_bytes = 0;
    for (uint32_t i = 0; i < p->n_tensors; i++)
        total += (uint64_t)p->entries[i].rows * (uint64_t)p->entries[i].cols;
    for (uint32_t i = 0; i < p->n_tensors && !rc; i++) {
        k3_pack_entry *e = &p->entries[i];
        done_bytes += (uint64_t)e->rows * (uint64_t)e->cols;
        if (e->done) continue;
        if (k3_cli_interrupted || (a->limit && packed == a->limit)) {
            rc = k3_fail(err, K3_ERR_INTERRUPTED, "stopped with %u of %u tensors packed; run "
                         "k3 pack again to resume", i, p->n_tensors);
            break;
        }
        rc = pack_one(fd, partial, ck, p, e, st, err);
        packed++;
        if (progress)
            fprintf(stderr, "\rk3 pack: %3.0f%% [%u/%u] %-60.60s", 100.0 * done_bytes / total,
                    i + 1, p->n_tensors, e->name);
    }
    if (progress && packed) fprintf(stderr, "\n");
    if (!rc) {
        p->complete = 1;
        rc = k3_pack_write_meta(fd, partial, p, err);
    }
    if (!rc && fsync(fd) != 0) rc = k3_fail(err, K3_ERR_IO, "%s: sync failed", partial);
    if (fd >= 0) close(fd);
    if (!rc && rename(partial, final) != 0)
        rc = k3_fail(err, K3_ERR_IO, "cannot rename %s to %s: %s", partial, final, strerror(errno));
    return rc;
}

/* ---- quality and verify -------------------------------------------------------------------- */

/* Measures the int8 spine, alone and with --approx, on the built-in text ([BOS] first)
 * against the exact path, prints the table and stores the figures beside the pack. */
static int measure(const pack_args *a, const k3_pack *p, k3_err *err) {
    k3_tokenizer *tok = NULL;
    k3_config cfg;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = k3_config_load(a->model_dir, &cfg, err);
    if (!rc) rc = k3_tokenizer_load(a->model_dir, &tok, err);
    if (!rc) rc = k3_tokenizer_encode(tok, k3_quality_builtin_text, strlen(k3_quality_builtin_text),
                                      false, &ids, &n, err);
    k3_tokenizer_free(tok);
    if (rc) return rc;
    int32_t *b = realloc(ids, (n + 1) * sizeof *ids);
    if (!b) {
        free(ids);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    memmove(b + 1, b, n * sizeof *b);
    b[0] = cfg.bos_token_id;
    n = n + 1 < (size_t)a->quality_tokens ? n + 1 : (size_t)a->quality_tokens;
    if (a->verbose)
        fprintf(stderr, "k3 pack: measuring the int8 spine (alone and with --approx) against "
                "the exact path on %zu tokens of built-in text\n", n);
    k3_quality_opts o = {.model_dir = a->model_dir, .pack_dir = a->out_dir,
                         .base = k3_engine_opts_default()};
    o.base.threads = a->threads; /* 0: OpenMP's own count (OMP_NUM_THREADS) */
    int modes[2] = {K3_QMODE_INT8, K3_QMODE_APPROX};
    k3_quality_row rows[3];
    rc = k3_quality_eval(&o, b, n, modes, 2, rows, err);
    free(b);
    if (rc) return rc;
    k3_quality_print(stdout, rows, 3);
    k3_pack_quality q = {.pack_checksum = p->header_checksum,
                         .predictions = rows[0].predictions,
                         .nll_exact = rows[0].nll,
                         .ppl_exact = rows[0].ppl,
                         .has_approx = 1};
    k3_pack_figures *g[2] = {&q.int8, &q.approx};
    for (int m = 0; m < 2; m++)
        *g[m] = (k3_pack_figures){rows[1 + m].nll, rows[1 + m].ppl, rows[1 + m].mean_kl,
                                  rows[1 + m].top1, rows[1 + m].max_abs_dlogit};
    char path[PATH_MAX];
    k3_path_join(path, sizeof path, a->out_dir, K3_PACK_QUALITY_FILE);
    rc = k3_pack_quality_write(path, &q, err);
    if (!rc) printf("k3 pack: quality figures stored in %s\n", path);
    return rc;
}

/* Whether figures for exactly this pack are already stored (a re-run does not re-measure). */
static bool has_figures(const char *dir, const k3_pack *p, bool verbose) {
    char path[PATH_MAX];
    k3_pack_quality q;
    k3_err ignored;
    k3_path_join(path, sizeof path, dir, K3_PACK_QUALITY_FILE);
    if (k3_pack_quality_read(path, &q, &ignored) || q.pack_checksum != p->header_checksum ||
        !q.has_approx)
        return false;
    if (verbose) fprintf(stderr, "k3 pack: quality figures already stored in %s\n", path);
    return true;
}

static int verify(const char *final, uint32_t scheme, const k3_checkpoint *ck, k3_err *err) {
    k3_pack *p = NULL;
    int rc = k3_pack_open(final, &p, err);
    if (!rc) rc = k3_pack_check_scheme(p, scheme, err);
    if (!rc) rc = k3_pack_check_model(p, ck, err);
    if (!rc) rc = k3_pack_verify(p, err);
    if (!rc)
        printf("k3 pack: %s is intact: %u tensors, %llu bytes, every checksum matches, packed "
               "from %s\n", final, p->n_tensors, (unsigned long long)p->file_bytes, ck->dir);
    k3_pack_close(p);
    return rc;
}

/* The pack at final, when it is complete and belongs to ck; NULL otherwise (to rebuild). */
static k3_pack *existing(const char *final, uint32_t scheme, const k3_checkpoint *ck,
                         bool verbose) {
    k3_pack *p = NULL;
    k3_err e;
    if (access(final, F_OK) != 0) return NULL;
    if (k3_pack_open(final, &p, &e) == K3_OK && k3_pack_check_scheme(p, scheme, &e) == K3_OK &&
        k3_pack_check_model(p, ck, &e) == K3_OK)
        return p;
    if (verbose) fprintf(stderr, "k3 pack: rebuilding %s: %s\n", final, e.msg);
    k3_pack_close(p);
    return NULL;
}

static double entropy_bits(const uint64_t h[256]) {
    double n = 0, s = 0;
    for (int b = 0; b < 256; b++) n += (double)h[b];
    for (int b = 0; b < 256; b++)
        if (h[b]) s -= (double)h[b] / n * log2((double)h[b] / n);
    return s;
}

/* "lossless spine: N bytes, R% of BF16" and what the tensors packed in this run looked like. */
static void lx_report(const k3_pack *p, const lx_stats *st) {
    uint64_t bf16 = 0, payload = 0;
    for (uint32_t i = 0; i < p->n_tensors; i++) {
        uint64_t a, b;
        k3_pack_parts(p->scheme, &p->entries[i], &a, &b);
        payload += a + b;
        bf16 += 2 * (uint64_t)p->entries[i].rows * (uint64_t)p->entries[i].cols;
    }
    printf("lossless spine: %llu bytes, %.2f%% of BF16 (%llu BF16 bytes in %u matrices; the file "
           "with its 4 KiB alignment: %llu bytes, %.2f%%)\n", (unsigned long long)payload,
           100.0 * (double)payload / (double)bf16, (unsigned long long)bf16, p->n_tensors,
           (unsigned long long)p->file_bytes, 100.0 * (double)p->file_bytes / (double)bf16);
    if (!st->weights) return;
    int distinct = 0;
    for (int b = 0; b < 256; b++) distinct += st->exp_hist[b] != 0;
    printf("lossless spine: %s%u matrices, %llu weights: escapes %.4f%%; entropy of the exponent "
           "%.3f bits (%d distinct values, its 15 most frequent per matrix cover %.4f%%), of the "
           "high byte %.3f bits\n", st->tensors < p->n_tensors ? "packed in this run: " : "",
           st->tensors, (unsigned long long)st->weights,
           100.0 * (double)st->escapes / (double)st->weights, entropy_bits(st->exp_hist),
           distinct, 100.0 * (double)st->top15_exp / (double)st->weights,
           entropy_bits(st->hi_hist));
}

static int pack(const pack_args *a, k3_err *err) {
    double t0 = k3_now_s();
    k3_checkpoint *ck = NULL;
    k3_pack plan = {0}, *done = NULL;
    char final[PATH_MAX];
    uint32_t scheme = a->lossless ? K3_PACK_SCHEME_BF16LX : K3_PACK_SCHEME_INT8_ROW;
    lx_stats *st = calloc(1, sizeof *st);
    if (!st) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    k3_path_join(final, sizeof final, a->out_dir, a->lossless ? K3_PACK_LX_FILE : K3_PACK_FILE);
    int rc = k3_checkpoint_open(a->model_dir, &ck, err);
    if (!rc && a->verify) {
        free(st);
        rc = verify(final, scheme, ck, err);
        k3_checkpoint_close(ck);
        return rc;
    }
    if (!rc && !a->verify && a->out_given && access(a->out_dir, F_OK) != 0 &&
        mkdir(a->out_dir, 0777) != 0) /* --out DIR that does not exist yet: create it */
        rc = k3_fail(err, K3_ERR_IO, "--out %s: the folder does not exist and cannot be "
                     "created: %s", a->out_dir, strerror(errno));
    if (!rc && access(a->out_dir, W_OK) != 0)
        rc = a->out_given ? k3_fail(err, K3_ERR_IO, "--out %s: not writable (%s); give a "
                                    "writable folder", a->out_dir, strerror(errno))
                          : k3_fail(err, K3_ERR_IO, "%s: not writable (%s); give --out DIR "
                                    "for the pack", a->out_dir, strerror(errno));
    if (!rc && !(done = existing(final, scheme, ck, a->verbose))) {
        rc = k3_pack_plan(ck, scheme, &plan, err);
        /* Ctrl-C: the packer stops after the tensor in progress (the file stays resumable) */
        k3_cli_catch_signals(K3_CLI_SIG_RESTART);
        if (!rc) rc = pack_all(a, ck, &plan, final, st, err);
        k3_cli_default_sigint();
        if (!rc) rc = k3_pack_open(final, &done, err);
        if (!rc && a->verbose)
            fprintf(stderr, "k3 pack: wrote %s: %u tensors, %.3f GB in %.1f s\n", final,
                    done->n_tensors, (double)done->file_bytes / 1e9, k3_now_s() - t0);
    } else if (!rc && a->verbose) {
        fprintf(stderr, "k3 pack: %s is already complete for this model\n", final);
    }
    k3_checkpoint_close(ck);
    k3_pack_clear(&plan);
    if (!rc && a->lossless) lx_report(done, st); /* exact: nothing to measure */
    free(st);
    if (!rc && !a->lossless && a->quality && !has_figures(a->out_dir, done, a->verbose))
        rc = measure(a, done, err);
    k3_pack_close(done);
    return rc;
}

int k3_cmd_pack(int argc, char **argv) {
    pack_args a;
    int rc = parse_pack(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    /* a name: its folder */
    if ((rc = k3_model_arg("k3 pack", a.model_dir, &a.model_dir))) return rc;
    if (!a.out_given) a.out_dir = a.model_dir;
    k3_err err = {0};
    rc = pack(&a, &err);
    if (rc) k3_opts_error("pack", &err);
    return rc;
}
