/* test_server.c — the server's request validation, stop strings and JSON escaping, without
 * HTTP (tests/server/ drives the real server with the OpenAI client).
 *
 * Expected statuses and fields are the OpenAI API's rules as documented in request.c: a field
 * k3 honours is type- and range-checked; one it cannot honour is accepted only with its
 * neutral value; anything else is a 400 whose "param" names the field.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "../src/server/srv.h"
#include "test.h"

typedef struct vcase {
    enum k3_srv_kind kind;
    const char *json;
    const char *param; /* NULL = valid */
} vcase;

#define CHAT K3_SRV_CHAT
#define COMP K3_SRV_COMPLETIONS
#define M "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static const vcase cases[] = {
    {CHAT, "{" M "}", NULL},
    {CHAT, "{" M ",\"model\":\"x\",\"max_tokens\":5,\"temperature\":0,\"top_p\":0.5,\"seed\":-3,"
           "\"stop\":[\"a\",\"b\"],\"stream\":true,\"stream_options\":{\"include_usage\":true},"
           "\"n\":1,\"logprobs\":false,\"tools\":[],\"tool_choice\":\"auto\",\"user\":\"u\"}", NULL},
    {CHAT, "{" M ",\"max_tokens\":null,\"temperature\":null,\"stop\":null}", NULL},
    {CHAT, "{" M ",\"reasoning_effort\":\"low\"}", NULL},
    {CHAT, "{" M ",\"reasoning_effort\":\"medium\"}", NULL}, /* read as high */
    {CHAT, "{" M ",\"reasoning_effort\":\"minimal\"}", "reasoning_effort"},
    {CHAT, "{" M ",\"max_tokens\":0}", "max_tokens"},
    {CHAT, "{" M ",\"max_tokens\":\"5\"}", "max_tokens"},
    {CHAT, "{" M ",\"max_tokens\":1.5}", "max_tokens"},
    {CHAT, "{" M ",\"max_tokens\":5,\"max_completion_tokens\":6}", "max_completion_tokens"},
    {CHAT, "{" M ",\"max_tokens\":5,\"max_completion_tokens\":5}", NULL},
    {CHAT, "{" M ",\"temperature\":2.5}", "temperature"},
    {CHAT, "{" M ",\"top_p\":-0.1}", "top_p"},
    {CHAT, "{" M ",\"top_k\":-2}", "top_k"},
    {CHAT, "{" M ",\"stop\":\"\"}", "stop"},
    {CHAT, "{" M ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop"},
    {CHAT, "{" M ",\"stream_options\":{\"foo\":1}}", "stream_options"},
    {CHAT, "{" M ",\"n\":3}", "n"},
    {CHAT, "{" M ",\"logprobs\":true,\"top_logprobs\":20}", NULL},
    {CHAT, "{" M ",\"logprobs\":true,\"stream\":true}", NULL},
    {CHAT, "{" M ",\"logprobs\":1}", "logprobs"},
    {CHAT, "{" M ",\"top_logprobs\":2}", "top_logprobs"},
    {CHAT, "{" M ",\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs"},
    {COMP, "{\"prompt\":\"a\",\"logprobs\":5,\"echo\":true}", NULL},
    {COMP, "{\"prompt\":\"a\",\"logprobs\":true}", "logprobs"},
    {COMP, "{\"prompt\":\"a\",\"echo\":true,\"stream\":true}", "echo"},
    {CHAT, "{" M ",\"presence_penalty\":0.1}", "presence_penalty"},
    {CHAT, "{" M ",\"logit_bias\":{\"1\":2}}", "logit_bias"},
    {CHAT, "{" M ",\"tools\":[{\"type\":\"function\"}]}", "tools[0].function"},
    {CHAT, "{" M ",\"tools\":[{\"type\":\"retrieval\"}]}", "tools[0].type"},
    {CHAT, "{" M ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"\"}}]}",
     "tools[0].function.name"},
    {CHAT, "{" M ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
           "\"parameters\":{\"type\":\"object\"}}}],\"tool_choice\":\"required\","
           "\"parallel_tool_calls\":false}", NULL},
    {CHAT, "{" M ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
           "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}",
     "tool_choice"},
    {CHAT, "{" M ",\"tool_choice\":\"required\"}", "tool_choice"},
    {CHAT, "{" M ",\"tool_choice\":\"any\"}", "tool_choice"},
    {CHAT, "{" M ",\"parallel_tool_calls\":1}", "parallel_tool_calls"},
    {CHAT, "{" M ",\"response_format\":{\"type\":\"json_object\"}}", "response_format"},
    {CHAT, "{" M ",\"prompt\":\"x\"}", "prompt"},
    {CHAT, "{" M ",\"echo\":false}", "echo"},
    {CHAT, "{\"messages\":[]}", "messages"},
    {CHAT, "{\"messages\":{}}", "messages"},
    {CHAT, "{}", "messages"},
    {CHAT, "[]", ""},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
           "{\"type\":\"image_url\",\"image_url\":{}}]}]}", "messages[0].content[1].type"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
     "messages[0].content[0].text"},
    {CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"bot\",\"content\":"
           "\"x\"}]}", "messages[1].role"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"extra\":1}]}", "messages[0].extra"},
    {CHAT, "{\"messages\":[{\"role\":\"assistant\",\"content\":null}]}", NULL},
    {CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":null}]}", "messages[0].content"},
    {COMP, "{\"prompt\":\"hi\"}", NULL},
    {COMP, "{\"prompt\":[1,2,3],\"echo\":false,\"best_of\":1,\"suffix\":null}", NULL},
    {COMP, "{\"prompt\":[[1,2]]}", NULL},
    {COMP, "{\"prompt\":[\"a\"]}", NULL},
    {COMP, "{\"prompt\":[\"a\",\"b\"]}", "prompt"},
    {COMP, "{\"prompt\":[1.5]}", "prompt"},
    {COMP, "{\"prompt\":[-1]}", "prompt"},
    {COMP, "{\"prompt\":\"\"}", "prompt"},
    {COMP, "{\"prompt\":[]}", "prompt"},
    {COMP, "{\"prompt\":\"a\",\"echo\":1}", "echo"},
    {COMP, "{\"prompt\":\"a\",\"logprobs\":-1}", "logprobs"},
    {COMP, "{\"prompt\":\"a\",\"messages\":[]}", "messages"},
    {COMP, "{\"prompt\":\"a\",\"max_completion_tokens\":3}", "max_completion_tokens"},
    {COMP, "{}", "prompt"},
};

