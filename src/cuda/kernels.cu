// kernels.cu — the CUDA kernels behind kern.h (read that header's invariants first).
//
// Decode-shape products are memory-bound: a BF16 row is read once, 16 bytes per lane per
// load, four loads in flight, one warp (or, for short matrices, several) per row. The MXFP4
// experts keep the input vector in registers ("x-stationary"): each thread owns one
// 32-column group (one 16-byte load of nibbles plus its E8M0 byte) and walks rows, so x is
// read once per block, not once per row; each packed byte is decoded to its two E2M1 values
// by one lookup in a conflict-free shared table, and the group's power-of-two scale is
// applied to the group's sum, which is exact (a power of two commutes with rounding, barring
// under/overflow). Measured speeds and what limits them: BENCHMARKS.md.
#include "kern.h"

#include <cuda_runtime.h>
#include <math.h>

namespace {

constexpr unsigned FULL = 0xffffffffu;

__constant__ float E2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

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
    if (r < rows) {
        const int64_t nv = cols / EPV;
        const uint4 *row = reinterpret_cast<const uint4 *>(W + r * cols * ES);
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        int64_t c = part * 32 + lane;
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
    if (gr >= mm.start[mm.n]) return;
    int i = 0;
    while (gr >= mm.start[i + 1]) i++;
    const int64_t r = gr - mm.start[i], nv = mm.cols / EPV;
    const uint4 *row = reinterpret_cast<const uint4 *>(mm.w[i] + r * mm.cols * ES);
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    float acc0 = 0.0f, acc1 = 0.0f;
    int64_t c = lane;
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
void launch_vec(const k3k_mat *w, const float *x, float *y, cudaStream_t s) {
    const int grid = blocks_for(w->rows, MV_THREADS / 32 / S);
    matvec_vec<DT, S><<<grid, MV_THREADS, 0, s>>>(static_cast<const uint8_t *>(w->data), w->scale,
                                                   w->rows, w->cols, x, y);
}

template <int DT>
cudaError_t launch_matvec(const k3k_mat *w, const float *x, float *y, cudaStream_t s) {
    const int es = DT == K3K_BF16 ? 2 : DT == K3K_I8 ? 1 : 4, epv = 16 / es;
    const auto *W = static_cast<const uint8_t *>(w->data);
    const bool aligned = (w->cols * es) % 16 == 0 && ((uintptr_t)W & 15) == 0 &&
                         ((uintptr_t)x & 15) == 0;
    if (!aligned) {
        const int grid = blocks_for(w->rows, MV_THREADS / 32);
        matvec_any<DT><<<grid, MV_THREADS, 0, s>>>(W, w->scale, w->rows, w->cols, x, y);
        return cudaGetLastError();
    }
    // Warps per row: enough warps for ~3 waves of the chip (16384), while every lane keeps at
    // least two 16-byte loads of the row.
    const int64_t nv = w->cols / epv;
    int S = 1;
    while (S < 8 && w->rows < 12288 && w->rows * S < 16384 && nv >= 64 * 2 * S) S *= 2;
    switch (S) {
    case 1: launch_vec<DT, 1>(w, x, y, s); break;
    case 2: launch_vec<DT, 2>(w, x, y, s); break;
    case 4: launch_vec<DT, 4>(w, x, y, s); break;
    default: launch_vec<DT, 8>(w, x, y, s); break;
    }
    return cudaGetLastError();
}

// ---- MXFP4 experts --------------------------------------------------------------------

constexpr int MX_THREADS = 128; // 4 warps; thread t owns column groups t, t + 128, ...
constexpr int MX_CHUNK = 32;    // rows reduced across the warps per shared-memory round

// The decode table: for every packed byte e, the pair (E2M1[e & 15], E2M1[e >> 4]) = (even,
// odd column), in 16 copies interleaved so that copy s sits in banks 2s and 2s + 1: lane l
// reads copy l % 16, so the 16 lanes of a half-warp never share a bank whatever bytes they
// look up (one conflict-free 8-byte load decodes two nibbles). 256 × 16 × 8 = 32 KB.
constexpr int MX_SLOTS = 16;

__device__ void mx_table_init(float2 *tab) {
    for (int i = threadIdx.x; i < 256 * MX_SLOTS; i += blockDim.x) {
        const int e = i / MX_SLOTS;
        tab[i] = make_float2(E2M1[e & 15], E2M1[e >> 4]);
    }
}

// Σ over one 32-column group: E2M1(nibble) · x, without the group scale. p holds the 16
// packed bytes (the low nibble is the even column), xr the 32 x values; lane8 = 8 · (lane % 16)
// selects the lane's copy of the table. Per byte: a shift and a mask-or form the table offset
// (128 · byte + lane8), one 8-byte shared load, two FMAs; four accumulators keep the FMA
// chains short.
__device__ __forceinline__ float mx_group(uint4 p, const float *xr, const float2 *tab,
                                          uint32_t lane8) {
    const uint32_t pw[4] = {p.x, p.y, p.z, p.w};
    const char *t = reinterpret_cast<const char *>(tab);
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const uint32_t v = pw[q];
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const uint32_t off = ((b ? v >> (8 * b - 7) : v << 7) & 0x7f80u) | lane8;
            const float2 f = *reinterpret_cast<const float2 *>(t + off);
            a[(b & 1) * 2] = fmaf(f.x, xr[8 * q + 2 * b], a[(b & 1) * 2]);
            a[(b & 1) * 2 + 1] = fmaf(f.y, xr[8 * q + 2 * b + 1], a[(b & 1) * 2 + 1]);
        }
    }
    return (a[0] + a[1]) + (a[2] + a[3]);
}

