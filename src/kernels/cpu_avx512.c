/* cpu_avx512.c — the x86-64 AVX-512F path (16 f32 lanes): cpu_avx2.c's loops at twice the
 * width, compiled for AVX-512F by the pragma below and used only when the CPU (and OS) has it.
 *
 * Lane recipe as in cpu_avx2.c, with one 16-lane accumulator per (row, vector); the
 * matrix-vector, small-batch BF16 and tiled batched loops run the same sequence, so they
 * agree bit for bit.
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

#define KC 256 /* batched tile: columns per tile */
#define RG 16  /* batched tile: rows per tile; 16 × 256 f32 = 16 KB, in L1 */

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

static inline __m512 bf16_tail(const uint16_t *p, int64_t n) {
    uint16_t t[16] = {0};
    memcpy(t, p, (size_t)n * sizeof *p);
    return bf16_16(t);
}

/* ---- matrix-vector (n = 1): four rows share each x load ---------------------------------- */

static void bf16_vec(const uint16_t *w, int64_t cols, const float *x, float *y, int64_t r0,
                     int64_t r1) {
    int64_t full = cols & ~(int64_t)15, tail = cols - full, r = r0;
    __m512 xt = tail ? load_tail(x + full, tail) : _mm512_setzero_ps();
    for (; r + 4 <= r1; r += 4) {
        const uint16_t *a = w + r * cols, *b = a + cols, *c = b + cols, *d = c + cols;
        __m512 sa = _mm512_setzero_ps(), sb = sa, sc = sa, sd = sa;
        for (int64_t i = 0; i < full; i += 16) {
            __m512 xi = _mm512_loadu_ps(x + i);
            sa = _mm512_fmadd_ps(bf16_16(a + i), xi, sa);
            sb = _mm512_fmadd_ps(bf16_16(b + i), xi, sb);
            sc = _mm512_fmadd_ps(bf16_16(c + i), xi, sc);
            sd = _mm512_fmadd_ps(bf16_16(d + i), xi, sd);
        }
        if (tail) {
            sa = _mm512_fmadd_ps(bf16_tail(a + full, tail), xt, sa);
            sb = _mm512_fmadd_ps(bf16_tail(b + full, tail), xt, sb);
            sc = _mm512_fmadd_ps(bf16_tail(c + full, tail), xt, sc);
            sd = _mm512_fmadd_ps(bf16_tail(d + full, tail), xt, sd);
        }
        y[r] = hsum(sa), y[r + 1] = hsum(sb), y[r + 2] = hsum(sc), y[r + 3] = hsum(sd);
    }
    for (; r < r1; r++) {
        const uint16_t *a = w + r * cols;
        __m512 s = _mm512_setzero_ps();
        for (int64_t i = 0; i < full; i += 16)
            s = _mm512_fmadd_ps(bf16_16(a + i), _mm512_loadu_ps(x + i), s);
        if (tail) s = _mm512_fmadd_ps(bf16_tail(a + full, tail), xt, s);
        y[r] = hsum(s);
    }
}

static void f32_vec(const float *w, int64_t cols, const float *x, float *y, int64_t r0,
                    int64_t r1) {
    int64_t full = cols & ~(int64_t)15, tail = cols - full, r = r0;
    __m512 xt = tail ? load_tail(x + full, tail) : _mm512_setzero_ps();
    for (; r + 4 <= r1; r += 4) {
        const float *a = w + r * cols, *b = a + cols, *c = b + cols, *d = c + cols;
        __m512 sa = _mm512_setzero_ps(), sb = sa, sc = sa, sd = sa;
        for (int64_t i = 0; i < full; i += 16) {
            __m512 xi = _mm512_loadu_ps(x + i);
            sa = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), xi, sa);
            sb = _mm512_fmadd_ps(_mm512_loadu_ps(b + i), xi, sb);
            sc = _mm512_fmadd_ps(_mm512_loadu_ps(c + i), xi, sc);
            sd = _mm512_fmadd_ps(_mm512_loadu_ps(d + i), xi, sd);
        }
        if (tail) {
            sa = _mm512_fmadd_ps(load_tail(a + full, tail), xt, sa);
            sb = _mm512_fmadd_ps(load_tail(b + full, tail), xt, sb);
            sc = _mm512_fmadd_ps(load_tail(c + full, tail), xt, sc);
            sd = _mm512_fmadd_ps(load_tail(d + full, tail), xt, sd);
        }
        y[r] = hsum(sa), y[r + 1] = hsum(sb), y[r + 2] = hsum(sc), y[r + 3] = hsum(sd);
    }
    for (; r < r1; r++) {
        const float *a = w + r * cols;
        __m512 s = _mm512_setzero_ps();
        for (int64_t i = 0; i < full; i += 16)
            s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(x + i), s);
        if (tail) s = _mm512_fmadd_ps(load_tail(a + full, tail), xt, s);
        y[r] = hsum(s);
    }
}

