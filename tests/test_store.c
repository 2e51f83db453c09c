/* test_store.c — the expert streaming store (src/store/store.h, issue 3):
 *  - logits with the store are bit-identical to the in-place (mapped) path on k3-nano for
 *    budgets from one slot to every expert, O_DIRECT and buffered, prefetch on and off, both
 *    policies, shards split over two folders, and a checkpoint whose expert tensors are not
 *    back to back (per-tensor fallback, written by `k3-lab synth --scatter`);
 *  - faults: a shard truncated after load inside an expert, an injected EIO, a read that
 *    returns short once and one interrupted by EINTR;
 *  - the io_uring engine (--io-engine uring): the same bit-identity over budgets, O_DIRECT
 *    and buffered, prefetch on and off, and the same faults (the read hook runs before each
 *    io_uring read as before each pread: its short read is resubmitted by the ring's own
 *    loop; a kernel-made short read or -EINTR is not injected);
 *  - memory: the cache stays within its budget, a budget below one layer's working set
 *    completes, and (CLI, real expert size) the measured peak RSS stays within the plan.
 * The reference is the engine itself with experts used in place from the mapping — the
 * path the fixture tests (test_model.c) check against PyTorch. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/engine/k3.h"
#include "../src/engine/k3_lab.h"
#include "../src/engine/k3_test.h"
#include "../src/format/safetensors.h"
#include "../src/store/store.h"
#include "cli_run.h"
#include "../src/store/store_internal.h"
#include "test.h"

/* One part of the engine's description (k3_engine_describe) in buf [K3_DESCRIBE_CAP]. */
static const char *describe(const k3_engine *e, int part, char *buf) {
    k3_engine_describe(e, part, buf, K3_DESCRIBE_CAP);
    return buf;
}

#define NANO "tests/fixtures/k3-nano"
#define N_TOK 20

static const int32_t prompt[N_TOK] = {1792, 5,   77,  1000, 9,    300, 1500, 2,  64, 65,
                                      900,  901, 12,  13,   1793, 4,   800,  33, 7,  1200};

