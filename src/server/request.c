/* request.c — validation of completions / chat-completions request bodies (see srv.h).
 *
 * Every top-level field is looked up in one table. A field k3 honours is checked for type
 * and range; a field it cannot honour (logprobs, penalties,
 * images, n > 1, ...) is accepted only with its neutral value and is otherwise a 400 that
 * names it; an unknown field is a 400 too, as OpenAI does. Nothing is silently dropped.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tok/tokenizer.h"
#include "srv.h"

#define INVALID "invalid_request_error"
#define KIND_COMP 1u
#define KIND_CHAT 2u

typedef struct parse_ctx {
    enum k3_srv_kind kind;
    int ceiling;
    bool has_max_tokens; /* max_tokens or max_completion_tokens seen */
    const char *max_name;
} parse_ctx;

typedef int (*field_fn)(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                        k3_api_error *e);

/* ---- type helpers -------------------------------------------------------------------------- */

static const char *json_type(const cJSON *v) {
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    return "an object";
}

static int type_error(const char *name, const char *want, const cJSON *v, k3_api_error *e) {
    return k3_api_fail(e, 400, INVALID, NULL, name, "'%s' must be %s, not %s", name, want,
                       json_type(v));
}

int k3_api_unsupported(k3_api_error *e, const char *param, const char *why) {
    return k3_api_fail(e, 400, INVALID, "unsupported_parameter", param,
                       "k3 cannot honour '%s': %s", param, why);
}

int k3_api_wrong(k3_api_error *e, const char *param, const char *want) {
    return k3_api_fail(e, 400, INVALID, NULL, param, "'%s' must be %s", param, want);
}

const char *k3_json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int cannot(const char *name, const char *why, k3_api_error *e) {
    return k3_api_unsupported(e, name, why);
}

/* An integer-valued JSON number within [lo, hi]. */
static int get_int(const cJSON *v, const char *name, double lo, double hi, long long *out,
                   k3_api_error *e) {
    if (!cJSON_IsNumber(v)) return type_error(name, "an integer", v, e);
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d)) return type_error(name, "an integer", v, e);
    if (d < lo || d > hi)
        return k3_api_fail(e, 400, INVALID, NULL, name, "'%s' must be between %.0f and %.0f, "
                           "got %.0f", name, lo, hi, d);
    *out = (long long)d;
    return 0;
}

static int get_num(const cJSON *v, const char *name, double lo, double hi, double *out,
                   k3_api_error *e) {
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return type_error(name, "a number", v, e);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return k3_api_fail(e, 400, INVALID, NULL, name, "'%s' must be between %g and %g, got %g",
                           name, lo, hi, v->valuedouble);
    *out = v->valuedouble;
    return 0;
}

/* ---- fields k3 honours ----------------------------------------------------------------------- */

static int f_string(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                    k3_api_error *e) {
    (void)c, (void)p;
    return cJSON_IsString(v) ? 0 : type_error(name, "a string", v, e);
}

static int f_object(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                    k3_api_error *e) {
    (void)c, (void)p;
    return cJSON_IsObject(v) ? 0 : type_error(name, "an object", v, e);
}

static int f_max_tokens(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                        k3_api_error *e) {
    long long n;
    if (get_int(v, name, 1, 1 << 30, &n, e)) return -1;
    if (c->has_max_tokens && n != p->max_requested)
        return k3_api_fail(e, 400, INVALID, NULL, name, "'%s' and '%s' disagree; give one",
                           c->max_name, name);
    c->has_max_tokens = true;
    c->max_name = name;
    p->max_tokens = p->max_requested = (int)n;
    /* Above the server's ceiling (--max-tokens) the reply is cut there, as it would be at the
     * request's own limit: finish_reason "length" (Anthropic: stop_reason "max_tokens") and
     * usage say where it stopped. Agents ask for far more than they need (Claude Code always
     * 32000), and a 400 would stop them dead. */
    if (c->ceiling > 0 && n > c->ceiling) {
        p->max_tokens = c->ceiling;
        p->max_clamped = true;
    }
    return 0;
}

static int f_temperature(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                         k3_api_error *e) {
    (void)c;
    return get_num(v, name, 0, 2, &p->temperature, e);
}

static int f_top_p(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                   k3_api_error *e) {
    (void)c;
    return get_num(v, name, 0, 1, &p->top_p, e);
}

static int f_top_k(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                   k3_api_error *e) {
    (void)c;
    long long k;
    if (get_int(v, name, -1, 1 << 30, &k, e)) return -1;
    p->top_k = k < 0 ? 0 : (int)k; /* -1 means off, as in vLLM */
    return 0;
}

