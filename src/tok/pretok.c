/* pretok.c — Kimi's pat_str, its PCRE2 translation, and match iteration (pretok.h). */
#include "pretok.h"

const char k3_kimi_pat_str[] =
    "[\\p{Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

#define CONTRACTION "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"

const char k3_kimi_pat_pcre2[] =
    "[\\p{sc:Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?" K3_PAT_UPPERISH "*" K3_PAT_LOWERISH "+" CONTRACTION
    "|[^\\r\\n\\p{L}\\p{N}]?" K3_PAT_UPPERISH "+" K3_PAT_LOWERISH "*" CONTRACTION
    "|\\p{N}{1,3}"
    "| ?[^" K3_PAT_WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" K3_PAT_WS "]*[\\r\\n]+"
    "|[" K3_PAT_WS "]+(?![^" K3_PAT_WS "])"
    "|[" K3_PAT_WS "]+";

int k3_pretok_compile(const char *pattern, pcre2_code **out, k3_err *err) {
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return k3_fail(err, K3_ERR_GENERIC, "pre-tokenizer regex, offset %zu: %s", (size_t)at,
                       (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: the interpreter also works */
    *out = re;
    return K3_OK;
}

int k3_pretok_next(const pcre2_code *re, pcre2_match_data *md, const char *s, size_t len,
                   size_t pos, size_t *b, size_t *e) {
    /* The caller validated s once; PCRE2 would otherwise re-check all of it on every call. */
    int rc = pcre2_match(re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                         NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return rc;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *b = ov[0];
    *e = ov[1];
    return 1;
}
