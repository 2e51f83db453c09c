/* cpu_avx2.c — the x86-64 AVX2+FMA path (8 f32 lanes). The file is compiled for AVX2 by the
 * pragma below whatever the build flags, and kernels.c uses it only when the CPU has AVX2 and
 * FMA, so one binary runs on any x86-64.
 *
 * Lane recipe (kernels.h): per (row, vector) one 8-lane accumulator; step i adds
 * W[r][i..i+8)·x[i..i+8) with FMA; a last partial step uses zero-padded weights and a masked
 * x load; then hsum() adds the lanes in one fixed order. The matrix-vector loops (n = 1), the
 * small-batch BF16 loops (n <= 5) and the tiled batched loops run exactly this sequence, so
 * they agree bit for bit. Those loops, and dot / axpy / kda_delta, are written once in
 * simd_dense.h over lane macros (defined below) and shared with cpu_avx512.c.
 *
 * MXFP4 (every batch size, its own loops): per chunk of up to MX_CHUNK 32-blocks of a row,
 * (1) mx_decode looks up the codes of 32 packed bytes at once with vpshufb as int8 2·E2M1
 * (exact small integers), interleaves the low- and high-nibble results back into column
 * order and stores them to a small L1 buffer, with each block's scale / 2 as f32; (2) per 8
 * columns, vpmovsxbd + vcvtdq2ps give the integers as f32, summed lane-wise with FMA into a
 * per-block partial, and the block adds partial·(scale/2) to the row's accumulator with one
 * FMA. Multiplying by a power of two is exact, so this reorders the scalar path's sum and
 * changes nothing else — except where 6·scale overflows f32 (E8M0 253 and 254): the reference
 * dequantizes first and gets ±inf weights there, so such a block takes each weight as
 * (2·E2M1)·(scale/2) before its FMA, as the reference does. The previous decode (vpsrlvd +
 * vpermps + a sign fix-up per 8 weights, a table multiply per block) was bound by Zen 3's one
 * vpermps per cycle; this one is ~1.4x faster from L2 and, with its prefetch, ~1.7x streaming
 * from memory (one thread, Zen 3). */
#include "dispatch.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>


/* The micro-kernel's row and vector loops must unroll fully, or its accumulators live on
 * the stack (a 3x slower batched product). */
#define UNROLL _Pragma("GCC unroll 4")
#define UNROLL8 _Pragma("GCC unroll 8")
#define UNROLL16 _Pragma("GCC unroll 16")

