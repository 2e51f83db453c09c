/* test_idlist.c — the one token-id list parser (src/cli/idlist.h) and its users:
 * `k3 run --prompt-ids`, `k3 quality --ids` and `k3 detokenize IDS | --file PATH` accept the
 * same text and fail with the same messages (exit 2 for a non-number, 7 for an id outside
 * the vocabulary naming the id and the vocabulary size). The k3-nano fixture's vocabulary has
 * 2048 ids; its tokenizer test case "Hello, world!" is ids 39,596,78,11,286,1733,0
 * (test_tokenizer.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cli/idlist.h"
#include "cli_run.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"
#define HELLO "39,596,78,11,286,1733,0"

static int parse(const char *s, int32_t **ids, size_t *n, k3_err *err) {
    return k3_cli_parse_ids(s, strlen(s), "--x", 0, 2048, ids, n, err);
}

static void test_parse_accepts(void) {
    static const struct { const char *text; size_t n; int32_t first, last; } ok[] = {
        {"1792", 1, 1792, 1792}, {"1,2,3", 3, 1, 3}, {"1, 2 ,3", 3, 1, 3},
        {"1 2\t3\n", 3, 1, 3}, {"0\n2047\n", 2, 0, 2047}, {" 7 ", 1, 7, 7}, {"", 0, 0, 0},
        {" \n ", 0, 0, 0}, {"5,\n6", 2, 5, 6},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int32_t *ids = NULL;
        size_t n = 99;
        k3_err err = {0};
        int rc = parse(ok[i].text, &ids, &n, &err);
        int good = rc == 0 && n == ok[i].n && (n == 0 || (ids[0] == ok[i].first &&
                                                          ids[n - 1] == ok[i].last));
        free(ids);
        CHECK(good, "'%s': rc %d n %zu: %s", ok[i].text, rc, n, err.msg);
    }
}

static void test_parse_refuses(void) {
    static const struct { const char *text; int code; const char *needle; } bad[] = {
        {"1,x", K3_ERR_USAGE, "'x' is not a token id"}, {"-1", K3_ERR_USAGE, "'-1'"},
        {"1.5", K3_ERR_USAGE, "'1.5'"}, {"1,,2", K3_ERR_USAGE, "empty item"},
        {",1", K3_ERR_USAGE, "empty item"}, {"1,", K3_ERR_USAGE, "empty item"},
        {",", K3_ERR_USAGE, "empty item"},
        {"2048", K3_ERR_INPUT, "token id 2048 is outside the vocabulary [0, 2048)"},
        {"1,99999999999999999999", K3_ERR_INPUT, "token id 99999999999999999999 is outside"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        k3_err err = {0};
        int rc = parse(bad[i].text, &ids, &n, &err);
        free(ids);
        CHECK(rc == bad[i].code && strstr(err.msg, bad[i].needle) && strstr(err.msg, "--x"),
              "'%s': rc %d, message: %s", bad[i].text, rc, err.msg);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    k3_err err = {0};
    const char *file = "1\n2\n3,x\n";
    int rc = k3_cli_parse_ids(file, strlen(file), "ids.txt", 1, 2048, &ids, &n, &err);
    free(ids);
    CHECK(rc == K3_ERR_USAGE && strstr(err.msg, "ids.txt:3: 'x'"), "file: %s", err.msg);
}

/* An id file may start with a UTF-8 byte order mark (Windows editors write one): skipped. A
 * NUL byte means the file is not text: refused at its line, not quoted as a broken id. */
static void test_parse_file_bom_nul(void) {
    int32_t *ids = NULL;
    size_t n = 0;
    k3_err err = {0};
    static const char bom[] = "\xEF\xBB\xBF" "39\n596\n";
    int rc = k3_cli_parse_ids(bom, sizeof bom - 1, "ids.txt", 1, 2048, &ids, &n, &err);
    CHECK(rc == 0 && n == 2 && ids && ids[0] == 39 && ids[1] == 596, "BOM: rc %d, n %zu: %s",
          rc, n, err.msg);
    free(ids), ids = NULL;
    static const char nul[] = "1\n2\0\n3\n";
    err = (k3_err){0};
    rc = k3_cli_parse_ids(nul, sizeof nul - 1, "ids.txt", 1, 2048, &ids, &n, &err);
    free(ids), ids = NULL;
    CHECK(rc == K3_ERR_USAGE && strstr(err.msg, "ids.txt:2") &&
          strstr(err.msg, "not a text file"), "NUL byte: rc %d: %s", rc, err.msg);
    static const char bin[] = "\0\0\0";
    err = (k3_err){0};
    rc = k3_cli_parse_ids(bin, sizeof bin - 1, "ids.txt", 1, 2048, &ids, &n, &err);
    free(ids);
    CHECK(rc == K3_ERR_USAGE && strstr(err.msg, "ids.txt:1") &&
          strstr(err.msg, "not a text file"), "NUL bytes: rc %d: %s", rc, err.msg);
}

/* Writes text to a new file in dir; returns its path (static). */
static const char *write_ids(const char *dir, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/ids.txt", dir);
    FILE *f = fopen(path, "w");
    CHECK_OR(NULL, f && fputs(text, f) >= 0 && fclose(f) == 0, "cannot write %s", path);
    return path;
}

/* Runs k3 args; checks the exit status and that stdout equals out (when non-NULL) and stderr
 * contains err_needle (when non-NULL). */
