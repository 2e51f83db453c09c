/* anthropic.c — the Anthropic Messages API over the chat pipeline (anthropic.h). */
#include "anthropic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID "invalid_request_error"

/* ---- request translation ------------------------------------------------------------------ */

/* Keys of a block other than those listed (and cache_control) are refused. */
static int only_keys(const cJSON *o, const char *const *keys, const char *at, k3_api_error *e) {
    const cJSON *f;
    cJSON_ArrayForEach(f, o) {
        bool ok = !strcmp(f->string, "cache_control");
        for (int k = 0; keys[k] && !ok; k++) ok = !strcmp(f->string, keys[k]);
        if (!ok) {
            char p[160];
            snprintf(p, sizeof p, "%s.%s", at, f->string);
            return k3_api_unsupported(e, p, "unknown field");
        }
    }
    return 0;
}

/* Claude Code's first system block: a per-request billing line ("x-anthropic-billing-header:
 * cc_version=…; cch=…") whose hash changes with every request. It means nothing to the model
 * and, kept, would make every prompt differ from its first tokens (no state reuse). */
#define BILLING_PREFIX "x-anthropic-billing-header:"

static bool billing_line(const char *text) {
    return !strncmp(text, BILLING_PREFIX, sizeof BILLING_PREFIX - 1);
}

/* Text of a string or of an array of text blocks, appended to b. A system text (system =
 * true) that is the billing line is dropped. */
static int text_of(const cJSON *c, const char *at, bool system, k3_sbuf *b, k3_api_error *e) {
    if (cJSON_IsString(c)) {
        if (!(system && billing_line(c->valuestring))) k3_sbuf_str(b, c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c)) return k3_api_wrong(e, at, "a string or an array of text blocks");
    int j = 0;
    const cJSON *blk;
    cJSON_ArrayForEach(blk, c) {
        char p[160];
        snprintf(p, sizeof p, "%s[%d]", at, j++);
        const char *type = k3_json_str(blk, "type"), *text = k3_json_str(blk, "text");
        static const char *const keys[] = {"type", "text", "citations", NULL};
        if (!type || strcmp(type, "text")) {
            snprintf(p + strlen(p), sizeof p - strlen(p), ".type");
            return k3_api_unsupported(e, p, "k3 reads text blocks only");
        }
        if (!text) return k3_api_wrong(e, p, "a text block with a \"text\" string");
        if (only_keys(blk, keys, p, e)) return -1;
        if (system && billing_line(text)) continue;
        if (b->len && system) k3_sbuf_str(b, "\n"); /* blocks are paragraphs of one text */
        k3_sbuf_str(b, text);
    }
    return 0;
}

/* A tool result's content: a string, or blocks of any type, appended to b as text. Never
 * refused: an agent whose tool returned something k3 cannot read (an image, a tool_reference
 * of Claude Code's tool search) must still get a reply, or its session would be stuck on a 400
 * for good. Text blocks are their text; a tool_reference names its tool; any other block is
 * its JSON (an image or document: its type only, k3 reads text). */
static int tool_result_text(const cJSON *c, const char *at, k3_sbuf *b, k3_api_error *e) {
    if (cJSON_IsString(c)) {
        k3_sbuf_str(b, c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c)) return k3_api_wrong(e, at, "a string or an array of content blocks");
    const cJSON *blk;
    cJSON_ArrayForEach(blk, c) {
        const char *type = k3_json_str(blk, "type"), *text = k3_json_str(blk, "text");
        if (b->len) k3_sbuf_str(b, "\n");
        if (type && !strcmp(type, "text") && text) {
            k3_sbuf_str(b, text);
        } else if (type && !strcmp(type, "tool_reference") && k3_json_str(blk, "tool_name")) {
            k3_sbuf_printf(b, "[tool_reference: %s]", k3_json_str(blk, "tool_name"));
        } else if (type && (!strcmp(type, "image") || !strcmp(type, "document"))) {
            k3_sbuf_printf(b, "[%s omitted: k3 reads text only]", type);
        } else {
            cJSON *copy = cJSON_Duplicate(blk, 1);
            cJSON_DeleteItemFromObjectCaseSensitive(copy, "cache_control");
            char *json = copy ? cJSON_PrintUnformatted(copy) : NULL;
            cJSON_Delete(copy);
            if (!json) return k3_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            k3_sbuf_str(b, json);
            free(json);
        }
    }
    return 0;
}

