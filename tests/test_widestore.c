/* test_widestore.c — the expert store on k3-wide (real expert size, 17,547,264 B; offsets past
 * 4 GiB): logits bit-identical to the in-place path with the smallest useful cache (top-k + 1
 * slots, O_DIRECT, prefetch on) and with every expert cached (buffered, prefetch off). Runs
 * with K3_WIDE_DIR set (scripts/test-wide.sh); skipped otherwise. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../src/engine/k3.h"
#include "../src/engine/k3_lab.h"
#include "../src/store/store.h"
#include "pack_helpers.h"
#include "test.h"

#define N_TOK 3
static const int32_t ids[N_TOK] = {1, 500, 77};

static int run(const char *dir, k3_engine_opts o, float *logits, int *vocab, k3_err *err) {
    k3_engine *e = NULL;
    k3_session *s = NULL;
    unsetenv("K3_MMAP_EXPERTS"); /* the wide suite may set it for its other kernel paths */
    int rc = k3_engine_load(dir, &o, &e, err);
    if (!rc) rc = k3_session_new(e, 16, &s, err);
    if (!rc) *vocab = k3_engine_config(e)->vocab_size;
    for (int t = 0; !rc && t < N_TOK; t++)
        rc = k3_session_step(s, ids[t], logits ? logits + (size_t)t * *vocab : NULL, err);
    k3_session_free(s);
    k3_engine_free(e);
    return rc;
}

static void test_wide_store_bit_identical(void) {
    const char *dir;
    if (!ph_wide(&dir, NULL)) return;
    const size_t max_vocab = 1 << 18;
    float *ref = malloc(N_TOK * max_vocab * sizeof *ref), *got = malloc(N_TOK * max_vocab * sizeof *got);
    CHECK(ref && got, "out of memory");
    k3_err err = {0};
    int vocab = 0;
    k3_engine_opts in_place = k3_engine_opts_default();
    in_place.experts_in_place = 1;
    int rc = run(dir, in_place, ref, &vocab, &err);
    CHECK(rc == 0 && (size_t)vocab <= max_vocab, "in-place run: %s", err.msg);
    const struct { int slots, direct, pipe; const char *what; } cfg[] = {
        {17, K3_IO_DIRECT, K3_PIPE_ALL, "17 slots, O_DIRECT, pipe"},
        {1000, K3_IO_BUFFERED, K3_PIPE_OFF, "all, buffered"},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        k3_engine_opts o = k3_engine_opts_default();
        o.lab = &(k3_lab_opts){.expert_slots = cfg[i].slots, .gpu_max_layers = -1}, o.direct = cfg[i].direct, o.pipe = cfg[i].pipe;
        rc = run(dir, o, got, &vocab, &err);
        CHECK(rc == 0, "%s: %s", cfg[i].what, err.msg);
        CHECK(memcmp(got, ref, N_TOK * (size_t)vocab * sizeof *got) == 0,
              "%s: logits differ from the in-place path", cfg[i].what);
    }
    free(ref);
    free(got);
}

const k3_test k3_suite_widestore[] = {
    {"wide_store_bit_identical", test_wide_store_bit_identical},
    {0},
};
