/* test_repl.c — the chat commands end to end through $K3_BIN on the k3-nano fixture:
 *  - `k3 chat` in a pseudo-terminal (forkpty): two turns, the second prefilling only its new
 *    tokens (read from the turn summaries), /reset, Ctrl-C in the middle of a reply (the
 *    partial reply is kept, checked through /save, and the prompt comes back), Ctrl-C at the
 *    prompt exits with status 0;
 *  - `k3 run` interrupted by SIGINT exits 130 after printing the text and the summary;
 *  - `k3 render --ids` prints chat.json's reference ids; `k3 run --chat` with a seed
 *    reproduces its tokens, and --temperature 0 is greedy. */
#include "test.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../src/util/fileio.h"

#define NANO "tests/fixtures/k3-nano"
#define TIMEOUT_S 120.0 /* generous: ASan builds and a busy 2-core machine */
/* A prompt whose greedy reply on k3-nano runs 2,938 ids before its end of message (the Ctrl-C
 * tests interrupt it after its first bytes: the longer it runs, the surer the interrupt lands
 * inside it on a loaded machine; "Tell me a long story." ends after 1,266). */
#define LONG_ASK "Tell me a long story, please."

static const char *k3_bin(void) {
    const char *b = getenv("K3_BIN");
    if (!b || access(b, X_OK) != 0) k3_test_skip("K3_BIN is not set to the k3 binary");
    return b;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- a process on a pseudo-terminal ------------------------------------------------------- */

typedef struct pty_proc {
    pid_t pid;
    int fd;
    char out[1 << 20]; /* everything read, NUL-terminated */
    size_t n;
    bool eof;
} pty_proc;

static int pty_spawn(pty_proc *p, char *const argv[]) {
    p->n = 0;
    p->out[0] = 0;
    p->eof = false;
    p->pid = forkpty(&p->fd, NULL, NULL, NULL);
    if (p->pid == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    return p->pid > 0 ? 0 : -1;
}

/* Reads what is available within wait_s seconds. */
static void pty_read(pty_proc *p, double wait_s) {
    struct pollfd pf = {p->fd, POLLIN, 0};
    if (p->eof || poll(&pf, 1, (int)(wait_s * 1000)) <= 0) return;
    ssize_t k = read(p->fd, p->out + p->n, sizeof p->out - 1 - p->n);
    if (k <= 0) {
        p->eof = true; /* EIO once the child is gone */
        return;
    }
    p->n += (size_t)k;
    p->out[p->n] = 0;
}

/* Waits until needle appears at or after offset `from`; returns the offset just past it. */
static long pty_expect(pty_proc *p, const char *needle, size_t from) {
    double t0 = now_s();
    for (;;) {
        char *hit = from <= p->n ? strstr(p->out + from, needle) : NULL;
        if (hit) return (long)(hit - p->out) + (long)strlen(needle);
        if (p->eof || now_s() - t0 > TIMEOUT_S || p->n + 1 >= sizeof p->out) return -1;
        pty_read(p, 0.2);
    }
}

static void pty_send(pty_proc *p, const char *s) {
    size_t len = strlen(s);
    CHECK(write(p->fd, s, len) == (ssize_t)len, "write to the pty");
}

/* Reads to the end and returns the exit status (or -1 on timeout, after killing it). */
static int pty_finish(pty_proc *p) {
    double t0 = now_s();
    int status;
    while (waitpid(p->pid, &status, WNOHANG) == 0) {
        if (now_s() - t0 > TIMEOUT_S) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &status, 0);
            close(p->fd);
            return -1;
        }
        pty_read(p, 0.1);
    }
    close(p->fd);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The numbers of the turn summary after offset from:
 * "[N new tokens prefilled (K kept from earlier turns) in S s; G generated ...". */
static long summary(pty_proc *p, size_t from, int *n_new, int *kept, int *gen) {
    long at = pty_expect(p, " generated in ", from);
    CHECK_OR(-1, at > 0, "no turn summary; output:\n%s", p->out + from);
    const char *b = p->out + at;
    while (b > p->out && *b != '[') b--;
    double s;
    int got = sscanf(b, "[%d new tokens prefilled (%d kept from earlier turns) in %lf s; %d",
                     n_new, kept, &s, gen);
    CHECK_OR(-1, got == 4, "summary: %.120s", b);
    return at;
}

/* ---- k3 chat -------------------------------------------------------------------------------- */

static void test_chat_in_a_terminal(void) {
    const char *bin = k3_bin();
    if (k3_test_stopped()) return;
    static pty_proc p;
    char save[] = "/tmp/k3-test-chat-XXXXXX";
    int fd = mkstemp(save);
    CHECK(fd >= 0);
    close(fd);
    char *argv[] = {(char *)bin, "chat", NANO, "--max-new", "8", "-q", NULL};
    CHECK(pty_spawn(&p, argv) == 0, "forkpty: %s", strerror(errno));
    long at = pty_expect(&p, ">>> ", 0);
    CHECK(at > 0, "no prompt:\n%s", p.out);

    /* Two turns: the second keeps everything the first fed and computes only its own. */
    int new1, kept1, gen1, new2, kept2, gen2;
    pty_send(&p, "Name a prime.\n");
    if ((at = summary(&p, (size_t)at, &new1, &kept1, &gen1)) < 0) return;
    CHECK((at = pty_expect(&p, ">>> ", (size_t)at)) > 0);
    pty_send(&p, "Another one?\n");
    if ((at = summary(&p, (size_t)at, &new2, &kept2, &gen2)) < 0) return;
    CHECK(kept1 == 0 && gen1 == 8 && gen2 == 8, "%d %d %d", kept1, gen1, gen2);
    CHECK(kept2 == new1 + gen1 - 1, "turn 2 kept %d, turn 1 fed %d", kept2, new1 + gen1 - 1);
    CHECK(new2 > 0 && new2 < new1 / 2, "turn 2 prefilled %d (turn 1: %d)", new2, new1);
    CHECK((at = pty_expect(&p, ">>> ", (size_t)at)) > 0);

    /* /reset, then a long reply interrupted by Ctrl-C after its first bytes. */
    pty_send(&p, "/reset\n");
    CHECK((at = pty_expect(&p, "(new conversation)", (size_t)at)) > 0, "%s", p.out + at);
    pty_send(&p, "/max-new 3000\n");
    CHECK((at = pty_expect(&p, "(at most 3000 tokens per reply)", (size_t)at)) > 0);
    pty_send(&p, LONG_ASK "\n");
    CHECK((at = pty_expect(&p, "please.\r\n", (size_t)at)) > 0, "no echo");
    size_t reply_at = (size_t)at;
    double t0 = now_s();
    while (p.n < reply_at + 24 && now_s() - t0 < TIMEOUT_S) pty_read(&p, 0.05);
    pty_send(&p, "\x03");
    int new3, kept3, gen3;
    if ((at = summary(&p, reply_at, &new3, &kept3, &gen3)) < 0) return;
    CHECK(strstr(p.out + reply_at, "interrupted (Ctrl-C)"), "reply not interrupted:\n%s",
          p.out + reply_at);
    CHECK(kept3 == 0 && gen3 >= 1 && gen3 < 3000, "after /reset: kept %d, generated %d", kept3,
          gen3);
    CHECK((at = pty_expect(&p, ">>> ", (size_t)at)) > 0, "the prompt did not come back");

    /* The partial reply is in the conversation. */
    char cmd[64];
    snprintf(cmd, sizeof cmd, "/save %s\n", save);
    pty_send(&p, cmd);
    CHECK((at = pty_expect(&p, "(saved 2 messages", (size_t)at)) > 0, "%s", p.out + at);
    CHECK((at = pty_expect(&p, ">>> ", (size_t)at)) > 0);

    /* Ctrl-C at the prompt exits cleanly. */
    pty_send(&p, "\x03");
    CHECK(pty_finish(&p) == 0, "exit status; output:\n%s", p.out + at);

    char *json;
    size_t len;
    k3_err err = {0};
    CHECK(k3_read_file(save, 1 << 20, &json, &len, &err) == K3_OK, "%s", err.msg);
    cJSON *body = cJSON_Parse(json);
    const cJSON *msgs = cJSON_GetObjectItem(body, "messages");
    CHECK(cJSON_GetArraySize(msgs) == 2);
    const cJSON *reply = cJSON_GetArrayItem(msgs, 1);
    const char *reasoning = cJSON_GetObjectItem(reply, "reasoning_content")->valuestring;
    const char *content = cJSON_GetObjectItem(reply, "content")->valuestring;
    CHECK(!strcmp(cJSON_GetObjectItem(reply, "role")->valuestring, "assistant"));
    CHECK(strlen(reasoning) + strlen(content) > 0, "the partial reply was not kept");
    cJSON_Delete(body);
    free(json);
    unlink(save);
}

/* ---- k3 run --------------------------------------------------------------------------------- */

/* Runs `$K3_BIN args...` with stdout and stderr in files; returns the exit status. When
 * sigint_after_bytes > 0, sends SIGINT once stdout holds that many bytes. */
static int run_k3(char *const args[], const char *out, const char *errf, long sigint_after) {
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(out, "w", stdout) || !freopen(errf, "w", stderr)) _exit(126);
        execv(args[0], args);
        _exit(127);
    }
    double t0 = now_s();
    bool sent = false;
    int status;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        if (sigint_after > 0 && !sent) {
            FILE *f = fopen(out, "r");
            long n = 0;
            if (f && fseek(f, 0, SEEK_END) == 0) n = ftell(f);
            if (f) fclose(f);
            if (n >= sigint_after) sent = kill(pid, SIGINT) == 0;
        }
        if (now_s() - t0 > TIMEOUT_S) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static char *slurp(const char *path) {
    char *b = NULL;
    size_t n;
    k3_err err = {0};
    if (k3_read_file(path, 1 << 24, &b, &n, &err)) return strdup("");
    return b;
}