static int f_seed(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                  k3_api_error *e) {
    (void)c;
    long long s;
    /* JSON numbers reach us as doubles: beyond 2^53 two seeds could collide silently. */
    if (get_int(v, name, -9007199254740992.0, 9007199254740992.0, &s, e)) return -1;
    p->seed = (uint64_t)s;
    p->has_seed = true;
    return 0;
}

static int add_stop(const cJSON *s, const char *name, k3_srv_params *p, k3_api_error *e) {
    if (!cJSON_IsString(s)) return type_error(name, "a string or an array of strings", s, e);
    size_t len = strlen(s->valuestring);
    if (len == 0 || len > K3_SRV_MAX_STOP_BYTES)
        return k3_api_fail(e, 400, INVALID, NULL, name, "each stop string must have 1 to %d "
                           "bytes", K3_SRV_MAX_STOP_BYTES);
    if (p->n_stop == K3_SRV_MAX_STOP)
        return k3_api_fail(e, 400, INVALID, NULL, name, "at most %d stop strings",
                           K3_SRV_MAX_STOP);
    if (!(p->stop[p->n_stop] = strdup(s->valuestring)))
        return k3_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    p->n_stop++;
    return 0;
}

static int f_stop(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                  k3_api_error *e) {
    (void)c;
    if (cJSON_IsString(v)) return add_stop(v, name, p, e);
    if (!cJSON_IsArray(v)) return type_error(name, "a string or an array of strings", v, e);
    const cJSON *s;
    cJSON_ArrayForEach(s, v) if (add_stop(s, name, p, e)) return -1;
    return 0;
}

static int f_stream(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                    k3_api_error *e) {
    (void)c;
    if (!cJSON_IsBool(v)) return type_error(name, "a boolean", v, e);
    p->stream = cJSON_IsTrue(v);
    return 0;
}

static int f_stream_options(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                            k3_api_error *e) {
    (void)c;
    if (!cJSON_IsObject(v)) return type_error(name, "an object", v, e);
    const cJSON *o;
    cJSON_ArrayForEach(o, v) {
        if (strcmp(o->string, "include_usage"))
            return k3_api_fail(e, 400, INVALID, "unsupported_parameter", name,
                               "unknown stream option '%s' (k3 supports include_usage)",
                               o->string);
        if (cJSON_IsNull(o)) continue;
        if (!cJSON_IsBool(o)) return type_error("stream_options.include_usage", "a boolean", o, e);
        p->include_usage = cJSON_IsTrue(o);
    }
    return 0;
}

static int set_thinking(const cJSON *v, const char *name, k3_srv_params *p, k3_api_error *e) {
    if (!cJSON_IsBool(v)) return type_error(name, "a boolean", v, e);
    p->thinking = cJSON_IsTrue(v);
    return 0;
}

static int f_thinking(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                      k3_api_error *e) {
    (void)c;
    return set_thinking(v, name, p, e);
}

/* vLLM's way to pass renderer switches: {"chat_template_kwargs": {"thinking": false}}. */
static int f_template_kwargs(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                             k3_api_error *e) {
    (void)c;
    if (!cJSON_IsObject(v)) return type_error(name, "an object", v, e);
    const cJSON *o;
    cJSON_ArrayForEach(o, v) {
        if (strcmp(o->string, "thinking"))
            return k3_api_fail(e, 400, INVALID, "unsupported_parameter", name,
                               "unknown chat_template_kwargs key '%s' (k3 supports thinking)",
                               o->string);
        if (set_thinking(o, "chat_template_kwargs.thinking", p, e)) return -1;
    }
    return 0;
}

static int f_reasoning_effort(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                              k3_api_error *e) {
    (void)c;
    if (!cJSON_IsString(v)) return type_error(name, "a string", v, e);
    const char *s = v->valuestring;
    if (!strcmp(s, "none")) {
        p->thinking = false; /* spec §12.2a: "none" turns thinking off */
        return 0;
    }
    if (!strcmp(s, "medium")) { /* see K3_SRV_MEDIUM_EFFORT */
        p->effort_mapped = true;
        return 0;
    }
    if (strcmp(s, "low") && strcmp(s, "high") && strcmp(s, "max"))
        return k3_api_fail(e, 400, INVALID, NULL, name, "reasoning_effort '%s' is not one K3 "
                           "supports: low, high, max (medium is read as %s; none for no "
                           "thinking)", s, K3_SRV_MEDIUM_EFFORT);
    return 0;
}

