/* fixture_check.c — see fixture_check.h. */
#include "fixture_check.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/engine/k3.h"
#include "../src/engine/k3_lab.h"
#include "../src/kernels/kernels.h"
#include "../src/util/fileio.h"
#include "test.h"

static cJSON *load_json(const char *dir, const char *name) {
    char path[1024], *text = NULL;
    k3_err err = {0};
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (k3_read_file(path, 1u << 30, &text, NULL, &err)) {
        k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
        return NULL;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) k3_test_fail(__FILE__, __LINE__, "%s: malformed JSON", path);
    return j;
}

/* The kernel path and expert mode fixture_on_every_path runs the checks with (NULL / 0: the
 * defaults); each load asserts that the engine runs that path (k3_engine_kernels), so a check
 * cannot pass silently on another one. */
static const char *path_kernels;
static int path_in_place;

/* The GPU suite (test_cuda) says what it runs through these variables; the test harness maps
 * them onto the options (the library reads no environment). */
static k3_engine_opts test_opts(void) {
    k3_engine_opts o = k3_engine_opts_default();
    const char *v;
    if ((v = getenv("K3_KERNELS")) && *v) o.kernels = v;
    if (path_kernels) o.kernels = path_kernels;
    o.experts_in_place = path_in_place;
    if ((v = getenv("K3_DEVICE")) && *v) o.device = v;
    static k3_lab_opts lab;
    lab = k3_lab_opts_default();
    if ((v = getenv("K3_GPU_LAYERS")) && *v) lab.gpu_max_layers = atoi(v);
    if ((v = getenv("K3_GPU_EXPERT_SLOTS")) && *v) lab.gpu_expert_slots = atoi(v);
    o.lab = &lab;
    return o;
}

static k3_engine *load_engine(const char *model_dir) {
    k3_engine *e = NULL;
    k3_err err = {0};
    k3_engine_opts o = test_opts();
    if (k3_engine_load(model_dir, &o, &e, &err))
        k3_test_fail(__FILE__, __LINE__, "loading %s: %s", model_dir, err.msg);
    const char *want = path_kernels ? path_kernels : getenv("K3_KERNELS");
    if (e && want && *want && strcmp(k3_engine_kernels(e), want))
        k3_test_fail(__FILE__, __LINE__, "asked for the %s kernel path, the engine runs %s",
                     want, k3_engine_kernels(e));
    if (e && path_in_place) {
        char line[K3_DESCRIBE_CAP];
        k3_engine_describe(e, K3_DESCRIBE_STORE, line, sizeof line);
        if (!strstr(line, "used in place"))
            k3_test_fail(__FILE__, __LINE__, "asked for experts in place: %s", line);
    }
    return e;
}

static int *json_ints(const cJSON *a, int *n) {
    *n = cJSON_GetArraySize(a);
    int *v = malloc((size_t)(*n ? *n : 1) * sizeof *v);
    for (int i = 0; i < *n; i++) v[i] = (int)cJSON_GetArrayItem(a, i)->valuedouble;
    return v;
}

