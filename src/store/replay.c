/* replay.c — trace replay against the policies and Belady's MIN; synthetic trace generator
 * (see replay.h). Offline tools: allocation here is fine. */
#include "replay.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../format/config.h"
#include "policy.h"
#include "store.h"

/* Expert ids in a trace: K3 has 896 routed experts; the bound keeps layer * n_experts keys
 * (K3_MAX_LAYERS * this) well inside int. */
#define K3_TRACE_MAX_EXPERTS (1 << 20)

/* ==== reading a router trace ============================================================ */

/* Appends one request's ids (the layer is folded into the keys once n_experts is known). */
static int add_request(k3_route_trace *t, size_t *cap, const cJSON *ids) {
    if ((size_t)t->n_req == *cap) {
        *cap = *cap ? 2 * *cap : 4096;
        int32_t *nk = realloc(t->key, *cap * (size_t)t->k * sizeof *nk);
        if (!nk) return -1;
        t->key = nk;
    }
    int j = 0;
    for (const cJSON *e = ids->child; e; e = e->next, j++)
        t->key[(size_t)t->n_req * t->k + j] = (int32_t)e->valueint; /* layer folded in later */
    t->n_req++;
    return 0;
}

int k3_route_trace_read(const char *path, k3_route_trace *t, k3_err *err) {
    *t = (k3_route_trace){0};
    FILE *f = fopen(path, "r");
    if (!f) return k3_fail(err, K3_ERR_IO, "%s: cannot open the router trace", path);
    char *line = NULL;
    size_t lcap = 0, cap = 0, lcap_layers = 0, lineno = 0;
    int *layers = NULL, rc = K3_OK;
    while (!rc && getline(&line, &lcap, f) > 0) {
        lineno++;
        cJSON *o = cJSON_Parse(line);
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "layer");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "ids");
        int k = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : 0;
        int ok = cJSON_IsNumber(l) && k > 0 && (!t->k || k == t->k);
        for (const cJSON *e = ok ? ids->child : NULL; e; e = e->next)
            ok &= cJSON_IsNumber(e) && e->valuedouble == floor(e->valuedouble) &&
                  e->valuedouble >= 0 && e->valuedouble < K3_TRACE_MAX_EXPERTS;
        /* Checked on the double: valueint saturates, and layer * n_experts must fit the int
         * keys (a hostile layer overflowed it and wrote out of bounds, issue 20 D4). */
        if (ok && !(l->valuedouble == floor(l->valuedouble) && l->valuedouble >= 0 &&
                    l->valuedouble < K3_MAX_LAYERS)) {
            rc = k3_fail(err, K3_ERR_INPUT, "%s:%zu: layer %.0f is not a layer number "
                         "(an integer in 0..%d)", path, lineno, l->valuedouble, K3_MAX_LAYERS - 1);
        } else if (!ok) {
            rc = k3_fail(err, K3_ERR_INPUT, "%s:%zu: not a router trace line ({\"layer\":L,"
                         "\"ids\":[...]} with the same number of ids on every line)", path, lineno);
        } else {
            t->k = k;
            if ((size_t)t->n_req == lcap_layers) {
                lcap_layers = lcap_layers ? 2 * lcap_layers : 4096;
                int *nl = realloc(layers, lcap_layers * sizeof *nl);
                if (!nl) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
                else layers = nl;
            }
            if (!rc) layers[t->n_req] = l->valueint;
            if (l->valueint + 1 > t->n_layers) t->n_layers = l->valueint + 1;
            if (!rc && add_request(t, &cap, ids))
                rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
            for (const cJSON *e = ids->child; !rc && e; e = e->next)
                if (e->valueint + 1 > t->n_experts) t->n_experts = e->valueint + 1;
        }
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    if (!rc && !t->n_req) rc = k3_fail(err, K3_ERR_INPUT, "%s: empty router trace", path);
    for (int r = 0; !rc && r < t->n_req; r++) /* key = layer * n_experts + id */
        for (int j = 0; j < t->k; j++) t->key[(size_t)r * t->k + j] += layers[r] * t->n_experts;
    free(layers);
    if (rc) k3_route_trace_free(t);
    return rc;
}

void k3_route_trace_free(k3_route_trace *t) {
    free(t->key);
    *t = (k3_route_trace){0};
}

/* ==== online policies: the store's caching, without the reads ============================ */

