/* slot.c — one generation in a slot (worker.h): its start (conversation from the state
 * cache, sampler, parsers, emitter), the generation loop's hooks (k3_gen_io: each id becomes
 * the reply's text, logprobs, tool calls) and its end (finish reason, counters). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* POLLRDHUP; the Makefile passes it too, but not every build does */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "../tok/tokenizer.h"
#include "../util/clock.h"
#include "worker.h"

/* One forward pass of `rows` token rows that session sess was in, for /metrics: its rows
 * and the time it waited for expert reads (the session's last step is that pass; a shared
 * pass is counted once, not once per session in it). */
void k3_srv_count_pass(k3_server *s, int rows, const k3_session *sess) {
    k3_run_stats st;
    k3_session_stats(sess, &st);
    pthread_mutex_lock(&s->mu);
    k3_metrics_pass(&s->metrics, rows);
    s->metrics.expert_wait_s += st.last.eload_s;
    pthread_mutex_unlock(&s->mu);
}

/* Completions with echo: the prompt's text is given back first, and the whole prompt is
 * prefilled with the logits of every position (the scheduler's rounds, K3_MS_ALL_LOGITS), so
 * that each prompt token gets its logprob (the first none; k3_slot_echo_rows). */
static int begin_echo(k3_server *s, k3_job *j, k3_err *err) {
    int vocab = s->ws->vocab;
    const k3_tokenizer *tok = k3_engine_tokenizer(s->eng);
    char *text = NULL;
    size_t len = 0;
    if (k3_tokenizer_decode(tok, j->prompt, j->n_prompt, &text, &len, err)) return -1;
    k3_sbuf_add(&j->content, text, len);
    free(text);
    if (j->p.logprobs) k3_logprobs_add(&j->lp, tok, NULL, vocab, j->prompt[0], 0, false);
    return 0;
}

void k3_slot_echo_rows(k3_server *s, k3_slot *w, size_t at, int n, const float *rows) {
    k3_job *j = w->j;
    int vocab = s->ws->vocab;
    for (size_t r = 0; r < (size_t)n && at + r + 1 < j->n_prompt && j->p.logprobs; r++)
        k3_logprobs_add(&j->lp, k3_engine_tokenizer(s->eng), rows + r * (size_t)vocab, vocab,
                        j->prompt[at + r + 1], j->p.top_logprobs, false);
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
    k3_srv_test_after_token();
    if (show(c->s, c->j, id, false)) return true;
    /* parallel_tool_calls false: the reply ends after its first complete call */
    return c->j->p.tools && !c->j->p.parallel_tool_calls && w->tc.n_calls;
}


/* k3_gen_io.cancelled */
static bool cancelled(void *user) {
    job_ctx *c = user;
    return k3_job_abandoned(c->s, c->j);
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
    k3_srv_test_begin(ws, w); /* the test build's scripted reply and spec rule, if set */
    return rc;
}


/* Decode starts: the session holds the whole prompt and its logits are in w->c->logits. */
void k3_slot_start_decode(k3_server *s, k3_slot *w) {
    k3_job *j = w->j;
    int limit = j->p.max_tokens ? j->p.max_tokens : s->o.max_tokens; /* 0 = none */
    j->t_decode = k3_now_s(); /* prefill time vs decode speed, for /health */
    w->c->logits_valid = true;
    /* drafts skip the logits logprobs read; scripted replies choose their own ids */
    bool script = k3_srv_test_scripted(s->ws);
    bool spec = !j->p.logprobs && !script && w->spec.max_draft > 0;
    k3_gen_start(&w->g, w->c->sess, &w->sampler, w->c->logits,
                 &(k3_gen_params){.max_new = limit ? limit : -1, .stops = &s->ws->stops,
                                  .spec = spec ? &w->spec : NULL},
                 &(k3_gen_io){.user = &w->ctx, .emit = take, .cancelled = cancelled,
                              .choose = script ? k3_srv_test_choose : NULL});
    w->phase = K3_SLOT_DECODE;
}

void k3_slot_failed(k3_slot *w) {
    w->failed = true;
    w->done = true;
}

/* --prompt-cache: where this prompt's prefill stops for a snapshot (k3_pcache_marks), past
 * the reused prefix. Without room for them, none (the prompt is prefilled all the same). */
