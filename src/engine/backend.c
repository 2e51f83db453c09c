/* backend.c — the backend boundary (backend.h): device choice, the CPU backend (k3_forward)
 * and the dispatch to the CUDA backend when this build has it (K3_WITH_CUDA). */
#include "backend.h"

#include "../store/store.h"
#include "../util/dtype.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3_lab.h"
#ifdef K3_WITH_CUDA
#include "../cuda/gpu.h"
#endif

struct k3_backend {
    const k3_model *m;
    int cuda;   /* 0: CPU; 1: CUDA (gpu is set) */
    void *gpu;  /* k3_gpu * */
    char line[1024];
};

#ifdef K3_WITH_CUDA
static int open_cuda(k3_backend *b, const k3_engine_opts *o, const char *why, k3_err *err) {
    if (!(o->gpu_gb >= 0 && o->gpu_gb < 1e9)) /* also inf and nan */
        return k3_fail_field(err, K3_ERR_USAGE, "gpu_gb",
                             " %g: expected a number of GB from 0 to 1e9",
                       o->gpu_gb);
    k3_lab_opts lab = o->lab ? *o->lab : k3_lab_opts_default(); /* the lab's controls */
    k3_gpu_opts go = {.gpu_gb = o->gpu_gb, .max_layers = lab.gpu_max_layers,
                      .expert_slots = lab.gpu_expert_slots, .profile = lab.gpu_profile};
    int rc;
    k3_gpu *g = NULL;
    char plan[900];
    if ((rc = k3_gpu_open(b->m, &go, &g, plan, sizeof plan, err))) return rc;
    b->cuda = 1;
    b->gpu = g;
    snprintf(b->line, sizeof b->line, "%s%s", why, plan);
    return K3_OK;
}
#endif

int k3_backend_open(const k3_model *m, const k3_engine_opts *o, k3_backend **out,
                    k3_err *err) {
    const char *dev = o->device && *o->device ? o->device : "cpu";
    if (strcmp(dev, "cpu") && strcmp(dev, "cuda") && strcmp(dev, "auto"))
        return k3_fail_field(err, K3_ERR_USAGE, "device", " '%s': expected cpu, cuda or auto", dev);
    k3_backend *b = calloc(1, sizeof *b);
    if (!b) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    b->m = m;
    int rc = K3_OK;
#ifdef K3_WITH_CUDA
    char reason[256] = "";
    int have = k3_gpu_device_count(reason, sizeof reason) > 0;
    if (m->lm_head.dtype == K3_DT_BF16LX) { /* the lossless spine: CPU kernels only */
        have = 0;
        snprintf(reason, sizeof reason, "the lossless spine is decoded by the CPU kernels; "
                 "a BF16 spine runs on the GPU");
        if (!strcmp(dev, "cuda"))
            rc = k3_fail(err, K3_ERR_USAGE, "device cuda: %s", reason);
    }
    if (!rc && (!strcmp(dev, "cuda") || (!strcmp(dev, "auto") && have)))
        rc = open_cuda(b, o, strcmp(dev, "auto") ? "" : "auto picked the GPU: ", err);
    else if (!rc && !strcmp(dev, "auto"))
        snprintf(b->line, sizeof b->line, "device: cpu (auto: no usable CUDA device: %s)", reason);
    else
        snprintf(b->line, sizeof b->line, "device: cpu");
#else
    if (!strcmp(dev, "cuda"))
        rc = k3_fail_field(err, K3_ERR_DEVICE, "device", " 'cuda': this k3 was built without CUDA "
                     "(rebuild with make CUDA=1 where nvcc is installed)");
    snprintf(b->line, sizeof b->line, "device: cpu%s",
             strcmp(dev, "auto") ? "" : " (auto: this k3 was built without CUDA)");
#endif
    if (rc) {
        free(b);
        return rc;
    }
    *out = b;
    return K3_OK;
}

void k3_backend_close(k3_backend *b) {
    if (!b) return;
#ifdef K3_WITH_CUDA
    k3_gpu_close(b->gpu);
#endif
    free(b);
}

const char *k3_backend_name(const k3_backend *b) { return b->cuda ? "cuda" : "cpu"; }
const char *k3_backend_line(const k3_backend *b) { return b->line; }

int k3_backend_session_new(k3_backend *b, const k3_state *st, void **sess, k3_err *err) {
    *sess = NULL;
#ifdef K3_WITH_CUDA
    if (b->cuda)
        return k3_gpu_session_new(b->gpu, k3_state_max_ctx(st), (k3_gpu_session **)sess, err);
#endif
    (void)b, (void)st, (void)err;
    return K3_OK;
}

void k3_backend_session_free(k3_backend *b, void *sess) {
#ifdef K3_WITH_CUDA
    if (b && b->cuda) k3_gpu_session_free(sess);
#endif
    (void)b, (void)sess;
}

void k3_backend_session_reset(k3_backend *b, void *sess) {
#ifdef K3_WITH_CUDA
    if (b->cuda) k3_gpu_session_reset(sess);
#endif
    (void)b, (void)sess;
}

/* ---- the pass ------------------------------------------------------------------------------- */

struct k3_backend_scratch {
    k3_batch *batch;           /* the CPU's rows (NULL on a device backend) */
    k3_store_client *client;   /* asks the store for each MoE layer's union */
    k3_batch_seg *bsegs;       /* [max_rows] */
    int max_rows;
};

