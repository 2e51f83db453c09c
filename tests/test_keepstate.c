/* test_keepstate.c — a prompt pass stopped by an on_layer hook puts its session back where the
 * pass began (issue 31: the work of the passes before it is kept, not reset).
 *
 * A prompt of 50 ids goes in passes of 16 (k3_session_set_chunk: the option that caps the
 * prompt rows); the hook stops the second pass after a middle layer, when the KDA layers before
 * it have already folded the pass's ids into their state. The oracles are independent runs of
 * the same engine that were never stopped: a session that fed only the first pass (its state
 * file, k3_session_save, must be the stopped session's byte for byte: ids, KDA state, conv
 * windows, the latent MLA rows in use), and a session that fed the whole prompt in one go (the
 * stopped session, continued, must give its logits bit for bit). On both fixtures: k3-nano
 * (random) and k3-tiny-kjv (trained). A multistep pass with a prompt chunk beside a decode row
 * and a speculative verification goes back for all three sessions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/engine/k3.h"
#include "test.h"

enum { N_IDS = 50, CHUNK = 16 };

typedef struct stopper {
    int stop_pos, stop_layer; /* stop the pass that starts at stop_pos after this layer */
    int calls, stops;
} stopper;

static int on_layer(void *user, int pos, int n, int layer, int n_layers) {
    stopper *st = user;
    (void)n, (void)n_layers;
    st->calls++;
    if (pos != st->stop_pos || layer != st->stop_layer) return 0;
    st->stops++;
    return 1;
}

/* The whole file at path into *buf (*len bytes); 0 on failure. */
static int slurp(const char *path, char **buf, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    rewind(f);
    *buf = malloc((size_t)*len + 1);
    int ok = *buf && fread(*buf, 1, (size_t)*len, f) == (size_t)*len;
    fclose(f);
    return ok;
}

/* 1 when sessions a and b save to the same bytes (k3_session_save). */
static int same_state(const k3_session *a, const k3_session *b, const char *tag) {
    char pa[64], pb[64];
    k3_err err;
    snprintf(pa, sizeof pa, "/tmp/k3_keep_%d_%s_a.k3s", (int)getpid(), tag);
    snprintf(pb, sizeof pb, "/tmp/k3_keep_%d_%s_b.k3s", (int)getpid(), tag);
    char *x = NULL, *y = NULL;
    long nx = 0, ny = 0;
    int same = k3_session_save(a, pa, &err) == K3_OK && k3_session_save(b, pb, &err) == K3_OK &&
               slurp(pa, &x, &nx) && slurp(pb, &y, &ny) && nx == ny && !memcmp(x, y, (size_t)nx);
    free(x), free(y);
    unlink(pa), unlink(pb);
    return same;
}

static void ids_of(int32_t *ids, int n, int vocab) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 7919 + 11) % (vocab - 3) + 3);
}

static void stop_in_second_pass(const char *dir) {
    k3_engine *e = NULL;
    k3_session *s = NULL, *first = NULL, *whole = NULL;
    k3_err err = {0};
    CHECK(k3_engine_load(dir, NULL, &e, &err) == K3_OK, "%s: %s", dir, err.msg);
    const k3_config *c = k3_engine_config(e);
    size_t V = (size_t)c->vocab_size;
    float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b);
    int32_t ids[N_IDS];
    ids_of(ids, N_IDS, c->vocab_size);
    CHECK(k3_session_new(e, 64, &s, &err) == K3_OK &&
          k3_session_new(e, 64, &first, &err) == K3_OK &&
          k3_session_new(e, 64, &whole, &err) == K3_OK, "%s", err.msg);
    k3_session_set_chunk(s, CHUNK);
    /* the second pass (positions 16..31), after a middle layer: KDA layers before it ran */
    stopper st = {.stop_pos = CHUNK, .stop_layer = c->num_hidden_layers / 2};
    k3_trace tr = {.user = &st, .on_layer = on_layer};
    k3_session_set_trace(s, &tr);
    int rc = k3_session_prefill(s, ids, N_IDS, a, NULL, &err);
    CHECK(rc == K3_ERR_INTERRUPTED && st.stops == 1 && k3_session_pos(s) == CHUNK,
          "%s: rc %d (%s), %d stops, position %d (want %d: the first pass kept)", dir, rc,
          err.msg, st.stops, k3_session_pos(s), CHUNK);
    /* exactly the session that fed the first pass and nothing else */
    k3_session_set_chunk(first, CHUNK);
    CHECK(k3_session_prefill(first, ids, CHUNK, NULL, NULL, &err) == K3_OK, "%s", err.msg);
    CHECK(same_state(s, first, "first"), "%s: the stopped session's state differs from one "
          "that fed only the first pass", dir);
    /* continued (the same hook, stopping nothing now): the uninterrupted logits */
    st.stop_pos = -1;
    int reused = -1;
    CHECK(k3_session_prefill(s, ids, N_IDS, a, &reused, &err) == K3_OK && reused == CHUNK,
          "%s: %s, reused %d", dir, err.msg, reused);
    k3_session_set_chunk(whole, N_IDS);
    CHECK(k3_session_prefill(whole, ids, N_IDS, b, NULL, &err) == K3_OK, "%s", err.msg);
    CHECK(memcmp(a, b, V * sizeof *a) == 0, "%s: logits after the resumed prompt differ from "
          "an uninterrupted prefill", dir);
    CHECK(same_state(s, whole, "whole"), "%s: states differ after the whole prompt", dir);
    free(a), free(b);
    k3_session_free(s), k3_session_free(first), k3_session_free(whole);
    k3_engine_free(e);
}