/* The store's K3_* variables would override what each test asks for: clear them. */
static void clean_env(void) {
    static const char *const vars[] = {"K3_EXPERT_GB", "K3_LOAD_THREADS", "K3_DIRECT", "K3_PIPE",
                                       "K3_CACHE_POLICY", "K3_MMAP_EXPERTS", "K3_DIRS",
                                       "K3_IO_ENGINE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

/* Runs the prompt through a fresh engine with opts; writes [N_TOK][vocab] logits. Returns the
 * status of the first failing call; err gets its message. */
static int run_logits(const char *dir, const k3_engine_opts *opts, float *logits, int *vocab,
                      k3_run_stats *st, k3_err *err) {
    k3_engine *e = NULL;
    k3_session *s = NULL;
    clean_env();
    int rc = k3_engine_load(dir, opts, &e, err);
    if (!rc) rc = k3_session_new(e, 64, &s, err);
    if (!rc) *vocab = k3_engine_config(e)->vocab_size;
    if (!rc && !opts->experts_in_place && strstr(describe(e, K3_DESCRIBE_STORE, (char[K3_DESCRIBE_CAP]){0}), "in place"))
        rc = k3_fail(err, K3_ERR_GENERIC, "the store run used experts in place");
    for (int t = 0; !rc && t < N_TOK; t++)
        rc = k3_session_step(s, prompt[t], logits + (size_t)t * *vocab, err);
    if (!rc && st) k3_session_stats(s, st);
    k3_session_free(s);
    k3_engine_free(e);
    return rc;
}

static float *reference(const char *dir, int *vocab) {
    float *ref = malloc((size_t)N_TOK * 4096 * sizeof *ref);
    CHECK_OR(NULL, ref, "out of memory");
    k3_engine_opts o = k3_engine_opts_default();
    o.experts_in_place = 1;
    o.threads = 2;
    k3_err err = {0};
    int rc = run_logits(dir, &o, ref, vocab, NULL, &err);
    if (rc) free(ref);
    CHECK_OR(NULL, rc == 0, "in-place reference run failed: %s", err.msg);
    return ref;
}

/* Store run vs reference, bit for bit. */
static void expect_identical(const char *dir, const float *ref, int vocab, k3_engine_opts o,
                             const char *what) {
    if (k3_test_stopped()) return;
    float *got = malloc((size_t)N_TOK * vocab * sizeof *got);
    CHECK(got, "out of memory");
    k3_err err = {0};
    int v = 0;
    k3_run_stats st;
    int rc = run_logits(dir, &o, got, &v, &st, &err);
    int same = rc == 0 && memcmp(got, ref, (size_t)N_TOK * vocab * sizeof *got) == 0;
    size_t first = 0;
    while (rc == 0 && !same && first < (size_t)N_TOK * vocab && got[first] == ref[first]) first++;
    free(got);
    CHECK(rc == 0, "%s: run failed: %s", what, err.msg);
    CHECK(same, "%s: logits differ from the in-place path (first at token %zu, id %zu)", what,
          first / vocab, first % vocab);
    CHECK(st.expert_requests > 0 && st.peak_cache_bytes <= st.cache_bytes,
          "%s: %llu requests, peak %llu of %llu cache bytes", what,
          (unsigned long long)st.expert_requests, (unsigned long long)st.peak_cache_bytes,
          (unsigned long long)st.cache_bytes);
}

/* k3-nano: top-4 of 32 experts in 8 MoE layers (256 experts). */
static void test_budgets_bit_identical(void) {
    int vocab = 0;
    float *ref = reference(NANO, &vocab);
    if (!ref) return;
    const int slots[] = {1, 3, 5, 40, 256};
    const int direct[] = {K3_IO_DIRECT, K3_IO_BUFFERED};
    const int pipe[] = {K3_PIPE_OFF, K3_PIPE_ALL};
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 2; b++)
            for (size_t c = 0; c < 2; c++) {
                char what[128];
                snprintf(what, sizeof what, "%d slots, %s, K3_PIPE %s", slots[a],
                         b ? "buffered" : "O_DIRECT", c ? "on" : "off");
                k3_engine_opts o = k3_engine_opts_default();
                o.threads = 2;
                o.lab = &(k3_lab_opts){.expert_slots = slots[a], .gpu_max_layers = -1};
                o.direct = direct[b];
                o.pipe = pipe[c];
                o.cache_policy = a % 2 ? "s3fifo" : "lru";
                o.io_engine = K3_IO_ENGINE_THREADS; /* the pool; uring below */
                expect_identical(NANO, ref, vocab, o, what);
            }
    free(ref);
}

/* ---- temporary copies of k3-nano ------------------------------------------------------- */

static char *tmp_copy(const char *tag) {
    static char dir[256]; /* test-only; one copy in use at a time */
    snprintf(dir, sizeof dir, "/tmp/k3-store-test-%d-%s", (int)getpid(), tag);
    char cmd[640];
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r " NANO " %s", dir, dir);
    CHECK_OR(NULL, system(cmd) == 0, "cannot copy the fixture to %s", dir);
    return dir;
}

static void rm_rf(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* Shards split over two folders found through K3_DIRS / opts.dirs: even shards in A, odd in
 * B, none left in the snapshot folder. */
static void test_two_folders(void) {
    int vocab = 0;
    float *ref = reference(NANO, &vocab);
    if (!ref) return;
    char *dir = tmp_copy("dirs"), dirs[600], cmd[2048];
    if (!dir) { free(ref); return; }
    snprintf(dirs, sizeof dirs, "%s/a:%s/b", dir, dir);
    snprintf(cmd, sizeof cmd, "cd %s && mkdir a b && for f in model-*.safetensors; do "
             "case $f in *[02468]-of-*) mv $f a/;; *) mv $f b/;; esac; done && "
             "ls a | grep -q . && ls b | grep -q .", dir);
    int ok = system(cmd) == 0;
    if (ok) {
        k3_engine_opts o = k3_engine_opts_default();
        o.threads = 2;
        o.lab = &(k3_lab_opts){.expert_slots = 7, .gpu_max_layers = -1};
        o.direct = K3_IO_DIRECT;
        o.pipe = K3_PIPE_ALL;
        o.dirs = dirs;
        expect_identical(dir, ref, vocab, o, "shards in two folders");
    }
    rm_rf(dir);
    free(ref);
    CHECK(ok, "could not split the shards: %s", cmd);
}

/* ---- faults ------------------------------------------------------------------------------ */

/* The file offset of layer 1 expert 0's first tensor in dir. */
static uint64_t expert_offset(const char *dir, int *shard_file_no) {
    k3_checkpoint *ck = NULL;
    k3_err err = {0};
    CHECK_OR(0, k3_checkpoint_open(dir, &ck, &err) == 0, "%s", err.msg);
    const k3_tensor *t = k3_checkpoint_find(
        ck, "language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_packed");
    uint64_t off = t ? t->file_offset : 0;
    if (t) sscanf(strrchr(ck->shards[t->shard].path, '/'), "/model-%d", shard_file_no);
    k3_checkpoint_close(ck);
    CHECK_OR(0, t, "no layer 1 expert 0 in %s", dir);
    return off;
}

/* A shard cut short after load, inside layer 1's experts: the step fails with
 * K3_ERR_EXPERT_IO naming shard, layer and expert, and writes no logits. */
static void truncated_after_load(int io_engine) {
    char *dir = tmp_copy("trunc");
    if (!dir) return;
    int no = 0;
    uint64_t off = expert_offset(dir, &no);
    k3_engine *e = NULL;
    k3_session *s = NULL;
    k3_err err = {0};
    k3_engine_opts o = k3_engine_opts_default();
    o.threads = 2;
    o.lab = &(k3_lab_opts){.expert_slots = 256, .gpu_max_layers = -1};
    o.direct = K3_IO_BUFFERED;
    o.pipe = K3_PIPE_OFF;
    o.io_engine = io_engine;
    clean_env();
    int rc = off ? k3_engine_load(dir, &o, &e, &err) : -1;
    if (!rc) rc = k3_session_new(e, 16, &s, &err);
    char shard[512];
    snprintf(shard, sizeof shard, "%s/model-%05d-of-000011.safetensors", dir, no);
    float logits[2048];
    for (int i = 0; i < 2048; i++) logits[i] = NAN;
    int trunc = !rc ? truncate(shard, (off_t)(off + 100)) : -1;
    int step = !rc && !trunc ? k3_session_step(s, 1792, logits, &err) : -1;
    int untouched = 1;
    for (int i = 0; i < 2048; i++) untouched &= isnan(logits[i]);
    k3_session_free(s);
    k3_engine_free(e);
    rm_rf(dir);
    CHECK(rc == 0 && trunc == 0, "setup failed: rc %d trunc %d %s", rc, trunc, err.msg);
    CHECK(step == K3_ERR_EXPERT_IO, "status %d, want %d (K3_ERR_EXPERT_IO): %s", step,
          K3_ERR_EXPERT_IO, err.msg);
    CHECK(strstr(err.msg, strrchr(shard, '/') + 1) && strstr(err.msg, "layer 1 expert ") &&
              strstr(err.msg, "truncated"), "message does not name shard/layer/expert: %s", err.msg);
    CHECK(untouched, "logits were written by a step that failed");
}

static void test_truncated_after_load(void) { truncated_after_load(K3_IO_ENGINE_THREADS); }

typedef struct hook_state {
    int calls, mode, shortened, interrupted, failed;
} hook_state;

enum { HOOK_SHORT_ONCE, HOOK_EIO_THIRD };

/* Test read hook: mode SHORT_ONCE halves the first read and interrupts the second with
 * EINTR; EIO_THIRD fails the third read with EIO. */
static int hook(void *user, int shard, uint64_t off, size_t *len) {
    (void)shard, (void)off;
    hook_state *h = user;
    int n = ++h->calls;
    if (h->mode == HOOK_SHORT_ONCE && n == 1 && *len > 1) { *len /= 2; h->shortened++; }
    if (h->mode == HOOK_SHORT_ONCE && n == 2) { h->interrupted++; return EINTR; }
    if (h->mode == HOOK_EIO_THIRD && n == 3) { h->failed++; return EIO; }
    return 0;
}

static int run_with_hook(const float *ref, int vocab, hook_state *h, int direct, int io_engine,
                         k3_err *err, int *same) {
    k3_engine *e = NULL;
    k3_session *s = NULL;
    k3_engine_opts o = k3_engine_opts_default();
    o.threads = 1;
    o.lab = &(k3_lab_opts){.expert_slots = 6, .gpu_max_layers = -1};
    o.direct = direct;
    o.pipe = K3_PIPE_OFF;
    o.load_threads = 1;
    o.io_engine = io_engine;
    clean_env();
    int rc = k3_engine_load(NANO, &o, &e, err);
    if (!rc) rc = k3_session_new(e, 64, &s, err);
    if (!rc) k3_store_set_read_hook(k3_engine_store(e), hook, h);
    float *got = malloc((size_t)N_TOK * vocab * sizeof *got);
    for (int t = 0; !rc && got && t < N_TOK; t++)
        rc = k3_session_step(s, prompt[t], got + (size_t)t * vocab, err);
    *same = !rc && got && memcmp(got, ref, (size_t)N_TOK * vocab * sizeof *got) == 0;
    free(got);
    k3_session_free(s);
    k3_engine_free(e);
    return rc;
}

static void short_read_and_eintr_retried(int io_engine) {
    int vocab = 0;
    float *ref = reference(NANO, &vocab);
    if (!ref) return;
    for (int direct = 0; direct < 2; direct++) {
        hook_state h = {.mode = HOOK_SHORT_ONCE};
        k3_err err = {0};
        int same = 0;
        int rc = run_with_hook(ref, vocab, &h, direct ? K3_IO_DIRECT : K3_IO_BUFFERED, io_engine,
                               &err, &same);
        CHECK(rc == 0, "%s: run failed: %s", direct ? "direct" : "buffered", err.msg);
        CHECK(h.shortened == 1 && h.interrupted == 1 && h.calls > 3, "hook saw %d calls", h.calls);
        CHECK(same, "%s: logits differ after a short read + EINTR", direct ? "direct" : "buffered");
    }
    free(ref);
}

static void eio_fails_with_exit_status(int io_engine) {
    int vocab = 0;
    float *ref = reference(NANO, &vocab);
    if (!ref) return;
    hook_state h = {.mode = HOOK_EIO_THIRD};
    k3_err err = {0};
    int same = 0;
    int rc = run_with_hook(ref, vocab, &h, K3_IO_BUFFERED, io_engine, &err, &same);
    free(ref);
    CHECK(h.failed == 1, "the hook injected %d errors", h.failed);
    CHECK(rc == K3_ERR_EXPERT_IO && K3_ERR_EXPERT_IO == 9, "status %d: %s", rc, err.msg);
    CHECK(strstr(err.msg, ".safetensors: layer ") && strstr(err.msg, " expert ") &&
              strstr(err.msg, strerror(EIO)), "message: %s", err.msg);
}

static void test_short_read_and_eintr_retried(void) {
    short_read_and_eintr_retried(K3_IO_ENGINE_THREADS);
}
static void test_eio_fails_with_exit_status(void) { eio_fails_with_exit_status(K3_IO_ENGINE_THREADS); }

/* ---- the io_uring engine ------------------------------------------------------------------ */

/* Whether this kernel lets us make a ring: a store opened with --io-engine uring says which
 * engine it reads with; where the kernel refused (seccomp in a container, old kernel) it
 * must say so and read with the pool, and the uring tests skip. */
static int uring_works(void) {
    k3_engine_opts o = k3_engine_opts_default();
    o.threads = 1;
    o.lab = &(k3_lab_opts){.expert_slots = 8, .gpu_max_layers = -1};
    o.io_engine = K3_IO_ENGINE_URING;
    k3_engine *e = NULL;
    k3_err err = {0};
    char d[K3_DESCRIBE_CAP];
    clean_env();
    int rc = k3_engine_load(NANO, &o, &e, &err);
    if (!rc) describe(e, K3_DESCRIBE_STORE, d);
    k3_engine_free(e);
    CHECK_OR(0, rc == 0, "load failed: %s", err.msg);
    if (strstr(d, "io_uring unavailable")) {
        CHECK_OR(0, strstr(d, "4 threads"), "fell back without the pool: %s", d);
        k3_test_skip("the kernel refuses io_uring here (%s)", strstr(d, "io_uring unavailable"));
        return 0;
    }
    CHECK_OR(0, strstr(d, "io_uring, 4 in flight"), "the load line does not name io_uring: %s", d);
    return 1;
}

static void test_uring_bit_identical(void) {
    if (!uring_works()) return;
    int vocab = 0;
    float *ref = reference(NANO, &vocab);
    if (!ref) return;
    const int slots[] = {1, 5, 40, 256}, threads[] = {1, 4};
    for (size_t a = 0; a < 4; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 2; c++)
                for (int t = 0; t < 2; t++) {
                    char what[128];
                    snprintf(what, sizeof what, "io_uring x%d, %d slots, %s, K3_PIPE %s",
                             threads[t], slots[a], b ? "buffered" : "O_DIRECT", c ? "on" : "off");
                    k3_engine_opts o = k3_engine_opts_default();
                    o.threads = 2;
                    o.lab = &(k3_lab_opts){.expert_slots = slots[a], .gpu_max_layers = -1};
                    o.direct = b ? K3_IO_BUFFERED : K3_IO_DIRECT;
                    o.pipe = c ? K3_PIPE_ALL : K3_PIPE_OFF;
                    o.load_threads = threads[t];
                    o.io_engine = K3_IO_ENGINE_URING;
                    expect_identical(NANO, ref, vocab, o, what);
                }
    free(ref);
}

static void test_uring_short_read_and_eintr(void) {
    if (uring_works()) short_read_and_eintr_retried(K3_IO_ENGINE_URING);
}
static void test_uring_eio(void) {
    if (uring_works()) eio_fails_with_exit_status(K3_IO_ENGINE_URING);
}
static void test_uring_truncated(void) {
    if (uring_works()) truncated_after_load(K3_IO_ENGINE_URING);
}

/* ---- memory -------------------------------------------------------------------------------- */

/* A budget in GB just above 3 slots gives 3 slots (< top-4: below one layer's working set). */
static void test_budget_is_a_ceiling(void) {
    k3_engine *e = NULL;
    k3_session *s = NULL;
    k3_err err = {0};
    k3_engine_opts probe = k3_engine_opts_default();
    probe.threads = 2;
    probe.lab = &(k3_lab_opts){.expert_slots = 1, .gpu_max_layers = -1};
    clean_env();
    int rc = k3_engine_load(NANO, &probe, &e, &err);
    CHECK(rc == 0, "%s", err.msg);
    uint64_t slot = k3_store_slot_bytes(k3_engine_store(e));
    k3_engine_free(e);
    e = NULL;
    double gb = 3.5 * (double)slot / 1e9;
    k3_engine_opts o = k3_engine_opts_default();
    o.threads = 2;
    o.expert_gb = gb;
    o.pipe = K3_PIPE_ALL;
    rc = k3_engine_load(NANO, &o, &e, &err);
    if (!rc) rc = k3_session_new(e, 64, &s, &err);
    float logits[2048];
    for (int t = 0; !rc && t < N_TOK; t++) rc = k3_session_step(s, prompt[t], logits, &err);
    k3_run_stats st = {0};
    if (!rc) k3_session_stats(s, &st);
    int n_slots = e ? k3_store_n_slots(k3_engine_store(e)) : 0;
    k3_session_free(s);
    k3_engine_free(e);
    CHECK(rc == 0, "%s", err.msg);
    CHECK(n_slots == 3, "%.3g GB gave %d slots of %llu bytes", gb, n_slots, (unsigned long long)slot);
    CHECK(st.cache_bytes <= (uint64_t)(gb * 1e9) && st.peak_cache_bytes <= st.cache_bytes,
          "cache %llu, peak %llu, budget %.0f bytes", (unsigned long long)st.cache_bytes,
          (unsigned long long)st.peak_cache_bytes, gb * 1e9);
    CHECK(st.misses > 0 && st.expert_requests == (uint64_t)N_TOK * 8 * 4,
          "%llu requests, %llu misses", (unsigned long long)st.expert_requests,
          (unsigned long long)st.misses);
}

/* ---- synthetic checkpoints (k3-lab synth) ----------------------------------------------- */

/* Runs `$K3_LAB_BIN synth DIR args`; returns DIR (static) or NULL. */
static const char *synth(const char *tag, const char *args) {
    static char dir[256];
    snprintf(dir, sizeof dir, "/tmp/k3-store-synth-%d-%s", (int)getpid(), tag);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf %s && %s synth %s %s >/dev/null", dir, k3t_lab_bin(), dir,
             args);
    CHECK_OR(NULL, access(k3t_lab_bin(), X_OK) == 0, "K3_LAB_BIN=%s is not built",
             k3t_lab_bin());
    CHECK_OR(NULL, system(cmd) == 0, "failed: %s", cmd);
    return dir;
}

/* Expert tensors not back to back: the store says so and reads tensor by tensor, exactly. */
static void test_scattered_experts_fallback(void) {
    const char *dir = synth("scatter", "--layers 3 --experts 8 --top-k 3 --scatter");
    if (!dir) return;
    int vocab = 0;
    float *ref = reference(dir, &vocab);
    k3_engine *e = NULL;
    k3_err err = {0};
    k3_engine_opts o = k3_engine_opts_default();
    o.threads = 2;
    o.lab = &(k3_lab_opts){.expert_slots = 4, .gpu_max_layers = -1};
    o.direct = K3_IO_DIRECT;
    int rc = ref ? k3_engine_load(dir, &o, &e, &err) : -1;
    int noted = !rc && strstr(describe(e, K3_DESCRIBE_STORE, (char[K3_DESCRIBE_CAP]){0}), "tensor by tensor") != NULL;
    k3_engine_free(e);
    if (ref && !rc) expect_identical(dir, ref, vocab, o, "scattered expert tensors");
    free(ref);
    rm_rf(dir);
    CHECK(rc == 0, "%s", err.msg);
    CHECK(noted, "the load line does not mention the per-tensor fallback");
}

/* Real expert size (17.5 MB), a budget of 5 slots below the top-8 working set: the run
 * completes, and the peak RSS the kernel measured for the child stays within 5% of the plan
 * the child printed. */
static void test_peak_rss_within_plan(void) {
#if defined(__SANITIZE_ADDRESS__)
    k3_test_skip("RSS is not meaningful under AddressSanitizer");
    return;
#endif
    const char *dir = synth("rss", "--layers 3 --experts 16 --top-k 8 --real-experts --hidden 256");
    if (!dir) return;
    char log[300], cmd[1024];
    snprintf(log, sizeof log, "%s.log", dir);
    snprintf(cmd, sizeof cmd, "K3_EXPERT_GB=0.1 K3_DIRECT=1 exec %s run %s --prompt-ids 1,2 "
             "--max-new 1 --ids >/dev/null 2>%s", k3t_bin(), dir, log);
    clean_env();
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    struct rusage ru = {0};
    pid_t w = pid > 0 ? wait4(pid, &status, 0, &ru) : -1;
    double plan[5] = {0};
    int slots = 0;
    FILE *f = fopen(log, "r");
    char line[4096];
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "memory plan: base ");
        if (p)
            sscanf(p, "memory plan: base %lf GB + spine %lf GB + expert cache %lf GB (%d slots x "
                   "%*f MB, %*[a-z0-9]) + state %lf GB", &plan[0], &plan[1], &plan[2], &slots,
                   &plan[3]);
    }
    if (f) fclose(f);
    unlink(log);
    rm_rf(dir);
    CHECK(w == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "k3 run failed (%d): %s",
          status, cmd);
    CHECK(slots == 5 && plan[2] > 0, "no memory plan line with 5 slots (got %d)", slots);
    double planned = (plan[0] + plan[1] + plan[2] + plan[3]) * 1e9;
    double peak = (double)ru.ru_maxrss * 1024;
    CHECK(peak <= 1.05 * planned, "peak RSS %.1f MB > plan %.1f MB + 5%%", peak / 1e6,
          planned / 1e6);
    CHECK(peak > plan[2] * 1e9, "peak RSS %.1f MB below the cache alone (%.1f MB): the test "
          "did not exercise the cache", peak / 1e6, plan[2] * 1e3);
}

