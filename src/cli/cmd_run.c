/* cmd_run.c — `k3 run`: tokenize, prefill, greedy decode, stream text. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../engine/k3.h"
#include "../tok/tokenizer.h"
#include "cli.h"
#include "store_flags.h"

typedef struct run_opts {
    const char *model_dir, *prompt, *prompt_ids, *dump_logits, *pack_dir;
    int spine; /* enum k3_spine_mode; the CLI default is auto */
    int max_new, threads, ctx;
    bool special, print_ids, verbose;
    k3_cli_store_opts so;            /* expert store flags (store_flags.h) */
} run_opts;

static void run_usage(FILE *f) {
    fprintf(f,
        "usage: k3 run [MODEL_DIR] (--prompt TEXT | --prompt-ids IDS) [options]\n"
        "\n"
        "Generates greedily (argmax) from the exact float32 model and prints text as each\n"
        "token is produced. Stops after --max-new tokens or at an end-of-message token\n"
        "(<|end_of_msg|> or [EOS]). Without MODEL_DIR the bundled fixture model is used.\n"
        "\n"
        "  --prompt TEXT        prompt text (UTF-8); no [BOS] is added\n"
        "  --special            let special-token spellings in TEXT (e.g. [BOS], <|sep|>)\n"
        "                       become their ids (default: they are ordinary text)\n"
        "  --prompt-ids IDS     comma-separated token ids instead of --prompt\n"
        "  --max-new N          generate at most N tokens (default 128)\n"
        "  --ids                print the generated ids (one line, comma-separated), not text\n"
        "  --dump-logits FILE   write float32 little-endian logits, row-major [rows, vocab]:\n"
        "                       row i = the logits after position i, for every prompt position\n"
        "                       and every generated token fed back (shape printed to stderr)\n"
        "  --threads N          compute threads (default: OMP_NUM_THREADS or all cores)\n"
        "  --ctx N              context capacity in tokens (default min(4096, model max))\n"
        "  --spine MODE         auto (default): the int8 spine when k3 pack has built it, else\n"
        "                       BF16; bf16: always the exact BF16 spine; int8: the packed int8\n"
        "                       spine (NOT exact; an error when it does not exist)\n"
        "  --pack-dir DIR       folder of the packed spine (default MODEL_DIR; see k3 pack --out)\n"
        "  -q, --quiet          no load line and no summary on stderr\n"
        "  -h, --help           this help\n\n");
    k3_cli_store_usage(f);
}

static int parse_int(const char *s, const char *flag, int lo, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > 1 << 30) {
        fprintf(stderr, "k3 run: %s needs an integer >= %d, got '%s'\n", flag, lo, s);
        return K3_ERR_USAGE;
    }
    *out = (int)v;
    return 0;
}

static int parse_spine(const char *s, int *out) {
    if (!strcmp(s, "auto")) *out = K3_SPINE_AUTO;
    else if (!strcmp(s, "bf16")) *out = K3_SPINE_BF16;
    else if (!strcmp(s, "int8")) *out = K3_SPINE_INT8;
    else {
        fprintf(stderr, "k3 run: --spine needs auto, bf16 or int8, got '%s'\n", s);
        return K3_ERR_USAGE;
    }
    return 0;
}

