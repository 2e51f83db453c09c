/* generate.c — the generation loop and the stop-string matcher (see generate.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* memmem; the Makefile passes it too, but not every build does */
#endif
#include "generate.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the loop -------------------------------------------------------------------------------- */

static k3_spec *spec_of(const k3_gen *g) {
    return g->o.spec && g->o.spec->max_draft > 0 ? g->o.spec : NULL;
}

void k3_gen_start(k3_gen *g, k3_session *s, k3_sampler *sm, float *logits,
                  const k3_gen_params *o, const k3_gen_io *io) {
    *g = (k3_gen){.s = s, .sm = sm, .logits = logits, .o = *o, .last_id = -1,
                  .fed = k3_session_pos(s)};
    if (io) g->io = *io;
    if (spec_of(g)) k3_spec_restart(g->o.spec);
}

/* Emits id and applies the stop rules (generate.h); true when the generation ends at it, in
 * which case it is not fed. */
static bool take(k3_gen *g, int32_t id) {
    bool stop_id = g->o.stops && k3_stops_has(g->o.stops, id);
    g->n_sampled++;
    g->last_id = id;
    bool stop_text = g->io.emit && g->io.emit(g->io.user, id);
    if (stop_id) g->end = K3_GEN_STOP;
    else if (stop_text) g->end = K3_GEN_STOP_STRING;
    else if (g->o.max_new >= 0 && g->n_sampled >= g->o.max_new) g->end = K3_GEN_MAX_NEW;
    else if (g->fed >= k3_session_max_ctx(g->s)) g->end = K3_GEN_CONTEXT;
    else if ((g->o.interrupt && *g->o.interrupt) ||
             (g->io.cancelled && g->io.cancelled(g->io.user)))
        g->end = K3_GEN_INTERRUPTED;
    if (g->end) return true;
    g->fed++; /* it will be fed */
    return false;
}

/* k3_spec_io: the logits after each id a pass keeps go to io.fed; an accepted draft is taken
 * like a sampled id. */
static int spec_fed(void *user, const float *logits, k3_err *err) {
    k3_gen *g = user;
    return g->io.fed ? g->io.fed(g->io.user, logits, err) : K3_OK;
}
static bool spec_accepted(void *user, int32_t id) { return take(user, id); }

bool k3_gen_next(k3_gen *g, int32_t *id) {
    if (g->end) return false;
    if (g->o.max_new >= 0 && g->n_sampled >= g->o.max_new) {
        g->end = K3_GEN_MAX_NEW;
        return false;
    }
    k3_spec *sp = spec_of(g);
    if (g->io.choose && g->io.choose(g->io.user, id)) {
        /* the caller's id (a scripted reply) */
    } else if (!sp || !k3_spec_next(sp, id)) {
        *id = k3_sampler_sample(g->sm, g->logits);
    }
    return !take(g, *id);
}

int k3_gen_feed_ids(k3_gen *g, int32_t id, int max_drafts, const int32_t **ids) {
    k3_spec *sp = spec_of(g);
    g->pending = id;
    g->n_feed = 1;
    *ids = &g->pending;
    if (!sp) return 1;
    int left = g->o.max_new >= 0 ? g->o.max_new - g->n_sampled - 1 /* drafts still emittable */
                                 : k3_session_max_ctx(g->s);
    if (left > max_drafts) left = max_drafts;
    g->n_feed = 1 + k3_spec_propose(sp, g->s, id, left);
    *ids = sp->pass;
    return g->n_feed;
}

const float *k3_gen_rows(const k3_gen *g) {
    k3_spec *sp = spec_of(g);
    return g->n_feed > 1 ? sp->rows : g->logits;
}

int k3_gen_fed(k3_gen *g, int rc, k3_err *err) {
    k3_spec *sp = spec_of(g);
    if (sp) { /* id, and maybe drafts K3 agrees with (taken through spec_accepted) */
        bool ended = false;
        k3_spec_io sio = {g, g->io.fed ? spec_fed : NULL, spec_accepted};
        rc = k3_spec_settle(sp, g->s, g->sm, rc, k3_gen_rows(g), g->logits, &sio, &ended, err);
    } else if (!rc && g->io.fed) {
        rc = g->io.fed(g->io.user, g->logits, err);
    }
    if (rc) g->end = K3_GEN_FAILED;
    return rc;
}

