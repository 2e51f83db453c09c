/* server.h — `k3 serve`: an OpenAI-compatible HTTP server over one loaded k3_engine
 * (libmicrohttpd for HTTP, cJSON for JSON). Endpoints: GET /v1/models[/ID], POST
 * /v1/completions, POST /v1/chat/completions, POST /v1/messages[/count_tokens] (Anthropic,
 * anthropic.h), POST /v1/responses (responses.h), GET /health, GET /metrics (Prometheus text,
 * metrics.h); each also without "/v1". GET / and /ui serve the chat page (ui.h) and /health
 * answers without the API key; /metrics needs it when one is set (as llama.cpp's does: the
 * counters tell how the server is used).
 *
 * Invariants:
 *  - Up to opts.parallel generations at once (default 1). A single worker thread owns every
 *    k3_session and runs every pass: each pass carries every running generation's next id
 *    and, within a row budget (the chunk), the next prompt chunk of those still prefilling,
 *    oldest first (k3_multistep: several sessions in one pass). Each row of a pass is
 *    bit-identical to feeding its session alone, so a reply (text, ids, logprobs) does not
 *    depend on what else runs. Connection threads parse, validate, render and tokenize
 *    (the tokenizer and renderer are read-only) and copy bytes out. A request that finds all
 *    slots busy gets 429 with Retry-After, or waits in a FIFO of at most opts.queue requests,
 *    admitted in arrival order. With --spec a generation steps alone (its drafts), beside
 *    the shared pass; an echo prefill runs alone before the next pass.
 *  - GET /v1/models, /health, /metrics and the page never wait for the worker.
 *  - A streamed reply's first event is sent when the request is accepted (before it waits
 *    for a slot), and a keep-alive follows every 5 s without an event (http.c), so a queued,
 *    prefilling or thinking request never looks dead to its client.
 *  - A request whose client has hung up is cancelled before its next token or prompt chunk:
 *    the worker polls the client's socket before each of its rows joins a pass. A cancelled
 *    or failed generation leaves its slot between passes; the others go on unchanged.
 *  - A slow streaming client slows only its own generation: the worker never waits for a
 *    client. Once more than opts.stream_backlog bytes (1 MiB) of its stream are unread, its
 *    generation sits out the passes, keeping its place, until the client has read below that;
 *    the others go on, so one client that stops reading (connected, but stalled) cannot stop
 *    the server. Its unread bytes stay under the limit plus one pass's events. If the client
 *    hangs up, the generation ends (cancelled) at the next pass, or within 20 ms when nothing
 *    else runs; one that stays connected without reading keeps its slot for
 *    opts.stall_timeout_s (5 minutes) at most, then is cancelled and its connection shut
 *    down. /metrics: k3_streams_waiting, k3_stream_backlog_peak_bytes.
 *  - A client of an HTTP/1.0 request that sends FIN after its request is gone (HTTP/1.0 has no
 *    half-close; nginx speaks it to upstreams): its generation is cancelled as for a reset.
 *  - The state cache keeps the last max(opts.state_cache, opts.parallel) conversations, one
 *    session each (sessions are created as needed, up to that many). A
 *    kept conversation's tokens are reused only when the new prompt extends them exactly
 *    (token for token, or, for chat, with its reply given back verbatim): the KDA recurrence
 *    cannot be rewound, so a prompt that diverges inside a kept conversation cannot use it.
 *    The one covering the longest prefix is taken; with none, a new session while the cache
 *    has room, else the least recently used one's state is dropped.
 *  - With opts.prompt_cache (src/server/pcache.h) the state at message ends and every 2048 ids
 *    of each prompt is stored as a file, and any later prompt resumes from the longest stored
 *    prefix (from any conversation, client, process or earlier run) when it covers more than a
 *    kept conversation; dropped conversations are stored there too. A file that fails any
 *    check is skipped with a log line: the reply is then exactly as without the cache.
 *    usage.prompt_tokens_details.cached_tokens says how many prompt tokens were reused.
 *  - Every request ends in an HTTP response (OpenAI-shaped {"error":{...}} for 4xx/5xx) or a
 *    closed connection; a field k3 cannot honour is a 400 naming it, never silently dropped.
 *  - Connections (conns.h): at most opts.max_connections, opts.max_per_address from one
 *    address, 503 + Retry-After past them; a request's headers and body arrive within
 *    opts.request_timeout_s of the accept or get 408. Requests (origin.c, srv.h): the Host
 *    names this server (opts.allow_host), an Origin is the server's own or in
 *    opts.allow_origin (403 otherwise), a POST body is application/json (415).
 *  - The server owns no global state: several servers may run in one process.
 */
#ifndef K3_SERVER_H
#define K3_SERVER_H

#include <stddef.h>
#include "../engine/k3.h"

