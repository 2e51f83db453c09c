/* cmd_bench_batch.c — `k3-lab bench prefill` (batched prefill: tokens/s by chunk size) and
 * `k3-lab bench spec` (speculative decoding: the cost of a verification pass by its size, then
 * forward passes per token and s/token with and without --spec), each beside the time the
 * weights it reads take to stream at the memory bandwidth of a large copy measured in the same
 * run (the physical limit when weights, not arithmetic, bound a pass). */
#include <errno.h>
#include <omp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/gen.h"
#include "../cli/model_dir.h"
#include "../cli/opts.h"
#include "../engine/k3.h"
#include "../engine/spec.h"
#include "lab.h"
#include "../util/clock.h"

typedef struct bopts {
    const char *model_dir, *chunk_list;
    int chunks[16], n_chunks, tokens, threads, spec, max_new;
} bopts;

#define BOPT(f) K3_OPT_CMD(bopts, f), .field = #f
/* Each benchmark's own rows, then the other's hidden (refused with a pointer to it). */
#define CHUNKS_ROW(hide) \
    {.flag = "--chunks", BOPT(chunk_list), .type = K3_OPT_STR, .flags = K3_OPTF_NONEMPTY | (hide), \
     .def = "1,8,32", .meta = "LIST", \
     .help = "comma-separated ids per pass, each 1.." K3_STR(K3_MAX_CHUNK) ", at most 16"}
#define TOKENS_ROW(hide) \
    {.flag = "--tokens", BOPT(tokens), .type = K3_OPT_INT, .lo = 1, .hi = 1 << 20, .def = "64", \
     .flags = (hide), .meta = "N", .help = "prompt ids to prefill"}
#define SPEC_ROW(hide) \
    {.flag = "--spec", BOPT(spec), .type = K3_OPT_INT, .lo = 1, .hi = K3_MAX_SPEC, \
     .def = "4", .flags = (hide), .meta = "N", \
     .help = "most drafted ids verified per pass (1 to " \
             K3_STR(K3_MAX_SPEC) ")"}
#define MAX_NEW_ROW(hide) \
    {.flag = "--max-new", BOPT(max_new), .type = K3_OPT_INT, .lo = 1, .hi = 1 << 20, \
     .def = "32", .flags = (hide), .meta = "N", .help = "ids generated per run"}
static const k3_opt prefill_rows[] = {CHUNKS_ROW(0), TOKENS_ROW(0), SPEC_ROW(K3_OPTF_HIDDEN),
                                      MAX_NEW_ROW(K3_OPTF_HIDDEN)};
static const k3_opt spec_rows[] = {SPEC_ROW(0), MAX_NEW_ROW(0), CHUNKS_ROW(K3_OPTF_HIDDEN),
                                   TOKENS_ROW(K3_OPTF_HIDDEN)};

static const k3_cli_command prefill_cmd = {
    .name = "bench prefill", .prog = "k3-lab",
    .usage = "usage: k3-lab bench prefill [MODEL_DIR] [--chunks 1,8,32] [--tokens N]\n"
             "                        [--threads N]\n"
             "Prefills N ids (a fixed pseudo-random sequence) once per chunk size after a\n"
             "warm-up pass, and prints prompt tokens/s, the weight bytes each pass reads (spine +\n"
             "the routed experts the store was asked for) and the time those bytes take at the\n"
             "bandwidth of a 1 GB memcpy measured in the same run. Output is bit-identical for\n"
             "every chunk size (tests/test_prefill.c).\n",
    .rows = prefill_rows, .n_rows = sizeof prefill_rows / sizeof *prefill_rows,
    .groups = K3_OG_THREADS, .max_positional = 1,
};
static const k3_cli_command spec_cmd = {
    .name = "bench spec", .prog = "k3-lab",
    .usage = "usage: k3-lab bench spec [MODEL_DIR] [--spec N] [--max-new N] [--threads N]\n"
             "First the cost of one verification pass of 1..N+1 ids (rewound each time) against\n"
             "one single step: a pass of 1 + d ids pays when it yields more ids than it costs\n"
             "steps (the rule in src/engine/spec.h measures this while decoding).\n"
             "Then greedy generation of --max-new ids from a repetitive prompt (a phrase, the\n"
             "model's own continuation of it, the phrase again) and from a non-repetitive one,\n"
             "without and with --spec N: forward passes per generated token, s/token, and\n"
             "whether the outputs are identical (they must be).\n",
    .rows = spec_rows, .n_rows = sizeof spec_rows / sizeof *spec_rows,
    .groups = K3_OG_THREADS, .max_positional = 1,
};

