/* test_plancli.c — `k3 plan` (issue 16): the memory plan without reading a weight. Its figures
 * are checked against what this file works out on its own from the shards' safetensors
 * headers and config.json (spine bytes, expert slots, the KV cache per position), its line
 * against the one `k3 run` prints with the same flags, a snapshot whose shards are only their
 * headers (holes for data) plans the same, and the engine refuses a session larger than the
 * context its plan counted. */
#include "test.h"
#include "cli_run.h"
#include "../src/engine/k3.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NANO "tests/fixtures/k3-nano"
#define KJV "tests/fixtures/k3-tiny-kjv"

/* The bytes of the row `name` of k3 plan's output ("  NAME   123 B  ..."), or -1. */
static long long row_bytes(const char *out, const char *name) {
    char key[64];
    snprintf(key, sizeof key, "\n  %s ", name);
    const char *p = out ? strstr(out, key) : NULL;
    if (!p) return -1;
    p += strlen(key);
    char *end;
    long long v = strtoll(p, &end, 10);
    return end != p && !strncmp(end, " B", 2) ? v : -1;
}

/* The line of text that starts with prefix (without its newline) into buf, or "". */
static const char *line_of(const char *text, const char *prefix, char *buf, size_t cap) {
    buf[0] = 0;
    const char *p = text ? strstr(text, prefix) : NULL;
    if (p) snprintf(buf, cap, "%.*s", (int)strcspn(p, "\n"), p);
    return buf;
}

/* Reads a shard's JSON header (malloc'd) and its length. */
static char *shard_header(const char *path, uint64_t *hn) {
    FILE *f = fopen(path, "rb");
    unsigned char len8[8];
    char *json = NULL;
    if (f && fread(len8, 1, 8, f) == 8) {
        *hn = 0;
        for (int i = 7; i >= 0; i--) *hn = *hn << 8 | len8[i];
        json = *hn < (64u << 20) ? malloc(*hn + 1) : NULL;
        if (json && fread(json, 1, *hn, f) != *hn) free(json), json = NULL;
        if (json) json[*hn] = 0;
    }
    if (f) fclose(f);
    return json;
}

/* From the shards' headers alone: every language-model tensor that is not a routed expert
 * (the spine) and the six tensors of one routed expert (layer 1, expert 0). */
static int header_sums(const char *dir, uint64_t *spine, uint64_t *expert) {
    *spine = *expert = 0;
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strstr(de->d_name, ".safetensors") || strstr(de->d_name, ".json")) continue;
        char path[1024];
        uint64_t hn;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        char *json = shard_header(path, &hn);
        cJSON *h = json ? cJSON_Parse(json) : NULL;
        free(json);
        for (cJSON *t = h ? h->child : NULL; t; t = t->next) {
            cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
            if (!cJSON_IsArray(off) || !strncmp(t->string, "__", 2)) continue;
            uint64_t n = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble -
                         (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
            if (strncmp(t->string, "language_model.", 15)) continue; /* vision tower */
            if (!strstr(t->string, ".experts.")) *spine += n;
            else if (strstr(t->string, ".layers.1.") && strstr(t->string, ".experts.0."))
                *expert += n;
        }
        cJSON_Delete(h);
    }
    closedir(d);
    return 0;
}

static int cfg_int(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valueint : -1;
}

