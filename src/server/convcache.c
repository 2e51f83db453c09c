/* convcache.c — the state cache of kept conversations (worker.h; server.h "--state-cache"): a
 * session per conversation, the logits after its last fed token, what its state means as a
 * chat (a request continuing the last reply is spliced onto it); with --prompt-cache
 * (pcache.h) the conversations it drops are stored there and any longer stored prefix of a
 * prompt is restored into the conversation chosen for it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/fileio.h"
#include "worker.h"

void k3_last_chat_clear(k3_last_chat *c) {
    cJSON_Delete(c->messages);
    free(c->reasoning);
    free(c->content);
    *c = (k3_last_chat){0};
}

/* After a failed feed the state is unknown: the next job on c starts fresh. */
int k3_kept_feed_failed(k3_conv *c, int rc) {
    k3_session_reset(c->sess);
    c->logits_valid = false;
    c->virt_msgs = 0;
    return rc;
}

/* Prompt tokens whose state can be reused: the kept tokens must be a prefix of the prompt.
 * When they are the whole prompt, the saved logits of its last token are needed too. */
static size_t reusable(const k3_conv *c, const int32_t *prompt, size_t n) {
    size_t kept = (size_t)k3_session_pos(c->sess);
    const int32_t *ids = k3_session_tokens(c->sess);
    if (kept == 0 || kept > n) return 0;
    if (memcmp(ids, prompt, kept * sizeof *prompt)) return 0;
    if (kept == n && !c->logits_valid) return 0;
    return kept;
}

/* A string field equal to want; absent or null count as "". */
static bool field_is(const cJSON *m, const char *key, const char *want) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, key);
    if (!v || cJSON_IsNull(v)) return !want[0];
    return cJSON_IsString(v) && !strcmp(v->valuestring, want);
}

/* True when req's messages are the last request's, then our reply verbatim, then more. */
static bool continues_last(const k3_last_chat *c, const k3_chat_request *req) {
    int n = cJSON_GetArraySize(c->messages);
    if (!c->messages || cJSON_GetArraySize(req->messages) <= n) return false;
    if (req->thinking != c->thinking || strcmp(req->effort, c->effort) || req->tools ||
        req->response_format || strcmp(req->tool_choice ? req->tool_choice : "", c->tool_choice))
        return false;
    const cJSON *a = req->messages->child, *b = c->messages->child;
    for (; b; a = a->next, b = b->next)
        if (!cJSON_Compare(a, b, true)) return false;
    const cJSON *f;
    cJSON_ArrayForEach(f, a) { /* the reply: role, content, reasoning and nothing else */
        if (!strcmp(f->string, "role") || !strcmp(f->string, "content")) continue;
        if (strcmp(f->string, "reasoning_content") && strcmp(f->string, "reasoning"))
            return false;
        if (c->thinking && !field_is(a, f->string, c->reasoning)) return false;
    }
    if (c->thinking && c->reasoning[0] && !cJSON_GetObjectItemCaseSensitive(a, "reasoning") &&
        !cJSON_GetObjectItemCaseSensitive(a, "reasoning_content"))
        return false; /* the client dropped the thinking: the state does not match */
    return field_is(a, "role", "assistant") && field_is(a, "content", c->content);
}

/* A chat request that continues conversation c's last reply (continues_last). The model's
 * own tokens for the reply need not be the canonical encoding of the text the client saw, so
 * the prompt is rebuilt as the kept conversation (virt: what the state holds, the reply
 * closed as the renderer closes it) followed by the rendering of the new messages alone.
 * Returns that prompt (malloc'd, *n ids; c's kept tokens are its prefix), or NULL. */
