/* test_tokenizer.c — the tokenizer (src/tok) against the fixtures: every encode case of
 * tests/fixtures/tokenizer/cases.json for both tokenizers and both special modes, every
 * decode case (one-shot and streaming), the chat.json segment encodings, the 400k/25k
 * slicing rule, the PCRE2 translation of pat_str, BPE against a naive tiktoken loop, bad
 * input and bad files, and (when K3_BIN is set) the tokenize/detokenize commands. */
#include "test.h"
#include "../src/tok/tok_internal.h"
#include "../src/tok/utf8.h"
#include "../src/util/fileio.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CASES_JSON "tests/fixtures/tokenizer/cases.json"
#define CHAT_JSON "tests/fixtures/tokenizer/chat.json"
#define KIMI_DIR "tests/fixtures/tokenizer/kimi-shaped"
#define NANO_DIR "tests/fixtures/k3-nano"

/* ---- helpers ------------------------------------------------------------------------- */

/* In-repo folder of a tokenizer named as in cases.json ("base" there is shared/fixtures). */
static const char *tok_dir(const char *name) {
    return strcmp(name, "kimi-shaped") == 0 ? KIMI_DIR : NANO_DIR;
}

static cJSON *load_json(const char *path) {
    char *buf;
    size_t len;
    k3_err err = {0};
    CHECK_OR(NULL, k3_read_file(path, (size_t)64 << 20, &buf, &len, &err) == K3_OK, "%s",
             err.msg);
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    CHECK_OR(NULL, j != NULL, "%s: malformed JSON", path);
    return j;
}

static k3_tokenizer *load_tok(const char *dir) {
    k3_tokenizer *t = NULL;
    k3_err err = {0};
    CHECK_OR(NULL, k3_tokenizer_load(dir, &t, &err) == K3_OK, "%s", err.msg);
    return t;
}

/* Decodes a hex string into a malloc'd buffer. */
static char *from_hex(const char *hex, size_t *len) {
    size_t n = strlen(hex) / 2;
    char *out = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    out[n] = 0;
    *len = n;
    return out;
}

/* 1 if ids[0..n) equals the JSON int array; else 0 and a note on the first difference. */
static int same_ids(const int32_t *ids, size_t n, const cJSON *arr, char *why, size_t cap) {
    size_t m = (size_t)cJSON_GetArraySize(arr), i = 0;
    for (const cJSON *e = arr ? arr->child : NULL; e && i < n; e = e->next, i++) {
        if (ids[i] != (int32_t)e->valuedouble) {
            snprintf(why, cap, "at %zu: got %d, want %d (got %zu ids, want %zu)", i, ids[i],
                     (int)e->valuedouble, n, m);
            return 0;
        }
    }
    snprintf(why, cap, "got %zu ids, want %zu", n, m);
    return n == m;
}

static int encode(const k3_tokenizer *t, const char *s, size_t len, bool special, int32_t **ids,
                  size_t *n) {
    k3_err err = {0};
    int rc = k3_tokenizer_encode(t, s, len, special, ids, n, &err);
    CHECK_OR(rc, rc == K3_OK, "encode: %s", err.msg);
    return rc;
}

/* ---- loading ------------------------------------------------------------------------- */

