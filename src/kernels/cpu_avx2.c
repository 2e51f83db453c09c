/* cpu_avx2.c — the x86-64 AVX2+FMA path (8 f32 lanes). The file is compiled for AVX2 by the
 * pragma below whatever the build flags, and kernels.c uses it only when the CPU has AVX2 and
 * FMA, so one binary runs on any x86-64.
 *
 * Lane recipe (kernels.h): per (row, vector) one 8-lane accumulator; step i adds
 * W[r][i..i+8)·x[i..i+8) with FMA; a last partial step uses zero-padded weights and a masked
 * x load; then hsum() adds the lanes in one fixed order. The matrix-vector loops (n = 1) and
 * the tiled batched loops (n > 1) run exactly this sequence, so they agree bit for bit.
 *
 * MXFP4 decode: four packed bytes hold eight codes; a variable shift puts code k in lane k,
 * vpermps looks up |E2M1|·scale in an 8-entry table built once per 32-block, and the code's
 * sign bit is XORed in. Each weight equals the scalar path's E2M1[code]·scale exactly. */
#include "dispatch.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#define KC 256 /* batched tile: columns per tile (a multiple of 32: MXFP4 blocks stay whole) */
#define RG 16  /* batched tile: rows per tile; 16 × 256 f32 = 16 KB, in L1 */

static const int32_t TAIL_MASK[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
static const float E2M1_MAG[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

/* k3_e8m0_to_f32's bits, built in an integer register (no float round trip through memory:
 * this runs once per row per 32-block). */
static inline uint32_t e8m0_bits(uint8_t s) {
    return s == 0 ? 0x00400000u : s == 255 ? 0x7fc00000u : (uint32_t)s << 23;
}

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

static inline __m256 bf16_tail(const uint16_t *p, int64_t n) {
    uint16_t t[8] = {0};
    memcpy(t, p, (size_t)n * sizeof *p);
    return bf16_8(t);
}

/* |E2M1|·scale for codes 0..7, each XORed with (code << 28) so that mx_8's XOR with the
 * whole code shifted by 28 cancels those bits and leaves only the sign (bit 3 → bit 31). */
static inline __m256 mx_table(uint8_t scale) {
    __m256 sc = _mm256_castsi256_ps(_mm256_set1_epi32((int32_t)e8m0_bits(scale)));
    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(E2M1_MAG), sc);
    __m256i comp = _mm256_setr_epi32(0, 1 << 28, 2 << 28, 3 << 28, 4 << 28, 5 << 28, 6 << 28,
                                     7 << 28);
    return _mm256_xor_ps(t, _mm256_castsi256_ps(comp));
}

/* The eight weights of four packed bytes (even column in the low nibble). */
static inline __m256 mx_8(const uint8_t *p, __m256 table) {
    int32_t u;
    memcpy(&u, p, 4);
    __m256i c = _mm256_srlv_epi32(_mm256_set1_epi32(u), _mm256_setr_epi32(0, 4, 8, 12, 16, 20,
                                                                          24, 28));
    __m256 v = _mm256_permutevar8x32_ps(table, c);
    return _mm256_xor_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(c, 28)));
}

/* ---- matrix-vector (n = 1): four rows share each x load ---------------------------------- */

