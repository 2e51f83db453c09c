/* test_nonfinite.c — corrupt weights give NaN/Inf logits: the engine refuses them with
 * K3_ERR_CHECKPOINT naming the position instead of sampling from them; `k3 run` exits 5
 * printing no token computed from them; `k3 serve` answers that request with 500.
 *
 * Each test patches a BF16 NaN (0x7fc0) or +Inf (0x7f80) into one element of a spine weight
 * of a scratch copy of tests/fixtures/k3-nano: a NaN in a layer's down_proj reaches every
 * logit (norms mix it into every element); one in a row of lm_head reaches only that id's
 * logit (the final hidden state stays finite); one in the embedding row of an id poisons the
 * positions from the first one fed that id. */
#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>

#include "../src/engine/k3.h"
#include "../src/server/server.h"
#include "cli_run.h"
#include "test.h"

#define DOWN0 "language_model.model.layers.0.mlp.down_proj.weight"
#define LM_HEAD "language_model.lm_head.weight"
#define EMBED "language_model.model.embed_tokens.weight"
#define BF16_NAN 0x7fc0
#define BF16_INF 0x7f80
#define BOS 1792

static k3_engine *load(const char *dir) {
    k3_engine *e = NULL;
    k3_err err = {0};
    k3_engine_opts o = k3_engine_opts_default();
    o.threads = 1;
    CHECK_OR(NULL, k3_engine_load(dir, &o, &e, &err) == K3_OK, "%s", err.msg);
    return e;
}

/* err is a K3_ERR_CHECKPOINT about non-finite logits naming `where` (e.g. "position 2"). */
static void expect_nonfinite(int rc, const k3_err *err, const char *where) {
    CHECK(rc == K3_ERR_CHECKPOINT, "rc %d: %s", rc, err->msg);
    CHECK(strstr(err->msg, "non-finite logits") && strstr(err->msg, where) &&
          strstr(err->msg, "corrupt"), "message: %s", err->msg);
}

/* The engine: a single step, a prefill in one pass (the last position's logits) and a pass
 * with logits at every position (the first row already fails) all refuse the logits. */
static void test_engine_spine_nan(void) {
    char *dir = k3t_nano_copy();
    if (!dir || k3t_patch_bf16(dir, DOWN0, 0, BF16_NAN)) return k3t_rm_dir(dir);
    k3_engine *e = load(dir);
    k3_session *s = NULL;
    k3_err err = {0};
    float *logits = malloc(3 * sizeof(float) * 4096);
    if (e && logits && k3_session_new(e, 64, &s, &err) == K3_OK &&
        k3_engine_config(e)->vocab_size <= 4096) {
        const int32_t ids[3] = {BOS, 5, 9};
        expect_nonfinite(k3_session_step(s, BOS, logits, &err), &err, "after position 0");
        k3_session_reset(s);
        if (!k3_test_stopped())
            expect_nonfinite(k3_session_prefill(s, ids, 3, logits, NULL, &err), &err,
                             "after position 2");
        k3_session_reset(s);
        if (!k3_test_stopped())
            expect_nonfinite(k3_session_forward(s, ids, 3, logits, K3_FWD_ALL_LOGITS, &err),
                             &err, "after position 0");
        k3_session_reset(s);
        if (!k3_test_stopped()) /* no logits asked for: nothing to check, nothing refused */
            CHECK(k3_session_forward(s, ids, 3, NULL, 0, &err) == K3_OK, "%s", err.msg);
    } else {
        k3_test_fail(__FILE__, __LINE__, "setup failed: %s", err.msg);
    }
    free(logits);
    k3_session_free(s);
    k3_engine_free(e);
    k3t_rm_dir(dir);
}

/* +Inf in one element of lm_head row 7: only logit 7 is non-finite, and it is named. */
static void test_engine_lm_head_row(void) {
    char *dir = k3t_nano_copy();
    k3_engine *e = NULL;
    k3_session *s = NULL;
    k3_err err = {0};
    if (dir && !k3t_patch_bf16(dir, LM_HEAD, 7 * 64 + 3, BF16_INF) && (e = load(dir))) {
        CHECK(k3_engine_config(e)->hidden_size == 64, "nano's hidden_size changed");
        float *logits = malloc(sizeof(float) * (size_t)k3_engine_config(e)->vocab_size);
        if (logits && k3_session_new(e, 16, &s, &err) == K3_OK)
            expect_nonfinite(k3_session_step(s, BOS, logits, &err), &err, "vocab id 7)");
        free(logits);
    }
    k3_session_free(s);
    k3_engine_free(e);
    k3t_rm_dir(dir);
}