/* ---- batched BF16 / F32 (n > 1): widen a 16-row × 256-column tile once, use it for every
 * vector ---------------------------------------------------------------------------------- */

enum { SRC_BF16, SRC_F32 };
typedef struct wsrc {
    int kind;
    const void *w; /* BF16 or F32 data */
    int64_t cols;
} wsrc;

/* t[0 .. kc rounded up to 16) = W[r][k0 .. k0 + kc), zero-padded: the very vectors the
 * matrix-vector loops compute in registers. */
static void tile_row(const wsrc *s, int64_t r, int64_t k0, int64_t kc, float *t) {
    int64_t full = kc & ~(int64_t)15, tail = kc - full;
    if (s->kind == SRC_BF16) {
        const uint16_t *p = (const uint16_t *)s->w + r * s->cols + k0;
        for (int64_t i = 0; i < full; i += 16) _mm512_store_ps(t + i, bf16_16(p + i));
        if (tail) _mm512_store_ps(t + full, bf16_tail(p + full, tail));
    } else {
        const float *p = (const float *)s->w + r * s->cols + k0;
        for (int64_t i = 0; i < full; i += 16) _mm512_store_ps(t + i, _mm512_loadu_ps(p + i));
        if (tail) _mm512_store_ps(t + full, load_tail(p + full, tail));
    }
}

/* The micro-kernel's row and vector loops must unroll fully, or its accumulators live on
 * the stack (a 3x slower batched product). */
#define UNROLL _Pragma("GCC unroll 4")
#define UNROLL8 _Pragma("GCC unroll 8")
#define UNROLL32 _Pragma("GCC unroll 32")

/* acc[r][v] += tile rows r < R times vectors v < V over one tile (full steps, then the
 * masked tail step). R and V are constants at each call, so the loops unroll. */
static inline __attribute__((always_inline)) void micro(const float *t, int R, const float *x,
                                                        int64_t ldx, int V, int64_t full,
                                                        int64_t tail, __m512 *acc) {
    __m512 a[4][4];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int v = 0; v < V; v++) a[r][v] = acc[r * K3_MAX_BATCH + v];
    for (int64_t i = 0; i < full; i += 16) {
        __m512 w[4];
        UNROLL
        for (int r = 0; r < R; r++) w[r] = _mm512_load_ps(t + r * KC + i);
        UNROLL
        for (int v = 0; v < V; v++) {
            __m512 xv = _mm512_loadu_ps(x + v * ldx + i);
            UNROLL
            for (int r = 0; r < R; r++) a[r][v] = _mm512_fmadd_ps(w[r], xv, a[r][v]);
        }
    }
    if (tail)
        UNROLL
        for (int v = 0; v < V; v++) {
            __m512 xv = load_tail(x + v * ldx + full, tail);
            UNROLL
            for (int r = 0; r < R; r++)
                a[r][v] = _mm512_fmadd_ps(_mm512_load_ps(t + r * KC + full), xv, a[r][v]);
        }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int v = 0; v < V; v++) acc[r * K3_MAX_BATCH + v] = a[r][v];
}

/* One tile's products for all n vectors: 4 rows × 4 vectors per micro call. */
static void tile_products(const float *tile, int nr, const float *x, int64_t cols, int n,
                          int64_t full, int64_t tail, __m512 (*acc)[K3_MAX_BATCH]) {
    int b = 0;
    for (; b + 4 <= n; b += 4) {
        int r = 0;
        for (; r + 4 <= nr; r += 4)
            micro(tile + r * KC, 4, x + b * cols, cols, 4, full, tail, &acc[r][b]);
        for (; r < nr; r++) micro(tile + r * KC, 1, x + b * cols, cols, 4, full, tail, &acc[r][b]);
    }
    for (; b < n; b++) {
        int r = 0;
        for (; r + 4 <= nr; r += 4)
            micro(tile + r * KC, 4, x + b * cols, cols, 1, full, tail, &acc[r][b]);
        for (; r < nr; r++) micro(tile + r * KC, 1, x + b * cols, cols, 1, full, tail, &acc[r][b]);
    }
}

