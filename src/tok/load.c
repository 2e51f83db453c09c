/* load.c — builds a k3_tokenizer from DIR/tiktoken.model and DIR/tokenizer_config.json
 * (spec §11.1): ranks, the 256 special spellings, the lookup maps and the compiled regex. */
#include "tok_internal.h"
#include "../util/fileio.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MODEL_BYTES ((size_t)256 << 20) /* the real tiktoken.model is 2.8 MB */
#define MAX_CONFIG_BYTES ((size_t)16 << 20)

/* ---- growable arena of token bytes plus their offsets ------------------------------- */

typedef struct arena {
    char *bytes;
    size_t n, cap;
    uint32_t *off; /* off[i] = start of token i; off[count] = n */
    size_t count, off_cap;
} arena;

static int arena_reserve(arena *a, size_t more) {
    if (a->n + more > a->cap) {
        size_t cap = a->cap ? a->cap : 1 << 16;
        while (cap < a->n + more) cap *= 2;
        char *p = realloc(a->bytes, cap);
        if (!p) return -1;
        a->bytes = p;
        a->cap = cap;
    }
    if (a->count + 2 > a->off_cap) {
        size_t cap = a->off_cap ? 2 * a->off_cap : 4096;
        uint32_t *o = realloc(a->off, cap * sizeof *o);
        if (!o) return -1;
        if (!a->off) o[0] = 0;
        a->off = o;
        a->off_cap = cap;
    }
    return 0;
}

/* Closes the token whose bytes were appended since the previous call. */
static void arena_close_token(arena *a) {
    a->off[++a->count] = (uint32_t)a->n;
}

static int arena_append(arena *a, const char *p, size_t n) {
    if (arena_reserve(a, n) != 0) return -1;
    memcpy(a->bytes + a->n, p, n);
    a->n += n;
    arena_close_token(a);
    return 0;
}

/* ---- tiktoken.model ------------------------------------------------------------------ */

static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Decodes standard, padded base64 s[0..n) into out; returns the byte count or -1. */
static long b64_decode(const char *s, size_t n, char *out) {
    if (n == 0 || n % 4) return -1;
    size_t pad = s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    long o = 0;
    uint32_t acc = 0;
    for (size_t i = 0; i < n - pad; i++) {
        int v = b64_value((unsigned char)s[i]);
        if (v < 0) return -1;
        acc = acc << 6 | (uint32_t)v;
        if (i % 4 == 3) {
            out[o++] = (char)(acc >> 16);
            out[o++] = (char)(acc >> 8);
            out[o++] = (char)acc;
            acc = 0;
        }
    }
    if (pad == 1) { /* 3 symbols left: 18 bits, 2 bytes */
        out[o++] = (char)(acc >> 10);
        out[o++] = (char)(acc >> 2);
    } else if (pad == 2) { /* 2 symbols: 12 bits, 1 byte */
        out[o++] = (char)(acc >> 4);
    }
    return o;
}

