/* policy.c — LRU and S3-FIFO (Yang et al., SOSP '23) over the store's slots. */
#include "policy.h"

#include <stdlib.h>
#include <string.h>

#include "store.h"

enum { LIST_NONE = 0, LIST_MAIN = 1, LIST_SMALL = 2 };

int k3_cache_policy_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "lru")) return K3_POLICY_LRU;
    if (!strcmp(name, "s3fifo") || !strcmp(name, "s3-fifo")) return K3_POLICY_S3FIFO;
    return -1;
}

const char *k3_cache_policy_name(int policy) {
    return policy == K3_POLICY_S3FIFO ? "s3fifo" : policy == K3_POLICY_LRU ? "lru" : "default";
}

int k3_policy_init(k3_policy *p, int kind, int n_slots, int n_keys) {
    *p = (k3_policy){.kind = kind == K3_POLICY_S3FIFO ? K3_POLICY_S3FIFO : K3_POLICY_LRU,
                     .n_slots = n_slots, .n_keys = n_keys};
    size_t n = (size_t)n_slots;
    p->prev = malloc(n * sizeof *p->prev);
    p->next = malloc(n * sizeof *p->next);
    p->key = malloc(n * sizeof *p->key);
    p->freq = calloc(n, 1);
    p->list = calloc(n, 1);
    p->ghost_at = calloc((size_t)n_keys, sizeof *p->ghost_at);
    for (int i = 0; i < 3; i++) p->head[i] = p->tail[i] = -1;
    p->small_cap = n_slots / 10 > 1 ? n_slots / 10 : 1;
    p->ghost_cap = n_slots;
    if (!p->prev || !p->next || !p->key || !p->freq || !p->list || !p->ghost_at) {
        k3_policy_free(p);
        return -1;
    }
    return 0;
}

void k3_policy_free(k3_policy *p) {
    free(p->prev);
    free(p->next);
    free(p->key);
    free(p->freq);
    free(p->list);
    free(p->ghost_at);
    *p = (k3_policy){0};
}

/* ---- intrusive lists: head = most recent ------------------------------------------- */

static void push_head(k3_policy *p, int l, int s) {
    p->prev[s] = -1;
    p->next[s] = p->head[l];
    if (p->head[l] >= 0) p->prev[p->head[l]] = s;
    else p->tail[l] = s;
    p->head[l] = s;
    p->list[s] = (uint8_t)l;
    p->size[l]++;
}

static void unlink_slot(k3_policy *p, int s) {
    int l = p->list[s];
    if (l == LIST_NONE) return;
    if (p->prev[s] >= 0) p->next[p->prev[s]] = p->next[s];
    else p->head[l] = p->next[s];
    if (p->next[s] >= 0) p->prev[p->next[s]] = p->prev[s];
    else p->tail[l] = p->prev[s];
    p->list[s] = LIST_NONE;
    p->size[l]--;
}

/* ---- ghost FIFO of recently evicted keys (S3-FIFO) --------------------------------- */

static int in_ghost(const k3_policy *p, int key) {
    uint32_t at = p->ghost_at[key];
    return at && p->ghost_serial - (at - 1) < (uint32_t)p->ghost_cap;
}

static void to_ghost(k3_policy *p, int key) { p->ghost_at[key] = ++p->ghost_serial; }

/* ---- operations ---------------------------------------------------------------------- */

void k3_policy_insert(k3_policy *p, int slot, int key) {
    unlink_slot(p, slot);
    p->key[slot] = key;
    p->freq[slot] = 0;
    if (p->kind == K3_POLICY_LRU || in_ghost(p, key)) {
        p->ghost_at[key] = 0;
        push_head(p, LIST_MAIN, slot);
    } else {
        push_head(p, LIST_SMALL, slot);
    }
}

void k3_policy_hit(k3_policy *p, int slot) {
    if (p->list[slot] == LIST_NONE) return;
    if (p->kind == K3_POLICY_LRU) {
        unlink_slot(p, slot);
        push_head(p, LIST_MAIN, slot);
    } else if (p->freq[slot] < 3) {
        p->freq[slot]++;
    }
}

void k3_policy_remove(k3_policy *p, int slot) { unlink_slot(p, slot); }

static int lru_victim(k3_policy *p, const int *pins) {
    for (int s = p->tail[LIST_MAIN]; s >= 0; s = p->prev[s]) {
        if (pins && pins[s] > 0) continue;
        unlink_slot(p, s);
        return s;
    }
    return -1;
}

/* S3-FIFO: evict from the small FIFO while it is over its share (its tail moves to main if it
 * was hit since insertion, else leaves a ghost); else from main, where a hit tail gets
 * another round with its counter decremented (CLOCK-like). Pinned tails go to main's head. */
static int s3fifo_victim(k3_policy *p, const int *pins) {
    int budget = 4 * p->n_slots + 8;
    while (budget-- > 0) {
        int small = p->size[LIST_SMALL] > 0 &&
                    (p->size[LIST_SMALL] >= p->small_cap || p->size[LIST_MAIN] == 0);
        int l = small ? LIST_SMALL : LIST_MAIN, s = p->tail[l];
        if (s < 0) return -1;
        unlink_slot(p, s);
        if (pins && pins[s] > 0) {
            push_head(p, LIST_MAIN, s);
        } else if (small && p->freq[s] >= 1) {
            p->freq[s] = 0;
            push_head(p, LIST_MAIN, s);
        } else if (small) {
            to_ghost(p, p->key[s]);
            return s;
        } else if (p->freq[s] > 0) {
            p->freq[s]--;
            push_head(p, LIST_MAIN, s);
        } else {
            return s;
        }
    }
    return -1;
}

int k3_policy_victim(k3_policy *p, const int *pins) {
    return p->kind == K3_POLICY_LRU ? lru_victim(p, pins) : s3fifo_victim(p, pins);
}
