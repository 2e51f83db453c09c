/* utf8.c — UTF-8 validation, iteration, Python isspace and U+FFFD replacement (utf8.h). */
#include "utf8.h"

#include <string.h>

/* Sequence length announced by a lead byte, 0 for a byte that can never start one
 * (continuation bytes 80..BF, overlong leads C0/C1, and F5..FF). */
static size_t lead_len(unsigned char b) {
    if (b < 0x80) return 1;
    if (b < 0xC2) return 0;
    if (b < 0xE0) return 2;
    if (b < 0xF0) return 3;
    if (b < 0xF5) return 4;
    return 0;
}

/* Allowed range of the second byte after lead b: narrower for E0 (no overlongs), ED (no
 * surrogates), F0 (no overlongs) and F4 (nothing above U+10FFFF). */
static bool second_ok(unsigned char lead, unsigned char b) {
    switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
    }
}

size_t k3_utf8_unit(const unsigned char *s, size_t n, int *kind) {
    size_t need = lead_len(s[0]);
    if (need == 0) {
        *kind = K3_UTF8_INVALID;
        return 1;
    }
    for (size_t k = 1; k < need; k++) {
        if (k >= n) {
            *kind = K3_UTF8_TRUNCATED;
            return k;
        }
        bool ok = k == 1 ? second_ok(s[0], s[1]) : (s[k] >= 0x80 && s[k] <= 0xBF);
        if (!ok) {
            *kind = K3_UTF8_INVALID;
            return k;
        }
    }
    *kind = K3_UTF8_VALID;
    return need;
}

size_t k3_utf8_invalid_at(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) { /* ASCII fast path */
            i++;
            continue;
        }
        int kind;
        size_t len = k3_utf8_unit(s + i, n - i, &kind);
        if (kind != K3_UTF8_VALID) return i;
        i += len;
    }
    return n;
}

uint32_t k3_utf8_next(const unsigned char *s, size_t *i) {
    const unsigned char *p = s + *i;
    if (p[0] < 0x80) {
        *i += 1;
        return p[0];
    }
    if (p[0] < 0xE0) {
        *i += 2;
        return (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
    }
    if (p[0] < 0xF0) {
        *i += 3;
        return (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    }
    *i += 4;
    return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 |
           (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
}

bool k3_py_isspace(uint32_t cp) {
    if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
    switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

size_t k3_utf8_replace(const unsigned char *s, size_t n, char *out) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, o = 0;
    while (i < n) {
        int kind;
        size_t len = k3_utf8_unit(s + i, n - i, &kind);
        const void *src = kind == K3_UTF8_VALID ? (const void *)(s + i) : fffd;
        size_t w = kind == K3_UTF8_VALID ? len : 3;
        if (out) memcpy(out + o, src, w);
        o += w;
        i += len;
    }
    return o;
}
