/* test_spine.c — the resident spine budget (src/model/spine.h, issue 8 item 4): the output is
 * bit-identical for every budget (token by token, chunked prefill, rewindable passes, int8
 * spine, sessions on two threads), the plan's numbers agree with the checkpoint's tensor
 * sizes, and a shard cut short after load fails the step with K3_ERR_IO naming the file. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/engine/k3.h"
#include "../src/engine/k3_lab.h"
#include "../src/format/safetensors.h"
#include "pack_helpers.h"
#include "test.h"

#define N_TOK 24
static const int32_t prompt[N_TOK] = {1792, 5,   77,  1000, 9,    300, 1500, 2,    64, 65,
                                      66,   67,  400, 401,  1200, 7,   8,    1100, 3,  4,
                                      900,  901, 12,  13};

enum { NO_FLAG = -1 }; /* budget argument: no budget at all (everything in place) */

static void clean_env(void) {
    unsetenv("K3_SPINE_GB");
    unsetenv("K3_DEVICE");
}

static const k3_lab_opts in_place = {.spine_in_place = 1, .gpu_max_layers = -1};

static int load_io(const char *dir, double gb, int int8, const char *pack_dir, int direct,
                   k3_engine **e, k3_err *err) {
    k3_engine_opts o = k3_engine_opts_default();
    o.threads = 2;
    o.spine_gb = gb == NO_FLAG ? K3_SPINE_GB_PLAN : gb < 0 ? 0 : gb;
    o.lab = gb == NO_FLAG ? &in_place : NULL; /* in place whatever the plan */
    o.spine = int8 ? K3_SPINE_INT8 : K3_SPINE_BF16;
    o.pack_dir = pack_dir;
    o.direct = direct;
    clean_env();
    return k3_engine_load(dir, &o, e, err);
}

static int load(const char *dir, double gb, int int8, const char *pack_dir, k3_engine **e,
                k3_err *err) {
    return load_io(dir, gb, int8, pack_dir, 0, e, err);
}

/* Bytes of a layer's spine, from the checkpoint alone: every tensor of the layer but the
 * routed experts and the AttnRes norms/projections (folded into f32 copies at load); *pinned
 * gets the router, its bias and the conv taps (copied at open when the layer streams), and
 * half[0] / half[1] (may be NULL) what is read for its token mixer / its FFN. */
static uint64_t layer_bytes(const k3_checkpoint *ck, int l, uint64_t *pinned, uint64_t *half) {
    char prefix[64];
    int n = snprintf(prefix, sizeof prefix, "language_model.model.layers.%d.", l);
    uint64_t sum = 0, h[2] = {0, 0};
    *pinned = 0;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const k3_tensor *t = &ck->tensors[i];
        if (strncmp(t->name, prefix, (size_t)n) || strstr(t->name, ".experts.") ||
            strstr(t->name, "_res_"))
            continue;
        sum += t->nbytes;
        if (strstr(t->name, "conv1d") || strstr(t->name, "gate.weight") ||
            strstr(t->name, "e_score_correction_bias"))
            *pinned += t->nbytes;
        else
            h[strstr(t->name, ".self_attn.") || strstr(t->name, ".input_layernorm.") ? 0 : 1] +=
                t->nbytes;
    }
    if (half) half[0] = h[0], half[1] = h[1];
    return sum;
}

static uint64_t tensor_bytes(const k3_checkpoint *ck, const char *name) {
    const k3_tensor *t = k3_checkpoint_find(ck, name);
    return t ? t->nbytes : 0;
}

/* Logits after every prompt position: token by token (chunk 0) or k3_session_prefill in
 * chunks, whose last pass's logits are compared, plus the steps after it. */
