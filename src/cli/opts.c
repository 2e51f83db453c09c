/* opts.c — the option table and its parser (see opts.h). */
#include "opts.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../store/store.h"
#include "../util/parse.h"

static const k3_opt_choice devices[] = {{"cpu", 0}, {"cuda", 0}, {"auto", 0}, {NULL, 0}};
static const k3_opt_choice spines[] = {
    {"auto", K3_SPINE_AUTO}, {"bf16", K3_SPINE_BF16}, {"int8", K3_SPINE_INT8},
    {"lossless", K3_SPINE_LOSSLESS}, {NULL, 0}};
static const k3_opt_choice directs[] = {
    {"0", K3_IO_BUFFERED}, {"1", K3_IO_DIRECT}, {"auto", K3_IO_AUTO}, {NULL, 0}};
static const k3_opt_choice io_engines[] = {
    {"threads", K3_IO_ENGINE_THREADS}, {"uring", K3_IO_ENGINE_URING}, {NULL, 0}};
static const k3_opt_choice pipes[] = {
    {"0", K3_PIPE_OFF},   {"off", K3_PIPE_OFF},         {"1", K3_PIPE_ALL},
    {"on", K3_PIPE_ALL},  {"all", K3_PIPE_ALL},         {"prev", K3_PIPE_PREV},
    {"lookahead", K3_PIPE_LOOKAHEAD}, {"auto", K3_PIPE_AUTO}, {NULL, 0}};
static const k3_opt_choice policies[] = {{"s3fifo", 0}, {"lru", 0}, {NULL, 0}};
static const k3_opt_choice efforts[] = {{"low", 0}, {"high", 0}, {"max", 0}, {NULL, 0}};

