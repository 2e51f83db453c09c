/* spec.c — speculative decoding: suffix-match drafting and exact verification (see spec.h). */
#include "spec.h"
#include "../util/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Does the length-len window ending at e (exclusive) equal the history's last len tokens? */
static int window_matches(const int32_t *t, size_t n, size_t e, size_t len) {
    for (size_t i = 1; i <= len; i++)
        if (t[e - i] != t[n - i]) return 0;
    return 1;
}

int k3_spec_draft(const int32_t *tokens, size_t n, int max_draft, int32_t *draft) {
    if (max_draft <= 0) return 0;
    for (size_t len = K3_SPEC_MAX_NGRAM; len >= K3_SPEC_MIN_NGRAM; len--) {
        if (n < len + 1) continue;
        /* Earlier windows end at e < n; scan from the most recent. */
        for (size_t e = n - 1; e >= len; e--) {
            if (!window_matches(tokens, n, e, len)) continue;
            int k = 0;
            while (k < max_draft && e + (size_t)k < n) {
                draft[k] = tokens[e + (size_t)k];
                k++;
            }
            return k;
        }
    }
    return 0;
}

/* ---- verification (see spec.h) ----------------------------------------------------------------- */

int k3_spec_init(k3_spec *sp, int max_draft, const k3_session *s, const k3_sampler *sm,
                 k3_err *err) {
    memset(sp, 0, sizeof *sp);
    sp->max_draft = max_draft > 0 ? max_draft : 0;
    sp->judge = true;
    sp->next = -1;
    sp->sampling = sm->o.temperature > 0;
    if (!sp->max_draft) return K3_OK;
    if (!k3_session_can_rewind(s)) {
        sp->off = sp->never = true;
        snprintf(sp->why, sizeof sp->why, "this device backend cannot rewind a pass");
    }
    sp->vocab = sm->vocab;
    size_t n = (size_t)sp->max_draft + 1;
    sp->hist = malloc(((size_t)k3_session_max_ctx(s) + 1) * sizeof *sp->hist);
    sp->pass = malloc(n * sizeof *sp->pass);
    sp->rows = malloc(n * (size_t)sp->vocab * sizeof *sp->rows);
    if (!sp->hist || !sp->pass || !sp->rows) {
        k3_spec_free(sp);
        return k3_fail_opts(err, K3_ERR_GENERIC, "spec", "out of memory for spec %d", max_draft);
    }
    return K3_OK;
}

void k3_spec_free(k3_spec *sp) {
    free(sp->hist);
    free(sp->pass);
    free(sp->rows);
    sp->hist = sp->pass = NULL;
    sp->rows = NULL;
}

void k3_spec_restart(k3_spec *sp) {
    sp->next = -1;
    memset(sp->win_ids, 0, sizeof sp->win_ids);
    memset(sp->win_s, 0, sizeof sp->win_s);
    sp->win_n = 0;
    if (!sp->never) sp->off = false, sp->why[0] = 0;
}

/* The pays-off rule (spec.h): off when the last K3_SPEC_WINDOW passes produced fewer ids per
 * second than single steps do. */
static void judge(k3_spec *sp, int produced, double pass_s) {
    sp->win_ids[sp->win_n % K3_SPEC_WINDOW] = produced;
    sp->win_s[sp->win_n % K3_SPEC_WINDOW] = pass_s;
    if (++sp->win_n < K3_SPEC_WINDOW || !sp->judge || sp->st.steps == 0) return;
    int ids = 0;
    double t = 0, step = sp->st.step_s / (double)sp->st.steps;
    for (int i = 0; i < K3_SPEC_WINDOW; i++) ids += sp->win_ids[i], t += sp->win_s[i];
    if (ids * step < t) {
        sp->off = true;
        snprintf(sp->why, sizeof sp->why, "turned off for this generation: the last %d passes "
                 "made %d ids in %.3f s, slower than single steps (%.4f s each)", K3_SPEC_WINDOW,
                 ids, t, step);
    }
}

bool k3_spec_next(k3_spec *sp, int32_t *id) {
    if (sp->next < 0) return false;
    *id = sp->next;
    sp->next = -1;
    return true;
}

/* Is draft x K3's choice at this row? The sampler draws at this row exactly as it would
 * without speculation (greedy: the argmax; sampling: one draw of its PRNG); x is accepted when
 * it is that id. Otherwise the drawn id is the next one emitted (k3_spec_next), so no row is
 * drawn twice and the PRNG advances once per emitted id, as without --spec (spec.h). */
static bool agrees(k3_spec *sp, k3_sampler *sm, const float *row, int32_t x) {
    int32_t y = k3_sampler_sample(sm, row);
    if (y == x) return true;
    if (sp->sampling) sp->next = y;
    return false;
}

