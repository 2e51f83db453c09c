/* cmd_bench_gpu.c — `k3-lab bench-gpu`: the CUDA backend against the card's copy bandwidth
 * measured in the same run: every kernel at K3's decode shapes, then, with MODEL_DIR (a K3-shaped
 * checkpoint such as `k3-lab synth --real`), decode seconds per token per layer kind with the
 * spine resident, extrapolated to K3's 93 layers and compared with the HBM floor. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../cli/model_dir.h"
#include "../cli/opts.h"
#include "../engine/k3.h"
#include "../engine/k3_lab.h"
#include "lab.h"
#ifdef K3_WITH_CUDA
#include "../cuda/gpu.h"
#include "../util/clock.h"
#endif

/* What the table parses (flags and the lab's variables). */
typedef struct gpu_args {
    int tokens, warmup, reps, max_layers, expert_slots, pdl;
    double gpu_gb;
    k3_gpu_tuning t;
} gpu_args;

#define GPU(f) K3_OPT_CMD(gpu_args, f), .field = #f
static const k3_opt gpu_rows[] = {
    {.flag = "--tokens", GPU(tokens), .type = K3_OPT_INT, .lo = 1, .hi = 1 << 20, .def = "32",
     .meta = "N", .help = "decode steps timed"},
    {.flag = "--warmup", GPU(warmup), .type = K3_OPT_INT, .lo = 0, .hi = 1 << 20, .def = "16",
     .meta = "N", .help = "steps before timing, filling the expert cache"},
    {.flag = "--reps", GPU(reps), .type = K3_OPT_INT, .lo = 1, .hi = 1 << 20, .def = "20",
     .meta = "N", .help = "launches per timed batch in part 1"},
    {.flag = "--gpu-gb", GPU(gpu_gb), .type = K3_OPT_DOUBLE, .lo = 0, .hi = 1e6, .meta = "G",
     .help = "device memory budget (default: free memory less a margin)"},
    {.env = "K3_GPU_LAYERS", GPU(max_layers), .type = K3_OPT_INT, .lo = -1, .hi = 1 << 20,
     .def = "-1", .help = "keep at most N spine layers resident (-1: as many as fit)"},
    {.env = "K3_GPU_EXPERT_SLOTS", GPU(expert_slots), .type = K3_OPT_INT, .lo = 0,
     .hi = 1 << 20, .help = "exactly N device expert slots (0: the budget)"},
    {.env = "K3_PDL", GPU(pdl), .type = K3_OPT_INT, .lo = 0, .hi = 1, .def = "1",
     .help = "0: launch without programmatic dependent launch"},
    {.env = "K3_MX_SCHEDULE", GPU(t.mx_schedule), .type = K3_OPT_INT, .lo = 0, .hi = 64,
     .help = "the MXFP4 experts' launch schedule (0 = fastest)"},
    {.env = "K3_MX_SCAN", GPU(t.mx_scan), .type = K3_OPT_SWITCH, .value = 1, .lo = 0, .hi = 1,
     .help = "1: also n experts per launch for n = 1..32, and host enqueue times"},
    {.env = "K3_MX_SWEEP", GPU(t.mx_sweep), .type = K3_OPT_SWITCH, .value = 1, .lo = 0, .hi = 1,
     .help = "1: also every MXFP4 schedule"},
    {.env = "K3_ONLY_EXPERTS", GPU(t.only_experts), .type = K3_OPT_SWITCH, .value = 1, .lo = 0,
     .hi = 1, .help = "1: only the MXFP4 expert rows (profiling runs)"},
};

static const k3_cli_command gpu_cmd = {
    .name = "bench-gpu", .prog = "k3-lab",
    .usage =
        "usage: k3-lab bench-gpu [MODEL_DIR] [options]\n"
        "\n"
        "Measures the GPU backend (a k3-lab built with make CUDA=1, on a CUDA device):\n"
        " 1. the device-to-device copy bandwidth (bytes read + written per second), then every\n"
        "    product kernel at K3's decode shapes (batch 1: BF16 and int8 matvecs, the 16\n"
        "    routed MXFP4 experts of a layer in one launch) and the KDA and MLA mixers, each\n"
        "    as GB/s of weight bytes and as a share of that copy bandwidth;\n"
        " 2. with MODEL_DIR (a checkpoint at K3's widths, e.g. k3-lab synth DIR --real --layers 4\n"
        "    --experts 32 --top-k 16): greedy decode on the GPU with the spine resident and the\n"
        "    experts cached, each layer timed with device events; seconds per token per layer\n"
        "    kind, extrapolated to K3 (1 KDA+dense, 68 KDA+MoE and 24 MLA+MoE layers, 896\n"
        "    experts, vocabulary 163840), against the HBM floor = bytes read per token /\n"
        "    copy bandwidth.\n",
    .rows = gpu_rows, .n_rows = sizeof gpu_rows / sizeof *gpu_rows,
    .max_positional = 1,
};