static const k3_opt table[] = {
    /* ---- device */
    {.flag = "--device", .env = "K3_DEVICE", K3_OPT_ENG(device), .type = K3_OPT_WORD,
     .choices = devices, .def = "auto", .meta = "DEV", .group = K3_OG_DEVICE,
     .help = "cpu, cuda or auto: auto runs on the GPU when this k3 was built with CUDA\n"
             "(make CUDA=1) and a device answers, else on the CPU; the load line says\n"
             "which. cuda without either is an error (exit status 12)"},
    {.flag = "--gpu-gb", .env = "K3_GPU_GB", K3_OPT_ENG(gpu_gb), .type = K3_OPT_DOUBLE,
     .lo = 0, .hi = 1e6, .flags = K3_OPTF_LO_OPEN, .meta = "G", .group = K3_OG_DEVICE,
     .help = "device memory the GPU may use, in GB (default: the free memory less\n"
             "max(1 GiB, 5%)): spine layers stay resident as far as it allows, the rest\n"
             "stream per token from pinned host memory; the remainder caches experts"},
    /* ---- threads and kernels */
    {.flag = "--threads", K3_OPT_ENG(threads), .type = K3_OPT_INT, .lo = 1, .hi = 1024,
     .meta = "N", .group = K3_OG_THREADS,
     .help = "compute threads (default: OpenMP's own count when OMP_NUM_THREADS is\n"
             "set, else the physical cores)"},
    {.flag = "--kernels", .env = "K3_KERNELS", K3_OPT_ENG(kernels), .type = K3_OPT_STR,
     .meta = "PATH", .group = K3_OG_KERNELS,
     .help = "kernel path: scalar, avx2, avx512 or neon (default: the fastest this CPU\n"
             "runs; k3 version lists them)"},
    /* ---- spine */
    {.flag = "--spine", K3_OPT_ENG(spine), .type = K3_OPT_CHOICE, .choices = spines,
     .def = "auto", .meta = "MODE", .group = K3_OG_SPINE,
     .help = "auto: the lossless spine when k3 pack --lossless has built it, else the\n"
             "int8 spine when k3 pack has built it, else BF16; bf16: always the exact\n"
             "BF16 spine; lossless: the exact spine in 12 bits per weight (CPU; an error\n"
             "when it does not exist); int8: the packed int8 spine (NOT exact; an error\n"
             "when it does not exist)"},
    {.flag = "--approx", .env = "K3_APPROX", K3_OPT_ENG(approx), .type = K3_OPT_SWITCH,
     .value = 1, .lo = 0, .hi = 1, .group = K3_OG_SPINE,
     .help = "also quantize activations to int8 in the int8 spine's products (faster,\n"
             "NOT exact; needs the int8 spine)"},
    {.flag = "--pack-dir", K3_OPT_ENG(pack_dir), .type = K3_OPT_STR, .meta = "DIR",
     .group = K3_OG_BUDGET, .help = "folder of the packed spine (default MODEL_DIR; see k3 pack --out)"},
    {.flag = "--spine-gb", .env = "K3_SPINE_GB", K3_OPT_ENG(spine_gb), .type = K3_OPT_DOUBLE,
     .lo = 0, .hi = 1e6, .meta = "G", .group = K3_OG_BUDGET,
     .help = "RAM for the spine in GB (CPU only): lm_head and the first layers that\n"
             "fit stay resident, the rest are read from the shards half a layer at a\n"
             "time while the previous half computes (two staging buffers, counted in G;\n"
             "O_DIRECT unless --direct 0 or K3_DIRECT=0); 0 streams every layer. Output is identical\n"
             "for every G. Default: the memory plan (printed at load): everything in place\n"
             "when it fits in the RAM limit (cgroup included) beside the expert cache, else a\n"
             "budget of what the limit leaves"},
    {.flag = "--memory-gb", .env = "K3_MEMORY_GB", K3_OPT_ENG(memory_gb), .type = K3_OPT_DOUBLE,
     .lo = 0, .hi = 1e6, .flags = K3_OPTF_LO_OPEN, .meta = "G", .group = K3_OG_BUDGET,
     .help = "plan memory for a machine of G GB (all of it available, no cgroup) instead\n"
             "of this one's RAM, available memory and cgroup limits: k3 plan MODEL\n"
             "--memory-gb 64 shows what a 64 GB machine runs. Default: this machine"},
    /* ---- expert store */
    {.flag = "--expert-gb", .env = "K3_EXPERT_GB", K3_OPT_ENG(expert_gb), .type = K3_OPT_DOUBLE,
     .lo = 0, .hi = 1e6, .flags = K3_OPTF_LO_OPEN, .meta = "GB", .group = K3_OG_STORE,
     .help = "expert cache budget, GB (default: available memory minus spine, state\n"
             "and max(2 GB, 10%) headroom)"},
    {.flag = "--load-threads", .env = "K3_LOAD_THREADS", K3_OPT_ENG(load_threads),
     .type = K3_OPT_INT, .lo = 1, .hi = 256, .def = "4", .meta = "N", .group = K3_OG_STORE,
     .help = "expert reader threads (reads in flight with --io-engine uring)"},
    {.flag = "--io-engine", .env = "K3_IO_ENGINE", K3_OPT_ENG(io_engine), .type = K3_OPT_CHOICE,
     .choices = io_engines, .def = "threads", .meta = "threads|uring", .group = K3_OG_STORE,
     .help = "how experts are read: a pool of --load-threads threads (blocking preads),\n"
             "or one thread keeping --load-threads reads in flight on an io_uring (the\n"
             "pool where the kernel refuses a ring; the load line says which)"},
    {.flag = "--direct", .env = "K3_DIRECT", K3_OPT_ENG(direct), .type = K3_OPT_CHOICE,
     .choices = directs, .def = "auto", .meta = "0|1|auto", .group = K3_OG_STORE,
     .help = "O_DIRECT reads; auto: 1 when the experts do not fit in RAM (or the\n"
             "memory cgroup's limit), else buffered reads through the page cache"},
    {.flag = "--pipe", .env = "K3_PIPE", K3_OPT_ENG(pipe), .type = K3_OPT_CHOICE,
     .choices = pipes, .def = "auto", .meta = "MODE", .group = K3_OG_STORE,
     .help = "prefetch: 0/off, 1/on/all (both predictors), prev (previous token's\n"
             "choice), lookahead (next layer's router on this layer's input), auto (on\n"
             "when the cache holds 2 x top-k experts; a predictor pauses while fewer of\n"
             "its reads are used than half, or than the disk's share of time busy with\n"
             "the streamed spine)"},
    {.flag = "--cache-policy", .env = "K3_CACHE_POLICY", K3_OPT_ENG(cache_policy),
     .type = K3_OPT_WORD, .choices = policies, .def = "s3fifo", .meta = "P",
     .group = K3_OG_STORE, .help = "s3fifo or lru"},
    {.flag = "--dirs", .env = "K3_DIRS", K3_OPT_ENG(dirs), .type = K3_OPT_STR, .meta = "D1:D2",
     .group = K3_OG_STORE, .help = "extra folders holding shards, e.g. on other drives; under\n"
                                   "mpirun (make MPI=1) %r is the rank's number"},
    {.flag = "--mpi-timeout", .env = "K3_MPI_TIMEOUT", .field = "mpi_timeout",
     K3_OPT_COM(mpi_timeout), .type = K3_OPT_DOUBLE, .lo = 0, .hi = 1e6,
     .flags = K3_OPTF_LO_OPEN, .def = "60", .meta = "S", .group = K3_OG_STORE,
     .help = "under mpirun (make MPI=1): seconds a rank waits for another's experts\n"
             "before it ends the job naming the rank that did not answer"},
    {.flag = "--expert-disk-gb", .field = "expert_disk_gb", K3_OPT_COM(expert_disk_gb),
     .type = K3_OPT_DOUBLE, .lo = -1, .hi = 1e6, .def = "-1", .meta = "GB", .group = K3_OG_STORE,
     .help = "streaming install (k3 setup --stream): disk for the experts fetched on\n"
             "demand, the least recently used evicted first (0: keep none; -1: leave\n"
             "max(10%, min(20 GB, 25%)) of its file system free)"},
    {.flag = "--mmap-experts", .env = "K3_MMAP_EXPERTS", K3_OPT_ENG(experts_in_place),
     .type = K3_OPT_SWITCH, .value = 1, .lo = 0, .hi = 1, .group = K3_OG_STORE,
     .help = "no cache: experts used in place from the mapped shards (the reference\n"
             "path)"},
    {.flag = "--profile", .env = "K3_PROFILE", .field = "profile", K3_OPT_COM(profile),
     .type = K3_OPT_SWITCH, .value = 1, .lo = 0, .hi = 2, .group = K3_OG_TRACE,
     .help = "one line per pass on stderr: attention, router, expert wait, expert\n"
             "compute, head; K3_PROFILE=2 adds each MoE layer's expert wait / compute"},
    {.flag = "--router-trace", .field = "router_trace", K3_OPT_COM(router_trace),
     .type = K3_OPT_STR, .meta = "PATH", .group = K3_OG_TRACE,
     .help = "write one JSON line per (step, layer): chosen expert ids and weights in\n"
             "router order, flushed line by line"},
    /* ---- speed */
    {.flag = "--chunk", .field = "chunk", K3_OPT_GEN(chunk), .type = K3_OPT_INT, .lo = 1,
     .hi = K3_MAX_CHUNK, .meta = "N", .group = K3_OG_SPEED,
     .help = "prompt ids per batched prefill pass (default: as many as the memory plan's\n"
             "prompt passes hold, at least 32, in the server too; 1 = one by one). Each\n"
             "spine matrix and routed expert is read once per pass; bit-identical for\n"
             "every N"},
    {.flag = "--spec", .field = "spec", K3_OPT_GEN(spec), .type = K3_OPT_INT, .lo = 0,
     .hi = K3_MAX_SPEC, .def = "0", .meta = "N", .group = K3_OG_SPEED,
     .help = "speculative decoding: verify up to N drafted ids per pass (n-gram suffix\n"
             "matches from the prompt and output; 0 = off). Greedy output is token for\n"
             "token the same; sampling keeps each id's distribution but a seed gives\n"
             "another sequence. Turns itself off for a reply when it is slower"},
    /* ---- sampling */
    {.flag = "--temperature", .field = "temperature", K3_OPT_GEN(sampling.temperature),
     .type = K3_OPT_DOUBLE, .lo = 0, .hi = 1e6, .def = "0", .meta = "T",
     .group = K3_OG_SAMPLING,
     .help = "sample at temperature T (0 = greedy: the argmax, ties to the lowest id;\n"
             "reproducible)"},
    {.flag = "--top-k", .field = "top_k", K3_OPT_GEN(sampling.top_k), .type = K3_OPT_INT,
     .lo = 0, .hi = 1 << 30, .def = "0", .meta = "K", .group = K3_OG_SAMPLING,
     .help = "sample only among the K largest logits (0 = off)"},
    {.flag = "--top-p", .field = "top_p", K3_OPT_GEN(sampling.top_p), .type = K3_OPT_DOUBLE,
     .lo = 0, .hi = 1, .flags = K3_OPTF_LO_OPEN, .def = "1", .meta = "P",
     .group = K3_OG_SAMPLING,
     .help = "then only among the most likely ids whose probabilities first reach P\n"
             "(1 = off)"},
    {.flag = "--seed", .field = "seed", K3_OPT_GEN(sampling.seed), .type = K3_OPT_U64,
     .meta = "N", .group = K3_OG_SAMPLING,
     .help = "PRNG seed (xoshiro256** seeded by SplitMix64, src/engine/sampler.h); the\n"
             "same seed and prompt reproduce a run. Default: from the clock, printed in\n"
             "the summary. Unused (a warning) at temperature 0"},
    /* ---- chat */
    {.flag = "--system", .field = "system", K3_OPT_GEN(system), .type = K3_OPT_STR,
     .meta = "TEXT", .group = K3_OG_CHAT, .help = "a system message before the conversation"},
    {.flag = "--effort", .field = "effort", K3_OPT_GEN(effort), .type = K3_OPT_WORD,
     .choices = efforts, .def = "max", .meta = "E", .group = K3_OG_CHAT,
     .help = "thinking effort: low, high or max"},
    {.flag = "--think", .field = "think", K3_OPT_GEN(no_think), .type = K3_OPT_SWITCH,
     .value = 0, .group = K3_OG_CHAT, .help = "thinking on (the default)"},
    {.flag = "--no-think", .field = "no_think", K3_OPT_GEN(no_think), .type = K3_OPT_SWITCH,
     .value = 1, .group = K3_OG_CHAT, .help = "thinking off: the reply starts in the response channel"},
    {.flag = "--no-show-thinking", .field = "hide_thinking", K3_OPT_GEN(hide_thinking),
     .type = K3_OPT_SWITCH, .value = 1, .group = K3_OG_CHAT,
     .help = "do not print the thinking channel (it is still generated)"},
    /* ---- context and state */
    {.flag = "--ctx", .field = "ctx", K3_OPT_COM(ctx), .type = K3_OPT_INT, .lo = 1,
     .hi = 1 << 30, .meta = "N", .group = K3_OG_CTX,
     .help = "context capacity in tokens (default min(4096, model max))"},
    {.flag = "--load-state", .field = "load_state", K3_OPT_COM(load_state), .type = K3_OPT_STR,
     .meta = "FILE", .group = K3_OG_STATE,
     .help = "start from a state saved by --save-state (same model and spine mode only,\n"
             "checked by fingerprint): the prompt continues it"},
    {.flag = "--save-state", .field = "save_state", K3_OPT_COM(save_state), .type = K3_OPT_STR,
     .meta = "FILE", .group = K3_OG_STATE,
     .help = "at the end, save the state (every token fed; a chat reply is closed with\n"
             "<|end_of_msg|>) for a later --load-state. FILE's folder must be writable\n"
             "(checked before generating). Not written when interrupted"},
    /* ---- environment only */
    {.env = "HF_TOKEN", .field = "hf_token", K3_OPT_COM(hf_token), .type = K3_OPT_STR,
     .group = K3_OG_NET,
     .help = "Hugging Face token for the experts a streaming install (k3 setup --stream)\n"
             "still downloads"},
    /* ---- output */
    {.flag = "--quiet", .alias = "-q", .field = "quiet", K3_OPT_COM(quiet),
     .type = K3_OPT_SWITCH, .value = 1, .group = K3_OG_QUIET,
     .help = "no load line and no summary on stderr"},
};

