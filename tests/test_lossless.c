/* test_lossless.c — the lossless spine (issue 33): `k3 pack --lossless` writes matrices that
 * decode to the checkpoint's very BF16 bits in at most 80% of their bytes on k3-tiny-kjv;
 * `--spine lossless` gives logits bit-identical to `--spine bf16` on both fixtures, on every
 * kernel path this CPU runs (the path and the lossless matrices asserted on the bound model),
 * in place and at several --spine-gb budgets; auto prefers it; the planner counts its packed
 * sizes; a corrupt, truncated, renamed or foreign pack is refused with the reason.
 * (The kernels themselves: tests/test_simd.c, lossless_*.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/engine/k3.h"
#include "../src/engine/k3_lab.h"
#include "../src/engine/k3_test.h"
#include "../src/format/packed.h"
#include "../src/format/safetensors.h"
#include "../src/kernels/kernels.h"
#include "../src/model/model.h"
#include "pack_helpers.h"
#include "test.h"

/* `k3 pack MODEL --lossless --out DIR` once per model per process. */
static char *g_lx[2];
static void drop_lx(void) {
    for (int i = 0; i < 2; i++) ph_rmdir(g_lx[i]), free(g_lx[i]);
}
static const char *lx_pack(const char *model, char **out_text) {
    int slot = strcmp(model, NANO) != 0;
    if (g_lx[slot] && !out_text) return g_lx[slot];
    char *dir = ph_tmpdir(), args[1024], *err = NULL;
    if (!dir) return NULL;
    snprintf(args, sizeof args, "pack %s --lossless --out %s -q", model, dir);
    int st = ph_k3(args, out_text, &err);
    if (st != 0) {
        k3_test_fail(__FILE__, __LINE__, "k3 %s exited %d: %s", args, st, err ? err : "");
        free(err);
        ph_rmdir(dir);
        free(dir);
        return NULL;
    }
    free(err);
    if (g_lx[slot]) ph_rmdir(g_lx[slot]), free(g_lx[slot]);
    else if (!g_lx[!slot]) atexit(drop_lx);
    return g_lx[slot] = dir;
}

static char *lx_path(const char *dir) { return ph_join(dir, K3_PACK_LX_FILE); }

/* The pack's size line against the BF16 bytes of the matrices k3_pack_selects (counted here
 * from the checkpoint), and the payload bytes the layout rule gives for the table's entries. */
static void test_kjv_size_at_most_80_percent(void) {
    char *out = NULL;
    const char *dir = lx_pack(KJV_DIR, &out);
    if (!dir) return;
    unsigned long long n = 0;
    double pct = 0;
    const char *line = out ? strstr(out, "lossless spine: ") : NULL;
    int parsed = line && sscanf(line, "lossless spine: %llu bytes, %lf%% of BF16", &n, &pct) == 2;
    k3_checkpoint *ck = NULL;
    k3_err err = {0};
    uint64_t bf16 = 0, payload = 0;
    CHECK(k3_checkpoint_open(KJV_DIR, &ck, &err) == 0, "%s", err.msg);
    for (size_t i = 0; i < ck->n_tensors; i++)
        if (k3_pack_selects(&ck->tensors[i], K3_PACK_SCHEME_BF16LX)) bf16 += ck->tensors[i].nbytes;
    k3_checkpoint_close(ck);
    char *p = lx_path(dir);
    k3_pack *pk = NULL;
    int rc = k3_pack_open(p, &pk, &err);
    free(p);
    for (uint32_t i = 0; !rc && i < pk->n_tensors; i++) {
        const k3_pack_entry *e = &pk->entries[i];
        payload += (uint64_t)e->rows * ((uint64_t)(e->cols + 31) / 32 * 48) +
                   4 * ((uint64_t)e->rows + 1 + e->n_esc);
    }
    k3_pack_close(pk);
    CHECK(parsed, "no size line in: %s", out ? out : "(nothing)");
    free(out);
    CHECK(rc == 0, "%s", err.msg);
    CHECK(n == payload, "reported %llu bytes, the table's entries make %llu", n,
          (unsigned long long)payload);
    CHECK(fabs(pct - 100.0 * (double)n / (double)bf16) < 0.01, "%.2f%% of %llu BF16 bytes", pct,
          (unsigned long long)bf16);
    CHECK(pct <= 80.0, "lossless spine is %.2f%% of BF16 (issue 33: at most 80%%)", pct);
}

