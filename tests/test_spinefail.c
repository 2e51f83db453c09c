/* test_spinefail.c — a pass that fails part-way (here: a streamed spine layer whose shard was
 * cut short, src/model/spine.h) must not leave a half-updated session behind for the next
 * k3_session_prefill to build on. The layers before the failure have already folded the
 * failed ids into their KDA and conv state while the position did not move, so a retry of
 * the same prompt (a client retrying after a 500, the next turn of k3 chat) would reuse that
 * history and produce different logits. After the shard is restored, the retry must give
 * the logits of a clean session, bit for bit. An embedding row that cannot be read names the
 * shard. The O_DIRECT probe at load falls back to buffered reads only when the file system
 * refuses O_DIRECT (EINVAL); a disk error there fails the load naming the file. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../src/engine/k3.h"
#include "../src/engine/k3_lab.h"
#include "../src/format/safetensors.h"
#include "pack_helpers.h"
#include "test.h"

#define N_TOK 12
static const int32_t prompt[N_TOK] = {1792, 5, 77, 1000, 9, 300, 1500, 2, 64, 65, 66, 67};

static const k3_lab_opts in_place = {.spine_in_place = 1, .gpu_max_layers = -1};

static int load(const char *dir, int budget, k3_engine **e, k3_err *err) {
    unsetenv("K3_SPINE_GB");
    unsetenv("K3_DEVICE");
    k3_engine_opts o = k3_engine_opts_default();
    o.threads = 2;
    o.spine_gb = budget ? 0 : K3_SPINE_GB_PLAN;
    o.lab = budget ? NULL : &in_place; /* in place whatever the plan */
    o.spine = K3_SPINE_BF16;
    return k3_engine_load(dir, &o, e, err);
}

/* Logits after prompt[0, N_TOK) from a fresh session on the unmodified fixture. */
static float *reference(int V, k3_err *err) {
    k3_engine *e = NULL;
    k3_session *s = NULL;
    float *ref = malloc((size_t)V * sizeof *ref);
    int rc = load(NANO, 0, &e, err);
    if (!rc) rc = k3_session_new(e, 64, &s, err);
    if (!rc) rc = k3_session_prefill(s, prompt, N_TOK, ref, NULL, err);
    k3_session_free(s);
    k3_engine_free(e);
    if (rc) free(ref), ref = NULL;
    return ref;
}

static void test_retry_after_failed_pass(void) {
    /* the FFN half of the last layer: every earlier layer has run when its read fails */
    char *dir, *shard;
    uint64_t cut;
    if (ph_nano_tensor("language_model.model.layers.8.post_attention_layernorm.weight", &dir,
                       &shard, &cut))
        return;
    cut += 10;
    k3_err err = {0};
    size_t len = 0;
    uint8_t *orig = ph_read(shard, &len);
    k3_engine *e = NULL;
    k3_session *s = NULL;
    int rc = orig ? load(dir, 1, &e, &err) : -1;
    if (!rc) rc = k3_session_new(e, 64, &s, &err);
    int V = e ? k3_engine_config(e)->vocab_size : 0;
    float *got = malloc((size_t)(V ? V : 1) * sizeof *got);
    int first = -1, failed = -1, retry = -1;
    if (!rc) {
        k3_session_set_chunk(s, 4);
        first = k3_session_prefill(s, prompt, 4, got, NULL, &err); /* a good first part */
        if (!first && !truncate(shard, (off_t)cut)) {
            failed = k3_session_prefill(s, prompt, N_TOK, got, NULL, &err);
            if (!ph_write(shard, orig, len)) /* the shard is back: retry the same prompt */
                retry = k3_session_prefill(s, prompt, N_TOK, got, NULL, &err);
        }
    }
    k3_session_free(s);
    k3_engine_free(e);
    float *ref = retry == 0 ? reference(V, &err) : NULL;
    CHECK(rc == 0 && first == 0, "setup failed: %s", err.msg);
    CHECK(failed == K3_ERR_IO, "the pass over the cut shard returned %d, want K3_ERR_IO", failed);
    CHECK(retry == 0, "the retry after restoring the shard failed (%d): %s", retry, err.msg);
    if (ref) {
        int same = !memcmp(got, ref, (size_t)V * sizeof *got);
        int diff_at = -1;
        for (int i = 0; i < V && diff_at < 0; i++)
            if (memcmp(&got[i], &ref[i], sizeof *got)) diff_at = i;
        CHECK(same, "the retry built on the failed pass's half-updated state: logit %d is %g, "
              "a clean session gives %g", diff_at, diff_at >= 0 ? got[diff_at] : 0.0,
              diff_at >= 0 ? ref[diff_at] : 0.0);
    }
    free(ref), free(got), free(orig), free(shard);
    ph_rmdir(dir);
    free(dir);
}

