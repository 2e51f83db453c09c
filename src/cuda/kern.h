/* kern.h — the CUDA kernels of the GPU backend (src/cuda/kernels.cu), as plain C launchers.
 *
 * Invariants (the CPU contract of src/kernels/kernels.h, carried to the device):
 *  - Activations are float32. BF16 weights are widened exactly (bits << 16); MXFP4 experts
 *    are decoded exactly (each E2M1 code is a BF16 times 2^-126, the group's E8M0 power of
 *    two applied to the group's sum, spec §10.4) and multiplied on the tensor cores with x
 *    split exactly into three BF16 parts (products exact, sums in f32); the int8 spine (NOT
 *    exact, opt-in) is q · row scale as on the CPU. No weight is ever converted to a lower
 *    precision and no activation is quantized.
 *  - Products and reductions are summed in a different (parallel) order than the CPU's
 *    ascending loop, so results differ from the scalar path by float32 rounding only.
 *    Element-wise recurrences that the CPU keeps exact on every path (the KDA delta rule,
 *    AttnRes and MoE weighted sums, the conv) run per element in the CPU's order with
 *    separate multiply and add (__fmul_rn / __fadd_rn, no FMA contraction), so they are
 *    bit-identical to the scalar path given identical inputs. The MLA attention value sum
 *    is the exception: it is split over position chunks (k3k_mla_attend) or splits
 *    (k3k_mla_latent_attend).
 *  - Every launcher enqueues on `stream`, never synchronizes, and returns the launch status
 *    (cudaGetLastError); a kernel never allocates. A kernel may start while the previous one
 *    on the stream finishes (programmatic dependent launch) but reads no activation and
 *    writes nothing before that one has completed (kernels.cu).
 *  - Device pointers only, except where a parameter says "host".
 */
#ifndef K3_CUDA_KERN_H
#define K3_CUDA_KERN_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Weight dtypes on the device (the same meaning as enum k3_dtype; mapped in gpu.c). */
enum { K3K_F32 = 0, K3K_BF16 = 1, K3K_I8 = 3 };

/* A dense weight matrix in device memory [rows, cols], row-major. I8 rows carry a float32
 * scale each (scale [rows]); otherwise scale is NULL. */
typedef struct k3k_mat {
    const void *data;
    const float *scale;
    int dtype;
    int64_t rows, cols;
} k3k_mat;

/* Most routed experts one MoE launch takes (K3 uses 16). */
#define K3K_MAX_EXPERTS 64
/* Most AttnRes values (closed blocks + the partial sum), as K3_MAX_RES_VALUES. */
#define K3K_MAX_RES 64

/* One launch's routed experts: slot base addresses in device memory, the tensors at fixed
 * offsets from each base (the expert cache's slot layout, gpu.c), each slot PREPARED by
 * k3k_experts_prepare (the kernels' own layout of the same bytes). Passed by value. Offsets
 * of every tensor and of the flag word (which has 16 bytes of room) 16-byte aligned, the six
 * tensors in the order above without overlap (the prepared layout fills w1p..w3s as one
 * region, w2p..w2s as another). */
typedef struct k3k_experts {
    int n;                                 /* experts, <= K3K_MAX_EXPERTS */
    int inter, latent;                     /* moe_intermediate_size, routed_expert_hidden_size,
                                            * multiples of 32 */
    uint64_t off_w1p, off_w1s, off_w3p, off_w3s, off_w2p, off_w2s; /* bytes from a base */
    uint64_t off_flag;                     /* a uint32 written by k3k_experts_prepare */
    const uint8_t *base[K3K_MAX_EXPERTS];
} k3k_experts;

/* y[rows] = W x (spec §2.3), x [cols]. */
cudaError_t k3k_matvec(const k3k_mat *w, const float *x, float *y, cudaStream_t stream);

/* Products of one input x with several matrices, y[i] = W[i] x for i < n <= K3K_MAX_MULTI
 * (KDA's six input projections, say), in one launch so the chip streams them back to back
 * with no tail between them; each row's sum is the one k3k_matvec gives with one warp per
 * row. Matrices of different cols or dtypes fall back to one launch each. */
#define K3K_MAX_MULTI 8
cudaError_t k3k_matvec_multi(const k3k_mat *const *w, float *const *y, int n, const float *x,
                             cudaStream_t stream);

/* Prepares one expert for the kernels below: src holds its tensors as in the checkpoint (w1,
 * w3 [inter, latent], w2 [latent, inter]: packed nibbles, low nibble the even column, and one
 * E8M0 byte per row and 32 columns) at ex's offsets; dst (a slot, same offsets, not src)
 * receives the same bytes re-laid out in mma fragment order (kernels.cu, mx_prepare_k), and
 * the flag word whether any scale byte is 0 or 255 (those experts take an exact but slower
 * scale decode). ex->n and ex->base are not used. */
