/* test_tokload.c — a damaged tiktoken.model is blamed by name, with the line when a line is
 * malformed; tokenizer_config.json is not blamed for it.
 *
 * The fixture k3-nano has 1792 ranks (one per line of tiktoken.model) and its
 * tokenizer_config.json names specials 1792..2047; the copies here lose the file's tail. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/tok/tokenizer.h"
#include "cli_run.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"

/* A folder with NANO's tokenizer_config.json and the first `bytes` bytes of its
 * tiktoken.model (or its first `lines` lines when bytes < 0). */
static char *cut_copy(long bytes, int lines) {
    char *dir = k3t_tmpdir(), cmd[512];
    if (!dir) return NULL;
    if (bytes >= 0)
        snprintf(cmd, sizeof cmd, "cp " NANO "/tokenizer_config.json %s/ && head -c %ld "
                 NANO "/tiktoken.model > %s/tiktoken.model", dir, bytes, dir);
    else
        snprintf(cmd, sizeof cmd, "cp " NANO "/tokenizer_config.json %s/ && head -n %d "
                 NANO "/tiktoken.model > %s/tiktoken.model", dir, lines, dir);
    if (system(cmd) != 0) {
        k3t_rm_dir(dir);
        CHECK_OR(NULL, 0, "%s failed", cmd);
    }
    return dir;
}

/* Loading dir fails with code, and the message contains every needle but not avoid. */
static void expect(const char *dir, int code, const char *const *needles, const char *avoid) {
    k3_tokenizer *t = NULL;
    k3_err err = {0};
    int rc = k3_tokenizer_load(dir, &t, &err);
    k3_tokenizer_free(t);
    CHECK(rc == code, "rc %d, want %d: %s", rc, code, err.msg);
    for (; *needles; needles++) CHECK(strstr(err.msg, *needles), "no \"%s\" in: %s", *needles, err.msg);
    CHECK(!avoid || !strstr(err.msg, avoid), "\"%s\" blamed: %s", avoid, err.msg);
}

/* Cut at a line boundary: every line is well formed, 1000 ranks, and the config's specials
 * (from 1792) cannot follow them: the message names tiktoken.model and the rank count. */
static void test_truncated_at_line_end(void) {
    char *dir = cut_copy(-1, 1000), path[600];
    if (!dir) return;
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    const char *const needles[] = {path, "only 1000 ranks", "truncated", "names special id",
                                   NULL};
    expect(dir, K3_ERR_TOKENIZER, needles, NULL);
    if (!k3_test_stopped()) { /* also through the CLI: exit 6, the same message */
        k3t_cli r;
        char args[600];
        snprintf(args, sizeof args, "tokenize %s hello", dir);
        if (!k3t_cli_run(args, &r)) {
            CHECK(r.status == K3_ERR_TOKENIZER, "exit %d: %s", r.status, r.err);
            CHECK(strstr(r.err, "k3 tokenize: ") == r.err && strstr(r.err, path) &&
                  strstr(r.err, "truncated"), "stderr: %s", r.err);
        }
        k3t_cli_free(&r);
    }
    k3t_rm_dir(dir);
}

/* Cut inside a line: that line is malformed; the message gives its number (the fixture's
 * lines are short, so byte 1000 falls in a line we count here) and says the file ends there. */
static void test_truncated_mid_line(void) {
    FILE *f = fopen(NANO "/tiktoken.model", "rb");
    CHECK(f, NANO "/tiktoken.model: cannot open");
    int line = 1, c;
    for (long i = 0; i < 1000 && (c = fgetc(f)) != EOF; i++) line += c == '\n';
    int next = fgetc(f);
    fclose(f);
    CHECK(next != '\n' && next != EOF, "byte 1000 ends a line; pick another cut");
    char *dir = cut_copy(1000, 0), want[640];
    if (!dir) return;
    snprintf(want, sizeof want, "%s/tiktoken.model:%d: ", dir, line);
    const char *const needles[] = {want, "truncated", NULL};
    expect(dir, K3_ERR_TOKENIZER, needles, "tokenizer_config.json");
    k3t_rm_dir(dir);
}

const k3_test k3_suite_tokload[] = {
    {"truncated_at_line_end", test_truncated_at_line_end},
    {"truncated_mid_line", test_truncated_mid_line},
    {0},
};
