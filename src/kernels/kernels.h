/* kernels.h — the math primitives the forward pass is built from, behind one dispatch table.
 *
 * Invariants (spec §2):
 *  - Weights stay in their checkpoint dtype; BF16 is widened exactly (bits << 16) and MXFP4 is
 *    decoded exactly (§10.4) inside the kernels, a few registers (or one small L1 tile in a
 *    batched product) at a time. No f32 copy of a weight matrix is ever made.
 *  - Kernel paths: "scalar" (the reference), "avx2" (x86-64 AVX2+FMA), "avx512" (AVX-512F)
 *    and "neon" (aarch64). One binary holds every path of its architecture; k3_kernels_select
 *    picks one at engine load (k3_engine_opts.kernels forces it) and the model keeps the pointer.
 *  - Scalar order: every dot product sums i = 0..n-1 ascending into one f32 accumulator with
 *    separate multiply and add (-ffp-contract=off). A SIMD path sums lane-wise with FMA (lane
 *    l takes columns l, l+W, ...; a zero-padded last vector takes the tail) and then adds the
 *    lanes in a fixed order, so it differs from scalar by rounding only (tests/test_simd.c
 *    states the bound). The x86 MXFP4 products instead sum each 32-block's E2M1·x into a
 *    partial and add partial·scale once per block (exact: the scale is a power of two), except
 *    for E8M0 253..255 where the reference's dequantized weights overflow; their lanes need not
 *    take consecutive columns (cpu_avx2.c, cpu_avx512.c). On every path a row's result
 *    depends only on that row and its input vector: not on the thread count, not on the rows
 *    computed beside it, and not on the batch size — row b of k3_matmul equals k3_matvec of
 *    x[b] bit for bit. The batched products (BF16 / F32 from 6 vectors, MXFP4 from 8) are
 *    register-blocked GEMM micro-kernels (simd_gemm.h; MXFP4: simd_mxgemm.h's tiling around
 *    cpu_avx2.c's / cpu_avx512.c's micro-kernels) that keep exactly this sequence per output —
 *    one W-lane accumulator along k, FMA per step (MXFP4: a multiply then FMAs per 32-block
 *    partial, one FMA by the block scale), the zero-padded last step, the fixed lane sum — and
 *    only choose which outputs run side by side in registers.
 *  - Threads split work by output row only (OpenMP, inside k3_matvec / k3_matmul; with
 *    k3_matmul_rows the caller splits the rows among its own threads).
 *  - The element-wise helpers (k3_axpy, k3_kda_delta_rule) use separate multiply and add on
 *    every path and keep the scalar order per element, so they are exact on every path.
 *  - Divisions stay divisions (mean, SiTU's /25, SiLU) as in the PyTorch CPU reference.
 */
#ifndef K3_KERNELS_H
#define K3_KERNELS_H

#include <stdint.h>
#include <string.h>

#include "../util/bf16lx.h"
#include "../util/err.h"

/* One CPU path's kernels (src/kernels/dispatch.h); read-only, chosen once at engine load.
 * Every function below that takes `kr` also accepts NULL, meaning the scalar path (a model
 * bound outside the engine). */
typedef struct k3_kernels k3_kernels;

/* The path called name ("scalar", "avx2", "avx512", "neon"), or NULL when it is not compiled
 * into this binary or this CPU cannot run it. */
const k3_kernels *k3_kernels_get(const char *name);
/* The fastest path this CPU runs (never NULL: scalar runs everywhere). */
const k3_kernels *k3_kernels_best(void);
/* name if non-NULL and non-empty, else the best path.
 * Errors: K3_ERR_USAGE when the requested path is unknown or this CPU cannot run it (the
 * message lists the paths it can). */
int k3_kernels_select(const char *name, const k3_kernels **out, k3_err *err);
const char *k3_kernels_name(const k3_kernels *k);
/* Fills out[0..] with every path this CPU runs, fastest first; returns how many (<= cap). */
int k3_kernels_available(const k3_kernels **out, int cap);
/* Physical cores this process may run on (affinity mask, SMT siblings counted once): the
 * default thread count. At least 1. */
int k3_cpu_physical_cores(void);

/* A dense weight matrix [rows, cols], row-major, BF16, F32, I8 or BF16LX (enum k3_dtype).
 * Vectors (norm weights, biases) are matrices with rows = 1. I8 (the packed int8 spine, not
 * exact) carries one f32 scale per row: W[r][i] ≈ scale[r] · q[r][i]. BF16LX (the lossless
 * spine, exact) is the BF16 matrix re-encoded in 12 bits per weight plus escapes: data holds
 * rows × k3_lx_row_bytes(cols) bytes of groups, esc the escape index and list, xtab the
 * code table (layout below, "lossless BF16"). */
