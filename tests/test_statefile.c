/* test_statefile.c — issue 32's attacks on state files, in a folder others can write to
 * (serve's --state-dir) or named by a user (--load-state), on the k3-nano fixture:
 *  - D13: a FIFO at the name is refused at once (the load runs in a child, so that a load
 *    that blocks fails this test after a bounded wait instead of hanging it);
 *  - D14: a symbolic link at the old guessable temporary name (PATH.tmp) is not written
 *    through; a link at PATH itself is not read through;
 *  - D12: a cache's load (k3_session_load_prefix) takes only a file holding exactly the ids
 *    it was written for, by this build, and leaves the session untouched otherwise;
 *  - spill names come from k3_random_hex, not from a pid.
 * The server-level ones (two servers sharing --state-dir) are in tests/server/harden.test.mjs. */
#include "test.h"
#include "../src/engine/k3.h"
#include "../src/util/fileio.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NANO "tests/fixtures/k3-nano"
#define ENGINE_FIELD_AT 80 /* k3_state_file_header.engine: after payload_bytes (state_file.h) */

static const int32_t ids[] = {1792, 500, 501, 502, 503, 504};

typedef struct fixture {
    k3_engine *e;
    k3_session *s, *t;
    char dir[64], path[128];
} fixture;

/* k3-nano, two sessions, a scratch folder and a state file of ids[0, 4) at path. */
static int setup(fixture *f) {
    k3_err err = {0};
    memset(f, 0, sizeof *f);
    strcpy(f->dir, "/tmp/k3-test-statefile-XXXXXX");
    CHECK_OR(-1, mkdtemp(f->dir), "mkdtemp");
    snprintf(f->path, sizeof f->path, "%s/a.state", f->dir);
    CHECK_OR(-1, k3_engine_load(NANO, NULL, &f->e, &err) == K3_OK, "%s", err.msg);
    CHECK_OR(-1, k3_session_new(f->e, 64, &f->s, &err) == K3_OK, "%s", err.msg);
    CHECK_OR(-1, k3_session_new(f->e, 64, &f->t, &err) == K3_OK, "%s", err.msg);
    CHECK_OR(-1, k3_session_prefill(f->s, ids, 4, NULL, NULL, &err) == K3_OK, "%s", err.msg);
    CHECK_OR(-1, k3_session_save(f->s, f->path, &err) == K3_OK, "%s", err.msg);
    return 0;
}