/* Every row of every packed matrix decodes to the checkpoint's bytes, and each escape count
 * is the number of weights whose high byte the table lacks (counted here). */
static void test_decodes_to_checkpoint_bits(void) {
    const char *models[] = {NANO, KJV_DIR};
    for (int mi = 0; mi < 2 && !k3_test_stopped(); mi++) {
        const char *dir = lx_pack(models[mi], NULL);
        if (!dir) return;
        k3_checkpoint *ck = NULL;
        k3_pack *pk = NULL;
        k3_err err = {0};
        char *p = lx_path(dir);
        int rc = k3_checkpoint_open(models[mi], &ck, &err);
        if (!rc) rc = k3_pack_open(p, &pk, &err);
        free(p);
        for (uint32_t i = 0; !rc && i < pk->n_tensors && !k3_test_stopped(); i++) {
            const k3_pack_entry *e = &pk->entries[i];
            const k3_tensor *t = k3_checkpoint_find(ck, e->name);
            CHECK(t && t->dtype == K3_DT_BF16, "%s", e->name);
            const uint16_t *w = t->data;
            k3_mat m = {.data = pk->map + e->q_offset, .dtype = K3_DT_BF16LX, .rows = e->rows,
                        .cols = e->cols, .esc = (const uint32_t *)(pk->map + e->scale_offset),
                        .n_esc = e->n_esc};
            memcpy(m.xtab, e->xtab, 16);
            uint16_t *back = malloc((size_t)e->cols * 2);
            uint64_t escapes = 0;
            for (int64_t k = 0; k < e->rows * e->cols; k++)
                escapes += memchr(e->xtab, w[k] >> 8, 15) == NULL;
            int64_t bad = -1;
            for (int64_t r = 0; r < e->rows && bad < 0; r++) {
                k3_lx_decode_row(&m, r, back);
                if (memcmp(back, w + r * e->cols, (size_t)e->cols * 2)) bad = r;
            }
            free(back);
            CHECK(bad < 0, "%s: row %lld does not decode to the checkpoint's bits", e->name,
                  (long long)bad);
            CHECK(escapes == e->n_esc, "%s: %u escapes, %llu weights outside the table", e->name,
                  e->n_esc, (unsigned long long)escapes);
        }
        k3_pack_close(pk);
        k3_checkpoint_close(ck);
        CHECK(rc == 0, "%s", err.msg);
    }
}

#define N_TOK 12
static const int32_t prompt[N_TOK] = {1792, 5, 77, 1000, 9, 300, 1500, 2, 64, 65, 400, 12};

static int load(const char *model, int spine, const char *pack_dir, const char *kernels,
                double gb, k3_engine **e, k3_err *err) {
    k3_engine_opts o = k3_engine_opts_default();
    o.threads = 2;
    o.spine = spine;
    o.pack_dir = pack_dir;
    o.kernels = kernels;
    static const k3_lab_opts in_place = {.spine_in_place = 1, .gpu_max_layers = -1};
    if (gb < 0) o.lab = &in_place; /* in place whatever the plan */
    else o.spine_gb = gb;
    return k3_engine_load(model, &o, e, err);
}

/* Logits of every position: token by token, then again in one rewindable pass of all ids
 * (the batched products). */
static float *logits(k3_engine *e, k3_err *err, int *rc) {
    int V = k3_engine_config(e)->vocab_size;
    float *out = calloc((size_t)2 * N_TOK * V, sizeof *out);
    k3_session *s = NULL;
    *rc = k3_session_new(e, 64, &s, err);
    for (int t = 0; t < N_TOK && !*rc; t++)
        *rc = k3_session_step(s, prompt[t], out + (size_t)t * V, err);
    if (!*rc) k3_session_reset(s);
    if (!*rc)
        *rc = k3_session_forward(s, prompt, N_TOK, out + (size_t)N_TOK * V, K3_FWD_ALL_LOGITS,
                                 err);
    k3_session_free(s);
    return out;
}

