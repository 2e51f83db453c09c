/* test_badinput.c — a broken snapshot or command line fails cleanly, with the right code.
 *
 * Each test copies tests/fixtures/k3-nano into a fresh mkdtemp folder under /tmp, breaks one
 * thing, and checks both
 *  (a) k3_engine_load: the status code, and a message naming the file and the tensor/field;
 *  (b) the CLI (`$K3_BIN run DIR --prompt-ids 1792 --max-new 2`, K3_BIN defaults to ./k3):
 *      exit status equal to that code, stderr starting with "k3 run: " and naming the file, and
 *      an empty stdout (no garbage tokens).
 * The fixture itself is never written. Temporary folders are removed afterwards.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/engine/k3.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"
#define INDEX "model.safetensors.index.json"
#define SHARD(n) "model-000" #n "-of-000011.safetensors"
#define SHARD3 "model-00003-of-000011.safetensors"
#define SHARD5 "model-00005-of-000011.safetensors"
#define SHARD11 "model-00011-of-000011.safetensors"
#define L2 "language_model.model.layers.2."
#define Q_PROJ L2 "self_attn.q_proj.weight"

/* ---- files ------------------------------------------------------------------------------ */

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    CHECK_OR(NULL, f, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, (cap = cap ? 2 * cap : 65536) + 1);
            if (!nb) break;
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f) || !buf;
    fclose(f);
    if (bad) free(buf);
    CHECK_OR(NULL, !bad, "%s: read failed", path);
    buf[n] = 0;
    *len = n;
    return buf;
}

static void write_all(const char *path, const void *buf, size_t len) {
    if (k3_test_stopped()) return;
    FILE *f = fopen(path, "wb");
    CHECK(f, "%s: %s", path, strerror(errno));
    size_t w = fwrite(buf, 1, len, f);
    int rc = fclose(f);
    CHECK(w == len && rc == 0, "%s: write failed", path);
}

static void copy_file(const char *from, const char *to) {
    size_t len = 0;
    char *buf = read_all(from, &len);
    if (!buf) return;
    write_all(to, buf, len);
    free(buf);
}

/* Removes every entry of dir (files only: the copies have no subfolders) and dir itself. */
static void rm_tree(char *dir) {
    if (!dir) return;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *p = join(dir, e->d_name);
            if (p && unlink(p) != 0) fprintf(stderr, "test_badinput: cannot remove %s\n", p);
            free(p);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

static char *make_tmpdir(void) {
    char tmpl[] = "/tmp/k3-badinput-XXXXXX";
    CHECK_OR(NULL, mkdtemp(tmpl), "mkdtemp: %s", strerror(errno));
    return strdup(tmpl);
}

/* A fresh copy of k3-nano's regular files (reference/ is not needed) in a new /tmp folder. */
static char *nano_copy(void) {
    char *dir = make_tmpdir();
    if (!dir) return NULL;
    DIR *d = opendir(NANO);
    if (!d) {
        rm_tree(dir);
        CHECK_OR(NULL, 0, NANO ": %s", strerror(errno));
    }
    struct dirent *e;
    while (!k3_test_stopped() && (e = readdir(d))) {
        char *from = join(NANO, e->d_name);
        struct stat st;
        if (from && lstat(from, &st) == 0 && S_ISREG(st.st_mode)) {
            char *to = join(dir, e->d_name);
            if (to) copy_file(from, to);
            free(to);
        }
        free(from);
    }
    closedir(d);
    if (k3_test_stopped()) {
        rm_tree(dir);
        return NULL;
    }
    return dir;
}

static void remove_file(const char *dir, const char *name) {
    if (k3_test_stopped()) return;
    char *p = join(dir, name);
    int rc = p ? unlink(p) : -1;
    free(p);
    CHECK(rc == 0, "%s/%s: %s", dir, name, strerror(errno));
}

static void truncate_file(const char *dir, const char *name, long long new_size) {
    if (k3_test_stopped()) return;
    char *p = join(dir, name);
    int rc = p ? truncate(p, (off_t)new_size) : -1;
    free(p);
    CHECK(rc == 0, "truncate %s: %s", name, strerror(errno));
}

static long long file_size(const char *dir, const char *name) {
    char *p = join(dir, name);
    struct stat st;
    int rc = p ? stat(p, &st) : -1;
    free(p);
    CHECK_OR(-1, rc == 0, "stat %s: %s", name, strerror(errno));
    return (long long)st.st_size;
}

/* ---- JSON files and shard headers -------------------------------------------------------- */

static cJSON *json_load(const char *dir, const char *name) {
    if (k3_test_stopped()) return NULL;
    char *p = join(dir, name);
    size_t len;
    char *text = p ? read_all(p, &len) : NULL;
    free(p);
    if (!text) return NULL;
    cJSON *root = cJSON_Parse(text);
    free(text);
    CHECK_OR(NULL, root, "%s: not JSON", name);
    return root;
}

/* Writes root to dir/name and frees it. */
static void json_save(const char *dir, const char *name, cJSON *root) {
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) {
        CHECK(k3_test_stopped(), "cJSON_Print failed");
        return;
    }
    char *p = join(dir, name);
    if (p) write_all(p, text, strlen(text));
    free(p);
    free(text);
}

