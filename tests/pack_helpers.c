/* pack_helpers.c — see pack_helpers.h. */
#include "pack_helpers.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/format/safetensors.h"
#include "test.h"

char *ph_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

char *ph_tmpdir(void) {
    const char *t = getenv("TMPDIR");
    char *tmpl = ph_join(t && *t ? t : "/tmp", "k3packtest.XXXXXX");
    CHECK_OR(NULL, tmpl && mkdtemp(tmpl), "cannot create a temporary folder");
    return tmpl;
}

void ph_rmdir(const char *dir) {
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = ph_join(dir, e->d_name);
        if (p) unlink(p);
        free(p);
    }
    closedir(d);
    rmdir(dir);
}

uint8_t *ph_read(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0;
    if (len) *len = (size_t)n;
    return b;
}

int ph_write(const char *path, const uint8_t *b, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(b, 1, len, f);
    return fclose(f) == 0 && w == len ? 0 : -1;
}

int ph_copy_dir(const char *src, const char *dst) {
    DIR *d = opendir(src);
    if (!d) return -1;
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        char *s = ph_join(src, e->d_name), *t = ph_join(dst, e->d_name);
        struct stat st;
        if (s && t && stat(s, &st) == 0 && S_ISREG(st.st_mode)) {
            size_t n;
            uint8_t *b = ph_read(s, &n);
            rc = b ? ph_write(t, b, n) : -1;
            free(b);
        }
        free(s);
        free(t);
    }
    closedir(d);
    return rc;
}

int ph_wide(const char **model, const char **ref) {
    struct stat st;
    *model = getenv("K3_WIDE_DIR");
    if (!*model || stat(*model, &st) != 0) {
        k3_test_skip("K3_WIDE_DIR is not set to a generated k3-wide model");
        return 0;
    }
    if (!ref) return 1;
    *ref = getenv("K3_WIDE_REF");
    if (!*ref) *ref = "../shared/fixtures/k3-wide/reference";
    if (stat(*ref, &st) != 0) {
        k3_test_skip("no k3-wide reference folder at %s", *ref);
        return 0;
    }
    return 1;
}

int ph_nano_tensor(const char *name, char **dir, char **shard, uint64_t *offset) {
    *dir = ph_tmpdir();
    *shard = NULL;
    if (!*dir) return -1;
    k3_checkpoint *ck = NULL;
    k3_err err = {0};
    int rc = ph_copy_dir(NANO, *dir) ? -1 : k3_checkpoint_open(*dir, &ck, &err);
    const k3_tensor *t = rc ? NULL : k3_checkpoint_find(ck, name);
    if (t) *shard = strdup(ck->shards[t->shard].path), *offset = t->file_offset;
    k3_checkpoint_close(ck);
    if (*shard) return 0;
    ph_rmdir(*dir);
    free(*dir), *dir = NULL;
    k3_test_fail(__FILE__, __LINE__, "a copy of %s with tensor %s: %s", NANO, name,
                 err.msg[0] ? err.msg : "copy failed or tensor missing");
    return -1;
}

int ph_k3(const char *args, char **out, char **err) {
    const char *bin = getenv("K3_BIN");
    if (!bin || !*bin) bin = "./k3";
    CHECK_OR(-1, access(bin, X_OK) == 0, "K3_BIN=%s is not executable (make test sets it)", bin);
    char *dir = ph_tmpdir();
    if (!dir) return -1;
    char *po = ph_join(dir, "out"), *pe = ph_join(dir, "err");
    size_t n = strlen(bin) + strlen(args) + strlen(po) + strlen(pe) + 32;
    char *cmd = malloc(n);
    snprintf(cmd, n, "%s %s >%s 2>%s </dev/null", bin, args, po, pe);
    int st = system(cmd);
    if (out) *out = (char *)ph_read(po, NULL);
    if (err) *err = (char *)ph_read(pe, NULL);
    free(cmd);
    free(po);
    free(pe);
    ph_rmdir(dir);
    free(dir);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *g_pack[2]; /* NANO, KJV_DIR */
static void drop_packs(void) {
    for (int i = 0; i < 2; i++) {
        ph_rmdir(g_pack[i]);
        free(g_pack[i]);
    }
}

/* `k3 pack model --out DIR` into a fresh folder, once per process (slot). */
static const char *pack_once(int slot, const char *model) {
    static int registered;
    if (g_pack[slot]) return g_pack[slot];
    char *dir = ph_tmpdir();
    if (!dir) return NULL;
    size_t n = strlen(dir) + strlen(model) + 32;
    char *args = malloc(n), *err = NULL;
    snprintf(args, n, "pack %s --out %s -q", model, dir);
    int st = ph_k3(args, NULL, &err);
    free(args);
    if (st != 0) {
        k3_test_fail(__FILE__, __LINE__, "k3 pack %s exited %d: %s", model, st, err ? err : "");
        free(err);
        ph_rmdir(dir);
        free(dir);
        return NULL;
    }
    free(err);
    g_pack[slot] = dir;
    if (!registered++) atexit(drop_packs);
    return dir;
}

const char *ph_nano_pack(void) { return pack_once(0, NANO); }
const char *ph_kjv_pack(void) { return pack_once(1, KJV_DIR); }
