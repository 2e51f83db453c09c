/* cmd_bench.c — `k3-lab bench io`: expert-read throughput and per-layer latency of the store's
 * reader against fio on the same files (random expert-sized direct reads, same thread count),
 * and optionally a short decode with K3_PIPE off and on (how much read time compute hides). */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../cli/model_dir.h"
#include "../cli/opts.h"
#include "../engine/k3.h"
#include "../engine/k3_lab.h"
#include "../format/config.h"
#include "../format/safetensors.h"
#include "../store/store.h"
#include "lab.h"
#include "../util/clock.h"

typedef struct bench_opts {
    const char *dir;
    int threads, direct, decode, fio, io_engine;
    double seconds;
} bench_opts;

static const k3_opt_choice io_engines[] = {
    {"threads", K3_IO_ENGINE_THREADS}, {"uring", K3_IO_ENGINE_URING}, {NULL, 0}};

#define BENCH(f) K3_OPT_CMD(bench_opts, f), .field = #f
static const k3_opt bench_rows[] = {
    {.flag = "--threads", BENCH(threads), .type = K3_OPT_INT, .lo = 1, .hi = 256, .meta = "N",
     .help = "reader threads and fio jobs (default 4)"},
    {.flag = "--seconds", BENCH(seconds), .type = K3_OPT_DOUBLE, .lo = 0, .hi = 1e6,
     .flags = K3_OPTF_LO_OPEN, .meta = "S", .help = "duration of each measurement (default 10)"},
    {.flag = "--direct", BENCH(direct), .type = K3_OPT_INT, .lo = 0, .hi = 1, .meta = "0|1",
     .help = "O_DIRECT for the store (default 1; fio always uses direct I/O)"},
    {.flag = "--io-engine", BENCH(io_engine), .type = K3_OPT_CHOICE, .choices = io_engines,
     .meta = "E", .help = "the store's reader: threads (default: a pool of --threads preads)\n"
                          "or uring (io_uring, --threads reads in flight on one thread)"},
    {.flag = "--decode", BENCH(decode), .type = K3_OPT_INT, .lo = 0, .hi = 1 << 20, .meta = "N",
     .help = "also decode N tokens with K3_PIPE off and on, cache of 2 x top-k"},
    {.flag = "--no-fio", BENCH(fio), .type = K3_OPT_SWITCH, .value = 0, .help = "skip fio"},
};

static const k3_cli_command bench_cmd = {
    .name = "bench io", .prog = "k3-lab",
    .usage =
        "usage: k3-lab bench io [MODEL_DIR] [options]\n"
        "\n"
        "Reads random experts through the expert store's reader pool (a layer's top-k misses\n"
        "submitted together, as in decode) and reports GB/s and per-layer latency, then runs fio\n"
        "on the same shard files with the same thread count (random reads of one expert's size,\n"
        "direct I/O) as the device's limit. Use a checkpoint that does not fit in the page\n"
        "cache, or direct I/O (the default), so neither side reads from memory.\n",
    .rows = bench_rows, .n_rows = sizeof bench_rows / sizeof *bench_rows,
    .max_positional = 1,
};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

typedef struct io_result {
    double gbps, layer_p50_ms, layer_p99_ms, read_ms;
    long layers;
    int engine; /* the store's enum k3_io_engine in use (after any fallback) */
} io_result;

/* Random (layer, top-k distinct experts) requests through the store for `seconds`. */
/* pipelined: the next request's experts are prefetched while this one's are consumed (as
 * K3_PIPE does in decode), so the readers never wait for the consumer between layers. */
static void random_request(uint64_t *rng, const int *moe, int n_moe, int E, int K, int *layer,
                           int *ids) {
    *layer = moe[rng_next(rng) % (uint64_t)n_moe];
    for (int j = 0; j < K; j++) { /* distinct ids */
        int e, dup;
        do {
            e = (int)(rng_next(rng) % (uint64_t)E);
            dup = 0;
            for (int i = 0; i < j; i++) dup |= ids[i] == e;
        } while (dup);
        ids[j] = e;
    }
}

