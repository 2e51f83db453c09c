/* test_pcache.c — the prompt cache's core (src/server/pcache.h) on k3-nano: where snapshots
 * are taken (positions worked out by hand), that a restored prefix continues bit for bit as a
 * fresh prefill does, that a second cache on the same folder (another process, a restart)
 * finds the longest stored prefix, that a file holding other ids under a prefix's name is
 * refused, and the budget. */
#include "test.h"
#include "cli_run.h"
#include "../src/engine/k3.h"
#include "../src/server/pcache.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NANO "tests/fixtures/k3-nano"

static void test_marks(void) {
    /* eom = 9: message ends after positions 3, 5, 300, 310, 700, 4000; n = 4200 */
    size_t n = 4200;
    int32_t *ids = calloc(n, sizeof *ids);
    size_t out[16];
    if (!ids) return;
    ids[2] = ids[4] = ids[299] = ids[309] = ids[699] = ids[3999] = 9;
    size_t k = k3_pcache_marks(ids, n, 0, 9, 32, out, 16); /* passes of 32: every 2048 */
    /* 3: the first message end; 5: 2 after it, skipped; 300: 297 >= 256 after 3; 310: 10
     * after 300, skipped; 700: 400 after 300; 2048: every K3_PCACHE_EVERY; 4000: the last
     * message end; 4096: 96 after it, skipped */
    size_t want[] = {3, 300, 700, 2048, 4000};
    CHECK(k == 5, "%zu marks", k);
    for (size_t i = 0; i < k && i < 5; i++) CHECK(out[i] == want[i], "mark %zu: %zu", i, out[i]);
    /* past a reused prefix only the later ones; the prompt's end itself is never a mark */
    k = k3_pcache_marks(ids, n, 300, 9, 0, out, 16);
    CHECK(k == 3 && out[0] == 700, "%zu marks from 300, first %zu", k, out[0]);
    /* cut at 700: 700 is the prompt's end, never a mark (its logits come from the prefill) */
    CHECK(k3_pcache_marks(ids, 700, 0, 9, 0, out, 16) == 2, "a mark at n is not taken");
    /* prompt passes of 3000 ids: the inner marks at their ends, not every 2048 (which would
     * cut each pass short and read its experts again) */
    k = k3_pcache_marks(ids, n, 0, 9, 3000, out, 16);
    size_t want3000[] = {3, 300, 700, 3000, 4000};
    CHECK(k == 5, "%zu marks with passes of 3000", k);
    for (size_t i = 0; i < k && i < 5; i++)
        CHECK(out[i] == want3000[i], "mark %zu with passes of 3000: %zu", i, out[i]);
    free(ids);
}

static int files_in(const char *dir, off_t *bytes) {
    DIR *d = opendir(dir);
    int n = 0;
    *bytes = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        if (strncmp(de->d_name, "k3pc-", 5)) continue;
        char p[512];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (!stat(p, &st)) *bytes += st.st_size;
        n++;
    }
    if (d) closedir(d);
    return n;
}