/* With a budget that streams, embedding rows are read with pread: a shard cut short inside
 * the embedding after load fails the step with K3_ERR_IO naming the shard. */
static void test_embed_read_names_file(void) {
    char *dir, *shard;
    uint64_t cut;
    if (ph_nano_tensor("language_model.model.embed_tokens.weight", &dir, &shard, &cut)) return;
    cut += 1000 * 64 * 2; /* rows 0..999 stay */
    k3_err err = {0};
    k3_engine *e = NULL;
    k3_session *s = NULL;
    int rc = load(dir, 1, &e, &err);
    if (!rc) rc = k3_session_new(e, 64, &s, &err);
    int step = -1;
    if (!rc && !truncate(shard, (off_t)cut))
        step = k3_session_step(s, 1792, NULL, &err);
    CHECK(rc == 0, "setup failed: %s", err.msg);
    CHECK(step == K3_ERR_IO, "status %d, want K3_ERR_IO: %s", step, err.msg);
    CHECK(step != K3_ERR_IO || (strstr(err.msg, shard) && strstr(err.msg, "1792")),
          "the message does not name the shard %s and the token: %s", shard, err.msg);
    k3_session_free(s);
    k3_engine_free(e);
    free(shard);
    ph_rmdir(dir);
    free(dir);
}

/* pread for this whole test binary (it takes the place of libc's, libk3.a included): the
 * system call itself, except that while fail_direct is set, reads from O_DIRECT descriptors
 * fail with that errno. This is how a disk error reaches the spine's O_DIRECT probe. */
static _Atomic int fail_direct, direct_fails;

ssize_t pread(int fd, void *buf, size_t count, off_t offset) {
    int e = atomic_load(&fail_direct);
    if (e && (fcntl(fd, F_GETFL) & O_DIRECT)) {
        atomic_fetch_add(&direct_fails, 1);
        errno = e;
        return -1;
    }
    return (ssize_t)syscall(SYS_pread64, fd, buf, count, offset);
}

/* Loads the fixture with a budget of 0 (every layer streamed, O_DIRECT) while O_DIRECT reads
 * fail with errno e; *direct is the spine's O_DIRECT flag after a successful load. */
static int load_failing_direct(int e, int *direct, k3_err *err) {
    k3_engine *eng = NULL;
    unsetenv("K3_DIRECT");
    atomic_store(&direct_fails, 0);
    atomic_store(&fail_direct, e);
    int rc = load(NANO, 1, &eng, err);
    atomic_store(&fail_direct, 0);
    k3_spine_stats st = {0};
    if (!rc) k3_engine_spine_stats(eng, &st);
    *direct = st.direct;
    k3_engine_free(eng);
    return rc;
}

static void test_direct_probe_error(void) {
    int direct = -1;
    k3_err err = {0};
    int rc = load_failing_direct(EIO, &direct, &err);
    CHECK(atomic_load(&direct_fails) > 0, "no O_DIRECT read went through the test's pread");
    CHECK(rc == K3_ERR_IO, "a disk error in the O_DIRECT probe: status %d (O_DIRECT %d), want "
          "K3_ERR_IO: %s", rc, direct, err.msg);
    CHECK(rc != K3_ERR_IO || (strstr(err.msg, ".safetensors") && strstr(err.msg, strerror(EIO))),
          "the message does not name the file and the error: %s", err.msg);
    /* a file system that refuses O_DIRECT reads: buffered reads, as before */
    err = (k3_err){0};
    rc = load_failing_direct(EINVAL, &direct, &err);
    CHECK(rc == 0 && direct == 0, "O_DIRECT refused (EINVAL): status %d, O_DIRECT %d: %s", rc,
          direct, err.msg);
}

const k3_test k3_suite_spinefail[] = {
    {"retry_after_failed_pass", test_retry_after_failed_pass},
    {"embed_read_names_file", test_embed_read_names_file},
    {"direct_probe_error", test_direct_probe_error},
    {0},
};
