/* srv.h — internals of the server module shared by its files (not a public API; the C tests
 * include it to check request validation).
 *
 *   http.c     libmicrohttpd glue: routing, auth, body limit, JSON replies, the SSE reader
 *   request.c  request JSON -> k3_srv_params (+ the prompt), or an OpenAI-shaped error
 *   queue.c, clients.c, convcache.c, pcache.c, slot.c, sched.c, worker.c: the worker
 *              (worker.h): admission (busy / FIFO), client polling, the state cache, the
 *              prompt cache (pcache.h), one generation, the scheduler's passes, the worker
 *              thread
 *   emit.c     what one generated piece of text becomes: stop strings, SSE chunks, JSON
 *   anthropic.c / responses.c  the Messages and Responses APIs as chat bodies, and their replies
 *
 * Locking: everything in k3_job below "guarded by srv->mu" is read and written only with
 * k3_server.mu held; the rest is written before the job is queued and read-only after.
 */
#ifndef K3_SRV_H
#define K3_SRV_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "../chat/render.h"
#include "../engine/k3.h"
#include "../tok/tokenizer.h"
#include "metrics.h"
#include "server.h"

/* ---- growable byte buffer ------------------------------------------------------------- */

typedef struct k3_sbuf {
    char *p;
    size_t len, cap;
    int oom; /* an append failed; the content is truncated */
} k3_sbuf;

