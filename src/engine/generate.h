/* generate.h — the one generation loop of `k3 run`, `k3 chat` and `k3 serve`: sample the next
 * id, hand it to the caller, apply the stop rules, feed it (one step, or one speculative
 * verification pass with the drafts K3 agrees with, spec.h); and the stop-string matcher for
 * callers that stop on text.
 *
 * Invariants:
 *  - One k3_gen holds one generation's per-token state; k3_gen_step advances it by one
 *    sampled id (plus the drafts a verification pass accepts) and k3_gen_run loops until it
 *    ends. Nothing is allocated per token. (The server's batching builds on this: several
 *    k3_gen, one per session.)
 *  - Every sampled id goes through io.emit exactly once, in order, a stop id included. The id
 *    that ends the generation is emitted but never fed; every other emitted id is fed, so
 *    after the loop k3_session_tokens holds the prompt followed by the emitted ids but the
 *    last (tests/test_genloop.c).
 *  - Stop rules, checked after each emitted id, first match wins: a stop id (K3_GEN_STOP:
 *    <|end_of_msg|>, [EOS], [EOT]; spec §12.4); emit returned true (K3_GEN_STOP_STRING: the
 *    caller found a stop string in the text so far); max_new ids sampled (K3_GEN_MAX_NEW);
 *    the id would be fed at position max_ctx (K3_GEN_CONTEXT); the interrupt flag or
 *    io.cancelled (K3_GEN_INTERRUPTED). A generation with max_new 0 samples nothing.
 *  - Sampling is the sampler's (sampler.h): greedy output, and sampled output with a seed,
 *    depend only on the logits; greedy output is the same with and without speculation.
 */
#ifndef K3_GENERATE_H
#define K3_GENERATE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3.h"
#include "sampler.h"
#include "spec.h"

/* Why a generation ended (K3_GEN_RUNNING while it goes on). */
enum k3_gen_end {
    K3_GEN_RUNNING = 0,
    K3_GEN_STOP,        /* a stop id was sampled */
    K3_GEN_STOP_STRING, /* io.emit found a stop string */
    K3_GEN_MAX_NEW,     /* max_new ids were sampled */
    K3_GEN_INTERRUPTED, /* the interrupt flag was raised, or io.cancelled said so */
    K3_GEN_CONTEXT,     /* the context is full: the last id sampled has no position */
    K3_GEN_FAILED,      /* a step, a pass or io.fed failed (k3_gen_step returned its status) */
};

/* What the loop calls back. Every member may be NULL. */
typedef struct k3_gen_io {
    void *user;
    /* Each sampled id, in order, before it is fed. Returns true to end the generation at this
     * id with K3_GEN_STOP_STRING (it is then not fed). */
    bool (*emit)(void *user, int32_t id);
    /* The logits [vocab_size] after each id fed: k3_session_step's, or the row of a
     * verification pass for each id it keeps (e.g. --dump-logits). A nonzero status ends the
     * generation with it (K3_GEN_FAILED). */
    int (*fed)(void *user, const float *logits, k3_err *err);
    /* Asked after each id that no other rule ended; true = K3_GEN_INTERRUPTED (e.g. the
     * server's client hung up). */
    bool (*cancelled)(void *user);
    /* Test-only (the server's scripted replies): when it returns true, *id replaces the
     * sampled one. Leave it NULL with speculation. */
    bool (*choose)(void *user, int32_t *id);
} k3_gen_io;

typedef struct k3_gen_params {
    int max_new;            /* ids to sample at most, a stop id included; < 0: no limit but
                               the context */
    const k3_stops *stops;  /* stop ids (sampler.h); NULL = none */
    k3_spec *spec;          /* speculative decoding set up for this session and sampler, or
                               NULL (or max_draft 0): single steps. Restarted by k3_gen_start;
                               its statistics add up over generations */
    const volatile sig_atomic_t *interrupt; /* nonzero ends the generation; NULL = none */
} k3_gen_params;

typedef struct k3_gen {
    k3_session *s;
    k3_sampler *sm;
    float *logits;       /* [vocab_size]: the logits after the last id fed; sampled from, then
                            overwritten by each step */
    k3_gen_params o;
    k3_gen_io io;
    int n_sampled;       /* ids sampled (= emitted) so far */
    int32_t last_id;     /* the last id sampled (never fed), or -1 */
    int fed;             /* session positions once every emitted id but the last is fed */
    enum k3_gen_end end;
    int32_t pending;     /* the id being fed (k3_gen_feed_ids) */
    int n_feed;          /* ids being fed: 1, or 1 + drafts */
    double decode_s;     /* wall time in k3_gen_run, seconds */
} k3_gen;