static int32_t *spliced(k3_server *s, const k3_conv *c, const k3_job *j, size_t *n) {
    if (!c->virt_msgs || !continues_last(&c->last_chat, &j->req)) return NULL;
    k3_segments segs = {0};
    int32_t *cont = NULL, *np = NULL;
    size_t n_cont = 0;
    k3_err err;
    if (k3_chat_render(&j->req, c->virt_msgs + 1, &segs, &err) ||
        k3_segments_encode(k3_engine_tokenizer(s->eng), &segs, &cont, &n_cont, &err) ||
        n_cont > j->n_prompt)
        goto out;
    *n = c->n_virt + n_cont;
    /* Rendering is compositional (render.h): the continuation is the canonical tail. */
    if (memcmp(cont, j->prompt + j->n_prompt - n_cont, n_cont * sizeof *cont) ||
        *n > (size_t)s->ctx || !(np = malloc(*n * sizeof *np)))
        goto out;
    memcpy(np, c->virt, c->n_virt * sizeof *np);
    memcpy(np + c->n_virt, cont, n_cont * sizeof *np);
out:
    free(cont);
    k3_segments_free(&segs);
    return np;
}

void k3_kept_free(k3_conv *c) {
    k3_session_free(c->sess);
    k3_last_chat_clear(&c->last_chat);
    free(c->logits);
    free(c->virt);
    *c = (k3_conv){0};
}

/* --prompt-cache: what the cache did, into /metrics. */
void k3_pcache_count(k3_server *s, const k3_pcache_stats *st) {
    pthread_mutex_lock(&s->mu);
    k3_metrics *m = &s->metrics;
    m->pcache_hits += st->hits;
    m->pcache_ram_hits += st->ram_hits;
    m->pcache_tokens += st->tokens_restored;
    m->pcache_bytes_read += st->bytes_read;
    m->pcache_saves += st->saves;
    m->pcache_bytes_written += st->bytes_written;
    m->pcache_evicted += st->evicted;
    m->pcache_skipped += st->skipped;
    m->pcache_read_s += st->read_s;
    m->pcache_write_s += st->write_s;
    pthread_mutex_unlock(&s->mu);
}

/* --prompt-cache: after the pick, a stored prefix of the prompt longer than the kept one (at
 * most all ids but the last: the logits after it come from the prefill) is restored into
 * c's session. Returns the prompt ids now reused. */
static size_t from_pcache(k3_server *s, k3_conv *c, const k3_job *j, size_t kept) {
    k3_pcache_stats st = {0};
    size_t r = k3_pcache_restore(s->ws->pc, c->sess, j->prompt, j->n_prompt, kept,
                                 j->n_prompt - 1, &st);
    k3_pcache_count(s, &st);
    if (r) {
        c->logits_valid = false;
        c->virt_msgs = 0;
        return r;
    }
    if ((size_t)k3_session_pos(c->sess) != kept) { /* a file failed after the session was
                                                       touched: it was reset */
        k3_session_reset(c->sess);
        c->logits_valid = false;
        c->virt_msgs = 0;
        return 0;
    }
    return kept;
}