/* Parses a decimal rank s[0..n) (digits only); -1 when malformed or huge. */
static long parse_rank(const char *s, size_t n) {
    if (n == 0 || n > 9) return -1;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* One line "base64 rank" → appends the token; line_no and hint (said after the problem) only
 * for messages. */
static int parse_rank_line(arena *a, const char *line, size_t n, const char *path, int line_no,
                           const char *hint, k3_err *err) {
    const char *sp = memchr(line, ' ', n);
    size_t b64_len = sp ? (size_t)(sp - line) : n;
    if (arena_reserve(a, b64_len) != 0)
        return k3_fail(err, K3_ERR_GENERIC, "%s: out of memory", path);
    long len = sp ? b64_decode(line, b64_len, a->bytes + a->n) : -1;
    long rank = sp ? parse_rank(sp + 1, n - b64_len - 1) : -1;
    if (len < 0 || rank < 0)
        return k3_fail(err, K3_ERR_TOKENIZER,
                       "%s:%d: malformed line (expected \"<base64> <rank>\")%s", path, line_no,
                       hint);
    if (rank != (long)a->count)
        return k3_fail(err, K3_ERR_TOKENIZER,
                       "%s:%d: rank %ld, expected %zu (ranks must be contiguous from 0)%s",
                       path, line_no, rank, a->count, hint);
    a->n += (size_t)len;
    arena_close_token(a);
    return K3_OK;
}

/* Parses every non-empty line of tiktoken.model (as tiktoken does, blank lines are skipped). */
static int parse_tiktoken(arena *a, const char *buf, size_t len, const char *path, k3_err *err) {
    int line_no = 0;
    for (size_t pos = 0; pos < len;) {
        const char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len, n = end - pos;
        line_no++;
        if (n > 0 && buf[end - 1] == '\r') n--;
        const char *hint = nl ? "" : "; the file ends inside this line: truncated?";
        if (n > 0 && parse_rank_line(a, buf + pos, n, path, line_no, hint, err) != K3_OK)
            return err->code;
        pos = end + 1;
    }
    if (a->count == 0) return k3_fail(err, K3_ERR_TOKENIZER, "%s: no ranks", path);
    return K3_OK;
}

/* ---- tokenizer_config.json ----------------------------------------------------------- */

static int line_of(const char *buf, const char *at) {
    int line = 1;
    for (const char *p = buf; p < at; p++) line += *p == '\n';
    return line;
}

/* Fills names[i] (borrowed from root) for each special n_ranks+i listed in
 * added_tokens_decoder; the others stay NULL. The specials follow the last rank, so an id past
 * them means tiktoken.model (model_path) lost its last lines. */
static int special_names(const cJSON *root, int32_t n_ranks, const char **names,
                         const char *path, const char *model_path, k3_err *err) {
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "added_tokens_decoder");
    if (!cJSON_IsObject(dec))
        return k3_fail(err, K3_ERR_CONFIG, "%s: no \"added_tokens_decoder\" object", path);
    for (const cJSON *e = dec->child; e; e = e->next) {
        char *end;
        long id = strtol(e->string, &end, 10);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!*end && end != e->string && id >= n_ranks + K3_TOK_N_SPECIALS)
            return k3_fail(err, K3_ERR_TOKENIZER,
                           "%s: only %d ranks (ids 0..%d), but %s names special id %ld, so the "
                           "ranks should go up to at least %ld: tiktoken.model looks truncated "
                           "(copy it again from the snapshot)", model_path, n_ranks,
                           n_ranks - 1, path, id, id - K3_TOK_N_SPECIALS);
        if (*end || end == e->string || id < n_ranks || id >= n_ranks + K3_TOK_N_SPECIALS)
            return k3_fail(err, K3_ERR_CONFIG,
                           "%s: added_tokens_decoder id \"%s\" is not a special id (%d..%d)",
                           path, e->string, n_ranks, n_ranks + K3_TOK_N_SPECIALS - 1);
        if (!cJSON_IsString(c) || !c->valuestring[0])
            return k3_fail(err, K3_ERR_CONFIG,
                           "%s: added_tokens_decoder \"%s\" has no \"content\" string", path,
                           e->string);
        names[id - n_ranks] = c->valuestring;
    }
    return K3_OK;
}

/* Appends the 256 special spellings to the arena: named ones, else <|reserved_token_{id}|>. */
static int load_specials(arena *a, const char *path, const char *model_path, k3_err *err) {
    char *buf;
    size_t len;
    if (k3_read_file(path, MAX_CONFIG_BYTES, &buf, &len, err) != K3_OK) return err->code;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    int rc = root ? K3_OK
                  : k3_fail(err, K3_ERR_CONFIG, "%s:%d: malformed JSON", path,
                            line_of(buf, end ? end : buf));
    const char *names[K3_TOK_N_SPECIALS] = {0};
    int32_t n_ranks = (int32_t)a->count;
    if (rc == K3_OK) rc = special_names(root, n_ranks, names, path, model_path, err);
    for (int i = 0; rc == K3_OK && i < K3_TOK_N_SPECIALS; i++) {
        char tmp[64];
        const char *s = names[i];
        if (!s) snprintf(tmp, sizeof tmp, "<|reserved_token_%d|>", n_ranks + i);
        if (arena_append(a, s ? s : tmp, strlen(s ? s : tmp)) != 0)
            rc = k3_fail(err, K3_ERR_GENERIC, "%s: out of memory", path);
    }
    cJSON_Delete(root);
    free(buf);
    return rc;
}

