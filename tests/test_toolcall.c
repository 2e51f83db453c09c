/* test_toolcall.c — the tools-block parser (src/chat/toolcall.c) as the renderer's exact
 * inverse: assistant messages with tool calls (chat.json's plus generated ones) are rendered
 * to ids by src/chat/render.c, the ids after the generation prompt are parsed back through
 * the reply parser and the tool-call parser, and the calls must equal the originals; every
 * split of the id sequence into pieces must give the same result. Malformed and cut-off
 * blocks come back as text with a reason. */
#include "test.h"
#include "../src/chat/conv.h"
#include "../src/chat/parse.h"
#include "../src/chat/render.h"
#include "../src/chat/toolcall.h"
#include "../src/util/fileio.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define CHAT_JSON "tests/fixtures/tokenizer/chat.json"
#define KIMI_DIR "tests/fixtures/tokenizer/kimi-shaped"

/* ---- helpers ------------------------------------------------------------------------------ */

static k3_tokenizer *load_tok(void) {
    k3_tokenizer *t = NULL;
    k3_err err = {0};
    CHECK_OR(NULL, k3_tokenizer_load(KIMI_DIR, &t, &err) == K3_OK, "%s", err.msg);
    return t;
}

/* Ids of body rendered whole (add_generation_prompt as given). */
static int encode_body(const k3_tokenizer *t, const cJSON *body, int32_t **ids, size_t *n) {
    k3_chat_request req;
    k3_segments segs = {0};
    k3_err err = {0};
    int rc = k3_chat_request_parse(body, &req, &err);
    if (!rc) rc = k3_chat_render(&req, 0, &segs, &err);
    if (!rc) rc = k3_segments_encode(t, &segs, ids, n, &err);
    k3_segments_free(&segs);
    CHECK_OR(rc, rc == K3_OK, "render: %s", err.msg);
    return rc;
}

/* What the model would generate for messages[last] (an assistant message) of body: the ids
 * of the whole render minus those of the render of messages[0, last) + generation prompt. */
static int reply_ids(const k3_tokenizer *t, const cJSON *body, int32_t **ids, size_t *n) {
    cJSON *whole = cJSON_Duplicate(body, 1), *prefix = cJSON_Duplicate(body, 1);
    cJSON_AddFalseToObject(whole, "add_generation_prompt");
    cJSON *msgs = cJSON_GetObjectItem(prefix, "messages");
    cJSON_DeleteItemFromArray(msgs, cJSON_GetArraySize(msgs) - 1);
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    int rc = encode_body(t, whole, &a, &na);
    if (!rc) rc = encode_body(t, prefix, &b, &nb);
    cJSON_Delete(whole);
    cJSON_Delete(prefix);
    if (!rc && !(nb < na && !memcmp(a, b, nb * sizeof *a))) {
        k3_test_fail(__FILE__, __LINE__, "the prompt is not a prefix of the whole render");
        rc = -1;
    }
    if (!rc) {
        *n = na - nb;
        *ids = malloc(*n * sizeof **ids);
        memcpy(*ids, a + nb, *n * sizeof **ids);
    }
    free(a);
    free(b);
    return rc;
}

/* A reply parsed back: the channels' text and the tool-call parser. */
typedef struct reply {
    k3_strbuf ch[3];
    k3_toolcall_parser tc;
    bool entered; /* the reply reached the tools block */
} reply;

static void reply_free(reply *r) {
    for (int i = 0; i < 3; i++) k3_strbuf_free(&r->ch[i]);
    k3_toolcall_parser_free(&r->tc);
}

/* Feeds ids in pieces ending at cuts[0..n_cuts) (ascending, last = n), as the server does:
 * each id to the reply parser, the tools block's ids of one piece to the tool-call parser at
 * once. finish: the reply is cut after the last id (else it must end with a stop id). */