typedef struct shard {
    char *path;
    cJSON *header;
    char *file;     /* the whole file */
    size_t len;
    size_t data_at; /* 8 + header length */
} shard;

static int shard_load(const char *dir, const char *name, shard *s) {
    memset(s, 0, sizeof *s);
    if (k3_test_stopped()) return -1;
    s->path = join(dir, name);
    s->file = s->path ? read_all(s->path, &s->len) : NULL;
    CHECK_OR(-1, s->file && s->len >= 8, "%s: unreadable or too short", name);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | (unsigned char)s->file[i];
    CHECK_OR(-1, 8 + n <= s->len, "%s: bad header length", name);
    s->data_at = 8 + (size_t)n;
    char *json = strndup(s->file + 8, (size_t)n);
    s->header = json ? cJSON_Parse(json) : NULL;
    free(json);
    CHECK_OR(-1, s->header, "%s: header is not JSON", name);
    return 0;
}

static void shard_free(shard *s) {
    cJSON_Delete(s->header);
    free(s->file);
    free(s->path);
    memset(s, 0, sizeof *s);
}

/* Rewrites the shard as: new header length, the edited header padded with spaces to a
 * multiple of 8 (as the safetensors serializer does), then the unchanged data. Offsets are
 * relative to the data, so a header of another length is fine. Frees s. */
static void shard_save(shard *s) {
    char *json = k3_test_stopped() ? NULL : cJSON_PrintUnformatted(s->header);
    if (json) {
        size_t n = strlen(json), padded = (n + 7) & ~(size_t)7, data = s->len - s->data_at;
        unsigned char *out = malloc(8 + padded + data);
        if (out) {
            for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)padded >> (8 * i));
            memcpy(out + 8, json, n);
            memset(out + 8 + n, ' ', padded - n);
            memcpy(out + 8 + padded, s->file + s->data_at, data);
            write_all(s->path, out, 8 + padded + data);
        }
        CHECK(out, "out of memory");
        free(out);
        free(json);
    }
    shard_free(s);
}

/* The header entry of tensor name; records a failure when absent. */
static cJSON *entry(shard *s, const char *name) {
    if (k3_test_stopped()) return NULL;
    cJSON *e = cJSON_GetObjectItemCaseSensitive(s->header, name);
    CHECK_OR(NULL, cJSON_IsObject(e), "%s not in %s", name, s->path);
    return e;
}

static void set_item(cJSON *e, const char *key, cJSON *value) {
    if (!e) {
        cJSON_Delete(value);
        return;
    }
    CHECK(value && cJSON_ReplaceItemInObjectCaseSensitive(e, key, value), "cannot set %s", key);
}

static cJSON *pair(double a, double b) {
    cJSON *arr = cJSON_CreateArray();
    cJSON_AddItemToArray(arr, cJSON_CreateNumber(a));
    cJSON_AddItemToArray(arr, cJSON_CreateNumber(b));
    return arr;
}

