/* responses.c — the Responses API over the chat pipeline (responses.h). */
#include "responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define INVALID "invalid_request_error"

/* ---- the store ---------------------------------------------------------------------------- */

void k3_resp_store_init(k3_resp_store *st) {
    memset(st, 0, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
}

void k3_resp_store_free(k3_resp_store *st) {
    for (int i = 0; i < K3_RESP_STORE_MAX; i++) free(st->id[i]), free(st->items[i]);
    pthread_mutex_destroy(&st->mu);
}

/* The items of response id, parsed, or NULL. */
static cJSON *store_get(k3_resp_store *st, const char *id) {
    cJSON *v = NULL;
    pthread_mutex_lock(&st->mu);
    for (int i = 0; i < K3_RESP_STORE_MAX && !v; i++)
        if (st->id[i] && !strcmp(st->id[i], id)) v = cJSON_Parse(st->items[i]);
    pthread_mutex_unlock(&st->mu);
    return v;
}

/* Takes items (malloc'd); the oldest entry makes room. */
static void store_put(k3_resp_store *st, const char *id, char *items) {
    char *copy = strdup(id);
    if (!copy || !items) {
        free(copy);
        free(items);
        return;
    }
    pthread_mutex_lock(&st->mu);
    free(st->id[st->next]);
    free(st->items[st->next]);
    st->id[st->next] = copy;
    st->items[st->next] = items;
    st->next = (st->next + 1) % K3_RESP_STORE_MAX;
    pthread_mutex_unlock(&st->mu);
}

/* ---- request translation ------------------------------------------------------------------ */

static cJSON *message(cJSON *msgs, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    if (content) cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
    return m;
}

/* The text of a message's content (a string or text parts) into b. */
static int content_text(const cJSON *c, const char *at, k3_sbuf *b, k3_api_error *e) {
    if (cJSON_IsString(c)) {
        k3_sbuf_str(b, c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c)) return k3_api_wrong(e, at, "a string or an array of content parts");
    int k = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        char p[160];
        snprintf(p, sizeof p, "%s[%d].type", at, k++);
        const char *type = k3_json_str(part, "type"), *text = k3_json_str(part, "text");
        if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text") &&
                      strcmp(type, "text") && strcmp(type, "summary_text") &&
                      strcmp(type, "reasoning_text")))
            return k3_api_unsupported(e, p, "k3 reads text parts only (input_text, output_text)");
        if (!text) return k3_api_wrong(e, p, "a text part with a \"text\" string");
        k3_sbuf_str(b, text);
    }
    return 0;
}

/* A tool output: a string, or parts whose text is joined (others as their JSON). */
static int output_text(const cJSON *c, const char *at, k3_sbuf *b, k3_api_error *e) {
    if (cJSON_IsString(c)) return k3_sbuf_str(b, c->valuestring), 0;
    if (!cJSON_IsArray(c)) return k3_api_wrong(e, at, "a string or an array of content parts");
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const char *text = k3_json_str(part, "text");
        if (text) {
            k3_sbuf_str(b, text);
            continue;
        }
        char *json = cJSON_PrintUnformatted(part);
        if (!json) return k3_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        k3_sbuf_str(b, json);
        free(json);
    }
    return 0;
}

typedef struct conv {
    cJSON *msgs;       /* chat messages being built */
    cJSON *assistant;  /* the last assistant message while tool calls may still join it */
    k3_sbuf reasoning; /* reasoning items waiting for their assistant message */
} conv;

static cJSON *assistant_for(conv *cv) {
    if (!cv->assistant) {
        cv->assistant = message(cv->msgs, "assistant", "");
        if (cv->reasoning.len) {
            k3_sbuf_add(&cv->reasoning, "", 0);
            cJSON_AddStringToObject(cv->assistant, "reasoning_content", cv->reasoning.p);
            cv->reasoning.len = 0;
        }
    }
    return cv->assistant;
}

static void add_call(conv *cv, const char *id, const char *name, const char *args) {
    cJSON *a = assistant_for(cv);
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(a, "tool_calls");
    if (!calls) calls = cJSON_AddArrayToObject(a, "tool_calls");
    cJSON *call = cJSON_CreateObject(), *f = cJSON_CreateObject();
    cJSON_AddStringToObject(call, "id", id);
    cJSON_AddStringToObject(call, "type", "function");
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", args);
    cJSON_AddItemToObject(call, "function", f);
    cJSON_AddItemToArray(calls, call);
}