static void test_run_ctrl_c_exits_130(void) {
    const char *bin = k3_bin();
    if (k3_test_stopped()) return;
    char out[] = "/tmp/k3-test-run-out-XXXXXX", errf[] = "/tmp/k3-test-run-err-XXXXXX";
    close(mkstemp(out));
    close(mkstemp(errf));
    char *args[] = {(char *)bin, "run", NANO, "--chat", "--prompt", LONG_ASK,
                    "--max-new", "3000", NULL};
    int rc = run_k3(args, out, errf, 16);
    char *o = slurp(out), *e = slurp(errf);
    CHECK(rc == 130, "exit %d; stderr: %s", rc, e);
    CHECK(strlen(o) >= 16 && o[strlen(o) - 1] == '\n', "the text so far was not printed");
    CHECK(strstr(e, "interrupted (Ctrl-C)") && strstr(e, "generated "), "no summary: %s", e);
    free(o);
    free(e);
    unlink(out);
    unlink(errf);
}

/* Runs k3 with args and returns its stdout (malloc'd), or NULL unless it exits 0. */
static char *k3_stdout(char *const args[]) {
    char out[] = "/tmp/k3-test-out-XXXXXX", errf[] = "/tmp/k3-test-err-XXXXXX";
    close(mkstemp(out));
    close(mkstemp(errf));
    int rc = run_k3(args, out, errf, 0);
    char *o = slurp(out), *e = slurp(errf);
    if (rc != 0) {
        k3_test_fail(__FILE__, __LINE__, "k3 %s exited %d: %s", args[1], rc, e);
        free(o);
        o = NULL;
    }
    free(e);
    unlink(out);
    unlink(errf);
    return o;
}