#define N_TABLE (sizeof table / sizeof *table)

static const struct {
    unsigned group;
    const char *title;
} group_titles[] = {
    {K3_OG_DEVICE, "device"}, {K3_OG_THREADS, "threads"}, {K3_OG_KERNELS, "kernels"},
    {K3_OG_SPINE, "spine"}, {K3_OG_BUDGET, "spine folder and budget"},
    {K3_OG_STORE, "expert store (routed experts are read from the shards on demand)"},
    {K3_OG_TRACE, "tracing"}, {K3_OG_SPEED, "speed (exact)"}, {K3_OG_SAMPLING, "sampling"}, {K3_OG_CHAT, "chat"},
    {K3_OG_CTX, "context"}, {K3_OG_STATE, "state files"},
    {K3_OG_NET, "environment"}, {K3_OG_QUIET, "output"},
};

const k3_opt *k3_opts_table(size_t *n) {
    *n = N_TABLE;
    return table;
}

/* The rows cmd uses, command rows first; returns their count. */
static int collect(const k3_cli_command *cmd, const k3_opt **rows, int cap) {
    int n = 0;
    for (size_t i = 0; i < cmd->n_rows && n < cap; i++) rows[n++] = &cmd->rows[i];
    for (size_t i = 0; i < N_TABLE && n < cap; i++)
        if (table[i].group & cmd->groups) rows[n++] = &table[i];
    return n;
}