static void parse_pieces(const k3_tokenizer *t, bool thinking, const int32_t *ids,
                         const size_t *cuts, size_t n_cuts, reply *out) {
    k3_stops stops;
    k3_stops_init(&stops, t, 163586);
    k3_reply_parser rp;
    k3_reply_parser_init(&rp, t, &stops, thinking);
    k3_toolcall_parser_init(&out->tc, t);
    char *buf = malloc(k3_reply_parser_out_cap(t));
    int32_t *block = NULL;
    size_t from = 0;
    for (size_t c = 0; c < n_cuts; c++) {
        size_t nb = 0;
        block = realloc(block, (cuts[c] - from + 1) * sizeof *block);
        for (size_t i = from; i < cuts[c]; i++) {
            enum k3_channel ch;
            enum k3_reply_pos before = rp.pos;
            if (rp.ended) break;
            int len = k3_reply_parser_push(&rp, ids[i], buf, k3_reply_parser_out_cap(t), &ch);
            if (len > 0) k3_strbuf_put(&out->ch[ch], buf, (size_t)len);
            if (k3_toolcall_in_block(&rp, before, ids[i])) block[nb++] = ids[i];
            if (rp.pos == K3_IN_TOOLS) out->entered = true;
        }
        k3_toolcall_push(&out->tc, block, nb);
        from = cuts[c];
    }
    if (!rp.ended) {
        enum k3_channel ch;
        int len = k3_reply_parser_finish(&rp, buf, k3_reply_parser_out_cap(t), &ch);
        if (len > 0) k3_strbuf_put(&out->ch[ch], buf, (size_t)len);
    }
    if (out->entered) k3_toolcall_finish(&out->tc);
    free(block);
    free(buf);
    k3_reply_parser_free(&rp);
}

static void parse_whole(const k3_tokenizer *t, bool thinking, const int32_t *ids, size_t n,
                        reply *out) {
    parse_pieces(t, thinking, ids, &n, 1, out);
}

/* Everything a parse produced, as one string, to compare parses of different splits. */
static char *summary(const reply *r) {
    k3_strbuf b = {0};
    k3_strbuf_printf(&b, "status %d reason %s\nrest %s\n", r->tc.status, r->tc.reason,
                     r->tc.rest ? r->tc.rest : "(none)");
    for (int i = 0; i < 3; i++) k3_strbuf_printf(&b, "ch%d %s\n", i, r->ch[i].p ? r->ch[i].p : "");
    for (size_t i = 0; i < r->tc.n_calls; i++) {
        const k3_tool_call *c = &r->tc.calls[i];
        k3_strbuf_printf(&b, "call %s %s pieces", c->name, c->arguments.p);
        for (size_t k = 0; k < c->n_pieces; k++) k3_strbuf_printf(&b, " %zu", c->piece_ends[k]);
        k3_strbuf_puts(&b, "\n");
    }
    return b.p;
}

