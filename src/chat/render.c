/* render.c — OpenAI request body → XTML segments → ids (spec §12; see render.h). Read next
 * to spec §12.1–12.5: one function per building block, in render order. */
#include "render.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pyjson.h"

#define EFFORT_BODY                                                                          \
    "`thinking_effort` guides on how much to think in your thinking channel (not including " \
    "the response channel), supported values include `low`, `medium`, `high`, and `max`.\n" \
    "Now the system is invoked with `thinking_effort=%s`."
#define TOOLS_HEAD "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n"
#define DYNAMIC_TOOLS_HEAD                                                                   \
    "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n" \
    "You have access to all existing and extended tools.\n"                                  \
    "Here are the specs for the extended tools.\n\n```json\n"
#define JSON_FORMAT_BODY                                                                     \
    "Your response must be raw JSON data without markdown code blocks (```json) or any "     \
    "additional formatting."

/* ---- segment lists ----------------------------------------------------------------------- */

int k3_segments_push(k3_segments *s, const char *text, size_t len, bool allow_special,
                     k3_err *err) {
    if (len == 0) return K3_OK;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        k3_segment *v = realloc(s->v, cap * sizeof *v);
        if (!v) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
        s->v = v;
        s->cap = cap;
    }
    char *t = malloc(len + 1);
    if (!t) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    memcpy(t, text, len);
    t[len] = 0;
    s->v[s->n++] = (k3_segment){t, len, allow_special};
    return K3_OK;
}

void k3_segments_free(k3_segments *s) {
    for (size_t i = 0; i < s->n; i++) free(s->v[i].text);
    free(s->v);
    *s = (k3_segments){0};
}

char *k3_segments_text(const k3_segments *s, size_t *len) {
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++) n += s->v[i].len;
    char *out = malloc(n + 1);
    if (!out) return NULL;
    size_t at = 0;
    for (size_t i = 0; i < s->n; i++) {
        memcpy(out + at, s->v[i].text, s->v[i].len);
        at += s->v[i].len;
    }
    out[n] = 0;
    if (len) *len = n;
    return out;
}

int k3_segments_encode(const k3_tokenizer *t, const k3_segments *s, int32_t **ids, size_t *n,
                       k3_err *err) {
    size_t cap = 64, cnt = 0;
    int32_t *all = malloc(cap * sizeof *all);
    if (!all) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    for (size_t i = 0; i < s->n; i++) {
        int32_t *part;
        size_t np;
        int rc = k3_tokenizer_encode(t, s->v[i].text, s->v[i].len, s->v[i].allow_special,
                                     &part, &np, err);
        if (rc) {
            free(all);
            return rc;
        }
        if (cnt + np > cap) {
            while (cnt + np > cap) cap *= 2;
            int32_t *grown = realloc(all, cap * sizeof *all);
            if (!grown) {
                free(part);
                free(all);
                return k3_fail(err, K3_ERR_GENERIC, "out of memory");
            }
            all = grown;
        }
        memcpy(all + cnt, part, np * sizeof *part);
        cnt += np;
        free(part);
    }
    *ids = all;
    *n = cnt;
    return K3_OK;
}

/* ---- building blocks (§12.1) ------------------------------------------------------------- */

/* Render context: the first error sticks in rc and later calls do nothing. `emit` is false
 * while walking messages that are already in the model state (continuations). */
typedef struct rctx {
    k3_segments *out;
    k3_err *err;
    int rc;
    bool emit;
    size_t budget; /* k3_chat_request.max_segments: 0 = none */
} rctx;

/* Every non-empty segment encodes to at least one token, so a render with more segments
 * than the budget has more tokens than the context: stop there rather than render (and
 * tokenize) the rest of a hostile request (issue 20, D1). */
static void over_budget(rctx *r) {
    if (!r->rc && r->budget && r->out->n > r->budget)
        r->rc = k3_fail(r->err, K3_ERR_INPUT, "request: the prompt is longer than the context "
                        "of %zu tokens (it has more than %zu segments, each at least one token)",
                        r->budget, r->budget);
}

static void seg(rctx *r, const char *text, bool special) {
    if (!r->rc && r->emit) r->rc = k3_segments_push(r->out, text, strlen(text), special, r->err);
    over_budget(r);
}

static void seg_n(rctx *r, const char *text, size_t len) {
    if (!r->rc && r->emit) r->rc = k3_segments_push(r->out, text, len, false, r->err);
    over_budget(r);
}

