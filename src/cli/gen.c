/* gen.c — the decode loop shared by `k3 run` and `k3 chat`, and Ctrl-C (see gen.h). */
#include "gen.h"
#include "../util/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

volatile sig_atomic_t k3_cli_interrupted;
static int sigint_pipe[2] = {-1, -1}; /* CLI-level, like the flag: the handler's wake-up */

static void on_sigint(int sig) {
    (void)sig;
    int saved = errno;
    k3_cli_interrupted = 1;
    if (sigint_pipe[1] >= 0 && write(sigint_pipe[1], "!", 1) < 0) { /* full: already awake */ }
    errno = saved;
}

void k3_cli_catch_sigint(void) {
    if (sigint_pipe[0] < 0 && pipe2(sigint_pipe, O_NONBLOCK | O_CLOEXEC) != 0)
        sigint_pipe[0] = sigint_pipe[1] = -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a blocking call in the receiving thread returns EINTR */
    sigaction(SIGINT, &sa, NULL);
    k3_cli_clear_sigint();
}

int k3_cli_sigint_fd(void) { return sigint_pipe[0]; }

void k3_cli_clear_sigint(void) {
    char drain[64];
    while (sigint_pipe[0] >= 0 && read(sigint_pipe[0], drain, sizeof drain) > 0) {}
    k3_cli_interrupted = 0;
}

const char *k3_gen_end_name(enum k3_gen_end end) {
    switch (end) {
    case K3_GEN_STOP: return "end of message";
    case K3_GEN_MAX_NEW: return "--max-new reached";
    case K3_GEN_INTERRUPTED: return "interrupted (Ctrl-C)";
    case K3_GEN_CONTEXT: return "context full";
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

/* ---- the loop -------------------------------------------------------------------------------- */

/* One generation's output side: what emit() needs to print a sampled id and decide the end. */
typedef struct gen_out {
    k3_session *s;
    const k3_stops *stops;
    k3_reply_parser *parser;
    const k3_gen_opts *o;
    k3_gen_result *r;
    printer pr;
    k3_detok_stream ds;
    enum k3_channel ch;
    char *text;
    size_t cap;
    int fed;          /* ids in the session once those emitted so far are fed */
} gen_out;

/* Records and prints the sampled id; returns true (with r->end set) when the generation ends
 * at it, in which case it is not fed. */
static bool emit(gen_out *g, int32_t id) {
    const k3_gen_opts *o = g->o;
    k3_gen_result *r = g->r;
    bool stop = k3_stops_has(g->stops, id);
    int len;
    if (o->print_ids) fprintf(o->out, "%s%d", r->n_sampled ? "," : "", id);
    r->n_sampled++;
    r->last_id = id;
    if (!stop) r->ids[r->n++] = id;
    if (g->parser) {
        len = k3_reply_parser_push(g->parser, id, g->text, g->cap, &g->ch);
        if (!o->print_ids) print_chunk(&g->pr, g->ch, g->text, len);
    } else if (!o->print_ids && !stop) {
        len = k3_detok_stream_push(o->tok, &g->ds, id, g->text, g->cap);
        if (len > 0) fwrite(g->text, 1, (size_t)len, o->out);
    }
    fflush(o->out);
    if (stop || k3_cli_interrupted || r->n_sampled >= o->max_new ||
        g->fed >= k3_session_max_ctx(g->s)) {
        r->end = stop ? K3_GEN_STOP : k3_cli_interrupted ? K3_GEN_INTERRUPTED
               : r->n_sampled >= o->max_new ? K3_GEN_MAX_NEW : K3_GEN_CONTEXT;
        return true;
    }
    g->fed++; /* it will be fed */
    return false;
}

/* k3_spec_io callbacks: a kept id's logits go to on_logits; an accepted draft is emitted. */
static int spec_fed(void *user, const float *logits, k3_err *err) {
    gen_out *g = user;
    return g->o->on_logits ? g->o->on_logits(g->o->user, logits, err) : K3_OK;
}
static bool spec_accepted(void *user, int32_t id) { return emit(user, id); }

int k3_cli_generate(k3_session *s, k3_sampler *sm, const k3_stops *stops, float *logits,
                    k3_reply_parser *parser, const k3_gen_opts *o, k3_gen_result *r,
                    k3_err *err) {
    *r = (k3_gen_result){.last_id = -1};
    gen_out g = {.s = s, .stops = stops, .parser = parser, .o = o, .r = r, .pr = {o, -1, false},
                 .ch = K3_CH_RESPONSE, .cap = k3_reply_parser_out_cap(o->tok),
                 .fed = k3_session_pos(s)};
    g.text = malloc(g.cap);
    r->ids = malloc(((size_t)o->max_new + 1) * sizeof *r->ids);
    if (!g.text || !r->ids) {
        free(g.text);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    if (o->spec) k3_spec_restart(o->spec);
    k3_spec_io io = {&g, spec_fed, spec_accepted};
    double t0 = k3_now_s();
    int rc = K3_OK, len;
    for (;;) {
        if (r->n_sampled >= o->max_new) {
            r->end = K3_GEN_MAX_NEW;
            break;
        }
        int32_t id;
        if (!o->spec || !k3_spec_next(o->spec, &id)) id = k3_sampler_sample(sm, logits);
        if (emit(&g, id)) break;
        if (o->spec) { /* id, and maybe drafts K3 agrees with (emitted through io) */
            bool ended = false;
            int left = o->max_new - r->n_sampled - 1; /* drafts that can still be emitted */
            if ((rc = k3_spec_feed(o->spec, s, sm, id, left, logits, &io, &ended, err)) || ended)
                break;
            continue;
        }
        if ((rc = k3_session_step(s, id, logits, err))) break;
        if (o->on_logits && (rc = o->on_logits(o->user, logits, err))) break;
    }
    r->decode_s = k3_now_s() - t0;
    if (parser) {
        len = k3_reply_parser_finish(parser, g.text, g.cap, &g.ch);
        if (!o->print_ids) print_chunk(&g.pr, g.ch, g.text, len);
    } else if (!o->print_ids) {
        len = k3_detok_stream_flush(&g.ds, g.text, g.cap);
        if (len > 0) fwrite(g.text, 1, (size_t)len, o->out);
    }
    if (g.pr.dim) fputs(SGR_RESET, o->out);
    fputc('\n', o->out);
    fflush(o->out);
    free(g.text);
    return rc;
}