/* a and b are the same JSON value with object keys in the same order. */
static bool same_json(const cJSON *a, const cJSON *b) {
    if ((a->type & 0xFF) != (b->type & 0xFF)) return false;
    if (cJSON_IsNumber(a)) return a->valuedouble == b->valuedouble;
    if (cJSON_IsString(a)) return !strcmp(a->valuestring, b->valuestring);
    if (!cJSON_IsArray(a) && !cJSON_IsObject(a)) return true;
    const cJSON *x = a->child, *y = b->child;
    for (; x && y; x = x->next, y = y->next) {
        if (cJSON_IsObject(a) && strcmp(x->string, y->string)) return false;
        if (!same_json(x, y)) return false;
    }
    return !x && !y;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* Checks that reply ids of an assistant message give back its content, reasoning and tool
 * calls, for the whole sequence, every single cut, one id per piece and random splits. */
static void check_roundtrip(const k3_tokenizer *t, const char *id, const cJSON *body) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (reply_ids(t, body, &ids, &n)) return;
    const cJSON *msgs = cJSON_GetObjectItem(body, "messages");
    const cJSON *m = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const cJSON *think = cJSON_GetObjectItem(body, "thinking");
    bool thinking = !cJSON_IsFalse(think);
    reply r = {0};
    parse_whole(t, thinking, ids, n, &r);
    const cJSON *calls = cJSON_GetObjectItem(m, "tool_calls");
    CHECK(r.tc.status == K3_TOOLCALL_DONE, "%s: status %d (%s)", id, r.tc.status, r.tc.reason);
    CHECK(r.tc.n_calls == (size_t)cJSON_GetArraySize(calls), "%s: %zu calls", id, r.tc.n_calls);
    const char *content = cJSON_GetStringValue(cJSON_GetObjectItem(m, "content"));
    CHECK(!strcmp(r.ch[K3_CH_RESPONSE].p ? r.ch[K3_CH_RESPONSE].p : "", content ? content : ""),
          "%s: content \"%s\"", id, r.ch[K3_CH_RESPONSE].p);
    if (thinking) {
        const char *rc = cJSON_GetStringValue(cJSON_GetObjectItem(m, "reasoning_content"));
        size_t s, len;
        if (rc) k3_py_strip(rc, strlen(rc), &s, &len);
        const char *want = rc && len ? rc : "";
        CHECK(!strcmp(r.ch[K3_CH_THINK].p ? r.ch[K3_CH_THINK].p : "", want),
              "%s: reasoning \"%s\"", id, r.ch[K3_CH_THINK].p);
    }
    size_t k = 0;
    for (const cJSON *c = calls->child; c; c = c->next, k++) {
        const cJSON *f = cJSON_GetObjectItem(c, "function");
        const k3_tool_call *got = &r.tc.calls[k];
        CHECK(!strcmp(got->name, cJSON_GetObjectItem(f, "name")->valuestring), "%s call %zu: %s",
              id, k, got->name);
        const cJSON *args = cJSON_GetObjectItem(f, "arguments");
        cJSON *want = cJSON_IsObject(args) ? cJSON_Duplicate(args, 1)
                      : cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        if (cJSON_IsString(args) && !want) {
            /* not JSON: the json type="object" fallback gives the text back, blank → {} */
            size_t s, len;
            k3_py_strip(args->valuestring, strlen(args->valuestring), &s, &len);
            const char *w = len ? args->valuestring : "{}";
            CHECK(!strcmp(got->arguments.p, w), "%s call %zu: arguments %s, want %s", id, k,
                  got->arguments.p, w);
        } else {
            if (!want) want = cJSON_CreateObject();
            cJSON *back = cJSON_Parse(got->arguments.p);
            bool same = back && same_json(back, want);
            char *ws = cJSON_PrintUnformatted(want);
            cJSON_Delete(back);
            cJSON_Delete(want);
            CHECK(same, "%s call %zu: arguments %s, want %s", id, k, got->arguments.p, ws);
            free(ws);
        }
        CHECK(got->n_pieces >= 1 && got->piece_ends[got->n_pieces - 1] == got->arguments.n,
              "%s call %zu: pieces", id, k);
    }
    char *want = summary(&r);
    reply_free(&r);
    /* Splits: every single cut, one id per piece, random multi-piece splits. */
    size_t *cuts = malloc((n + 1) * sizeof *cuts);
    for (size_t mode = 0; mode < n + 1 + 20; mode++) {
        size_t nc = 0;
        if (mode < n) {
            if (mode) cuts[nc++] = mode;
        } else if (mode == n) {
            for (size_t i = 1; i < n; i++) cuts[nc++] = i;
        } else {
            for (size_t i = 1; i < n; i++)
                if (rnd(8) == 0) cuts[nc++] = i;
        }
        cuts[nc++] = n;
        reply s = {0};
        parse_pieces(t, thinking, ids, cuts, nc, &s);
        char *got = summary(&s);
        reply_free(&s);
        bool same = !strcmp(got, want);
        free(got);
        if (!same) {
            free(cuts);
            free(ids);
            free(want);
            CHECK(same, "%s: split mode %zu (of %zu ids) parses differently", id, mode, n);
        }
    }
    free(cuts);
    free(ids);
    free(want);
}