/* logprobs: chat a boolean (top_logprobs gives the alternatives), completions an integer
 * (the alternatives per token). Streamed: one chunk per token carries its entry. */
static int f_logprobs(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                      k3_api_error *e) {
    if (c->kind == K3_SRV_CHAT) {
        if (!cJSON_IsBool(v)) return type_error(name, "a boolean", v, e);
        p->logprobs = cJSON_IsTrue(v);
        return 0;
    }
    long long n;
    if (get_int(v, name, 0, 20, &n, e)) return -1;
    p->logprobs = true;
    p->top_logprobs = (int)n;
    return 0;
}

static int f_top_logprobs(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                          k3_api_error *e) {
    (void)c;
    long long n;
    if (get_int(v, name, 0, 20, &n, e)) return -1;
    p->top_logprobs = (int)n;
    return 0;
}

static int f_echo(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                  k3_api_error *e) {
    (void)c;
    if (!cJSON_IsBool(v)) return type_error(name, "a boolean", v, e);
    p->echo = cJSON_IsTrue(v);
    return 0;
}

/* ---- fields accepted only with their neutral value ---------------------------------------- */

static int f_n(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
               k3_api_error *e) {
    (void)c, (void)p;
    long long n;
    if (get_int(v, name, 1, 1 << 30, &n, e)) return -1;
    return n == 1 ? 0 : cannot(name, "k3 generates one choice per request (n must be 1)", e);
}

static int f_false_only(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                        k3_api_error *e) {
    (void)c, (void)p;
    if (cJSON_IsFalse(v)) return 0;
    if (!strcmp(name, "logprobs") || !strcmp(name, "top_logprobs"))
        return cannot(name, "k3 serve does not return log probabilities", e);
    if (!strcmp(name, "echo")) return cannot(name, "the prompt is not echoed back", e);
    if (!strcmp(name, "store")) return cannot(name, "k3 stores nothing", e);
    return cannot(name, "only false is supported", e);
}

static int f_zero_only(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                       k3_api_error *e) {
    (void)c, (void)p;
    if (!cJSON_IsNumber(v)) return type_error(name, "a number", v, e);
    if (v->valuedouble == 0) return 0;
    if (!strcmp(name, "top_logprobs"))
        return cannot(name, "k3 serve does not return log probabilities", e);
    return cannot(name, "k3 samples without frequency or presence penalties", e);
}

static int f_empty_only(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                        k3_api_error *e) {
    (void)c, (void)p;
    if ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child) return 0;
    if (!strcmp(name, "functions"))
        return cannot(name, "the deprecated 'functions' API is not supported; use 'tools'", e);
    if (!strcmp(name, "logit_bias")) return cannot(name, "logit bias is not supported", e);
    return cannot(name, "only an empty value is supported", e);
}

/* tools: functions with JSON Schema parameters, rendered as K3's tool declaration (§12.5). */
static int f_tools(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                   k3_api_error *e) {
    (void)c;
    if (!cJSON_IsArray(v)) return type_error(name, "an array", v, e);
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, v) {
        char at[64];
        snprintf(at, sizeof at, "tools[%d]", i);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(t)) return type_error(at, "an object", t, e);
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function")) {
            snprintf(at, sizeof at, "tools[%d].type", i);
            return cannot(at, "k3 offers tools of type \"function\" only", e);
        }
        snprintf(at, sizeof at, "tools[%d].function", i);
        if (!f) return k3_api_fail(e, 400, INVALID, NULL, at, "'%s' is required", at);
        if (!cJSON_IsObject(f)) return type_error(at, "an object", f, e);
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(f, "name");
        snprintf(at, sizeof at, "tools[%d].function.name", i);
        if (!cJSON_IsString(fn) || !fn->valuestring[0])
            return k3_api_fail(e, 400, INVALID, NULL, at, "'%s' must be a non-empty string", at);
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        snprintf(at, sizeof at, "tools[%d].function.parameters", i);
        if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
            return type_error(at, "a JSON Schema object", params, e);
        i++;
    }
    p->tools = i > 0;
    return 0;
}

/* tool_choice: "auto", "none", "required" render as the official renderer does (§12.5,
 * render.c); a named function has no verified K3 rendering, so it is refused by name. */