static int64_t replay_policy(const k3_route_trace *t, int policy, int n_slots) {
    int n_keys = t->n_layers * t->n_experts;
    k3_policy p;
    int *where = malloc((size_t)n_keys * sizeof *where);
    int *slot_key = malloc((size_t)n_slots * sizeof *slot_key);
    int *pins = calloc((size_t)n_slots, sizeof *pins);
    int *held = malloc((size_t)t->k * sizeof *held);
    int64_t hits = -1;
    if (!where || !slot_key || !pins || !held || k3_policy_init(&p, policy, n_slots, n_keys))
        goto done;
    for (int i = 0; i < n_keys; i++) where[i] = -1;
    for (int i = 0; i < n_slots; i++) slot_key[i] = -1;
    int n_free = n_slots;
    hits = 0;
    for (int r = 0; r < t->n_req; r++) {
        const int32_t *keys = t->key + (size_t)r * t->k;
        for (int j = 0; j < t->k; j++) {
            int s = where[keys[j]];
            if (s >= 0) {
                hits++;
                k3_policy_hit(&p, s);
            } else {
                s = n_free ? --n_free : k3_policy_victim(&p, pins);
                if (s < 0) { held[j] = -1; continue; } /* cannot happen with k + 1 slots */
                if (slot_key[s] >= 0) where[slot_key[s]] = -1; /* evicted */
                where[keys[j]] = s;
                slot_key[s] = keys[j];
                k3_policy_insert(&p, s, keys[j]);
            }
            pins[s]++;
            held[j] = s;
        }
        for (int j = 0; j < t->k; j++)
            if (held[j] >= 0) pins[held[j]]--;
    }
    k3_policy_free(&p);
done:
    free(where);
    free(slot_key);
    free(pins);
    free(held);
    return hits;
}

/* ==== Belady's MIN: evict the key used farthest in the future ============================ */

typedef struct heap_item {
    int64_t next;
    int32_t key;
} heap_item;

/* A typed max-heap on next use; tok/bpe.c has one of its own order: a shared one in util/
 * would cost a comparator call per step in both. */
static void heap_push(heap_item *h, size_t *n, heap_item it) {
    size_t i = (*n)++;
    while (i && h[(i - 1) / 2].next < it.next) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = it;
}

static heap_item heap_pop(heap_item *h, size_t *n) {
    heap_item top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1].next > h[c].next) c++;
        if (h[c].next <= last.next) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static int64_t replay_belady(const k3_route_trace *t, int n_slots) {
    size_t n = (size_t)t->n_req * t->k, n_keys = (size_t)t->n_layers * t->n_experts, hn = 0;
    int64_t *next = malloc(n * sizeof *next), *last = malloc(n_keys * sizeof *last);
    int64_t *cur_next = malloc(n_keys * sizeof *cur_next);
    int *req_of = malloc(n_keys * sizeof *req_of);
    uint8_t *in = calloc(n_keys, 1);
    heap_item *heap = malloc((n + 1) * sizeof *heap), *stash = malloc(((size_t)t->k + 1) * sizeof *stash);
    int64_t hits = -1;
    if (!next || !last || !cur_next || !req_of || !in || !heap || !stash) goto done;
    for (size_t i = 0; i < n_keys; i++) last[i] = INT64_MAX, req_of[i] = -1;
    for (size_t i = n; i-- > 0;) {
        next[i] = last[t->key[i]];
        last[t->key[i]] = (int64_t)i;
    }
    hits = 0;
    int size = 0;
    for (size_t i = 0; i < n; i++) {
        int key = t->key[i], r = (int)(i / (size_t)t->k);
        if (in[key]) {
            hits++;
        } else {
            if (size == n_slots) { /* evict: farthest next use, not one of this request */
                int ns = 0;
                for (;;) {
                    heap_item it = heap_pop(heap, &hn);
                    if (!in[it.key] || cur_next[it.key] != it.next) continue; /* stale */
                    if (req_of[it.key] == r) { stash[ns++] = it; continue; }
                    in[it.key] = 0;
                    size--;
                    break;
                }
                while (ns) heap_push(heap, &hn, stash[--ns]);
            }
            in[key] = 1;
            size++;
        }
        cur_next[key] = next[i];
        req_of[key] = r;
        heap_push(heap, &hn, (heap_item){next[i], key});
    }
done:
    free(next);
    free(last);
    free(cur_next);
    free(req_of);
    free(in);
    free(heap);
    free(stash);
    return hits;
}