#ifdef K3_WITH_CUDA
static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

enum { KDA_DENSE, KDA_MOE, MLA_MOE, MLA_DENSE, N_KINDS };
static const char *KIND[N_KINDS] = {"KDA+dense", "KDA+MoE", "MLA+MoE", "MLA+dense"};

static int kind_of(const k3_config *c, int l) {
    return c->layer_is_mla[l] ? (c->layer_is_moe[l] ? MLA_MOE : MLA_DENSE)
                              : (c->layer_is_moe[l] ? KDA_MOE : KDA_DENSE);
}

/* Runs warmup + tokens greedy steps; per-layer mean ms and bytes of the timed steps only. */
static int decode(k3_engine *e, int warmup, int tokens, double *ms, uint64_t *bytes,
                  double *wall, k3_err *err) {
    const k3_config *c = k3_engine_config(e);
    int L = c->num_hidden_layers, rc, n0 = 0;
    k3_session *s = NULL;
    float *logits = malloc((size_t)c->vocab_size * sizeof *logits);
    double *ms0 = calloc((size_t)L + 1, sizeof *ms0), t0 = 0;
    if (!logits || !ms0) return k3_fail(err, K3_ERR_GENERIC, "out of memory");
    rc = k3_session_new(e, warmup + tokens + 1, &s, err);
    int32_t tok = c->bos_token_id;
    for (int st = 0; !rc && st < warmup + tokens; st++) {
        if (st == warmup) {
            n0 = k3_engine_layer_profile(e, ms0, NULL);
            t0 = k3_now_s();
        }
        rc = k3_session_step(s, tok, logits, err);
        tok = argmax(logits, c->vocab_size);
    }
    *wall = (k3_now_s() - t0) / tokens;
    int n = rc ? 0 : k3_engine_layer_profile(e, ms, bytes);
    for (int l = 0; l <= L && n; l++) ms[l] = (ms[l] * n - ms0[l] * n0) / (n - n0);
    if (!rc && n - n0 != tokens) rc = k3_fail(err, K3_ERR_DEVICE, "no per-layer profile");
    k3_session_free(s);
    free(logits);
    free(ms0);
    return rc;
}