static int f_tool_choice(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                         k3_api_error *e) {
    (void)c;
    if (cJSON_IsObject(v))
        return cannot(name, "a named tool_choice ({\"type\": \"function\", ...}) has no "
                      "verified rendering in K3's chat format; use \"auto\", \"required\" or "
                      "\"none\" and name the tool in a message", e);
    if (!cJSON_IsString(v) || (strcmp(v->valuestring, "none") && strcmp(v->valuestring, "auto") &&
                               strcmp(v->valuestring, "required")))
        return k3_api_fail(e, 400, INVALID, NULL, name, "'%s' must be \"auto\", \"none\" or "
                           "\"required\"", name);
    p->tool_required = !strcmp(v->valuestring, "required");
    return 0;
}

static int f_parallel_tool_calls(const cJSON *v, const char *name, parse_ctx *c,
                                 k3_srv_params *p, k3_api_error *e) {
    (void)c;
    if (!cJSON_IsBool(v)) return type_error(name, "a boolean", v, e);
    p->parallel_tool_calls = cJSON_IsTrue(v);
    return 0;
}

static int f_response_format(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                             k3_api_error *e) {
    (void)c, (void)p;
    if (!cJSON_IsObject(v)) return type_error(name, "an object", v, e);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
    if (cJSON_IsString(t) && !strcmp(t->valuestring, "text") && cJSON_GetArraySize(v) == 1)
        return 0;
    return cannot(name, "k3 cannot constrain output to JSON; only {\"type\": \"text\"}", e);
}

static int f_modalities(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                        k3_api_error *e) {
    (void)c, (void)p;
    if (!cJSON_IsArray(v)) return type_error(name, "an array", v, e);
    const cJSON *m;
    cJSON_ArrayForEach(m, v) if (!cJSON_IsString(m) || strcmp(m->valuestring, "text"))
        return cannot(name, "k3 produces text only", e);
    return 0;
}

static int f_never(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                   k3_api_error *e) {
    (void)v, (void)c, (void)p;
    if (!strcmp(name, "suffix") && cJSON_IsString(v) && !v->valuestring[0]) return 0;
    if (!strcmp(name, "best_of") && cJSON_IsNumber(v) && v->valuedouble == 1) return 0;
    if (!strcmp(name, "function_call") && cJSON_IsString(v) && !strcmp(v->valuestring, "none"))
        return 0;
    return cannot(name, "not supported by k3 serve", e);
}

/* ---- prompt and messages (shape only; rendering is in k3_srv_build_prompt) ---------------- */

static int check_ids(const cJSON *v, const char *name, k3_api_error *e) {
    if (!v->child) return k3_api_fail(e, 400, INVALID, NULL, name, "'%s' is empty", name);
    const cJSON *x;
    cJSON_ArrayForEach(x, v) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) ||
            x->valuedouble < 0 || x->valuedouble > 2147483647.0)
            return type_error(name, "a string, or an array of token ids", x, e);
    }
    return 0;
}

static int f_prompt(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                    k3_api_error *e) {
    (void)c, (void)p;
    if (cJSON_IsString(v)) {
        if (!v->valuestring[0])
            return k3_api_fail(e, 400, INVALID, NULL, name, "'prompt' is empty");
        return 0;
    }
    if (!cJSON_IsArray(v) || !v->child) return type_error(name, "a string or token ids", v, e);
    if (cJSON_IsNumber(v->child)) return check_ids(v, name, e);
    if (cJSON_GetArraySize(v) != 1)
        return cannot(name, "k3 serves one prompt per request (batched prompts are not "
                      "supported)", e);
    if (cJSON_IsString(v->child)) return f_prompt(v->child, name, c, p, e);
    if (cJSON_IsArray(v->child)) return check_ids(v->child, name, e);
    return type_error(name, "a string or token ids", v->child, e);
}

static int check_content(const cJSON *m, int i, k3_api_error *e) {
    char name[96];
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    snprintf(name, sizeof name, "messages[%d].content", i);
    if (!content || cJSON_IsNull(content) || cJSON_IsString(content)) return 0;
    if (!cJSON_IsArray(content)) return type_error(name, "a string or an array of parts", content, e);
    int j = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        snprintf(name, sizeof name, "messages[%d].content[%d]", i, j);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type))
            return type_error(name, "an object with a \"type\"", part, e);
        if (strcmp(type->valuestring, "text")) {
            snprintf(name, sizeof name, "messages[%d].content[%d].type", i, j);
            return k3_api_fail(e, 400, INVALID, "unsupported_parameter", name, "k3 reads text "
                               "only; content part type '%s' (%s) is not supported",
                               type->valuestring, name);
        }
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        snprintf(name, sizeof name, "messages[%d].content[%d].text", i, j);
        if (!cJSON_IsString(text)) return type_error(name, "a string", text ? text : part, e);
        j++;
    }
    return 0;
}