static float *run(k3_engine *e, int chunk, k3_err *err, int *rc) {
    int V = k3_engine_config(e)->vocab_size;
    float *out = malloc((size_t)N_TOK * V * sizeof *out);
    k3_session *s = NULL;
    *rc = k3_session_new(e, 64, &s, err);
    if (!*rc && chunk == 0)
        for (int t = 0; t < N_TOK && !*rc; t++)
            *rc = k3_session_step(s, prompt[t], out + (size_t)t * V, err);
    if (!*rc && chunk > 0) { /* passes of `chunk` ids with logits at every position */
        k3_session_set_chunk(s, chunk);
        for (int t = 0; t < N_TOK && !*rc; t += chunk) {
            int n = N_TOK - t < chunk ? N_TOK - t : chunk;
            *rc = k3_session_forward(s, prompt + t, n, out + (size_t)t * V, K3_FWD_ALL_LOGITS,
                                     err);
        }
    }
    k3_session_free(s);
    return out;
}

/* Token by token and in chunks of 5 and 24, for budgets: none, 0 (O_DIRECT and buffered
 * reads), a part, all. The part is
 * 3/4 of the layers' and lm_head's bytes: at nano's sizes the two staging buffers take a
 * fifth of the spine, so half would keep lm_head alone; 3/4 keeps lm_head and a few layers. */
static void test_identical_for_every_budget(void) {
    k3_engine *e = NULL;
    k3_err err = {0};
    int rc = load(NANO, NO_FLAG, 0, NULL, &e, &err);
    CHECK(rc == 0, "%s", err.msg);
    int V = k3_engine_config(e)->vocab_size;
    float *ref = run(e, 0, &err, &rc);
    k3_engine_free(e);
    CHECK(rc == 0, "%s", err.msg);
    k3_checkpoint *ck = NULL;
    CHECK(k3_checkpoint_open(NANO, &ck, &err) == 0, "%s", err.msg);
    uint64_t total = tensor_bytes(ck, "language_model.lm_head.weight"), pin;
    for (int l = 0; l < 9; l++) total += layer_bytes(ck, l, &pin, NULL);
    k3_checkpoint_close(ck);
    const double budgets[] = {NO_FLAG, 0, 0, 0.75 * total / 1e9, 1000};
    const int direct[] = {0, 0, -1, 0, 0}; /* -1: buffered + DONTNEED (--direct 0) */
    const int chunks[] = {0, 5, 24};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
        rc = load_io(NANO, budgets[b], 0, NULL, direct[b], &e, &err);
        k3_spine_stats st;
        if (!rc) k3_engine_spine_stats(e, &st);
        if (!rc && budgets[b] == 0 && st.direct != (direct[b] == 0)) k3_engine_free(e);
        CHECK(rc || budgets[b] != 0 || st.direct == (direct[b] == 0), "budget 0: O_DIRECT %d",
              st.direct);
        CHECK(rc == 0, "budget %g: %s", budgets[b], err.msg);
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
            float *got = run(e, chunks[c], &err, &rc);
            int same = !rc && memcmp(got, ref, (size_t)N_TOK * V * sizeof *got) == 0;
            free(got);
            if (rc || !same) k3_engine_free(e), free(ref);
            CHECK(rc == 0, "budget %g chunk %d: %s", budgets[b], chunks[c], err.msg);
            CHECK(same, "budget %g chunk %d: logits differ from the run without a budget",
                  budgets[b], chunks[c]);
        }
        k3_engine_free(e);
    }
    free(ref);
}

/* The plan against the checkpoint: budget 0 streams all, a large one keeps all, 3/4 (see
 * above) keeps lm_head and a prefix of layers whose bytes are exactly the tensors' sizes,
 * within the budget. */