static void test_load_vocab_and_specials(void) {
    cJSON *cases = load_json(CASES_JSON);
    k3_tokenizer *kimi = load_tok(KIMI_DIR), *nano = load_tok(NANO_DIR);
    if (k3_test_stopped()) return;
    CHECK(k3_tokenizer_n_ranks(kimi) == 163584 && k3_tokenizer_vocab_size(kimi) == 163840);
    CHECK(k3_tokenizer_n_ranks(nano) == 1792 && k3_tokenizer_vocab_size(nano) == 2048);
    const cJSON *named = cJSON_GetObjectItem(cases, "named_specials_kimi_shaped");
    int n_named = 0;
    for (const cJSON *e = named->child; e; e = e->next, n_named++) {
        const char *text = cJSON_GetObjectItem(e, "text")->valuestring;
        int id = atoi(e->string);
        CHECK(k3_tokenizer_special_id(kimi, text) == id, "%s", text);
        CHECK(k3_tokenizer_special_id(nano, text) == id - 163584 + 1792, "%s", text);
    }
    CHECK(n_named == 16);
    CHECK(k3_tokenizer_special_id(kimi, "<|reserved_token_163592|>") == 163592);
    CHECK(k3_tokenizer_special_id(nano, "<|reserved_token_1800|>") == 1800);
    CHECK(k3_tokenizer_special_id(kimi, "<|endoftext|>") == -1);
    size_t len;
    const char *b = k3_tokenizer_token_bytes(kimi, 163839, &len);
    CHECK(b && len == 5 && memcmp(b, "[PAD]", 5) == 0);
    CHECK(k3_tokenizer_token_bytes(kimi, 163840, &len) == NULL);
    CHECK(k3_tokenizer_token_bytes(kimi, -1, &len) == NULL);
    k3_tokenizer_free(kimi);
    k3_tokenizer_free(nano);
    cJSON_Delete(cases);
}

/* ---- the regex translation ----------------------------------------------------------- */

static void test_pat_str_is_the_fixtures(void) {
    cJSON *cases = load_json(CASES_JSON);
    if (k3_test_stopped()) return;
    const char *pat = cJSON_GetObjectItem(cases, "pat_str")->valuestring;
    CHECK(strcmp(pat, k3_kimi_pat_str) == 0, "cases.json pat_str differs from pretok.c");
    cJSON_Delete(cases);
}

static pcre2_code *compile_whole(const char *cls) {
    char pat[512];
    snprintf(pat, sizeof pat, "\\A(?:%s)\\z", cls);
    pcre2_code *re = NULL;
    k3_err err = {0};
    CHECK_OR(NULL, k3_pretok_compile(pat, &re, &err) == K3_OK, "%s", err.msg);
    return re;
}

static int matches(const pcre2_code *re, pcre2_match_data *md, const char *s, size_t n) {
    return pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL) >= 0;
}

/* Every code point: the De Morgan classes equal the lookahead-guarded intersections, the
 * White_Space class equals PCRE2's \s minus U+180E, and Python isspace adds U+1C..1F. */
static void test_regex_classes_on_every_code_point(void) {
    const char *cls[6] = {
        K3_PAT_UPPERISH, "(?!\\p{sc:Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]",
        K3_PAT_LOWERISH, "(?!\\p{sc:Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]",
        "[" K3_PAT_WS "]", "\\s"};
    pcre2_code *re[6];
    for (int k = 0; k < 6; k++) re[k] = compile_whole(cls[k]);
    if (k3_test_stopped()) return;
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    int n_cp = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char s[4];
        size_t n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        unsigned char lead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
        for (size_t i = n - 1; i > 0; i--) s[i] = (char)(0x80 | ((cp >> (6 * (n - 1 - i))) & 0x3F));
        s[0] = (char)(lead[n] | (cp >> (6 * (n - 1))));
        n_cp++;
        CHECK(matches(re[0], md, s, n) == matches(re[1], md, s, n), "upper U+%04X", cp);
        CHECK(matches(re[2], md, s, n) == matches(re[3], md, s, n), "lower U+%04X", cp);
        int ws = matches(re[4], md, s, n);
        CHECK(ws == (matches(re[5], md, s, n) && cp != 0x180E), "space U+%04X", cp);
        CHECK(k3_py_isspace(cp) == (ws || (cp >= 0x1C && cp <= 0x1F)), "isspace U+%04X", cp);
    }
    CHECK(n_cp == 1112064);
    pcre2_match_data_free(md);
    for (int k = 0; k < 6; k++) pcre2_code_free(re[k]);
}

/* ---- fixture encode / decode cases --------------------------------------------------- */