static void test_run_chat_seed_and_greedy(void) {
    const char *bin = k3_bin();
    if (k3_test_stopped()) return;
    char *b = (char *)bin;
    char *s1[] = {b, "run", NANO, "--chat", "--prompt", "Hi", "--max-new", "24", "--ids", "-q",
                  "--temperature", "0.9", "--top-p", "0.95", "--seed", "1234", NULL};
    char *s2[] = {b, "run", NANO, "--chat", "--prompt", "Hi", "--max-new", "24", "--ids", "-q",
                  "--temperature", "0.9", "--top-p", "0.95", "--seed", "99", NULL};
    char *g0[] = {b, "run", NANO, "--chat", "--prompt", "Hi", "--max-new", "24", "--ids", "-q",
                  "--temperature", "0", "--seed", "5", NULL};
    char *g1[] = {b, "run", NANO, "--chat", "--prompt", "Hi", "--max-new", "24", "--ids", "-q",
                  NULL};
    char *a = k3_stdout(s1), *a2 = k3_stdout(s1), *c = k3_stdout(s2);
    char *x = k3_stdout(g0), *y = k3_stdout(g1);
    if (k3_test_stopped()) return;
    CHECK(!strcmp(a, a2), "the same seed gave different tokens:\n%s\n%s", a, a2);
    CHECK(strcmp(a, c), "another seed gave the same 24 tokens: %s", a);
    CHECK(!strcmp(x, y), "temperature 0 is not greedy:\n%s\n%s", x, y);
    free(a), free(a2), free(c), free(x), free(y);
}

