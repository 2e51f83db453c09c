/* tok_internal.h — the k3_tokenizer object, shared by load.c (which builds it) and
 * tokenizer.c (which encodes and decodes with it). Not for use outside src/tok and tests.
 *
 * Invariants:
 *  - Token id i's bytes are bytes[off[i] .. off[i+1]) for every id 0..n_ranks+255 (specials
 *    hold their spelling), so ranks, specials and decoding share one arena.
 *  - Once loaded the object is immutable; encode/decode allocate their own scratch, so one
 *    tokenizer may be used from several threads at once.
 */
#ifndef K3_TOK_INTERNAL_H
#define K3_TOK_INTERNAL_H

#include "bpe.h"
#include "pretok.h"
#include "tokenizer.h"

#define K3_TOK_N_SPECIALS 256
#define K3_TOK_SLICE_CHARS 400000 /* tokenization_kimi.py TIKTOKEN_MAX_ENCODE_CHARS */
#define K3_TOK_RUN_CHARS 25000    /* tokenization_kimi.py MAX_NO_WHITESPACES_CHARS */

struct k3_tokenizer {
    int32_t n_ranks;
    char *bytes;         /* token bytes of every id: ranks, then the special spellings */
    uint32_t *off;       /* n_ranks + 257 offsets into bytes */
    size_t max_rank_len; /* longest ranked byte string: longer pairs cannot merge */
    size_t max_token_len;
    k3_bmap ranks;       /* bytes → rank, ids 0..n_ranks-1 */
    k3_bmap specials;    /* spelling → id, ids n_ranks..n_ranks+255 */
    unsigned char special_first[256]; /* 1 where some spelling starts with that byte */
    size_t special_lens[K3_TOK_N_SPECIALS]; /* distinct spelling lengths, longest first */
    int n_special_lens;
    pcre2_code *re;      /* k3_kimi_pat_pcre2, compiled */
};

#endif