/* max |a - ref| over a JSON float row. */
static double row_diff(const float *a, const cJSON *ref, int n) {
    double worst = 0;
    const cJSON *x = ref->child;
    for (int i = 0; i < n && x; i++, x = x->next) {
        double d = fabs((double)a[i] - x->valuedouble);
        if (!(d <= worst)) worst = d; /* NaN propagates as a failure */
    }
    return worst;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* ---- routing capture ---------------------------------------------------------------- */

#define MAX_MOE 128
#define MAX_K 64
typedef struct routing_log {
    int n_layers, k;
    int layer[MAX_MOE];
    int ids[MAX_MOE][MAX_K];
    float w[MAX_MOE][MAX_K];
} routing_log;

static void on_routing(void *user, int pos, int layer, const int *ids, const float *w, int k) {
    (void)pos;
    routing_log *r = user;
    if (r->n_layers >= MAX_MOE || k > MAX_K) return;
    r->layer[r->n_layers] = layer;
    r->k = k;
    memcpy(r->ids[r->n_layers], ids, (size_t)k * sizeof *ids);
    memcpy(r->w[r->n_layers], w, (size_t)k * sizeof *w);
    r->n_layers++;
}

/* Exact id list (canonical order) and weights within tol for one position. */
static int check_routing(const routing_log *r, const cJSON *routing, int pos, double tol,
                         const char *what) {
    const cJSON *lr;
    int li = 0;
    cJSON_ArrayForEach(lr, routing) {
        int layer = cJSON_GetObjectItem(lr, "layer")->valueint;
        const cJSON *ids = cJSON_GetArrayItem(cJSON_GetObjectItem(lr, "expert_ids"), pos);
        const cJSON *ws = cJSON_GetArrayItem(cJSON_GetObjectItem(lr, "expert_weights"), pos);
        CHECK_OR(0, li < r->n_layers && r->layer[li] == layer, "%s pos %d: no routing for layer %d",
                 what, pos, layer);
        for (int j = 0; j < r->k; j++) {
            int want = cJSON_GetArrayItem(ids, j)->valueint;
            CHECK_OR(0, r->ids[li][j] == want, "%s pos %d layer %d slot %d: expert %d, want %d",
                     what, pos, layer, j, r->ids[li][j], want);
            double d = fabs(r->w[li][j] - cJSON_GetArrayItem(ws, j)->valuedouble);
            CHECK_OR(0, d <= tol, "%s pos %d layer %d slot %d: weight off by %g", what, pos,
                     layer, j, d);
        }
        li++;
    }
    return 1;
}

/* ---- prompts: logits, argmax, routing, greedy --------------------------------------- */

/* Step st: argmax (and the top-8 logits) after the prompt and tokens[0..st-1]; then feeding
 * tokens[st] must route to expert_ids_per_step[st]. */
static void check_greedy(k3_session *s, const cJSON *greedy, float *logits, int vocab,
                         routing_log *rl, const fixture_tol *tol, const char *name) {
    k3_err err = {0};
    const cJSON *toks = cJSON_GetObjectItem(greedy, "tokens");
    const cJSON *steps = cJSON_GetObjectItem(greedy, "expert_ids_per_step");
    const cJSON *top8 = cJSON_GetObjectItem(greedy, "top8");
    int n = cJSON_GetArraySize(toks);
    for (int st = 0; st < n; st++) {
        int want = cJSON_GetArrayItem(toks, st)->valueint, got = argmax(logits, vocab);
        CHECK(got == want, "%s greedy step %d: token %d, want %d", name, st, got, want);
        const cJSON *t8 = cJSON_GetArrayItem(top8, st);
        const cJSON *id = cJSON_GetObjectItem(t8, "ids")->child;
        const cJSON *lg = cJSON_GetObjectItem(t8, "logits")->child;
        for (; id && lg; id = id->next, lg = lg->next)
            CHECK(fabs(logits[id->valueint] - lg->valuedouble) <= tol->logits,
                  "%s greedy step %d: logit of %d is %g, want %g", name, st, id->valueint,
                  logits[id->valueint], lg->valuedouble);
        rl->n_layers = 0;
        CHECK(!k3_session_step(s, want, logits, &err), "%s", err.msg);
        const cJSON *layers = cJSON_GetArrayItem(steps, st);
        CHECK(rl->n_layers == cJSON_GetArraySize(layers), "%s greedy step %d: %d MoE layers",
              name, st, rl->n_layers);
        for (int li = 0; li < rl->n_layers; li++) {
            const cJSON *ids = cJSON_GetArrayItem(layers, li);
            for (int j = 0; j < rl->k; j++)
                CHECK(rl->ids[li][j] == cJSON_GetArrayItem(ids, j)->valueint,
                      "%s greedy step %d layer %d slot %d: expert %d", name, st, rl->layer[li],
                      j, rl->ids[li][j]);
        }
    }
}

static void check_prompt(k3_engine *e, const char *ref_dir, const char *name,
                         const fixture_tol *tol) {
    cJSON *j = load_json(ref_dir, name);
    if (!j) return;
    k3_session *s = NULL;
    k3_err err = {0};
    int vocab = k3_engine_config(e)->vocab_size, n_ids;
    int *ids = json_ints(cJSON_GetObjectItem(j, "prompt_ids"), &n_ids);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    routing_log *rl = calloc(1, sizeof *rl);
    const cJSON *ref_logits = cJSON_GetObjectItem(j, "logits");
    const cJSON *routing = cJSON_GetObjectItem(j, "routing");
    k3_trace tr = {.user = rl, .on_routing = on_routing};
    int ok = !k3_session_new(e, 0, &s, &err);
    if (!ok) k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
    if (ok) k3_session_set_trace(s, &tr);
    double worst = 0;
    for (int p = 0; ok && p < n_ids; p++) {
        rl->n_layers = 0;
        if (k3_session_step(s, ids[p], logits, &err)) {
            k3_test_fail(__FILE__, __LINE__, "%s pos %d: %s", name, p, err.msg);
            break;
        }
        double d = row_diff(logits, cJSON_GetArrayItem(ref_logits, p), vocab);
        worst = d > worst ? d : worst;
        if (!(d <= tol->logits)) {
            k3_test_fail(__FILE__, __LINE__, "%s pos %d: max |Δlogit| %g > %g", name, p, d,
                         tol->logits);
            break;
        }
        int want = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "argmax"), p)->valueint;
        if (argmax(logits, vocab) != want) {
            k3_test_fail(__FILE__, __LINE__, "%s pos %d: argmax %d, want %d", name, p,
                         argmax(logits, vocab), want);
            break;
        }
        if (!check_routing(rl, routing, p, tol->expert_weight, name)) break;
    }
    if (!k3_test_stopped())
        check_greedy(s, cJSON_GetObjectItem(j, "greedy"), logits, vocab, rl, tol, name);
    if (getenv("K3_TEST_VERBOSE")) printf("  %s: max |Δlogit| %.3g\n", name, worst);
    k3_session_free(s);
    free(rl);
    free(logits);
    free(ids);
    cJSON_Delete(j);
}

