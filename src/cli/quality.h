/* quality.h — teacher-forced evaluation of the engine's spine modes against the exact float32
 * path (`k3 quality`, and the figures `k3 pack` stores; issue 8).
 *
 * Definitions (all in double precision over the full vocabulary; position i's logits predict
 * ids[i+1], so n ids give n-1 predictions):
 *  - NLL/token = mean of -log softmax(logits_i)[ids[i+1]] (nats); perplexity = exp(NLL).
 *  - mean KL = mean over positions of KL(P_exact || P_mode) = Σ_v p_exact(v)·(log p_exact(v) −
 *    log p_mode(v)), nats.
 *  - top-1 agreement = fraction of positions where argmax (lowest id on ties) is the same.
 *  - max |Δlogit| = max over positions and vocabulary of |logit_mode − logit_exact|.
 * The reference is its own engine loaded with the BF16 spine; every mode, "bf16" included,
 * runs in a separate engine and session, so "bf16" vs the reference checks the harness (KL 0,
 * 100% agreement, Δ 0) rather than comparing a buffer with itself.
 */
#ifndef K3_QUALITY_H
#define K3_QUALITY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../engine/k3.h"
#include "../util/err.h"

/* bf16: the exact path again (checks the harness); int8: the packed spine; approx: the packed
 * spine with int8 activations (--approx). */
enum k3_quality_mode { K3_QMODE_BF16 = 0, K3_QMODE_INT8 = 1, K3_QMODE_APPROX = 2 };

typedef struct k3_quality_row {
    const char *mode;      /* "exact" (the reference), "bf16", "int8" or "approx" */
    int predictions;
    double nll, ppl;
    double mean_kl, top1, max_abs_dlogit; /* NAN for the reference row */
} k3_quality_row;

typedef struct k3_quality_opts {
    const char *model_dir;
    const char *pack_dir;  /* where the int8 pack lives; NULL = model_dir */
    /* Every engine's options (threads, kernels, device, spine_gb, verbose, ...); spine,
     * pack_dir, approx and experts_in_place are set per mode (the figures do not depend on
     * the spine budget: the output is identical for any budget). */
    k3_engine_opts base;
} k3_quality_opts;

/* A short mixed text (prose, numbers, code) `k3 pack` evaluates on. */
extern const char k3_quality_builtin_text[];

/* Feeds ids[0..n) (n >= 2) through the exact reference and through each of modes[0..n_modes)
 * in lockstep. rows[0] gets the reference, rows[1 + j] mode j.
 * Errors: those of k3_engine_load / k3_session_new / k3_session_step (K3_ERR_INPUT when n
 * exceeds the context), K3_ERR_USAGE when n < 2. */
int k3_quality_eval(const k3_quality_opts *o, const int32_t *ids, size_t n, const int *modes,
                    int n_modes, k3_quality_row *rows, k3_err *err);

/* The table, one line per row. */
void k3_quality_print(FILE *f, const k3_quality_row *rows, int n_rows);

#endif