static void teardown(fixture *f) {
    k3_session_free(f->s);
    k3_session_free(f->t);
    k3_engine_free(f->e);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    if (f->dir[0] && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", f->dir);
}

/* ---- D13: a FIFO ----------------------------------------------------------------------------- */

/* Runs k3_session_load(t, path) in a child; returns its status (the k3 code, 0 = loaded), or
 * -1 when it had not returned after 10 s (it blocked) and was killed. */
static int load_in_child(k3_session *t, const char *path, int prefix) {
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20); /* a safety net should the parent die */
        k3_err err = {0};
        int rc = prefix ? k3_session_load_prefix(t, path, ids, 4, &err)
                        : k3_session_load(t, path, &err);
        if (rc) fprintf(stderr, "    (child: %s)\n", err.msg);
        _exit(rc);
    }
    if (pid < 0) return -2;
    for (int i = 0; i < 1000; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -3;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static void test_fifo_refused_at_once(void) {
    fixture f;
    if (setup(&f)) {
        teardown(&f);
        return;
    }
    char fifo[160];
    snprintf(fifo, sizeof fifo, "%s/fifo.state", f.dir);
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo: %s", strerror(errno));
    int rc = load_in_child(f.t, fifo, 0), rc2 = load_in_child(f.t, fifo, 1);
    k3_err err = {0};
    int here = rc == -1 ? -1 : k3_session_load(f.t, fifo, &err); /* only once it cannot block */
    teardown(&f);
    CHECK(rc != -1 && rc2 != -1, "loading a FIFO blocked for 10 s (D13)");
    CHECK(rc == K3_ERR_IO && rc2 == K3_ERR_IO, "codes %d %d", rc, rc2);
    CHECK(here == K3_ERR_IO && strstr(err.msg, "not a regular file"), "%s", err.msg);
}

/* ---- D14: symbolic links ---------------------------------------------------------------------- */

static void test_link_at_temp_name_not_followed(void) {
    fixture f;
    if (setup(&f)) {
        teardown(&f);
        return;
    }
    char victim[160], tmp[200], buf[64] = "";
    snprintf(victim, sizeof victim, "%s/victim.txt", f.dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", f.path); /* the name k3 wrote through before */
    FILE *v = fopen(victim, "w");
    CHECK(v && fputs("precious\n", v) >= 0 && fclose(v) == 0);
    CHECK(symlink(victim, tmp) == 0, "%s", strerror(errno));
    k3_err err = {0};
    int rc = k3_session_save(f.s, f.path, &err);
    v = fopen(victim, "r");
    size_t n = v ? fread(buf, 1, sizeof buf - 1, v) : 0;
    if (v) fclose(v);
    buf[n] = 0;
    struct stat st;
    int is_link = lstat(tmp, &st) == 0 && S_ISLNK(st.st_mode);
    /* a link at the state file's own name is not read through either */
    char link[160];
    snprintf(link, sizeof link, "%s/link.state", f.dir);
    int made = symlink(f.path, link) == 0;
    k3_err lerr = {0};
    int lrc = made ? k3_session_load(f.t, link, &lerr) : -1;
    int ok_load = k3_session_load(f.t, f.path, &err) == K3_OK && k3_session_pos(f.t) == 4;
    teardown(&f);
    CHECK(rc == K3_OK, "%s", err.msg);
    CHECK(!strcmp(buf, "precious\n"), "the file behind PATH.tmp was overwritten (D14): "
          "now %zu bytes starting %.8s", n, buf);
    CHECK(is_link, "the planted link was replaced, not left alone");
    CHECK(lrc == K3_ERR_IO && strstr(lerr.msg, "symbolic link"), "%d: %s", lrc, lerr.msg);
    CHECK(ok_load, "the state written beside the link does not load back");
}

/* ---- D12: a cache's file holds what it claims --------------------------------------------------- */

/* Rewrites the engine stamp of the file at path and repairs its trailing checksum. */
static int restamp(const char *path, uint64_t stamp) {
    FILE *f = fopen(path, "r+b");
    CHECK_OR(-1, f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    unsigned char *b = malloc((size_t)n);
    rewind(f);
    CHECK_OR(-1, b && fread(b, 1, (size_t)n, f) == (size_t)n);
    memcpy(b + ENGINE_FIELD_AT, &stamp, 8);
    uint64_t h = XXH3_64bits(b, (size_t)n - 8);
    memcpy(b + n - 8, &h, 8);
    rewind(f);
    CHECK_OR(-1, fwrite(b, 1, (size_t)n, f) == (size_t)n && fclose(f) == 0);
    free(b);
    return 0;
}

static void test_prefix_load_checks_ids_and_build(void) {
    fixture f;
    if (setup(&f)) {
        teardown(&f);
        return;
    }
    k3_err err = {0};
    /* t holds 2 other positions: a refused load must leave them */
    const int32_t other[] = {1792, 9, 10, 11, 12};
    CHECK(k3_session_prefill(f.t, other, 2, NULL, NULL, &err) == K3_OK, "%s", err.msg);
    int32_t wrong[4];
    memcpy(wrong, ids, sizeof wrong);
    wrong[3] = 777;
    int r_wrong = k3_session_load_prefix(f.t, f.path, wrong, 4, &err);
    char msg[sizeof err.msg];
    snprintf(msg, sizeof msg, "%s", err.msg);
    int kept = k3_session_pos(f.t) == 2 && k3_session_tokens(f.t)[1] == 9;
    int r_short = k3_session_load_prefix(f.t, f.path, ids, 3, &err);
    int r_long = k3_session_load_prefix(f.t, f.path, ids, 5, &err);
    int r_ok = k3_session_load_prefix(f.t, f.path, ids, 4, &err);
    int loaded = k3_session_pos(f.t) == 4 && !memcmp(k3_session_tokens(f.t), ids, 4 * 4);
    /* another build's file: the cache refuses it, --load-state still takes it */
    int re = restamp(f.path, 0x1234);
    k3_session_reset(f.t);
    int r_build = re ? -1 : k3_session_load_prefix(f.t, f.path, ids, 4, &err);
    char bmsg[sizeof err.msg];
    snprintf(bmsg, sizeof bmsg, "%s", err.msg);
    int r_user = re ? -1 : k3_session_load(f.t, f.path, &err);
    teardown(&f);
    CHECK(r_wrong == K3_ERR_INPUT && strstr(msg, "another token prefix"), "%d: %s", r_wrong, msg);
    CHECK(kept, "a refused load touched the session");
    CHECK(r_short == K3_ERR_INPUT && r_long == K3_ERR_INPUT, "%d %d", r_short, r_long);
    CHECK(r_ok == K3_OK && loaded, "the matching load failed: %s", err.msg);
    CHECK(r_build == K3_ERR_INPUT && strstr(bmsg, "another k3 build"), "%d: %s", r_build, bmsg);
    CHECK(r_user == K3_OK, "--load-state of another build's file: %s", err.msg);
}

static void test_random_names(void) {
    char a[33], b[33];
    k3_err err = {0};
    CHECK(k3_random_hex(a, 16, &err) == K3_OK && k3_random_hex(b, 16, &err) == K3_OK, "%s",
          err.msg);
    CHECK(strlen(a) == 32 && strspn(a, "0123456789abcdef") == 32, "%s", a);
    CHECK(strcmp(a, b), "two draws gave %s", a);
}

const k3_test k3_suite_statefile[] = {
    {"fifo_refused_at_once", test_fifo_refused_at_once},
    {"link_at_temp_name_not_followed", test_link_at_temp_name_not_followed},
    {"prefix_load_checks_ids_and_build", test_prefix_load_checks_ids_and_build},
    {"random_names", test_random_names},
    {0},
};