void fixture_check_prompts(const char *model_dir, const char *ref_dir, const fixture_tol *tol) {
    cJSON *man = load_json(ref_dir, "manifest.json");
    k3_engine *e = man ? load_engine(model_dir) : NULL;
    const cJSON *p;
    if (e)
        cJSON_ArrayForEach(p, cJSON_GetObjectItem(man, "prompts")) {
            check_prompt(e, ref_dir, p->valuestring, tol);
            if (k3_test_stopped()) break;
        }
    k3_engine_free(e);
    cJSON_Delete(man);
}

/* ---- per-layer trace ------------------------------------------------------------------ */

typedef struct trace_ctx {
    const cJSON *layers, *final_hidden, *final_normed;
    double tol, worst;
    char where[160];
} trace_ctx;

static const char *point_key(enum k3_trace_point pt) {
    switch (pt) {
    case K3_TRACE_ATTN_IN: return "attn_in";
    case K3_TRACE_ATTN_OUT: return "attn_out";
    case K3_TRACE_MLP_IN: return "mlp_in";
    case K3_TRACE_MLP_OUT: return "mlp_out";
    case K3_TRACE_PARTIAL_SUM: return "partial_sum";
    default: return NULL;
    }
}

static void on_vector(void *user, int pos, int layer, enum k3_trace_point pt, const float *x,
                      int n) {
    trace_ctx *t = user;
    const cJSON *ref = NULL;
    const char *key = point_key(pt);
    if (key)
        ref = cJSON_GetObjectItem(cJSON_GetArrayItem(t->layers, layer), key);
    else
        ref = pt == K3_TRACE_FINAL_HIDDEN ? t->final_hidden : t->final_normed;
    double d = row_diff(x, cJSON_GetArrayItem(ref, pos), n);
    if (!(d <= t->worst)) {
        t->worst = d;
        snprintf(t->where, sizeof t->where, "pos %d layer %d %s", pos, layer,
                 key ? key : pt == K3_TRACE_FINAL_HIDDEN ? "final_hidden" : "final_normed");
    }
}

