/* spec.h — lossless n-gram speculative decoding: draft proposal (issue 10).
 *
 * Invariants:
 *  - Drafts cost nothing to make: they are copied from earlier in the token history (prompt
 *    and output), never produced by a model, so a wrong draft only costs verification work.
 *  - The matcher prefers the LONGEST suffix (max_ngram down to min_ngram tokens) that occurred
 *    before, and among equal lengths the MOST RECENT occurrence; it proposes the tokens that
 *    followed that occurrence (at most max_draft, never past the end of the history).
 *  - Verification (k3_spec_feed) accepts only tokens equal to K3's own choice at that row (the
 *    argmax, or the seeded sampler's draw) and rewinds the state exactly, so output with
 *    speculation equals output without it, token for token, greedy or seeded.
 */
#ifndef K3_SPEC_H
#define K3_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "k3.h"
#include "sampler.h"

#define K3_SPEC_MIN_NGRAM 2
#define K3_SPEC_MAX_NGRAM 6

/* Proposes up to max_draft tokens to follow tokens[0..n) into draft[]. Returns the number
 * proposed (0 when no suffix of length 2..6 occurred earlier). O(n · 6) per call. */
int k3_spec_draft(const int32_t *tokens, size_t n, int max_draft, int32_t *draft);

/* ---- verification (issue 10) ----------------------------------------------------------------
 * k3_spec_feed replaces k3_session_step(id) in a decode loop. It drafts what may follow id and
 * runs id plus the drafts as ONE batched pass (k3_session_forward: one spine read, the union
 * of their routed experts read once) with the logits at every position. Draft i is accepted
 * when the sampler's choice after the previous id (the argmax: greedy only) equals it; the
 * first disagreement ends the pass and the session is rewound (k3_session_rewind) to the ids
 * kept, bit-identical to having fed only them. K3's own choice after the last kept id is then
 * the next token, exactly as without speculation: output and state are token for token the
 * same, so a wrong draft only costs verification work.
 *
 * With sampling on (temperature > 0) the sampler draws at each row of the pass exactly as it
 * would without speculation (one draw of its PRNG for the id after pass[i]); draft i+1 is
 * accepted when it is the id drawn, and otherwise the drawn id is emitted next (k3_spec_next).
 * For a draft that is one id with certainty (q = δ_x) this is standard speculative sampling:
 * x is accepted with probability p(x), and after a rejection the id comes from p without x,
 * renormalised. And since the PRNG advances once per emitted id, in order, a seeded run with
 * --spec is id for id the run without it, whatever drafts were verified or the pays-off rule
 * decided (tests/test_specdec.c).
 *
 * Speculation is off when the backend cannot rewind (a device backend), and for the rest of a
 * generation once it does not pay as measured: over the last K3_SPEC_WINDOW passes, the ids
 * they produced (1 + accepted drafts each) per second of pass time fall below one id per mean
 * single step. What a pass of 1 + d ids costs against a
 * step depends on the machine (2 cores, k3-wide: 5 ids cost 3.7 steps, compute-bound; far less
 * where streaming the weights dominates; `k3-lab bench spec`), so the rule measures it rather than
 * assuming an acceptance threshold. The first id of a generation is fed alone to time a step. */

#define K3_SPEC_WINDOW 8

typedef struct k3_spec_stats {
    long passes;         /* verification passes (an id plus at least one draft) */
    long steps;          /* single-id feeds (no draft, or speculation off) */
    long proposed;       /* drafts verified */
    long accepted;       /* drafts K3 agreed with (emitted without a pass of their own) */
    long fed;            /* ids kept as fed by the passes (each pass: 1 + its accepted drafts) */
    long partial;        /* passes that accepted some but not all of their drafts */
    long accepted_at[8]; /* accepted drafts by position in the pass: 1st, 2nd, ... (8+ last) */
    double pass_s, step_s; /* wall time in passes and in single steps */
} k3_spec_stats;