// x [cols] slice of group g into registers (zeros past the last group).
__device__ __forceinline__ void load_x32(const float *__restrict__ x, int g, int ng, float *xr) {
    if (g >= ng) {
#pragma unroll
        for (int i = 0; i < 32; i++) xr[i] = 0.0f;
        return;
    }
    const float4 *x4 = reinterpret_cast<const float4 *>(x + (size_t)g * 32);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float4 a = __ldg(x4 + i);
        xr[4 * i] = a.x, xr[4 * i + 1] = a.y, xr[4 * i + 2] = a.z, xr[4 * i + 3] = a.w;
    }
}

// The routed experts of a layer as one list of rows (expert j's row r is row j·rows + r of
// the output). A persistent grid: block b takes a contiguous range of those rows, so the work
// is even to within one row and x is (re)loaded only when the range enters another expert.
// Each step computes two rows of the same expert (GU: their gate (w1) and up (w3) rows, then
// SiTU) while the next step's 16-byte loads are already in flight (software pipelining:
// without it every warp waits for memory, then computes, and the two never overlap).
template <int G, bool GU>
__global__ void __launch_bounds__(MX_THREADS)
experts_k(const k3k_experts ex, const float *__restrict__ x, float beta, float lb,
          float *__restrict__ out) {
    constexpr int NM = GU ? 2 : 1;
    __shared__ float2 tab[256 * MX_SLOTS];
    __shared__ float red[NM][MX_THREADS / 32][MX_CHUNK];
    mx_table_init(tab);
    const int rows = GU ? ex.inter : ex.latent, cols = GU ? ex.latent : ex.inter;
    const int ng = cols / 32, total = ex.n * rows;
    const int r0 = (int)((int64_t)total * blockIdx.x / gridDim.x);
    const int r1 = (int)((int64_t)total * (blockIdx.x + 1) / gridDim.x);
    const uint64_t offp[2] = {GU ? ex.off_w1p : ex.off_w2p, ex.off_w3p};
    const uint64_t offs[2] = {GU ? ex.off_w1s : ex.off_w2s, ex.off_w3s};
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t lane8 = (uint32_t)(lane % MX_SLOTS) * 8;
    __syncthreads(); // the table
    if (r0 >= r1) return; // uniform over the block
    // rows [c0, chunk_end) are reduced together; a step never straddles a chunk or expert end
    auto chunk_end = [&](int gr) { return min(r0 + ((gr - r0) / MX_CHUNK + 1) * MX_CHUNK, r1); };
    auto step_len = [&](int gr) {
        return gr + 1 < chunk_end(gr) && (gr % rows) + 1 < rows ? 2 : 1;
    };
    uint4 q[G][NM][2], qn[G][NM][2];
    uint32_t sc[G][NM][2], scn[G][NM][2];
    auto load = [&](int gr, int len, uint4 (&dq)[G][NM][2], uint32_t (&ds)[G][NM][2]) {
        const int j = gr / rows, r = gr - j * rows;
        const uint8_t *base = ex.base[j];
#pragma unroll
        for (int gi = 0; gi < G; gi++) {
            const int g = threadIdx.x + gi * MX_THREADS;
            const bool on = g < ng;
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const size_t rr = (size_t)r + (len == 2 ? u : 0);
                    dq[gi][m][u] = on ? __ldcs(reinterpret_cast<const uint4 *>(
                                                base + offp[m] + rr * (cols / 2)) + g)
                                      : make_uint4(0, 0, 0, 0);
                    ds[gi][m][u] = on ? base[offs[m] + rr * ng + g] : 127u;
                }
        }
    };
    float xr[G][32];
    int xj = -1, gr = r0, len = step_len(r0), c0 = r0;
    load(gr, len, q, sc);
    for (;;) {
        const int j = gr / rows, nxt = gr + len;
        if ((GU ? 0 : j) != xj) {
            xj = GU ? 0 : j;
#pragma unroll
            for (int gi = 0; gi < G; gi++)
                load_x32(x + (size_t)xj * cols, threadIdx.x + gi * MX_THREADS, ng, xr[gi]);
        }
        const int nlen = nxt < r1 ? step_len(nxt) : 0;
        if (nlen) load(nxt, nlen, qn, scn); /* in flight during the arithmetic below */
        float acc[NM][2] = {};
#pragma unroll
        for (int gi = 0; gi < G; gi++) {
            if (warp * 32 + gi * MX_THREADS >= ng) continue; /* whole warp past the row */
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int u = 0; u < 2; u++)
                    acc[m][u] = fmaf(mx_group(q[gi][m][u], xr[gi], tab, lane8),
                                     e8m0f(sc[gi][m][u]), acc[m][u]);
        }
