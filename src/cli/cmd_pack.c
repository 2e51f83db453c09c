/* cmd_pack.c — `k3 pack`: writes the int8 packed spine beside a snapshot (format and rule in
 * docs/PACKED-SPINE.md and src/format/packed.h), resumably, then measures what it costs with the
 * quality harness and stores the figures beside it. `--verify` re-checks every checksum. */
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
#include "quality.h"
#include "../util/clock.h"


typedef struct pack_args {
    const char *model_dir, *out_dir, *spine;
    bool verify, quality, verbose;
    bool out_given;    /* --out DIR (else out_dir is MODEL_DIR) */
    int threads, quality_tokens, limit;
} pack_args;

static void pack_usage(FILE *f) {
    fprintf(f,
        "usage: k3 pack MODEL_DIR [--spine int8] [options]\n"
        "\n"
        "Converts the spine's BF16 matrices (attention, dense and shared-expert projections, the\n"
        "latent projections and lm_head) to int8 with one f32 scale per output row (symmetric\n"
        "absmax, round half to even) and writes " K3_PACK_FILE " beside the snapshot.\n"
        "Norms, conv taps, A_log, dt_bias, the router (weights and bias), the AttnRes\n"
        "projections, the embedding and the routed experts stay as they are. The int8 spine is\n"
        "NOT exact: at the end k3 pack measures it against the exact path on a short built-in\n"
        "text and stores the figures in " K3_PACK_QUALITY_FILE ";\n"
        "k3 run then uses the int8 spine by default (--spine auto) and prints those figures.\n"
        "An interrupted run (Ctrl-C, crash) resumes where it stopped.\n"
        "Format and rule: docs/PACKED-SPINE.md\n"
        "\n"
        "  --spine int8        the only packing scheme (default)\n"
        "  --out DIR           write into DIR instead of MODEL_DIR (e.g. a read-only snapshot);\n"
        "                      then pass --pack-dir DIR to k3 run / k3 quality\n"
        "  --verify            check an existing pack: header, table, every tensor's checksum,\n"
        "                      and that it was packed from MODEL_DIR; writes nothing\n"
        "  --no-quality        skip the quality measurement at the end (a re-run also skips\n"
        "                      it when figures for this very pack are stored; delete\n"
        "                      " K3_PACK_QUALITY_FILE " to measure again)\n"
        "  --quality-tokens N  evaluate the first N tokens of the built-in text (default 64)\n"
        "  --limit N           stop after packing N more tensors (the file stays resumable)\n"
        "  --threads N         threads (default: OMP_NUM_THREADS or all cores)\n"
        "  -q, --quiet         no progress on stderr\n"
        "  -h, --help          this help\n");
}

static int parse_int(const char *s, const char *flag, int lo, int *out) {
    k3_err err = {0};
    if (!k3_parse_int(s, flag, lo, 1 << 30, out, &err)) return 0;
    fprintf(stderr, "k3 pack: %s\n", err.msg);
    return K3_ERR_USAGE;
}

static int parse_pack(int argc, char **argv, pack_args *a) {
    *a = (pack_args){.quality = true, .verbose = true, .quality_tokens = 64, .spine = "int8"};
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        bool v = i + 1 < argc;
        int rc = 0;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) { pack_usage(stdout); return -1; }
        else if (!strcmp(s, "--verify")) a->verify = true;
        else if (!strcmp(s, "--no-quality")) a->quality = false;
        else if (!strcmp(s, "-q") || !strcmp(s, "--quiet")) a->verbose = false;
        else if (!strcmp(s, "--out") && v) a->out_dir = argv[++i];
        else if (!strcmp(s, "--spine") && v) a->spine = argv[++i];
        else if (!strcmp(s, "--quality-tokens") && v)
            rc = parse_int(argv[++i], s, 2, &a->quality_tokens);
        else if (!strcmp(s, "--limit") && v) rc = parse_int(argv[++i], s, 1, &a->limit);
        else if (!strcmp(s, "--threads") && v) rc = parse_int(argv[++i], s, 1, &a->threads);
        else if (s[0] != '-' && !a->model_dir) a->model_dir = s;
        else {
            fprintf(stderr, "k3 pack: unknown option or missing value: '%s' (see k3 pack "
                    "--help)\n", s);
            return K3_ERR_USAGE;
        }
        if (rc) return rc;
    }
    if (!a->model_dir) {
        fprintf(stderr, "k3 pack: give MODEL_DIR (see k3 pack --help)\n");
        return K3_ERR_USAGE;
    }
    if (strcmp(a->spine, "int8") != 0) {
        fprintf(stderr, "k3 pack: --spine %s: only int8 is supported\n", a->spine);
        return K3_ERR_USAGE;
    }
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

