/* fuzz_tokenizer.c — the tokenizer (kimi-shaped fixture: the real pre-tokenizer pattern).
 * Oracle: valid UTF-8 encodes (specials off) and decodes back to the same bytes; any ids
 * decode without error; the input with specials allowed encodes or is refused cleanly. */
#include <string.h>

#include "../src/tok/tokenizer.h"
#include "fuzz.h"

static const k3_tokenizer *fuzz_tok(void) {
    static k3_tokenizer *t;
    if (!t) {
        k3_err err = {0};
        if (k3_tokenizer_load("tests/fixtures/tokenizer/kimi-shaped", &t, &err)) {
            fprintf(stderr, "fuzz_tokenizer: %s (run from the repository root)\n", err.msg);
            abort();
        }
    }
    return t;
}

int k3_fuzz_tokenizer(const uint8_t *data, size_t size) {
    const k3_tokenizer *t = fuzz_tok();
    const char *s = (const char *)data;
    int32_t *ids = NULL;
    size_t n = 0;
    k3_err err = {0};
    int bad = 0;
    if (!k3_tokenizer_encode(t, s, size, false, &ids, &n, &err)) {
        char *back = NULL;
        size_t len = 0;
        if (k3_tokenizer_decode(t, ids, n, &back, &len, &err) || len != size ||
            memcmp(back, s, size))
            bad = -1;
        free(back);
        free(ids);
    }
    if (!k3_tokenizer_encode(t, s, size, true, &ids, &n, &err)) free(ids);
    /* the same bytes as ids (3 bytes each, modulo the vocabulary) */
    size_t m = size / 3;
    int32_t *raw = malloc((m + 1) * sizeof *raw);
    int vocab = k3_tokenizer_vocab_size(t);
    for (size_t i = 0; raw && i < m; i++)
        raw[i] = (int32_t)(((uint32_t)data[3 * i] << 16 | (uint32_t)data[3 * i + 1] << 8 |
                            data[3 * i + 2]) % (uint32_t)vocab);
    char *text = NULL;
    size_t len = 0;
    if (raw && !k3_tokenizer_decode(t, raw, m, &text, &len, &err)) free(text);
    free(raw);
    return bad;
}

K3_FUZZ_ENTRY(k3_fuzz_tokenizer)
