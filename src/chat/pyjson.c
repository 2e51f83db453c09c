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

/* Members sorted by (key, position): a key's members are then adjacent, first and last
 * position at the ends of the run, in O(n log n) instead of a scan per member. */
typedef struct keyed {
    const cJSON *m;
    size_t pos;
} keyed;

static int cmp_keyed(const void *a, const void *b) {
    const keyed *x = a, *y = b;
    int c = strcmp(x->m->string, y->m->string);
    if (c) return c;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int cmp_first_pos(const void *a, const void *b) {
    const k3_pyjson_member *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

int k3_pyjson_dict(const cJSON *obj, k3_pyjson_member **out, size_t *n_out) {
    size_t n = 0;
    for (const cJSON *c = obj->child; c; c = c->next) n += c->string != NULL;
    keyed *all = malloc((n + 1) * sizeof *all);
    k3_pyjson_member *m = malloc((n + 1) * sizeof *m);
    if (!all || !m) {
        free(all);
        free(m);
        return -1;
    }
    size_t k = 0, pos = 0;
    for (const cJSON *c = obj->child; c; c = c->next, pos++)
        if (c->string) all[k++] = (keyed){c, pos};
    qsort(all, n, sizeof *all, cmp_keyed);
    size_t u = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && !strcmp(all[j].m->string, all[i].m->string)) j++;
        m[u++] = (k3_pyjson_member){all[i].m->string, all[j - 1].m, all[i].pos};
        i = j;
    }
    free(all);
    qsort(m, u, sizeof *m, cmp_first_pos);
    *out = m;
    *n_out = u;
    return 0;
}

static int cmp_key(const void *a, const void *b) {
    return strcmp(((const k3_pyjson_member *)a)->key, ((const k3_pyjson_member *)b)->key);
}

static void dump_object(k3_strbuf *b, const cJSON *v, enum k3_pyjson_style st, bool sort) {
    k3_pyjson_member *keys;
    size_t k;
    if (k3_pyjson_dict(v, &keys, &k)) {
        b->oom = 1;
        return;
    }
    if (sort) qsort(keys, k, sizeof *keys, cmp_key);
    k3_strbuf_put(b, "{", 1);
    for (size_t i = 0; i < k; i++) {
        if (i) k3_strbuf_puts(b, st == K3_PYJSON_COMPACT ? "," : ", ");
        dump_string(b, keys[i].key);
        k3_strbuf_puts(b, st == K3_PYJSON_COMPACT ? ":" : ": ");
        k3_pyjson_dump(b, keys[i].value, st, sort);
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
        int kind;
        /* Not yet validated here (reasoning_content, tool-call arguments): a truncated or
         * invalid sequence is one non-space unit and is never read past n. */
        size_t unit = k3_utf8_unit(u + i, n - i, &kind);
        uint32_t cp = 0xFFFD;
        if (kind == K3_UTF8_VALID) cp = k3_utf8_next(u, &i);
        else i += unit;
        if (!k3_py_isspace(cp)) {
            if (first == n) first = at;
            end = i;
        }
    }
    *start = first == n ? 0 : first;
    *len = first == n ? 0 : end - first;
}
