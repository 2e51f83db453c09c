/* tokenizer.c — encoding (slicing, specials, regex, BPE), decoding and streaming decode of
 * Kimi K3's tokenizer (spec §11). Loading lives in load.c; the regex in pretok.c; the BPE in
 * bpe.c; UTF-8 handling in utf8.c. */
#include "tok_internal.h"
#include "utf8.h"

#include <stdlib.h>
#include <string.h>

/* ---- accessors ----------------------------------------------------------------------- */

int k3_tokenizer_vocab_size(const k3_tokenizer *t) { return t->n_ranks + K3_TOK_N_SPECIALS; }
int k3_tokenizer_n_ranks(const k3_tokenizer *t) { return t->n_ranks; }

int k3_tokenizer_special_id(const k3_tokenizer *t, const char *spelling) {
    return k3_bmap_get(&t->specials, spelling, strlen(spelling));
}

const char *k3_tokenizer_token_bytes(const k3_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ranks + K3_TOK_N_SPECIALS) return NULL;
    *len = t->off[id + 1] - t->off[id];
    return t->bytes + t->off[id];
}

/* ---- encoding ------------------------------------------------------------------------ */

/* Scratch of one encode call (so the tokenizer itself stays immutable and shareable). */
typedef struct enc {
    const k3_tokenizer *t;
    pcre2_match_data *md;
    k3_bpe_work work;
    k3_ids ids;
    k3_err *err;
} enc;

static int oom(enc *c) { return k3_fail(c->err, K3_ERR_GENERIC, "encode: out of memory"); }

/* Regex-splits s[0..len) and BPE-encodes each piece (tiktoken's encode_ordinary). The
 * segment is the whole regex subject, so `\s+(?!\S)` sees its end as end of input. */
static int encode_ordinary(enc *c, const char *s, size_t len) {
    size_t pos = 0, b, e;
    int rc;
    while ((rc = k3_pretok_next(c->t->re, c->md, s, len, pos, &b, &e)) == 1) {
        if (k3_bpe_piece(&c->t->ranks, c->t->max_rank_len, (const unsigned char *)s + b, e - b,
                         &c->work, &c->ids) != 0)
            return oom(c);
        pos = e;
    }
    if (rc < 0) return k3_fail(c->err, K3_ERR_TOKENIZER, "pre-tokenizer regex failed (%d)", rc);
    return K3_OK;
}

/* Leftmost, then longest, special spelling in s[from..len): its id and start, or -1. */
static int32_t find_special(const k3_tokenizer *t, const char *s, size_t len, size_t from,
                            size_t *at) {
    for (size_t p = from; p < len; p++) {
        if (!t->special_first[(unsigned char)s[p]]) continue;
        for (int k = 0; k < t->n_special_lens; k++) {
            size_t l = t->special_lens[k];
            int32_t id = l <= len - p ? k3_bmap_get(&t->specials, s + p, l) : -1;
            if (id >= 0) {
                *at = p;
                return id;
            }
        }
    }
    return -1;
}

/* Encodes one piece of the outer slicing: split at special spellings when allowed. */
static int encode_segment(enc *c, const char *s, size_t len, bool allow_special) {
    size_t pos = 0, at;
    int32_t id;
    while (allow_special && (id = find_special(c->t, s, len, pos, &at)) >= 0) {
        if (encode_ordinary(c, s + pos, at - pos) != K3_OK) return c->err->code;
        if (k3_ids_push(&c->ids, id) != 0) return oom(c);
        pos = at + (c->t->off[id + 1] - c->t->off[id]);
    }
    return encode_ordinary(c, s + pos, len - pos);
}

/* tokenization_kimi.py's outer slicing (spec §11.3): slices of 400,000 characters; inside a
 * slice, a run of more than 25,000 characters of one class (str.isspace or not) is cut every
 * 25,000 characters, the cut ending the current piece. Each piece is encoded on its own. */
static int encode_sliced(enc *c, const char *s, size_t len, bool allow_special) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t piece = i, n_chars = 0, run = 0;
        bool space = false;
        for (; i < len && n_chars < K3_TOK_SLICE_CHARS; n_chars++) {
            size_t at = i;
            bool sp = k3_py_isspace(k3_utf8_next(u, &i));
            if (n_chars == 0 || sp != space) {
                space = sp;
                run = 1;
            } else if (++run > K3_TOK_RUN_CHARS) {
                if (encode_segment(c, s + piece, at - piece, allow_special) != K3_OK)
                    return c->err->code;
                piece = at;
                run = 1;
            }
        }
        if (encode_segment(c, s + piece, i - piece, allow_special) != K3_OK) return c->err->code;
    }
    return K3_OK;
}

