/* emit.c — what generated text becomes on the wire: stop strings, SSE chunks in OpenAI's
 * format, and the final JSON of a non-streamed reply (see srv.h).
 *
 * Stop strings apply to the answer (content channel) only, as OpenAI applies them to what it
 * returns as content: text that could still grow into a stop string is held back, never sent
 * and then taken back. Reasoning is sent as generated.
 *
 * A streamed event is appended to the job's j->out, which its connection drains as the socket
 * takes it (http.c, sse_read). Appending never waits for the client: a client that reads
 * slower than its reply is generated, or stops reading, makes its generation sit out the
 * passes once more than s->stream_backlog bytes are unread (clients.c), so one slow client
 * never holds up the worker and the other generations.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anthropic.h"
#include "responses.h"
#include "../engine/generate.h"
#include "srv.h"

struct k3_emitter {
    k3_server *s;
    k3_job *j;
    k3_stop_text stop; /* content held back: a suffix that may begin a stop string */
    k3_sbuf event;     /* one SSE event being formatted */
    k3_anth_stream as; /* Anthropic stream: the open content block */
};

k3_emitter *k3_emitter_new(void) { return calloc(1, sizeof(k3_emitter)); }

void k3_emitter_free(k3_emitter *em) {
    if (!em) return;
    k3_stop_text_free(&em->stop);
    k3_sbuf_free(&em->event);
    free(em);
}

void k3_emitter_begin(k3_emitter *em, k3_server *s, k3_job *j) {
    em->s = s;
    em->j = j;
    em->event.len = 0;
    em->event.oom = 0;
    k3_stop_text_reset(&em->stop, (const char *const *)j->p.stop, j->p.n_stop);
    j->stop_index = -1;
}

/* ---- SSE ------------------------------------------------------------------------------- */

/* Hands em->event to the connection, without waiting: the backlog of a client that is
 * behind is bounded by its slot sitting out (worker.c), not here. */
static void push_event(k3_emitter *em) {
    k3_server *s = em->s;
    k3_job *j = em->j;
    pthread_mutex_lock(&s->mu);
    k3_sbuf_add(&j->out, em->event.p, em->event.len);
    size_t unread = j->out.len - j->out_taken;
    if (unread > s->backlog_peak) s->backlog_peak = unread;
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->mu);
    em->event.len = 0;
}

/* Opens `data: {"id":…,"object":…,"created":…,"model":…,"choices":[` in em->event. */
static void event_head(k3_emitter *em) {
    const k3_job *j = em->j;
    k3_sbuf *b = &em->event;
    bool chat = j->p.kind == K3_SRV_CHAT;
    k3_sbuf_printf(b, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":\"", j->id,
                   chat ? "chat.completion.chunk" : "text_completion", j->created);
    k3_sbuf_json_str(b, em->s->model_id, strlen(em->s->model_id));
    k3_sbuf_str(b, "\",\"choices\":[");
}

/* Closes the event; with include_usage every chunk carries "usage": null but the last. */
static void event_tail(k3_emitter *em) {
    k3_sbuf_str(&em->event, em->j->p.include_usage ? "],\"usage\":null}\n\n" : "]}\n\n");
    push_event(em);
}

