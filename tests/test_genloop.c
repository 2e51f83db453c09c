/* test_genloop.c — the one generation loop (src/engine/generate.h) and the one prefill path
 * (k3_session_prefill_with) on k3-nano, against values derived without them:
 *  - the reference greedy continuation (tests/fixtures/k3-nano/reference, computed by the
 *    Python reference implementation) gives the ids, so max_new, stop ids, the context limit,
 *    the interrupt flag and a cancel callback each end the run at an index known in advance;
 *  - the emit callback receives exactly the ids the session is then fed (k3_session_tokens);
 *  - a stop string split across two ids is found in the ids' raw bytes by strstr, and the
 *    loop must stop at the id that completes it, releasing exactly the text before it;
 *  - the prefill hook sees passes of `chunk` ids in order with the reference logits of every
 *    position;
 * and, through $K3_BIN, what a new user saw: --profile during a chunked prefill prints one
 * line per pass, chat's /help lists the slash commands only, and a reply that was all
 * thinking says "(thinking hidden, N tokens)" with --no-show-thinking. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/engine/generate.h"
#include "../src/engine/k3.h"
#include "../src/tok/tokenizer.h"
#include "batch_check.h"
#include "cli_run.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"
#define NANO_REF NANO "/reference"
#define VOCAB 2048

static k3_engine *load(void) {
    k3_engine *e = NULL;
    k3_err err = {0};
    k3_engine_opts o = k3_engine_opts_default();
    o.experts_in_place = 1;
    CHECK_OR(NULL, k3_engine_load(NANO, &o, &e, &err) == K3_OK, "%s", err.msg);
    return e;
}

/* ---- one generation through k3_gen, recorded ------------------------------------------------ */

typedef struct rec {
    int32_t ids[256];
    int n;
    int fed_calls, fed_argmax_ok;  /* io.fed: calls, and rows whose argmax is the next id */
    const int32_t *ref;            /* expected ids, for fed_argmax_ok */
    int interrupt_after;           /* > 0: raise *flag once this many ids were emitted */
    volatile sig_atomic_t *flag;
    int cancel_after;              /* > 0: io.cancelled says yes from this many ids on */
    const k3_tokenizer *tok;       /* stop strings: the raw bytes of each id go through st */
    k3_stop_text *st;
    char text[4096];
    size_t n_text;
} rec;