#pragma unroll
        for (int m = 0; m < NM; m++) {
            const float s0 = warp_sum(acc[m][0]), s1 = warp_sum(acc[m][1]);
            if (lane == 0) {
                red[m][warp][gr - c0] = s0;
                if (len == 2) red[m][warp][gr - c0 + 1] = s1;
            }
        }
        const int ce = chunk_end(gr);
        if (nxt >= ce) { /* the chunk is complete: sum the warps' parts, write, start anew */
            __syncthreads();
            const int i = threadIdx.x;
            if (i < ce - c0) {
                float s0 = 0.0f, s1 = 0.0f;
                for (int w = 0; w < MX_THREADS / 32; w++) {
                    s0 += red[0][w][i];
                    if (GU) s1 += red[NM - 1][w][i];
                }
                out[c0 + i] = GU ? situf(s0, s1, beta, lb) : s0;
            }
            __syncthreads();
            c0 = ce;
        }
        if (!nlen) break;
        gr = nxt, len = nlen;
#pragma unroll
        for (int gi = 0; gi < G; gi++)
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int u = 0; u < 2; u++) q[gi][m][u] = qn[gi][m][u], sc[gi][m][u] = scn[gi][m][u];
    }
}

// The tile variant: block (t, j) computes rows [32 t, 32 t + 32) of expert j, x loaded once
// per block; no software pipelining (many small blocks hide latency instead).
template <int G, bool GU>
__global__ void __launch_bounds__(MX_THREADS)
experts_tile_k(const k3k_experts ex, const float *__restrict__ x, float beta, float lb,
               float *__restrict__ out) {
    constexpr int NM = GU ? 2 : 1;
    __shared__ float2 tab[256 * MX_SLOTS];
    __shared__ float red[NM][MX_THREADS / 32][MX_CHUNK];
    mx_table_init(tab);
    const int rows = GU ? ex.inter : ex.latent, cols = GU ? ex.latent : ex.inter, ng = cols / 32;
    const int j = blockIdx.y, r0 = blockIdx.x * MX_CHUNK;
    const uint8_t *base = ex.base[j];
    const uint64_t offp[2] = {GU ? ex.off_w1p : ex.off_w2p, ex.off_w3p};
    const uint64_t offs[2] = {GU ? ex.off_w1s : ex.off_w2s, ex.off_w3s};
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t lane8 = (uint32_t)(lane % MX_SLOTS) * 8;
    float xr[G][32];
#pragma unroll
    for (int gi = 0; gi < G; gi++)
        load_x32(x + (GU ? 0 : (size_t)j * cols), threadIdx.x + gi * MX_THREADS, ng, xr[gi]);
    __syncthreads();
#pragma unroll 2
    for (int rr = 0; rr < MX_CHUNK; rr++) {
        const int r = r0 + rr;
        float acc[NM] = {};
        if (r < rows) {
#pragma unroll
            for (int gi = 0; gi < G; gi++) {
                const int g = threadIdx.x + gi * MX_THREADS;
                if (warp * 32 + gi * MX_THREADS >= ng || g >= ng) continue;
#pragma unroll
                for (int m = 0; m < NM; m++) {
                    const uint4 q = __ldcs(reinterpret_cast<const uint4 *>(
                                               base + offp[m] + (size_t)r * (cols / 2)) + g);
                    const float sc = e8m0f(base[offs[m] + (size_t)r * ng + g]);
                    acc[m] = fmaf(mx_group(q, xr[gi], tab, lane8), sc, acc[m]);
                }
            }
        }
#pragma unroll
        for (int m = 0; m < NM; m++) {
            const float t = warp_sum(acc[m]);
            if (lane == 0) red[m][warp][rr] = t;
        }
    }
    __syncthreads();
    const int i = threadIdx.x;
    if (i < MX_CHUNK && r0 + i < rows) {
        float s0 = 0.0f, s1 = 0.0f;
        for (int w = 0; w < MX_THREADS / 32; w++) {
            s0 += red[0][w][i];
            if (GU) s1 += red[NM - 1][w][i];
        }
        out[(size_t)j * rows + r0 + i] = GU ? situf(s0, s1, beta, lb) : s0;
    }
}