int k3_gen_step(k3_gen *g, k3_err *err) {
    int32_t id;
    if (!k3_gen_next(g, &id)) return K3_OK;
    const int32_t *ids;
    int n = k3_gen_feed_ids(g, id, INT_MAX, &ids);
    int rc = n == 1 ? k3_session_step(g->s, id, g->logits, err)
                    : k3_session_forward(g->s, ids, n, (float *)k3_gen_rows(g),
                                         K3_FWD_ALL_LOGITS | K3_FWD_REWINDABLE, err);
    return k3_gen_fed(g, rc, err);
}

int k3_gen_run(k3_gen *g, k3_err *err) {
    double t0 = now_s();
    int rc = K3_OK;
    while (!g->end && !rc) rc = k3_gen_step(g, err);
    g->decode_s = now_s() - t0;
    return rc;
}

/* ---- stop strings ---------------------------------------------------------------------------- */

void k3_stop_text_reset(k3_stop_text *st, const char *const *strings, int n) {
    st->n = n < K3_STOP_TEXT_MAX ? n : K3_STOP_TEXT_MAX;
    for (int i = 0; i < st->n; i++) st->s[i] = strings[i];
    st->len = st->released = 0;
    st->matched = st->oom = false;
    st->which = -1;
}

void k3_stop_text_free(k3_stop_text *st) {
    free(st->hold);
    *st = (k3_stop_text){0};
}

/* Earliest start of any stop string in h[0, n), or -1. */
static long find_stop(const k3_stop_text *st, const char *h, size_t n, int *which) {
    long best = -1;
    for (int i = 0; i < st->n; i++) {
        const char *m = memmem(h, n, st->s[i], strlen(st->s[i]));
        if (m && (best < 0 || m - h < best)) best = m - h, *which = i;
    }
    return best;
}

/* Length of the longest suffix of h[0, n) that is a proper prefix of some stop string. */
static size_t held_suffix(const k3_stop_text *st, const char *h, size_t n) {
    size_t keep = 0;
    for (int i = 0; i < st->n; i++) {
        size_t sl = strlen(st->s[i]);
        for (size_t k = (sl - 1 < n ? sl - 1 : n); k > keep; k--)
            if (!memcmp(h + n - k, st->s[i], k)) {
                keep = k;
                break;
            }
    }
    return keep;
}

bool k3_stop_text_push(k3_stop_text *st, const char *text, size_t n, const char **out,
                       size_t *out_n) {
    *out = st->hold;
    *out_n = 0;
    if (st->matched) return true;
    if (st->released) { /* drop what went out at the last call */
        memmove(st->hold, st->hold + st->released, st->len - st->released);
        st->len -= st->released;
        st->released = 0;
    }
    if (!st->len && !n) return false;
    if (st->len + n > st->cap) {
        size_t cap = st->cap ? st->cap : 256;
        while (cap < st->len + n) cap *= 2;
        char *p = realloc(st->hold, cap);
        if (!p) { /* keep matching what is held; this text is lost */
            st->oom = true;
            return false;
        }
        st->hold = p;
        st->cap = cap;
    }
    if (n) memcpy(st->hold + st->len, text, n);
    st->len += n;
    *out = st->hold;
    long at = find_stop(st, st->hold, st->len, &st->which);
    if (at >= 0) {
        *out_n = (size_t)at;
        st->len = 0;
        st->matched = true;
        return true;
    }
    *out_n = st->released = st->len - held_suffix(st, st->hold, st->len);
    return false;
}

void k3_stop_text_flush(k3_stop_text *st, const char **out, size_t *out_n) {
    *out = st->hold + st->released;
    *out_n = st->matched ? 0 : st->len - st->released;
    st->len = st->released = 0;
}