int k3_tokenizer_encode(const k3_tokenizer *t, const char *text, size_t len, bool allow_special,
                        int32_t **ids, size_t *n, k3_err *err) {
    size_t bad = k3_utf8_invalid_at((const unsigned char *)text, len);
    if (bad < len)
        return k3_fail(err, K3_ERR_TOKENIZER, "text is not valid UTF-8 (byte %zu is 0x%02x)",
                       bad, (unsigned char)text[bad]);
    enc c = {.t = t, .err = err};
    c.md = pcre2_match_data_create_from_pattern(t->re, NULL);
    int rc = c.md ? encode_sliced(&c, text, len, allow_special) : oom(&c);
    pcre2_match_data_free(c.md);
    k3_bpe_work_free(&c.work);
    if (rc != K3_OK) {
        free(c.ids.v);
        return rc;
    }
    *ids = c.ids.v ? c.ids.v : malloc(sizeof(int32_t)); /* never NULL on success */
    *n = c.ids.n;
    return *ids ? K3_OK : k3_fail(err, K3_ERR_GENERIC, "encode: out of memory");
}

/* ---- decoding ------------------------------------------------------------------------ */

int k3_tokenizer_decode(const k3_tokenizer *t, const int32_t *ids, size_t n, char **out,
                        size_t *out_len, k3_err *err) {
    size_t total = 0, len;
    for (size_t i = 0; i < n; i++) {
        if (!k3_tokenizer_token_bytes(t, ids[i], &len))
            return k3_fail(err, K3_ERR_INPUT, "token id %d at position %zu is out of range "
                           "(vocabulary %d)", ids[i], i, k3_tokenizer_vocab_size(t));
        total += len;
    }
    unsigned char *raw = malloc(total + 1);
    char *text = malloc(3 * total + 1);
    if (!raw || !text) {
        free(raw);
        free(text);
        return k3_fail(err, K3_ERR_GENERIC, "decode: out of memory");
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *b = k3_tokenizer_token_bytes(t, ids[i], &len);
        memcpy(raw + o, b, len);
        o += len;
    }
    *out_len = k3_utf8_replace(raw, total, text);
    text[*out_len] = 0;
    free(raw);
    *out = text;
    return K3_OK;
}

/* ---- streaming decode ---------------------------------------------------------------- */

/* Appends one unit to out (if out): the bytes when valid, else U+FFFD; returns its size. */
static size_t put_unit(char *out, int kind, const unsigned char *s, size_t len) {
    static const unsigned char fffd[3] = {0xEF, 0xBF, 0xBD};
    if (kind != K3_UTF8_VALID) s = fffd, len = 3;
    if (out) memcpy(out, s, len);
    return len;
}

/* Decodes st's held bytes followed by tok[0..len): writes the printable text to out (NULL:
 * only count) and stores what stays held in *next (NULL: discard). Held bytes are always a
 * valid but incomplete prefix (<= 3 bytes), so the first unit covers all of them. */
static size_t stream_emit(const k3_detok_stream *st, const unsigned char *tok, size_t len,
                          char *out, k3_detok_stream *next) {
    unsigned char held[4];
    size_t n_held = (size_t)st->n_pending, i = 0, o = 0;
    int kind;
    memcpy(held, st->pending, n_held);
    if (n_held > 0) {
        unsigned char buf[8];
        size_t take = len < 4 - n_held ? len : 4 - n_held;
        memcpy(buf, held, n_held);
        memcpy(buf + n_held, tok, take);
        size_t u = k3_utf8_unit(buf, n_held + take, &kind);
        if (kind == K3_UTF8_TRUNCATED) { /* still incomplete: tok was all used */
            memcpy(held + n_held, tok, take);
            n_held += take;
            i = len;
        } else {
            o += put_unit(out, kind, buf, u); /* o was 0 */
            i = u - n_held;
            n_held = 0;
        }
    }
    while (i < len) {
        size_t u = k3_utf8_unit(tok + i, len - i, &kind);
        if (kind == K3_UTF8_TRUNCATED) {
            memcpy(held, tok + i, u);
            n_held = u;
        } else {
            o += put_unit(out ? out + o : NULL, kind, tok + i, u);
        }
        i += u;
    }
    if (next) {
        memcpy(next->pending, held, n_held);
        next->n_pending = (int)n_held;
    }
    return o;
}

int k3_detok_stream_push(const k3_tokenizer *t, k3_detok_stream *st, int32_t id, char *out,
                         size_t cap) {
    size_t len;
    const unsigned char *tok = (const unsigned char *)k3_tokenizer_token_bytes(t, id, &len);
    if (!tok || stream_emit(st, tok, len, NULL, NULL) >= cap) return -1;
    size_t n = stream_emit(st, tok, len, out, st);
    out[n] = 0;
    return (int)n;
}

int k3_detok_stream_flush(k3_detok_stream *st, char *out, size_t cap) {
    size_t n = st->n_pending > 0 ? 3 : 0; /* held bytes are one maximal subpart: one U+FFFD */
    if (n >= cap) return -1;
    if (n) put_unit(out, K3_UTF8_INVALID, NULL, 0);
    out[n] = 0;
    st->n_pending = 0;
    return (int)n;
}

size_t k3_tokenizer_max_token_len(const k3_tokenizer *t) { return t->max_token_len; }