/* The lm_head bytes + every layer's bytes of the bound model's BF16 spine, for budgets. */
static void check_model(const char *model) {
    const char *dir = lx_pack(model, NULL);
    if (!dir) return;
    const k3_kernels *paths[8];
    int np = k3_kernels_available(paths, 8);
    k3_engine *e = NULL;
    k3_err err = {0};
    for (int p = 0; p < np && !k3_test_stopped(); p++) {
        const char *kn = k3_kernels_name(paths[p]);
        int rc = load(model, K3_SPINE_BF16, NULL, kn, -1, &e, &err);
        CHECK(rc == 0, "%s", err.msg);
        int V = k3_engine_config(e)->vocab_size;
        uint64_t spine = k3_engine_model(e)->spine_bytes;
        float *ref = logits(e, &err, &rc);
        k3_engine_free(e);
        CHECK(rc == 0, "%s", err.msg);
        /* in place; everything streamed; about half resident */
        const double budgets[] = {-1, 0, 0.55 * (double)spine / 1e9};
        for (int b = 0; b < 3 && !k3_test_stopped(); b++) {
            rc = load(model, K3_SPINE_LOSSLESS, dir, kn, budgets[b], &e, &err);
            CHECK(rc == 0, "%s budget %g: %s", kn, budgets[b], err.msg);
            const k3_model *m = k3_engine_model(e);
            k3_spine_stats st;
            k3_engine_spine_stats(e, &st);
            int on_path = !strcmp(k3_kernels_name(m->kr), kn);
            int lx = m->lm_head.dtype == K3_DT_BF16LX && m->layers[0].post_attention_layernorm.dtype == K3_DT_BF16;
            float *got = logits(e, &err, &rc);
            int same = !rc && memcmp(got, ref, (size_t)2 * N_TOK * V * sizeof *got) == 0;
            k3_engine_free(e);
            free(got);
            CHECK(rc == 0, "%s budget %g: %s", kn, budgets[b], err.msg);
            CHECK(on_path && lx, "%s: the model must run the lossless matrices on that path", kn);
            CHECK(b == 0 || st.streamed_layers > 0, "%s budget %g streams nothing", kn, budgets[b]);
            CHECK(same, "%s, %s budget %g: logits differ from --spine bf16", model, kn,
                  budgets[b]);
        }
        free(ref);
    }
}

static void test_logits_identical_nano(void) { check_model(NANO); }
static void test_logits_identical_kjv(void) { check_model(KJV_DIR); }

/* The planner's spine bytes: BF16's less, per packed matrix, its BF16 bytes and plus its
 * packed parts (layout rule recomputed here). */
static void test_planner_counts_packed_bytes(void) {
    const char *dir = lx_pack(NANO, NULL);
    if (!dir) return;
    k3_engine *e = NULL;
    k3_err err = {0};
    CHECK(load(NANO, K3_SPINE_BF16, NULL, NULL, -1, &e, &err) == 0, "%s", err.msg);
    uint64_t bf16 = k3_engine_model(e)->spine_bytes;
    k3_engine_free(e);
    CHECK(load(NANO, K3_SPINE_LOSSLESS, dir, NULL, -1, &e, &err) == 0, "%s", err.msg);
    uint64_t lx = k3_engine_model(e)->spine_bytes;
    int n_packed = k3_engine_model(e)->n_packed;
    k3_engine_free(e);
    char *p = lx_path(dir);
    k3_pack *pk = NULL;
    int rc = k3_pack_open(p, &pk, &err);
    free(p);
    CHECK(rc == 0, "%s", err.msg);
    uint64_t want = bf16;
    for (uint32_t i = 0; i < pk->n_tensors; i++) {
        const k3_pack_entry *x = &pk->entries[i];
        want = want - 2 * (uint64_t)x->rows * (uint64_t)x->cols +
               (uint64_t)x->rows * ((uint64_t)(x->cols + 31) / 32 * 48) +
               4 * ((uint64_t)x->rows + 1 + x->n_esc);
    }
    int n = (int)pk->n_tensors;
    k3_pack_close(pk);
    CHECK(n_packed == n, "%d matrices bound to the pack, %d in it", n_packed, n);
    CHECK(lx == want, "spine bytes %llu, want %llu (BF16 %llu)", (unsigned long long)lx,
          (unsigned long long)want, (unsigned long long)bf16);
}

static int spine_line(const char *dir, int mode, int approx, char *line, size_t cap, int *int8) {
    k3_engine *e = NULL;
    k3_err err = {0};
    k3_engine_opts o = k3_engine_opts_default();
    o.spine = mode;
    o.pack_dir = dir;
    o.approx = approx;
    int rc = k3_engine_load(NANO, &o, &e, &err);
    char buf[K3_DESCRIBE_CAP];
    if (!rc) k3_engine_describe(e, K3_DESCRIBE_SPINE, buf, sizeof buf);
    snprintf(line, cap, "%s", rc ? err.msg : buf);
    *int8 = rc ? -1 : k3_engine_spine_int8(e);
    k3_engine_free(e);
    return rc;
}

