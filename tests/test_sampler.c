/* test_sampler.c — src/engine/sampler.c on fixed logits: the PRNG against an independent
 * Python transcription of SplitMix64 + xoshiro256**, same seed → same tokens, temperature 0
 * = greedy, and the candidate sets of top-k and top-p as documented in sampler.h. */
#include "test.h"
#include "../src/engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define V 64

/* Logits with a known order: id i has logit -0.1 * |i - 20| (a peak at 20, ties around it)
 * except two equal maxima at 5 and 40 (2.0). */
static void fixed_logits(float *l) {
    for (int i = 0; i < V; i++) l[i] = -0.1f * (float)abs(i - 20);
    l[5] = l[40] = 2.0f;
}

static k3_sampler make(double t, double top_p, int top_k, uint64_t seed) {
    k3_sampler s;
    k3_sampler_opts o = {t, top_p, top_k, seed};
    k3_err err = {0};
    CHECK_OR(s, k3_sampler_init(&s, &o, V, &err) == K3_OK, "%s", err.msg);
    return s;
}

/* Values from a separate Python implementation (seed 42: the state is four SplitMix64
 * outputs; SplitMix64(0)'s first output is the published 0xe220a8397b1dcdaf). */
static void test_prng_reference(void) {
    uint64_t st[4];
    k3_rng_seed(st, 42);
    CHECK(k3_rng_next(st) == 0x15780b2e0c2ec716ULL);
    CHECK(k3_rng_next(st) == 0x6104d9866d113a7eULL);
    CHECK(k3_rng_next(st) == 0xae17533239e499a1ULL);
    k3_rng_seed(st, 0);
    CHECK(st[0] == 0xe220a8397b1dcdafULL);
}

static void test_same_seed_same_tokens(void) {
    float l[V];
    fixed_logits(l);
    k3_sampler a = make(1.3, 0.95, 0, 7), b = make(1.3, 0.95, 0, 7), c = make(1.3, 0.95, 0, 8);
    int same_c = 0, distinct = 0, seen[V] = {0};
    for (int i = 0; i < 500; i++) {
        l[i % V] += 0.01f; /* the logits move between steps, as in a real run */
        int32_t x = k3_sampler_sample(&a, l), y = k3_sampler_sample(&b, l);
        CHECK(x == y, "step %d: %d vs %d", i, x, y);
        same_c += k3_sampler_sample(&c, l) == x;
        if (!seen[x]++) distinct++;
    }
    CHECK(same_c < 400, "another seed gave the same tokens %d/500 times", same_c);
    CHECK(distinct > 5, "only %d distinct tokens: not sampling", distinct);
    k3_sampler_free(&a);
    k3_sampler_free(&b);
    k3_sampler_free(&c);
}

static void test_temperature_zero_is_greedy(void) {
    float l[V];
    fixed_logits(l);
    k3_sampler g = make(0, 0.5, 3, 99);
    for (int i = 0; i < 20; i++) CHECK(k3_sampler_sample(&g, l) == 5); /* tie → lower id */
    l[40] = 2.5f;
    CHECK(k3_sampler_sample(&g, l) == 40);
    uint64_t fresh[4];
    k3_rng_seed(fresh, 99);
    CHECK(!memcmp(fresh, g.rng, sizeof fresh), "greedy drew random numbers");
    k3_sampler_free(&g);
}

static void test_top_k_candidates(void) {
    float l[V];
    fixed_logits(l);
    k3_sampler s = make(1.0, 1.0, 4, 1);
    const k3_candidate *c;
    int n = k3_sampler_candidates(&s, l, &c);
    /* 5 and 40 (2.0), then 20 (0.0), then 19 and 21 tie at -0.1: the lower id wins. */
    CHECK(n == 4 && c[0].id == 5 && c[1].id == 40 && c[2].id == 20 && c[3].id == 19,
          "n %d: %d %d %d %d", n, c[0].id, c[1].id, c[2].id, c[3].id);
    double z = 2 * exp(2.0) + exp(0.0) + exp(-0.1);
    CHECK(fabs(c[0].p - exp(2.0) / z) < 1e-6 && fabs(c[3].p - exp(-0.1) / z) < 1e-6);
    int counts[V] = {0};
    for (int i = 0; i < 20000; i++) counts[k3_sampler_sample(&s, l)]++;
    CHECK(counts[5] + counts[40] + counts[20] + counts[19] == 20000, "outside the top-k");
    double want19 = 20000 * exp(-0.1) / z;
    CHECK(fabs(counts[19] - want19) < 5 * sqrt(want19), "id 19: %d, want %.0f", counts[19], want19);
    k3_sampler_free(&s);
}

static void test_top_p_candidates(void) {
    /* p = 0.5, 0.3, 0.15, 0.05 at temperature 1 (logits are their logs). */
    float l[V];
    for (int i = 0; i < V; i++) l[i] = -1e30f;
    l[9] = logf(0.5f), l[3] = logf(0.3f), l[7] = logf(0.15f), l[1] = logf(0.05f);
    k3_sampler s = make(1.0, 0.75, 0, 3);
    const k3_candidate *c;
    int n = k3_sampler_candidates(&s, l, &c);
    CHECK(n == 2 && c[0].id == 9 && c[1].id == 3, "n %d", n);
    CHECK(fabs(c[0].p - 0.625) < 1e-6 && fabs(c[1].p - 0.375) < 1e-6, "%g %g", c[0].p, c[1].p);
    k3_sampler_free(&s);
    s = make(1.0, 0.9, 0, 3);
    n = k3_sampler_candidates(&s, l, &c);
    CHECK(n == 3 && c[2].id == 7, "n %d", n);
    for (int i = 0; i < 5000; i++) {
        int32_t x = k3_sampler_sample(&s, l);
        CHECK(x == 9 || x == 3 || x == 7, "sampled %d outside the nucleus", x);
    }
    k3_sampler_free(&s);
    s = make(1.0, 1e-9, 0, 3); /* the nucleus never drops below one id */
    n = k3_sampler_candidates(&s, l, &c);
    CHECK(n == 1 && c[0].id == 9 && c[0].p == 1.0);
    k3_sampler_free(&s);
    /* Temperature sharpens before top-p: at T = 0.5 the top two already pass 0.9. */
    s = make(0.5, 0.9, 0, 3);
    n = k3_sampler_candidates(&s, l, &c);
    CHECK(n == 2, "n %d", n);
    k3_sampler_free(&s);
}

static void test_bad_options(void) {
    k3_sampler s;
    k3_err err = {0};
    k3_sampler_opts bad[] = {{-1, 1, 0, 0}, {1, 0, 0, 0}, {1, 1.5, 0, 0}, {1, 1, -2, 0},
                             {NAN, 1, 0, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(k3_sampler_init(&s, &bad[i], V, &err) == K3_ERR_USAGE, "option set %zu", i);
}

const k3_test k3_suite_sampler[] = {
    {"prng_reference", test_prng_reference},
    {"same_seed_same_tokens", test_same_seed_same_tokens},
    {"temperature_zero_is_greedy", test_temperature_zero_is_greedy},
    {"top_k_candidates", test_top_k_candidates},
    {"top_p_candidates", test_top_p_candidates},
    {"bad_options", test_bad_options},
    {0},
};
