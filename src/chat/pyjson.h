/* pyjson.h — (internal to src/chat) a growable byte buffer, and JSON text written exactly as
 * Python's json.dumps(..., ensure_ascii=False) writes it, which is what the official K3
 * renderer (encoding_k3.py) puts into prompts (spec §12.5).
 *
 * Invariants:
 *  - Strings keep non-ASCII bytes literally; only '"', '\\' and U+0000..U+001F are escaped
 *    (\b \f \n \r \t by name, the rest as \u00xx with lowercase hex), as Python does.
 *  - Objects print each key once, at its first position, with its LAST value (Python's dict
 *    semantics for a duplicated key); sort_keys orders keys by code point (= UTF-8 bytes).
 *  - Numbers: cJSON keeps only a double, so an integral value with |v| < 2^53 prints as an
 *    integer ("5"; Python prints "5.0" when the source text was a float) and any other value
 *    prints as the shortest text that reads back to the same double, which is Python's
 *    float repr ("0.5", "1e-07").
 */
#ifndef K3_CHAT_PYJSON_H
#define K3_CHAT_PYJSON_H

#include <stdbool.h>
#include <stddef.h>
#include <cjson/cJSON.h>

/* Growable buffer; start from {0}. After an allocation failure `oom` is set and further
 * writes are dropped, so callers check once at the end. p is NUL-terminated when non-NULL. */
typedef struct k3_strbuf {
    char *p;
    size_t n, cap;
    int oom;
} k3_strbuf;

void k3_strbuf_put(k3_strbuf *b, const char *s, size_t n);
void k3_strbuf_puts(k3_strbuf *b, const char *s);
void k3_strbuf_printf(k3_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void k3_strbuf_free(k3_strbuf *b);

enum k3_pyjson_style {
    K3_PYJSON_COMPACT, /* separators=(",", ":") — tool declarations and schemas */
    K3_PYJSON_SPACED,  /* Python's default (", ", ": ") — non-string tool-call arguments */
};

/* Appends the JSON text of v to b in the given style; keys sorted recursively if sort_keys. */
void k3_pyjson_dump(k3_strbuf *b, const cJSON *v, enum k3_pyjson_style style, bool sort_keys);

/* Python dict semantics for a JSON object with a repeated key: each key once, at the
 * position of its FIRST member, with the value of its LAST member. *out (malloc'd, caller
 * frees) holds the *n distinct keys in first-position order. O(n log n) in the members, so
 * that a hostile object of many keys costs no more than sorting them (issue 20, D1).
 * Returns 0, or -1 when out of memory. */
typedef struct k3_pyjson_member {
    const char *key;
    const cJSON *value;
    size_t pos; /* index of the key's first member in obj */
} k3_pyjson_member;
int k3_pyjson_dict(const cJSON *obj, k3_pyjson_member **out, size_t *n);

/* Python's str.strip(): the [*start, *start + *len) range of s[0..n) without leading and
 * trailing Unicode whitespace (str.isspace). s may hold any bytes: an invalid or truncated
 * sequence counts as one non-space character, and nothing past s[n) is read. */
void k3_py_strip(const char *s, size_t n, size_t *start, size_t *len);

#endif
