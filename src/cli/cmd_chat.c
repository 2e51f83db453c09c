/* cmd_chat.c — `k3 chat`: an interactive conversation in the K3 chat format. The session
 * keeps the conversation's KDA, conv and MLA state between turns, so each turn prefills only
 * its own new tokens (src/chat/conv.h); the summary after each turn and /stats show it. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../chat/conv.h"
#include "../engine/k3.h"
#include "../util/fileio.h"
#include "cli.h"
#include "gen.h"
#include "load.h"
#include "opts.h"
#include "../util/clock.h"

#define PROMPT ">>> "
#define MORE "... "

typedef struct chat_opts {
    const char *model_dir;
    const char *tools_file; /* --tools FILE */
    int max_new;
    bool verbose;
    k3_cli_chat_opts co;
    k3_engine_opts eo;    /* engine options (opts.h) */
    k3_cli_common cc;     /* --ctx, --load-state, --save-state, --profile, ... */
    const char *prompt_cache; /* --prompt-cache DIR (src/server/pcache.h) */
    double prompt_cache_gb;
} chat_opts;

/* The slash commands: in --help, and all that /help prints. */
static const char chat_commands[] =
    "commands:\n"
    "  /reset               start a new conversation (state cleared)\n"
    "  /effort low|high|max thinking effort (the next turn re-reads the conversation)\n"
    "  /think on|off        thinking on or off (the next turn re-reads the conversation)\n"
    "  /save FILE           write the conversation as an OpenAI request body (JSON; works\n"
    "                       with k3 render --request FILE)\n"
    "  /load FILE           read a conversation saved by /save (its tokens are prefilled\n"
    "                       on the next turn)\n"
    "  /stats               tokens prefilled, reused and generated; context used;\n"
    "                       speculation (--spec)\n"
    "  /max-new N           cap the next replies at N tokens\n"
    "  /tool RESULT         answer the model's next pending tool call (with --tools); the\n"
    "                       reply continues once every call has its result\n"
    "  /help, /exit\n";

static const k3_opt chat_rows[] = {
    {.flag = "--max-new", K3_OPT_CMD(chat_opts, max_new), .field = "max_new", .type = K3_OPT_INT,
     .lo = 1, .hi = 1 << 30, .def = "1024", .meta = "N", .help = "at most N tokens per reply"},
    {.flag = "--tools", K3_OPT_CMD(chat_opts, tools_file), .field = "tools", .type = K3_OPT_STR,
     .meta = "FILE", .help = "declare tools (an OpenAI \"tools\" JSON array) to the model; its\n"
                             "tool calls are shown with their arguments"},
    {.flag = "--prompt-cache", K3_OPT_CMD(chat_opts, prompt_cache), .field = "prompt_cache",
     .type = K3_OPT_STR, .flags = K3_OPTF_NONEMPTY, .meta = "DIR",
     .help = "resume each turn from the longest prefix stored in DIR (by any earlier chat,\n"
             "run or server: the same system prompt and tools are not prefilled again) and\n"
             "store snapshots at message ends and every 2048 tokens"},
    {.flag = "--prompt-cache-gb", K3_OPT_CMD(chat_opts, prompt_cache_gb),
     .field = "prompt_cache_gb", .type = K3_OPT_DOUBLE, .lo = 1e-6, .hi = 1e6, .def = "32",
     .meta = "G", .help = "disk budget of --prompt-cache for this model's files"},
};

static const k3_cli_command chat_cmd = {
    .name = "chat",
    .usage =
        "usage: k3 chat [MODEL_DIR] [options]\n"
        "\n"
        "Talk to the model. Enter sends a message; end a line with \\ to continue on the next\n"
        "line, or put a block between two lines holding only \"\"\". The reply's thinking is\n"
        "shown dimmed (or hidden with --no-show-thinking), then its answer, then a summary.\n"
        "The conversation's model state is kept between turns: each turn prefills only its\n"
        "new tokens. Ctrl-C during a reply stops it after the current token (the partial reply\n"
        "stays in the conversation); during a long prompt it stops the prompt pass within a\n"
        "layer, and the message and the prompt passes done before it are kept (the next turn\n"
        "goes on from there); at the prompt Ctrl-C or Ctrl-D exits.\n"
        "A turn that fails prints its error and is dropped; the chat goes on, and its exit\n"
        "status is then that of the last failed turn (5 non-finite logits, 3 or 9 a spine\n"
        "layer or an expert that could not be read; k3 --help lists them), else 0.\n"
        "--load-state continues a state saved by k3 run --chat --save-state or k3 chat\n"
        "--save-state (written when the chat ends).\n",
    .rows = chat_rows, .n_rows = sizeof chat_rows / sizeof *chat_rows,
    .groups = K3_OG_MODEL | K3_OG_TRACE | K3_OG_SPEED | K3_OG_SAMPLING | K3_OG_CHAT |
              K3_OG_CTX | K3_OG_STATE,
    .epilog = chat_commands,
    .max_positional = 1,
};