static void plan_marks(k3_server *s, k3_slot *w, const k3_job *j) {
    w->n_marks = w->next_mark = w->inner = 0;
    if (!s->ws->pc || w->echo || s->o.no_reuse) return;
    size_t cap = j->n_prompt / (K3_PCACHE_EVERY / 8) + 4; /* marks are >= 256 apart but 2 */
    if (cap > w->marks_cap) {
        size_t *m = realloc(w->marks, cap * sizeof *m);
        if (!m) return;
        w->marks = m, w->marks_cap = cap;
    }
    w->n_marks = k3_pcache_marks(j->prompt, j->n_prompt, w->pf.at, s->ws->eom,
                                 (size_t)s->ws->chunk, w->marks, w->marks_cap);
}

void k3_slot_snapshot(k3_server *s, k3_slot *w) {
    k3_worker_state *ws = s->ws;
    k3_pcache_stats st = {0};
    size_t at = w->pf.at;
    if (k3_pcache_save(ws->pc, w->c->sess, &st)) {
        if (w->inner) k3_pcache_drop(ws->pc, w->j->prompt, w->inner, &st); /* superseded */
        w->inner = w->j->prompt[at - 1] != ws->eom ? at : 0;
    }
    k3_pcache_count(s, &st);
    w->next_mark++;
}

/* Starts job j in slot w (reserved for it at admission): its conversation from the state
 * cache, the reused prefix, sampler, parsers and emitter. The slot then prefills, decodes
 * at once (the kept state is the whole prompt), or is done (failed, cancelled). */
void k3_slot_begin(k3_server *s, k3_slot *w, k3_job *j) {
    j->slot = w;
    w->ctx = (job_ctx){s, j};
    w->c = NULL;
    w->failed = w->done = false;
    w->err = (k3_err){0};
    w->phase = K3_SLOT_PREFILL;
    j->t_start = k3_now_s();
    k3_emitter_begin(w->em, s, j);
    k3_emit_start(w->em);
    long reuse = k3_kept_pick(s, j, &w->err);
    if (reuse < 0) return k3_slot_failed(w);
    if (start_sampling(s, j, &w->err)) return k3_slot_failed(w);
    w->c->virt_msgs = 0; /* from here on the state is this job's */
    k3_last_chat_clear(&w->c->last_chat);
    j->n_cached = (int)reuse;
    j->state_hit = reuse > 0;
    j->n_prompt_used = (int)j->n_prompt;
    w->echo = j->p.echo;
    if (w->echo && begin_echo(s, j, &w->err)) return k3_slot_failed(w);
    if ((size_t)reuse == j->n_prompt && !w->echo)
        return k3_slot_start_decode(s, w); /* state and logits kept */
    w->c->logits_valid = false;
    /* the one prefill path (k3.h): the kept prefix stays, the rest goes in the rounds */
    if (k3_prefill_begin(&w->pf, w->c->sess, j->prompt, j->n_prompt, NULL, &w->err))
        return k3_slot_failed(w);
    plan_marks(s, w, j);
}

/* Ends the slot's job: finish reason, final chunks, the conversation's meaning (chat), the
 * counters; the job becomes DONE and the slot free. */
void k3_slot_finish(k3_server *s, k3_slot *w) {
    k3_job *j = w->j;
    const char *finish = NULL;
    if (w->failed) {
        j->failed = true;
        k3_api_fail(&j->err, 500, "server_error", NULL, NULL, "generation failed: %s",
                    w->err.msg);
    } else if (w->err.code == K3_ERR_INTERRUPTED) { /* its pass stopped: the client left */
        snprintf(j->stopped, sizeof j->stopped, "%.150s; %d ids kept", w->err.msg,
                 k3_session_pos(w->c->sess));
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
    if (finish && j->p.kind == K3_SRV_CHAT) k3_kept_remember_reply(s, j);
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


void k3_slot_free(k3_slot *w) {
    k3_spec_free(&w->spec);
    k3_sampler_free(&w->sampler);
    k3_reply_parser_free(&w->parser);
    k3_toolcall_parser_free(&w->tc);
    free(w->text);
    free(w->marks);
    k3_emitter_free(w->em);
}