/* ---- prefetch predictors next to MLA layers; the order of a burst of reads ------------- */

/* k3-nano's full_attn_layers are [4, 8, 9] (one-based): layers 3, 7 and 8 are MLA, so the
 * lookahead (layer l's router on layer l-1's MoE input) is blind for l in {3, 4, 7, 8}. */
static const int nano_blind[9] = {0, 0, 0, 1, 1, 0, 0, 1, 1};

/* The predictor read at each layer: the previous token's next to an MLA layer, whatever
 * K3_PIPE asks for; the store reads prefetches only from that predictor. */
static void test_mla_adjacent_layers_use_prev(void) {
    const int pipes[] = {K3_PIPE_LOOKAHEAD, K3_PIPE_ALL, K3_PIPE_PREV, K3_PIPE_OFF};
    for (size_t i = 0; i < 4 && !k3_test_stopped(); i++) {
        k3_engine *e = NULL;
        k3_err err = {0};
        k3_engine_opts o = {.threads = 1, .lab = &(k3_lab_opts){.expert_slots = 256, .gpu_max_layers = -1}, .pipe = pipes[i]};
        clean_env();
        int rc = k3_engine_load(NANO, &o, &e, &err);
        CHECK(rc == 0, "load failed: %s", err.msg);
        if (rc) return;
        k3_store *st = k3_engine_store(e);
        for (int l = 0; l < 9; l++) {
            int want = pipes[i] == K3_PIPE_OFF ? 0 : pipes[i] == K3_PIPE_PREV ? 1 :
                       nano_blind[l] ? 1 : pipes[i];
            CHECK(k3_store_layer_pipe(st, l) == want, "K3_PIPE %d, layer %d: predictors %d, "
                  "want %d", pipes[i], l, k3_store_layer_pipe(st, l), want);
        }
        if (pipes[i] == K3_PIPE_LOOKAHEAD) { /* reads: prev at 4, lookahead at 2, nothing else */
            k3_store_client *c = NULL;
            CHECK(k3_store_client_new(st, &c, &err) == 0, "client: %s", err.msg);
            const int ids[4] = {0, 5, 9, 31};
            const struct { int layer, source, reads; } ask[] = {
                {4, K3_PIPE_LOOKAHEAD, 0}, {4, K3_PIPE_PREV, 4},
                {2, K3_PIPE_PREV, 0}, {2, K3_PIPE_LOOKAHEAD, 4}, {3, K3_PIPE_LOOKAHEAD, 0}};
            k3_store_stats a, b;
            for (size_t q = 0; c && q < sizeof ask / sizeof *ask; q++) {
                k3_store_get_stats(st, &a);
                k3_store_prefetch(c, ask[q].layer, ids, 4, ask[q].source);
                k3_store_get_stats(st, &b);
                CHECK(b.prefetch_reads - a.prefetch_reads == (uint64_t)ask[q].reads,
                      "layer %d source %d: %llu prefetch reads, want %d", ask[q].layer,
                      ask[q].source, (unsigned long long)(b.prefetch_reads - a.prefetch_reads),
                      ask[q].reads);
            }
            k3_store_client_free(c);
        }
        k3_engine_free(e);
    }
}

