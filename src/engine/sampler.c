/* sampler.c — greedy / temperature / top-k / top-p sampling and the stop rule (sampler.h). */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>

/* ---- PRNG: SplitMix64 seeding, xoshiro256** ----------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void k3_rng_seed(uint64_t st[4], uint64_t seed) {
    for (int i = 0; i < 4; i++) st[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t k3_rng_next(uint64_t s[4]) {
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* ---- sampler ------------------------------------------------------------------------------ */

int k3_sampler_init(k3_sampler *s, const k3_sampler_opts *o, int vocab, k3_err *err) {
    *s = (k3_sampler){0};
    if (!(o->temperature >= 0) || isinf(o->temperature))
        return k3_fail(err, K3_ERR_USAGE, "temperature must be a number >= 0 (0 = greedy)");
    if (!(o->top_p > 0 && o->top_p <= 1))
        return k3_fail(err, K3_ERR_USAGE, "top-p must be in (0, 1] (1 = off)");
    if (o->top_k < 0) return k3_fail(err, K3_ERR_USAGE, "top-k must be >= 0 (0 = off)");
    s->o = *o;
    s->vocab = vocab;
    k3_rng_seed(s->rng, o->seed);
    if (!(s->cand = malloc((size_t)vocab * sizeof *s->cand)))
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    return K3_OK;
}

void k3_sampler_free(k3_sampler *s) {
    free(s->cand);
    s->cand = NULL;
}

/* a before b in draw order: larger logit first, ties to the lower id. */
static int before(const k3_candidate *a, const k3_candidate *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *a, const void *b) {
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* Min-heap on draw order (the root is the worst kept candidate). */
static void sift_down(k3_candidate *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && before(&h[w], &h[l])) w = l;
        if (r < n && before(&h[w], &h[r])) w = r;
        if (w == i) return;
        k3_candidate t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Steps 2: fills cand with the kept ids in draw order; returns how many. */
static int keep_top_k(k3_sampler *s, const float *logits) {
    k3_candidate *c = s->cand;
    int n = s->vocab, k = s->o.top_k;
    for (int i = 0; i < n; i++) c[i] = (k3_candidate){i, logits[i], 0};
    if (k > 0 && k < n) {
        for (int i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
        for (int i = k; i < n; i++)
            if (before(&c[i], &c[0])) {
                c[0] = c[i];
                sift_down(c, k, 0);
            }
        n = k;
    }
    qsort(c, (size_t)n, sizeof *c, cmp_cand);
    return n;
}

int k3_sampler_candidates(k3_sampler *s, const float *logits, const k3_candidate **out) {
    k3_candidate *c = s->cand;
    *out = c;
    if (s->o.temperature == 0) {
        int best = 0;
        for (int i = 1; i < s->vocab; i++)
            if (logits[i] > logits[best]) best = i;
        c[0] = (k3_candidate){best, logits[best], 1.0};
        return 1;
    }
    int n = keep_top_k(s, logits);
    double sum = 0, max = c[0].logit;
    for (int i = 0; i < n; i++) sum += c[i].p = exp(((double)c[i].logit - max) / s->o.temperature);
    for (int i = 0; i < n; i++) c[i].p /= sum;
    if (s->o.top_p < 1) {
        /* p is non-increasing in draw order (exp is monotonic), so the nucleus is a prefix. */
        double cum = 0;
        int keep = 0;
        while (keep < n && cum < s->o.top_p) cum += c[keep++].p;
        n = keep;
        for (int i = 0; i < n; i++) c[i].p /= cum;
    }
    return n;
}

int32_t k3_sampler_sample(k3_sampler *s, const float *logits) {
    const k3_candidate *c;
    int n = k3_sampler_candidates(s, logits, &c);
    if (s->o.temperature == 0) return c[0].id;
    double u = (double)(k3_rng_next(s->rng) >> 11) * 0x1.0p-53, cum = 0;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (u < cum) return c[i].id;
    }
    return c[n - 1].id;
}