static const int32_t TAIL_MASK[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* p[0..n) for 0 < n < 8, zeros above; never reads past p + n. */
static inline __m256 load_tail(const float *p, int64_t n) {
    return _mm256_maskload_ps(p, _mm256_loadu_si256((const __m256i *)(TAIL_MASK + 8 - n)));
}

static inline __m256 bf16_8(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* 2·E2M1 of the 16 codes as int8 (exact integers; the scale is halved to match). */
static const int8_t E2M1_X2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

#define MX_CHUNK 32 /* 32-blocks per decode pass: 1 KB of int8 per row, in L1 */

/* One row's decoded chunk: q holds 2·E2M1 per column (laid out as mx_off says), hs each
 * block's scale / 2 as f32. */
typedef struct mx_row {
    _Alignas(32) int8_t q[MX_CHUNK * 32];
    _Alignas(32) float hs[MX_CHUNK];
} mx_row;

/* Offset in mx_row.q of columns 8j..8j+7 of block g: a pair of blocks is stored as the two
 * in-lane interleaves [g: 0-15 | g+1: 0-15 | g: 16-31 | g+1: 16-31]. */
static inline int64_t mx_off(int64_t g, int j) {
    return (g >> 1) * 64 + (g & 1) * 16 + (j & 1) * 8 + (j >> 1) * 32;
}

/* Decodes nb <= MX_CHUNK blocks (packed p, scales sc) into o (pass 1 of the file comment),
 * prefetching the bytes pf further on (the same columns a few rows below: without it one
 * thread streamed an expert at ~60% of the rate it computes from cache, the hardware
 * prefetcher stopping at each 4 KB page). Returns nonzero when some block's scale is E8M0
 * 253..255 (6·scale overflows, or NaN). */
static inline int mx_decode(const uint8_t *p, const uint8_t *sc, int64_t nb, int64_t pf,
                            mx_row *o) {
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)E2M1_X2));
    const __m256i nib = _mm256_set1_epi8(15);
    int64_t g = 0;
    for (; g + 2 <= nb; g += 2) {
        if (!(g & 2)) _mm_prefetch((const char *)(p + g * 16 + pf), _MM_HINT_T0);
        __m256i v = _mm256_loadu_si256((const __m256i *)(p + g * 16));
        __m256i lo = _mm256_shuffle_epi8(tab, _mm256_and_si256(v, nib));
        __m256i hi = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
        _mm256_store_si256((__m256i *)(o->q + g * 32), _mm256_unpacklo_epi8(lo, hi));
        _mm256_store_si256((__m256i *)(o->q + g * 32 + 32), _mm256_unpackhi_epi8(lo, hi));
    }
    if (g < nb) { /* an odd last block: the same layout, one lane */
        __m128i v = _mm_loadu_si128((const __m128i *)(p + g * 16)), n1 = _mm_set1_epi8(15);
        __m128i t1 = _mm256_castsi256_si128(tab);
        __m128i lo = _mm_shuffle_epi8(t1, _mm_and_si128(v, n1));
        __m128i hi = _mm_shuffle_epi8(t1, _mm_and_si128(_mm_srli_epi16(v, 4), n1));
        _mm_store_si128((__m128i *)(o->q + g * 32), _mm_unpacklo_epi8(lo, hi));
        _mm_store_si128((__m128i *)(o->q + g * 32 + 32), _mm_unpackhi_epi8(lo, hi));
    }
    /* scale / 2 = 2^(s-128): k3_e8m0_to_f32's bits (s << 23; 0 -> 2^-127, 255 -> NaN) times
     * 0.5, exact also for the subnormal 2^-128. */
    const __m256i zero = _mm256_setzero_si256(), all = _mm256_set1_epi32(255);
    const __m256i sub = _mm256_set1_epi32(0x00400000), nan = _mm256_set1_epi32(0x7fc00000);
    __m256i big = zero;
    for (int64_t i = 0; i < nb; i += 8) {
        uint64_t u = 0;
        memcpy(&u, sc + i, (size_t)(nb - i < 8 ? nb - i : 8)); /* never past the row's scales */
        __m256i s = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)u));
        big = _mm256_or_si256(big, _mm256_cmpgt_epi32(s, _mm256_set1_epi32(252)));
        __m256i b = _mm256_slli_epi32(s, 23);
        b = _mm256_blendv_epi8(b, sub, _mm256_cmpeq_epi32(s, zero));
        b = _mm256_blendv_epi8(b, nan, _mm256_cmpeq_epi32(s, all));
        _mm256_store_ps(o->hs + i, _mm256_mul_ps(_mm256_castsi256_ps(b), _mm256_set1_ps(0.5f)));
    }
    return !_mm256_testz_si256(big, big);
}

