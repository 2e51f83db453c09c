/* engine.c — k3_engine (loaded model) and k3_session (one timeline), see k3.h. */
#include "k3.h"

#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../store/store.h"
#include "../kernels/kernels.h"
#include "../format/packed.h"
#include "../format/safetensors.h"
#include "../util/clock.h"
#include "../util/fileio.h"
#include "../util/sigbus.h"
#include "plan.h"
#include "../model/model.h"
#include "../model/spine.h"
#include "../model/state_file.h"
#include "../tok/tokenizer.h"
#include "backend.h"
#include "k3_test.h"
#include "k3_lab.h"
#include "engine_internal.h"

/* The figures `k3 pack` stored beside the pack, if they belong to this very file. */
static void quality_note(k3_engine *e, const char *dir, char *out, size_t cap) {
    char path[PATH_MAX];
    k3_pack_quality q;
    k3_err ignored;
    k3_path_join(path, sizeof path, dir, K3_PACK_QUALITY_FILE);
    const k3_pack_figures *g = e->approx ? &q.approx : &q.int8;
    if (k3_pack_quality_read(path, &q, &ignored) || q.pack_checksum != e->pack->header_checksum ||
        (e->approx && !q.has_approx))
        snprintf(out, cap, "no quality figures stored for this pack%s (measure with k3 quality)",
                 e->approx ? " and int8 activations" : "");
    else
        snprintf(out, cap, "k3 pack measured on %d predictions: mean KL %.3g nats, top-1 "
                 "agreement %.2f%%, max |dlogit| %.3g, perplexity %.6g (exact %.6g)",
                 q.predictions, g->mean_kl, 100 * g->top1, g->max_abs_dlogit, g->ppl,
                 q.ppl_exact);
}

/* Opens the lossless pack for mode lossless, or auto when it exists (not on the GPU, which
 * multiplies BF16 or int8 only); the spine line says so. 1: opened, 0: not wanted. */
static int open_lossless(k3_engine *e, const char *model_dir, const char *dir,
                         const k3_engine_opts *o, k3_err *err) {
    char path[PATH_MAX];
    k3_path_join(path, sizeof path, dir, K3_PACK_LX_FILE);
    bool cuda = o->device && !strcmp(o->device, "cuda");
    if (o->spine == K3_SPINE_LOSSLESS && cuda)
        return -k3_fail(err, K3_ERR_USAGE, "spine lossless is decoded by the CPU kernels; with "
                        "device cuda use spine bf16 or auto");
    if (o->spine != K3_SPINE_LOSSLESS &&
        (o->spine != K3_SPINE_AUTO || o->approx || cuda || access(path, F_OK) != 0))
        return 0;
    if (access(path, F_OK) != 0)
        return -k3_fail(err, K3_ERR_IO, "%s: no lossless spine here; build it with k3 pack %s "
                        "--lossless%s%s", path, model_dir, o->pack_dir ? " --out " : "",
                        o->pack_dir ? o->pack_dir : "");
    int rc = k3_pack_open(path, &e->pack, err);
    if (!rc) rc = k3_pack_check_scheme(e->pack, K3_PACK_SCHEME_BF16LX, err);
    if (!rc) rc = k3_pack_check_model(e->pack, e->ck, err);
    if (rc) return -rc;
    snprintf(e->spine_line, sizeof e->spine_line, "spine: lossless from %s (exact: the BF16 "
             "bits, decoded in the kernels)", path);
    return 1;
}

/* Opens the packed spine when opts ask for it (docs/PACKED-SPINE.md) and writes the spine
 * line; must run after the checkpoint is open and before the model is bound. */
static int open_spine(k3_engine *e, const char *model_dir, const k3_engine_opts *o,
                      k3_err *err) {
    int mode = o->spine;
    const char *dir = o->pack_dir ? o->pack_dir : model_dir;
    char path[PATH_MAX], note[512];
    if (o->approx && mode == K3_SPINE_LOSSLESS)
        return k3_fail(err, K3_ERR_USAGE, "approx multiplies the int8 spine with int8 "
                       "activations; it cannot be used with spine lossless");
    int lx = open_lossless(e, model_dir, dir, o, err);
    if (lx) return lx < 0 ? -lx : K3_OK;
    k3_path_join(path, sizeof path, dir, K3_PACK_FILE);
    int present = access(path, F_OK) == 0;
    e->approx = o->approx != 0;
    if (e->approx && (mode == K3_SPINE_BF16 || !present))
        return k3_fail_field(err, K3_ERR_USAGE, "approx", " multiplies the int8 spine with int8 "
                       "activations; %s", mode == K3_SPINE_BF16 ? "it cannot be used with "
                       "spine bf16" : "build the int8 spine first with k3 pack");
    if (mode == K3_SPINE_BF16 || (mode == K3_SPINE_AUTO && !present)) {
        snprintf(e->spine_line, sizeof e->spine_line, "spine: BF16 from the checkpoint (exact)");
        return K3_OK;
    }
    if (!present)
        return k3_fail(err, K3_ERR_IO, "%s: no packed spine here; build it with k3 pack %s%s%s",
                       path, model_dir, o->pack_dir ? " --out " : "",
                       o->pack_dir ? o->pack_dir : "");
    int rc = k3_pack_open(path, &e->pack, err);
    if (!rc) rc = k3_pack_check_scheme(e->pack, K3_PACK_SCHEME_INT8_ROW, err);
    if (!rc) rc = k3_pack_check_model(e->pack, e->ck, err);
    if (rc) return rc;
    quality_note(e, dir, note, sizeof note);
    snprintf(e->spine_line, sizeof e->spine_line, "spine: int8 from %s%s -- NOT exact; %s",
             path, e->approx ? " with int8 activations" : "", note);
    return K3_OK;
}

