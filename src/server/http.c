/* http.c — the libmicrohttpd side of `k3 serve`: daemon start/stop, routing, auth, body
 * limit, JSON and SSE responses (see server.h for the invariants).
 *
 * MHD runs one thread per connection, so a handler may block: a non-streamed generation
 * waits in the access handler, a streamed one in the SSE content reader. The access handler
 * is called first with the headers only (route, method, auth and Content-Length are checked
 * there and answered at once), then with body pieces, then once more to dispatch.
 */
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "anthropic.h"
#include "responses.h"
#include "conns.h"
#include "srv.h"
#include "worker.h" /* k3_srv_test_stream_backlog */
#include "../util/clock.h"
#include "ui.h"

#define K3_MAX_CONNECTIONS 256    /* default connection limit (one thread each), 1/8 per address */
#define K3_WAIT_TICK_NS 200000000 /* how often a waiting connection looks at its socket */
#define K3_KEEPALIVE_S 5.0        /* a silent stream gets a keep-alive after this long: agents
                                     give up on a stream quiet for long (Claude Code: ~300 s
                                     before the first byte), proxies sooner */
#define K3_STALL_TIMEOUT_S 300    /* default --stall-timeout (server.h) */

enum route { R_NONE, R_MODELS, R_MODEL, R_COMPLETIONS, R_CHAT, R_HEALTH, R_UI, R_MESSAGES,
             R_COUNT_TOKENS, R_METRICS, R_RESPONSES };

typedef struct k3_conn {
    enum route route;
    const char *path;   /* canonical route name for the log */
    char model[256];    /* R_MODEL: the id asked for */
    const k3_ui_file *ui; /* R_UI: the page's file, and its Content-Type */
    const char *ui_type;
    k3_sbuf body;
    bool too_large;
    bool answered;      /* a response was queued while reading the headers */
    bool http11;        /* the request is HTTP/1.1 (it may be sent an interim 100) */
} k3_conn;

/* ---- responses ------------------------------------------------------------------------- */

/* Writes one log line with every control byte (newline, ESC, DEL...) as \xNN: request
 * fields and values reach the log, and must not forge lines or terminal escapes (D8). */
static void log_write(const char *prefix, const char *line) {
    char out[4 * 1024 + 1];
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)line; *p && n + 5 < sizeof out; p++) {
        if (*p < 0x20 || *p == 0x7f) n += (size_t)snprintf(out + n, 5, "\\x%02x", *p);
        else out[n++] = (char)*p;
    }
    out[n] = 0;
    fprintf(stderr, "k3 serve: %s%s\n", prefix, out);
}