/* ---- chat.json cases ---------------------------------------------------------------------- */

static void test_chat_json_calls_roundtrip(void) {
    k3_tokenizer *t = load_tok();
    if (!t) return;
    char *buf;
    size_t len;
    k3_err err = {0};
    CHECK(k3_read_file(CHAT_JSON, (size_t)64 << 20, &buf, &len, &err) == K3_OK, "%s", err.msg);
    cJSON *root = cJSON_ParseWithLength(buf, len);
    free(buf);
    int n_cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const cJSON *msgs = cJSON_GetObjectItem(c, "messages");
        int i = 0;
        const cJSON *m;
        cJSON_ArrayForEach(m, msgs) {
            i++;
            if (!cJSON_GetObjectItem(m, "tool_calls")) continue;
            cJSON *body = cJSON_Duplicate(cJSON_GetObjectItem(c, "options"), 1);
            cJSON *part = cJSON_CreateArray();
            for (int k = 0; k < i; k++)
                cJSON_AddItemToArray(part, cJSON_Duplicate(cJSON_GetArrayItem(msgs, k), 1));
            cJSON_AddItemToObject(body, "messages", part);
            const cJSON *tools = cJSON_GetObjectItem(c, "tools");
            if (!cJSON_IsNull(tools)) cJSON_AddItemToObject(body, "tools", cJSON_Duplicate(tools, 1));
            check_roundtrip(t, cJSON_GetObjectItem(c, "id")->valuestring, body);
            cJSON_Delete(body);
            n_cases++;
            if (k3_test_stopped()) break;
        }
        if (k3_test_stopped()) break;
    }
    cJSON_Delete(root);
    k3_tokenizer_free(t);
    if (!k3_test_stopped()) CHECK(n_cases == 4, "%d chat.json messages with tool calls", n_cases);
}

/* ---- generated cases ---------------------------------------------------------------------- */

static const char *const STRINGS[] = {
    "", "plain", "K3 \"MXFP4\" & friends", "\xe6\x9d\xb1\xe4\xba\xac \xe2\x9c\x93 \xf0\x9f\x98\x80",
    "<|close|>argument<|sep|>", "<|open|>call tool=\"x\" index=\"1\"<|sep|>", "&quot;&amp;\"",
    "line\nbreak\ttab", "  spaced  ", "{\"looks\": \"json\"}", "\\back\\slash", "null", "5",
    "<|end_of_msg|>[EOS]", " ", "a very long string value that runs on and on over many tokens "
    "to make the id sequence longer than a few pieces 0123456789",
};
static const char *const KEYS[] = {"q", "_id", "path", "\xe5\x90\x8d\xe5\x89\x8d", "a\"b",
                                   "x&y", "key with space", "<|close|>", "type", "tool"};
static const double NUMBERS[] = {0, -1, 42, 0.5, 1e-07, 3.14159, 1e300, -2.5e-5, 123456789,
                                 9007199254740993.0};

static cJSON *gen_value(int depth) {
    switch (rnd(depth > 2 ? 4 : 6)) {
    case 0: return cJSON_CreateString(STRINGS[rnd(sizeof STRINGS / sizeof *STRINGS)]);
    case 1: return cJSON_CreateNumber(NUMBERS[rnd(sizeof NUMBERS / sizeof *NUMBERS)]);
    case 2: return cJSON_CreateBool(rnd(2));
    case 3: return cJSON_CreateNull();
    case 4: {
        cJSON *o = cJSON_CreateObject();
        int n = (int)rnd(4);
        for (int i = 0; i < n; i++) {
            const char *k = KEYS[rnd(sizeof KEYS / sizeof *KEYS)];
            if (!cJSON_GetObjectItemCaseSensitive(o, k))
                cJSON_AddItemToObject(o, k, gen_value(depth + 1));
        }
        return o;
    }
    default: {
        cJSON *a = cJSON_CreateArray();
        int n = (int)rnd(4);
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, gen_value(depth + 1));
        return a;
    }
    }
}

