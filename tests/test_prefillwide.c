/* test_prefillwide.c — batched prefill on k3-wide (K3's real widths: 7168 hidden, 96 KDA and
 * MLA heads, 3584-wide latent experts, top-16 of 32): chunked passes bit-identical to token by
 * token and within the k3-wide tolerance (2e-4) of the reference, for every reference prompt.
 * Runs with K3_WIDE_DIR set (scripts/test-wide.sh); skipped otherwise. K3_WIDE_REF = the
 * reference folder (default ../shared/fixtures/k3-wide/reference). */
#include <stdlib.h>
#include <sys/stat.h>

#include "batch_check.h"
#include "pack_helpers.h"
#include "test.h"

static void test_wide_chunked_bit_identical(void) {
    const char *dir, *ref;
    if (!ph_wide(&dir, &ref)) return;
    /* 4 layers, blocks of 2 (AttnRes boundary at layer 2), KDA 1-2 and MLA 3-4 (one-based);
     * prompts of 1, 5 and 12 ids: chunks of 5 split the 12 as 5 + 5 + 2 */
    static const int chunks[] = {5, 12};
    unsetenv("K3_MMAP_EXPERTS");
    bc_check_chunked(dir, ref, chunks, 2, 2e-4, 0); /* greedy: tests/test_wide.c */
}

const k3_test k3_suite_prefillwide[] = {
    {"wide_chunked_bit_identical", test_wide_chunked_bit_identical},
    {0},
};