/* Every encode case in both modes, plus decode(encode(text)) == text. */
static void check_encode_cases(const char *name) {
    cJSON *cases = load_json(CASES_JSON);
    k3_tokenizer *t = load_tok(tok_dir(name));
    if (k3_test_stopped()) return;
    static const char *mode[2] = {"ids_special_as_text", "ids_special_allowed"};
    int n_checked = 0;
    char why[256];
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(cases, "encode")) {
        const char *id = cJSON_GetObjectItem(c, "id")->valuestring;
        size_t len, n, out_len;
        char *text = from_hex(cJSON_GetObjectItem(c, "utf8_hex")->valuestring, &len), *back;
        for (int m = 0; m < 2; m++) {
            int32_t *ids;
            if (encode(t, text, len, m == 1, &ids, &n) != K3_OK) return;
            const cJSON *want = cJSON_GetObjectItem(cJSON_GetObjectItem(c, name), mode[m]);
            CHECK(same_ids(ids, n, want, why, sizeof why), "%s %s %s: %s", name, id, mode[m],
                  why);
            k3_err err = {0};
            CHECK(k3_tokenizer_decode(t, ids, n, &back, &out_len, &err) == K3_OK, "%s", err.msg);
            CHECK(out_len == len && memcmp(back, text, len) == 0, "%s %s round trip", name, id);
            free(back);
            free(ids);
            n_checked++;
        }
        free(text);
    }
    CHECK(n_checked == 2 * 154, "%d", n_checked);
    k3_tokenizer_free(t);
    cJSON_Delete(cases);
}

static void test_encode_cases_kimi_shaped(void) { check_encode_cases("kimi-shaped"); }
static void test_encode_cases_k3_nano(void) { check_encode_cases("k3-nano"); }

/* Decodes ids one at a time through the streaming decoder; malloc'd, NUL-terminated. */
static char *stream_decode(const k3_tokenizer *t, const int32_t *ids, size_t n, size_t *len) {
    size_t cap = 3 * (k3_tokenizer_max_token_len(t) + 3) + 1, o = 0;
    char *out = malloc(n * cap + 8), *buf = malloc(cap);
    k3_detok_stream st = {0};
    for (size_t i = 0; i < n; i++) {
        int w = k3_detok_stream_push(t, &st, ids[i], buf, cap);
        CHECK_OR(NULL, w >= 0 && strlen(buf) == (size_t)w, "push %d", ids[i]);
        memcpy(out + o, buf, (size_t)w);
        o += (size_t)w;
    }
    int w = k3_detok_stream_flush(&st, out + o, 8);
    CHECK_OR(NULL, w >= 0 && st.n_pending == 0, "flush");
    *len = o + (size_t)w;
    free(buf);
    return out;
}

/* Every decode case: one-shot and streaming both give the expected text's bytes. */
static void check_decode_cases(const char *name) {
    cJSON *cases = load_json(CASES_JSON);
    k3_tokenizer *t = load_tok(tok_dir(name));
    if (k3_test_stopped()) return;
    int n_checked = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(cJSON_GetObjectItem(cases, "decode"), name)) {
        const char *id = cJSON_GetObjectItem(c, "id")->valuestring;
        const char *want = cJSON_GetObjectItem(c, "text")->valuestring;
        const cJSON *arr = cJSON_GetObjectItem(c, "ids");
        size_t n = (size_t)cJSON_GetArraySize(arr), i = 0, len, slen;
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        for (const cJSON *e = arr->child; e; e = e->next) ids[i++] = (int32_t)e->valuedouble;
        char *text;
        k3_err err = {0};
        CHECK(k3_tokenizer_decode(t, ids, n, &text, &len, &err) == K3_OK, "%s", err.msg);
        CHECK(len == strlen(want) && memcmp(text, want, len) == 0, "%s %s", name, id);
        char *streamed = stream_decode(t, ids, n, &slen);
        if (!streamed) return;
        CHECK(slen == len && memcmp(streamed, text, len) == 0, "%s %s streaming", name, id);
        free(streamed);
        free(text);
        free(ids);
        n_checked++;
    }
    CHECK(n_checked == 11, "%d", n_checked);
    k3_tokenizer_free(t);
    cJSON_Delete(cases);
}

