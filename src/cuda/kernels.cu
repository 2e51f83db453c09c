// kernels.cu — the CUDA kernels behind kern.h (read that header's invariants first).
//
// Decode-shape products are memory-bound: a BF16 row is read once, 16 bytes per lane per
// load, four loads in flight, one warp (or, for short matrices, several) per row. The MXFP4
// experts run on the tensor cores with exact BF16 operands (weights decoded in registers from
// a layout prepared once per expert, x split into three BF16 parts; see "MXFP4 experts"
// below), because decoding 4-bit weights for f32 FMAs costs more instructions than the memory
// system leaves time for. Measured speeds and what limits them: BENCHMARKS.md.
#include "kern.h"

#include <cuda_bf16.h>
#include <float.h>
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

namespace {

constexpr unsigned FULL = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32); red is __shared__ float[32]. Every
// thread gets the result. Fixed order, so deterministic.
__device__ float block_sum(float v, float *red) {
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads(); // red may still be read by a previous call
    if (lane == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        float t = lane < nw ? red[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) red[0] = t;
    }
    __syncthreads();
    return red[0];
}

__device__ float block_max(float v, float *red) {
    v = warp_max(v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        float t = lane < nw ? red[lane] : -INFINITY;
        t = warp_max(t);
        if (lane == 0) red[0] = t;
    }
    __syncthreads();
    return red[0];
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// SiTU-GLU (spec §8.1), in the CPU's order: (β·tanh(g/β)) · σ(g) · (β₂·tanh(u/β₂)).
__device__ __forceinline__ float situf(float g, float u, float beta, float lb) {
    float a = __fmul_rn(beta, tanhf(__fdiv_rn(g, beta)));
    a = __fmul_rn(a, sigmoidf_(g));
    return __fmul_rn(a, __fmul_rn(lb, tanhf(__fdiv_rn(u, lb))));
}

__device__ __forceinline__ float e8m0f(uint32_t s) {
    uint32_t u = s == 0 ? 0x00400000u : s == 255 ? 0x7fc00000u : s << 23;
    return __uint_as_float(u);
}

inline int blocks_for(int64_t n, int threads) { return (int)((n + threads - 1) / threads); }

// ---- programmatic dependent launch (sm_90) ----------------------------------------------
//
// Decode is a chain of short kernels on one stream; each would otherwise pay its launch, its
// first loads' latency and the previous kernel's tail in series. So every kernel lets the next
// one launch early (pdl_trigger, at its start: the next grid's blocks still take SM room only
// as this grid's blocks leave it), and every kernel of the decode is launched with
// programmatic stream serialization (launch_pdl) and calls pdl_wait — which returns once every
// earlier grid has completed and its writes are visible — before it reads an activation or
// writes anything. The products (matvec*, experts) first start streaming their WEIGHTS (never
// written by the kernels before them); the small kernels wait at once, which still hides their
// launch. A kernel launched this way without a pdl_wait would race with its predecessor.
// k3k_set_tuning(0, ...) launches them plainly (for comparison in benchmarks).
__device__ __forceinline__ void pdl_trigger() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// The lab switches of k3k_set_tuning (kern.h): process-wide, set before any launch.
static int tuning_pdl = 1, tuning_mx_schedule = 0;
bool pdl_on() { return tuning_pdl != 0; }

template <typename... P, typename... A>
cudaError_t launch_pdl(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                       A &&...args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = pdl_on() ? 1 : 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cfg.attrs = at, cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, k, static_cast<A &&>(args)...);
}

// ---- dense products -------------------------------------------------------------------

constexpr int MV_THREADS = 256; // 8 warps, one row each

// 16 bytes of weights (8 BF16, 16 int8 or 4 f32) times the matching x, added to acc.
template <int DT>
__device__ __forceinline__ float dot16(uint4 w, const float4 *__restrict__ x4, float acc) {
    const uint32_t ww[4] = {w.x, w.y, w.z, w.w};
    if (DT == K3K_BF16) {
        const float4 a = __ldg(x4), b = __ldg(x4 + 1);
        acc = fmaf(__uint_as_float(ww[0] << 16), a.x, acc);
        acc = fmaf(__uint_as_float(ww[0] & 0xffff0000u), a.y, acc);
        acc = fmaf(__uint_as_float(ww[1] << 16), a.z, acc);
        acc = fmaf(__uint_as_float(ww[1] & 0xffff0000u), a.w, acc);
        acc = fmaf(__uint_as_float(ww[2] << 16), b.x, acc);
        acc = fmaf(__uint_as_float(ww[2] & 0xffff0000u), b.y, acc);
        acc = fmaf(__uint_as_float(ww[3] << 16), b.z, acc);
        acc = fmaf(__uint_as_float(ww[3] & 0xffff0000u), b.w, acc);
    } else if (DT == K3K_I8) {
        // (q + 128) placed in the low byte of 2^23 is exact; subtracting 2^23 + 128 gives q.
        float part[4];
#pragma unroll
        for (int q = 0; q < 4; q++) { /* four independent chains, then added in order */
            const uint32_t u = ww[q] ^ 0x80808080u;
            const float4 a = __ldg(x4 + q);
            float t = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7540)) - 8388736.0f;
            t = t * a.x;
            t = fmaf(__uint_as_float(__byte_perm(u, 0x4b000000u, 0x7541)) - 8388736.0f, a.y, t);
            t = fmaf(__uint_as_float(__byte_perm(u, 0x4b000000u, 0x7542)) - 8388736.0f, a.z, t);
            part[q] = fmaf(__uint_as_float(__byte_perm(u, 0x4b000000u, 0x7543)) - 8388736.0f, a.w, t);
        }
        acc += (part[0] + part[1]) + (part[2] + part[3]);
    } else {
        const float4 a = __ldg(x4);
        acc = fmaf(__uint_as_float(ww[0]), a.x, acc);
        acc = fmaf(__uint_as_float(ww[1]), a.y, acc);
        acc = fmaf(__uint_as_float(ww[2]), a.z, acc);
        acc = fmaf(__uint_as_float(ww[3]), a.w, acc);
    }
    return acc;
}

