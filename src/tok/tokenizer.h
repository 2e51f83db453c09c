/* tokenizer.h — Kimi K3's tiktoken-style tokenizer (spec §11).
 *
 * Invariants:
 *  - Ids 0..n_ranks-1 are the BPE ranks of tiktoken.model (line "base64 rank", ranks
 *    contiguous); ids n_ranks..n_ranks+255 are the 256 specials, named from
 *    tokenizer_config.json "added_tokens_decoder", else "<|reserved_token_{id}|>".
 *  - Encoding with allow_special=false treats every special spelling as ordinary text
 *    (user/tool/model content); allow_special=true turns each of the 256 spellings into its
 *    id (tiktoken allowed_special="all") — only for trusted chat structure.
 *  - Pre-tokenization uses Kimi's pat_str through PCRE2, translated (`&&` class intersection,
 *    \p{Han} as Script, \s as White_Space; see pretok.h), proven on the fixture cases.
 *  - Encoding is tiktoken's exactly, including tokenization_kimi.py's outer slicing (400,000
 *    characters, runs of more than 25,000 same-class characters cut).
 *  - A loaded tokenizer is immutable: encode/decode may run from several threads at once.
 *  - Decoding concatenates token bytes (specials as their spelling) and replaces invalid
 *    UTF-8 with U+FFFD per maximal subpart (Python errors="replace").
 */
#ifndef K3_TOKENIZER_H
#define K3_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "../util/err.h"

typedef struct k3_tokenizer k3_tokenizer;

/* Loads DIR/tiktoken.model and DIR/tokenizer_config.json.
 * Errors: K3_ERR_IO (file missing), K3_ERR_TOKENIZER (bad line, non-contiguous rank),
 * K3_ERR_CONFIG (malformed tokenizer_config.json). The message names the file and line. */
int k3_tokenizer_load(const char *dir, k3_tokenizer **out, k3_err *err);
void k3_tokenizer_free(k3_tokenizer *t);

int k3_tokenizer_vocab_size(const k3_tokenizer *t); /* n_ranks + 256 */
int k3_tokenizer_n_ranks(const k3_tokenizer *t);

/* Id of a special token spelling such as "<|end_of_msg|>", or -1. */
int k3_tokenizer_special_id(const k3_tokenizer *t, const char *spelling);

/* Encodes len bytes of UTF-8 text (spec §11.3, including the 400k/25k slicing rule).
 * On success *ids is a malloc'd array of *n ids (caller frees).
 * Errors: K3_ERR_TOKENIZER (text is not valid UTF-8), K3_ERR_GENERIC (out of memory). */
int k3_tokenizer_encode(const k3_tokenizer *t, const char *text, size_t len, bool allow_special,
                        int32_t **ids, size_t *n, k3_err *err);

/* The raw bytes of one token (a special's spelling for specials); NULL for an id out of
 * range. *len receives the byte count. */
const char *k3_tokenizer_token_bytes(const k3_tokenizer *t, int32_t id, size_t *len);

/* Decodes n ids to UTF-8 with U+FFFD replacement; *out is malloc'd and NUL-terminated.
 * Errors: K3_ERR_INPUT (id out of range), K3_ERR_GENERIC (out of memory). */
int k3_tokenizer_decode(const k3_tokenizer *t, const int32_t *ids, size_t n, char **out,
                        size_t *out_len, k3_err *err);

/* Streaming decoder: feed ids one at a time, get only complete, valid UTF-8 back; bytes of an
 * incomplete sequence are held until the next id completes or breaks it. The concatenated
 * output of all pushes plus the flush equals k3_tokenizer_decode of the same ids.
 * Start from a zeroed struct: k3_detok_stream st = {0}; (at most 3 bytes are ever held). */
typedef struct k3_detok_stream {
    unsigned char pending[8];
    int n_pending;
} k3_detok_stream;

/* Appends the text made printable by `id` to out (capacity cap bytes, NUL-terminated) and
 * returns the number of bytes written (never more than cap-1; a token's text is at most
 * 3 bytes per byte of its bytes plus held bytes, so cap >= 3*(maxlen+3)+1 is always enough,
 * see k3_tokenizer_max_token_len). Returns -1, leaving st unchanged, if id is out of range
 * or the text does not fit in cap. Allocates nothing. */
int k3_detok_stream_push(const k3_tokenizer *t, k3_detok_stream *st, int32_t id, char *out,
                         size_t cap);
/* Ends the stream: held bytes (a truncated sequence, one maximal subpart) become one U+FFFD,
 * written to out and NUL-terminated. Returns bytes written (0 or 3), or -1 if cap < 4 and a
 * U+FFFD is due. st is then empty and may be reused. */
int k3_detok_stream_flush(k3_detok_stream *st, char *out, size_t cap);

/* Longest byte string of any token (ranks and special spellings). */
size_t k3_tokenizer_max_token_len(const k3_tokenizer *t);

#endif
