/* conv.c — a conversation kept in step with a session's state (see conv.h). */
#include "conv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "render.h"
#include "toolcall.h"

/* ---- id lists ------------------------------------------------------------------------------ */

static int ids_append(k3_id_list *l, const int32_t *v, size_t n, k3_err *err) {
    if (l->n + n > l->cap) {
        size_t cap = l->cap ? l->cap : 256;
        while (cap < l->n + n) cap *= 2;
        int32_t *p = realloc(l->v, cap * sizeof *p);
        if (!p) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
        l->v = p;
        l->cap = cap;
    }
    if (n) memcpy(l->v + l->n, v, n * sizeof *v);
    l->n += n;
    return K3_OK;
}

/* ---- lifetime and settings ----------------------------------------------------------------- */

int k3_conv_init(k3_conv *c, const k3_tokenizer *t, k3_err *err) {
    *c = (k3_conv){.tok = t, .thinking = true, .effort = "max"};
    if (!(c->messages = cJSON_CreateArray())) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    return K3_OK;
}

void k3_conv_free(k3_conv *c) {
    cJSON_Delete(c->messages);
    cJSON_Delete(c->tools);
    free(c->committed.v);
    free(c->closing.v);
    free(c->prompt.v);
    *c = (k3_conv){0};
}

/* Drops the ids: the next prompt renders every message from scratch. */
static void forget_ids(k3_conv *c) {
    c->committed.n = c->closing.n = 0;
    c->rendered = 0;
    c->no_preamble = false;
}

void k3_conv_reset(k3_conv *c) {
    while (cJSON_GetArraySize(c->messages) > 0) cJSON_DeleteItemFromArray(c->messages, 0);
    forget_ids(c);
}

void k3_conv_set_thinking(k3_conv *c, bool on) {
    if (c->thinking != on) forget_ids(c);
    c->thinking = on;
}

int k3_conv_set_effort(k3_conv *c, const char *effort, k3_err *err) {
    if (strcmp(effort, "low") && strcmp(effort, "high") && strcmp(effort, "max"))
        return k3_fail(err, K3_ERR_USAGE, "effort '%s': expected low, high or max", effort);
    if (strcmp(c->effort, effort)) forget_ids(c);
    snprintf(c->effort, sizeof c->effort, "%s", effort);
    return K3_OK;
}

int k3_conv_set_tools(k3_conv *c, const cJSON *tools, k3_err *err) {
    if (tools && (!cJSON_IsArray(tools) || !cJSON_GetArraySize(tools)))
        return k3_fail(err, K3_ERR_INPUT, "tools must be a non-empty JSON array of "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(f, "name")))
            return k3_fail(err, K3_ERR_INPUT, "tools[%d]: needs \"function\": {\"name\": "
                           "\"...\", \"parameters\": {JSON Schema}}", i);
        i++;
    }
    cJSON *copy = tools ? cJSON_Duplicate(tools, 1) : NULL;
    if (tools && !copy) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    cJSON_Delete(c->tools);
    c->tools = copy;
    forget_ids(c);
    return K3_OK;
}

int k3_conv_pending_tools(const k3_conv *c) {
    int answered = 0;
    for (const cJSON *m = c->messages->child ? c->messages->child->prev : NULL; m;
         m = m == c->messages->child ? NULL : m->prev) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "tool")) {
            answered++;
            continue;
        }
        if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant")) return 0;
        int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(m, "tool_calls"));
        return n > answered ? n - answered : 0;
    }
    return 0;
}

/* ---- messages ------------------------------------------------------------------------------ */

int k3_conv_add(k3_conv *c, const char *role, const char *text, k3_err *err) {
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", role) ||
        !cJSON_AddStringToObject(m, "content", text)) {
        cJSON_Delete(m);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    }
    cJSON_AddItemToArray(c->messages, m);
    return K3_OK;
}

void k3_conv_pop(k3_conv *c) {
    int n = cJSON_GetArraySize(c->messages);
    if (n > 0 && (size_t)n > c->rendered) cJSON_DeleteItemFromArray(c->messages, n - 1);
}

int k3_conv_set_history(k3_conv *c, const int32_t *ids, size_t n, k3_err *err) {
    k3_conv_reset(c);
    c->no_preamble = n > 0;
    return ids_append(&c->committed, ids, n, err);
}

/* ---- prompts and replies ------------------------------------------------------------------- */

int k3_conv_prompt(k3_conv *c, k3_err *err) {
    k3_chat_request req = {.messages = c->messages, .thinking = c->thinking,
                           .add_generation_prompt = true, .no_preamble = c->no_preamble,
                           .tools = c->tools};
    snprintf(req.effort, sizeof req.effort, "%s", c->effort);
    k3_segments segs = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = k3_chat_render(&req, c->rendered, &segs, err);
    if (!rc) rc = k3_segments_encode(c->tok, &segs, &ids, &n, err);
    k3_segments_free(&segs);
    c->prompt.n = 0;
    if (!rc) rc = ids_append(&c->prompt, c->committed.v, c->committed.n, err);
    if (!rc) rc = ids_append(&c->prompt, c->closing.v, c->closing.n, err);
    if (!rc) rc = ids_append(&c->prompt, ids, n, err);
    free(ids);
    return rc;
}