static cJSON *message(const char *role) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    return m;
}

/* One user message: text blocks become user messages, tool_result blocks tool messages. */
static int user_message(const cJSON *c, int i, cJSON *out, k3_api_error *e) {
    char at[96];
    snprintf(at, sizeof at, "messages[%d].content", i);
    if (cJSON_IsString(c)) {
        cJSON *m = message("user");
        cJSON_AddStringToObject(m, "content", c->valuestring);
        cJSON_AddItemToArray(out, m);
        return 0;
    }
    if (!cJSON_IsArray(c)) return k3_api_wrong(e, at, "a string or an array of content blocks");
    k3_sbuf text = {0};
    bool have_text = false;
    int j = 0, rc = 0;
    const cJSON *blk;
    cJSON_ArrayForEach(blk, c) {
        char p[128];
        snprintf(p, sizeof p, "%s[%d]", at, j++);
        const char *type = k3_json_str(blk, "type");
        if (type && !strcmp(type, "text")) {
            static const char *const keys[] = {"type", "text", "citations", NULL};
            if (!k3_json_str(blk, "text")) rc = k3_api_wrong(e, p, "a text block with a \"text\" string");
            if (!rc) rc = only_keys(blk, keys, p, e);
            if (rc) break;
            k3_sbuf_str(&text, k3_json_str(blk, "text"));
            have_text = true;
        } else if (type && !strcmp(type, "tool_result")) {
            static const char *const keys[] = {"type", "tool_use_id", "content", "is_error", NULL};
            if ((rc = only_keys(blk, keys, p, e))) break;
            const char *id = k3_json_str(blk, "tool_use_id");
            char pc[160];
            snprintf(pc, sizeof pc, "%s.tool_use_id", p);
            if (!id) {
                rc = k3_api_wrong(e, pc, "a string");
                break;
            }
            if (have_text) { /* text before a result stays before it */
                cJSON *m = message("user");
                cJSON_AddStringToObject(m, "content", text.p ? text.p : "");
                cJSON_AddItemToArray(out, m);
                text.len = 0;
                text.p[0] = 0;
                have_text = false;
            }
            k3_sbuf result = {0};
            const cJSON *rcontent = cJSON_GetObjectItemCaseSensitive(blk, "content");
            snprintf(pc, sizeof pc, "%s.content", p);
            if (rcontent && !cJSON_IsNull(rcontent)) rc = tool_result_text(rcontent, pc, &result, e);
            if (!rc) {
                cJSON *m = message("tool");
                cJSON_AddStringToObject(m, "tool_call_id", id);
                cJSON_AddStringToObject(m, "content", result.p ? result.p : "");
                cJSON_AddItemToArray(out, m);
            }
            k3_sbuf_free(&result);
            if (rc) break;
        } else {
            snprintf(p + strlen(p), sizeof p - strlen(p), ".type");
            rc = k3_api_unsupported(e, p, "k3 reads text and tool_result blocks in user messages "
                             "(it is a text-only engine)");
            break;
        }
    }
    if (!rc && (have_text || !j)) {
        cJSON *m = message("user");
        k3_sbuf_add(&text, "", 0);
        cJSON_AddStringToObject(m, "content", text.p ? text.p : "");
        cJSON_AddItemToArray(out, m);
    }
    k3_sbuf_free(&text);
    return rc;
}