static int store_io(const bench_opts *o, const k3_config *c, const k3_checkpoint *ck,
                    int pipelined, uint64_t *expert_bytes, io_result *res, k3_err *err) {
    k3_store_settings set = {.expert_slots = (pipelined ? 3 : 2) * c->num_experts_per_token,
                             .load_threads = o->threads, .direct = o->direct ? 1 : -1,
                             .pipe = pipelined ? K3_PIPE_PREV : K3_PIPE_OFF,
                             .policy = K3_POLICY_LRU, .io_engine = o->io_engine};
    k3_mem_plan plan = {0};
    k3_store *st = NULL;
    k3_store_client *cl = NULL;
    int rc = k3_store_open(ck, c, &set, &plan, &st, err);
    if (!rc) rc = k3_store_client_new(st, &cl, err);
    int K = c->num_experts_per_token, E = c->num_experts, *ids = malloc(2 * (size_t)K * sizeof *ids);
    size_t cap = 1 << 16;
    double *lat = malloc(cap * sizeof *lat), t0 = k3_now_s(), t1 = t0;
    uint64_t rng = 12345;
    long n = 0;
    int moe[K3_MAX_LAYERS], n_moe = 0;
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (c->layer_is_moe[l]) moe[n_moe++] = l;
    if (!rc && (!ids || !lat || !n_moe)) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    int layer = 0, next_layer = 0;
    if (!rc) random_request(&rng, moe, n_moe, E, K, &next_layer, ids + K);
    while (!rc && (t1 = k3_now_s()) - t0 < o->seconds && (size_t)n < cap) {
        layer = next_layer;
        memcpy(ids, ids + K, (size_t)K * sizeof *ids);
        random_request(&rng, moe, n_moe, E, K, &next_layer, ids + K);
        double a = k3_now_s();
        k3_store_begin(cl, layer, ids, K);
        if (pipelined) k3_store_prefetch(cl, next_layer, ids + K, K, K3_PIPE_PREV);
        for (int j = 0; j < K && !rc; j++) {
            int at;
            k3_expert ex;
            rc = k3_store_next(cl, &at, &ex, err);
            if (!rc) k3_store_done(cl, at);
        }
        k3_store_end(cl);
        lat[n++] = k3_now_s() - a;
    }
    if (!rc) {
        k3_store_stats s;
        k3_store_get_stats(st, &s);
        qsort(lat, (size_t)n, sizeof *lat, cmp_double);
        *res = (io_result){.gbps = (double)s.bytes_read / (t1 - t0) / 1e9,
                           .layer_p50_ms = n ? 1e3 * lat[n / 2] : 0,
                           .layer_p99_ms = n ? 1e3 * lat[(size_t)(n * 0.99)] : 0,
                           .read_ms = s.reads ? 1e3 * s.read_s / (double)s.reads : 0,
                           .layers = n, .engine = k3_store_io_engine(st)};
        *expert_bytes = k3_store_slot_bytes(st) ? k3_store_expert_bytes(st) : 0;
    }
    free(ids);
    free(lat);
    k3_store_client_free(cl);
    k3_store_close(st);
    return rc;
}

/* fio on the shards, random reads of bs bytes, direct, `threads` jobs. */
static int run_fio(const bench_opts *o, const k3_checkpoint *ck, uint64_t bs, io_result *res) {
    size_t n = 256;
    for (int i = 0; i < ck->n_shards; i++) n += strlen(ck->shards[i].path) + 1;
    char *cmd = malloc(n + 512), *files = malloc(n);
    if (!cmd || !files) return -1;
    files[0] = 0;
    for (int i = 0; i < ck->n_shards; i++) { /* fio separates files with ':' */
        if (ck->shards[i].file_bytes < bs) continue;
        strcat(files, files[0] ? ":" : "");
        strcat(files, ck->shards[i].path);
    }
    snprintf(cmd, n + 512, "fio --name=k3 --filename=%s --readonly --rw=randread --bs=%llu "
             "--direct=1 --ioengine=psync --numjobs=%d --time_based --runtime=%d "
             "--group_reporting --output-format=json 2>/dev/null", files,
             (unsigned long long)bs, o->threads, (int)(o->seconds + 0.5));
    FILE *p = popen(cmd, "r");
    free(cmd);
    free(files);
    if (!p) return -1;
    size_t cap = 1 << 20, len = 0;
    char *out = malloc(cap);
    while (out && len + 1 < cap && !feof(p)) len += fread(out + len, 1, cap - 1 - len, p);
    int status = pclose(p);
    if (!out) return -1;
    out[len] = 0;
    cJSON *root = cJSON_Parse(strchr(out, '{') ? strchr(out, '{') : out);
    free(out);
    const cJSON *job = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "jobs"), 0);
    const cJSON *rd = cJSON_GetObjectItem(job, "read");
    const cJSON *bw = cJSON_GetObjectItem(rd, "bw_bytes");
    const cJSON *lat = cJSON_GetObjectItem(cJSON_GetObjectItem(rd, "clat_ns"), "mean");
    int ok = status == 0 && cJSON_IsNumber(bw);
    if (ok) *res = (io_result){.gbps = bw->valuedouble / 1e9,
                               .read_ms = cJSON_IsNumber(lat) ? lat->valuedouble / 1e6 : 0};
    cJSON_Delete(root);
    return ok ? 0 : -1;
}

