/* cmd_run.c — `k3 run`: tokenize (or render one chat turn), prefill, decode (greedy or
 * sampled), stream text; optionally continue from / save a state file. */
#include <errno.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../chat/conv.h"
#include "../engine/k3.h"
#include "../tok/tokenizer.h"
#include "cli.h"
#include "gen.h"
#include "idlist.h"
#include "load.h"
#include "opts.h"
#include "../util/clock.h"
#include "../util/fileio.h"

typedef struct run_opts {
    const char *model_dir, *prompt, *prompt_file, *prompt_ids, *dump_logits;
    char *prompt_text;               /* --prompt - or --prompt-file: malloc'd */
    int max_new;
    bool special, print_ids, verbose;
    bool chat;                       /* --chat: render --prompt as one user turn */
    k3_cli_chat_opts co;             /* sampling and chat options (gen.h) */
    k3_engine_opts eo;               /* engine options (opts.h) */
    k3_cli_common cc;                /* --ctx, --save-state, --load-state, --profile, ... */
    const char *prompt_cache;        /* --prompt-cache DIR (src/server/pcache.h) */
    double prompt_cache_gb;
} run_opts;

#define RUN(f) K3_OPT_CMD(run_opts, f), .field = #f
static const k3_opt run_rows[] = {
    {.flag = "--prompt", RUN(prompt), .type = K3_OPT_STR, .meta = "TEXT",
     .help = "prompt text (UTF-8); no [BOS] is added; - reads it from stdin"},
    {.flag = "--prompt-file", RUN(prompt_file), .type = K3_OPT_STR, .meta = "FILE",
     .help = "read the prompt text from FILE"},
    {.flag = "--prompt-ids", RUN(prompt_ids), .type = K3_OPT_STR, .meta = "IDS",
     .help = "token ids instead of --prompt (commas or spaces between them)"},
    {.flag = "--chat", RUN(chat), .type = K3_OPT_SWITCH, .value = 1,
     .help = "render TEXT as one user turn in the K3 chat format (spec §12: thinking-"
             "effort message, generation prompt) and print the reply's thinking (dimmed\n"
             "on a terminal), then its answer"},
    {.flag = "--special", RUN(special), .type = K3_OPT_SWITCH, .value = 1,
     .help = "let special-token spellings in TEXT (e.g. [BOS], <|sep|>) become their\n"
             "ids (default: they are ordinary text)"},
    {.flag = "--max-new", RUN(max_new), .type = K3_OPT_INT, .lo = 0, .hi = 1 << 30,
     .def = "128", .meta = "N", .help = "generate at most N tokens"},
    {.flag = "--ids", RUN(print_ids), .type = K3_OPT_SWITCH, .value = 1,
     .help = "print the generated ids (one line, comma-separated), not text"},
    {.flag = "--dump-logits", RUN(dump_logits), .type = K3_OPT_STR, .meta = "FILE",
     .help = "write float32 little-endian logits, row-major [rows, vocab]: row i = the\n"
             "logits after position i, for every prompt position and every generated\n"
             "token fed back (shape printed to stderr)"},
    {.flag = "--prompt-cache", RUN(prompt_cache), .type = K3_OPT_STR, .flags = K3_OPTF_NONEMPTY,
     .meta = "DIR",
     .help = "resume from the longest prefix of the prompt stored in DIR (by any earlier\n"
             "run, chat or server) and store snapshots at its message ends and every 2048\n"
             "tokens (as k3 serve --prompt-cache; not with --dump-logits)"},
    {.flag = "--prompt-cache-gb", RUN(prompt_cache_gb), .type = K3_OPT_DOUBLE, .lo = 1e-6,
     .hi = 1e6, .def = "32", .meta = "G",
     .help = "disk budget of --prompt-cache for this model's files"},
};

static const k3_cli_command run_cmd = {
    .name = "run",
    .usage =
        "usage: k3 run [MODEL_DIR] (--prompt TEXT | --prompt-file FILE | --prompt-ids IDS)\n"
        "              [options]\n"
        "\n"
        "Generates from the exact float32 model (greedily unless --temperature is given) and\n"
        "prints text as each token is produced. Stops after --max-new tokens or at an\n"
        "end-of-message token (<|end_of_msg|>, [EOS], [EOT]). Ctrl-C stops after the current\n"
        "token, prints the text and the summary and exits with status 130 (in the prompt it\n"
        "stops within a layer). Without MODEL_DIR the bundled fixture model is used.\n"
        "--system, --effort and the thinking flags apply with --chat.\n",
    .rows = run_rows, .n_rows = sizeof run_rows / sizeof *run_rows,
    .groups = K3_OG_MODEL | K3_OG_TRACE | K3_OG_SPEED | K3_OG_SAMPLING | K3_OG_CHAT |
              K3_OG_CTX | K3_OG_STATE,
    .max_positional = 1,
};

