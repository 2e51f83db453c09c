/* testctl.c — the server's one door for tests (server.h, k3_server_test_control; SQLite's
 * sqlite3_test_control is the pattern). Compiled only into the test build (-DK3_TEST_CONTROLS:
 * build/k3-test, which tests/server and tests/web run); in the shipped k3 this file is empty
 * and worker.h's k3_srv_test_* are no-ops, so no test switch ships (tests/test_arch.c looks
 * for the K3_TEST_ names in ./k3). */
#ifdef K3_TEST_CONTROLS
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tok/tokenizer.h"
#include "../util/clock.h"
#include "../util/fileio.h"
#include "worker.h"

/* What the tests set, process-wide, before k3_server_start. */
static struct {
    const char *scripted_reply; /* a JSON file: an array of strings */
    double token_delay_s;
    size_t stream_backlog;
    double pass_hold_s;
    int pass_hold_pos; /* ... in a pass that starts at this position or later */
    bool pass_held; /* the one hold was spent */
} tests;

int k3_server_test_control(int op, ...) {
    va_list ap;
    int rc = 0;
    va_start(ap, op);
    switch (op) {
    case K3_SERVER_TEST_SCRIPTED_REPLY: tests.scripted_reply = va_arg(ap, const char *); break;
    case K3_SERVER_TEST_TOKEN_DELAY: tests.token_delay_s = va_arg(ap, double); break;
    case K3_SERVER_TEST_STREAM_BACKLOG: tests.stream_backlog = va_arg(ap, size_t); break;
    case K3_SERVER_TEST_PASS_HOLD: tests.pass_hold_s = va_arg(ap, double); break;
    case K3_SERVER_TEST_PASS_HOLD_POS: tests.pass_hold_pos = va_arg(ap, int); break;
    default: rc = -1;
    }
    va_end(ap);
    return rc;
}

size_t k3_srv_test_stream_backlog(void) { return tests.stream_backlog; }

void k3_srv_test_after_token(void) {
    if (tests.token_delay_s > 0) poll(NULL, 0, (int)(tests.token_delay_s * 1e3));
}

void k3_srv_test_hold_pass(k3_server *s, int pos, int n, int layer) {
    if (!(tests.pass_hold_s > 0) || tests.pass_held || layer != 0 || n < 2 ||
        pos < tests.pass_hold_pos)
        return;
    tests.pass_held = true;
    fprintf(stderr, "k3 serve: test: a pass of %d ids holds after layer 1 (position %d)\n", n,
            pos);
    k3_worker_state *ws = s->ws;
    double t0 = k3_now_s();
    for (; k3_now_s() - t0 < tests.pass_hold_s; poll(NULL, 0, 5)) {
        bool stay = false;
        for (int i = 0; i < ws->pass_segs && !stay; i++)
            stay = !k3_job_abandoned(s, ws->seg_slot[i]->j);
        if (!stay) return;
    }
}

/* Reads the scripted replies into w->script. */
static int load_script(k3_worker_state *w, const char *path, const k3_tokenizer *tok,
                       k3_err *err) {
    char *buf;
    size_t len;
    int rc = k3_read_file(path, (size_t)16 << 20, &buf, &len, err);
    if (rc) return rc;
    cJSON *arr = cJSON_ParseWithLength(buf, len);
    free(buf);
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    w->script = calloc(n ? (size_t)n : 1, sizeof *w->script);
    w->script_len = calloc(n ? (size_t)n : 1, sizeof *w->script_len);
    if (!n || !w->script || !w->script_len) {
        cJSON_Delete(arr);
        return k3_fail(err, K3_ERR_INPUT, "%s: a scripted reply file must hold a non-empty JSON "
                       "array of strings", path);
    }
    const cJSON *r;
    cJSON_ArrayForEach(r, arr) {
        if (!cJSON_IsString(r)) rc = k3_fail(err, K3_ERR_INPUT, "%s: entry %zu is not a string",
                                             path, w->n_script);
        if (!rc) rc = k3_tokenizer_encode(tok, r->valuestring, strlen(r->valuestring), true,
                                          &w->script[w->n_script], &w->script_len[w->n_script],
                                          err);
        if (rc) break;
        w->n_script++;
    }
    cJSON_Delete(arr);
    return rc;
}

int k3_srv_test_start(k3_worker_state *w, const k3_tokenizer *tok, k3_err *err) {
    return tests.scripted_reply ? load_script(w, tests.scripted_reply, tok, err) : 0;
}

void k3_srv_test_free(k3_worker_state *w) {
    for (size_t i = 0; i < w->n_script; i++) free(w->script[i]);
    free(w->script);
    free(w->script_len);
}

bool k3_srv_test_scripted(const k3_worker_state *w) { return w->n_script > 0; }

void k3_srv_test_begin(k3_worker_state *ws, k3_slot *w) {
    if (!ws->n_script) return;
    size_t k = ws->script_next++ % ws->n_script; /* generation i takes reply i % n */
    w->script_cur = ws->script[k];
    w->script_cur_len = ws->script_len[k];
    w->script_at = 0;
}

bool k3_srv_test_choose(void *user, int32_t *id) {
    job_ctx *c = user;
    k3_slot *w = c->j->slot;
    *id = w->script_at < w->script_cur_len ? w->script_cur[w->script_at++]
                                           : c->s->ws->stops.ids[0];
    return true;
}
#endif