static void test_validation(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const vcase *c = &cases[i];
        cJSON *root = cJSON_Parse(c->json);
        CHECK(root, "case %zu does not parse", i);
        k3_srv_params p;
        k3_api_error e = {0};
        int rc = k3_srv_parse_params(root, c->kind, 0, &p, &e);
        cJSON_Delete(root);
        if (!c->param) {
            CHECK(rc == 0, "case %zu (%s) rejected: %s [%s]", i, c->json, e.message, e.param);
            k3_srv_params_free(&p);
        } else {
            CHECK(rc == -1 && e.status == 400, "case %zu (%s) accepted", i, c->json);
            CHECK(!strcmp(e.param, c->param), "case %zu: param '%s', want '%s' (%s)", i, e.param,
                  c->param, e.message);
            char *body = k3_api_error_json(&e);
            cJSON *err = cJSON_Parse(body);
            free(body);
            const cJSON *o = cJSON_GetObjectItem(err, "error");
            CHECK(cJSON_IsString(cJSON_GetObjectItem(o, "message")) &&
                  cJSON_IsString(cJSON_GetObjectItem(o, "type")) &&
                  cJSON_GetObjectItem(o, "param") && cJSON_GetObjectItem(o, "code"),
                  "case %zu: error body is not OpenAI-shaped", i);
            cJSON_Delete(err);
        }
    }
}

static void test_defaults_and_ceiling(void) {
    cJSON *root = cJSON_Parse("{\"prompt\":\"a\"}");
    k3_srv_params p;
    k3_api_error e = {0};
    CHECK(k3_srv_parse_params(root, COMP, 0, &p, &e) == 0);
    CHECK(p.max_tokens == 256 && p.temperature == 1.0 && p.top_p == 1.0 && !p.thinking,
          "completions defaults: max_tokens %d temperature %g top_p %g", p.max_tokens,
          p.temperature, p.top_p);
    CHECK(k3_srv_parse_params(root, COMP, 100, &p, &e) == 0 && p.max_tokens == 100);
    cJSON_Delete(root);
    root = cJSON_Parse("{" M ",\"max_tokens\":101}");
    /* above the ceiling: cut to it (an agent asking 32000 of a --max-tokens 64 server) */
    CHECK(k3_srv_parse_params(root, CHAT, 100, &p, &e) == 0 && p.max_tokens == 100 &&
          p.max_clamped && p.max_requested == 101);
    CHECK(k3_srv_parse_params(root, CHAT, 101, &p, &e) == 0 && p.max_tokens == 101 &&
          !p.max_clamped);
    cJSON_Delete(root);
    root = cJSON_Parse("{" M "}");
    CHECK(k3_srv_parse_params(root, CHAT, 0, &p, &e) == 0 && p.max_tokens == 0 && p.thinking);
    cJSON_Delete(root);
    const char *off[] = {"{" M ",\"thinking\":false}", "{" M ",\"reasoning_effort\":\"none\"}",
                         "{" M ",\"chat_template_kwargs\":{\"thinking\":false}}"};
    for (int i = 0; i < 3; i++) {
        root = cJSON_Parse(off[i]);
        CHECK(k3_srv_parse_params(root, CHAT, 0, &p, &e) == 0 && !p.thinking, "%s", off[i]);
        cJSON_Delete(root);
    }
    root = cJSON_Parse("{" M ",\"stop\":\"xy\",\"seed\":7}");
    CHECK(k3_srv_parse_params(root, CHAT, 0, &p, &e) == 0);
    CHECK(p.n_stop == 1 && !strcmp(p.stop[0], "xy") && p.has_seed && p.seed == 7);
    k3_srv_params_free(&p);
    cJSON_Delete(root);
}

