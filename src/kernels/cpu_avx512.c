/* cpu_avx512.c — the x86-64 AVX-512F path (16 f32 lanes): cpu_avx2.c's loops at twice the
 * width, compiled for AVX-512F by the pragma below and used only when the CPU (and OS) has it.
 *
 * Lane recipe as in cpu_avx2.c, with one 16-lane accumulator per (row, vector); the
 * matrix-vector, small-batch BF16 and tiled batched loops run the same sequence, so they
 * agree bit for bit. Those loops and the element-wise helpers are simd_dense.h's, shared
 * with cpu_avx2.c through the lane macros below.
 *
 * MXFP4 (every batch size, its own loops; the design of cpu_avx2.c's, with AVX-512F's own
 * decode): vpmovzxbd puts a block's 16 packed bytes in 16 lanes; vpermps with the 16-entry
 * E2M1 table (sign included; it reads only the low 4 bits of each index) gives the 16
 * even-column weights, and after vpsrld 4 the 16 odd-column ones: 4 µops per 32 weights
 * where the previous decode (vpermd + vpsrlvd + vpermps per 16) took 6 and a table multiply.
 * x is de-interleaved once per chunk (even columns, then odd, per 32-block) to match. Each
 * block's two products are summed into a partial, and the block adds partial·scale to the
 * row's accumulator with one FMA: a power of two scales exactly, so this only reorders the
 * scalar path's sum — except where 6·scale overflows f32 (E8M0 253 and 254): the reference
 * dequantizes first and gets ±inf weights there, so such a block takes each weight as
 * E2M1·scale before its FMA, as the reference does. */
#include "dispatch.h"

#if defined(__x86_64__)
/* make test-avx512-emu defines K3_AVX512_EMULATED and injects SIMDe's AVX-512F for this file
 * alone (-include tests/simde_avx512.h), so that product code never includes tests/. */
#if !defined(K3_AVX512_EMULATED)
#pragma GCC push_options
#pragma GCC target("avx512f")
#include <immintrin.h>
#endif


/* The micro-kernel's row and vector loops must unroll fully, or its accumulators live on
 * the stack (a 3x slower batched product). */
#define UNROLL _Pragma("GCC unroll 4")
#define UNROLL8 _Pragma("GCC unroll 8")

static inline float hsum(__m512 z) {
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1));
    __m256 v = _mm256_add_ps(_mm512_castps512_ps256(z), hi);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* p[0..n) for 0 < n < 16, zeros above; never reads past p + n. */
static inline __m512 load_tail(const float *p, int64_t n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}

static inline __m512 bf16_16(const uint16_t *p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

/* ---- MXFP4: x de-interleaved once per chunk, every weight vector meets up to MX_VG vectors -- */

#define MX_VG 4      /* input vectors per pass over the weights */
#define MX_RB 64     /* rows per row block: with n > MX_VG its weights stay in L2 between passes */
#define MX_XP 8192   /* floats of de-interleaved x per chunk, all vectors of a group (32 KB) */
#define MX_SF 256    /* most blocks in a chunk (MX_XP / 32: one vector) */
#define MX_PF_ROWS 8 /* prefetch distance in rows (one 8-row group ahead for a matrix-vector) */
#define MX_S_BIG 0x1p126f /* scale of E8M0 253: from there 6·scale overflows f32 */

/* sf[g] = block g's scale as f32 (k3_e8m0_to_f32: s << 23, 0 -> 2^-127, 255 -> NaN) for
 * g < nb <= MX_SF; returns nonzero when some scale is 253..255. Never reads past sc + nb. */
static inline int mx_scales(const uint8_t *sc, int64_t nb, float *sf) {
    const __m512i sub = _mm512_set1_epi32(0x00400000), nan = _mm512_set1_epi32(0x7fc00000);
    __mmask16 big = 0;
    for (int64_t i = 0; i < nb; i += 16) {
        _Alignas(16) uint8_t t[16] = {0};
        memcpy(t, sc + i, (size_t)(nb - i < 16 ? nb - i : 16));
        __m512i s = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)t));
        __m512i b = _mm512_slli_epi32(s, 23);
        b = _mm512_mask_mov_epi32(b, _mm512_cmpeq_epi32_mask(s, _mm512_setzero_si512()), sub);
        b = _mm512_mask_mov_epi32(b, _mm512_cmpeq_epi32_mask(s, _mm512_set1_epi32(255)), nan);
        big |= _mm512_cmpgt_epi32_mask(s, _mm512_set1_epi32(252));
        _mm512_storeu_ps(sf + i, _mm512_castsi512_ps(b));
    }
    return big != 0;
}