static void *field_ptr(const k3_opt *r, const k3_opt_targets *t) {
    char *base = r->target == K3_OT_ENGINE ? (char *)t->eo : r->target == K3_OT_GEN
                 ? (char *)t->co : r->target == K3_OT_COMMON ? (char *)t->cc : (char *)t->cmd;
    return base ? base + r->offset : NULL;
}

static void store_int(void *p, size_t size, long long v) {
    if (size == sizeof(bool)) *(bool *)p = v != 0;
    else *(int *)p = (int)v;
}

static const char *choice_list(const k3_opt *r, char *buf, size_t cap) {
    buf[0] = 0;
    for (const k3_opt_choice *c = r->choices; c->name; c++)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", c == r->choices ? "" : ", ",
                 c->name);
    return buf;
}

/* Parses text for row r into its field; name is what the message calls it (the flag or
 * the variable). */
static int set_value(const k3_opt *r, const char *text, const char *name,
                     const k3_opt_targets *t, k3_err *err) {
    void *p = field_ptr(r, t);
    if (!p) return k3_fail(err, K3_ERR_GENERIC, "%s: no target for this option", name);
    long long ll;
    double d;
    int rc = K3_OK;
    char list[160];
    switch (r->type) {
    case K3_OPT_SWITCH: /* only from a variable: an integer */
        if (!(rc = k3_parse_long(text, name, (long long)r->lo, (long long)r->hi, &ll, err)))
            store_int(p, r->size, ll);
        break;
    case K3_OPT_INT:
        if (!(rc = k3_parse_long(text, name, (long long)r->lo, (long long)r->hi, &ll, err)))
            *(int *)p = (int)ll;
        break;
    case K3_OPT_SIZE:
        if (!(rc = k3_parse_long(text, name, (long long)r->lo, (long long)r->hi, &ll, err)))
            *(size_t *)p = (size_t)ll;
        break;
    case K3_OPT_U64:
        rc = k3_parse_u64(text, name, (uint64_t *)p, err);
        break;
    case K3_OPT_DOUBLE:
        rc = k3_parse_double(text, name, r->lo, r->hi, &d, err);
        if ((r->flags & K3_OPTF_LO_OPEN) && (rc || !(d > r->lo))) /* the range says "(lo" */
            rc = k3_fail(err, K3_ERR_USAGE, "%s='%s': expected a finite number in (%g, %g]",
                         name, text, r->lo, r->hi);
        if (!rc) *(double *)p = d;
        break;
    case K3_OPT_STR:
        if ((r->flags & K3_OPTF_NONEMPTY) && !*text)
            return k3_fail(err, K3_ERR_USAGE, "%s is empty: give a value (or %s)", name,
                           name[0] == '-' ? "leave the flag out" : "unset the variable");
        *(const char **)p = text;
        break;
    case K3_OPT_WORD:
    case K3_OPT_CHOICE: {
        const k3_opt_choice *c = r->choices;
        while (c->name && strcmp(c->name, text)) c++;
        if (!c->name)
            return k3_fail(err, K3_ERR_USAGE, "%s='%s': expected one of %s", name, text,
                           choice_list(r, list, sizeof list));
        if (r->type == K3_OPT_WORD) *(const char **)p = c->name;
        else *(int *)p = c->value;
        break;
    }
    }
    return rc;
}

