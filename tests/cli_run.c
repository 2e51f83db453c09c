/* cli_run.c — see cli_run.h. */
#include "cli_run.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/format/safetensors.h"
#include "pack_helpers.h"
#include "test.h"

const char *k3t_bin(void) {
    const char *b = getenv("K3_BIN");
    return b && *b ? b : "./k3";
}

const char *k3t_lab_bin(void) {
    const char *b = getenv("K3_LAB_BIN");
    return b && *b ? b : "./k3-lab";
}

/* The whole file as a NUL-terminated string (ph_read), the test failed when missing. */
static char *slurp(const char *path) {
    char *s = (char *)ph_read(path, NULL);
    CHECK_OR(NULL, s, "%s: cannot read", path);
    return s;
}

char *k3t_tmpdir(void) {
    char tmpl[] = "/tmp/k3-test-XXXXXX";
    CHECK_OR(NULL, mkdtemp(tmpl), "mkdtemp: %s", strerror(errno));
    return strdup(tmpl);
}

void k3t_rm_dir(char *dir) {
    if (!dir) return;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (strncmp(dir, "/tmp/k3-test-", 13) == 0 && system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", dir);
    free(dir);
}

char *k3t_nano_copy(void) {
    char *dir = k3t_tmpdir(), cmd[PATH_MAX + 64];
    if (!dir) return NULL;
    snprintf(cmd, sizeof cmd, "cp tests/fixtures/k3-nano/*.* '%s'/", dir);
    if (system(cmd) != 0) {
        k3t_rm_dir(dir);
        CHECK_OR(NULL, 0, "cannot copy tests/fixtures/k3-nano");
    }
    return dir;
}

int k3t_cli_run_in(const char *cwd, const char *bin, const char *args, k3t_cli *r) {
    *r = (k3t_cli){.status = -1};
    if (k3_test_stopped()) return -1;
    char abs[PATH_MAX];
    if (!bin) {
        CHECK_OR(-1, realpath(k3t_bin(), abs), "K3_BIN=%s: %s (make test sets it)", k3t_bin(),
                 strerror(errno));
        bin = abs;
    }
    char *tmp = k3t_tmpdir();
    if (!tmp) return -1;
    size_t cap = strlen(args) + strlen(bin) + 2 * strlen(tmp) + (cwd ? strlen(cwd) : 0) + 96;
    char *cmd = malloc(cap);
    if (cmd)
        snprintf(cmd, cap, "%s%s%s'%s' %s </dev/null >%s/out 2>%s/err", cwd ? "cd '" : "",
                 cwd ? cwd : "", cwd ? "' && " : "", bin, args, tmp, tmp);
    int st = cmd ? system(cmd) : -1;
    free(cmd);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/out", tmp);
    r->out = slurp(path);
    snprintf(path, sizeof path, "%s/err", tmp);
    r->err = slurp(path);
    k3t_rm_dir(tmp);
    CHECK_OR(-1, st != -1 && WIFEXITED(st), "could not run %s %s", bin, args);
    r->status = WEXITSTATUS(st);
    CHECK_OR(-1, r->status != 126 && r->status != 127, "could not exec %s", bin);
    return r->out && r->err ? 0 : -1;
}

int k3t_cli_run(const char *args, k3t_cli *r) { return k3t_cli_run_in(NULL, NULL, args, r); }

int k3t_lab_run(const char *args, k3t_cli *r) {
    *r = (k3t_cli){.status = -1};
    if (k3_test_stopped()) return -1;
    char abs[PATH_MAX];
    CHECK_OR(-1, realpath(k3t_lab_bin(), abs), "K3_LAB_BIN=%s: %s (make test sets it)",
             k3t_lab_bin(), strerror(errno));
    return k3t_cli_run_in(NULL, abs, args, r);
}

void k3t_cli_free(k3t_cli *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

int k3t_patch_bf16(const char *dir, const char *name, size_t index, uint16_t bits) {
    if (k3_test_stopped()) return -1;
    k3_checkpoint *ck = NULL;
    k3_err err = {0};
    CHECK_OR(-1, k3_checkpoint_open(dir, &ck, &err) == K3_OK, "%s", err.msg);
    const k3_tensor *t = k3_checkpoint_find(ck, name);
    char path[PATH_MAX];
    uint64_t off = 0;
    int ok = t && t->dtype == K3_DT_BF16 && (index + 1) * 2 <= t->nbytes;
    if (ok) {
        snprintf(path, sizeof path, "%s", ck->shards[t->shard].path);
        off = t->file_offset + index * 2;
    }
    k3_checkpoint_close(ck);
    CHECK_OR(-1, ok, "%s: no BF16 tensor %s with element %zu", dir, name, index);
    uint8_t le[2] = {(uint8_t)bits, (uint8_t)(bits >> 8)};
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    ssize_t w = fd >= 0 ? pwrite(fd, le, 2, (off_t)off) : -1;
    if (fd >= 0) close(fd);
    CHECK_OR(-1, w == 2, "%s: cannot patch: %s", path, strerror(errno));
    return 0;
}
