/* conv.h — a chat conversation kept in step with a session's state, so each turn prefills
 * only its new tokens (used by `k3 chat` and `k3 run --chat`).
 *
 * The conversation is two things kept together:
 *  - messages, OpenAI-style (what /save writes, what `k3 render` reads), and
 *  - the token sequence the model has actually seen: the rendered prompt of each turn plus
 *    the ids the model generated, exactly as sampled (never re-tokenized), then the ids that
 *    close the reply (k3_reply_parser_closing).
 *
 * Invariants:
 *  - k3_conv_prompt returns a sequence that EXTENDS the previous turn's sequence (committed
 *    ids + closing ids + the new messages rendered as a continuation + the generation
 *    prompt), so k3_session_prefill computes only the new suffix. When the history ends in a
 *    well-formed reply, that sequence equals rendering the whole conversation from scratch
 *    (render.h: rendering is compositional; tested).
 *  - Changing thinking on/off or the effort changes the preamble of the whole conversation,
 *    so the next prompt is a full render (the session then starts again, and says so).
 *  - The stop id that ended a reply is never fed; the closing ids end with <|end_of_msg|>.
 */
#ifndef K3_CHAT_CONV_H
#define K3_CHAT_CONV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "../tok/stops.h"
#include "../tok/tokenizer.h"
#include "parse.h"

typedef struct k3_id_list {
    int32_t *v;
    size_t n, cap;
} k3_id_list;

typedef struct k3_conv {
    const k3_tokenizer *tok;
    cJSON *messages;      /* array of message objects */
    bool thinking;        /* default true */
    char effort[8];       /* "low" | "high" | "max" (default) */
    k3_id_list committed; /* ids of the conversation through the last reply (as generated) */
    k3_id_list closing;   /* ids that close the last reply, not yet fed */
    size_t rendered;      /* messages [0, rendered) are in committed */
    bool no_preamble;     /* committed came from a state file: render without a preamble */
    cJSON *tools;         /* declared tools (an OpenAI "tools" array), or NULL */
    k3_id_list prompt;    /* the last k3_conv_prompt result */
} k3_conv;

/* An empty conversation (thinking on, effort max). Errors: K3_ERR_GENERIC. */
int k3_conv_init(k3_conv *c, const k3_tokenizer *t, k3_err *err);
void k3_conv_free(k3_conv *c);

/* Forgets messages and ids (keeps thinking and effort). */
void k3_conv_reset(k3_conv *c);

/* Thinking on/off and effort ("low", "high", "max"); a change re-renders the conversation
 * at the next prompt. Errors: K3_ERR_USAGE (another effort). */
void k3_conv_set_thinking(k3_conv *c, bool on);
int k3_conv_set_effort(k3_conv *c, const char *effort, k3_err *err);

/* Declares tools (an OpenAI "tools" JSON array, copied; NULL = none): the tool declaration
 * leads the prompt (§12.5), so the next prompt is a full render; replies' tools blocks then
 * become the assistant message's tool_calls (ids "call_M_K": message M, call K).
 * Errors: K3_ERR_INPUT (not an array of {"type":"function","function":{"name":…}}). */
int k3_conv_set_tools(k3_conv *c, const cJSON *tools, k3_err *err);

/* Tool calls of the last assistant message still without a tool message after it. */
int k3_conv_pending_tools(const k3_conv *c);

/* Appends a message (role "system", "user" or "tool") with text content; a tool message
 * answers the next pending call by position (the renderer names it). Errors: K3_ERR_GENERIC. */
int k3_conv_add(k3_conv *c, const char *role, const char *text, k3_err *err);
/* Removes the last message (e.g. one whose prompt could not be built). */
void k3_conv_pop(k3_conv *c);

/* Starts from a saved state's ids (k3_session_load): the model already holds them, the
 * messages list is empty, and new messages are rendered without a preamble. */
int k3_conv_set_history(k3_conv *c, const int32_t *ids, size_t n, k3_err *err);

/* The whole id sequence the session should hold before the assistant's next reply, in
 * c->prompt (valid until the next call). Errors: K3_ERR_INPUT (a message the renderer
 * refuses), K3_ERR_TOKENIZER (text that is not UTF-8), K3_ERR_GENERIC. */
int k3_conv_prompt(k3_conv *c, k3_err *err);

/* Records the assistant's reply after generation from c->prompt: the ids sampled (without
 * the stop id) become history, the parser's text becomes the assistant message
 * (reasoning_content and content) and its closing ids are kept for the next prompt.
 * Errors: K3_ERR_TOKENIZER, K3_ERR_GENERIC. */
int k3_conv_commit(k3_conv *c, const int32_t *generated, size_t n, const k3_reply_parser *p,
                   k3_err *err);

/* The ids of the conversation as it stands (committed + closing): what a session should
 * hold to continue from here, e.g. before saving its state. Points into c; valid until the
 * next change. */
int k3_conv_history(k3_conv *c, const int32_t **ids, size_t *n, k3_err *err);

/* The conversation as an OpenAI request body {"messages", "thinking", "reasoning_effort"}
 * (malloc'd, pretty-printed), or NULL when out of memory. */
char *k3_conv_to_json(const k3_conv *c);
/* Replaces messages, thinking and effort with those of a request body (the ids are
 * dropped: the next prompt is a full render). Checks that the body renders.
 * Errors: K3_ERR_INPUT, K3_ERR_GENERIC. */
int k3_conv_from_json(k3_conv *c, const char *json, size_t len, k3_err *err);

#endif