/* Starts a generation in session s after its last fed id: logits [vocab_size] must hold the
 * logits after that id (e.g. from k3_session_prefill). o and io are copied. */
void k3_gen_start(k3_gen *g, k3_session *s, k3_sampler *sm, float *logits,
                  const k3_gen_params *o, const k3_gen_io *io);

/* One id: samples it (or takes the replacement a rejected draft left, k3_spec_next), emits
 * it, applies the stop rules and, unless it ended the generation, feeds it — with speculation
 * in one pass with up to max_new - n_sampled - 1 drafts, each accepted draft emitted and
 * checked the same way. Sets g->end when the generation ends; does nothing once it has.
 * Errors: those of k3_session_step, k3_spec_feed and io.fed (g->end is then K3_GEN_FAILED;
 * a failed step may have reset the session, k3.h). */
int k3_gen_step(k3_gen *g, k3_err *err);

/* k3_gen_step in three parts, for a caller that feeds the ids itself (several sessions' rows
 * in one pass, k3_multistep_run in k3 serve --parallel). k3_gen_next chooses the next id as
 * k3_gen_step does (io.choose, a rejected draft's replacement, or the sampler over
 * g->logits), emits it and applies the stop rules: true with *id when id must now be fed to
 * g->s; false when the generation ended (g->end), at this id or before. k3_gen_feed_ids: the
 * ids to feed (*ids, the count returned): id alone, or with speculation id and up to
 * max_drafts drafts — then a verification: one pass with the logits at every position,
 * rewindable (K3_MS_ALL_LOGITS | K3_MS_REWINDABLE). The caller runs that pass and puts its
 * logits into k3_gen_rows(g) (one row [vocab] for one id, else [count][vocab]), then calls
 * k3_gen_fed with the pass's status rc: acceptance and rewind, io.fed, the accepted drafts
 * emitted. Returns rc or the status of what failed (g->end is then K3_GEN_FAILED). The ids,
 * logits and stop decisions are exactly k3_gen_step's, which is these three parts. */
bool k3_gen_next(k3_gen *g, int32_t *id);
int k3_gen_feed_ids(k3_gen *g, int32_t id, int max_drafts, const int32_t **ids);
const float *k3_gen_rows(const k3_gen *g);
int k3_gen_fed(k3_gen *g, int rc, k3_err *err);

/* k3_gen_step until the generation ends; g->decode_s receives the time it took.
 * Errors: those of k3_gen_step. */
int k3_gen_run(k3_gen *g, k3_err *err);

/* ---- stop strings ---------------------------------------------------------------------------
 * A caller that stops on text (the server's "stop") pushes the text of each id through a
 * k3_stop_text. It releases the text that cannot be part of a stop string and holds back a
 * suffix that could still grow into one, so that text is never sent and then taken back; a
 * stop string split across ids, or a UTF-8 character split across ids, is found where it
 * completes. */

#define K3_STOP_TEXT_MAX 4

typedef struct k3_stop_text {
    const char *s[K3_STOP_TEXT_MAX]; /* the stop strings (non-empty; not copied) */
    int n;
    char *hold;                      /* [cap]: released bytes first, then the held suffix */
    size_t len, cap, released;
    bool matched;                    /* a stop string matched; later text is dropped */
    int which;                       /* the index of the string that matched, else -1 */
    bool oom;                        /* out of memory: text was dropped */
} k3_stop_text;

/* Starts matching strings[0, n) (n <= K3_STOP_TEXT_MAX; the strings must outlive st). Keeps
 * st's buffer; st must be zeroed before its first use. */
void k3_stop_text_reset(k3_stop_text *st, const char *const *strings, int n);
void k3_stop_text_free(k3_stop_text *st);

/* Appends text[0, n). *out / *out_n receive the bytes that may be released now (valid until
 * the next call). Returns true when a stop string is now complete: *out then holds the text
 * before its earliest start, and everything from it on is dropped, now and later. */
bool k3_stop_text_push(k3_stop_text *st, const char *text, size_t n, const char **out,
                       size_t *out_n);

/* The end without a match: *out / *out_n receive the held text (nothing after a match). */
void k3_stop_text_flush(k3_stop_text *st, const char **out, size_t *out_n);

#endif