static void test_decode_cases_kimi_shaped(void) { check_decode_cases("kimi-shaped"); }
static void test_decode_cases_k3_nano(void) { check_decode_cases("k3-nano"); }

/* ---- chat.json: each segment on its own ---------------------------------------------- */

/* Encodes every segment with its allow_special flag; ids appended to *all. */
static int encode_segments(const k3_tokenizer *t, const cJSON *segs, k3_ids *all) {
    const cJSON *s;
    cJSON_ArrayForEach(s, segs) {
        const char *text = cJSON_GetArrayItem(s, 0)->valuestring;
        int32_t *ids;
        size_t n;
        if (encode(t, text, strlen(text), cJSON_IsTrue(cJSON_GetArrayItem(s, 1)), &ids, &n))
            return -1;
        for (size_t i = 0; i < n; i++) k3_ids_push(all, ids[i]);
        free(ids);
    }
    return 0;
}

/* Where whole-text encoding differs, it must give the "wrong engine" ids, not the right. */
static void check_whole_text(const k3_tokenizer *t, const cJSON *c, const k3_ids *right) {
    const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
    const char *id = cJSON_GetObjectItem(c, "id")->valuestring;
    int32_t *ids;
    size_t n;
    char why[256];
    if (encode(t, text, strlen(text), true, &ids, &n) != K3_OK) return;
    const cJSON *wrong = cJSON_GetObjectItem(c, "ids_kimi-shaped_if_whole_text_encoded");
    CHECK(same_ids(ids, n, wrong, why, sizeof why), "%s whole text: %s", id, why);
    CHECK(n != right->n || memcmp(ids, right->v, n * sizeof *ids) != 0, "%s", id);
    free(ids);
}

static void check_chat(const char *name) {
    cJSON *chat = load_json(CHAT_JSON);
    k3_tokenizer *t = load_tok(tok_dir(name));
    if (k3_test_stopped()) return;
    char key[64], why[256];
    snprintf(key, sizeof key, "ids_%s", name);
    int n_cases = 0, n_whole = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(chat, "cases")) {
        const char *id = cJSON_GetObjectItem(c, "id")->valuestring;
        k3_ids all = {0};
        if (encode_segments(t, cJSON_GetObjectItem(c, "segments"), &all) != 0) return;
        CHECK(same_ids(all.v, all.n, cJSON_GetObjectItem(c, key), why, sizeof why), "%s %s: %s",
              name, id, why);
        if (strcmp(name, "kimi-shaped") == 0 &&
            cJSON_IsTrue(cJSON_GetObjectItem(c, "whole_text_encoding_differs"))) {
            check_whole_text(t, c, &all);
            n_whole++;
        }
        free(all.v);
        n_cases++;
    }
    CHECK(n_cases == 24 && n_whole == (strcmp(name, "kimi-shaped") == 0 ? 3 : 0));
    k3_tokenizer_free(t);
    cJSON_Delete(chat);
}

static void test_chat_kimi_shaped(void) { check_chat("kimi-shaped"); }
static void test_chat_k3_nano(void) { check_chat("k3-nano"); }

/* ---- slicing rule (spec §11.3) ------------------------------------------------------- */

/* Repeats unit (ulen bytes) n times, malloc'd. */
static char *repeat(const char *unit, size_t ulen, size_t n) {
    char *s = malloc(ulen * n + 1);
    for (size_t i = 0; i < n; i++) memcpy(s + i * ulen, unit, ulen);
    s[ulen * n] = 0;
    return s;
}

/* 1 if encode(s) equals encode(s[0..cut)) ++ encode(s[cut..len)), 0 if not, -1 on error. */
static int same_as_cut(const k3_tokenizer *t, const char *s, size_t len, size_t cut) {
    int32_t *all, *a, *b;
    size_t n, na, nb;
    if (encode(t, s, len, false, &all, &n) || encode(t, s, cut, false, &a, &na) ||
        encode(t, s + cut, len - cut, false, &b, &nb))
        return -1;
    int same = n == na + nb && memcmp(all, a, na * 4) == 0 && memcmp(all + na, b, nb * 4) == 0;
    free(all), free(a), free(b);
    return same;
}