bool experts_ok(const k3k_experts *ex) {
    if (ex->n < 1 || ex->n > K3K_MAX_EXPERTS || ex->inter % 32 || ex->latent % 32) return false;
    for (int j = 0; j < ex->n; j++)
        if ((uintptr_t)(ex->base[j] + ex->off_w1p) % 16 || (uintptr_t)(ex->base[j] + ex->off_w3p) % 16 ||
            (uintptr_t)(ex->base[j] + ex->off_w2p) % 16)
            return false;
    return true;
}

// One block per SM slot the kernel's occupancy allows (at most one per row).
template <int G, bool GU>
cudaError_t launch_experts(const k3k_experts *ex, const float *x, float beta, float lb,
                           float *out, cudaStream_t s) {
    const int v = ex->variant != K3K_EXPERTS_AUTO ? ex->variant
                  : GU ? K3K_EXPERTS_TILE : K3K_EXPERTS_PERSISTENT;
    if (v == K3K_EXPERTS_TILE) {
        const dim3 grid(blocks_for(GU ? ex->inter : ex->latent, MX_CHUNK), ex->n);
        experts_tile_k<G, GU><<<grid, MX_THREADS, 0, s>>>(*ex, x, beta, lb, out);
        return cudaGetLastError();
    }
    int dev = 0, sms = 0, per_sm = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, experts_k<G, GU>, MX_THREADS, 0);
    if (e != cudaSuccess) return e;
    const int total = ex->n * (GU ? ex->inter : ex->latent);
    int grid = sms * (per_sm > 0 ? per_sm : 1);
    grid = grid < total ? grid : total;
    experts_k<G, GU><<<grid, MX_THREADS, 0, s>>>(*ex, x, beta, lb, out);
    return cudaGetLastError();
}