/* The eight values 2·E2M1 at q as f32 (exact). */
static inline __m256 mx_q8(const int8_t *q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

/* ---- MXFP4: decoded chunk by chunk, every weight vector meets up to MX_VG input vectors ---- */

#define MX_VG 4  /* input vectors per pass over the weights */
#define MX_PF_ROWS 4 /* prefetch distance in rows (4, 8, 16 measured alike; none: ~40% slower) */
/* scale / 2 from E8M0 253 on: 6·scale overflows f32 (see the file comment). */
#define MX_HS_BIG 0x1p125f

/* acc + Σ_j ((2·E2M1)·hs)·x over one block (weight by weight, the reference's order of
 * rounding): the path of a block whose scale overflows, or NaN. Rare, so out of line. */
static __attribute__((noinline)) __m256 mx_block_big(__m256 acc, const int8_t *q, int64_t g,
                                                     float hs, const float *x) {
    __m256 h = _mm256_set1_ps(hs);
    for (int j = 0; j < 4; j++)
        acc = _mm256_fmadd_ps(_mm256_mul_ps(mx_q8(q + mx_off(g, j)), h),
                              _mm256_loadu_ps(x + 8 * j), acc);
    return acc;
}

/* acc[i·lda + v] += W[row i] · x[v] over the nb decoded blocks in buf[i] (columns from x on), for
 * rows i < R and vectors v < V: per block, the partial Σ (2·E2M1)·x in column order (first a
 * multiply, then FMAs), then acc += partial·(scale/2). The operations of a (row, vector) pair
 * do not depend on R or V, so any batch gives a row the matrix-vector bits. R, V and big are
 * constants at each call (the loops unroll). The R·V partials live in registers: 8 of them
 * keep both FMA pipes busy (each partial is a chain of dependent FMAs); with R·V > 4 the
 * accumulators, touched once per block, stay in memory so that 16 registers suffice.
 * big = 0 promises that no block has scale / 2 >= MX_HS_BIG (or NaN): no test, no call, so no
 * register spill around it in the hot loop. */
static inline __attribute__((always_inline)) void mx_rows(const mx_row *buf, int64_t nb, int R,
                                                          const float *x, int64_t ldx, int V,
                                                          int big, __m256 *acc, int64_t lda) {
    const int in_regs = R * V <= 4;
    __m256 a[4]; /* [i·V + v] when in_regs; flat so that GCC keeps them in registers */
    if (in_regs)
        UNROLL
        for (int i = 0; i < R; i++)
            UNROLL
            for (int v = 0; v < V; v++) a[i * V + v] = acc[i * lda + v];
    for (int64_t g = 0; g < nb; g++) {
        const float *xg = x + g * 32;
        __m256 part[8];
        UNROLL
        for (int j = 0; j < 4; j++) {
            __m256 xv[MX_VG]; /* each weight vector is used as soon as it is made */
            UNROLL
            for (int v = 0; v < V; v++) xv[v] = _mm256_loadu_ps(xg + v * ldx + 8 * j);
            UNROLL8
            for (int i = 0; i < R; i++) {
                __m256 w = mx_q8(buf[i].q + mx_off(g, j));
                UNROLL
                for (int v = 0; v < V; v++)
                    part[i * V + v] = j ? _mm256_fmadd_ps(w, xv[v], part[i * V + v])
                                        : _mm256_mul_ps(w, xv[v]);
            }
        }
        UNROLL8
        for (int i = 0; i < R; i++) {
            float hs = buf[i].hs[g];
            if (!big || hs < MX_HS_BIG) { /* false for NaN too */
                __m256 h = _mm256_broadcast_ss(&buf[i].hs[g]); /* a load, not a shuffle */
                UNROLL
                for (int v = 0; v < V; v++) {
                    if (in_regs) a[i * V + v] = _mm256_fmadd_ps(part[i * V + v], h, a[i * V + v]);
                    else acc[i * lda + v] = _mm256_fmadd_ps(part[i * V + v], h, acc[i * lda + v]);
                }
            } else {
                UNROLL
                for (int v = 0; v < V; v++) {
                    __m256 *t = in_regs ? &a[i * V + v] : &acc[i * lda + v];
                    *t = mx_block_big(*t, buf[i].q, g, hs, xg + v * ldx);
                }
            }
        }
    }
    if (in_regs)
        UNROLL
        for (int i = 0; i < R; i++)
            UNROLL
            for (int v = 0; v < V; v++) acc[i * lda + v] = a[i * V + v];
}

/* mx_rows with (R, V) as constants: MX_GROUP_ROWS[V] rows at a time. big: some block of these
 * rows' chunk has an overflowing or NaN scale; then, as for any other R, the rows go one at a
 * time (the same operations for every other block). */
static const int MX_GROUP_ROWS[MX_VG + 1] = {0, 8, 4, 2, 2};
#define MX_ROWS(R_, V_, big_, i_) mx_rows(&buf[i_], nb, R_, x, ldx, V_, big_, acc + (i_) * lda, lda)
static void mx_group(const mx_row *buf, int64_t nb, int R, const float *x, int64_t ldx, int V,
                     int big, __m256 *acc, int64_t lda) {
    if (!big && R == MX_GROUP_ROWS[V]) {
        if (V == 1) MX_ROWS(MX_GROUP_ROWS[1], 1, 0, 0);
        else if (V == 2) MX_ROWS(MX_GROUP_ROWS[2], 2, 0, 0);
        else if (V == 3) MX_ROWS(MX_GROUP_ROWS[3], 3, 0, 0);
        else MX_ROWS(MX_GROUP_ROWS[4], 4, 0, 0);
        return;
    }
    for (int i = 0; i < R; i++) {
        if (V == 1) big ? MX_ROWS(1, 1, 1, i) : MX_ROWS(1, 1, 0, i);
        else if (V == 2) big ? MX_ROWS(1, 2, 1, i) : MX_ROWS(1, 2, 0, i);
        else if (V == 3) big ? MX_ROWS(1, 3, 1, i) : MX_ROWS(1, 3, 0, i);
        else big ? MX_ROWS(1, 4, 1, i) : MX_ROWS(1, 4, 0, i);
    }
}
#undef MX_ROWS

/* Rows [r0, r1) for n <= K3_MAX_BATCH vectors: R rows at a time (as many as the first group of
 * MX_VG vectors wants), each chunk of them decoded once (pass 1) and summed against every
 * group of vectors in turn; the accumulators of all n vectors wait on the stack. */
static void mxfp4_rows(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols,
                       const float *x, int n, float *y, int64_t r0, int64_t r1) {
    int64_t ng = cols / 32;
    int V0 = n < MX_VG ? n : MX_VG;
    mx_row buf[8];
    __m256 acc[8 * K3_MAX_BATCH];
    for (int64_t r = r0; r < r1;) {
        int R = r + MX_GROUP_ROWS[V0] <= r1 ? MX_GROUP_ROWS[V0] : 1;
        for (int k = 0; k < R * n; k++) acc[k] = _mm256_setzero_ps();
        for (int64_t g0 = 0; g0 < ng; g0 += MX_CHUNK) {
            int64_t nb = ng - g0 < MX_CHUNK ? ng - g0 : MX_CHUNK;
            int big = 0;
            for (int i = 0; i < R; i++)
                big |= mx_decode(packed + (r + i) * (cols / 2) + g0 * 16, scale + (r + i) * ng + g0,
                                 nb, MX_PF_ROWS * (cols / 2), &buf[i]);
            for (int b = 0; b < n; b += MX_VG)
                mx_group(buf, nb, R, x + (int64_t)b * cols + g0 * 32, cols,
                         n - b < MX_VG ? n - b : MX_VG, big, acc + b, n);
        }
        for (int i = 0; i < R; i++)
            for (int v = 0; v < n; v++) y[(int64_t)v * rows + r + i] = hsum(acc[i * n + v]);
        r += R;
    }
}

/* Lane macros for simd_dense.h (the BF16 / F32 products and element-wise helpers, written
 * once for AVX2 and AVX-512F): 8 lanes. */
#define W 8
#define VF __m256
#define VZERO() _mm256_setzero_ps()
#define VLOADU(p) _mm256_loadu_ps(p)
#define VLOADA(p) _mm256_load_ps(p)
#define VSTOREU(p, v) _mm256_storeu_ps(p, v)
#define VSTOREA(p, v) _mm256_store_ps(p, v)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VMAX(a, b) _mm256_max_ps(a, b) /* a > b ? a : b: the second operand when unordered */
#define VPOW2(t)                                                                               \
    _mm256_castsi256_ps(                                                                       \
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(127)), 23))
#define VSET1(a) _mm256_set1_ps(a)
#define VBF16(p) bf16_8(p)
#define GEMM_R 3         /* simd_gemm.h's micro-kernel: 3 rows x 4 vectors: 12 accumulators of the 16 ymm */
#define GEMM_V 4
#define GEMM_RB 96
#define GEMM_KC 512
#define SMALL_ACC 12       /* accumulators of bf16_rows (R·V) */
#define SMALL_R4 3         /* rows per bf16_rows call at n = 4 and at n = 5 */
#define SMALL_R5 2
#define UNROLL_V UNROLL16  /* bf16_rows' vector loop */
#define LX_SMALL_R2 2 /* rows per lossless small-batch call at n = 2, 3 (simd_dense.h) */
#define LX_SMALL_R4 1 /* ... at n = 4, 5 */
#define LX_JOIN(v8, o) do { o[0] = v8[0]; o[1] = v8[1]; o[2] = v8[2]; o[3] = v8[3]; } while (0)
#include "simd_dense.h"

