/* bpe.c — byte-string hash map and heap-based rank-BPE (bpe.h). */
#include "bpe.h"

#include <stdlib.h>
#include <string.h>

/* ---- byte-string → id map ------------------------------------------------------------ */

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int key_equals(const k3_bmap *m, int32_t id, const void *key, size_t len) {
    size_t a = m->off[id], b = m->off[id + 1];
    return b - a == len && memcmp(m->bytes + a, key, len) == 0;
}

int32_t k3_bmap_get(const k3_bmap *m, const void *key, size_t len) {
    size_t i = (size_t)hash_bytes(key, len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        int32_t id = m->slot[i];
        if (id < 0 || key_equals(m, id, key, len)) return id;
    }
}

int32_t k3_bmap_build(k3_bmap *m, const char *bytes, const uint32_t *off, int32_t first,
                      int32_t n) {
    size_t slots = 16;
    while (slots < 2 * (size_t)n) slots *= 2; /* load factor <= 1/2 */
    m->slot = malloc(slots * sizeof *m->slot);
    if (!m->slot) return -2;
    memset(m->slot, 0xFF, slots * sizeof *m->slot); /* all -1 */
    m->mask = slots - 1;
    m->bytes = bytes;
    m->off = off;
    for (int32_t id = first; id < first + n; id++) {
        size_t len = off[id + 1] - off[id];
        size_t i = (size_t)hash_bytes((const unsigned char *)bytes + off[id], len) & m->mask;
        for (; m->slot[i] >= 0; i = (i + 1) & m->mask)
            if (key_equals(m, m->slot[i], bytes + off[id], len)) return id;
        m->slot[i] = id;
    }
    return -1;
}

void k3_bmap_free(k3_bmap *m) {
    free(m->slot);
    m->slot = NULL;
}

int k3_ids_push(k3_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? 2 * ids->cap : 64;
        int32_t *v = realloc(ids->v, cap * sizeof *v);
        if (!v) return -1;
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return 0;
}

/* ---- min-heap of candidate merges, ordered by (rank, position) ----------------------- */

struct k3_bpe_heap_entry {
    int32_t rank, pos;
};
typedef struct k3_bpe_heap_entry heap_entry;

static int before(heap_entry a, heap_entry b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

/* Typed for the merge order (store/replay.c's heap is another's; see there). */
static void heap_push(heap_entry *h, size_t *n, heap_entry e) {
    size_t i = (*n)++;
    while (i > 0 && before(e, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

static heap_entry heap_pop(heap_entry *h, size_t *n) {
    heap_entry top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && before(h[c + 1], h[c])) c++;
        if (!before(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

/* ---- rank-BPE ------------------------------------------------------------------------ */

void k3_bpe_work_free(k3_bpe_work *w) {
    free(w->next);
    free(w->prev);
    free(w->pair_rank);
    free(w->heap);
    memset(w, 0, sizeof *w);
}

static int work_reserve(k3_bpe_work *w, size_t n) {
    if (n <= w->cap) return 0;
    k3_bpe_work_free(w);
    w->next = malloc(n * sizeof *w->next);
    w->prev = malloc(n * sizeof *w->prev);
    w->pair_rank = malloc(n * sizeof *w->pair_rank);
    w->heap = malloc(3 * n * sizeof *w->heap); /* n-1 initial pairs + 2 per merge */
    if (!w->next || !w->prev || !w->pair_rank || !w->heap) {
        k3_bpe_work_free(w);
        return -1;
    }
    w->cap = n;
    return 0;
}

/* Rank of node i joined with the node after it, or -1 (no next node, or no rank). */
static int32_t pair_rank(const k3_bmap *ranks, size_t max_len, const unsigned char *p,
                         int32_t n, const int32_t *next, int32_t i) {
    int32_t j = next[i];
    if (j >= n) return -1;
    int32_t end = next[j];
    if ((size_t)(end - i) > max_len) return -1;
    return k3_bmap_get(ranks, p + i, (size_t)(end - i));
}

/* Nodes are byte positions linked by next/prev; pair_rank[i] is the rank of node i joined
 * with its successor (-1: none, or node i was merged away). A heap entry (r, i) is stale
 * unless pair_rank[i] == r: a node's pair only ever grows, and distinct byte strings have
 * distinct ranks, so an equal rank means the same pair. */
static void merge_all(const k3_bmap *ranks, size_t max_len, const unsigned char *p, int32_t n,
                      k3_bpe_work *w) {
    int32_t *next = w->next, *prev = w->prev, *pr = w->pair_rank;
    size_t hn = 0;
    for (int32_t i = 0; i < n; i++) {
        next[i] = i + 1;
        prev[i] = i - 1;
    }
    for (int32_t i = 0; i < n; i++) {
        pr[i] = pair_rank(ranks, max_len, p, n, next, i);
        if (pr[i] >= 0) heap_push(w->heap, &hn, (heap_entry){pr[i], i});
    }
    while (hn > 0) {
        heap_entry e = heap_pop(w->heap, &hn);
        int32_t i = e.pos;
        if (pr[i] != e.rank) continue; /* stale */
        int32_t j = next[i];
        next[i] = next[j];
        if (next[j] < n) prev[next[j]] = i;
        pr[j] = -1;
        pr[i] = pair_rank(ranks, max_len, p, n, next, i);
        if (pr[i] >= 0) heap_push(w->heap, &hn, (heap_entry){pr[i], i});
        int32_t h = prev[i];
        if (h >= 0) {
            pr[h] = pair_rank(ranks, max_len, p, n, next, h);
            if (pr[h] >= 0) heap_push(w->heap, &hn, (heap_entry){pr[h], h});
        }
    }
}

int k3_bpe_piece(const k3_bmap *ranks, size_t max_len, const unsigned char *p, size_t n,
                 k3_bpe_work *w, k3_ids *out) {
    int32_t whole = n <= max_len ? k3_bmap_get(ranks, p, n) : -1;
    if (whole >= 0) return k3_ids_push(out, whole);
    if (work_reserve(w, n) != 0) return -1;
    merge_all(ranks, max_len, p, (int32_t)n, w);
    for (int32_t i = 0; i < (int32_t)n; i = w->next[i]) {
        int32_t r = k3_bmap_get(ranks, p + i, (size_t)(w->next[i] - i));
        if (k3_ids_push(out, r) != 0) return -1;
    }
    return 0;
}