// Rows 16-byte aligned (cols · element size a multiple of 16, W and x aligned). S warps share
// a row (S in 1, 2, 4, 8), each taking every S-th 32-chunk stripe, so that short matrices
// still fill the chip and long ones end in a short tail; their sums are added in warp order.
template <int DT, int S>
__global__ void __launch_bounds__(MV_THREADS)
matvec_vec(const uint8_t *__restrict__ W, const float *__restrict__ scale, int64_t rows,
           int64_t cols, const float *__restrict__ x, float *__restrict__ y) {
    constexpr int EPV = DT == K3K_BF16 ? 8 : DT == K3K_I8 ? 16 : 4; // elements per 16 bytes
    constexpr int ES = DT == K3K_BF16 ? 2 : DT == K3K_I8 ? 1 : 4;
    constexpr int XPV = EPV / 4;                                    // float4s of x per load
    constexpr int RPB = MV_THREADS / 32 / S;                        // rows per block
    __shared__ float red[MV_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % S;
    const int64_t r = (int64_t)blockIdx.x * RPB + warp / S;
    float acc0 = 0.0f, acc1 = 0.0f;
    pdl_trigger();
    const int64_t nv = cols / EPV;
    const uint4 *row = reinterpret_cast<const uint4 *>(W + (r < rows ? r : 0) * cols * ES);
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    int64_t c = part * 32 + lane;
    // the first four loads are issued before x may be read (programmatic dependent launch)
    const bool pre = r < rows && c + 96 * S < nv;
    uint4 p0 = {}, p1 = {}, p2 = {}, p3 = {};
    if (pre)
        p0 = __ldcs(row + c), p1 = __ldcs(row + c + 32 * S), p2 = __ldcs(row + c + 64 * S),
        p3 = __ldcs(row + c + 96 * S);
    pdl_wait();
    if (pre) {
        acc0 = dot16<DT>(p0, x4 + c * XPV, acc0);
        acc1 = dot16<DT>(p1, x4 + (c + 32 * S) * XPV, acc1);
        acc0 = dot16<DT>(p2, x4 + (c + 64 * S) * XPV, acc0);
        acc1 = dot16<DT>(p3, x4 + (c + 96 * S) * XPV, acc1);
        c += 128 * S;
    }
    if (r < rows) {
        for (; c + 96 * S < nv; c += 128 * S) { // four independent 16-byte loads in flight
            const uint4 w0 = __ldcs(row + c), w1 = __ldcs(row + c + 32 * S);
            const uint4 w2 = __ldcs(row + c + 64 * S), w3 = __ldcs(row + c + 96 * S);
            acc0 = dot16<DT>(w0, x4 + c * XPV, acc0);
            acc1 = dot16<DT>(w1, x4 + (c + 32 * S) * XPV, acc1);
            acc0 = dot16<DT>(w2, x4 + (c + 64 * S) * XPV, acc0);
            acc1 = dot16<DT>(w3, x4 + (c + 96 * S) * XPV, acc1);
        }
        for (; c < nv; c += 32 * S) acc0 = dot16<DT>(__ldcs(row + c), x4 + c * XPV, acc0);
    }
    const float acc = warp_sum(acc0 + acc1);
    if (S == 1) {
        if (lane == 0 && r < rows) y[r] = DT == K3K_I8 ? acc * scale[r] : acc;
        return;
    }
    if (lane == 0) red[warp] = acc;
    __syncthreads();
    if (threadIdx.x < RPB) {
        const int64_t rr = (int64_t)blockIdx.x * RPB + threadIdx.x;
        if (rr < rows) {
            float t = 0.0f;
            for (int p = 0; p < S; p++) t += red[threadIdx.x * S + p];
            y[rr] = DT == K3K_I8 ? t * scale[rr] : t;
        }
    }
}

template <int DT>
__device__ __forceinline__ float weight_at(const uint8_t *W, int64_t i) {
    if (DT == K3K_BF16)
        return __uint_as_float((uint32_t)reinterpret_cast<const uint16_t *>(W)[i] << 16);
    if (DT == K3K_I8) return (float)reinterpret_cast<const int8_t *>(W)[i];
    return reinterpret_cast<const float *>(W)[i];
}

// Any shape or alignment (small or odd matrices).
template <int DT>
__global__ void __launch_bounds__(MV_THREADS)
matvec_any(const uint8_t *__restrict__ W, const float *__restrict__ scale, int64_t rows,
           int64_t cols, const float *__restrict__ x, float *__restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * (MV_THREADS / 32) + (threadIdx.x >> 5);
    pdl_trigger();
    pdl_wait();
    if (r >= rows) return;
    float acc = 0.0f;
    for (int64_t i = lane; i < cols; i += 32) acc = fmaf(weight_at<DT>(W, r * cols + i), x[i], acc);
    acc = warp_sum(acc);
    if (lane == 0) y[r] = DT == K3K_I8 ? acc * scale[r] : acc;
}

// Several matrices of one input as one list of rows, one warp per row (matvec_vec with S = 1).
struct mv_multi {
    int n;
    int64_t cols;
    const uint8_t *w[K3K_MAX_MULTI];
    const float *scale[K3K_MAX_MULTI];
    float *y[K3K_MAX_MULTI];
    int64_t start[K3K_MAX_MULTI + 1]; /* first row of each matrix in the list */
};

template <int DT>
__global__ void __launch_bounds__(MV_THREADS)
matvec_multi_k(const mv_multi mm, const float *__restrict__ x) {
    constexpr int EPV = DT == K3K_BF16 ? 8 : 16, ES = DT == K3K_BF16 ? 2 : 1, XPV = EPV / 4;
    const int lane = threadIdx.x & 31;
    const int64_t gr = (int64_t)blockIdx.x * (MV_THREADS / 32) + (threadIdx.x >> 5);
    pdl_trigger();
    if (gr >= mm.start[mm.n]) {
        pdl_wait();
        return;
    }
    int i = 0;
    while (gr >= mm.start[i + 1]) i++;
    const int64_t r = gr - mm.start[i], nv = mm.cols / EPV;
    const uint4 *row = reinterpret_cast<const uint4 *>(mm.w[i] + r * mm.cols * ES);
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    float acc0 = 0.0f, acc1 = 0.0f;
    int64_t c = lane;
    // the first four loads are issued before x may be read (programmatic dependent launch)
    const bool pre = c + 96 < nv;
    uint4 p0 = {}, p1 = {}, p2 = {}, p3 = {};
    if (pre)
        p0 = __ldcs(row + c), p1 = __ldcs(row + c + 32), p2 = __ldcs(row + c + 64),
        p3 = __ldcs(row + c + 96);
    pdl_wait();
    if (pre) {
        acc0 = dot16<DT>(p0, x4 + c * XPV, acc0);
        acc1 = dot16<DT>(p1, x4 + (c + 32) * XPV, acc1);
        acc0 = dot16<DT>(p2, x4 + (c + 64) * XPV, acc0);
        acc1 = dot16<DT>(p3, x4 + (c + 96) * XPV, acc1);
        c += 128;
    }
    for (; c + 96 < nv; c += 128) {
        const uint4 w0 = __ldcs(row + c), w1 = __ldcs(row + c + 32);
        const uint4 w2 = __ldcs(row + c + 64), w3 = __ldcs(row + c + 96);
        acc0 = dot16<DT>(w0, x4 + c * XPV, acc0);
        acc1 = dot16<DT>(w1, x4 + (c + 32) * XPV, acc1);
        acc0 = dot16<DT>(w2, x4 + (c + 64) * XPV, acc0);
        acc1 = dot16<DT>(w3, x4 + (c + 96) * XPV, acc1);
    }
    for (; c < nv; c += 32) acc0 = dot16<DT>(__ldcs(row + c), x4 + c * XPV, acc0);
    const float acc = warp_sum(acc0 + acc1);
    if (lane == 0) mm.y[i][r] = DT == K3K_I8 ? acc * mm.scale[i][r] : acc;
}

template <int DT, int S>
cudaError_t launch_vec(const k3k_mat *w, const float *x, float *y, cudaStream_t s) {
    const int grid = blocks_for(w->rows, MV_THREADS / 32 / S);
    return launch_pdl(matvec_vec<DT, S>, grid, MV_THREADS, 0, s,
                      static_cast<const uint8_t *>(w->data), w->scale, w->rows, w->cols, x, y);
}

template <int DT>
cudaError_t launch_matvec(const k3k_mat *w, const float *x, float *y, cudaStream_t s) {
    const int es = DT == K3K_BF16 ? 2 : DT == K3K_I8 ? 1 : 4, epv = 16 / es;
    const auto *W = static_cast<const uint8_t *>(w->data);
    const bool aligned = (w->cols * es) % 16 == 0 && ((uintptr_t)W & 15) == 0 &&
                         ((uintptr_t)x & 15) == 0;
    if (!aligned) {
        const int grid = blocks_for(w->rows, MV_THREADS / 32);
        return launch_pdl(matvec_any<DT>, grid, MV_THREADS, 0, s, W, w->scale, w->rows, w->cols,
                          x, y);
    }
    // Warps per row: enough warps for ~3 waves of the chip (16384), while every lane keeps at
    // least two 16-byte loads of the row.
    const int64_t nv = w->cols / epv;
    int S = 1;
    while (S < 8 && w->rows < 12288 && w->rows * S < 16384 && nv >= 64 * 2 * S) S *= 2;
    switch (S) {
    case 1: return launch_vec<DT, 1>(w, x, y, s);
    case 2: return launch_vec<DT, 2>(w, x, y, s);
    case 4: return launch_vec<DT, 4>(w, x, y, s);
    default: return launch_vec<DT, 8>(w, x, y, s);
    }
}

// ---- MXFP4 experts --------------------------------------------------------------------
//
// The products run on the tensor cores (mma.sync m16n8k16, BF16 operands, f32 accumulators)
// and stay exact up to the summation order:
//  - Weights: every E2M1 code is exactly a BF16 once its bits are put in place — magnitude
//    (e1 e0 m) at bits 8..6 (the exponent's two low bits and the mantissa's top bit) and the
//    sign at bit 15 — which is the code's value times 2^-126 (e = 0, m = 1 lands on the BF16
//    subnormal 2^-127 = 0.5 · 2^-126). The expert cache re-lays every expert out once, at
//    upload (k3k_experts_prepare), so that a lane's 16-byte load holds exactly its mma
//    fragments, each 32-bit word 8 codes encoded so that four rotations and four AND/XORs
//    decode them (mx_decode, mx_inv).
//  - Activations: x · 2^S (S chosen per vector from max|x|, exact) is split exactly into three
//    BF16 parts x1 + x2 + x3 (8 + 8 + 8 significant bits), the three columns of the mma's
//    8-column B operand. Products of BF16s are exact in the tensor cores; only the sums round.
//  - Each 32-column group's mma sum is multiplied by its E8M0 scale (a power of two) and
//    added to the row's f32 sum; the row's total is scaled back by 2^(126 - S) (exact).
// So a result differs from the scalar CPU sum by f32 rounding in another order, barring
// under/overflow of the scaled partial sums (|y| / max|x| ≥ ~2^120, or x elements below
// max|x| · 2^-109, whose products flush).

// The BF16x2 bits an E2M1 code pair occupies (magnitudes at 8..6, signs at 15; both halves).
constexpr uint32_t MX_P = 0x81C081C0u;

// One prepared word w (8 weights) into the four BF16x2 fragment registers a[0..3]:
//   a0 = P & w, a1 = P & rot(w, 12), a2 = P & (rot(w, 2) ^ rot(w, 6)), a3 = P & (rot(w, 2) ^
//   rot(w, 8))   (rot: right rotation; P = MX_P)
// — 4 SHF and 4 LOP3. No layout lets four plain rotations do it (the 8-bit pattern P does
// not tile 32 bits by rotations, nor does any 2- or 3-rotation XOR scheme reach all 32 bits),
// so two registers take an XOR of two rotations; this map is linear and invertible over
// GF(2), and k3k_experts_prepare stores w = its inverse applied to the wanted bits (mx_inv).
//
// LD (K3_MX_SCHEDULE's legacy-decode entry, for comparison): the earlier encoding — per 16-bit
// half, magnitudes at bits 0-2, 3-5, 6-8, 9-11 and their signs at 13, 12, 15, 14 — decoded by
// three shifts and six ANDs/ORs (11 instructions).
template <bool LD>
__device__ __forceinline__ void mx_decode(uint32_t w, uint32_t (&a)[4]) {
    if constexpr (LD) {
        constexpr uint32_t MAG = 0x01C001C0u, SGN = 0x80008000u;
        a[0] = ((w << 6) & MAG) | ((w << 2) & SGN);
        a[1] = (w << 3) & (MAG | SGN);
        a[2] = w & (MAG | SGN);
        a[3] = ((w >> 3) & MAG) | ((w << 1) & SGN);
        return;
    }
    const uint32_t r2 = __funnelshift_r(w, w, 2), r6 = __funnelshift_r(w, w, 6);
    const uint32_t r8 = __funnelshift_r(w, w, 8), r12 = __funnelshift_r(w, w, 12);
    a[0] = w & MX_P;
    a[1] = r12 & MX_P;
    a[2] = (r2 ^ r6) & MX_P;
    a[3] = (r2 ^ r8) & MX_P;
}

// mx_decode's map as a 32×32 matrix over GF(2), inverted at compile time. Target bit k =
// 8 j + i is bit MX_P's i-th set position of register a[j]; row[i] of the inverse is the mask
// of target bits whose parity is bit i of w.
struct mx_matrix { uint32_t row[32]; };
constexpr int mx_pos(int i) { // the i-th set bit of MX_P
    int n = 0;
    for (int p = 0; p < 32; p++)
        if ((MX_P >> p) & 1u) {
            if (n == i) return p;
            n++;
        }
    return -1;
}
constexpr mx_matrix mx_make_inv() {
    const int rots[4][2] = {{0, 0}, {12, 12}, {2, 6}, {2, 8}}; // equal entries: one rotation
    mx_matrix f{}, inv{};
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 8; i++) {
            const int p = mx_pos(i);
            uint32_t r = 1u << ((p + rots[j][0]) % 32);
            if (rots[j][1] != rots[j][0]) r ^= 1u << ((p + rots[j][1]) % 32);
            f.row[8 * j + i] = r;            // target bit 8j + i = parity(r & w)
            inv.row[8 * j + i] = 1u << (8 * j + i);
        }
    for (int b = 0; b < 32; b++) { // Gauss-Jordan: row b ends with pivot at w bit b
        int piv = b;
        while (piv < 32 && !((f.row[piv] >> b) & 1u)) piv++;
        if (piv == 32) return mx_matrix{}; // singular: caught by the static_assert below
        uint32_t t = f.row[piv]; f.row[piv] = f.row[b]; f.row[b] = t;
        t = inv.row[piv]; inv.row[piv] = inv.row[b]; inv.row[b] = t;
        for (int r = 0; r < 32; r++)
            if (r != b && ((f.row[r] >> b) & 1u)) f.row[r] ^= f.row[b], inv.row[r] ^= inv.row[b];
    }
    return inv;
}
constexpr mx_matrix MX_INV_HOST = mx_make_inv();
static_assert(MX_INV_HOST.row[0] != 0, "mx_decode's map must be invertible");
__constant__ mx_matrix mx_inv = mx_make_inv();

// d = A·B + d for one 16×16 weight slice A and B = x's three BF16 parts (columns 0-2).
__device__ __forceinline__ void mx_mma(float (&d)[4], const uint32_t (&a)[4], uint2 b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}

// Byte b of a prepared scale word as 2^(E - 127). Fast: E << 23, right for 1 <= E <= 254;
// an expert with a scale byte 0 or 255 is flagged at preparation and takes the exact decode.
template <bool EXACT>
__device__ __forceinline__ float mx_scale(uint32_t sw, int b) {
    const uint32_t e = (sw >> (8 * b)) & 0xffu;
    return EXACT ? e8m0f(e) : __uint_as_float(e << 23);
}

