/* convcache.c — the state cache of kept conversations (worker.h; server.h "--state-cache"): a
 * session per conversation, the logits after its last fed token, what its state means as a
 * chat (a request continuing the last reply is spliced onto it), and with --state-dir the
 * conversations the cache drops spilled to state files and read back when they return. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    size_t kept = c->sess ? (size_t)k3_session_pos(c->sess) : c->n_ids;
    const int32_t *ids = c->sess ? k3_session_tokens(c->sess) : c->ids;
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
    if (c->file) unlink(c->file); /* a spilled state is a cache: it goes with the server */
    free(c->file);
    free(c->ids);
    *c = (k3_conv){0};
}

/* --state-dir: writes conversation c (in memory, holding ids) to a spill entry (an empty one,
 * else the least recently used; never `keep`) as a state file with its ids, logits and chat
 * meaning, so that a later request can still resume it. A failure (disk full) is logged and
 * the state is just dropped, as without --state-dir. */
static void spill_out(k3_server *s, k3_conv *c, const k3_conv *keep) {
    k3_worker_state *w = s->ws;
    size_t n = (size_t)k3_session_pos(c->sess);
    k3_conv *sp = NULL;
    for (int i = 0; i < w->n_spill; i++) {
        k3_conv *e = &w->spill[i];
        if (e != keep && (!sp || (sp->n_ids && (!e->n_ids || e->used < sp->used)))) sp = e;
    }
    if (!n || !sp) return;
    k3_err err = {0};
    sp->n_ids = 0; /* the entry's old state is overwritten */
    k3_last_chat_clear(&sp->last_chat);
    if (!sp->ids) sp->ids = malloc(c->virt_cap * sizeof *sp->ids);
    if (!sp->virt) sp->virt = malloc(c->virt_cap * sizeof *sp->virt);
    if (!sp->logits) sp->logits = malloc((size_t)w->vocab * sizeof *sp->logits);
    if (!sp->ids || !sp->virt || !sp->logits) {
        fprintf(stderr, "k3 serve: out of memory spilling a conversation state\n");
        return;
    }
    if (k3_session_save(c->sess, sp->file, &err)) {
        fprintf(stderr, "k3 serve: a conversation state was dropped: %s\n", err.msg);
        return;
    }
    memcpy(sp->ids, k3_session_tokens(c->sess), n * sizeof *sp->ids);
    sp->n_ids = n;
    memcpy(sp->logits, c->logits, (size_t)w->vocab * sizeof *sp->logits);
    sp->logits_valid = c->logits_valid;
    memcpy(sp->virt, c->virt, c->n_virt * sizeof *sp->virt);
    sp->n_virt = c->n_virt;
    sp->virt_cap = c->virt_cap;
    sp->virt_msgs = c->virt_msgs;
    sp->last_chat = c->last_chat; /* moved */
    c->last_chat = (k3_last_chat){0};
    c->virt_msgs = 0;
    sp->used = c->used;
    pthread_mutex_lock(&s->mu);
    s->metrics.state_spills++;
    pthread_mutex_unlock(&s->mu);
}

/* Loads spill entry sp into conversation c (whose own state was spilled or is empty); the
 * entry is then empty. Returns 0, or an error (the file could not be read back, or holds
 * other ids than the entry's, e.g. another server's sharing the folder: c is empty). */
static int spill_in(k3_server *s, k3_conv *sp, k3_conv *c, k3_err *err) {
    k3_worker_state *w = s->ws;
    int n = (int)sp->n_ids;
    sp->n_ids = 0; /* its state moves into c (or is lost with an unreadable file) */
    int rc = k3_session_load_prefix(c->sess, sp->file, sp->ids, n, err);
    if (rc) {
        k3_session_reset(c->sess);
        c->logits_valid = false;
        c->virt_msgs = 0;
        k3_last_chat_clear(&sp->last_chat);
        return rc;
    }
    memcpy(c->logits, sp->logits, (size_t)w->vocab * sizeof *c->logits);
    c->logits_valid = sp->logits_valid;
    memcpy(c->virt, sp->virt, sp->n_virt * sizeof *c->virt);
    c->n_virt = sp->n_virt;
    c->virt_msgs = sp->virt_msgs;
    k3_last_chat_clear(&c->last_chat);
    c->last_chat = sp->last_chat; /* moved */
    sp->last_chat = (k3_last_chat){0};
    pthread_mutex_lock(&s->mu);
    s->metrics.state_loads++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* Makes c a new, empty conversation of the state cache. */
int k3_kept_new(k3_server *s, k3_conv *c, k3_err *err) {
    *c = (k3_conv){0};
    int rc = k3_session_new(s->eng, s->o.ctx, &c->sess, err);
    if (rc) return rc;
    if (s->o.chunk) k3_session_set_chunk(c->sess, s->o.chunk);
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
 * recently used (its state is dropped, or with --state-dir spilled to a state file, and a
 * spilled conversation that covers a longer prefix is loaded back). A chat that continues a
 * kept reply has its prompt
 * spliced onto that conversation (spliced), also with --no-reuse (which then drops the
 * state: same prompts, same output). Conversations in use by other slots are not looked at.
 * Sets j->slot->c (marked busy) and returns the prompt ids reused, or -1 with err (no
 * session could be made). */
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
    k3_conv *from_disk = NULL; /* a spilled conversation that covers more */
    for (int i = 0; i < w->n_spill && !j->p.echo && !s->o.no_reuse; i++) {
        k3_conv *c = &w->spill[i];
        if (!c->n_ids) continue;
        size_t r = reusable(c, j->prompt, j->n_prompt), len = 0;
        int32_t *np = NULL;
        if (!r && j->p.kind == K3_SRV_CHAT && (np = spliced(s, c, j, &len)))
            r = reusable(c, np, len);
        if (r > best_n) {
            free(best_prompt);
            from_disk = c, best = NULL, best_n = r, best_prompt = np, best_len = len;
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
    if (!best_n || from_disk) {
        if (w->n_spill && !s->o.no_reuse) spill_out(s, best, from_disk);
        k3_session_reset(best->sess);
        best->logits_valid = false;
        best->virt_msgs = 0;
    }
    if (from_disk) {
        k3_err lerr = {0};
        if (spill_in(s, from_disk, best, &lerr)) {
            fprintf(stderr, "k3 serve: a spilled conversation state could not be read back "
                    "(prefilled instead): %s\n", lerr.msg);
            best_n = 0;
        }
    }
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

/* --state-dir: the spill entries and their file names: random, so that servers sharing the
 * folder (two containers whose k3 are both pid 1) never write each other's files (D12). */
int k3_spill_open(k3_server *s, k3_err *err) {
    k3_worker_state *w = s->ws;
    struct stat st;
    if (stat(s->o.state_dir, &st) || !S_ISDIR(st.st_mode) || access(s->o.state_dir, W_OK))
        return k3_fail(err, K3_ERR_USAGE, "state_dir %s: not a folder this process can write "
                       "(create it first)", s->o.state_dir);
    int n = s->o.state_files > 0 ? s->o.state_files : 8;
    if (!(w->spill = calloc((size_t)n, sizeof *w->spill)))
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    w->n_spill = n;
    char tag[33];
    int rc = k3_random_hex(tag, 16, err);
    if (rc) return rc;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(s->o.state_dir) + 64;
        if (!(w->spill[i].file = malloc(len))) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
        snprintf(w->spill[i].file, len, "%s/k3-serve-%s-%d.state", s->o.state_dir, tag, i);
    }
    return 0;
}