typedef struct k3_mat {
    const void *data;
    int dtype;
    int64_t rows, cols;
    const float *scale;  /* [rows], K3_DT_I8 only; NULL otherwise */
    const uint32_t *esc; /* K3_DT_BF16LX: [rows + 1] row starts, then [n_esc] escapes */
    uint32_t n_esc;      /* K3_DT_BF16LX: escapes in the list */
    uint8_t xtab[16];    /* K3_DT_BF16LX: the high byte each 4-bit code stands for (15: escape) */
} k3_mat;

/* An MXFP4 matrix [rows, cols] (compressed-tensors mxfp4-pack-quantized, spec §10.4):
 * packed [rows, cols/2] (even column in the low nibble), scale [rows, cols/32] (E8M0). */
typedef struct k3_mxfp4 {
    const uint8_t *packed;
    const uint8_t *scale;
    int64_t rows, cols;
} k3_mxfp4;

static inline float k3_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* E8M0 scale 2^(s-127) built from bits: s = 0 is the subnormal 2^-127, s = 255 is NaN. */
static inline float k3_e8m0_to_f32(uint8_t s) {
    uint32_t u = s == 0 ? 0x00400000u : s == 255 ? 0x7fc00000u : (uint32_t)s << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* E2M1 code (0..15: bit 3 sign, bits 2..1 exponent, bit 0 mantissa) times an E8M0 scale. */
float k3_mxfp4_value(uint8_t code, uint8_t scale);

/* Element i of a BF16/F32 matrix viewed as a flat vector. */
float k3_mat_at(const k3_mat *m, int64_t i);

/* y[rows] = W x, x[cols]. Spec §2.3 (I8: see k3_rows_i8). */
void k3_matvec(const k3_kernels *kr, const k3_mat *w, const float *x, float *y);
/* Batched product for n input vectors (prefill): y[b][rows] = W x[b] for b < n, x [n][cols]
 * and y [n][rows] row-major. W is streamed from memory once per 64 vectors. n >= 1. */
void k3_matmul(const k3_kernels *kr, const k3_mat *w, const float *x, int n, float *y);
/* Rows [r0, r1) of k3_matmul's y (y [n][rows]; the other rows are not written), on the
 * calling thread alone: for a caller that splits one product's rows among the threads of its
 * own parallel region (no fork per product). Each row's bits are k3_matmul's. BF16 / F32 /
 * I8 / BF16LX as k3_matmul; 0 <= r0 <= r1 <= rows. */
void k3_matmul_rows(const k3_kernels *kr, const k3_mat *w, const float *x, int n, float *y,
                    int64_t r0, int64_t r1);
/* y[b][c] = Σ_{i<k} x[b][i]·w[i][c] for b < n and columns c0 <= c < c1, on the calling
 * thread: the F32 product whose matrix has its rows along the sum (x·W: w [k][ldw], x
 * [n][ldx], y [n][ldy], row-major with those strides; y's other columns are not written).
 * Every output is one accumulator over i ascending from 0: the scalar path multiplies then
 * adds, a SIMD path fuses them (FMA) with its lanes along c (not along i, as k3_matmul's), so
 * on a path an output's bits depend on neither the column range nor the rows beside it, and
 * SIMD and scalar differ by rounding only. MLA's Σ_j p_j c_j over a cache tile as it is
 * stored (spec §7.5). k >= 0, n >= 1, 0 <= c0 <= c1 <= ldw and ldy. */
void k3_matmul_xw(const k3_kernels *kr, const float *w, int64_t ldw, int64_t k, const float *x,
                  int64_t ldx, int n, float *y, int64_t ldy, int64_t c0, int64_t c1);
/* y[rows] = W x for an MXFP4 matrix with fused exact decode (the table of the 16 E2M1 codes
 * times the block's E8M0 scale). cols is a multiple of 32. Spec §10.4. */
void k3_matvec_mxfp4(const k3_kernels *kr, const k3_mxfp4 *w, const float *x, float *y);
/* The batched form of k3_matvec_mxfp4, shapes as k3_matmul. */
void k3_matmul_mxfp4(const k3_kernels *kr, const k3_mxfp4 *w, const float *x, int n, float *y);
/* y[j] = W_j x[j] for count MXFP4 matrices (a MoE layer's experts) in ONE parallel region:
 * the rows of all matrices are split across the threads together, so count small products
 * cost one fork/join and every thread streams long runs. Each y[j] equals k3_matvec_mxfp4 of
 * W_j and x[j] bit for bit. x[j] may be shared (the same latent vector for every w1 / w3). */
void k3_matvec_mxfp4_many(const k3_kernels *kr, int count, const k3_mxfp4 *w,
                          const float *const *x, float *const *y);

/* The instruction mixes of the batched products' micro-kernels, for `k3-lab bench kernels`:
 * each runs from registers and L1 only, so its rate is the peak the product's inner loop can
 * reach on this core. K3_MIX_FMA: independent FMA chains (the core's multiply-add peak);
 * K3_MIX_GEMM_BF16: the BF16 / F32 batched product's micro-kernel (simd_gemm.h);
 * K3_MIX_GEMM_MXFP4: the MXFP4 batched product's. */
enum k3_mix { K3_MIX_FMA, K3_MIX_GEMM_BF16, K3_MIX_GEMM_MXFP4 };
/* Runs mix `which` of path kr `reps` times on the calling thread; returns the f32
 * multiply-adds it did (a product's MACs, not counting a per-block scale FMA), or 0 when the
 * path has no such loop (scalar). reps >= 1. */
int64_t k3_kernels_mix(const k3_kernels *kr, int which, int64_t reps);

/* Σ_i a[i]·b[i] for i < n (one thread; SIMD paths reorder the sum as described above). */
float k3_dot(const k3_kernels *kr, const float *a, const float *b, int64_t n);
/* y[i] = y[i] + a·x[i] for i < n (exact: the same result on every path). */
void k3_axpy(const k3_kernels *kr, float a, const float *x, float *y, int64_t n);
/* KDA delta rule for one head (spec §6.6, fla's naive order), exact on every path:
 * S [d key][d value] ← diag(alpha)·S; δ = v − Sᵀk; S ← S + (beta·k) δᵀ; o = Sᵀq with the
 * updated S. q, k, v, alpha [d]; u [d] is scratch (left holding δ); o [d] is written. */
void k3_kda_delta_rule(const k3_kernels *kr, float *S, const float *q, const float *k,
                       const float *v, const float *alpha, float beta, int d, float *u,
                       float *o);

/* The exponentials of one row's online-softmax step (flash attention; spec §7.3's softmax),
 * the same bits on every path: with t_j = s[j]·scale and m' = max(*m, max_j t_j) (written back
 * to *m; *m = -INFINITY before a row's first step), p[j] = k3_exp(t_j − m') for j < n, and the
 * return value is Σ_j p[j]. The max and the sum take element j in lane j % 16 (ascending j)
 * and then fold the 16 lanes in a fixed order (src/kernels/dispatch.h), so the SIMD paths
 * give the scalar path's bits. n >= 1; p [n] may not alias s. */
float k3_softmax_exp(const k3_kernels *kr, const float *s, int64_t n, float scale, float *m,
                     float *p);
/* e^x for x <= 0 by the polynomial k3_softmax_exp evaluates (Cephes' expf, separate multiply
 * and add: the same bits on every path): within 2 ulp of e^x on [-87.3, 0]; 2^-126 below
 * about -87.34 rather than a subnormal or 0; NaN for NaN. Not for x > 0. */
float k3_exp(float x);

/* y[n] = w ⊙ (x · 1/sqrt(Σx²/n + eps)); w may be NULL (no weight). y may alias x. Spec §4. */
void k3_rmsnorm(const float *x, const k3_mat *w, int n, float eps, float *y);

float k3_sigmoid(float x);
/* x / (1 + e^-x): ATen's CPU SiLU divides (spec §2.6). */
float k3_silu(float x);
/* SiTU-GLU (spec §8.1): (β·tanh(g/β)) · σ(g) · (β₂·tanh(u/β₂)), in that order. */
float k3_situ(float g, float u, float beta, float linear_beta);

/* KDA lower-bound decay gate for one (head, channel) (spec §6.4):
 * α = exp(lower_bound · σ(exp(a_log) · (f + dt_bias))), in that order; a_log is the head's
 * A_log[h] (per head), f and dt_bias the channel's. With lower_bound = -5, α ∈ (e⁻⁵, 1]. */
float k3_kda_gate(float f, float dt_bias, float a_log, float lower_bound);

/* out[i] = SiTU(gate[i], up[i]) for i < n; out may alias gate. */
void k3_situ_vec(const float *gate, const float *up, int n, float beta, float linear_beta,
                 float *out);

/* ---- lossless BF16 (src/kernels/lossless.c; exact: k3 pack --lossless, issue 33) -------- *
 *
 * A BF16 weight is its high byte (sign, exponent bits 7..1) and its low byte (exponent bit 0,
 * mantissa). The high byte takes few values in a trained matrix, so each matrix has a table of
 * the 15 most frequent (xtab[0..14]) and stores per weight the low byte and a 4-bit code:
 * xtab's index, or 15 (an escape) with the high byte in the escape list. Decoding gives the
 * BF16 bits exactly, and every kernel path widens them as it widens BF16 and runs the BF16
 * lane recipe unchanged, so every product is bit-identical to the BF16 matrix's on the same
 * path (same thread count irrelevant, as above).
 *
 * Layout: each row is ceil(cols / 32) groups of K3_LX_GROUP_BYTES bytes (the last group of a
 * row zero-padded past cols). In a group, weight k (column 32g + k) sits at position
 * p = k3_lx_pos(k) = 16·((k >> 2) & 1) + 4·(k >> 3) + (k & 3); bytes 0..15 hold the codes
 * (byte j: low nibble position j, high nibble position 16 + j), bytes 16..47 the low bytes by
 * position. The position order puts, after one in-lane byte shuffle and two in-lane
 * interleaves (AVX2 vpshufb / vpunpck; NEON tbl / zip), every 8 consecutive columns in one
 * register in column order. esc[r] .. esc[r + 1] - 1 index row r's escapes in esc[rows + 1 +
 * i], each (column << 8) | high byte, in ascending column. Kernels clamp the index to n_esc,
 * so a corrupt payload gives wrong numbers (k3 pack --verify finds it) but never a read
 * outside the matrix. The constants, the table rule and the encoder are src/util/bf16lx.h's
 * (the packer in src/format lays files out with them). */
/* Decodes row r of a K3_DT_BF16LX matrix into out[cols] (BF16 bits): the reference decoder
 * (k3 pack's self-check, tests, k3_mat_at). */
void k3_lx_decode_row(const k3_mat *m, int64_t r, uint16_t *out);

/* ---- int8 spine (src/kernels/int8.c; NOT exact, opt-in via `k3 pack`) ----------------- */

/* Quantizes one BF16 row of n values to int8, symmetric absmax, one scale per row:
 * scale = f32(absmax / 127); q[i] = round-half-to-even(f32(w[i] / scale)) clamped to ±127.
 * An all-zero row gets scale 0 and q = 0. Returns the scale, or NaN when the row holds a
 * non-finite value (q is then unspecified; the caller refuses the tensor). */
float k3_quantize_row_i8(const uint16_t *w_bf16, int64_t n, int8_t *q);

/* y[r] = (Σ_i f32(q[r][i]) · x[i]) · scale[r] for rows r0 <= r < r1 of an I8 matrix: the sum
 * in ascending i into one f32 accumulator, then one multiply by the row scale. */
void k3_rows_i8(const k3_mat *w, const float *x, float *y, int64_t r0, int64_t r1);
#if defined(__x86_64__)
/* The same with AVX2 + FMA (the CPU must have them): lane-wise sums, then the lanes in a fixed
 * order, then the cols % 16 tail in ascending order; differs from k3_rows_i8 by rounding only. */
void k3_rows_i8_avx2(const k3_mat *w, const float *x, float *y, int64_t r0, int64_t r1);
#endif

/* ---- --approx (K3_APPROX=1): int8 activations too (NOT exact; needs the int8 spine) ------ */

/* Activations are quantized in blocks of K3_Q8_BLOCK consecutive values (the last block may be
 * shorter): s_b = f32(absmax / 127), q = round-half-to-even(x / s_b) clamped to ±127; an
 * all-zero block gets s_b = 0, a block holding NaN/Inf gets s_b = NaN. */
#define K3_Q8_BLOCK 32
void k3_quantize_act_q8(const float *x, int64_t n, int8_t *q, float *scale);

/* y[r] = (Σ_b f32(Σ_{i in b} q[r][i]·xq[i]) · s_b) · scale[r] for rows r0 <= r < r1 of a
 * K3_DT_I8_Q8 matrix, x quantized as above: each block's integer sum is exact, blocks are added
 * in ascending order in one f32 accumulator. x's int8 copy is on the stack, so a matrix wider
 * than K3_Q8_MAX_COLS is multiplied as plain K3_DT_I8 instead. */
#define K3_Q8_MAX_COLS (1 << 17)
void k3_rows_i8_q8(const k3_mat *w, const float *x, float *y, int64_t r0, int64_t r1);
#if defined(__x86_64__)
/* The same with AVX2 (maddubs): the block sums are the same integers, the blocks are added
 * lane-wise with FMA, so it differs from k3_rows_i8_q8 by rounding only. */
void k3_rows_i8_q8_avx2(const k3_mat *w, const float *x, float *y, int64_t r0, int64_t r1);
#endif

#endif
