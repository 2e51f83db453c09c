/* spec.h — lossless n-gram speculative decoding: draft proposal (issue 10).
 *
 * Invariants:
 *  - Drafts cost nothing to make: they are copied from earlier in the token history (prompt
 *    and output), never produced by a model, so a wrong draft only costs verification work.
 *  - The matcher prefers the LONGEST suffix (max_ngram down to min_ngram tokens) that occurred
 *    before, and among equal lengths the MOST RECENT occurrence; it proposes the tokens that
 *    followed that occurrence (at most max_draft, never past the end of the history).
 *  - Verification (the engine) accepts only tokens equal to K3's own greedy choice, so output
 *    with speculation equals output without it, token for token.
 */
#ifndef K3_SPEC_H
#define K3_SPEC_H

#include <stddef.h>
#include <stdint.h>

#define K3_SPEC_MIN_NGRAM 2
#define K3_SPEC_MAX_NGRAM 6

/* Proposes up to max_draft tokens to follow tokens[0..n) into draft[]. Returns the number
 * proposed (0 when no suffix of length 2..6 occurred earlier). O(n · 6) per call. */
int k3_spec_draft(const int32_t *tokens, size_t n, int max_draft, int32_t *draft);

#endif