/* xp[b·32 + l] = x[b·32 + 2l] and xp[b·32 + 16 + l] = x[b·32 + 2l + 1] for blocks b < nb: the
 * column order in which mx_16x2 yields a block's weights. */
static inline void mx_deinterleave(const float *x, int64_t nb, float *xp) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int64_t b = 0; b < nb; b++) {
        __m512 lo = _mm512_loadu_ps(x + b * 32), hi = _mm512_loadu_ps(x + b * 32 + 16);
        _mm512_store_ps(xp + b * 32, _mm512_permutex2var_ps(lo, even, hi));
        _mm512_store_ps(xp + b * 32 + 16, _mm512_permutex2var_ps(lo, odd, hi));
    }
}

/* The 32 E2M1 values of one block's 16 packed bytes: *even = columns 0, 2, .., 30 (low
 * nibbles), *odd = columns 1, 3, .., 31 (high nibbles). vpermps reads only the low four bits
 * of each index, so the low nibble needs no mask and the sign comes with the table. */
static inline void mx_16x2(const uint8_t *q, __m512 tab, __m512 *even, __m512 *odd) {
    __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    *even = _mm512_permutexvar_ps(d, tab);
    *odd = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tab);
}

/* acc + the block weight by weight, each weight E2M1·scale first as the reference does: the
 * path of a block whose scale overflows, or NaN. Rare, so out of line. */
static __attribute__((noinline)) __m512 mx_block_big(__m512 acc, const uint8_t *q, float s,
                                                     const float *xp) {
    __m512 e, o, sv = _mm512_set1_ps(s);
    mx_16x2(q, _mm512_loadu_ps(k3_e2m1), &e, &o);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(e, sv), _mm512_load_ps(xp), acc);
    return _mm512_fmadd_ps(_mm512_mul_ps(o, sv), _mm512_load_ps(xp + 16), acc);
}

/* acc[i][v] += W[row i] · x[v] over nb blocks for rows i < R (packed p + i·h, scales
 * sf + i·MX_SF) and vectors v < V (de-interleaved at xp + v·ldx): per block, the partial
 * even·x_even + odd·x_odd (a multiply, then an FMA), then acc += partial·scale. The
 * operations of a (row, vector) pair do not depend on R or V, so any batch gives a row the
 * matrix-vector bits. R, V and big are constants at each call (the loops unroll); big = 0
 * promises no block has a scale >= MX_S_BIG (or NaN): no test, no call in the hot loop. */
static inline __attribute__((always_inline)) void mx_rows(const uint8_t *p, int64_t h,
                                                          const float *sf, int64_t nb, int R,
                                                          const float *xp, int64_t ldx, int V,
                                                          int big, int64_t pf,
                                                          __m512 (*acc)[MX_VG]) {
    const __m512 tab = _mm512_loadu_ps(k3_e2m1);
    __m512 a[8]; /* [i·V + v], R·V <= 8 */
    UNROLL8
    for (int i = 0; i < R; i++)
        UNROLL
        for (int v = 0; v < V; v++) a[i * V + v] = acc[i][v];
    for (int64_t g = 0; g < nb; g++) {
        __m512 part[8];
        UNROLL8
        for (int i = 0; i < R; i++) {
            const uint8_t *q = p + i * h + g * 16;
            if (!(g & 3)) _mm_prefetch((const char *)(q + pf), _MM_HINT_T0);
            __m512 e, o;
            mx_16x2(q, tab, &e, &o);
            UNROLL
            for (int v = 0; v < V; v++) {
                const float *xb = xp + v * ldx + g * 32;
                part[i * V + v] = _mm512_fmadd_ps(o, _mm512_load_ps(xb + 16),
                                                  _mm512_mul_ps(e, _mm512_load_ps(xb)));
            }
        }
        UNROLL8
        for (int i = 0; i < R; i++) {
            float s = sf[i * MX_SF + g];
            if (!big || s < MX_S_BIG) { /* false for NaN too */
                UNROLL
                for (int v = 0; v < V; v++)
                    a[i * V + v] =
                        _mm512_fmadd_ps(part[i * V + v], _mm512_set1_ps(s), a[i * V + v]);
            } else {
                UNROLL
                for (int v = 0; v < V; v++)
                    a[i * V + v] = mx_block_big(a[i * V + v], p + i * h + g * 16, s,
                                                xp + v * ldx + g * 32);
            }
        }
    }
    UNROLL8
    for (int i = 0; i < R; i++)
        UNROLL
        for (int v = 0; v < V; v++) acc[i][v] = a[i * V + v];
}