/* ---- expert store (issue 3) ---------------------------------------------------------- */

/* The lab's controls (k3_lab.h), or their defaults when the caller gave none. */
static const k3_lab_opts *lab_of(const k3_engine_opts *o) {
    static const k3_lab_opts none = {.gpu_max_layers = -1};
    return o->lab ? o->lab : &none;
}

static int store_settings(const k3_engine_opts *o, k3_store_settings *ss, k3_err *err) {
    *ss = (k3_store_settings){o->expert_gb, lab_of(o)->expert_slots, o->load_threads, o->direct,
                              o->pipe, K3_POLICY_DEFAULT, o->experts_in_place, o->dirs,
                              o->io_engine};
    if (o->cache_policy && (ss->policy = k3_cache_policy_parse(o->cache_policy)) < 0)
        return k3_fail_field(err, K3_ERR_USAGE, "cache_policy", " '%s': expected lru or s3fifo",
                       o->cache_policy);
    return k3_store_settings_check(ss, err);
}

static int open_store(k3_engine *e, const k3_store_settings *ss, k3_err *err) {
    k3_mem_plan plan = {.base_bytes = e->mplan.base_bytes,
                        .spine_bytes = k3_spine_ram_bytes(e->model.spine, &e->model),
                        /* the sessions and the prompt passes' scratch (plan.h) */
                        .state_bytes = e->mplan.sessions_bytes + e->mplan.undo_bytes +
                                       e->mplan.prefill_bytes,
                        .limit_bytes = e->mplan.limit_bytes,
                        .headroom_bytes = e->mplan.headroom_bytes};
    int rc = k3_store_open(e->ck, &e->cfg, ss, &plan, &e->store, err);
    if (rc) return rc;
    e->model.store = e->store;
    e->plan = plan;
    e->model.expert_bytes = k3_store_expert_bytes(e->store);
    k3_store_describe(e->store, e->store_line, sizeof e->store_line);
    return K3_OK;
}

struct k3_store *k3_engine_store(const k3_engine *e) { return e->store; }
struct k3_model *k3_engine_model(k3_engine *e) { return &e->model; }

void k3_session_stats(const k3_session *s, k3_run_stats *out) {
    k3_store_stats ss;
    k3_store_get_stats(s->e->store, &ss);
    const k3_mem_plan *p = &s->e->plan;
    *out = (k3_run_stats){
        .expert_requests = ss.requests,
        .hits = ss.hits, .prefetch_hits = ss.prefetch_hits, .prefetch_late = ss.prefetch_late,
        .misses = ss.misses, .prefetch_reads = ss.prefetch_reads,
        .prefetch_wasted = ss.prefetch_wasted,
        .prefetch_skipped = ss.prefetch_skipped, .spine_busy = ss.spine_busy, .reads = ss.reads, .bytes_read = ss.bytes_read,
        .read_s = ss.read_s, .read_busy_s = ss.read_busy_s, .cache_bytes = p->cache_bytes,
        .peak_cache_bytes = ss.peak_slots_used * k3_store_slot_bytes(s->e->store),
        .plan_bytes = p->base_bytes + p->spine_bytes + p->cache_bytes + p->state_bytes};
    k3_state_times(s->state, &out->time, &out->last);
    k3_state_layer_times(s->state, &out->layer_eload_s, &out->layer_expert_s);
    out->n_layers = s->e->cfg.num_hidden_layers;
    for (int src = K3_PIPE_PREV; src <= K3_PIPE_LOOKAHEAD; src++) {
        double r = ss.recall_total[src] ? (double)ss.recall_hits[src] / ss.recall_total[src] : -1;
        if (src == K3_PIPE_PREV) out->recall_prev = r;
        else out->recall_lookahead = r;
    }
    k3_spine_stats sp;
    k3_spine_get_stats(s->e->model.spine, &sp);
    out->spine_streams = sp.staging_bytes > 0;
    out->spine_bytes_read = sp.bytes_read;
    out->spine_read_s = sp.read_s, out->spine_wait_s = sp.wait_s;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) out->peak_rss_bytes = (uint64_t)ru.ru_maxrss * 1024;
}

/* ---- expert source (a streaming install, wired in by the caller) ---------------------- */