static void test_long_runs_round_trip(void) {
    k3_tokenizer *t = load_tok(KIMI_DIR);
    if (k3_test_stopped()) return;
    const char *units[2] = {" ", "a"};
    for (int k = 0; k < 2; k++) {
        char *s = repeat(units[k], 1, 60000), *back;
        int32_t *ids;
        size_t n, len;
        k3_err err = {0};
        if (encode(t, s, 60000, false, &ids, &n)) return;
        CHECK(k3_tokenizer_decode(t, ids, n, &back, &len, &err) == K3_OK, "%s", err.msg);
        CHECK(len == 60000 && memcmp(back, s, len) == 0, "60,000 x '%s'", units[k]);
        free(s), free(back), free(ids);
    }
    k3_tokenizer_free(t);
}

/* 25,001 random lowercase letters with some é: one regex piece, cut after 25,000 characters
 * (not bytes). Without the cut (plain BPE of the piece), or cut at byte 25,000, ids differ. */
static void test_run_cut_counts_characters(void) {
    k3_tokenizer *t = load_tok(KIMI_DIR);
    if (k3_test_stopped()) return;
    char *s = malloc(2 * 25001);
    size_t len = 0, cut = 0;
    uint64_t rng = 99;
    for (int i = 0; i < 25001; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        unsigned r = (unsigned)(rng >> 33) % 27;
        if (i == 25000) cut = len;
        if (r == 26) s[len++] = (char)0xC3, s[len++] = (char)0xA9;
        else s[len++] = (char)('a' + r);
    }
    size_t byte_cut = 25000 + ((unsigned char)s[25000] == 0xA9); /* a character boundary */
    CHECK(cut > byte_cut);
    CHECK(same_as_cut(t, s, len, cut) == 1, "cut at 25,000 characters");
    CHECK(same_as_cut(t, s, len, byte_cut) == 0, "cut at 25,000 bytes would give the same");
    int32_t *ids;
    size_t n;
    k3_ids uncut = {0};
    k3_bpe_work w = {0};
    if (encode(t, s, len, false, &ids, &n)) return;
    CHECK(k3_bpe_piece(&t->ranks, t->max_rank_len, (unsigned char *)s, len, &w, &uncut) == 0);
    CHECK(uncut.n != n || memcmp(uncut.v, ids, n * 4) != 0, "the cut changes nothing here");
    free(uncut.v), free(ids), free(s);
    k3_bpe_work_free(&w);
    k3_tokenizer_free(t);
}

/* U+001C then 25,000 spaces: one run for Python's isspace (U+001C is a space there, though
 * not for the regex), so the last space is cut off; treating U+001C as non-space would
 * not cut. Slices: 400,002 characters are cut after 400,000. */
static void test_run_cut_uses_isspace_and_slices(void) {
    k3_tokenizer *t = load_tok(KIMI_DIR);
    if (k3_test_stopped()) return;
    char *s = repeat(" ", 1, 25001);
    s[0] = 0x1C;
    CHECK(same_as_cut(t, s, 25001, 25000) == 1, "isspace run cut");
    CHECK(same_as_cut(t, s, 25001, 1) == 0, "not cut: same ids");
    char *ab = repeat("ab ", 3, 133334); /* no long run */
    CHECK(same_as_cut(t, ab, 400002, 400000) == 1, "400,000-character slice");
    CHECK(same_as_cut(t, ab, 400002, 399998) == 0, "unsliced: same ids"); /* piece boundary */
    free(s), free(ab);
    k3_tokenizer_free(t);
}

/* ---- BPE ----------------------------------------------------------------------------- */