/* --prompt - (stdin) or --prompt-file FILE into o->prompt_text. */
static int read_prompt(run_opts *o, k3_err *err) {
    size_t len = 0;
    if (o->prompt_file)
        return k3_read_file(o->prompt_file, 256u << 20, &o->prompt_text, &len, err) ? err->code
               : (o->prompt = o->prompt_text, K3_OK);
    size_t cap = 0;
    char *buf = NULL;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            char *nb = realloc(buf, cap = 2 * cap + 65536 + 1);
            if (!nb) {
                free(buf);
                return k3_fail(err, K3_ERR_GENERIC, "out of memory reading stdin");
            }
            buf = nb;
        }
        size_t k = fread(buf + len, 1, cap - len - 1, stdin);
        len += k;
        if (k == 0) break;
    }
    if (ferror(stdin)) {
        free(buf);
        return k3_fail(err, K3_ERR_IO, "--prompt -: reading stdin failed");
    }
    buf[len] = 0;
    o->prompt = o->prompt_text = buf;
    return K3_OK;
}

/* Without --ctx, the positions this run can need, so the memory plan counts its session at
 * that and not at the default 4096 (src/engine/plan.h, "Sessions"): a raw prompt of B bytes
 * is at most B tokens (every token is at least one byte), ids are counted, then --max-new.
 * 0 (the default context) for a chat turn (the template adds tokens), a loaded state
 * (positions from the file) and --spec (drafts run ahead); never above 4096. */
static int expected_ctx(const run_opts *o) {
    if (o->chat || o->cc.load_state || o->co.spec) return 0;
    size_t n = 0;
    if (o->prompt_ids) {
        int32_t *ids = NULL;
        k3_err ignored; /* a bad list is reported when the prompt is read */
        if (k3_cli_parse_ids(o->prompt_ids, strlen(o->prompt_ids), "--prompt-ids", 0, INT32_MAX,
                             &ids, &n, &ignored))
            return 0;
        free(ids);
    } else if (o->prompt) {
        n = strlen(o->prompt);
    }
    size_t need = n + (size_t)o->max_new;
    return need > 0 && need < 4096 ? (int)need : 0;
}

static int parse_args(int argc, char **argv, run_opts *o) {
    *o = (run_opts){.verbose = true};
    k3_opts_parsed p;
    k3_opt_targets t = {&o->eo, &o->co, &o->cc, o};
    int rc = k3_opts_parse(&run_cmd, argc, argv, &t, &p);
    if (rc) return rc;
    o->model_dir = p.n_positional ? p.positional[0] : NULL;
    o->verbose = !o->cc.quiet;
    o->eo.verbose = o->verbose;
    if ((o->prompt != NULL) + (o->prompt_file != NULL) + (o->prompt_ids != NULL) != 1) {
        fprintf(stderr, "k3 run: give exactly one of --prompt, --prompt-file or --prompt-ids "
                "(see k3 run --help)\n");
        return K3_ERR_USAGE;
    }
    if (o->chat && (o->prompt_ids || o->special)) {
        fprintf(stderr, "k3 run: --chat takes the user's text with --prompt; --prompt-ids and "
                "--special apply to raw prompts only\n");
        return K3_ERR_USAGE;
    }
    k3_err err = {0};
    if (o->cc.save_state && k3_cli_check_writable("--save-state", o->cc.save_state, &err)) {
        k3_opts_error("run", &err);
        return err.code;
    }
    if ((o->prompt_file || (o->prompt && !strcmp(o->prompt, "-"))) && read_prompt(o, &err)) {
        k3_opts_error("run", &err);
        return err.code;
    }
    if ((rc = k3_model_arg("k3 run", o->model_dir, &o->model_dir))) return rc;
    o->eo.ctx = o->cc.ctx ? o->cc.ctx : expected_ctx(o);
    return 0;
}

typedef struct run_ctx {
    const run_opts *o;
    const k3_engine *e;
    const k3_tokenizer *tok;
    k3_session *s;
    float *logits;
    FILE *dump;
    long dump_rows;
    int vocab;
    k3_conv conv;      /* --chat */
    bool has_conv;
    k3_pcache *pc;     /* --prompt-cache, or NULL */
    k3_cli_store_run *sr; /* the prompt's progress line */
} run_ctx;