static int attach_source(k3_engine *e, const k3_engine_opts *o, k3_err *err) {
    if (!o->expert_source) return K3_OK;
    return k3_store_set_source(e->store, o->expert_source, err);
}

/* ---- resident spine budget (src/model/spine.h) ---------------------------------------- */

/* The budget from opts: 1 and *bytes when one applies (spine_gb >= 0), 0 when none, else
 * -K3_ERR_USAGE. */
/* ---- the memory plan (plan.h) --------------------------------------------------------------- */

/* One routed expert's cache slot as the store sizes it: gate, up and down in MXFP4 (a nibble
 * per weight plus one E8M0 scale per 32) rounded to the I/O alignment, plus one alignment
 * unit (src/store/map.c). An estimate for planning; the store sizes the real one. */
static uint64_t slot_estimate(const k3_config *c) {
    uint64_t w = (uint64_t)c->moe_intermediate_size * (uint64_t)c->routed_expert_hidden_size;
    uint64_t bytes = 3 * (w / 2 + w / 32), align = 4096;
    return (bytes + align - 1) / align * align + align;
}

/* Bytes of the metadata read before weights (plan.h's base allowance): every shard's header
 * and the snapshot's small files. From the files, never from the process's RSS, so that the
 * plan is the same for every run (and for `k3 plan`) on the same snapshot. */
static uint64_t metadata_bytes(const k3_checkpoint *ck) {
    static const char *const files[] = {"config.json", "model.safetensors.index.json",
                                        "tiktoken.model", "tokenizer_config.json"};
    uint64_t n = 0;
    for (int i = 0; i < ck->n_shards; i++) n += ck->shards[i].data_start;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char path[4200];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", ck->dir, files[i]);
        if (stat(path, &st) == 0 && st.st_size > 0) n += (uint64_t)st.st_size;
    }
    return n;
}

/* The machine of o->memory_gb: that much RAM, all of it available, no cgroup. */
static void given_machine(double gb, k3_machine_mem *m) {
    uint64_t bytes = (uint64_t)llround(gb * 1e9); /* 0.021692416 GB is 21692416 bytes */
    *m = (k3_machine_mem){.ram_total_bytes = bytes, .ram_available_bytes = bytes};
    snprintf(m->ram_source, sizeof m->ram_source, "memory_gb given");
}

/* Plans the spine budget and the expert cache from the machine's memory (the process's cgroup
 * included), the model's sizes and the overrides in o, before anything is read. */
static int plan_memory(k3_engine *e, const k3_engine_opts *o, uint64_t *spine_budget,
                       k3_err *err) {
    const k3_config *c = &e->cfg;
    int moe_layers = c->num_hidden_layers - c->first_k_dense_replace;
    int ctx_default = c->max_position_embeddings < 4096 ? c->max_position_embeddings : 4096;
    if (o->ctx < 0)
        return k3_fail_field(err, K3_ERR_USAGE, "ctx",
                             " %d: expected positions >= 1, or 0: the default %d",
                       o->ctx, ctx_default);
    /* spine_gb's one check: K3_SPINE_GB_PLAN or a budget (the planner is then given it) */
    if (!(o->spine_gb == K3_SPINE_GB_PLAN || (o->spine_gb >= 0 && o->spine_gb <= 1e6)))
        return k3_fail_field(err, K3_ERR_USAGE, "spine_gb",
                             " %g: expected a number of GB from 0 to 1e6, "
                       "or K3_SPINE_GB_PLAN (-1): planned", o->spine_gb);
    if (lab_of(o)->spine_in_place && o->spine_gb != K3_SPINE_GB_PLAN)
        return k3_fail_field(err, K3_ERR_USAGE, "spine_gb",
                             " %g: the lab's spine_in_place leaves no "
                       "budget", o->spine_gb);
    if (!(o->memory_gb >= 0 && o->memory_gb < 1e6))
        return k3_fail_field(err, K3_ERR_USAGE, "memory_gb",
                             " %g: expected a number of GB below 1e6 (or "
                       "0: this machine's)", o->memory_gb);
    /* past the model's context no session opens (k3_session_new says why): plan its maximum */
    e->plan_ctx = o->ctx <= 0 ? ctx_default
                  : o->ctx < c->max_position_embeddings ? o->ctx : c->max_position_embeddings;
    k3_plan_model pm = {.spine_bytes = e->model.spine_bytes, .expert_slot_bytes = slot_estimate(c),
                        .top_k = c->num_experts_per_token,
                        .session_bytes = k3_state_plan_bytes(&e->model, e->plan_ctx),
                        .prefill_row_bytes = k3_prefill_row_bytes(&e->model),
                        .prefill_rows_min = K3_DEFAULT_CHUNK,
                        .prefill_group_rows = k3_prefill_group_rows(),
                        .prefill_group_bytes = k3_prefill_group_bytes(&e->model,
                                                                      K3_DEFAULT_CHUNK),
                        /* no pass outgrows the context; the GPU backend feeds a prompt
                         * token by token */
                        .prefill_rows_max = o->device && !strcmp(o->device, "cuda") ? 0
                                            : o->prompt_rows < 0 ? 0
                                            : e->plan_ctx < K3_MAX_CHUNK ? e->plan_ctx
                                                                         : K3_MAX_CHUNK,
                        /* a pass that may be stopped keeps it (not on the GPU nor under MPI:
                         * no pass of theirs stops) */
                        .undo_bytes = (o->device && !strcmp(o->device, "cuda")) ||
                                      o->expert_ranks ? 0 : k3_state_undo_bytes(&e->model)};
    if (o->prompt_rows > 0 && pm.prefill_rows_max > o->prompt_rows)
        pm.prefill_rows_max = o->prompt_rows;
    pm.experts_bytes = (uint64_t)(moe_layers > 0 ? moe_layers : 0) * (uint64_t)c->num_experts *
                       pm.expert_slot_bytes;
    int rc = k3_spine_floor_bytes(&e->model, e->ck, e->pack, &pm.staging_bytes, err);
    if (rc) return rc;
    k3_machine_mem probed;
    const k3_machine_mem *m = o->machine;
    if (!m && o->memory_gb > 0) given_machine(o->memory_gb, &probed), m = &probed;
    if (!m && (rc = k3_machine_mem_probe("", &probed, err))) return rc;
    if (!m) m = &probed;
    k3_plan_request r = {.base_bytes = k3_plan_base_bytes(metadata_bytes(e->ck)),
                         .sessions = o->sessions > 0 ? o->sessions : 1,
                         .pass_sessions = o->pass_sessions,
                         .gpu = o->device && !strcmp(o->device, "cuda"),
                         .spine_gb = o->spine_gb, /* K3_SPINE_GB_PLAN is the planner's -1 */
                         .expert_gb = lab_of(o)->expert_slots > 0
                                          ? (double)lab_of(o)->expert_slots *
                                                pm.expert_slot_bytes / 1e9
                                          : o->expert_gb,
                         .ctx = e->plan_ctx};
    e->mplan_model = pm;
    if ((rc = k3_plan_memory(m, &pm, &r, &e->mplan, err))) return rc;
    if (lab_of(o)->spine_in_place && e->mplan.spine_budgeted)
        e->mplan.spine_budgeted = 0; /* the caller asked for the mapping whatever the plan */
    *spine_budget = e->mplan.spine_budgeted ? e->mplan.spine_budget_bytes : UINT64_MAX;
    return K3_OK;
}