static int argmax(const float *x) {
    int best = 0;
    for (int i = 1; i < VOCAB; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static bool rec_emit(void *user, int32_t id) {
    rec *r = user;
    if (r->n < 256) r->ids[r->n] = id;
    r->n++;
    if (r->interrupt_after && r->n >= r->interrupt_after) *r->flag = 1;
    if (!r->st) return false;
    size_t len, n_out;
    const char *b = k3_tokenizer_token_bytes(r->tok, id, &len), *out;
    bool stop = k3_stop_text_push(r->st, b, len, &out, &n_out);
    if (r->n_text + n_out < sizeof r->text) memcpy(r->text + r->n_text, out, n_out);
    r->n_text += n_out;
    return stop;
}

static int rec_fed(void *user, const float *logits, k3_err *err) {
    (void)err;
    rec *r = user;
    /* the logits after the id fed as r->n-th pick the next reference id */
    if (r->ref && r->n < 24) r->fed_argmax_ok += argmax(logits) == r->ref[r->n];
    r->fed_calls++;
    return K3_OK;
}

static bool rec_cancelled(void *user) {
    rec *r = user;
    return r->cancel_after && r->n >= r->cancel_after;
}

typedef struct run_cfg {
    int max_new, ctx, spec;
    int32_t stop_id;                /* -1 = none */
    double temperature;
    uint64_t seed;
} run_cfg;

/* Prefills p in a fresh session, generates with k3_gen_run as cfg says, records into r; g
 * receives the loop's final state and *pos the session's position, tokens[] its history. */
static int run_gen(k3_engine *e, const bc_prompt *p, const run_cfg *cfg, rec *r, k3_gen *g,
                   int32_t *tokens, int *pos) {
    k3_session *s = NULL;
    k3_sampler sm = {0};
    k3_spec sp = {0};
    k3_err err = {0};
    float *logits = malloc(VOCAB * sizeof *logits);
    k3_sampler_opts so = {.temperature = cfg->temperature, .top_p = 1, .seed = cfg->seed};
    k3_stops stops = {.n = cfg->stop_id >= 0, .ids = {cfg->stop_id}};
    int rc = k3_session_new(e, cfg->ctx, &s, &err);
    if (!rc) rc = k3_sampler_init(&sm, &so, VOCAB, &err);
    if (!rc) rc = k3_spec_init(&sp, cfg->spec, s, &sm, &err);
    sp.judge = false; /* keep verifying on a random-weight model */
    if (!rc) rc = k3_session_prefill(s, p->ids, (size_t)p->n, logits, NULL, &err);
    if (!rc) {
        k3_gen_params gp = {.max_new = cfg->max_new, .stops = &stops, .spec = &sp,
                            .interrupt = r->flag};
        k3_gen_io io = {.user = r, .emit = rec_emit, .fed = rec_fed, .cancelled = rec_cancelled};
        k3_gen_start(g, s, &sm, logits, &gp, &io);
        rc = k3_gen_run(g, &err);
        *pos = k3_session_pos(s);
        memcpy(tokens, k3_session_tokens(s), (size_t)*pos * sizeof *tokens);
    }
    if (rc) k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
    k3_spec_free(&sp);
    k3_sampler_free(&sm);
    k3_session_free(s);
    free(logits);
    return !rc;
}

/* The invariants of every run: the session holds the prompt, then every emitted id but the
 * last; the loop counted what emit saw. */
static int emitted_is_fed(const bc_prompt *p, const rec *r, const k3_gen *g,
                          const int32_t *tokens, int pos, const char *what) {
    CHECK_OR(0, g->n_sampled == r->n && r->n <= 256, "%s: loop counted %d, emit saw %d", what,
             g->n_sampled, r->n);
    CHECK_OR(0, pos == p->n + (r->n ? r->n - 1 : 0), "%s: position %d after %d prompt ids and "
             "%d emitted", what, pos, p->n, r->n);
    CHECK_OR(0, !memcmp(tokens, p->ids, (size_t)p->n * sizeof *tokens), "%s: prompt", what);
    for (int i = 0; i + 1 < r->n; i++)
        CHECK_OR(0, tokens[p->n + i] == r->ids[i], "%s: position %d holds %d, emitted %d", what,
                 p->n + i, tokens[p->n + i], r->ids[i]);
    CHECK_OR(0, !r->n || g->last_id == r->ids[r->n - 1], "%s: last_id %d", what, g->last_id);
    return 1;
}

static int same_as_reference(const bc_prompt *p, const rec *r, int n, const char *what) {
    for (int i = 0; i < n; i++)
        CHECK_OR(0, r->ids[i] == p->greedy[i], "%s: id %d is %d, the reference's %d", what, i,
                 r->ids[i], p->greedy[i]);
    return 1;
}

static int32_t tokens_buf[4096];

/* Greedy: the reference continuation, with and without speculation; max_new counted right;
 * the logits after each fed id pick the next reference id. */
static void test_greedy_max_new(void) {
    k3_engine *e = load();
    if (!e) return;
    static const char *names[] = {"prompt_len7.json", "prompt_len33.json"};
    for (int k = 0; k < 2 && !k3_test_stopped(); k++) {
        bc_prompt p;
        if (!bc_prompt_load(NANO_REF, names[k], &p)) break;
        CHECK(p.n_greedy == 24, "%s: %d reference ids", names[k], p.n_greedy);
        static const int max_news[] = {24, 5, 1};
        for (int m = 0; m < 3 && !k3_test_stopped(); m++)
            for (int spec = 0; spec <= 4; spec += 4) {
                rec r = {.ref = p.greedy};
                k3_gen g;
                int pos;
                run_cfg cfg = {.max_new = max_news[m], .spec = spec, .stop_id = -1};
                char what[96];
                snprintf(what, sizeof what, "%s, max_new %d, spec %d", names[k], max_news[m],
                         spec);
                if (!run_gen(e, &p, &cfg, &r, &g, tokens_buf, &pos) ||
                    !emitted_is_fed(&p, &r, &g, tokens_buf, pos, what) ||
                    !same_as_reference(&p, &r, r.n, what))
                    break;
                CHECK(r.n == max_news[m] && g.end == K3_GEN_MAX_NEW, "%s: %d ids, end %d", what,
                      r.n, g.end);
                CHECK(r.fed_calls == r.n - 1 && r.fed_argmax_ok == r.n - 1, "%s: io.fed called "
                      "%d times, %d rows pick the next reference id", what, r.fed_calls,
                      r.fed_argmax_ok);
            }
        bc_prompt_free(&p);
    }
    k3_engine_free(e);
}

/* Each stop rule ends the run at the index the reference ids predict. */
static void test_stop_rules(void) {
    k3_engine *e = load();
    if (!e) return;
    bc_prompt p;
    if (!bc_prompt_load(NANO_REF, "prompt_len7.json", &p)) return;
    int k = 5; /* the stop id: the first reference id from the 6th on not seen before it */
    for (int first = 0; k < 24 && !first; k += !first) {
        first = 1;
        for (int i = 0; i < k; i++) first &= p.greedy[i] != p.greedy[k];
    }
    CHECK(k < 24);
    volatile sig_atomic_t flag = 0;
    struct {
        const char *what;
        run_cfg cfg;
        int interrupt_after, cancel_after;
        int want_n;
        enum k3_gen_end want_end;
    } t[] = {
        {"stop id", {.max_new = 24, .stop_id = p.greedy[k]}, 0, 0, k + 1, K3_GEN_STOP},
        {"stop id, spec", {.max_new = 24, .spec = 3, .stop_id = p.greedy[k]}, 0, 0, k + 1,
         K3_GEN_STOP},
        /* ctx 13: ids are fed at positions 7..12; the 7th id would need position 13 */
        {"context", {.max_new = 24, .ctx = 13, .stop_id = -1}, 0, 0, 7, K3_GEN_CONTEXT},
        {"context, spec", {.max_new = 24, .ctx = 13, .spec = 4, .stop_id = -1}, 0, 0, 7,
         K3_GEN_CONTEXT},
        {"no limit but the context", {.max_new = -1, .ctx = 20, .stop_id = -1}, 0, 0, 14,
         K3_GEN_CONTEXT},
        {"max_new 0", {.max_new = 0, .stop_id = -1}, 0, 0, 0, K3_GEN_MAX_NEW},
        {"interrupt", {.max_new = 24, .stop_id = -1}, 3, 0, 3, K3_GEN_INTERRUPTED},
        {"cancel", {.max_new = 24, .stop_id = -1}, 0, 4, 4, K3_GEN_INTERRUPTED},
        {"max_new before a cancel", {.max_new = 4, .stop_id = -1}, 0, 4, 4, K3_GEN_MAX_NEW},
        {"stop id before max_new", {.max_new = k + 1, .stop_id = p.greedy[k]}, 0, 0, k + 1,
         K3_GEN_STOP},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0] && !k3_test_stopped(); i++) {
        flag = 0;
        rec r = {.ref = p.greedy, .flag = &flag, .interrupt_after = t[i].interrupt_after,
                 .cancel_after = t[i].cancel_after};
        k3_gen g;
        int pos;
        if (!run_gen(e, &p, &t[i].cfg, &r, &g, tokens_buf, &pos) ||
            !emitted_is_fed(&p, &r, &g, tokens_buf, pos, t[i].what) ||
            !same_as_reference(&p, &r, r.n, t[i].what))
            break;
        CHECK(r.n == t[i].want_n && g.end == t[i].want_end, "%s: %d ids (want %d), end %d "
              "(want %d)", t[i].what, r.n, t[i].want_n, g.end, t[i].want_end);
    }
    bc_prompt_free(&p);
    k3_engine_free(e);
}

/* Sampled with a seed: the loop draws exactly what a hand-written step-and-sample loop with
 * the same seed draws. */
static void test_sampled_seed(void) {
    k3_engine *e = load();
    if (!e) return;
    bc_prompt p;
    if (!bc_prompt_load(NANO_REF, "prompt_len7.json", &p)) return;
    rec r = {0};
    k3_gen g;
    int pos;
    run_cfg cfg = {.max_new = 16, .stop_id = -1, .temperature = 0.9, .seed = 1234};
    if (run_gen(e, &p, &cfg, &r, &g, tokens_buf, &pos) &&
        emitted_is_fed(&p, &r, &g, tokens_buf, pos, "sampled")) {
        k3_session *s = NULL;
        k3_sampler sm;
        k3_err err = {0};
        float *logits = malloc(VOCAB * sizeof *logits);
        k3_sampler_opts so = {.temperature = 0.9, .top_p = 1, .seed = 1234};
        int ok = k3_session_new(e, 0, &s, &err) == K3_OK &&
                 k3_sampler_init(&sm, &so, VOCAB, &err) == K3_OK &&
                 k3_session_prefill(s, p.ids, (size_t)p.n, logits, NULL, &err) == K3_OK;
        int same = ok, greedy_like = 1;
        for (int i = 0; ok && i < 16; i++) {
            int32_t id = k3_sampler_sample(&sm, logits);
            same &= id == r.ids[i];
            greedy_like &= id == p.greedy[i];
            if (i + 1 < 16) ok = k3_session_step(s, id, logits, &err) == K3_OK;
        }
        if (ok) k3_sampler_free(&sm);
        k3_session_free(s);
        free(logits);
        CHECK(ok, "%s", err.msg);
        CHECK(same, "the loop's sampled ids differ from step-and-sample with the same seed");
        CHECK(!greedy_like, "temperature 0.9 gave the greedy ids");
    }
    bc_prompt_free(&p);
    k3_engine_free(e);
}

/* A stop string made of the last bytes of one reference id and the first bytes of the next:
 * the loop stops at the second, the released text is everything before the string. */
static void test_stop_string_across_ids(void) {
    k3_engine *e = load();
    if (!e) return;
    const k3_tokenizer *tok = k3_engine_tokenizer(e);
    bc_prompt p;
    if (!bc_prompt_load(NANO_REF, "prompt_len7.json", &p)) return;
    char all[4096];
    size_t n_all = 0, start[25];
    for (int i = 0; i < 24; i++) {
        size_t len;
        const char *b = k3_tokenizer_token_bytes(tok, p.greedy[i], &len);
        start[i] = n_all;
        CHECK(b && n_all + len < sizeof all);
        memcpy(all + n_all, b, len);
        n_all += len;
    }
    start[24] = n_all;
    all[n_all] = 0;
    int cases = 0;
    for (int i = 2; i + 1 < 24 && cases < 3 && !k3_test_stopped(); i++) {
        size_t a = start[i + 1] - start[i], b = start[i + 2] - start[i + 1];
        if (a < 2 || b < 2) continue;
        char stop[8] = {0};
        memcpy(stop, all + start[i + 1] - 2, 4);
        if (memchr(stop, 0, 4)) continue;
        const char *hit = strstr(all, stop);
        if (!hit || (size_t)(hit - all) != start[i + 1] - 2) continue; /* not its first place */
        cases++;
        const char *strings[] = {"\x01never", stop};
        k3_stop_text st = {0};
        k3_stop_text_reset(&st, strings, 2);
        rec r = {.tok = tok, .st = &st};
        k3_gen g;
        int pos;
        run_cfg cfg = {.max_new = 24, .spec = cases == 2 ? 3 : 0, .stop_id = -1};
        int ok = run_gen(e, &p, &cfg, &r, &g, tokens_buf, &pos) &&
                 emitted_is_fed(&p, &r, &g, tokens_buf, pos, "stop string");
        k3_stop_text_free(&st);
        if (!ok) break;
        CHECK(g.end == K3_GEN_STOP_STRING && r.n == i + 2, "stop string '%s' (ids %d and %d): "
              "end %d after %d ids", stop, i, i + 1, g.end, r.n);
        CHECK(r.n_text == start[i + 1] - 2 && !memcmp(r.text, all, r.n_text), "released %zu "
              "bytes, want the %zu before the stop string", r.n_text, start[i + 1] - 2);
    }
    CHECK(cases > 0, "no two neighbouring reference ids of 2+ bytes each");
    bc_prompt_free(&p);
    k3_engine_free(e);
}

/* The matcher alone: text is released as soon as it cannot begin a stop string. */
static void test_stop_text(void) {
    const char *strings[] = {"abc", "bd"};
    k3_stop_text st = {0};
    k3_stop_text_reset(&st, strings, 2);
    const char *out;
    size_t n;
    CHECK(!k3_stop_text_push(&st, "xxa", 3, &out, &n) && n == 2 && !memcmp(out, "xx", 2));
    CHECK(!k3_stop_text_push(&st, "b", 1, &out, &n) && n == 0, "'ab' may still become abc");
    CHECK(!k3_stop_text_push(&st, "x", 1, &out, &n) && n == 3 && !memcmp(out, "abx", 3));
    CHECK(!k3_stop_text_push(&st, "ab", 2, &out, &n) && n == 0);
    CHECK(k3_stop_text_push(&st, "d!", 2, &out, &n) && n == 1 && out[0] == 'a', "'abd' holds "
          "bd at 1: 'a' is released");
    CHECK(k3_stop_text_push(&st, "more", 4, &out, &n) && n == 0, "text after a match");
    k3_stop_text_flush(&st, &out, &n);
    CHECK(n == 0);
    k3_stop_text_reset(&st, strings, 2);
    CHECK(!k3_stop_text_push(&st, "zab", 3, &out, &n) && n == 1);
    k3_stop_text_flush(&st, &out, &n);
    CHECK(n == 2 && !memcmp(out, "ab", 2), "flush gives the held text");
    k3_stop_text_free(&st);
}

/* ---- the prefill hook ------------------------------------------------------------------------ */

typedef struct passes {
    const bc_prompt *p;
    int n, next_pos, bad_rows, stop_after;
    size_t lefts[64];
    double worst;
} passes;

static int on_pass(void *user, int pos, int n, const float *rows, size_t left, k3_err *err) {
    passes *q = user;
    if (pos != q->next_pos) q->bad_rows++;
    for (int t = 0; rows && t < n; t++) {
        const float *want = q->p->logits + (size_t)(pos + t) * VOCAB, *got = rows + (size_t)t * VOCAB;
        for (int i = 0; i < VOCAB; i++) {
            double d = fabs((double)got[i] - want[i]);
            if (d > q->worst) q->worst = d;
        }
        q->bad_rows += argmax(got) != argmax(want);
    }
    if (q->n < 64) q->lefts[q->n] = left;
    q->n++;
    q->next_pos = pos + n;
    if (q->stop_after && q->n == q->stop_after)
        return k3_fail(err, K3_ERR_INTERRUPTED, "stopped by the hook");
    return K3_OK;
}

static void test_prefill_hook(void) {
    k3_engine *e = load();
    if (!e) return;
    bc_prompt p;
    if (!bc_prompt_load(NANO_REF, "prompt_len33.json", &p)) return;
    k3_session *s = NULL;
    k3_err err = {0};
    float *last = malloc(VOCAB * sizeof *last);
    CHECK(k3_session_new(e, 0, &s, &err) == K3_OK, "%s", err.msg);
    k3_session_set_chunk(s, 5);
    passes q = {.p = &p};
    k3_prefill_hook hook = {.user = &q, .on_pass = on_pass, .all_logits = 1};
    int reused = -1;
    CHECK(k3_session_prefill_with(s, p.ids, (size_t)p.n, last, &reused, &hook, &err) == K3_OK,
          "%s", err.msg);
    /* 33 ids in passes of 5: 7 passes, the last of 3 */
    CHECK(q.n == 7 && q.next_pos == 33 && reused == 0, "%d passes ending at %d", q.n, q.next_pos);
    for (int i = 0; i < 7; i++)
        CHECK(q.lefts[i] == (size_t)(i < 6 ? 28 - 5 * i : 0), "pass %d: %zu left", i, q.lefts[i]);
    CHECK(q.bad_rows == 0 && q.worst < 1e-4, "rows vs the reference: %d bad, worst %g",
          q.bad_rows, q.worst);
    CHECK(argmax(last) == p.greedy[0], "the logits after the prompt");
    /* A nonzero status from the hook stops the prefill; the ids fed so far are kept and the
     * next prefill of the same prompt continues from them. */
    k3_session_reset(s);
    q = (passes){.p = &p, .stop_after = 3};
    CHECK(k3_session_prefill_with(s, p.ids, (size_t)p.n, last, NULL, &hook, &err) ==
          K3_ERR_INTERRUPTED && k3_session_pos(s) == 15, "stopped at %d", k3_session_pos(s));
    q = (passes){.p = &p, .next_pos = 15};
    CHECK(k3_session_prefill_with(s, p.ids, (size_t)p.n, last, &reused, &hook, &err) == K3_OK,
          "%s", err.msg);
    CHECK(reused == 15 && q.n == 4 && q.bad_rows == 0 && argmax(last) == p.greedy[0],
          "kept %d, %d passes", reused, q.n);
    k3_session_free(s);
    free(last);
    bc_prompt_free(&p);
    k3_engine_free(e);
}

/* ---- through the CLI ------------------------------------------------------------------------- */

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *h = hay; (h = strstr(h, needle)); h += strlen(needle)) n++;
    return n;
}