static int bench_model(const char *dir, const gpu_args *a, const k3_gpu_bench *kb, k3_err *err) {
    int warmup = a->warmup, tokens = a->tokens;
    k3_engine_opts eo = k3_engine_opts_default();
    eo.device = "cuda", eo.verbose = 1, eo.gpu_gb = a->gpu_gb;
    /* the lab's controls (k3_lab.h): per-layer device events, and K3_GPU_LAYERS /
     * K3_GPU_EXPERT_SLOTS through the table */
    k3_lab_opts lab = k3_lab_opts_default();
    lab.gpu_profile = 1, lab.gpu_max_layers = a->max_layers, lab.gpu_expert_slots = a->expert_slots;
    eo.lab = &lab;
    k3_engine *e = NULL;
    int rc = k3_engine_load(dir, &eo, &e, err);
    if (rc) return rc;
    const k3_config *c = k3_engine_config(e);
    int L = c->num_hidden_layers;
    double *ms = calloc((size_t)L + 1, sizeof *ms), wall = 0;
    uint64_t *bytes = calloc((size_t)L + 1, sizeof *bytes);
    if (!ms || !bytes) rc = k3_fail(err, K3_ERR_GENERIC, "out of memory");
    if (!rc) rc = decode(e, warmup, tokens, ms, bytes, &wall, err);
    if (rc) goto done;
    double bw = kb->copy_bps, sum = 0;
    printf("\ndecode on %s: %d layers, %d experts (top-%d), %d timed steps after %d warm-up "
           "(positions < %d), spine resident, experts cached\n", dir, L, c->num_experts,
           c->num_experts_per_token, tokens, warmup, warmup + tokens);
    printf("%-6s %-10s %10s %10s %8s %7s\n", "layer", "kind", "MB/token", "ms", "GB/s", "of copy");
    double kms[N_KINDS] = {0}, kbytes[N_KINDS] = {0};
    int kn[N_KINDS] = {0};
    for (int l = 0; l <= L; l++) {
        const char *k = l < L ? KIND[kind_of(c, l)] : "head";
        printf("%-6d %-10s %10.1f %10.3f %8.0f %6.1f%%\n", l, k, bytes[l] / 1e6, ms[l],
               bytes[l] / (ms[l] * 1e-3) / 1e9, 100.0 * bytes[l] / (ms[l] * 1e-3) / bw);
        sum += ms[l];
        if (l == L) continue;
        kms[kind_of(c, l)] += ms[l], kbytes[kind_of(c, l)] += (double)bytes[l];
        kn[kind_of(c, l)]++;
    }
    printf("sum of layers + head %.3f ms; wall clock %.3f ms per token (%.1f tokens/s)\n", sum,
           wall * 1e3, 1.0 / wall);
    /* K3: layer i is MLA iff i % 4 == 3 or i == 92, MoE iff i >= 1 (spec §1). */
    int k3n[N_KINDS] = {0};
    for (int i = 0; i < 93; i++) k3n[(i % 4 == 3 || i == 92) ? (i ? MLA_MOE : MLA_DENSE) : (i ? KDA_MOE : KDA_DENSE)]++;
    double router_extra = (896.0 - c->num_experts) * c->hidden_size * 2 + (896.0 - c->num_experts) * 4;
    double k3_s = 0, k3_b = 0;
    printf("\nper layer kind (mean), and K3 with 896 experts (router +%.1f MB per MoE layer, "
           "timed at the BF16 product's %.0f GB/s):\n", router_extra / 1e6, kb->bf16_bps / 1e9);
    printf("%-10s %8s %10s %10s %8s %7s\n", "kind", "K3 count", "MB/token", "ms", "GB/s", "of copy");
    for (int k = 0; k < N_KINDS; k++) {
        if (!k3n[k]) continue;
        if (!kn[k]) {
            printf("%-10s %8d   (not in this model: no figure)\n", KIND[k], k3n[k]);
            rc = rc ? rc : -1;
            continue;
        }
        double b = kbytes[k] / kn[k], s = kms[k] / kn[k] * 1e-3;
        if (k == KDA_MOE || k == MLA_MOE) b += router_extra, s += router_extra / kb->bf16_bps;
        printf("%-10s %8d %10.1f %10.3f %8.0f %6.1f%%\n", KIND[k], k3n[k], b / 1e6, s * 1e3,
               b / s / 1e9, 100.0 * b / s / bw);
        k3_s += k3n[k] * s, k3_b += k3n[k] * b;
    }
    if (rc == -1) {
        rc = k3_fail(err, K3_ERR_USAGE, "%s lacks a layer kind of K3: no extrapolation (use at "
                     "least 4 layers with k3-lab synth)", dir);
        goto done;
    }
    double head_b = 163840.0 * c->hidden_size * 2 + c->hidden_size * 6.0;
    double head_s = kb->lm_head_s + (ms[L] * 1e-3 - bytes[L] / kb->bf16_bps); /* + mix, norm */
    k3_s += head_s, k3_b += head_b;
    double floor_s = k3_b / bw;
    printf("head (lm_head 163840x7168 as measured in part 1, plus the output mix and norm): "
           "%.3f ms, %.1f MB\n", head_s * 1e3, head_b / 1e6);
    printf("K3 extrapolated: %.2f ms per token (%.1f tokens/s) reading %.2f GB; HBM floor "
           "%.2f ms at the copy bandwidth %.0f GB/s; %.0f%% of the floor's speed\n",
           k3_s * 1e3, 1.0 / k3_s, k3_b / 1e9, floor_s * 1e3, bw / 1e9, 100.0 * floor_s / k3_s);
done:
    free(ms);
    free(bytes);
    k3_engine_free(e);
    return rc;
}
#endif

int k3_cmd_bench_gpu(int argc, char **argv) {
    gpu_args a = {0};
    k3_opts_parsed parsed;
    k3_opt_targets tg = {.cmd = &a};
    int rc = k3_opts_parse(&gpu_cmd, argc, argv, &tg, &parsed);
    if (rc) return rc < 0 ? 0 : rc;
    const char *dir = parsed.n_positional ? parsed.positional[0] : NULL;
    if (dir && (rc = k3_model_arg("k3-lab bench-gpu", dir, &dir))) return rc; /* a name too */
    a.t.no_pdl = !a.pdl;
#ifdef K3_WITH_CUDA
    k3_err err = {0};
    k3_gpu_bench kb;
    k3_gpu_set_tuning(&a.t);
    rc = k3_gpu_bench_kernels(stdout, a.reps, &a.t, &kb, &err);
    if (!rc && dir) rc = bench_model(dir, &a, &kb, &err);
    if (rc) fprintf(stderr, "k3-lab bench-gpu: %s\n", err.msg);
    return rc;
#else
    (void)dir;
    fprintf(stderr, "k3-lab bench-gpu: this k3-lab was built without CUDA (rebuild with make "
            "CUDA=1)\n");
    return K3_ERR_DEVICE;
#endif
}