static int one_item(conv *cv, const cJSON *it, int i, k3_api_error *e) {
    char at[96];
    snprintf(at, sizeof at, "input[%d]", i);
    if (!cJSON_IsObject(it)) return k3_api_wrong(e, at, "an object");
    const char *type = k3_json_str(it, "type");
    const char *role = k3_json_str(it, "role");
    if (!type && role) type = "message"; /* EasyInputMessage: {role, content} */
    if (!type) return k3_api_wrong(e, at, "an item with a \"type\"");
    if (!strcmp(type, "message")) {
        snprintf(at, sizeof at, "input[%d].role", i);
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") &&
                      strcmp(role, "system") && strcmp(role, "developer")))
            return k3_api_wrong(e, at, "\"user\", \"assistant\", \"system\" or \"developer\"");
        snprintf(at, sizeof at, "input[%d].content", i);
        k3_sbuf b = {0};
        int rc = content_text(cJSON_GetObjectItemCaseSensitive(it, "content"), at, &b, e);
        k3_sbuf_add(&b, "", 0);
        if (!rc && !strcmp(role, "assistant")) {
            cv->assistant = NULL; /* a message starts a new assistant turn */
            cJSON *a = assistant_for(cv);
            cJSON_ReplaceItemInObjectCaseSensitive(a, "content", cJSON_CreateString(b.p));
        } else if (!rc) {
            cv->assistant = NULL;
            message(cv->msgs, !strcmp(role, "developer") ? "system" : role, b.p);
        }
        k3_sbuf_free(&b);
        return rc;
    }
    if (!strcmp(type, "reasoning")) { /* K3's thinking: our reasoning_text, else the summary */
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        snprintf(at, sizeof at, "input[%d].content", i);
        if (!cJSON_IsArray(c) || !c->child) {
            c = cJSON_GetObjectItemCaseSensitive(it, "summary");
            snprintf(at, sizeof at, "input[%d].summary", i);
        }
        cv->assistant = NULL;
        return c && !cJSON_IsNull(c) ? content_text(c, at, &cv->reasoning, e) : 0;
    }
    bool custom = !strcmp(type, "custom_tool_call");
    if (custom || !strcmp(type, "function_call")) {
        const char *id = k3_json_str(it, "call_id"), *name = k3_json_str(it, "name");
        const char *args = k3_json_str(it, custom ? "input" : "arguments");
        if (!id || !name || !args)
            return k3_api_wrong(e, at, custom ? "a custom_tool_call with call_id, name and input"
                                       : "a function_call with call_id, name and arguments");
        if (!custom) return add_call(cv, id, name, args), 0;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "input", args);
        char *json = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!json) return k3_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        add_call(cv, id, name, json);
        free(json);
        return 0;
    }
    if (!strcmp(type, "function_call_output") || !strcmp(type, "custom_tool_call_output")) {
        const char *id = k3_json_str(it, "call_id");
        if (!id) return k3_api_wrong(e, at, "an output item with a \"call_id\"");
        snprintf(at, sizeof at, "input[%d].output", i);
        k3_sbuf b = {0};
        int rc = output_text(cJSON_GetObjectItemCaseSensitive(it, "output"), at, &b, e);
        k3_sbuf_add(&b, "", 0);
        if (!rc) cJSON_AddStringToObject(message(cv->msgs, "tool", b.p), "tool_call_id", id);
        k3_sbuf_free(&b);
        cv->assistant = NULL;
        return rc;
    }
    snprintf(at, sizeof at, "input[%d].type", i);
    return k3_api_unsupported(e, at, "k3 reads message, reasoning, function_call, custom_tool_call and "
                       "their output items");
}

/* input (string or items), after the stored items of previous_response_id, into chat
 * messages; *items gets the whole conversation as Responses items (for the store). */