// One 32-column group of one lane's 16-row tile: words w0, w1 (its two 16-column slices), B
// fragments b0, b1 of the same slices, the scale bytes for rows g and g + 8 at sb, sb + 1.
template <bool EXACT, bool LD>
__device__ __forceinline__ void mx_group(uint32_t w0, uint32_t w1, uint2 b0, uint2 b1,
                                         uint32_t sw, int sb, float (&acc)[4]) {
    uint32_t a[4];
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mx_decode<LD>(w0, a);
    mx_mma(d, a, b0);
    mx_decode<LD>(w1, a);
    mx_mma(d, a, b1);
    const float s0 = mx_scale<EXACT>(sw, sb), s1 = mx_scale<EXACT>(sw, sb + 1);
    acc[0] = fmaf(d[0], s0, acc[0]);
    acc[1] = fmaf(d[1], s0, acc[1]);
    acc[2] = fmaf(d[2], s1, acc[2]);
    acc[3] = fmaf(d[3], s1, acc[3]);
}

// The three BF16 parts of v (bits), exact for finite v (each remainder is exact in f32 and
// the last has at most 8 significant bits). Non-finite v: v itself, then zeros.
__device__ __forceinline__ void mx_split(float v, uint32_t (&p)[3]) {
    p[0] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    if (!(fabsf(v) <= FLT_MAX)) {
        p[1] = p[2] = 0;
        return;
    }
    const float r = __fsub_rn(v, __uint_as_float(p[0] << 16));
    p[1] = __bfloat16_as_ushort(__float2bfloat16_rn(r));
    p[2] = __bfloat16_as_ushort(__float2bfloat16_rn(__fsub_rn(r, __uint_as_float(p[1] << 16))));
}

// Barrier 1 over the block's first n threads (the experts kernels' compute warps; the copy
// warp, when there is one, never waits on it).
__device__ __forceinline__ void mx_sync(int n) {
    asm volatile("bar.sync 1, %0;\n" ::"r"(n) : "memory");
}

// max over the first n threads (n a multiple of 32), as block_max.
__device__ float mx_max(float v, float *red, int n) {
    v = warp_max(v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = n >> 5;
    mx_sync(n);
    if (lane == 0) red[w] = v;
    mx_sync(n);
    if (w == 0) {
        float t = lane < nw ? red[lane] : -INFINITY;
        t = warp_max(t);
        if (lane == 0) red[0] = t;
    }
    mx_sync(n);
    return red[0];
}

// Stages x [cols] as B fragments: Bs[s·12 + lane] for k-slice s and lanes 0-11 (lane 4n + c
// holds part n of columns 16s + 2c, +1 and 16s + 2c + 8, +9; lanes 12-31 read those of lanes
// 0-11 as B columns 3-7, which no result reads). Returns S
// (x is taken as x · 2^S, max|x| · 2^S in [2^125, 2^126); S = 0 for zero or non-finite x).
// Run by the block's first nthr threads; ends with their barrier (mx_sync); the caller
// guarantees that no warp still reads Bs.
__device__ int mx_stage(const float *__restrict__ x, int cols, uint2 *Bs, float *red, int nthr) {
    // entry e = (slice e / 4, c = e % 4): x[k], x[k + 1], x[k + 8], x[k + 9], k = 16 (e / 4) + 2c;
    // up to ME entries per thread are read once into registers (one trip to memory)
    constexpr int ME = 4;
    const int ne = cols / 4;
    const bool held = ne <= ME * (int)nthr;
    float2 v[ME][2];
    float m = 0.0f;
    auto upd = [&](float f) { f = fabsf(f); m = f <= FLT_MAX ? fmaxf(m, f) : INFINITY; };
    if (held) {
#pragma unroll
        for (int i = 0; i < ME; i++) {
            const int e = threadIdx.x + i * nthr, k = 16 * (e >> 2) + 2 * (e & 3);
            if (e >= ne) break;
            v[i][0] = *reinterpret_cast<const float2 *>(x + k);
            v[i][1] = *reinterpret_cast<const float2 *>(x + k + 8);
            upd(v[i][0].x), upd(v[i][0].y), upd(v[i][1].x), upd(v[i][1].y); // NaN: non-finite
        }
    } else {
        for (int i = threadIdx.x; i < cols; i += nthr) upd(x[i]);
    }
    m = mx_max(m, red, nthr);
    const int S = m > 0.0f && m <= FLT_MAX ? 125 - ilogbf(m) : 0; // -2 <= S <= 274
    // 2^S as three exact factors (each product exact: |x| · 2^S < 2^126, and magnitudes grow)
    const int a = S < 127 ? S : 127, b = S - a < 127 ? S - a : 127, c3 = S - a - b;
    const float f1 = __uint_as_float((uint32_t)(a + 127) << 23);
    const float f2 = __uint_as_float((uint32_t)(b + 127) << 23);
    const float f3 = __uint_as_float((uint32_t)(c3 + 127) << 23);
    auto sc = [&](float f) { return __fmul_rn(__fmul_rn(__fmul_rn(f, f1), f2), f3); };
    auto put = [&](int e, float2 lo, float2 hi) {
        uint32_t p[4][3];
        mx_split(sc(lo.x), p[0]);
        mx_split(sc(lo.y), p[1]);
        mx_split(sc(hi.x), p[2]);
        mx_split(sc(hi.y), p[3]);
#pragma unroll
        for (int n = 0; n < 3; n++)
            Bs[(e >> 2) * 12 + 4 * n + (e & 3)] =
                make_uint2(p[0][n] | p[1][n] << 16, p[2][n] | p[3][n] << 16);
    };
    if (held) {
#pragma unroll
        for (int i = 0; i < ME; i++) {
            const int e = threadIdx.x + i * nthr;
            if (e >= ne) break;
            put(e, v[i][0], v[i][1]);
        }
    } else {
        for (int e = threadIdx.x; e < ne; e += nthr) {
            const int k = 16 * (e >> 2) + 2 * (e & 3);
            put(e, make_float2(x[k], x[k + 1]), make_float2(x[k + 8], x[k + 9]));
        }
    }
    mx_sync(nthr);
    return S;
}

template <bool E> struct mx_exact { static constexpr bool value = E; };

// The bulk copy engine (TMA, sm_90): one lane copies a contiguous block of global memory
// (16-byte aligned, a multiple of 16 bytes) into shared memory; the copy completes on an
// mbarrier as a transaction count, which the warp's lanes wait for (phase parity).
__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
                 "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes,
                                          uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];\n" ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    asm volatile("{\n.reg .pred p;\nW%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra W%=;\n}\n" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
}

// The prepared layout (k3k_experts_prepare). Unit: one 16-row tile × one 32-column group of one
// matrix = 256 bytes of nibbles + 16 scale bytes. A chunk = two groups (the last chunk of a
// row may hold one): its nibbles (512 bytes: lane l's 16 at 16 l, group 2c's two words then
// 2c + 1's; a one-group chunk: lane l's 8 at 8 l) followed by its scales (32 bytes: [g][group
// 2c: rows g, g + 8; group 2c + 1: rows g, g + 8]; one group: [g][2]). Word q of a lane holds
// its 16-column slice q of the group in mma fragment order (rows g = l/4 and g + 8, columns
// 2c, 2c + 1 and 2c + 8, 2c + 9 for c = l % 4; bit positions as mx_decode reads them).
// An item (the unit a block computes) is two 16-row tiles read against the same x: gate+up,
// tile t of w1 and of w3 (then SiTU); down, tiles 2t and 2t + 1 of w2 (rows 32t..32t + 31),
// so that every B fragment loaded serves two mmas. The two tiles' chunks alternate (first
// tile's chunk c, second's chunk c, first's chunk c + 1, ...) in the region from off_w1p
// (whose size is that of w1p, w1s, w3p and w3s together) or off_w2p (w2p and w2s); item t
// starts at t · ng · 544. Chunk-major (chunks of an item in column order): a warp's columns of
// one item are one contiguous block. Step-major (K3's shapes, mx_step_major): the chunk pairs
// of an item reordered so that step k of warp 0, 1, ..., 7 (one step = 1088 bytes, chunk k of
// the warp in both tiles) follow each other, so step k of every warp is one contiguous block.
constexpr int MX_STEP = 1088; // bytes of one pipeline step: one chunk of each of two tiles

