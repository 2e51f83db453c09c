#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int k3_fail(k3_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
        err->field[0] = 0;
    }
    return code;
}

int k3_fail_field(k3_err *err, int code, const char *field, const char *fmt, ...) {
    if (err) {
        snprintf(err->field, sizeof err->field, "%s", field);
        size_t n = strlen(err->field);
        memcpy(err->msg, err->field, n + 1);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg + n, sizeof err->msg - n, fmt, ap);
        va_end(ap);
        err->code = code;
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
    return err->code;
}