/* With a budget (given, or planned), plans it and starts streaming (after binding, before the
 * store's memory plan). The budget is the CPU backend's: --device auto then means the CPU,
 * cuda is refused (the GPU plans its own memory with --gpu-gb). */
static int open_spine_budget(k3_engine *e, const k3_engine_opts *o, uint64_t bytes,
                             const k3_store_settings *ss, k3_engine_opts *dev, bool plan_only,
                             k3_err *err) {
    snprintf(e->spine_plan_line, sizeof e->spine_plan_line, "spine budget: none");
    if (bytes == UINT64_MAX) return K3_OK;
    if (o->device && !strcmp(o->device, "cuda"))
        return k3_fail_field(err, K3_ERR_USAGE, "spine_gb",
                             " is a budget of the CPU backend; the GPU "
                       "backend plans its own device memory");
    dev->device = "cpu";
    /* direct as for experts, but auto means O_DIRECT: streamed layers are read
     * once per pass and never worth the page cache */
    bool direct = ss->direct != K3_IO_BUFFERED;
    int rc = plan_only ? k3_spine_plan_only(&e->model, e->ck, e->pack, bytes, direct,
                                            &e->model.spine, err)
                       : k3_spine_open(&e->model, e->ck, e->pack, bytes, direct, &e->model.spine,
                                       err);
    if (!rc) k3_spine_describe(e->model.spine, e->spine_plan_line, sizeof e->spine_plan_line);
    return rc;
}

/* After the spine took its layers: the expert cache gets the planned bytes (and whatever the
 * spine's layer granularity left) unless the caller fixed it. */
static void settle_plan(k3_engine *e, const k3_engine_opts *o, k3_store_settings *ss) {
    /* the planned model: the spare never makes the cache larger than every expert */
    if (e->model.spine)
        k3_plan_settle(&e->mplan, &e->mplan_model, k3_spine_ram_bytes(e->model.spine, &e->model));
    if (lab_of(o)->expert_slots <= 0 && o->expert_gb <= 0 && !o->experts_in_place)
        ss->expert_gb = (double)e->mplan.expert_cache_bytes / 1e9;
    k3_plan_describe(&e->mplan, e->mplan_line, sizeof e->mplan_line);
}

void k3_engine_spine_stats(const k3_engine *e, k3_spine_stats *out) {
    k3_spine_get_stats(e->model.spine, out);
}

k3_engine_opts k3_engine_opts_default(void) {
    /* physical cores: SMT siblings share the FPU and the memory bus */
    return (k3_engine_opts){.threads = k3_cpu_physical_cores(), .spine = K3_SPINE_BF16,
                            .load_threads = 4, .direct = K3_IO_AUTO, .pipe = K3_PIPE_AUTO,
                            .device = "cpu",
                            .spine_gb = K3_SPINE_GB_PLAN, .sessions = 1};
}