static cJSON *gen_call(int k) {
    static const char *const NAMES[] = {"get_weather", "search.docs", "db-get", "f",
                                        "run_\xe6\x9d\xb1", "a&b\"c"};
    cJSON *call = cJSON_CreateObject(), *f = cJSON_CreateObject();
    char id[24];
    snprintf(id, sizeof id, "call_%d", k);
    cJSON_AddStringToObject(call, "id", id);
    cJSON_AddStringToObject(call, "type", "function");
    cJSON_AddStringToObject(f, "name", NAMES[rnd(sizeof NAMES / sizeof *NAMES)]);
    uint32_t how = rnd(10);
    if (how == 0) {
        cJSON_AddStringToObject(f, "arguments", rnd(2) ? "{not json <|close|>json<|sep|>" : "");
    } else {
        cJSON *args = cJSON_CreateObject();
        int n = (int)rnd(5);
        for (int i = 0; i < n; i++) {
            const char *key = KEYS[rnd(sizeof KEYS / sizeof *KEYS)];
            if (!cJSON_GetObjectItemCaseSensitive(args, key))
                cJSON_AddItemToObject(args, key, gen_value(0));
        }
        if (how < 5) {
            cJSON_AddItemToObject(f, "arguments", args); /* an object, as chat-14 gives */
        } else {
            char *s = cJSON_PrintUnformatted(args);    /* a JSON string, as OpenAI gives */
            cJSON_AddStringToObject(f, "arguments", s);
            free(s);
            cJSON_Delete(args);
        }
    }
    cJSON_AddItemToObject(call, "function", f);
    return call;
}

static void test_generated_calls_roundtrip(void) {
    k3_tokenizer *t = load_tok();
    if (!t) return;
    for (int c = 0; c < 60 && !k3_test_stopped(); c++) {
        cJSON *body = cJSON_CreateObject(), *msgs = cJSON_CreateArray();
        bool thinking = rnd(2);
        cJSON_AddBoolToObject(body, "thinking", thinking);
        cJSON *user = cJSON_CreateObject(), *a = cJSON_CreateObject();
        cJSON_AddStringToObject(user, "role", "user");
        cJSON_AddStringToObject(user, "content", "go");
        cJSON_AddStringToObject(a, "role", "assistant");
        cJSON_AddStringToObject(a, "content", rnd(2) ? "" : STRINGS[rnd(4)]);
        if (thinking) cJSON_AddStringToObject(a, "reasoning_content", STRINGS[rnd(4)]);
        cJSON *calls = cJSON_CreateArray();
        int n = 1 + (int)rnd(c % 10 == 0 ? 6 : 3);
        for (int k = 0; k < n; k++) cJSON_AddItemToArray(calls, gen_call(k));
        cJSON_AddItemToObject(a, "tool_calls", calls);
        cJSON_AddItemToArray(msgs, user);
        cJSON_AddItemToArray(msgs, a);
        cJSON_AddItemToObject(body, "messages", msgs);
        char id[32];
        snprintf(id, sizeof id, "generated-%d", c);
        check_roundtrip(t, id, body);
        if (k3_test_stopped()) {
            char *s = cJSON_PrintUnformatted(body);
            fprintf(stderr, "  the case: %s\n", s);
            free(s);
        }
        cJSON_Delete(body);
    }
    k3_tokenizer_free(t);
}

/* ---- malformed and cut-off blocks --------------------------------------------------------- */

