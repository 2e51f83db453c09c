/* k3_lab.h — the engine's lab and test controls: settings no product command may set (k3-lab's
 * benchmarks and the tests only), kept out of k3_engine_opts. A caller that needs them fills a
 * k3_lab_opts and points k3_engine_opts.lab at it; the product leaves lab NULL.
 *
 * Invariants:
 *  - Only src/lab, tests and the engine itself include this header (tests/test_arch.c: src/cli
 *    and src/server never do), so the shipped `k3` cannot reach these controls.
 *  - lab NULL behaves exactly as k3_lab_opts_default().
 */
#ifndef K3_ENGINE_LAB_H
#define K3_ENGINE_LAB_H

#include "k3.h"

typedef struct k3_lab_opts {
    int expert_slots;     /* > 0: exactly this many CPU expert cache slots (beats expert_gb); the
                           * memory plan counts them; 0: the plan's */
    int spine_in_place;   /* 1: the spine used in place from the mappings whatever the plan (no
                           * budget); spine_gb must stay K3_SPINE_GB_PLAN */
    int gpu_max_layers;   /* >= 0: at most this many resident spine layers on the GPU (the rest
                           * stream); < 0: as many as fit */
    int gpu_expert_slots; /* > 0: exactly this many device expert slots; 0: the budget */
    int gpu_profile;      /* 1: time every GPU layer with device events (k3_engine_layer_profile) */
} k3_lab_opts;

/* Nothing set: gpu_max_layers -1, everything else 0. */
static inline k3_lab_opts k3_lab_opts_default(void) {
    return (k3_lab_opts){.gpu_max_layers = -1};
}

#endif