static int dump_row(void *user, const float *logits, k3_err *err) {
    run_ctx *r = user;
    if (fwrite(logits, sizeof(float), (size_t)r->vocab, r->dump) != (size_t)r->vocab)
        return k3_fail(err, K3_ERR_IO, "%s: write failed: %s", r->o->dump_logits, strerror(errno));
    r->dump_rows++;
    return K3_OK;
}

/* The whole id sequence to prefill: a loaded state's ids, then the raw prompt or the
 * rendered chat turn. *prompt is malloc'd. */
static int build_prompt(run_ctx *r, int32_t **prompt, size_t *n, k3_err *err) {
    const run_opts *o = r->o;
    const int32_t *held = k3_session_tokens(r->s);
    size_t n_held = (size_t)k3_session_pos(r->s);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc;
    if (o->chat) {
        if ((rc = k3_conv_init(&r->conv, r->tok, err))) return rc;
        r->has_conv = true;
        k3_conv_set_thinking(&r->conv, !o->co.no_think);
        rc = k3_conv_set_effort(&r->conv, o->co.effort ? o->co.effort : "max", err);
        if (!rc) rc = k3_conv_set_history(&r->conv, held, n_held, err);
        if (!rc && o->co.system) rc = k3_conv_add(&r->conv, "system", o->co.system, err);
        if (!rc) rc = k3_conv_add(&r->conv, "user", o->prompt, err);
        if (!rc) rc = k3_conv_prompt(&r->conv, err);
        if (rc) return rc;
        n_ids = r->conv.prompt.n;
        if (!(ids = malloc((n_ids + 1) * sizeof *ids)))
            return k3_fail(err, K3_ERR_GENERIC, "out of memory");
        memcpy(ids, r->conv.prompt.v, n_ids * sizeof *ids);
    } else {
        int32_t *part;
        size_t n_part;
        if (o->prompt_ids)
            rc = k3_cli_parse_ids(o->prompt_ids, strlen(o->prompt_ids), "--prompt-ids", 0,
                                  r->vocab, &part, &n_part, err);
        else
            rc = k3_tokenizer_encode(r->tok, o->prompt, strlen(o->prompt), o->special, &part,
                                     &n_part, err);
        if (!rc && n_part == 0) rc = k3_fail(err, K3_ERR_USAGE, "the prompt is empty");
        if (rc) return rc;
        n_ids = n_held + n_part;
        if (!(ids = malloc(n_ids * sizeof *ids))) {
            free(part);
            return k3_fail(err, K3_ERR_GENERIC, "out of memory");
        }
        memcpy(ids, held, n_held * sizeof *ids);
        memcpy(ids + n_held, part, n_part * sizeof *ids);
        free(part);
    }
    *prompt = ids;
    *n = n_ids;
    return K3_OK;
}

/* k3_prefill_hook: --dump-logits writes the rows of each prefill pass. */
static int dump_pass(void *user, int pos, int n, const float *rows, size_t left, k3_err *err) {
    (void)pos, (void)left;
    run_ctx *r = user;
    int rc = K3_OK;
    for (int t = 0; t < n && !rc; t++) rc = dump_row(r, rows + (size_t)t * (size_t)r->vocab, err);
    return rc;
}

/* Feeds what the saved timeline still lacks and writes the state file: raw, the last
 * sampled id (even a stop id: the timeline holds every generated token); chat, the rest of
 * the reply and its closing ids, so the state ends at a message boundary. */
static int save_state(run_ctx *r, const k3_gen_result *g, k3_err *err) {
    int rc = K3_OK;
    if (r->has_conv) {
        const int32_t *ids;
        size_t n;
        rc = k3_conv_history(&r->conv, &ids, &n, err);
        if (!rc) rc = k3_session_prefill(r->s, ids, n, NULL, NULL, err);
    } else if (g->n_sampled > 0) {
        rc = k3_session_step(r->s, g->last_id, NULL, err);
    }
    if (!rc) rc = k3_session_save(r->s, r->o->cc.save_state, err);
    if (!rc && r->o->verbose)
        fprintf(stderr, "k3: saved the state after %d positions to %s\n", k3_session_pos(r->s),
                r->o->cc.save_state);
    return rc;
}

/* The end-of-run line; fed = prompt tokens computed (fewer than n_prompt - reused when Ctrl-C
 * stopped the prefill, then end_note says so). */