int k3_backend_scratch_new(k3_backend *b, int max_rows, k3_backend_scratch **out, k3_err *err) {
    k3_backend_scratch *sc = calloc(1, sizeof *sc);
    if (!sc) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    sc->max_rows = max_rows;
    int rc = K3_OK;
    if (!(sc->bsegs = calloc((size_t)max_rows, sizeof *sc->bsegs)) ||
        (!b->cuda && !(sc->batch = k3_batch_new(b->m, max_rows))))
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory for a %d-row pass", max_rows);
    if (!rc && !b->cuda && b->m->store) rc = k3_store_client_new(b->m->store, &sc->client, err);
    if (rc) {
        k3_backend_scratch_free(sc);
        return rc;
    }
    *out = sc;
    return K3_OK;
}

void k3_backend_scratch_free(k3_backend_scratch *sc) {
    if (!sc) return;
    k3_batch_free(sc->batch);
    k3_store_client_free(sc->client);
    free(sc->bsegs);
    free(sc);
}

uint64_t k3_backend_scratch_bytes(const k3_backend *b, int max_rows) {
    return sizeof(k3_backend_scratch) + (uint64_t)max_rows * sizeof(k3_batch_seg) +
           (b->cuda ? 0 : k3_batch_bytes(b->m, max_rows));
}

uint64_t k3_backend_scratch_experts(const k3_backend_scratch *sc) {
    return sc && sc->batch ? k3_batch_experts(sc->batch) : 0;
}

#ifdef K3_WITH_CUDA
/* Rows of logits a segment writes (K3_BATCH_* flags). */
static int seg_rows(const k3_backend_seg *g) {
    return g->flags & K3_BATCH_NO_LOGITS ? 0 : g->flags & K3_BATCH_ALL_LOGITS ? g->n : 1;
}

/* A device backend: segment after segment, id by id. */
static int cuda_pass(k3_backend *b, const k3_backend_seg *segs, int nseg, float *logits,
                     k3_err *err) {
    size_t vocab = (size_t)b->m->cfg.vocab_size;
    for (int i = 0; i < nseg; i++)
        if (segs[i].flags & K3_BATCH_REWINDABLE)
            return k3_fail(err, K3_ERR_USAGE, "this backend cannot rewind a pass");
    for (int i = 0; i < nseg; i++) {
        const k3_backend_seg *g = &segs[i];
        bool all = g->flags & K3_BATCH_ALL_LOGITS, none = g->flags & K3_BATCH_NO_LOGITS;
        for (int t = 0; t < g->n; t++) {
            float *row = !logits || none ? NULL : all ? logits + (size_t)t * vocab
                       : t + 1 == g->n ? logits : NULL;
            int rc = k3_gpu_step(g->sess, g->st, g->ids[t], row, g->trace, err);
            if (rc) return rc;
        }
        if (logits) logits += (size_t)seg_rows(g) * vocab;
    }
    return K3_OK;
}
#endif

int k3_backend_pass(k3_backend *b, k3_backend_scratch *sc, const k3_backend_seg *segs, int nseg,
                    float *logits, k3_err *err) {
#ifdef K3_WITH_CUDA
    if (b->cuda) return cuda_pass(b, segs, nseg, logits, err);
#endif
    const k3_backend_seg *g = &segs[0];
    if (nseg < 1 || (nseg > 1 && !sc))
        return k3_fail(err, K3_ERR_USAGE, "a pass of %d segments needs a scratch", nseg);
    if (nseg == 1 && g->n == 1 && !(g->flags & K3_BATCH_REWINDABLE)) /* the single step */
        return k3_forward(b->m, g->st, g->ids[0], g->flags & K3_BATCH_NO_LOGITS ? NULL : logits,
                          g->trace, err);
    if (!sc)
        return k3_forward_batch(b->m, g->st, g->ids, g->n,
                                g->flags & K3_BATCH_NO_LOGITS ? NULL : logits,
                                g->flags & (K3_BATCH_ALL_LOGITS | K3_BATCH_REWINDABLE), g->trace,
                                err);
    if (nseg > sc->max_rows)
        return k3_fail(err, K3_ERR_INPUT, "a pass of %d segments; the scratch holds %d rows",
                       nseg, sc->max_rows);
    for (int i = 0; i < nseg; i++)
        sc->bsegs[i] = (k3_batch_seg){.s = segs[i].st, .tokens = segs[i].ids, .n = segs[i].n,
                                      .flags = segs[i].flags, .trace = segs[i].trace};
    return k3_forward_multi(b->m, sc->batch, sc->client, sc->bsegs, nseg, logits, err);
}

int k3_backend_can_rewind(const k3_backend *b) { return !b->cuda; }

int k3_backend_rewind(k3_backend *b, void *sess, k3_state *st, int pos, k3_err *err) {
    (void)sess;
    if (!k3_backend_can_rewind(b))
        return k3_fail(err, K3_ERR_USAGE, "this backend cannot rewind a pass");
    return k3_state_rewind(b->m, st, pos, err);
}

int k3_backend_sync(k3_backend *b, void *sess, k3_state *st, int to_host, k3_err *err) {
#ifdef K3_WITH_CUDA
    if (b->cuda) return k3_gpu_sync_state(sess, st, to_host, err);
#endif
    (void)b, (void)sess, (void)st, (void)to_host, (void)err;
    return K3_OK;
}

int k3_backend_layer_profile(const k3_backend *b, double *ms, uint64_t *bytes, int layers) {
#ifdef K3_WITH_CUDA
    if (b->cuda) return k3_gpu_layer_profile(b->gpu, ms, bytes, layers);
#endif
    (void)b, (void)ms, (void)bytes, (void)layers;
    return 0;
}