// The routed experts of a layer as one list of items (expert j's item t is j · tiles + t,
// tiles = items per expert: inter / 16 for GU, latent / 32 for down). A persistent grid: block b
// takes a contiguous range of items; its W warps split the columns (warp w: chunks
// [w·np/W, (w+1)·np/W)), and each warp streams its contiguous block of each item through a
// ring of D shared-memory stages of up to K steps (K · MX_STEP bytes), filled by the bulk copy
// engine (lane 0 issues one copy per stage, D - 1 stages ahead; a copy never spans two items)
// and awaited on one mbarrier per stage. The warps' sums meet in shared memory once per item
// (a fixed order: deterministic). x is staged once (GU) or per expert (down). Few large copies
// matter: with one copy per step the copy engine, not DRAM, limited the stream (BENCHMARKS.md).
//
// WS (the copy warp): the layout is step-major (mx_step_major: a tile's step k of every warp
// is one contiguous run of W · MX_STEP bytes), and one extra warp (warp W, lane 0) streams
// every tile through ONE ring of D block-wide stages of K steps (K · W · MX_STEP bytes, one
// copy each), as far ahead as the ring allows: a stage is refilled once all W compute warps
// have released it (an "empty" mbarrier of W arrivals). So the copies are W times larger and
// run ahead of the compute by up to D - 1 stages, independently of any one warp's progress.
template <bool GU, bool WS, int W, int D, int K, bool LD>
__device__ __forceinline__ void experts_body(const k3k_experts &ex, const float *__restrict__ x,
                                             float beta, float lb, float *__restrict__ out) {
    extern __shared__ __align__(128) uint8_t smem[];
    constexpr int NM = 2;   // tiles an item
    constexpr int GB = 544; // bytes of one group in both tiles
    constexpr int SB = WS ? K * W * MX_STEP : K * MX_STEP; // bytes of one stage
    __shared__ float part[2][NM][W][16];
    __shared__ float red[32];
    __shared__ uint64_t bar_all[WS ? 2 * D : W * D]; // WS: full [D], then empty [D]
    const int rows = GU ? ex.inter : ex.latent, cols = GU ? ex.latent : ex.inter;
    const int ng = cols / 32, np = (ng + 1) / 2, tiles = rows / (GU ? 16 : 32);
    const int items = ex.n * tiles;
    const int it0 = (int)((int64_t)items * blockIdx.x / gridDim.x);
    const int it1 = (int)((int64_t)items * (blockIdx.x + 1) / gridDim.x);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    const int c_lo = warp * np / W, c_hi = (warp + 1) * np / W;
    const int g_lo = 2 * c_lo, g_hi = min(2 * c_hi, ng); // the warp's groups
    const int cpw = (np + W - 1) / W;
    const int spi = cpw; // steps per item, the same in every warp
    const int gpi = (spi + K - 1) / K;         // copies (of up to K steps) per item
    const int total = (it1 - it0) * gpi;
    const uint64_t region = GU ? ex.off_w1p : ex.off_w2p;
    const size_t tile_b = (size_t)ng * GB;
    const int wbytes = (g_hi - g_lo) * GB; // the warp's block of one item
    uint2 *Bs = reinterpret_cast<uint2 *>(smem);
    uint8_t *ring = smem + ((size_t)cols / 16 * 12 * sizeof(uint2) + 127) / 128 * 128 +
                    (WS ? 0 : (size_t)warp * D * SB);
    uint64_t *bars = WS ? bar_all : bar_all + warp * D, *empty = bar_all + D;
    pdl_trigger();
    if (it0 >= it1) return; // uniform over the block

    if constexpr (WS) {
        if (threadIdx.x == 0) {
            for (int i = 0; i < D; i++) mbar_init(bars + i, 1), mbar_init(empty + i, W);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        __syncthreads(); // the only barrier the copy warp takes part in
        if (warp == W) { // the copy warp: copy i = stage i % D, steps [K (i % gpi), ...) of item
            if (lane != 0) return;
            int j = it0 / tiles, t = it0 - j * tiles, cs = 0, st = 0;
            for (int i = 0; i < total; i++) {
                if (i >= D) mbar_wait(empty + st, ((i / D) - 1) & 1); // its last use is done
                const int n = min(K, spi - cs * K) * W * MX_STEP;
                mbar_expect_tx(bars + st, n);
                bulk_copy(ring + st * SB,
                          ex.base[j] + region + t * tile_b + (size_t)cs * K * W * MX_STEP, n,
                          bars + st);
                st = st + 1 == D ? 0 : st + 1;
                if (++cs == gpi) {
                    cs = 0;
                    if (++t == tiles) t = 0, j++;
                }
            }
            return;
        }
    }

    // lane 0's load cursor: copy ls (steps K·ls ...) of the item of expert lj, tile lt, into
    // stage lstage
    int ls = 0, lj = it0 / tiles, lt = it0 - lj * tiles, lstage = 0;
    const uint8_t *lsrc = nullptr;
    auto issue = [&]() {
        if (ls == 0) lsrc = ex.base[lj] + region + lt * tile_b + (size_t)g_lo * GB;
        const int off = ls * K * MX_STEP, n = min(K * MX_STEP, wbytes - off);
        mbar_expect_tx(bars + lstage, n > 0 ? n : 0);
        if (n > 0) bulk_copy(ring + lstage * SB, lsrc + off, n, bars + lstage);
        lstage = lstage + 1 == D ? 0 : lstage + 1;
        if (++ls == gpi) {
            ls = 0;
            if (++lt == tiles) lt = 0, lj++;
        }
    };
    if (!WS && lane == 0) {
        for (int i = 0; i < D; i++) mbar_init(bars + i, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        for (int i = 0; i < D - 1 && i < total; i++) issue();
    }
    __syncwarp();
    // experts whose scales need the exact decode (k3k_experts_prepare's flag), one bit each
    const uint64_t exact =
        (uint64_t)__ballot_sync(FULL, lane < ex.n && *reinterpret_cast<const uint32_t *>(
                                                          ex.base[lane] + ex.off_flag)) |
        (uint64_t)__ballot_sync(FULL, lane + 32 < ex.n && *reinterpret_cast<const uint32_t *>(
                                                               ex.base[lane + 32] + ex.off_flag))
            << 32;

    // Weights and flags are ready before the previous kernel ends (they come from uploads the
    // host has waited for); x (its output) and out (which it may still read) are not.
    pdl_wait();
    int ci = it0, cs = 0, cstage = 0; // the copy being computed: copy cs of item ci
    int xj = GU ? 0 : ci / tiles;
    int S = mx_stage(x + (size_t)xj * cols, cols, Bs, red, W * 32);
    float acc[NM][4] = {};
    // Lanes 12-31 hold B's columns 3-7, which no result reads: they load lanes 0-11's.
    const uint2 *bl = Bs + lane % 12;

    // Step cs of the item at st: one chunk of each of its two tiles. A chunk holds two groups
    // (pair) or the row's odd last one.
    auto compute = [&](const uint8_t *st, int cs, auto ex_tag) {
        constexpr bool E = decltype(ex_tag)::value;
        const int gi = g_lo + 2 * cs, n = g_hi - gi;
        if (n >= 2) { // uniform
            const uint4 q = *reinterpret_cast<const uint4 *>(st + lane * 16);
            const uint32_t sw = *reinterpret_cast<const uint32_t *>(st + 512 + g * 4);
            const uint4 q3 = *reinterpret_cast<const uint4 *>(st + 544 + lane * 16);
            const uint32_t sw3 = *reinterpret_cast<const uint32_t *>(st + 1056 + g * 4);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint2 b0 = bl[(2 * gi + 2 * h) * 12], b1 = bl[(2 * gi + 2 * h + 1) * 12];
                mx_group<E, LD>(h ? q.z : q.x, h ? q.w : q.y, b0, b1, sw, 2 * h, acc[0]);
                mx_group<E, LD>(h ? q3.z : q3.x, h ? q3.w : q3.y, b0, b1, sw3, 2 * h, acc[1]);
            }
        } else if (n == 1) {
            const uint2 b0 = bl[2 * gi * 12], b1 = bl[(2 * gi + 1) * 12];
            const uint2 q = *reinterpret_cast<const uint2 *>(st + lane * 8);
            const uint32_t sw = *reinterpret_cast<const uint16_t *>(st + 256 + g * 2);
            const uint2 q3 = *reinterpret_cast<const uint2 *>(st + 272 + lane * 8);
            const uint32_t sw3 = *reinterpret_cast<const uint16_t *>(st + 528 + g * 2);
            mx_group<E, LD>(q.x, q.y, b0, b1, sw, 0, acc[0]);
            mx_group<E, LD>(q3.x, q3.y, b0, b1, sw3, 0, acc[1]);
        }
    };

    // The item is complete in every warp: row g's sum is lane 4g's columns 0 + 1 (x1, x2)
    // plus lane 4g + 1's column 2 (x3); the warps' sums are added in warp order.
    auto finish = [&]() {
        const int pb = (ci - it0) & 1, c = lane & 3;
#pragma unroll
        for (int m = 0; m < NM; m++) {
            float r0 = c == 0 ? acc[m][0] + acc[m][1] : c == 1 ? acc[m][0] : 0.0f;
            float r1 = c == 0 ? acc[m][2] + acc[m][3] : c == 1 ? acc[m][2] : 0.0f;
            r0 += __shfl_xor_sync(FULL, r0, 1);
            r1 += __shfl_xor_sync(FULL, r1, 1);
            if (c == 0) part[pb][m][warp][g] = r0, part[pb][m][warp][g + 8] = r1;
            acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
        }
        mx_sync(W * 32); // the compute warps only
        if (threadIdx.x < 16) {
            const int j = ci / tiles, r = (ci - j * tiles) * (GU ? 16 : 32) + threadIdx.x;
            float s0 = 0.0f, s1 = 0.0f;
            for (int w = 0; w < W; w++) {
                s0 += part[pb][0][w][threadIdx.x];
                s1 += part[pb][1][w][threadIdx.x];
            }
            s0 = ldexpf(s0, 126 - S), s1 = ldexpf(s1, 126 - S);
            float *o = out + (size_t)j * rows + r;
            if (GU) o[0] = situf(s0, s1, beta, lb);
            else o[0] = s0, o[16] = s1;
        }
    };

    uint32_t parity = 0; // of the stage's current use
    bool cexact = (exact >> (ci / tiles)) & 1;
    for (int s = 0; s < total; s++) {
        if (!WS && lane == 0 && s + D - 1 < total) issue(); // into the stage used in s - 1
        mbar_wait(bars + cstage, parity);                   // copy s has landed
        // this warp's step k of the stage (WS: the stage holds step k of every warp in turn)
        const uint8_t *st = ring + cstage * SB + (WS ? warp * MX_STEP : 0);
        constexpr int KS = WS ? W * MX_STEP : MX_STEP;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int step = cs * K + k;
            if (step >= spi) break;
            if (cexact) { /* uniform: the expert has scale bytes 0 or 255 */
                compute(st + k * KS, step, mx_exact<true>());
            } else {
                compute(st + k * KS, step, mx_exact<false>());
            }
        }
        __syncwarp(); // every lane is done with the stage before it is refilled
        if (WS && lane == 0) mbar_arrive(empty + cstage);
        if (++cstage == D) cstage = 0, parity ^= 1;
        if (++cs == gpi) {
            finish();
            cs = 0;
            if (++ci < it1) {
                cexact = (exact >> (ci / tiles)) & 1;
                if (!GU && ci / tiles != xj) { // every warp is past finish()'s barrier
                    xj = ci / tiles;
                    S = mx_stage(x + (size_t)xj * cols, cols, Bs, red, W * 32);
                }
            }
        }
    }
}

// The kernel: W compute warps, plus the copy warp when WS (its registers capped so that as
// many blocks fit an SM as the shared memory allows: three of 3 × 2 stages, two of more).
template <bool GU, bool WS, int W, int D, int K, bool LD>
__global__ void __launch_bounds__((W + WS) * 32, WS ? (D * K <= 6 ? 3 : 2) : 0)
experts_k(const __grid_constant__ k3k_experts ex, const float *__restrict__ x, float beta,
          float lb, float *__restrict__ out) {
    experts_body<GU, WS, W, D, K, LD>(ex, x, beta, lb, out);
}

// The copy-warp kernels' warps and the step-major layout's: a matrix [rows, cols] is laid out
// step-major (for them) when its chunks split evenly into whole steps over MX_WS_W warps
// (K3's shapes do) and the schedule is not MX_CHUNK_MAJOR.
constexpr int MX_WS_W = 8;
constexpr int MX_CHUNK_MAJOR = K3K_MX_SCHEDULES - 1; // the schedule without a copy warp
int mx_schedule() { return tuning_mx_schedule; }
bool mx_step_major(int cols) {
    const int ng = cols / 32;
    return ng % 2 == 0 && (ng / 2) % MX_WS_W == 0 && mx_schedule() != MX_CHUNK_MAJOR;
}

