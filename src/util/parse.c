/* parse.c — see parse.h. */
#include "parse.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

int k3_parse_long(const char *s, const char *name, long long lo, long long hi, long long *out,
                  k3_err *err) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || isspace((unsigned char)*s) || v < lo || v > hi)
        return k3_fail(err, K3_ERR_USAGE, "%s='%s': expected an integer in [%lld, %lld]", name,
                       s, lo, hi);
    *out = v;
    return K3_OK;
}

int k3_parse_int(const char *s, const char *name, int lo, int hi, int *out, k3_err *err) {
    long long v;
    int rc = k3_parse_long(s, name, lo, hi, &v, err);
    if (!rc) *out = (int)v;
    return rc;
}

int k3_parse_double(const char *s, const char *name, double lo, double hi, double *out,
                    k3_err *err) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    /* errno: overflow to inf ("1e999") or underflow; !isfinite: "inf", "nan" */
    if (errno == ERANGE || end == s || *end || isspace((unsigned char)*s) || !isfinite(v) ||
        v < lo || v > hi)
        return k3_fail(err, K3_ERR_USAGE, "%s='%s': expected a finite number in [%g, %g]", name,
                       s, lo, hi);
    *out = v;
    return K3_OK;
}

int k3_parse_u64(const char *s, const char *name, uint64_t *out, k3_err *err) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || !isdigit((unsigned char)*s))
        return k3_fail(err, K3_ERR_USAGE, "%s='%s': expected an integer in [0, 2^64)", name, s);
    *out = v;
    return K3_OK;
}