static void matmul_tiles(const wsrc *s, int64_t rows, const float *x, int n, float *y,
                         int64_t r0, int64_t r1) {
    _Alignas(64) float tile[RG * KC];
    __m512 acc[RG][K3_MAX_BATCH];
    int64_t cols = s->cols;
    for (int64_t rg = r0; rg < r1; rg += RG) {
        int nr = r1 - rg < RG ? (int)(r1 - rg) : RG;
        for (int r = 0; r < nr; r++)
            for (int b = 0; b < n; b++) acc[r][b] = _mm512_setzero_ps();
        for (int64_t k0 = 0; k0 < cols; k0 += KC) {
            int64_t kc = cols - k0 < KC ? cols - k0 : KC, full = kc & ~(int64_t)15;
            for (int r = 0; r < nr; r++) tile_row(s, rg + r, k0, kc, tile + r * KC);
            tile_products(tile, nr, x + k0, cols, n, full, kc - full, acc);
        }
        for (int r = 0; r < nr; r++)
            for (int b = 0; b < n; b++) y[b * rows + rg + r] = hsum(acc[r][b]);
    }
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

/* ---- BF16 small batches (2 <= n <= BF16_SMALL): straight from registers ---------------- */

/* Widest batch taken from registers; above it the tiles. Chunked prefill's per-expert and
 * speculative verification's batches are this small; the tile path cost ~2.6x a matrix-vector
 * product at n = 2 (cpu_avx2.c's measurement). */
#define BF16_SMALL 5

/* y[v·rows + r + i] = W[r + i] · x[v] for rows i < R and vectors v < V: each 16-weight vector is
 * widened once and meets all V inputs; per (row, vector) the lane recipe exactly (full steps,
 * then the masked tail step, then hsum), so the bits equal bf16_vec's. R·V <= 20 accumulators;
 * R and V are constants at each call. */
static inline __attribute__((always_inline)) void bf16_rows(const uint16_t *w, int64_t rows,
                                                            int64_t cols, const float *x,
                                                            int V, int R, float *y, int64_t r) {
    int64_t full = cols & ~(int64_t)15, tail = cols - full;
    __m512 acc[20];
    UNROLL8
    for (int k = 0; k < R * V; k++) acc[k] = _mm512_setzero_ps();
    for (int64_t i = 0; i < full; i += 16)
        UNROLL
        for (int q = 0; q < R; q++) {
            __m512 wq = bf16_16(w + (r + q) * cols + i);
            UNROLL8
            for (int v = 0; v < V; v++)
                acc[q * V + v] =
                    _mm512_fmadd_ps(wq, _mm512_loadu_ps(x + v * cols + i), acc[q * V + v]);
        }
    if (tail)
        UNROLL
        for (int q = 0; q < R; q++) {
            __m512 wq = bf16_tail(w + (r + q) * cols + full, tail);
            UNROLL8
            for (int v = 0; v < V; v++)
                acc[q * V + v] = _mm512_fmadd_ps(wq, load_tail(x + v * cols + full, tail),
                                                 acc[q * V + v]);
        }
    UNROLL
    for (int q = 0; q < R; q++)
        UNROLL8
        for (int v = 0; v < V; v++) y[v * rows + r + q] = hsum(acc[q * V + v]);
}

#define BF16_RUN(R_, V_)                                                              \
    do {                                                                              \
        for (; r + (R_) <= r1; r += (R_)) bf16_rows(w, rows, cols, x, (V_), (R_), y, r); \
        for (; r < r1; r++) bf16_rows(w, rows, cols, x, (V_), 1, y, r);              \
    } while (0)

static void bf16_small(const uint16_t *w, int64_t rows, int64_t cols, const float *x, int n,
                       float *y, int64_t r0, int64_t r1) {
    int64_t r = r0;
    switch (n) {
    case 2: BF16_RUN(4, 2); break;
    case 3: BF16_RUN(4, 3); break;
    case 4: BF16_RUN(4, 4); break;
    default: BF16_RUN(4, 5); break;
    }
}
#undef BF16_RUN

/* ---- the table's entries -------------------------------------------------------------- */

static void bf16(const uint16_t *w, int64_t rows, int64_t cols, const float *x, int n, float *y,
                 int64_t r0, int64_t r1) {
    if (n == 1) {
        bf16_vec(w, cols, x, y, r0, r1);
        return;
    }
    if (n <= BF16_SMALL) {
        bf16_small(w, rows, cols, x, n, y, r0, r1);
        return;
    }
    wsrc s = {SRC_BF16, w, cols};
    matmul_tiles(&s, rows, x, n, y, r0, r1);
}

static void f32(const float *w, int64_t rows, int64_t cols, const float *x, int n, float *y,
                int64_t r0, int64_t r1) {
    if (n == 1) {
        f32_vec(w, cols, x, y, r0, r1);
        return;
    }
    wsrc s = {SRC_F32, w, cols};
    matmul_tiles(&s, rows, x, n, y, r0, r1);
}

static void mxfp4(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols,
                  const float *x, int n, float *y, int64_t r0, int64_t r1) {
    mxfp4_rows(packed, scale, rows, cols, x, n, y, r0, r1);
}

static float dot(const float *a, const float *b, int64_t n) {
    int64_t full = n & ~(int64_t)15, tail = n - full;
    __m512 s = _mm512_setzero_ps();
    for (int64_t i = 0; i < full; i += 16)
        s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s);
    if (tail) s = _mm512_fmadd_ps(load_tail(a + full, tail), load_tail(b + full, tail), s);
    return hsum(s);
}