/* --profile with --chunk 8 over 20 prompt ids: passes 1-8, 9-16, 17-20, then one line per
 * decode step (3 ids sampled: 2 fed). */
static void test_profile_per_pass(void) {
    k3t_cli r;
    if (k3t_cli_run("run " NANO " --prompt-ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20"
                    " --max-new 3 --chunk 8 --profile --ids", &r))
        return;
    CHECK(r.status == 0, "exit %d: %s", r.status, r.err);
    int lines = count(r.err, "k3: profile: ");
    int ok = lines == 5 && strstr(r.err, "profile: tokens 1-8 (one pass of 8,") &&
             strstr(r.err, "profile: tokens 9-16 (one pass of 8,") &&
             strstr(r.err, "profile: tokens 17-20 (one pass of 4,") &&
             strstr(r.err, "profile: token 21:") && strstr(r.err, "profile: token 22:");
    if (!ok) k3_test_fail(__FILE__, __LINE__, "%d profile lines:\n%s", lines, r.err);
    k3t_cli_free(&r);
}

/* /help in chat: the slash commands, not the command-line help. */
static void test_chat_help_commands_only(void) {
    const char *bin = k3t_bin();
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "printf '/help\\n' | '%s' chat " NANO " -q", bin);
    FILE *f = popen(cmd, "r");
    CHECK(f);
    static char out[1 << 16];
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    CHECK(pclose(f) == 0, "%s", out);
    CHECK(strstr(out, "/reset") && strstr(out, "/max-new N") && strstr(out, "/exit"), "%s", out);
    CHECK(!strstr(out, "usage:") && !strstr(out, "--max-new") && !strstr(out, "--temperature"),
          "/help printed the command-line help:\n%s", out);
}

