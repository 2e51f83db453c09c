/* cmd_run.c — `k3 run`: tokenize (or render one chat turn), prefill, decode (greedy or
 * sampled), stream text; optionally continue from / save a state file. */
#include <errno.h>
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
#include "store_flags.h"
#include "device_flags.h"
#include "spine_flags.h"

typedef struct run_opts {
    const char *model_dir, *prompt, *prompt_ids, *dump_logits, *pack_dir;
    int spine; /* enum k3_spine_mode; the CLI default is auto */
    int approx; /* --approx: 1; else 0 (then $K3_APPROX decides) */
    int max_new, threads, ctx;
    bool special, print_ids, verbose;
    bool chat;                       /* --chat: render --prompt as one user turn */
    k3_cli_chat_opts co;             /* sampling and chat flags (gen.h) */
    const char *save_state, *load_state;
    k3_cli_store_opts so;            /* expert store flags (store_flags.h) */
    k3_cli_device_opts dev;          /* --device, --gpu-gb (device_flags.h) */
    k3_cli_spine_budget spine_gb;    /* --spine-gb (spine_flags.h) */
} run_opts;

static void run_usage(FILE *f) {
    fprintf(f,
        "usage: k3 run [MODEL_DIR] (--prompt TEXT | --prompt-ids IDS) [options]\n"
        "\n"
        "Generates from the exact float32 model (greedily unless --temperature is given) and\n"
        "prints text as each token is produced. Stops after --max-new tokens or at an\n"
        "end-of-message token (<|end_of_msg|>, [EOS], [EOT]). Ctrl-C stops after the current\n"
        "token, prints the text and the summary and exits with status 130. Without MODEL_DIR\n"
        "the bundled fixture model is used.\n"
        "\n"
        "  --prompt TEXT        prompt text (UTF-8); no [BOS] is added\n"
        "  --chat               render TEXT as one user turn in the K3 chat format (spec §12:\n"
        "                       thinking-effort message, generation prompt) and print the\n"
        "                       reply's thinking (dimmed on a terminal), then its answer\n"
        "  --special            let special-token spellings in TEXT (e.g. [BOS], <|sep|>)\n"
        "                       become their ids (default: they are ordinary text)\n"
        "  --prompt-ids IDS     token ids instead of --prompt (commas or spaces between them)\n"
        "  --max-new N          generate at most N tokens (default 128)\n"
        "  --ids                print the generated ids (one line, comma-separated), not text\n"
        "  --dump-logits FILE   write float32 little-endian logits, row-major [rows, vocab]:\n"
        "                       row i = the logits after position i, for every prompt position\n"
        "                       and every generated token fed back (shape printed to stderr)\n"
        "  --threads N          compute threads (default: OMP_NUM_THREADS, else physical cores)\n"
        "  --ctx N              context capacity in tokens (default min(4096, model max))\n"
        "  --spine MODE         auto (default): the int8 spine when k3 pack has built it, else\n"
        "                       BF16; bf16: always the exact BF16 spine; int8: the packed int8\n"
        "                       spine (NOT exact; an error when it does not exist)\n"
        "  --pack-dir DIR       folder of the packed spine (default MODEL_DIR; see k3 pack --out)\n"
        "  --approx             also quantize activations to int8 in the int8 spine's products\n"
        "                       (faster, NOT exact; needs the int8 spine; = K3_APPROX=1)\n"
        "%s"
        "  --load-state FILE    start from a state saved by --save-state (same model and spine\n"
        "                       mode only, checked by fingerprint): the prompt continues it; with\n"
        "                       --chat the turn is rendered without repeating the preamble\n"
        "  --save-state FILE    after the run, save the state (every prompt and generated token\n"
        "                       fed; with --chat the reply is closed with <|end_of_msg|>) for a\n"
        "                       later --load-state. Not written when interrupted\n"
        "  -q, --quiet          no load line and no summary on stderr\n"
        "  -h, --help           this help\n"
        "\n"
        "sampling:\n%s"
        "\n"
        "with --chat:\n%s", k3_cli_spine_gb_help, k3_cli_sampling_help, k3_cli_chat_help);
    fprintf(f, "\nspeed (exact):\n%s\n", k3_cli_speed_help);
    k3_cli_store_usage(f);
    k3_cli_device_usage(f);
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

/* OpenMP crashes inside its runtime when asked for absurd thread counts: cap them here. */
static int parse_threads(const char *s, int *out) {
    int rc = parse_int(s, "--threads", 1, out);
    if (!rc && *out > 1024) {
        fprintf(stderr, "k3 run: --threads %d is more than the 1024 k3 supports\n", *out);
        rc = K3_ERR_USAGE;
    }
    return rc;
}

static int parse_args(int argc, char **argv, run_opts *o) {
    *o = (run_opts){.max_new = 128, .verbose = true, .spine = K3_SPINE_AUTO,
                    .co = K3_CLI_CHAT_DEFAULTS};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        int rc = k3_cli_chat_flag("run", argc, argv, &i, &o->co);
        if (rc == 1) continue;
        if (rc) return rc;
        if ((rc = k3_cli_store_flag("run", argc, argv, &i, &o->so)) == 1) continue;
        if (rc) return rc;
        if ((rc = k3_cli_device_flag("run", argc, argv, &i, &o->dev)) == 1) continue;
        if (rc) return rc;
        if ((rc = k3_cli_spine_gb_flag("run", argc, argv, &i, &o->spine_gb)) == 1) continue;
        if (rc) return rc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { run_usage(stdout); return -1; }
        else if (!strcmp(a, "--chat")) o->chat = true;
        else if (!strcmp(a, "--save-state") && has_val) o->save_state = argv[++i];
        else if (!strcmp(a, "--load-state") && has_val) o->load_state = argv[++i];
        else if (!strcmp(a, "--special")) o->special = true;
        else if (!strcmp(a, "--ids")) o->print_ids = true;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->verbose = false;
        else if (!strcmp(a, "--prompt") && has_val) o->prompt = argv[++i];
        else if (!strcmp(a, "--prompt-ids") && has_val) o->prompt_ids = argv[++i];
        else if (!strcmp(a, "--dump-logits") && has_val) o->dump_logits = argv[++i];
        else if (!strcmp(a, "--pack-dir") && has_val) o->pack_dir = argv[++i];
        else if (!strcmp(a, "--approx")) o->approx = 1;
        else if (!strcmp(a, "--spine") && has_val) rc = parse_spine(argv[++i], &o->spine);
        else if (!strcmp(a, "--max-new") && has_val) rc = parse_int(argv[++i], a, 0, &o->max_new);
        else if (!strcmp(a, "--threads") && has_val) rc = parse_threads(argv[++i], &o->threads);
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
    if (o->chat && (o->prompt_ids || o->special)) {
        fprintf(stderr, "k3 run: --chat takes the user's text with --prompt; --prompt-ids and "
                "--special apply to raw prompts only\n");
        return K3_ERR_USAGE;
    }
    if (!o->model_dir) o->model_dir = k3_default_model_dir();
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
    if (!rc) rc = k3_session_save(r->s, r->o->save_state, err);
    if (!rc && r->o->verbose)
        fprintf(stderr, "k3: saved the state after %d positions to %s\n", k3_session_pos(r->s),
                r->o->save_state);
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
    double t0 = k3_cli_now_s();
    /* Ctrl-C stops the prefill between passes (K3_ERR_INTERRUPTED) */
    k3_prefill_hook dump = {.user = r, .on_pass = dump_pass, .all_logits = 1};
    rc = k3_session_prefill_with(r->s, prompt, n_prompt, r->logits, &kept,
                                 r->dump ? &dump : NULL, err);
    size_t reused = (size_t)kept;
    double prefill_s = k3_cli_now_s() - t0;
    size_t fed = (size_t)k3_session_pos(r->s) - reused;
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
    if (!rc && o->save_state) rc = save_state(r, &g, err);
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
    k3_engine_opts eo = {.threads = o->threads, .verbose = o->verbose, .spine = o->spine,
                         .pack_dir = o->pack_dir, .approx = o->approx};
    k3_cli_store_engine_opts(&o->so, &eo);
    k3_cli_spine_gb_apply(&o->spine_gb, &eo);
    k3_cli_store_run sr = {0};
    int rc = k3_cli_device_engine_opts(&o->dev, &eo, err);
    if (!rc) rc = k3_engine_load(o->model_dir, &eo, &e, err);
    if (rc) goto done;
    r.e = e;
    r.tok = k3_engine_tokenizer(e);
    r.vocab = k3_engine_config(e)->vocab_size;
    int ctx = o->ctx ? o->ctx : 0;
    if ((rc = k3_session_new(e, ctx, &s, err))) goto done;
    r.s = s;
    if (o->co.chunk) k3_session_set_chunk(s, o->co.chunk);
    if ((rc = k3_cli_store_attach(&sr, s, &o->so, err))) goto done;
    if (o->load_state && (rc = k3_session_load(s, o->load_state, err))) goto done;
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
    if (o.co.sampling.temperature > 0) k3_cli_pick_seed(&o.co);
    k3_err err = {0};
    rc = run(&o, &err);
    if (rc) {
        fflush(stdout);
        fprintf(stderr, "k3: %s\n", err.msg);
    }
    return rc;
}