static int input(const cJSON *body, k3_resp_store *store, cJSON *msgs, char **items,
                 k3_api_error *e) {
    cJSON *all = NULL;
    const char *prev = k3_json_str(body, "previous_response_id");
    const cJSON *pv = cJSON_GetObjectItemCaseSensitive(body, "previous_response_id");
    if (pv && !cJSON_IsNull(pv) && !prev) return k3_api_wrong(e, "previous_response_id", "a string");
    if (prev && !(all = store_get(store, prev)))
        return k3_api_fail(e, 400, INVALID, "previous_response_not_found", "previous_response_id",
                           "Previous response with id '%s' not found: k3 keeps the last %d "
                           "responses in memory only (send the whole conversation as input "
                           "instead)", prev, K3_RESP_STORE_MAX);
    if (!all) all = cJSON_CreateArray();
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(body, "input");
    if (cJSON_IsString(in)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "type", "message");
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", in->valuestring);
        cJSON_AddItemToArray(all, m);
    } else if (cJSON_IsArray(in)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, in) cJSON_AddItemToArray(all, cJSON_Duplicate(it, 1));
    } else if (in && !cJSON_IsNull(in)) {
        cJSON_Delete(all);
        return k3_api_wrong(e, "input", "a string or an array of items");
    }
    if (!all->child) {
        cJSON_Delete(all);
        return k3_api_fail(e, 400, INVALID, NULL, "input", "'input' is required");
    }
    conv cv = {.msgs = msgs};
    int i = 0, rc = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, all) if ((rc = one_item(&cv, it, i++, e))) break;
    k3_sbuf_free(&cv.reasoning);
    *items = rc ? NULL : cJSON_PrintUnformatted(all);
    cJSON_Delete(all);
    return rc;
}

/* A custom (freeform) tool as a function with one string argument. */
static cJSON *custom_function(const cJSON *t) {
    k3_sbuf d = {0};
    const char *desc = k3_json_str(t, "description");
    if (desc) k3_sbuf_str(&d, desc);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(t, "format");
    const char *def = k3_json_str(fmt, "definition"), *syntax = k3_json_str(fmt, "syntax");
    if (def) k3_sbuf_printf(&d, "%sThe input must follow this %s grammar:\n%s",
                            d.len ? "\n\n" : "", syntax ? syntax : "", def);
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "name", k3_json_str(t, "name"));
    if (d.len) k3_sbuf_add(&d, "", 0), cJSON_AddStringToObject(f, "description", d.p);
    k3_sbuf_free(&d);
    cJSON *params = cJSON_AddObjectToObject(f, "parameters");
    cJSON_AddStringToObject(params, "type", "object");
    cJSON *in = cJSON_AddObjectToObject(cJSON_AddObjectToObject(params, "properties"), "input");
    cJSON_AddStringToObject(in, "type", "string");
    cJSON_AddStringToObject(in, "description", "the raw input of the tool");
    cJSON *req = cJSON_AddArrayToObject(params, "required");
    cJSON_AddItemToArray(req, cJSON_CreateString("input"));
    return f;
}

static int tool_list(const cJSON *in, const char *at0, cJSON *arr, k3_resp_job *r,
                     k3_api_error *e) {
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, in) {
        char at[96];
        snprintf(at, sizeof at, "%s[%d]", at0, i++);
        const char *type = k3_json_str(t, "type"), *name = k3_json_str(t, "name");
        if (!cJSON_IsObject(t) || !type) return k3_api_wrong(e, at, "a tool object with a \"type\"");
        cJSON *f = NULL;
        if (!strcmp(type, "namespace")) {
            const cJSON *sub = cJSON_GetObjectItemCaseSensitive(t, "tools");
            snprintf(at + strlen(at), sizeof at - strlen(at), ".tools");
            if (!cJSON_IsArray(sub)) return k3_api_wrong(e, at, "an array");
            if (tool_list(sub, at, arr, r, e)) return -1;
            continue;
        }
        if (strcmp(type, "function") && strcmp(type, "custom")) {
            snprintf(r->note, sizeof r->note, "; hosted tool '%.40s' (%.60s) not offered to the "
                     "model", type, at);
            continue;
        }
        if (!name || !name[0]) return k3_api_wrong(e, at, "a tool with a non-empty \"name\"");
        if (!strcmp(type, "custom")) {
            char **c = realloc(r->custom, (size_t)(r->n_custom + 1) * sizeof *c);
            if (!c || !(c[r->n_custom] = strdup(name)))
                return k3_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            r->custom = c;
            r->n_custom++;
            f = custom_function(t);
        } else {
            f = cJSON_CreateObject();
            cJSON_AddStringToObject(f, "name", name);
            if (k3_json_str(t, "description"))
                cJSON_AddStringToObject(f, "description", k3_json_str(t, "description"));
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(t, "parameters");
            if (p && !cJSON_IsNull(p)) cJSON_AddItemToObject(f, "parameters", cJSON_Duplicate(p, 1));
        }
        cJSON *tool = cJSON_CreateObject();
        cJSON_AddStringToObject(tool, "type", "function");
        cJSON_AddItemToObject(tool, "function", f);
        cJSON_AddItemToArray(arr, tool);
    }
    return 0;
}

