/* toolcall.c — the tools block's ids → tool calls (toolcall.h). Read next to render.c's
 * tool_calls / call_body / call_arguments, of which this is the inverse. */
#include "toolcall.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

/* Grammar positions (toolcall.h). */
enum { ST_BLOCK, ST_CALL, ST_VALUE, ST_JSON, ST_END };

void k3_toolcall_parser_init(k3_toolcall_parser *p, const k3_tokenizer *t) {
    *p = (k3_toolcall_parser){.tok = t, .status = K3_TOOLCALL_OPEN, .state = ST_BLOCK};
    p->open_id = k3_tokenizer_special_id(t, "<|open|>");
    p->close_id = k3_tokenizer_special_id(t, "<|close|>");
    p->sep_id = k3_tokenizer_special_id(t, "<|sep|>");
    p->n_ranks = k3_tokenizer_n_ranks(t);
}

static void call_free(k3_tool_call *c) {
    free(c->name);
    k3_strbuf_free(&c->arguments);
    free(c->piece_ends);
    *c = (k3_tool_call){0};
}

void k3_toolcall_parser_free(k3_toolcall_parser *p) {
    for (size_t i = 0; i < p->n_calls; i++) call_free(&p->calls[i]);
    call_free(&p->cur);
    free(p->calls);
    free(p->ids);
    free(p->key);
    free(p->type);
    free(p->rest);
    *p = (k3_toolcall_parser){0};
}

bool k3_toolcall_in_block(const k3_reply_parser *rp, enum k3_reply_pos before, int32_t id) {
    return before == K3_IN_TOOLS && !(rp->ended && rp->stop_id == id);
}

/* ---- helpers ------------------------------------------------------------------------------ */

static void malformed(k3_toolcall_parser *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void malformed(k3_toolcall_parser *p, const char *fmt, ...) {
    if (p->status != K3_TOOLCALL_OPEN) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->reason, sizeof p->reason, fmt, ap);
    va_end(ap);
    p->status = K3_TOOLCALL_MALFORMED;
}

/* ids[from, to) as text (U+FFFD for broken UTF-8), malloc'd; NULL when out of memory. */
static char *text_of(k3_toolcall_parser *p, size_t from, size_t to, size_t *len) {
    char *s = NULL;
    size_t n = 0;
    k3_err err;
    if (k3_tokenizer_decode(p->tok, p->ids + from, to - from, &s, &n, &err)) {
        p->oom = true;
        return NULL;
    }
    if (len) *len = n;
    return s;
}

static bool is_blank(const char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (b[i] != ' ' && b[i] != '\n' && b[i] != '\t' && b[i] != '\r') return false;
    return true;
}

/* Attribute value: &quot; → ", &amp; → & in one left-to-right pass (render.c escapes & first,
 * so "&amp;quot;" comes back as "&quot;"). In place. */
static void unescape(char *s) {
    char *w = s;
    for (const char *r = s; *r;) {
        if (!strncmp(r, "&quot;", 6)) {
            *w++ = '"';
            r += 6;
        } else if (!strncmp(r, "&amp;", 5)) {
            *w++ = '&';
            r += 5;
        } else {
            *w++ = *r++;
        }
    }
    *w = 0;
}

#define MAX_ATTRS 2

/* A marker's text `tag key="v" key="v"` split in place: tag, then up to MAX_ATTRS pairs
 * (values unescaped). Returns the attribute count, or -1 when it is not of that shape. */
static int split_marker(char *s, char **tag, char *keys[MAX_ATTRS], char *vals[MAX_ATTRS]) {
    *tag = s;
    char *at = strchr(s, ' ');
    int n = 0;
    if (!at) return 0;
    *at++ = 0;
    while (*at) {
        if (n == MAX_ATTRS) return -1;
        char *eq = strstr(at, "=\"");
        if (!eq || eq == at) return -1;
        *eq = 0;
        char *v = eq + 2, *q = strchr(v, '"');
        if (!q) return -1;
        *q = 0;
        keys[n] = at;
        vals[n] = v;
        unescape(v);
        n++;
        at = q + 1;
        if (*at == ' ') at++;
        else if (*at) return -1;
    }
    return n;
}

static const char *attr(int n, char *keys[], char *vals[], const char *key) {
    for (int i = 0; i < n; i++)
        if (!strcmp(keys[i], key)) return vals[i];
    return NULL;
}