/* The steps before any weight is read: config, tokenizer, the store's settings, the
 * checkpoint's headers (the shards are mapped, not read), the pack, binding, kernels. */
static int open_headers(k3_engine *e, const char *model_dir, const k3_engine_opts *opts,
                        k3_store_settings *ss, k3_err *err) {
    int rc = k3_config_load(model_dir, &e->cfg, err);
    if (!rc) rc = k3_tokenizer_load(model_dir, &e->tok, err);
    if (!rc && k3_tokenizer_vocab_size(e->tok) > e->cfg.vocab_size)
        rc = k3_fail(err, K3_ERR_CONFIG, "%s: tokenizer has %d ids but config.json vocab_size "
                     "is %d", model_dir, k3_tokenizer_vocab_size(e->tok), e->cfg.vocab_size);
    if (!rc) rc = store_settings(opts, ss, err);
    if (!rc) rc = k3_checkpoint_open_dirs(model_dir, ss->dirs, &e->ck, err);
    if (!rc) rc = open_spine(e, model_dir, opts, err);
    if (!rc) rc = k3_model_bind_packed(&e->model, &e->cfg, e->ck, e->pack, e->approx, err);
    if (!rc) rc = k3_kernels_select(opts->kernels, &e->model.kr, err);
    e->model.ranks = opts->expert_ranks; /* MPI (src/dist); NULL in one process */
    e->rank_ops = opts->rank_ops;
    if (!rc && e->rank_ops && !(e->pass_wire = malloc(K3_ROP_PASS_INTS * sizeof(int32_t))))
        rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    return rc;
}

/* The memory plan, the spine budget at layer granularity (opened and streaming, or with
 * plan_only only planned: nothing read) and the plan settled around it. */
static int plan_spine(k3_engine *e, const k3_engine_opts *opts, k3_store_settings *ss,
                      k3_engine_opts *dev, bool plan_only, k3_err *err) {
    uint64_t spine_bytes = UINT64_MAX;
    int rc = plan_memory(e, opts, &spine_bytes, err);
    if (!rc) rc = open_spine_budget(e, opts, spine_bytes, ss, dev, plan_only, err);
    if (!rc) settle_plan(e, opts, ss);
    return rc;
}

int k3_engine_plan(const char *model_dir, const k3_engine_opts *opts, k3_engine_plan_info *out,
                   k3_err *err) {
    k3_engine_opts defaults = k3_engine_opts_default();
    if (!opts) opts = &defaults;
    memset(out, 0, sizeof *out);
    k3_engine *e = calloc(1, sizeof *e);
    if (!e) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    k3_store_settings ss;
    k3_engine_opts dev = *opts;
    int rc = open_headers(e, model_dir, opts, &ss, err);
    if (!rc) rc = plan_spine(e, opts, &ss, &dev, true, err);
    if (!rc) {
        const k3_config *c = &e->cfg;
        out->plan = e->mplan;
        out->model = e->mplan_model;
        k3_spine_get_stats(e->model.spine, &out->spine);
        out->n_layers = c->num_hidden_layers;
        out->moe_layers = c->num_hidden_layers - c->first_k_dense_replace;
        out->n_experts = c->num_experts;
        out->spine_mapped_bytes = e->model.spine_bytes;
        snprintf(out->line, sizeof out->line, "%s", e->mplan_line);
        snprintf(out->spine_line, sizeof out->spine_line, "%s", e->spine_plan_line);
        snprintf(out->spine_mode, sizeof out->spine_mode, "%s", e->spine_line);
    }
    k3_engine_free(e);
    return rc;
}