cudaError_t k3k_experts_prepare(const k3k_experts *ex, const uint8_t *src, uint8_t *dst,
                                cudaStream_t stream);

/* The routed experts of one MoE layer, gate and up with SiTU (spec §8.1, §8.3):
 * h[j][r] = SiTU(W1_j z, W3_j z)[r] for j < ex->n, r < inter; z [latent], h [n][inter]. */
cudaError_t k3k_experts_gate_up(const k3k_experts *ex, const float *z, float beta,
                                float linear_beta, float *h, cudaStream_t stream);
/* Their down projections: out[j] = W2_j h[j], h [n][inter], out [n][latent].
 * Both: slots prepared by k3k_experts_prepare, z and h 8-byte aligned; cudaErrorInvalidValue
 * otherwise. One launch each, on the tensor cores (kernels.cu, "MXFP4 experts"). */
cudaError_t k3k_experts_down(const k3k_experts *ex, const float *h, float *out,
                             cudaStream_t stream);
/* Both take one of K3K_MX_SCHEDULES launch schedules (ring depth; with or without a copy
 * warp, whose layout k3k_experts_prepare picks): the fastest measured (0) unless
 * k3k_set_tuning picks another — for benchmark sweeps and tests; it must be the same at
 * preparation and launch. Results are the same function of
 * the inputs under every schedule (only the summation order differs). */
#define K3K_MX_SCHEDULES 6
/* Schedule i of the gate+up (gate_up != 0) or the down kernel: whether it has a copy warp, its
 * ring's stages and steps (8 · 1088 bytes each with a copy warp, else 1088 bytes per warp) a
 * stage, and whether it decodes the weights the earlier way (11 instead of 8 instructions per
 * 8 weights, but plain shifts instead of funnel shifts). */
/* Lab switches, process-wide (set them before any launch; not for product use): pdl 0
 * launches kernels without programmatic dependent launch (for comparison); mx_schedule picks
 * the MXFP4 experts' schedule (0 <= i < K3K_MX_SCHEDULES, else 0). Defaults: 1, 0. */
void k3k_set_tuning(int pdl, int mx_schedule);
void k3k_mx_schedule(int i, int gate_up, int *copy_warp, int *stages, int *steps,
                     int *legacy_decode);

/* y[n] = w ⊙ (x / sqrt(mean(x²) + eps)) (spec §4); w [n] BF16 or F32 (wdtype), or NULL for
 * no weight. y may alias x. n >= 1. */
cudaError_t k3k_rmsnorm(const float *x, const void *w, int wdtype, int n, float eps, float *y,
                        cudaStream_t stream);

/* AttnRes mix (spec §5) over values[0..n) (each [hidden], device pointers; n <= K3K_MAX_RES):
 * out = Σ_j softmax_j(score_j) · values[j], score_j = Σ_i (v_j[i] · r_j) · sw[i],
 * r_j = 1 / sqrt(mean(v_j²) + eps). scores [K3K_MAX_RES] is device scratch. out must not
 * alias a value. */
cudaError_t k3k_attn_res(const float *const *values, int n, const float *sw, int hidden,
                         float eps, float *scores, float *out, cudaStream_t stream);

/* y[i] = a[i] + b[i] (y may alias a or b). */
cudaError_t k3k_add(const float *a, const float *b, float *y, int n, cudaStream_t stream);
/* out[i] = SiTU(gate[i], up[i]) (spec §8.1); out may alias gate. */
cudaError_t k3k_situ(const float *gate, const float *up, int n, float beta, float linear_beta,
                     float *out, cudaStream_t stream);
/* x[i] = x[i] · σ(g[i]) (the MLA output gate, spec §7.4). */
cudaError_t k3k_sigmoid_gate(float *x, const float *g, int n, cudaStream_t stream);

/* KDA causal depthwise conv + SiLU for one of q/k/v (spec §6.2): x [P] in place; taps
 * [P][conv] F32; hist [P][conv-1] the last raw inputs per channel, oldest first (updated). */
cudaError_t k3k_short_conv(float *x, const float *taps, float *hist, int P, int conv,
                           cudaStream_t stream);

/* KDA per-head core (spec §6.3-§6.7), one block per head: L2-normalises q (× D^-½) and k,
 * the decay gate α from f, dt_bias and A_log[h], β = σ(b[h]), the delta rule on S
 * [H][D][D] (updated in place), then the gated RMSNorm with o_norm [D] F32 and g.
 * q, k, v, f, g, o are [H·D]; q and k are normalised in place; o is written. D <= 1024. */
