/* fuzz_trace.c — a router trace (jsonl) through k3_route_trace_read, then replayed under
 * LRU and Belady with k + 1 slots. Oracle: hits never exceed the requests' keys. */
#include "../src/store/replay.h"
#include "../src/store/store.h"
#include "fuzz_files.h"

int k3_fuzz_trace(const uint8_t *data, size_t size) {
    static char dir[256];
    if (!dir[0]) k3_fuzz_dir("trace", dir, sizeof dir);
    if (k3_fuzz_write(dir, "trace.jsonl", data, size)) return 0;
    char path[512];
    snprintf(path, sizeof path, "%s/trace.jsonl", dir);
    k3_route_trace t;
    k3_err err = {0};
    if (k3_route_trace_read(path, &t, &err)) return 0;
    int bad = 0;
    int64_t total = (int64_t)t.n_req * t.k;
    if ((int64_t)t.n_layers * t.n_experts <= (1 << 22)) { /* replay allocates per key */
        int64_t lru = k3_replay(&t, K3_POLICY_LRU, t.k + 1);
        int64_t min = k3_replay(&t, K3_POLICY_BELADY, t.k + 1);
        bad = lru > total || min > total || (lru >= 0 && min >= 0 && min < lru);
    }
    k3_route_trace_free(&t);
    return bad ? -1 : 0;
}

K3_FUZZ_ENTRY(k3_fuzz_trace)
