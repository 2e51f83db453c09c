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

/* Python dict semantics for a JSON object with a repeated key: a member is skipped when an
 * earlier member has its key (k3_pyjson_dict_dup), and the member's value is that of the
 * LAST member with the key (k3_pyjson_dict_value). Iterate: for each child c of obj, skip it
 * if dup, else use dict_value(c). */
int k3_pyjson_dict_dup(const cJSON *obj, const cJSON *member);
const cJSON *k3_pyjson_dict_value(const cJSON *member);

/* Python's str.strip(): the [*start, *start + *len) range of s[0..n) without leading and
 * trailing Unicode whitespace (str.isspace). s must be valid UTF-8. */
void k3_py_strip(const char *s, size_t n, size_t *start, size_t *len);

#endif