/* The plan of a 64 GB machine for k3-nano, part by part, against the headers and the config. */
static void test_figures_from_the_headers(void) {
    k3t_cli a = {0}, b = {0};
    k3t_cli_run("plan " NANO " --memory-gb 64 --ctx 64", &a);
    k3t_cli_run("plan " NANO " --memory-gb 64 --ctx 1064", &b);
    char *json = NULL;
    FILE *f = fopen(NANO "/config.json", "r");
    if (f) {
        json = calloc(1, 1 << 16);
        if (json && fread(json, 1, (1 << 16) - 1, f) == 0) free(json), json = NULL;
        fclose(f);
    }
    cJSON *root = json ? cJSON_Parse(json) : NULL;
    free(json);
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    const cJSON *lac = cJSON_GetObjectItemCaseSensitive(tc, "linear_attn_config");
    int H = cfg_int(tc, "num_attention_heads"), nope = cfg_int(tc, "qk_nope_head_dim");
    int lora = cfg_int(tc, "kv_lora_rank"), rope = cfg_int(tc, "qk_rope_head_dim");
    int n_mla = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(lac, "full_attn_layers"));
    int moe = cfg_int(tc, "num_hidden_layers") - cfg_int(tc, "first_k_dense_replace");
    int experts = cfg_int(tc, "num_experts");
    /* the pass-start copy: each KDA layer's S [heads][d][d] and conv windows [3][P][conv-1] */
    int n_kda = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(lac, "kda_layers"));
    long long kh = cfg_int(lac, "num_heads"), kd = cfg_int(lac, "head_dim");
    long long win = cfg_int(lac, "short_conv_kernel_size") - 1;
    long long undo = 4ll * n_kda * (kh * kd * kd + 3 * kh * kd * win);
    cJSON_Delete(root);
    uint64_t spine = 0, expert = 0;
    int sums = header_sums(NANO, &spine, &expert);
    long long lim = row_bytes(a.out, "limit"), os = row_bytes(a.out, "OS reserve");
    long long sp = row_bytes(a.out, "spine"), cache = row_bytes(a.out, "expert cache");
    long long s64 = row_bytes(a.out, "sessions"), s1064 = row_bytes(b.out, "sessions");
    long long base = row_bytes(a.out, "base"), total = row_bytes(a.out, "total");
    long long prompt = row_bytes(a.out, "prompt passes"), copies = row_bytes(a.out, "pass copies");
    int st = a.status, st2 = b.status;
    char err[512];
    snprintf(err, sizeof err, "%s", a.err ? a.err : "");
    k3t_cli_free(&a), k3t_cli_free(&b);
    CHECK(st == 0 && st2 == 0, "exit %d / %d: %s", st, st2, err);
    CHECK(sums == 0 && spine > 0 && expert > 0 && H > 0 && nope > 0 && n_mla > 0 && moe > 0);
    CHECK(lim == 64000000000ll, "%lld", lim);
    CHECK(os == 6400000000ll, "10%% of 64 GB: %lld", os); /* max(10%, min(2 GB, 1/8)) */
    CHECK(sp == (long long)spine, "the spine in place is every non-expert tensor: %lld vs %llu",
          sp, (unsigned long long)spine);
    /* every expert fits: one slot each, its six tensors rounded up to 4096 plus one 4096 */
    uint64_t slot = (expert + 4095) / 4096 * 4096 + 4096;
    CHECK(cache == (long long)((uint64_t)moe * (uint64_t)experts * slot), "%lld vs %d x %d x %llu",
          cache, moe, experts, (unsigned long long)slot);
    /* 1000 more positions: each holds every MLA layer's latent row, the normed c_kv
     * (kv_lora_rank) and the shared k_pe (rope) in f32; nothing per head grows with them */
    long long per_pos = 4ll * n_mla * (lora + rope);
    CHECK(s1064 - s64 == 1000 * per_pos, "%lld - %lld vs 1000 x %lld", s1064, s64, per_pos);
    CHECK(copies == undo && undo > 0, "pass copies %lld vs %lld", copies, undo);
    CHECK(prompt >= 0 && total == base + sp + cache + s64 + copies + prompt, "%lld", total);
}

