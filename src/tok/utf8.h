/* utf8.h — UTF-8 scanning for the tokenizer: strict validation of encoder input, code-point
 * iteration, Python str.isspace(), and maximal-subpart scanning for U+FFFD replacement.
 *
 * Invariants:
 *  - "Valid" means RFC 3629: no overlongs, no surrogates (U+D800..DFFF), nothing above
 *    U+10FFFF. This is what Python's decoder accepts, so validated text is a Python str.
 *  - k3_utf8_unit splits bytes into units exactly as Python's errors="replace" does: each
 *    unit is one valid sequence or one maximal subpart of an ill-formed sequence (one
 *    U+FFFD each, Unicode §3.9 "best practice").
 */
#ifndef K3_TOK_UTF8_H
#define K3_TOK_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum k3_utf8_kind {
    K3_UTF8_VALID,     /* a complete, valid sequence */
    K3_UTF8_INVALID,   /* a maximal subpart of an ill-formed sequence: one U+FFFD */
    K3_UTF8_TRUNCATED, /* a valid prefix cut off by the end of the buffer */
};

/* Length (1..4) of the unit starting at s[0] (n >= 1) and its kind in *kind. */
size_t k3_utf8_unit(const unsigned char *s, size_t n, int *kind);

/* Offset of the first byte that is not part of valid UTF-8, or n if all of s is valid. */
size_t k3_utf8_invalid_at(const unsigned char *s, size_t n);

/* Decodes the code point at s[*i] of VALID text and advances *i past it. */
uint32_t k3_utf8_next(const unsigned char *s, size_t *i);

/* Python's str.isspace() for one code point (bidi WS/B/S or category Zs). */
bool k3_py_isspace(uint32_t cp);

/* Writes n bytes as UTF-8 with each invalid unit replaced by U+FFFD (EF BF BD) to out, which
 * must hold 3*n bytes (out may be NULL to only count). Returns the number of bytes written. */
size_t k3_utf8_replace(const unsigned char *s, size_t n, char *out);

#endif
