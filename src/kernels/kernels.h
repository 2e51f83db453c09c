/* kernels.h — the math primitives the forward pass is built from (scalar reference path).
 *
 * Invariants (spec §2):
 *  - Weights stay in their checkpoint dtype; BF16 is widened exactly (bits << 16) and MXFP4 is
 *    decoded exactly (§10.4) inside the kernels. No f32 copy of a weight matrix is made.
 *  - Canonical reduction order: every dot product sums i = 0..n-1 ascending into one f32
 *    accumulator with separate multiply and add (the build uses -ffp-contract=off).
 *    Threads split work by output row only, so results do not depend on the thread count.
 *  - Divisions stay divisions (mean, SiTU's /25, SiLU) as in the PyTorch CPU reference.
 */
#ifndef K3_KERNELS_H
#define K3_KERNELS_H

#include <stdint.h>
#include <string.h>

/* A dense weight matrix [rows, cols], row-major, BF16, F32 or I8 (enum k3_dtype). Vectors
 * (norm weights, biases) are matrices with rows = 1. I8 (the packed int8 spine, not exact)
 * carries one f32 scale per row: W[r][i] ≈ scale[r] · q[r][i]. */
typedef struct k3_mat {
    const void *data;
    int dtype;
    int64_t rows, cols;
    const float *scale; /* [rows], K3_DT_I8 only; NULL otherwise */
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
void k3_matvec(const k3_mat *w, const float *x, float *y);
/* y[rows] = W x for an MXFP4 matrix with fused exact decode. Spec §10.4. */
void k3_matvec_mxfp4(const k3_mxfp4 *w, const float *x, float *y);

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

/* ---- int8 spine (src/kernels/int8.c; NOT exact, opt-in via `k3 pack`) ----------------- */

/* Quantizes one BF16 row of n values to int8, symmetric absmax, one scale per row:
 * scale = f32(absmax / 127); q[i] = round-half-to-even(f32(w[i] / scale)) clamped to ±127.
 * An all-zero row gets scale 0 and q = 0. Returns the scale, or NaN when the row holds a
 * non-finite value (q is then unspecified; the caller refuses the tensor). */
float k3_quantize_row_i8(const uint16_t *w_bf16, int64_t n, int8_t *q);

/* y[r] = (Σ_i f32(q[r][i]) · x[i]) · scale[r] for rows r0 <= r < r1 of an I8 matrix: the sum
 * in ascending i into one f32 accumulator, then one multiply by the row scale. */
void k3_rows_i8(const k3_mat *w, const float *x, float *y, int64_t r0, int64_t r1);

#endif