static double offset_of(cJSON *e, int which) {
    return e ? cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(e, "data_offsets"), which)
                   ->valuedouble
             : 0;
}

/* ---- the two checks ---------------------------------------------------------------------- */

static int has_all(const char *text, const char *const *needles, const char **missing) {
    for (; *needles; needles++)
        if (!strstr(text, *needles)) {
            *missing = *needles;
            return 0;
        }
    return 1;
}

/* (a) k3_engine_load returns code and a message containing every needle; the message is
 * copied to msg (sizeof k3_err.msg bytes) when msg is non-NULL. */
static void expect_load(const char *dir, int code, const char *const *needles, char *msg) {
    if (msg) msg[0] = 0;
    if (k3_test_stopped()) return;
    k3_engine *e = NULL;
    k3_err err = {0};
    k3_engine_opts o = k3_engine_opts_default();
    int rc = k3_engine_load(dir, &o, &e, &err);
    if (rc == K3_OK) k3_engine_free(e);
    if (msg) memcpy(msg, err.msg, sizeof err.msg);
    CHECK(rc == code, "k3_engine_load returned %d, want %d: %s", rc, code, err.msg);
    CHECK(rc == K3_OK || err.code == code, "err.code %d != returned %d", err.code, rc);
    const char *missing = NULL;
    CHECK(rc == K3_OK || has_all(err.msg, needles, &missing), "message lacks \"%s\": %s",
          missing, err.msg);
}

typedef struct cli_out {
    int status; /* exit status, or -1 when killed by a signal */
    char *out, *err;
} cli_out;

static const char *k3_bin(void) {
    const char *b = getenv("K3_BIN");
    return b && *b ? b : "./k3";
}

