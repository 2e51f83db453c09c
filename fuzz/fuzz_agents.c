/* fuzz_agents.c — the agents' APIs: the first byte picks the translator (even: Anthropic
 * Messages, anthropic.h; odd: Responses, responses.h, with one response in the store for
 * previous_response_id), the rest is the body. A body the translator accepts goes through the
 * chat validator; a Responses body is then "answered": its text (a slice of the input) as
 * reasoning and answer, and a tool call to each tool name it declared, then the end.
 * Oracles: a translated body is a JSON object the chat validator answers (no 5xx but out of
 * memory); every streamed event's data is valid JSON with strictly increasing
 * sequence_number; the finished Response is valid JSON. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <string.h>

#include "../src/server/anthropic.h"
#include "../src/server/responses.h"
#include "fuzz.h"

/* Every "data: " line of ev is a JSON object; Responses events number themselves in order. */
static int check_events(const k3_sbuf *ev, int *seq) {
    if (!ev->len) return 0;
    char *copy = strndup(ev->p, ev->len);
    int bad = 0;
    for (char *line = strtok(copy, "\n"); line && !bad; line = strtok(NULL, "\n")) {
        if (strncmp(line, "data: ", 6)) continue;
        cJSON *v = cJSON_Parse(line + 6);
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(v, "sequence_number");
        bad = !cJSON_IsObject(v) || (cJSON_IsNumber(n) && n->valueint != (*seq)++);
        cJSON_Delete(v);
    }
    free(copy);
    return bad;
}

static k3_resp_store store;
static struct k3_server srv = {.model_id = "k3-fuzz", .resp_store = &store};

static int answer(k3_resp_job *r, const cJSON *chat, const char *text, size_t n) {
    k3_job j = {.created = 1, .finish = "tool_calls", .n_prompt_used = 1};
    snprintf(r->id, sizeof r->id, "resp_k3fuzz");
    k3_sbuf ev = {0};
    int seq = 0, bad = 0;
    k3_resp_open(r, &ev, &srv, &j);
    k3_resp_text(r, &ev, true, 1, text, n / 2);
    k3_resp_text(r, &ev, true, 0, text + n / 2, n - n / 2);
    const cJSON *t;
    int k = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(chat, "tools")) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        if (!cJSON_IsString(name)) continue;
        char id[32];
        snprintf(id, sizeof id, "call_%d", k++);
        size_t end = strlen("{\"input\":\"x\"}");
        k3_resp_tool_call(r, &ev, true, id, name->valuestring, "{\"input\":\"x\"}", &end, 1);
    }
    k3_resp_finish(r, &ev, true, &srv, &j, &store);
    bad = check_events(&ev, &seq);
    cJSON *fin = r->final ? cJSON_Parse(r->final) : NULL;
    bad |= !cJSON_IsObject(fin);
    cJSON_Delete(fin);
    k3_sbuf_free(&ev);
    return bad;
}

int k3_fuzz_agents(const uint8_t *data, size_t size) {
    static bool ready;
    if (!ready) { /* one stored response for previous_response_id */
        k3_resp_store_init(&store);
        cJSON *b = cJSON_Parse("{\"input\":\"hi\"}");
        k3_resp_job *r = NULL;
        k3_api_error e;
        cJSON *c = k3_resp_to_chat(b, &store, &r, &e);
        k3_job j = {.created = 1, .finish = "stop"};
        snprintf(r->id, sizeof r->id, "resp_stored");
        k3_resp_text(r, NULL, false, 0, "ok", 2);
        k3_resp_finish(r, NULL, false, &srv, &j, &store);
        k3_resp_job_free(r);
        cJSON_Delete(c);
        cJSON_Delete(b);
        ready = true;
    }
    if (size < 1) return 0;
    bool responses = data[0] & 1;
    cJSON *body = cJSON_ParseWithLength((const char *)data + 1, size - 1);
    if (!body) return 0;
    k3_api_error e = {0};
    k3_resp_job *r = NULL;
    cJSON *chat = responses ? k3_resp_to_chat(body, &store, &r, &e)
                            : k3_anth_to_chat(body, data[0] & 2, &e);
    int bad = 0;
    if (!chat) {
        bad = e.status != 400 && e.status != 500;
    } else {
        k3_srv_params p;
        bad = !cJSON_IsObject(chat);
        if (!k3_srv_parse_params(chat, K3_SRV_CHAT, 64, &p, &e)) k3_srv_params_free(&p);
        else bad |= e.status != 400 && e.status != 500;
        if (r && !bad) bad = answer(r, chat, (const char *)data + 1, size - 1 < 64 ? size - 1 : 64);
    }
    k3_resp_job_free(r);
    cJSON_Delete(chat);
    cJSON_Delete(body);
    return bad ? -1 : 0;
}

K3_FUZZ_ENTRY(k3_fuzz_agents)