static int find(const k3_opt *const *rows, int n, const char *a, size_t len) {
    for (int i = 0; i < n; i++) {
        const k3_opt *r = rows[i];
        if (r->flag && strlen(r->flag) == len && !strncmp(r->flag, a, len)) return i;
        if (r->alias && strlen(r->alias) == len && !strncmp(r->alias, a, len)) return i;
    }
    return -1;
}

static const char *prog(const k3_cli_command *cmd) { return cmd->prog ? cmd->prog : "k3"; }

static int usage_error(const k3_cli_command *cmd, const char *fmt, const char *a) {
    fprintf(stderr, "%s %s: ", prog(cmd), cmd->name);
    fprintf(stderr, fmt, a);
    fprintf(stderr, " (see %s %s --help)\n", prog(cmd), cmd->name);
    return K3_ERR_USAGE;
}

static int fail_print(const k3_cli_command *cmd, const k3_err *err) {
    fprintf(stderr, "%s %s: %s\n", prog(cmd), cmd->name, err->msg);
    return K3_ERR_USAGE;
}

int k3_opts_usage_error(const k3_cli_command *cmd, const char *what) {
    return usage_error(cmd, "%s", what);
}

int k3_opts_parse(const k3_cli_command *cmd, int argc, char **argv, const k3_opt_targets *t,
                  k3_opts_parsed *out) {
    const k3_opt *rows[160];
    int n = collect(cmd, rows, 160);
    k3_err err = {0};
    *out = (k3_opts_parsed){0};
    if (t->eo) {
        *t->eo = k3_engine_opts_default();
        t->eo->spine = K3_SPINE_AUTO;
    }
    if (t->co) *t->co = (k3_cli_chat_opts)K3_CLI_CHAT_DEFAULTS;
    if (t->cc) *t->cc = (k3_cli_common){0};
    for (int i = 0; i < n; i++) /* defaults, through the same parser */
        if (rows[i]->def && set_value(rows[i], rows[i]->def, rows[i]->flag, t, &err))
            return fail_print(cmd, &err);
    bool options_done = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!options_done && cmd->end_of_options && !strcmp(a, "--")) {
            options_done = true;
            continue;
        }
        if (!options_done && (!strcmp(a, "-h") || !strcmp(a, "--help"))) {
            k3_opts_usage(cmd, stdout);
            return -1;
        }
        if (options_done || a[0] != '-' || !a[1]) {
            if (out->n_positional >= cmd->max_positional)
                return usage_error(cmd, "unexpected argument '%s'", a);
            out->positional[out->n_positional++] = a;
            continue;
        }
        const char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        int k = find(rows, n, a, len);
        if (k < 0) {
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(len < 100 ? len : 100), a);
            return usage_error(cmd, "unknown option '%s'", name);
        }
        const k3_opt *r = rows[k];
        if (out->given[k] == 1)
            return usage_error(cmd, "%s is given twice (give it once)", r->flag);
        out->given[k] = 1;
        if (r->type == K3_OPT_SWITCH) {
            if (eq) return usage_error(cmd, "%s takes no value", r->flag);
            store_int(field_ptr(r, t), r->size, r->value);
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) return usage_error(cmd, "%s needs a value", r->flag);
        if (set_value(r, v, r->flag, t, &err)) return fail_print(cmd, &err);
    }
    for (int i = 0; i < n; i++) { /* variables, for what no flag set */
        const char *v = rows[i]->env ? getenv(rows[i]->env) : NULL;
        if (out->given[i] || !v || (!*v && !(rows[i]->flags & K3_OPTF_NONEMPTY))) continue;
        if (set_value(rows[i], v, rows[i]->env, t, &err)) return fail_print(cmd, &err);
        out->given[i] = 2;
    }
    const char *omp = getenv("OMP_NUM_THREADS");
    if (t->eo && omp && *omp && !k3_opts_given(cmd, out, "--threads"))
        t->eo->threads = 0; /* OpenMP reads it itself (it may be a list) */
    if (t->co && k3_opts_given(cmd, out, "--seed")) {
        t->co->has_seed = true;
        if (!(t->co->sampling.temperature > 0))
            fprintf(stderr, "%s %s: warning: --seed is unused at temperature 0 (greedy "
                    "decoding); give --temperature T > 0 to sample\n", prog(cmd), cmd->name);
    }
    return K3_OK;
}