/* Greedy decode of o->decode tokens with `slots` cache slots; the session's stats. */
static int decode(const bench_opts *o, int slots, int pipe, k3_run_stats *st, k3_err *err) {
    k3_engine_opts eo = k3_engine_opts_default();
    k3_lab_opts lab = k3_lab_opts_default();
    lab.expert_slots = slots; /* exactly 2 x top-k (the lab's control, k3_lab.h) */
    eo.lab = &lab, eo.load_threads = o->threads, eo.pipe = pipe;
    eo.direct = o->direct ? K3_IO_DIRECT : K3_IO_BUFFERED;
    eo.io_engine = o->io_engine;
    k3_engine *e = NULL;
    k3_session *s = NULL;
    int rc = k3_engine_load(o->dir, &eo, &e, err);
    if (!rc) rc = k3_session_new(e, 64, &s, err);
    int vocab = e ? k3_engine_config(e)->vocab_size : 0;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    int32_t tok = 1;
    for (int t = 0; !rc && logits && t < o->decode; t++) {
        rc = k3_session_step(s, tok, logits, err);
        for (int i = 1; i < vocab; i++) /* greedy, as decode would */
            if (logits[i] > logits[tok] || tok == i - 1) tok = logits[i] > logits[tok] ? i : tok;
    }
    if (!rc) k3_session_stats(s, st);
    free(logits);
    k3_session_free(s);
    k3_engine_free(e);
    return rc;
}

static int parse_args(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){.threads = 4, .direct = 1, .seconds = 10, .fio = 1};
    /* main.c sends kernels, decode, prefill, spec and mla elsewhere: anything else but io is a
     * usage error naming every benchmark */
    bool help = argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"));
    if (argc < 2 || strcmp(argv[1], "io")) {
        fprintf(help ? stdout : stderr, "%s%s%s%s: kernels, decode, prefill, spec, mla or io "
                "(k3-lab bench NAME --help)\n", help ? "usage: k3-lab bench NAME; NAME is one of"
                : "k3-lab bench: ", help || argc < 2 ? "" : "unknown benchmark '",
                help || argc < 2 ? "" : argv[1], help ? "" : argc < 2 ? "name a benchmark"
                : "'; name one of");
        return help ? -1 : K3_ERR_USAGE;
    }
    k3_opts_parsed parsed;
    k3_opt_targets t = {.cmd = o};
    int rc = k3_opts_parse(&bench_cmd, argc - 1, argv + 1, &t, &parsed);
    if (rc) return rc;
    /* a folder, a name (OWNER/NAME[@REV]) or the bundled model: the one door (model_dir.h) */
    return k3_model_arg("k3-lab bench io", parsed.n_positional ? parsed.positional[0] : NULL,
                        &o->dir);
}

static void print_decode(const char *what, const k3_run_stats *st, double fio_gbps) {
    double gb = (double)st->bytes_read / 1e9, bound = fio_gbps > 0 ? gb / fio_gbps : 0;
    printf("| %s | %ld | %.3f | %.2f | %.2f | %.2f | %.2f | %.1f%% / %.1f%% |\n", what,
           st->time.tokens, gb, st->time.total_s, st->time.moe_s - st->time.eload_s,
           st->time.eload_s, bound, 100 * (st->recall_prev < 0 ? 0 : st->recall_prev),
           100 * (st->recall_lookahead < 0 ? 0 : st->recall_lookahead));
}

