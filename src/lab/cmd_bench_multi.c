/* cmd_bench_multi.c — `k3-lab bench-batch`: N sessions decoding at once (k3_sessions_step, one
 * pass for all of them) against the same N requests served one after another
 * (k3_session_step), for each N of --sessions, in one run: aggregate and per-request tokens/s
 * and the weight bytes each generated token costs (issue 18, part 5). Both ways give the same
 * ids (checked: the run says so, and fails when they differ). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/model_dir.h"
#include "../cli/opts.h"
#include "../engine/k3.h"
#include "../util/clock.h"
#include "../util/parse.h"
#include "lab.h"

#define MAX_SESSIONS 64

typedef struct mopts {
    const char *model_dir, *session_list;
    int sessions[16], n_sessions, tokens, prompt, threads, repeat;
    double spine_gb;
    const char *pack_dir;
} mopts;

#define MOPT(f) K3_OPT_CMD(mopts, f), .field = #f
static const k3_opt multi_rows[] = {
    {.flag = "--sessions", MOPT(session_list), .type = K3_OPT_STR, .flags = K3_OPTF_NONEMPTY,
     .def = "1,2,4,8", .meta = "LIST",
     .help = "comma-separated N, each 1.." K3_STR(MAX_SESSIONS) ", at most 16"},
    {.flag = "--tokens", MOPT(tokens), .type = K3_OPT_INT, .lo = 1, .hi = 1 << 16, .def = "8",
     .meta = "T", .help = "ids generated per request"},
    {.flag = "--prompt", MOPT(prompt), .type = K3_OPT_INT, .lo = 1, .hi = K3_MAX_CHUNK,
     .def = "4", .meta = "P", .help = "prompt ids per request"},
    {.flag = "--repeat", MOPT(repeat), .type = K3_OPT_INT, .lo = 1, .hi = 100, .def = "1",
     .meta = "R", .help = "measure each way R times, alternately, and keep the fastest (a\n"
                          "loaded machine's noise is one-sided)"},
};

static const k3_cli_command multi_cmd = {
    .name = "bench-batch", .prog = "k3-lab",
    .usage =
        "usage: k3-lab bench-batch [MODEL_DIR] [--sessions 1,2,4,8] [--tokens T] [--prompt P]\n"
        "                          [--spine-gb X] [--threads N]\n"
        "For each N of --sessions: N requests (prompts of P pseudo-random ids, different per\n"
        "request) each generate T greedy ids, first served one after another (k3_session_step),\n"
        "then all N together, one pass per step (k3_sessions_step: each spine matrix applied\n"
        "once over the N rows, each expert of the rows' union read once). Prints aggregate\n"
        "generated tokens/s, per-request tokens/s (each request's T ids over the time it was\n"
        "being generated), the mean time a request took to finish from the start, and the\n"
        "weight bytes per generated token: experts applied (union x expert size) and read from\n"
        "disk, spine applied and read from disk (the streamed part, with --spine-gb), and the\n"
        "phases of a step (one after another) or a pass (together): mixers, MoE (of which\n"
        "waiting for expert reads), lm_head. The expert cache is warmed with one pass first.\n"
        "The ids of both ways must be identical.\n",
    .rows = multi_rows, .n_rows = sizeof multi_rows / sizeof *multi_rows,
    .groups = K3_OG_THREADS | K3_OG_BUDGET, .max_positional = 1,
};

/* Returns 0, -1 after printing help, or K3_ERR_USAGE (said). */
static int parse(int argc, char **argv, mopts *o, k3_err *err) {
    *o = (mopts){0};
    k3_engine_opts eo;
    k3_opts_parsed parsed;
    k3_opt_targets t = {.eo = &eo, .cmd = o};
    int rc = k3_opts_parse(&multi_cmd, argc, argv, &t, &parsed);
    if (rc) return rc;
    o->threads = eo.threads, o->spine_gb = eo.spine_gb, o->pack_dir = eo.pack_dir;
    if ((rc = k3_model_arg("k3-lab bench-batch", parsed.n_positional ? parsed.positional[0]
                           : NULL, &o->model_dir)))
        return rc;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", o->session_list);
    for (char *save = NULL, *p = strtok_r(buf, ",", &save); p && !rc;
         p = strtok_r(NULL, ",", &save)) {
        if (o->n_sessions == 16) rc = k3_fail(err, K3_ERR_USAGE, "--sessions: at most 16 values");
        else rc = k3_parse_int(p, "--sessions", 1, MAX_SESSIONS, &o->sessions[o->n_sessions++],
                               err);
    }
    if (!rc && !o->n_sessions)
        rc = k3_fail(err, K3_ERR_USAGE, "--sessions: expected a list such as 1,2,4,8");
    if (rc) fprintf(stderr, "k3-lab bench-batch: %s\n", err->msg);
    return rc ? -2 : 0;
}