static int parse_args(int argc, char **argv, chat_opts *o) {
    *o = (chat_opts){.verbose = true};
    k3_opts_parsed p;
    k3_opt_targets t = {&o->eo, &o->co, &o->cc, o};
    int rc = k3_opts_parse(&chat_cmd, argc, argv, &t, &p);
    if (rc) return rc;
    if ((rc = k3_model_arg("k3 chat", p.n_positional ? p.positional[0] : NULL, &o->model_dir)))
        return rc;
    o->verbose = !o->cc.quiet;
    o->eo.verbose = o->verbose;
    k3_err err = {0};
    if (o->cc.save_state && k3_cli_check_writable("--save-state", o->cc.save_state, &err)) {
        k3_opts_error("chat", &err);
        return err.code;
    }
    return 0;
}

/* ---- the REPL's state -------------------------------------------------------------------- */

typedef struct chat {
    const chat_opts *o;
    int max_new;       /* --max-new, changed by /max-new */
    const k3_engine *e;
    const k3_tokenizer *tok;
    k3_session *s;
    k3_conv conv;
    k3_stops stops;
    k3_sampler sm;     /* one PRNG stream for the whole conversation */
    k3_spec spec;      /* --spec: speculative decoding, statistics over the conversation */
    float *logits;
    k3_pcache *pc;     /* --prompt-cache, or NULL */
    bool color;
    /* /stats */
    int turns;
    long prefilled, reused, generated;
    double prefill_s, decode_s;
    int last_new, last_reused, last_gen;
    double last_prefill_s, last_decode_s;
    k3_cli_store_run *sr; /* the prompt's progress line */
} chat;

