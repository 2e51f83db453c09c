/* bpe.h — the byte-string → id hash map and tiktoken's rank-BPE over one piece (spec §11.3).
 *
 * Invariants:
 *  - A k3_bmap stores only ids; each id's key is bytes[off[id] .. off[id+1]) of the arena it
 *    was built over, so the arena must outlive the map and never move.
 *  - k3_bpe_piece gives exactly tiktoken's result: the whole piece if it has a rank, else
 *    repeated merging of the adjacent pair whose concatenation has the lowest rank, the
 *    leftmost pair on ties. It uses a binary heap with lazy deletion, O(n log n), so a
 *    25,000-byte piece is cheap (tiktoken's own loop is quadratic).
 */
#ifndef K3_TOK_BPE_H
#define K3_TOK_BPE_H

#include <stddef.h>
#include <stdint.h>

/* Open-addressing hash map from byte strings to ids (no deletion). */
typedef struct k3_bmap {
    int32_t *slot;   /* -1 = empty, else an id */
    size_t mask;     /* slot count - 1 (a power of two) */
    const char *bytes;
    const uint32_t *off;
} k3_bmap;

/* Builds a map of ids first..first+n-1. Returns -1 on success, -2 when out of memory, or
 * the id (>= 0) whose key equals a key inserted earlier (a duplicate). */
int32_t k3_bmap_build(k3_bmap *m, const char *bytes, const uint32_t *off, int32_t first,
                      int32_t n);
/* The id of key, or -1. */
int32_t k3_bmap_get(const k3_bmap *m, const void *key, size_t len);
void k3_bmap_free(k3_bmap *m);

/* A growable id list. */
typedef struct k3_ids {
    int32_t *v;
    size_t n, cap;
} k3_ids;

/* Appends id; returns 0, or -1 when out of memory. */
int k3_ids_push(k3_ids *ids, int32_t id);

/* Scratch arrays for k3_bpe_piece, grown on demand; reuse one per encode call. */
typedef struct k3_bpe_work {
    int32_t *next, *prev, *pair_rank;
    struct k3_bpe_heap_entry *heap;
    size_t cap; /* piece bytes the arrays can hold */
} k3_bpe_work;

void k3_bpe_work_free(k3_bpe_work *w);

/* Appends the ranks of piece p[0..n) (n >= 1) to out. ranks maps bytes to ranks; max_len is
 * the longest ranked byte string. Every single byte must have a rank. Returns 0, or -1 when
 * out of memory. */
int k3_bpe_piece(const k3_bmap *ranks, size_t max_len, const unsigned char *p, size_t n,
                 k3_bpe_work *w, k3_ids *out);

#endif