/* Runs $K3_BIN with args (argv[0] is supplied), capturing stdout and stderr in files. */
static int run_cli(const char *const *args, cli_out *r) {
    memset(r, 0, sizeof *r);
    if (k3_test_stopped()) return -1;
    const char *bin = k3_bin();
    CHECK_OR(-1, access(bin, X_OK) == 0, "K3_BIN=%s is not an executable (build it with make k3, "
             "or run through make test)", bin);
    char *tmp = make_tmpdir();
    if (!tmp) return -1;
    char *po = join(tmp, "stdout"), *pe = join(tmp, "stderr");
    int fo = po ? open(po, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
    int fe = pe ? open(pe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
    const char *argv[32] = {bin};
    int n = 1;
    for (; args[n - 1] && n < 31; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    pid_t pid = -1;
    if (fo >= 0 && fe >= 0) {
        fflush(NULL);
        pid = fork();
        if (pid == 0) {
            int devnull = open("/dev/null", O_RDONLY);
            if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0)
                _exit(126);
            execv(bin, (char *const *)argv);
            _exit(127);
        }
    }
    int wst = 0;
    pid_t w = -1;
    if (pid > 0)
        while ((w = waitpid(pid, &wst, 0)) < 0 && errno == EINTR) {}
    if (fo >= 0) close(fo);
    if (fe >= 0) close(fe);
    size_t len;
    if (w == pid && pid > 0) {
        r->status = WIFEXITED(wst) ? WEXITSTATUS(wst) : -1;
        r->out = read_all(po, &len);
        r->err = read_all(pe, &len);
    }
    if (po) unlink(po);
    if (pe) unlink(pe);
    free(po);
    free(pe);
    rm_tree(tmp);
    CHECK_OR(-1, pid > 0 && w == pid, "could not run %s", bin);
    CHECK_OR(-1, WIFEXITED(wst), "%s was killed by signal %d", bin, WTERMSIG(wst));
    CHECK_OR(-1, r->status != 127 && r->status != 126, "could not exec %s", bin);
    return r->out && r->err ? 0 : -1;
}

static void cli_free(cli_out *r) {
    free(r->out);
    free(r->err);
}

/* (b) the CLI exits with code, says "<prefix>..." naming every needle on stderr, and prints
 * nothing on stdout. */
static void expect_cli_args(const char *const *args, int code, const char *prefix,
                            const char *const *needles) {
    cli_out r;
    if (run_cli(args, &r) == 0) {
        const char *missing = NULL;
        if (r.status != code)
            k3_test_fail(__FILE__, __LINE__, "k3 %s %s exited %d, want %d; stderr: %s", args[0],
                         args[1] ? args[1] : "", r.status, code, r.err);
        else if (strncmp(r.err, prefix, strlen(prefix)) != 0)
            k3_test_fail(__FILE__, __LINE__, "stderr does not start with \"%s\": %s", prefix,
                         r.err);
        else if (!has_all(r.err, needles, &missing))
            k3_test_fail(__FILE__, __LINE__, "stderr lacks \"%s\": %s", missing, r.err);
        else if (r.out[0])
            k3_test_fail(__FILE__, __LINE__, "stdout is not empty: \"%.200s\"", r.out);
    }
    cli_free(&r);
}

static void expect_cli(const char *dir, int code, const char *const *needles) {
    const char *args[] = {"run", dir, "--prompt-ids", "1792", "--max-new", "2", NULL};
    expect_cli_args(args, code, "k3 run: ", needles);
}

/* Both checks on dir; the needles are strings the message must contain. */
#define EXPECT_FAIL(dir, code, ...)                                                      \
    do {                                                                                 \
        const char *const needles_[] = {__VA_ARGS__, NULL};                              \
        expect_load(dir, code, needles_, NULL);                                          \
        expect_cli(dir, code, needles_);                                                 \
    } while (0)

/* ---- checkpoint cases -------------------------------------------------------------------- */

static void test_truncated_shard(void) {
    char *d = nano_copy();
    if (!d) return;
    long long size = file_size(d, SHARD5), cut = size - 1000;
    truncate_file(d, SHARD5, cut);
    const char *const needles[] = {SHARD5, "truncated", NULL};
    char msg[sizeof ((k3_err *)0)->msg];
    expect_load(d, K3_ERR_CHECKPOINT, needles, msg);
    /* The message must name a tensor whose data the truncation cut (several are). */
    char cut_name[256] = "";
    if (!k3_test_stopped()) {
        char *p = join(d, SHARD5);
        size_t len = 0;
        char *f = p ? read_all(p, &len) : NULL;
        uint64_t n = 0;
        for (int i = 7; f && len >= 8 && i >= 0; i--) n = (n << 8) | (unsigned char)f[i];
        char *json = f && 8 + n <= len ? strndup(f + 8, (size_t)n) : NULL;
        cJSON *hdr = json ? cJSON_Parse(json) : NULL;
        for (cJSON *e = hdr ? hdr->child : NULL; e; e = e->next)
            if (strcmp(e->string, "__metadata__") && 8 + n + offset_of(e, 1) > (double)cut &&
                strstr(msg, e->string))
                snprintf(cut_name, sizeof cut_name, "%s", e->string);
        cJSON_Delete(hdr);
        free(json);
        free(f);
        free(p);
        if (!cut_name[0])
            k3_test_fail(__FILE__, __LINE__, "message names no tensor past the new end: %s", msg);
    }
    const char *const cli_needles[] = {SHARD5, "truncated", cut_name, NULL};
    expect_cli(d, K3_ERR_CHECKPOINT, cli_needles);
    rm_tree(d);
}

/* The end offset alone pushed far past EOF: the span no longer matches the shape. */
static void test_offsets_end_past_eof(void) {
    char *d = nano_copy();
    if (!d) return;
    shard s;
    if (shard_load(d, SHARD5, &s) == 0) {
        cJSON *e = entry(&s, "language_model.model.layers.4.self_attn.q_proj.weight");
        set_item(e, "data_offsets", pair(offset_of(e, 0), 1e15));
    }
    shard_save(&s);
    if (!k3_test_stopped())
        EXPECT_FAIL(d, K3_ERR_CHECKPOINT, SHARD5,
                    "language_model.model.layers.4.self_attn.q_proj.weight", "data_offsets");
    rm_tree(d);
}

/* Both offsets moved past EOF (span still consistent): caught as data beyond the file. */
static void test_offsets_shifted_past_eof(void) {
    char *d = nano_copy();
    if (!d) return;
    shard s;
    if (shard_load(d, SHARD5, &s) == 0) {
        cJSON *e = entry(&s, "language_model.model.layers.4.self_attn.q_proj.weight");
        set_item(e, "data_offsets", pair(offset_of(e, 0) + 1e12, offset_of(e, 1) + 1e12));
    }
    shard_save(&s);
    if (!k3_test_stopped())
        EXPECT_FAIL(d, K3_ERR_CHECKPOINT, SHARD5,
                    "language_model.model.layers.4.self_attn.q_proj.weight", "data ends at byte",
                    "truncated");
    rm_tree(d);
}

/* Offsets beyond what any file can hold (and beyond 2^53, where doubles lose integers). */
static void test_offsets_absurd(void) {
    char *d = nano_copy();
    if (!d) return;
    shard s;
    if (shard_load(d, SHARD5, &s) == 0) {
        cJSON *e = entry(&s, "language_model.model.layers.4.self_attn.q_proj.weight");
        set_item(e, "data_offsets", pair(1e19, 1e19 + 8192));
    }
    shard_save(&s);
    if (!k3_test_stopped())
        EXPECT_FAIL(d, K3_ERR_CHECKPOINT, SHARD5,
                    "language_model.model.layers.4.self_attn.q_proj.weight", "data_offsets");
    rm_tree(d);
}

/* Removed from the index and from its shard: the model binder names it. */
static void test_tensor_missing(void) {
    char *d = nano_copy();
    if (!d) return;
    cJSON *idx = json_load(d, INDEX);
    if (idx) cJSON_DeleteItemFromObjectCaseSensitive(
                 cJSON_GetObjectItemCaseSensitive(idx, "weight_map"), Q_PROJ);
    json_save(d, INDEX, idx);
    shard s;
    if (shard_load(d, SHARD3, &s) == 0) cJSON_DeleteItemFromObjectCaseSensitive(s.header, Q_PROJ);
    shard_save(&s);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_CHECKPOINT, d, Q_PROJ, "missing");
    rm_tree(d);
}

/* The index lists a tensor that its shard's header lacks. */
static void test_index_lists_absent_tensor(void) {
    char *d = nano_copy();
    if (!d) return;
    shard s;
    if (shard_load(d, SHARD3, &s) == 0) cJSON_DeleteItemFromObjectCaseSensitive(s.header, Q_PROJ);
    shard_save(&s);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_CHECKPOINT, INDEX, Q_PROJ, SHARD3);
    rm_tree(d);
}