/* Attribute values: & → &amp; then " → &quot; (§12.1). */
static void attr_value(rctx *r, const char *v) {
    k3_strbuf b = {0};
    for (const char *p = v; *p; p++) {
        if (*p == '&')
            k3_strbuf_puts(&b, "&amp;");
        else if (*p == '"')
            k3_strbuf_puts(&b, "&quot;");
        else
            k3_strbuf_put(&b, p, 1);
    }
    if (b.oom && !r->rc) r->rc = k3_fail(r->err, K3_ERR_GENERIC, "out of memory");
    if (b.n) seg_n(r, b.p, b.n);
    k3_strbuf_free(&b);
}

/* open(tag, attrs): attrs is a NULL-terminated list of key, value pairs. */
static void open_tag(rctx *r, const char *tag, const char *const *attrs) {
    seg(r, K3_TOK_OPEN, true);
    seg(r, tag, false);
    for (const char *const *a = attrs; a && a[0]; a += 2) {
        char key[64];
        snprintf(key, sizeof key, " %s", a[0]);
        seg(r, key, false);
        seg(r, "=\"", false);
        attr_value(r, a[1]);
        seg(r, "\"", false);
    }
    seg(r, K3_TOK_SEP, true);
}

static void close_tag(rctx *r, const char *tag) {
    seg(r, K3_TOK_CLOSE, true);
    seg(r, tag, false);
    seg(r, K3_TOK_SEP, true);
}

static void end_message(rctx *r) {
    close_tag(r, "message");
    seg(r, K3_TOK_END_OF_MSG, true);
}

/* An internal system message: body whitespace-trimmed (§12.2). */
static void internal_system(rctx *r, const char *type, const char *body) {
    const char *attrs[] = {"role", "system", "type", type, NULL};
    open_tag(r, "message", attrs);
    size_t start, len;
    k3_py_strip(body, strlen(body), &start, &len);
    seg_n(r, body + start, len);
    end_message(r);
}

static int fail(rctx *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(rctx *r, const char *fmt, ...) {
    if (r->rc) return r->rc;
    va_list ap;
    va_start(ap, fmt);
    char msg[sizeof r->err->msg];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return r->rc = k3_fail(r->err, K3_ERR_INPUT, "request: %s", msg);
}

/* ---- content ----------------------------------------------------------------------------- */

/* A string, null/absent, or a list of text parts (each its own segment, §12.2a). */
static void content(rctx *r, const cJSON *c, size_t i) {
    if (!c || cJSON_IsNull(c)) return;
    if (cJSON_IsString(c)) {
        seg_n(r, c->valuestring, strlen(c->valuestring));
        return;
    }
    if (!cJSON_IsArray(c)) {
        fail(r, "messages[%zu].content must be a string, null or a list of text parts", i);
        return;
    }
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text)) {
            fail(r, "messages[%zu].content: only {\"type\": \"text\", \"text\": ...} parts are "
                 "supported (k3 is a text-only engine)", i);
            return;
        }
        seg_n(r, text->valuestring, strlen(text->valuestring));
    }
}