/* With tools declared: the reply's complete calls as m's tool_calls (a malformed or cut
 * block's text stays in the history's ids; the message keeps the calls before it). */
static int add_tool_calls(const k3_conv *c, cJSON *m, const int32_t *ids, size_t n,
                          const k3_stops *stops, k3_err *err) {
    k3_toolcall_parser tc;
    int has = k3_toolcall_parse_reply(c->tok, stops, c->thinking, ids, n, &tc);
    cJSON *calls = has > 0 && tc.n_calls ? cJSON_AddArrayToObject(m, "tool_calls") : NULL;
    int at = cJSON_GetArraySize(c->messages);
    for (size_t k = 0; calls && k < tc.n_calls; k++) {
        char id[48];
        snprintf(id, sizeof id, "call_%d_%zu", at, k + 1);
        cJSON *call = cJSON_CreateObject(), *f = cJSON_CreateObject();
        cJSON_AddStringToObject(call, "id", id);
        cJSON_AddStringToObject(call, "type", "function");
        cJSON_AddStringToObject(f, "name", tc.calls[k].name);
        cJSON_AddStringToObject(f, "arguments", tc.calls[k].arguments.p);
        cJSON_AddItemToObject(call, "function", f);
        cJSON_AddItemToArray(calls, call);
    }
    k3_toolcall_parser_free(&tc);
    return has < 0 ? k3_fail(err, K3_ERR_GENERIC, "out of memory") : K3_OK;
}

int k3_conv_commit(k3_conv *c, const int32_t *generated, size_t n, const k3_reply_parser *p,
                   k3_err *err) {
    int32_t *closing = NULL;
    size_t n_closing = 0;
    int rc = k3_reply_parser_closing(p, &closing, &n_closing, err);
    cJSON *m = rc ? NULL : cJSON_CreateObject();
    const char *content = p->text[K3_CH_RESPONSE].p, *reasoning = p->text[K3_CH_THINK].p;
    if (!rc && (!m || !cJSON_AddStringToObject(m, "role", "assistant") ||
                !cJSON_AddStringToObject(m, "content", content ? content : "") ||
                (c->thinking &&
                 !cJSON_AddStringToObject(m, "reasoning_content", reasoning ? reasoning : ""))))
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    if (!rc && c->tools) rc = add_tool_calls(c, m, generated, n, &p->stops, err);
    k3_id_list committed = {0};
    if (!rc) rc = ids_append(&committed, c->prompt.v, c->prompt.n, err);
    if (!rc) rc = ids_append(&committed, generated, n, err);
    if (rc) {
        cJSON_Delete(m);
        free(closing);
        free(committed.v);
        return rc;
    }
    cJSON_AddItemToArray(c->messages, m);
    free(c->committed.v);
    c->committed = committed;
    c->closing.n = 0;
    rc = ids_append(&c->closing, closing, n_closing, err);
    free(closing);
    c->rendered = (size_t)cJSON_GetArraySize(c->messages);
    return rc;
}

int k3_conv_history(k3_conv *c, const int32_t **ids, size_t *n, k3_err *err) {
    c->prompt.n = 0;
    int rc = ids_append(&c->prompt, c->committed.v, c->committed.n, err);
    if (!rc) rc = ids_append(&c->prompt, c->closing.v, c->closing.n, err);
    *ids = c->prompt.v;
    *n = c->prompt.n;
    return rc;
}

/* ---- /save and /load ----------------------------------------------------------------------- */

char *k3_conv_to_json(const k3_conv *c) {
    cJSON *body = cJSON_CreateObject();
    if (!body) return NULL;
    cJSON_AddItemToObject(body, "messages", cJSON_Duplicate(c->messages, 1));
    if (c->tools) cJSON_AddItemToObject(body, "tools", cJSON_Duplicate(c->tools, 1));
    cJSON_AddBoolToObject(body, "thinking", c->thinking);
    cJSON_AddStringToObject(body, "reasoning_effort", c->effort);
    char *s = cJSON_Print(body);
    cJSON_Delete(body);
    return s;
}

int k3_conv_from_json(k3_conv *c, const char *json, size_t len, k3_err *err) {
    cJSON *body = cJSON_ParseWithLength(json, len);
    if (!body) return k3_fail(err, K3_ERR_INPUT, "not valid JSON");
    k3_chat_request req;
    k3_segments segs = {0};
    int rc = k3_chat_request_parse(body, &req, err);
    if (!rc) rc = k3_chat_render(&req, 0, &segs, err); /* refuse what would not render */
    k3_segments_free(&segs);
    if (!rc) {
        cJSON *msgs = cJSON_DetachItemFromObjectCaseSensitive(body, "messages");
        cJSON_Delete(c->messages);
        c->messages = msgs;
        c->thinking = req.thinking;
        snprintf(c->effort, sizeof c->effort, "%s", req.effort);
        cJSON_Delete(c->tools);
        c->tools = req.tools ? cJSON_DetachItemFromObjectCaseSensitive(body, "tools") : NULL;
        forget_ids(c);
    }
    cJSON_Delete(body);
    return rc;
}