/* mx_rows with (R, V) as constants: MX_GROUP_ROWS[V] rows at a time (8 partial sums in
 * flight keep both FMA ports busy). big: some block of these rows' chunk has an overflowing
 * or NaN scale; then the rows go one at a time through the checking loop. */
static const int MX_GROUP_ROWS[MX_VG + 1] = {0, 8, 4, 2, 2};
#define MX_ROWS(R_, V_, big_, i_) \
    mx_rows(p + (i_) * h, h, sf + (i_) * MX_SF, nb, R_, xp, ldx, V_, big_, pf, &acc[i_])
static void mx_group(const uint8_t *p, int64_t h, const float *sf, int64_t nb, int R,
                     const float *xp, int64_t ldx, int V, int big, int64_t pf,
                     __m512 (*acc)[MX_VG]) {
    if (big) {
        for (int i = 0; i < R; i++) {
            if (V == 1) MX_ROWS(1, 1, 1, i);
            else if (V == 2) MX_ROWS(1, 2, 1, i);
            else if (V == 3) MX_ROWS(1, 3, 1, i);
            else MX_ROWS(1, 4, 1, i);
        }
    } else if (R == MX_GROUP_ROWS[V]) {
        if (V == 1) MX_ROWS(8, 1, 0, 0);
        else if (V == 2) MX_ROWS(4, 2, 0, 0);
        else if (V == 3) MX_ROWS(2, 3, 0, 0);
        else MX_ROWS(2, 4, 0, 0);
    } else { /* the last rows of a range, one at a time */
        if (V == 1) MX_ROWS(1, 1, 0, 0);
        else if (V == 2) MX_ROWS(1, 2, 0, 0);
        else if (V == 3) MX_ROWS(1, 3, 0, 0);
        else MX_ROWS(1, 4, 0, 0);
    }
}
#undef MX_ROWS

/* Rows [r0, r1) for n vectors: row blocks of MX_RB rows; in each, groups of MX_VG vectors;
 * per group, chunks of up to MX_XP / (32·V) blocks (x de-interleaved once per chunk), R rows
 * at a time, the accumulators kept per row block between chunks. */
static void mxfp4_rows(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols,
                       const float *x, int n, float *y, int64_t r0, int64_t r1) {
    int64_t ng = cols / 32, h = cols / 2;
    _Alignas(64) float xp[MX_XP];
    _Alignas(64) float sf[8 * MX_SF];
    __m512 acc[MX_RB][MX_VG];
    for (int64_t rb = r0; rb < r1; rb += MX_RB) {
        int64_t rb1 = r1 - rb < MX_RB ? r1 : rb + MX_RB;
        for (int b = 0; b < n; b += MX_VG) {
            int V = n - b < MX_VG ? n - b : MX_VG;
            int64_t cb = MX_XP / (32 * V); /* blocks per chunk */
            for (int64_t r = rb; r < rb1; r++)
                for (int v = 0; v < V; v++) acc[r - rb][v] = _mm512_setzero_ps();
            for (int64_t g0 = 0; g0 < ng; g0 += cb) {
                int64_t nb = ng - g0 < cb ? ng - g0 : cb;
                for (int v = 0; v < V; v++)
                    mx_deinterleave(x + (int64_t)(b + v) * cols + g0 * 32, nb, xp + v * cb * 32);
                for (int64_t r = rb; r < rb1;) {
                    int R = r + MX_GROUP_ROWS[V] <= rb1 ? MX_GROUP_ROWS[V] : 1, big = 0;
                    for (int i = 0; i < R; i++)
                        big |= mx_scales(scale + (r + i) * ng + g0, nb, sf + i * MX_SF);
                    mx_group(packed + r * h + g0 * 16, h, sf, nb, R, xp, cb * 32, V, big,
                             MX_PF_ROWS * h, &acc[r - rb]);
                    r += R;
                }
            }
            for (int64_t r = rb; r < rb1; r++)
                for (int v = 0; v < V; v++) y[(int64_t)(b + v) * rows + r] = hsum(acc[r - rb][v]);
        }
    }
}