static void bf16_vec(const uint16_t *w, int64_t cols, const float *x, float *y, int64_t r0,
                     int64_t r1) {
    int64_t full = cols & ~(int64_t)7, tail = cols - full, r = r0;
    __m256 xt = tail ? load_tail(x + full, tail) : _mm256_setzero_ps();
    for (; r + 4 <= r1; r += 4) {
        const uint16_t *a = w + r * cols, *b = a + cols, *c = b + cols, *d = c + cols;
        __m256 sa = _mm256_setzero_ps(), sb = sa, sc = sa, sd = sa;
        for (int64_t i = 0; i < full; i += 8) {
            __m256 xi = _mm256_loadu_ps(x + i);
            sa = _mm256_fmadd_ps(bf16_8(a + i), xi, sa);
            sb = _mm256_fmadd_ps(bf16_8(b + i), xi, sb);
            sc = _mm256_fmadd_ps(bf16_8(c + i), xi, sc);
            sd = _mm256_fmadd_ps(bf16_8(d + i), xi, sd);
        }
        if (tail) {
            sa = _mm256_fmadd_ps(bf16_tail(a + full, tail), xt, sa);
            sb = _mm256_fmadd_ps(bf16_tail(b + full, tail), xt, sb);
            sc = _mm256_fmadd_ps(bf16_tail(c + full, tail), xt, sc);
            sd = _mm256_fmadd_ps(bf16_tail(d + full, tail), xt, sd);
        }
        y[r] = hsum(sa), y[r + 1] = hsum(sb), y[r + 2] = hsum(sc), y[r + 3] = hsum(sd);
    }
    for (; r < r1; r++) {
        const uint16_t *a = w + r * cols;
        __m256 s = _mm256_setzero_ps();
        for (int64_t i = 0; i < full; i += 8)
            s = _mm256_fmadd_ps(bf16_8(a + i), _mm256_loadu_ps(x + i), s);
        if (tail) s = _mm256_fmadd_ps(bf16_tail(a + full, tail), xt, s);
        y[r] = hsum(s);
    }
}

static void f32_vec(const float *w, int64_t cols, const float *x, float *y, int64_t r0,
                    int64_t r1) {
    int64_t full = cols & ~(int64_t)7, tail = cols - full, r = r0;
    __m256 xt = tail ? load_tail(x + full, tail) : _mm256_setzero_ps();
    for (; r + 4 <= r1; r += 4) {
        const float *a = w + r * cols, *b = a + cols, *c = b + cols, *d = c + cols;
        __m256 sa = _mm256_setzero_ps(), sb = sa, sc = sa, sd = sa;
        for (int64_t i = 0; i < full; i += 8) {
            __m256 xi = _mm256_loadu_ps(x + i);
            sa = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), xi, sa);
            sb = _mm256_fmadd_ps(_mm256_loadu_ps(b + i), xi, sb);
            sc = _mm256_fmadd_ps(_mm256_loadu_ps(c + i), xi, sc);
            sd = _mm256_fmadd_ps(_mm256_loadu_ps(d + i), xi, sd);
        }
        if (tail) {
            sa = _mm256_fmadd_ps(load_tail(a + full, tail), xt, sa);
            sb = _mm256_fmadd_ps(load_tail(b + full, tail), xt, sb);
            sc = _mm256_fmadd_ps(load_tail(c + full, tail), xt, sc);
            sd = _mm256_fmadd_ps(load_tail(d + full, tail), xt, sd);
        }
        y[r] = hsum(sa), y[r + 1] = hsum(sb), y[r + 2] = hsum(sc), y[r + 3] = hsum(sd);
    }
    for (; r < r1; r++) {
        const float *a = w + r * cols;
        __m256 s = _mm256_setzero_ps();
        for (int64_t i = 0; i < full; i += 8)
            s = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), s);
        if (tail) s = _mm256_fmadd_ps(load_tail(a + full, tail), xt, s);
        y[r] = hsum(s);
    }
}

