/* gen.c — printing a reply of `k3 run` / `k3 chat` over the generation loop, and the flags
 * both share (see gen.h). */
#include "gen.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double k3_cli_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *k3_gen_end_name(enum k3_gen_end end) {
    switch (end) {
    case K3_GEN_STOP: return "end of message";
    case K3_GEN_MAX_NEW: return "--max-new reached";
    case K3_GEN_INTERRUPTED: return "interrupted (Ctrl-C)";
    case K3_GEN_CONTEXT: return "context full";
    case K3_GEN_STOP_STRING: return "stop string";
    case K3_GEN_RUNNING: return "running";
    case K3_GEN_FAILED: return "failed";
    }
    return "?";
}

/* ---- shared flags ---------------------------------------------------------------------------- */

const char k3_cli_sampling_help[] =
    "  --temperature T      sample at temperature T (default 0 = greedy: the argmax, ties to\n"
    "                       the lowest id; reproducible)\n"
    "  --top-k K            sample only among the K largest logits (0 = off, the default)\n"
    "  --top-p P            then only among the most likely ids whose probabilities first\n"
    "                       reach P (1 = off, the default)\n"
    "  --seed N             PRNG seed (xoshiro256** seeded by SplitMix64; see\n"
    "                       src/engine/sampler.h); the same seed and prompt reproduce a run.\n"
    "                       Default: from the clock, printed in the summary\n";

const char k3_cli_chat_help[] =
    "  --system TEXT        a system message before the conversation\n"
    "  --effort E           thinking effort: low, high or max (default max)\n"
    "  --no-think           thinking off: the reply starts in the response channel\n"
    "  --no-show-thinking   do not print the thinking channel (it is still generated)\n";

const char k3_cli_speed_help[] =
    "  --chunk N            prompt ids per batched prefill pass (default 32; 1 = one by one).\n"
    "                       Each spine matrix and each routed expert is read once per pass;\n"
    "                       results are bit-identical for every N\n"
    "  --spec N             speculative decoding: verify up to N drafted ids per pass (n-gram\n"
    "                       suffix matches from the prompt and output; 0 = off, the default).\n"
    "                       Greedy output is token for token what it is without --spec; with\n"
    "                       sampling each id keeps its distribution (speculative sampling) but\n"
    "                       a seed gives another sequence. Turns itself off for the rest of a\n"
    "                       reply when its passes are slower than single steps\n";

static int bad_value(const char *cmd, const char *flag, const char *want, const char *got) {
    fprintf(stderr, "k3 %s: %s needs %s, got '%s'\n", cmd, flag, want, got);
    return K3_ERR_USAGE;
}

int k3_cli_chat_flag(const char *cmd, int argc, char **argv, int *i, k3_cli_chat_opts *o) {
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    char *end;
    if (!strcmp(a, "--no-think")) return o->no_think = true, 1;
    if (!strcmp(a, "--no-show-thinking")) return o->hide_thinking = true, 1;
    bool known = !strcmp(a, "--temperature") || !strcmp(a, "--top-p") || !strcmp(a, "--top-k") ||
                 !strcmp(a, "--seed") || !strcmp(a, "--system") || !strcmp(a, "--effort") ||
                 !strcmp(a, "--chunk") || !strcmp(a, "--spec");
    if (!known) return 0;
    if (!v) return bad_value(cmd, a, "a value", "");
    ++*i;
    errno = 0;
    if (!strcmp(a, "--system")) {
        o->system = v;
    } else if (!strcmp(a, "--effort")) {
        if (strcmp(v, "low") && strcmp(v, "high") && strcmp(v, "max"))
            return bad_value(cmd, a, "low, high or max", v);
        o->effort = v;
    } else if (!strcmp(a, "--temperature")) {
        o->sampling.temperature = strtod(v, &end);
        if (*end || end == v || errno || !(o->sampling.temperature >= 0) ||
            isinf(o->sampling.temperature))
            return bad_value(cmd, a, "a number >= 0", v);
    } else if (!strcmp(a, "--top-p")) {
        o->sampling.top_p = strtod(v, &end);
        if (*end || end == v || errno || !(o->sampling.top_p > 0 && o->sampling.top_p <= 1))
            return bad_value(cmd, a, "a number in (0, 1]", v);
    } else if (!strcmp(a, "--chunk") || !strcmp(a, "--spec")) {
        bool chunk = !strcmp(a, "--chunk");
        int lo = chunk ? 1 : 0, hi = chunk ? K3_MAX_CHUNK : K3_MAX_CHUNK - 1;
        long k = strtol(v, &end, 10);
        if (*end || end == v || errno || k < lo || k > hi) {
            char want[64];
            snprintf(want, sizeof want, "an integer in [%d, %d]", lo, hi);
            return bad_value(cmd, a, want, v);
        }
        *(chunk ? &o->chunk : &o->spec) = (int)k;
    } else if (!strcmp(a, "--top-k")) {
        long k = strtol(v, &end, 10);
        if (*end || end == v || errno || k < 0 || k > 1 << 30)
            return bad_value(cmd, a, "an integer >= 0", v);
        o->sampling.top_k = (int)k;
    } else {
        unsigned long long seed = strtoull(v, &end, 10);
        if (*end || end == v || errno || v[0] == '-')
            return bad_value(cmd, a, "an integer in [0, 2^64)", v);
        o->sampling.seed = seed;
        o->has_seed = true;
    }
    return 1;
}