/* Feeds pieces through a non-streamed job's emitter; returns the content and whether (and at
 * which piece) a stop string matched. */
static char *emit_pieces(const char *const *stops, int n_stop, const char *const *pieces,
                         int *stopped_at) {
    k3_job j = {0};
    j.p.kind = K3_SRV_COMPLETIONS;
    for (int i = 0; i < n_stop; i++) j.p.stop[i] = (char *)stops[i];
    j.p.n_stop = n_stop;
    k3_emitter *em = k3_emitter_new();
    k3_emitter_begin(em, NULL, &j);
    *stopped_at = -1;
    for (int i = 0; pieces[i]; i++)
        if (k3_emit_text(em, 0, pieces[i], strlen(pieces[i]))) {
            *stopped_at = i;
            break;
        }
    k3_emit_finish(em, *stopped_at >= 0 ? "stop" : "length");
    k3_emitter_free(em);
    char *out = strdup(j.content.p ? j.content.p : "");
    k3_sbuf_free(&j.content);
    return out;
}

static void test_stop_strings(void) {
    struct {
        const char *stops[2];
        int n_stop;
        const char *pieces[6];
        const char *want;
        int stopped_at;
    } t[] = {
        {{"abc"}, 1, {"xxa", "b", "cyy", NULL}, "xx", 2},     /* split across pieces */
        {{"abc"}, 1, {"xa", "bd", "ab", NULL}, "xabdab", -1}, /* near misses, held tail freed */
        {{"abc", "d"}, 2, {"xab", "zd", NULL}, "xabz", 1},    /* the earliest match wins */
        {{"bc", "abcd"}, 2, {"abcd", NULL}, "", 0},          /* earliest start, not first listed */
        {{"\xC3\xA9"}, 1, {"caf", "\xC3", "\xA9!", NULL}, "caf", 2}, /* é in two pieces */
        {{"zz"}, 1, {"", "plain", NULL}, "plain", -1},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int at;
        char *got = emit_pieces(t[i].stops, t[i].n_stop, t[i].pieces, &at);
        int ok = !strcmp(got, t[i].want) && at == t[i].stopped_at;
        CHECK(ok, "case %zu: got '%s' (stop at %d), want '%s' (%d)", i, got, at, t[i].want,
              t[i].stopped_at);
        free(got);
    }
}