static int reasoning(const cJSON *v, cJSON *out, k3_api_error *e) {
    if (!cJSON_IsObject(v)) return k3_api_wrong(e, "reasoning", "an object");
    const cJSON *f;
    cJSON_ArrayForEach(f, v) {
        char p[64];
        snprintf(p, sizeof p, "reasoning.%s", f->string);
        if (strcmp(f->string, "effort") && strcmp(f->string, "summary") &&
            strcmp(f->string, "generate_summary"))
            return k3_api_unsupported(e, p, "unknown field");
    }
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(v, "effort");
    if (!ev || cJSON_IsNull(ev)) return 0;
    const char *s = cJSON_IsString(ev) ? ev->valuestring : "";
    /* K3 has low, high, max (spec §12.2); medium is mapped by the chat validator */
    const char *k3 = !strcmp(s, "none") ? "none" : !strcmp(s, "minimal") || !strcmp(s, "low")
                   ? "low" : !strcmp(s, "medium") ? "medium" : !strcmp(s, "high") ? "high"
                   : !strcmp(s, "xhigh") ? "max" : NULL;
    if (!k3) return k3_api_wrong(e, "reasoning.effort", "none, minimal, low, medium, high or xhigh");
    cJSON_AddStringToObject(out, "reasoning_effort", k3);
    return 0;
}

static int text_param(const cJSON *v, k3_api_error *e) {
    if (!cJSON_IsObject(v)) return k3_api_wrong(e, "text", "an object");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(v, "format");
    const char *type = k3_json_str(fmt, "type");
    if (fmt && !cJSON_IsNull(fmt) && (!type || strcmp(type, "text")))
        return k3_api_unsupported(e, "text.format", "k3 cannot constrain output to JSON; only "
                           "{\"type\": \"text\"}");
    return 0;
}

static const char *const hints[] = {"model", "store", "include", "metadata", "client_metadata",
                                    "prompt_cache_key", "safety_identifier", "user",
                                    "service_tier", "truncation", "stream_options",
                                    "prompt_cache_retention", NULL};

static bool is_hint(const char *k) {
    for (int i = 0; hints[i]; i++)
        if (!strcmp(hints[i], k)) return true;
    return false;
}

/* Fields copied to the chat body under a name the chat validator checks. */
static const char *const copied[][2] = {{"max_output_tokens", "max_tokens"},
    {"temperature", "temperature"}, {"top_p", "top_p"}, {"stream", "stream"},
    {"parallel_tool_calls", "parallel_tool_calls"}, {"tool_choice", "tool_choice"},
    {"top_logprobs", "top_logprobs"}};

static int top_fields(const cJSON *body, k3_api_error *e) {
    static const char *const handled[] = {"input", "instructions", "previous_response_id",
                                          "tools", "reasoning", "text", NULL};
    const cJSON *f;
    cJSON_ArrayForEach(f, body) {
        bool ok = is_hint(f->string);
        for (int k = 0; handled[k] && !ok; k++) ok = !strcmp(f->string, handled[k]);
        for (size_t k = 0; k < sizeof copied / sizeof *copied && !ok; k++)
            ok = !strcmp(f->string, copied[k][0]);
        if (!ok)
            return k3_api_fail(e, 400, INVALID, "unsupported_parameter", f->string,
                               "Unsupported parameter: '%s' (k3 does not support it)", f->string);
    }
    const cJSON *bg = cJSON_GetObjectItemCaseSensitive(body, "background");
    if (cJSON_IsTrue(bg)) return k3_api_unsupported(e, "background", "k3 answers in the request");
    return 0;
}