static void test_render_ids_match_chat_json(void) {
    const char *bin = k3_bin();
    if (k3_test_stopped()) return;
    char *json;
    size_t len;
    k3_err err = {0};
    CHECK(k3_read_file("tests/fixtures/tokenizer/chat.json", 1 << 26, &json, &len, &err) == 0);
    cJSON *chat = cJSON_Parse(json);
    free(json);
    int checked = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(chat, "cases")) {
        const char *id = cJSON_GetObjectItem(c, "id")->valuestring;
        if (strcmp(id, "chat-11") && strcmp(id, "chat-14") && strcmp(id, "chat-20")) continue;
        cJSON *body = cJSON_Duplicate(cJSON_GetObjectItem(c, "options"), 1);
        cJSON_AddItemToObject(body, "messages", cJSON_Duplicate(cJSON_GetObjectItem(c, "messages"), 1));
        if (!cJSON_IsNull(cJSON_GetObjectItem(c, "tools")))
            cJSON_AddItemToObject(body, "tools", cJSON_Duplicate(cJSON_GetObjectItem(c, "tools"), 1));
        char req[] = "/tmp/k3-test-req-XXXXXX";
        int fd = mkstemp(req);
        char *text = cJSON_PrintUnformatted(body);
        CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
        close(fd);
        char *args[] = {(char *)bin, "render", NANO, "--request", req, "--ids", NULL};
        char *ids = k3_stdout(args);
        char *want = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "ids_k3-nano"));
        if (ids) ids[strcspn(ids, "\n")] = 0;
        CHECK(ids && !strncmp(want + 1, ids, strlen(want) - 2) && strlen(ids) == strlen(want) - 2,
              "%s: %s", id, ids);
        char *args2[] = {(char *)bin, "render", "--request", req, NULL};
        char *rendered = k3_stdout(args2);
        CHECK(rendered && !strcmp(rendered, cJSON_GetObjectItem(c, "text")->valuestring), "%s", id);
        free(rendered);
        free(ids);
        free(want);
        free(text);
        unlink(req);
        cJSON_Delete(body);
        checked++;
    }
    CHECK(checked == 3);
    cJSON_Delete(chat);
}

const k3_test k3_suite_repl[] = {
    {"chat_in_a_terminal", test_chat_in_a_terminal},
    {"run_ctrl_c_exits_130", test_run_ctrl_c_exits_130},
    {"run_chat_seed_and_greedy", test_run_chat_seed_and_greedy},
    {"render_ids_match_chat_json", test_render_ids_match_chat_json},
    {0},
};
