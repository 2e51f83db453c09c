/* batch_check.c — see batch_check.h. */
#include "batch_check.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/util/fileio.h"
#include "test.h"

static cJSON *load_json(const char *dir, const char *name) {
    char path[1024], *text = NULL;
    k3_err err = {0};
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECK_OR(NULL, k3_read_file(path, 1u << 30, &text, NULL, &err) == K3_OK, "%s", err.msg);
    cJSON *j = cJSON_Parse(text);
    free(text);
    CHECK_OR(NULL, j != NULL, "%s: malformed JSON", path);
    return j;
}

int bc_prompt_names(const char *ref_dir, char **names, int cap) {
    cJSON *man = load_json(ref_dir, "manifest.json");
    if (!man) return 0;
    int n = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(man, "prompts")) {
        if (n < cap && cJSON_IsString(p)) names[n++] = strdup(p->valuestring);
    }
    cJSON_Delete(man);
    return n;
}

int bc_prompt_load(const char *ref_dir, const char *name, bc_prompt *p) {
    memset(p, 0, sizeof *p);
    cJSON *j = load_json(ref_dir, name);
    if (!j) return 0;
    const cJSON *ids = cJSON_GetObjectItem(j, "prompt_ids"), *lg = cJSON_GetObjectItem(j, "logits");
    const cJSON *gr = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "greedy"), "tokens");
    p->n = cJSON_GetArraySize(ids);
    p->vocab = cJSON_GetObjectItem(j, "vocab_size")->valueint;
    p->ids = malloc((size_t)p->n * sizeof *p->ids);
    p->logits = malloc((size_t)p->n * p->vocab * sizeof *p->logits);
    for (int t = 0; t < p->n; t++) {
        p->ids[t] = cJSON_GetArrayItem(ids, t)->valueint;
        const cJSON *row = cJSON_GetArrayItem(lg, t), *x = row ? row->child : NULL;
        for (int i = 0; i < p->vocab && x; i++, x = x->next)
            p->logits[(size_t)t * p->vocab + i] = (float)x->valuedouble;
    }
    p->n_greedy = gr ? cJSON_GetArraySize(gr) : 0;
    if (p->n_greedy > 64) p->n_greedy = 64;
    for (int i = 0; i < p->n_greedy; i++) p->greedy[i] = cJSON_GetArrayItem(gr, i)->valueint;
    cJSON_Delete(j);
    return 1;
}

void bc_prompt_free(bc_prompt *p) {
    free(p->ids);
    free(p->logits);
}

void bc_tmp_path(char *buf, size_t cap, const char *tag) {
    static int seq;
    snprintf(buf, cap, "/tmp/k3_batch_%d_%d_%s.state", (int)getpid(), seq++, tag);
}

int bc_same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    k3_err err = {0};
    int same = !k3_read_file(a, 1u << 30, &x, &nx, &err) && !k3_read_file(b, 1u << 30, &y, &ny, &err)
               && nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

/* ---- routing capture: ids and weights per (position, layer) ------------------------------- */

#define MAX_POS 128
#define MAX_LAYERS 16
#define MAX_K 32
typedef struct routes {
    int k, seen;
    int ids[MAX_POS][MAX_LAYERS][MAX_K];
    float w[MAX_POS][MAX_LAYERS][MAX_K];
} routes;