static const char *str_field(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- tools (§12.5) ----------------------------------------------------------------------- */

static void tool_declare(rctx *r, const cJSON *tools, bool dynamic) {
    k3_strbuf b = {0};
    k3_strbuf_puts(&b, dynamic ? DYNAMIC_TOOLS_HEAD : TOOLS_HEAD);
    k3_pyjson_dump(&b, tools, K3_PYJSON_COMPACT, true);
    k3_strbuf_puts(&b, "\n```");
    if (b.oom) {
        if (!r->rc) r->rc = k3_fail(r->err, K3_ERR_GENERIC, "out of memory");
    } else {
        const char *attrs[] = {"role", "system", "type", "tool-declare", NULL};
        open_tag(r, "message", attrs);
        seg_n(r, b.p, b.n);
        end_message(r);
    }
    k3_strbuf_free(&b);
}

static const char *xtml_type(const cJSON *v) {
    if (cJSON_IsBool(v)) return "boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsNumber(v)) return "number";
    if (cJSON_IsString(v)) return "string";
    if (cJSON_IsObject(v)) return "object";
    return "array";
}

/* One argument per key in insertion order: strings raw, the rest as Python's json.dumps. */
static void call_arguments(rctx *r, const cJSON *args) {
    k3_pyjson_member *keys;
    size_t n;
    if (k3_pyjson_dict(args, &keys, &n)) {
        if (!r->rc) r->rc = k3_fail(r->err, K3_ERR_GENERIC, "out of memory");
        return;
    }
    for (size_t i = 0; i < n && !r->rc; i++) {
        const cJSON *v = keys[i].value;
        const char *attrs[] = {"key", keys[i].key, "type", xtml_type(v), NULL};
        open_tag(r, "argument", attrs);
        if (cJSON_IsString(v)) {
            seg_n(r, v->valuestring, strlen(v->valuestring));
        } else {
            k3_strbuf b = {0};
            k3_pyjson_dump(&b, v, K3_PYJSON_SPACED, false);
            if (b.oom && !r->rc) r->rc = k3_fail(r->err, K3_ERR_GENERIC, "out of memory");
            seg_n(r, b.p ? b.p : "", b.n);
            k3_strbuf_free(&b);
        }
        close_tag(r, "argument");
    }
    free(keys);
}

/* arguments: absent/null/blank → none; a JSON object (or its text) → per key; other text
 * that is not JSON → raw inside json type="object" (§12.5). */
static void call_body(rctx *r, const cJSON *arguments, size_t i) {
    if (!arguments || cJSON_IsNull(arguments)) return;
    if (cJSON_IsObject(arguments)) {
        call_arguments(r, arguments);
        return;
    }
    if (!cJSON_IsString(arguments)) {
        fail(r, "messages[%zu]: tool call arguments must be a JSON string or object", i);
        return;
    }
    const char *s = arguments->valuestring;
    size_t start, len;
    k3_py_strip(s, strlen(s), &start, &len);
    if (len == 0) return;
    cJSON *parsed = cJSON_ParseWithLengthOpts(s, strlen(s) + 1, NULL, 1);
    if (!parsed) {
        const char *attrs[] = {"type", "object", NULL};
        open_tag(r, "json", attrs);
        seg_n(r, s, strlen(s));
        close_tag(r, "json");
        return;
    }
    if (cJSON_IsObject(parsed))
        call_arguments(r, parsed);
    else
        fail(r, "messages[%zu]: tool call arguments must be a JSON object", i);
    cJSON_Delete(parsed);
}

static const cJSON *call_function(const cJSON *call) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(call, "function");
    return cJSON_IsObject(f) ? f : call;
}

static void tool_calls(rctx *r, const cJSON *calls, size_t i) {
    if (!cJSON_IsArray(calls) || cJSON_GetArraySize(calls) == 0) return;
    open_tag(r, "tools", NULL);
    int k = 0;
    const cJSON *call;
    cJSON_ArrayForEach(call, calls) {
        const char *name = str_field(call_function(call), "name");
        if (!name) {
            fail(r, "messages[%zu].tool_calls[%d]: function.name is missing", i, k);
            return;
        }
        char index[16];
        snprintf(index, sizeof index, "%d", ++k);
        const char *attrs[] = {"tool", name, "index", index, NULL};
        open_tag(r, "call", attrs);
        call_body(r, cJSON_GetObjectItemCaseSensitive(call_function(call), "arguments"), i);
        close_tag(r, "call");
    }
    close_tag(r, "tools");
}

/* ---- messages (§12.2–12.4) --------------------------------------------------------------- */

static void role_message(rctx *r, const cJSON *m, const char *role, size_t i) {
    const char *name = str_field(m, "name");
    const char *attrs[] = {"role", role, name && *name ? "name" : NULL, name, NULL};
    open_tag(r, "message", attrs);
    content(r, cJSON_GetObjectItemCaseSensitive(m, "content"), i);
    end_message(r);
}

/* reasoning_content when it is a non-empty string, else reasoning; blank → empty block. */
static void think_block(rctx *r, const cJSON *m, size_t i) {
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
    if (!(cJSON_IsString(rc) && rc->valuestring[0]))
        rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning");
    open_tag(r, "think", NULL);
    if (rc && !cJSON_IsNull(rc)) {
        if (!cJSON_IsString(rc)) {
            fail(r, "messages[%zu].reasoning_content must be a string", i);
            return;
        }
        size_t start, len;
        k3_py_strip(rc->valuestring, strlen(rc->valuestring), &start, &len);
        if (len) seg_n(r, rc->valuestring, strlen(rc->valuestring));
    }
    close_tag(r, "think");
}