/* ---- MXFP4 batched (n >= MXG_MIN): simd_gemm.h's blocking with the MXFP4 order ------------
 *
 * The same operations per (row, vector) as mx_rows, so the bits equal mxfp4_rows' at every
 * batch size: per block g, part = q0·x0 (a multiply), part = fma(q_j, x_j, part) for j = 1..3
 * (q_j = 2·E2M1 of columns 32g + 8j .. 32g + 8j + 7 as f32), then acc = fma(part, scale/2, acc);
 * a block whose scale / 2 >= MX_HS_BIG (or NaN) instead does acc = fma(q_j·(scale/2), x_j, acc)
 * for j = 0..3; hsum at the end. What differs is where the operands wait: the decoded weights of
 * GEMM_RB rows × GEMM_KC columns are widened once to f32 in an L1 tile and used for every
 * vector, the inputs are packed per group of GEMM_V as in gemm_dense, and the micro-kernel keeps
 * GEMM_R × GEMM_V partials in registers (12 of the 16 ymm), the accumulators in L1 (one load and
 * one store each per block). Per block that is 48 multiply-adds of the product and 12 scale FMAs:
 * at most 80% of the FMA pipes do product work (K3_MIX_GEMM_MXFP4 measures this loop). */

#define MXG_R GEMM_R /* simd_mxgemm.h's tiling: the dense GEMM's */
#define MXG_V GEMM_V
#define MXG_RB GEMM_RB
#define MXG_NB (GEMM_KC / 32) /* blocks per tile row */
#define MXG_TILE_ONE 2.0f     /* the tile holds 2·E2M1 */