void k3_cli_pick_seed(k3_cli_chat_opts *o) {
    if (o->has_seed) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    o->sampling.seed = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ---- printing the channels ------------------------------------------------------------------ */

#define SGR_DIM "\033[2m"
#define SGR_RESET "\033[0m"

typedef struct printer {
    const k3_gen_opts *o;
    int last_ch;      /* channel printed last, or -1 */
    bool dim;         /* SGR_DIM is active */
} printer;

static void print_chunk(printer *pr, enum k3_channel ch, const char *text, int len) {
    const k3_gen_opts *o = pr->o;
    if (len <= 0 || (ch == K3_CH_THINK && !o->show_thinking)) return;
    if ((int)ch != pr->last_ch) {
        if (pr->dim) fputs(SGR_RESET, o->out);
        pr->dim = false;
        if (pr->last_ch == K3_CH_THINK) fputs("\n\n", o->out); /* thinking, then the answer */
        if (ch == K3_CH_THINK && o->color) {
            fputs(SGR_DIM, o->out);
            pr->dim = true;
        }
        pr->last_ch = (int)ch;
    }
    fwrite(text, 1, (size_t)len, o->out);
}

/* ---- the loop's output side ------------------------------------------------------------------ */

/* One reply's printing: what emit() needs to record and print a sampled id. */
typedef struct gen_out {
    const k3_stops *stops;
    k3_reply_parser *parser;
    const k3_gen_opts *o;
    k3_gen_result *r;
    printer pr;
    k3_detok_stream ds;
    enum k3_channel ch;
    char *text;
    size_t cap;
    int n_think;      /* ids generated in the thinking channel */
} gen_out;

/* k3_gen_io.emit: records and prints the sampled id (never a stop string: false). */
static bool emit(void *user, int32_t id) {
    gen_out *g = user;
    const k3_gen_opts *o = g->o;
    k3_gen_result *r = g->r;
    bool stop = k3_stops_has(g->stops, id);
    int len;
    if (o->print_ids) fprintf(o->out, "%s%d", r->n_sampled ? "," : "", id);
    r->n_sampled++;
    if (!stop) r->ids[r->n++] = id;
    if (g->parser) {
        g->n_think += g->parser->pos == K3_IN_THINK;
        len = k3_reply_parser_push(g->parser, id, g->text, g->cap, &g->ch);
        if (!o->print_ids) print_chunk(&g->pr, g->ch, g->text, len);
    } else if (!o->print_ids && !stop) {
        len = k3_detok_stream_push(o->tok, &g->ds, id, g->text, g->cap);
        if (len > 0) fwrite(g->text, 1, (size_t)len, o->out);
    }
    fflush(o->out);
    return false;
}

/* k3_gen_io.fed: the logits after each fed id go to on_logits. */
static int fed(void *user, const float *logits, k3_err *err) {
    gen_out *g = user;
    return g->o->on_logits(g->o->user, logits, err);
}

int k3_cli_generate(k3_session *s, k3_sampler *sm, const k3_stops *stops, float *logits,
                    k3_reply_parser *parser, const k3_gen_opts *o, k3_gen_result *r,
                    k3_err *err) {
    *r = (k3_gen_result){.last_id = -1};
    gen_out g = {.stops = stops, .parser = parser, .o = o, .r = r, .pr = {o, -1, false},
                 .ch = K3_CH_RESPONSE, .cap = k3_reply_parser_out_cap(o->tok)};
    g.text = malloc(g.cap);
    r->ids = malloc(((size_t)o->max_new + 1) * sizeof *r->ids);
    if (!g.text || !r->ids) {
        free(g.text);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    k3_gen gen;
    int rc = K3_OK, len;
    k3_gen_start(&gen, s, sm, logits,
                 &(k3_gen_params){.max_new = o->max_new, .stops = stops, .spec = o->spec,
                                     .interrupt = &k3_cli_interrupted},
                 &(k3_gen_io){.user = &g, .emit = emit, .fed = o->on_logits ? fed : NULL});
    rc = k3_gen_run(&gen, err);
    r->last_id = gen.last_id;
    r->end = gen.end;
    r->decode_s = gen.decode_s;
    if (parser) {
        len = k3_reply_parser_finish(parser, g.text, g.cap, &g.ch);
        if (!o->print_ids) print_chunk(&g.pr, g.ch, g.text, len);
    } else if (!o->print_ids) {
        len = k3_detok_stream_flush(&g.ds, g.text, g.cap);
        if (len > 0) fwrite(g.text, 1, (size_t)len, o->out);
    }
    if (g.pr.dim) fputs(SGR_RESET, o->out);
    if (parser && !o->show_thinking && !o->print_ids && g.pr.last_ch < 0 && g.n_think > 0)
        fprintf(o->out, o->color ? SGR_DIM "(thinking hidden, %d tokens)" SGR_RESET
                                 : "(thinking hidden, %d tokens)", g.n_think);
    fputc('\n', o->out);
    fflush(o->out);
    free(g.text);
    return rc;
}