int k3_engine_load(const char *model_dir, const k3_engine_opts *opts, k3_engine **out,
                   k3_err *err) {
    k3_engine_opts defaults = k3_engine_opts_default();
    if (!opts) opts = &defaults;
    if (opts->threads < 0)
        return k3_fail_field(err, K3_ERR_USAGE, "threads",
                             " %d: expected >= 1 (or 0: OpenMP's own count)",
                       opts->threads);
    k3_engine *e = calloc(1, sizeof *e);
    if (!e) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    k3_sigbus_install(); /* a shard truncated under a step fails the step (D2) */
    if (opts->threads > 0) omp_set_num_threads(opts->threads);
    k3_store_settings ss;
    k3_engine_opts dev = *opts;
    int rc = open_headers(e, model_dir, opts, &ss, err);
    if (!rc) rc = plan_spine(e, opts, &ss, &dev, false, err);
    if (!rc) rc = open_store(e, &ss, err);
    if (!rc) rc = attach_source(e, opts, err);
    if (!rc) rc = k3_backend_open(&e->model, &dev, &e->backend, err);
    if (!rc && opts->expert_ranks && k3_backend_can_rewind(e->backend) == 0)
        rc = k3_fail_opts(err, K3_ERR_USAGE, "device", "the %s backend: an MPI run computes "
                          "its experts on the CPU backend only (GPU ranks are not built yet); "
                          "give device cpu", k3_backend_name(e->backend));
    if (rc) {
        k3_engine_free(e);
        return rc;
    }
    if (opts->verbose)
        fprintf(stderr, "k3: loaded %s: %d layers (%d KDA, %d MLA), hidden %d, %d experts "
                "(top-%d), spine %.3f GB + experts %.3f GB mapped from %d shard(s)%s, "
                "%d threads\n", model_dir, e->cfg.num_hidden_layers, e->model.n_kda,
                e->model.n_mla, e->cfg.hidden_size, e->cfg.num_experts,
                e->cfg.num_experts_per_token, (double)e->model.spine_bytes / 1e9,
                (double)e->model.expert_bytes / 1e9, e->ck->n_shards,
                e->ck->n_skipped_shards ? " (vision-only shards skipped)" : "",
                omp_get_max_threads());
    if (opts->verbose) fprintf(stderr, "k3: %s\n", e->spine_line);
    if (opts->verbose) fprintf(stderr, "k3: %s\n", e->mplan_line);
    if (opts->verbose && e->model.spine) fprintf(stderr, "k3: %s\n", e->spine_plan_line);
    if (opts->verbose)
        fprintf(stderr, "k3: kernels: %s path, %d threads\n", k3_kernels_name(e->model.kr),
                omp_get_max_threads());
    if (opts->verbose) fprintf(stderr, "k3: %s\n", e->store_line);
    if (opts->verbose) fprintf(stderr, "k3: %s\n", k3_backend_line(e->backend));
    *out = e;
    return K3_OK;
}

void k3_engine_free(k3_engine *e) {
    if (!e) return;
    k3_backend_close(e->backend);
    k3_spine_close(e->model.spine);
    k3_model_free(&e->model);
    k3_store_close(e->store);
    k3_pack_close(e->pack);
    k3_checkpoint_close(e->ck);
    k3_tokenizer_free(e->tok);
    free(e->pass_wire);
    free(e);
}

const k3_config *k3_engine_config(const k3_engine *e) { return &e->cfg; }
const k3_tokenizer *k3_engine_tokenizer(const k3_engine *e) { return e->tok; }
uint64_t k3_engine_weight_bytes(const k3_engine *e) {
    return e->model.spine_bytes + e->model.expert_bytes;
}

int k3_engine_spine_int8(const k3_engine *e) {
    return e->pack != NULL && e->pack->scheme == K3_PACK_SCHEME_INT8_ROW;
}
int k3_engine_approx(const k3_engine *e) { return e->approx; }
const char *k3_engine_kernels(const k3_engine *e) { return k3_kernels_name(e->model.kr); }

void k3_engine_describe(const k3_engine *e, int parts, char *buf, size_t cap) {
    const char *line[] = {e->spine_line, e->spine_plan_line, e->store_line,
                          k3_backend_line(e->backend)};
    size_t len = 0;
    if (cap) buf[0] = 0;
    for (int i = 0; i < 4 && len + 1 < cap; i++) {
        if (!(parts & 1 << i)) continue;
        int n = snprintf(buf + len, cap - len, "%s%s", len ? "\n" : "", line[i]);
        len = n < 0 ? len : len + (size_t)n < cap ? len + (size_t)n : cap - 1;
    }
}

int k3_session_new(const k3_engine *e, int max_ctx, k3_session **out, k3_err *err) {
    int ctx_default = e->cfg.max_position_embeddings < 4096 ? e->cfg.max_position_embeddings
                                                             : 4096;
    int want = max_ctx > 0 ? max_ctx : ctx_default;
    if (want <= e->cfg.max_position_embeddings && want > e->plan_ctx)
        return k3_fail(err, K3_ERR_USAGE, "a session of %d positions is more than the memory "
                       "plan counted (%d, ctx at load): its KV cache could pass the limit; give "
                       "the context at load (ctx)", want, e->plan_ctx);
    k3_session *s = calloc(1, sizeof *s);
    if (!s) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    s->e = e;
    /* expert-major prompt passes: as many ids as the plan's activation budget holds */
    s->chunk = e->mplan.prefill_rows > 0 ? e->mplan.prefill_rows : K3_DEFAULT_CHUNK;
    int rc = k3_state_new(&e->model, max_ctx, &s->state, err);
    if (rc) {
        free(s);
        return rc;
    }
    if (!(s->tokens = malloc((size_t)k3_state_max_ctx(s->state) * sizeof *s->tokens))) {
        k3_session_free(s);
        return k3_fail(err, K3_ERR_GENERIC, "out of memory for the token history");
    }
    if ((rc = k3_backend_session_new(e->backend, s->state, &s->dev, err))) {
        k3_session_free(s);
        return rc;
    }
    if ((rc = k3_engine_mirror(s, K3_ROP_NEW, k3_state_max_ctx(s->state), 0, NULL, 0, err))) {
        k3_session_free(s);
        return rc;
    }
    *out = s;
    return K3_OK;
}

