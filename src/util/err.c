#include "err.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* err's message from fmt, its code, and no field. */
static void vfail(k3_err *err, int code, const char *fmt, va_list ap) {
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    err->code = code;
    memset(err->field, 0, sizeof err->field);
}

int k3_fail(k3_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vfail(err, code, fmt, ap);
        va_end(ap);
    }
    return code;
}

int k3_fail_field(k3_err *err, int code, const char *field, const char *fmt, ...) {
    if (err) {
        memset(err->field, 0, sizeof err->field);
        snprintf(err->field[0].name, sizeof err->field[0].name, "%s", field);
        size_t n = strlen(err->field[0].name);
        memcpy(err->msg, err->field[0].name, n + 1);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg + n, sizeof err->msg - n, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

static bool word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
}

/* The offset of the last occurrence of name in msg as a whole word, or -1. */
static long last_word(const char *msg, const char *name) {
    size_t n = strlen(name);
    long found = -1;
    for (const char *p = msg; n && (p = strstr(p, name)); p++)
        if ((p == msg || !word_char(p[-1])) && !word_char(p[n])) found = p - msg;
    return found;
}

int k3_fail_opts(k3_err *err, int code, const char *fields, const char *fmt, ...) {
    if (!err) return code;
    va_list ap;
    va_start(ap, fmt);
    vfail(err, code, fmt, ap);
    va_end(ap);
    int k = 0;
    for (const char *f = fields; *f && k < K3_ERR_FIELDS;) {
        size_t n = strcspn(f, ",");
        if (n && n < sizeof err->field[k].name) {
            memcpy(err->field[k].name, f, n);
            long at = last_word(err->msg, err->field[k].name);
            if (at >= 0) err->field[k++].at = (size_t)at;
            else memset(&err->field[k], 0, sizeof err->field[k]);
        }
        f += n + (f[n] == ',');
    }
    return code;
}

int k3_err_prefix(k3_err *err, const char *fmt, ...) {
    if (!err) return K3_ERR_GENERIC;
    char head[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t n = strlen(head);
    if (n + 2 >= sizeof err->msg) n = sizeof err->msg - 3;
    memcpy(err->msg, head, n);
    memcpy(err->msg + n, ": ", 2);
    size_t rest = sizeof err->msg - n - 3;
    strncpy(err->msg + n + 2, old, rest);
    err->msg[sizeof err->msg - 1] = 0;
    for (int k = 0; k < K3_ERR_FIELDS; k++) { /* the names moved right (or fell off the end) */
        size_t len = strlen(err->field[k].name);
        if (len && err->field[k].at + n + 2 + len < sizeof err->msg) err->field[k].at += n + 2;
        else memset(&err->field[k], 0, sizeof err->field[k]);
    }
    return err->code;
}