/* Separate multiply and add, element by element: the scalar result exactly. */
static void axpy(float a, const float *x, float *y, int64_t n) {
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i),
                                              _mm512_mul_ps(va, _mm512_loadu_ps(x + i))));
    for (; i < n; i++) y[i] = y[i] + a * x[i];
}

/* cpu_scalar.c's kda_delta vectorised over the value index j: each element sees the same
 * operations in the same order (no FMA), so the result is the scalar one exactly. */
static void kda_delta(float *S, const float *q, const float *k, const float *v,
                      const float *alpha, float beta, int d, float *u, float *o) {
    int dv = d & ~15;
    for (int j = 0; j < d; j++) u[j] = 0;
    for (int i = 0; i < d; i++) {
        float *row = S + (size_t)i * d;
        __m512 al = _mm512_set1_ps(alpha[i]), ki = _mm512_set1_ps(k[i]);
        for (int j = 0; j < dv; j += 16) {
            __m512 s = _mm512_mul_ps(_mm512_loadu_ps(row + j), al);
            _mm512_storeu_ps(row + j, s);
            _mm512_storeu_ps(u + j, _mm512_add_ps(_mm512_loadu_ps(u + j), _mm512_mul_ps(ki, s)));
        }
        for (int j = dv; j < d; j++) {
            row[j] = row[j] * alpha[i];
            u[j] = u[j] + k[i] * row[j];
        }
    }
    for (int j = 0; j < d; j++) u[j] = v[j] - u[j]; /* δ */
    for (int j = 0; j < d; j++) o[j] = 0;
    for (int i = 0; i < d; i++) {
        float bk = beta * k[i];
        float *row = S + (size_t)i * d;
        __m512 vbk = _mm512_set1_ps(bk), qi = _mm512_set1_ps(q[i]);
        for (int j = 0; j < dv; j += 16) {
            __m512 s = _mm512_add_ps(_mm512_loadu_ps(row + j),
                                     _mm512_mul_ps(vbk, _mm512_loadu_ps(u + j)));
            _mm512_storeu_ps(row + j, s);
            _mm512_storeu_ps(o + j, _mm512_add_ps(_mm512_loadu_ps(o + j), _mm512_mul_ps(qi, s)));
        }
        for (int j = dv; j < d; j++) {
            row[j] = row[j] + bk * u[j];
            o[j] = o[j] + q[i] * row[j];
        }
    }
}

#if !defined(K3_AVX512_EMULATED)
#pragma GCC pop_options
#endif

const k3_kernels k3_kernels_avx512 = {
    .name = "avx512",
    .bf16 = bf16,
    .f32 = f32,
    .mxfp4 = mxfp4,
    .dot = dot,
    .axpy = axpy,
    .kda_delta = kda_delta,
};

#endif