/* A decode with both predictors: bit-identical logits; the lookahead is routed (and scored)
 * only at layers 2, 5, 6 (layer 1 follows the dense layer 0, which predicts nothing), the
 * previous token's choice at every MoE layer from 2 on once a token has passed. */
static void test_mla_fallback_decode(void) {
    int vocab = 0;
    float *ref = reference(NANO, &vocab);
    if (!ref) return;
    expect_identical(NANO, ref, vocab, (k3_engine_opts){.threads = 2, .lab = &(k3_lab_opts){.expert_slots = 40, .gpu_max_layers = -1},
                     .pipe = K3_PIPE_LOOKAHEAD}, "K3_PIPE lookahead, 40 slots");
    expect_identical(NANO, ref, vocab, (k3_engine_opts){.threads = 2, .lab = &(k3_lab_opts){.expert_slots = 9, .gpu_max_layers = -1},
                     .pipe = K3_PIPE_ALL}, "K3_PIPE all, 9 slots");
    k3_engine *e = NULL;
    k3_session *s = NULL;
    k3_err err = {0};
    k3_engine_opts o = {.threads = 2, .lab = &(k3_lab_opts){.expert_slots = 40, .gpu_max_layers = -1}, .pipe = K3_PIPE_ALL};
    clean_env();
    int rc = k3_engine_load(NANO, &o, &e, &err);
    if (!rc) rc = k3_session_new(e, 64, &s, &err);
    float *got = malloc((size_t)vocab * sizeof *got);
    int same = got != NULL;
    for (int t = 0; !rc && got && t < N_TOK; t++) {
        rc = k3_session_step(s, prompt[t], got, &err);
        same &= !rc && memcmp(got, ref + (size_t)t * vocab, (size_t)vocab * sizeof *got) == 0;
    }
    k3_store_stats ss = {0};
    if (!rc) k3_store_get_stats(k3_engine_store(e), &ss);
    free(got);
    k3_session_free(s);
    k3_engine_free(e);
    free(ref);
    CHECK(rc == 0 && same, "decode failed or differs: %s", err.msg);
    uint64_t la_layers = 0, prev_layers = 0;
    for (int l = 2; l < 9; l++) la_layers += !nano_blind[l], prev_layers++;
    CHECK(ss.recall_total[K3_PIPE_LOOKAHEAD] == N_TOK * la_layers * 4,
          "lookahead scored %llu times, want %llu (%d tokens x layers 2, 5, 6 x top-4)",
          (unsigned long long)ss.recall_total[K3_PIPE_LOOKAHEAD],
          (unsigned long long)(N_TOK * la_layers * 4), N_TOK);
    CHECK(ss.recall_total[K3_PIPE_PREV] == (N_TOK - 1) * prev_layers * 4,
          "prev scored %llu times, want %llu", (unsigned long long)ss.recall_total[K3_PIPE_PREV],
          (unsigned long long)((N_TOK - 1) * prev_layers * 4));
    CHECK(ss.read_busy_s > 0 && ss.read_busy_s <= ss.read_s + 1e-9,
          "read busy %.6f s must be in (0, summed read time %.6f s]", ss.read_busy_s, ss.read_s);
}