static void test_restore_continues_exactly(void) {
    k3_engine *e = NULL;
    k3_session *a = NULL, *b = NULL;
    k3_pcache *pc = NULL, *pc2 = NULL;
    k3_err err = {0};
    CHECK(k3_engine_load(NANO, NULL, &e, &err) == K3_OK, "%s", err.msg);
    if (k3_test_stopped()) return;
    CHECK(k3_session_new(e, 256, &a, &err) == K3_OK && k3_session_new(e, 256, &b, &err) == K3_OK);
    char dir[] = "/tmp/k3-test-pcache-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK(k3_pcache_open(e, dir, 1.0, 0, &pc, &err) == K3_OK, "%s", err.msg);
    if (k3_test_stopped()) return;
    int vocab = k3_engine_config(e)->vocab_size;
    float *la = malloc(vocab * sizeof *la), *lb = malloc(vocab * sizeof *lb);
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = 500 + (i * 37) % 900;
    k3_pcache_stats st = {0};
    /* snapshots after 40 and 70 ids of one prompt (70 crosses a 64-id block of the chain) */
    CHECK(k3_session_prefill(a, ids, 40, NULL, NULL, &err) == K3_OK);
    k3_pcache_save(pc, a, &st);
    CHECK(k3_session_prefill(a, ids, 70, NULL, NULL, &err) == K3_OK);
    k3_pcache_save(pc, a, &st);
    k3_pcache_save(pc, a, &st); /* stored already: not written again */
    CHECK(st.saves == 2, "%llu saves", st.saves);
    off_t bytes;
    CHECK(files_in(dir, &bytes) == 2 && (unsigned long long)bytes == st.bytes_written);
    /* the reference: the whole prompt prefilled from empty */
    CHECK(k3_session_prefill(a, ids, 100, la, NULL, &err) == K3_OK);

    /* a second cache on the folder (a restart): the longest stored prefix, then bit-exact */
    CHECK(k3_pcache_open(e, dir, 1.0, 1, &pc2, &err) == K3_OK, "%s", err.msg);
    k3_pcache_stats s2 = {0};
    CHECK(k3_pcache_restore(pc2, b, ids, 100, 0, 99, &s2) == 70);
    CHECK(s2.hits == 1 && s2.tokens_restored == 70 && s2.bytes_read > 0);
    int reused = 0;
    CHECK(k3_session_prefill(b, ids, 100, lb, &reused, &err) == K3_OK && reused == 70);
    CHECK(!memcmp(la, lb, vocab * sizeof *la), "restored state diverges");
    /* the RAM tier (1 snapshot) kept the 70 one: restored again with its file gone */
    char gone[600] = "";
    off_t big = 0;
    DIR *gd = opendir(dir);
    for (struct dirent *de; gd && (de = readdir(gd));) {
        char p[600];
        struct stat fst;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (!strncmp(de->d_name, "k3pc-", 5) && !stat(p, &fst) && fst.st_size > big)
            big = fst.st_size, strcpy(gone, p);
    }
    if (gd) closedir(gd);
    char keep[640];
    snprintf(keep, sizeof keep, "%s.away", gone);
    CHECK(gone[0] && rename(gone, keep) == 0);
    k3_session_reset(b);
    CHECK(k3_pcache_restore(pc2, b, ids, 100, 0, 99, &s2) == 70 && s2.ram_hits == 1,
          "%llu RAM hits", s2.ram_hits);
    CHECK(k3_session_prefill(b, ids, 100, lb, &reused, &err) == K3_OK && reused == 70);
    CHECK(!memcmp(la, lb, vocab * sizeof *la), "the state restored from RAM diverges");
    CHECK(rename(keep, gone) == 0);
    /* at most 69: the 40 one; more than 40 asked: none */
    k3_session_reset(b);
    CHECK(k3_pcache_restore(pc2, b, ids, 100, 0, 69, &s2) == 40);
    k3_session_reset(b);
    CHECK(k3_pcache_restore(pc2, b, ids, 100, 40, 69, &s2) == 0 && k3_session_pos(b) == 0);
    /* a prompt that differs at id 50: only the 40 prefix matches */
    int32_t other[100];
    memcpy(other, ids, sizeof other);
    other[50] = 7;
    CHECK(k3_pcache_restore(pc2, b, other, 100, 0, 99, &s2) == 40);

    /* a file holding other ids (70 of `other`) under the 70 prefix's name: refused when
     * its ids are compared, the session untouched, the 40 one used instead */
    char p70[600] = "";
    off_t biggest = 0;
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        char p[600];
        struct stat fst;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (!strncmp(de->d_name, "k3pc-", 5) && !stat(p, &fst) && fst.st_size > biggest)
            biggest = fst.st_size, strcpy(p70, p);
    }
    if (d) closedir(d);
    CHECK(p70[0]);
    k3_session_reset(b);
    CHECK(k3_session_prefill(b, other, 70, NULL, NULL, &err) == K3_OK);
    CHECK(k3_session_save(b, p70, &err) == K3_OK, "%s", err.msg);
    k3_pcache_stats s3 = {0};
    k3_session_reset(b);
    k3_pcache *pc3 = NULL; /* no RAM tier: pc2's RAM copies are not files */
    CHECK(k3_pcache_open(e, dir, 1.0, 0, &pc3, &err) == K3_OK, "%s", err.msg);
    CHECK(pc3 && k3_pcache_restore(pc3, b, ids, 100, 0, 99, &s3) == 40 && s3.skipped == 1,
          "skipped %llu", s3.skipped);
    k3_pcache_close(pc3);
    CHECK(!memcmp(k3_session_tokens(b), ids, 40 * sizeof *ids));
    char cmd[1400];

    /* the budget: a third prefix over a budget of ~1.5 files evicts the least recently used */
    k3_pcache_close(pc);
    CHECK(k3_pcache_open(e, dir, (double)bytes / 2 * 1.5 / 1e9, 0, &pc, &err) == K3_OK);
    k3_pcache_stats s4 = {0};
    CHECK(k3_session_prefill(a, other, 60, NULL, NULL, &err) == K3_OK);
    k3_pcache_save(pc, a, &s4);
    off_t after;
    files_in(dir, &after);
    CHECK(s4.saves == 1 && s4.evicted >= 1 && (double)after <= (double)bytes / 2 * 1.5 + 1,
          "%llu evicted, %lld bytes", s4.evicted, (long long)after);

    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    free(la);
    free(lb);
    k3_pcache_close(pc);
    k3_pcache_close(pc2);
    k3_session_free(a);
    k3_session_free(b);
    k3_engine_free(e);
}