static int check_message(const cJSON *m, int i, k3_api_error *e) {
    static const char *const keys[] = {"role", "content", "name", "reasoning_content",
                                       "reasoning", "tool_calls", "tool_call_id", "tool",
                                       "refusal", NULL};
    char name[96];
    snprintf(name, sizeof name, "messages[%d]", i);
    if (!cJSON_IsObject(m)) return type_error(name, "an object", m, e);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    snprintf(name, sizeof name, "messages[%d].role", i);
    if (!cJSON_IsString(role)) return type_error(name, "a string", role ? role : m, e);
    const char *r = role->valuestring;
    if (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") &&
        strcmp(r, "assistant") && strcmp(r, "tool"))
        return k3_api_fail(e, 400, INVALID, NULL, name, "unknown role '%s' (system, developer, "
                           "user, assistant or tool)", r);
    const cJSON *f;
    cJSON_ArrayForEach(f, m) {
        int known = 0;
        for (int k = 0; keys[k]; k++) known |= !strcmp(f->string, keys[k]);
        snprintf(name, sizeof name, "messages[%d].%s", i, f->string);
        if (!known)
            return k3_api_fail(e, 400, INVALID, "unsupported_parameter", name,
                               "unknown message field '%s'", f->string);
        if (cJSON_IsNull(f) || !strcmp(f->string, "role") || !strcmp(f->string, "content") ||
            !strcmp(f->string, "tool_calls"))
            continue;
        if (!strcmp(f->string, "refusal")) return cannot(name, "refusals are not supported", e);
        if (!cJSON_IsString(f)) return type_error(name, "a string", f, e);
    }
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    snprintf(name, sizeof name, "messages[%d].tool_calls", i);
    if (calls && !cJSON_IsNull(calls) && (!cJSON_IsArray(calls) || strcmp(r, "assistant")))
        return type_error(name, "an array on an assistant message", calls, e);
    if (check_content(m, i, e)) return -1;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    snprintf(name, sizeof name, "messages[%d].content", i);
    if (strcmp(r, "assistant") && (!content || cJSON_IsNull(content)))
        return k3_api_fail(e, 400, INVALID, NULL, name, "a %s message needs 'content'", r);
    return 0;
}

static int f_messages(const cJSON *v, const char *name, parse_ctx *c, k3_srv_params *p,
                      k3_api_error *e) {
    (void)c, (void)p;
    if (!cJSON_IsArray(v)) return type_error(name, "an array", v, e);
    if (!v->child)
        return k3_api_fail(e, 400, INVALID, NULL, name, "'messages' must not be empty");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, v) if (check_message(m, i++, e)) return -1;
    return 0;
}

/* ---- the table -------------------------------------------------------------------------------- */

static const struct field {
    const char *name;
    unsigned kinds;
    field_fn fn;
} fields[] = {
    {"model", KIND_COMP | KIND_CHAT, f_string},
    {"prompt", KIND_COMP, f_prompt},
    {"messages", KIND_CHAT, f_messages},
    {"max_tokens", KIND_COMP | KIND_CHAT, f_max_tokens},
    {"max_completion_tokens", KIND_CHAT, f_max_tokens},
    {"temperature", KIND_COMP | KIND_CHAT, f_temperature},
    {"top_p", KIND_COMP | KIND_CHAT, f_top_p},
    {"top_k", KIND_COMP | KIND_CHAT, f_top_k},
    {"seed", KIND_COMP | KIND_CHAT, f_seed},
    {"stop", KIND_COMP | KIND_CHAT, f_stop},
    {"stream", KIND_COMP | KIND_CHAT, f_stream},
    {"stream_options", KIND_COMP | KIND_CHAT, f_stream_options},
    {"reasoning_effort", KIND_CHAT, f_reasoning_effort},
    {"thinking", KIND_CHAT, f_thinking},
    {"chat_template_kwargs", KIND_CHAT, f_template_kwargs},
    {"user", KIND_COMP | KIND_CHAT, f_string},
    {"metadata", KIND_CHAT, f_object},
    {"service_tier", KIND_CHAT, f_string},
    {"parallel_tool_calls", KIND_CHAT, f_parallel_tool_calls},
    {"n", KIND_COMP | KIND_CHAT, f_n},
    {"logprobs", KIND_COMP | KIND_CHAT, f_logprobs},
    {"top_logprobs", KIND_CHAT, f_top_logprobs},
    {"echo", KIND_COMP, f_echo},
    {"store", KIND_CHAT, f_false_only},
    {"frequency_penalty", KIND_COMP | KIND_CHAT, f_zero_only},
    {"presence_penalty", KIND_COMP | KIND_CHAT, f_zero_only},
    {"logit_bias", KIND_COMP | KIND_CHAT, f_empty_only},
    {"tools", KIND_CHAT, f_tools},
    {"functions", KIND_CHAT, f_empty_only},
    {"tool_choice", KIND_CHAT, f_tool_choice},
    {"function_call", KIND_CHAT, f_never},
    {"response_format", KIND_CHAT, f_response_format},
    {"modalities", KIND_CHAT, f_modalities},
    {"audio", KIND_CHAT, f_never},
    {"prediction", KIND_CHAT, f_never},
    {"web_search_options", KIND_CHAT, f_never},
    {"suffix", KIND_COMP, f_never},
    {"best_of", KIND_COMP, f_never},
};