/* k3 run: exit 5, the message on stderr, nothing on stdout. */
static void test_cli_prompt(void) {
    char *dir = k3t_nano_copy(), args[512];
    k3t_cli r = {0};
    if (dir && !k3t_patch_bf16(dir, DOWN0, 0, BF16_NAN)) {
        snprintf(args, sizeof args, "run %s --prompt-ids %d --max-new 4", dir, BOS);
        if (!k3t_cli_run(args, &r)) {
            CHECK(r.status == K3_ERR_CHECKPOINT, "exit %d, stderr: %s", r.status, r.err);
            CHECK(strstr(r.err, "k3 run: non-finite logits") && strstr(r.err, "after position 0"),
                  "stderr: %s", r.err);
            CHECK(r.out[0] == 0, "stdout: %s", r.out);
        }
    }
    k3t_cli_free(&r);
    k3t_rm_dir(dir);
}

/* Decode: the first generated id is computed from good logits and printed; feeding it (its
 * embedding row is NaN) gives bad logits at position 1, and nothing sampled from them shows. */
static void test_cli_decode(void) {
    k3t_cli clean = {0}, r = {0};
    char *dir = NULL, args[512];
    snprintf(args, sizeof args, "run tests/fixtures/k3-nano --prompt-ids %d --max-new 1 --ids -q",
             BOS);
    if (k3t_cli_run(args, &clean) || clean.status != 0) {
        k3_test_fail(__FILE__, __LINE__, "the clean run failed: %s", clean.err);
        goto out;
    }
    int first = atoi(clean.out);
    if (!(dir = k3t_nano_copy()) || k3t_patch_bf16(dir, EMBED, (size_t)first * 64, BF16_NAN))
        goto out;
    snprintf(args, sizeof args, "run %s --prompt-ids %d --max-new 4 --ids", dir, BOS);
    if (!k3t_cli_run(args, &r)) {
        char want[32];
        snprintf(want, sizeof want, "%d\n", first);
        CHECK(r.status == K3_ERR_CHECKPOINT, "exit %d, stderr: %s", r.status, r.err);
        CHECK(strstr(r.err, "non-finite logits") && strstr(r.err, "after position 1"),
              "stderr: %s", r.err);
        CHECK(!strcmp(r.out, want), "stdout \"%s\", want only the first id %d", r.out, first);
    }
out:
    k3t_cli_free(&clean);
    k3t_cli_free(&r);
    k3t_rm_dir(dir);
}

static size_t grow(char *p, size_t size, size_t n, void *user) {
    char *buf = user;
    size_t len = strlen(buf), add = size * n;
    if (len + add < 4096) memcpy(buf + len, p, add), buf[len + add] = 0;
    return add;
}

/* k3 serve: the request gets a 500 whose error message is the engine's. */
static void test_server_500(void) {
    char *dir = k3t_nano_copy(), body[4096] = "", url[256];
    k3_engine *e = NULL;
    k3_server *srv = NULL;
    k3_err err = {0};
    if (!dir || k3t_patch_bf16(dir, DOWN0, 0, BF16_NAN) || !(e = load(dir))) goto out;
    k3_server_opts so = {.port = 0, .ctx = 64};
    CHECK(k3_server_start(e, dir, &so, &srv, &err) == K3_OK, "%s", err.msg);
    snprintf(url, sizeof url, "%s/v1/completions", k3_server_url(srv));
    CURL *c = curl_easy_init();
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    long status = 0;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{\"prompt\":\"hello\",\"max_tokens\":3}");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, grow);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, body);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    CURLcode cc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    CHECK(cc == CURLE_OK, "%s", curl_easy_strerror(cc));
    CHECK(status == 500, "status %ld, body %s", status, body);
    CHECK(strstr(body, "non-finite logits") && strstr(body, "corrupt"), "body %s", body);
out:
    k3_server_stop(srv);
    k3_engine_free(e);
    k3t_rm_dir(dir);
}

const k3_test k3_suite_nonfinite[] = {
    {"engine_spine_nan", test_engine_spine_nan},
    {"engine_lm_head_row", test_engine_lm_head_row},
    {"cli_prompt", test_cli_prompt},
    {"cli_decode", test_cli_decode},
    {"server_500", test_server_500},
    {0},
};