// Re-lays one matrix [rows, cols] (rows % 16 == 0, or % 32 with pairs; cols % 32 == 0) out for
// experts_k (the layout above; d points at the region): tile t's chunk c goes to
// d + it · ng · 544 + at · 1088 + mt · (544, or 272 for a one-group chunk), where it is the
// item and mt the tile's place in it — pairs (down): it = t / 2, mt = t % 2; else (gate+up,
// called for w1 with m = 0 and w3 with m = 1): it = t, mt = m — and at = c (chunk-major) or,
// step-major, j · MX_WS_W + w for warp w = c / cpw and its step j = c % cpw.
// One thread per (16-row tile, group, lane). *flag |= 1 when a scale byte is 0 or 255 (not
// decoded by the fast path).
__global__ void mx_prepare_k(const uint8_t *__restrict__ sp, const uint8_t *__restrict__ ss,
                             uint8_t *__restrict__ d, int rows, int cols, int m, bool pairs,
                             bool step_major, bool legacy, uint32_t *flag) {
    const int ng = cols / 32, cpw = ng / 2 / MX_WS_W;
    const int64_t n = (int64_t)(rows / 16) * ng * 32;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int lane = (int)(i & 31), g = lane >> 2, c = lane & 3;
        const int64_t tg = i >> 5;
        const int gi = (int)(tg % ng), t = (int)(tg / ng);
        const bool pair = (gi | 1) < ng;
        // the chunk: nibbles then scales, the item's second tile's after its first's
        const int cc = gi >> 1, at = step_major ? (cc % cpw) * MX_WS_W + cc / cpw : cc;
        const int it = pairs ? t >> 1 : t, mt = pairs ? t & 1 : m;
        uint8_t *ch = d + (size_t)it * ng * 544 + (size_t)at * 1088 + (size_t)mt * (pair ? 544 : 272);
#pragma unroll
        for (int q = 0; q < 2; q++) {
            uint32_t tk = 0; // mx_decode's target bits: 8 j + 4 h + (m, e0, e1, sign)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int64_t row = 16 * t + g + (j & 1) * 8;
                    const int col = 32 * gi + 16 * q + 2 * c + h + (j >> 1) * 8;
                    const uint32_t code = (sp[row * (cols / 2) + col / 2] >> ((col & 1) * 4)) & 15u;
                    tk |= code << (8 * j + 4 * h); // MX_P's bits in order: 6, 7, 8, 15 (+16 h)
                }
            uint32_t w = 0;
            if (legacy) { // mx_decode<true>'s encoding
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const uint32_t code = (tk >> (8 * j + 4 * h)) & 15u;
                        const uint32_t sign_at = (0xefcdu >> (4 * j)) & 15u; // 13, 12, 15, 14
                        w |= (code & 7u) << (16 * h + 3 * j) | (code >> 3) << (16 * h + sign_at);
                    }
            } else {
#pragma unroll
                for (int b = 0; b < 32; b++) w |= (uint32_t)(__popc(mx_inv.row[b] & tk) & 1) << b;
            }
            *reinterpret_cast<uint32_t *>(ch + (pair ? lane * 16 + (gi & 1) * 8 : lane * 8) + 4 * q) = w;
        }
        if (c == 0)
            for (int rr = 0; rr < 2; rr++) {
                const uint8_t e = ss[(int64_t)(16 * t + g + 8 * rr) * ng + gi];
                ch[pair ? 512 + g * 4 + (gi & 1) * 2 + rr : 256 + g * 2 + rr] = e;
                if (e == 0 || e == 255) atomicOr(flag, 1u);
            }
    }
}

// The tensors' regions in order and apart (the prepared layout fills w1p..w3s as one region),
// every offset 16-byte aligned.
bool experts_layout_ok(const k3k_experts *ex) {
    if (ex->inter % 32 || ex->latent % 32 || ex->inter < 32 || ex->latent < 32) return false;
    const uint64_t p = (uint64_t)ex->inter * ex->latent / 2, sc = p / 16;
    const uint64_t o[7] = {ex->off_w1p, ex->off_w1s, ex->off_w3p, ex->off_w3s,
                           ex->off_w2p, ex->off_w2s, ex->off_flag};
    for (int i = 0; i < 7; i++)
        if (o[i] % 16) return false;
    return o[1] >= o[0] + p && o[2] >= o[1] + sc && o[3] >= o[2] + p && o[5] >= o[4] + p;
}

bool experts_ok(const k3k_experts *ex) {
    if (ex->n < 1 || ex->n > K3K_MAX_EXPERTS || !experts_layout_ok(ex)) return false;
    for (int j = 0; j < ex->n; j++)
        if ((uintptr_t)ex->base[j] % 16) return false;
    return true;
}

// One block per SM slot the kernel's occupancy allows (at most one per item).
template <bool GU, bool WS, int W, int D, int K, bool LD = false>
cudaError_t launch_experts_v(const k3k_experts *ex, const float *x, float beta, float lb,
                             float *out, cudaStream_t s) {
    const int rows = GU ? ex->inter : ex->latent, cols = GU ? ex->latent : ex->inter;
    const size_t smem = ((size_t)cols / 16 * 12 * sizeof(uint2) + 127) / 128 * 128 +
                        (size_t)W * D * K * MX_STEP;
    constexpr int threads = (W + WS) * 32;
    // blocks the GPU holds at once, per shape: queried on the first launch of each (k3 uses one
    // device per process; the queries cost more host time than the launch itself)
    static int cap_memo = 0, cap_rows = 0, cap_cols = 0;
    static pthread_mutex_t cap_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&cap_lock);
    cudaError_t e = cudaSuccess;
    if (cap_memo == 0 || cap_rows != rows || cap_cols != cols) {
        int dev = 0, sms = 0, per_sm = 0;
        if (smem > 32 * 1024) /* with the static arrays, past the default 48 KB */
            e = cudaFuncSetAttribute(experts_k<GU, WS, W, D, K, LD>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e == cudaSuccess) e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &per_sm, experts_k<GU, WS, W, D, K, LD>, threads, smem);
        if (e == cudaSuccess) cap_memo = sms * (per_sm > 0 ? per_sm : 1), cap_rows = rows, cap_cols = cols;
    }
    const int cap = cap_memo;
    pthread_mutex_unlock(&cap_lock);
    if (e != cudaSuccess) return e;
    const int items = ex->n * (rows / (GU ? 16 : 32));
    int grid = cap;
    grid = grid < items ? grid : items;
    // as few blocks as keep the busiest one's item count: when that count is what the launch
    // waits for, the others then share the bandwidth among fewer blocks (down at 16 experts:
    // 1792 items take 359 blocks of <= 5, not 396 blocks of 4 or 5)
    const int per = (items + grid - 1) / grid;
    grid = (items + per - 1) / per;
    return launch_pdl(experts_k<GU, WS, W, D, K, LD>, grid, threads, smem, s, *ex, x, beta, lb,
                      out);
}

// Schedules of the copy-warp kernels (8 compute warps + the copy warp, step-major layout): ring
// stages, steps a stage, and whether the weights use the earlier 11-instruction decode
// (mx_decode<true>: plain shifts, measured faster than the 8-instruction funnel-shift decode in
// gate+up but not in down), one table per kernel; entry 0 is the default, the fastest
// measured. The last schedule (MX_CHUNK_MAJOR) is the kernel without a copy warp (8 warps,
// each streaming its own columns through its own 2 stages of 3 steps) on the chunk-major
// layout, which also serves every shape the step-major layout does not fit. K3_MX_SCHEDULE=i
// picks entry i of both tables, for `k3-lab bench-gpu`'s sweep and the kernel tests, which run
// every entry (preparation and launch must see the same value). Measured on an H200
// (BENCHMARKS.md, 2026-11-30 14:00 UTC).
struct mx_sched {
    int stages, steps;
    bool legacy;
};
constexpr mx_sched MX_SCHED_GU[MX_CHUNK_MAJOR] = {
    {3, 2, true}, {3, 2, false}, {2, 3, false}, {3, 3, false}, {4, 2, false}};
constexpr mx_sched MX_SCHED_DOWN[MX_CHUNK_MAJOR] = {
    {3, 3, true}, {3, 2, false}, {2, 3, false}, {3, 3, false}, {4, 2, false}};
constexpr const mx_sched &mx_sched_of(bool gu, int i) {
    return gu ? MX_SCHED_GU[i] : MX_SCHED_DOWN[i];
}

template <bool GU, int I>
cudaError_t launch_ws(const k3k_experts *ex, const float *x, float beta, float lb, float *out,
                      cudaStream_t s) {
    constexpr mx_sched sc = mx_sched_of(GU, I);
    return launch_experts_v<GU, true, MX_WS_W, sc.stages, sc.steps, sc.legacy>(ex, x, beta, lb,
                                                                                 out, s);
}

template <bool GU>
cudaError_t launch_experts(const k3k_experts *ex, const float *x, float beta, float lb,
                           float *out, cudaStream_t s) {
    static_assert(MX_CHUNK_MAJOR == 5, "one case per schedule");
    if (!mx_step_major(GU ? ex->latent : ex->inter))
        return launch_experts_v<GU, false, 8, 2, 3>(ex, x, beta, lb, out, s);
    switch (mx_schedule()) {
    case 1: return launch_ws<GU, 1>(ex, x, beta, lb, out, s);
    case 2: return launch_ws<GU, 2>(ex, x, beta, lb, out, s);
    case 3: return launch_ws<GU, 3>(ex, x, beta, lb, out, s);
    case 4: return launch_ws<GU, 4>(ex, x, beta, lb, out, s);
    default: return launch_ws<GU, 0>(ex, x, beta, lb, out, s);
    }
}

// ---- element-wise and small reductions --------------------------------------------------

__global__ void rmsnorm_k(const float *x, const void *w, int wdt, int n, float eps, float *y) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    __shared__ float red[32];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) { // each thread rewrites only its own x[i]
        const float v = x[i] * r;
        float wi = 1.0f;
        if (w) wi = wdt == K3K_BF16
                        ? __uint_as_float((uint32_t)static_cast<const uint16_t *>(w)[i] << 16)
                        : static_cast<const float *>(w)[i];
        y[i] = w ? wi * v : v;
    }
}

struct res_values {
    const float *v[K3K_MAX_RES];
};

// One block per value: score_j (spec §5 step 2).
__global__ void attn_res_scores(const res_values vals, const float *sw, int hidden, float eps,
                                float *scores) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    __shared__ float red[32];
    const float *v = vals.v[blockIdx.x];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss = fmaf(v[i], v[i], ss);
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)hidden + eps);
    float dot = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dot = fmaf(v[i] * r, sw[i], dot);
    dot = block_sum(dot, red);
    if (threadIdx.x == 0) scores[blockIdx.x] = dot;
}

// Softmax of the scores (sequential, the CPU's order) and the mix, element-wise in j order.
__global__ void attn_res_mix(const res_values vals, int n, const float *scores, int hidden,
                             float *out) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    __shared__ float p[K3K_MAX_RES];
    if (threadIdx.x == 0) {
        float mx = scores[0], sum = 0.0f;
        for (int j = 1; j < n; j++) mx = scores[j] > mx ? scores[j] : mx;
        for (int j = 0; j < n; j++) sum = __fadd_rn(sum, p[j] = expf(scores[j] - mx));
        for (int j = 0; j < n; j++) p[j] = __fdiv_rn(p[j], sum);
    }
    __syncthreads();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= hidden) return;
    float acc = 0.0f;
    for (int j = 0; j < n; j++) acc = __fadd_rn(acc, __fmul_rn(p[j], vals.v[j][i]));
    out[i] = acc;
}

__global__ void add_k(const float *a, const float *b, float *y, int n) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(a[i], b[i]);
}

__global__ void situ_k(const float *gate, const float *up, int n, float beta, float lb,
                       float *out) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = situf(gate[i], up[i], beta, lb);
}

__global__ void sigmoid_gate_k(float *x, const float *g, int n) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(x[i], sigmoidf_(g[i]));
}

// ---- KDA --------------------------------------------------------------------------------