static void test_json_escaping(void) {
    /* Replacements as Python's bytes.decode("utf-8", "replace") gives them. */
    struct {
        const char *in;
        size_t n;
        const char *want;
    } t[] = {
        {"plain", 5, "plain"},
        {"q\"b\\n\nt\t\x01", 9, "q\\\"b\\\\n\\nt\\t\\u0001"},
        {"\xE2\x82\xAC ok", 6, "\xE2\x82\xAC ok"},                     /* € kept as is */
        {"a\xFF" "b", 3, "a\xEF\xBF\xBD" "b"},                         /* invalid byte */
        {"\xC0\xAF", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},                   /* overlong '/' */
        {"\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},   /* a surrogate */
        {"\xE2\x82", 2, "\xEF\xBF\xBD"},                                /* truncated */
        {"\xE2\x82x", 3, "\xEF\xBF\xBDx"},
        {"\xF0\x9F\x98", 3, "\xEF\xBF\xBD"},
        {"nul\0x", 5, "nul\\u0000x"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        k3_sbuf b = {0};
        k3_sbuf_json_str(&b, t[i].in, t[i].n);
        int ok = b.p && !strcmp(b.p, t[i].want);
        CHECK(ok, "case %zu: got '%s'", i, b.p ? b.p : "(null)");
        /* and it is valid JSON that reads back as a string */
        k3_sbuf q = {0};
        k3_sbuf_printf(&q, "\"%s\"", b.p);
        cJSON *v = cJSON_Parse(q.p);
        CHECK(cJSON_IsString(v), "case %zu: not a JSON string", i);
        cJSON_Delete(v);
        k3_sbuf_free(&q);
        k3_sbuf_free(&b);
    }
}

/* reasoning_effort "medium" renders exactly as "high" (the nearest K3 effort at or above it,
 * srv.h) and says so; "high" itself is not marked. The renderer's own ids for "high" and "low"
 * are the reference. */
static void test_medium_effort_is_high(void) {
    k3_engine *e = NULL;
    k3_err err = {0};
    k3_engine_opts o = k3_engine_opts_default();
    o.experts_in_place = 1;
    CHECK(k3_engine_load("tests/fixtures/k3-nano", &o, &e, &err) == K3_OK, "%s", err.msg);
    const char *efforts[] = {"medium", "high", "low"};
    int32_t *ids[3] = {0};
    size_t n[3] = {0};
    bool mapped[3] = {0};
    for (int i = 0; i < 3; i++) {
        char body[256];
        snprintf(body, sizeof body, "{" M ",\"reasoning_effort\":\"%s\"}", efforts[i]);
        cJSON *root = cJSON_Parse(body);
        k3_srv_params p;
        k3_chat_request req;
        k3_api_error ae = {0};
        int rc = k3_srv_parse_params(root, CHAT, 0, &p, &ae);
        if (!rc) rc = k3_srv_build_prompt(e, root, &p, &req, &ids[i], &n[i], &ae);
        mapped[i] = p.effort_mapped;
        if (!rc) k3_srv_params_free(&p);
        cJSON_Delete(root);
        if (rc) {
            k3_test_fail(__FILE__, __LINE__, "%s: %s", efforts[i], ae.message);
            break;
        }
    }
    int ok = !k3_test_stopped();
    if (ok) {
        CHECK(mapped[0] && !mapped[1] && !mapped[2], "effort_mapped %d %d %d", mapped[0],
              mapped[1], mapped[2]);
        CHECK(n[0] == n[1] && !memcmp(ids[0], ids[1], n[0] * sizeof *ids[0]),
              "medium does not render as high");
        CHECK(n[1] != n[2] || memcmp(ids[1], ids[2], n[1] * sizeof *ids[1]), "high = low?");
    }
    for (int i = 0; i < 3; i++) free(ids[i]);
    k3_engine_free(e);
}

/* The context error names what can be changed: --ctx while the server runs below the model's
 * maximum, else fewer max_tokens or a shorter prompt. */
static void test_context_error_advice(void) {
    k3_srv_params p = {.kind = COMP, .max_tokens = 50};
    k3_api_error e = {0};
    CHECK(k3_srv_check_context(&p, 50, 100, 4096, &e) == 0, "50 + 50 fits 100");
    CHECK(k3_srv_check_context(&p, 51, 100, 4096, &e) == -1 && !strcmp(e.param, "max_tokens") &&
          !strcmp(e.code, "context_length_exceeded") && strstr(e.message, "--ctx") &&
          strstr(e.message, "4096"), "below the model's maximum: %s", e.message);
    CHECK(k3_srv_check_context(&p, 51, 100, 100, &e) == -1 && !strcmp(e.param, "max_tokens") &&
          !strstr(e.message, "--ctx") && strstr(e.message, "at most 49 max_tokens"),
          "at the model's maximum: %s", e.message);
    p.max_tokens = 0;
    CHECK(k3_srv_check_context(&p, 99, 100, 100, &e) == 0, "one position left for a reply");
    CHECK(k3_srv_check_context(&p, 100, 100, 100, &e) == -1 && !strcmp(e.param, "prompt") &&
          !strstr(e.message, "--ctx") && strstr(e.message, "shorten the prompt"), "%s",
          e.message);
    p.kind = CHAT;
    CHECK(k3_srv_check_context(&p, 100, 100, 200, &e) == -1 && !strcmp(e.param, "messages") &&
          strstr(e.message, "--ctx"), "%s", e.message);
}

const k3_test k3_suite_server[] = {
    {"request_validation", test_validation},
    {"defaults_and_ceiling", test_defaults_and_ceiling},
    {"stop_strings", test_stop_strings},
    {"json_escaping", test_json_escaping},
    {"medium_effort_is_high", test_medium_effort_is_high},
    {"context_error_advice", test_context_error_advice},
    {0},
};