static void test_plan_numbers(void) {
    k3_checkpoint *ck = NULL;
    k3_err err = {0};
    CHECK(k3_checkpoint_open(NANO, &ck, &err) == 0, "%s", err.msg);
    uint64_t head = tensor_bytes(ck, "language_model.lm_head.weight");
    uint64_t norm = tensor_bytes(ck, "language_model.model.norm.weight");
    uint64_t layer[9], pinned[9], half[9][2], all = head, pinned_all = 0;
    for (int l = 0; l < 9; l++) {
        layer[l] = layer_bytes(ck, l, &pinned[l], half[l]);
        all += layer[l];
        pinned_all += pinned[l];
    }
    k3_checkpoint_close(ck);
    CHECK(head > 0 && layer[0] > 0 && pinned[1] > 0, "fixture tensors not found");

    const double gbs[] = {0, 0.75 * all / 1e9, 1000};
    for (int i = 0; i < 3; i++) {
        k3_engine *e = NULL;
        int rc = load(NANO, gbs[i], 0, NULL, &e, &err);
        CHECK(rc == 0, "%s", err.msg);
        k3_spine_stats st;
        k3_engine_spine_stats(e, &st);
        k3_engine_free(e);
        CHECK(st.budgeted && st.n_layers == 9 && st.budget_bytes == (uint64_t)(gbs[i] * 1e9),
              "budget %g: not in effect", gbs[i]);
        CHECK(st.resident_layers + st.streamed_layers == 9, "%d + %d layers",
              st.resident_layers, st.streamed_layers);
        uint64_t res = st.head_resident ? head + norm : 0, streamed = st.head_resident ? 0 : head;
        for (int l = 0; l < 9; l++)
            if (l < st.resident_layers) res += layer[l];
            else streamed += layer[l] - pinned[l];
        CHECK(st.resident_bytes == res, "budget %g: resident %llu bytes, the tensors hold %llu",
              gbs[i], (unsigned long long)st.resident_bytes, (unsigned long long)res);
        CHECK(st.streamed_bytes == streamed, "budget %g: streamed %llu bytes, want %llu", gbs[i],
              (unsigned long long)st.streamed_bytes, (unsigned long long)streamed);
        if (i == 0)
            CHECK(st.resident_layers == 0 && !st.head_resident && st.staging_bytes > 0 &&
                      st.pinned_bytes >= pinned_all + norm, "budget 0 must stream everything");
        if (i == 2)
            CHECK(st.resident_layers == 9 && st.head_resident && st.staging_bytes == 0 &&
                      st.pinned_bytes == 0 && st.bytes_read == 0, "a large budget keeps all");
        if (i == 1) {
            CHECK(st.head_resident && st.resident_layers > 0 && st.streamed_layers > 0,
                  "3/4: lm_head + %d layers resident", st.resident_layers);
            CHECK(st.resident_bytes + st.staging_bytes + st.pinned_bytes <= st.budget_bytes,
                  "3/4: the plan exceeds its budget");
            /* staging: two buffers, each holds the largest streamed half-layer (aligned) */
            uint64_t big = 0;
            for (int l = st.resident_layers; l < 9; l++)
                for (int h = 0; h < 2; h++)
                    if (half[l][h] > big) big = half[l][h];
            int paged = st.staging_bytes / 8192 * 8192 == st.staging_bytes;
            CHECK(st.staging_bytes >= 2 * big && paged,
                  "staging %llu < 2 x %llu", (unsigned long long)st.staging_bytes,
                  (unsigned long long)big);
        }
    }
}

/* A rewindable pass (speculative verification) streamed, rewound, continued. */
static void test_rewind_streamed(void) {
    float *ref[2] = {NULL, NULL};
    k3_err err = {0};
    for (int k = 0; k < 2; k++) {
        k3_engine *e = NULL;
        k3_session *s = NULL;
        int rc = load(NANO, k ? 0 : NO_FLAG, 0, NULL, &e, &err);
        if (!rc) rc = k3_session_new(e, 64, &s, &err);
        int V = rc ? 0 : k3_engine_config(e)->vocab_size;
        ref[k] = calloc((size_t)3 * V + 1, sizeof(float));
        if (!rc) rc = k3_session_forward(s, prompt, 10, NULL, 0, &err);
        if (!rc) rc = k3_session_forward(s, prompt + 10, 6, NULL, K3_FWD_REWINDABLE, &err);
        if (!rc) rc = k3_session_rewind(s, 12, &err);
        if (!rc) rc = k3_session_forward(s, prompt + 20, 3, ref[k], K3_FWD_ALL_LOGITS, &err);
        k3_session_free(s);
        k3_engine_free(e);
        if (rc) free(ref[0]), free(ref[1]);
        CHECK(rc == 0, "%s", err.msg);
        if (k) {
            int same = memcmp(ref[0], ref[1], (size_t)3 * V * sizeof(float)) == 0;
            free(ref[0]), free(ref[1]);
            CHECK(same, "rewound pass: logits differ with budget 0");
        }
    }
}