/* acc[i·K3_MAX_BATCH + v] += tile rows i < R · vectors v < V over nb blocks (tile t, row
 * stride GEMM_KC; scales / 2 hs, row stride MXG_NB; packed inputs xp). R, V and big are
 * constants at each call; big = 0 promises no scale / 2 >= MX_HS_BIG nor NaN. */
static inline __attribute__((always_inline)) void mxg_micro(const float *t, const float *hs,
                                                            int R, const float *xp, int V,
                                                            int64_t nb, int big, __m256 *acc) {
    for (int64_t g = 0; g < nb; g++) {
        __m256 part[GEMM_R][GEMM_V];
        UNROLL
        for (int j = 0; j < 4; j++) {
            int64_t s = g * 4 + j;
            __m256 w[GEMM_R];
            UNROLL
            for (int i = 0; i < R; i++) w[i] = _mm256_load_ps(t + i * GEMM_KC + s * 8);
            UNROLL
            for (int v = 0; v < V; v++) {
                __m256 xv = _mm256_load_ps(xp + (s * GEMM_V + v) * 8);
                UNROLL
                for (int i = 0; i < R; i++)
                    part[i][v] = j ? _mm256_fmadd_ps(w[i], xv, part[i][v]) : _mm256_mul_ps(w[i], xv);
            }
        }
        UNROLL
        for (int i = 0; i < R; i++) {
            float h = hs[i * MXG_NB + g];
            __m256 *a = acc + i * K3_MAX_BATCH;
            if (!big || h < MX_HS_BIG) { /* false for NaN too */
                __m256 hv = _mm256_broadcast_ss(&hs[i * MXG_NB + g]);
                UNROLL
                for (int v = 0; v < V; v++) a[v] = _mm256_fmadd_ps(part[i][v], hv, a[v]);
            } else {
                __m256 hv = _mm256_set1_ps(h);
                for (int v = 0; v < V; v++)
                    for (int j = 0; j < 4; j++)
                        a[v] = _mm256_fmadd_ps(
                            _mm256_mul_ps(_mm256_load_ps(t + i * GEMM_KC + (g * 4 + j) * 8), hv),
                            _mm256_load_ps(xp + ((g * 4 + j) * GEMM_V + v) * 8), a[v]);
            }
        }
    }
}

/* The inputs packed as for the dense GEMM (columns in order; MXG_V = GEMM_V). */
static inline void mxg_pack_x(const float *x, int64_t ldx, int V, int64_t kc, float *xp) {
    gemm_pack_x(x, ldx, V, kc, xp);
}

/* tile[i·GEMM_KC + c] = 2·E2M1 of row r's column k0 + c as f32 (column order), hs[i·MXG_NB + g]
 * = its blocks' scales / 2, for nb blocks; returns nonzero when some scale is E8M0 253..255. */
static int mxg_tile_row(const uint8_t *packed, const uint8_t *scale, int64_t cols, int64_t r,
                        int64_t k0, int64_t nb, float *tile, float *hs) {
    mx_row q;
    int big = mx_decode(packed + r * (cols / 2) + k0 / 2, scale + r * (cols / 32) + k0 / 32, nb,
                        MX_PF_ROWS * (cols / 2), &q);
    for (int64_t g = 0; g < nb; g++) {
        for (int j = 0; j < 4; j++) _mm256_store_ps(tile + g * 32 + 8 * j, mx_q8(q.q + mx_off(g, j)));
        hs[g] = q.hs[g];
    }
    return big;
}

#include "simd_mxgemm.h" /* mxfp4_gemm, mxfp4, mix */

#pragma GCC pop_options

K3_SIMD_TABLE(k3_kernels_avx2, "avx2");

#endif