static void expect_cli(const char *args, int status, const char *out, const char *err_needle) {
    if (k3_test_stopped()) return;
    k3t_cli r;
    if (!k3t_cli_run(args, &r)) {
        CHECK(r.status == status, "k3 %s: exit %d, want %d; stderr: %s", args, r.status, status,
              r.err);
        CHECK(!out || !strcmp(r.out, out), "k3 %s: stdout '%s', want '%s'", args, r.out, out);
        CHECK(!err_needle || strstr(r.err, err_needle), "k3 %s: stderr lacks '%s': %s", args,
              err_needle, r.err);
    }
    k3t_cli_free(&r);
}

static void test_detokenize_file(void) {
    char *dir = k3t_tmpdir(), args[1024];
    const char *path = dir ? write_ids(dir, "39\n596, 78\n11 286\n1733,0\n") : NULL;
    if (path) {
        snprintf(args, sizeof args, "detokenize " NANO " --file %s", path);
        expect_cli(args, 0, "Hello, world!\n", NULL);
        snprintf(args, sizeof args, "detokenize --file %s", path); /* default DIR */
        expect_cli(args, 0, "Hello, world!\n", NULL);
        snprintf(args, sizeof args, "detokenize " NANO " --file %s 1,2", path);
        expect_cli(args, K3_ERR_USAGE, "", "--file and IDS both given");
        path = write_ids(dir, "39\n596\n4096\n");
        snprintf(args, sizeof args, "detokenize " NANO " --file %s", path);
        expect_cli(args, K3_ERR_INPUT, "", ":3: token id 4096 is outside the vocabulary [0, 2048)");
        path = write_ids(dir, "39\n5x\n");
        snprintf(args, sizeof args, "detokenize " NANO " --file %s", path);
        expect_cli(args, K3_ERR_USAGE, "", ":2: '5x' is not a token id");
        path = write_ids(dir, "\xEF\xBB\xBF" "39 596 78 11 286 1733 0\n");
        snprintf(args, sizeof args, "detokenize " NANO " --file %s", path);
        expect_cli(args, 0, "Hello, world!\n", NULL);
        expect_cli("detokenize " NANO " --file /nonexistent/ids.txt", K3_ERR_IO, "",
                   "/nonexistent/ids.txt");
    }
    k3t_rm_dir(dir);
}

/* The same list and the same mistakes give the same answers through both commands. */
static void test_run_and_detokenize_agree(void) {
    expect_cli("detokenize " NANO " '39 596 78 11 286 1733 0'", 0, "Hello, world!\n", NULL);
    expect_cli("detokenize " NANO " 1,x", K3_ERR_USAGE, "", "'x' is not a token id");
    expect_cli("run " NANO " -q --max-new 1 --prompt-ids 1,x", K3_ERR_USAGE, "",
               "'x' is not a token id");
    expect_cli("detokenize " NANO " 5,2048", K3_ERR_INPUT, "",
               "token id 2048 is outside the vocabulary [0, 2048)");
    expect_cli("run " NANO " -q --max-new 1 --prompt-ids 5,2048", K3_ERR_INPUT, "",
               "token id 2048 is outside the vocabulary [0, 2048)");
    expect_cli("detokenize " NANO " 1,,2", K3_ERR_USAGE, "", "empty item");
    expect_cli("run " NANO " -q --max-new 1 --prompt-ids 1,,2", K3_ERR_USAGE, "", "empty item");
    /* k3 tokenize's output feeds k3 run as it is (space- or comma-separated alike) */
    expect_cli("run " NANO " -q --max-new 1 --ids --prompt-ids '" HELLO "'", 0, NULL, NULL);
}

/* k3 quality --ids reads the same lists (space-separated too) and fails the same way. */
static void test_quality_ids(void) {
    if (k3_test_stopped()) return;
    k3t_cli a, b;
    if (k3t_cli_run("quality " NANO " -q --modes bf16 --ids 39,596,78,11", &a)) return;
    if (!k3t_cli_run("quality " NANO " -q --modes bf16 --ids '39 596\n78, 11'", &b)) {
        CHECK(a.status == 0 && b.status == 0, "exit %d / %d; stderr: %s / %s", a.status,
              b.status, a.err, b.err);
        CHECK(strstr(a.out, "bf16             3") && !strcmp(a.out, b.out),
              "comma- and space-separated lists differ:\n%s\n%s", a.out, b.out);
        k3t_cli_free(&b);
    }
    k3t_cli_free(&a);
    expect_cli("quality " NANO " -q --ids 1,x", K3_ERR_USAGE, "", "--ids '1,x': 'x' is not a "
               "token id");
    expect_cli("quality " NANO " -q --ids 5,2048", K3_ERR_INPUT, "",
               "token id 2048 is outside the vocabulary [0, 2048)");
    expect_cli("quality " NANO " -q --ids 1,,2", K3_ERR_USAGE, "", "empty item");
}

const k3_test k3_suite_idlist[] = {
    {"parse_accepts", test_parse_accepts},
    {"parse_refuses", test_parse_refuses},
    {"parse_file_bom_nul", test_parse_file_bom_nul},
    {"detokenize_file", test_detokenize_file},
    {"run_and_detokenize_agree", test_run_and_detokenize_agree},
    {"quality_ids", test_quality_ids},
    {0},
};