// ---- element-wise and small reductions --------------------------------------------------

__global__ void rmsnorm_k(const float *x, const void *w, int wdt, int n, float eps, float *y) {
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
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(a[i], b[i]);
}

__global__ void situ_k(const float *gate, const float *up, int n, float beta, float lb,
                       float *out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = situf(gate[i], up[i], beta, lb);
}

__global__ void sigmoid_gate_k(float *x, const float *g, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(x[i], sigmoidf_(g[i]));
}

// ---- KDA --------------------------------------------------------------------------------

__global__ void short_conv_k(float *x, const float *taps, float *hist, int P, int conv) {
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

// ---- router -----------------------------------------------------------------------------

constexpr int ROUTER_THREADS = 1024;

// Each expert's rank in canonical order = how many experts beat it (higher biased score,
// or equal and a lower id); the first k ranks are the choice.
__global__ void __launch_bounds__(ROUTER_THREADS)
router_topk_k(const float *logits, const float *bias, int E, int k, float scaling, int *ids,
              float *weights) {
    extern __shared__ float rs[]; // scores [E], biased [E]
    __shared__ int chosen[K3K_MAX_EXPERTS];
    float *score = rs, *biased = rs + E;
    if (threadIdx.x < K3K_MAX_EXPERTS) chosen[threadIdx.x] = -1; // stays -1 only for NaN scores
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const float s = sigmoidf_(logits[e]);
        score[e] = s;
        biased[e] = __fadd_rn(s, bias[e]);
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
        for (int j = 0; j < k; j++) sum = __fadd_rn(sum, chosen[j] < 0 ? NAN : score[chosen[j]]);
        sum = __fadd_rn(sum, 1e-20f);
        for (int j = 0; j < k; j++) {
            ids[j] = chosen[j];
            weights[j] = chosen[j] < 0 ? NAN : __fmul_rn(__fdiv_rn(score[chosen[j]], sum), scaling);
        }
    }
}

__global__ void moe_sum_k(const float *eo, const float *w, int k, int n, float *acc) {
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
        matvec_multi_k<K3K_BF16><<<grid, MV_THREADS, 0, s>>>(mm, x);
    else
        matvec_multi_k<K3K_I8><<<grid, MV_THREADS, 0, s>>>(mm, x);
    return cudaGetLastError();
}