void k3_sbuf_add(k3_sbuf *b, const char *s, size_t n);
void k3_sbuf_str(k3_sbuf *b, const char *s);
void k3_sbuf_printf(k3_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s[0..n) as the inside of a JSON string (quotes not included). */
void k3_sbuf_json_str(k3_sbuf *b, const char *s, size_t n);
void k3_sbuf_free(k3_sbuf *b);

/* ---- errors as the client sees them ----------------------------------------------------- */

typedef struct k3_api_error {
    int status;        /* HTTP status: 400, 401, 404, 413, 429, 500, 503 */
    const char *type;  /* OpenAI error type: "invalid_request_error", ... */
    const char *code;  /* OpenAI error code or NULL: "context_length_exceeded", ... */
    const char *allow; /* 405: the method to use (the Allow header) */
    char param[160];   /* the offending field ("messages[1].content[0].type"), or "" */
    char message[768];
} k3_api_error;

/* Fills e and returns -1 (so validators can `return k3_api_fail(...)`). */
int k3_api_fail(k3_api_error *e, int status, const char *type, const char *code,
                const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* 400 unsupported_parameter: "k3 cannot honour 'param': why" (a field whose meaning k3
 * cannot give). Returns -1. */
int k3_api_unsupported(k3_api_error *e, const char *param, const char *why);
/* 400: "'param' must be want" (e.g. want = "a string"). Returns -1. */
int k3_api_wrong(k3_api_error *e, const char *param, const char *want);
/* o[key] when it is a JSON string, else NULL (absent, null or another type). */
const char *k3_json_str(const cJSON *o, const char *key);
/* {"error":{"message":...,"type":...,"param":...,"code":...}} as a malloc'd string. */
char *k3_api_error_json(const k3_api_error *e);

/* ---- a parsed request ----------------------------------------------------------------- */

enum k3_srv_kind { K3_SRV_COMPLETIONS, K3_SRV_CHAT };

#define K3_SRV_MAX_STOP 4
#define K3_SRV_MAX_STOP_BYTES 256

typedef struct k3_srv_params {
    enum k3_srv_kind kind;
    int max_tokens;          /* completion tokens; 0 = until the end of the message */
    int max_requested;       /* the request's own max_tokens (0 = none given) */
    bool max_clamped;        /* max_tokens was above the server's ceiling: cut to it */
    double temperature;      /* 0 = greedy */
    double top_p;            /* (0, 1] */
    int top_k;               /* 0 = off */
    uint64_t seed;
    bool has_seed;
    char *stop[K3_SRV_MAX_STOP]; /* malloc'd, non-empty */
    int n_stop;
    bool stream, include_usage;
    bool thinking;           /* chat: generation starts in the thinking channel */
    const char *effort;      /* chat: the server's default effort when the request gives
                                none (k3_srv_apply_defaults), else NULL */
    bool effort_mapped;      /* reasoning_effort "medium" was read as K3_SRV_MEDIUM_EFFORT */
    /* not from JSON; set by the connection before k3_srv_build_prompt (0 / -1 = none) */
    int ctx;                 /* the context in tokens: rendering stops once past it */
    int client_fd;           /* the client's socket: rendering stops when it is gone */
    bool tools;              /* chat: tools were offered; the reply's tools block is parsed
                                into tool calls (src/chat/toolcall.h) */
    bool tool_required;      /* tool_choice "required" */
    bool parallel_tool_calls;/* false: generation ends after the first complete call */
    bool logprobs;           /* chat logprobs: true / completions logprobs: N given */
    int top_logprobs;        /* 0..20 alternatives per token */
    bool echo;               /* completions: the prompt is returned with its logprobs */
} k3_srv_params;

/* OpenAI's reasoning_effort "medium" (the default of its clients) is not a K3 effort: the
 * official renderer accepts low, high and max (spec §12.2; its system text lists medium, the
 * encoder refuses it). The server reads it as the nearest effort at or above it, so a client
 * gets at least the thinking it asked for, and says so in the request's log line. */
#define K3_SRV_MEDIUM_EFFORT "high"

/* Checks every top-level field of a completions or chat request (types, ranges, fields k3
 * cannot honour) and fills p; prompt/messages are checked only for shape here.
 * max_tokens_ceiling > 0 clamps a larger max_tokens to it (p->max_clamped). Returns 0, or -1
 * with e filled (400). */
int k3_srv_parse_params(const cJSON *root, enum k3_srv_kind kind, int max_tokens_ceiling,
                        k3_srv_params *p, k3_api_error *e);
void k3_srv_params_free(k3_srv_params *p);

/* Refuses a body (its raw text and its parse root) with a "\u0000" escape inside a string
 * or key: cJSON's strings end at the NUL, so the rest would silently vanish from the prompt.
 * Returns 0, or -1 with e filled (400 naming the field, e.g. "messages[0].content"). */
int k3_srv_check_strings(const char *body, size_t len, const cJSON *root, k3_api_error *e);

/* Builds the prompt token ids of a validated request: raw completions encode `prompt` as
 * plain text (or take its ids); chat renders `messages` with the K3 chat format
 * (src/chat/render.h) into *req, which points into root (role "developer" is rewritten to
 * "system" in root first). *ids is malloc'd. Returns 0, or -1 with e filled (400, or 500
 * when out of memory). */
/* The server's defaults (k3_server_opts.temperature, .effort) for what the request left out.
 * Call after k3_srv_parse_params succeeded. */
void k3_srv_apply_defaults(const cJSON *root, const k3_server_opts *o, k3_srv_params *p);

int k3_srv_build_prompt(const k3_engine *eng, cJSON *root, const k3_srv_params *p,
                        k3_chat_request *req, int32_t **ids, size_t *n, k3_api_error *e);

/* The context check of a built prompt: n_prompt ids, and max_tokens more when given, must fit
 * the session's ctx tokens (the prompt itself must leave room for one). Returns 0, or -1 with
 * e filled (400 context_length_exceeded naming max_tokens, or the prompt / messages when the
 * prompt alone is too long) saying what to change: `--ctx` while ctx is below the model's
 * max_position_embeddings (model_max), else fewer max_tokens or a shorter prompt. */
int k3_srv_check_context(const k3_srv_params *p, size_t n_prompt, int ctx, int model_max,
                         k3_api_error *e);

/* ---- log probabilities (logprobs.c) ------------------------------------------------------- */

/* The logprobs of a reply as JSON pieces: chat entries, or completions' four arrays. Values
 * are log_softmax of the exact float32 logits (the model's distribution, not the sampler's
 * after temperature / top-p / top-k). */
typedef struct k3_logprobs {
    k3_sbuf content;                     /* chat: {token, logprob, bytes, top_logprobs}, ... */
    k3_sbuf tokens, values, top, offsets;/* completions */
    size_t offset;                       /* bytes of the tokens so far (text_offset) */
    int n;
} k3_logprobs;

/* Appends the entry of token `id` drawn from `logits` (vocab floats; NULL = nothing predicted
 * it: the first prompt token, completions only) with its `top` (<= 20) likeliest ids. */
void k3_logprobs_add(k3_logprobs *lp, const k3_tokenizer *t, const float *logits, int vocab,
                     int32_t id, int top, bool chat);
/* The "logprobs" value: {"content": [...]} (chat) or {"tokens", "token_logprobs",
 * "top_logprobs", "text_offset"} (completions). */
void k3_logprobs_json(k3_sbuf *b, const k3_logprobs *lp, bool chat);
void k3_logprobs_free(k3_logprobs *lp);

/* ---- jobs and the server ---------------------------------------------------------------- */

/* Unread bytes a streamed reply may hold (j->out) before its generation sits out the passes
 * until the client reads (worker.c): the generation runs ahead of a slow client by this much
 * at most (plus one round's events), and never makes the worker wait. The default of
 * k3_server.stream_backlog (which the test build may set lower, K3_SERVER_TEST_STREAM_BACKLOG). */
#define K3_STREAM_BACKLOG_BYTES ((size_t)1 << 20)

enum k3_job_state { K3_JOB_QUEUED, K3_JOB_RUNNING, K3_JOB_DONE };

#define K3_SRV_MAX_PARALLEL 64 /* --parallel's ceiling (the multistep pass holds up to
                                  K3_MULTISTEP_MAX_ROWS rows: a chunk beside each slot's) */

typedef struct k3_job {
    /* written by the connection thread before submission, read-only afterwards */
    struct k3_server *srv;
    struct MHD_Connection *conn;
    const char *path;        /* the route, for the log line */
    k3_srv_params p;
    cJSON *root;             /* the request body (chat: req points into it) */
    k3_chat_request req;     /* chat only */
    int32_t *prompt;         /* canonical prompt ids; the worker may splice (worker.c) */
    size_t n_prompt;
    int fd;                  /* client socket, polled for hang-up; -1 = unknown */
    bool anthropic;          /* POST /v1/messages: replies in Anthropic's shapes (anthropic.h) */
    struct k3_resp_job *resp;/* POST /v1/responses: the Response's state (responses.h); freed
                                by the connection (http.c), not k3_job_free */
    double t_sent;           /* connection only: monotonic seconds of the last bytes handed
                                to the stream (keep-alives follow K3_KEEPALIVE_S of silence) */
    bool fin_gone;           /* HTTP/1.0: a FIN after the complete request means the client is
                                gone (no half-close to tell apart; D19) */
    char id[48];
    long long created;       /* Unix seconds */
    double t_submit;         /* monotonic seconds */

    /* guarded by srv->mu */
    enum k3_job_state state;
    bool cancel;             /* the client is gone or the server stops */
    bool conn_timed;         /* stream: its connection has MHD's timeout on (http.c; the
                                connection's thread only) */
    bool probed;             /* the client sent FIN: a probe was written to tell a half-close
                                from a close (http.c) */
    k3_sbuf out;             /* stream: SSE bytes not yet handed to the connection, of
                                which out_taken are taken: out.len - out_taken unread,
                                kept near s->stream_backlog (clients.c) */
    size_t out_taken;
    double t_read;           /* stream: monotonic seconds its connection last took bytes (or
                                the submission) */
    bool stalled;            /* cancelled because its streaming client read nothing for
                                o.stall_timeout_s (D21) */
    char stopped[192];       /* cancelled inside a pass: where it stopped (the engine's words,
                                k3_sched_pass_unwanted), for the log line; "" otherwise */
    struct k3_job *next;     /* FIFO link while queued */

    /* written by the worker while RUNNING; read by the connection once DONE */
    struct k3_slot *slot;        /* the worker's slot running it (worker.c) */
    k3_sbuf content, reasoning;  /* non-stream: the reply so far */
    const char *finish;          /* "stop", "length", "tool_calls", "malformed_tool_call",
                                    or NULL (cancelled / failed) */
    k3_sbuf tool_calls;          /* non-stream: the message.tool_calls items, comma-joined */
    int n_tool_calls;
    int stop_index;              /* the stop string that matched (p.stop[i]), or -1 */
    k3_logprobs lp;              /* p.logprobs: per token, prompt tokens first with echo */
    char tool_error[160];        /* a malformed or cut tools block: why (also logged) */
    int n_prompt_used;           /* prompt tokens after any reuse splice */
    int n_cached;                /* prompt tokens whose state was reused */
    int n_completion, n_reasoning;
    bool failed;
    k3_api_error err;            /* when failed */
    double t_start, t_end;       /* monotonic seconds: start of prefill, end */
    double t_decode;             /* monotonic seconds: end of prefill (0 = not reached) */
    bool state_hit;              /* prefilled from a kept conversation state */
} k3_job;

/* What /health reports about the last finished generation and the engine's counters
 * (status.c). Written by the worker after each job, read by /health; guarded by srv->mu. */
typedef struct k3_srv_status {
    bool have_last;              /* a generation has finished since start */
    int prompt_tokens, cached_tokens, completion_tokens;
    double prefill_s, decode_s;  /* wall seconds of each phase of the last generation */
    double gb_per_token;         /* GB read from storage (experts + streamed spine) per token
                                    the last generation fed; 0 when all was in memory */
    uint64_t expert_requests, expert_hits; /* engine-wide since load; hits include prefetch */
    uint64_t bytes_read_total;   /* engine-wide storage bytes read (experts + spine) */
} k3_srv_status;

struct k3_server {
    const k3_engine *eng;
    k3_server_opts o;
    char model_id[256];
    char url[320];
    int port;
    int ctx;                 /* the session's capacity in tokens */
    struct MHD_Daemon *mhd;
    long long started_unix;
    bool sync_ready;         /* mu and the condition variables are initialised */

    pthread_mutex_t mu;
    pthread_cond_t work;     /* worker: a job was queued or stop was asked */
    pthread_cond_t progress; /* connections: a job produced output or changed state */
    bool stopping;
    k3_job *head, *tail;     /* FIFO of queued jobs */
    int n_queued;
    int n_active;            /* jobs running (admitted from the FIFO, not yet DONE) */
    int slots;               /* jobs that may run at once (--parallel) */
    unsigned long long n_requests; /* generations admitted */
    unsigned long long n_ids;      /* request ids handed out */
    unsigned long long n_tokens;   /* completion tokens generated, all requests */
    k3_srv_status status;          /* the last generation, for /health */
    k3_metrics metrics;            /* GET /metrics (metrics.h) */
    int n_waiting;                 /* running generations sitting out the passes until their
                                      streaming client reads (worker.c) */
    size_t backlog_peak;           /* the most unread bytes a stream has held (emit.c) */
    int states_kept, states_cap;   /* the state cache's entries and capacity, for /metrics */
    size_t stream_backlog;         /* unread bytes a stream may hold before its slot sits out
                                      (K3_STREAM_BACKLOG_BYTES; the test build may lower it) */

    struct k3_conns *conns;        /* accepted connections: caps and deadlines (conns.h) */

    pthread_t worker;
    bool worker_started;
    /* Owned by the worker thread only (no lock): the session, its kept tokens, scratch. */
    struct k3_worker_state *ws;
    struct k3_resp_store *resp_store; /* recent Responses for previous_response_id */
};

/* 1 when the connection on socket fd is dead (reset by the peer, or closed both ways). A
 * peer that only sent FIN may still be reading (half-close, D6): that is
 * k3_srv_client_read_closed, and a write tells the two apart (a closed peer answers RST). */
bool k3_srv_client_gone(int fd);
bool k3_srv_client_read_closed(int fd);
/* k3_srv_client_gone for job j's client, and for HTTP/1.0 (j->fin_gone) a FIN as well. */
bool k3_job_client_gone(const struct k3_job *j);

/* origin.c — local-server hygiene (issue 32, D20). The Host header (NULL: absent, HTTP/1.0)
 * names this server: a literal IPv4/IPv6 address, localhost, o->host, or a name in
 * o->allow_host (comma-separated; "*" = any). Without that a DNS-rebinding page could pass as
 * same-origin. */
bool k3_srv_host_allowed(const k3_server_opts *o, const char *host);
/* The Origin header (NULL: absent) is this server's own ("http://" or "https://" + Host) or
 * in o->allow_origin (comma-separated, exact; "*" = any). */
bool k3_srv_origin_allowed(const k3_server_opts *o, const char *origin, const char *host);
/* Content-Type is application/json (parameters allowed) or absent: a browser's cross-site
 * "simple" POST (text/plain, form types) is refused without a preflight. */
bool k3_srv_json_type(const char *content_type);

/* worker.c */
int k3_worker_start(struct k3_server *s, k3_err *err);
void k3_worker_stop(struct k3_server *s);
/* Queues a job, or fills e with 429 (busy, queue full) / 503 (stopping) and returns -1. */
int k3_job_submit(struct k3_server *s, k3_job *j, k3_api_error *e);
/* Marks the job cancelled; a queued job is removed at once. Call with s->mu held. */
void k3_job_cancel_locked(struct k3_server *s, k3_job *j);
/* Blocks until the job is DONE (cancelling it first when cancel is true). */
void k3_job_wait_done(struct k3_server *s, k3_job *j, bool cancel);
void k3_job_free(k3_job *j);

/* status.c — the worker records a finished job (session = its session; call without s->mu)
 * for /health and /metrics (tokens, state cache, the engine's counters); /health appends the
 * status fields (memory plan, last generation, hit rate) to b. */
void k3_srv_status_record(struct k3_server *s, const k3_job *j, const k3_session *session);
void k3_srv_status_json(struct k3_server *s, k3_sbuf *b);

/* emit.c — per-job output state used by the worker */
typedef struct k3_emitter k3_emitter;
k3_emitter *k3_emitter_new(void);
void k3_emitter_free(k3_emitter *em);
void k3_emitter_begin(k3_emitter *em, struct k3_server *s, k3_job *j);
/* Text generated in the reasoning (channel 1) or content (channel 0) channel. Returns true
 * when a stop string matched (the text before it was emitted; generation should end). */
bool k3_emit_text(k3_emitter *em, int channel, const char *text, size_t n);
/* Flushes held-back text and writes the final chunk(s) (stream) for finish reason `finish`. */
void k3_emit_finish(k3_emitter *em, const char *finish);
/* Stream: a chunk with an empty delta carrying the logprobs of one token (`one`). */
void k3_emit_logprobs(k3_emitter *em, const k3_logprobs *one);
/* Once the job starts: resets the stream's state (its opening event was written by
 * k3_emit_opening when the request was accepted). */
void k3_emit_start(k3_emitter *em);
/* The first event(s) of a streamed reply, written into j->out by the connection before the
 * job is submitted, so a client hears at once however long the queue and prefill take:
 * OpenAI chat: the role chunk; Anthropic: message_start + ping; Responses: response.created
 * + response.in_progress; completions: nothing. */
void k3_emit_opening(const struct k3_server *s, k3_job *j);
/* A keep-alive for a stream that has been silent (appended to b): Anthropic's ping event,
 * else an SSE comment (which OpenAI clients skip). */
void k3_emit_keepalive(const k3_job *j, k3_sbuf *b);
/* A complete tool call (index = its position, 0-based): stream: a delta with index, id,
 * type and name, then one delta per argument piece (arguments[0, piece_ends[k]) ...);
 * non-stream: appended to j->tool_calls. The call id is derived from the job id. */
void k3_emit_tool_call(k3_emitter *em, int index, const char *name, const char *arguments,
                       const size_t *piece_ends, size_t n_pieces);

/* Final non-stream JSON body of a finished job; malloc'd. */
char *k3_srv_reply_json(const struct k3_server *s, const k3_job *j);
/* The usage object's JSON (no trailing newline) into b. */
void k3_srv_usage_json(k3_sbuf *b, const k3_job *j);

#endif