/* tiktoken's byte_pair_merge, quadratic, as the reference. */
static size_t naive_bpe(const k3_tokenizer *t, const unsigned char *p, size_t n, int32_t *out) {
    size_t *b = malloc((n + 1) * sizeof *b), m = n + 1, k = 0;
    for (size_t i = 0; i <= n; i++) b[i] = i;
    for (;;) {
        int32_t best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 2 < m; i++) {
            int32_t r = k3_bmap_get(&t->ranks, p + b[i], b[i + 2] - b[i]);
            if (r >= 0 && (best < 0 || r < best)) best = r, at = i;
        }
        if (best < 0) break;
        memmove(&b[at + 1], &b[at + 2], (m - at - 2) * sizeof *b);
        m--;
    }
    for (size_t i = 0; i + 1 < m; i++) out[k++] = k3_bmap_get(&t->ranks, p + b[i], b[i + 1] - b[i]);
    free(b);
    return k;
}

/* The heap BPE equals the naive loop on random pieces full of equal-rank ties. */
static void test_bpe_matches_naive_merge_loop(void) {
    k3_tokenizer *t = load_tok(KIMI_DIR);
    if (k3_test_stopped()) return;
    const char alphabet[] = "aaaabbbccdeet hs\xc3\xa9\xe4\xb8\x80";
    uint64_t rng = 12345;
    k3_bpe_work w = {0};
    unsigned char p[300];
    int32_t ref[300];
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = 1 + iter % 300;
        for (size_t i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            p[i] = (unsigned char)alphabet[(rng >> 33) % (sizeof alphabet - 1)];
        }
        k3_ids got = {0};
        CHECK(k3_bpe_piece(&t->ranks, t->max_rank_len, p, n, &w, &got) == 0);
        int32_t whole = k3_bmap_get(&t->ranks, p, n);
        size_t nr = whole >= 0 ? (ref[0] = whole, 1) : naive_bpe(t, p, n, ref);
        CHECK(got.n == nr && memcmp(got.v, ref, nr * 4) == 0, "iteration %d (n=%zu)", iter, n);
        free(got.v);
    }
    k3_bpe_work_free(&w);
    k3_tokenizer_free(t);
}

/* A 25,000-character piece (one regex match) encodes quickly: the BPE is not quadratic. The
 * thread's CPU time, not the wall clock: other processes loading the machine do not count. */