/* The index names the wrong shard for a tensor that does exist. */
static void test_index_wrong_shard(void) {
    char *d = nano_copy();
    if (!d) return;
    cJSON *idx = json_load(d, INDEX);
    if (idx) {
        cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
        cJSON *v = cJSON_CreateString(SHARD(04));
        if (!cJSON_ReplaceItemInObjectCaseSensitive(wm, Q_PROJ, v)) cJSON_Delete(v);
    }
    json_save(d, INDEX, idx);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_CHECKPOINT, INDEX, Q_PROJ, SHARD(04), SHARD3);
    rm_tree(d);
}

/* An MXFP4 U8 tensor relabelled BF16 with the last dim halved: byte span still consistent. */
static void test_wrong_dtype(void) {
    char *d = nano_copy();
    if (!d) return;
    const char *name = L2 "block_sparse_moe.experts.0.w1.weight_packed";
    shard s;
    if (shard_load(d, SHARD3, &s) == 0) {
        cJSON *e = entry(&s, name);
        cJSON *shape = e ? cJSON_GetObjectItemCaseSensitive(e, "shape") : NULL;
        int rows = shape ? cJSON_GetArrayItem(shape, 0)->valueint : 0;
        int cols = shape ? cJSON_GetArrayItem(shape, 1)->valueint : 0;
        if (e && cols % 2) k3_test_fail(__FILE__, __LINE__, "%s: odd last dim %d", name, cols);
        const int dims[2] = {rows, cols / 2};
        set_item(e, "dtype", cJSON_CreateString("BF16"));
        set_item(e, "shape", cJSON_CreateIntArray(dims, 2));
    }
    shard_save(&s);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_CHECKPOINT, SHARD3, name, "dtype", "BF16");
    rm_tree(d);
}

