/* test_conv.c — a conversation kept in a session (src/chat/conv.c, k3_session_prefill) and
 * state files (src/model/state_file.c) on the k3-nano fixture model:
 *  - turn 2 prefills only its new tokens, its ids are exactly chat.json's reference ids for
 *    the whole conversation (chat-07), and its logits equal a from-scratch prefill;
 *  - the prefill reuse rules and the interrupt flag;
 *  - a saved state continues bit-exactly, and is refused by another model. */
#include "test.h"
#include "../src/chat/conv.h"
#include "../src/chat/render.h"
#include "../src/engine/k3.h"
#include "../src/util/fileio.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NANO "tests/fixtures/k3-nano"
#define CHAT_JSON "tests/fixtures/tokenizer/chat.json"

static k3_engine *load_engine(const char *dir) {
    k3_engine *e = NULL;
    k3_err err = {0};
    CHECK_OR(NULL, k3_engine_load(dir, NULL, &e, &err) == K3_OK, "%s", err.msg);
    return e;
}

static k3_session *new_session(const k3_engine *e) {
    k3_session *s = NULL;
    k3_err err = {0};
    CHECK_OR(NULL, k3_session_new(e, 1024, &s, &err) == K3_OK, "%s", err.msg);
    return s;
}

/* The chat.json case `id` as a request body (options + messages), and its k3-nano ids. */
static cJSON *fixture_case(cJSON *chat, const char *id, int32_t **ids, size_t *n) {
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(chat, "cases")) {
        if (strcmp(cJSON_GetObjectItem(c, "id")->valuestring, id)) continue;
        const cJSON *arr = cJSON_GetObjectItem(c, "ids_k3-nano");
        *n = (size_t)cJSON_GetArraySize(arr);
        *ids = malloc(*n * sizeof **ids);
        size_t i = 0;
        for (const cJSON *v = arr->child; v; v = v->next) (*ids)[i++] = (int32_t)v->valuedouble;
        cJSON *body = cJSON_Duplicate(cJSON_GetObjectItem(c, "options"), 1);
        cJSON_AddItemToObject(body, "messages",
                              cJSON_Duplicate(cJSON_GetObjectItem(c, "messages"), 1));
        return body;
    }
    return NULL;
}

static float max_abs_diff(const float *a, const float *b, int n) {
    float m = 0;
    for (int i = 0; i < n; i++) {
        float d = a[i] > b[i] ? a[i] - b[i] : b[i] - a[i];
        if (!(d <= m)) m = d; /* NaN counts as a difference */
    }
    return m;
}

/* ---- turn 2 ---------------------------------------------------------------------------------- */

/* chat-07: system, user "Name a prime.", assistant "7" with reasoning, user "Another one?".
 * Turn 1 is prompted through k3_conv; the assistant's reply is "generated" by feeding the
 * reference tokens one by one as the decode loop would; turn 2 must then prefill only its
 * own tokens and reproduce the reference ids and the from-scratch logits. */