static int assistant_message(const cJSON *c, int i, cJSON *out, k3_api_error *e) {
    char at[96];
    snprintf(at, sizeof at, "messages[%d].content", i);
    cJSON *m = message("assistant");
    cJSON_AddItemToArray(out, m);
    if (cJSON_IsString(c)) {
        cJSON_AddStringToObject(m, "content", c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c)) return k3_api_wrong(e, at, "a string or an array of content blocks");
    k3_sbuf text = {0}, think = {0};
    cJSON *calls = NULL;
    int j = 0, rc = 0;
    const cJSON *blk;
    cJSON_ArrayForEach(blk, c) {
        char p[128];
        snprintf(p, sizeof p, "%s[%d]", at, j++);
        const char *type = k3_json_str(blk, "type");
        if (type && !strcmp(type, "text")) {
            static const char *const keys[] = {"type", "text", "citations", NULL};
            if (!k3_json_str(blk, "text")) rc = k3_api_wrong(e, p, "a text block with a \"text\" string");
            if (!rc) rc = only_keys(blk, keys, p, e);
            if (!rc) k3_sbuf_str(&text, k3_json_str(blk, "text"));
        } else if (type && !strcmp(type, "thinking")) {
            static const char *const keys[] = {"type", "thinking", "signature", NULL};
            if (!k3_json_str(blk, "thinking")) rc = k3_api_wrong(e, p, "a thinking block with a string");
            if (!rc) rc = only_keys(blk, keys, p, e);
            if (!rc) k3_sbuf_str(&think, k3_json_str(blk, "thinking"));
        } else if (type && !strcmp(type, "redacted_thinking")) {
            /* Anthropic's encrypted thinking: nothing k3 can read (and it never writes one) */
        } else if (type && !strcmp(type, "tool_use")) {
            static const char *const keys[] = {"type", "id", "name", "input", NULL};
            const cJSON *input = cJSON_GetObjectItemCaseSensitive(blk, "input");
            if (!k3_json_str(blk, "id") || !k3_json_str(blk, "name") || !cJSON_IsObject(input))
                rc = k3_api_wrong(e, p, "a tool_use block with id, name and an input object");
            if (!rc) rc = only_keys(blk, keys, p, e);
            if (!rc) {
                if (!calls) calls = cJSON_AddArrayToObject(m, "tool_calls");
                cJSON *call = cJSON_CreateObject(), *f = cJSON_CreateObject();
                cJSON_AddStringToObject(call, "id", k3_json_str(blk, "id"));
                cJSON_AddStringToObject(call, "type", "function");
                cJSON_AddStringToObject(f, "name", k3_json_str(blk, "name"));
                cJSON_AddItemToObject(f, "arguments", cJSON_Duplicate(input, 1));
                cJSON_AddItemToObject(call, "function", f);
                cJSON_AddItemToArray(calls, call);
            }
        } else {
            snprintf(p + strlen(p), sizeof p - strlen(p), ".type");
            rc = k3_api_unsupported(e, p, "k3 reads text, thinking and tool_use blocks in assistant "
                             "messages");
        }
        if (rc) break;
    }
    k3_sbuf_add(&text, "", 0);
    k3_sbuf_add(&think, "", 0);
    if (!rc) {
        cJSON_AddStringToObject(m, "content", text.p ? text.p : "");
        if (think.len) cJSON_AddStringToObject(m, "reasoning_content", think.p);
    }
    k3_sbuf_free(&text);
    k3_sbuf_free(&think);
    return rc;
}

/* A system-role message inside messages (Claude Code sends them for reminders): a system
 * message at its place, as K3's format renders system text between turns (render.c). */
static int system_message(const cJSON *c, int i, cJSON *out, k3_api_error *e) {
    char at[96];
    snprintf(at, sizeof at, "messages[%d].content", i);
    k3_sbuf b = {0};
    int rc = text_of(c, at, true, &b, e);
    if (!rc && b.len) {
        cJSON *m = message("system");
        cJSON_AddStringToObject(m, "content", b.p);
        cJSON_AddItemToArray(out, m);
    }
    k3_sbuf_free(&b);
    return rc;
}