static int parse_args(int argc, char **argv, run_opts *o) {
    *o = (run_opts){.max_new = 128, .verbose = true, .spine = K3_SPINE_AUTO};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        int rc = 0;
        if ((rc = k3_cli_store_flag("run", argc, argv, &i, &o->so)) == 1) continue;
        if (rc) return rc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { run_usage(stdout); return -1; }
        else if (!strcmp(a, "--special")) o->special = true;
        else if (!strcmp(a, "--ids")) o->print_ids = true;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->verbose = false;
        else if (!strcmp(a, "--prompt") && has_val) o->prompt = argv[++i];
        else if (!strcmp(a, "--prompt-ids") && has_val) o->prompt_ids = argv[++i];
        else if (!strcmp(a, "--dump-logits") && has_val) o->dump_logits = argv[++i];
        else if (!strcmp(a, "--pack-dir") && has_val) o->pack_dir = argv[++i];
        else if (!strcmp(a, "--spine") && has_val) rc = parse_spine(argv[++i], &o->spine);
        else if (!strcmp(a, "--max-new") && has_val) rc = parse_int(argv[++i], a, 0, &o->max_new);
        else if (!strcmp(a, "--threads") && has_val) rc = parse_int(argv[++i], a, 1, &o->threads);
        else if (!strcmp(a, "--ctx") && has_val) rc = parse_int(argv[++i], a, 1, &o->ctx);
        else if (a[0] != '-' && !o->model_dir) o->model_dir = a;
        else {
            fprintf(stderr, "k3 run: unknown option or missing value: '%s' (see k3 run --help)\n", a);
            return K3_ERR_USAGE;
        }
        if (rc) return rc;
    }
    if (!o->prompt == !o->prompt_ids) {
        fprintf(stderr, "k3 run: give exactly one of --prompt or --prompt-ids (see k3 run --help)\n");
        return K3_ERR_USAGE;
    }
    if (!o->model_dir) o->model_dir = k3_default_model_dir();
    return 0;
}