int k3_opts_given(const k3_cli_command *cmd, const k3_opts_parsed *p, const char *flag) {
    const k3_opt *rows[160];
    int n = collect(cmd, rows, 160);
    for (int i = 0; i < n; i++)
        if (rows[i]->flag && !strcmp(rows[i]->flag, flag)) return p->given[i];
    return 0;
}

/* ---- help ------------------------------------------------------------------------------- */

#define HELP_COL 23
#define HELP_WIDTH 80

/* Prints text from column HELP_COL, wrapped at spaces so no line passes HELP_WIDTH
 * (a '\n' in the text is read as a space: the table's line breaks are only hints). */
static void print_wrapped(const char *text, FILE *f) {
    size_t col = HELP_COL, width = HELP_WIDTH - HELP_COL;
    const char *p = text;
    bool first = true;
    while (*p) {
        while (*p == ' ' || *p == '\n') p++;
        size_t len = 0;
        while (p[len] && p[len] != ' ' && p[len] != '\n') len++;
        if (!len) break;
        if (!first && col + 1 + len > HELP_COL + width) {
            fprintf(f, "\n%*s", HELP_COL, "");
            col = HELP_COL;
            first = true;
        }
        fprintf(f, "%s%.*s", first ? "" : " ", (int)len, p);
        col += len + !first;
        first = false;
        p += len;
    }
    fprintf(f, "\n");
}