static void log_line(const k3_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_line(const k3_server *s, const char *fmt, ...) {
    if (!s->o.log_requests) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    log_write("", line);
}

/* Queues `body` (malloc'd, taken over; NULL = out of memory → 500) with status. */
static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, char *body,
                             const char *hname, const char *hvalue) {
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"param\":null,\"code\":null}}\n";
        body = strdup(oom);
        status = 500;
        if (!body) return MHD_NO;
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (hname) MHD_add_response_header(r, hname, hvalue);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* Counts an answered request for /metrics (metrics.h). */
static void count(k3_server *s, const char *path, int status) {
    pthread_mutex_lock(&s->mu);
    k3_metrics_request(&s->metrics, path, status);
    pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result reply_error(k3_server *s, struct MHD_Connection *c,
                                   const char *method, const char *path, const k3_api_error *e) {
    count(s, path, e->status);
    log_line(s, "%s %s %d %s%s%s", method, path, e->status, e->message, e->param[0] ? " @ " : "",
             e->param);
    const char *hname = NULL, *hvalue = NULL;
    if (e->status == 401) hname = "WWW-Authenticate", hvalue = "Bearer";
    else if (e->status == 429 || e->status == 503) hname = "Retry-After", hvalue = "1";
    else if (e->status == 405) hname = "Allow", hvalue = e->allow;
    bool anthropic = path && !strncmp(path, "/v1/messages", 12); /* its own error shape */
    return reply(c, (unsigned)e->status, anthropic ? k3_anth_error_json(e) : k3_api_error_json(e),
                 hname, hvalue);
}

/* ---- GET endpoints ------------------------------------------------------------------------- */

static void model_object(k3_sbuf *b, const k3_server *s) {
    k3_sbuf_str(b, "{\"id\":\"");
    k3_sbuf_json_str(b, s->model_id, strlen(s->model_id));
    /* The context and the largest reply, under the names clients read them: OpenRouter's
     * and LM Studio's context_length, vLLM's max_model_len, Anthropic's max_input_tokens and
     * max_tokens (opencode, Claude Code gateways). */
    int max_out = s->o.max_tokens > 0 && s->o.max_tokens < s->ctx ? s->o.max_tokens : s->ctx;
    k3_sbuf_printf(b, "\",\"object\":\"model\",\"type\":\"model\",\"created\":%lld,"
                   "\"owned_by\":\"k3\",\"context_length\":%d,\"max_model_len\":%d,"
                   "\"max_input_tokens\":%d,\"max_tokens\":%d,\"max_output_tokens\":%d}",
                   (long long)s->started_unix, s->ctx, s->ctx, s->ctx, max_out, max_out);
}

static enum MHD_Result get_models(k3_server *s, struct MHD_Connection *c) {
    count(s, "/v1/models", 200);
    k3_sbuf b = {0};
    k3_sbuf_str(&b, "{\"object\":\"list\",\"data\":[");
    model_object(&b, s);
    k3_sbuf_str(&b, "]}\n");
    return reply(c, 200, b.oom ? (k3_sbuf_free(&b), NULL) : b.p, NULL, NULL);
}

static enum MHD_Result get_model(k3_server *s, struct MHD_Connection *c, const char *id) {
    if (strcmp(id, s->model_id)) {
        k3_api_error e;
        k3_api_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                    "The model '%s' does not exist; this server serves '%s'", id, s->model_id);
        return reply_error(s, c, "GET", "/v1/models/ID", &e);
    }
    count(s, "/v1/models/ID", 200);
    k3_sbuf b = {0};
    model_object(&b, s);
    k3_sbuf_str(&b, "\n");
    return reply(c, 200, b.oom ? (k3_sbuf_free(&b), NULL) : b.p, NULL, NULL);
}

static enum MHD_Result get_health(k3_server *s, struct MHD_Connection *c) {
    pthread_mutex_lock(&s->mu);
    bool busy = s->n_active > 0;
    int queued = s->n_queued;
    unsigned long long n = s->n_requests, tokens = s->n_tokens;
    k3_metrics_request(&s->metrics, "/health", 200);
    pthread_mutex_unlock(&s->mu);
    k3_sbuf b = {0};
    k3_sbuf_str(&b, "{\"status\":\"ok\",\"model\":\"");
    k3_sbuf_json_str(&b, s->model_id, strlen(s->model_id));
    k3_sbuf_printf(&b, "\",\"generating\":%s,\"queued\":%d,\"queue_limit\":%d,"
                   "\"generations\":%llu,\"completion_tokens\":%llu",
                   busy ? "true" : "false", queued, s->o.queue, n, tokens);
    k3_srv_status_json(s, &b);
    k3_sbuf_str(&b, "}\n");
    return reply(c, 200, b.oom ? (k3_sbuf_free(&b), NULL) : b.p, NULL, NULL);
}

/* Prometheus text (metrics.h). Rendered under s->mu from the server's own counters; this
 * scrape is counted after its text, so it shows in the next one. */
static enum MHD_Result get_metrics(k3_server *s, struct MHD_Connection *c) {
    k3_sbuf b = {0};
    pthread_mutex_lock(&s->mu);
    k3_metrics_gauges g = {.active = s->n_active, .queued = s->n_queued, .slots = s->slots,
                           .queue_limit = s->o.queue, .states_kept = s->states_kept,
                           .states_cap = s->states_cap, .streams_waiting = s->n_waiting,
                           .backlog_peak = s->backlog_peak};
    k3_metrics_text(&s->metrics, &g, &b);
    k3_metrics_request(&s->metrics, "/metrics", 200);
    pthread_mutex_unlock(&s->mu);
    if (b.oom) {
        k3_sbuf_free(&b);
        return reply(c, 500, NULL, NULL, NULL);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(b.len, b.p, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        k3_sbuf_free(&b);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* The chat page (ui.h): static bytes from the binary. The policy lets the page load only its
 * own files and talk only to this server, and never run inline script. */
static enum MHD_Result get_ui(k3_server *s, struct MHD_Connection *c, const k3_conn *cc) {
    count(s, "/ui", 200);
    struct MHD_Response *r = MHD_create_response_from_buffer(
        cc->ui->size, (void *)cc->ui->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", cc->ui_type);
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'self'; script-src 'self'; style-src 'self'; "
                            "img-src 'self' data:; connect-src 'self'; object-src 'none'; "
                            "base-uri 'none'; frame-ancestors 'none'");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- generation endpoints ------------------------------------------------------------------------ */

static void job_log(const k3_server *s, const k3_job *j, int status) {
    char clamp[96] = "";
    if (j->p.max_clamped)
        snprintf(clamp, sizeof clamp, "; max_tokens %d cut to --max-tokens %d",
                 j->p.max_requested, j->p.max_tokens);
    log_line(s, "POST %s %d%s prompt %d (cached %d) + %d tokens, %s%s%s, %.3f s%s%s%s", j->path,
             status, j->p.stream ? " stream" : "", j->n_prompt_used, j->n_cached, j->n_completion,
             j->finish ? j->finish : j->failed ? "failed" : j->stalled ?
             "cancelled: the client read nothing for --stall-timeout" : "cancelled",
             j->stopped[0] ? ": " : "", j->stopped,
             j->t_end > j->t_submit ? j->t_end - j->t_submit : 0.0,
             j->p.effort_mapped ? "; reasoning_effort medium read as " K3_SRV_MEDIUM_EFFORT : "",
             clamp, j->resp ? j->resp->note : "");
}

static void wait_tick(k3_server *s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += K3_WAIT_TICK_NS;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&s->progress, &s->mu, &ts);
}

/* The stream's MHD timeout: --stall-timeout while MHD holds events for the socket (a client
 * that takes nothing that long is closed, D21, also after its generation ended), none while
 * sse_read waits for the worker (a long prefill or queue wait sends nothing). Switching from
 * none to a timeout restarts MHD's idle clock. Called on the connection's thread. */
static void stream_timeout(k3_job *j, bool on) {
    if (j->conn_timed == on) return;
    j->conn_timed = on;
    double st = j->srv->o.stall_timeout_s;
    MHD_set_connection_option(j->conn, MHD_CONNECTION_OPTION_TIMEOUT,
                              on ? (unsigned)(st < 1 ? 1 : st + 0.999) : 0u);
}

/* SSE content reader: hands out what the worker produced; blocks until there is some. */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    k3_job *j = cls;
    k3_server *s = j->srv;
    pthread_mutex_lock(&s->mu);
    for (bool waited = false;; waited = true) {
        size_t avail = j->out.len - j->out_taken;
        if (avail) {
            size_t n = avail < max ? avail : max;
            memcpy(buf, j->out.p + j->out_taken, n);
            j->out_taken += n;
            j->t_read = k3_now_s();
            if (j->out_taken == j->out.len) j->out.len = j->out_taken = 0;
            j->t_sent = k3_now_s();
            pthread_cond_broadcast(&s->progress); /* its slot may be sitting out (worker.c) */
            pthread_mutex_unlock(&s->mu);
            stream_timeout(j, true);
            return (ssize_t)n;
        }
        if (j->state == K3_JOB_DONE) {
            pthread_mutex_unlock(&s->mu);
            MHD_set_connection_option(j->conn, MHD_CONNECTION_OPTION_TIMEOUT, K3_IDLE_TIMEOUT_S);
            return j->finish || j->failed ? MHD_CONTENT_READER_END_OF_STREAM
                                          : MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (!waited && j->conn_timed) { /* about to wait for the worker: no timeout */
            pthread_mutex_unlock(&s->mu);
            stream_timeout(j, false);
            pthread_mutex_lock(&s->mu);
            continue;
        }
        /* Queued, prefilling or thinking without a visible event: everything handed out so
         * far ended on an event boundary (push_event appends whole events), so a keep-alive
         * may go in between. */
        double now = k3_now_s();
        if (now - j->t_sent >= K3_KEEPALIVE_S) {
            k3_sbuf ka = {0};
            k3_emit_keepalive(j, &ka);
            size_t n = ka.len < max ? ka.len : 0;
            if (n) memcpy(buf, ka.p, n);
            k3_sbuf_free(&ka);
            j->t_sent = now;
            if (n) {
                pthread_mutex_unlock(&s->mu);
                return (ssize_t)n;
            }
        }
        wait_tick(s);
        /* The client sent FIN: half-closed (still reading) or gone. An SSE comment, which
         * clients ignore, makes a gone client's kernel answer RST, seen below next tick. */
        if (!j->probed && j->state != K3_JOB_DONE && k3_srv_client_read_closed(j->fd)) {
            j->probed = true;
            static const char ping[] = ": k3\n\n";
            size_t n = sizeof ping - 1 < max ? sizeof ping - 1 : max;
            memcpy(buf, ping, n);
            pthread_mutex_unlock(&s->mu);
            return (ssize_t)n;
        }
        /* While queued nobody else watches this socket (the worker does once it runs). */
        if (j->state == K3_JOB_QUEUED && k3_job_client_gone(j)) {
            k3_job_cancel_locked(s, j);
            pthread_mutex_unlock(&s->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void job_free(k3_job *j) {
    k3_resp_job_free(j->resp);
    k3_job_free(j);
}

/* The status a cancelled job is logged and counted with (D16): 499, nginx's "client closed
 * the request", when its client left (or stalled), 503 when the server is stopping. */
static int cancelled_status(k3_server *s) {
    pthread_mutex_lock(&s->mu);
    bool stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    return stopping ? 503 : 499;
}

/* Called when MHD drops the streamed response (done, or the client left). The status line
 * said 200; a failed stream ends with an error event (logged 500), a cancelled one is 499. */
static void sse_free(void *cls) {
    k3_job *j = cls;
    k3_job_wait_done(j->srv, j, true);
    int status = j->failed ? 500 : j->finish ? 200 : cancelled_status(j->srv);
    if (status == 499 && k3_now_s() - j->t_read >= j->srv->o.stall_timeout_s)
        j->stalled = true; /* MHD's timeout closed it (start_stream), before the worker did */
    job_log(j->srv, j, status);
    count(j->srv, j->path, status == 500 ? 200 : status);
    job_free(j);
}

static enum MHD_Result start_stream(k3_server *s, struct MHD_Connection *c, k3_job *j) {
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, j, sse_free);
    if (!r) {
        k3_job_wait_done(s, j, true);
        job_free(j);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    /* None while waiting for the worker, --stall-timeout while events wait for the socket
     * (stream_timeout); hang-ups are caught by polling. */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r); /* sse_free runs when MHD lets go of it */
    return ret;
}

/* Non-streamed: wait for the worker, watching the socket while queued. A client that sent
 * FIN may have half-closed and still read (D6): an interim "100 Continue", which HTTP/1.1
 * clients skip, makes a gone client's kernel answer RST, so only that cancels. HTTP/1.0 has no
 * interim answer to probe with, and its clients (nginx's default to upstreams) do not
 * half-close: a FIN is taken as gone (j->fin_gone), by the worker before each token too (D19).
 * MHD writes nothing on this connection while its thread is here. */
static enum MHD_Result finish_plain(k3_server *s, struct MHD_Connection *c, k3_job *j,
                                    bool http11) {
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0);
    pthread_mutex_lock(&s->mu);
    while (j->state != K3_JOB_DONE) {
        wait_tick(s);
        if (http11 && !j->probed && k3_srv_client_read_closed(j->fd)) {
            static const char interim[] = "HTTP/1.1 100 Continue\r\n\r\n";
            j->probed = true;
            if (send(j->fd, interim, sizeof interim - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
                k3_job_cancel_locked(s, j);
        }
        if (j->state == K3_JOB_QUEUED && k3_job_client_gone(j)) k3_job_cancel_locked(s, j);
    }
    pthread_mutex_unlock(&s->mu);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, K3_IDLE_TIMEOUT_S);
    enum MHD_Result ret;
    if (j->failed) {
        ret = reply_error(s, c, "POST", j->path, &j->err);
    } else if (!j->finish) {
        k3_api_error e;
        k3_api_fail(&e, 503, "server_error", NULL, NULL, "the generation was cancelled");
        int status = cancelled_status(s); /* 499 (counted, logged) when nobody listens */
        job_log(s, j, status);
        count(s, j->path, status);
        ret = reply(c, 503, k3_api_error_json(&e), "Retry-After", "1"); /* if anyone listens */
    } else {
        job_log(s, j, 200);
        count(s, j->path, 200);
        ret = reply(c, 200, k3_srv_reply_json(s, j), NULL, NULL);
    }
    job_free(j);
    return ret;
}

/* Validates, renders and tokenizes on this thread, then queues the job for the worker. */
static enum MHD_Result post_generate(k3_server *s, struct MHD_Connection *c, k3_conn *cc) {
    k3_api_error e = {0};
    cJSON *root = cJSON_ParseWithLength(cc->body.p ? cc->body.p : "", cc->body.len);
    if (!root) {
        k3_api_fail(&e, 400, "invalid_request_error", NULL, NULL, "We could not parse the JSON "
                    "body of your request: it is not valid JSON");
        return reply_error(s, c, "POST", cc->path, &e);
    }
    if (k3_srv_check_strings(cc->body.p, cc->body.len, root, &e)) {
        cJSON_Delete(root);
        return reply_error(s, c, "POST", cc->path, &e);
    }
    k3_job *j = calloc(1, sizeof *j);
    if (!j) {
        cJSON_Delete(root);
        return reply(c, 500, NULL, NULL, NULL);
    }
    if (cc->route == R_MESSAGES || cc->route == R_COUNT_TOKENS) { /* anthropic.h */
        cJSON *chat = k3_anth_to_chat(root, cc->route == R_COUNT_TOKENS, &e);
        cJSON_Delete(root);
        if (!chat) {
            free(j);
            return reply_error(s, c, "POST", cc->path, &e);
        }
        root = chat;
        j->anthropic = true;
    } else if (cc->route == R_RESPONSES) { /* responses.h */
        cJSON *chat = k3_resp_to_chat(root, s->resp_store, &j->resp, &e);
        cJSON_Delete(root);
        if (!chat) {
            free(j);
            return reply_error(s, c, "POST", cc->path, &e);
        }
        root = chat;
    }
    j->root = root; /* owned by the job from here on */
    enum k3_srv_kind kind = cc->route == R_COMPLETIONS ? K3_SRV_COMPLETIONS : K3_SRV_CHAT;
    int bad = k3_srv_parse_params(root, kind, s->o.max_tokens, &j->p, &e);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->fin_gone = !cc->http11;
    j->p.ctx = s->ctx;
    j->p.client_fd = j->fd;
    if (!bad) k3_srv_apply_defaults(root, &s->o, &j->p);
    if (!bad)
        bad = k3_srv_build_prompt(s->eng, root, &j->p, &j->req, &j->prompt, &j->n_prompt, &e);
    if (!bad && cc->route == R_COUNT_TOKENS) { /* the prompt is all it asks about */
        char *body = malloc(64);
        if (body) snprintf(body, 64, "{\"input_tokens\":%zu}\n", j->n_prompt);
        log_line(s, "POST %s 200 %zu tokens", cc->path, j->n_prompt);
        count(s, cc->path, 200);
        job_free(j);
        return reply(c, 200, body, NULL, NULL);
    }
    if (!bad)
        bad = k3_srv_check_context(&j->p, j->n_prompt, s->ctx,
                                   k3_engine_config(s->eng)->max_position_embeddings, &e);
    if (!bad) {
        j->srv = s;
        j->conn = c;
        j->path = cc->path;
        j->created = (long long)time(NULL);
        j->t_submit = j->t_read = k3_now_s();
        pthread_mutex_lock(&s->mu);
        unsigned long long serial = ++s->n_ids;
        pthread_mutex_unlock(&s->mu);
        snprintf(j->id, sizeof j->id, "%s%sk3%llx%llx", j->anthropic ? "msg" : j->resp ? "resp"
                 : kind == K3_SRV_CHAT ? "chatcmpl" : "cmpl", j->anthropic || j->resp ? "_" : "-",
                 (unsigned long long)s->started_unix, serial);
        if (j->resp) snprintf(j->resp->id, sizeof j->resp->id, "%s", j->id);
        k3_emit_opening(s, j); /* the client hears at once, however long it waits */
        j->t_sent = k3_now_s();
        bad = k3_job_submit(s, j, &e);
    }
    if (bad) {
        job_free(j);
        return reply_error(s, c, "POST", cc->path, &e);
    }
    return j->p.stream ? start_stream(s, c, j) : finish_plain(s, c, j, cc->http11);
}

/* ---- routing --------------------------------------------------------------------------------- */

static enum route route_of(const char *url, k3_conn *cc) {
    if ((cc->ui = k3_ui_find(url, &cc->ui_type))) return cc->path = "/ui", R_UI;
    if (!strncmp(url, "/v1/", 4)) url += 3;
    if (!strcmp(url, "/models")) return cc->path = "/v1/models", R_MODELS;
    if (!strcmp(url, "/completions")) return cc->path = "/v1/completions", R_COMPLETIONS;
    if (!strcmp(url, "/chat/completions")) return cc->path = "/v1/chat/completions", R_CHAT;
    if (!strcmp(url, "/health")) return cc->path = "/health", R_HEALTH;
    if (!strcmp(url, "/metrics")) return cc->path = "/metrics", R_METRICS;
    if (!strcmp(url, "/messages")) return cc->path = "/v1/messages", R_MESSAGES;
    if (!strcmp(url, "/responses")) return cc->path = "/v1/responses", R_RESPONSES;
    if (!strcmp(url, "/messages/count_tokens"))
        return cc->path = "/v1/messages/count_tokens", R_COUNT_TOKENS;
    if (!strncmp(url, "/models/", 8) && url[8] && strlen(url + 8) < sizeof cc->model) {
        snprintf(cc->model, sizeof cc->model, "%s", url + 8);
        return cc->path = "/v1/models/ID", R_MODEL;
    }
    return R_NONE;
}

/* Equal strings, in time independent of where they differ. */
static bool same_secret(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = na != nb;
    for (size_t i = 0; i < na; i++) d |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return d == 0;
}

static bool authorized(const k3_server *s, struct MHD_Connection *c) {
    if (!s->o.api_key || !s->o.api_key[0]) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"); /* Anthropic */
    if (x && same_secret(x, s->o.api_key)) return true;
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    return same_secret(h + 7, s->o.api_key);
}

/* A connection over a cap (conns.h): 503 with Retry-After, and closed. */
static enum MHD_Result reply_refused(k3_server *s, struct MHD_Connection *c, const char *path) {
    k3_api_error e;
    k3_api_fail(&e, 503, "server_error", "too_many_connections", NULL,
                "Too many connections to this server (at most %d, or %d from one address: k3 "
                "serve --max-connections, --max-connections-per-address); retry later",
                s->o.max_connections, s->o.max_per_address);
    count(s, path, 503);
    log_line(s, "%s 503 connection over the cap", path ? path : "(request)");
    struct MHD_Response *r = NULL;
    char *body = k3_api_error_json(&e);
    if (body) r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Retry-After", "1");
    MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c, 503, r);
    MHD_destroy_response(r);
    return ret;
}

/* The first call: headers only. Answers at once when the request cannot succeed. */
static enum MHD_Result on_headers(k3_server *s, struct MHD_Connection *c, const char *url,
                                  const char *method, k3_conn *cc) {
    k3_api_error e = {0};
    cc->route = route_of(url, cc);
    if (k3_conns_refused(c)) {
        cc->answered = true;
        return k3_conns_dispatch(s, c) ? reply_refused(s, c, cc->path) : MHD_NO;
    }
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    const char *type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    bool post = cc->route == R_COMPLETIONS || cc->route == R_CHAT || cc->route == R_MESSAGES ||
                cc->route == R_COUNT_TOKENS || cc->route == R_RESPONSES;
    if (!k3_srv_host_allowed(&s->o, host))
        k3_api_fail(&e, 403, "invalid_request_error", "host_not_allowed", NULL,
                    "This server does not answer to Host '%s' (a page of another site may be "
                    "reaching it through DNS rebinding); if that name is yours, start k3 serve "
                    "with --allow-host NAME", host);
    else if (cc->route != R_UI && !k3_srv_origin_allowed(&s->o, origin, host))
        k3_api_fail(&e, 403, "invalid_request_error", "origin_not_allowed", NULL,
                    "Requests from the web page at %s are refused (a page of another site must "
                    "not drive this server); if that page is yours, start k3 serve with "
                    "--allow-origin %s", origin, origin);
    else if (cc->route == R_NONE)
        k3_api_fail(&e, 404, "invalid_request_error", "unknown_url", NULL,
                    "Invalid URL (%s %s)", method, url);
    else if (strcmp(method, post ? "POST" : "GET")) {
        k3_api_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                    "%s %s is not supported; use %s", method, url, post ? "POST" : "GET");
        e.allow = post ? "POST" : "GET";
    }
    else if (cc->route != R_HEALTH && cc->route != R_UI && !authorized(s, c))
        k3_api_fail(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                    "Missing or incorrect API key: send \"Authorization: Bearer KEY\" with the "
                    "key given to k3 serve (--api-key or K3_API_KEY)");
    else {
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body_bytes)
            k3_api_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                        "The request body is larger than this server's limit of %zu bytes "
                        "(k3 serve --max-body)", s->o.max_body_bytes);
        else if (post && !k3_srv_json_type(type))
            k3_api_fail(&e, 415, "invalid_request_error", "unsupported_media_type", NULL,
                        "The body must be sent as Content-Type: application/json, not '%s' "
                        "(curl: -H 'Content-Type: application/json')", type);
    }
    if (!e.status) return MHD_YES;
    cc->answered = true;
    if (!k3_conns_dispatch(s, c)) return MHD_NO; /* answered 408 already */
    return reply_error(s, c, method, cc->path ? cc->path : url, &e);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
    k3_server *s = cls;
    k3_conn *cc = *con_cls;
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        *con_cls = cc;
        cc->http11 = version && !strcmp(version, MHD_HTTP_VERSION_1_1);
        return on_headers(s, c, url, method, cc);
    }
    if (*upload_size) {
        if (!cc->answered && !cc->too_large) {
            if (cc->body.len + *upload_size > s->o.max_body_bytes) {
                cc->too_large = true; /* chunked bodies have no Content-Length to check */
                k3_sbuf_free(&cc->body);
            } else {
                k3_sbuf_add(&cc->body, upload, *upload_size);
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cc->answered) return MHD_YES;
    cc->answered = true;
    if (!k3_conns_dispatch(s, c)) return MHD_NO; /* answered 408 already */
    k3_api_error e = {0};
    if (cc->too_large || cc->body.oom) {
        k3_api_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                    "The request body is larger than this server's limit of %zu bytes "
                    "(k3 serve --max-body)", s->o.max_body_bytes);
        return reply_error(s, c, method, cc->path, &e);
    }
    switch (cc->route) {
    case R_MODELS: return get_models(s, c);
    case R_MODEL: return get_model(s, c, cc->model);
    case R_HEALTH: return get_health(s, c);
    case R_UI: return get_ui(s, c, cc);
    case R_METRICS: return get_metrics(s, c);
    default: return post_generate(s, c, cc);
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)toe;
    k3_conns_request_done(cls, c);
    k3_conn *cc = *con_cls;
    if (!cc) return;
    k3_sbuf_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

/* libmicrohttpd's own messages. Those about a connection that ended (the client left, or
 * a stream ended with an error event already sent) are the normal life of a server, logged
 * per request by job_log already: dropped, so the log shows only real problems (issue 15). */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    const k3_server *s = cls;
    if (!s->o.log_requests) return;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = 0;
    static const char *const benign[] = {
        "Closing connection (application reported error generating data)", /* stream cut */
        "Socket has been disconnected", "Failed to send", NULL};
    for (int i = 0; benign[i]; i++)
        if (!strncmp(line, benign[i], strlen(benign[i]))) return;
    log_write("http: ", line);
}

/* ---- start / stop ------------------------------------------------------------------------------ */

static int bind_address(const char *host, int port, struct sockaddr_storage *ss, int *v6,
                        k3_err *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc || !res)
        return k3_fail(err, K3_ERR_USAGE, "--host %s: cannot resolve: %s", host, gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return 0;
}

static void default_model_id(const char *dir, char *out, size_t cap) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t start = n;
    while (start > 0 && dir[start - 1] != '/') start--;
    snprintf(out, cap, "%.*s", (int)(n - start), dir + start);
    if (!out[0]) snprintf(out, cap, "k3");
}

int k3_server_start(const k3_engine *e, const char *model_dir, const k3_server_opts *opts,
                    k3_server **out, k3_err *err) {
    if (opts->api_key && !opts->api_key[0]) /* an empty key would mean no auth at all */
        return k3_fail(err, K3_ERR_USAGE, "api_key is empty: give a key, or none for no auth");
    k3_server *s = calloc(1, sizeof *s);
    if (!s) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    s->eng = e;
    s->o = *opts;
    if (!s->o.host) s->o.host = "127.0.0.1";
    if (!s->o.max_body_bytes) s->o.max_body_bytes = 8u << 20;
    if (!s->o.max_connections) s->o.max_connections = K3_MAX_CONNECTIONS;
    s->stream_backlog = k3_srv_test_stream_backlog();
    if (!s->stream_backlog) s->stream_backlog = K3_STREAM_BACKLOG_BYTES;
    if (!s->o.max_per_address)
        s->o.max_per_address = s->o.max_connections / 8 > 4 ? s->o.max_connections / 8 : 4;
    if (!s->o.request_timeout_s) s->o.request_timeout_s = K3_REQUEST_TIMEOUT_S;
    if (!s->o.stall_timeout_s) s->o.stall_timeout_s = K3_STALL_TIMEOUT_S;
    s->started_unix = (long long)time(NULL);
    if (s->o.model_id) snprintf(s->model_id, sizeof s->model_id, "%s", s->o.model_id);
    else default_model_id(model_dir, s->model_id, sizeof s->model_id);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->progress, NULL);
    if (!(s->resp_store = malloc(sizeof *s->resp_store))) {
        free(s);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    k3_resp_store_init(s->resp_store);
    s->sync_ready = true;
    struct sockaddr_storage ss;
    int v6 = 0, rc = bind_address(s->o.host, s->o.port, &ss, &v6, err);
    if (!rc) rc = k3_worker_start(s, err);
    if (!rc) rc = k3_conns_start(s, err);
    if (rc) {
        k3_server_stop(s);
        return rc;
    }
    /* Slowloris (D5, D15): connections that trickle a header byte by byte each hold a
     * thread; one address may hold only a share of them, so the others (and /health) get in,
     * and each has a deadline (conns.h). MHD's own limits are the caps plus a margin, so that
     * a connection over a cap is answered 503 rather than dropped. */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_AUTO | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    s->mhd = MHD_start_daemon(flags, (uint16_t)s->o.port, NULL, NULL, on_request, s,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                              MHD_OPTION_CONNECTION_LIMIT, k3_conns_mhd_limit(s),
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, k3_conns_mhd_per_address(s),
                              MHD_OPTION_NOTIFY_CONNECTION, k3_conns_notify, s,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)K3_IDLE_TIMEOUT_S,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                              MHD_OPTION_END);
    if (!s->mhd) {
        k3_server_stop(s);
        return k3_fail(err, K3_ERR_USAGE, "cannot listen on %s port %d (in use, or not an "
                       "address of this machine)", opts->host ? opts->host : "127.0.0.1",
                       opts->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->o.port;
    snprintf(s->url, sizeof s->url, v6 ? "http://[%s]:%d" : "http://%s:%d", s->o.host, s->port);
    *out = s;
    return 0;
}

void k3_server_stop(k3_server *s) {
    if (!s) return;
    if (s->sync_ready) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true; /* running and queued jobs end; their connections return */
        pthread_cond_broadcast(&s->work);
        pthread_cond_broadcast(&s->progress);
        pthread_mutex_unlock(&s->mu);
    }
    if (s->mhd) MHD_stop_daemon(s->mhd);
    k3_conns_stop(s);
    k3_worker_stop(s);
    if (s->sync_ready) {
        pthread_cond_destroy(&s->progress);
        pthread_cond_destroy(&s->work);
        pthread_mutex_destroy(&s->mu);
        k3_resp_store_free(s->resp_store);
        free(s->resp_store);
    }
    free(s);
}

int k3_server_port(const k3_server *s) { return s->port; }
const char *k3_server_model_id(const k3_server *s) { return s->model_id; }
const char *k3_server_url(const k3_server *s) { return s->url; }

void k3_server_describe_policy(const k3_server *s, char *buf, size_t cap) {
    char ceiling[64], queue[96];
    if (s->o.max_tokens) snprintf(ceiling, sizeof ceiling, "%d", s->o.max_tokens);
    else snprintf(ceiling, sizeof ceiling, "up to the context");
    if (s->o.queue) snprintf(queue, sizeof queue, "up to %d more wait in a FIFO, 429 beyond",
                             s->o.queue);
    else snprintf(queue, sizeof queue, "others get 429 + Retry-After");
    char at_once[96];
    if (s->slots > 1) snprintf(at_once, sizeof at_once, "up to %d generations at once, in "
                               "shared passes", s->slots);
    else snprintf(at_once, sizeof at_once, "one generation at a time");
    char pc[PATH_MAX + 96];
    if (s->o.prompt_cache)
        snprintf(pc, sizeof pc, "prompt cache %s within %g GB, %d in RAM", s->o.prompt_cache,
                 s->o.prompt_cache_gb > 0 ? s->o.prompt_cache_gb : K3_PCACHE_DEFAULT_GB,
                 s->o.prompt_cache_ram);
    else
        snprintf(pc, sizeof pc, "prompt cache off (--prompt-cache DIR)");
    snprintf(buf, cap, "%s (%s); completion tokens per request: %s; context %d tokens; "
             "conversation states kept: %d; %s; API key %s", at_once, queue, ceiling, s->ctx,
             s->states_cap, pc, s->o.api_key && s->o.api_key[0] ? "required" : "not required");
}
