/* responses.h — OpenAI's Responses API (POST /v1/responses, what Codex speaks) on top of the
 * chat-completions pipeline, as anthropic.h does for Messages: a request is translated into
 * the equivalent chat body (then validated, rendered and generated exactly as
 * /v1/chat/completions), and the reply is written as a Response. Internal to src/server.
 *
 * Request translation (fields not listed are a 400 naming them):
 *   instructions                          → a first system message (not carried over by
 *                                           previous_response_id, as OpenAI documents)
 *   input: a string                       → one user message
 *   input items: message {role user | assistant | system | developer, content: a string or
 *     input_text / output_text parts}     → that message (images and files: 400)
 *     reasoning {content [reasoning_text] or summary} → reasoning_content of the next
 *                                           assistant message (encrypted_content ignored)
 *     function_call {call_id, name, arguments} → a tool call of the assistant message
 *     custom_tool_call {call_id, name, input}  → a tool call whose arguments are {"input": …}
 *     function_call_output / custom_tool_call_output {call_id, output} → a tool message
 *   previous_response_id                  → the stored conversation (input and output items)
 *                                           of that response, then input; an id not (or no
 *                                           longer) in the store is a 400 naming the field
 *   tools: function {name, description, parameters, strict} → a function tool;
 *     custom {name, description, format}  → a function with one string argument "input"
 *       (its grammar, if any, is appended to the description); the model's call comes back
 *       as a custom_tool_call whose input is that string
 *     namespace {tools}                   → its function tools, flattened
 *     hosted tools (web_search, file_search, ...) are not declared to the model (k3 runs no
 *       server-side tools; Codex declares web_search by default); the log line says so
 *   tool_choice "auto" | "none" | "required", parallel_tool_calls, max_output_tokens,
 *   temperature, top_p, stream; reasoning.effort (none, minimal → low, low, medium → high,
 *   high, xhigh → max) → K3's effort; text.format must be text.
 *   Hints accepted, changing nothing generated: store, include, metadata, client_metadata,
 *   prompt_cache_key, safety_identifier, user, service_tier, truncation, text.verbosity,
 *   reasoning.summary, stream_options.
 *
 * Reply: a Response {id "resp_…", object "response", status completed | incomplete
 * (incomplete_details.reason max_output_tokens), output [reasoning {content [reasoning_text]},
 * message {content [output_text]}, function_call | custom_tool_call], usage {input_tokens,
 * input_tokens_details.cached_tokens, output_tokens, output_tokens_details.reasoning_tokens,
 * total_tokens}}. Streaming: response.created and response.in_progress at once (before the
 * request waits for the worker), then per item response.output_item.added, content_part.added,
 * output_text.delta / reasoning_text.delta / function_call_arguments.delta /
 * custom_tool_call_input.delta, their .done, content_part.done, output_item.done, and
 * response.completed (or response.incomplete / response.failed); every event has a
 * sequence_number. Errors: OpenAI's {"error": {...}} shape.
 *
 * The store: the last K3_RESP_STORE_MAX responses (each its conversation as Responses items,
 * JSON) are kept in memory for previous_response_id, whatever "store" says, and lost at exit.
 */
#ifndef K3_SERVER_RESPONSES_H
#define K3_SERVER_RESPONSES_H

#include <pthread.h>
#include <stdbool.h>
#include <cjson/cJSON.h>

#include "srv.h"

#define K3_RESP_STORE_MAX 64

/* Recent responses for previous_response_id: a ring of (id, items JSON), its own lock. */
typedef struct k3_resp_store {
    pthread_mutex_t mu;
    char *id[K3_RESP_STORE_MAX];
    char *items[K3_RESP_STORE_MAX]; /* a JSON array of input + output items */
    int next;
} k3_resp_store;

void k3_resp_store_init(k3_resp_store *st);
void k3_resp_store_free(k3_resp_store *st);

/* A Responses job's own state (k3_job.resp): what the reply needs from the request, and the
 * stream's open item. Written by the connection before submission, then by the worker. */
typedef struct k3_resp_job {
    char id[64];            /* "resp_…" (also the job's id) */
    char *echo;             /* request fields echoed in the Response (JSON members, no braces) */
    char *input_items;      /* the conversation so far (JSON array) for the store */
    char **custom;          /* names of custom (freeform) tools */
    int n_custom;
    bool store;             /* keep this response for previous_response_id (always true) */
    char note[160];         /* what the request's log line should add ("" = nothing) */
    /* stream / output state (worker) */
    int seq;                /* next sequence_number */
    int open;               /* -1 none, 0 message, 1 reasoning */
    int n_items;            /* output items so far */
    k3_sbuf text;           /* the open item's text */
    k3_sbuf items;          /* finished output items (comma-joined JSON) */
    char *final;            /* the finished Response JSON (non-stream reply) */
} k3_resp_job;

/* body → the equivalent chat-completions body (a new tree), or NULL with e filled (400).
 * *out gets the job state (malloc'd; free with k3_resp_job_free). */
cJSON *k3_resp_to_chat(const cJSON *body, k3_resp_store *store, k3_resp_job **out,
                       k3_api_error *e);
void k3_resp_job_free(k3_resp_job *r);

/* The opening events (response.created, response.in_progress) into ev. */
void k3_resp_open(k3_resp_job *r, k3_sbuf *ev, const struct k3_server *s, const k3_job *j);
/* Generated text of channel 0 (answer) or 1 (reasoning); events into ev when streaming. */
void k3_resp_text(k3_resp_job *r, k3_sbuf *ev, bool stream, int channel, const char *text,
                  size_t n);
/* One complete tool call (id = the call id). */
void k3_resp_tool_call(k3_resp_job *r, k3_sbuf *ev, bool stream, const char *call_id,
                       const char *name, const char *arguments, const size_t *piece_ends,
                       size_t n_pieces);
/* The end: closes the open item, builds r->final, stores the conversation, and (stream)
 * writes response.completed / incomplete / failed. */
void k3_resp_finish(k3_resp_job *r, k3_sbuf *ev, bool stream, const struct k3_server *s,
                    const k3_job *j, k3_resp_store *store);

#endif