static void print_row(const k3_opt *r, FILE *f) {
    char left[96];
    if (r->flag)
        snprintf(left, sizeof left, "  %s%s%s%s%s", r->alias ? r->alias : "",
                 r->alias ? ", " : "", r->flag, r->meta ? " " : "", r->meta ? r->meta : "");
    else
        snprintf(left, sizeof left, "  %s", r->env);
    fprintf(f, "%s", left);
    if (strlen(left) >= HELP_COL - 1) fprintf(f, "\n%*s", HELP_COL, "");
    else fprintf(f, "%*s", (int)(HELP_COL - strlen(left)), "");
    char text[1200], tail[128] = "";
    if (r->def && r->type != K3_OPT_SWITCH) snprintf(tail, sizeof tail, "default %s", r->def);
    if (r->env && r->flag)
        snprintf(tail + strlen(tail), sizeof tail - strlen(tail), "%s%s", *tail ? "; " : "",
                 r->env);
    snprintf(text, sizeof text, "%s%s%s%s", r->help, *tail ? " (" : "", tail, *tail ? ")" : "");
    print_wrapped(text, f);
}

void k3_opts_usage(const k3_cli_command *cmd, FILE *f) {
    fprintf(f, "%s", cmd->usage);
    if (cmd->n_rows) fprintf(f, "\noptions:\n");
    for (size_t i = 0; i < cmd->n_rows; i++)
        if (!(cmd->rows[i].flags & K3_OPTF_HIDDEN)) print_row(&cmd->rows[i], f);
    for (size_t g = 0; g < sizeof group_titles / sizeof *group_titles; g++) {
        if (!(cmd->groups & group_titles[g].group)) continue;
        fprintf(f, "\n%s:\n", group_titles[g].title);
        for (size_t i = 0; i < N_TABLE; i++)
            if (table[i].group == group_titles[g].group) print_row(&table[i], f);
    }
    fprintf(f, "\n  -h, --help           this help\n");
    if (cmd->end_of_options) fprintf(f, "  --                   end of options (for an argument "
                                        "that starts with '-')\n");
    fprintf(f, "Flags take --flag VALUE or --flag=VALUE; a flag beats its variable.\n");
    if (cmd->epilog) fprintf(f, "\n%s", cmd->epilog);
}

