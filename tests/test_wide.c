/* test_wide.c — the engine against k3-wide, the 4-layer model at K3's real widths (offsets
 * past 4 GiB, real expert size). Runs only when asked (`k3_tests wide`, see
 * scripts/test-wide.sh), with K3_WIDE_DIR = the generated model and K3_WIDE_REF = its
 * reference folder (default ../shared/fixtures/k3-wide/reference). Every check runs once per
 * kernel path this CPU runs (scalar, avx2, ...). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../src/kernels/kernels.h"

#include "fixture_check.h"
#include "pack_helpers.h"
#include "test.h"

/* Tolerances from the k3-wide section of tests/fixtures/README.md. */
static const fixture_tol wide_tol = {2e-4, 2e-4, 1e-5, 2e-4};


static const char *model_dir, *ref_dir;
static void trace(void) { fixture_check_trace(model_dir, ref_dir, "trace_len5.json", &wide_tol); }
static void prompts(void) { fixture_check_prompts(model_dir, ref_dir, &wide_tol); }
static void decode(void) { fixture_check_decode(model_dir, ref_dir, &wide_tol); }

/* Runs check once per kernel path this CPU runs: the fastest as configured, the others on
 * the experts in place (they check the kernels only). */
static void on_every_path(void (*check)(void)) {
    if (!ph_wide(&model_dir, &ref_dir)) return;
    fixture_on_every_path(check, 1);
}

static void test_trace(void) { on_every_path(trace); }
static void test_prompts(void) { on_every_path(prompts); }
static void test_decode(void) { on_every_path(decode); }

const k3_test k3_suite_wide[] = {
    {"wide_trace_len5", test_trace},
    {"wide_prompts_logits_routing_greedy", test_prompts},
    {"wide_decode_vs_prefill", test_decode},
    {0},
};