static void summary(const run_ctx *r, size_t n_prompt, size_t reused, size_t fed,
                    double prefill_s, const k3_gen_result *g, const char *end_note) {
    if (!r->o->verbose) return;
    char from_state[64] = "";
    if (reused)
        snprintf(from_state, sizeof from_state, " (%zu from the state, %zu new)", reused, fed);
    char sampling[96] = "greedy";
    const k3_sampler_opts *so = &r->o->co.sampling;
    if (so->temperature > 0)
        snprintf(sampling, sizeof sampling, "temperature %g, top-k %d, top-p %g, seed %llu",
                 so->temperature, so->top_k, so->top_p, (unsigned long long)so->seed);
    fprintf(stderr, "k3: prompt %zu tokens%s in %.3f s (%.2f tok/s), generated %d tokens in "
            "%.3f s (%.2f tok/s), %s; %s\n", n_prompt, from_state, prefill_s,
            fed / (prefill_s + 1e-12), g->n_sampled, g->decode_s,
            g->n_sampled > 1 ? (g->n_sampled - 1) / (g->decode_s + 1e-12) : 0.0, sampling,
            end_note ? end_note : k3_gen_end_name(g->end));
}

static int generate(run_ctx *r, const int32_t *prompt, size_t n_prompt, k3_err *err) {
    const run_opts *o = r->o;
    k3_sampler sm;
    k3_stops stops;
    k3_reply_parser parser;
    k3_gen_result g = {0};
    int kept = 0; /* positions of a loaded state that the prompt extends */
    int rc = k3_sampler_init(&sm, &o->co.sampling, r->vocab, err);
    if (rc) return rc;
    k3_stops_init(&stops, r->tok, k3_engine_config(r->e)->eos_token_id);
    if (r->has_conv) k3_reply_parser_init(&parser, r->tok, &stops, !o->co.no_think);
    double t0 = k3_now_s();
    /* Ctrl-C stops the prefill within a layer (K3_ERR_INTERRUPTED): the session is back where
     * that pass began, the passes before it kept (the summary counts them as fed) */
    k3_prefill_hook dump = {.user = r, .on_pass = dump_pass, .all_logits = 1};
    size_t held = 0;
    if (r->pc && n_prompt > 1)
        rc = k3_cli_pcache_prefill(r->pc, r->s, r->tok, prompt, n_prompt, o->verbose, &held,
                                   err);
    if (!rc)
        rc = k3_session_prefill_with(r->s, prompt, n_prompt, r->logits, &kept,
                                     r->dump ? &dump : NULL, err);
    if (r->sr) k3_cli_prompt_end(r->sr);
    size_t reused = r->pc ? held : (size_t)kept;
    double prefill_s = k3_now_s() - t0;
    /* a pass stopped part-way goes back to where it began (k3.h): the passes before it stay */
    size_t pos = (size_t)k3_session_pos(r->s), fed = pos > reused ? pos - reused : 0;
    const char *end_note = rc == K3_ERR_INTERRUPTED ? "interrupted (Ctrl-C) in the prompt" : NULL;
    k3_spec spec = {0};
    if (!rc && o->co.spec) rc = k3_spec_init(&spec, o->co.spec, r->s, &sm, err);
    if (!rc) {
        k3_gen_opts go = {.tok = r->tok, .max_new = o->max_new, .print_ids = o->print_ids,
                          .show_thinking = !o->co.hide_thinking, .color = isatty(1),
                          .out = stdout, .on_logits = r->dump ? dump_row : NULL, .user = r,
                          .spec = o->co.spec ? &spec : NULL};
        rc = k3_cli_generate(r->s, &sm, &stops, r->logits, r->has_conv ? &parser : NULL, &go,
                             &g, err);
    }
    if (!rc || rc == K3_ERR_INTERRUPTED)
        summary(r, n_prompt, reused, fed, prefill_s, &g, end_note);
    if ((!rc || rc == K3_ERR_INTERRUPTED) && o->co.spec && o->verbose) {
        char line[768];
        k3_spec_summary(&spec, g.n_sampled, line, sizeof line);
        fprintf(stderr, "k3: %s\n", line);
    }
    k3_spec_free(&spec);
    if (!rc && g.end == K3_GEN_INTERRUPTED)
        rc = k3_fail(err, K3_ERR_INTERRUPTED, "interrupted after %d generated tokens",
                     g.n_sampled);
    if (!rc && r->has_conv) rc = k3_conv_commit(&r->conv, g.ids, g.n, &parser, err);
    if (!rc && o->cc.save_state) rc = save_state(r, &g, err);
    if (r->has_conv) k3_reply_parser_free(&parser);
    k3_sampler_free(&sm);
    free(g.ids);
    return rc;
}

