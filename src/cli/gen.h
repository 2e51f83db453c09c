/* gen.h — `k3 run` and `k3 chat` over the generation loop (src/engine/generate.h): printing
 * the reply as it is generated, and the flags both commands share.
 *
 * Invariants:
 *  - Ctrl-C (SIGINT) only sets k3_cli_interrupted (interrupt.h); the loop checks it after
 *    each token is printed, so a reply stops after the current token and keeps everything
 *    generated.
 *  - The token that ends a reply (a stop id, or the last one before --max-new / Ctrl-C) is
 *    sampled but not fed; k3_gen_result says which ids were sampled.
 */
#ifndef K3_CLI_GEN_H
#define K3_CLI_GEN_H

#include <stdbool.h>
#include <stdio.h>

#include "../chat/parse.h"
#include "../engine/generate.h"
#include "../engine/k3.h"
#include "../engine/sampler.h"
#include "../engine/spec.h"
#include "../server/pcache.h"
#include "interrupt.h"

typedef struct k3_gen_opts {
    const k3_tokenizer *tok;
    int max_new;
    bool print_ids;      /* raw mode: print the sampled ids (stop id included), not text */
    bool show_thinking;  /* chat: print the thinking channel */
    bool color;          /* chat: thinking dimmed with ANSI SGR 2 (for terminals) */
    FILE *out;
    /* Called with the logits after each generated token is fed (e.g. --dump-logits). */
    int (*on_logits)(void *user, const float *logits, k3_err *err);
    void *user;
    /* Speculative decoding (--spec, src/engine/spec.h), or NULL: set up by the caller with this
     * session and sampler; the loop restarts it per generation and its statistics add up. */
    k3_spec *spec;
} k3_gen_opts;

typedef struct k3_gen_result {
    int32_t *ids;        /* malloc'd: the sampled ids without a final stop id */
    size_t n;
    int n_sampled;       /* including the stop id */
    int32_t last_id;     /* the last id sampled (not fed), or -1 */
    enum k3_gen_end end;
    double decode_s;     /* wall time of the loop */
} k3_gen_result;

/* Generates after the prompt with k3_gen_run: `logits` holds the logits after the last prompt
 * id and is overwritten; Ctrl-C (k3_cli_interrupted) ends it. Raw mode (parser NULL) prints
 * text through the streaming decoder; chat mode prints the parser's channels (thinking dimmed,
 * or hidden: then a reply that was all thinking prints a dim "(thinking hidden, N tokens)").
 * Ends with a newline.
 * Errors: those of k3_gen_run; K3_ERR_GENERIC. */
int k3_cli_generate(k3_session *s, k3_sampler *sm, const k3_stops *stops, float *logits,
                    k3_reply_parser *parser, const k3_gen_opts *o, k3_gen_result *r,
                    k3_err *err);

/* ---- options shared by `k3 run --chat` and `k3 chat` (set by the option table, opts.h) ------- */

typedef struct k3_cli_chat_opts {
    k3_sampler_opts sampling; /* default greedy */
    bool has_seed;            /* else the seed comes from the clock (and is printed) */
    const char *system;       /* --system TEXT, or NULL */
    const char *effort;       /* --effort low|high|max (default max) */
    bool no_think;            /* --no-think: thinking off */
    bool hide_thinking;       /* --no-show-thinking */
    int chunk;                /* --chunk N: ids per prefill pass (0 = K3_DEFAULT_CHUNK) */
    int spec;                 /* --spec N: drafts verified per pass (0 = off) */
} k3_cli_chat_opts;

#define K3_CLI_CHAT_DEFAULTS {.sampling = {.temperature = 0, .top_p = 1, .top_k = 0}}

/* Fills the seed from the clock unless --seed was given (sampling only). */
void k3_cli_pick_seed(k3_cli_chat_opts *o);

/* --prompt-cache for k3 run and k3 chat (src/server/pcache.h, the server's folder and files):
 * restores the longest stored prefix of prompt[0, n) beyond what s holds of it, then prefills
 * up to each snapshot position (k3_pcache_marks) and stores the state there; the
 * caller prefills the rest. *held: the prompt positions s held before any prefill (restored
 * ones included). verbose: one line each for what was restored and written. Errors: those of
 * k3_session_prefill (Ctrl-C included); the cache's own failures are logged, never returned. */
int k3_cli_pcache_prefill(k3_pcache *pc, k3_session *s, const k3_tokenizer *tok,
                          const int32_t *prompt, size_t n, bool verbose, size_t *held,
                          k3_err *err);

/* "end of message", "--max-new reached", ... for summary lines. */
const char *k3_gen_end_name(enum k3_gen_end end);

#endif