/* "1,8,32" into o->chunks. */
static int parse_chunks(const k3_cli_command *cmd, bopts *o) {
    char *end;
    o->n_chunks = 0;
    for (const char *p = o->chunk_list; *p; p = *end ? end + 1 : end) {
        errno = 0;
        long c = strtol(p, &end, 10);
        if (end == p || errno || c < 1 || c > K3_MAX_CHUNK || (*end && *end != ',') ||
            o->n_chunks == 16)
            return k3_opts_usage_error(cmd, "--chunks needs at most 16 sizes in [1, "
                                       K3_STR(K3_MAX_CHUNK) "]");
        o->chunks[o->n_chunks++] = (int)c;
    }
    return 0;
}

static int parse(int argc, char **argv, const char *what, bopts *o) {
    *o = (bopts){0};
    bool prefill = !strcmp(what, "prefill");
    const k3_cli_command *cmd = prefill ? &prefill_cmd : &spec_cmd;
    k3_engine_opts eo;
    k3_opts_parsed parsed;
    k3_opt_targets t = {.eo = &eo, .cmd = o};
    int rc = k3_opts_parse(cmd, argc, argv, &t, &parsed);
    if (rc) return rc;
    static const char *const theirs[2][2] = {{"--chunks", "--tokens"}, {"--spec", "--max-new"}};
    for (int k = 0; k < 2; k++)
        if (k3_opts_given(cmd, &parsed, theirs[prefill][k]) == 1) {
            fprintf(stderr, "k3-lab bench %s: %s belongs to k3-lab bench %s (see --help)\n",
                    what, theirs[prefill][k], prefill ? "spec" : "prefill");
            return K3_ERR_USAGE;
        }
    o->threads = eo.threads;
    char who[32];
    snprintf(who, sizeof who, "k3-lab bench %s", what);
    if ((rc = k3_model_arg(who, parsed.n_positional ? parsed.positional[0] : NULL,
                           &o->model_dir)))
        return rc;
    return parse_chunks(cmd, o);
}

/* One progress line on stderr ("k3-lab bench WHAT: ..."): a measurement can take tens of
 * seconds on a real-width model, and the table on stdout only grows row by row. */
__attribute__((format(printf, 2, 3))) static void progress(const char *what, const char *fmt,
                                                            ...) {
    fflush(stdout); /* the rows so far first */
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "k3-lab bench %s: ", what);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* Read + written bytes per second of a parallel 1 GB memcpy (best of 3). */
static double copy_bw(void) { return k3_lab_copy_rate((size_t)1 << 30); }

/* Bytes of one routed expert (three MXFP4 matrices inter x latent: nibbles + E8M0 scales) and
 * of the spine (everything else the forward pass reads). */
static void weight_sizes(const k3_engine *e, double *expert, double *spine) {
    const k3_config *c = k3_engine_config(e);
    double m = (double)c->moe_intermediate_size * c->routed_expert_hidden_size;
    int n_moe = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n_moe += c->layer_is_moe[l];
    *expert = 3 * (m / 2 + m / 32);
    *spine = (double)k3_engine_weight_bytes(e) - *expert * n_moe * c->num_experts;
}

static int load(const bopts *o, k3_engine **e, k3_err *err) {
    k3_engine_opts eo = k3_engine_opts_default();
    eo.threads = o->threads; /* 0: OpenMP's own count (OMP_NUM_THREADS) */
    eo.verbose = 1;
    return k3_engine_load(o->model_dir, &eo, e, err);
}

static uint64_t requests(const k3_session *s) {
    k3_run_stats st;
    k3_session_stats(s, &st);
    return st.expert_requests;
}

/* ---- k3-lab bench prefill ----------------------------------------------------------------- */