/* Request fields echoed in the Response object. */
static char *echo_of(const cJSON *body) {
    cJSON *o = cJSON_CreateObject();
    static const char *const keys[] = {"instructions", "max_output_tokens", "metadata",
                                       "previous_response_id", "temperature", "top_p",
                                       "tool_choice", "tools", "parallel_tool_calls", "reasoning",
                                       "store", "text", "truncation", "user", NULL};
    for (int i = 0; keys[i]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, keys[i]);
        cJSON_AddItemToObject(o, keys[i], v ? cJSON_Duplicate(v, 1) : cJSON_CreateNull());
    }
    if (cJSON_IsNull(cJSON_GetObjectItem(o, "tools")))
        cJSON_ReplaceItemInObject(o, "tools", cJSON_CreateArray());
    if (cJSON_IsNull(cJSON_GetObjectItem(o, "metadata")))
        cJSON_ReplaceItemInObject(o, "metadata", cJSON_CreateObject());
    if (cJSON_IsNull(cJSON_GetObjectItem(o, "tool_choice")))
        cJSON_ReplaceItemInObject(o, "tool_choice", cJSON_CreateString("auto"));
    if (cJSON_IsNull(cJSON_GetObjectItem(o, "parallel_tool_calls")))
        cJSON_ReplaceItemInObject(o, "parallel_tool_calls", cJSON_CreateTrue());
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) return NULL;
    size_t n = strlen(s); /* the members without the braces */
    memmove(s, s + 1, n - 2);
    s[n - 2] = 0;
    return s;
}

cJSON *k3_resp_to_chat(const cJSON *body, k3_resp_store *store, k3_resp_job **out,
                       k3_api_error *e) {
    *out = NULL;
    if (!cJSON_IsObject(body)) {
        k3_api_wrong(e, "body", "a JSON object");
        return NULL;
    }
    if (top_fields(body, e)) return NULL;
    k3_resp_job *r = calloc(1, sizeof *r);
    cJSON *chat = cJSON_CreateObject();
    if (!r || !chat) {
        free(r);
        cJSON_Delete(chat);
        k3_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    r->open = -1;
    r->store = true;
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    int rc = 0;
    const cJSON *ins = cJSON_GetObjectItemCaseSensitive(body, "instructions");
    if (cJSON_IsString(ins) && ins->valuestring[0]) message(msgs, "system", ins->valuestring);
    else if (ins && !cJSON_IsNull(ins) && !cJSON_IsString(ins))
        rc = k3_api_wrong(e, "instructions", "a string");
    if (!rc) rc = input(body, store, msgs, &r->input_items, e);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, "tools");
    if (!rc && v && !cJSON_IsNull(v)) {
        if (!cJSON_IsArray(v)) rc = k3_api_wrong(e, "tools", "an array");
        else rc = tool_list(v, "tools", cJSON_AddArrayToObject(chat, "tools"), r, e);
    }
    v = cJSON_GetObjectItemCaseSensitive(body, "reasoning");
    if (!rc && v && !cJSON_IsNull(v)) rc = reasoning(v, chat, e);
    v = cJSON_GetObjectItemCaseSensitive(body, "text");
    if (!rc && v && !cJSON_IsNull(v)) rc = text_param(v, e);
    for (size_t k = 0; k < sizeof copied / sizeof *copied && !rc; k++) {
        v = cJSON_GetObjectItemCaseSensitive(body, copied[k][0]);
        if (v) cJSON_AddItemToObject(chat, copied[k][1], cJSON_Duplicate(v, 1));
    }
    if (!rc && !(r->echo = echo_of(body)))
        rc = k3_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (rc) {
        cJSON_Delete(chat);
        k3_resp_job_free(r);
        return NULL;
    }
    *out = r;
    return chat;
}

void k3_resp_job_free(k3_resp_job *r) {
    if (!r) return;
    free(r->echo);
    free(r->input_items);
    for (int i = 0; i < r->n_custom; i++) free(r->custom[i]);
    free(r->custom);
    k3_sbuf_free(&r->text);
    k3_sbuf_free(&r->items);
    free(r->final);
    free(r);
}

/* ---- the Response object ------------------------------------------------------------------ */

static void usage(k3_sbuf *b, const k3_job *j) {
    k3_sbuf_printf(b, "{\"input_tokens\":%d,\"input_tokens_details\":{\"cached_tokens\":%d},"
                   "\"output_tokens\":%d,\"output_tokens_details\":{\"reasoning_tokens\":%d},"
                   "\"total_tokens\":%d}", j->n_prompt_used, j->n_cached, j->n_completion,
                   j->n_reasoning, j->n_prompt_used + j->n_completion);
}