static void mxfp4_vec(const uint8_t *packed, const uint8_t *scale, int64_t cols,
                      const float *x, float *y, int64_t r0, int64_t r1) {
    int64_t ng = cols / 32, r = r0;
    for (; r + 4 <= r1; r += 4) {
        const uint8_t *pa = packed + r * (cols / 2), *pb = pa + cols / 2, *pc = pb + cols / 2,
                      *pd = pc + cols / 2, *sa = scale + r * ng;
        __m256 aa = _mm256_setzero_ps(), ab = aa, ac = aa, ad = aa;
        for (int64_t g = 0; g < ng; g++) {
            __m256 ta = mx_table(sa[g]), tb = mx_table(sa[ng + g]);
            __m256 tc = mx_table(sa[2 * ng + g]), td = mx_table(sa[3 * ng + g]);
            for (int j = 0; j < 4; j++) {
                int64_t o = g * 16 + 4 * j;
                __m256 xi = _mm256_loadu_ps(x + g * 32 + 8 * j);
                aa = _mm256_fmadd_ps(mx_8(pa + o, ta), xi, aa);
                ab = _mm256_fmadd_ps(mx_8(pb + o, tb), xi, ab);
                ac = _mm256_fmadd_ps(mx_8(pc + o, tc), xi, ac);
                ad = _mm256_fmadd_ps(mx_8(pd + o, td), xi, ad);
            }
        }
        y[r] = hsum(aa), y[r + 1] = hsum(ab), y[r + 2] = hsum(ac), y[r + 3] = hsum(ad);
    }
    for (; r < r1; r++) {
        const uint8_t *p = packed + r * (cols / 2), *s = scale + r * ng;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            __m256 t = mx_table(s[g]);
            for (int j = 0; j < 4; j++)
                acc = _mm256_fmadd_ps(mx_8(p + g * 16 + 4 * j, t),
                                      _mm256_loadu_ps(x + g * 32 + 8 * j), acc);
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

/* t[0 .. kc rounded up to 8) = W[r][k0 .. k0 + kc), zero-padded: the very vectors the
 * matrix-vector loops compute in registers. */
static void tile_row(const wsrc *s, int64_t r, int64_t k0, int64_t kc, float *t) {
    int64_t full = kc & ~(int64_t)7, tail = kc - full;
    if (s->kind == SRC_BF16) {
        const uint16_t *p = (const uint16_t *)s->w + r * s->cols + k0;
        for (int64_t i = 0; i < full; i += 8) _mm256_store_ps(t + i, bf16_8(p + i));
        if (tail) _mm256_store_ps(t + full, bf16_tail(p + full, tail));
    } else if (s->kind == SRC_F32) {
        const float *p = (const float *)s->w + r * s->cols + k0;
        for (int64_t i = 0; i < full; i += 8) _mm256_store_ps(t + i, _mm256_loadu_ps(p + i));
        if (tail) _mm256_store_ps(t + full, load_tail(p + full, tail));
    } else {
        const uint8_t *p = (const uint8_t *)s->w + r * (s->cols / 2) + k0 / 2;
        const uint8_t *sc = s->scale + r * (s->cols / 32) + k0 / 32;
        for (int64_t g = 0; g < kc / 32; g++) {
            __m256 table = mx_table(sc[g]);
            for (int j = 0; j < 4; j++)
                _mm256_store_ps(t + g * 32 + 8 * j, mx_8(p + g * 16 + 4 * j, table));
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
                                                        int64_t tail, __m256 *acc) {
    __m256 a[4][2];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int v = 0; v < V; v++) a[r][v] = acc[r * K3_MAX_BATCH + v];
    for (int64_t i = 0; i < full; i += 8) {
        __m256 w[4];
        UNROLL
        for (int r = 0; r < R; r++) w[r] = _mm256_load_ps(t + r * KC + i);
        UNROLL
        for (int v = 0; v < V; v++) {
            __m256 xv = _mm256_loadu_ps(x + v * ldx + i);
            UNROLL
            for (int r = 0; r < R; r++) a[r][v] = _mm256_fmadd_ps(w[r], xv, a[r][v]);
        }
    }
    if (tail)
        UNROLL
        for (int v = 0; v < V; v++) {
            __m256 xv = load_tail(x + v * ldx + full, tail);
            UNROLL
            for (int r = 0; r < R; r++)
                a[r][v] = _mm256_fmadd_ps(_mm256_load_ps(t + r * KC + full), xv, a[r][v]);
        }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int v = 0; v < V; v++) acc[r * K3_MAX_BATCH + v] = a[r][v];
}

/* One tile's products for all n vectors: 4 rows × 2 vectors per micro call. */
static void tile_products(const float *tile, int nr, const float *x, int64_t cols, int n,
                          int64_t full, int64_t tail, __m256 (*acc)[K3_MAX_BATCH]) {
    int b = 0;
    for (; b + 2 <= n; b += 2) {
        int r = 0;
        for (; r + 4 <= nr; r += 4)
            micro(tile + r * KC, 4, x + b * cols, cols, 2, full, tail, &acc[r][b]);
        for (; r < nr; r++) micro(tile + r * KC, 1, x + b * cols, cols, 2, full, tail, &acc[r][b]);
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
    _Alignas(32) float tile[RG * KC];
    __m256 acc[RG][K3_MAX_BATCH];
    int64_t cols = s->cols;
    for (int64_t rg = r0; rg < r1; rg += RG) {
        int nr = r1 - rg < RG ? (int)(r1 - rg) : RG;
        for (int r = 0; r < nr; r++)
            for (int b = 0; b < n; b++) acc[r][b] = _mm256_setzero_ps();
        for (int64_t k0 = 0; k0 < cols; k0 += KC) {
            int64_t kc = cols - k0 < KC ? cols - k0 : KC, full = kc & ~(int64_t)7;
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
    int64_t full = n & ~(int64_t)7, tail = n - full;
    __m256 s = _mm256_setzero_ps();
    for (int64_t i = 0; i < full; i += 8)
        s = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s);
    if (tail) s = _mm256_fmadd_ps(load_tail(a + full, tail), load_tail(b + full, tail), s);
    return hsum(s);
}

/* Separate multiply and add, element by element: the scalar result exactly. */
static void axpy(float a, const float *x, float *y, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i),
                                              _mm256_mul_ps(va, _mm256_loadu_ps(x + i))));
    for (; i < n; i++) y[i] = y[i] + a * x[i];
}

/* cpu_scalar.c's kda_delta vectorised over the value index j: each element sees the same
 * operations in the same order (no FMA), so the result is the scalar one exactly. */
static void kda_delta(float *S, const float *q, const float *k, const float *v,
                      const float *alpha, float beta, int d, float *u, float *o) {
    int dv = d & ~7;
    for (int j = 0; j < d; j++) u[j] = 0;
    for (int i = 0; i < d; i++) {
        float *row = S + (size_t)i * d;
        __m256 al = _mm256_set1_ps(alpha[i]), ki = _mm256_set1_ps(k[i]);
        for (int j = 0; j < dv; j += 8) {
            __m256 s = _mm256_mul_ps(_mm256_loadu_ps(row + j), al);
            _mm256_storeu_ps(row + j, s);
            _mm256_storeu_ps(u + j, _mm256_add_ps(_mm256_loadu_ps(u + j), _mm256_mul_ps(ki, s)));
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
        __m256 vbk = _mm256_set1_ps(bk), qi = _mm256_set1_ps(q[i]);
        for (int j = 0; j < dv; j += 8) {
            __m256 s = _mm256_add_ps(_mm256_loadu_ps(row + j),
                                     _mm256_mul_ps(vbk, _mm256_loadu_ps(u + j)));
            _mm256_storeu_ps(row + j, s);
            _mm256_storeu_ps(o + j, _mm256_add_ps(_mm256_loadu_ps(o + j), _mm256_mul_ps(qi, s)));
        }
        for (int j = dv; j < d; j++) {
            row[j] = row[j] + bk * u[j];
            o[j] = o[j] + q[i] * row[j];
        }
    }
}

#pragma GCC pop_options

const k3_kernels k3_kernels_avx2 = {
    .name = "avx2",
    .bf16 = bf16,
    .f32 = f32,
    .mxfp4 = mxfp4,
    .dot = dot,
    .axpy = axpy,
    .kda_delta = kda_delta,
};

#endif