static void on_routing(void *user, int pos, int layer, const int *ids, const float *w, int k) {
    routes *r = user;
    if (pos >= MAX_POS || layer >= MAX_LAYERS || k > MAX_K) return;
    r->k = k;
    r->seen++;
    memcpy(r->ids[pos][layer], ids, (size_t)k * sizeof *ids);
    memcpy(r->w[pos][layer], w, (size_t)k * sizeof *w);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy continuation by steps after the session's current state; 0 after a failure. */
static int greedy_matches(k3_session *s, const bc_prompt *p, float *logits, const char *what) {
    k3_err err = {0};
    for (int i = 0; i < p->n_greedy && i < p->max_greedy; i++) {
        int id = argmax(logits, p->vocab);
        CHECK_OR(0, id == p->greedy[i], "%s: greedy token %d is %d, reference %d", what, i, id,
                 p->greedy[i]);
        if (i + 1 < p->n_greedy && i + 1 < p->max_greedy)
            CHECK_OR(0, k3_session_step(s, id, logits, &err) == K3_OK, "%s", err.msg);
    }
    return 1;
}

/* Token by token: logits [n][vocab], routing, state file and greedy continuation. */
static int run_steps(const k3_engine *e, const bc_prompt *p, float *logits, routes *rt,
                     const char *state_path) {
    k3_session *s = NULL;
    k3_err err = {0};
    CHECK_OR(0, k3_session_new(e, 0, &s, &err) == K3_OK, "%s", err.msg);
    k3_trace tr = {.user = rt, .on_routing = on_routing};
    k3_session_set_trace(s, &tr);
    int ok = 1;
    for (int t = 0; ok && t < p->n; t++)
        ok = k3_session_step(s, p->ids[t], logits + (size_t)t * p->vocab, &err) == K3_OK;
    if (ok) ok = k3_session_save(s, state_path, &err) == K3_OK;
    if (!ok) k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
    k3_session_set_trace(s, NULL);
    float *last = malloc((size_t)p->vocab * sizeof *last);
    if (ok) memcpy(last, logits + (size_t)(p->n - 1) * p->vocab, (size_t)p->vocab * sizeof *last);
    if (ok) ok = greedy_matches(s, p, last, "token by token");
    free(last);
    k3_session_free(s);
    return ok;
}

/* Chunked: passes of `chunk` ids with every position's logits. */
static int run_chunked(const k3_engine *e, const bc_prompt *p, int chunk, float *logits,
                       routes *rt, const char *state_path) {
    k3_session *s = NULL;
    k3_err err = {0};
    CHECK_OR(0, k3_session_new(e, 0, &s, &err) == K3_OK, "%s", err.msg);
    k3_trace tr = {.user = rt, .on_routing = on_routing};
    k3_session_set_trace(s, &tr);
    int ok = 1;
    for (int t = 0; ok && t < p->n; t += chunk) {
        int len = p->n - t < chunk ? p->n - t : chunk;
        ok = k3_session_forward(s, p->ids + t, len, logits + (size_t)t * p->vocab,
                                K3_FWD_ALL_LOGITS, &err) == K3_OK;
    }
    if (ok) ok = k3_session_save(s, state_path, &err) == K3_OK;
    if (!ok) k3_test_fail(__FILE__, __LINE__, "chunk %d: %s", chunk, err.msg);
    k3_session_set_trace(s, NULL);
    float *last = malloc((size_t)p->vocab * sizeof *last);
    if (ok) memcpy(last, logits + (size_t)(p->n - 1) * p->vocab, (size_t)p->vocab * sizeof *last);
    if (ok) ok = greedy_matches(s, p, last, "chunked");
    free(last);
    k3_session_free(s);
    return ok;
}

/* k3_session_prefill with the chunk size: the last position's logits. */
static int prefill_last(const k3_engine *e, const bc_prompt *p, int chunk, float *last) {
    k3_session *s = NULL;
    k3_err err = {0};
    CHECK_OR(0, k3_session_new(e, 0, &s, &err) == K3_OK, "%s", err.msg);
    k3_session_set_chunk(s, chunk);
    int ok = k3_session_prefill(s, p->ids, (size_t)p->n, last, NULL, &err) == K3_OK;
    if (!ok) k3_test_fail(__FILE__, __LINE__, "prefill chunk %d: %s", chunk, err.msg);
    k3_session_free(s);
    return ok;
}

static void check_prompt(const k3_engine *e, const bc_prompt *p, const int *chunks, int n_chunks,
                         double tol, const char *name) {
    size_t V = (size_t)p->vocab, all = (size_t)p->n * V;
    float *ls = malloc(all * sizeof *ls), *lc = malloc(all * sizeof *lc), *last = malloc(V * 4);
    routes *rs = calloc(1, sizeof *rs), *rc = calloc(1, sizeof *rc);
    char sp[256], cp[256];
    bc_tmp_path(sp, sizeof sp, "steps");
    bc_tmp_path(cp, sizeof cp, "chunked");
    int ok = run_steps(e, p, ls, rs, sp);
    for (int ci = 0; ok && ci < n_chunks; ci++) {
        int chunk = chunks[ci];
        memset(rc, 0, sizeof *rc);
        if (!(ok = run_chunked(e, p, chunk, lc, rc, cp))) break;
        size_t bad = 0;
        while (bad < all && memcmp(&ls[bad], &lc[bad], sizeof *ls) == 0) bad++;
        if (bad < all) {
            k3_test_fail(__FILE__, __LINE__, "%s chunk %d: logits differ from token by token at "
                         "position %zu id %zu: %.9g vs %.9g", name, chunk, bad / V, bad % V,
                         lc[bad], ls[bad]);
            break;
        }
        for (int t = 0; t < p->n; t++) {
            const float *got = lc + t * V, *ref = p->logits + t * V;
            double worst = 0;
            for (size_t i = 0; i < V; i++) {
                double d = fabs((double)got[i] - ref[i]);
                if (!(d <= worst)) worst = d;
            }
            if (!(worst <= tol) || argmax(got, p->vocab) != argmax(ref, p->vocab)) {
                k3_test_fail(__FILE__, __LINE__, "%s chunk %d position %d: max |dlogit| %.3g "
                             "(tolerance %.3g), argmax %d vs reference %d", name, chunk, t, worst,
                             tol, argmax(got, p->vocab), argmax(ref, p->vocab));
                ok = 0;
                break;
            }
        }
        if (!ok) break;
        if (rc->seen != rs->seen || memcmp(rc->ids, rs->ids, sizeof rs->ids) ||
            memcmp(rc->w, rs->w, sizeof rs->w)) {
            k3_test_fail(__FILE__, __LINE__, "%s chunk %d: routing differs from token by token "
                         "(%d vs %d routing calls)", name, chunk, rc->seen, rs->seen);
            break;
        }
        if (!bc_same_file(sp, cp)) {
            k3_test_fail(__FILE__, __LINE__, "%s chunk %d: the state file (KDA state, conv "
                         "windows, MLA cache, ids) differs from token by token", name, chunk);
            break;
        }
        if (!p->max_greedy) continue; /* the quick check (k3-wide) stops here */
        if (!(ok = prefill_last(e, p, chunk, last))) break;
        if (memcmp(last, ls + (size_t)(p->n - 1) * V, V * sizeof *last)) {
            k3_test_fail(__FILE__, __LINE__, "%s chunk %d: k3_session_prefill's last logits "
                         "differ from token by token", name, chunk);
            break;
        }
    }
    unlink(sp);
    unlink(cp);
    free(ls), free(lc), free(last), free(rs), free(rc);
}

void bc_check_chunked(const char *model_dir, const char *ref_dir, const int *chunks,
                      int n_chunks, double tol, int max_greedy) {
    k3_engine *e = NULL;
    k3_err err = {0};
    CHECK(k3_engine_load(model_dir, NULL, &e, &err) == K3_OK, "%s", err.msg);
    char *names[16];
    int n = bc_prompt_names(ref_dir, names, 16);
    if (n == 0 && !k3_test_stopped()) k3_test_fail(__FILE__, __LINE__, "no prompts in %s", ref_dir);
    for (int i = 0; i < n; i++) {
        bc_prompt p;
        if (!k3_test_stopped() && bc_prompt_load(ref_dir, names[i], &p)) {
            p.max_greedy = max_greedy;
            CHECK(p.n <= MAX_POS, "prompt too long for the routing capture");
            check_prompt(e, &p, chunks, n_chunks, tol, names[i]);
            bc_prompt_free(&p);
        }
        free(names[i]);
    }
    k3_engine_free(e);
}
