/* spec.c — suffix-match drafting for speculative decoding (see spec.h). */
#include "spec.h"

/* Does the length-len window ending at e (exclusive) equal the history's last len tokens? */
static int window_matches(const int32_t *t, size_t n, size_t e, size_t len) {
    for (size_t i = 1; i <= len; i++)
        if (t[e - i] != t[n - i]) return 0;
    return 1;
}

int k3_spec_draft(const int32_t *tokens, size_t n, int max_draft, int32_t *draft) {
    if (max_draft <= 0) return 0;
    for (size_t len = K3_SPEC_MAX_NGRAM; len >= K3_SPEC_MIN_NGRAM; len--) {
        if (n < len + 1) continue;
        /* Earlier windows end at e < n; scan from the most recent. */
        for (size_t e = n - 1; e >= len; e--) {
            if (!window_matches(tokens, n, e, len)) continue;
            int k = 0;
            while (k < max_draft && e + (size_t)k < n) {
                draft[k] = tokens[e + (size_t)k];
                k++;
            }
            return k;
        }
    }
    return 0;
}
