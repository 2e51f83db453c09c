/* cmd_bench_gpu.c — `k3-lab bench-gpu`: the CUDA backend against the card's copy bandwidth
 * measured in the same run: every kernel at K3's decode shapes, then, with MODEL_DIR (a K3-shaped
 * checkpoint such as `k3-lab synth --real`), decode seconds per token per layer kind with the
 * spine resident, extrapolated to K3's 93 layers and compared with the HBM floor. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/k3.h"
#include "lab.h"
#include "../util/parse.h"
#ifdef K3_WITH_CUDA
#include "../cuda/gpu.h"
#include "../util/clock.h"
#endif

static void usage(FILE *f) {
    fprintf(f,
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
        "    copy bandwidth.\n"
        "\n"
        "  --tokens N    decode steps timed (default 32)\n"
        "  --warmup N    steps before timing, filling the expert cache (default 16)\n"
        "  --reps N      launches per timed batch in part 1 (default 20)\n"
        "  --gpu-gb G    device memory budget (default: free memory less a margin)\n"
        "  -h, --help    this help\n");
}

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

static int bench_model(const char *dir, int warmup, int tokens, double gpu_gb,
                       const k3_gpu_bench *kb, k3_err *err) {
    k3_engine_opts eo = k3_engine_opts_default();
    eo.device = "cuda", eo.verbose = 1, eo.gpu_gb = gpu_gb, eo.gpu_profile = 1;
    /* lab switches (the library reads no environment): K3_GPU_LAYERS=N keeps at most N
     * spine layers resident, K3_GPU_EXPERT_SLOTS=N sizes the expert cache exactly */
    const char *v = getenv("K3_GPU_LAYERS");
    if (v && *v) eo.gpu_max_layers = atoi(v);
    if ((v = getenv("K3_GPU_EXPERT_SLOTS")) && *v) eo.gpu_expert_slots = atoi(v);
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

static int parse_int(const char *s, const char *flag, int lo, int *out) {
    k3_err err = {0};
    if (!k3_parse_int(s, flag, lo, 1 << 20, out, &err)) return 0;
    fprintf(stderr, "k3-lab bench-gpu: %s\n", err.msg);
    return K3_ERR_USAGE;
}

int k3_cmd_bench_gpu(int argc, char **argv) {
    const char *dir = NULL;
    int tokens = 32, warmup = 16, reps = 20, rc = 0;
    double gpu_gb = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--tokens") && has) rc = parse_int(argv[++i], a, 1, &tokens);
        else if (!strcmp(a, "--warmup") && has) rc = parse_int(argv[++i], a, 0, &warmup);
        else if (!strcmp(a, "--reps") && has) rc = parse_int(argv[++i], a, 1, &reps);
        else if (!strcmp(a, "--gpu-gb") && has) {
            k3_err err = {0};
            if (k3_parse_double(argv[++i], a, 0, 1e6, &gpu_gb, &err)) {
                fprintf(stderr, "k3-lab bench-gpu: %s\n", err.msg);
                rc = K3_ERR_USAGE;
            }
        }
        else if (a[0] != '-' && !dir) dir = a;
        else {
            fprintf(stderr, "k3-lab bench-gpu: unknown option or missing value: '%s'\n", a);
            rc = K3_ERR_USAGE;
        }
    }
    if (rc) return rc;
#ifdef K3_WITH_CUDA
    k3_err err = {0};
    k3_gpu_bench kb;
    /* lab switches: a lab command reads its own environment (the library reads none) */
    const char *pdl = getenv("K3_PDL"), *sched = getenv("K3_MX_SCHEDULE");
    k3_gpu_tuning t = {.no_pdl = pdl && pdl[0] == '0', .mx_schedule = sched ? atoi(sched) : 0,
                       .mx_scan = getenv("K3_MX_SCAN") != NULL,
                       .mx_sweep = getenv("K3_MX_SWEEP") != NULL,
                       .only_experts = getenv("K3_ONLY_EXPERTS") != NULL};
    k3_gpu_set_tuning(&t);
    rc = k3_gpu_bench_kernels(stdout, reps, &t, &kb, &err);
    if (!rc && dir) rc = bench_model(dir, warmup, tokens, gpu_gb, &kb, &err);
    if (rc) fprintf(stderr, "k3-lab bench-gpu: %s\n", err.msg);
    return rc;
#else
    (void)dir, (void)tokens, (void)warmup, (void)reps, (void)gpu_gb;
    fprintf(stderr, "k3-lab bench-gpu: this k3-lab was built without CUDA (rebuild with make "
            "CUDA=1)\n");
    return K3_ERR_DEVICE;
#endif
}