static int messages(const cJSON *in, cJSON *out, k3_api_error *e) {
    if (!cJSON_IsArray(in) || !in->child)
        return k3_api_wrong(e, "messages", "a non-empty array of messages");
    int i = 0, n = cJSON_GetArraySize(in);
    const cJSON *m;
    cJSON_ArrayForEach(m, in) {
        char at[64];
        snprintf(at, sizeof at, "messages[%d]", i);
        static const char *const keys[] = {"role", "content", NULL};
        if (!cJSON_IsObject(m)) return k3_api_wrong(e, at, "an object");
        if (only_keys(m, keys, at, e)) return -1;
        const char *role = k3_json_str(m, "role");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        snprintf(at, sizeof at, "messages[%d].role", i);
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system")))
            return k3_api_wrong(e, at, "\"user\", \"assistant\" or \"system\"");
        if (!strcmp(role, "assistant") && i == n - 1) {
            snprintf(at, sizeof at, "messages[%d]", i);
            return k3_api_unsupported(e, at, "a final assistant message (a reply to continue): K3's "
                               "chat format closes every message in the history");
        }
        int rc = !strcmp(role, "user")   ? user_message(c, i, out, e)
                 : !strcmp(role, "system") ? system_message(c, i, out, e)
                                           : assistant_message(c, i, out, e);
        if (rc) return rc;
        i++;
    }
    return 0;
}

static int tools(const cJSON *in, cJSON *out, k3_api_error *e) {
    if (!cJSON_IsArray(in)) return k3_api_wrong(e, "tools", "an array");
    cJSON *arr = cJSON_AddArrayToObject(out, "tools");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, in) {
        char at[64];
        snprintf(at, sizeof at, "tools[%d]", i++);
        const char *type = k3_json_str(t, "type");
        if (type && strcmp(type, "custom")) {
            snprintf(at + strlen(at), sizeof at - strlen(at), ".type");
            return k3_api_unsupported(e, at, "server tools are not available in k3; declare client "
                               "tools with name, description and input_schema");
        }
        /* defer_loading (Claude Code's tool search: load the tool when referenced) and
         * eager_input_streaming are hints: k3 declares every tool it is sent. */
        static const char *const keys[] = {"type", "name", "description", "input_schema",
                                           "defer_loading", "eager_input_streaming", NULL};
        if (!cJSON_IsObject(t) || !k3_json_str(t, "name"))
            return k3_api_wrong(e, at, "an object with a \"name\"");
        if (only_keys(t, keys, at, e)) return -1;
        cJSON *f = cJSON_CreateObject(), *tool = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "name", k3_json_str(t, "name"));
        if (k3_json_str(t, "description")) cJSON_AddStringToObject(f, "description", k3_json_str(t, "description"));
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
        if (schema) cJSON_AddItemToObject(f, "parameters", cJSON_Duplicate(schema, 1));
        cJSON_AddStringToObject(tool, "type", "function");
        cJSON_AddItemToObject(tool, "function", f);
        cJSON_AddItemToArray(arr, tool);
    }
    return 0;
}

static int tool_choice(const cJSON *tc, cJSON *out, k3_api_error *e) {
    static const char *const keys[] = {"type", "name", "disable_parallel_tool_use", NULL};
    const char *type = k3_json_str(tc, "type");
    if (!cJSON_IsObject(tc) || !type) return k3_api_wrong(e, "tool_choice", "an object with a \"type\"");
    if (only_keys(tc, keys, "tool_choice", e)) return -1;
    if (!strcmp(type, "tool"))
        return k3_api_unsupported(e, "tool_choice", "{\"type\": \"tool\"} (one named tool) has no "
                           "verified rendering in K3's chat format; use auto, any or none");
    const char *oai = !strcmp(type, "auto") ? "auto" : !strcmp(type, "any") ? "required"
                      : !strcmp(type, "none") ? "none" : NULL;
    if (!oai) return k3_api_wrong(e, "tool_choice.type", "\"auto\", \"any\" or \"none\"");
    cJSON_AddStringToObject(out, "tool_choice", oai);
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(tc, "disable_parallel_tool_use");
    if (dp && !cJSON_IsBool(dp)) return k3_api_wrong(e, "tool_choice.disable_parallel_tool_use", "a boolean");
    if (cJSON_IsTrue(dp)) cJSON_AddFalseToObject(out, "parallel_tool_calls");
    return 0;
}

