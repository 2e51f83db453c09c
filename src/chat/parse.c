/* parse.c — the reply's channels as tokens arrive, and the closing of a cut reply (parse.h). */
#include "parse.h"

#include <stdlib.h>
#include <string.h>

#include "render.h"

void k3_reply_parser_init(k3_reply_parser *p, const k3_tokenizer *t, const k3_stops *stops,
                          bool thinking) {
    *p = (k3_reply_parser){.tok = t, .stops = *stops, .stop_id = -1};
    p->open_id = k3_tokenizer_special_id(t, K3_TOK_OPEN);
    p->close_id = k3_tokenizer_special_id(t, K3_TOK_CLOSE);
    p->sep_id = k3_tokenizer_special_id(t, K3_TOK_SEP);
    p->pos = thinking ? K3_IN_THINK : K3_IN_RESPONSE;
    p->ds_channel = thinking ? K3_CH_THINK : K3_CH_RESPONSE;
}

void k3_reply_parser_free(k3_reply_parser *p) {
    for (int i = 0; i < 3; i++) k3_strbuf_free(&p->text[i]);
}

size_t k3_reply_parser_out_cap(const k3_tokenizer *t) {
    return (K3_MARKER_MAX_IDS + 2) * (3 * (k3_tokenizer_max_token_len(t) + 3) + 1) + 8;
}

static enum k3_channel channel_of(enum k3_reply_pos pos) {
    return pos == K3_IN_THINK ? K3_CH_THINK : pos == K3_IN_TOOLS ? K3_CH_TOOLS : K3_CH_RESPONSE;
}

/* Output being built by one push: all of it belongs to one channel (see parse.h). */
typedef struct emit {
    char *out;
    size_t cap, n;
} emit;

static void text_id(k3_reply_parser *p, emit *e, int32_t id) {
    int len = k3_detok_stream_push(p->tok, &p->ds, id, e->out + e->n, e->cap - e->n);
    if (len > 0) e->n += (size_t)len;
}

static void flush_ds(k3_reply_parser *p, emit *e) {
    int len = k3_detok_stream_flush(&p->ds, e->out + e->n, e->cap - e->n);
    if (len > 0) e->n += (size_t)len;
}

static void release_marker(k3_reply_parser *p, emit *e) {
    for (int i = 0; i < p->n_marker; i++) text_id(p, e, p->marker[i]);
    p->n_marker = 0;
}

/* The tag of the held marker ("think", …) if it is all ordinary text, else "". */
static void marker_tag(const k3_reply_parser *p, char *tag, size_t cap) {
    size_t n = 0;
    tag[0] = 0;
    for (int i = 1; i < p->n_marker; i++) {
        size_t len;
        if (p->marker[i] >= k3_tokenizer_n_ranks(p->tok)) return; /* a special inside */
        const char *b = k3_tokenizer_token_bytes(p->tok, p->marker[i], &len);
        if (!b || n + len >= cap) {
            tag[0] = 0;
            return;
        }
        memcpy(tag + n, b, len);
        n += len;
    }
    tag[n] = 0;
}

/* The position after marker (open/close, tag) at pos, or -1 if it is not a valid move. */
static int next_pos(enum k3_reply_pos pos, bool open, const char *tag) {
    if (!open && !strcmp(tag, "think") && pos == K3_IN_THINK) return K3_AFTER_THINK;
    if (open && !strcmp(tag, "response") && pos == K3_AFTER_THINK) return K3_IN_RESPONSE;
    if (!open && !strcmp(tag, "response") && pos == K3_IN_RESPONSE) return K3_AFTER_RESPONSE;
    if (open && !strcmp(tag, "tools") && pos == K3_AFTER_RESPONSE) return K3_IN_TOOLS;
    if (!open && !strcmp(tag, "tools") && pos == K3_IN_TOOLS) return K3_AFTER_TOOLS;
    if (!open && !strcmp(tag, "message") && (pos == K3_AFTER_RESPONSE || pos == K3_AFTER_TOOLS))
        return K3_AFTER_MESSAGE;
    return -1;
}

