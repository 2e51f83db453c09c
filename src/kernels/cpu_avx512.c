/* cpu_avx512.c — the x86-64 AVX-512F path (16 f32 lanes): cpu_avx2.c's loops at twice the
 * width, compiled for AVX-512F by the pragma below and used only when the CPU (and OS) has it.
 *
 * Lane recipe as in cpu_avx2.c, with one 16-lane accumulator per (row, vector); the
 * matrix-vector and batched loops run the same sequence, so they agree bit for bit.
 *
 * MXFP4 decode: eight packed bytes hold sixteen codes; a lane permute and a variable shift put
 * code k in lane k, and vpermps looks it up in the 16-entry table E2M1[code]·scale built once
 * per 32-block (sign included). Each weight equals the scalar path's exactly. */
#include "dispatch.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f")
#include <immintrin.h>

#define KC 256 /* batched tile: columns per tile (a multiple of 32: MXFP4 blocks stay whole) */
#define RG 16  /* batched tile: rows per tile; 16 × 256 f32 = 16 KB, in L1 */

/* k3_e8m0_to_f32's bits, built in an integer register (no float round trip through memory:
 * this runs once per row per 32-block). */
static inline uint32_t e8m0_bits(uint8_t s) {
    return s == 0 ? 0x00400000u : s == 255 ? 0x7fc00000u : (uint32_t)s << 23;
}

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

/* E2M1[code]·scale for the 16 codes, sign included. */
static inline __m512 mx_table(uint8_t scale) {
    __m512 sc = _mm512_castsi512_ps(_mm512_set1_epi32((int32_t)e8m0_bits(scale)));
    return _mm512_mul_ps(_mm512_loadu_ps(k3_e2m1), sc);
}

/* The sixteen weights of eight packed bytes (even column in the low nibble): lane k takes
 * dword k/8 shifted right by 4·(k%8); vpermps uses its low four bits. */
static inline __m512 mx_16(const uint8_t *p, __m512 table) {
    __m512i d = _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)p));
    __m512i sel = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512i sh = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    __m512i c = _mm512_srlv_epi32(_mm512_permutexvar_epi32(sel, d), sh);
    return _mm512_permutexvar_ps(c, table);
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

static void mxfp4_vec(const uint8_t *packed, const uint8_t *scale, int64_t cols,
                      const float *x, float *y, int64_t r0, int64_t r1) {
    int64_t ng = cols / 32, r = r0;
    for (; r + 4 <= r1; r += 4) {
        const uint8_t *pa = packed + r * (cols / 2), *pb = pa + cols / 2, *pc = pb + cols / 2,
                      *pd = pc + cols / 2, *sa = scale + r * ng;
        __m512 aa = _mm512_setzero_ps(), ab = aa, ac = aa, ad = aa;
        for (int64_t g = 0; g < ng; g++) {
            __m512 ta = mx_table(sa[g]), tb = mx_table(sa[ng + g]);
            __m512 tc = mx_table(sa[2 * ng + g]), td = mx_table(sa[3 * ng + g]);
            for (int j = 0; j < 2; j++) {
                int64_t o = g * 16 + 8 * j;
                __m512 xi = _mm512_loadu_ps(x + g * 32 + 16 * j);
                aa = _mm512_fmadd_ps(mx_16(pa + o, ta), xi, aa);
                ab = _mm512_fmadd_ps(mx_16(pb + o, tb), xi, ab);
                ac = _mm512_fmadd_ps(mx_16(pc + o, tc), xi, ac);
                ad = _mm512_fmadd_ps(mx_16(pd + o, td), xi, ad);
            }
        }
        y[r] = hsum(aa), y[r + 1] = hsum(ab), y[r + 2] = hsum(ac), y[r + 3] = hsum(ad);
    }
    for (; r < r1; r++) {
        const uint8_t *p = packed + r * (cols / 2), *s = scale + r * ng;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            __m512 t = mx_table(s[g]);
            for (int j = 0; j < 2; j++)
                acc = _mm512_fmadd_ps(mx_16(p + g * 16 + 8 * j, t),
                                      _mm512_loadu_ps(x + g * 32 + 16 * j), acc);
        }
        y[r] = hsum(acc);
    }
}

/* ---- batched (n > 1): decode a 16-row × 256-column tile once, use it for every vector ---- */

enum { SRC_BF16, SRC_F32, SRC_MXFP4 };
typedef struct wsrc {
    int kind;
    const void *w;         /* BF16 / F32 data, or MXFP4 packed */
    const uint8_t *scale;  /* MXFP4 only */
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
    } else if (s->kind == SRC_F32) {
        const float *p = (const float *)s->w + r * s->cols + k0;
        for (int64_t i = 0; i < full; i += 16) _mm512_store_ps(t + i, _mm512_loadu_ps(p + i));
        if (tail) _mm512_store_ps(t + full, load_tail(p + full, tail));
    } else {
        const uint8_t *p = (const uint8_t *)s->w + r * (s->cols / 2) + k0 / 2;
        const uint8_t *sc = s->scale + r * (s->cols / 32) + k0 / 32;
        for (int64_t g = 0; g < kc / 32; g++) {
            __m512 table = mx_table(sc[g]);
            for (int j = 0; j < 2; j++)
                _mm512_store_ps(t + g * 32 + 16 * j, mx_16(p + g * 16 + 8 * j, table));
        }
    }
}

/* The micro-kernel's row and vector loops must unroll fully, or its accumulators live on
 * the stack (a 3x slower batched product). */
#define UNROLL _Pragma("GCC unroll 4")

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

/* ---- the table's entries -------------------------------------------------------------- */

static void bf16(const uint16_t *w, int64_t rows, int64_t cols, const float *x, int n, float *y,
                 int64_t r0, int64_t r1) {
    if (n == 1) {
        bf16_vec(w, cols, x, y, r0, r1);
        return;
    }
    wsrc s = {SRC_BF16, w, NULL, cols};
    matmul_tiles(&s, rows, x, n, y, r0, r1);
}

static void f32(const float *w, int64_t rows, int64_t cols, const float *x, int n, float *y,
                int64_t r0, int64_t r1) {
    if (n == 1) {
        f32_vec(w, cols, x, y, r0, r1);
        return;
    }
    wsrc s = {SRC_F32, w, NULL, cols};
    matmul_tiles(&s, rows, x, n, y, r0, r1);
}

static void mxfp4(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols,
                  const float *x, int n, float *y, int64_t r0, int64_t r1) {
    if (n == 1) {
        mxfp4_vec(packed, scale, cols, x, y, r0, r1);
        return;
    }
    wsrc s = {SRC_MXFP4, packed, scale, cols};
    matmul_tiles(&s, rows, x, n, y, r0, r1);
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

#pragma GCC pop_options

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