/* The Response with status, its output items and usage (NULL = in progress, no usage). */
static void response(k3_sbuf *b, const k3_resp_job *r, const struct k3_server *s,
                     const k3_job *j, const char *status) {
    k3_sbuf_printf(b, "{\"id\":\"%s\",\"object\":\"response\",\"created_at\":%lld,"
                   "\"status\":\"%s\",\"model\":\"", r->id, j->created, status);
    k3_sbuf_json_str(b, s->model_id, strlen(s->model_id));
    k3_sbuf_printf(b, "\",\"output\":[%s],", strcmp(status, "in_progress") && r->items.p
                   ? r->items.p : "");
    if (!strcmp(status, "incomplete"))
        k3_sbuf_str(b, "\"incomplete_details\":{\"reason\":\"max_output_tokens\"},");
    else k3_sbuf_str(b, "\"incomplete_details\":null,");
    if (!strcmp(status, "failed")) {
        k3_sbuf_str(b, "\"error\":{\"code\":\"server_error\",\"message\":\"");
        k3_sbuf_json_str(b, j->err.message, strlen(j->err.message));
        k3_sbuf_str(b, "\"},");
    } else {
        k3_sbuf_str(b, "\"error\":null,");
    }
    k3_sbuf_str(b, r->echo);
    k3_sbuf_str(b, ",\"usage\":");
    if (!strcmp(status, "in_progress") || !strcmp(status, "failed")) k3_sbuf_str(b, "null");
    else usage(b, j);
    k3_sbuf_str(b, "}");
}

/* `event: NAME\ndata: {"type":NAME,"sequence_number":N` — the caller adds the rest. */
static void event(k3_resp_job *r, k3_sbuf *ev, const char *name) {
    k3_sbuf_printf(ev, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%d", name, name,
                   r->seq++);
}

/* The output_item.done event of output item idx (its JSON in item). */
static void item_done(k3_resp_job *r, k3_sbuf *ev, int idx, const k3_sbuf *item) {
    event(r, ev, "response.output_item.done");
    k3_sbuf_printf(ev, ",\"output_index\":%d,\"item\":", idx);
    k3_sbuf_add(ev, item->p, item->len);
    k3_sbuf_str(ev, "}\n\n");
}

void k3_resp_open(k3_resp_job *r, k3_sbuf *ev, const struct k3_server *s, const k3_job *j) {
    event(r, ev, "response.created");
    k3_sbuf_str(ev, ",\"response\":");
    response(ev, r, s, j, "in_progress");
    k3_sbuf_str(ev, "}\n\n");
    event(r, ev, "response.in_progress");
    k3_sbuf_str(ev, ",\"response\":");
    response(ev, r, s, j, "in_progress");
    k3_sbuf_str(ev, "}\n\n");
}

/* ---- output items ---------------------------------------------------------------------------- */

static void item_id(char *out, size_t cap, const k3_resp_job *r, const char *prefix) {
    snprintf(out, cap, "%s_%s_%d", prefix, r->id + 5, r->n_items); /* r->id is "resp_…" */
}

/* The finished message or reasoning item for the open text (into b). */
static void text_item(k3_sbuf *b, const k3_resp_job *r, int kind) {
    char id[96];
    item_id(id, sizeof id, r, kind ? "rs" : "msg");
    if (kind) k3_sbuf_printf(b, "{\"id\":\"%s\",\"type\":\"reasoning\",\"summary\":[],"
                             "\"content\":[{\"type\":\"reasoning_text\",\"text\":\"", id);
    else k3_sbuf_printf(b, "{\"id\":\"%s\",\"type\":\"message\",\"status\":\"completed\","
                        "\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\","
                        "\"annotations\":[],\"logprobs\":[],\"text\":\"", id);
    k3_sbuf_json_str(b, r->text.p ? r->text.p : "", r->text.len);
    k3_sbuf_str(b, "\"}]}");
}

static void part(k3_sbuf *b, const k3_resp_job *r, int kind, bool full) {
    k3_sbuf_printf(b, "{\"type\":\"%s\",", kind ? "reasoning_text" : "output_text");
    if (!kind) k3_sbuf_str(b, "\"annotations\":[],\"logprobs\":[],");
    k3_sbuf_str(b, "\"text\":\"");
    if (full) k3_sbuf_json_str(b, r->text.p ? r->text.p : "", r->text.len);
    k3_sbuf_str(b, "\"}");
}