/* A dtype safetensors knows but k3 does not load. */
static void test_unsupported_dtype(void) {
    char *d = nano_copy();
    if (!d) return;
    shard s;
    if (shard_load(d, SHARD3, &s) == 0)
        set_item(entry(&s, Q_PROJ), "dtype", cJSON_CreateString("F16"));
    shard_save(&s);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_CHECKPOINT, SHARD3, Q_PROJ, "dtype F16");
    rm_tree(d);
}

/* Same element count, wrong shape: q_proj [64,64] -> [32,128]. */
static void test_wrong_shape(void) {
    char *d = nano_copy();
    if (!d) return;
    shard s;
    const int dims[2] = {32, 128};
    if (shard_load(d, SHARD3, &s) == 0)
        set_item(entry(&s, Q_PROJ), "shape", cJSON_CreateIntArray(dims, 2));
    shard_save(&s);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_CHECKPOINT, SHARD3, Q_PROJ, "shape", "[32,128]");
    rm_tree(d);
}

/* A shape whose element count wraps 64 bits must not pass as a zero-byte tensor. */
static void test_shape_overflow(void) {
    char *d = nano_copy();
    if (!d) return;
    shard s;
    if (shard_load(d, SHARD3, &s) == 0) {
        cJSON *e = entry(&s, Q_PROJ);
        cJSON *shape = cJSON_CreateArray();
        cJSON_AddItemToArray(shape, cJSON_CreateNumber(4294967296.0));
        cJSON_AddItemToArray(shape, cJSON_CreateNumber(4294967296.0));
        set_item(e, "shape", shape);
        set_item(e, "data_offsets", pair(offset_of(e, 0), offset_of(e, 0)));
    }
    shard_save(&s);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_CHECKPOINT, SHARD3, Q_PROJ, "bad shape");
    rm_tree(d);
}

/* A fractional dimension is not silently rounded down to the expected size. */
static void test_shape_not_integer(void) {
    char *d = nano_copy();
    if (!d) return;
    shard s;
    if (shard_load(d, SHARD3, &s) == 0) {
        cJSON *shape = cJSON_CreateArray();
        cJSON_AddItemToArray(shape, cJSON_CreateNumber(64));
        cJSON_AddItemToArray(shape, cJSON_CreateNumber(64.5));
        set_item(entry(&s, Q_PROJ), "shape", shape);
    }
    shard_save(&s);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_CHECKPOINT, SHARD3, Q_PROJ, "bad shape");
    rm_tree(d);
}

/* The 8-byte header length says more than the file holds. */
static void test_header_length_past_eof(void) {
    char *d = nano_copy();
    if (!d) return;
    shard s;
    if (shard_load(d, SHARD3, &s) == 0) {
        uint64_t n = (uint64_t)s.len; /* 8 + n > file size */
        for (int i = 0; i < 8; i++) s.file[i] = (char)(n >> (8 * i));
        write_all(s.path, s.file, s.len);
    }
    shard_free(&s);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_CHECKPOINT, SHARD3, "header length");
    rm_tree(d);
}

static void test_shard_too_short(void) {
    char *d = nano_copy();
    if (!d) return;
    truncate_file(d, SHARD3, 5);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_CHECKPOINT, SHARD3, "too short");
    rm_tree(d);
}

static void test_header_not_json(void) {
    char *d = nano_copy();
    if (!d) return;
    shard s;
    if (shard_load(d, SHARD3, &s) == 0) {
        s.file[8] = '#'; /* the opening brace */
        write_all(s.path, s.file, s.len);
    }
    shard_free(&s);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_CHECKPOINT, SHARD3, "JSON");
    rm_tree(d);
}

static void test_shard_file_missing(void) {
    char *d = nano_copy();
    if (!d) return;
    remove_file(d, SHARD3);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_IO, SHARD3, "cannot open");
    rm_tree(d);
}