static void assistant_message(rctx *r, const cJSON *m, bool thinking, size_t i) {
    const char *name = str_field(m, "name");
    const char *attrs[] = {"role", "assistant", name && *name ? "name" : NULL, name, NULL};
    open_tag(r, "message", attrs);
    if (thinking) think_block(r, m, i); /* thinking off drops history reasoning (§12.4) */
    open_tag(r, "response", NULL);
    content(r, cJSON_GetObjectItemCaseSensitive(m, "content"), i);
    close_tag(r, "response");
    tool_calls(r, cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), i);
    end_message(r);
}

/* The tool calls of the last assistant message, indexed once per message so that a long
 * run of tool results costs O(n log n), not a scan of the calls per result (issue 20, D1). */
typedef struct call_ref {
    const char *id; /* NULL when the call has no id string */
    int pos;        /* 1-based */
} call_ref;

typedef struct call_index {
    const cJSON *calls; /* what v and by_id were built from; NULL = not built */
    const cJSON **v;    /* [n] the calls in order */
    call_ref *by_id;    /* [n_id] sorted by (id, pos) */
    size_t n, n_id;
} call_index;

static int cmp_ref(const void *a, const void *b) {
    const call_ref *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    if (c) return c;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static void call_index_free(call_index *ci) {
    free(ci->v);
    free(ci->by_id);
    *ci = (call_index){0};
}

static int call_index_build(call_index *ci, const cJSON *calls) {
    if (ci->calls == calls && (ci->v || !calls)) return 0;
    call_index_free(ci);
    ci->calls = calls;
    size_t n = 0;
    if (cJSON_IsArray(calls))
        for (const cJSON *c = calls->child; c; c = c->next) n++;
    ci->v = malloc((n + 1) * sizeof *ci->v);
    ci->by_id = malloc((n + 1) * sizeof *ci->by_id);
    if (!ci->v || !ci->by_id) return -1;
    if (cJSON_IsArray(calls))
        for (const cJSON *c = calls->child; c; c = c->next) {
            const char *id = str_field(c, "id");
            if (id) ci->by_id[ci->n_id++] = (call_ref){id, (int)ci->n + 1};
            ci->v[ci->n++] = c;
        }
    qsort(ci->by_id, ci->n_id, sizeof *ci->by_id, cmp_ref);
    return 0;
}

/* 1-based position of the first call with this id, or 0. */
static int call_position(const call_index *ci, const char *id) {
    if (!id) return 0;
    size_t lo = 0, hi = ci->n_id; /* first entry with id >= the one asked for */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(ci->by_id[mid].id, id) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < ci->n_id && !strcmp(ci->by_id[lo].id, id) ? ci->by_id[lo].pos : 0;
}

typedef struct tool_result {
    const cJSON *m;
    size_t i;   /* index in messages */
    int pos;    /* matched call position, 0 if none */
} tool_result;

static int cmp_result(const void *a, const void *b) {
    const tool_result *x = a, *y = b;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i; /* stable */
}

/* Consecutive tool messages [i, j): reordered by their calls' positions when every id
 * resolves; index counts tool results since the last assistant message (§12.5). */
static void tool_run(rctx *r, const cJSON *start, size_t i, size_t j, call_index *ci,
                     int *index, size_t first) {
    tool_result *run = calloc(j - i, sizeof *run);
    if (!run || call_index_build(ci, ci->calls)) {
        free(run);
        r->rc = k3_fail(r->err, K3_ERR_GENERIC, "out of memory");
        return;
    }
    bool all = true;
    const cJSON *m = start;
    for (size_t k = i; k < j; k++, m = m->next) {
        run[k - i] = (tool_result){m, k, call_position(ci, str_field(m, "tool_call_id"))};
        all = all && run[k - i].pos > 0;
    }
    if (all) qsort(run, j - i, sizeof *run, cmp_result);
    for (size_t k = 0; k < j - i && !r->rc; k++) {
        int at = ++*index;
        const char *name = str_field(run[k].m, "tool");
        if (!name) name = str_field(run[k].m, "name");
        const cJSON *call = (size_t)at <= ci->n ? ci->v[at - 1] : NULL;
        if (!name && call) name = str_field(call_function(call), "name");
        if (!name) {
            fail(r, "messages[%zu]: a tool message needs \"tool\", \"name\" or a matching "
                 "preceding assistant tool call", run[k].i);
            break;
        }
        char idx[16];
        snprintf(idx, sizeof idx, "%d", at);
        bool emit = r->emit;
        r->emit = run[k].i >= first;
        const char *attrs[] = {"role", "tool", "tool", name, "index", idx, NULL};
        open_tag(r, "message", attrs);
        content(r, cJSON_GetObjectItemCaseSensitive(run[k].m, "content"), run[k].i);
        end_message(r);
        r->emit = emit;
    }
    free(run);
}

/* Walks the messages as the linked list they are (indexing a cJSON array is a scan). */
static void messages(rctx *r, const k3_chat_request *req, size_t first) {
    const cJSON *m = req->messages->child;
    call_index ci = {0};
    int tool_index = 0;
    for (size_t i = 0; m && !r->rc;) {
        if (req->cancelled && i % 256 == 0 && req->cancelled(req->cancel_arg)) {
            r->rc = k3_fail(r->err, K3_ERR_INTERRUPTED, "request: the client went away");
            break;
        }
        const char *role = str_field(m, "role");
        r->emit = i >= first;
        if (!role) {
            fail(r, "messages[%zu] has no \"role\" string", i);
        } else if (!strcmp(role, "tool")) {
            size_t j = i;
            const cJSON *end = m;
            while (end && (role = str_field(end, "role")) && !strcmp(role, "tool"))
                j++, end = end->next;
            tool_run(r, m, i, j, &ci, &tool_index, first);
            i = j;
            m = end;
            continue;
        } else if (!strcmp(role, "assistant")) {
            call_index_free(&ci);
            ci.calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            tool_index = 0;
            assistant_message(r, m, req->thinking, i);
        } else if (!strcmp(role, "system")) {
            const cJSON *tools = cJSON_GetObjectItemCaseSensitive(m, "tools");
            if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0)
                tool_declare(r, tools, true); /* its content is dropped (§12.2a) */
            else
                role_message(r, m, "system", i);
        } else if (!strcmp(role, "user")) {
            role_message(r, m, "user", i);
        } else {
            fail(r, "messages[%zu]: role \"%s\" is not one of system, user, assistant, tool",
                 i, role);
        }
        i++;
        m = m->next;
    }
    call_index_free(&ci);
    r->emit = true;
}

