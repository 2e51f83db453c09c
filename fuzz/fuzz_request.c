/* fuzz_request.c — a chat-completions body through the server's validation (NUL check,
 * parameter table) and the K3 renderer, then tokenized with the k3-nano tokenizer.
 * Oracle: rendering is compositional (render.h): for a request whose messages [0, n) and
 * the continuation from n render, the two segment lists joined equal the whole render. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <string.h>

#include "../src/chat/render.h"
#include "../src/server/srv.h"
#include "fuzz.h"

static const k3_tokenizer *request_tok(void) {
    static k3_tokenizer *t;
    if (!t) {
        k3_err err = {0};
        if (k3_tokenizer_load("tests/fixtures/k3-nano", &t, &err)) {
            fprintf(stderr, "fuzz_request: %s (run from the repository root)\n", err.msg);
            abort();
        }
    }
    return t;
}

static bool same_segments(const k3_segments *a, const k3_segments *b, size_t from,
                          const k3_segments *whole) {
    if (a->n + (b->n - from) != whole->n) return false;
    for (size_t i = 0; i < whole->n; i++) {
        const k3_segment *s = i < a->n ? &a->v[i] : &b->v[i - a->n + from];
        const k3_segment *w = &whole->v[i];
        if (s->len != w->len || s->allow_special != w->allow_special ||
            memcmp(s->text, w->text, w->len))
            return false;
    }
    return true;
}

static const char *role_of(const cJSON *m) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    return cJSON_IsString(r) ? r->valuestring : "";
}

/* The compositional invariant at n = 1 (when messages 0 and 1 are not tool results). */
static int check_split(const k3_chat_request *req, const k3_segments *whole) {
    const cJSON *m0 = req->messages->child, *m1 = m0 ? m0->next : NULL;
    if (!m1 || req->tool_choice || req->response_format || !strcmp(role_of(m0), "tool") ||
        !strcmp(role_of(m1), "tool"))
        return 0;
    cJSON *head = cJSON_CreateArray();
    cJSON_AddItemToArray(head, cJSON_Duplicate(m0, 1));
    k3_chat_request first = *req;
    first.messages = head;
    first.add_generation_prompt = false;
    k3_segments a = {0}, b = {0};
    k3_err err = {0};
    int ra = k3_chat_render(&first, 0, &a, &err), rb = k3_chat_render(req, 1, &b, &err);
    int bad = !ra && !rb && !same_segments(&a, &b, 0, whole);
    k3_segments_free(&a);
    k3_segments_free(&b);
    cJSON_Delete(head);
    return bad ? -1 : 0;
}

int k3_fuzz_request(const uint8_t *data, size_t size) {
    const char *body = (const char *)data;
    cJSON *root = cJSON_ParseWithLength(body, size);
    if (!root) return 0;
    int bad = 0;
    k3_api_error e = {0};
    k3_srv_params p;
    if (!k3_srv_check_strings(body, size, root, &e)) {
        if (!k3_srv_parse_params(root, K3_SRV_COMPLETIONS, 0, &p, &e)) k3_srv_params_free(&p);
        if (!k3_srv_parse_params(root, K3_SRV_CHAT, 0, &p, &e)) k3_srv_params_free(&p);
    }
    k3_chat_request req;
    k3_err err = {0};
    if (!k3_chat_request_parse(root, &req, &err)) {
        req.max_segments = 4096;
        k3_segments whole = {0};
        if (!k3_chat_render(&req, 0, &whole, &err)) {
            bad = check_split(&req, &whole);
            int32_t *ids = NULL;
            size_t n = 0;
            if (!k3_segments_encode(request_tok(), &whole, &ids, &n, &err)) free(ids);
        }
        k3_segments_free(&whole);
    }
    cJSON_Delete(root);
    return bad;
}

K3_FUZZ_ENTRY(k3_fuzz_request)
