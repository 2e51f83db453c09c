/* pyjson.c — growable buffer and Python-compatible JSON text (see pyjson.h). */
#include "pyjson.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tok/utf8.h"

/* ---- buffer ----------------------------------------------------------------------------- */

static int reserve(k3_strbuf *b, size_t extra) {
    if (b->oom) return 0;
    if (b->n + extra + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

void k3_strbuf_put(k3_strbuf *b, const char *s, size_t n) {
    if (!reserve(b, n)) return;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void k3_strbuf_puts(k3_strbuf *b, const char *s) { k3_strbuf_put(b, s, strlen(s)); }

void k3_strbuf_printf(k3_strbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        k3_strbuf_put(b, tmp, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

void k3_strbuf_free(k3_strbuf *b) {
    free(b->p);
    *b = (k3_strbuf){0};
}

/* ---- JSON text -------------------------------------------------------------------------- */

static void dump_string(k3_strbuf *b, const char *s) {
    k3_strbuf_put(b, "\"", 1);
    const char *run = s;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            }
        }
        if (!esc) continue;
        k3_strbuf_put(b, run, (size_t)(s - run));
        k3_strbuf_puts(b, esc);
        run = s + 1;
    }
    k3_strbuf_put(b, run, (size_t)(s - run));
    k3_strbuf_put(b, "\"", 1);
}

static void dump_number(k3_strbuf *b, double v) {
    if (v == 0) { /* -0 too: the source "0" or "-0" is a Python int */
        k3_strbuf_put(b, "0", 1);
        return;
    }
    if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        k3_strbuf_printf(b, "%.0f", v);
        return;
    }
    if (!isfinite(v)) { /* not produced by cJSON's parser; Python's spelling */
        k3_strbuf_puts(b, isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity");
        return;
    }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v) break;
    }
    k3_strbuf_puts(b, tmp);
}

/* The last sibling of `first` (inclusive) with the same key: Python keeps the last value. */
const cJSON *k3_pyjson_dict_value(const cJSON *first) {
    const cJSON *v = first;
    for (const cJSON *c = first->next; c; c = c->next)
        if (c->string && strcmp(c->string, first->string) == 0) v = c;
    return v;
}

int k3_pyjson_dict_dup(const cJSON *obj, const cJSON *item) {
    for (const cJSON *c = obj->child; c != item; c = c->next)
        if (c->string && strcmp(c->string, item->string) == 0) return 1;
    return 0;
}

static int cmp_key(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

static void dump_object(k3_strbuf *b, const cJSON *v, enum k3_pyjson_style st, bool sort) {
    size_t n = 0;
    for (const cJSON *c = v->child; c; c = c->next) n++;
    const cJSON **keys = malloc((n + 1) * sizeof *keys);
    if (!keys) {
        b->oom = 1;
        return;
    }
    size_t k = 0;
    for (const cJSON *c = v->child; c; c = c->next)
        if (c->string && !k3_pyjson_dict_dup(v, c)) keys[k++] = c;
    if (sort) qsort(keys, k, sizeof *keys, cmp_key);
    k3_strbuf_put(b, "{", 1);
    for (size_t i = 0; i < k; i++) {
        if (i) k3_strbuf_puts(b, st == K3_PYJSON_COMPACT ? "," : ", ");
        dump_string(b, keys[i]->string);
        k3_strbuf_puts(b, st == K3_PYJSON_COMPACT ? ":" : ": ");
        k3_pyjson_dump(b, k3_pyjson_dict_value(keys[i]), st, sort);
    }
    k3_strbuf_put(b, "}", 1);
    free(keys);
}

void k3_pyjson_dump(k3_strbuf *b, const cJSON *v, enum k3_pyjson_style st, bool sort_keys) {
    if (cJSON_IsObject(v)) {
        dump_object(b, v, st, sort_keys);
    } else if (cJSON_IsArray(v)) {
        k3_strbuf_put(b, "[", 1);
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child) k3_strbuf_puts(b, st == K3_PYJSON_COMPACT ? "," : ", ");
            k3_pyjson_dump(b, c, st, sort_keys);
        }
        k3_strbuf_put(b, "]", 1);
    } else if (cJSON_IsString(v)) {
        dump_string(b, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        dump_number(b, v->valuedouble);
    } else if (cJSON_IsTrue(v)) {
        k3_strbuf_puts(b, "true");
    } else if (cJSON_IsFalse(v)) {
        k3_strbuf_puts(b, "false");
    } else {
        k3_strbuf_puts(b, "null");
    }
}

void k3_py_strip(const char *s, size_t n, size_t *start, size_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, first = n, end = 0;
    while (i < n) {
        size_t at = i;
        uint32_t cp = k3_utf8_next(u, &i);
        if (!k3_py_isspace(cp)) {
            if (first == n) first = at;
            end = i;
        }
    }
    *start = first == n ? 0 : first;
    *len = first == n ? 0 : end - first;
}