/* One burst of reads (k3_store_order_reads) on a hand-built store: 3 shards, shards 0 and 2
 * on drive 7, shard 1 on drive 9. The burst must come sorted by (shard, offset) per drive,
 * and interleaved: the i-th read of each drive before the (i+1)-th of any. */
static void test_burst_sorted_and_interleaved(void) {
    enum { E = 8 };
    k3_expert_loc loc[E] = {0};
    const int shard[E] = {2, 0, 1, 0, 1, 2, 1, 0};
    const uint64_t off[E] = {4096, 8192, 12288, 4096, 4096, 0, 8192, 0};
    for (int i = 0; i < E; i++) loc[i].shard[0] = shard[i], loc[i].off[0] = off[i];
    dev_t dev[3] = {7, 9, 7};
    k3_slot slots[E];
    for (int i = 0; i < E; i++) slots[i] = (k3_slot){.key = E - 1 - i}; /* slot i holds E-1-i */
    k3_store st = {.n_experts = E, .loc = loc, .dev = dev, .slots = slots};
    int batch[E], rank[E];
    for (int i = 0; i < E; i++) batch[i] = i;
    k3_store_order_reads(&st, batch, rank, E);
    /* expected, worked by hand: drive 7 in (shard, offset) order: keys 7 (0,0), 3 (0,4096),
     * 1 (0,8192), 5 (2,0), 0 (2,4096); drive 9: 4 (1,4096), 6 (1,8192), 2 (1,12288);
     * interleaved by rank, (shard, offset) order within a rank: 7, 4, 3, 6, 1, 2, 5, 0. */
    const int want_keys[E] = {7, 4, 3, 6, 1, 2, 5, 0};
    for (int i = 0; i < E; i++)
        CHECK(slots[batch[i]].key == want_keys[i], "read %d: expert %d, want %d", i,
              slots[batch[i]].key, want_keys[i]);
}

