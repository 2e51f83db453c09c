/* fixture_check.h — compares the engine with a reference folder (k3-nano or k3-wide):
 * logits at every prompt position, routing, greedy continuations, per-layer trace and
 * cached decode vs full prefill (formats: tests/fixtures/README.md). */
#ifndef K3_FIXTURE_CHECK_H
#define K3_FIXTURE_CHECK_H

typedef struct fixture_tol {
    double logits, trace, expert_weight, decode_vs_prefill;
} fixture_tol;

/* Each runs the named check of model_dir against ref_dir and records a test failure
 * (k3_test_fail) with the worst position/layer when a tolerance is exceeded. */
void fixture_check_prompts(const char *model_dir, const char *ref_dir, const fixture_tol *tol);
void fixture_check_trace(const char *model_dir, const char *ref_dir, const char *trace_file,
                         const fixture_tol *tol);
void fixture_check_decode(const char *model_dir, const char *ref_dir, const fixture_tol *tol);

/* Runs check once per kernel path this CPU runs (the fastest first, then the others down to
 * scalar), loading each engine with that path (k3_engine_opts.kernels) and failing when the
 * engine reports another (k3_engine_kernels). With others_in_place, every path but the first
 * uses the experts in place from the mapping (they check the kernels, not the expert store's
 * reads), which is asserted too. Stops at the first failing path. */
void fixture_on_every_path(void (*check)(void), int others_in_place);

#endif