/* Bytes of one routed expert (three MXFP4 matrices inter x latent: nibbles + E8M0 scales) and
 * of the spine (everything else the forward pass reads), as `k3-lab bench prefill` counts. */
static void weight_sizes(const k3_engine *e, double *expert, double *spine) {
    const k3_config *c = k3_engine_config(e);
    double m = (double)c->moe_intermediate_size * c->routed_expert_hidden_size;
    int n_moe = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n_moe += c->layer_is_moe[l];
    *expert = 3 * (m / 2 + m / 32);
    *spine = (double)k3_engine_weight_bytes(e) - *expert * n_moe * c->num_experts;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* What one way of serving N requests measured. */
typedef struct measure {
    double wall_s, request_s, finish_s; /* all; summed per request; summed finish times */
    double expert_used, expert_disk, spine_used, spine_disk; /* bytes */
    k3_phase_times per;                 /* per step (one after another) or per pass */
} measure;

typedef struct bench {
    const mopts *o;
    k3_engine *e;
    k3_multistep *ms;
    k3_session *ss[MAX_SESSIONS];
    float *logits;      /* [MAX_SESSIONS][vocab] */
    int32_t *ids;       /* [2][MAX_SESSIONS][tokens]: the ids generated each way */
    int32_t next[MAX_SESSIONS];
    double expert, spine; /* bytes of one expert, of the spine */
    int n_moe, top_k;
} bench;

/* Request i's prompt: P ids of its own. */
static void prompt_of(const bench *b, int i, int32_t *out) {
    unsigned V = (unsigned)k3_engine_config(b->e)->vocab_size;
    for (int j = 0; j < b->o->prompt; j++)
        out[j] = (int32_t)(((unsigned)(i * 131 + j) * 7919u + 11u) % V);
}

/* Resets the N sessions and prefills each with its prompt (not measured); next[i] = its first
 * generated id. */
static int prefill_all(bench *b, int n, k3_err *err) {
    int32_t *prompt = malloc((size_t)b->o->prompt * sizeof *prompt); /* up to K3_MAX_CHUNK */
    if (!prompt) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    int rc = K3_OK;
    for (int i = 0; i < n && !rc; i++) {
        prompt_of(b, i, prompt);
        k3_session_reset(b->ss[i]);
        rc = k3_session_prefill(b->ss[i], prompt, (size_t)b->o->prompt, b->logits, NULL, err);
        if (!rc) b->next[i] = argmax(b->logits, k3_engine_config(b->e)->vocab_size);
    }
    free(prompt);
    return rc;
}

typedef struct counters {
    uint64_t expert_bytes_read, spine_bytes_read, experts;
} counters;

/* The phase times summed over sessions [0, n) (each session's steps; a pass's times are
 * given to every session in it, so together takes session 0's alone). */
static k3_phase_times phases(const bench *b, int n) {
    k3_phase_times sum = {0};
    for (int i = 0; i < n; i++) {
        k3_run_stats rs;
        k3_session_stats(b->ss[i], &rs);
        sum.total_s += rs.time.total_s, sum.attn_s += rs.time.attn_s;
        sum.moe_s += rs.time.moe_s, sum.eload_s += rs.time.eload_s;
        sum.head_s += rs.time.head_s, sum.tokens += rs.time.tokens;
    }
    return sum;
}

static void per_unit(k3_phase_times *d, const k3_phase_times *a, const k3_phase_times *z,
                     double units) {
    d->total_s = (z->total_s - a->total_s) / units, d->attn_s = (z->attn_s - a->attn_s) / units;
    d->moe_s = (z->moe_s - a->moe_s) / units, d->eload_s = (z->eload_s - a->eload_s) / units;
    d->head_s = (z->head_s - a->head_s) / units;
}

static void count(const bench *b, counters *c) {
    k3_run_stats rs;
    k3_spine_stats sp;
    k3_multistep_stats ms;
    k3_session_stats(b->ss[0], &rs);
    k3_engine_spine_stats(b->e, &sp);
    k3_multistep_get_stats(b->ms, &ms);
    *c = (counters){rs.bytes_read, sp.bytes_read, ms.experts};
}

/* One after another: request i's T ids, then request i+1's. */
static int serial(bench *b, int n, measure *m, k3_err *err) {
    int T = b->o->tokens, V = k3_engine_config(b->e)->vocab_size, rc = prefill_all(b, n, err);
    counters c0, c1;
    count(b, &c0);
    k3_phase_times p0 = phases(b, n), p1;
    double t0 = k3_now_s();
    for (int i = 0; i < n && !rc; i++) {
        double r0 = k3_now_s();
        for (int t = 0; t < T && !rc; t++) {
            b->ids[i * T + t] = b->next[i];
            rc = k3_session_step(b->ss[i], b->next[i], b->logits, err);
            b->next[i] = argmax(b->logits, V);
        }
        double r1 = k3_now_s();
        m->request_s += r1 - r0;
        m->finish_s += r1 - t0;
    }
    m->wall_s = k3_now_s() - t0;
    count(b, &c1);
    p1 = phases(b, n);
    double tokens = (double)n * T;
    per_unit(&m->per, &p0, &p1, tokens);
    m->expert_used = b->expert * (double)b->top_k * b->n_moe; /* top-k per MoE layer per id */
    m->expert_disk = (double)(c1.expert_bytes_read - c0.expert_bytes_read) / tokens;
    m->spine_used = b->spine;
    m->spine_disk = (double)(c1.spine_bytes_read - c0.spine_bytes_read) / tokens;
    return rc;
}

/* Together: T passes of k3_sessions_step over the N sessions. */
static int together(bench *b, int n, measure *m, k3_err *err) {
    int T = b->o->tokens, V = k3_engine_config(b->e)->vocab_size, rc = prefill_all(b, n, err);
    int32_t *ids = b->ids + (size_t)MAX_SESSIONS * T;
    counters c0, c1;
    count(b, &c0);
    k3_phase_times p0 = phases(b, 1), p1;
    double t0 = k3_now_s();
    for (int t = 0; t < T && !rc; t++) {
        for (int i = 0; i < n; i++) ids[i * T + t] = b->next[i];
        rc = k3_sessions_step(b->ms, b->ss, b->next, n, b->logits, NULL, err);
        for (int i = 0; i < n && !rc; i++) b->next[i] = argmax(b->logits + (size_t)i * V, V);
    }
    m->wall_s = k3_now_s() - t0;
    m->request_s = m->finish_s = m->wall_s * n; /* every request runs (and ends) throughout */
    count(b, &c1);
    p1 = phases(b, 1);
    per_unit(&m->per, &p0, &p1, T);
    double tokens = (double)n * T;
    m->expert_used = b->expert * (double)(c1.experts - c0.experts) / tokens;
    m->expert_disk = (double)(c1.expert_bytes_read - c0.expert_bytes_read) / tokens;
    m->spine_used = b->spine / n;
    m->spine_disk = (double)(c1.spine_bytes_read - c0.spine_bytes_read) / tokens;
    return rc;
}

static void row(int n, const char *way, const measure *m, int T, double base) {
    double tokens = (double)n * T, agg = tokens / m->wall_s;
    const k3_phase_times *p = &m->per;
    printf("| %d | %s | %.2f | %.3f | %.2fx | %.3f | %.2f | %.1f | %.1f | %.1f | %.1f | "
           "%.3f / %.3f (%.3f) / %.3f |\n", n, way, m->wall_s, agg, agg / base,
           T / (m->request_s / n), m->finish_s / n, m->expert_used / 1e6, m->expert_disk / 1e6,
           m->spine_used / 1e6, m->spine_disk / 1e6, p->attn_s, p->moe_s, p->eload_s, p->head_s);
}

static int run(const mopts *o, k3_err *err) {
    bench b = {.o = o};
    int max_n = 1, rc;
    for (int i = 0; i < o->n_sessions; i++) max_n = o->sessions[i] > max_n ? o->sessions[i] : max_n;
    k3_engine_opts eo = k3_engine_opts_default();
    eo.threads = o->threads; /* 0: OpenMP's own count (OMP_NUM_THREADS) */
    eo.spine_gb = o->spine_gb, eo.pack_dir = o->pack_dir;
    eo.sessions = max_n;
    eo.verbose = 1;
    if ((rc = k3_engine_load(o->model_dir, &eo, &b.e, err))) return rc;
    const k3_config *c = k3_engine_config(b.e);
    weight_sizes(b.e, &b.expert, &b.spine);
    b.top_k = c->num_experts_per_token;
    for (int l = 0; l < c->num_hidden_layers; l++) b.n_moe += c->layer_is_moe[l];
    int ctx = o->prompt + o->tokens + 1;
    rc = k3_multistep_new(b.e, max_n, &b.ms, err);
    for (int i = 0; i < max_n && !rc; i++) rc = k3_session_new(b.e, ctx, &b.ss[i], err);
    b.logits = malloc((size_t)max_n * c->vocab_size * sizeof *b.logits);
    b.ids = malloc(2 * (size_t)MAX_SESSIONS * o->tokens * sizeof *b.ids);
    if (!rc && (!b.logits || !b.ids)) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    k3_spine_stats sp;
    k3_engine_spine_stats(b.e, &sp);
    printf("k3-lab bench-batch: %s, %d threads, prompts of %d ids, %d generated per request, "
           "best of %d; spine %.3f GB (%s), one expert %.2f MB, top-%d of %d experts, %d MoE "
           "layers\n", o->model_dir, omp_get_max_threads(), o->prompt, o->tokens, o->repeat,
           b.spine / 1e9,
           !sp.budgeted ? "in RAM, used in place" : sp.streamed_layers ? "budget: layers streamed"
                                                                     : "budget: all resident",
           b.expert / 1e6, b.top_k, c->num_experts, b.n_moe);
    if (!rc) { /* warm-up: the expert cache and the page cache see every request's first pass */
        fprintf(stderr, "k3-lab bench-batch: warm-up pass of %d sessions\n", max_n);
        rc = prefill_all(&b, max_n, err);
        if (!rc) rc = k3_sessions_step(b.ms, b.ss, b.next, max_n, b.logits, NULL, err);
    }
    printf("| N | served | s | aggregate tok/s | vs N=1 | per-request tok/s | mean finish s | "
           "expert MB/tok applied | expert MB/tok from disk | spine MB/tok applied | "
           "spine MB/tok from disk | step or pass s: mixers / MoE (reads) / head |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    double base = 0;
    int all_same = 1;
    for (int k = 0; k < o->n_sessions && !rc; k++) {
        int n = o->sessions[k], T = o->tokens;
        measure ms1 = {0}, msn = {0};
        int same = 1;
        for (int r = 0; r < o->repeat && !rc; r++) {
            measure a = {0}, z = {0};
            fprintf(stderr, "k3-lab bench-batch: N=%d one after another (%d of %d)\n", n, r + 1,
                    o->repeat);
            fflush(stdout);
            if ((rc = serial(&b, n, &a, err))) break;
            fprintf(stderr, "k3-lab bench-batch: N=%d together (%d of %d)\n", n, r + 1,
                    o->repeat);
            if ((rc = together(&b, n, &z, err))) break;
            same &= !memcmp(b.ids, b.ids + (size_t)MAX_SESSIONS * T, (size_t)n * T * sizeof *b.ids);
            if (!r || a.wall_s < ms1.wall_s) ms1 = a;
            if (!r || z.wall_s < msn.wall_s) msn = z;
        }
        if (rc) break;
        if (!base) base = (double)T / ms1.wall_s; /* one request alone */
        all_same &= same;
        row(n, "one after another", &ms1, T, base);
        row(n, same ? "together" : "together (IDS DIFFER)", &msn, T, base);
    }
    if (!rc)
        printf("generated ids: %s\n", all_same ? "identical both ways for every N"
                                               : "DIFFERENT (a bug: see tests/test_multistep.c)");
    if (!rc && !all_same)
        rc = k3_fail(err, K3_ERR_GENERIC, "the ids generated together differ from one after "
                     "another");
    for (int i = 0; i < max_n; i++) k3_session_free(b.ss[i]);
    k3_multistep_free(b.ms);
    k3_engine_free(b.e);
    free(b.logits), free(b.ids);
    return rc;
}

int k3_cmd_bench_multi(int argc, char **argv) {
    mopts o;
    k3_err err = {0};
    int rc = parse(argc, argv, &o, &err);
    if (rc) return rc == -1 ? 0 : rc == -2 ? K3_ERR_USAGE : rc;
    rc = run(&o, &err);
    if (rc) fprintf(stderr, "k3-lab bench-batch: %s\n", err.msg);
    return rc;
}
