/* worker.c — admission (N slots + a bounded FIFO), the worker thread that owns every
 * session, the state cache of kept conversations, and the scheduler that runs the slots'
 * generations in shared passes.
 *
 * The worker is the only thread that touches the sessions (whose token histories,
 * k3_session_tokens, are what "kept" means below), the logits buffers and the multistep.
 * Connection threads hand it jobs through s->head/tail under s->mu and wait on s->progress;
 * it signals s->progress after every change a connection may wait for.
 *
 * A round of the scheduler (run_round) is one k3_multistep pass: each decoding slot's next
 * id (chosen by the one generation loop, k3_gen_next / k3_gen_fed: the stop rules of
 * src/engine/generate.h) and the prompt chunks of the prefilling slots that fit the row
 * budget. The hooks look at each client's socket before its rows join a pass (a hang-up
 * cancels before the next one) and turn ids into the reply's text.
 *
 * A slow streaming client (see "slow clients" below) never makes the worker wait: its slot
 * sits out the rounds while its unread backlog is over the limit (opts.stream_backlog).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* POLLRDHUP; the Makefile passes it too, but not every build does */
#endif
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../chat/parse.h"
#include "../engine/generate.h"
#include "../chat/toolcall.h"
#include "../engine/sampler.h"
#include "../engine/spec.h"
#include "../tok/tokenizer.h"
#include "../util/fileio.h"
#include "srv.h"
#include "../util/clock.h"

/* The last chat reply, kept so that a request continuing it can reuse the state. */
typedef struct k3_last_chat {
    cJSON *messages;             /* the request's messages (a copy), or NULL = none */
    bool thinking;
    char effort[8], tool_choice[16];
    char *reasoning, *content;   /* the reply as the client saw it (before stop strings) */
} k3_last_chat;

static void last_chat_clear(k3_last_chat *c) {
    cJSON_Delete(c->messages);
    free(c->reasoning);
    free(c->content);
    *c = (k3_last_chat){0};
}

/* One kept conversation (the state cache, server.h): a session, the logits after its last
 * fed token, and what its state means as a chat. */
typedef struct k3_conv {
    k3_session *sess;
    float *logits;        /* vocab_size floats: the logits after the last fed token */
    bool logits_valid;    /* logits belong to the last token the session holds */
    /* The last chat reply as a conversation: kept + the unfed last id + the closing ids of
     * the reply (k3_reply_parser_closing); virt_msgs = messages of that request, 0 = none. */
    int32_t *virt;
    size_t n_virt, virt_cap, virt_msgs;
    k3_last_chat last_chat;
    unsigned long long used; /* when a job last ran on it (k3_worker_state.clock); 0 never */
    bool busy;               /* a slot runs a job on it */
    /* A conversation spilled to disk (--state-dir; sess is NULL): its state file and the ids
     * it holds (n_ids = 0: an empty spill entry). */
    char *file;
    int32_t *ids;
    size_t n_ids;
} k3_conv;

/* The job and its server, for the generation loop's hooks (the job's slot: j->slot). */
typedef struct job_ctx {
    k3_server *s;
    k3_job *j;
} job_ctx;

/* One running generation (--parallel N: N slots): its conversation and per-job state. */
typedef struct k3_slot {
    k3_job *j;            /* the job it runs; NULL = free */
    k3_conv *c;           /* the conversation (session) the job runs on */
    job_ctx ctx;          /* k3_gen_io.user */
    enum { K3_SLOT_FREE, K3_SLOT_PREFILL, K3_SLOT_DECODE } phase;
    unsigned long long admitted; /* admission order: prefill chunks go to the oldest first */
    unsigned long long round;    /* the last round that gave it a prefill chunk */
    bool batched;         /* its decode rows join the multistep pass (not with --spec) */
    int32_t next;         /* decode: the id k3_gen_next chose, fed in the next pass */
    k3_gen g;             /* decode */
    bool done;            /* the job ends after this round (finished, cancelled, failed) */
    bool waiting;         /* decode: sits out this round, its streaming client is behind */
    double wait_since;    /* ... since when (monotonic seconds), for o.stall_timeout_s */
    bool failed;          /* ... because it failed (err) */
    k3_err err;
    int32_t last;         /* the last sampled id (never fed) */
    k3_sampler sampler;
    k3_spec spec;         /* --spec (max_draft 0 = off), set up per job with the sampler */
    k3_reply_parser parser;
    k3_toolcall_parser tc;/* chat with tools: the reply's tools block (toolcall.h) */
    bool tc_entered;      /* the reply reached its tools block */
    size_t tc_sent;       /* calls of tc already given to the emitter */
    int32_t *script_cur;  /* test-only: this generation's scripted reply */
    size_t script_cur_len, script_at;
    k3_detok_stream ds;   /* raw completions */
    char *text;           /* one push of visible text */
    size_t text_cap;
    k3_emitter *em;
} k3_slot;