/* auto: lossless over int8 over BF16; --approx (int8 activations) keeps auto on int8; an
 * explicit lossless without the file says how to build it; lossless with --approx refused. */
static void test_auto_prefers_lossless(void) {
    const char *lx = lx_pack(NANO, NULL), *i8 = lx ? ph_nano_pack() : NULL;
    char *both = i8 ? ph_tmpdir() : NULL;
    if (!both) return;
    char *a = lx_path(lx), *b = lx_path(both), *c = ph_join(i8, K3_PACK_FILE),
         *d = ph_join(both, K3_PACK_FILE);
    size_t na, nc;
    uint8_t *ba = ph_read(a, &na), *bc = ph_read(c, &nc);
    int w = ba && bc && !ph_write(b, ba, na) && !ph_write(d, bc, nc);
    free(ba), free(bc), free(a), free(b), free(c), free(d);
    char l1[8192], l2[8192], l3[8192], l4[8192], l5[8192];
    int i1, i2, i3, i4, i5;
    int r1 = spine_line(both, K3_SPINE_AUTO, 0, l1, sizeof l1, &i1);
    int r2 = spine_line(both, K3_SPINE_AUTO, 1, l2, sizeof l2, &i2);
    int r3 = spine_line(i8, K3_SPINE_LOSSLESS, 0, l3, sizeof l3, &i3);
    int r4 = spine_line(both, K3_SPINE_LOSSLESS, 1, l4, sizeof l4, &i4);
    int r5 = spine_line(lx, K3_SPINE_AUTO, 0, l5, sizeof l5, &i5);
    ph_rmdir(both);
    free(both);
    CHECK(w, "copying the packs failed");
    CHECK(r1 == 0 && i1 == 0 && strstr(l1, "spine: lossless") && strstr(l1, "exact"),
          "auto with both packs: %s", l1);
    CHECK(r2 == 0 && i2 == 1 && strstr(l2, "int8"), "auto --approx: %s", l2);
    CHECK(r3 == K3_ERR_IO && strstr(l3, "--lossless"), "lossless without its file: %d %s", r3, l3);
    CHECK(r4 == K3_ERR_USAGE, "lossless with approx: %d %s", r4, l4);
    CHECK(r5 == 0 && i5 == 0 && strstr(l5, "lossless"), "auto, lossless pack only: %s", l5);
}

/* A copy of the nano lossless pack with a change, loaded with --spine lossless. */
static void expect_refused(const uint8_t *b, size_t len, const char *model, const char *needle) {
    char *d = ph_tmpdir();
    if (!d) return;
    char *p = lx_path(d), msg[8192];
    int w = ph_write(p, b, len), i8;
    free(p);
    k3_engine *e = NULL;
    k3_err err = {0};
    k3_engine_opts o = k3_engine_opts_default();
    o.spine = K3_SPINE_LOSSLESS;
    o.pack_dir = d;
    int rc = w ? -1 : k3_engine_load(model, &o, &e, &err);
    snprintf(msg, sizeof msg, "%s", rc ? err.msg : "loaded");
    k3_engine_free(e);
    (void)i8;
    ph_rmdir(d);
    free(d);
    CHECK(w == 0, "write failed");
    CHECK(rc == K3_ERR_PACK, "load returned %d, want K3_ERR_PACK: %s", rc, msg);
    CHECK(strstr(msg, needle), "message lacks \"%s\": %s", needle, msg);
}

static void test_corrupt_foreign_refused(void) {
    const char *dir = lx_pack(NANO, NULL), *i8 = dir ? ph_nano_pack() : NULL;
    if (!i8) return;
    char *p = lx_path(dir), *q = ph_join(i8, K3_PACK_FILE);
    size_t len, len8;
    uint8_t *b = ph_read(p, &len), *b8 = ph_read(q, &len8);
    free(p), free(q);
    CHECK(b && b8, "no packs");
    b[130] ^= 1; /* inside the tensor table */
    expect_refused(b, len, NANO, "table checksum");
    b[130] ^= 1;
    b[13] ^= 3; /* the scheme field: the header checksum no longer matches */
    expect_refused(b, len, NANO, "header checksum");
    b[13] ^= 3;
    expect_refused(b, len - 100, NANO, "truncated");
    expect_refused(b, 64, NANO, "truncated");
    expect_refused(b8, len8, NANO, "holds the int8 spine"); /* an int8 pack renamed */
    expect_refused(b, len, KJV_DIR, "another model");
    free(b), free(b8);
}