__global__ void short_conv_k(float *x, const float *taps, float *hist, int P, int conv) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= P) return;
    const int nh = conv - 1;
    float *h = hist + (size_t)c * nh;
    const float *wc = taps + (size_t)c * conv;
    float y = 0.0f;
    for (int i = 0; i < nh; i++) y = __fadd_rn(y, __fmul_rn(wc[i], h[i]));
    const float xc = x[c];
    y = __fadd_rn(y, __fmul_rn(wc[nh], xc));
    for (int i = 0; i + 1 < nh; i++) h[i] = h[i + 1];
    if (nh > 0) h[nh - 1] = xc;
    x[c] = __fdiv_rn(y, 1.0f + expf(-y)); // SiLU divides, as ATen's CPU kernel
}

// One block per head, blockDim = D rounded up to a multiple of 32; thread j < D owns value
// column j of S (spec §6.6: the CPU's loop order per column).
__global__ void kda_heads_k(float *q, float *k, const float *v, const float *f, const float *b,
                            const float *g, const float *a_log, const float *dt_bias,
                            const float *o_norm, float *S, int D, float q_scale, float lb,
                            float eps, float *o) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    extern __shared__ float sm[]; // q [D], k [D], alpha [D]
    __shared__ float red[32];
    float *qs = sm, *ks = sm + D, *al = sm + 2 * D;
    const int h = blockIdx.x, j = threadIdx.x;
    const bool on = j < D;
    const size_t hj = (size_t)h * D + j;
    float qj = on ? q[hj] : 0.0f, kj = on ? k[hj] : 0.0f;
    const float qn = sqrtf(block_sum(qj * qj, red) + 1e-6f); // fla's in-kernel L2 norm
    const float kn = sqrtf(block_sum(kj * kj, red) + 1e-6f);
    qj = __fdiv_rn(qj, qn);
    if (q_scale != 1.0f) qj = __fmul_rn(qj, q_scale);
    kj = __fdiv_rn(kj, kn);
    const float beta = sigmoidf_(b[h]);
    if (on) {
        q[hj] = qj, k[hj] = kj;
        qs[j] = qj, ks[j] = kj;
        const float zz = __fadd_rn(f[hj], dt_bias[hj]); // decay gate (spec §6.4), A_log per head
        al[j] = expf(__fmul_rn(lb, sigmoidf_(__fmul_rn(expf(a_log[h]), zz))));
    }
    __syncthreads();
    float oj = 0.0f;
    if (on) {
        float *Sh = S + (size_t)h * D * D;
        float u = 0.0f;
#pragma unroll 8
        for (int i = 0; i < D; i++) {
            const float s = __fmul_rn(Sh[(size_t)i * D + j], al[i]);
            Sh[(size_t)i * D + j] = s;
            u = __fadd_rn(u, __fmul_rn(ks[i], s));
        }
        const float delta = __fsub_rn(v[hj], u);
#pragma unroll 8
        for (int i = 0; i < D; i++) {
            const float bk = __fmul_rn(beta, ks[i]);
            const float s = __fadd_rn(Sh[(size_t)i * D + j], __fmul_rn(bk, delta));
            Sh[(size_t)i * D + j] = s;
            oj = __fadd_rn(oj, __fmul_rn(qs[i], s));
        }
    }
    const float ss = block_sum(oj * oj, red); // gated per-head RMSNorm (spec §6.7)
    const float r = 1.0f / sqrtf(ss / (float)D + eps);
    if (on) {
        const float y = __fmul_rn(o_norm[j], __fmul_rn(oj, r));
        o[hj] = __fmul_rn(y, sigmoidf_(g[hj]));
    }
}

// ---- MLA --------------------------------------------------------------------------------

__global__ void mla_append_k(float *kv, int t, const float *KV, const float *ckv, int H,
                             int nope, int rope, int vd, int lora) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    const int kvf = H * nope + rope + H * vd;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= kvf) return;
    float *e = kv + (size_t)t * kvf;
    if (idx < H * nope) {
        const int h = idx / nope, d = idx % nope;
        e[idx] = KV[h * (nope + vd) + d];
    } else if (idx < H * nope + rope) {
        e[idx] = ckv[lora + idx - H * nope];
    } else {
        const int r = idx - H * nope - rope, h = r / vd, d = r % vd;
        e[idx] = KV[h * (nope + vd) + nope + d];
    }
}

constexpr int ATT_THREADS = 256;

// Flash-decoding: block (h, s) takes positions [s·K3K_ATT_CHUNK, +K3K_ATT_CHUNK) of head h:
// scores, the chunk's max m and Σ e^(score - m) = l, and Σ e^(score - m) · v, written to
// part[(h·NS + s)·(vd + 2)] as m, l, o[vd]. vd <= ATT_THREADS.
__global__ void __launch_bounds__(ATT_THREADS)
mla_attend_part(const float *Q, const float *kv, int n, int H, int nope, int rope, int vd,
                float scale, float *part) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    __shared__ float sc[K3K_ATT_CHUNK], red[32], osum[ATT_THREADS];
    const int h = blockIdx.x, s = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int qk = nope + rope, kvf = H * nope + rope + H * vd;
    const int j0 = s * K3K_ATT_CHUNK, cnt = min(n - j0, K3K_ATT_CHUNK);
    const float *q = Q + (size_t)h * qk;
    for (int jj = warp; jj < cnt; jj += ATT_THREADS / 32) {
        const float *ej = kv + (size_t)(j0 + jj) * kvf;
        const float *kn = ej + (size_t)h * nope, *kp = ej + (size_t)H * nope;
        float dn = 0.0f, dp = 0.0f;
        for (int d = lane; d < nope; d += 32) dn = fmaf(q[d], kn[d], dn);
        for (int d = lane; d < rope; d += 32) dp = fmaf(q[nope + d], kp[d], dp);
        dn = warp_sum(dn);
        dp = warp_sum(dp);
        if (lane == 0) sc[jj] = __fmul_rn(__fadd_rn(dn, dp), scale);
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int jj = threadIdx.x; jj < cnt; jj += ATT_THREADS) mx = fmaxf(mx, sc[jj]);
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int jj = threadIdx.x; jj < cnt; jj += ATT_THREADS) {
        const float e = expf(sc[jj] - mx);
        sc[jj] = e;
        sum += e;
    }
    sum = block_sum(sum, red); /* its barriers also publish sc */
    /* values: ns streams of positions per value column, four loads in flight each */
    const int ns = ATT_THREADS / vd, st = threadIdx.x / vd, d = threadIdx.x % vd;
    const float *vals = kv + (size_t)j0 * kvf + (size_t)H * nope + rope + (size_t)h * vd + d;
    float acc = 0.0f;
    if (st < ns) {
        int jj = st;
        for (; jj + 3 * ns < cnt; jj += 4 * ns) {
            const float v0 = vals[(size_t)jj * kvf], v1 = vals[(size_t)(jj + ns) * kvf];
            const float v2 = vals[(size_t)(jj + 2 * ns) * kvf], v3 = vals[(size_t)(jj + 3 * ns) * kvf];
            acc = fmaf(sc[jj], v0, acc);
            acc = fmaf(sc[jj + ns], v1, acc);
            acc = fmaf(sc[jj + 2 * ns], v2, acc);
            acc = fmaf(sc[jj + 3 * ns], v3, acc);
        }
        for (; jj < cnt; jj += ns) acc = fmaf(sc[jj], vals[(size_t)jj * kvf], acc);
    }
    osum[threadIdx.x] = acc;
    __syncthreads();
    float *out = part + ((size_t)h * gridDim.y + s) * (vd + 2);
    if (threadIdx.x < vd) {
        float o = 0.0f;
        for (int t = 0; t < ns; t++) o += osum[t * vd + threadIdx.x];
        out[2 + threadIdx.x] = o;
    }
    if (threadIdx.x == 0) out[0] = mx, out[1] = sum;
}

// o[h][d] = Σ_s o_s[d] · e^(m_s - M) / Σ_s l_s · e^(m_s - M), M = max_s m_s.
__global__ void mla_attend_merge(const float *part, int NS, int vd, float *o) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    const int h = blockIdx.x;
    const float *p = part + (size_t)h * NS * (vd + 2);
    float M = -INFINITY, L = 0.0f;
    for (int s = 0; s < NS; s++) M = fmaxf(M, p[(size_t)s * (vd + 2)]);
    for (int s = 0; s < NS; s++) L += p[(size_t)s * (vd + 2) + 1] * expf(p[(size_t)s * (vd + 2)] - M);
    for (int d = threadIdx.x; d < vd; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < NS; s++)
            acc = fmaf(p[(size_t)s * (vd + 2) + 2 + d], expf(p[(size_t)s * (vd + 2)] - M), acc);
        o[(size_t)h * vd + d] = acc / L;
    }
}

// ---- MLA over the latent cache (absorbed form, spec §7.5; src/model/mla.c) --------------

// qa[h] = W_ukᵀ q_nope[h] ++ q_pe[h]: thread i of block (h, y) sums column i of head h's W_uk
// rows (kv_b_proj rows h·(nope + vd) + d, d ascending) times q_nope[d], as absorb() does.
template <int DT>
__global__ void mla_absorb_k(const float *Q, const uint8_t *W, const float *scale, int H, int nope,
                             int rope, int vd, int lora, float *qa) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    const int h = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x, qk = nope + rope;
    const int kvf = lora + rope;
    const float *q = Q + (size_t)h * qk;
    if (i < lora) {
        float acc = 0.0f;
        for (int d = 0; d < nope; d++) {
            const int64_t row = (int64_t)h * (nope + vd) + d;
            float w = weight_at<DT>(W, row * lora + i);
            if (DT == K3K_I8) w *= scale[row];
            acc = fmaf(q[d], w, acc);
        }
        qa[(size_t)h * kvf + i] = acc;
    }
    if (blockIdx.y == 0)
        for (int k = threadIdx.x; k < rope; k += blockDim.x) qa[(size_t)h * kvf + lora + k] = q[nope + k];
}

// Flash-decoding over the latent rows lat [n][lora + rope], which every head shares: block
// (g, s, z) takes heads [g·LAT_HG, +LAT_HG), positions [s·per, +per) in tiles of LAT_TJ and
// latent columns [z·LAT_COLS, +LAT_COLS). Each latent row is read once per head group (not
// once per head): a tile's scores qa[h]·lat_j are register-blocked products (4 heads × 2
// positions per thread, both operands staged in shared memory LAT_TD columns at a time),
// then an online softmax per head (running max m, l = Σ e^(score - m), the accumulators
// rescaled when m grows) and acc[h][c] += e^(score - m) · c_j[c] with c_j read once per tile
// for all LAT_HG heads. Writes part[(h·NS + s)·(lora + 2)] = m, l, acc[lora] for
// mla_attend_merge. Deterministic: the order depends on n only, not on the GPU.
constexpr int LAT_HG = 16, LAT_TJ = 128, LAT_TD = 16, LAT_THREADS = 256;
static_assert(LAT_HG * LAT_TD == LAT_THREADS, "one query element per thread and step");
constexpr int LAT_COLS = 2 * LAT_THREADS; // accumulator columns per block (2 per thread)