/* Appends s[0..n) as a JSON string, written as Python's json.dumps(ensure_ascii=False). */
static void json_string(k3_strbuf *b, const char *s) {
    cJSON *v = cJSON_CreateString(s);
    if (!v) {
        b->oom = 1;
        return;
    }
    k3_pyjson_dump(b, v, K3_PYJSON_SPACED, false);
    cJSON_Delete(v);
}

static void end_piece(k3_toolcall_parser *p) {
    k3_tool_call *c = &p->cur;
    size_t *e = realloc(c->piece_ends, (c->n_pieces + 1) * sizeof *e);
    if (!e) {
        p->oom = true;
        return;
    }
    c->piece_ends = e;
    e[c->n_pieces++] = c->arguments.n;
}

/* ---- markers ------------------------------------------------------------------------------ */

/* One argument value, ids [value_start, mark_start): appended as `"K": V`. */
static void take_argument(k3_toolcall_parser *p) {
    size_t len;
    char *v = text_of(p, p->value_start, p->mark_start, &len);
    if (!v) return;
    k3_strbuf *b = &p->cur.arguments;
    k3_strbuf_puts(b, p->n_args++ ? ", " : "{");
    json_string(b, p->key);
    k3_strbuf_puts(b, ": ");
    if (!strcmp(p->type, "string")) {
        json_string(b, v);
    } else {
        cJSON *j = cJSON_ParseWithLengthOpts(v, len + 1, NULL, 1);
        if (j)
            k3_strbuf_put(b, v, len); /* verbatim: exact digits, Python's spacing */
        else
            json_string(b, v);
        cJSON_Delete(j);
    }
    free(v);
    end_piece(p);
}

static void take_call(k3_toolcall_parser *p) {
    if (p->n_args == 0) k3_strbuf_puts(&p->cur.arguments, "{}");
    else if (p->n_args > 0) k3_strbuf_puts(&p->cur.arguments, "}");
    if (p->n_args >= 0) end_piece(p);
    if (p->cur.arguments.oom) p->oom = true;
    if (p->n_calls == p->cap_calls) {
        size_t cap = p->cap_calls ? 2 * p->cap_calls : 4;
        k3_tool_call *v = realloc(p->calls, cap * sizeof *v);
        if (!v) {
            p->oom = true;
            return;
        }
        p->calls = v;
        p->cap_calls = cap;
    }
    p->calls[p->n_calls++] = p->cur;
    p->cur = (k3_tool_call){0};
    p->call_start = p->n_ids;
}

static char *dup(k3_toolcall_parser *p, const char *s) {
    char *d = strdup(s);
    if (!d) p->oom = true;
    return d;
}

/* <|sep|> ended the marker ids[mark_start, n_ids - 1): move through the grammar. */
static void take_marker(k3_toolcall_parser *p) {
    bool open = p->ids[p->mark_start] == p->open_id;
    p->in_marker = false;
    char *s = text_of(p, p->mark_start + 1, p->n_ids - 1, NULL);
    if (!s) return;
    char *tag, *keys[MAX_ATTRS], *vals[MAX_ATTRS];
    int na = split_marker(s, &tag, keys, vals);
    const char *spell = open ? "<|open|>" : "<|close|>";
    if (na < 0) {
        malformed(p, "marker %s%.40s is not of the form tag key=\"value\"", spell, s);
    } else if (p->state == ST_BLOCK && open && !strcmp(tag, "call") &&
               attr(na, keys, vals, "tool")) {
        p->cur.name = dup(p, attr(na, keys, vals, "tool"));
        p->n_args = 0;
        p->state = ST_CALL;
    } else if (p->state == ST_BLOCK && !open && !strcmp(tag, "tools") && na == 0) {
        p->state = ST_END;
        p->status = K3_TOOLCALL_DONE;
    } else if (p->state == ST_CALL && open && !strcmp(tag, "argument") && p->n_args >= 0 &&
               attr(na, keys, vals, "key") && attr(na, keys, vals, "type")) {
        free(p->key);
        free(p->type);
        p->key = dup(p, attr(na, keys, vals, "key"));
        p->type = dup(p, attr(na, keys, vals, "type"));
        p->value_start = p->n_ids;
        p->state = ST_VALUE;
    } else if (p->state == ST_CALL && open && !strcmp(tag, "json") && p->n_args == 0) {
        p->value_start = p->n_ids;
        p->state = ST_JSON;
    } else if (p->state == ST_CALL && !open && !strcmp(tag, "call") && na == 0) {
        take_call(p);
        p->state = ST_BLOCK;
    } else if (p->state == ST_VALUE && !open && !strcmp(tag, "argument") && na == 0) {
        take_argument(p);
        p->state = ST_CALL;
    } else if (p->state == ST_JSON && !open && !strcmp(tag, "json") && na == 0) {
        size_t len;
        char *raw = text_of(p, p->value_start, p->mark_start, &len);
        if (raw) k3_strbuf_put(&p->cur.arguments, raw, len);
        free(raw);
        end_piece(p);
        p->n_args = -1;
        p->state = ST_CALL;
    } else {
        static const char *where[] = {"between calls", "inside a call", "inside an argument",
                                      "inside a json block", "after the block"};
        malformed(p, "unexpected marker %s%.40s %s", spell, tag, where[p->state]);
    }
    free(s);
}