static int bench_prefill(const bopts *o, k3_err *err) {
    k3_engine *e = NULL;
    int rc = load(o, &e, err);
    if (rc) return rc;
    const k3_config *c = k3_engine_config(e);
    int32_t *ids = malloc((size_t)o->tokens * sizeof *ids);
    for (int i = 0; i < o->tokens; i++) ids[i] = (int32_t)((i * 7919u + 11u) % (unsigned)c->vocab_size);
    progress("prefill", "measuring the memory bandwidth (1 GB memcpy, best of 3)");
    double bw = copy_bw(), expert, spine, base_tps = 0;
    weight_sizes(e, &expert, &spine);
    printf("k3-lab bench prefill: %s, %d ids, %d threads; memcpy %.2f GB/s (read + write); spine "
           "%.3f GB, one expert %.2f MB\n", o->model_dir, o->tokens, omp_get_max_threads(),
           bw / 1e9, spine / 1e9, expert / 1e6);
    printf("| chunk | passes | prefill s | tokens/s | speed-up | weights read GB | at memcpy rate s "
           "| expert reads per token |\n|---|---|---|---|---|---|---|---|\n");
    for (int ci = 0; ci < o->n_chunks && !rc; ci++) {
        k3_session *s = NULL;
        int chunk = o->chunks[ci], n = o->tokens;
        progress("prefill", "chunk %d (%d of %d): a warm-up pass, then %d ids in %d passes", chunk,
                 ci + 1, o->n_chunks, n, (n + chunk - 1) / chunk);
        if ((rc = k3_session_new(e, n + 8, &s, err))) break;
        k3_session_set_chunk(s, chunk);
        /* warm-up: one pass of this size touches the spine and the scratch */
        rc = k3_session_forward(s, ids, chunk < n ? chunk : n, NULL, 0, err);
        k3_session_reset(s);
        uint64_t r0 = requests(s);
        double t = k3_now_s();
        if (!rc) rc = k3_session_prefill(s, ids, (size_t)n, NULL, NULL, err);
        t = k3_now_s() - t;
        uint64_t nreq = requests(s) - r0;
        int passes = (n + chunk - 1) / chunk;
        double bytes = spine * passes + expert * (double)nreq, tps = n / t;
        if (ci == 0) base_tps = tps;
        if (!rc)
            printf("| %d | %d | %.3f | %.2f | %.2fx | %.2f | %.3f | %.2f |\n", chunk, passes, t,
                   tps, tps / base_tps, bytes / 1e9, bytes / (bw / 2), (double)nreq / n);
        k3_session_free(s);
    }
    free(ids);
    k3_engine_free(e);
    return rc;
}

/* ---- k3-lab bench spec -------------------------------------------------------------------- */

/* Time of a pass of n ids at the same position (rewound after each), best of `reps`. */
static int pass_time(k3_session *s, const int32_t *ids, int n, int reps, float *rows, double *best,
                     k3_err *err) {
    int pos = k3_session_pos(s), rc = K3_OK;
    *best = 1e30;
    for (int r = 0; r < reps && !rc; r++) {
        double t = k3_now_s();
        rc = k3_session_forward(s, ids, n, rows, K3_FWD_ALL_LOGITS | K3_FWD_REWINDABLE, err);
        if (!rc) rc = k3_session_rewind(s, pos, err);
        t = k3_now_s() - t;
        if (t < *best) *best = t;
    }
    return rc;
}

typedef struct spec_run {
    double s_per_token, passes_per_token;
    int n;
    int32_t ids[1024];
    k3_spec_stats st;
    char why[160];
} spec_run;

static int generate(k3_engine *e, const int32_t *prompt, int n, int max_new, int spec,
                    spec_run *out, k3_err *err) {
    const k3_config *c = k3_engine_config(e);
    k3_session *s = NULL;
    k3_sampler sm;
    k3_spec sp = {0};
    k3_stops stops = {0}; /* no stop id: every run generates max_new ids */
    k3_sampler_opts so = {.temperature = 0, .top_p = 1};
    float *logits = malloc((size_t)c->vocab_size * sizeof *logits);
    FILE *null = fopen("/dev/null", "w");
    int rc = k3_session_new(e, n + max_new + 8, &s, err);
    if (!rc) rc = k3_sampler_init(&sm, &so, c->vocab_size, err);
    if (!rc) rc = k3_spec_init(&sp, spec, s, &sm, err);
    if (!rc) rc = k3_session_prefill(s, prompt, (size_t)n, logits, NULL, err);
    if (!rc) {
        k3_gen_opts go = {.tok = k3_engine_tokenizer(e), .max_new = max_new, .print_ids = true,
                          .out = null, .spec = spec ? &sp : NULL};
        k3_gen_result r;
        rc = k3_cli_generate(s, &sm, &stops, logits, NULL, &go, &r, err);
        if (!rc) {
            out->n = (int)r.n < 1024 ? (int)r.n : 1024;
            memcpy(out->ids, r.ids, (size_t)out->n * sizeof *r.ids);
            out->s_per_token = r.decode_s / r.n_sampled;
            long fwd = spec ? sp.st.passes + sp.st.steps : r.n_sampled - 1;
            out->passes_per_token = (double)fwd / r.n_sampled;
            out->st = sp.st;
            snprintf(out->why, sizeof out->why, "%s", sp.off ? sp.why : "");
        }
        free(r.ids);
        k3_sampler_free(&sm);
    }
    k3_spec_free(&sp);
    k3_session_free(s);
    fclose(null);
    free(logits);
    return rc;
}