typedef struct k3_spec {
    int max_draft;       /* --spec N; 0 = off */
    bool off;            /* off for the rest of this generation (why says so) */
    bool never;          /* off for good: a backend that cannot rewind */
    bool sampling;       /* temperature > 0: speculative sampling acceptance */
    int32_t next;        /* after a rejection while sampling: the id drawn at that row, to be
                          * emitted next (k3_spec_next); -1 = none */
    bool judge;          /* apply the pays-off rule (default; tests turn it off to keep
                          * verifying on a model whose drafts rarely pay) */
    char why[160];
    int vocab;
    int32_t *hist;       /* [max_ctx + 1] the session's ids, then the pending id */
    int32_t *pass;       /* [max_draft + 1] */
    float *rows;         /* [max_draft + 1][vocab] logits of a pass */
    int win_ids[K3_SPEC_WINDOW];       /* the last passes: ids produced (1 + accepted) */
    double win_s[K3_SPEC_WINDOW];      /* and their time */
    int win_n;                         /* passes since the generation started */
    int nd;              /* the drafts of the pass being fed (k3_spec_propose) */
    double t0;           /* when it was proposed */
    k3_spec_stats st;
} k3_spec;

/* What k3_spec_feed calls back, in order, for the ids a pass keeps. */
typedef struct k3_spec_io {
    void *user;
    /* The logits after each id kept as fed (the pending id, then each accepted draft); may be
     * NULL. A nonzero status aborts the feed with it. */
    int (*fed)(void *user, const float *logits, k3_err *err);
    /* An accepted draft id, to be emitted as the next sampled token. Returns true when the
     * generation ends at this id (stop id, --max-new, Ctrl-C, context): it is then not fed. */
    bool (*accepted)(void *user, int32_t id);
} k3_spec_io;

/* Prepares speculation with up to max_draft drafts per pass (0: never drafts) for session s
 * sampled by sm; turns it off, with the reason in sp->why, for sampling or a device backend.
 * Errors: K3_ERR_GENERIC (out of memory). */
int k3_spec_init(k3_spec *sp, int max_draft, const k3_session *s, const k3_sampler *sm,
                 k3_err *err);
void k3_spec_free(k3_spec *sp);
/* Starts a new generation: clears the acceptance window and turns speculation back on unless
 * it is off for good (sampling, device). Statistics keep adding up. */
void k3_spec_restart(k3_spec *sp);

/* Feeds id (K3's choice, already emitted) and up to max_now drafts (<= max_draft; fewer
 * near --max-new or the end of the context) in one pass; accepted drafts go through io.
 * On return *ended says whether io->accepted ended the generation, and logits [vocab] holds
 * the logits after the last id fed (as after k3_session_step; an id that ended the
 * generation is not fed). sm must be the sampler
 * given to k3_spec_init (greedy: it draws nothing; sampling: it draws one number per draft
 * verified and one more after a rejection).
 * Errors: those of k3_session_forward / k3_session_rewind and of io->fed. */
int k3_spec_feed(k3_spec *sp, k3_session *s, k3_sampler *sm, int32_t id, int max_now,
                 float *logits, const k3_spec_io *io, bool *ended, k3_err *err);

/* k3_spec_feed in two halves, for a caller that runs the pass itself (k3 serve: several
 * sessions' rows, verifications included, in one pass). k3_spec_propose: the ids to feed
 * after id: sp->pass[0, 1 + returned drafts) (id, then up to max_now drafts). The caller feeds
 * them to s: one id as a step (its logits row), several as one pass with the logits at every
 * position and K3_FWD_REWINDABLE (K3_MS_ALL_LOGITS | K3_MS_REWINDABLE), then calls
 * k3_spec_settle with the pass's status rc and its rows [1 + drafts][vocab]: acceptance, the
 * rewind to the ids kept, io as in k3_spec_feed, logits [vocab] = the logits after the last id
 * fed. The results are k3_spec_feed's exactly. Errors: rc; those of k3_session_rewind and
 * io->fed. */
int k3_spec_propose(k3_spec *sp, const k3_session *s, int32_t id, int max_now);
int k3_spec_settle(k3_spec *sp, k3_session *s, k3_sampler *sm, int rc, const float *rows,
                   float *logits, const k3_spec_io *io, bool *ended, k3_err *err);

/* While sampling, a rejected draft's replacement is drawn with the rejection: returns true
 * once, with it in *id, and the loop emits it instead of sampling the logits. */
bool k3_spec_next(k3_spec *sp, int32_t *id);

/* One line (no newline): drafts proposed and accepted, forward passes per generated token,
 * partial accepts, the time saved against single steps (estimated from the steps' mean), and
 * why speculation is off if it is. */
void k3_spec_summary(const k3_spec *sp, long generated, char *buf, size_t cap);

#endif