/* k3 run --prompt-cache: a second run with the same system prompt and another question resumes
 * from the first run's snapshot and prints what a run without the cache prints. */
static void test_run_resumes_from_another_run(void) {
    char *dir = k3t_tmpdir();
    if (!dir) return;
    char args[3][1024];
    const char *common = "tests/fixtures/k3-tiny-kjv --chat --no-think --max-new 8 --ids "
                         "--system \"$(head -c 1500 tests/fixtures/kjv-heldout-philippians.txt)\"";
    snprintf(args[0], sizeof args[0], "run %s --prompt 'Who wrote this?' --prompt-cache %s",
             common, dir);
    snprintf(args[1], sizeof args[1], "run %s --prompt 'To whom?' --prompt-cache %s", common, dir);
    snprintf(args[2], sizeof args[2], "run %s --prompt 'To whom?'", common);
    k3t_cli r[3] = {0};
    for (int i = 0; i < 3; i++) CHECK(k3t_cli_run(args[i], &r[i]) == 0 && r[i].status == 0,
                                      "run %d: %s", i, r[i].err ? r[i].err : "");
    if (!k3_test_stopped()) {
        CHECK(strstr(r[0].err, "snapshots written") && !strstr(r[0].err, "from the state"),
              "%s", r[0].err);
        CHECK(strstr(r[1].err, "prompt tokens restored") && strstr(r[1].err, "from the state"),
              "%s", r[1].err);
        CHECK(!strcmp(r[1].out, r[2].out), "with the cache: %s\nwithout: %s", r[1].out, r[2].out);
    }
    for (int i = 0; i < 3; i++) k3t_cli_free(&r[i]);
    k3t_rm_dir(dir);
}

/* k3 chat --prompt-cache: a new chat with the same system prompt resumes from an earlier chat's
 * snapshot and prints what a chat without the cache prints. */
static void test_chat_resumes_from_another_chat(void) {
    char *dir = k3t_tmpdir();
    if (!dir) return;
    /* stdin from a file: through a script run by sh (k3t_cli_run gives /dev/null) */
    char in[600], sh[600], args[3][1200], bin[4096];
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(sh, sizeof sh, "%s/chat.sh", dir);
    FILE *f = fopen(in, "w");
    CHECK(f && fputs("Who wrote this?\n", f) >= 0 && fclose(f) == 0);
    CHECK(realpath(k3t_bin(), bin) != NULL, "%s", k3t_bin());
    f = fopen(sh, "w");
    int wrote = f ? fprintf(f, "exec '%s' chat tests/fixtures/k3-tiny-kjv --no-think --max-new 8 "
                            "--system \"$(head -c 1500 tests/fixtures/kjv-heldout-philippians.txt)"
                            "\" \"$@\" < '%s'\n", bin, in) : -1;
    CHECK(wrote > 0 && fclose(f) == 0);
    snprintf(args[0], sizeof args[0], "%s --prompt-cache %s", sh, dir);
    snprintf(args[1], sizeof args[1], "%s --prompt-cache %s", sh, dir);
    snprintf(args[2], sizeof args[2], "%s", sh);
    k3t_cli r[3] = {0};
    for (int i = 0; i < 3; i++)
        CHECK(k3t_cli_run_in(NULL, "/bin/sh", args[i], &r[i]) == 0 && r[i].status == 0,
              "chat %d: %s", i, r[i].err ? r[i].err : "");
    if (!k3_test_stopped()) {
        CHECK(strstr(r[0].err, "snapshots written"), "%s", r[0].err);
        CHECK(strstr(r[1].err, "prompt tokens restored"), "%s", r[1].err);
        /* the reply is the line after the prompt; the summaries' times differ */
        const char *a = strstr(r[1].out, ">>> "), *b = strstr(r[2].out, ">>> ");
        const char *ea = a ? strstr(a, "\n[") : NULL, *eb = b ? strstr(b, "\n[") : NULL;
        CHECK(ea && eb && ea - a == eb - b && !memcmp(a, b, (size_t)(ea - a)),
              "with the cache: %s\nwithout: %s", r[1].out, r[2].out);
    }
    for (int i = 0; i < 3; i++) k3t_cli_free(&r[i]);
    k3t_rm_dir(dir);
}