static int bench_spec(const bopts *o, k3_err *err) {
    k3_engine *e = NULL;
    int rc = load(o, &e, err);
    if (rc) return rc;
    const k3_config *c = k3_engine_config(e);
    int V = c->vocab_size, nmax = o->spec + 1;
    progress("spec", "measuring the memory bandwidth (1 GB memcpy, best of 3)");
    double bw = copy_bw(), expert, spine;
    weight_sizes(e, &expert, &spine);
    printf("k3-lab bench spec: %s, %d threads; memcpy %.2f GB/s; spine %.3f GB, one expert "
           "%.2f MB\n", o->model_dir, omp_get_max_threads(), bw / 1e9, spine / 1e9, expert / 1e6);
    /* 1. what a verification pass of n ids costs against one step */
    int32_t plain[64];
    for (int i = 0; i < 64; i++) plain[i] = (int32_t)((i * 7919u + 11u) % (unsigned)V);
    float *rows = malloc((size_t)nmax * V * sizeof *rows);
    k3_session *s = NULL;
    if (!(rc = k3_session_new(e, 128, &s, err))) rc = k3_session_prefill(s, plain, 16, NULL, NULL, err);
    double t1 = 0, warm;
    if (!rc) rc = pass_time(s, plain + 16, nmax, 1, rows, &warm, err); /* sizes the scratch */
    printf("| ids in the pass | s per pass | vs one step | marginal cost per extra id |\n"
           "|---|---|---|---|\n");
    for (int n = 1; n <= nmax && !rc; n++) {
        double t;
        progress("spec", "passes of %d ids (size %d of %d), best of 3", n, n, nmax);
        rc = pass_time(s, plain + 16, n, 3, rows, &t, err);
        if (n == 1) t1 = t;
        if (!rc)
            printf("| %d | %.3f | %.2fx | %.2f |\n", n, t, t / t1,
                   n == 1 ? 0.0 : (t / t1 - 1) / (n - 1));
    }
    k3_session_free(s);
    free(rows);
    /* 2. generation without and with --spec. The repetitive prompt: a phrase repeated (Q),
     * the model's greedy continuation of it (G), then Q again, so that the drafter proposes G
     * and a model that repeats itself accepts it (random weights need that much help). */
    static const int32_t phrase[8] = {101, 2002, 303, 44, 1505, 606, 77, 808};
    int32_t rep[1024], nrep = 0;
    spec_run *base = calloc(1, sizeof *base), *run = calloc(1, sizeof *run);
    for (int k = 0; k < 6; k++)
        for (int i = 0; i < 8; i++) rep[nrep++] = phrase[i] % V;
    if (!rc) progress("spec", "generating the repetitive prompt's continuation (%d ids, 1 of 5)",
                      o->max_new);
    if (!rc) rc = generate(e, rep, nrep, o->max_new, 0, base, err);
    for (int i = 0; i < base->n && !rc; i++) rep[nrep + i] = base->ids[i];
    memcpy(rep + nrep + base->n, rep, (size_t)nrep * sizeof *rep);
    nrep = 2 * nrep + base->n;
    printf("\n| prompt | --spec | s/token | forward passes per token | drafts proposed | "
           "accepted | output identical |\n|---|---|---|---|---|---|---|\n");
    for (int pi = 0; pi < 2 && !rc; pi++) {
        const int32_t *p = pi ? plain : rep;
        int n = pi ? 64 : nrep;
        const char *name = pi ? "non-repetitive" : "repetitive";
        progress("spec", "%s prompt: %d ids without --spec (%d of 5)", name, o->max_new,
                 2 + 2 * pi);
        if ((rc = generate(e, p, n, o->max_new, 0, base, err))) break;
        printf("| %s (%d ids) | off | %.3f | %.3f | — | — | — |\n", name, n, base->s_per_token,
               base->passes_per_token);
        progress("spec", "%s prompt: %d ids with --spec %d (%d of 5)", name, o->max_new, o->spec,
                 3 + 2 * pi);
        if ((rc = generate(e, p, n, o->max_new, o->spec, run, err))) break;
        int same = run->n == base->n && !memcmp(run->ids, base->ids, (size_t)base->n * 4);
        printf("| %s (%d ids) | %d | %.3f | %.3f | %ld | %ld | %s |%s%s\n", name, n, o->spec,
               run->s_per_token, run->passes_per_token, run->st.proposed, run->st.accepted,
               same ? "yes" : "NO", run->why[0] ? " " : "", run->why);
        if (!same) rc = k3_fail(err, K3_ERR_GENERIC, "--spec changed the output");
    }
    free(base), free(run);
    k3_engine_free(e);
    return rc;
}

int k3_cmd_bench_batch(int argc, char **argv) {
    const char *what = argv[0];
    bopts o;
    int rc = parse(argc, argv, what, &o);
    if (rc) return rc < 0 ? 0 : rc;
    k3_err err = {0};
    rc = !strcmp(what, "prefill") ? bench_prefill(&o, &err) : bench_spec(&o, &err);
    if (rc) fprintf(stderr, "k3-lab bench %s: %s\n", what, err.msg);
    return rc;
}
