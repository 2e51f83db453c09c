/* pretok.h — Kimi's pre-tokenizer regex (spec §11.2) translated for PCRE2.
 *
 * Kimi's pat_str is written for Rust fancy-regex. Three constructs mean something else, or
 * nothing, in PCRE2 10.42, so the pattern PCRE2 compiles (k3_kimi_pat_pcre2) is a
 * translation, made by hand and checked by tests/test_tokenizer.c:
 *
 *  1. Class intersection `[A&&[^\p{Han}]]` does not exist in PCRE2. Because general
 *     categories partition the code points, "A and not Han" is the complement of "the other
 *     categories, or Han" (De Morgan), which is one plain negated class:
 *       [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
 *         → [^\p{Ll}\p{C}\p{N}\p{P}\p{S}\p{Z}\p{sc:Han}]
 *       [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
 *         → [^\p{Lu}\p{Lt}\p{C}\p{N}\p{P}\p{S}\p{Z}\p{sc:Han}]
 *     It equals the lookahead form (?:(?!\p{sc:Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]) on every
 *     code point (a test checks all 1,112,064), and unlike that form it is a single class, so
 *     `*`/`+` over it never backtrack through a group.
 *  2. `\p{Han}` in Rust regex is the Script property; PCRE2 >= 10.40 reads an unqualified
 *     script name as Script_Extensions, which also covers CJK punctuation such as "。" and
 *     "、". So Han is written \p{sc:Han}.
 *  3. `\s` in Rust regex is Unicode White_Space; PCRE2's \s with UCP also matches U+180E. So
 *     \s is spelled out as the White_Space list (K3_PAT_WS), and \S as its complement.
 *
 * Everything else is kept: the alternation order (PCRE2, like fancy-regex, takes the first
 * alternative that matches, leftmost), `\s+(?!\S)` as a lookahead, `\p{N}{1,3}`, and the
 * case-insensitive contraction group. The pattern is compiled with PCRE2_UTF | PCRE2_UCP.
 */
#ifndef K3_TOK_PRETOK_H
#define K3_TOK_PRETOK_H

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#include <stddef.h>

#include "../util/err.h"

/* Unicode White_Space, the members of Rust regex's \s, as the inside of a class. */
#define K3_PAT_WS                                                                          \
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"   \
    "\\x{205F}\\x{3000}"
/* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] */
#define K3_PAT_UPPERISH "[^\\p{Ll}\\p{C}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{sc:Han}]"
/* [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] */
#define K3_PAT_LOWERISH "[^\\p{Lu}\\p{Lt}\\p{C}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{sc:Han}]"

/* The pat_str of tokenization_kimi.py, verbatim (fancy-regex syntax; not compiled). */
extern const char k3_kimi_pat_str[];
/* Its PCRE2 translation (above); what the tokenizer compiles. */
extern const char k3_kimi_pat_pcre2[];

/* Compiles pattern with PCRE2_UTF | PCRE2_UCP and JIT-compiles it when the platform can.
 * Errors: K3_ERR_GENERIC with PCRE2's message. */
int k3_pretok_compile(const char *pattern, pcre2_code **out, k3_err *err);

/* Finds the first match in s[0..len) at or after pos (s must be valid UTF-8; pos a character
 * boundary). Returns 1 with the match in [*b, *e), 0 when there is none, or a negative PCRE2
 * error code. md must come from pcre2_match_data_create_from_pattern(re). */
int k3_pretok_next(const pcre2_code *re, pcre2_match_data *md, const char *s, size_t len,
                   size_t pos, size_t *b, size_t *e);

#endif