/* output_config (Claude Code sends {"effort": "high"}): effort is a hint K3 has too. Its
 * "format" (structured output) would change what is generated and is refused. Returns the
 * K3 effort for the request ("low", "high", "max"), NULL when none is given, or "" (error). */
static const char *output_effort(const cJSON *oc, k3_api_error *e) {
    if (!oc || cJSON_IsNull(oc)) return NULL;
    if (!cJSON_IsObject(oc)) return k3_api_wrong(e, "output_config", "an object"), "";
    const cJSON *f;
    cJSON_ArrayForEach(f, oc) {
        if (!strcmp(f->string, "effort") || cJSON_IsNull(f)) continue;
        char p[96];
        snprintf(p, sizeof p, "output_config.%s", f->string);
        return k3_api_unsupported(e, p, !strcmp(f->string, "format")
                           ? "k3 cannot constrain output to a JSON schema" : "unknown field"), "";
    }
    const char *effort = k3_json_str(oc, "effort");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(oc, "effort");
    if (!v || cJSON_IsNull(v)) return NULL;
    if (!effort) return k3_api_wrong(e, "output_config.effort", "a string"), "";
    /* K3 has low, high and max (spec §12.2); medium reads as the nearest at or above it */
    if (!strcmp(effort, "low")) return "low";
    if (!strcmp(effort, "medium")) return K3_SRV_MEDIUM_EFFORT;
    if (!strcmp(effort, "high")) return "high";
    if (!strcmp(effort, "max") || !strcmp(effort, "xhigh")) return "max";
    return k3_api_wrong(e, "output_config.effort", "\"low\", \"medium\", \"high\" or \"max\""), "";
}

/* thinking: absent / disabled → off; enabled → the effort of its budget (or of output_config
 * when given); adaptive (the model decides how much) → on, at output_config's effort or, when
 * none, the server's default (--effort: no reasoning_effort is set). */
static int thinking(const cJSON *t, const char *effort, cJSON *out, k3_api_error *e) {
    const char *type = "disabled";
    if (t && !cJSON_IsNull(t)) {
        static const char *const keys[] = {"type", "budget_tokens", "display", NULL};
        type = k3_json_str(t, "type");
        if (!cJSON_IsObject(t) || !type) return k3_api_wrong(e, "thinking", "an object with a \"type\"");
        if (only_keys(t, keys, "thinking", e)) return -1;
    }
    if (!strcmp(type, "enabled")) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(t, "budget_tokens");
        if (!cJSON_IsNumber(b) || b->valuedouble < 1024)
            return k3_api_wrong(e, "thinking.budget_tokens", "an integer >= 1024");
        if (!effort)
            effort = b->valuedouble < 8192 ? "low" : b->valuedouble < 32768 ? "high" : "max";
    } else if (!strcmp(type, "adaptive")) {
        if (!effort) cJSON_AddTrueToObject(out, "thinking");
    } else if (!strcmp(type, "disabled")) {
        effort = "none";
    } else {
        return k3_api_wrong(e, "thinking.type", "\"enabled\", \"adaptive\" or \"disabled\"");
    }
    if (effort) cJSON_AddStringToObject(out, "reasoning_effort", effort);
    return 0;
}