typedef struct k3_worker_state {
    /* The state cache: cap_convs conversations at most (>= the slots, so a free slot always
     * finds one not in use), created as needed (n_convs so far). */
    k3_conv *convs;
    int n_convs, cap_convs;
    /* --state-dir: conversations the cache dropped, spilled as state files (k3_session_save),
     * n_spill entries at most (--state-files), the least recently used overwritten. */
    k3_conv *spill;
    int n_spill;
    unsigned long long clock;
    k3_slot *slots;
    int n_slots;
    unsigned long long admissions, rounds;
    /* The pass: segments of the slots' rows, their logits rows [n_slots][vocab], and which
     * slot each segment is (k3_multistep_run; rows budget: the chunk + one per slot). */
    k3_multistep *ms;
    k3_multistep_seg *segs;
    k3_slot **seg_slot;
    float *rows;
    int max_rows;
    int chunk;            /* prompt ids per prefill pass, over all prefilling slots */
    int vocab;
    k3_stops stops;       /* end-of-message ids */
    /* Test-only scripted replies (k3_server_opts.scripted_reply): generation i takes the ids
     * of reply i % n_script instead of sampling, then the end-of-message id. */
    int32_t **script;
    size_t *script_len, n_script, script_next;
} k3_worker_state;

/* ---- admission -------------------------------------------------------------------------- */

int k3_job_submit(k3_server *s, k3_job *j, k3_api_error *e) {
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return k3_api_fail(e, 503, "server_error", NULL, NULL, "the server is shutting down");
    }
    int busy = s->n_active + s->n_queued;
    if (busy >= s->slots + s->o.queue) {
        pthread_mutex_unlock(&s->mu);
        if (s->o.queue)
            return k3_api_fail(e, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
                               "k3 is generating and its queue of %d is full; retry later",
                               s->o.queue);
        if (s->slots > 1)
            return k3_api_fail(e, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
                               "k3 is generating %d replies (--parallel %d); retry later",
                               s->slots, s->slots);
        return k3_api_fail(e, 429, "rate_limit_error", "rate_limit_exceeded", NULL,
                           "k3 is generating another reply (one at a time); retry later");
    }
    j->state = K3_JOB_QUEUED;
    j->next = NULL;
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    s->n_queued++;
    s->n_requests++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void k3_job_cancel_locked(k3_server *s, k3_job *j) {
    j->cancel = true;
    if (j->state != K3_JOB_QUEUED) return;
    k3_job **pp = &s->head, *prev = NULL;
    while (*pp && *pp != j) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (*pp) {
        *pp = j->next;
        if (s->tail == j) s->tail = prev;
        s->n_queued--;
    }
    j->state = K3_JOB_DONE;
    pthread_cond_broadcast(&s->progress);
}

