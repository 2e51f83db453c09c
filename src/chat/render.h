/* render.h — the K3 chat format ("XTML", spec §12): an OpenAI chat-completions request body
 * rendered to segments [text, allow_special] exactly as the official encoding_k3.py does,
 * and segments to token ids. Used by `k3 render`, `k3 run --chat`, `k3 chat` and the server.
 *
 * Invariants (each checked against tests/fixtures/tokenizer/chat.json, both tokenizers):
 *  - Only the structural spellings <|open|>, <|sep|>, <|close|>, <|end_of_msg|> are segments
 *    with allow_special; tag names, attribute keys, `="`, values, `"` and ALL content are
 *    separate segments with specials disabled, so text typed by a user, a tool or the model
 *    can never forge structure (a literal "<|open|>" in content stays ordinary BPE).
 *  - Ids are each segment encoded on its own, concatenated. Encoding the joined text differs
 *    (chat.json's whole_text_encoding_differs cases) and is never done.
 *  - Empty segments are dropped (an empty think block is open + close, nothing between).
 *  - No [BOS] is added (§11.4).
 *  - Rendering is compositional: the segments of messages [0, n) followed by those of the
 *    continuation from n (k3_chat_render with first_message = n) equal the whole render's,
 *    for any n not inside a run of tool results (a run is reordered as a whole) and when no
 *    tool_choice / response_format message trails the render. This is what lets a session
 *    keep a conversation's state and prefill only a new turn.
 *
 * Request fields read (others, e.g. "model", "temperature", are ignored here):
 *   messages (array, required): role system|user|assistant|tool; content a string, null, or
 *     a list of {"type":"text","text":…} parts (each part its own segment); optional name;
 *     assistant: reasoning_content (or reasoning), tool_calls [{id, function:{name,
 *     arguments}}] with arguments a JSON string or object; tool: tool_call_id, tool, name.
 *     A system message with a non-empty "tools" list renders only a dynamic tool declaration.
 *   tools (array): the tool-declaration system message, keys sorted recursively, compact.
 *   tool_choice: "auto" (nothing), "required", "none". A named function choice is refused:
 *     its rendering is not verified against the official renderer.
 *   response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {…}}.
 *   reasoning_effort / thinking_effort: "low" | "high" | "max" (default "max"); "none"
 *     turns thinking off. "medium" is refused, as the official encoder does.
 *   thinking (k3 extension, default true) and add_generation_prompt (default true).
 */
#ifndef K3_CHAT_RENDER_H
#define K3_CHAT_RENDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "../tok/tokenizer.h"
#include "../util/err.h"

#define K3_TOK_OPEN "<|open|>"
#define K3_TOK_CLOSE "<|close|>"
#define K3_TOK_SEP "<|sep|>"
#define K3_TOK_END_OF_MSG "<|end_of_msg|>"

typedef struct k3_segment {
    char *text;         /* malloc'd, NUL-terminated */
    size_t len;
    bool allow_special; /* true only for the structural spellings */
} k3_segment;

/* A growable segment list; start from {0}, free with k3_segments_free. */
typedef struct k3_segments {
    k3_segment *v;
    size_t n, cap;
} k3_segments;

/* The renderer's view of a request body (pointers into the caller's cJSON tree). */
typedef struct k3_chat_request {
    const cJSON *messages;        /* array */
    const cJSON *tools;           /* non-empty array, or NULL */
    const char *tool_choice;      /* "required", "none", or NULL */
    const cJSON *response_format; /* object with a type other than "text", or NULL */
    bool thinking;
    char effort[8];               /* "low", "high" or "max" */
    bool add_generation_prompt;
    bool no_preamble;             /* not from JSON: the model state already holds the tool
                                     declaration and thinking-effort message (continuation
                                     of a saved state); see k3_chat_render */
    size_t max_segments;          /* not from JSON: 0, or the context in tokens. Every
                                     non-empty segment is at least one token, so the render
                                     stops with K3_ERR_INPUT as soon as it has more segments
                                     than this (the prompt cannot fit) */
    bool (*cancelled)(void *arg); /* not from JSON: NULL, or asked every 256 messages; true
                                     stops the render with K3_ERR_INTERRUPTED (client gone) */
    void *cancel_arg;
} k3_chat_request;

/* Reads and checks the request-level fields of an OpenAI chat-completions body (messages
 * are checked while rendering). Errors: K3_ERR_INPUT naming the field and the fix. */
int k3_chat_request_parse(const cJSON *body, k3_chat_request *req, k3_err *err);

/* Appends to out the segments of req. With first_message == 0 this is the whole prompt:
 * tool declaration, thinking-effort message, messages, tool_choice / response_format
 * messages, generation prompt. With first_message > 0 (or req->no_preamble) it is the
 * continuation of a conversation whose messages [0, first_message) are already in the
 * model state: no preamble, only messages [first_message, n) (earlier ones are still read
 * to name tool results), then the trailing messages and generation prompt.
 * Work is O(n log n) in the messages, tool calls and argument keys (issue 20, D1).
 * Errors: K3_ERR_INPUT naming messages[i] and the field, or past req->max_segments;
 * K3_ERR_INTERRUPTED (req->cancelled said so); K3_ERR_GENERIC (out of memory). */
int k3_chat_render(const k3_chat_request *req, size_t first_message, k3_segments *out,
                   k3_err *err);

/* Convenience: parse + render a whole JSON body given as text. */
int k3_chat_render_json(const char *json, size_t len, k3_segments *out, k3_err *err);

/* Appends one segment (copied; empty text is dropped). Errors: K3_ERR_GENERIC. */
int k3_segments_push(k3_segments *s, const char *text, size_t len, bool allow_special,
                     k3_err *err);

/* Encodes every segment on its own (allow_special per segment) and concatenates the ids;
 * *ids is malloc'd (caller frees), *n its length.
 * Errors: K3_ERR_TOKENIZER (invalid UTF-8 in a segment), K3_ERR_GENERIC. */
int k3_segments_encode(const k3_tokenizer *t, const k3_segments *s, int32_t **ids, size_t *n,
                       k3_err *err);

/* The concatenated text (malloc'd, NUL-terminated; *len its length if non-NULL), or NULL
 * when out of memory. */
char *k3_segments_text(const k3_segments *s, size_t *len);

void k3_segments_free(k3_segments *s);

#endif