int k3_srv_parse_params(const cJSON *root, enum k3_srv_kind kind, int max_tokens_ceiling,
                        k3_srv_params *p, k3_api_error *e) {
    *p = (k3_srv_params){.kind = kind, .temperature = 1.0, .top_p = 1.0, .thinking = true,
                         .client_fd = -1, .parallel_tool_calls = true};
    parse_ctx c = {.kind = kind, .ceiling = max_tokens_ceiling};
    unsigned bit = kind == K3_SRV_CHAT ? KIND_CHAT : KIND_COMP;
    if (!cJSON_IsObject(root))
        return k3_api_fail(e, 400, INVALID, NULL, NULL, "the request body must be a JSON "
                           "object, not %s", json_type(root));
    const cJSON *v;
    cJSON_ArrayForEach(v, root) {
        const struct field *f = NULL;
        for (size_t i = 0; i < sizeof fields / sizeof fields[0] && !f; i++)
            if (!strcmp(fields[i].name, v->string) && (fields[i].kinds & bit)) f = &fields[i];
        if (!f) {
            k3_srv_params_free(p); /* stop strings taken from earlier fields (found by fuzzing) */
            return k3_api_fail(e, 400, INVALID, "unsupported_parameter", v->string,
                               "Unrecognized request argument supplied: %s", v->string);
        }
        if (cJSON_IsNull(v)) continue; /* null means "not given" in the OpenAI API */
        if (f->fn(v, f->name, &c, p, e)) {
            k3_srv_params_free(p);
            return -1;
        }
    }
    const char *need = kind == K3_SRV_CHAT ? "messages" : "prompt";
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, need);
    if (!x || cJSON_IsNull(x)) {
        k3_srv_params_free(p);
        return k3_api_fail(e, 400, INVALID, NULL, need, "'%s' is required", need);
    }
    if (p->tool_required && !p->tools) {
        k3_srv_params_free(p);
        return k3_api_fail(e, 400, INVALID, NULL, "tool_choice", "tool_choice \"required\" "
                           "needs a non-empty 'tools' list");
    }
    const char *lp_bad = kind == K3_SRV_CHAT && p->top_logprobs && !p->logprobs
                         ? "'top_logprobs' needs 'logprobs': true"
                         : p->stream && p->echo
                         ? "k3 echoes the prompt in non-streamed replies only; set 'stream': "
                           "false" : NULL;
    if (lp_bad) {
        k3_srv_params_free(p);
        return k3_api_fail(e, 400, INVALID, "unsupported_parameter",
                           p->top_logprobs && !p->logprobs ? "top_logprobs"
                           : p->logprobs ? "logprobs" : "echo", "%s", lp_bad);
    }
    if (kind == K3_SRV_COMPLETIONS && !c.has_max_tokens) /* OpenAI's completions default */
        p->max_tokens = max_tokens_ceiling > 0 && max_tokens_ceiling < 256 ? max_tokens_ceiling
                                                                           : 256;
    if (kind == K3_SRV_COMPLETIONS) p->thinking = false;
    return 0;
}

static bool given(const cJSON *root, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    return v && !cJSON_IsNull(v);
}

void k3_srv_apply_defaults(const cJSON *root, const k3_server_opts *o, k3_srv_params *p) {
    if (!given(root, "temperature")) p->temperature = o->temperature;
    if (p->kind == K3_SRV_CHAT && !given(root, "reasoning_effort") &&
        !given(root, "thinking_effort"))
        p->effort = o->effort;
}

