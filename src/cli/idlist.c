/* idlist.c — token-id lists (idlist.h). */
#include "idlist.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* "src:line" for a file, else "src 'text'" (text cut to 60 bytes). */
static void where(char *buf, size_t cap, const char *text, size_t len, const char *src,
                  int is_file, int line) {
    if (is_file)
        snprintf(buf, cap, "%s:%d", src, line);
    else
        snprintf(buf, cap, "%s '%.*s%s'", src, len > 60 ? 57 : (int)len, text,
                 len > 60 ? "..." : "");
}

int k3_cli_parse_ids(const char *text, size_t len, const char *src, int is_file, int vocab,
                     int32_t **ids, size_t *n, k3_err *err) {
    size_t cap = 0, cnt = 0, i = 0;
    int32_t *v = NULL;
    int line = 1, rc = K3_OK;
    int comma_line = 1; /* the last comma's line: a trailing comma is reported there */
    bool after_comma = true; /* at the start, a comma would begin with an empty item */
    char at[160];
    if (is_file && len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3))
        i = 3; /* a UTF-8 byte order mark, as some editors write at the start */
    const char *nul = memchr(text, '\0', len);
    if (nul) { /* a binary file: say so rather than quote a "token id" cut at the NUL */
        for (const char *p = text; p < nul; p++) line += *p == '\n';
        where(at, sizeof at, text, (size_t)(nul - text), src, is_file, line);
        return k3_fail(err, K3_ERR_USAGE, "%s: a NUL byte: not a text file of token ids", at);
    }
    while (i < len && !rc) {
        char c = text[i];
        if (is_space(c)) {
            line += c == '\n';
            i++;
            continue;
        }
        if (c == ',') {
            if (after_comma) break; /* an empty item: reported below */
            after_comma = true;
            comma_line = line;
            i++;
            continue;
        }
        size_t start = i;
        uint64_t x = 0;
        while (i < len && !is_space(text[i]) && text[i] != ',') {
            if (text[i] < '0' || text[i] > '9') x = UINT64_MAX;
            else if (x <= (uint64_t)vocab) x = x * 10 + (uint64_t)(text[i] - '0');
            i++;
        }
        int w = (int)(i - start);
        where(at, sizeof at, text, len, src, is_file, line);
        if (x == UINT64_MAX)
            rc = k3_fail(err, K3_ERR_USAGE, "%s: '%.*s' is not a token id (ids are non-negative "
                         "integers separated by commas or spaces)", at, w > 40 ? 40 : w,
                         text + start);
        else if (x >= (uint64_t)vocab)
            rc = k3_fail(err, K3_ERR_INPUT, "%s: token id %.*s is outside the vocabulary "
                         "[0, %d)", at, w > 40 ? 40 : w, text + start, vocab);
        else if (cnt == cap) {
            int32_t *nv = realloc(v, (cap = cap ? 2 * cap : 64) * sizeof *v);
            if (!nv) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
            else v = nv;
        }
        if (!rc) v[cnt++] = (int32_t)x;
        after_comma = false;
    }
    if (!rc && after_comma && (cnt > 0 || i < len)) { /* ",,", a leading or trailing comma */
        where(at, sizeof at, text, len, src, is_file, i < len ? line : comma_line);
        rc = k3_fail(err, K3_ERR_USAGE, "%s: an empty item (a comma with no id before or after "
                     "it)", at);
    }
    if (rc) {
        free(v);
        return rc;
    }
    *ids = v;
    *n = cnt;
    return K3_OK;
}
