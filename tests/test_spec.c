/* test_spec.c — the n-gram drafter on hand-made histories (expected drafts worked out by
 * hand from the rule in src/engine/spec.h). */
#include "../src/engine/spec.h"
#include "test.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

static void test_no_match_no_draft(void) {
    int32_t t[] = {1, 2, 3, 4, 5}, d[8];
    CHECK(k3_spec_draft(t, N(t), 4, d) == 0);
    int32_t one[] = {7, 7}; /* a 1-token repeat is below the minimum n-gram */
    CHECK(k3_spec_draft(one, N(one), 4, d) == 0);
}

static void test_bigram_proposes_continuation(void) {
    /* suffix (8, 9) occurred at positions 1-2, followed by 5, 6, 8, 9 */
    int32_t t[] = {4, 8, 9, 5, 6, 8, 9}, d[8];
    int k = k3_spec_draft(t, N(t), 3, d);
    CHECK(k == 3 && d[0] == 5 && d[1] == 6 && d[2] == 8, "k=%d d=%d,%d,%d", k, d[0], d[1], d[2]);
}

static void test_longest_suffix_wins(void) {
    /* bigram (2,3) last occurred at 5-6 (followed by 9), but the trigram (1,2,3) occurred
     * at 0-2 (followed by 7): the longer match is preferred. */
    int32_t t[] = {1, 2, 3, 7, 0, 2, 3, 9, 1, 2, 3}, d[4];
    int k = k3_spec_draft(t, N(t), 1, d);
    CHECK(k == 1 && d[0] == 7, "k=%d d0=%d", k, d[0]);
}

static void test_most_recent_occurrence_wins(void) {
    int32_t t[] = {5, 6, 1, 5, 6, 2, 5, 6}, d[4];
    int k = k3_spec_draft(t, N(t), 1, d);
    CHECK(k == 1 && d[0] == 2, "k=%d d0=%d", k, d[0]);
}

static void test_draft_stops_at_history_end(void) {
    /* periodic history: the match ending right before the suffix proposes up to the end */
    int32_t t[] = {3, 4, 3, 4, 3, 4}, d[8];
    int k = k3_spec_draft(t, N(t), 8, d);
    CHECK(k == 2 && d[0] == 3 && d[1] == 4, "k=%d", k);
    CHECK(k3_spec_draft(t, N(t), 0, d) == 0);
}

const k3_test k3_suite_spec[] = {
    {"no_match_no_draft", test_no_match_no_draft},
    {"bigram_proposes_continuation", test_bigram_proposes_continuation},
    {"longest_suffix_wins", test_longest_suffix_wins},
    {"most_recent_occurrence_wins", test_most_recent_occurrence_wins},
    {"draft_stops_at_history_end", test_draft_stops_at_history_end},
    {0},
};