/* <|sep|> closes the held marker: switch position, or release it as text. */
static void end_marker(k3_reply_parser *p, emit *e) {
    char tag[64];
    marker_tag(p, tag, sizeof tag);
    int next = next_pos(p->pos, p->marker[0] == p->open_id, tag);
    if (next < 0) {
        p->marker[p->n_marker++] = p->sep_id; /* room kept: n_marker < MAX here */
        release_marker(p, e);
        return;
    }
    flush_ds(p, e); /* held bytes belong to the channel being left */
    p->n_marker = 0;
    p->pos = (enum k3_reply_pos)next;
    p->ds_channel = channel_of(p->pos);
}

static int record(k3_reply_parser *p, const emit *e, enum k3_channel ch) {
    e->out[e->n] = 0;
    if (e->n) k3_strbuf_put(&p->text[ch], e->out, e->n);
    return p->text[ch].oom ? -1 : (int)e->n;
}

int k3_reply_parser_push(k3_reply_parser *p, int32_t id, char *out, size_t cap,
                         enum k3_channel *ch) {
    emit e = {out, cap, 0};
    *ch = p->ds_channel;
    if (p->ended) {
        out[0] = 0;
        return 0;
    }
    if (k3_stops_has(&p->stops, id)) {
        release_marker(p, &e);
        flush_ds(p, &e);
        p->ended = true;
        p->stop_id = id;
    } else if (id == p->open_id || id == p->close_id) {
        release_marker(p, &e); /* a marker inside a marker: the first was text */
        p->marker[p->n_marker++] = id;
    } else if (p->n_marker && id == p->sep_id) {
        end_marker(p, &e);
    } else if (p->n_marker && p->n_marker < K3_MARKER_MAX_IDS - 1) {
        p->marker[p->n_marker++] = id;
    } else {
        release_marker(p, &e); /* too long to be a marker, or no marker held */
        text_id(p, &e, id);
    }
    return record(p, &e, *ch);
}

int k3_reply_parser_finish(k3_reply_parser *p, char *out, size_t cap, enum k3_channel *ch) {
    emit e = {out, cap, 0};
    *ch = p->ds_channel;
    release_marker(p, &e);
    flush_ds(p, &e);
    p->ended = true;
    return record(p, &e, *ch);
}

/* ---- closing a cut reply ------------------------------------------------------------------ */

/* Appends marker(spelling, tag) = spelling + tag + <|sep|> as the renderer writes it. */
static int marker(k3_segments *s, const char *spelling, const char *tag, k3_err *err) {
    int rc = k3_segments_push(s, spelling, strlen(spelling), true, err);
    if (!rc) rc = k3_segments_push(s, tag, strlen(tag), false, err);
    if (!rc) rc = k3_segments_push(s, K3_TOK_SEP, strlen(K3_TOK_SEP), true, err);
    return rc;
}

int k3_reply_parser_closing(const k3_reply_parser *p, int32_t **ids, size_t *n, k3_err *err) {
    static const struct { const char *spelling, *tag; } steps[] = {
        {K3_TOK_CLOSE, "think"},    /* from K3_IN_THINK */
        {K3_TOK_OPEN, "response"},  /* from K3_AFTER_THINK: an empty response block */
        {K3_TOK_CLOSE, "response"}, /* from K3_IN_RESPONSE */
        {K3_TOK_CLOSE, "message"},  /* from K3_AFTER_RESPONSE */
    };
    int first; /* the step the position starts at; 4 = only <|end_of_msg|> */
    switch (p->pos) {
    case K3_IN_THINK: first = 0; break;
    case K3_AFTER_THINK: first = 1; break;
    case K3_IN_RESPONSE: first = 2; break;
    case K3_AFTER_RESPONSE: case K3_AFTER_TOOLS: first = 3; break;
    case K3_IN_TOOLS: first = -1; break; /* <|close|>tools<|sep|>, then step 3 */
    default: first = 4; break;
    }
    k3_segments s = {0};
    int rc = first < 0 ? marker(&s, K3_TOK_CLOSE, "tools", err) : K3_OK;
    for (int i = first < 0 ? 3 : first; i < 4 && !rc; i++)
        rc = marker(&s, steps[i].spelling, steps[i].tag, err);
    if (!rc) rc = k3_segments_push(&s, K3_TOK_END_OF_MSG, strlen(K3_TOK_END_OF_MSG), true, err);
    if (!rc) rc = k3_segments_encode(p->tok, &s, ids, n, err);
    k3_segments_free(&s);
    return rc;
}
