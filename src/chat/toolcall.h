/* toolcall.h — the model's tools block (spec §12.5) back into OpenAI tool calls: the exact
 * inverse of the renderer's tool_calls (render.c), fed the generated ids as they arrive.
 *
 * The block, after <|open|>tools<|sep|>, is
 *   ( <|open|>call tool="NAME" index="k"<|sep|>
 *       ( <|open|>argument key="K" type="T"<|sep|> VALUE <|close|>argument<|sep|> )*
 *       | <|open|>json type="object"<|sep|> RAW <|close|>json<|sep|>
 *     <|close|>call<|sep|> )*
 *   <|close|>tools<|sep|>
 * where <|open|> <|close|> <|sep|> are the special ids (never text: the renderer encodes all
 * text with specials disabled, so a value spelling "<|close|>" is ordinary BPE and stays
 * text here). Attribute values are unescaped (&quot; → ", &amp; → &).
 *
 * A call's function.arguments is rebuilt as JSON text `{"K": V, ...}` (", " and ": " as
 * the renderer's Python-style values use), keys in block order:
 *  - type="string": VALUE is the raw string, written as a JSON string;
 *  - any other type: VALUE is Python-style JSON and is copied verbatim when it is valid JSON
 *    (numbers keep their exact digits); otherwise (NaN, a cut value) it becomes a JSON string;
 *  - the json type="object" fallback: arguments = RAW exactly (the renderer writes it for
 *    arguments that were not JSON);
 *  - no argument at all: "{}".
 *
 * Invariants:
 *  - Ids are consumed one at a time, so the result does not depend on how the id sequence is
 *    split into pieces (tested for every split).
 *  - Whitespace-only text between markers is tolerated; any other deviation (text where a
 *    marker belongs, an unknown tag, a special inside a marker or value, a marker over
 *    K3_TOOLCALL_MARKER_MAX bytes) makes the block malformed; the end of the reply before
 *    <|close|>tools<|sep|> makes it cut off. Either way the calls completed before that point
 *    stay calls, and the ids from the start of the first incomplete call are given back as
 *    text (k3_toolcall_parser.rest) with a reason. Nothing is ever dropped or looped on.
 *  - Memory grows with the block only (the ids are kept for the fallback text).
 */
#ifndef K3_CHAT_TOOLCALL_H
#define K3_CHAT_TOOLCALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../tok/tokenizer.h"
#include "parse.h"
#include "pyjson.h"

#define K3_TOOLCALL_MARKER_MAX 4096 /* bytes of a marker's text (tag and attributes) */

typedef struct k3_tool_call {
    char *name;           /* malloc'd, unescaped */
    k3_strbuf arguments;  /* JSON text (see above) */
    size_t *piece_ends;   /* byte offsets in arguments ending each streaming piece */
    size_t n_pieces;
} k3_tool_call;

enum k3_toolcall_status {
    K3_TOOLCALL_OPEN,      /* still inside the block */
    K3_TOOLCALL_DONE,      /* <|close|>tools<|sep|> arrived, every call well formed */
    K3_TOOLCALL_MALFORMED, /* see reason */
    K3_TOOLCALL_CUT,       /* the reply ended inside the block */
};

typedef struct k3_toolcall_parser {
    const k3_tokenizer *tok;
    int32_t open_id, close_id, sep_id;
    int n_ranks;
    enum k3_toolcall_status status;
    char reason[160];        /* MALFORMED / CUT: what happened, for the log and the client */
    int state;               /* toolcall.c's grammar position */
    int32_t *ids;            /* every id fed so far */
    size_t n_ids, cap_ids;
    size_t call_start;       /* ids index where the current (incomplete) call began */
    size_t mark_start;       /* ids index of the <|open|>/<|close|> of the marker being read */
    size_t mark_bytes;
    size_t value_start;      /* ids index of the first id of the value being read */
    bool in_marker;
    int n_args;              /* arguments of the current call so far; -1 after a json block */
    k3_tool_call cur;        /* the call being read */
    char *key, *type;        /* the current argument's attributes (malloc'd) */
    k3_tool_call *calls;     /* completed calls, in order */
    size_t n_calls, cap_calls;
    char *rest;              /* MALFORMED / CUT: the text from the first incomplete call on */
    bool oom;
} k3_toolcall_parser;

/* Starts a parser for the ids after <|open|>tools<|sep|>. Allocates nothing yet. */
void k3_toolcall_parser_init(k3_toolcall_parser *p, const k3_tokenizer *t);
void k3_toolcall_parser_free(k3_toolcall_parser *p);

/* Feeds n ids of the block (any split). Ids after the block's end are ignored. Returns 0,
 * or -1 when out of memory (p->oom; the parser then stops). */
int k3_toolcall_push(k3_toolcall_parser *p, const int32_t *ids, size_t n);

/* The reply ended (stop id, token limit): a block still open becomes CUT. Fills p->rest for
 * MALFORMED / CUT. Returns 0, or -1 when out of memory. */
int k3_toolcall_finish(k3_toolcall_parser *p);

/* For a reply parser: true when `id`, just pushed to rp whose position before the push was
 * `before`, belongs to the tools block (everything after <|open|>tools<|sep|> through
 * <|close|>tools<|sep|>, never the stop id). */
bool k3_toolcall_in_block(const k3_reply_parser *rp, enum k3_reply_pos before, int32_t id);

/* A whole generated reply (ids after the generation prompt, without the stop id) → *out
 * (initialised here; free it with k3_toolcall_parser_free). Returns 1 when the reply has a
 * tools block (then finished: see out->status), 0 when it has none, -1 out of memory. */
int k3_toolcall_parse_reply(const k3_tokenizer *t, const k3_stops *stops, bool thinking,
                            const int32_t *ids, size_t n, k3_toolcall_parser *out);

#endif