/* ---- feeding ------------------------------------------------------------------------------ */

static void take_id(k3_toolcall_parser *p, int32_t id) {
    if (p->n_ids == p->cap_ids) {
        size_t cap = p->cap_ids ? 2 * p->cap_ids : 256;
        int32_t *v = realloc(p->ids, cap * sizeof *v);
        if (!v) {
            p->oom = true;
            return;
        }
        p->ids = v;
        p->cap_ids = cap;
    }
    p->ids[p->n_ids++] = id; /* kept after a malformation too: it is part of `rest` */
    if (p->status != K3_TOOLCALL_OPEN) return;
    bool marker_id = id == p->open_id || id == p->close_id;
    if (p->in_marker) {
        if (id == p->sep_id) {
            take_marker(p);
            return;
        }
        size_t len = 0;
        if (id >= p->n_ranks || marker_id) {
            malformed(p, "a special token inside a marker");
        } else if (k3_tokenizer_token_bytes(p->tok, id, &len) &&
                   (p->mark_bytes += len) > K3_TOOLCALL_MARKER_MAX) {
            malformed(p, "a marker longer than %d bytes", K3_TOOLCALL_MARKER_MAX);
        }
        return;
    }
    bool in_value = p->state == ST_VALUE || p->state == ST_JSON;
    if (id == p->close_id || (id == p->open_id && !in_value)) {
        p->in_marker = true;
        p->mark_start = p->n_ids - 1;
        p->mark_bytes = 0;
    } else if (id >= p->n_ranks) {
        size_t len = 0;
        const char *b = k3_tokenizer_token_bytes(p->tok, id, &len);
        malformed(p, "special token %.*s %s", (int)(b ? len : 0), b ? b : "",
                  in_value ? "inside a value" : "where a marker belongs");
    } else if (!in_value) {
        size_t len = 0;
        const char *b = k3_tokenizer_token_bytes(p->tok, id, &len);
        if (!b || !is_blank(b, len)) malformed(p, "text where a marker belongs");
    }
}

int k3_toolcall_push(k3_toolcall_parser *p, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n && !p->oom && p->state != ST_END; i++) take_id(p, ids[i]);
    return p->oom ? -1 : 0;
}

int k3_toolcall_finish(k3_toolcall_parser *p) {
    if (p->status == K3_TOOLCALL_OPEN) {
        p->status = K3_TOOLCALL_CUT;
        snprintf(p->reason, sizeof p->reason, "the reply ended inside the tools block");
    }
    if (p->status != K3_TOOLCALL_DONE && !p->rest && !p->oom)
        p->rest = text_of(p, p->call_start, p->n_ids, NULL);
    return p->oom ? -1 : 0;
}

int k3_toolcall_parse_reply(const k3_tokenizer *t, const k3_stops *stops, bool thinking,
                            const int32_t *ids, size_t n, k3_toolcall_parser *out) {
    k3_reply_parser rp;
    k3_reply_parser_init(&rp, t, stops, thinking);
    k3_toolcall_parser_init(out, t);
    size_t cap = k3_reply_parser_out_cap(t);
    char *buf = malloc(cap);
    bool entered = false;
    int rc = buf ? 0 : -1;
    for (size_t i = 0; i < n && !rc && !rp.ended; i++) {
        enum k3_channel ch;
        enum k3_reply_pos before = rp.pos;
        if (k3_reply_parser_push(&rp, ids[i], buf, cap, &ch) < 0) rc = -1;
        if (!rc && k3_toolcall_in_block(&rp, before, ids[i])) {
            entered = true;
            rc = k3_toolcall_push(out, &ids[i], 1);
        }
        if (rp.pos == K3_IN_TOOLS) entered = true;
    }
    if (!rc && entered) rc = k3_toolcall_finish(out);
    free(buf);
    k3_reply_parser_free(&rp);
    return rc < 0 ? -1 : entered;
}