static void test_nano(void) { stop_in_second_pass("tests/fixtures/k3-nano"); }
static void test_kjv(void) { stop_in_second_pass("tests/fixtures/k3-tiny-kjv"); }

/* A multistep pass of a prompt chunk (session 0, whose hook stops it), a decode row (1) and a
 * speculative verification (2, rewindable): every session is back where it was. */
static void test_multistep_all_back(void) {
    k3_engine *e = NULL;
    k3_session *s[3] = {0}, *ref[3] = {0};
    k3_multistep *ms = NULL;
    k3_err err = {0};
    CHECK(k3_engine_load("tests/fixtures/k3-nano", NULL, &e, &err) == K3_OK, "%s", err.msg);
    const k3_config *c = k3_engine_config(e);
    int32_t ids[N_IDS];
    ids_of(ids, N_IDS, c->vocab_size);
    CHECK(k3_multistep_new(e, 64, &ms, &err) == K3_OK, "%s", err.msg);
    for (int i = 0; i < 3; i++) {
        CHECK(k3_session_new(e, 64, &s[i], &err) == K3_OK &&
              k3_session_new(e, 64, &ref[i], &err) == K3_OK, "%s", err.msg);
        /* each holds 8 + i ids already, as its reference does */
        CHECK(k3_session_prefill(s[i], ids + i, 8 + (size_t)i, NULL, NULL, &err) == K3_OK &&
              k3_session_prefill(ref[i], ids + i, 8 + (size_t)i, NULL, NULL, &err) == K3_OK,
              "%s", err.msg);
    }
    stopper st = {.stop_pos = 8, .stop_layer = 1};
    k3_trace tr = {.user = &st, .on_layer = on_layer};
    k3_session_set_trace(s[0], &tr);
    float *logits = malloc((size_t)8 * (size_t)c->vocab_size * sizeof *logits);
    k3_multistep_seg segs[3] = {
        {.session = s[0], .ids = ids + 20, .n_ids = 12, .flags = K3_MS_NO_LOGITS},
        {.session = s[1], .ids = ids + 30, .n_ids = 1, .flags = K3_MS_LAST_LOGITS},
        {.session = s[2], .ids = ids + 31, .n_ids = 4,
         .flags = K3_MS_ALL_LOGITS | K3_MS_REWINDABLE}};
    int rc = k3_multistep_run(ms, segs, 3, logits, &err);
    CHECK(rc == K3_ERR_INTERRUPTED && st.stops == 1, "rc %d (%s), %d stops", rc, err.msg,
          st.stops);
    for (int i = 0; i < 3; i++) {
        CHECK(segs[i].status == K3_ERR_INTERRUPTED && k3_session_pos(s[i]) == 8 + i,
              "segment %d: status %d, position %d", i, segs[i].status, k3_session_pos(s[i]));
        char tag[16];
        snprintf(tag, sizeof tag, "ms%d", i);
        CHECK(same_state(s[i], ref[i], tag), "session %d is not where the pass began", i);
    }
    /* a pass of decode rows only is not stopped (it lasts one step): the hook is not asked */
    st = (stopper){.stop_pos = 8, .stop_layer = 0};
    segs[0] = (k3_multistep_seg){.session = s[0], .ids = ids + 20, .n_ids = 1};
    rc = k3_multistep_run(ms, segs, 3, logits, &err);
    CHECK(rc == K3_OK && st.calls == 0 && k3_session_pos(s[0]) == 9, "rc %d (%s), %d calls",
          rc, err.msg, st.calls);
    free(logits);
    k3_multistep_free(ms);
    for (int i = 0; i < 3; i++) k3_session_free(s[i]), k3_session_free(ref[i]);
    k3_engine_free(e);
}

const k3_test k3_suite_keepstate[] = {
    {"stop_in_second_pass_nano", test_nano},
    {"stop_in_second_pass_kjv", test_kjv},
    {"multistep_all_back", test_multistep_all_back},
    {0},
};