void k3_srv_params_free(k3_srv_params *p) {
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    p->n_stop = 0;
}

/* ---- prompts -------------------------------------------------------------------------------- */

static int take_ids(const cJSON *arr, int vocab, int32_t **ids, size_t *n, k3_api_error *e) {
    size_t cnt = (size_t)cJSON_GetArraySize(arr), i = 0;
    int32_t *v = malloc(cnt * sizeof *v);
    if (!v) return k3_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) {
        if (x->valuedouble >= vocab) {
            free(v);
            return k3_api_fail(e, 400, INVALID, NULL, "prompt", "token id %.0f is outside the "
                               "vocabulary [0, %d)", x->valuedouble, vocab);
        }
        v[i++] = (int32_t)x->valuedouble;
    }
    *ids = v;
    *n = cnt;
    return 0;
}

static int completion_prompt(const k3_engine *eng, const cJSON *prompt, int32_t **ids,
                             size_t *n, k3_api_error *e) {
    const k3_tokenizer *tok = k3_engine_tokenizer(eng);
    if (cJSON_IsArray(prompt) && !cJSON_IsNumber(prompt->child)) prompt = prompt->child;
    if (cJSON_IsArray(prompt))
        return take_ids(prompt, k3_engine_config(eng)->vocab_size, ids, n, e);
    k3_err err = {0};
    /* Special-token spellings in the text are ordinary text: structure needs ids. */
    if (k3_tokenizer_encode(tok, prompt->valuestring, strlen(prompt->valuestring), false, ids,
                            n, &err))
        return k3_api_fail(e, err.code == K3_ERR_GENERIC ? 500 : 400, INVALID, NULL, "prompt",
                           "%s", err.msg);
    if (*n == 0) {
        free(*ids);
        return k3_api_fail(e, 400, INVALID, NULL, "prompt", "'prompt' has no tokens");
    }
    return 0;
}

/* OpenAI's newer "developer" role is the system role of older models and of K3's format. */
static void developer_to_system(cJSON *messages) {
    cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "developer"))
            cJSON_ReplaceItemInObjectCaseSensitive(m, "role", cJSON_CreateString("system"));
    }
}

static bool client_gone(void *fd) { return k3_srv_client_gone((int)(intptr_t)fd); }

static int chat_prompt(const k3_engine *eng, cJSON *root, const k3_srv_params *p,
                       k3_chat_request *req, int32_t **ids, size_t *n, k3_api_error *e) {
    k3_err err = {0};
    k3_segments segs = {0};
    developer_to_system(cJSON_GetObjectItemCaseSensitive(root, "messages"));
    if (p->effort_mapped && !cJSON_ReplaceItemInObjectCaseSensitive(
                                root, "reasoning_effort", cJSON_CreateString(K3_SRV_MEDIUM_EFFORT)))
        return k3_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    int rc = k3_chat_request_parse(root, req, &err);
    if (!rc) {
        req->thinking = p->thinking; /* also set by chat_template_kwargs / reasoning_effort */
        if (p->effort) snprintf(req->effort, sizeof req->effort, "%s", p->effort);
        req->max_segments = p->ctx > 0 ? (size_t)p->ctx : 0; /* a hostile request stops early */
        if (p->client_fd >= 0) {
            req->cancelled = client_gone;
            req->cancel_arg = (void *)(intptr_t)p->client_fd;
        }
        rc = k3_chat_render(req, 0, &segs, &err);
    }
    bool too_long = rc == K3_ERR_INPUT && req->max_segments && segs.n > req->max_segments;
    if (!rc) rc = k3_segments_encode(k3_engine_tokenizer(eng), &segs, ids, n, &err);
    k3_segments_free(&segs);
    if (too_long)
        return k3_api_fail(e, 400, INVALID, "context_length_exceeded", "messages", "This "
                           "model's context is %d tokens and the prompt is longer (k3 serve "
                           "--ctx raises the context)", p->ctx);
    if (rc)
        return k3_api_fail(e, rc == K3_ERR_GENERIC ? 500 : 400, INVALID, NULL, "messages", "%s",
                           err.msg);
    return 0;
}

int k3_srv_build_prompt(const k3_engine *eng, cJSON *root, const k3_srv_params *p,
                        k3_chat_request *req, int32_t **ids, size_t *n, k3_api_error *e) {
    if (p->kind == K3_SRV_COMPLETIONS)
        return completion_prompt(eng, cJSON_GetObjectItemCaseSensitive(root, "prompt"), ids, n,
                                 e);
    return chat_prompt(eng, root, p, req, ids, n, e);
}

