/* policy.h — cache eviction policies over a fixed set of slots (internal to src/store; the
 * replay tool uses them too). A policy only orders READY slots: the store inserts a slot
 * when its read completes, reports hits, removes slots it frees, and asks for a victim.
 *
 * Invariants:
 *  - A slot is in the policy's lists iff it was inserted and not yet removed or chosen.
 *  - k3_policy_victim never returns a slot with pins[slot] > 0 (pins may be NULL: none).
 *  - Every operation is O(1) except victim, which skips pinned slots (at most the pinned
 *    count, i.e. a layer's top-k per client) and, for S3-FIFO, promotes/demotes in passing.
 */
#ifndef K3_POLICY_H
#define K3_POLICY_H

#include <stdint.h>

typedef struct k3_policy {
    int kind;        /* enum k3_cache_policy, resolved (LRU or S3FIFO) */
    int n_slots, n_keys;
    int *prev, *next, *key;  /* intrusive doubly linked lists over slots; key per slot */
    uint8_t *freq;   /* S3-FIFO access counter, 0..3 */
    uint8_t *list;   /* which list a slot is on: 0 none, 1 main (LRU: the only list), 2 small */
    int head[3], tail[3], size[3];
    int small_cap;   /* S3-FIFO: the small FIFO's target size (10% of slots) */
    uint32_t *ghost_at; /* S3-FIFO ghost FIFO: per key, serial of insertion + 1 (0 = never) */
    uint32_t ghost_serial;
    int ghost_cap;
} k3_policy;

/* Errors: returns -1 when out of memory. */
int k3_policy_init(k3_policy *p, int kind, int n_slots, int n_keys);
void k3_policy_free(k3_policy *p);

/* A slot became READY holding key. */
void k3_policy_insert(k3_policy *p, int slot, int key);
/* A request found key in slot. */
void k3_policy_hit(k3_policy *p, int slot);
/* The slot was emptied by the store (cancelled, failed): forget it without ghosting. */
void k3_policy_remove(k3_policy *p, int slot);
/* Chooses, unlinks and returns a slot to evict, or -1 when every listed slot is pinned. */
int k3_policy_victim(k3_policy *p, const int *pins);

#endif