/* Lane macros for simd_dense.h (the BF16 / F32 products and element-wise helpers, written
 * once for AVX2 and AVX-512F): 16 lanes. */
#define W 16
#define VF __m512
#define VZERO() _mm512_setzero_ps()
#define VLOADU(p) _mm512_loadu_ps(p)
#define VLOADA(p) _mm512_load_ps(p)
#define VSTOREU(p, v) _mm512_storeu_ps(p, v)
#define VSTOREA(p, v) _mm512_store_ps(p, v)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VMAX(a, b) _mm512_max_ps(a, b) /* a > b ? a : b: the second operand when unordered */
#define VPOW2(t)                                                                               \
    _mm512_castsi512_ps(                                                                       \
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(127)), 23))
#define VSET1(a) _mm512_set1_ps(a)
#define VBF16(p) bf16_16(p)
#define GEMM_R 4         /* simd_gemm.h's micro-kernel: 4 rows x 6 vectors: 24 accumulators of the 32 zmm */
#define GEMM_V 6
#define GEMM_RB 128 /* rows per block: inputs packed once per 128 rows, 512 KB of accumulators */
#define GEMM_KC 512
#define SMALL_ACC 20       /* accumulators of bf16_rows (R·V) */
#define SMALL_R4 4         /* rows per bf16_rows call at n = 4 and at n = 5 */
#define SMALL_R5 4
#define UNROLL_V UNROLL8   /* bf16_rows' vector loop */
/* Two 8-lane halves as one 16-lane vector (a in lanes 0..7). */
static inline __m512 join16(__m256 a, __m256 b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(a)),
                                               _mm256_castps_pd(b), 1));
}
#define LX_SMALL_R2 4 /* rows per lossless small-batch call at n = 2, 3 (simd_dense.h) */
#define LX_SMALL_R4 2 /* ... at n = 4, 5 */
#define LX_JOIN(v8, o) do { o[0] = join16(v8[0], v8[1]); o[1] = join16(v8[2], v8[3]); } while (0)
#include "simd_dense.h"

/* ---- MXFP4 batched (n >= MXG_MIN): simd_gemm.h's blocking with this file's MXFP4 order -----
 *
 * The same operations per (row, vector) as mx_rows, so the bits equal mxfp4_rows' at every
 * batch size: per block, part = even·x_even (a multiply), part = fma(odd, x_odd, part), then
 * acc = fma(part, scale, acc) (E2M1 values; x de-interleaved as mx_deinterleave does); a block
 * whose scale >= MX_S_BIG (or NaN) instead adds (even·scale)·x_even and then (odd·scale)·x_odd
 * with FMAs; hsum at the end. The decoded weights of MXG_RB rows × GEMM_KC columns wait in an
 * L1 tile as f32 (decoded once, used for every vector), the inputs are de-interleaved and
 * packed per group of MXG_V, and the micro-kernel keeps MXG_R × MXG_V partials and as many
 * accumulators in registers (24 of the 32 zmm). Per block that is 24 multiply-adds of the
 * product and 12 scale FMAs: at most 2/3 of the FMA pipes do product work (the order fixed
 * by the matrix-vector loop: a block of 32 is only two 16-lane steps). */

#define MXG_R 4 /* simd_mxgemm.h's tiling */
#define MXG_V 3
#define MXG_RB 96
#define MXG_NB (GEMM_KC / 32) /* blocks per tile row */
#define MXG_TILE_ONE 1.0f     /* the tile holds E2M1 */

/* acc[i·K3_MAX_BATCH + v] += tile rows i < R · vectors v < V over nb blocks (tile t: per block
 * 16 even then 16 odd weights, row stride GEMM_KC; scales sf, row stride MXG_NB; xp: per block
 * two steps of MXG_V vectors × 16). R, V, big constants; big = 0 promises no big scale. */