int k3_srv_check_context(const k3_srv_params *p, size_t n_prompt, int ctx, int model_max,
                         k3_api_error *e) {
    size_t want = n_prompt + (size_t)p->max_tokens;
    if (n_prompt < (size_t)ctx && (!p->max_tokens || want <= (size_t)ctx)) return 0;
    const char *param = n_prompt < (size_t)ctx ? "max_tokens"
                      : p->kind == K3_SRV_CHAT ? "messages" : "prompt";
    char fix[160];
    if (ctx < model_max) /* the server was started with less than the model allows */
        snprintf(fix, sizeof fix, "k3 serve --ctx raises the context, up to the model's %d",
                 model_max);
    else if (n_prompt < (size_t)ctx)
        snprintf(fix, sizeof fix, "that is the model's maximum: ask for at most %zu max_tokens "
                 "or shorten the prompt", (size_t)ctx - n_prompt);
    else
        snprintf(fix, sizeof fix, "that is the model's maximum: shorten the prompt");
    return k3_api_fail(e, 400, INVALID, "context_length_exceeded", param, "This model's context "
                       "is %d tokens; the prompt has %zu and %d more were asked for (%s)", ctx,
                       n_prompt, p->max_tokens, fix);
}

/* ---- NUL inside strings ---------------------------------------------------------------------- */

/* The first raw "\u0000" escape in body, or NULL. Backslashes occur only inside strings of
 * valid JSON, so a scan that skips each escape ("\\" included) sees exactly the escapes. */
static const char *raw_nul_escape(const char *body, size_t len) {
    for (size_t i = 0; i + 1 < len; i++) {
        if (body[i] != '\\') continue;
        if (body[i + 1] == 'u' && i + 5 < len && !memcmp(body + i + 2, "0000", 4))
            return body + i;
        i++; /* skip the escaped character */
    }
    return NULL;
}

/* a and b are the same document parsed with and without the NUL escapes replaced: the first
 * string whose length differs is the one cJSON cut. Writes its path to path. */
static bool find_cut(const cJSON *a, const cJSON *b, char *path, size_t cap) {
    size_t at = strlen(path);
    if (cJSON_IsString(a) && cJSON_IsString(b))
        return strlen(a->valuestring) != strlen(b->valuestring);
    int i = 0;
    for (const cJSON *x = a ? a->child : NULL, *y = b ? b->child : NULL; x && y;
         x = x->next, y = y->next, i++) {
        if (cJSON_IsObject(a)) {
            if (strlen(x->string) != strlen(y->string)) return true; /* a key: name the object */
            snprintf(path + at, cap - at, "%s%s", at ? "." : "", x->string);
        } else {
            snprintf(path + at, cap - at, "[%d]", i);
        }
        if (find_cut(x, y, path, cap)) return true;
        path[at] = 0;
    }
    return false;
}

int k3_srv_check_strings(const char *body, size_t len, const cJSON *root, k3_api_error *e) {
    const char *nul = raw_nul_escape(body, len);
    if (!nul) return 0;
    /* Rare and refused anyway: a second parse with every NUL escape made \u0001 finds the
     * field to name. */
    char *copy = malloc(len + 1);
    if (!copy) return k3_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    memcpy(copy, body, len);
    copy[len] = 0;
    for (size_t off = (size_t)(nul - body);;) {
        copy[off + 5] = '1';
        const char *next = raw_nul_escape(copy + off + 6, len - off - 6);
        if (!next) break;
        off = (size_t)(next - copy);
    }
    cJSON *other = cJSON_ParseWithLength(copy, len);
    free(copy);
    char path[160] = "";
    bool found = other && find_cut(root, other, path, sizeof path);
    cJSON_Delete(other);
    const char *where = found && path[0] ? path : NULL;
    return k3_api_fail(e, 400, INVALID, NULL, where, "'%s' contains a NUL character (\\u0000), "
                       "which k3 cannot pass to the model (cJSON would cut the string there): "
                       "remove it", where ? where : "a string of the request");
}

int k3_server_body_has_nul(const char *body, size_t len, char *where, size_t cap) {
    if (!raw_nul_escape(body, len)) return 0;
    cJSON *root = cJSON_ParseWithLength(body, len);
    k3_api_error e = {0};
    int bad = root && k3_srv_check_strings(body, len, root, &e) != 0;
    cJSON_Delete(root);
    if (bad && cap) snprintf(where, cap, "%s", e.param);
    return bad;
}