/* ---- request-level parts ----------------------------------------------------------------- */

static void response_format(rctx *r, const cJSON *rf) {
    const char *type = str_field(rf, "type");
    if (!strcmp(type, "json_object")) {
        internal_system(r, "response-format",
                        "The system is invoked with `response_format=json_object`.\n"
                        JSON_FORMAT_BODY);
        return;
    }
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!schema) schema = cJSON_GetObjectItemCaseSensitive(js, "json_schema");
    if (!schema) schema = js;
    k3_strbuf b = {0};
    k3_strbuf_puts(&b, "The system is invoked with `response_format=json_schema`.\n"
                     JSON_FORMAT_BODY "\nThe JSON data must match the following schema:\n"
                     "```json\n");
    k3_pyjson_dump(&b, schema, K3_PYJSON_COMPACT, true);
    k3_strbuf_puts(&b, "\n```");
    if (b.oom)
        r->rc = k3_fail(r->err, K3_ERR_GENERIC, "out of memory");
    else
        internal_system(r, "response-format", b.p);
    k3_strbuf_free(&b);
}

int k3_chat_render(const k3_chat_request *req, size_t first_message, k3_segments *out,
                   k3_err *err) {
    rctx r = {.out = out, .err = err, .emit = true, .budget = req->max_segments};
    if (first_message == 0 && !req->no_preamble) {
        if (req->tools) tool_declare(&r, req->tools, false);
        if (req->thinking) {
            char body[512];
            snprintf(body, sizeof body, EFFORT_BODY, req->effort);
            internal_system(&r, "thinking-effort", body);
        }
    }
    messages(&r, req, first_message);
    if (req->tool_choice && !strcmp(req->tool_choice, "required"))
        internal_system(&r, "tool-choice", "The system is invoked with `tool_choice=required`."
                        "\nYou MUST call tools in the next message.");
    else if (req->tool_choice)
        internal_system(&r, "tool-choice", "The system is invoked with `tool_choice=none`.\n"
                        "You MUST NOT call any tools in the next message.");
    if (req->response_format) response_format(&r, req->response_format);
    if (req->add_generation_prompt) {
        const char *attrs[] = {"role", "assistant", NULL};
        open_tag(&r, "message", attrs);
        open_tag(&r, req->thinking ? "think" : "response", NULL);
    }
    return r.rc;
}

/* ---- request parsing --------------------------------------------------------------------- */

static int bad(k3_err *err, const char *what) {
    return k3_fail(err, K3_ERR_INPUT, "request: %s", what);
}

