/* sampler.h — picking the next token from float32 logits; the stop rule (spec §12.4) is
 * src/tok/stops.h, re-exported here. Shared by `k3 run`, `k3 chat` and the server.
 *
 * Sampling, in this order (the same as Hugging Face's default warpers):
 *  1. temperature == 0: greedy — the argmax, ties to the lowest id. No random draw is made,
 *     so greedy output never depends on the seed.
 *  2. top_k > 0: keep the top_k largest logits (ties to the lower id).
 *  3. p_i = exp((logit_i - max) / temperature), normalised over the kept ids, in double.
 *  4. top_p < 1: order the kept ids by p descending (ties to the lower id) and keep the
 *     shortest prefix whose cumulative probability reaches top_p (at least one id);
 *     renormalise.
 *  5. Draw u uniform in [0, 1) and return the first id, in that order, whose cumulative
 *     probability exceeds u (the last kept id if rounding leaves none).
 *
 * The PRNG is xoshiro256** 1.0 (Blackman & Vigna, 2018), its 256-bit state filled from the
 * 64-bit seed by SplitMix64; u = (next() >> 11) * 2^-53. One draw per sampled token, so a
 * seed and the same logits reproduce a run exactly.
 *
 * Invariants: k3_sampler_sample allocates nothing (scratch is sized at init); a sampler is
 * single-threaded state (one per session or request).
 */
#ifndef K3_SAMPLER_H
#define K3_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "../tok/stops.h" /* k3_stops (re-exported) */
#include "../tok/tokenizer.h"
#include "../util/err.h"

typedef struct k3_sampler_opts {
    double temperature; /* >= 0; 0 = greedy */
    double top_p;       /* (0, 1]; 1 = off */
    int top_k;          /* >= 0; 0 = off */
    uint64_t seed;
} k3_sampler_opts;

/* One candidate: an id with its logit, then its probability once computed. */
typedef struct k3_candidate {
    int32_t id;
    float logit;
    double p;
} k3_candidate;

typedef struct k3_sampler {
    k3_sampler_opts o;
    int vocab;
    uint64_t rng[4];    /* xoshiro256** state */
    k3_candidate *cand; /* [vocab] scratch */
} k3_sampler;

/* Checks the options and allocates the scratch for a vocab_size-id model.
 * Errors: K3_ERR_USAGE (temperature < 0, top_p outside (0, 1], top_k < 0), K3_ERR_GENERIC. */
int k3_sampler_init(k3_sampler *s, const k3_sampler_opts *o, int vocab_size, k3_err *err);
void k3_sampler_free(k3_sampler *s);

/* The next token for logits [vocab_size] (steps 1-5 above). */
int32_t k3_sampler_sample(k3_sampler *s, const float *logits);

/* Steps 2-4 only (no draw): the kept candidates, in draw order, with normalised p; returns
 * their count (>= 1). Valid until the next call. For temperature 0 it returns the argmax
 * alone with p = 1. Exposed so tests and tools can see exactly which ids are eligible. */
int k3_sampler_candidates(k3_sampler *s, const float *logits, const k3_candidate **out);

/* The PRNG alone: seeds state from seed (SplitMix64), and the next 64-bit output. */
void k3_rng_seed(uint64_t state[4], uint64_t seed);
uint64_t k3_rng_next(uint64_t state[4]);

/* The stop rule (k3_stops, spec §12.4) is src/tok/stops.h, included above. */

#endif
