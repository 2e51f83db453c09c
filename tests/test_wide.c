/* test_wide.c — the engine against k3-wide, the 4-layer model at K3's real widths (offsets
 * past 4 GiB, real expert size). Runs only when asked (`k3_tests wide`, see
 * scripts/test-wide.sh), with K3_WIDE_DIR = the generated model and K3_WIDE_REF = its
 * reference folder (default ../shared/fixtures/k3-wide/reference). */
#include <stdlib.h>
#include <sys/stat.h>

#include "fixture_check.h"
#include "test.h"

/* Tolerances from the k3-wide section of tests/fixtures/README.md. */
static const fixture_tol wide_tol = {2e-4, 2e-4, 1e-5, 2e-4};

static int paths(const char **model, const char **ref) {
    struct stat st;
    *model = getenv("K3_WIDE_DIR");
    *ref = getenv("K3_WIDE_REF");
    if (!*ref) *ref = "../shared/fixtures/k3-wide/reference";
    if (!*model || stat(*model, &st) != 0) {
        k3_test_skip("K3_WIDE_DIR is not set to a generated k3-wide model");
        return 0;
    }
    if (stat(*ref, &st) != 0) {
        k3_test_skip("no k3-wide reference folder at %s", *ref);
        return 0;
    }
    return 1;
}

static void test_trace(void) {
    const char *m, *r;
    if (paths(&m, &r)) fixture_check_trace(m, r, "trace_len5.json", &wide_tol);
}

static void test_prompts(void) {
    const char *m, *r;
    if (paths(&m, &r)) fixture_check_prompts(m, r, &wide_tol);
}

static void test_decode(void) {
    const char *m, *r;
    if (paths(&m, &r)) fixture_check_decode(m, r, &wide_tol);
}

const k3_test k3_suite_wide[] = {
    {"wide_trace_len5", test_trace},
    {"wide_prompts_logits_routing_greedy", test_prompts},
    {"wide_decode_vs_prefill", test_decode},
    {0},
};