cJSON *k3_anth_to_chat(const cJSON *body, bool count_tokens, k3_api_error *e) {
    if (!cJSON_IsObject(body)) {
        k3_api_wrong(e, "body", "a JSON object");
        return NULL;
    }
    /* Hints and metadata are accepted and change nothing k3 generates: cache_control (k3
     * keeps conversation states anyway), context_management (Claude Code's request to clear
     * old tool results server-side: k3 keeps the history it is sent), metadata,
     * service_tier. output_config's effort is K3's effort (output_effort). */
    static const char *const all[] = {"model", "messages", "system", "max_tokens",
                                      "stop_sequences", "temperature", "top_p", "top_k",
                                      "metadata", "stream", "thinking", "tools", "tool_choice",
                                      "output_config", "cache_control", "context_management",
                                      "service_tier", NULL};
    static const char *const counting[] = {"model", "messages", "system", "thinking", "tools",
                                           "tool_choice", "output_config", "cache_control",
                                           "context_management", NULL};
    const char *const *keys = count_tokens ? counting : all;
    const cJSON *f;
    cJSON_ArrayForEach(f, body) {
        bool ok = false;
        for (int k = 0; keys[k] && !ok; k++) ok = !strcmp(f->string, keys[k]);
        if (!ok) {
            k3_api_fail(e, 400, INVALID, "unsupported_parameter", f->string, "%s: Extra inputs "
                        "are not permitted (k3 does not support '%s')", f->string, f->string);
            return NULL;
        }
    }
    cJSON *out = cJSON_CreateObject();
    cJSON *msgs = cJSON_AddArrayToObject(out, "messages");
    int rc = 0;
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(body, "system");
    if (sys && !cJSON_IsNull(sys)) {
        k3_sbuf b = {0};
        rc = text_of(sys, "system", true, &b, e);
        if (!rc && b.len) {
            cJSON *m = message("system");
            k3_sbuf_add(&b, "", 0);
            cJSON_AddStringToObject(m, "content", b.p ? b.p : "");
            cJSON_AddItemToArray(msgs, m);
        }
        k3_sbuf_free(&b);
    }
    if (!rc) rc = messages(cJSON_GetObjectItemCaseSensitive(body, "messages"), msgs, e);
    const char *effort = NULL;
    if (!rc) {
        effort = output_effort(cJSON_GetObjectItemCaseSensitive(body, "output_config"), e);
        rc = effort && !effort[0] ? -1 : 0;
    }
    if (!rc) rc = thinking(cJSON_GetObjectItemCaseSensitive(body, "thinking"), effort, out, e);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, "tools");
    if (!rc && v && !cJSON_IsNull(v)) rc = tools(v, out, e);
    v = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
    if (!rc && v && !cJSON_IsNull(v)) rc = tool_choice(v, out, e);
    if (!rc && !count_tokens) {
        v = cJSON_GetObjectItemCaseSensitive(body, "max_tokens");
        if (!v) rc = k3_api_fail(e, 400, INVALID, NULL, "max_tokens", "max_tokens: Field required");
        v = cJSON_GetObjectItemCaseSensitive(body, "metadata");
        if (!rc && v && !cJSON_IsNull(v) && !cJSON_IsObject(v)) rc = k3_api_wrong(e, "metadata", "an object");
        /* the rest is checked by the chat-completions validator, under the same names */
        static const char *const copy[][2] = {{"model", "model"}, {"max_tokens", "max_tokens"},
            {"stop_sequences", "stop"}, {"temperature", "temperature"}, {"top_p", "top_p"},
            {"top_k", "top_k"}, {"stream", "stream"}};
        for (size_t k = 0; k < sizeof copy / sizeof *copy && !rc; k++) {
            v = cJSON_GetObjectItemCaseSensitive(body, copy[k][0]);
            if (v) cJSON_AddItemToObject(out, copy[k][1], cJSON_Duplicate(v, 1));
        }
    }
    if (rc) {
        cJSON_Delete(out);
        return NULL;
    }
    return out;
}

/* ---- errors ------------------------------------------------------------------------------- */

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

static void error_body(k3_sbuf *b, const k3_api_error *e) {
    /* Anthropic's shape has no param: the message names the field. */
    const char *param = !strcmp(e->param, "stop") ? "stop_sequences" : e->param;
    k3_sbuf_printf(b, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":\"",
                   error_type(e->status));
    k3_sbuf_json_str(b, e->message, strlen(e->message));
    if (param[0] && !strstr(e->message, param)) {
        k3_sbuf_str(b, " (");
        k3_sbuf_json_str(b, param, strlen(param));
        k3_sbuf_str(b, ")");
    }
    k3_sbuf_str(b, "\"}}");
}

char *k3_anth_error_json(const k3_api_error *e) {
    k3_sbuf b = {0};
    error_body(&b, e);
    k3_sbuf_str(&b, "\n");
    if (b.oom) {
        k3_sbuf_free(&b);
        return NULL;
    }
    return b.p;
}