static void test_index_malformed(void) {
    char *d = nano_copy();
    if (!d) return;
    truncate_file(d, INDEX, file_size(d, INDEX) / 2);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_CHECKPOINT, INDEX, "weight_map");
    rm_tree(d);
}

static void test_index_missing(void) {
    char *d = nano_copy();
    if (!d) return;
    remove_file(d, INDEX);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_IO, d, INDEX);
    rm_tree(d);
}

/* The vision-only shard is never opened: without it the model loads and runs, and k3 run
 * prints the same tokens as on the untouched fixture. */
static void test_vision_shard_missing_ok(void) {
    char *d = nano_copy();
    if (!d) return;
    remove_file(d, SHARD11);
    const char *const none[] = {NULL};
    expect_load(d, K3_OK, none, NULL);
    const char *broken[] = {"run", d, "--prompt-ids", "1792", "--max-new", "2", "--ids", "-q",
                            NULL};
    const char *pristine[] = {"run", NANO, "--prompt-ids", "1792", "--max-new", "2", "--ids",
                              "-q", NULL};
    const char *plain[] = {"run", d, "--prompt-ids", "1792", "--max-new", "2", NULL};
    cli_out a = {0}, b = {0}, c = {0};
    if (run_cli(broken, &a) == 0 && run_cli(pristine, &b) == 0 && run_cli(plain, &c) == 0) {
        if (a.status != 0 || b.status != 0 || c.status != 0)
            k3_test_fail(__FILE__, __LINE__, "exit %d/%d/%d; stderr: %s%s%s", a.status, b.status,
                         c.status, a.err, b.err, c.err);
        else if (strlen(a.out) < 3 || !strchr(a.out, ','))
            k3_test_fail(__FILE__, __LINE__, "--ids printed \"%s\", want two ids", a.out);
        else if (strcmp(a.out, b.out) != 0)
            k3_test_fail(__FILE__, __LINE__, "ids \"%s\" differ from the untouched model's \"%s\"",
                         a.out, b.out);
        else if (strlen(c.out) < 2)
            k3_test_fail(__FILE__, __LINE__, "k3 run printed no tokens: \"%s\"", c.out);
        else if (strncmp(c.err, "k3: loaded ", 11) != 0 || !strstr(c.err, "vision-only"))
            k3_test_fail(__FILE__, __LINE__, "unexpected load line: %s", c.err);
    }
    cli_free(&a);
    cli_free(&b);
    cli_free(&c);
    rm_tree(d);
}

/* ---- config, tokenizer, folder ----------------------------------------------------------- */

static void test_config_truncated(void) {
    char *d = nano_copy();
    if (!d) return;
    truncate_file(d, "config.json", file_size(d, "config.json") / 2);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_CONFIG, "config.json", "malformed JSON");
    rm_tree(d);
}

static void test_config_field_missing(void) {
    char *d = nano_copy();
    if (!d) return;
    cJSON *cfg = json_load(d, "config.json");
    if (cfg) cJSON_DeleteItemFromObjectCaseSensitive(
                 cJSON_GetObjectItemCaseSensitive(cfg, "text_config"), "hidden_size");
    json_save(d, "config.json", cfg);
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_CONFIG, "config.json", "missing \"hidden_size\"");
    rm_tree(d);
}

static void test_config_missing(void) {
    char *d = nano_copy();
    if (!d) return;
    remove_file(d, "config.json");
    /* and says what a snapshot holds (issue 15) */
    if (!k3_test_stopped())
        EXPECT_FAIL(d, K3_ERR_IO, "config.json", "cannot open", "model.safetensors.index.json",
                    "tiktoken.model", "tokenizer_config.json", "k3 setup");
    rm_tree(d);
}

static void test_tokenizer_missing(void) {
    char *d = nano_copy();
    if (!d) return;
    remove_file(d, "tiktoken.model");
    if (!k3_test_stopped()) EXPECT_FAIL(d, K3_ERR_IO, "tiktoken.model");
    rm_tree(d);
}