/* One choice delta: channel 0 = content (or text), 1 = reasoning_content, -1 = role only. */
static void send_delta(k3_emitter *em, int channel, const char *text, size_t n) {
    k3_sbuf *b = &em->event;
    if (em->j->resp) {
        k3_resp_text(em->j->resp, b, true, channel, text, n);
        push_event(em);
        return;
    }
    if (em->j->anthropic) {
        if (channel >= 0) k3_anth_text(&em->as, b, channel, text, n);
        push_event(em);
        return;
    }
    event_head(em);
    if (em->j->p.kind == K3_SRV_CHAT) {
        if (channel < 0) k3_sbuf_str(b, "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"");
        else k3_sbuf_printf(b, "{\"index\":0,\"delta\":{\"%s\":\"",
                            channel ? "reasoning_content" : "content");
        k3_sbuf_json_str(b, text, n);
        k3_sbuf_str(b, "\"},\"logprobs\":null,\"finish_reason\":null}");
    } else {
        k3_sbuf_str(b, "{\"index\":0,\"text\":\"");
        k3_sbuf_json_str(b, text, n);
        k3_sbuf_str(b, "\",\"logprobs\":null,\"finish_reason\":null}");
    }
    event_tail(em);
}

static void out_text(k3_emitter *em, int channel, const char *text, size_t n) {
    if (n == 0) return;
    if (em->j->resp && !em->j->p.stream) k3_resp_text(em->j->resp, NULL, false, channel, text, n);
    if (em->j->p.stream) send_delta(em, channel, text, n);
    else k3_sbuf_add(channel ? &em->j->reasoning : &em->j->content, text, n);
}

void k3_emit_start(k3_emitter *em) {
    em->as = (k3_anth_stream){.open = -1};
}

void k3_emit_opening(const k3_server *s, k3_job *j) {
    if (!j->p.stream) return;
    k3_emitter em = {.s = (k3_server *)s, .j = j};
    k3_anth_stream as;
    if (j->resp) k3_resp_open(j->resp, &em.event, s, j);
    else if (j->anthropic) k3_anth_message_start(&as, &em.event, s, j);
    else if (j->p.kind == K3_SRV_CHAT) {
        event_head(&em);
        k3_sbuf_str(&em.event, "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":"
                    "\"\"},\"logprobs\":null,\"finish_reason\":null}");
        k3_sbuf_str(&em.event, j->p.include_usage ? "],\"usage\":null}\n\n" : "]}\n\n");
    }
    k3_sbuf_add(&j->out, em.event.p, em.event.len); /* not yet shared: no lock needed */
    k3_sbuf_free(&em.event);
}

void k3_emit_keepalive(const k3_job *j, k3_sbuf *b) {
    if (j->anthropic) k3_sbuf_str(b, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    else k3_sbuf_str(b, ": keep-alive\n\n");
}

void k3_emit_logprobs(k3_emitter *em, const k3_logprobs *one) {
    k3_sbuf *b = &em->event;
    bool chat = em->j->p.kind == K3_SRV_CHAT;
    event_head(em);
    k3_sbuf_str(b, chat ? "{\"index\":0,\"delta\":{},\"logprobs\":"
                        : "{\"index\":0,\"text\":\"\",\"logprobs\":");
    k3_logprobs_json(b, one, chat);
    k3_sbuf_str(b, ",\"finish_reason\":null}");
    event_tail(em);
}

/* ---- tool calls ---------------------------------------------------------------------------- */

/* One streamed tool-call delta: {"index":0,"delta":{"tool_calls":[{"index":K, ...}]}}. */
static void tool_delta(k3_emitter *em, int index, const char *id, const char *name,
                       const char *args, size_t n) {
    k3_sbuf *b = &em->event;
    event_head(em);
    k3_sbuf_printf(b, "{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":%d,", index);
    if (id) {
        k3_sbuf_printf(b, "\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":\"", id);
        k3_sbuf_json_str(b, name, strlen(name));
        k3_sbuf_str(b, "\",\"arguments\":\"\"}}]}");
    } else {
        k3_sbuf_str(b, "\"function\":{\"arguments\":\"");
        k3_sbuf_json_str(b, args, n);
        k3_sbuf_str(b, "\"}}]}");
    }
    k3_sbuf_str(b, ",\"logprobs\":null,\"finish_reason\":null}");
    event_tail(em);
}

void k3_emit_tool_call(k3_emitter *em, int index, const char *name, const char *arguments,
                       const size_t *piece_ends, size_t n_pieces) {
    k3_job *j = em->j;
    char id[80];
    /* j->id is "chatcmpl-k3…" / "msg_k3…": unique per server run; + the index per call. */
    const char *serial = strstr(j->id, "k3");
    snprintf(id, sizeof id, "%s_%s_%d", j->anthropic ? "toolu" : "call", serial ? serial : j->id,
             index);
    j->n_tool_calls++;
    if (j->resp) {
        snprintf(id, sizeof id, "call_%s_%d", serial ? serial : j->id, index);
        k3_resp_tool_call(j->resp, &em->event, j->p.stream, id, name, arguments, piece_ends,
                          n_pieces);
        if (j->p.stream) push_event(em);
        else em->event.len = 0;
        return;
    }
    if (j->anthropic) {
        if (j->p.stream) {
            k3_anth_tool_use(&em->as, &em->event, id, name, arguments, piece_ends, n_pieces);
            push_event(em);
        } else {
            k3_anth_tool_use_json(&j->tool_calls, id, name, arguments);
        }
        return;
    }
    if (j->p.stream) {
        tool_delta(em, index, id, name, NULL, 0);
        size_t from = 0;
        for (size_t k = 0; k < n_pieces; k++) {
            tool_delta(em, index, NULL, NULL, arguments + from, piece_ends[k] - from);
            from = piece_ends[k];
        }
        return;
    }
    k3_sbuf *b = &j->tool_calls;
    k3_sbuf_printf(b, "%s{\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":\"",
                   b->len ? "," : "", id);
    k3_sbuf_json_str(b, name, strlen(name));
    k3_sbuf_str(b, "\",\"arguments\":\"");
    k3_sbuf_json_str(b, arguments, strlen(arguments));
    k3_sbuf_str(b, "\"}}");
}

/* ---- stop strings -------------------------------------------------------------------------- */

bool k3_emit_text(k3_emitter *em, int channel, const char *text, size_t n) {
    const k3_srv_params *p = &em->j->p;
    if (em->stop.matched) return true;
    if (channel != 0 || p->n_stop == 0) {
        out_text(em, channel, text, n);
        return false;
    }
    const char *out;
    size_t len;
    bool stopped = k3_stop_text_push(&em->stop, text, n, &out, &len);
    out_text(em, 0, out, len);
    if (stopped) em->j->stop_index = em->stop.which;
    return stopped;
}

/* ---- the end ---------------------------------------------------------------------------------- */

void k3_srv_usage_json(k3_sbuf *b, const k3_job *j) {
    k3_sbuf_printf(b, "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
                   "\"prompt_tokens_details\":{\"cached_tokens\":%d},"
                   "\"completion_tokens_details\":{\"reasoning_tokens\":%d}}",
                   j->n_prompt_used, j->n_completion, j->n_prompt_used + j->n_completion,
                   j->n_cached, j->n_reasoning);
}

void k3_emit_finish(k3_emitter *em, const char *finish) {
    k3_job *j = em->j;
    const char *held;
    size_t n_held;
    k3_stop_text_flush(&em->stop, &held, &n_held);
    if (finish) out_text(em, 0, held, n_held);
    if (!finish && !j->failed) return; /* cancelled: nobody is listening */
    k3_sbuf *b = &em->event;
    if (j->resp) {
        k3_resp_finish(j->resp, b, j->p.stream, em->s, j, em->s->resp_store);
        if (j->p.stream) push_event(em);
        else b->len = 0;
        return;
    }
    if (!j->p.stream) return;
    if (j->anthropic) {
        if (j->failed) k3_anth_error_event(b, &j->err);
        else k3_anth_finish(&em->as, b, j);
        push_event(em);
        return;
    }
    if (j->failed) {
        char *err = k3_api_error_json(&j->err);
        k3_sbuf_str(b, "data: ");
        if (err) k3_sbuf_add(b, err, strlen(err) - 1); /* without its newline */
        k3_sbuf_str(b, "\n\n");
        free(err);
    } else {
        event_head(em);
        if (j->p.kind == K3_SRV_CHAT) k3_sbuf_str(b, "{\"index\":0,\"delta\":{}");
        else k3_sbuf_str(b, "{\"index\":0,\"text\":\"\"");
        k3_sbuf_printf(b, ",\"logprobs\":null,\"finish_reason\":\"%s\"}", finish);
        event_tail(em);
        if (j->p.include_usage) {
            event_head(em);
            k3_sbuf_str(b, "],\"usage\":");
            k3_srv_usage_json(b, j);
            k3_sbuf_str(b, "}\n\n");
            push_event(em);
        }
    }
    k3_sbuf_str(b, "data: [DONE]\n\n");
    push_event(em);
}

char *k3_srv_reply_json(const k3_server *s, const k3_job *j) {
    if (j->anthropic) return k3_anth_reply_json(s, j);
    if (j->resp) return j->resp->final ? strdup(j->resp->final) : NULL;
    k3_sbuf b = {0};
    bool chat = j->p.kind == K3_SRV_CHAT;
    k3_sbuf_printf(&b, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":\"", j->id,
                   chat ? "chat.completion" : "text_completion", j->created);
    k3_sbuf_json_str(&b, s->model_id, strlen(s->model_id));
    k3_sbuf_str(&b, "\",\"choices\":[{\"index\":0,");
    if (chat) {
        k3_sbuf_str(&b, "\"message\":{\"role\":\"assistant\",\"content\":");
        if (j->n_tool_calls && !j->content.len) { /* OpenAI: null beside tool calls */
            k3_sbuf_str(&b, "null");
        } else {
            k3_sbuf_str(&b, "\"");
            k3_sbuf_json_str(&b, j->content.p ? j->content.p : "", j->content.len);
            k3_sbuf_str(&b, "\"");
        }
        if (j->n_tool_calls) {
            k3_sbuf_str(&b, ",\"tool_calls\":[");
            k3_sbuf_add(&b, j->tool_calls.p, j->tool_calls.len);
            k3_sbuf_str(&b, "]");
        }
        k3_sbuf_str(&b, ",\"reasoning_content\":");
        if (j->p.thinking) {
            k3_sbuf_str(&b, "\"");
            k3_sbuf_json_str(&b, j->reasoning.p ? j->reasoning.p : "", j->reasoning.len);
            k3_sbuf_str(&b, "\"");
        } else {
            k3_sbuf_str(&b, "null");
        }
        k3_sbuf_str(&b, "},");
    } else {
        k3_sbuf_str(&b, "\"text\":\"");
        k3_sbuf_json_str(&b, j->content.p ? j->content.p : "", j->content.len);
        k3_sbuf_str(&b, "\",");
    }
    k3_sbuf_str(&b, "\"logprobs\":");
    if (j->p.logprobs) k3_logprobs_json(&b, &j->lp, chat);
    else k3_sbuf_str(&b, "null");
    k3_sbuf_printf(&b, ",\"finish_reason\":\"%s\"}],\"usage\":", j->finish);
    k3_srv_usage_json(&b, j);
    k3_sbuf_str(&b, "}\n");
    if (b.oom || j->content.oom || j->reasoning.oom || j->tool_calls.oom) {
        k3_sbuf_free(&b);
        return NULL;
    }
    return b.p;
}