/* With --no-show-thinking, a reply that was all thinking (8 ids, none of them <|close|>: the
 * think block never closed) says so instead of printing nothing. */
static void test_hidden_thinking_note(void) {
    k3t_cli ids, text;
    if (k3t_cli_run("run " NANO " --chat --prompt Hi --max-new 8 --ids -q", &ids)) return;
    CHECK(ids.status == 0, "%s", ids.err);
    k3_engine *e = load();
    if (!e) return;
    int close_id = k3_tokenizer_special_id(k3_engine_tokenizer(e), "<|close|>");
    k3_engine_free(e);
    int n = 0, closed = 0;
    for (char *p = ids.out; *p;) {
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p) break;
        n++;
        closed |= id == close_id;
        p = *end ? end + 1 : end;
    }
    k3t_cli_free(&ids);
    CHECK(n == 8 && !closed && close_id >= 0, "%d ids, close id %d %s", n, close_id,
          closed ? "among them" : "");
    if (k3t_cli_run("run " NANO " --chat --prompt Hi --max-new 8 -q --no-show-thinking", &text))
        return;
    CHECK(text.status == 0 && !strcmp(text.out, "(thinking hidden, 8 tokens)\n"), "stdout: '%s'",
          text.out);
    k3t_cli_free(&text);
    if (k3t_cli_run("run " NANO " --chat --prompt Hi --max-new 8 -q", &text)) return;
    CHECK(text.status == 0 && !strstr(text.out, "thinking hidden") && strlen(text.out) > 1,
          "shown thinking: '%s'", text.out);
    k3t_cli_free(&text);
}

const k3_test k3_suite_genloop[] = {
    {"greedy_reference_and_max_new", test_greedy_max_new},
    {"stop_rules_at_predicted_index", test_stop_rules},
    {"sampled_seed_as_step_and_sample", test_sampled_seed},
    {"stop_string_across_ids", test_stop_string_across_ids},
    {"stop_text_matcher", test_stop_text},
    {"prefill_hook_passes", test_prefill_hook},
    {"profile_one_line_per_pass", test_profile_per_pass},
    {"chat_help_commands_only", test_chat_help_commands_only},
    {"hidden_thinking_note", test_hidden_thinking_note},
    {0},
};
