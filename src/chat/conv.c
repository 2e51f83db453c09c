/* conv.c — a conversation kept in step with a session's state (see conv.h). */
#include "conv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "render.h"

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
                           .add_generation_prompt = true, .no_preamble = c->no_preamble};
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

int k3_conv_commit(k3_conv *c, const int32_t *generated, size_t n, const k3_reply_parser *p,
                   k3_err *err) {
    int32_t *closing = NULL;
    size_t n_closing = 0;
    int rc = k3_reply_parser_closing(p, &closing, &n_closing, err);
    cJSON *m = rc ? NULL : cJSON_CreateObject();
    const char *content = p->text[K3_CH_RESPONSE].p, *reasoning = p->text[K3_CH_THINK].p;
    /* Tool-call text (K3_CH_TOOLS) is not parsed back into tool_calls: the REPL and
     * `k3 run --chat` declare no tools. */
    if (!rc && (!m || !cJSON_AddStringToObject(m, "role", "assistant") ||
                !cJSON_AddStringToObject(m, "content", content ? content : "") ||
                (c->thinking &&
                 !cJSON_AddStringToObject(m, "reasoning_content", reasoning ? reasoning : ""))))
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
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
        forget_ids(c);
    }
    cJSON_Delete(body);
    return rc;
}