static void add_item(k3_resp_job *r, const char *json, size_t n) {
    if (r->items.len) k3_sbuf_str(&r->items, ",");
    k3_sbuf_add(&r->items, json, n);
    r->n_items++;
}

static void close_text(k3_resp_job *r, k3_sbuf *ev, bool stream) {
    if (r->open < 0) return;
    int kind = r->open, idx = r->n_items;
    char id[96];
    item_id(id, sizeof id, r, kind ? "rs" : "msg");
    k3_sbuf item = {0};
    text_item(&item, r, kind);
    if (stream) {
        event(r, ev, kind ? "response.reasoning_text.done" : "response.output_text.done");
        k3_sbuf_printf(ev, ",\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,"
                       "%s\"text\":\"", id, idx, kind ? "" : "\"logprobs\":[],");
        k3_sbuf_json_str(ev, r->text.p ? r->text.p : "", r->text.len);
        k3_sbuf_str(ev, "\"}\n\n");
        event(r, ev, "response.content_part.done");
        k3_sbuf_printf(ev, ",\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,"
                       "\"part\":", id, idx);
        part(ev, r, kind, true);
        k3_sbuf_str(ev, "}\n\n");
        item_done(r, ev, idx, &item);
    }
    add_item(r, item.p, item.len);
    k3_sbuf_free(&item);
    r->text.len = 0;
    r->open = -1;
}

void k3_resp_text(k3_resp_job *r, k3_sbuf *ev, bool stream, int channel, const char *text,
                  size_t n) {
    if (n == 0) return;
    int kind = channel ? 1 : 0;
    char id[96];
    if (r->open != kind) {
        close_text(r, ev, stream);
        r->open = kind;
        item_id(id, sizeof id, r, kind ? "rs" : "msg");
        if (stream) {
            event(r, ev, "response.output_item.added");
            k3_sbuf_printf(ev, ",\"output_index\":%d,\"item\":", r->n_items);
            if (kind) k3_sbuf_printf(ev, "{\"id\":\"%s\",\"type\":\"reasoning\",\"summary\":[],"
                                     "\"content\":[]}}\n\n", id);
            else k3_sbuf_printf(ev, "{\"id\":\"%s\",\"type\":\"message\",\"status\":"
                                "\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n", id);
            event(r, ev, "response.content_part.added");
            k3_sbuf_printf(ev, ",\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,"
                           "\"part\":", id, r->n_items);
            part(ev, r, kind, false);
            k3_sbuf_str(ev, "}\n\n");
        }
    }
    k3_sbuf_add(&r->text, text, n);
    if (!stream) return;
    item_id(id, sizeof id, r, kind ? "rs" : "msg");
    event(r, ev, kind ? "response.reasoning_text.delta" : "response.output_text.delta");
    k3_sbuf_printf(ev, ",\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,%s"
                   "\"delta\":\"", id, r->n_items, kind ? "" : "\"logprobs\":[],");
    k3_sbuf_json_str(ev, text, n);
    k3_sbuf_str(ev, "\"}\n\n");
}

static bool is_custom(const k3_resp_job *r, const char *name) {
    for (int i = 0; i < r->n_custom; i++)
        if (!strcmp(r->custom[i], name)) return true;
    return false;
}

/* A custom tool's input: the "input" string of the arguments, or the arguments' raw text
 * when the model wrote something else. malloc'd. */
static char *custom_input(const char *arguments) {
    cJSON *o = cJSON_Parse(arguments);
    const char *s = k3_json_str(o, "input");
    char *out = strdup(s ? s : arguments);
    cJSON_Delete(o);
    return out;
}

