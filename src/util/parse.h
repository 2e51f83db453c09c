/* parse.h — range-checked number parsing for options (command-line flags, environment
 * variables, request fields): the whole string must be the number, and a value outside
 * [lo, hi] is refused with the range in the message.
 *
 * Invariants:
 *  - The message names the option as given (`name`, e.g. "--expert-gb" or "K3_EXPERT_GB")
 *    and quotes the text: "--expert-gb='inf': expected a finite number in (0, 1e+06]".
 *  - Doubles must be finite (inf and nan are refused whatever the range).
 *  - Nothing is written to *out on error.
 */
#ifndef K3_UTIL_PARSE_H
#define K3_UTIL_PARSE_H

#include <stdint.h>
#include "err.h"

/* A decimal integer in [lo, hi] (leading '+' or '-' allowed). Errors: K3_ERR_USAGE. */
int k3_parse_long(const char *s, const char *name, long long lo, long long hi, long long *out,
                  k3_err *err);
/* k3_parse_long into an int (lo and hi must fit in int). */
int k3_parse_int(const char *s, const char *name, int lo, int hi, int *out, k3_err *err);
/* A finite floating-point number in [lo, hi] (strtod syntax). Errors: K3_ERR_USAGE. */
int k3_parse_double(const char *s, const char *name, double lo, double hi, double *out,
                    k3_err *err);
/* An unsigned decimal integer in [0, 2^64), no sign. Errors: K3_ERR_USAGE. */
int k3_parse_u64(const char *s, const char *name, uint64_t *out, k3_err *err);

#endif