/* Packs entry e from the checkpoint, syncs it, marks it done in the table. */
static int pack_one(int fd, const char *path, const k3_checkpoint *ck, k3_pack *p,
                    k3_pack_entry *e, k3_err *err) {
    const k3_tensor *t = k3_checkpoint_find(ck, e->name);
    if (!t) return k3_fail(err, K3_ERR_CHECKPOINT, "%s: tensor %s vanished", ck->dir, e->name);
    uint64_t n = (uint64_t)e->rows * (uint64_t)e->cols;
    int8_t *q = malloc(n);
    float *scale = malloc((size_t)e->rows * sizeof *scale);
    int rc = q && scale ? quantize(t, q, scale, err)
                        : k3_fail(err, K3_ERR_GENERIC, "out of memory");
    if (!rc) rc = write_all(fd, path, q, n, e->q_offset, err);
    if (!rc) rc = write_all(fd, path, scale, (uint64_t)e->rows * 4, e->scale_offset, err);
    if (!rc && fdatasync(fd) != 0)
        rc = k3_fail(err, K3_ERR_IO, "%s: sync failed: %s", path, strerror(errno));
    if (!rc) {
        e->checksum = k3_pack_checksum(q, n, scale, e->rows);
        e->done = 1;
        rc = k3_pack_write_meta(fd, path, p, err);
    }
    free(q);
    free(scale);
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
                   old.entries[i].cols == p->entries[i].cols;
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
                    k3_err *err) {
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
        rc = pack_one(fd, partial, ck, p, e, err);
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
    if (a->threads) o.base.threads = a->threads;
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

static int verify(const char *final, const k3_checkpoint *ck, k3_err *err) {
    k3_pack *p = NULL;
    int rc = k3_pack_open(final, &p, err);
    if (!rc) rc = k3_pack_check_model(p, ck, err);
    if (!rc) rc = k3_pack_verify(p, err);
    if (!rc)
        printf("k3 pack: %s is intact: %u tensors, %llu bytes, every checksum matches, packed "
               "from %s\n", final, p->n_tensors, (unsigned long long)p->file_bytes, ck->dir);
    k3_pack_close(p);
    return rc;
}

/* The pack at final, when it is complete and belongs to ck; NULL otherwise (to rebuild). */
static k3_pack *existing(const char *final, const k3_checkpoint *ck, bool verbose) {
    k3_pack *p = NULL;
    k3_err e;
    if (access(final, F_OK) != 0) return NULL;
    if (k3_pack_open(final, &p, &e) == K3_OK && k3_pack_check_model(p, ck, &e) == K3_OK) return p;
    if (verbose) fprintf(stderr, "k3 pack: rebuilding %s: %s\n", final, e.msg);
    k3_pack_close(p);
    return NULL;
}

static int pack(const pack_args *a, k3_err *err) {
    double t0 = k3_now_s();
    k3_checkpoint *ck = NULL;
    k3_pack plan = {0}, *done = NULL;
    char final[PATH_MAX];
    k3_path_join(final, sizeof final, a->out_dir, K3_PACK_FILE);
    int rc = k3_checkpoint_open(a->model_dir, &ck, err);
    if (!rc && a->verify) {
        rc = verify(final, ck, err);
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
    if (!rc && !(done = existing(final, ck, a->verbose))) {
        rc = k3_pack_plan(ck, &plan, err);
        /* Ctrl-C: the packer stops after the tensor in progress (the file stays resumable) */
        k3_cli_catch_signals(K3_CLI_SIG_RESTART);
        if (!rc) rc = pack_all(a, ck, &plan, final, err);
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
    if (!rc && a->quality && !has_figures(a->out_dir, done, a->verbose))
        rc = measure(a, done, err);
    k3_pack_close(done);
    return rc;
}

int k3_cmd_pack(int argc, char **argv) {
    pack_args a;
    int rc = parse_pack(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    if ((rc = k3_model_arg("pack", a.model_dir, &a.model_dir))) return rc; /* a name: its folder */
    if (!a.out_given) a.out_dir = a.model_dir;
    k3_err err = {0};
    rc = pack(&a, &err);
    if (rc) fprintf(stderr, "k3 pack: %s\n", err.msg);
    return rc;
}