/* `k3 plan -q` prints the line `k3 run` prints for the same flags and machine. */
static void test_line_is_the_runs(void) {
    static const char *const flags[] = {
        "--memory-gb 0.023",                /* the planner streams layers 1..5 itself */
        "--memory-gb 0.1 --spine-gb 0.002",  /* a budget given: everything streams */
        "--memory-gb 64",                    /* everything in place */
        "--memory-gb 0.1 --expert-gb 0.0005"};
    /* a sanitizer build's RSS (the plan's base) alone passes the first limit */
    int asan = strstr(k3t_bin(), "asan") != NULL;
    for (size_t i = asan; i < sizeof flags / sizeof *flags; i++) {
        char args[512], pl[1024], rl[1024], ps[1024], rs[1024];
        k3t_cli p = {0}, r = {0};
        snprintf(args, sizeof args, "plan " KJV " %s --ctx 11", flags[i]);
        k3t_cli_run(args, &p);
        snprintf(args, sizeof args, "run " KJV " %s --prompt-ids 1,2,3 --max-new 8 --ids",
                 flags[i]);
        k3t_cli_run(args, &r);
        line_of(p.out, "memory planner:", pl, sizeof pl);
        line_of(r.err, "memory planner:", rl, sizeof rl);
        line_of(p.out, "spine budget ", ps, sizeof ps);
        line_of(r.err, "spine budget ", rs, sizeof rs);
        int st = p.status, rst = r.status;
        k3t_cli_free(&p), k3t_cli_free(&r);
        CHECK(st == 0 && rst == 0, "%s: exit %d / %d", flags[i], st, rst);
        /* the same line to the byte: nothing in the plan is measured at run time */
        CHECK(pl[0] && !strcmp(pl, rl), "%s:\n plan: %s\n run:  %s", flags[i], pl, rl);
        /* the spine's layers: the same split; a given budget is also the same bytes */
        char *pr = strstr(ps, "resident "), *rr = strstr(rs, "resident ");
        CHECK(!!pr == !!rr, "%s: %s | %s", flags[i], ps, rs);
        if (!pr) continue;
        if (strstr(flags[i], "--spine-gb")) {
            CHECK(!strncmp(ps, rs, strcspn(ps, "(")), "%s:\n %s\n %s", flags[i], ps, rs);
            char *pp = strstr(ps, "); staging"), *rp = strstr(rs, "); staging");
            CHECK(pp && rp && !strcmp(pp, rp), "%s:\n %s\n %s", flags[i], ps, rs);
        }
        char *pst = strstr(ps, "streamed "), *rst2 = strstr(rs, "streamed ");
        CHECK(pst && rst2 && !strncmp(pst, rst2, strcspn(pst, "(")), "%s:\n %s\n %s", flags[i],
              ps, rs);
        CHECK(!strncmp(pr, rr, strcspn(pr, "(")), "%s:\n %s\n %s", flags[i], ps, rs);
    }
}

static void test_below_the_minimum_is_refused(void) {
    k3t_cli r = {0};
    k3t_cli_run("plan " NANO " --memory-gb 0.001", &r);
    int ok = r.err && strstr(r.err, "cannot run within 0.001 GB (memory_gb given)") &&
             strstr(r.err, "it needs at least");
    int st = r.status;
    char err[1024];
    snprintf(err, sizeof err, "%s", r.err ? r.err : "");
    k3t_cli_free(&r);
    CHECK(st == 2 && ok, "exit %d: %s", st, err);
}

/* D18 (issue 32): the minimum `k3 plan` prints is the same every run and exact: k3 run on a
 * machine of that many bytes runs, one page less is refused (and the refusal names the same
 * minimum). */
static void test_minimum_is_exact_and_stable(void) {
    k3t_cli a = {0}, b = {0}, at = {0}, below = {0};
    k3t_cli_run("plan " KJV " --ctx 11", &a);
    k3t_cli_run("plan " KJV " --ctx 11", &b);
    long long min = row_bytes(a.out, "minimum limit"), min2 = row_bytes(b.out, "minimum limit");
    char args[512], bytes[64];
    snprintf(args, sizeof args, "run " KJV " --ctx 11 --memory-gb %.9f --prompt-ids 1,2,3 "
             "--max-new 8 --ids", (double)min / 1e9);
    k3t_cli_run(args, &at);
    snprintf(args, sizeof args, "run " KJV " --ctx 11 --memory-gb %.9f --prompt-ids 1,2,3 "
             "--max-new 8 --ids", (double)(min - 4096) / 1e9);
    k3t_cli_run(args, &below);
    snprintf(bytes, sizeof bytes, "(%lld bytes:", min);
    int st_at = at.status, st_below = below.status;
    int says = below.err && strstr(below.err, "cannot run within") && strstr(below.err, bytes);
    char err[1024];
    snprintf(err, sizeof err, "%s | %s", at.err ? at.err : "", below.err ? below.err : "");
    k3t_cli_free(&a), k3t_cli_free(&b), k3t_cli_free(&at), k3t_cli_free(&below);
    CHECK(min > 0 && min == min2, "the minimum moved between runs: %lld, %lld", min, min2);
    CHECK((min & 4095) == 0, "%lld: not whole pages", min);
    CHECK(st_at == 0, "at the printed minimum %lld: exit %d: %s", min, st_at, err);
    CHECK(st_below == 2 && says, "one page below %lld: exit %d: %s", min, st_below, err);
}

