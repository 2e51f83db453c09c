/* test_spinewide.c — the spine budget on k3-wide (real widths, 5.3 GB of spine, offsets past
 * 4 GiB): with --spine-gb 0 the logits are bit-identical to the in-place path, and the shards'
 * mappings hold (almost) nothing in RSS: streamed layers are never touched through them.
 * Runs with K3_WIDE_DIR set (scripts/test-wide.sh); skipped otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../src/engine/k3.h"
#include "../src/engine/k3_lab.h"
#include "pack_helpers.h"
#include "test.h"

#define N_TOK 2
static const int32_t ids[N_TOK] = {1, 500};

/* Resident bytes of every mapping of a file under dir (/proc/self/smaps). */
static unsigned long long mapped_rss(const char *dir) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[4096];
    int inside = 0;
    unsigned long long kb = 0, v;
    while (f && fgets(line, sizeof line, f)) {
        if (strchr(line, '-') && strchr(line, ' ') && line[0] != ' ' &&
            strchr(line, '-') < strchr(line, ' ')) /* a mapping's header line */
            inside = strstr(line, dir) && strstr(line, ".safetensors");
        else if (inside && sscanf(line, "Rss: %llu kB", &v) == 1)
            kb += v;
    }
    if (f) fclose(f);
    return kb * 1024;
}

static int run(const char *dir, int budget, float *logits, int *vocab,
               unsigned long long *rss, k3_err *err) {
    k3_engine *e = NULL;
    k3_session *s = NULL;
    k3_engine_opts o = k3_engine_opts_default();
    o.spine = K3_SPINE_BF16;
    /* in place whatever the plan (the lab's control), else streaming every layer */
    o.spine_gb = budget ? 0 : K3_SPINE_GB_PLAN;
    k3_lab_opts lab = {.expert_slots = 40, .spine_in_place = !budget, .gpu_max_layers = -1};
    o.lab = &lab;
    unsetenv("K3_SPINE_GB");
    unsetenv("K3_MMAP_EXPERTS");
    int rc = k3_engine_load(dir, &o, &e, err);
    if (!rc) rc = k3_session_new(e, 16, &s, err);
    if (!rc) *vocab = k3_engine_config(e)->vocab_size;
    for (int t = 0; !rc && t < N_TOK; t++)
        rc = k3_session_step(s, ids[t], logits + (size_t)t * *vocab, err);
    *rss = mapped_rss(dir);
    k3_session_free(s);
    k3_engine_free(e);
    return rc;
}

static void test_wide_budget_zero(void) {
    const char *dir;
    if (!ph_wide(&dir, NULL)) return;
    const size_t max_vocab = 1 << 18;
    float *ref = malloc(N_TOK * max_vocab * sizeof *ref);
    float *got = malloc(N_TOK * max_vocab * sizeof *got);
    CHECK(ref && got, "out of memory");
    k3_err err = {0};
    int vocab = 0;
    unsigned long long rss_in_place = 0, rss_streamed = 0;
    int rc = run(dir, 0, ref, &vocab, &rss_in_place, &err);
    if (!rc) rc = run(dir, 1, got, &vocab, &rss_streamed, &err);
    int same = !rc && memcmp(got, ref, N_TOK * (size_t)vocab * sizeof *got) == 0;
    free(ref);
    free(got);
    CHECK(rc == 0, "%s", err.msg);
    CHECK(same, "--spine-gb 0: logits differ from the in-place path");
    /* in place, the spine's pages (5.3 GB) are mapped in; streamed, only shard headers and
     * pages next to them (fault-around) */
    CHECK(rss_in_place > 4000000000ull, "in place: only %llu bytes of the shards resident",
          rss_in_place);
    CHECK(rss_streamed < 64000000ull, "--spine-gb 0: %llu bytes of the shards' mappings are "
          "resident (streamed layers touched through the mapping?)", rss_streamed);
}

const k3_test k3_suite_spinewide[] = {
    {"wide_budget_zero", test_wide_budget_zero},
    {0},
};