/* Makes c a new, empty conversation of the state cache. */
int k3_kept_new(k3_server *s, k3_conv *c, k3_err *err) {
    *c = (k3_conv){0};
    int rc = k3_session_new(s->eng, s->o.ctx, &c->sess, err);
    if (rc) return rc;
    if (s->o.chunk) k3_session_set_chunk(c->sess, s->o.chunk);
    k3_session_set_trace(c->sess, &s->ws->trace); /* an abandoned pass stops (sched.c) */
    c->logits = malloc((size_t)s->ws->vocab * sizeof *c->logits);
    c->virt_cap = (size_t)k3_session_max_ctx(c->sess) + 64; /* + the last id and a reply's
                                                              closing markers */
    c->virt = malloc(c->virt_cap * sizeof *c->virt);
    if (!c->logits || !c->virt) {
        k3_kept_free(c);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    return 0;
}

/* The state cache's choice for job j: the kept conversation that covers the longest prefix
 * of its prompt (a conversation's kept tokens must be a prefix of the prompt: the KDA
 * recurrence cannot be rewound), else a new one while the cache has room, else the least
 * recently used (its state is dropped; with --prompt-cache it is stored there first, so a
 * request continuing it later finds it by prefix). With --prompt-cache a stored snapshot
 * covering a longer prefix (from any conversation or process) is then restored into the
 * chosen conversation. A chat that continues a kept reply has its prompt spliced onto that
 * conversation (spliced), also with --no-reuse (which then drops the state: same prompts, same
 * output). Conversations in use by other slots are not looked at. Sets j->slot->c (marked
 * busy) and returns the prompt ids reused, or -1 with err (no session could be made). */
long k3_kept_pick(k3_server *s, k3_job *j, k3_err *err) {
    k3_worker_state *w = s->ws;
    k3_conv *best = NULL;
    size_t best_n = 0, best_len = 0;
    int32_t *best_prompt = NULL;
    for (int i = 0; i < w->n_convs && !j->p.echo; i++) {
        k3_conv *c = &w->convs[i];
        if (c->busy) continue;
        size_t r = reusable(c, j->prompt, j->n_prompt), len = 0;
        int32_t *np = NULL;
        if (!r && j->p.kind == K3_SRV_CHAT && (np = spliced(s, c, j, &len)))
            r = reusable(c, np, len);
        if (r > best_n) {
            free(best_prompt);
            best = c, best_n = r, best_prompt = np, best_len = len;
        } else {
            free(np);
        }
    }
    if (best_prompt) {
        free(j->prompt);
        j->prompt = best_prompt;
        j->n_prompt = best_len;
    }
    if (s->o.no_reuse) best_n = 0; /* the prompt is built the same way, the state is not used */
    if (!best && w->n_convs < w->cap_convs) {
        if (k3_kept_new(s, &w->convs[w->n_convs], err)) return -1;
        best = &w->convs[w->n_convs++];
    }
    bool fresh = best != NULL;
    for (int i = 0; !fresh && i < w->n_convs; i++) /* the least recently used not in use */
        if (!w->convs[i].busy && (!best || w->convs[i].used < best->used)) best = &w->convs[i];
    if (!best) return k3_fail(err, K3_ERR_GENERIC, "no free conversation state"), -1;
    if (!best_n) {
        if (w->pc && !s->o.no_reuse && k3_session_pos(best->sess) > 0) { /* kept on disk */
            k3_pcache_stats st = {0};
            k3_pcache_save(w->pc, best->sess, &st);
            k3_pcache_count(s, &st);
        }
        k3_session_reset(best->sess);
        best->logits_valid = false;
        best->virt_msgs = 0;
    }
    if (w->pc && !j->p.echo && !s->o.no_reuse && j->n_prompt > 1)
        best_n = from_pcache(s, best, j, best_n);
    j->slot->c = best;
    best->busy = true;
    best->used = ++w->clock;
    return (long)best_n;
}

/* After a chat reply: what the state means as a conversation, for spliced(). */
void k3_kept_remember_reply(k3_server *s, k3_job *j) {
    k3_slot *w = j->slot;
    k3_last_chat *c = &w->c->last_chat;
    const k3_reply_parser *p = &w->parser;
    int32_t *closing = NULL;
    size_t n_closing = 0;
    k3_err err;
    if (p->text[K3_CH_TOOLS].n || k3_reply_parser_closing(p, &closing, &n_closing, &err)) return;
    bool last = !k3_stops_has(&s->ws->stops, w->last);
    size_t kept = (size_t)k3_session_pos(w->c->sess), n = kept + last + n_closing;
    c->messages = cJSON_Duplicate(j->req.messages, true);
    c->reasoning = strdup(p->text[K3_CH_THINK].p ? p->text[K3_CH_THINK].p : "");
    c->content = strdup(p->text[K3_CH_RESPONSE].p ? p->text[K3_CH_RESPONSE].p : "");
    if (n > w->c->virt_cap || !c->messages || !c->reasoning || !c->content ||
        p->text[K3_CH_THINK].oom || p->text[K3_CH_RESPONSE].oom) {
        k3_last_chat_clear(c);
    } else {
        c->thinking = j->req.thinking;
        snprintf(c->effort, sizeof c->effort, "%s", j->req.effort);
        snprintf(c->tool_choice, sizeof c->tool_choice, "%s",
                 j->req.tool_choice ? j->req.tool_choice : "");
        memcpy(w->c->virt, k3_session_tokens(w->c->sess), kept * sizeof *w->c->virt);
        if (last) w->c->virt[kept] = w->last;
        memcpy(w->c->virt + kept + last, closing, n_closing * sizeof *closing);
        w->c->n_virt = n;
        w->c->virt_msgs = (size_t)cJSON_GetArraySize(j->req.messages);
    }
    free(closing);
}
