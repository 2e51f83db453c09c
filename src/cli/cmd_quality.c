/* cmd_quality.c — `k3 quality`: teacher-forced NLL/perplexity per spine mode and the
 * distance of each mode's next-token distributions from the exact path (see quality.h). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine/k3.h"
#include "../format/packed.h"
#include "../tok/tokenizer.h"
#include "../util/fileio.h"
#include "cli.h"
#include "idlist.h"
#include "quality.h"
#include "opts.h"

const char k3_quality_builtin_text[] =
    "The quick brown fox jumps over the lazy dog. In 1687 Isaac Newton published the "
    "Principia, which set out the laws of motion and universal gravitation. Water boils at "
    "100 degrees Celsius at sea level; higher up it boils at a lower temperature, because the "
    "air pressure is lower.\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n";

/* ---- evaluation ---------------------------------------------------------------------------- */

static const char *const MODE_NAMES[] = {"bf16", "int8", "approx"};

typedef struct mode_run {
    k3_engine *e;
    k3_session *s;
    float *logits;
    double nll_sum, kl_sum, max_d;
    int agree;
} mode_run;

static void softmax_stats(const float *l, int v, double *lse, int *arg) {
    int a = 0;
    for (int i = 1; i < v; i++)
        if (l[i] > l[a]) a = i;
    double m = l[a], s = 0;
    for (int i = 0; i < v; i++) s += exp((double)l[i] - m);
    *lse = m + log(s);
    *arg = a;
}

/* Adds one position's figures of mode r against the reference logits ref. */
static void compare(mode_run *r, const float *ref, double ref_lse, int ref_arg, int v, int next) {
    double lse;
    int arg;
    softmax_stats(r->logits, v, &lse, &arg);
    r->nll_sum += lse - (double)r->logits[next];
    r->agree += arg == ref_arg;
    double kl = 0;
    for (int i = 0; i < v; i++) {
        double lp = (double)ref[i] - ref_lse, lq = (double)r->logits[i] - lse;
        kl += exp(lp) * (lp - lq);
        double d = fabs((double)r->logits[i] - (double)ref[i]);
        if (d > r->max_d) r->max_d = d;
    }
    r->kl_sum += kl;
}

/* Every mode is its own engine; routed experts are used in place from the mapped shards, so
 * the engines share the page cache instead of each filling an expert cache of its own (the
 * store's results are bit-identical either way). */
static int load_mode(const k3_quality_opts *o, int mode, int ctx, mode_run *r, k3_err *err) {
    k3_engine_opts eo = o->base;
    eo.spine = mode == K3_QMODE_BF16 ? K3_SPINE_BF16 : K3_SPINE_INT8;
    eo.pack_dir = o->pack_dir;
    eo.experts_in_place = 1;
    eo.approx = mode == K3_QMODE_APPROX;
    eo.ctx = ctx; /* the plan counts the session at its context */
    int rc = k3_engine_load(o->model_dir, &eo, &r->e, err);
    if (!rc) rc = k3_session_new(r->e, ctx, &r->s, err);
    if (!rc && !(r->logits = malloc((size_t)k3_engine_config(r->e)->vocab_size * sizeof(float))))
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    return rc;
}

static void free_mode(mode_run *r) {
    free(r->logits);
    k3_session_free(r->s);
    k3_engine_free(r->e);
}

static void fill_row(k3_quality_row *row, const char *name, const mode_run *r, int n, bool ref) {
    row->mode = name;
    row->predictions = n;
    row->nll = r->nll_sum / n;
    row->ppl = exp(row->nll);
    row->mean_kl = ref ? NAN : r->kl_sum / n;
    row->top1 = ref ? NAN : (double)r->agree / n;
    row->max_abs_dlogit = ref ? NAN : r->max_d;
}

int k3_quality_eval(const k3_quality_opts *o, const int32_t *ids, size_t n, const int *modes,
                    int n_modes, k3_quality_row *rows, k3_err *err) {
    if (n < 2) return k3_fail(err, K3_ERR_USAGE, "need at least 2 tokens to evaluate, got %zu", n);
    if (n > INT_MAX) return k3_fail(err, K3_ERR_INPUT, "too many tokens");
    mode_run *r = calloc((size_t)n_modes + 1, sizeof *r);
    if (!r) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    int rc = load_mode(o, K3_QMODE_BF16, (int)n, &r[0], err);
    for (int j = 0; j < n_modes && !rc; j++) rc = load_mode(o, modes[j], (int)n, &r[1 + j], err);
    int v = rc ? 0 : k3_engine_config(r[0].e)->vocab_size;
    for (size_t i = 0; i + 1 < n && !rc; i++) {
        for (int j = 0; j <= n_modes && !rc; j++)
            rc = k3_session_step(r[j].s, ids[i], r[j].logits, err);
        if (rc) break;
        double lse;
        int arg;
        softmax_stats(r[0].logits, v, &lse, &arg);
        r[0].nll_sum += lse - (double)r[0].logits[ids[i + 1]];
        for (int j = 1; j <= n_modes; j++) compare(&r[j], r[0].logits, lse, arg, v, ids[i + 1]);
    }
    if (!rc) {
        fill_row(&rows[0], "exact", &r[0], (int)n - 1, true);
        for (int j = 0; j < n_modes; j++)
            fill_row(&rows[1 + j], MODE_NAMES[modes[j]], &r[1 + j], (int)n - 1, false);
    }
    for (int j = 0; j <= n_modes; j++) free_mode(&r[j]);
    free(r);
    return rc;
}

