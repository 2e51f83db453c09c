/* engine.c — k3_engine (loaded model) and k3_session (one timeline), see k3.h. */
#include "k3.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../format/safetensors.h"
#include "../model/model.h"
#include "../tok/tokenizer.h"

struct k3_engine {
    k3_config cfg;
    k3_checkpoint *ck;
    k3_model model;
    k3_tokenizer *tok;
};

struct k3_session {
    const k3_engine *e;
    k3_state *state;
    k3_trace trace;
    int has_trace;
};

int k3_engine_load(const char *model_dir, const k3_engine_opts *opts, k3_engine **out,
                   k3_err *err) {
    k3_engine *e = calloc(1, sizeof *e);
    if (!e) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    if (opts && opts->threads > 0) omp_set_num_threads(opts->threads);
    int rc = k3_config_load(model_dir, &e->cfg, err);
    if (!rc) rc = k3_tokenizer_load(model_dir, &e->tok, err);
    if (!rc && k3_tokenizer_vocab_size(e->tok) > e->cfg.vocab_size)
        rc = k3_fail(err, K3_ERR_CONFIG, "%s: tokenizer has %d ids but config.json vocab_size "
                     "is %d", model_dir, k3_tokenizer_vocab_size(e->tok), e->cfg.vocab_size);
    if (!rc) rc = k3_checkpoint_open(model_dir, &e->ck, err);
    if (!rc) rc = k3_model_bind(&e->model, &e->cfg, e->ck, err);
    if (rc) {
        k3_engine_free(e);
        return rc;
    }
    if (opts && opts->verbose)
        fprintf(stderr, "k3: loaded %s: %d layers (%d KDA, %d MLA), hidden %d, %d experts "
                "(top-%d), spine %.3f GB + experts %.3f GB mapped from %d shard(s)%s, "
                "%d threads\n", model_dir, e->cfg.num_hidden_layers, e->model.n_kda,
                e->model.n_mla, e->cfg.hidden_size, e->cfg.num_experts,
                e->cfg.num_experts_per_token, (double)e->model.spine_bytes / 1e9,
                (double)e->model.expert_bytes / 1e9, e->ck->n_shards,
                e->ck->n_skipped_shards ? " (vision-only shards skipped)" : "",
                omp_get_max_threads());
    *out = e;
    return K3_OK;
}

void k3_engine_free(k3_engine *e) {
    if (!e) return;
    k3_model_free(&e->model);
    k3_checkpoint_close(e->ck);
    k3_tokenizer_free(e->tok);
    free(e);
}

const k3_config *k3_engine_config(const k3_engine *e) { return &e->cfg; }
const k3_tokenizer *k3_engine_tokenizer(const k3_engine *e) { return e->tok; }
uint64_t k3_engine_weight_bytes(const k3_engine *e) {
    return e->model.spine_bytes + e->model.expert_bytes;
}

int k3_session_new(const k3_engine *e, int max_ctx, k3_session **out, k3_err *err) {
    k3_session *s = calloc(1, sizeof *s);
    if (!s) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    s->e = e;
    int rc = k3_state_new(&e->model, max_ctx, &s->state, err);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return K3_OK;
}

void k3_session_free(k3_session *s) {
    if (!s) return;
    k3_state_free(s->state);
    free(s);
}

void k3_session_reset(k3_session *s) { k3_state_reset(s->state); }
int k3_session_pos(const k3_session *s) { return k3_state_pos(s->state); }
int k3_session_max_ctx(const k3_session *s) { return k3_state_max_ctx(s->state); }

void k3_session_set_trace(k3_session *s, const k3_trace *trace) {
    s->has_trace = trace != NULL;
    if (trace) s->trace = *trace;
}

int k3_session_step(k3_session *s, int32_t token, float *logits, k3_err *err) {
    const k3_config *c = &s->e->cfg;
    if (token < 0 || token >= c->vocab_size)
        return k3_fail(err, K3_ERR_INPUT, "token id %d is outside the vocabulary [0, %d)",
                       token, c->vocab_size);
    if (k3_state_pos(s->state) >= k3_state_max_ctx(s->state))
        return k3_fail(err, K3_ERR_INPUT, "the context is full (%d positions); start a new "
                       "session or raise --ctx", k3_state_max_ctx(s->state));
    k3_forward(&s->e->model, s->state, token, logits, s->has_trace ? &s->trace : NULL);
    return K3_OK;
}