static inline __attribute__((always_inline)) void mxg_micro(const float *t, const float *sf,
                                                            int R, const float *xp, int V,
                                                            int64_t nb, int big, __m512 *acc) {
    __m512 a[MXG_R][MXG_V];
    UNROLL
    for (int i = 0; i < R; i++)
        UNROLL
        for (int v = 0; v < V; v++) a[i][v] = acc[i * K3_MAX_BATCH + v];
    for (int64_t g = 0; g < nb; g++) {
        __m512 part[MXG_R][MXG_V];
        UNROLL
        for (int j = 0; j < 2; j++) {
            __m512 w[MXG_R];
            UNROLL
            for (int i = 0; i < R; i++) w[i] = _mm512_load_ps(t + i * GEMM_KC + g * 32 + j * 16);
            UNROLL
            for (int v = 0; v < V; v++) {
                __m512 xv = _mm512_load_ps(xp + ((g * 2 + j) * MXG_V + v) * 16);
                UNROLL
                for (int i = 0; i < R; i++)
                    part[i][v] = j ? _mm512_fmadd_ps(w[i], xv, part[i][v]) : _mm512_mul_ps(w[i], xv);
            }
        }
        UNROLL
        for (int i = 0; i < R; i++) {
            float s = sf[i * MXG_NB + g];
            if (!big || s < MX_S_BIG) { /* false for NaN too */
                __m512 sv = _mm512_set1_ps(s);
                UNROLL
                for (int v = 0; v < V; v++) a[i][v] = _mm512_fmadd_ps(part[i][v], sv, a[i][v]);
            } else {
                __m512 sv = _mm512_set1_ps(s);
                for (int v = 0; v < V; v++)
                    for (int j = 0; j < 2; j++)
                        a[i][v] = _mm512_fmadd_ps(
                            _mm512_mul_ps(_mm512_load_ps(t + i * GEMM_KC + g * 32 + j * 16), sv),
                            _mm512_load_ps(xp + ((g * 2 + j) * MXG_V + v) * 16), a[i][v]);
            }
        }
    }
    UNROLL
    for (int i = 0; i < R; i++)
        UNROLL
        for (int v = 0; v < V; v++) acc[i * K3_MAX_BATCH + v] = a[i][v];
}

/* xp[((2b + j)·MXG_V + v)·16 + l] = vector v's column 32b + 2l + j (j = 0: even columns, 1: odd)
 * for blocks b < kc / 32: mx_deinterleave's order, interleaved by step. */
static void mxg_pack_x(const float *x, int64_t ldx, int V, int64_t kc, float *xp) {
    _Alignas(64) float d[GEMM_KC];
    int64_t nb = kc / 32;
    for (int v = 0; v < V; v++) {
        mx_deinterleave(x + v * ldx, nb, d);
        for (int64_t st = 0; st < 2 * nb; st++)
            _mm512_store_ps(xp + (st * MXG_V + v) * 16, _mm512_load_ps(d + st * 16));
    }
}

/* Row r's nb blocks from column k0 decoded into tile (per block 16 even, then 16 odd E2M1
 * values) and sf (scales); returns nonzero when some scale is E8M0 253..255. */
static int mxg_tile_row(const uint8_t *packed, const uint8_t *scale, int64_t cols, int64_t r,
                        int64_t k0, int64_t nb, float *tile, float *sf) {
    const __m512 tab = _mm512_loadu_ps(k3_e2m1);
    const uint8_t *p = packed + r * (cols / 2) + k0 / 2;
    for (int64_t g = 0; g < nb; g++) {
        __m512 e, o;
        mx_16x2(p + g * 16, tab, &e, &o);
        _mm512_store_ps(tile + g * 32, e);
        _mm512_store_ps(tile + g * 32 + 16, o);
    }
    return mx_scales(scale + r * (cols / 32) + k0 / 32, nb, sf);
}

#include "simd_mxgemm.h" /* mxfp4_gemm, mxfp4, mix */

#if !defined(K3_AVX512_EMULATED)
#pragma GCC pop_options
#endif

K3_SIMD_TABLE(k3_kernels_avx512, "avx512");

#endif