/* Parses "12,7,9" into a malloc'd array. */
static int parse_ids(const char *s, int vocab, int32_t **ids, size_t *n, k3_err *err) {
    size_t cap = 16, cnt = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x >= vocab || (*end && *end != ',')) {
            free(v);
            return k3_fail(err, K3_ERR_USAGE, "--prompt-ids: '%s' is not a comma-separated list "
                           "of ids in [0, %d)", s, vocab);
        }
        if (cnt == cap && !(v = realloc(v, (cap *= 2) * sizeof *v)))
            return k3_fail(err, K3_ERR_GENERIC, "out of memory");
        v[cnt++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    *ids = v;
    *n = cnt;
    return K3_OK;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

typedef struct run_ctx {
    const run_opts *o;
    const k3_tokenizer *tok;
    k3_session *s;
    float *logits;
    FILE *dump;
    long dump_rows;
    int vocab;
} run_ctx;

/* Feeds one token; computes logits when needed (last prompt token, decode, or dumping). */
static int feed(run_ctx *r, int32_t tok, bool need_logits, k3_err *err) {
    bool want = need_logits || r->dump;
    int rc = k3_session_step(r->s, tok, want ? r->logits : NULL, err);
    if (rc || !r->dump) return rc;
    if (fwrite(r->logits, sizeof(float), (size_t)r->vocab, r->dump) != (size_t)r->vocab)
        return k3_fail(err, K3_ERR_IO, "%s: write failed: %s", r->o->dump_logits, strerror(errno));
    r->dump_rows++;
    return K3_OK;
}

static bool is_stop(const k3_engine *e, const k3_tokenizer *tok, int32_t id) {
    return id == k3_engine_config(e)->eos_token_id || id == k3_tokenizer_special_id(tok, "[EOS]");
}

static int generate(run_ctx *r, const k3_engine *e, const int32_t *prompt, size_t n_prompt,
                    k3_err *err) {
    double t0 = now_s();
    int rc = 0;
    for (size_t i = 0; i < n_prompt && !rc; i++) rc = feed(r, prompt[i], i + 1 == n_prompt, err);
    if (rc) return rc;
    double t1 = now_s();
    k3_detok_stream ds = {0};
    char text[4096];
    int n_gen = 0;
    for (; n_gen < r->o->max_new; n_gen++) {
        int32_t id = argmax(r->logits, r->vocab);
        if (r->o->print_ids) {
            printf("%s%d", n_gen ? "," : "", id);
        } else if (!is_stop(e, r->tok, id)) {
            int len = k3_detok_stream_push(r->tok, &ds, id, text, sizeof text);
            if (len > 0) fwrite(text, 1, (size_t)len, stdout);
        }
        fflush(stdout);
        if (is_stop(e, r->tok, id)) { n_gen++; break; }
        if (n_gen + 1 < r->o->max_new && (rc = feed(r, id, true, err))) return rc;
    }
    if (!r->o->print_ids) {
        int len = k3_detok_stream_flush(&ds, text, sizeof text);
        if (len > 0) fwrite(text, 1, (size_t)len, stdout);
    }
    printf("\n");
    double t2 = now_s();
    if (r->o->verbose)
        fprintf(stderr, "k3: prompt %zu tokens in %.3f s (%.2f tok/s), generated %d tokens in "
                "%.3f s (%.2f tok/s)\n", n_prompt, t1 - t0, n_prompt / (t1 - t0 + 1e-12), n_gen,
                t2 - t1, n_gen > 1 ? (n_gen - 1) / (t2 - t1 + 1e-12) : 0.0);
    return K3_OK;
}

static int run(const run_opts *o, k3_err *err) {
    k3_engine *e = NULL;
    k3_session *s = NULL;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    run_ctx r = {.o = o};
    k3_engine_opts eo = {.threads = o->threads, .verbose = o->verbose, .spine = o->spine,
                         .pack_dir = o->pack_dir};
    k3_cli_store_engine_opts(&o->so, &eo);
    k3_cli_store_run sr = {0};
    int rc = k3_engine_load(o->model_dir, &eo, &e, err);
    if (rc) goto done;
    r.tok = k3_engine_tokenizer(e);
    r.vocab = k3_engine_config(e)->vocab_size;
    if (o->prompt_ids)
        rc = parse_ids(o->prompt_ids, r.vocab, &prompt, &n_prompt, err);
    else
        rc = k3_tokenizer_encode(r.tok, o->prompt, strlen(o->prompt), o->special, &prompt,
                                 &n_prompt, err);
    if (!rc && n_prompt == 0) rc = k3_fail(err, K3_ERR_USAGE, "the prompt is empty");
    if (rc) goto done;
    int ctx = o->ctx ? o->ctx : 0;
    if ((rc = k3_session_new(e, ctx, &s, err))) goto done;
    if ((size_t)k3_session_max_ctx(s) < n_prompt + (size_t)o->max_new) {
        rc = k3_fail(err, K3_ERR_INPUT, "prompt (%zu) + --max-new (%d) exceed the context of %d "
                     "tokens (raise --ctx)", n_prompt, o->max_new, k3_session_max_ctx(s));
        goto done;
    }
    r.s = s;
    if ((rc = k3_cli_store_attach(&sr, s, &o->so, err))) goto done;
    if (!(r.logits = malloc((size_t)r.vocab * sizeof(float)))) {
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
        goto done;
    }
    if (o->dump_logits && !(r.dump = fopen(o->dump_logits, "wb"))) {
        rc = k3_fail(err, K3_ERR_IO, "%s: cannot create: %s", o->dump_logits, strerror(errno));
        goto done;
    }
    rc = generate(&r, e, prompt, n_prompt, err);
    if (r.dump) {
        if (fclose(r.dump) != 0 && !rc)
            rc = k3_fail(err, K3_ERR_IO, "%s: write failed", o->dump_logits);
        else if (!rc)
            fprintf(stderr, "k3: wrote logits [%ld, %d] float32 to %s\n", r.dump_rows, r.vocab,
                    o->dump_logits);
    }
done:
    k3_cli_store_finish(&sr, o->verbose && !rc);
    free(r.logits);
    free(prompt);
    k3_session_free(s);
    k3_engine_free(e);
    return rc;
}

int k3_cmd_run(int argc, char **argv) {
    run_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    k3_err err = {0};
    rc = run(&o, &err);
    if (rc) {
        fflush(stdout);
        fprintf(stderr, "k3: %s\n", err.msg);
    }
    return rc;
}