__global__ void __launch_bounds__(LAT_THREADS)
mla_latent_split(const float *qa, const float *lat, int n, int per, int H, int lora, int rope,
                 float scale, float *part) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    __shared__ float Ls[LAT_TD][LAT_TJ + 1], Qs[LAT_HG][LAT_TD];
    __shared__ __align__(16) float P[LAT_TJ][LAT_HG];
    __shared__ float M[LAT_HG], Lsum[LAT_HG], R[LAT_HG];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, kvf = lora + rope;
    const int h0 = blockIdx.x * LAT_HG, s = blockIdx.y, c0 = blockIdx.z * LAT_COLS + tid;
    const int hq = tid / 64, jp = tid % 64; /* score block: heads 4hq.., positions jp, jp + 64 */
    const int j0 = s * per, j1 = min(n, j0 + per);
    float acc[LAT_HG][2] = {};
    if (tid < LAT_HG) M[tid] = -INFINITY, Lsum[tid] = 0.0f;
    for (int jt = j0; jt < j1; jt += LAT_TJ) {
        const int cnt = min(LAT_TJ, j1 - jt);
        float sc[4][2] = {}, nl[LAT_TJ * LAT_TD / LAT_THREADS], nq;
        /* step d0's operands are fetched into registers during step d0 - LAT_TD's products */
        auto fetch = [&](int d0) {
#pragma unroll
            for (int k = 0; k < LAT_TJ * LAT_TD / LAT_THREADS; k++) {
                const int i = tid + k * LAT_THREADS, jj = i / LAT_TD, dd = i % LAT_TD;
                nl[k] = jj < cnt && d0 + dd < kvf ? lat[(size_t)(jt + jj) * kvf + d0 + dd] : 0.0f;
            }
            const int hh = tid / LAT_TD, dd = tid % LAT_TD; /* LAT_HG·LAT_TD == LAT_THREADS */
            nq = h0 + hh < H && d0 + dd < kvf ? qa[(size_t)(h0 + hh) * kvf + d0 + dd] : 0.0f;
        };
        fetch(0);
        for (int d0 = 0; d0 < kvf; d0 += LAT_TD) {
            __syncthreads(); /* the last step's readers are done */
#pragma unroll
            for (int k = 0; k < LAT_TJ * LAT_TD / LAT_THREADS; k++) {
                const int i = tid + k * LAT_THREADS;
                Ls[i % LAT_TD][i / LAT_TD] = nl[k];
            }
            Qs[tid / LAT_TD][tid % LAT_TD] = nq;
            __syncthreads();
            if (d0 + LAT_TD < kvf) fetch(d0 + LAT_TD);
#pragma unroll
            for (int dd = 0; dd < LAT_TD; dd++) {
                const float l0 = Ls[dd][jp], l1 = Ls[dd][jp + 64];
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    const float q = Qs[4 * hq + a][dd];
                    sc[a][0] = fmaf(q, l0, sc[a][0]), sc[a][1] = fmaf(q, l1, sc[a][1]);
                }
            }
        }
        for (int a = 0; a < 4; a++) /* positions past the split's end weigh nothing */
            for (int b = 0; b < 2; b++)
                P[jp + 64 * b][4 * hq + a] = jp + 64 * b < cnt ? __fmul_rn(sc[a][b], scale) : -INFINITY;
        __syncthreads();
        for (int hh = 2 * warp; hh < 2 * warp + 2; hh++) { /* warp w: heads 2w, 2w + 1 */
            float mx = -INFINITY;
            for (int jj = lane; jj < cnt; jj += 32) mx = fmaxf(mx, P[jj][hh]);
            mx = fmaxf(warp_max(mx), M[hh]);
            float sum = 0.0f;
            for (int jj = lane; jj < LAT_TJ; jj += 32) {
                const float e = jj < cnt ? expf(P[jj][hh] - mx) : 0.0f;
                P[jj][hh] = e;
                sum += e;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                const float r = M[hh] == -INFINITY ? 0.0f : expf(M[hh] - mx);
                R[hh] = r, Lsum[hh] = fmaf(Lsum[hh], r, sum), M[hh] = mx;
            }
        }
        __syncthreads();
#pragma unroll
        for (int hh = 0; hh < LAT_HG; hh++) acc[hh][0] *= R[hh], acc[hh][1] *= R[hh];
        const float *row = lat + (size_t)jt * kvf;
#pragma unroll 4
        for (int jj = 0; jj < cnt; jj++, row += kvf) {
            const float v0 = c0 < lora ? row[c0] : 0.0f;
            const float v1 = c0 + LAT_THREADS < lora ? row[c0 + LAT_THREADS] : 0.0f;
            const float4 *p4 = (const float4 *)P[jj];
#pragma unroll
            for (int q = 0; q < LAT_HG / 4; q++) {
                const float4 p = p4[q];
                acc[4 * q][0] = fmaf(p.x, v0, acc[4 * q][0]), acc[4 * q][1] = fmaf(p.x, v1, acc[4 * q][1]);
                acc[4 * q + 1][0] = fmaf(p.y, v0, acc[4 * q + 1][0]), acc[4 * q + 1][1] = fmaf(p.y, v1, acc[4 * q + 1][1]);
                acc[4 * q + 2][0] = fmaf(p.z, v0, acc[4 * q + 2][0]), acc[4 * q + 2][1] = fmaf(p.z, v1, acc[4 * q + 2][1]);
                acc[4 * q + 3][0] = fmaf(p.w, v0, acc[4 * q + 3][0]), acc[4 * q + 3][1] = fmaf(p.w, v1, acc[4 * q + 3][1]);
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int hh = 0; hh < LAT_HG; hh++) {
        if (h0 + hh >= H) break;
        float *out = part + ((size_t)(h0 + hh) * gridDim.y + s) * (lora + 2);
        if (c0 < lora) out[2 + c0] = acc[hh][0];
        if (c0 + LAT_THREADS < lora) out[2 + c0 + LAT_THREADS] = acc[hh][1];
        if (blockIdx.z == 0 && tid == 0) out[0] = M[hh], out[1] = Lsum[hh];
    }
}

// o[h][v] = W_uv[h] · acc[h]: one warp per output row (kv_b_proj row h·(nope + vd) + nope + v).
template <int DT>
__global__ void mla_up_k(const uint8_t *W, const float *scale, const float *acc, int H, int nope,
                         int vd, int lora, float *o) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (r >= H * vd) return;
    const int h = r / vd, v = r % vd;
    const int64_t row = (int64_t)h * (nope + vd) + nope + v;
    const float *a = acc + (size_t)h * lora;
    float t = 0.0f;
    for (int i = lane; i < lora; i += 32) t = fmaf(weight_at<DT>(W, row * lora + i), a[i], t);
    t = warp_sum(t);
    if (lane == 0) o[r] = DT == K3K_I8 ? t * scale[row] : t;
}

// ---- router -----------------------------------------------------------------------------

constexpr int ROUTER_THREADS = 1024;

// Each expert's rank in canonical order = how many experts beat it (higher biased score,
// or equal and a lower id); the first k ranks are the choice. A NaN or -Inf biased score
// (corrupt weights) counts as -FLT_MAX, as in src/model/ffn.c k3_moe_select: it ranks last
// and every rank is taken once, so the k ids are distinct; its NaN weight reaches the
// logits, where the engine reports it.
__global__ void __launch_bounds__(ROUTER_THREADS)
router_topk_k(const float *logits, const float *bias, int E, int k, float scaling, int *ids,
              float *weights) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    extern __shared__ float rs[]; // scores [E], biased [E]
    __shared__ int chosen[K3K_MAX_EXPERTS];
    float *score = rs, *biased = rs + E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const float s = sigmoidf_(logits[e]), b = __fadd_rn(s, bias[e]);
        score[e] = s;
        biased[e] = b > -FLT_MAX ? b : -FLT_MAX;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const float be = biased[e];
        int rank = 0;
        for (int o = 0; o < E; o++) {
            const float bo = biased[o];
            rank += bo > be || (bo == be && o < e);
        }
        if (rank < k) chosen[rank] = e;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int j = 0; j < k; j++) sum = __fadd_rn(sum, score[chosen[j]]);
        sum = __fadd_rn(sum, 1e-20f);
        for (int j = 0; j < k; j++) {
            ids[j] = chosen[j];
            weights[j] = __fmul_rn(__fdiv_rn(score[chosen[j]], sum), scaling);
        }
    }
}

__global__ void moe_sum_k(const float *eo, const float *w, int k, int n, float *acc) {
    pdl_trigger();
    pdl_wait(); // launched early (launch_pdl); nothing read or written before
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = 0.0f;
    for (int j = 0; j < k; j++) a = __fadd_rn(a, __fmul_rn(eo[(size_t)j * n + i], w[j]));
    acc[i] = a;
}

__global__ void fill_random_k(uint32_t *p, size_t n, uint64_t seed, uint32_t mask) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + i * 0x9e3779b97f4a7c15ull; /* SplitMix64 */
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        p[i] = (uint32_t)(z ^ (z >> 31)) & mask;
    }
}

} // namespace

extern "C" cudaError_t k3k_fill_random(void *p, size_t bytes, uint64_t seed, uint32_t mask,
                                       cudaStream_t s) {
    fill_random_k<<<1024, 256, 0, s>>>(static_cast<uint32_t *>(p), bytes / 4, seed, mask);
    return cudaGetLastError();
}

// ---- launchers (kern.h) -----------------------------------------------------------------