static void test_model_dir_nonexistent(void) {
    char *d = make_tmpdir();
    if (!d) return;
    char *nope = join(d, "no-such-model");
    if (nope) EXPECT_FAIL(nope, K3_ERR_IO, "no-such-model", "config.json");
    free(nope);
    rm_tree(d);
}

static void test_model_dir_is_a_file(void) {
    char *d = make_tmpdir();
    if (!d) return;
    char *f = join(d, "model.txt");
    if (f) write_all(f, "not a model\n", 12);
    if (f && !k3_test_stopped()) EXPECT_FAIL(f, K3_ERR_IO, "model.txt", "config.json");
    free(f);
    rm_tree(d);
}

/* ---- command line ------------------------------------------------------------------------ */

static void test_cli_unknown_flag(void) {
    const char *args[] = {"run", NANO, "--prompt-ids", "1792", "--bogus", NULL};
    const char *const needles[] = {"--bogus", NULL};
    expect_cli_args(args, K3_ERR_USAGE, "k3 run: ", needles);
}

static void test_cli_max_new_not_a_number(void) {
    const char *args[] = {"run", NANO, "--prompt-ids", "1792", "--max-new", "abc", NULL};
    const char *const needles[] = {"--max-new", "abc", NULL};
    expect_cli_args(args, K3_ERR_USAGE, "k3 run: ", needles);
}

static void test_cli_no_prompt(void) {
    const char *args[] = {"run", NANO, "--max-new", "2", NULL};
    const char *const needles[] = {"--prompt", NULL};
    expect_cli_args(args, K3_ERR_USAGE, "k3 run: ", needles);
}

static void test_cli_prompt_id_out_of_vocab(void) {
    const char *args[] = {"run", NANO, "--prompt-ids", "99999", "--max-new", "2", NULL};
    const char *const needles[] = {"--prompt-ids", "99999", "2048", NULL};
    expect_cli_args(args, K3_ERR_INPUT, "k3: ", needles); /* after the load line */
}

static void test_cli_prompt_ids_garbage(void) {
    const char *args[] = {"run", NANO, "--prompt-ids", "1792,x", "--max-new", "2", NULL};
    const char *const needles[] = {"--prompt-ids", "1792,x", NULL};
    expect_cli_args(args, K3_ERR_USAGE, "k3: ", needles); /* after the load line */
}

const k3_test k3_suite_badinput[] = {
    {"truncated_shard", test_truncated_shard},
    {"offsets_end_past_eof", test_offsets_end_past_eof},
    {"offsets_shifted_past_eof", test_offsets_shifted_past_eof},
    {"offsets_absurd", test_offsets_absurd},
    {"tensor_missing", test_tensor_missing},
    {"index_lists_absent_tensor", test_index_lists_absent_tensor},
    {"index_wrong_shard", test_index_wrong_shard},
    {"wrong_dtype", test_wrong_dtype},
    {"unsupported_dtype", test_unsupported_dtype},
    {"wrong_shape", test_wrong_shape},
    {"shape_overflow", test_shape_overflow},
    {"shape_not_integer", test_shape_not_integer},
    {"header_length_past_eof", test_header_length_past_eof},
    {"shard_too_short", test_shard_too_short},
    {"header_not_json", test_header_not_json},
    {"shard_file_missing", test_shard_file_missing},
    {"index_malformed", test_index_malformed},
    {"index_missing", test_index_missing},
    {"vision_shard_missing_ok", test_vision_shard_missing_ok},
    {"config_truncated", test_config_truncated},
    {"config_field_missing", test_config_field_missing},
    {"config_missing", test_config_missing},
    {"tokenizer_missing", test_tokenizer_missing},
    {"model_dir_nonexistent", test_model_dir_nonexistent},
    {"model_dir_is_a_file", test_model_dir_is_a_file},
    {"cli_unknown_flag", test_cli_unknown_flag},
    {"cli_max_new_not_a_number", test_cli_max_new_not_a_number},
    {"cli_no_prompt", test_cli_no_prompt},
    {"cli_prompt_id_out_of_vocab", test_cli_prompt_id_out_of_vocab},
    {"cli_prompt_ids_garbage", test_cli_prompt_ids_garbage},
    {0},
};
