/* text.c — byte buffers, JSON string escaping and OpenAI-shaped error bodies (see srv.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "srv.h"

/* ---- growable byte buffer -------------------------------------------------------------- */

static int sbuf_reserve(k3_sbuf *b, size_t extra) {
    if (b->oom) return -1;
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void k3_sbuf_add(k3_sbuf *b, const char *s, size_t n) {
    if (sbuf_reserve(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void k3_sbuf_str(k3_sbuf *b, const char *s) { k3_sbuf_add(b, s, strlen(s)); }

void k3_sbuf_printf(k3_sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || sbuf_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void k3_sbuf_free(k3_sbuf *b) {
    free(b->p);
    *b = (k3_sbuf){0};
}

/* Length of the valid UTF-8 sequence at s (1..4; RFC 3629: no overlongs, no surrogates,
 * nothing above U+10FFFF), or 0 with *bad = the bytes of its maximal invalid subpart, which
 * become one U+FFFD (as Python's errors="replace" and the tokenizer's decoder do). */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad) {
    unsigned c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    *bad = 1;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    for (size_t i = 1; i < len; i++) {
        if (i >= n || s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xBF)) {
            *bad = i;
            return 0;
        }
    }
    return len;
}

/* Escapes quotes, backslashes and control characters; invalid UTF-8 becomes U+FFFD, so the
 * output is always valid JSON text whatever bytes came in. */
void k3_sbuf_json_str(k3_sbuf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t run = i;
        while (run < n && u[run] >= 0x20 && u[run] < 0x80 && u[run] != '"' && u[run] != '\\')
            run++;
        if (run > i) {
            k3_sbuf_add(b, s + i, run - i);
            i = run;
            continue;
        }
        unsigned c = u[i];
        if (c == '"') k3_sbuf_add(b, "\\\"", 2);
        else if (c == '\\') k3_sbuf_add(b, "\\\\", 2);
        else if (c == '\n') k3_sbuf_add(b, "\\n", 2);
        else if (c == '\r') k3_sbuf_add(b, "\\r", 2);
        else if (c == '\t') k3_sbuf_add(b, "\\t", 2);
        else if (c < 0x20) k3_sbuf_printf(b, "\\u%04x", c);
        else {
            size_t bad, len = utf8_seq(u + i, n - i, &bad);
            if (len) {
                k3_sbuf_add(b, s + i, len);
                i += len;
                continue;
            }
            k3_sbuf_add(b, "\xEF\xBF\xBD", 3);
            i += bad;
            continue;
        }
        i++;
    }
}

/* ---- errors ------------------------------------------------------------------------------ */

int k3_api_fail(k3_api_error *e, int status, const char *type, const char *code,
                const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    e->allow = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

char *k3_api_error_json(const k3_api_error *e) {
    k3_sbuf b = {0};
    k3_sbuf_str(&b, "{\"error\":{\"message\":\"");
    k3_sbuf_json_str(&b, e->message, strlen(e->message));
    k3_sbuf_str(&b, "\",\"type\":\"");
    k3_sbuf_str(&b, e->type ? e->type : "invalid_request_error");
    k3_sbuf_str(&b, "\",\"param\":");
    if (e->param[0]) {
        k3_sbuf_str(&b, "\"");
        k3_sbuf_json_str(&b, e->param, strlen(e->param));
        k3_sbuf_str(&b, "\"");
    } else {
        k3_sbuf_str(&b, "null");
    }
    k3_sbuf_str(&b, ",\"code\":");
    if (e->code) k3_sbuf_printf(&b, "\"%s\"", e->code);
    else k3_sbuf_str(&b, "null");
    k3_sbuf_str(&b, "}}\n");
    if (b.oom) {
        k3_sbuf_free(&b);
        return NULL;
    }
    return b.p;
}