void k3_session_free(k3_session *s) {
    if (!s) return;
    k3_engine_mirror(s, K3_ROP_FREE, 0, 0, NULL, 0, NULL); /* a rank that missed it quits anyway */
    k3_backend_session_free(s->e->backend, s->dev);
    k3_state_free(s->state);
    free(s->tokens);
    free(s);
}

void k3_session_reset(k3_session *s) {
    k3_engine_mirror(s, K3_ROP_RESET, 0, 0, NULL, 0, NULL); /* a lost rank fails the next pass */
    k3_state_reset(s->state);
    k3_backend_session_reset(s->e->backend, s->dev);
}
int k3_session_pos(const k3_session *s) { return k3_state_pos(s->state); }
int k3_session_max_ctx(const k3_session *s) { return k3_state_max_ctx(s->state); }

void k3_session_set_trace(k3_session *s, const k3_trace *trace) {
    s->has_trace = trace != NULL;
    if (trace) s->trace = *trace;
}

/* One segment through the one pass (pass.c). */
static int one_segment(k3_session *s, const int32_t *ids, int n, float *logits, int flags,
                       k3_err *err) {
    k3_pass_seg g = {.s = s, .ids = ids, .n = n,
                     .flags = (logits ? flags : flags | K3_BATCH_NO_LOGITS) &
                              ~(logits ? 0 : K3_BATCH_ALL_LOGITS)};
    return k3_engine_pass(s->e, NULL, &g, 1, logits, err);
}

int k3_session_step(k3_session *s, int32_t token, float *logits, k3_err *err) {
    return one_segment(s, &token, 1, logits, 0, err);
}

/* ---- token history, prefill with reuse, interruption, state files (k3.h) ------------------ */

const int32_t *k3_session_tokens(const k3_session *s) { return s->tokens; }

void k3_session_set_interrupt(k3_session *s, const volatile sig_atomic_t *flag) {
    s->interrupt = flag;
}

int k3_session_prefill(k3_session *s, const int32_t *ids, size_t n, float *logits, int *reused,
                       k3_err *err) {
    return k3_session_prefill_with(s, ids, n, logits, reused, NULL, err);
}

int k3_prefill_begin(k3_prefill *p, k3_session *s, const int32_t *ids, size_t n, int *reused,
                     k3_err *err) {
    size_t pos = (size_t)k3_session_pos(s), keep = 0;
    while (keep < pos && keep < n && s->tokens[keep] == ids[keep]) keep++;
    if (keep < pos || keep == n) { /* the history is not a strict prefix: start again */
        k3_session_reset(s);
        keep = 0;
    }
    if (reused) *reused = (int)keep;
    *p = (k3_prefill){.s = s, .ids = ids, .n = n, .at = keep, .first = keep};
    if (n > (size_t)k3_session_max_ctx(s))
        return k3_fail_opts(err, K3_ERR_INPUT, "ctx", "the prompt (%zu tokens) does not fit the "
                            "context of %d tokens (raise ctx)", n, k3_session_max_ctx(s));
    return K3_OK;
}

int k3_prefill_next(const k3_prefill *p, int max, const int32_t **ids) {
    size_t left = p->n - p->at, len = (size_t)(max < p->s->chunk ? max : p->s->chunk);
    if (len > left) len = left;
    *ids = p->ids + p->at;
    return (int)len;
}

void k3_prefill_fed(k3_prefill *p, int n) { p->at += (size_t)n; }

/* One pass of ids[0, len) at the session's position: with all-logits rows for the hook, the
 * last row is copied to logits when the pass ends the prompt. */
static int prefill_pass(k3_session *s, const int32_t *ids, int len, bool last, float *logits,
                        float *rows, k3_err *err) {
    if (!rows) return k3_session_forward(s, ids, len, last ? logits : NULL, 0, err);
    int rc = k3_session_forward(s, ids, len, rows, K3_FWD_ALL_LOGITS, err);
    size_t V = (size_t)s->e->cfg.vocab_size;
    if (!rc && last && logits) memcpy(logits, rows + (size_t)(len - 1) * V, V * sizeof *rows);
    return rc;
}

int k3_session_prefill_with(k3_session *s, const int32_t *ids, size_t n, float *logits,
                            int *reused, const k3_prefill_hook *hook, k3_err *err) {
    k3_prefill p;
    int rc = k3_prefill_begin(&p, s, ids, n, reused, err), len;
    if (rc) return rc;
    float *rows = NULL;
    /* every position's logits: passes no longer than the default, or the rows outgrow RAM */
    int max_rows = hook && hook->all_logits && s->chunk > K3_DEFAULT_CHUNK ? K3_DEFAULT_CHUNK
                                                                           : s->chunk;
    if (hook && hook->all_logits &&
        !(rows = malloc((size_t)max_rows * (size_t)s->e->cfg.vocab_size * sizeof *rows)))
        return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    const int32_t *chunk;
    while (!rc && (len = k3_prefill_next(&p, max_rows, &chunk)) > 0) {
        if (s->interrupt && *s->interrupt) {
            rc = k3_fail(err, K3_ERR_INTERRUPTED, "interrupted after %zu of %zu prompt tokens",
                         p.at - p.first, n - p.first);
            break;
        }
        size_t at = p.at;
        rc = prefill_pass(s, chunk, len, at + (size_t)len == n, logits, rows, err);
        if (!rc) k3_prefill_fed(&p, len);
        if (!rc && hook && hook->on_pass)
            rc = hook->on_pass(hook->user, (int)at, len, rows, n - p.at, err);
    }
    free(rows);
    return rc;
}