/* A snapshot inside a message (at 2048: prompt passes of 32 ids, --chunk 32) is dropped once the
 * same prompt's next one (the message end at 3000) is written; a later prompt sharing 3,500 ids
 * resumes at 3000 and prints what a run without the cache prints. */
static void test_inner_snapshot_superseded(void) {
    char *dir = k3t_tmpdir();
    if (!dir) return;
    k3t_cli eom = {0};
    CHECK(k3t_cli_run("tokenize tests/fixtures/k3-nano --special '<|end_of_msg|>'", &eom) == 0);
    int e = eom.out ? atoi(eom.out) : 0;
    k3t_cli_free(&eom);
    CHECK(e > 0);
    char *ids = malloc(4000 * 8), *ids2 = malloc(4000 * 8);
    size_t len = 0, len2 = 0;
    for (int i = 0; ids && ids2 && i < 4000; i++) {
        int v = i == 2999 ? e : 500 + (i * 37) % 900;
        len += (size_t)sprintf(ids + len, "%s%d", i ? "," : "", v);
        if (i < 3500) len2 += (size_t)sprintf(ids2 + len2, "%s%d", i ? "," : "", v);
    }
    if (ids2) strcat(ids2, ",7,8,9");
    char *args = malloc(64000);
    k3t_cli r[3] = {0};
    if (args && ids && ids2 && !k3_test_stopped()) {
        snprintf(args, 64000, "run tests/fixtures/k3-nano --max-new 2 --ids --chunk 32 "
                 "--prompt-ids %s --prompt-cache %s", ids, dir);
        CHECK(k3t_cli_run(args, &r[0]) == 0 && r[0].status == 0, "%s", r[0].err);
        CHECK(strstr(r[0].err, "2 snapshots written"), "%s", r[0].err);
        off_t bytes;
        CHECK(files_in(dir, &bytes) == 1, "the 2048 snapshot was not dropped");
        snprintf(args, 64000, "run tests/fixtures/k3-nano --max-new 2 --ids --prompt-ids %s "
                 "--prompt-cache %s", ids2, dir);
        CHECK(k3t_cli_run(args, &r[1]) == 0 && r[1].status == 0, "%s", r[1].err);
        CHECK(strstr(r[1].err, "3000 prompt tokens restored"), "%s", r[1].err);
        snprintf(args, 64000, "run tests/fixtures/k3-nano --max-new 2 --ids --prompt-ids %s",
                 ids2);
        CHECK(k3t_cli_run(args, &r[2]) == 0 && r[2].status == 0, "%s", r[2].err);
        CHECK(r[1].out && r[2].out && !strcmp(r[1].out, r[2].out), "%s vs %s", r[1].out,
              r[2].out);
    }
    for (int i = 0; i < 3; i++) k3t_cli_free(&r[i]);
    free(args);
    free(ids);
    free(ids2);
    k3t_rm_dir(dir);
}

const k3_test k3_suite_pcache[] = {
    {"inner_snapshot_superseded", test_inner_snapshot_superseded},
    {"chat_resumes_from_another_chat", test_chat_resumes_from_another_chat},
    {"run_resumes_from_another_run", test_run_resumes_from_another_run},
    {"marks", test_marks},
    {"restore_continues_exactly", test_restore_continues_exactly},
    {NULL, NULL},
};
