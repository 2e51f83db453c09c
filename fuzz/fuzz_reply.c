/* fuzz_reply.c — generated ids (2 bytes each, modulo the k3-nano vocabulary, so structural
 * specials come up often) through the reply parser. Oracle: each push writes at most
 * k3_reply_parser_out_cap bytes, and the closing ids exist for any reply. */
#include <string.h>

#include "../src/chat/parse.h"
#include "../src/engine/sampler.h"
#include "fuzz.h"

static const k3_tokenizer *reply_tok(void) {
    static k3_tokenizer *t;
    if (!t) {
        k3_err err = {0};
        if (k3_tokenizer_load("tests/fixtures/k3-nano", &t, &err)) {
            fprintf(stderr, "fuzz_reply: %s (run from the repository root)\n", err.msg);
            abort();
        }
    }
    return t;
}

int k3_fuzz_reply(const uint8_t *data, size_t size) {
    const k3_tokenizer *t = reply_tok();
    if (size < 1) return 0;
    int vocab = k3_tokenizer_vocab_size(t), bad = 0;
    k3_stops stops;
    k3_stops_init(&stops, t, -1);
    k3_reply_parser p;
    k3_reply_parser_init(&p, t, &stops, data[0] & 1);
    size_t cap = k3_reply_parser_out_cap(t);
    char *out = malloc(cap);
    if (!out) return 0;
    enum k3_channel ch;
    for (size_t i = 1; i + 1 < size; i += 2) {
        /* the high values land on the last ids, where the specials are */
        uint32_t v = (uint32_t)data[i] << 8 | data[i + 1];
        int32_t id = (int32_t)(v >= 0xff00 ? (uint32_t)vocab - 1 - (v & 0xff) % 64
                                           : v % (uint32_t)vocab);
        int n = k3_reply_parser_push(&p, id, out, cap, &ch);
        if (n < -1 || (n >= 0 && (size_t)n >= cap)) bad = -1;
    }
    int n = k3_reply_parser_finish(&p, out, cap, &ch);
    if (n < -1 || (n >= 0 && (size_t)n >= cap)) bad = -1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    k3_err err = {0};
    if (!k3_reply_parser_closing(&p, &ids, &n_ids, &err)) free(ids);
    k3_reply_parser_free(&p);
    free(out);
    return bad;
}

K3_FUZZ_ENTRY(k3_fuzz_reply)