void k3_quality_print(FILE *f, const k3_quality_row *rows, int n_rows) {
    fprintf(f, "%-6s %11s %10s %12s %10s %8s %12s\n", "mode", "predictions", "NLL/token",
            "perplexity", "mean KL", "top-1", "max|dlogit|");
    for (int i = 0; i < n_rows; i++) {
        const k3_quality_row *q = &rows[i];
        fprintf(f, "%-6s %11d %10.6f %12.6g ", q->mode, q->predictions, q->nll, q->ppl);
        if (isnan(q->mean_kl))
            fprintf(f, "%10s %8s %12s\n", "(ref)", "", "");
        else
            fprintf(f, "%10.3g %7.2f%% %12.4g\n", q->mean_kl, 100 * q->top1, q->max_abs_dlogit);
    }
}

/* ---- the command --------------------------------------------------------------------------- */

typedef struct quality_args {
    const char *model_dir, *text_file, *ids, *json, *modes;
    bool builtin, bos;
    int max_tokens;
    k3_engine_opts eo; /* --threads, --kernels, --device, --pack-dir, --spine-gb (opts.h) */
    k3_cli_common cc;
} quality_args;

#define QA(f) K3_OPT_CMD(quality_args, f), .field = #f
static const k3_opt quality_rows[] = {
    {.flag = "--text", QA(text_file), .type = K3_OPT_STR, .meta = "FILE",
     .help = "evaluate the text of FILE (UTF-8, tokenized as ordinary text)"},
    {.flag = "--ids", QA(ids), .type = K3_OPT_STR, .meta = "IDS",
     .help = "evaluate these token ids, separated by commas and/or spaces (k3 tokenize\n"
             "output reads back as it is)"},
    {.flag = "--builtin", QA(builtin), .type = K3_OPT_SWITCH, .value = 1,
     .help = "evaluate the short built-in text k3 pack uses"},
    {.flag = "--bos", QA(bos), .type = K3_OPT_SWITCH, .value = 1,
     .help = "put [BOS] (config bos_token_id) before the tokens"},
    {.flag = "--max-tokens", QA(max_tokens), .type = K3_OPT_INT, .lo = 2, .hi = 1 << 30,
     .def = "512", .meta = "N", .help = "use at most the first N tokens"},
    {.flag = "--modes", QA(modes), .type = K3_OPT_STR, .meta = "LIST",
     .help = "comma-separated modes among bf16, int8, approx (default: bf16, and int8\n"
             "when a packed spine exists); bf16 vs the exact path must give KL 0 and 100%\n"
             "agreement: it checks the harness itself; approx is int8 with int8\n"
             "activations (k3 run --approx)"},
    {.flag = "--json", QA(json), .type = K3_OPT_STR, .meta = "FILE",
     .help = "also write the figures as JSON to FILE"},
};

static const k3_cli_command quality_cmd = {
    .name = "quality",
    .usage =
        "usage: k3 quality [MODEL_DIR] (--text FILE | --ids IDS | --builtin) [options]\n"
        "\n"
        "Teacher-forced evaluation: feeds the tokens one by one and, at every position, compares\n"
        "the next-token distribution of each mode with the exact float32 path (BF16 spine).\n"
        "Prints, per mode, mean NLL/token (nats), perplexity, mean KL(exact || mode), top-1\n"
        "agreement and max |logit difference|. Without MODEL_DIR the bundled fixture is used.\n"
        "Experts are used in place from the mapped shards (every engine shares the page cache).\n",
    .rows = quality_rows, .n_rows = sizeof quality_rows / sizeof *quality_rows,
    .groups = K3_OG_DEVICE | K3_OG_THREADS | K3_OG_KERNELS | K3_OG_BUDGET | K3_OG_QUIET,
    .max_positional = 1,
};

static int parse_quality(int argc, char **argv, quality_args *a) {
    *a = (quality_args){0};
    k3_opts_parsed p;
    k3_opt_targets t = {.eo = &a->eo, .cc = &a->cc, .cmd = a};
    int rc = k3_opts_parse(&quality_cmd, argc, argv, &t, &p);
    if (rc) return rc;
    if ((rc = k3_model_arg("k3 quality", p.n_positional ? p.positional[0] : NULL, &a->model_dir)))
        return rc;
    a->eo.verbose = !a->cc.quiet;
    if ((a->text_file != NULL) + (a->ids != NULL) + a->builtin != 1) {
        fprintf(stderr, "k3 quality: give exactly one of --text, --ids or --builtin\n");
        return K3_ERR_USAGE;
    }
    return 0;
}