typedef struct worker {
    k3_engine *e;
    const float *ref;
    int rc, same;
    k3_err err;
} worker;

static void *decode_thread(void *arg) {
    worker *w = arg;
    int V = k3_engine_config(w->e)->vocab_size;
    for (int rep = 0; rep < 3 && !w->rc; rep++) {
        float *got = run(w->e, rep == 1 ? 4 : 0, &w->err, &w->rc);
        w->same = !w->rc && memcmp(got, w->ref, (size_t)N_TOK * V * sizeof *got) == 0;
        free(got);
        if (!w->same) break;
    }
    return NULL;
}

/* Two sessions on two threads share one engine streaming every layer. */
static void test_threads_share_staging(void) {
    k3_engine *e = NULL;
    k3_err err = {0};
    int rc = load(NANO, NO_FLAG, 0, NULL, &e, &err);
    CHECK(rc == 0, "%s", err.msg);
    float *ref = run(e, 0, &err, &rc);
    k3_engine_free(e);
    CHECK(rc == 0, "%s", err.msg);
    rc = load(NANO, 0, 0, NULL, &e, &err);
    if (rc) free(ref);
    CHECK(rc == 0, "%s", err.msg);
    worker w[2] = {{e, ref, 0, 0, {0}}, {e, ref, 0, 0, {0}}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, decode_thread, &w[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    k3_engine_free(e);
    free(ref);
    for (int i = 0; i < 2; i++) {
        CHECK(w[i].rc == 0, "thread %d: %s", i, w[i].err.msg);
        CHECK(w[i].same, "thread %d: logits differ from a single session's", i);
    }
}

/* The int8 packed spine streams too, with the same output as int8 in place. */
static void test_int8_spine(void) {
    const char *pack = ph_nano_pack();
    if (!pack) return;
    float *out[2] = {NULL, NULL};
    k3_err err = {0};
    int V = 0;
    for (int k = 0; k < 2; k++) {
        k3_engine *e = NULL;
        int rc = load(NANO, k ? 0 : NO_FLAG, 1, pack, &e, &err);
        if (!rc) V = k3_engine_config(e)->vocab_size, out[k] = run(e, k ? 5 : 0, &err, &rc);
        k3_spine_stats st;
        if (!rc) k3_engine_spine_stats(e, &st);
        k3_engine_free(e);
        if (rc) free(out[0]);
        CHECK(rc == 0, "%s", err.msg);
        if (k) CHECK(st.streamed_layers == 9 && st.bytes_read > 0, "int8: nothing streamed");
    }
    int same = memcmp(out[0], out[1], (size_t)N_TOK * V * sizeof(float)) == 0;
    free(out[0]), free(out[1]);
    CHECK(same, "int8 spine: logits differ with budget 0");
}

/* A shard cut short after load, inside layer 8's spine: K3_ERR_IO naming the shard, no logits;
 * with the bytes back and the session reset, the same prompt gives the reference logits. */
static void test_truncated_shard(void) {
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
    int rc = orig ? load(dir, 0, 0, NULL, &e, &err) : -1;
    if (!rc) rc = k3_session_new(e, 64, &s, &err);
    int V = e ? k3_engine_config(e)->vocab_size : 0;
    float *logits = malloc((size_t)V * sizeof *logits + 1);
    for (int i = 0; i < V; i++) logits[i] = NAN;
    int trunc = !rc ? truncate(shard, (off_t)cut) : -1, step = -1, untouched = 1;
    for (int i = 0; !trunc && i < 3 && (step = k3_session_step(s, prompt[i], logits, &err)) == 0;)
        i++;
    for (int i = 0; i < V && step; i++) untouched &= isnan(logits[i]);
    k3_err fail = err;
    int back = !trunc && ph_write(shard, orig, len) == 0, again = -1;
    if (back) { /* the same session, reset, through the whole prompt */
        k3_session_reset(s);
        float *got = malloc((size_t)N_TOK * V * sizeof *got);
        again = 0;
        for (int t = 0; t < N_TOK && !again; t++)
            again = k3_session_step(s, prompt[t], got + (size_t)t * V, &err);
        k3_session_free(s), s = NULL;
        k3_engine_free(e), e = NULL;
        float *ref = NULL;
        int rc2 = load(NANO, NO_FLAG, 0, NULL, &e, &err);
        if (!rc2) ref = run(e, 0, &err, &rc2);
        again = again || rc2 || memcmp(got, ref, (size_t)N_TOK * V * sizeof *got) != 0;
        free(got), free(ref);
    }
    k3_session_free(s);
    k3_engine_free(e);
    free(logits), free(orig), free(shard);
    ph_rmdir(dir);
    free(dir);
    CHECK(rc == 0 && trunc == 0, "setup failed: %s", err.msg);
    CHECK(step == K3_ERR_IO && K3_ERR_IO == 3, "status %d, want K3_ERR_IO: %s", step, fail.msg);
    CHECK(strstr(fail.msg, ".safetensors: truncated: spine layer 8"),
          "message does not name the shard and layer: %s", fail.msg);
    CHECK(untouched, "logits were written by a step that failed");
    CHECK(back && again == 0, "after restoring the shard and a reset, output differs: %s",
          err.msg);
}

/* --spine-gb on the command line: the plan is printed, output identical, bad values refused,
 * and --device cuda refused with a budget. */
static void test_cli_flag(void) {
    char *out0 = NULL, *out1 = NULL, *err1 = NULL, *err2 = NULL, *err3 = NULL;
    const char *args = "run " NANO " --prompt-ids 1792,5,77,1000 --max-new 6 --ids --spine bf16";
    char cmd[512];
    int rc0 = ph_k3(args, &out0, NULL);
    snprintf(cmd, sizeof cmd, "%s --spine-gb 0", args);
    int rc1 = ph_k3(cmd, &out1, &err1);
    int rc2 = ph_k3("run " NANO " --prompt x --spine-gb -1", NULL, &err2);
    snprintf(cmd, sizeof cmd, "%s --spine-gb 0 --device cuda", args);
    int rc3 = ph_k3(cmd, NULL, &err3);
    int same = out0 && out1 && !strcmp(out0, out1);
    int plan = err1 && strstr(err1, "spine budget 0.000 MB: resident no layers") &&
               strstr(err1, "streamed layers 0..8 + lm_head");
    int bad = err2 && strstr(err2, "--spine-gb='-1': expected a finite number in [0, ");
    int cuda = err3 && strstr(err3, ": --spine-gb is a budget of the CPU backend");
    char *e1 = err1 ? strdup(err1) : NULL;
    free(out0), free(out1), free(err1), free(err2), free(err3);
    CHECK(rc0 == 0 && rc1 == 0, "exit %d / %d", rc0, rc1);
    CHECK(same, "generated ids differ with --spine-gb 0");
    CHECK(plan, "no plan line: %s", e1 ? e1 : "");
    free(e1);
    CHECK(rc2 == K3_ERR_USAGE && bad, "--spine-gb -1: exit %d", rc2);
    CHECK(rc3 == K3_ERR_USAGE && cuda, "--device cuda with a budget: exit %d", rc3);
}

const k3_test k3_suite_spine[] = {
    {"identical_for_every_budget", test_identical_for_every_budget},
    {"plan_numbers", test_plan_numbers},
    {"rewind_streamed", test_rewind_streamed},
    {"threads_share_staging", test_threads_share_staging},
    {"int8_spine", test_int8_spine},
    {"truncated_shard", test_truncated_shard},
    {"cli_flag", test_cli_flag},
    {0},
};