/* Parses a reply given as text with specials (thinking off) whole and one id per piece;
 * both must agree. Returns the whole parse in *r. */
static void parse_text(const k3_tokenizer *t, const char *text, reply *r) {
    int32_t *ids;
    size_t n;
    k3_err err = {0};
    CHECK(k3_tokenizer_encode(t, text, strlen(text), true, &ids, &n, &err) == K3_OK);
    parse_whole(t, false, ids, n, r);
    size_t *cuts = malloc(n * sizeof *cuts);
    for (size_t i = 0; i < n; i++) cuts[i] = i + 1;
    reply s = {0};
    parse_pieces(t, false, ids, cuts, n, &s);
    char *a = summary(r), *b = summary(&s);
    bool same = !strcmp(a, b);
    free(a);
    free(b);
    free(cuts);
    free(ids);
    reply_free(&s);
    CHECK(same, "split parse differs for %s", text);
}

#define HEAD "ok<|close|>response<|sep|><|open|>tools<|sep|>"
#define CALL1 "<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"n\" " \
              "type=\"number\"<|sep|>NaN<|close|>argument<|sep|><|close|>call<|sep|>"

static void test_malformed_blocks(void) {
    k3_tokenizer *t = load_tok();
    if (!t) return;
    struct {
        const char *text;
        enum k3_toolcall_status status;
        size_t n_calls;
        const char *rest, *reason;
    } cases[] = {
        /* well formed; a number that is not JSON becomes a string */
        {HEAD CALL1 "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>",
         K3_TOOLCALL_DONE, 1, NULL, ""},
        /* cut by the token limit inside the second call's value */
        {HEAD CALL1 "<|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>argument key=\"s\" "
         "type=\"string\"<|sep|>half a val", K3_TOOLCALL_CUT, 1,
         "<|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>argument key=\"s\" "
         "type=\"string\"<|sep|>half a val", "the reply ended inside the tools block"},
        /* the model stopped (end of message) inside the block */
        {HEAD "<|open|>call tool=\"g\" index=\"1\"<|sep|><|end_of_msg|>", K3_TOOLCALL_CUT, 0,
         "<|open|>call tool=\"g\" index=\"1\"<|sep|>", "the reply ended inside the tools block"},
        /* prose where a call belongs */
        {HEAD "I will call f.<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>",
         K3_TOOLCALL_MALFORMED, 0, "I will call f.<|close|>tools<|sep|>",
         "text where a marker belongs"},
        /* an <|open|> inside a value */
        {HEAD CALL1 "<|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>argument key=\"s\" "
         "type=\"string\"<|sep|>a<|open|>b<|close|>argument<|sep|><|close|>call<|sep|>"
         "<|close|>tools<|sep|><|end_of_msg|>", K3_TOOLCALL_MALFORMED, 1,
         "<|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>argument key=\"s\" type=\"string\""
         "<|sep|>a<|open|>b<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
         "special token <|open|> inside a value"},
        /* an unknown tag, a call without its tool attribute */
        {HEAD "<|open|>invoke name=\"f\"<|sep|><|close|>tools<|sep|><|end_of_msg|>",
         K3_TOOLCALL_MALFORMED, 0, "<|open|>invoke name=\"f\"<|sep|><|close|>tools<|sep|>",
         "unexpected marker <|open|>invoke between calls"},
        {HEAD "<|open|>call index=\"1\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
         "<|end_of_msg|>", K3_TOOLCALL_MALFORMED, 0,
         "<|open|>call index=\"1\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
         "unexpected marker <|open|>call between calls"},
        /* a json block after an argument */
        {HEAD "<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"a\" type=\"null\""
         "<|sep|>null<|close|>argument<|sep|><|open|>json type=\"object\"<|sep|>x<|close|>json"
         "<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|end_of_msg|>",
         K3_TOOLCALL_MALFORMED, 0, NULL, "unexpected marker <|open|>json inside a call"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases && !k3_test_stopped(); i++) {
        reply r = {0};
        parse_text(t, cases[i].text, &r);
        CHECK(r.entered, "case %zu", i);
        CHECK(r.tc.status == cases[i].status, "case %zu: status %d (%s)", i, r.tc.status,
              r.tc.reason);
        CHECK(r.tc.n_calls == cases[i].n_calls, "case %zu: %zu calls", i, r.tc.n_calls);
        CHECK(!strcmp(r.tc.reason, cases[i].reason), "case %zu: reason \"%s\"", i, r.tc.reason);
        if (cases[i].rest)
            CHECK(r.tc.rest && !strcmp(r.tc.rest, cases[i].rest), "case %zu: rest \"%s\"", i,
                  r.tc.rest);
        if (cases[i].status == K3_TOOLCALL_DONE) CHECK(!r.tc.rest, "case %zu", i);
        if (cases[i].n_calls)
            CHECK(!strcmp(r.tc.calls[0].arguments.p, "{\"n\": \"NaN\"}"), "case %zu: %s", i,
                  r.tc.calls[0].arguments.p);
        reply_free(&r);
    }
    /* A marker that never ends: refused after K3_TOOLCALL_MARKER_MAX bytes, no hang. */
    k3_strbuf big = {0};
    k3_strbuf_puts(&big, HEAD "<|open|>call tool=\"");
    for (int i = 0; i < 2000; i++) k3_strbuf_puts(&big, "abc ");
    reply r = {0};
    parse_text(t, big.p, &r);
    k3_strbuf_free(&big);
    CHECK(r.tc.status == K3_TOOLCALL_MALFORMED && strstr(r.tc.reason, "longer than"), "%s",
          r.tc.reason);
    reply_free(&r);
    k3_tokenizer_free(t);
}

/* The json type="object" fallback and an empty call, written by hand (renderer spelling). */
static void test_fallback_and_empty(void) {
    k3_tokenizer *t = load_tok();
    if (!t) return;
    reply r = {0};
    parse_text(t, HEAD "<|open|>call tool=\"a&amp;b&quot;\" index=\"1\"<|sep|><|open|>json "
               "type=\"object\"<|sep|>{not: json}<|close|>json<|sep|><|close|>call<|sep|>"
               "<|open|>call tool=\"g\" index=\"2\"<|sep|><|close|>call<|sep|>"
               "<|open|>call tool=\"h\" index=\"3\"<|sep|><|open|>argument key=\"k&quot;\" "
               "type=\"object\"<|sep|>{\"x\": [1, 2.50]}<|close|>argument<|sep|>"
               "<|open|>argument key=\"s\" type=\"string\"<|sep|>\"q\"\n<|close|>argument<|sep|>"
               "<|close|>call<|sep|>\n<|close|>tools<|sep|><|end_of_msg|>", &r);
    CHECK(r.tc.status == K3_TOOLCALL_DONE && r.tc.n_calls == 3, "%d %s", r.tc.status,
          r.tc.reason);
    CHECK(!strcmp(r.tc.calls[0].name, "a&b\""), "%s", r.tc.calls[0].name);
    CHECK(!strcmp(r.tc.calls[0].arguments.p, "{not: json}"), "%s", r.tc.calls[0].arguments.p);
    CHECK(!strcmp(r.tc.calls[1].arguments.p, "{}"), "%s", r.tc.calls[1].arguments.p);
    CHECK(!strcmp(r.tc.calls[2].arguments.p, "{\"k\\\"\": {\"x\": [1, 2.50]}, \"s\": \"\\\"q\\\"\\n\"}"),
          "%s", r.tc.calls[2].arguments.p);
    CHECK(r.tc.calls[2].n_pieces == 3 && r.tc.calls[2].piece_ends[0] == 24, "%zu %zu",
          r.tc.calls[2].n_pieces, r.tc.calls[2].piece_ends[0]);
    reply_free(&r);
    k3_tokenizer_free(t);
}

/* k3 chat's side: a conversation with tools declared turns a reply's tools block into the
 * assistant message's tool_calls, and after the tool result its next prompt is exactly the
 * whole conversation rendered from scratch. */
static void test_conversation_round_trip(void) {
    k3_tokenizer *t = load_tok();
    if (!t) return;
    k3_err err = {0};
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                               "\"parameters\":{\"type\":\"object\"}}}]");
    cJSON *body = cJSON_Parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"Tool.\",\"tool_calls\":"
        "[{\"id\":\"call_1_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]}]}");
    cJSON_AddItemToObject(body, "tools", cJSON_Duplicate(tools, 1));
    int32_t *reply = NULL;
    size_t n = 0;
    if (reply_ids(t, body, &reply, &n)) return;
    k3_conv c;
    CHECK(k3_conv_init(&c, t, &err) == K3_OK);
    CHECK(k3_conv_set_tools(&c, tools, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_conv_add(&c, "user", "Weather?", &err) == K3_OK);
    CHECK(k3_conv_prompt(&c, &err) == K3_OK, "%s", err.msg);
    k3_stops stops;
    k3_stops_init(&stops, t, 163586);
    k3_reply_parser p;
    k3_reply_parser_init(&p, t, &stops, true);
    char *buf = malloc(k3_reply_parser_out_cap(t));
    enum k3_channel ch;
    for (size_t i = 0; i < n; i++) k3_reply_parser_push(&p, reply[i], buf, k3_reply_parser_out_cap(t), &ch);
    free(buf);
    CHECK(p.ended && reply[n - 1] == 163586);
    CHECK(k3_conv_commit(&c, reply, n - 1, &p, &err) == K3_OK, "%s", err.msg); /* without the stop */
    k3_reply_parser_free(&p);
    const cJSON *m = cJSON_GetArrayItem(c.messages, 1);
    const cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "tool_calls"), 0);
    const cJSON *f = cJSON_GetObjectItem(call, "function");
    CHECK(call && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(call, "id")), "call_1_1"));
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(f, "name")), "get_weather"));
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(f, "arguments")), "{\"city\": \"Paris\"}"),
          "%s", cJSON_GetStringValue(cJSON_GetObjectItem(f, "arguments")));
    CHECK(k3_conv_pending_tools(&c) == 1);
    CHECK(k3_conv_add(&c, "tool", "sunny", &err) == K3_OK);
    CHECK(k3_conv_pending_tools(&c) == 0);
    CHECK(k3_conv_prompt(&c, &err) == K3_OK, "%s", err.msg);
    /* the whole conversation, rendered from scratch */
    cJSON *tool = cJSON_CreateObject();
    cJSON_AddStringToObject(tool, "role", "tool");
    cJSON_AddStringToObject(tool, "content", "sunny");
    cJSON_AddItemToArray(cJSON_GetObjectItem(body, "messages"), tool);
    int32_t *whole = NULL;
    size_t nw = 0;
    if (encode_body(t, body, &whole, &nw)) return;
    CHECK(nw == c.prompt.n && !memcmp(whole, c.prompt.v, nw * sizeof *whole),
          "continued prompt %zu ids, whole render %zu", c.prompt.n, nw);
    free(whole);
    free(reply);
    cJSON_Delete(body);
    cJSON_Delete(tools);
    k3_conv_free(&c);
    k3_tokenizer_free(t);
}

const k3_test k3_suite_toolcall[] = {
    {"conversation_round_trip", test_conversation_round_trip},
    {"chat_json_calls_roundtrip", test_chat_json_calls_roundtrip},
    {"generated_calls_roundtrip", test_generated_calls_roundtrip},
    {"malformed_blocks", test_malformed_blocks},
    {"fallback_and_empty", test_fallback_and_empty},
    {0},
};