/* --modes, or the default: bf16, plus int8 when a pack exists. */
static int parse_modes(const quality_args *a, int *modes, int *n, k3_err *err) {
    *n = 0;
    if (!a->modes) {
        char p[PATH_MAX];
        modes[(*n)++] = K3_QMODE_BF16;
        k3_path_join(p, sizeof p, a->eo.pack_dir ? a->eo.pack_dir : a->model_dir, K3_PACK_FILE);
        if (access(p, F_OK) == 0) modes[(*n)++] = K3_QMODE_INT8;
        return K3_OK;
    }
    const char *s = a->modes;
    while (*s && *n < 8) {
        size_t len = strcspn(s, ",");
        if (len == 6 && !strncmp(s, "approx", 6)) modes[(*n)++] = K3_QMODE_APPROX;
        else if (len == 4 && !strncmp(s, "bf16", 4)) modes[(*n)++] = K3_QMODE_BF16;
        else if (len == 4 && !strncmp(s, "int8", 4)) modes[(*n)++] = K3_QMODE_INT8;
        else
            return k3_fail(err, K3_ERR_USAGE, "--modes: '%s' is not a list of bf16, int8, "
                           "approx", a->modes);
        s += len + (s[len] == ',');
    }
    return *n ? K3_OK : k3_fail(err, K3_ERR_USAGE, "--modes is empty");
}

/* The evaluated ids: text (file or built-in) or --ids, optional [BOS], at most max_tokens. */
static int load_ids(const quality_args *a, int32_t **ids, size_t *n, k3_err *err) {
    k3_tokenizer *tok = NULL;
    k3_config cfg;
    char *text = NULL;
    size_t len = 0;
    int rc = k3_config_load(a->model_dir, &cfg, err);
    if (!rc && a->ids)
        rc = k3_cli_parse_ids(a->ids, strlen(a->ids), "--ids", 0, cfg.vocab_size, ids, n, err);
    if (!rc && !a->ids) {
        rc = k3_tokenizer_load(a->model_dir, &tok, err);
        if (!rc && a->text_file) rc = k3_read_file(a->text_file, 256u << 20, &text, &len, err);
        const char *t = a->text_file ? text : k3_quality_builtin_text;
        size_t tlen = a->text_file ? len : strlen(t);
        if (!rc) rc = k3_tokenizer_encode(tok, t, tlen, false, ids, n, err);
    }
    free(text);
    k3_tokenizer_free(tok);
    if (rc) return rc;
    if (a->bos) {
        int32_t *b = realloc(*ids, (*n + 1) * sizeof **ids);
        if (!b) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
        memmove(b + 1, b, *n * sizeof *b);
        b[0] = cfg.bos_token_id;
        *ids = b;
        (*n)++;
    }
    if (*n > (size_t)a->max_tokens) *n = (size_t)a->max_tokens;
    return K3_OK;
}

static int write_json(const char *path, const quality_args *a, const k3_quality_row *rows,
                      int n_rows, k3_err *err) {
    FILE *f = fopen(path, "w");
    if (!f) return k3_fail(err, K3_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    fprintf(f, "{\n  \"format\": \"k3-quality/1\",\n  \"predictions\": %d,\n  \"reference\": "
            "\"exact float32, BF16 spine\",\n  \"modes\": [\n", rows[0].predictions);
    for (int i = 0; i < n_rows; i++) {
        const k3_quality_row *q = &rows[i];
        fprintf(f, "    {\"mode\": \"%s\", \"nll\": %.17g, \"perplexity\": %.17g", q->mode, q->nll,
                q->ppl);
        if (!isnan(q->mean_kl))
            fprintf(f, ", \"mean_kl\": %.17g, \"top1_agreement\": %.17g, \"max_abs_dlogit\": "
                    "%.17g", q->mean_kl, q->top1, q->max_abs_dlogit);
        fprintf(f, "}%s\n", i + 1 < n_rows ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    (void)a;
    if (fclose(f) != 0) return k3_fail(err, K3_ERR_IO, "%s: write failed", path);
    return K3_OK;
}

int k3_cmd_quality(int argc, char **argv) {
    quality_args a;
    int rc = parse_quality(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    k3_err err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    int modes[8], n_modes = 0;
    k3_quality_row rows[9];
    k3_quality_opts o = {a.model_dir, a.eo.pack_dir, a.eo};
    rc = parse_modes(&a, modes, &n_modes, &err);
    if (!rc) rc = load_ids(&a, &ids, &n, &err);
    if (!rc) rc = k3_quality_eval(&o, ids, n, modes, n_modes, rows, &err);
    if (!rc) k3_quality_print(stdout, rows, n_modes + 1);
    if (!rc && a.json) rc = write_json(a.json, &a, rows, n_modes + 1, &err);
    free(ids);
    if (rc) k3_opts_error("quality", &err);
    return rc;
}