/* Drafts for what follows id; 0 when off or nothing matches. */
static int draft(k3_spec *sp, const k3_session *s, int32_t id, int max_now) {
    int pos = k3_session_pos(s), room = k3_session_max_ctx(s) - pos - 1;
    if (max_now > sp->max_draft) max_now = sp->max_draft;
    if (max_now > room) max_now = room;
    if (sp->off || max_now <= 0 || sp->st.steps == 0) return 0; /* the first feed times a step */
    memcpy(sp->hist, k3_session_tokens(s), (size_t)pos * sizeof *sp->hist);
    sp->hist[pos] = id;
    return k3_spec_draft(sp->hist, (size_t)pos + 1, max_now, sp->pass + 1);
}

int k3_spec_propose(k3_spec *sp, const k3_session *s, int32_t id, int max_now) {
    sp->pass[0] = id; /* (hist and pass exist once max_draft > 0) */
    sp->nd = draft(sp, s, id, max_now);
    sp->t0 = k3_now_s();
    return sp->nd;
}

int k3_spec_settle(k3_spec *sp, k3_session *s, k3_sampler *sm, int rc, const float *rows,
                   float *logits, const k3_spec_io *io, bool *ended, k3_err *err) {
    size_t V = (size_t)sm->vocab;
    int nd = sp->nd, pos = k3_session_pos(s) - (nd + 1);
    *ended = false;
    if (nd == 0) { /* a single step: its row is the logits */
        sp->st.steps++;
        sp->st.step_s += k3_now_s() - sp->t0;
        if (!rc && rows != logits) memcpy(logits, rows, V * sizeof *logits);
        return rc || !io->fed ? rc : io->fed(io->user, logits, err);
    }
    if (rc) return rc;
    int keep = nd + 1, acc = 0;
    for (int i = 0; i <= nd; i++) { /* row i: the logits after pass[i], which is kept */
        const float *row = rows + (size_t)i * V;
        if (io->fed && (rc = io->fed(io->user, row, err))) {
            keep = i + 1;
            break;
        }
        if (i == nd) break;
        if (!agrees(sp, sm, row, sp->pass[i + 1])) { /* K3 disagrees: stop here */
            keep = i + 1;
            break;
        }
        acc++;
        sp->st.accepted_at[i < 7 ? i : 7]++;
        if (io->accepted(io->user, sp->pass[i + 1])) { /* emitted, ends the generation */
            keep = i + 1;
            *ended = true;
            break;
        }
    }
    if (keep < nd + 1) {
        int rr = k3_session_rewind(s, pos + keep, err);
        if (!rc) rc = rr;
    }
    if (!rc) memcpy(logits, rows + (size_t)(keep - 1) * V, V * sizeof *logits);
    sp->st.proposed += nd;
    sp->st.accepted += acc;
    sp->st.fed += keep;
    sp->st.partial += acc > 0 && acc < nd;
    double dt = k3_now_s() - sp->t0;
    sp->st.pass_s += dt;
    sp->st.passes++;
    judge(sp, keep, dt);
    return rc;
}

int k3_spec_feed(k3_spec *sp, k3_session *s, k3_sampler *sm, int32_t id, int max_now,
                 float *logits, const k3_spec_io *io, bool *ended, k3_err *err) {
    int nd = sp->max_draft ? k3_spec_propose(sp, s, id, max_now) : 0, rc;
    if (!sp->max_draft) { /* never drafts: a plain step */
        sp->nd = 0;
        sp->t0 = k3_now_s();
    }
    if (nd == 0) rc = k3_session_step(s, id, logits, err);
    else rc = k3_session_forward(s, sp->pass, nd + 1, sp->rows,
                                 K3_FWD_ALL_LOGITS | K3_FWD_REWINDABLE, err);
    return k3_spec_settle(sp, s, sm, rc, nd ? sp->rows : logits, logits, io, ended, err);
}

void k3_spec_summary(const k3_spec *sp, long generated, char *buf, size_t cap) {
    const k3_spec_stats *t = &sp->st;
    long fwd = t->passes + t->steps;
    char saved[96] = "n/a";
    if (t->steps > 0) {
        double step = t->step_s / (double)t->steps;
        snprintf(saved, sizeof saved, "%.3f s (vs %.4f s per single step)",
                 (double)t->fed * step - t->pass_s, step);
    }
    int n = snprintf(buf, cap, "speculation (up to %d drafts): %ld drafts proposed, %ld accepted "
                     "(%.1f%%; %ld partial passes; by position", sp->max_draft, t->proposed,
                     t->accepted, t->proposed ? 100.0 * t->accepted / t->proposed : 0.0,
                     t->partial);
    for (int i = 0; i < 8 && i < sp->max_draft && n > 0 && (size_t)n < cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%ld", i ? "/" : " ", t->accepted_at[i]);
    if (n > 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "), %.3f forward passes per generated token (%ld "
                      "passes + %ld single steps for %ld tokens), time saved %s%s%s", generated
                      ? (double)fwd / (double)generated : 0.0, t->passes, t->steps, generated,
                      saved, sp->off ? "; " : "", sp->off ? sp->why : "");
}
