/* test_chatfail.c — a k3 chat turn that fails (here: non-finite logits from an lm_head row
 * patched to +Inf in a copy of k3-nano, so every reply fails with K3_ERR_CHECKPOINT) leaves
 * no trace in the conversation: its user message is not kept, so the next turn does not
 * send the model two user messages in a row and /save writes only what was answered; the
 * chat's exit status is the failed turn's (5), so a script sees it. (An interrupted prefill
 * keeps its message on purpose: the next turn continues it.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../src/util/err.h"

#include "cli_run.h"
#include "test.h"

#define LM_HEAD "language_model.lm_head.weight"

/* Runs `printf INPUT | k3 chat DIR -q --max-new 3`, stdout into out (cap bytes); returns the
 * exit status (-1 if it did not exit). */
static int chat(const char *dir, const char *input, char *out, size_t cap) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "printf '%s' | '%s' chat '%s' -q --max-new 3 2>/dev/null",
             input, k3t_bin(), dir);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_failed_turn_not_kept(void) {
    char *dir = k3t_nano_copy(), *tmp = k3t_tmpdir(), input[512], out[8192];
    if (!dir || !tmp || k3t_patch_bf16(dir, LM_HEAD, 7 * 64 + 3, 0x7f80)) goto done;
    snprintf(input, sizeof input, "first question\\nsecond question\\n/save %s/conv.json\\n",
             tmp);
    int status = chat(dir, input, out, sizeof out);
    CHECK(strstr(out, "error: non-finite logits"), "the turn did not fail: %s", out);
    CHECK(status == K3_ERR_CHECKPOINT, "exit status %d, want %d", status, K3_ERR_CHECKPOINT);
    char path[600];
    snprintf(path, sizeof path, "%s/conv.json", tmp);
    FILE *f = fopen(path, "r");
    char saved[8192] = "";
    if (f) saved[fread(saved, 1, sizeof saved - 1, f)] = 0, fclose(f);
    CHECK(f, "/save wrote nothing: %s", out);
    CHECK(f && !strstr(saved, "first question") && !strstr(saved, "second question"),
          "failed turns stayed in the conversation: %s", saved);
done:
    k3t_rm_dir(dir);
    k3t_rm_dir(tmp);
}

const k3_test k3_suite_chatfail[] = {
    {"failed_turn_not_kept", test_failed_turn_not_kept},
    {0},
};