void fixture_check_trace(const char *model_dir, const char *ref_dir, const char *trace_file,
                         const fixture_tol *tol) {
    cJSON *j = load_json(ref_dir, trace_file);
    k3_engine *e = j ? load_engine(model_dir) : NULL;
    k3_session *s = NULL;
    k3_err err = {0};
    if (!e || k3_session_new(e, 0, &s, &err)) goto done;
    trace_ctx t = {cJSON_GetObjectItem(j, "layers"), cJSON_GetObjectItem(j, "final_hidden"),
                   cJSON_GetObjectItem(j, "final_normed"), tol->trace, 0, ""};
    k3_trace tr = {.user = &t, .on_vector = on_vector};
    k3_session_set_trace(s, &tr);
    int n;
    int *ids = json_ints(cJSON_GetObjectItem(j, "prompt_ids"), &n);
    for (int p = 0; p < n; p++)
        if (k3_session_step(s, ids[p], NULL, &err)) break;
    free(ids);
    if (err.code) k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
    else if (!(t.worst <= tol->trace))
        k3_test_fail(__FILE__, __LINE__, "trace: max |Δ| %g > %g at %s", t.worst, tol->trace,
                     t.where);
    if (getenv("K3_TEST_VERBOSE")) printf("  trace: max |Δ| %.3g at %s\n", t.worst, t.where);
done:
    k3_session_free(s);
    k3_engine_free(e);
    cJSON_Delete(j);
}

/* ---- cached decode vs full prefill ---------------------------------------------------- */

void fixture_check_decode(const char *model_dir, const char *ref_dir, const fixture_tol *tol) {
    cJSON *j = load_json(ref_dir, "decode_vs_prefill.json");
    k3_engine *e = j ? load_engine(model_dir) : NULL;
    k3_session *s = NULL;
    k3_err err = {0};
    if (!e || k3_session_new(e, 0, &s, &err)) goto done;
    int n, k = cJSON_GetObjectItem(j, "prefill_len")->valueint, vocab = k3_engine_config(e)->vocab_size;
    int *ids = json_ints(cJSON_GetObjectItem(j, "prompt_ids"), &n);
    const cJSON *full = cJSON_GetObjectItem(j, "full_prefill_logits");
    float *logits = malloc((size_t)vocab * sizeof *logits);
    double worst = 0;
    /* Prefill k tokens (logits only at the last), then decode the rest one at a time. */
    for (int p = 0; p < n && !err.code; p++) {
        if (k3_session_step(s, ids[p], p >= k - 1 ? logits : NULL, &err)) break;
        if (p < k - 1) continue;
        double d = row_diff(logits, cJSON_GetArrayItem(full, p - (k - 1)), vocab);
        worst = d > worst ? d : worst;
    }
    if (err.code) k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
    else if (!(worst <= tol->decode_vs_prefill))
        k3_test_fail(__FILE__, __LINE__, "cached decode vs full prefill: max |Δ| %g > %g", worst,
                     tol->decode_vs_prefill);
    if (getenv("K3_TEST_VERBOSE"))
        printf("  cached decode vs full prefill: max |Δ| %.3g\n", worst);
    free(logits);
    free(ids);
done:
    k3_session_free(s);
    k3_engine_free(e);
    cJSON_Delete(j);
}

/* ---- every kernel path ------------------------------------------------------------------- */

void fixture_on_every_path(void (*check)(void), int others_in_place) {
    const k3_kernels *all[8];
    int n = k3_kernels_available(all, 8);
    for (int i = 0; i < n && !k3_test_stopped(); i++) {
        printf("        (kernel path %s)\n", k3_kernels_name(all[i]));
        fflush(stdout);
        path_kernels = k3_kernels_name(all[i]);
        path_in_place = i > 0 && others_in_place;
        check();
    }
    path_kernels = NULL, path_in_place = 0;
}