/* ---- library errors: field names to flags --------------------------------------------------- */

const char *k3_opts_flag_of(const char *field) {
    for (size_t k = 0; field && *field && k < N_TABLE; k++)
        if (table[k].flag && table[k].field && !strcmp(table[k].field, field))
            return table[k].flag;
    return NULL;
}

const char *k3_opts_render(const k3_err *err, char *out, size_t cap) {
    size_t o = 0, from = 0, len = strlen(err->msg);
    while (o < cap) { /* the next recorded field after from, in text order */
        int next = -1;
        for (int k = 0; k < K3_ERR_FIELDS; k++) {
            size_t n = strlen(err->field[k].name);
            if (n && err->field[k].at >= from && err->field[k].at + n <= len &&
                !strncmp(err->msg + err->field[k].at, err->field[k].name, n) &&
                (next < 0 || err->field[k].at < err->field[next].at))
                next = k;
        }
        const char *flag = next < 0 ? NULL : k3_opts_flag_of(err->field[next].name);
        size_t at = next < 0 ? len : err->field[next].at;
        o += (size_t)snprintf(out + o, cap - o, "%.*s%s", (int)(at - from),
                              err->msg + from, flag ? flag : next < 0 ? "" : err->field[next].name);
        if (next < 0) break;
        from = at + strlen(err->field[next].name);
    }
    if (cap) out[o < cap ? o : cap - 1] = 0;
    return out;
}

void k3_opts_error(const char *cmd, const k3_err *err) {
    if (!err->msg[0]) return; /* already said (an MPI follower rank: rank 0 reports) */
    char text[sizeof err->msg + 256];
    fprintf(stderr, "k3 %s: %s\n", cmd, k3_opts_render(err, text, sizeof text));
}