int k3_cmd_bench(int argc, char **argv) {
    bench_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    k3_config c;
    k3_checkpoint *ck = NULL;
    k3_err err = {0};
    io_result mine = {0}, fio = {0};
    uint64_t all_experts = 0;
    rc = k3_config_load(o.dir, &c, &err);
    if (!rc) rc = k3_checkpoint_open(o.dir, &ck, &err);
    io_result piped = {0}, fio2 = {0};
    uint64_t span = (uint64_t)c.moe_intermediate_size * c.routed_expert_hidden_size * 3 / 2 +
                    (uint64_t)c.moe_intermediate_size * c.routed_expert_hidden_size * 3 / 32;
    uint64_t bs = (span + 4095) / 4096 * 4096;
    /* fio before and after the store, so that a drive shared with other work shows its drift */
    int have_fio = !rc && o.fio && run_fio(&o, ck, bs, &fio) == 0;
    if (!rc) rc = store_io(&o, &c, ck, 0, &all_experts, &mine, &err);
    if (!rc) rc = store_io(&o, &c, ck, 1, &all_experts, &piped, &err);
    if (have_fio && run_fio(&o, ck, bs, &fio2) == 0) {
        printf("k3-lab bench io: fio before %.3f GB/s, after %.3f GB/s; the table uses the mean\n",
               fio.gbps, fio2.gbps);
        fio.gbps = (fio.gbps + fio2.gbps) / 2;
        fio.read_ms = (fio.read_ms + fio2.read_ms) / 2;
    }
    if (!rc) {
        printf("k3-lab bench io: %s: experts of %llu bytes (%.1f GB in all), top-%d, %d %s, "
               "%.0f s each, store reads %s\n\n", o.dir, (unsigned long long)span,
               (double)all_experts / 1e9, c.num_experts_per_token, o.threads,
               mine.engine == K3_IO_ENGINE_URING ? "reads in flight on io_uring" : "threads",
               o.seconds, o.direct ? "O_DIRECT" : "buffered");
        printf("| reader | GB/s | mean read (ms) | layer of top-%d p50 (ms) | p99 (ms) | vs fio |\n"
               "|---|---:|---:|---:|---:|---:|\n", c.num_experts_per_token);
        const io_result *rows[2] = {&mine, &piped};
        const char *names[2] = {"k3 store, one layer at a time", "k3 store, next layer prefetched"};
        for (int i = 0; i < 2; i++) {
            char vs[32] = "";
            if (have_fio) snprintf(vs, sizeof vs, "%.1f%%", 100 * rows[i]->gbps / fio.gbps);
            printf("| %s | %.3f | %.1f | %.1f | %.1f | %s |\n", names[i], rows[i]->gbps,
                   rows[i]->read_ms, rows[i]->layer_p50_ms, rows[i]->layer_p99_ms, vs);
        }
        if (have_fio)
            printf("| fio randread bs=%llu direct psync x%d | %.3f | %.1f | | | 100%% |\n",
                   (unsigned long long)bs, o.threads, fio.gbps, fio.read_ms);
        else if (o.fio)
            printf("| fio | (not run: is fio installed? scripts/install-deps.sh) | | | | |\n");
    }
    if (!rc && o.decode) {
        k3_run_stats off, on;
        int slots = 2 * c.num_experts_per_token;
        rc = decode(&o, slots, K3_PIPE_OFF, &off, &err);
        if (!rc) rc = decode(&o, slots, K3_PIPE_ALL, &on, &err);
        if (!rc) {
            printf("\ndecode, %d-slot cache (2 x top-k), %s:\n\n| K3_PIPE | tokens | GB read | "
                   "total (s) | expert compute+other moe (s) | eload (s) | GB / fio GB/s (s) | "
                   "recall prev / lookahead |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
                   slots, o.direct ? "O_DIRECT" : "buffered");
            print_decode("0", &off, have_fio ? fio.gbps : 0);
            print_decode("1", &on, have_fio ? fio.gbps : 0);
            printf("\nread time hidden behind compute with K3_PIPE=1: %.1f%% (eload %.2f s -> "
                   "%.2f s)\n", off.time.eload_s > 0 ? 100 * (1 - on.time.eload_s /
                   off.time.eload_s) : 0, off.time.eload_s, on.time.eload_s);
        }
    }
    k3_checkpoint_close(ck);
    if (rc) fprintf(stderr, "k3-lab bench io: %s\n", err.msg);
    return rc;
}