void k3_resp_tool_call(k3_resp_job *r, k3_sbuf *ev, bool stream, const char *call_id,
                       const char *name, const char *arguments, const size_t *piece_ends,
                       size_t n_pieces) {
    close_text(r, ev, stream);
    bool custom = is_custom(r, name);
    char *input = custom ? custom_input(arguments) : NULL;
    const char *value = custom ? (input ? input : "") : arguments;
    char id[96];
    item_id(id, sizeof id, r, custom ? "ctc" : "fc");
    int idx = r->n_items;
    k3_sbuf item = {0};
    k3_sbuf_printf(&item, "{\"id\":\"%s\",\"type\":\"%s\",\"status\":\"completed\","
                   "\"call_id\":\"%s\",\"name\":\"", id, custom ? "custom_tool_call"
                   : "function_call", call_id);
    k3_sbuf_json_str(&item, name, strlen(name));
    k3_sbuf_printf(&item, "\",\"%s\":\"", custom ? "input" : "arguments");
    k3_sbuf_json_str(&item, value, strlen(value));
    k3_sbuf_str(&item, "\"}");
    if (stream) {
        event(r, ev, "response.output_item.added");
        k3_sbuf_printf(ev, ",\"output_index\":%d,\"item\":{\"id\":\"%s\",\"type\":\"%s\","
                       "\"status\":\"in_progress\",\"call_id\":\"%s\",\"name\":\"", idx, id,
                       custom ? "custom_tool_call" : "function_call", call_id);
        k3_sbuf_json_str(ev, name, strlen(name));
        k3_sbuf_printf(ev, "\",\"%s\":\"\"}}\n\n", custom ? "input" : "arguments");
        const char *delta = custom ? "response.custom_tool_call_input.delta"
                                   : "response.function_call_arguments.delta";
        if (custom) { /* the input as one piece: the pieces are of the JSON arguments */
            n_pieces = 1;
            piece_ends = NULL;
        }
        size_t from = 0, len = strlen(value);
        for (size_t k = 0; k < n_pieces; k++) {
            size_t to = piece_ends ? piece_ends[k] : len;
            event(r, ev, delta);
            k3_sbuf_printf(ev, ",\"item_id\":\"%s\",\"output_index\":%d,\"delta\":\"", id, idx);
            k3_sbuf_json_str(ev, value + from, to - from);
            k3_sbuf_str(ev, "\"}\n\n");
            from = to;
        }
        event(r, ev, custom ? "response.custom_tool_call_input.done"
                            : "response.function_call_arguments.done");
        k3_sbuf_printf(ev, ",\"item_id\":\"%s\",\"output_index\":%d,\"name\":\"", id, idx);
        k3_sbuf_json_str(ev, name, strlen(name));
        k3_sbuf_printf(ev, "\",\"%s\":\"", custom ? "input" : "arguments");
        k3_sbuf_json_str(ev, value, strlen(value));
        k3_sbuf_str(ev, "\"}\n\n");
        item_done(r, ev, idx, &item);
    }
    add_item(r, item.p, item.len);
    k3_sbuf_free(&item);
    free(input);
}

/* The conversation after this response: its input items and output items, for the store. */
static char *conversation(const k3_resp_job *r) {
    k3_sbuf b = {0};
    size_t n = r->input_items ? strlen(r->input_items) : 0;
    if (n < 2) return NULL;
    k3_sbuf_add(&b, r->input_items, n - 1); /* without its closing ']' */
    if (r->items.len) {
        if (n > 2) k3_sbuf_str(&b, ",");
        k3_sbuf_add(&b, r->items.p, r->items.len);
    }
    k3_sbuf_str(&b, "]");
    if (b.oom) return k3_sbuf_free(&b), NULL;
    return b.p;
}

void k3_resp_finish(k3_resp_job *r, k3_sbuf *ev, bool stream, const struct k3_server *s,
                    const k3_job *j, k3_resp_store *store) {
    close_text(r, ev, stream);
    k3_sbuf_add(&r->items, "", 0);
    const char *status = j->failed ? "failed" : j->finish && !strcmp(j->finish, "length")
                       ? "incomplete" : "completed";
    k3_sbuf body = {0};
    response(&body, r, s, j, status);
    if (stream) {
        event(r, ev, !strcmp(status, "completed") ? "response.completed"
                     : !strcmp(status, "incomplete") ? "response.incomplete" : "response.failed");
        k3_sbuf_str(ev, ",\"response\":");
        k3_sbuf_add(ev, body.p, body.len);
        k3_sbuf_str(ev, "}\n\n");
    }
    k3_sbuf_str(&body, "\n");
    free(r->final);
    r->final = body.oom ? (k3_sbuf_free(&body), NULL) : body.p;
    if (!j->failed && r->store) store_put(store, r->id, conversation(r));
}