static void test_turn2_prefills_only_new_tokens(void) {
    cJSON *chat = NULL;
    char *buf;
    size_t len;
    k3_err err = {0};
    CHECK(k3_read_file(CHAT_JSON, (size_t)64 << 20, &buf, &len, &err) == K3_OK, "%s", err.msg);
    chat = cJSON_ParseWithLength(buf, len);
    free(buf);
    int32_t *F;
    size_t nF;
    cJSON *body = fixture_case(chat, "chat-07", &F, &nF);
    CHECK(body);
    k3_engine *e = load_engine(NANO);
    k3_session *s = new_session(e), *fresh = new_session(e);
    if (k3_test_stopped()) return;
    const k3_tokenizer *tok = k3_engine_tokenizer(e);
    int vocab = k3_engine_config(e)->vocab_size;
    float *l2 = malloc(vocab * sizeof *l2), *lf = malloc(vocab * sizeof *lf);

    /* Turn 1. */
    k3_conv c;
    CHECK(k3_conv_init(&c, tok, &err) == K3_OK);
    CHECK(k3_conv_add(&c, "system", "You are helpful.", &err) == K3_OK);
    CHECK(k3_conv_add(&c, "user", "Name a prime.", &err) == K3_OK);
    CHECK(k3_conv_prompt(&c, &err) == K3_OK, "%s", err.msg);
    size_t n1 = c.prompt.n;
    CHECK(n1 < nF && !memcmp(c.prompt.v, F, n1 * sizeof *F), "turn 1 is not a prefix of chat-07");
    int reused = -1;
    CHECK(k3_session_prefill(s, c.prompt.v, n1, l2, &reused, &err) == K3_OK, "%s", err.msg);
    CHECK(reused == 0 && k3_session_pos(s) == (int)n1);

    /* The reply: the reference ids after turn 1's prompt, through <|end_of_msg|>. */
    cJSON *head = cJSON_Duplicate(body, 1);
    cJSON_DeleteItemFromArray(cJSON_GetObjectItem(head, "messages"), 3);
    cJSON_AddFalseToObject(head, "add_generation_prompt");
    k3_chat_request req;
    k3_segments segs = {0};
    int32_t *H;
    size_t nH;
    CHECK(k3_chat_request_parse(head, &req, &err) == K3_OK);
    CHECK(k3_chat_render(&req, 0, &segs, &err) == K3_OK);
    CHECK(k3_segments_encode(tok, &segs, &H, &nH, &err) == K3_OK);
    CHECK(nH > n1 && !memcmp(H, F, nH * sizeof *H), "history render is not a prefix");
    k3_stops stops;
    k3_stops_init(&stops, tok, k3_engine_config(e)->eos_token_id);
    k3_reply_parser p;
    k3_reply_parser_init(&p, tok, &stops, true);
    char out[16384];
    enum k3_channel ch;
    size_t n_gen = 0;
    int32_t gen[256];
    for (size_t i = n1; i < nH; i++) {
        CHECK(k3_reply_parser_push(&p, H[i], out, sizeof out, &ch) >= 0);
        if (k3_stops_has(&stops, H[i])) break; /* sampled, never fed */
        gen[n_gen++] = H[i];
        CHECK(k3_session_step(s, H[i], NULL, &err) == K3_OK);
    }
    CHECK(p.ended && n_gen == nH - n1 - 1, "reply of %zu ids", n_gen);
    CHECK(!strcmp(p.text[K3_CH_THINK].p, "Small primes: 2, 3, 5, 7."), "%s", p.text[K3_CH_THINK].p);
    CHECK(!strcmp(p.text[K3_CH_RESPONSE].p, "7"), "%s", p.text[K3_CH_RESPONSE].p);
    CHECK(k3_conv_commit(&c, gen, n_gen, &p, &err) == K3_OK, "%s", err.msg);

    /* Turn 2: exactly the reference ids; only the new ones are computed. */
    CHECK(k3_conv_add(&c, "user", "Another one?", &err) == K3_OK);
    CHECK(k3_conv_prompt(&c, &err) == K3_OK, "%s", err.msg);
    CHECK(c.prompt.n == nF && !memcmp(c.prompt.v, F, nF * sizeof *F),
          "turn 2 ids differ from chat-07's (%zu vs %zu ids)", c.prompt.n, nF);
    CHECK(k3_session_prefill(s, c.prompt.v, c.prompt.n, l2, &reused, &err) == K3_OK);
    CHECK(reused == (int)(nH - 1), "reused %d, want %zu", reused, nH - 1);
    size_t n_new = nF - (size_t)reused; /* <|end_of_msg|> + the user turn + generation prompt */
    CHECK(n_new < nF / 4, "turn 2 prefilled %zu of %zu tokens", n_new, nF);

    /* From scratch. */
    CHECK(k3_session_prefill(fresh, F, nF, lf, &reused, &err) == K3_OK && reused == 0);
    float d = max_abs_diff(l2, lf, vocab);
    CHECK(d == 0, "turn-2 logits differ from a from-scratch prefill by %g", d);

    /* The saved conversation renders to the same ids. */
    char *json = k3_conv_to_json(&c);
    k3_segments again = {0};
    int32_t *A;
    size_t nA;
    CHECK(k3_chat_render_json(json, strlen(json), &again, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_segments_encode(tok, &again, &A, &nA, &err) == K3_OK);
    CHECK(nA == nF && !memcmp(A, F, nF * sizeof *F), "/save JSON renders differently");
    free(A);
    free(json);
    k3_segments_free(&again);
    k3_reply_parser_free(&p);
    k3_segments_free(&segs);
    free(H);
    cJSON_Delete(head);
    k3_conv_free(&c);
    free(l2);
    free(lf);
    free(F);
    cJSON_Delete(body);
    cJSON_Delete(chat);
    k3_session_free(s);
    k3_session_free(fresh);
    k3_engine_free(e);
}

/* ---- prefill reuse rules --------------------------------------------------------------------- */

static void test_prefill_reuse_rules(void) {
    k3_engine *e = load_engine(NANO);
    k3_session *s = new_session(e);
    if (k3_test_stopped()) return;
    k3_err err = {0};
    int32_t a[] = {1792, 40, 41, 42, 43, 44}, b[] = {1792, 40, 41, 99, 43};
    int reused;
    CHECK(k3_session_prefill(s, a, 3, NULL, &reused, &err) == K3_OK && reused == 0);
    CHECK(k3_session_prefill(s, a, 6, NULL, &reused, &err) == K3_OK && reused == 3);
    CHECK(!memcmp(k3_session_tokens(s), a, sizeof a) && k3_session_pos(s) == 6);
    /* Diverging at position 3: KDA state cannot be rewound, so everything is recomputed. */
    CHECK(k3_session_prefill(s, b, 5, NULL, &reused, &err) == K3_OK && reused == 0);
    CHECK(k3_session_pos(s) == 5 && k3_session_tokens(s)[3] == 99);
    /* The same sequence again has nothing new: recomputed too. */
    CHECK(k3_session_prefill(s, b, 5, NULL, &reused, &err) == K3_OK && reused == 0);
    /* The interrupt flag stops before the next token and keeps what was fed. */
    volatile sig_atomic_t stop = 1;
    k3_session_set_interrupt(s, &stop);
    CHECK(k3_session_prefill(s, a, 6, NULL, &reused, &err) == K3_ERR_INTERRUPTED);
    CHECK(k3_session_pos(s) == 0, "pos %d", k3_session_pos(s));
    k3_session_set_interrupt(s, NULL);
    k3_session_free(s);
    k3_engine_free(e);
}

/* ---- state files ----------------------------------------------------------------------------- */

/* A copy of k3-nano whose lm_head differs in one byte (shard 10 holds it first in data). */
static int other_model(char *dir) {
    strcpy(dir, "/tmp/k3-test-state-XXXXXX");
    CHECK_OR(-1, mkdtemp(dir), "mkdtemp");
    const char *files[] = {"config.json", "generation_config.json", "model.safetensors.index.json",
                           "tiktoken.model", "tokenizer_config.json"};
    char src[512], dst[512], cwd[256];
    CHECK_OR(-1, getcwd(cwd, sizeof cwd) != NULL);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(src, sizeof src, "%s/" NANO "/%s", cwd, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        CHECK_OR(-1, symlink(src, dst) == 0, "%s", dst);
    }
    for (int i = 1; i <= 11; i++) {
        snprintf(src, sizeof src, "%s/" NANO "/model-%05d-of-000011.safetensors", cwd, i);
        snprintf(dst, sizeof dst, "%s/model-%05d-of-000011.safetensors", dir, i);
        if (i != 10) {
            CHECK_OR(-1, symlink(src, dst) == 0, "%s", dst);
            continue;
        }
        char *b;
        size_t n;
        k3_err err = {0};
        CHECK_OR(-1, k3_read_file(src, (size_t)64 << 20, &b, &n, &err) == K3_OK, "%s", err.msg);
        uint64_t hlen;
        memcpy(&hlen, b, 8);
        b[8 + hlen] ^= 0x01; /* first data byte: the low mantissa bit of a BF16 weight */
        FILE *f = fopen(dst, "wb");
        CHECK_OR(-1, f && fwrite(b, 1, n, f) == n && fclose(f) == 0, "%s", dst);
        free(b);
    }
    return 0;
}

static void remove_dir(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static void test_state_file_roundtrip_and_refusal(void) {
    k3_engine *e = load_engine(NANO);
    k3_session *s = new_session(e), *t = new_session(e);
    if (k3_test_stopped()) return;
    k3_err err = {0};
    int vocab = k3_engine_config(e)->vocab_size;
    float *la = malloc(vocab * sizeof *la), *lb = malloc(vocab * sizeof *lb);
    int32_t ids[] = {1792, 500, 501, 502, 503, 504, 505, 506, 507, 508, 509, 510};
    char path[] = "/tmp/k3-test-state-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    /* Save after 9 positions; continuing from the file equals continuing in memory. */
    CHECK(k3_session_prefill(s, ids, 9, NULL, NULL, &err) == K3_OK);
    CHECK(k3_session_save(s, path, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_session_prefill(s, ids, 12, la, NULL, &err) == K3_OK);
    CHECK(k3_session_load(t, path, &err) == K3_OK, "%s", err.msg);
    CHECK(k3_session_pos(t) == 9 && !memcmp(k3_session_tokens(t), ids, 9 * sizeof *ids));
    int reused;
    CHECK(k3_session_prefill(t, ids, 12, lb, &reused, &err) == K3_OK && reused == 9);
    CHECK(max_abs_diff(la, lb, vocab) == 0, "loaded state diverges by %g",
          max_abs_diff(la, lb, vocab));

    /* The file holds the latent MLA rows (spec §7.5): the 88-byte header, the ids, the KDA
     * state, per MLA layer 9 rows of kv_lora_rank + qk_rope_head_dim f32, the checksum. */
    const k3_config *c = k3_engine_config(e);
    int n_mla = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n_mla += c->layer_is_mla[l];
    uint64_t P = (uint64_t)c->kda_num_heads * c->kda_head_dim;
    uint64_t kda = (uint64_t)(c->num_hidden_layers - n_mla) *
                   (P * c->kda_head_dim + 3 * P * (uint64_t)(c->kda_conv_size - 1));
    uint64_t want = 88 + 9 * 4 + kda * 4 +
                    (uint64_t)n_mla * 9 * (uint64_t)(c->kv_lora_rank + c->qk_rope_head_dim) * 4 + 8;
    struct stat st;
    CHECK(stat(path, &st) == 0 && (uint64_t)st.st_size == want, "%lld bytes, want %llu",
          (long long)st.st_size, (unsigned long long)want);

    /* A version-1 file (the expanded cache of an older k3): refused with what to do. */
    char old[] = "/tmp/k3-test-state-v1-XXXXXX";
    fd = mkstemp(old);
    CHECK(fd >= 0);
    close(fd);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", path, old);
    CHECK(system(cmd) == 0);
    FILE *v1 = fopen(old, "r+b");
    uint32_t one = 1;
    CHECK(v1 && fseek(v1, 8, SEEK_SET) == 0 && fwrite(&one, 4, 1, v1) == 1 && fclose(v1) == 0);
    CHECK(k3_session_load(t, old, &err) == K3_ERR_IO, "%s", err.msg);
    CHECK(strstr(err.msg, "version 1") && strstr(err.msg, "expanded") &&
          strstr(err.msg, "run the prompt again"), "%s", err.msg);
    CHECK(k3_session_pos(t) == 12);
    unlink(old);

    /* Another model (one weight byte differs): refused, the session untouched. */
    char dir[64];
    if (other_model(dir)) return;
    k3_engine *o = load_engine(dir);
    k3_session *u = o ? new_session(o) : NULL;
    if (k3_test_stopped()) return;
    CHECK(k3_session_prefill(u, ids, 2, NULL, NULL, &err) == K3_OK);
    CHECK(k3_session_load(u, path, &err) == K3_ERR_INPUT, "code %d: %s", err.code, err.msg);
    CHECK(strstr(err.msg, "another model"), "%s", err.msg);
    CHECK(k3_session_pos(u) == 2);
    k3_session_free(u);
    k3_engine_free(o);
    remove_dir(dir);

    /* A truncated file: refused before the session is touched. */
    CHECK(stat(path, &st) == 0 && truncate(path, st.st_size - 5) == 0);
    CHECK(k3_session_load(t, path, &err) == K3_ERR_IO, "%s", err.msg);
    CHECK(strstr(err.msg, "truncated"), "%s", err.msg);
    CHECK(k3_session_pos(t) == 12);
    /* Not a state file at all. */
    FILE *f = fopen(path, "wb");
    fputs("{\"messages\": []}\n", f);
    fclose(f);
    CHECK(k3_session_load(t, path, &err) == K3_ERR_IO && strstr(err.msg, "not a k3 state file"),
          "%s", err.msg);
    unlink(path);
    free(la);
    free(lb);
    k3_session_free(s);
    k3_session_free(t);
    k3_engine_free(e);
}

const k3_test k3_suite_conv[] = {
    {"turn2_prefills_only_new_tokens", test_turn2_prefills_only_new_tokens},
    {"prefill_reuse_rules", test_prefill_reuse_rules},
    {"state_file_roundtrip_and_refusal", test_state_file_roundtrip_and_refusal},
    {0},
};