/* ---- auto prefetch: a predictor pauses while its reads go unused ---------------------- */

/* The rule at its lines: reads until 64 predictions are scored; with the disk idle (busy 0)
 * a reading predictor keeps on at 45% used and pauses below, a paused one resumes above 55%,
 * not at it; with the disk busy 90% of the time the lines are 85% and 95%; fully busy, a
 * perfect predictor keeps reading and a paused one never resumes. */
static void test_prefetch_keeps_rule(void) {
    static const struct { uint64_t useful, cands; int reading; double busy; int keeps; } cases[] = {
        {0, 0, 1, 0, 1},    {0, 63, 1, 0, 1},   {0, 63, 0, 0, 1},   {0, 64, 1, 0, 0},
        {29, 64, 1, 0, 1},  {28, 64, 1, 0, 0},  /* 45.3% keeps, 43.8% pauses */
        {45, 100, 1, 0, 1}, {44, 100, 1, 0, 0}, {55, 100, 0, 0, 0}, {56, 100, 0, 0, 1},
        {50, 100, 1, 0, 1}, {50, 100, 0, 0, 0}, /* between the lines: stays as it was */
        {45, 100, 1, 0.3, 1}, {56, 100, 0, 0.3, 1}, /* busy below half: half still rules */
        {63, 100, 1, 0.9, 0}, {85, 100, 1, 0.9, 1}, {84, 100, 1, 0.9, 0},
        {95, 100, 0, 0.9, 0}, {96, 100, 0, 0.9, 1},
        {100, 100, 1, 1.0, 1}, {100, 100, 0, 1.0, 0},
        {1000, 1000, 0, 0, 1}, {0, 1000, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        CHECK(k3_prefetch_keeps(cases[i].useful, cases[i].cands, cases[i].reading,
                                cases[i].busy) == cases[i].keeps,
              "useful %llu of %llu, reading %d, busy %.2f: want keeps %d",
              (unsigned long long)cases[i].useful, (unsigned long long)cases[i].cands,
              cases[i].reading, cases[i].busy, cases[i].keeps);
}

/* Runs 32 layer visits on k3-nano (layers 1-8, 4 each; 32 experts, top-4), each predicted by
 * the previous-token source before it begins: `right` of the four predictions are experts
 * the layer then asks for, the others experts it never asks for; every prediction is of
 * experts neither cached nor in flight. busy > 0: the spine's reader is noted as reading that
 * share of the time first. Returns the store's counters after. */
static int visit_layers(int pipe, int right, double busy, k3_store_stats *out) {
    k3_engine *e = NULL;
    k3_store_client *c = NULL;
    k3_err err = {0};
    k3_engine_opts o = {.threads = 1, .lab = &(k3_lab_opts){.expert_slots = 256, .gpu_max_layers = -1}, .pipe = pipe};
    clean_env();
    int rc = k3_engine_load(NANO, &o, &e, &err);
    if (!rc) rc = k3_store_client_new(k3_engine_store(e), &c, &err);
    if (!rc && busy > 0) {
        k3_store_note_spine(k3_engine_store(e), 0, 100);
        k3_store_note_spine(k3_engine_store(e), 10 * busy, 110);
    }
    for (int v = 0; !rc && v < 32; v++) {
        int layer = 1 + v / 4, r = v % 4, pred[4], ids[4];
        for (int j = 0; j < 4; j++) ids[j] = 8 * r + j, pred[j] = j < right ? ids[j] : ids[j] + 4;
        k3_store_prefetch(c, layer, pred, 4, K3_PIPE_PREV);
        k3_store_begin(c, layer, ids, 4);
        for (int n = 0; !rc && n < 4; n++) {
            int j = -1;
            k3_expert ex;
            if (!(rc = k3_store_next(c, &j, &ex, &err))) k3_store_done(c, j);
        }
        k3_store_end(c);
    }
    if (!rc) k3_store_get_stats(k3_engine_store(e), out);
    k3_store_client_free(c);
    k3_engine_free(e);
    CHECK_OR(rc, rc == 0, "pipe %d: %s", pipe, err.msg);
    return rc;
}

/* Under K3_PIPE_AUTO a predictor none of whose reads are used reads its first 64 predictions
 * (16 visits x 4), then pauses: the other 64 are skipped. One whose reads are all used never
 * pauses, nor does one 3 of 4 right with the disk idle; 3 of 4 right with the spine's reader
 * busy 90% of the time pauses at 64 (75% < 85%); 2 of 4 right with the disk idle stays at
 * its line (50% >= 45%). An explicit K3_PIPE_ALL reads every wrong prediction. */
static void test_auto_prefetch_pauses_when_unused(void) {
    static const struct { int pipe, right; double busy; uint64_t reads, skipped; } cases[] = {
        {K3_PIPE_AUTO, 0, 0, 64, 64},    {K3_PIPE_AUTO, 4, 0, 128, 0},
        {K3_PIPE_AUTO, 3, 0, 128, 0},    {K3_PIPE_AUTO, 3, 0.9, 64, 64},
        {K3_PIPE_AUTO, 2, 0, 128, 0},    {K3_PIPE_AUTO, 4, 0.9, 128, 0},
        {K3_PIPE_ALL, 0, 0.9, 128, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases && !k3_test_stopped(); i++) {
        k3_store_stats st = {0};
        if (visit_layers(cases[i].pipe, cases[i].right, cases[i].busy, &st)) continue;
        CHECK(st.prefetch_reads == cases[i].reads && st.prefetch_skipped == cases[i].skipped,
              "pipe %d, %d of 4 right, busy %.1f: %llu prefetch reads, %llu skipped; want "
              "%llu, %llu", cases[i].pipe, cases[i].right, cases[i].busy,
              (unsigned long long)st.prefetch_reads, (unsigned long long)st.prefetch_skipped,
              (unsigned long long)cases[i].reads, (unsigned long long)cases[i].skipped);
        uint64_t used = st.prefetch_hits + st.prefetch_late;
        CHECK(used == cases[i].reads * (uint64_t)cases[i].right / 4, "%d of 4 right: %llu "
              "prefetches used of %llu", cases[i].right, (unsigned long long)used,
              (unsigned long long)cases[i].reads);
    }
}

const k3_test k3_suite_store[] = {
    {"mla_adjacent_layers_prefetch_the_previous_choice", test_mla_adjacent_layers_use_prev},
    {"mla_fallback_decode_bit_identical_and_scored", test_mla_fallback_decode},
    {"burst_sorted_by_file_offset_interleaved_by_drive", test_burst_sorted_and_interleaved},
    {"prefetch_keeps_rule_at_its_lines", test_prefetch_keeps_rule},
    {"auto_prefetch_pauses_when_its_reads_go_unused", test_auto_prefetch_pauses_when_unused},
    {"budgets_directio_pipe_policies_bit_identical", test_budgets_bit_identical},
    {"shards_in_two_folders_bit_identical", test_two_folders},
    {"truncated_after_load_fails_naming_shard_layer_expert", test_truncated_after_load},
    {"short_read_and_eintr_retried", test_short_read_and_eintr_retried},
    {"eio_fails_with_expert_io_status", test_eio_fails_with_exit_status},
    {"uring_budgets_directio_pipe_bit_identical", test_uring_bit_identical},
    {"uring_short_read_and_eintr_retried", test_uring_short_read_and_eintr},
    {"uring_eio_fails_with_expert_io_status", test_uring_eio},
    {"uring_truncated_fails_naming_shard_layer_expert", test_uring_truncated},
    {"budget_below_working_set_is_a_ceiling", test_budget_is_a_ceiling},
    {"scattered_expert_tensors_per_tensor_fallback", test_scattered_experts_fallback},
    {"real_expert_size_peak_rss_within_plan", test_peak_rss_within_plan},
    {0},
};