static int parse_effort(const cJSON *body, k3_chat_request *req, k3_err *err) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(body, "thinking_effort");
    const char *key = "thinking_effort";
    if (!e || cJSON_IsNull(e)) {
        e = cJSON_GetObjectItemCaseSensitive(body, "reasoning_effort");
        key = "reasoning_effort";
    }
    if (!e || cJSON_IsNull(e)) return K3_OK;
    if (!cJSON_IsString(e)) return k3_fail(err, K3_ERR_INPUT, "request: %s must be a string", key);
    const char *v = e->valuestring;
    if (!strcmp(v, "none")) {
        req->thinking = false;
        return K3_OK;
    }
    if (strcmp(v, "low") && strcmp(v, "high") && strcmp(v, "max"))
        return k3_fail(err, K3_ERR_INPUT, "request: %s \"%s\" is not supported: use \"low\", "
                       "\"high\", \"max\" or \"none\" (K3's renderer has no \"medium\")", key, v);
    snprintf(req->effort, sizeof req->effort, "%s", v);
    return K3_OK;
}

static int parse_bool(const cJSON *body, const char *key, bool *out, k3_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, key);
    if (!v || cJSON_IsNull(v)) return K3_OK;
    if (!cJSON_IsBool(v)) return k3_fail(err, K3_ERR_INPUT, "request: %s must be true or false", key);
    *out = cJSON_IsTrue(v);
    return K3_OK;
}

static int parse_tool_choice(const cJSON *tc, k3_chat_request *req, k3_err *err) {
    if (!tc || cJSON_IsNull(tc)) return K3_OK;
    if (cJSON_IsObject(tc))
        return bad(err, "a named tool_choice ({\"type\": \"function\", ...}) is not supported: "
                   "its K3 rendering is unverified; use \"auto\", \"required\" or \"none\"");
    if (!cJSON_IsString(tc) || (strcmp(tc->valuestring, "auto") &&
                                strcmp(tc->valuestring, "required") &&
                                strcmp(tc->valuestring, "none")))
        return bad(err, "tool_choice must be \"auto\", \"required\" or \"none\"");
    if (strcmp(tc->valuestring, "auto")) req->tool_choice = tc->valuestring;
    return K3_OK;
}

static int parse_response_format(const cJSON *rf, k3_chat_request *req, k3_err *err) {
    if (!rf || cJSON_IsNull(rf)) return K3_OK;
    const char *type = str_field(rf, "type");
    if (!cJSON_IsObject(rf) || !type)
        return bad(err, "response_format must be an object with a \"type\" string");
    if (!strcmp(type, "text")) return K3_OK;
    if (!strcmp(type, "json_schema") &&
        !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(rf, "json_schema")))
        return bad(err, "response_format json_schema needs a \"json_schema\" object");
    if (strcmp(type, "json_object") && strcmp(type, "json_schema"))
        return bad(err, "response_format type must be \"text\", \"json_object\" or "
                   "\"json_schema\"");
    req->response_format = rf;
    return K3_OK;
}

int k3_chat_request_parse(const cJSON *body, k3_chat_request *req, k3_err *err) {
    *req = (k3_chat_request){.thinking = true, .effort = "max", .add_generation_prompt = true};
    if (!cJSON_IsObject(body)) return bad(err, "the body must be a JSON object");
    req->messages = cJSON_GetObjectItemCaseSensitive(body, "messages");
    if (!cJSON_IsArray(req->messages)) return bad(err, "\"messages\" must be an array");
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
    if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools))
        return bad(err, "\"tools\" must be an array");
    if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0) req->tools = tools;
    int rc = parse_bool(body, "thinking", &req->thinking, err);
    if (!rc) rc = parse_bool(body, "add_generation_prompt", &req->add_generation_prompt, err);
    if (!rc) rc = parse_effort(body, req, err);
    if (!rc) rc = parse_tool_choice(cJSON_GetObjectItemCaseSensitive(body, "tool_choice"), req, err);
    if (!rc)
        rc = parse_response_format(cJSON_GetObjectItemCaseSensitive(body, "response_format"),
                                   req, err);
    return rc;
}

int k3_chat_render_json(const char *json, size_t len, k3_segments *out, k3_err *err) {
    cJSON *body = cJSON_ParseWithLength(json, len);
    if (!body) return bad(err, "the body is not valid JSON");
    k3_chat_request req;
    int rc = k3_chat_request_parse(body, &req, err);
    if (!rc) rc = k3_chat_render(&req, 0, out, err);
    cJSON_Delete(body);
    return rc;
}