void k3_anth_error_event(k3_sbuf *ev, const k3_api_error *e) {
    k3_sbuf_str(ev, "event: error\ndata: ");
    error_body(ev, e);
    k3_sbuf_str(ev, "\n\n");
}

/* ---- replies ------------------------------------------------------------------------------ */

static const char *stop_reason(const k3_job *j) {
    if (!j->finish) return "end_turn";
    if (!strcmp(j->finish, "length")) return "max_tokens";
    if (!strcmp(j->finish, "tool_calls")) return "tool_use";
    if (j->stop_index >= 0) return "stop_sequence";
    return "end_turn";
}

static void stop_sequence(k3_sbuf *b, const k3_job *j) {
    if (j->stop_index < 0 || !j->finish || strcmp(j->finish, "stop")) {
        k3_sbuf_str(b, "null");
        return;
    }
    const char *s = j->p.stop[j->stop_index];
    k3_sbuf_str(b, "\"");
    k3_sbuf_json_str(b, s, strlen(s));
    k3_sbuf_str(b, "\"");
}

static void usage(k3_sbuf *b, const k3_job *j) {
    k3_sbuf_printf(b, "{\"input_tokens\":%d,\"cache_creation_input_tokens\":0,"
                   "\"cache_read_input_tokens\":%d,\"output_tokens\":%d}",
                   j->n_prompt_used - j->n_cached, j->n_cached, j->n_completion);
}

static void message_head(k3_sbuf *b, const struct k3_server *s, const k3_job *j) {
    k3_sbuf_printf(b, "{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"",
                   j->id);
    k3_sbuf_json_str(b, s->model_id, strlen(s->model_id));
    k3_sbuf_str(b, "\",\"content\":[");
}

char *k3_anth_reply_json(const struct k3_server *s, const k3_job *j) {
    k3_sbuf b = {0};
    message_head(&b, s, j);
    bool any = false;
    if (j->p.thinking) {
        k3_sbuf_str(&b, "{\"type\":\"thinking\",\"thinking\":\"");
        k3_sbuf_json_str(&b, j->reasoning.p ? j->reasoning.p : "", j->reasoning.len);
        k3_sbuf_str(&b, "\",\"signature\":\"\"}");
        any = true;
    }
    if (j->content.len || (!j->n_tool_calls && !any)) {
        k3_sbuf_printf(&b, "%s{\"type\":\"text\",\"text\":\"", any ? "," : "");
        k3_sbuf_json_str(&b, j->content.p ? j->content.p : "", j->content.len);
        k3_sbuf_str(&b, "\"}");
        any = true;
    }
    if (j->tool_calls.len) {
        if (any) k3_sbuf_str(&b, ",");
        k3_sbuf_add(&b, j->tool_calls.p, j->tool_calls.len);
    }
    k3_sbuf_printf(&b, "],\"stop_reason\":\"%s\",\"stop_sequence\":", stop_reason(j));
    stop_sequence(&b, j);
    k3_sbuf_str(&b, ",\"usage\":");
    usage(&b, j);
    k3_sbuf_str(&b, "}\n");
    if (b.oom || j->content.oom || j->reasoning.oom || j->tool_calls.oom) {
        k3_sbuf_free(&b);
        return NULL;
    }
    return b.p;
}

/* The arguments as an object for tool_use.input, or NULL (the json fallback's raw text). */
static cJSON *input_object(const char *arguments) {
    cJSON *v = cJSON_Parse(arguments);
    if (cJSON_IsObject(v)) return v;
    cJSON_Delete(v);
    return NULL;
}

void k3_anth_tool_use_json(k3_sbuf *b, const char *id, const char *name, const char *arguments) {
    cJSON *input = input_object(arguments);
    if (b->len) k3_sbuf_str(b, ",");
    if (!input) {
        k3_sbuf_str(b, "{\"type\":\"text\",\"text\":\"");
        k3_sbuf_json_str(b, arguments, strlen(arguments));
        k3_sbuf_str(b, "\"}");
        return;
    }
    cJSON_Delete(input);
    k3_sbuf_printf(b, "{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":\"", id);
    k3_sbuf_json_str(b, name, strlen(name));
    k3_sbuf_str(b, "\",\"input\":");
    k3_sbuf_str(b, arguments); /* valid JSON text, as the model wrote its values */
    k3_sbuf_str(b, "}");
}