typedef struct k3_server_opts {
    const char *host;       /* numeric address or name to listen on; NULL = "127.0.0.1" */
    int port;               /* TCP port; 0 = any free port (see k3_server_port) */
    const char *api_key;    /* when set, /v1 requests need "Authorization: Bearer KEY"; "" is
                               refused (K3_ERR_USAGE), NULL = no auth */
    const char *model_id;   /* name shown in /v1/models; NULL = the model folder's name */
    int max_tokens;         /* ceiling on completion tokens per request (a larger max_tokens
                               is cut to it); 0 = the context */
    int queue;              /* requests allowed to wait while one generates; 0 = 429 at once */
    int ctx;                /* session capacity in tokens; 0 = the engine default */
    size_t max_body_bytes;  /* largest request body accepted (413 above); 0 = 8 MiB */
    int max_connections;    /* concurrent connections admitted (one thread each); 0 = 256;
                               more are answered 503 + Retry-After (conns.h) */
    int max_per_address;    /* of them from one client address; 0 = an eighth of
                               max_connections, at least 4 (behind a proxy every client has
                               the proxy's address: raise it to max_connections) */
    double request_timeout_s; /* a request's headers and body must arrive within this many
                               seconds of the accept, else 408 (slow headers, D15); 0 = 30 */
    const char *allow_host; /* names besides localhost, literal addresses and `host` that a
                               request's Host header may give (comma-separated; "*" = any);
                               others get 403 (DNS rebinding, D20) */
    const char *allow_origin; /* browser origins besides the server's own page that may call
                               it (comma-separated "scheme://host:port"; "*" = any); others
                               get 403. No CORS headers are sent */
    int log_requests;       /* 1: one line per request on stderr */
    int no_reuse;           /* 1: prefill every prompt from an empty state (prompts are still
                               built the same way): the A/B switch for state reuse */
    int spec;               /* --spec N: speculative decoding, N drafts per pass (0 = off;
                               src/engine/spec.h) */
    int chunk;              /* prompt ids per prefill pass; 0 = K3_DEFAULT_CHUNK */
    int parallel;           /* generations that run at once, their decode rows in one pass
                               (k3_multistep); 0 = 1 (one at a time) */
    int state_cache;        /* conversation states kept (the state cache; each one session,
                               so the engine's plan should count them: k3_engine_opts.sessions);
                               at least `parallel` are kept (one per slot) */
    const char *prompt_cache; /* the prompt cache's folder (pcache.h): prefix snapshots of
                               every prompt, shared by every conversation and process, kept
                               across restarts; NULL = off */
    double prompt_cache_gb; /* its disk budget for this model's files; 0 = K3_PCACHE_DEFAULT_GB */
    int prompt_cache_ram;   /* snapshots it keeps in RAM (each counted by the plan as a
                               session: k3_engine_opts.sessions); 0 = none */
    double temperature;     /* requests without "temperature" sample at this (0 = greedy; the
                               CLI's default is 1, OpenAI's) */
    const char *effort;     /* chat requests without reasoning_effort / thinking_effort think
                               at this effort ("low", "high", "max"); NULL = "max" */
    double stall_timeout_s; /* a streaming client that reads nothing for this many seconds while
                               its generation sits out (its backlog full) is cancelled and its
                               slot freed (D21); 0 = 300 (5 minutes) */
} k3_server_opts;

typedef struct k3_server k3_server;

#ifdef K3_TEST_CONTROLS
/* The one door for tests (SQLite's sqlite3_test_control is the pattern), compiled only into
 * the test build (-DK3_TEST_CONTROLS: build/k3-test, which tests/server and tests/web run;
 * its edge sets these from K3_TEST_* variables). The shipped k3 has none of it. Call before
 * k3_server_start; process-wide. Returns 0, or -1 for an unknown op. */
enum k3_server_test_op {
    /* const char *: a JSON file holding an array of strings; the i-th generation's ids are
     * string i % n (encoded with special tokens allowed) instead of sampled ones, then
     * end-of-message: lets tests make the random-weight fixture "call" tools. */
    K3_SERVER_TEST_SCRIPTED_REPLY = 1,
    /* double: seconds slept after each generated token (a browser test stops a reply
     * mid-stream on a machine where the fixture's whole reply takes 0.2 s). */
    K3_SERVER_TEST_TOKEN_DELAY,
    /* size_t: unread bytes a streamed reply may hold before its generation sits out (the
     * slow-client invariant above; default 1 MiB): a test stalls a client with less output
     * than the loopback socket buffers plus 1 MiB. */
    K3_SERVER_TEST_STREAM_BACKLOG,
    /* double: seconds the first pass of the process with a segment of more than one id (a
     * prompt) waits after its first layer, in the on_layer hook, while a client of the pass
     * stays; it logs "k3 serve: test: a pass of N ids holds after layer 1" first. A test that
     * waits for that line and then leaves is inside the pass whatever the machine's speed
     * (a pause measured from a first run could outlast a faster second one). */
    K3_SERVER_TEST_PASS_HOLD,
    /* int: the hold above is in the first such pass that starts at this prompt position or
     * later (default 0): a test stops a later pass of a prompt in passes of --chunk ids. */
    K3_SERVER_TEST_PASS_HOLD_POS,
};
int k3_server_test_control(int op, ...);
#endif

/* Starts listening and serving in background threads; returns once the socket is bound.
 * `e` must outlive the server. Errors: K3_ERR_USAGE (bad host, port in use, bad option),
 * K3_ERR_GENERIC (out of memory, thread creation), K3_ERR_INPUT (ctx out of range). */
int k3_server_start(const k3_engine *e, const char *model_dir, const k3_server_opts *opts,
                    k3_server **out, k3_err *err);

/* The bound TCP port, the served model id, the URL base ("http://HOST:PORT") and a
 * one-line description of the admission policy, for the startup banner. */
int k3_server_port(const k3_server *s);
const char *k3_server_model_id(const k3_server *s);
const char *k3_server_url(const k3_server *s);
void k3_server_describe_policy(const k3_server *s, char *buf, size_t cap);

/* The check every request body passes before it renders (issue 20, D7), for `k3 render`
 * (issue 32, D17): 1 when a string or key of the JSON body holds a "\u0000" escape (cJSON
 * would cut the string there), with the field's path (e.g. "messages[0].content", or "" when
 * it cannot be named) in where; 0 when there is none or the body is not JSON. */
int k3_server_body_has_nul(const char *body, size_t len, char *where, size_t cap);

/* Cancels the running generation, answers queued requests with 503, closes every
 * connection, joins all threads and frees the server. NULL is ignored. */
void k3_server_stop(k3_server *s);

#endif
