/* test_model.c — the engine against k3-nano's reference outputs (tests/fixtures/README.md). */
#include "fixture_check.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"
#define NANO_REF NANO "/reference"

/* Tolerances from the fixture README (recommended_tolerances in the manifest). */
static const fixture_tol nano_tol = {1e-4, 1e-4, 1e-5, 1e-4};

static void test_prompts(void) { fixture_check_prompts(NANO, NANO_REF, &nano_tol); }
static void test_trace(void) { fixture_check_trace(NANO, NANO_REF, "trace_len7.json", &nano_tol); }
static void test_decode_vs_prefill(void) { fixture_check_decode(NANO, NANO_REF, &nano_tol); }

const k3_test k3_suite_model[] = {
    {"nano_trace_len7", test_trace},
    {"nano_prompts_logits_routing_greedy", test_prompts},
    {"nano_decode_vs_prefill", test_decode_vs_prefill},
    {0},
};