/* A flipped payload byte is not seen at load (payloads are hashed by --verify alone), runs
 * without reading outside the matrix, and --verify names the tensor. */
static void test_verify_finds_payload_damage(void) {
    const char *dir = lx_pack(NANO, NULL);
    char *d = dir ? ph_tmpdir() : NULL;
    if (!d) return;
    char *src = lx_path(dir), *p = lx_path(d), name[K3_PACK_NAME_BYTES] = "";
    size_t len;
    uint8_t *b = ph_read(src, &len);
    k3_pack *pk = NULL;
    k3_err err = {0};
    int rc = b ? k3_pack_open(src, &pk, &err) : -1;
    if (!rc) {
        const k3_pack_entry *e = &pk->entries[pk->n_tensors - 1];
        snprintf(name, sizeof name, "%s", e->name);
        uint32_t *idx = (uint32_t *)(b + e->scale_offset);
        idx[1] = 0xfffffff0u; /* row 0's escapes run past the list */
        b[e->q_offset + 5] ^= 0x11; /* two codes of row 0 */
    }
    k3_pack_close(pk);
    int w = b ? ph_write(p, b, len) : -1;
    free(b), free(src), free(p);
    char args[1024], *errs = NULL;
    snprintf(args, sizeof args, "pack " NANO " --lossless --out %s --verify", d);
    int st = ph_k3(args, NULL, &errs);
    int named = errs && strstr(errs, name) && strstr(errs, "checksum mismatch");
    free(errs);
    k3_engine *e = NULL;
    int lr = load(NANO, K3_SPINE_LOSSLESS, d, NULL, -1, &e, &err), sr = -1;
    float *y = lr ? NULL : logits(e, &err, &sr);
    free(y);
    k3_engine_free(e);
    ph_rmdir(d);
    free(d);
    CHECK(rc == 0 && w == 0, "setup: %s", err.msg);
    CHECK(st == K3_ERR_PACK && named, "--verify exited %d; must name %s", st, name);
    CHECK(lr == 0, "load: %s", err.msg);
}

/* Packing twice gives the same bytes; a pack stopped after 5 tensors (--limit, exit 130)
 * leaves only the .partial file and, resumed, ends with the uninterrupted pack's bytes. */
static void test_deterministic_and_resumable(void) {
    const char *ref = lx_pack(NANO, NULL);
    char *d = ref ? ph_tmpdir() : NULL;
    if (!d) return;
    char args[1024], *pr = lx_path(ref), *pd = lx_path(d), partial[4200];
    snprintf(partial, sizeof partial, "%s.partial", pd);
    snprintf(args, sizeof args, "pack " NANO " --lossless --out %s -q --limit 5", d);
    int st1 = ph_k3(args, NULL, NULL);
    int only_partial = access(partial, F_OK) == 0 && access(pd, F_OK) != 0;
    snprintf(args, sizeof args, "pack " NANO " --lossless --out %s -q", d);
    int st2 = ph_k3(args, NULL, NULL);
    size_t na = 0, nb = 0;
    uint8_t *a = ph_read(pr, &na), *b = ph_read(pd, &nb);
    int same = a && b && na == nb && memcmp(a, b, na) == 0;
    free(a), free(b), free(pr), free(pd);
    ph_rmdir(d);
    free(d);
    CHECK(st1 == 130 && only_partial, "--limit 5 exited %d; the .partial file alone: %d", st1,
          only_partial);
    CHECK(st2 == 0, "resuming exited %d", st2);
    CHECK(same, "the resumed lossless pack differs from an uninterrupted one");
}

const k3_test k3_suite_lossless[] = {
    {"deterministic_and_resumable", test_deterministic_and_resumable},
    {"kjv_size_at_most_80_percent", test_kjv_size_at_most_80_percent},
    {"decodes_to_checkpoint_bits", test_decodes_to_checkpoint_bits},
    {"logits_identical_nano", test_logits_identical_nano},
    {"logits_identical_kjv", test_logits_identical_kjv},
    {"planner_counts_packed_bytes", test_planner_counts_packed_bytes},
    {"auto_prefers_lossless", test_auto_prefers_lossless},
    {"corrupt_foreign_refused", test_corrupt_foreign_refused},
    {"verify_finds_payload_damage", test_verify_finds_payload_damage},
    {NULL, NULL},
};