/* ---- batched passes: prefill chunks, speculative verification (k3.h) ----------------------- */

void k3_session_set_chunk(k3_session *s, int chunk) {
    s->chunk = chunk < 1 ? 1 : chunk > K3_MAX_CHUNK ? K3_MAX_CHUNK : chunk;
}
int k3_session_chunk(const k3_session *s) { return s->chunk; }

/* Batched passes and rewinds run on the CPU backend (a device backend steps token by token). */
int k3_session_can_rewind(const k3_session *s) { return k3_backend_can_rewind(s->e->backend); }

int k3_session_forward(k3_session *s, const int32_t *ids, int n, float *logits, int flags,
                       k3_err *err) {
    if (n < 1 || n > K3_MAX_CHUNK)
        return k3_fail(err, K3_ERR_INPUT, "a pass takes 1 to %d tokens, not %d", K3_MAX_CHUNK, n);
    return one_segment(s, ids, n, logits,
                       (flags & K3_FWD_ALL_LOGITS ? K3_BATCH_ALL_LOGITS : 0) |
                       (flags & K3_FWD_REWINDABLE ? K3_BATCH_REWINDABLE : 0), err);
}

int k3_session_rewind(k3_session *s, int pos, k3_err *err) {
    int rc = k3_engine_mirror(s, K3_ROP_REWIND, pos, 0, NULL, 0, err);
    return rc ? rc : k3_backend_rewind(s->e->backend, s->dev, s->state, pos, err);
}

/* Whether the spine is the (lossy) int8 pack: part of a state file's fingerprint (the lossless
 * pack computes what BF16 computes, so its state files are BF16's). */
#define SPINE_INT8(e) k3_engine_spine_int8(e)

int k3_session_save(const k3_session *s, const char *path, k3_err *err) {
    int rc = k3_backend_sync(s->e->backend, s->dev, s->state, 1, err);
    if (rc) return rc;
    return k3_state_file_save(s->state, &s->e->model, s->e->ck, SPINE_INT8(s->e), s->tokens,
                              path, err);
}

/* From the file at path, or (buf non-NULL) from its n bytes in memory named path. */
static int session_load(k3_session *s, const char *path, const void *buf, size_t n,
                        const k3_state_want *want, k3_err *err) {
    if (s->e->rank_ops)
        return k3_fail(err, K3_ERR_USAGE, "%s: state files cannot be loaded in an MPI run (the "
                       "other ranks would not follow); run it in one process", path);
    int rc = buf ? k3_state_file_load_mem(s->state, &s->e->model, s->e->ck, SPINE_INT8(s->e),
                                          s->tokens, buf, n, path, want, err)
                 : k3_state_file_load(s->state, &s->e->model, s->e->ck, SPINE_INT8(s->e),
                                      s->tokens, path, want, err);
    if (rc && k3_state_pos(s->state) == 0) /* the host state was reset: so is the device's */
        k3_backend_session_reset(s->e->backend, s->dev);
    return rc ? rc : k3_backend_sync(s->e->backend, s->dev, s->state, 0, err);
}

int k3_session_load(k3_session *s, const char *path, k3_err *err) {
    return session_load(s, path, NULL, 0, NULL, err);
}

int k3_session_load_prefix(k3_session *s, const char *path, const int32_t *ids, int n,
                           k3_err *err) {
    k3_state_want want = {ids, n};
    return session_load(s, path, NULL, 0, &want, err);
}

int k3_session_load_prefix_mem(k3_session *s, const void *buf, size_t bytes, const char *name,
                               const int32_t *ids, int n, k3_err *err) {
    k3_state_want want = {ids, n};
    return session_load(s, name, buf, bytes, &want, err);
}

int k3_engine_state_fingerprint(const k3_engine *e, uint8_t out[16], k3_err *err) {
    return k3_model_fingerprint(e->ck, SPINE_INT8(e), out, err);
}

int k3_state_peek(const uint8_t fingerprint[16], const char *path, int *pos, uint64_t *bytes,
                  k3_err *err) {
    return k3_state_file_peek(path, fingerprint, pos, bytes, err);
}

/* ---- device (backend.h) --------------------------------------------------------------------- */

int k3_engine_layer_profile(const k3_engine *e, double *ms, uint64_t *bytes) {
    return k3_backend_layer_profile(e->backend, ms, bytes, e->cfg.num_hidden_layers);
}