extern "C" cudaError_t k3k_experts_gate_up(const k3k_experts *ex, const float *z, float beta,
                                           float linear_beta, float *h, cudaStream_t s) {
    if (!experts_ok(ex) || ((uintptr_t)z & 15)) return cudaErrorInvalidValue;
    const int ng = ex->latent / 32;
    if (ng <= MX_THREADS) return launch_experts<1, true>(ex, z, beta, linear_beta, h, s);
    if (ng <= 2 * MX_THREADS) return launch_experts<2, true>(ex, z, beta, linear_beta, h, s);
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t k3k_experts_down(const k3k_experts *ex, const float *h, float *out,
                                        cudaStream_t s) {
    if (!experts_ok(ex) || ((uintptr_t)h & 15)) return cudaErrorInvalidValue;
    const int ng = ex->inter / 32;
    if (ng <= MX_THREADS) return launch_experts<1, false>(ex, h, 0, 0, out, s);
    if (ng <= 2 * MX_THREADS) return launch_experts<2, false>(ex, h, 0, 0, out, s);
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t k3k_rmsnorm(const float *x, const void *w, int wdtype, int n, float eps,
                                   float *y, cudaStream_t s) {
    rmsnorm_k<<<1, 1024, 0, s>>>(x, w, wdtype, n, eps, y);
    return cudaGetLastError();
}

extern "C" cudaError_t k3k_attn_res(const float *const *values, int n, const float *sw,
                                    int hidden, float eps, float *scores, float *out,
                                    cudaStream_t s) {
    if (n < 1 || n > K3K_MAX_RES) return cudaErrorInvalidValue;
    res_values v;
    for (int j = 0; j < n; j++) v.v[j] = values[j];
    attn_res_scores<<<n, 1024, 0, s>>>(v, sw, hidden, eps, scores);
    attn_res_mix<<<blocks_for(hidden, 256), 256, 0, s>>>(v, n, scores, hidden, out);
    return cudaGetLastError();
}

extern "C" cudaError_t k3k_add(const float *a, const float *b, float *y, int n, cudaStream_t s) {
    add_k<<<blocks_for(n, 256), 256, 0, s>>>(a, b, y, n);
    return cudaGetLastError();
}

extern "C" cudaError_t k3k_situ(const float *gate, const float *up, int n, float beta,
                                float linear_beta, float *out, cudaStream_t s) {
    situ_k<<<blocks_for(n, 256), 256, 0, s>>>(gate, up, n, beta, linear_beta, out);
    return cudaGetLastError();
}

extern "C" cudaError_t k3k_sigmoid_gate(float *x, const float *g, int n, cudaStream_t s) {
    sigmoid_gate_k<<<blocks_for(n, 256), 256, 0, s>>>(x, g, n);
    return cudaGetLastError();
}

extern "C" cudaError_t k3k_short_conv(float *x, const float *taps, float *hist, int P, int conv,
                                      cudaStream_t s) {
    short_conv_k<<<blocks_for(P, 256), 256, 0, s>>>(x, taps, hist, P, conv);
    return cudaGetLastError();
}

extern "C" cudaError_t k3k_kda_heads(float *q, float *k, const float *v, const float *f,
                                     const float *b, const float *g, const float *a_log,
                                     const float *dt_bias, const float *o_norm, float *S, int H,
                                     int D, float lower_bound, float eps, float *o,
                                     cudaStream_t s) {
    if (D < 1 || D > 1024) return cudaErrorInvalidValue;
    const float q_scale = (float)(1.0 / sqrt((double)D));
    const int threads = (D + 31) / 32 * 32;
    kda_heads_k<<<H, threads, 3 * (size_t)D * sizeof(float), s>>>(
        q, k, v, f, b, g, a_log, dt_bias, o_norm, S, D, q_scale, lower_bound, eps, o);
    return cudaGetLastError();
}

extern "C" cudaError_t k3k_mla_append(float *kv, int t, const float *KV, const float *ckv, int H,
                                      int nope, int rope, int vd, int lora, cudaStream_t s) {
    const int kvf = H * nope + rope + H * vd;
    mla_append_k<<<blocks_for(kvf, 256), 256, 0, s>>>(kv, t, KV, ckv, H, nope, rope, vd, lora);
    return cudaGetLastError();
}

extern "C" cudaError_t k3k_mla_attend(const float *Q, const float *kv, int t, int H, int nope,
                                      int rope, int vd, float *scratch, float *o,
                                      cudaStream_t s) {
    if (vd < 1 || vd > ATT_THREADS) return cudaErrorInvalidValue;
    const float scale = (float)(1.0 / sqrt((double)(nope + rope)));
    const int n = t + 1, NS = (n + K3K_ATT_CHUNK - 1) / K3K_ATT_CHUNK;
    mla_attend_part<<<dim3(H, NS), ATT_THREADS, 0, s>>>(Q, kv, n, H, nope, rope, vd, scale, scratch);
    mla_attend_merge<<<H, vd < 128 ? 32 : 128, 0, s>>>(scratch, NS, vd, o);
    return cudaGetLastError();
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
    router_topk_k<<<1, ROUTER_THREADS, smem, s>>>(logits, bias, E, k, scaling, ids, weights);
    return cudaGetLastError();
}

extern "C" cudaError_t k3k_moe_sum(const float *eo, const float *w, int k, int n, float *acc,
                                   cudaStream_t s) {
    moe_sum_k<<<blocks_for(n, 256), 256, 0, s>>>(eo, w, k, n, acc);
    return cudaGetLastError();
}
