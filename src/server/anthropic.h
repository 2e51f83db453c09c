/* anthropic.h — the Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens) on
 * top of the chat-completions pipeline: a request is translated into the equivalent OpenAI
 * chat body (then validated, rendered and generated exactly as /v1/chat/completions), and the
 * reply is written in Anthropic's shapes. Internal to src/server.
 *
 * Request translation (fields not listed are a 400 naming them):
 *   system (string or text blocks)      → a first system message (blocks joined by newlines;
 *                                         Claude Code's per-request "x-anthropic-billing-header:"
 *                                         block is dropped: it would defeat state reuse)
 *   system-role messages inside messages → a system message at their place
 *   messages[].content text blocks      → user / assistant text
 *   assistant thinking blocks           → reasoning_content (signature ignored)
 *   assistant tool_use {id,name,input}  → tool_calls
 *   user tool_result {tool_use_id, content (string or blocks of any type), is_error} → a
 *     tool message (K3's format has no error flag: is_error is accepted and the content says
 *     it); text blocks are their text, tool_reference "[tool_reference: NAME]", image and
 *     document a note, anything else its JSON: never a 400, which would stick an agent
 *   assistant redacted_thinking blocks   → dropped (nothing k3 can read)
 *   tools [{name, description, input_schema, defer_loading, eager_input_streaming}] →
 *     function tools (every tool declared); server tools (a "type" other than "custom") are
 *     refused
 *   tool_choice auto / any / none → "auto" / "required" / "none"; {"type":"tool"} is refused
 *     (as a named OpenAI tool_choice is); disable_parallel_tool_use → parallel_tool_calls false
 *   thinking: absent or {"type":"disabled"} → thinking off (Anthropic's default);
 *     {"type":"enabled","budget_tokens":N} (N >= 1024) → thinking on with K3's effort
 *     low for N < 8192, high for N < 32768, max otherwise. K3 has no token budget: the
 *     effort only guides how long it thinks; max_tokens still bounds thinking + answer.
 *     {"type":"adaptive"} → thinking on at output_config's effort, else the server's.
 *     "display" is accepted (the thinking is returned: an agent gives it back, and the
 *     state is reused only when the reply comes back verbatim).
 *   output_config {effort: low | medium (→ high) | high | max (xhigh → max)} → K3's effort
 *     (over the budget's); output_config.format (structured output) is refused.
 *   max_tokens (required; above --max-tokens cut to it), stop_sequences → stop, temperature,
 *   top_p, top_k, stream. Hints accepted and unused: metadata, cache_control (on blocks and
 *   top-level: k3 reuses state anyway), context_management (k3 keeps the history it is
 *   sent), service_tier; the anthropic-beta / anthropic-version headers are not read.
 *   A final assistant message (a prefilled reply to continue) is refused: K3's format closes
 *   every history message.
 *
 * Reply: content blocks thinking (when thinking is on), text, tool_use (input = the parsed
 * arguments); stop_reason end_turn / max_tokens / stop_sequence (+ stop_sequence) /
 * tool_use; usage input_tokens (not reused), cache_read_input_tokens, output_tokens. A
 * malformed tools block is text with stop_reason end_turn (and a log line).
 * Streaming: message_start, ping, content_block_start / _delta (thinking_delta, text_delta,
 * input_json_delta) / _stop, message_delta (stop_reason, usage), message_stop; a failure is
 * an "error" event. Errors: {"type":"error","error":{"type":…,"message":…}}.
 */
#ifndef K3_SERVER_ANTHROPIC_H
#define K3_SERVER_ANTHROPIC_H

#include <stdbool.h>
#include <cjson/cJSON.h>

#include "srv.h"

/* body → the equivalent chat-completions body (a new tree), or NULL with e filled (400).
 * count_tokens: the /count_tokens subset (no max_tokens, no sampling fields). */
cJSON *k3_anth_to_chat(const cJSON *body, bool count_tokens, k3_api_error *e);

/* e in Anthropic's error shape, malloc'd (newline-terminated), or NULL when out of memory. */
char *k3_anth_error_json(const k3_api_error *e);

/* The non-streamed reply of a finished job (j->anthropic), malloc'd. */
char *k3_anth_reply_json(const struct k3_server *s, const k3_job *j);

/* Stream state: the content block now open. */
typedef struct k3_anth_stream {
    int open;  /* -1 none, 0 text, 1 thinking */
    int index; /* index of the open block, or of the next one */
} k3_anth_stream;

/* SSE events appended to ev. */
void k3_anth_message_start(k3_anth_stream *st, k3_sbuf *ev, const struct k3_server *s,
                           const k3_job *j);
void k3_anth_text(k3_anth_stream *st, k3_sbuf *ev, int thinking, const char *text, size_t n);
void k3_anth_tool_use(k3_anth_stream *st, k3_sbuf *ev, const char *id, const char *name,
                      const char *arguments, const size_t *piece_ends, size_t n_pieces);
void k3_anth_finish(k3_anth_stream *st, k3_sbuf *ev, const k3_job *j);
void k3_anth_error_event(k3_sbuf *ev, const k3_api_error *e);

/* Non-stream: one tool_use content block (or a text block when arguments are not a JSON
 * object) appended to b, comma-separated. */
void k3_anth_tool_use_json(k3_sbuf *b, const char *id, const char *name, const char *arguments);

#endif
