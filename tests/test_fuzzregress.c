/* test_fuzzregress.c — every input under fuzz/regress/NAME/ fed to harness NAME (fuzz/fuzz_NAME.c,
 * included here without libFuzzer): each crash or oracle failure the fuzzers found stays a
 * test. The harnesses' seed corpora (fuzz/corpus/NAME/) run too, as a check that the
 * harnesses themselves work on ordinary input. */
#include "test.h"

#include <dirent.h>
#include <ftw.h>
#include <string.h>

#include "../src/util/fileio.h"

#include "../fuzz/fuzz_agents.c"
#include "../fuzz/fuzz_config.c"
#include "../fuzz/fuzz_idlist.c"
#include "../fuzz/fuzz_packed.c"
#include "../fuzz/fuzz_reply.c"
#include "../fuzz/fuzz_request.c"
#include "../fuzz/fuzz_safetensors.c"
#include "../fuzz/fuzz_state.c"
#include "../fuzz/fuzz_tokenizer.c"
#include "../fuzz/fuzz_trace.c"

static const struct {
    const char *name;
    int (*fn)(const uint8_t *, size_t);
} harnesses[] = {
    {"agents", k3_fuzz_agents},
    {"config", k3_fuzz_config},       {"idlist", k3_fuzz_idlist},
    {"packed", k3_fuzz_packed},       {"reply", k3_fuzz_reply},
    {"request", k3_fuzz_request},     {"safetensors", k3_fuzz_safetensors},
    {"state", k3_fuzz_state},
    {"tokenizer", k3_fuzz_tokenizer}, {"trace", k3_fuzz_trace},
};

static char tmp_dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *f) {
    (void)st, (void)flag, (void)f;
    return remove(path);
}

static void rm_tmp(void) {
    if (tmp_dir[0]) nftw(tmp_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* The harnesses' scratch files go to a private folder, removed at exit. */
static void use_tmp(void) {
    if (tmp_dir[0]) return;
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/k3-fuzzregress-XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        tmp_dir[0] = 0;
        return;
    }
    setenv("K3_FUZZ_TMP", tmp_dir, 1);
    atexit(rm_tmp);
}

/* Feeds every file of dir/NAME to its harness; *n counts the files. */
static void run_dir(const char *dir, int *n) {
    use_tmp();
    for (size_t h = 0; h < sizeof harnesses / sizeof harnesses[0]; h++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, harnesses[h].name);
        DIR *d = opendir(path);
        if (!d) continue;
        struct dirent *e;
        while (!k3_test_stopped() && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char file[1024];
            snprintf(file, sizeof file, "%s/%s", path, e->d_name);
            char *buf;
            size_t len;
            k3_err err = {0};
            if (k3_read_file(file, (size_t)1 << 24, &buf, &len, &err)) {
                k3_test_fail(__FILE__, __LINE__, "%s", err.msg);
                break;
            }
            int rc = harnesses[h].fn((const uint8_t *)buf, len);
            free(buf);
            (*n)++;
            if (rc) k3_test_fail(__FILE__, __LINE__, "%s: the oracle of fuzz_%s failed", file,
                                 harnesses[h].name);
        }
        closedir(d);
    }
}

static void test_regressions(void) {
    int n = 0;
    run_dir("fuzz/regress", &n);
    CHECK(k3_test_stopped() || n > 0, "no input under fuzz/regress");
}

static void test_seed_corpora(void) {
    int n = 0;
    run_dir("fuzz/corpus", &n);
    CHECK(k3_test_stopped() || n >= 8, "only %d seed inputs under fuzz/corpus", n);
}

const k3_test k3_suite_fuzzregress[] = {
    {"regressions", test_regressions},
    {"seed_corpora", test_seed_corpora},
    {0},
};
