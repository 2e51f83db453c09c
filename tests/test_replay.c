/* test_replay.c — trace replay (src/store/replay.h): hit counts on a hand-worked trace, MIN
 * never beaten by an online policy, and the synthetic trace generator's locality measured
 * here on what it wrote (independently of its own report). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/store/replay.h"
#include "../src/store/store.h"
#include "test.h"

static int write_trace(const char *path, const int *ids, int n, int k) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    for (int r = 0; r < n / k; r++) {
        fprintf(f, "{\"step\":%d,\"layer\":1,\"ids\":[", r);
        for (int j = 0; j < k; j++) fprintf(f, "%s%d", j ? "," : "", ids[r * k + j]);
        fprintf(f, "],\"weights\":[]}\n");
    }
    return fclose(f);
}

/* 1 2 3 1 2 3 with two slots, one id per request. By hand: LRU and S3-FIFO never hit (a cycle
 * longer than the cache); MIN hits the second 1 (evicting 2 at the first 3) and the second 3
 * (evicting 1, never used again); the static oracle holds two keys used twice each: 2 hits. */
static void test_hand_worked(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/k3-replay-test-%d.jsonl", (int)getpid());
    const int ids[] = {1, 2, 3, 1, 2, 3};
    CHECK(write_trace(path, ids, 6, 1) == 0, "cannot write %s", path);
    k3_route_trace t;
    k3_err err = {0};
    CHECK(k3_route_trace_read(path, &t, &err) == 0, "%s", err.msg);
    unlink(path);
    int64_t lru = k3_replay(&t, K3_POLICY_LRU, 2), s3 = k3_replay(&t, K3_POLICY_S3FIFO, 2);
    int64_t min = k3_replay(&t, K3_POLICY_BELADY, 2), top = k3_replay_static(&t, 2);
    int64_t small = k3_replay(&t, K3_POLICY_LRU, 1);
    k3_route_trace_free(&t);
    CHECK(lru == 0 && s3 == 0 && min == 2 && top == 2, "lru %lld s3fifo %lld min %lld static %lld",
          (long long)lru, (long long)s3, (long long)min, (long long)top);
    CHECK(small == -1, "a budget below top-k + 1 must be refused, got %lld", (long long)small);
}

/* On a generated trace MIN is an upper bound for every policy at every budget, and hit rates
 * grow with the budget. */
static void test_min_bounds_policies(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/k3-replay-gen-%d.jsonl", (int)getpid());
    k3_tracegen_opts o = {.tokens = 200, .layers = 4, .experts = 64, .top_k = 4, .hot = 4,
                          .overlap = 0.3, .hot_mass = 0.3, .seed = 7};
    FILE *f = fopen(path, "w");
    k3_tracegen_stats st;
    k3_err err = {0};
    CHECK(f && k3_tracegen(&o, f, &st, &err) == 0, "%s", err.msg);
    fclose(f);
    k3_route_trace t;
    CHECK(k3_route_trace_read(path, &t, &err) == 0, "%s", err.msg);
    unlink(path);
    int64_t prev[2] = {-1, -1};
    int bad = 0;
    for (int slots = 5; slots <= 200 && !bad; slots += 15) {
        int64_t min = k3_replay(&t, K3_POLICY_BELADY, slots);
        int64_t p[2] = {k3_replay(&t, K3_POLICY_LRU, slots), k3_replay(&t, K3_POLICY_S3FIFO, slots)};
        for (int i = 0; i < 2; i++) {
            if (p[i] > min || p[i] < 0) bad = slots;
            if (i == 0 && p[i] < prev[i]) bad = slots; /* LRU is a stack algorithm */
            prev[i] = p[i];
        }
    }
    k3_route_trace_free(&t);
    CHECK(!bad, "at %d slots an online policy beat MIN or LRU lost hits with more room", bad);
}

/* The written trace's overlap between consecutive tokens and hot-set share, computed here. */
static void test_generator_locality(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/k3-replay-loc-%d.jsonl", (int)getpid());
    k3_tracegen_opts o = {.tokens = 400, .layers = 3, .experts = 896, .top_k = 16, .hot = 16,
                          .overlap = 0.31, .hot_mass = 0.41, .seed = 3};
    FILE *f = fopen(path, "w");
    k3_tracegen_stats st;
    k3_err err = {0};
    CHECK(f && k3_tracegen(&o, f, &st, &err) == 0, "%s", err.msg);
    fclose(f);
    k3_route_trace t;
    CHECK(k3_route_trace_read(path, &t, &err) == 0, "%s", err.msg);
    unlink(path);
    long same = 0, pairs = 0;
    int64_t *count = calloc((size_t)t.n_layers * t.n_experts, sizeof *count);
    for (int r = 0; r < t.n_req; r++) {
        const int32_t *cur = t.key + (size_t)r * t.k;
        for (int j = 0; j < t.k; j++) count[cur[j]]++;
        if (r < 3) continue; /* the same layer one token earlier: 3 layers per token */
        const int32_t *prev = cur - 3 * t.k;
        for (int j = 0; j < t.k; j++)
            for (int i = 0; i < t.k; i++) same += cur[j] == prev[i];
        pairs += t.k;
    }
    double top = 0, all = 0;
    for (int l = 1; l < t.n_layers; l++) { /* 16 largest counts of the layer */
        int64_t *c = count + (size_t)l * t.n_experts;
        for (int pick = 0; pick < 16; pick++) {
            int best = 0;
            for (int e = 1; e < t.n_experts; e++) if (c[e] > c[best]) best = e;
            top += (double)c[best];
            c[best] = -c[best] - 1;
        }
        for (int e = 0; e < t.n_experts; e++) all += (double)(c[e] < 0 ? -c[e] - 1 : c[e]);
    }
    free(count);
    k3_route_trace_free(&t);
    double overlap = (double)same / pairs, hot = top / all;
    CHECK(overlap > 0.27 && overlap < 0.35, "consecutive-token overlap %.3f, asked 0.31", overlap);
    CHECK(hot > 0.37 && hot < 0.45, "top-16 share %.3f, asked 0.41", hot);
}

const k3_test k3_suite_replay[] = {
    {"hand_worked_lru_s3fifo_min_static", test_hand_worked},
    {"min_bounds_online_policies", test_min_bounds_policies},
    {"generator_overlap_and_hot_mass", test_generator_locality},
    {0},
};