void k3_job_wait_done(k3_server *s, k3_job *j, bool cancel) {
    pthread_mutex_lock(&s->mu);
    if (cancel) k3_job_cancel_locked(s, j);
    while (j->state != K3_JOB_DONE) pthread_cond_wait(&s->progress, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

void k3_job_free(k3_job *j) {
    if (!j) return;
    k3_srv_params_free(&j->p);
    cJSON_Delete(j->root);
    free(j->prompt);
    k3_sbuf_free(&j->out);
    k3_sbuf_free(&j->content);
    k3_sbuf_free(&j->reasoning);
    k3_sbuf_free(&j->tool_calls);
    k3_logprobs_free(&j->lp);
    free(j);
}

static short poll_now(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    int r;
    do r = poll(&p, 1, 0);
    while (r < 0 && errno == EINTR);
    return r > 0 ? p.revents : 0;
}

/* A FIN alone (POLLRDHUP) is also what a client that half-closes after its request sends
 * (issue 20, D6): only a reset or a dead socket says the client is gone. */
bool k3_srv_client_gone(int fd) { return poll_now(fd) & (POLLHUP | POLLERR | POLLNVAL); }

bool k3_srv_client_read_closed(int fd) { return poll_now(fd) & POLLRDHUP; }

bool k3_job_client_gone(const k3_job *j) {
    short ev = poll_now(j->fd);
    return (ev & (POLLHUP | POLLERR | POLLNVAL)) || (j->fin_gone && (ev & POLLRDHUP));
}

/* True when the job must end now: its client hung up, or the server is stopping. */
static bool job_abandoned(k3_server *s, k3_job *j) {
    pthread_mutex_lock(&s->mu);
    bool stop = j->cancel || s->stopping;
    pthread_mutex_unlock(&s->mu);
    if (!stop && k3_job_client_gone(j)) stop = true;
    return stop;
}

/* ---- one generation ------------------------------------------------------------------------ */

/* After a failed feed the state is unknown: the next job on c starts fresh. */
static int feed_failed(k3_conv *c, int rc) {
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

static void conv_free(k3_conv *c) {
    k3_session_free(c->sess);
    last_chat_clear(&c->last_chat);
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
    last_chat_clear(&sp->last_chat);
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
        last_chat_clear(&sp->last_chat);
        return rc;
    }
    memcpy(c->logits, sp->logits, (size_t)w->vocab * sizeof *c->logits);
    c->logits_valid = sp->logits_valid;
    memcpy(c->virt, sp->virt, sp->n_virt * sizeof *c->virt);
    c->n_virt = sp->n_virt;
    c->virt_msgs = sp->virt_msgs;
    last_chat_clear(&c->last_chat);
    c->last_chat = sp->last_chat; /* moved */
    sp->last_chat = (k3_last_chat){0};
    pthread_mutex_lock(&s->mu);
    s->metrics.state_loads++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* Makes c a new, empty conversation of the state cache. */
static int conv_new(k3_server *s, k3_conv *c, k3_err *err) {
    *c = (k3_conv){0};
    int rc = k3_session_new(s->eng, s->o.ctx, &c->sess, err);
    if (rc) return rc;
    if (s->o.chunk) k3_session_set_chunk(c->sess, s->o.chunk);
    c->logits = malloc((size_t)s->ws->vocab * sizeof *c->logits);
    c->virt_cap = (size_t)k3_session_max_ctx(c->sess) + 64; /* + the last id and a reply's
                                                              closing markers */
    c->virt = malloc(c->virt_cap * sizeof *c->virt);
    if (!c->logits || !c->virt) {
        conv_free(c);
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
static long pick_conv(k3_server *s, k3_job *j, k3_err *err) {
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
        if (conv_new(s, &w->convs[w->n_convs], err)) return -1;
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

/* One forward pass of `rows` token rows that session sess was in, for /metrics: its rows
 * and the time it waited for expert reads (the session's last step is that pass; a shared
 * pass is counted once, not once per session in it). */
static void count_pass(k3_server *s, int rows, const k3_session *sess) {
    k3_run_stats st;
    k3_session_stats(sess, &st);
    pthread_mutex_lock(&s->mu);
    k3_metrics_pass(&s->metrics, rows);
    s->metrics.expert_wait_s += st.last.eload_s;
    pthread_mutex_unlock(&s->mu);
}

/* Completions with echo: the whole prompt is prefilled with the logits of every position, so
 * each prompt token gets its logprob (the first none); the text is given back first. It runs
 * on its own session in passes of K3_DEFAULT_CHUNK, the other slots waiting meanwhile.
 * Returns 1 when abandoned, 0 done, -1 failed (err). */
static int prefill_echo(k3_server *s, k3_job *j, k3_err *err) {
    k3_slot *w = j->slot;
    int vocab = s->ws->vocab;
    const k3_tokenizer *tok = k3_engine_tokenizer(s->eng);
    char *text = NULL;
    size_t len = 0;
    if (k3_tokenizer_decode(tok, j->prompt, j->n_prompt, &text, &len, err)) return -1;
    k3_sbuf_add(&j->content, text, len);
    free(text);
    float *rows = malloc((size_t)K3_DEFAULT_CHUNK * (size_t)vocab * sizeof *rows);
    if (!rows) {
        k3_fail(err, K3_ERR_GENERIC, "out of memory");
        return -1;
    }
    k3_session_reset(w->c->sess);
    if (j->p.logprobs) k3_logprobs_add(&j->lp, tok, NULL, vocab, j->prompt[0], 0, false);
    int rc = 0;
    for (size_t i = 0; i < j->n_prompt && !rc;) {
        if (job_abandoned(s, j)) {
            rc = 1;
            break;
        }
        size_t n = j->n_prompt - i < K3_DEFAULT_CHUNK ? j->n_prompt - i : K3_DEFAULT_CHUNK;
        if ((rc = k3_session_forward(w->c->sess, j->prompt + i, (int)n, rows, K3_FWD_ALL_LOGITS,
                                     err))) {
            feed_failed(w->c, rc);
            rc = -1;
            break;
        }
        count_pass(s, (int)n, w->c->sess);
        for (size_t r = 0; r < n && i + r + 1 < j->n_prompt && j->p.logprobs; r++)
            k3_logprobs_add(&j->lp, tok, rows + r * (size_t)vocab, vocab, j->prompt[i + r + 1],
                            j->p.top_logprobs, false);
        memcpy(w->c->logits, rows + (n - 1) * (size_t)vocab, (size_t)vocab * sizeof *rows);
        i += n;
    }
    free(rows);
    w->c->logits_valid = rc == 0;
    return rc;
}

/* Chat with tools: gives the tools block's ids to the tool-call parser and each call it
 * completes to the emitter. */
static void take_tools(k3_slot *w, enum k3_reply_pos before, int32_t id) {
    if (!k3_toolcall_in_block(&w->parser, before, id)) return;
    w->tc_entered = true;
    k3_toolcall_push(&w->tc, &id, 1);
    for (; w->tc_sent < w->tc.n_calls; w->tc_sent++) {
        const k3_tool_call *c = &w->tc.calls[w->tc_sent];
        k3_emit_tool_call(w->em, (int)w->tc_sent, c->name, c->arguments.p, c->piece_ends,
                          c->n_pieces);
    }
}

/* Turns one sampled id into visible text (through the channel parser for chat) and emits
 * it. Returns true when a stop string matched. */
static bool show(k3_server *s, k3_job *j, int32_t id, bool cut) {
    k3_slot *w = j->slot;
    int len;
    int ch = 0;
    if (j->p.kind == K3_SRV_CHAT) {
        enum k3_channel c;
        enum k3_reply_pos before = w->parser.pos;
        len = cut ? k3_reply_parser_finish(&w->parser, w->text, w->text_cap, &c)
                  : k3_reply_parser_push(&w->parser, id, w->text, w->text_cap, &c);
        ch = c == K3_CH_THINK;
        if (j->p.tools) { /* the block becomes tool calls; without tools it shows as content */
            if (!cut) take_tools(w, before, id);
            if (c == K3_CH_TOOLS) len = 0;
        }
    } else if (cut) {
        len = k3_detok_stream_flush(&w->ds, w->text, w->text_cap);
    } else {
        len = k3_stops_has(&s->ws->stops, id) ? 0
              : k3_detok_stream_push(k3_engine_tokenizer(s->eng), &w->ds, id, w->text,
                                     w->text_cap);
    }
    return len > 0 && k3_emit_text(w->em, ch, w->text, (size_t)len);
}

/* After a chat reply with tools: the finish reason says what the tools block became, and a
 * malformed or cut block's text (from its first incomplete call) is given back as content. */
static const char *end_tools(k3_job *j, const char *finish) {
    k3_slot *w = j->slot;
    if (!w->tc_entered) return finish;
    const k3_toolcall_parser *tc = &w->tc;
    if (k3_toolcall_finish(&w->tc)) {
        snprintf(j->tool_error, sizeof j->tool_error, "out of memory in the tools block");
    } else if (tc->status == K3_TOOLCALL_MALFORMED ||
               (tc->status == K3_TOOLCALL_CUT && tc->rest[0])) {
        /* (a block cut right after a complete call — parallel_tool_calls false — is fine) */
        snprintf(j->tool_error, sizeof j->tool_error, "%s", tc->reason);
        k3_emit_text(w->em, 0, tc->rest, strlen(tc->rest));
    }
    if (j->tool_error[0]) {
        fprintf(stderr, "k3 serve: %s: malformed tool call: %s\n", j->id, j->tool_error);
        return !strcmp(finish, "length") ? finish : "malformed_tool_call";
    }
    return tc->n_calls ? "tool_calls" : finish;
}

/* The logprobs of the id just chosen from the slot's logits: kept for the reply, or
 * streamed. */
static void add_logprobs(k3_server *s, k3_job *j, int32_t id) {
    k3_slot *w = j->slot;
    int vocab = s->ws->vocab;
    bool chat = j->p.kind == K3_SRV_CHAT;
    const k3_tokenizer *tok = k3_engine_tokenizer(s->eng);
    if (!j->p.stream) {
        k3_logprobs_add(&j->lp, tok, w->c->logits, vocab, id, j->p.top_logprobs, chat);
        return;
    }
    k3_logprobs one = {.offset = j->lp.offset}; /* text_offset continues over the reply */
    k3_logprobs_add(&one, tok, w->c->logits, vocab, id, j->p.top_logprobs, chat);
    j->lp.offset = one.offset;
    k3_emit_logprobs(w->em, &one);
    k3_logprobs_free(&one);
}

/* k3_gen_io.emit: counts the id and shows it; true when a stop string matched. */
static bool take(void *user, int32_t id) {
    job_ctx *c = user;
    k3_slot *w = c->j->slot;
    w->last = id;
    c->j->n_completion++;
    if (c->j->p.kind == K3_SRV_CHAT && w->parser.pos == K3_IN_THINK) c->j->n_reasoning++;
    if (c->j->p.logprobs && !k3_stops_has(&c->s->ws->stops, id)) /* the logits it came from */
        add_logprobs(c->s, c->j, id);
    if (c->s->o.token_delay_s > 0) poll(NULL, 0, (int)(c->s->o.token_delay_s * 1e3)); /* tests */
    if (show(c->s, c->j, id, false)) return true;
    /* parallel_tool_calls false: the reply ends after its first complete call */
    return c->j->p.tools && !c->j->p.parallel_tool_calls && w->tc.n_calls;
}

/* k3_gen_io.choose, test-only: the scripted reply, then the end of the message. */
static bool scripted(void *user, int32_t *id) {
    job_ctx *c = user;
    k3_slot *w = c->j->slot;
    *id = w->script_at < w->script_cur_len ? w->script_cur[w->script_at++]
                                           : c->s->ws->stops.ids[0];
    return true;
}

/* k3_gen_io.fed of a slot stepped alone (--spec): one pass per id kept (a verification pass
 * counts once per id it keeps). Batched slots are counted per multistep pass instead. */
static int fed_alone(void *user, const float *logits, k3_err *err) {
    (void)logits, (void)err;
    job_ctx *c = user;
    count_pass(c->s, 1, c->j->slot->c->sess);
    return 0;
}

/* k3_gen_io.cancelled */
static bool cancelled(void *user) {
    job_ctx *c = user;
    return job_abandoned(c->s, c->j);
}

/* After a chat reply: what the state means as a conversation, for spliced(). */
static void remember_reply(k3_server *s, k3_job *j) {
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
        last_chat_clear(c);
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

static uint64_t fresh_seed(void) {
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, 0) == sizeof seed) return seed;
    return (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
}

static int start_sampling(k3_server *s, k3_job *j, k3_err *err) {
    k3_slot *w = j->slot;
    k3_worker_state *ws = s->ws;
    const k3_srv_params *p = &j->p;
    k3_sampler_opts so = {.temperature = p->top_p == 0 ? 0 : p->temperature,
                          .top_p = p->top_p == 0 ? 1 : p->top_p,
                          .top_k = p->top_k,
                          .seed = p->has_seed ? p->seed : fresh_seed()};
    k3_sampler_free(&w->sampler);
    k3_spec_free(&w->spec);
    int rc = k3_sampler_init(&w->sampler, &so, ws->vocab, err);
    /* logprobs need the logits of every taken id: no speculation (drafts skip them) */
    if (!rc) rc = k3_spec_init(&w->spec, p->logprobs ? 0 : s->o.spec, w->c->sess, &w->sampler, err);
    k3_reply_parser_free(&w->parser);
    k3_reply_parser_init(&w->parser, k3_engine_tokenizer(s->eng), &ws->stops, p->thinking);
    k3_toolcall_parser_free(&w->tc);
    k3_toolcall_parser_init(&w->tc, k3_engine_tokenizer(s->eng));
    w->tc_entered = false;
    w->tc_sent = 0;
    w->ds = (k3_detok_stream){0};
    if (ws->n_script) { /* test-only: this generation's scripted reply */
        size_t k = ws->script_next++ % ws->n_script;
        w->script_cur = ws->script[k];
        w->script_cur_len = ws->script_len[k];
        w->script_at = 0;
    }
    return rc;
}

/* ---- the scheduler ------------------------------------------------------------------------------
 * Jobs are admitted into free slots in arrival order. Each round builds one multistep pass
 * (k3.h: several sessions in one pass) of every decoding slot's next id and, within the row
 * budget left, the next prompt chunk of the prefilling slots, oldest first: a long prefill
 * joins passes beside the others' decode rows instead of stalling them. Each row of a pass is
 * bit-identical to feeding its session alone, so a job's ids and text do not depend on what
 * else runs. A job that ends (stop, cancel, failure: a segment fails alone) leaves its slot
 * between passes; the others go on untouched. Slots with --spec step alone (k3_gen_step). */

/* Decode starts: the session holds the whole prompt and its logits are in w->c->logits. */
static void start_decode(k3_server *s, k3_slot *w) {
    k3_job *j = w->j;
    int limit = j->p.max_tokens ? j->p.max_tokens : s->o.max_tokens; /* 0 = none */
    j->t_decode = k3_now_s(); /* prefill time vs decode speed, for /health */
    w->c->logits_valid = true;
    /* drafts skip the logits logprobs read; scripted replies choose their own ids */
    bool spec = !j->p.logprobs && !s->ws->n_script && w->spec.max_draft > 0;
    w->batched = !spec;
    k3_gen_start(&w->g, w->c->sess, &w->sampler, w->c->logits,
                 &(k3_gen_params){.max_new = limit ? limit : -1, .stops = &s->ws->stops,
                                  .spec = spec ? &w->spec : NULL},
                 &(k3_gen_io){.user = &w->ctx, .emit = take, .cancelled = cancelled,
                              .fed = spec ? fed_alone : NULL,
                              .choose = s->ws->n_script ? scripted : NULL});
    w->phase = K3_SLOT_DECODE;
}

static void slot_failed(k3_slot *w) {
    w->failed = true;
    w->done = true;
}

/* Starts job j in slot w (reserved for it at admission): its conversation from the state
 * cache, the reused prefix, sampler, parsers and emitter. The slot then prefills, decodes
 * at once (the kept state is the whole prompt), or is done (failed, cancelled). */
static void slot_begin(k3_server *s, k3_slot *w, k3_job *j) {
    j->slot = w;
    w->ctx = (job_ctx){s, j};
    w->c = NULL;
    w->failed = w->done = false;
    w->err = (k3_err){0};
    w->phase = K3_SLOT_PREFILL;
    j->t_start = k3_now_s();
    k3_emitter_begin(w->em, s, j);
    k3_emit_start(w->em);
    long reuse = pick_conv(s, j, &w->err);
    if (reuse < 0) return slot_failed(w);
    if (start_sampling(s, j, &w->err)) return slot_failed(w);
    w->c->virt_msgs = 0; /* from here on the state is this job's */
    last_chat_clear(&w->c->last_chat);
    j->n_cached = (int)reuse;
    j->state_hit = reuse > 0;
    j->n_prompt_used = (int)j->n_prompt;
    if (j->p.echo) {
        int rc = prefill_echo(s, j, &w->err);
        if (rc < 0) return slot_failed(w);
        if (rc > 0) w->done = true; /* abandoned */
        else start_decode(s, w);
        return;
    }
    if ((size_t)reuse == j->n_prompt) return start_decode(s, w); /* state and logits kept */
    w->c->logits_valid = false;
}

/* Ends the slot's job: finish reason, final chunks, the conversation's meaning (chat), the
 * counters; the job becomes DONE and the slot free. */
static void slot_finish(k3_server *s, k3_slot *w) {
    k3_job *j = w->j;
    const char *finish = NULL;
    if (w->failed) {
        j->failed = true;
        k3_api_fail(&j->err, 500, "server_error", NULL, NULL, "generation failed: %s",
                    w->err.msg);
    } else if (w->phase == K3_SLOT_DECODE) {
        switch (w->g.end) {
        case K3_GEN_STOP:
        case K3_GEN_STOP_STRING: finish = "stop"; break;
        case K3_GEN_MAX_NEW:
        case K3_GEN_CONTEXT: /* cut: what the parser or decoder held may complete a stop string */
            finish = show(s, j, w->last, true) ? "stop" : "length";
            break;
        default: break; /* the client left, or the server stops */
        }
    }
    if (finish && j->p.kind == K3_SRV_CHAT && j->p.tools) finish = end_tools(j, finish);
    if (finish && j->p.kind == K3_SRV_CHAT) remember_reply(s, j);
    j->finish = finish;
    j->t_end = k3_now_s();
    k3_emit_finish(w->em, finish);
    if (w->c) k3_srv_status_record(s, j, w->c->sess); /* /health, /metrics (status.c) */
    if (w->c) w->c->busy = false;
    k3_worker_state *ws = s->ws;
    int kept = 0;
    for (int i = 0; i < ws->n_convs; i++) kept += k3_session_pos(ws->convs[i].sess) > 0;
    pthread_mutex_lock(&s->mu);
    j->state = K3_JOB_DONE;
    s->n_active--;
    s->n_tokens += (unsigned long long)j->n_completion;
    s->states_kept = kept;
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->mu);
    w->j = NULL;
    w->c = NULL;
    w->phase = K3_SLOT_FREE;
}

/* ---- slow clients -----------------------------------------------------------------------
 * A streamed reply's events wait in j->out until its connection hands them to the socket
 * (http.c, sse_read); emit.c appends without waiting. A decoding slot whose client has more
 * than opts.stream_backlog bytes unread (K3_STREAM_BACKLOG_BYTES, 1 MiB) sits out the rounds
 * instead: it stays decoding and is not stepped, so its session, logits and next id are as it
 * left them, and it rejoins the pass where it was once the client has read below the limit.
 * The other slots go on meanwhile. Its backlog stays under the limit plus one round's events
 * (one id's, several with --spec, or a finish's last chunks). A sitting-out slot whose client
 * is gone (cancelled, hung up) or whose server stops ends at the next round, which comes
 * within K3_CLIENT_TICK_MS even when every slot sits out (wait_for_clients_locked). A client
 * that stays connected without reading keeps its slot for o.stall_timeout_s at most (D21: with
 * one slot it would lock every other request out): then its job ends (cancelled, "stalled")
 * and its connection is shut down. /metrics counts slots sitting out (k3_streams_waiting). */

#define K3_CLIENT_TICK_MS 20 /* how often a worker with every slot sitting out looks again */

/* Unread stream bytes of slot w's job over the limit (opts.stream_backlog, by default
 * K3_STREAM_BACKLOG_BYTES). Call with s->mu held. */
static bool client_behind_locked(const k3_server *s, const k3_slot *w) {
    const k3_job *j = w->j;
    return j->p.stream && j->out.len - j->out_taken > s->o.stream_backlog;
}

/* A sitting-out slot whose client has taken nothing for o.stall_timeout_s, counted from when
 * it began to sit out or the client's last read, whichever is later. Call with s->mu held. */
static bool stalled_locked(k3_server *s, k3_slot *w, bool was_waiting, double now) {
    if (!was_waiting) w->wait_since = now;
    double since = w->j->t_read > w->wait_since ? w->j->t_read : w->wait_since;
    return s->o.stall_timeout_s > 0 && now - since >= s->o.stall_timeout_s;
}

/* Before a round: marks the decoding slots that sit out it (w->waiting), ends those whose
 * client is gone or stalled, and publishes their count for /metrics. Returns that count. */
static int mark_waiting(k3_server *s) {
    k3_worker_state *ws = s->ws;
    double now = k3_now_s();
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < ws->n_slots; i++) {
        k3_slot *w = &ws->slots[i];
        bool was = w->waiting;
        w->waiting = w->j && !w->done && w->phase == K3_SLOT_DECODE && client_behind_locked(s, w);
        if (w->waiting && stalled_locked(s, w, was, now)) w->j->stalled = true;
    }
    pthread_mutex_unlock(&s->mu);
    int n = 0;
    for (int i = 0; i < ws->n_slots; i++) {
        k3_slot *w = &ws->slots[i];
        if (w->waiting && w->j->stalled) /* its connection thread waits on the socket: wake it */
            shutdown(w->j->fd, SHUT_RDWR);
        if (w->waiting && (w->j->stalled || job_abandoned(s, w->j))) { /* the job ends */
            w->waiting = false;
            w->g.end = K3_GEN_INTERRUPTED;
            w->done = true;
        }
        n += w->waiting;
    }
    pthread_mutex_lock(&s->mu);
    s->n_waiting = n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* With s->mu held, after a round in which every running slot sat out: sleeps until a
 * connection takes data (sse_read broadcasts s->progress) or K3_CLIENT_TICK_MS pass (a gone
 * client tells only a poll of its socket, a queued job only s->work), unless a client has
 * read below the limit already, the server stops or a queued job finds a free slot. */
static void wait_for_clients_locked(k3_server *s) {
    k3_worker_state *ws = s->ws;
    bool free_slot = false;
    for (int i = 0; i < ws->n_slots; i++) {
        const k3_slot *w = &ws->slots[i];
        if (w->waiting && !client_behind_locked(s, w)) return;
        free_slot |= !w->j;
    }
    if (s->stopping || (s->head && free_slot)) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* s->progress waits on the default clock */
    ts.tv_nsec += K3_CLIENT_TICK_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&s->progress, &s->mu, &ts);
}

/* The prefilling slot admitted first among those not yet given a chunk this round. */
static k3_slot *oldest_prefill(k3_worker_state *ws, unsigned long long round) {
    k3_slot *best = NULL;
    for (int i = 0; i < ws->n_slots; i++) {
        k3_slot *w = &ws->slots[i];
        if (w->j && w->phase == K3_SLOT_PREFILL && !w->done && w->round != round &&
            (!best || w->admitted < best->admitted))
            best = w;
    }
    return best;
}

/* One round: every decoding slot's next id (but those that sit out, mark_waiting) and the
 * prefill chunks that fit the row budget, in one multistep pass; then each slot takes its
 * result. Returns true when nothing ran because every running slot sits out. */
static bool run_round(k3_server *s) {
    k3_worker_state *ws = s->ws;
    unsigned long long round = ++ws->rounds;
    int n = 0, rows = 0, stepped = 0, waiting = mark_waiting(s);
    for (int i = 0; i < ws->n_slots; i++) {
        k3_slot *w = &ws->slots[i];
        if (!w->j || w->done || w->phase != K3_SLOT_DECODE || w->waiting) continue;
        if (!w->batched) { /* --spec: alone, with its drafts */
            stepped++;
            int rc = k3_gen_step(&w->g, &w->err);
            if (rc) {
                feed_failed(w->c, rc);
                w->failed = true;
            }
            w->done = w->g.end != K3_GEN_RUNNING;
            continue;
        }
        if (!k3_gen_next(&w->g, &w->next)) { /* ended at this id, or cancelled */
            w->done = true;
            continue;
        }
        ws->segs[n] = (k3_multistep_seg){.session = w->c->sess, .ids = &w->next, .n_ids = 1,
                                         .flags = K3_MS_LAST_LOGITS};
        ws->seg_slot[n++] = w;
        rows++;
    }
    int budget = ws->chunk; /* prompt ids this pass, over all prefilling slots */
    for (k3_slot *w; budget > 0 && rows < ws->max_rows && (w = oldest_prefill(ws, round));) {
        w->round = round;
        if (job_abandoned(s, w->j)) { /* the ids fed so far stay in its conversation */
            w->done = true;
            continue;
        }
        size_t at = (size_t)k3_session_pos(w->c->sess), left = w->j->n_prompt - at;
        int k = budget < ws->max_rows - rows ? budget : ws->max_rows - rows;
        if ((size_t)k > left) k = (int)left;
        ws->segs[n] = (k3_multistep_seg){
            .session = w->c->sess, .ids = w->j->prompt + at, .n_ids = k,
            .flags = (size_t)k == left ? K3_MS_LAST_LOGITS : K3_MS_NO_LOGITS};
        ws->seg_slot[n++] = w;
        rows += k;
        budget -= k;
    }
    if (!n) return waiting > 0 && !stepped;
    k3_err err;
    k3_multistep_run(ws->ms, ws->segs, n, ws->rows, &err); /* statuses are per segment */
    int ran = 0; /* a segment that was in the pass (a refused one was left out of it) */
    while (ran < n - 1 && ws->segs[ran].status) ran++;
    count_pass(s, rows, ws->segs[ran].session);
    for (int i = 0; i < n; i++) {
        k3_multistep_seg *g = &ws->segs[i];
        k3_slot *w = ws->seg_slot[i];
        if (g->status) {
            w->err = g->err;
            feed_failed(w->c, g->status);
        } else if (g->logits_row >= 0) {
            memcpy(w->c->logits, ws->rows + (size_t)g->logits_row * (size_t)ws->vocab,
                   (size_t)ws->vocab * sizeof *ws->rows);
        }
        if (w->phase == K3_SLOT_DECODE) {
            if (k3_gen_fed(&w->g, g->status, &w->err)) w->failed = true;
            w->done = w->g.end != K3_GEN_RUNNING;
        } else if (g->status) {
            slot_failed(w);
        } else if (g->flags == K3_MS_LAST_LOGITS) {
            start_decode(s, w);
        }
    }
    return false;
}

/* ---- the worker thread ------------------------------------------------------------------------ */

static void *worker_main(void *arg) {
    k3_server *s = arg;
    k3_worker_state *ws = s->ws;
    k3_slot *admitted[K3_SRV_MAX_PARALLEL];
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->n_active && !s->head && !s->stopping) pthread_cond_wait(&s->work, &s->mu);
        if (s->stopping) break;
        int na = 0; /* admission: free slots take queued jobs in arrival order */
        for (int i = 0; i < ws->n_slots && s->head; i++) {
            k3_slot *w = &ws->slots[i];
            if (w->j) continue;
            k3_job *j = s->head;
            s->head = j->next;
            if (!s->head) s->tail = NULL;
            s->n_queued--;
            s->n_active++;
            j->state = K3_JOB_RUNNING;
            w->j = j;
            w->admitted = ++ws->admissions;
            admitted[na++] = w;
        }
        if (na) pthread_cond_broadcast(&s->progress);
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < na; i++) slot_begin(s, admitted[i], admitted[i]->j);
        bool idle = run_round(s);
        for (int i = 0; i < ws->n_slots; i++)
            if (ws->slots[i].j && ws->slots[i].done) slot_finish(s, &ws->slots[i]);
        pthread_mutex_lock(&s->mu);
        if (idle) wait_for_clients_locked(s); /* no spinning while every client is behind */
    }
    /* Stopping: running jobs end where they are (their clients get what was sent, or 503),
     * queued ones unserved. */
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < ws->n_slots; i++)
        if (ws->slots[i].j) {
            ws->slots[i].failed = false;
            if (ws->slots[i].phase == K3_SLOT_DECODE) ws->slots[i].g.end = K3_GEN_INTERRUPTED;
            slot_finish(s, &ws->slots[i]);
        }
    pthread_mutex_lock(&s->mu);
    for (k3_job *j = s->head, *next; j; j = next) {
        next = j->next;
        j->cancel = true;
        j->state = K3_JOB_DONE;
    }
    s->head = s->tail = NULL;
    s->n_queued = 0;
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void slot_free(k3_slot *w) {
    k3_spec_free(&w->spec);
    k3_sampler_free(&w->sampler);
    k3_reply_parser_free(&w->parser);
    k3_toolcall_parser_free(&w->tc);
    free(w->text);
    k3_emitter_free(w->em);
}

static void worker_state_free(k3_worker_state *w) {
    if (!w) return;
    for (int i = 0; i < w->n_spill; i++) conv_free(&w->spill[i]);
    free(w->spill);
    for (int i = 0; i < w->n_slots; i++) slot_free(&w->slots[i]);
    free(w->slots);
    for (int i = 0; i < w->n_convs; i++) conv_free(&w->convs[i]);
    free(w->convs);
    k3_multistep_free(w->ms);
    free(w->segs);
    free(w->seg_slot);
    free(w->rows);
    for (size_t i = 0; i < w->n_script; i++) free(w->script[i]);
    free(w->script);
    free(w->script_len);
    free(w);
}

/* Test-only: reads opts.scripted_reply (server.h) into w->script. */
static int load_script(k3_worker_state *w, const char *path, const k3_tokenizer *tok,
                       k3_err *err) {
    char *buf;
    size_t len;
    int rc = k3_read_file(path, (size_t)16 << 20, &buf, &len, err);
    if (rc) return rc;
    cJSON *arr = cJSON_ParseWithLength(buf, len);
    free(buf);
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    w->script = calloc(n ? (size_t)n : 1, sizeof *w->script);
    w->script_len = calloc(n ? (size_t)n : 1, sizeof *w->script_len);
    if (!n || !w->script || !w->script_len) {
        cJSON_Delete(arr);
        return k3_fail(err, K3_ERR_INPUT, "%s: a scripted reply file must hold a non-empty JSON "
                       "array of strings", path);
    }
    const cJSON *r;
    cJSON_ArrayForEach(r, arr) {
        if (!cJSON_IsString(r)) rc = k3_fail(err, K3_ERR_INPUT, "%s: entry %zu is not a string",
                                             path, w->n_script);
        if (!rc) rc = k3_tokenizer_encode(tok, r->valuestring, strlen(r->valuestring), true,
                                          &w->script[w->n_script], &w->script_len[w->n_script],
                                          err);
        if (rc) break;
        w->n_script++;
    }
    cJSON_Delete(arr);
    return rc;
}

/* --state-dir: the spill entries and their file names: random, so that servers sharing the
 * folder (two containers whose k3 are both pid 1) never write each other's files (D12). */
static int spill_open(k3_server *s, k3_err *err) {
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

int k3_worker_start(k3_server *s, k3_err *err) {
    k3_worker_state *w = calloc(1, sizeof *w);
    if (!w) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    s->ws = w;
    const k3_config *c = k3_engine_config(s->eng);
    const k3_tokenizer *tok = k3_engine_tokenizer(s->eng);
    w->vocab = c->vocab_size;
    int n = s->o.parallel > 0 ? s->o.parallel : 1;
    if (n > K3_SRV_MAX_PARALLEL)
        return k3_fail(err, K3_ERR_USAGE, "parallel %d: at most %d generations at once", n,
                       K3_SRV_MAX_PARALLEL);
    w->n_slots = n;
    /* every slot needs a conversation of its own; the rest is the cache's */
    w->cap_convs = s->o.state_cache > n ? s->o.state_cache : n;
    w->chunk = s->o.chunk > 0 ? s->o.chunk : K3_DEFAULT_CHUNK;
    if (w->chunk > K3_MULTISTEP_MAX_ROWS - n) w->chunk = K3_MULTISTEP_MAX_ROWS - n;
    w->max_rows = w->chunk + n; /* a chunk of prompt beside every slot's decode row */
    w->convs = calloc((size_t)w->cap_convs, sizeof *w->convs);
    w->slots = calloc((size_t)n, sizeof *w->slots);
    w->segs = calloc((size_t)w->max_rows, sizeof *w->segs);
    w->seg_slot = calloc((size_t)w->max_rows, sizeof *w->seg_slot);
    /* logits rows: one per segment that wants them, at most one per slot */
    w->rows = malloc((size_t)n * (size_t)w->vocab * sizeof *w->rows);
    if (!w->convs || !w->slots || !w->segs || !w->seg_slot || !w->rows)
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    /* The first conversation now: it tells the context, and a bad --ctx fails the start. */
    int rc = conv_new(s, &w->convs[0], err);
    if (rc) return rc;
    w->n_convs = 1;
    if ((rc = k3_multistep_new(s->eng, w->max_rows, &w->ms, err))) return rc;
    if (s->o.state_dir && (rc = spill_open(s, err))) return rc;
    k3_stops_init(&w->stops, tok, c->eos_token_id);
    s->ctx = k3_session_max_ctx(w->convs[0].sess);
    s->slots = n;
    s->states_cap = w->cap_convs;
    for (int i = 0; i < n; i++) {
        k3_slot *sl = &w->slots[i];
        k3_reply_parser_init(&sl->parser, tok, &w->stops, false);
        sl->text_cap = k3_reply_parser_out_cap(tok);
        sl->text = malloc(sl->text_cap);
        sl->em = k3_emitter_new();
        if (!sl->text || !sl->em) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    if (s->o.scripted_reply && (rc = load_script(w, s->o.scripted_reply, tok, err))) return rc;
    if (pthread_create(&s->worker, NULL, worker_main, s))
        return k3_fail(err, K3_ERR_GENERIC, "cannot start the worker thread");
    s->worker_started = true;
    return 0;
}

void k3_worker_stop(k3_server *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->work);
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->mu);
    if (s->worker_started) pthread_join(s->worker, NULL);
    s->worker_started = false;
    worker_state_free(s->ws);
    s->ws = NULL;
}