/* ---- lookup tables ------------------------------------------------------------------- */

static int build_rank_map(k3_tokenizer *t, const char *path, k3_err *err) {
    int32_t dup = k3_bmap_build(&t->ranks, t->bytes, t->off, 0, t->n_ranks);
    if (dup == -2) return k3_fail(err, K3_ERR_GENERIC, "%s: out of memory", path);
    if (dup >= 0)
        return k3_fail(err, K3_ERR_TOKENIZER, "%s: rank %d repeats the bytes of an earlier rank",
                       path, dup);
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        if (k3_bmap_get(&t->ranks, &c, 1) < 0)
            return k3_fail(err, K3_ERR_TOKENIZER, "%s: byte 0x%02x has no rank", path, b);
    }
    for (int32_t i = 0; i < t->n_ranks; i++) {
        size_t len = t->off[i + 1] - t->off[i];
        if (len > t->max_rank_len) t->max_rank_len = len;
    }
    return K3_OK;
}

static int build_special_map(k3_tokenizer *t, const char *path, k3_err *err) {
    int32_t dup = k3_bmap_build(&t->specials, t->bytes, t->off, t->n_ranks, K3_TOK_N_SPECIALS);
    if (dup == -2) return k3_fail(err, K3_ERR_GENERIC, "%s: out of memory", path);
    if (dup >= 0)
        return k3_fail(err, K3_ERR_CONFIG, "%s: special id %d repeats an earlier spelling",
                       path, dup);
    t->max_token_len = t->max_rank_len;
    for (int32_t id = t->n_ranks; id < t->n_ranks + K3_TOK_N_SPECIALS; id++) {
        size_t len = t->off[id + 1] - t->off[id], k = 0;
        t->special_first[(unsigned char)t->bytes[t->off[id]]] = 1;
        if (len > t->max_token_len) t->max_token_len = len;
        while (k < (size_t)t->n_special_lens && t->special_lens[k] > len) k++;
        if (k < (size_t)t->n_special_lens && t->special_lens[k] == len) continue;
        memmove(&t->special_lens[k + 1], &t->special_lens[k],
                (size_t)(t->n_special_lens - (int)k) * sizeof t->special_lens[0]);
        t->special_lens[k] = len;
        t->n_special_lens++;
    }
    return K3_OK;
}

/* ---- public -------------------------------------------------------------------------- */

static int load_into(k3_tokenizer *t, const char *dir, k3_err *err) {
    char model[4096], config[4096];
    k3_path_join(model, sizeof model, dir, "tiktoken.model");
    k3_path_join(config, sizeof config, dir, "tokenizer_config.json");
    arena a = {0};
    char *buf = NULL;
    size_t len;
    int rc = k3_read_file(model, MAX_MODEL_BYTES, &buf, &len, err);
    if (rc == K3_OK) rc = parse_tiktoken(&a, buf, len, model, err);
    free(buf);
    t->n_ranks = (int32_t)a.count;
    if (rc == K3_OK) rc = load_specials(&a, config, model, err);
    t->bytes = a.bytes;
    t->off = a.off;
    if (rc == K3_OK) rc = build_rank_map(t, model, err);
    if (rc == K3_OK) rc = build_special_map(t, config, err);
    if (rc == K3_OK) rc = k3_pretok_compile(k3_kimi_pat_pcre2, &t->re, err);
    return rc;
}

int k3_tokenizer_load(const char *dir, k3_tokenizer **out, k3_err *err) {
    k3_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    int rc = load_into(t, dir, err);
    if (rc != K3_OK) {
        k3_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return K3_OK;
}

void k3_tokenizer_free(k3_tokenizer *t) {
    if (!t) return;
    k3_bmap_free(&t->ranks);
    k3_bmap_free(&t->specials);
    pcre2_code_free(t->re);
    free(t->bytes);
    free(t->off);
    free(t);
}