/* A copy of k3-nano whose shards hold their headers and a hole for the data: k3 plan reads
 * nothing else, so its plan is the original's. */
static void test_headers_only_snapshot(void) {
    char *dir = k3t_nano_copy();
    CHECK(dir);
    DIR *d = opendir(dir);
    struct dirent *de;
    int bad = !d;
    while (d && (de = readdir(d))) {
        if (!strstr(de->d_name, ".safetensors") || strstr(de->d_name, ".json")) continue;
        char path[1024];
        uint64_t hn = 0;
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        char *json = shard_header(path, &hn);
        int fd = json ? open(path, O_WRONLY) : -1;
        /* cut to the header, then the original length again: the data are now a hole */
        if (fd < 0 || stat(path, &st) || ftruncate(fd, (off_t)(8 + hn)) ||
            ftruncate(fd, st.st_size))
            bad = 1;
        if (fd >= 0) close(fd);
        free(json);
    }
    if (d) closedir(d);
    char args[1024], a[1024], b[1024];
    k3t_cli o = {0}, s = {0};
    k3t_cli_run("plan " NANO " --memory-gb 0.2 --spine-gb 0.0005 --ctx 100", &o);
    snprintf(args, sizeof args, "plan '%s' --memory-gb 0.2 --spine-gb 0.0005 --ctx 100", dir);
    k3t_cli_run(args, &s);
    const char *rows[] = {"memory planner:", "  spine ", "  expert cache ", "  sessions "};
    int same = o.status == 0 && s.status == 0;
    for (size_t i = 0; same && i < sizeof rows / sizeof *rows; i++) {
        line_of(o.out, rows[i], a, sizeof a);
        line_of(s.out, rows[i], b, sizeof b);
        same = a[0] && !strcmp(a, b);
    }
    k3t_cli_free(&o), k3t_cli_free(&s);
    k3t_rm_dir(dir);
    CHECK(!bad, "cannot make the headers-only copy");
    CHECK(same, "the plans differ:\n %s\n %s", a, b);
}

/* The plan counts each session at the context given at load; a larger session is refused
 * (its KV cache could pass the limit), a smaller one is fine. */
static void test_session_within_the_planned_context(void) {
    k3_engine_opts o = k3_engine_opts_default();
    o.threads = 1;
    o.ctx = 16;
    k3_engine *e = NULL;
    k3_session *s = NULL;
    k3_err err = {0};
    CHECK(k3_engine_load(NANO, &o, &e, &err) == K3_OK, "%s", err.msg);
    int small = k3_session_new(e, 16, &s, &err);
    k3_session_free(s);
    s = NULL;
    int big = k3_session_new(e, 17, &s, &err);
    k3_session_free(s);
    s = NULL;
    char msg[sizeof err.msg];
    snprintf(msg, sizeof msg, "%s", err.msg);
    int dflt = k3_session_new(e, 0, &s, &err); /* the default 4096 > 16 */
    k3_session_free(s);
    k3_engine_free(e);
    CHECK(small == K3_OK);
    CHECK(big == K3_ERR_USAGE && strstr(msg, "17 positions") && strstr(msg, "(16, ctx"), "%s",
          msg);
    CHECK(dflt == K3_ERR_USAGE);
}

const k3_test k3_suite_plancli[] = {
    {"figures_from_the_headers", test_figures_from_the_headers},
    {"line_is_the_runs", test_line_is_the_runs},
    {"below_the_minimum_is_refused", test_below_the_minimum_is_refused},
    {"headers_only_snapshot", test_headers_only_snapshot},
    {"minimum_is_exact_and_stable", test_minimum_is_exact_and_stable},
    {"session_within_the_planned_context", test_session_within_the_planned_context},
    {0}};