static void dim(const chat *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void dim(const chat *c, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t n = strlen(line);
    bool nl = n && line[n - 1] == '\n';
    if (nl) line[--n] = 0; /* end the style before the newline */
    printf(c->color ? "\033[2m%s\033[0m%s" : "%s%s", line, nl ? "\n" : "");
    fflush(stdout);
}

static int start_conversation(chat *c, k3_err *err) {
    k3_conv_reset(&c->conv);
    k3_session_reset(c->s);
    return c->o->co.system ? k3_conv_add(&c->conv, "system", c->o->co.system, err) : K3_OK;
}

/* ---- reading a message ------------------------------------------------------------------- */

/* Input is read from fd 0 with poll() on stdin and the SIGINT pipe together, so Ctrl-C at the
 * prompt is seen whichever thread took the signal (stdio's getline would keep waiting). */
typedef struct input {
    k3_strbuf pending; /* bytes read but not yet returned as lines */
    bool eof;
} input;

/* The next line without its newline (malloc'd) in *line: returns 1, 0 at end of input, -1 on
 * Ctrl-C. */
static int next_line(input *in, char **line) {
    for (;;) {
        char *p = in->pending.p, *nl = p ? memchr(p, '\n', in->pending.n) : NULL;
        if (nl || (in->eof && in->pending.n)) {
            size_t len = nl ? (size_t)(nl - p) : in->pending.n, used = len + (nl != NULL);
            if (!(*line = strndup(p, len))) return 0;
            memmove(p, p + used, in->pending.n - used);
            in->pending.n -= used;
            return 1;
        }
        if (in->eof || in->pending.oom) return 0;
        if (k3_cli_interrupted) return -1;
        struct pollfd pf[2] = {{0, POLLIN, 0}, {k3_cli_sigint_fd(), POLLIN, 0}};
        if (poll(pf, pf[1].fd >= 0 ? 2 : 1, -1) < 0 && errno != EINTR) return 0;
        if (k3_cli_interrupted) return -1;
        if (!(pf[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char chunk[4096];
        ssize_t k = read(0, chunk, sizeof chunk);
        if (k > 0)
            k3_strbuf_put(&in->pending, chunk, (size_t)k);
        else if (k == 0 || (errno != EINTR && errno != EAGAIN))
            in->eof = true;
    }
}

/* A whole message: continued lines ending in '\', or a block between two """ lines.
 * Returns a malloc'd string, or NULL at end of input / Ctrl-C. */
static char *read_message(input *in) {
    k3_strbuf msg = {0};
    bool block = false; /* between """ lines */
    int parts = 0;
    for (int i = 0;; i++) {
        fputs(i == 0 ? PROMPT : MORE, stdout);
        fflush(stdout);
        char *line;
        if (next_line(in, &line) != 1) {
            k3_strbuf_free(&msg);
            return NULL;
        }
        size_t n = strlen(line);
        bool fence = !strcmp(line, "\"\"\"");
        bool more = !block && !fence && n > 0 && line[n - 1] == '\\';
        if (!fence) {
            if (parts++) k3_strbuf_put(&msg, "\n", 1);
            k3_strbuf_put(&msg, line, n - more);
        }
        free(line);
        if (fence && i == 0) {
            block = true; /* the opening fence */
            continue;
        }
        if (fence || (!block && !more)) break; /* closing fence, or a last line */
    }
    if (msg.oom) {
        k3_strbuf_free(&msg);
        return NULL;
    }
    return msg.p ? msg.p : strdup("");
}

/* ---- a turn ------------------------------------------------------------------------------ */

static void turn_summary(chat *c, int n_new, int reused, double prefill_s,
                         const k3_gen_result *g) {
    k3_run_stats st;
    k3_session_stats(c->s, &st);
    char hits[64] = "";
    if (st.expert_requests)
        snprintf(hits, sizeof hits, "; expert store hit rate %.1f%%",
                 100.0 * (double)(st.hits + st.prefetch_hits) / (double)st.expert_requests);
    dim(c, "[%d new tokens prefilled (%d kept from earlier turns) in %.2f s; %d generated in "
        "%.2f s (%.1f tok/s); %s%s]\n", n_new, reused, prefill_s, g->n_sampled, g->decode_s,
        g->n_sampled > 1 ? (g->n_sampled - 1) / (g->decode_s + 1e-12) : 0.0,
        k3_gen_end_name(g->end), hits);
}

/* The tool calls of the reply just committed, for the user to answer with /tool. */
static void show_tool_calls(const chat *c) {
    const cJSON *m = cJSON_GetArrayItem(c->conv.messages,
                                        cJSON_GetArraySize(c->conv.messages) - 1);
    const cJSON *call;
    int k = 0;
    cJSON_ArrayForEach(call, cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(call, "function");
        printf("[tool call %d] %s %s\n", ++k,
               cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(f, "name")),
               cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(f, "arguments")));
    }
    if (k) dim(c, "(answer with /tool RESULT, one per call in order)\n");
}

static int turn(chat *c, const char *role, const char *text, k3_err *err) {
    int rc = k3_conv_add(&c->conv, role, text, err);
    if (!rc && (rc = k3_conv_prompt(&c->conv, err))) k3_conv_pop(&c->conv);
    if (rc) return rc;
    size_t n = c->conv.prompt.n;
    if (n + (size_t)c->max_new > (size_t)k3_session_max_ctx(c->s)) {
        k3_conv_pop(&c->conv);
        return k3_fail(err, K3_ERR_INPUT, "the conversation (%zu tokens) + --max-new (%d) would "
                       "pass the context of %d tokens: /reset, lower /max-new, or restart with a "
                       "larger --ctx", n, c->max_new, k3_session_max_ctx(c->s));
    }
    int reused = 0;
    double t0 = k3_now_s();
    size_t held = 0;
    if (c->sr) k3_cli_prompt_begin(c->sr, (int)n);
    if (c->pc) rc = k3_cli_pcache_prefill(c->pc, c->s, c->tok, c->conv.prompt.v, n,
                                          c->o->verbose, &held, err);
    if (!rc) rc = k3_session_prefill(c->s, c->conv.prompt.v, n, c->logits, &reused, err);
    if (c->sr) k3_cli_prompt_end(c->sr);
    if (c->pc) reused = (int)held;
    double prefill_s = k3_now_s() - t0;
    /* a pass stopped part-way goes back to where it began (k3.h): the passes before it stay */
    int n_new = k3_session_pos(c->s) > reused ? k3_session_pos(c->s) - reused : 0;
    c->prefilled += n_new;
    c->reused += reused;
    c->prefill_s += prefill_s;
    if (rc == K3_ERR_INTERRUPTED) { /* the message stays; the next turn goes on from the state */
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, "; kept: the %s and the state of %d of "
                 "its %zu prompt tokens, from which the next turn goes on",
                 strcmp(role, "tool") ? "message" : "result", k3_session_pos(c->s), n);
        return rc;
    }
    if (rc) { /* a failed turn leaves no trace: no two user messages in a row next time */
        k3_conv_pop(&c->conv);
        return rc;
    }

    k3_reply_parser p;
    k3_reply_parser_init(&p, c->tok, &c->stops, c->conv.thinking);
    k3_gen_opts go = {.tok = c->tok, .max_new = c->max_new,
                      .show_thinking = !c->o->co.hide_thinking, .color = c->color,
                      .out = stdout, .spec = c->spec.max_draft ? &c->spec : NULL};
    k3_gen_result g;
    rc = k3_cli_generate(c->s, &c->sm, &c->stops, c->logits, &p, &go, &g, err);
    if (!rc) {
        turn_summary(c, n_new, reused, prefill_s, &g);
        rc = k3_conv_commit(&c->conv, g.ids, g.n, &p, err);
        if (!rc) show_tool_calls(c);
        c->turns++;
        c->generated += g.n_sampled;
        c->decode_s += g.decode_s;
        c->last_new = n_new, c->last_reused = reused, c->last_gen = g.n_sampled;
        c->last_prefill_s = prefill_s, c->last_decode_s = g.decode_s;
    } else {
        k3_conv_pop(&c->conv); /* as for a failed prefill */
    }
    k3_reply_parser_free(&p);
    free(g.ids);
    return rc;
}

/* ---- commands ---------------------------------------------------------------------------- */

static void stats(const chat *c) {
    long total = c->prefilled + c->reused;
    printf("turns %d; context %d of %d positions in use\n", c->turns, k3_session_pos(c->s),
           k3_session_max_ctx(c->s));
    printf("prefill: %ld tokens computed in %.2f s, %ld kept from earlier turns instead of "
           "recomputed", c->prefilled, c->prefill_s, c->reused);
    if (total) printf(" (%.0f%% of what re-reading the whole conversation each turn costs "
                      "was saved)", 100.0 * (double)c->reused / (double)total);
    printf("\ngenerated: %ld tokens in %.2f s (%.1f tok/s)\n", c->generated, c->decode_s,
           c->generated / (c->decode_s + 1e-12));
    if (c->turns)
        printf("last turn: %d new tokens prefilled (%d kept) in %.3f s; %d generated in "
               "%.2f s\n", c->last_new, c->last_reused, c->last_prefill_s, c->last_gen,
               c->last_decode_s);
    const k3_sampler_opts *so = &c->o->co.sampling;
    if (so->temperature > 0)
        printf("sampling: temperature %g, top-k %d, top-p %g, seed %llu\n", so->temperature,
               so->top_k, so->top_p, (unsigned long long)so->seed);
    else
        printf("sampling: greedy\n");
    printf("thinking %s, effort %s; %d messages\n", c->conv.thinking ? "on" : "off",
           c->conv.effort, cJSON_GetArraySize(c->conv.messages));
    if (c->spec.max_draft) {
        char line[768];
        k3_spec_summary(&c->spec, c->generated, line, sizeof line);
        printf("%s\n", line);
    }
}

static int save(const chat *c, const char *path, k3_err *err) {
    char *json = k3_conv_to_json(&c->conv);
    if (!json) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    FILE *f = fopen(path, "w");
    int rc = K3_OK;
    if (!f || fputs(json, f) < 0 || fputc('\n', f) == EOF)
        rc = k3_fail(err, K3_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    if (f && fclose(f) != 0 && !rc) rc = k3_fail(err, K3_ERR_IO, "%s: write failed", path);
    free(json);
    return rc;
}

static int load(chat *c, const char *path, k3_err *err) {
    char *buf;
    size_t len;
    int rc = k3_read_file(path, (size_t)256 << 20, &buf, &len, err);
    if (rc) return rc;
    rc = k3_conv_from_json(&c->conv, buf, len, err);
    free(buf);
    if (rc) return k3_err_prefix(err, "%s", path);
    return K3_OK;
}

/* Runs one /command; returns 1 to exit the REPL. Errors are printed, not fatal. */
static int command(chat *c, const char *line) {
    char cmd[16] = "", arg[4096] = "";
    sscanf(line, "/%15s %4095[^\n]", cmd, arg);
    k3_err err = {0};
    int rc = K3_OK;
    if (!strcmp(cmd, "exit") || !strcmp(cmd, "quit")) return 1;
    if (!strcmp(cmd, "help")) {
        printf("%s", chat_commands);
    } else if (!strcmp(cmd, "reset")) {
        if (!(rc = start_conversation(c, &err))) dim(c, "(new conversation)\n");
    } else if (!strcmp(cmd, "effort")) {
        if (!(rc = k3_conv_set_effort(&c->conv, arg, &err)))
            dim(c, "(thinking effort %s)\n", c->conv.effort);
    } else if (!strcmp(cmd, "think") && (!strcmp(arg, "on") || !strcmp(arg, "off"))) {
        k3_conv_set_thinking(&c->conv, !strcmp(arg, "on"));
        dim(c, "(thinking %s)\n", arg);
    } else if (!strcmp(cmd, "save") && arg[0]) {
        if (!(rc = save(c, arg, &err))) dim(c, "(saved %d messages to %s)\n",
                                          cJSON_GetArraySize(c->conv.messages), arg);
    } else if (!strcmp(cmd, "load") && arg[0]) {
        if (!(rc = load(c, arg, &err)))
            dim(c, "(loaded %d messages; the next turn prefills them)\n",
                cJSON_GetArraySize(c->conv.messages));
    } else if (!strcmp(cmd, "tool") && arg[0]) {
        int pending = k3_conv_pending_tools(&c->conv);
        if (!pending) {
            printf("no tool call is waiting for a result\n");
        } else if (pending > 1) {
            if (!(rc = k3_conv_add(&c->conv, "tool", arg, &err)))
                dim(c, "(%d more tool results expected)\n", pending - 1);
        } else {
            rc = turn(c, "tool", arg, &err);
            if (rc == K3_ERR_INTERRUPTED) {
                dim(c, "(%s)\n", err.msg);
                rc = K3_OK;
            }
        }
    } else if (!strcmp(cmd, "stats")) {
        stats(c);
    } else if (!strcmp(cmd, "max-new") && atoi(arg) > 0) {
        c->max_new = atoi(arg);
        dim(c, "(at most %d tokens per reply)\n", c->max_new);
    } else {
        printf("unknown command '%s' (try /help)\n", line);
    }
    char text[sizeof err.msg + 256];
    if (rc) printf("error: %s\n", k3_opts_render(&err, text, sizeof text));
    return 0;
}

/* ---- main loop --------------------------------------------------------------------------- */

/* --load-state: the session holds the saved ids and the conversation continues them. */
static int load_state(chat *c, k3_err *err) {
    int rc = k3_session_load(c->s, c->o->cc.load_state, err);
    if (!rc) rc = k3_conv_set_history(&c->conv, k3_session_tokens(c->s),
                                      (size_t)k3_session_pos(c->s), err);
    if (!rc && c->o->verbose)
        fprintf(stderr, "k3: continuing the %d positions saved in %s\n", k3_session_pos(c->s),
                c->o->cc.load_state);
    return rc;
}

/* --save-state at the end: the conversation's ids (the last reply closed), then the file. */
static int save_state(chat *c, k3_err *err) {
    const int32_t *ids;
    size_t n;
    int rc = k3_conv_history(&c->conv, &ids, &n, err);
    if (!rc) rc = k3_session_prefill(c->s, ids, n, NULL, NULL, err);
    if (!rc) rc = k3_session_save(c->s, c->o->cc.save_state, err);
    if (!rc && c->o->verbose)
        fprintf(stderr, "k3: saved the state after %d positions to %s\n", k3_session_pos(c->s),
                c->o->cc.save_state);
    return rc;
}

static int repl(chat *c, k3_err *err) {
    int rc = start_conversation(c, err);
    if (!rc && c->o->cc.load_state) rc = load_state(c, err);
    if (rc) return rc;
    printf("k3 chat: Enter sends; end a line with \\ to continue it, or wrap a block in \"\"\" "
           "lines. /help lists commands; Ctrl-D exits.\n");
    input in = {0};
    int failed = 0; /* the last failed turn's status: the exit status (scripts see it) */
    k3_err last = {0};
    for (;;) {
        k3_cli_clear_sigint();
        char *msg = read_message(&in);
        if (!msg) {
            putchar('\n');
            fflush(stdout);
            k3_strbuf_free(&in.pending);
            if (failed) *err = last;
            return failed; /* Ctrl-D, or Ctrl-C at the prompt */
        }
        int quit = 0;
        if (msg[0] == '/') {
            quit = command(c, msg);
        } else if (msg[strspn(msg, " \t\n")]) {
            k3_err terr = {0};
            int trc = turn(c, "user", msg, &terr);
            if (trc == K3_ERR_INTERRUPTED)
                dim(c, "(%s)\n", terr.msg);
            else if (trc) {
                char text[sizeof terr.msg + 256];
                printf("error: %s\n", k3_opts_render(&terr, text, sizeof text));
                failed = trc, last = terr;
            }
        }
        free(msg);
        if (quit) {
            k3_strbuf_free(&in.pending);
            if (failed) *err = last;
            return failed;
        }
    }
}

/* --tools FILE: an OpenAI "tools" array (or a request body holding one). */
static int load_tools(k3_conv *conv, const char *path, k3_err *err) {
    char *buf;
    size_t len;
    int rc = k3_read_file(path, (size_t)16 << 20, &buf, &len, err);
    if (rc) return rc;
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    const cJSON *tools = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "tools") : j;
    rc = j ? k3_conv_set_tools(conv, tools, err) : k3_fail(err, K3_ERR_INPUT, "not valid JSON");
    cJSON_Delete(j);
    return rc ? k3_err_prefix(err, "--tools %s", path) : K3_OK;
}

static int chat_main(const chat_opts *o, k3_err *err) {
    chat c = {.o = o, .max_new = o->max_new, .color = isatty(1)};
    k3_engine_opts eo = o->eo;
    if (o->co.chunk) eo.prompt_rows = o->co.chunk; /* the plan counts passes of that many */
    eo.ctx = o->cc.ctx; /* the plan counts the session at its context */
    k3_cli_model m;
    k3_cli_store_run sr = {0};
    int rc = k3_cli_model_load(o->model_dir, &eo, &o->cc, &m, err);
    if (rc) return rc;
    k3_engine *e = m.e;
    c.e = e;
    c.tok = k3_engine_tokenizer(e);
    k3_stops_init(&c.stops, c.tok, k3_engine_config(e)->eos_token_id);
    rc = k3_session_new(e, o->cc.ctx, &c.s, err);
    if (!rc && o->co.chunk) k3_session_set_chunk(c.s, o->co.chunk);
    if (!rc) rc = k3_cli_store_attach(&sr, c.s, &o->cc, err);
    sr.dist = m.dist;
    c.sr = &sr;
    if (!rc) rc = k3_conv_init(&c.conv, c.tok, err);
    if (!rc) rc = k3_sampler_init(&c.sm, &o->co.sampling, k3_engine_config(e)->vocab_size, err);
    if (!rc && o->co.spec) rc = k3_spec_init(&c.spec, o->co.spec, c.s, &c.sm, err);
    if (!rc && o->co.spec && c.spec.never) fprintf(stderr, "k3: --spec is off: %s\n", c.spec.why);
    if (!rc && !(c.logits = malloc((size_t)k3_engine_config(e)->vocab_size * sizeof(float))))
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    if (!rc && o->tools_file) rc = load_tools(&c.conv, o->tools_file, err);
    if (!rc && o->prompt_cache)
        rc = k3_pcache_open(e, o->prompt_cache, o->prompt_cache_gb, 0, &c.pc, err);
    if (!rc) {
        k3_conv_set_thinking(&c.conv, !o->co.no_think);
        rc = k3_conv_set_effort(&c.conv, o->co.effort ? o->co.effort : "max", err);
    }
    if (!rc) {
        k3_cli_catch_sigint();
        k3_session_set_interrupt(c.s, &k3_cli_interrupted);
        rc = repl(&c, err);
        if (!rc && o->cc.save_state) rc = save_state(&c, err);
    }
    k3_cli_store_finish(&sr, o->verbose && !rc);
    k3_pcache_close(c.pc);
    free(c.logits);
    k3_spec_free(&c.spec);
    k3_sampler_free(&c.sm);
    k3_conv_free(&c.conv);
    k3_session_free(c.s);
    k3_cli_model_free(&m);
    return rc;
}

int k3_cmd_chat(int argc, char **argv) {
    chat_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (o.co.sampling.temperature > 0) k3_cli_pick_seed(&o.co);
    k3_err err = {0};
    rc = chat_main(&o, &err);
    if (rc) {
        fflush(stdout);
        k3_opts_error("chat", &err);
    }
    return rc;
}