static void test_long_piece_is_fast(void) {
    k3_tokenizer *t = load_tok(KIMI_DIR);
    if (k3_test_stopped()) return;
    char *s = malloc(25001);
    uint64_t rng = 7;
    for (int i = 0; i < 25000; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        s[i] = (char)('a' + (rng >> 33) % 26);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    int32_t *ids;
    size_t n;
    if (encode(t, s, 25000, false, &ids, &n)) return;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    double s_ = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    CHECK(n > 1000 && s_ < 2.0, "%zu ids in %.3f s", n, s_);
    free(ids), free(s);
    k3_tokenizer_free(t);
}

/* ---- errors -------------------------------------------------------------------------- */

static void test_invalid_utf8_is_refused(void) {
    k3_tokenizer *t = load_tok(NANO_DIR);
    if (k3_test_stopped()) return;
    const char *bad[] = {"\xff", "ab\x80", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                         "\xe2\x82", "ok\xf0\x9f\x98"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = NULL;
        size_t n;
        k3_err err = {0};
        int rc = k3_tokenizer_encode(t, bad[i], strlen(bad[i]), false, &ids, &n, &err);
        CHECK(rc == K3_ERR_TOKENIZER && strstr(err.msg, "UTF-8"), "case %zu: %d %s", i, rc,
              err.msg);
    }
    int32_t *ids, big = 2048;
    size_t n, len;
    char *text, buf[64];
    k3_err err = {0};
    CHECK(encode(t, "", 0, true, &ids, &n) == K3_OK && n == 0);
    free(ids);
    CHECK(k3_tokenizer_decode(t, &big, 1, &text, &len, &err) == K3_ERR_INPUT, "%s", err.msg);
    k3_detok_stream st = {0};
    CHECK(k3_detok_stream_push(t, &st, 2048, buf, sizeof buf) == -1);
    CHECK(k3_detok_stream_push(t, &st, 1792, buf, 4) == -1 && st.n_pending == 0); /* [BOS] */
    CHECK(k3_detok_stream_push(t, &st, 172, buf, sizeof buf) == 0 && st.n_pending == 1);
    CHECK(k3_detok_stream_flush(&st, buf, 3) == -1 && k3_detok_stream_flush(&st, buf, 4) == 3);
    CHECK(memcmp(buf, "\xef\xbf\xbd", 4) == 0);
    k3_tokenizer_free(t);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    FILE *f = fopen(k3_path_join(path, sizeof path, dir, name), "wb");
    fputs(text, f);
    fclose(f);
}

/* A 256-line tiktoken.model of the single bytes, with line `bad_line` (1-based) replaced. */
static void write_model(const char *dir, int bad_line, const char *replacement) {
    static const char b64[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *text = malloc(256 * 16 + 64), *o = text;
    for (int b = 0; b < 256; b++) {
        if (b + 1 == bad_line) o += sprintf(o, "%s\n", replacement);
        else o += sprintf(o, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);
    }
    write_text(dir, "tiktoken.model", text);
    free(text);
}

static void expect_load_error(const char *dir, int code, const char *a, const char *b) {
    k3_tokenizer *t = NULL;
    k3_err err = {0};
    int rc = k3_tokenizer_load(dir, &t, &err);
    CHECK(rc == code && t == NULL, "rc %d (want %d): %s", rc, code, err.msg);
    CHECK(strstr(err.msg, a) && strstr(err.msg, b), "message: %s", err.msg);
}

static void test_bad_tokenizer_files(void) {
    char dir[] = "/tmp/k3_tok_test_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    expect_load_error(dir, K3_ERR_IO, "tiktoken.model", "cannot open");
    write_text(dir, "tokenizer_config.json", "{\"added_tokens_decoder\": {\n"
               "\"256\": {\"content\": \"[BOS]\"}, \"257\": {\"content\": \"[BOS]x\"}}}");
    write_model(dir, 0, NULL);
    k3_tokenizer *t = load_tok(dir);
    if (k3_test_stopped()) return;
    CHECK(k3_tokenizer_vocab_size(t) == 512 && k3_tokenizer_special_id(t, "[BOS]") == 256);
    CHECK(k3_tokenizer_special_id(t, "<|reserved_token_511|>") == 511);
    int32_t *ids;
    size_t n;
    if (encode(t, "a[BOS]x[BOS]", 12, true, &ids, &n)) return; /* longest spelling wins */
    CHECK(n == 3 && ids[0] == 'a' && ids[1] == 257 && ids[2] == 256, "%zu ids", n);
    free(ids);
    k3_tokenizer_free(t);
    write_model(dir, 3, "Ag== 2 extra");
    expect_load_error(dir, K3_ERR_TOKENIZER, "tiktoken.model:3:", "malformed");
    write_model(dir, 7, "B*== 6");
    expect_load_error(dir, K3_ERR_TOKENIZER, "tiktoken.model:7:", "malformed");
    write_model(dir, 5, "BA== 9");
    expect_load_error(dir, K3_ERR_TOKENIZER, "tiktoken.model:5:", "contiguous");
    write_model(dir, 256, "AA== 255"); /* byte 0 twice, byte 0xff missing */
    expect_load_error(dir, K3_ERR_TOKENIZER, "tiktoken.model", "rank 255 repeats");
    write_model(dir, 0, NULL);
    write_text(dir, "tokenizer_config.json", "{\"added_tokens_decoder\": {\n\n\"256\": {,}}}");
    expect_load_error(dir, K3_ERR_CONFIG, "tokenizer_config.json:3:", "malformed JSON");
    write_text(dir, "tokenizer_config.json", "{\"added_tokens_decoder\": {\"12\": {}}}");
    expect_load_error(dir, K3_ERR_CONFIG, "tokenizer_config.json", "\"12\"");
    char path[512];
    unlink(k3_path_join(path, sizeof path, dir, "tiktoken.model"));
    unlink(k3_path_join(path, sizeof path, dir, "tokenizer_config.json"));
    rmdir(dir);
}

/* ---- the k3 tokenize / detokenize commands ------------------------------------------- */

/* Runs `$K3_BIN args`, keeps the start of stdout in out; returns the exit status. */
static int run_k3(const char *args, char *out, size_t cap) {
    char cmd[1024], rest[4096];
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", getenv("K3_BIN"), args);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, cap - 1, p) : 0;
    while (p && fread(rest, 1, sizeof rest, p) > 0) continue; /* drain: no SIGPIPE */
    out[n] = 0;
    int st = p ? pclose(p) : -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli_tokenize_detokenize(void) {
    if (!getenv("K3_BIN")) {
        k3_test_skip("K3_BIN is not set (make test sets it)");
        return;
    }
    char out[4096];
    CHECK(run_k3("tokenize " NANO_DIR " 'Hello, world!'", out, sizeof out) == 0);
    CHECK(strcmp(out, "39,596,78,11,286,1733,0\n") == 0, "got '%s'", out);
    CHECK(run_k3("tokenize 'Hello, world!'", out, sizeof out) == 0); /* default DIR */
    CHECK(strcmp(out, "39,596,78,11,286,1733,0\n") == 0, "got '%s'", out);
    CHECK(run_k3("tokenize " NANO_DIR " --special '<|open|>x'", out, sizeof out) == 0);
    CHECK(strncmp(out, "1795,", 5) == 0, "got '%s'", out);
    CHECK(run_k3("tokenize " NANO_DIR " '<|open|>'", out, sizeof out) == 0);
    CHECK(strncmp(out, "1795", 4) != 0, "got '%s'", out);
    CHECK(run_k3("tokenize " KIMI_DIR " --file " CASES_JSON, out, sizeof out) == 0);
    CHECK(run_k3("detokenize " NANO_DIR " 39,596,78,11,286,1733,0", out, sizeof out) == 0);
    CHECK(strcmp(out, "Hello, world!\n") == 0, "got '%s'", out);
    CHECK(run_k3("detokenize " NANO_DIR " 1,x", out, sizeof out) == K3_ERR_USAGE);
    CHECK(run_k3("detokenize " NANO_DIR " 2048", out, sizeof out) == K3_ERR_INPUT);
    CHECK(run_k3("tokenize", out, sizeof out) == K3_ERR_USAGE);
    CHECK(run_k3("tokenize --bogus x", out, sizeof out) == K3_ERR_USAGE);
    CHECK(run_k3("tokenize --help", out, sizeof out) == 0 && strstr(out, "usage"));
    CHECK(run_k3("tokenize /nonexistent --file /nonexistent", out, sizeof out) != 0);
}

const k3_test k3_suite_tokenizer[] = {
    {"load_vocab_and_specials", test_load_vocab_and_specials},
    {"pat_str_is_the_fixtures", test_pat_str_is_the_fixtures},
    {"regex_classes_on_every_code_point", test_regex_classes_on_every_code_point},
    {"encode_cases_kimi_shaped", test_encode_cases_kimi_shaped},
    {"encode_cases_k3_nano", test_encode_cases_k3_nano},
    {"decode_cases_kimi_shaped", test_decode_cases_kimi_shaped},
    {"decode_cases_k3_nano", test_decode_cases_k3_nano},
    {"chat_kimi_shaped", test_chat_kimi_shaped},
    {"chat_k3_nano", test_chat_k3_nano},
    {"long_runs_round_trip", test_long_runs_round_trip},
    {"run_cut_counts_characters", test_run_cut_counts_characters},
    {"run_cut_uses_isspace_and_slices", test_run_cut_uses_isspace_and_slices},
    {"bpe_matches_naive_merge_loop", test_bpe_matches_naive_merge_loop},
    {"long_piece_is_fast", test_long_piece_is_fast},
    {"invalid_utf8_is_refused", test_invalid_utf8_is_refused},
    {"bad_tokenizer_files", test_bad_tokenizer_files},
    {"cli_tokenize_detokenize", test_cli_tokenize_detokenize},
    {0},
};