cudaError_t k3k_kda_heads(float *q, float *k, const float *v, const float *f, const float *b,
                          const float *g, const float *a_log, const float *dt_bias,
                          const float *o_norm, float *S, int H, int D, float lower_bound,
                          float eps, float *o, cudaStream_t stream);

/* MLA: appends position t to one layer's expanded KV cache (spec §7.5): kv [max_ctx][kvf]
 * with kvf = H·nope + rope + H·vd; KV [H][nope + vd] from kv_b_proj, ckv [lora + rope]. */
cudaError_t k3k_mla_append(float *kv, int t, const float *KV, const float *ckv, int H, int nope,
                           int rope, int vd, int lora, cudaStream_t stream);
/* MLA attention of Q [H][nope + rope] over positions 0..t of kv (layout above): softmax of
 * (q_nope·k_nope + q_pe·k_pe) / sqrt(nope + rope), o [H][vd] = Σ_j p_j v_j. Positions are
 * split into chunks of K3K_ATT_CHUNK, one block per (head, chunk), each chunk's softmax
 * rescaled to the global maximum when merged (flash-decoding); so unlike the CPU's single
 * ascending sum this differs from the scalar path by rounding. scratch holds at least
 * k3k_mla_scratch_floats(H, vd, t + 1) floats. vd <= 256. */
#define K3K_ATT_CHUNK 256
#define k3k_mla_scratch_floats(H, vd, n) \
    ((size_t)(H) * (((size_t)(n) + K3K_ATT_CHUNK - 1) / K3K_ATT_CHUNK) * ((size_t)(vd) + 2))
cudaError_t k3k_mla_attend(const float *Q, const float *kv, int t, int H, int nope, int rope,
                           int vd, float *scratch, float *o, cudaStream_t stream);

/* The latent attention's scratch: at most K3K_LAT_SPLITS position splits per head, each
 * m, l and lora partial sums, whatever the context (12.6 MB at K3's 96 heads, lora 512). */
#define K3K_LAT_SPLITS 64
#define k3k_mla_latent_scratch_floats(H, lora) \
    ((size_t)(H) * K3K_LAT_SPLITS * ((size_t)(lora) + 2))

/* MLA attention of Q [H][nope + rope] over the LATENT rows lat [0..t][lora + rope] (one layer,
 * c_j ++ k_pe_j, state.h) in the absorbed form (spec §7.5, src/model/mla.c): qa [H][lora + rope]
 * = W_ukᵀ q_nope ++ q_pe, softmax over qa·lat_j / sqrt(nope + rope) flash-decoded in at most
 * K3K_LAT_SPLITS position splits (each read once per group of 16 heads, online softmax within
 * a split), acc [H][lora] = Σ_j p_j c_j, o [H][vd] = W_uv acc; W_uk and W_uv are head h's
 * rows h·(nope + vd) .. of kv_b [H·(nope + vd)][lora] (F32, BF16 or I8). Differs from the CPU
 * by float32 rounding (other summation order); the order depends on t only. scratch:
 * k3k_mla_latent_scratch_floats(H, lora) floats. cudaErrorInvalidValue when kv_b's shape or
 * dtype does not fit. */
cudaError_t k3k_mla_latent_attend(const float *Q, const k3k_mat *kv_b, const float *lat, int t,
                                  int H, int nope, int rope, int vd, int lora, float *qa,
                                  float *acc, float *scratch, float *o, cudaStream_t stream);

/* The LatentMoE router on device (spec §8.3 steps 2-5): logits [E] (router matvec output)
 * → σ, + bias [E] F32 for selection, top-k in canonical order (descending biased score, ties
 * to the lower id) into ids [k], weights [k] = renormalised unbiased scores × scaling.
 * A NaN or -Inf biased score ranks as -FLT_MAX (last, ties to the lower id), as on the CPU
 * (k3_moe_select): the k ids are always distinct and valid; a NaN score gives NaN weights.
 * E <= 8192, k <= K3K_MAX_EXPERTS. */
cudaError_t k3k_router_topk(const float *logits, const float *bias, int E, int k,
                            float scaling, int *ids, float *weights, cudaStream_t stream);

/* The weighted sum of the experts' outputs in slot order (spec §8.3):
 * acc[i] = Σ_j eo[j][i] · w[j], eo [k][n], w [k] (device). */
cudaError_t k3k_moe_sum(const float *eo, const float *w, int k, int n, float *acc,
                        cudaStream_t stream);

/* Benchmarks and tests: fills bytes (a multiple of 4) with pseudo-random 32-bit words from
 * seed, each ANDed with mask (e.g. 0xbfffbfff keeps BF16 values finite). */
cudaError_t k3k_fill_random(void *p, size_t bytes, uint64_t seed, uint32_t mask,
                            cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
