/* gen.c — printing a reply of `k3 run` / `k3 chat` over the generation loop, and the flags
 * both share (see gen.h). */
#include "gen.h"
#include "../util/clock.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* ---- seed ------------------------------------------------------------------------------------ */

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

int k3_cli_pcache_prefill(k3_pcache *pc, k3_session *s, const k3_tokenizer *tok,
                          const int32_t *prompt, size_t n, bool verbose, size_t *held,
                          k3_err *err) {
    k3_pcache_stats st = {0};
    size_t pos = (size_t)k3_session_pos(s);
    if (pos > n || memcmp(k3_session_tokens(s), prompt, pos * sizeof *prompt)) pos = 0;
    size_t got = n > 1 ? k3_pcache_restore(pc, s, prompt, n, pos, n - 1, &st) : 0;
    if (!got && (size_t)k3_session_pos(s) != pos && pos) k3_session_reset(s); /* a bad file */
    *held = got ? got : pos;
    size_t cap = n / (K3_PCACHE_EVERY / 8) + 4, k = 0; /* marks are >= 256 apart but 2 */
    size_t *marks = malloc(cap * sizeof *marks);
    if (marks) /* without room for them, no snapshots: the prompt is prefilled all the same */
        k = k3_pcache_marks(prompt, n, *held, k3_tokenizer_special_id(tok, "<|end_of_msg|>"),
                            (size_t)k3_session_chunk(s), marks, cap);
    int rc = 0;
    int32_t eom = k3_tokenizer_special_id(tok, "<|end_of_msg|>");
    size_t inner = 0; /* the last snapshot written inside a message, dropped when superseded */
    for (size_t i = 0; i < k && !rc; i++) {
        rc = k3_session_prefill(s, prompt, marks[i], NULL, NULL, err);
        if (rc || !k3_pcache_save(pc, s, &st)) continue;
        if (inner) k3_pcache_drop(pc, prompt, inner, &st);
        inner = prompt[marks[i] - 1] != eom ? marks[i] : 0;
    }
    free(marks);
    if (verbose && st.hits)
        fprintf(stderr, "k3: prompt cache: %zu prompt tokens restored (%llu bytes read in "
                "%.3f s)\n", got, st.bytes_read, st.read_s);
    if (verbose && st.saves)
        fprintf(stderr, "k3: prompt cache: %llu snapshots written (%llu bytes in %.3f s)\n",
                st.saves, st.bytes_written, st.write_s);
    return rc;
}