static int run(const run_opts *o, k3_err *err) {
    k3_engine *e = NULL;
    k3_session *s = NULL;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    run_ctx r = {.o = o};
    k3_engine_opts eo = o->eo;
    if (o->co.chunk) eo.prompt_rows = o->co.chunk; /* the plan counts passes of that many */
    k3_cli_model m;
    k3_cli_store_run sr = {0};
    int rc = k3_cli_model_load(o->model_dir, &eo, &o->cc, &m, err);
    if (rc) return rc;
    e = m.e;
    r.e = e;
    r.tok = k3_engine_tokenizer(e);
    r.vocab = k3_engine_config(e)->vocab_size;
    int ctx = o->eo.ctx, model_max = k3_engine_config(e)->max_position_embeddings;
    if (!o->cc.ctx && ctx > model_max) ctx = model_max; /* the check below then says why */
    if ((rc = k3_session_new(e, ctx, &s, err))) goto done;
    r.s = s;
    if (o->co.chunk) k3_session_set_chunk(s, o->co.chunk);
    if ((rc = k3_cli_store_attach(&sr, s, &o->cc, err))) goto done;
    sr.dist = m.dist;
    if (o->cc.load_state && (rc = k3_session_load(s, o->cc.load_state, err))) goto done;
    if (o->prompt_cache && o->dump_logits) {
        rc = k3_fail(err, K3_ERR_USAGE, "--prompt-cache skips the prompt positions it restores, "
                     "--dump-logits needs each one's logits: give one of them");
        goto done;
    }
    if (o->prompt_cache &&
        (rc = k3_pcache_open(e, o->prompt_cache, o->prompt_cache_gb, 0, &r.pc, err)))
        goto done;
    if ((rc = build_prompt(&r, &prompt, &n_prompt, err))) goto done;
    if ((size_t)k3_session_max_ctx(s) < n_prompt + (size_t)o->max_new) {
        int model_max = k3_engine_config(e)->max_position_embeddings;
        rc = k3_fail(err, K3_ERR_INPUT, "prompt (%zu tokens) + --max-new (%d) exceed the context "
                     "of %d tokens: lower --max-new%s", n_prompt, o->max_new,
                     k3_session_max_ctx(s), k3_session_max_ctx(s) < model_max
                         ? " or raise --ctx (the model allows up to max_position_embeddings)"
                         : " or shorten the prompt (the model allows no more)");
        goto done;
    }
    if (!(r.logits = malloc((size_t)r.vocab * sizeof(float)))) {
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
        goto done;
    }
    if (o->dump_logits && !(r.dump = fopen(o->dump_logits, "wb"))) {
        rc = k3_fail(err, K3_ERR_IO, "%s: cannot create: %s", o->dump_logits, strerror(errno));
        goto done;
    }
    k3_cli_catch_sigint();
    k3_session_set_interrupt(s, &k3_cli_interrupted);
    k3_cli_prompt_begin(&sr, (int)n_prompt);
    r.sr = &sr;
    rc = generate(&r, prompt, n_prompt, err);
    if (r.dump) {
        if (fclose(r.dump) != 0 && !rc)
            rc = k3_fail(err, K3_ERR_IO, "%s: write failed", o->dump_logits);
        else if (!rc)
            fprintf(stderr, "k3: wrote logits [%ld, %d] float32 to %s\n", r.dump_rows, r.vocab,
                    o->dump_logits);
    }
done:
    k3_cli_store_finish(&sr, o->verbose && (!rc || rc == K3_ERR_INTERRUPTED));
    if (r.has_conv) k3_conv_free(&r.conv);
    k3_pcache_close(r.pc);
    free(r.logits);
    free(prompt);
    k3_session_free(s);
    k3_cli_model_free(&m);
    return rc;
}

int k3_cmd_run(int argc, char **argv) {
    run_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) {
        free(o.prompt_text);
        return rc < 0 ? 0 : rc;
    }
    if (o.co.sampling.temperature > 0) k3_cli_pick_seed(&o.co);
    k3_err err = {0};
    rc = run(&o, &err);
    if (rc) {
        fflush(stdout);
        k3_opts_error("run", &err);
    }
    free(o.prompt_text);
    return rc;
}