int64_t k3_replay(const k3_route_trace *t, int policy, int n_slots) {
    if (n_slots < t->k + 1) return -1;
    return policy == K3_POLICY_BELADY ? replay_belady(t, n_slots) : replay_policy(t, policy, n_slots);
}

/* ==== synthetic traces ==================================================================== */

typedef struct gen {
    const k3_tracegen_opts *o;
    uint64_t rng;
    double *cdf;       /* [experts] cumulative popularity by rank */
    int *perm;         /* [layers][experts] rank -> expert id */
    int *prev, *cur;   /* [layers][k] previous token's choice, this token's */
    uint8_t *taken;    /* [experts] */
    int64_t *count;    /* [layers][experts] selections, for the measured hot mass */
    int64_t overlap_hits, overlap_total;
} gen;

static double uniform(uint64_t *s) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return (double)((*s * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static void set_zipf(gen *g, double s) {
    double sum = 0;
    for (int r = 0; r < g->o->experts; r++) sum += g->cdf[r] = pow(r + 1, -s);
    double acc = 0;
    for (int r = 0; r < g->o->experts; r++) g->cdf[r] = (acc += g->cdf[r] / sum);
}

static int draw_rank(gen *g) {
    double u = uniform(&g->rng);
    int lo = 0, hi = g->o->experts - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (g->cdf[mid] < u) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* One token at layer l: fills cur[l] and updates the counters. */
static void gen_token(gen *g, int l, int first, double reuse) {
    int K = g->o->top_k, E = g->o->experts;
    int *prev = g->prev + (size_t)l * K, *cur = g->cur + (size_t)l * K;
    const int *perm = g->perm + (size_t)l * E;
    memset(g->taken, 0, (size_t)E);
    for (int j = 0; j < K; j++) {
        int e = -1;
        if (!first && uniform(&g->rng) < reuse) { /* repeat one of the previous token's */
            int start = (int)(uniform(&g->rng) * K);
            for (int i = 0; i < K && e < 0; i++)
                if (!g->taken[prev[(start + i) % K]]) e = prev[(start + i) % K];
        }
        while (e < 0 || g->taken[e]) e = perm[draw_rank(g)];
        g->taken[e] = 1;
        cur[j] = e;
        g->count[(size_t)l * E + e]++;
    }
    if (!first) {
        for (int j = 0; j < K; j++) {
            int hit = 0;
            for (int i = 0; i < K; i++) hit |= prev[i] == cur[j];
            g->overlap_hits += hit;
        }
        g->overlap_total += K;
    }
    memcpy(prev, cur, (size_t)K * sizeof *cur);
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Share of selections taken by the `hot` most selected experts, averaged over layers. */
static double hot_mass(gen *g, int layers) {
    int E = g->o->experts;
    double sum = 0;
    for (int l = 0; l < layers; l++) {
        int64_t *c = g->count + (size_t)l * E, tot = 0, top = 0;
        qsort(c, (size_t)E, sizeof *c, cmp_desc);
        for (int e = 0; e < E; e++) tot += c[e];
        for (int e = 0; e < g->o->hot && e < E; e++) top += c[e];
        sum += tot ? (double)top / (double)tot : 0;
    }
    return sum / layers;
}

static void reset_counts(gen *g) {
    memset(g->count, 0, (size_t)g->o->layers * g->o->experts * sizeof *g->count);
    g->overlap_hits = g->overlap_total = 0;
}

/* Measures (hot mass, overlap) of `tokens` tokens on layer 0 for (s, reuse). */
static void probe(gen *g, double s, double reuse, int tokens, double *hm, double *ov) {
    set_zipf(g, s);
    reset_counts(g);
    g->rng = g->o->seed * 7919 + 17;
    for (int t = 0; t < tokens; t++) gen_token(g, 0, t == 0, reuse);
    *hm = hot_mass(g, 1);
    *ov = g->overlap_total ? (double)g->overlap_hits / (double)g->overlap_total : 0;
}

/* Bisection for s (hot mass grows with s), then for reuse (overlap grows with reuse). */
static void calibrate(gen *g, double *s_out, double *reuse_out) {
    const int probe_tokens = 3000;
    double lo = 0, hi = 4, hm, ov;
    for (int it = 0; it < 30; it++) {
        double mid = (lo + hi) / 2;
        probe(g, mid, 0, probe_tokens, &hm, &ov);
        if (hm < g->o->hot_mass) lo = mid;
        else hi = mid;
    }
    *s_out = (lo + hi) / 2;
    double rlo = 0, rhi = 1;
    for (int it = 0; it < 25; it++) {
        double mid = (rlo + rhi) / 2;
        probe(g, *s_out, mid, probe_tokens, &hm, &ov);
        if (ov < g->o->overlap) rlo = mid;
        else rhi = mid;
    }
    *reuse_out = (rlo + rhi) / 2;
}

int k3_tracegen(const k3_tracegen_opts *o, FILE *out, k3_tracegen_stats *st, k3_err *err) {
    if (o->top_k < 1 || o->top_k >= o->experts || o->hot < 1 || o->hot > o->experts ||
        o->layers < 1 || o->tokens < 2 || !(o->overlap >= 0 && o->overlap < 1) ||
        !(o->hot_mass > 0 && o->hot_mass < 1))
        return k3_fail(err, K3_ERR_USAGE, "trace-gen: need 1 <= top-k < experts, 1 <= hot <= "
                       "experts, layers >= 1, tokens >= 2, 0 <= overlap < 1, 0 < hot-mass < 1");
    size_t E = (size_t)o->experts, L = (size_t)o->layers, K = (size_t)o->top_k;
    gen g = {.o = o};
    g.cdf = malloc(E * sizeof *g.cdf);
    g.perm = malloc(L * E * sizeof *g.perm);
    g.prev = malloc(L * K * sizeof *g.prev);
    g.cur = malloc(L * K * sizeof *g.cur);
    g.taken = malloc(E);
    g.count = malloc(L * E * sizeof *g.count);
    int rc = K3_OK;
    if (!g.cdf || !g.perm || !g.prev || !g.cur || !g.taken || !g.count) {
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
        goto done;
    }
    g.rng = o->seed * 2654435761u + 1;
    for (size_t l = 0; l < L; l++) { /* each layer its own hot set */
        int *p = g.perm + l * E;
        for (size_t e = 0; e < E; e++) p[e] = (int)e;
        for (size_t e = E - 1; e > 0; e--) {
            size_t j = (size_t)(uniform(&g.rng) * (double)(e + 1));
            int tmp = p[e];
            p[e] = p[j], p[j] = tmp;
        }
    }
    calibrate(&g, &st->zipf_s, &st->reuse);
    set_zipf(&g, st->zipf_s);
    reset_counts(&g);
    g.rng = o->seed;
    for (int t = 0; t < o->tokens && !rc; t++)
        for (size_t l = 0; l < L; l++) {
            gen_token(&g, (int)l, t == 0, st->reuse);
            fprintf(out, "{\"step\":%d,\"layer\":%zu,\"ids\":[", t, l + 1);
            for (size_t j = 0; j < K; j++) fprintf(out, "%s%d", j ? "," : "", g.cur[l * K + j]);
            fprintf(out, "]}\n");
        }
    if (ferror(out)) rc = k3_fail(err, K3_ERR_IO, "trace-gen: write failed");
    st->overlap = g.overlap_total ? (double)g.overlap_hits / (double)g.overlap_total : 0;
    st->hot_mass = hot_mass(&g, o->layers);
done:
    free(g.cdf);
    free(g.perm);
    free(g.prev);
    free(g.cur);
    free(g.taken);
    free(g.count);
    return rc;
}

/* ==== static oracle: the n_slots most requested keys, held from their first use ========== */

static int cmp_i64_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int64_t k3_replay_static(const k3_route_trace *t, int n_slots) {
    size_t n_keys = (size_t)t->n_layers * t->n_experts, n = (size_t)t->n_req * t->k;
    int64_t *count = calloc(n_keys, sizeof *count), hits = 0;
    if (!count) return -1;
    for (size_t i = 0; i < n; i++) count[t->key[i]]++;
    qsort(count, n_keys, sizeof *count, cmp_i64_desc);
    for (size_t i = 0; i < n_keys && i < (size_t)n_slots && count[i]; i++) hits += count[i] - 1;
    free(count);
    return hits;
}
