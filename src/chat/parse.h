/* parse.h — splitting a generated K3 reply into its thinking and response channels as the
 * tokens arrive (spec §12.4), and the tokens that close a reply that was cut off.
 *
 * After the generation prompt the model writes
 *   REASONING <|close|>think<|sep|> <|open|>response<|sep|> ANSWER <|close|>response<|sep|>
 *   [<|open|>tools<|sep|> … <|close|>tools<|sep|>] <|close|>message<|sep|> <|end_of_msg|>
 * (without the think part when thinking is off). Markers start with the special ids
 * <|open|> / <|close|> and end at <|sep|>.
 *
 * Invariants:
 *  - A half-formed marker is never shown: from <|open|>/<|close|> to <|sep|> the tokens are
 *    held (at most K3_MARKER_MAX_IDS ids). A recognised marker switches the channel and
 *    prints nothing; anything else (too long, unknown tag, a second <|open|>) is released
 *    as ordinary text of the current channel, spellings included.
 *  - Text is decoded with the streaming UTF-8 decoder: only complete characters are given
 *    out; at a channel switch held bytes are flushed (as U+FFFD) into the old channel.
 *  - Inside the tools block everything, markers included, is text of K3_CH_TOOLS (raw XTML
 *    for a later tool-call parser).
 *  - Text outside think/tools blocks counts as response.
 *  - A stop id (k3_stops) ends the reply; later pushes do nothing.
 *  - The whole reply is also accumulated per channel (for the conversation history).
 */
#ifndef K3_CHAT_PARSE_H
#define K3_CHAT_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../tok/stops.h"
#include "../tok/tokenizer.h"
#include "pyjson.h"

#define K3_MARKER_MAX_IDS 16

enum k3_channel { K3_CH_THINK = 0, K3_CH_RESPONSE = 1, K3_CH_TOOLS = 2 };

/* Where the reply is; decides the channel and the closing tokens of a cut reply. */
enum k3_reply_pos {
    K3_IN_THINK,      /* after <|open|>think<|sep|> (the thinking generation prompt) */
    K3_AFTER_THINK,   /* after <|close|>think<|sep|> */
    K3_IN_RESPONSE,   /* after <|open|>response<|sep|> */
    K3_AFTER_RESPONSE,/* after <|close|>response<|sep|> */
    K3_IN_TOOLS,      /* after <|open|>tools<|sep|> */
    K3_AFTER_TOOLS,   /* after <|close|>tools<|sep|> */
    K3_AFTER_MESSAGE, /* after <|close|>message<|sep|> */
};

typedef struct k3_reply_parser {
    const k3_tokenizer *tok;
    int32_t open_id, close_id, sep_id;
    k3_stops stops;
    enum k3_reply_pos pos;
    bool ended;                       /* a stop id arrived */
    int32_t stop_id;                  /* which one, or -1 */
    int32_t marker[K3_MARKER_MAX_IDS];/* held ids from <|open|>/<|close|> on */
    int n_marker;
    k3_detok_stream ds;
    enum k3_channel ds_channel;       /* channel of the bytes held in ds */
    k3_strbuf text[3];                /* the whole reply, per channel */
} k3_reply_parser;

/* Starts a reply after the generation prompt: in the think block when thinking, else in the
 * response block. Allocates nothing until text arrives. */
void k3_reply_parser_init(k3_reply_parser *p, const k3_tokenizer *t, const k3_stops *stops,
                          bool thinking);
void k3_reply_parser_free(k3_reply_parser *p);

/* Bytes of `out` that k3_reply_parser_push may write for this tokenizer. */
size_t k3_reply_parser_out_cap(const k3_tokenizer *t);

/* Feeds one generated id. Writes the text it makes visible to out (capacity cap, at least
 * k3_reply_parser_out_cap; NUL-terminated) and its channel to *ch; returns the byte count
 * (0 when nothing is visible yet), or -1 when out of memory. Returns 0 after the end. */
int k3_reply_parser_push(k3_reply_parser *p, int32_t id, char *out, size_t cap,
                         enum k3_channel *ch);

/* Ends the reply early (max tokens, Ctrl-C): releases held marker ids and bytes as text.
 * Same output contract as push. */
int k3_reply_parser_finish(k3_reply_parser *p, char *out, size_t cap, enum k3_channel *ch);

/* The ids that, appended after the generated ones, complete the reply the way the renderer
 * writes an assistant message: the blocks still open are closed (an unfinished think block
 * is followed by an empty response block), then <|close|>message<|sep|><|end_of_msg|>.
 * When the model itself ended with <|end_of_msg|> this is just that id (it was sampled but
 * not yet fed). *ids is malloc'd. Errors: K3_ERR_TOKENIZER, K3_ERR_GENERIC. */
int k3_reply_parser_closing(const k3_reply_parser *p, int32_t **ids, size_t *n, k3_err *err);

#endif