extern "C" cudaError_t k3k_matvec(const k3k_mat *w, const float *x, float *y, cudaStream_t s) {
    if (w->rows <= 0) return cudaSuccess;
    switch (w->dtype) {
    case K3K_BF16: return launch_matvec<K3K_BF16>(w, x, y, s);
    case K3K_I8: return launch_matvec<K3K_I8>(w, x, y, s);
    case K3K_F32: return launch_matvec<K3K_F32>(w, x, y, s);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t k3k_matvec_multi(const k3k_mat *const *w, float *const *y, int n,
                                        const float *x, cudaStream_t s) {
    bool one = n >= 1 && n <= K3K_MAX_MULTI && ((uintptr_t)x & 15) == 0 &&
               (w[0]->dtype == K3K_BF16 || w[0]->dtype == K3K_I8);
    const int es = w[0]->dtype == K3K_BF16 ? 2 : 1;
    mv_multi mm = {};
    mm.n = n, mm.cols = w[0]->cols;
    mm.start[0] = 0;
    for (int i = 0; one && i < n; i++) {
        one = w[i]->dtype == w[0]->dtype && w[i]->cols == mm.cols && (mm.cols * es) % 16 == 0 &&
              ((uintptr_t)w[i]->data & 15) == 0;
        mm.w[i] = static_cast<const uint8_t *>(w[i]->data);
        mm.scale[i] = w[i]->scale;
        mm.y[i] = y[i];
        mm.start[i + 1] = mm.start[i] + w[i]->rows;
    }
    if (!one) { /* mixed shapes or dtypes: one launch each */
        for (int i = 0; i < n; i++) {
            cudaError_t e = k3k_matvec(w[i], x, y[i], s);
            if (e != cudaSuccess) return e;
        }
        return cudaSuccess;
    }
    const int grid = blocks_for(mm.start[n], MV_THREADS / 32);
    if (w[0]->dtype == K3K_BF16)
        return launch_pdl(matvec_multi_k<K3K_BF16>, grid, MV_THREADS, 0, s, mm, x);
    return launch_pdl(matvec_multi_k<K3K_I8>, grid, MV_THREADS, 0, s, mm, x);
}

extern "C" cudaError_t k3k_experts_gate_up(const k3k_experts *ex, const float *z, float beta,
                                           float linear_beta, float *h, cudaStream_t s) {
    if (!experts_ok(ex) || ((uintptr_t)z & 7)) return cudaErrorInvalidValue;
    return launch_experts<true>(ex, z, beta, linear_beta, h, s);
}

extern "C" cudaError_t k3k_experts_down(const k3k_experts *ex, const float *h, float *out,
                                        cudaStream_t s) {
    if (!experts_ok(ex) || ((uintptr_t)h & 7)) return cudaErrorInvalidValue;
    return launch_experts<false>(ex, h, 0, 0, out, s);
}

extern "C" void k3k_set_tuning(int pdl, int mx_schedule) {
    tuning_pdl = pdl != 0;
    tuning_mx_schedule = mx_schedule >= 0 && mx_schedule < K3K_MX_SCHEDULES ? mx_schedule : 0;
}

extern "C" void k3k_mx_schedule(int i, int gate_up, int *copy_warp, int *stages, int *steps,
                                int *legacy_decode) {
    i = i >= 0 && i < K3K_MX_SCHEDULES ? i : 0;
    *copy_warp = i != MX_CHUNK_MAJOR;
    const mx_sched sc = i == MX_CHUNK_MAJOR ? mx_sched{2, 3, false} : mx_sched_of(gate_up, i);
    *stages = sc.stages, *steps = sc.steps, *legacy_decode = sc.legacy;
}

extern "C" cudaError_t k3k_experts_prepare(const k3k_experts *ex, const uint8_t *src,
                                           uint8_t *dst, cudaStream_t s) {
    if (!experts_layout_ok(ex)) return cudaErrorInvalidValue;
    uint32_t *flag = reinterpret_cast<uint32_t *>(dst + ex->off_flag);
    cudaError_t e = cudaMemsetAsync(flag, 0, 4, s);
    if (e != cudaSuccess) return e;
    const uint64_t op[3] = {ex->off_w1p, ex->off_w3p, ex->off_w2p};
    const uint64_t os[3] = {ex->off_w1s, ex->off_w3s, ex->off_w2s};
    for (int i = 0; i < 3; i++) {
        const int rows = i < 2 ? ex->inter : ex->latent, cols = i < 2 ? ex->latent : ex->inter;
        const int64_t n = (int64_t)rows / 16 * (cols / 32) * 32;
        const int grid = (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
        const bool sm = mx_step_major(cols);
        mx_prepare_k<<<grid, 256, 0, s>>>(src + op[i], src + os[i],
                                          dst + (i < 2 ? ex->off_w1p : ex->off_w2p), rows, cols,
                                          i == 1, i == 2, sm,
                                          sm && mx_sched_of(i < 2, mx_schedule()).legacy, flag);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t k3k_rmsnorm(const float *x, const void *w, int wdtype, int n, float eps,
                                   float *y, cudaStream_t s) {
    return launch_pdl(rmsnorm_k, 1, 1024, 0, s, x, w, wdtype, n, eps, y);
}

extern "C" cudaError_t k3k_attn_res(const float *const *values, int n, const float *sw,
                                    int hidden, float eps, float *scores, float *out,
                                    cudaStream_t s) {
    if (n < 1 || n > K3K_MAX_RES) return cudaErrorInvalidValue;
    res_values v;
    for (int j = 0; j < n; j++) v.v[j] = values[j];
    cudaError_t e = launch_pdl(attn_res_scores, n, 1024, 0, s, v, sw, hidden, eps, scores);
    if (e != cudaSuccess) return e;
    return launch_pdl(attn_res_mix, blocks_for(hidden, 256), 256, 0, s, v, n, scores, hidden, out);
}

extern "C" cudaError_t k3k_add(const float *a, const float *b, float *y, int n, cudaStream_t s) {
    return launch_pdl(add_k, blocks_for(n, 256), 256, 0, s, a, b, y, n);
}

extern "C" cudaError_t k3k_situ(const float *gate, const float *up, int n, float beta,
                                float linear_beta, float *out, cudaStream_t s) {
    return launch_pdl(situ_k, blocks_for(n, 256), 256, 0, s, gate, up, n, beta, linear_beta, out);
}

extern "C" cudaError_t k3k_sigmoid_gate(float *x, const float *g, int n, cudaStream_t s) {
    return launch_pdl(sigmoid_gate_k, blocks_for(n, 256), 256, 0, s, x, g, n);
}

extern "C" cudaError_t k3k_short_conv(float *x, const float *taps, float *hist, int P, int conv,
                                      cudaStream_t s) {
    return launch_pdl(short_conv_k, blocks_for(P, 256), 256, 0, s, x, taps, hist, P, conv);
}

extern "C" cudaError_t k3k_kda_heads(float *q, float *k, const float *v, const float *f,
                                     const float *b, const float *g, const float *a_log,
                                     const float *dt_bias, const float *o_norm, float *S, int H,
                                     int D, float lower_bound, float eps, float *o,
                                     cudaStream_t s) {
    if (D < 1 || D > 1024) return cudaErrorInvalidValue;
    const float q_scale = (float)(1.0 / sqrt((double)D));
    const int threads = (D + 31) / 32 * 32;
    return launch_pdl(kda_heads_k, H, threads, 3 * (size_t)D * sizeof(float), s, q, k, v, f, b,
                      g, a_log, dt_bias, o_norm, S, D, q_scale, lower_bound, eps, o);
}

extern "C" cudaError_t k3k_mla_append(float *kv, int t, const float *KV, const float *ckv, int H,
                                      int nope, int rope, int vd, int lora, cudaStream_t s) {
    const int kvf = H * nope + rope + H * vd;
    return launch_pdl(mla_append_k, blocks_for(kvf, 256), 256, 0, s, kv, t, KV, ckv, H, nope, rope, vd,
                      lora);
}

extern "C" cudaError_t k3k_mla_attend(const float *Q, const float *kv, int t, int H, int nope,
                                      int rope, int vd, float *scratch, float *o,
                                      cudaStream_t s) {
    if (vd < 1 || vd > ATT_THREADS) return cudaErrorInvalidValue;
    const float scale = (float)(1.0 / sqrt((double)(nope + rope)));
    const int n = t + 1, NS = (n + K3K_ATT_CHUNK - 1) / K3K_ATT_CHUNK;
    cudaError_t e = launch_pdl(mla_attend_part, dim3(H, NS), ATT_THREADS, 0, s, Q, kv, n, H, nope,
                               rope, vd, scale, scratch);
    if (e != cudaSuccess) return e;
    return launch_pdl(mla_attend_merge, H, vd < 128 ? 32 : 128, 0, s, scratch, NS, vd, o);
}

extern "C" cudaError_t k3k_router_topk(const float *logits, const float *bias, int E, int k,
                                       float scaling, int *ids, float *weights,
                                       cudaStream_t s) {
    if (E < 1 || E > 8192 || k < 1 || k > K3K_MAX_EXPERTS || k > E) return cudaErrorInvalidValue;
    const size_t smem = 2 * (size_t)E * sizeof(float);
    if (smem > 48 * 1024) {
        cudaError_t rc = cudaFuncSetAttribute(router_topk_k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              (int)smem);
        if (rc != cudaSuccess) return rc;
    }
    return launch_pdl(router_topk_k, 1, ROUTER_THREADS, smem, s, logits, bias, E, k, scaling, ids,
                      weights);
}

extern "C" cudaError_t k3k_moe_sum(const float *eo, const float *w, int k, int n, float *acc,
                                   cudaStream_t s) {
    return launch_pdl(moe_sum_k, blocks_for(n, 256), 256, 0, s, eo, w, k, n, acc);
}

extern "C" cudaError_t k3k_mla_latent_attend(const float *Q, const k3k_mat *kv_b,
                                             const float *lat, int t, int H, int nope, int rope,
                                             int vd, int lora, float *qa, float *acc,
                                             float *scratch, float *o, cudaStream_t s) {
    if (kv_b->cols != lora || kv_b->rows != (int64_t)H * (nope + vd) || lora < 1 || lora > 4096)
        return cudaErrorInvalidValue;
    const uint8_t *W = (const uint8_t *)kv_b->data;
    const int dt = kv_b->dtype;
    if (dt != K3K_F32 && dt != K3K_BF16 && dt != K3K_I8) return cudaErrorInvalidValue;
    const dim3 ag(H, (lora + 127) / 128);
    cudaError_t e = dt == K3K_BF16 ? launch_pdl(mla_absorb_k<K3K_BF16>, ag, 128, 0, s, Q, W, kv_b->scale, H, nope, rope, vd, lora, qa)
                  : dt == K3K_I8   ? launch_pdl(mla_absorb_k<K3K_I8>, ag, 128, 0, s, Q, W, kv_b->scale, H, nope, rope, vd, lora, qa)
                                   : launch_pdl(mla_absorb_k<K3K_F32>, ag, 128, 0, s, Q, W, kv_b->scale, H, nope, rope, vd, lora, qa);
    if (e != cudaSuccess) return e;
    const float scale = (float)(1.0 / sqrt((double)(nope + rope)));
    /* splits of at least two tiles (the rescaling is then always exercised), at most
     * K3K_LAT_SPLITS: the scratch is bounded whatever the context */
    const int n = t + 1, tiles = (n + LAT_TJ - 1) / LAT_TJ;
    const int splits = min(K3K_LAT_SPLITS, (tiles + 1) / 2);
    const int per = (tiles + splits - 1) / splits * LAT_TJ, NS = (n + per - 1) / per;
    const dim3 grid((H + LAT_HG - 1) / LAT_HG, NS, (lora + LAT_COLS - 1) / LAT_COLS);
    e = launch_pdl(mla_latent_split, grid, LAT_THREADS, 0, s, (const float *)qa, lat, n, per, H,
                   lora, rope, scale, scratch);
    if (e != cudaSuccess) return e;
    e = launch_pdl(mla_attend_merge, H, 128, 0, s, (const float *)scratch, NS, lora, acc);
    if (e != cudaSuccess) return e;
    const int ub = (H * vd + 7) / 8;
    return dt == K3K_BF16 ? launch_pdl(mla_up_k<K3K_BF16>, ub, 256, 0, s, W, kv_b->scale, (const float *)acc, H, nope, vd, lora, o)
         : dt == K3K_I8   ? launch_pdl(mla_up_k<K3K_I8>, ub, 256, 0, s, W, kv_b->scale, (const float *)acc, H, nope, vd, lora, o)
                          : launch_pdl(mla_up_k<K3K_F32>, ub, 256, 0, s, W, kv_b->scale, (const float *)acc, H, nope, vd, lora, o);
}