/* ---- streaming ---------------------------------------------------------------------------- */

static void event(k3_sbuf *ev, const char *name) {
    k3_sbuf_printf(ev, "event: %s\ndata: {\"type\":\"%s\"", name, name);
}

static void close_block(k3_anth_stream *st, k3_sbuf *ev) {
    if (st->open < 0) return;
    event(ev, "content_block_stop");
    k3_sbuf_printf(ev, ",\"index\":%d}\n\n", st->index);
    st->open = -1;
    st->index++;
}

void k3_anth_message_start(k3_anth_stream *st, k3_sbuf *ev, const struct k3_server *s,
                           const k3_job *j) {
    *st = (k3_anth_stream){.open = -1};
    event(ev, "message_start");
    k3_sbuf_str(ev, ",\"message\":");
    message_head(ev, s, j);
    k3_sbuf_printf(ev, "],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":"
                   "%zu,\"output_tokens\":0}}}\n\n", j->n_prompt);
    event(ev, "ping");
    k3_sbuf_str(ev, "}\n\n");
}

void k3_anth_text(k3_anth_stream *st, k3_sbuf *ev, int thinking, const char *text, size_t n) {
    if (st->open != thinking) {
        close_block(st, ev);
        event(ev, "content_block_start");
        k3_sbuf_printf(ev, ",\"index\":%d,\"content_block\":%s}\n\n", st->index,
                       thinking ? "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}"
                                : "{\"type\":\"text\",\"text\":\"\"}");
        st->open = thinking;
    }
    event(ev, "content_block_delta");
    k3_sbuf_printf(ev, ",\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":\"", st->index,
                   thinking ? "thinking_delta" : "text_delta", thinking ? "thinking" : "text");
    k3_sbuf_json_str(ev, text, n);
    k3_sbuf_str(ev, "\"}}\n\n");
}

void k3_anth_tool_use(k3_anth_stream *st, k3_sbuf *ev, const char *id, const char *name,
                      const char *arguments, const size_t *piece_ends, size_t n_pieces) {
    cJSON *input = input_object(arguments);
    if (!input) { /* not an object: the model's raw text, as text */
        k3_anth_text(st, ev, 0, arguments, strlen(arguments));
        return;
    }
    cJSON_Delete(input);
    close_block(st, ev);
    event(ev, "content_block_start");
    k3_sbuf_printf(ev, ",\"index\":%d,\"content_block\":{\"type\":\"tool_use\",\"id\":\"%s\","
                   "\"name\":\"", st->index, id);
    k3_sbuf_json_str(ev, name, strlen(name));
    k3_sbuf_str(ev, "\",\"input\":{}}}\n\n");
    size_t from = 0;
    for (size_t k = 0; k < n_pieces; k++) {
        event(ev, "content_block_delta");
        k3_sbuf_printf(ev, ",\"index\":%d,\"delta\":{\"type\":\"input_json_delta\","
                       "\"partial_json\":\"", st->index);
        k3_sbuf_json_str(ev, arguments + from, piece_ends[k] - from);
        k3_sbuf_str(ev, "\"}}\n\n");
        from = piece_ends[k];
    }
    st->open = 2;
    close_block(st, ev);
}

void k3_anth_finish(k3_anth_stream *st, k3_sbuf *ev, const k3_job *j) {
    close_block(st, ev);
    event(ev, "message_delta");
    k3_sbuf_printf(ev, ",\"delta\":{\"stop_reason\":\"%s\",\"stop_sequence\":", stop_reason(j));
    stop_sequence(ev, j);
    k3_sbuf_str(ev, "},\"usage\":");
    usage(ev, j);
    k3_sbuf_str(ev, "}\n\n");
    event(ev, "message_stop");
    k3_sbuf_str(ev, "}\n\n");
}
