/* simd_gemm.h — the register-blocked GEMM micro-kernel of the batched BF16 / F32 products
 * (prompt rows × weights, n > BF16_SMALL vectors on x86; every n > 1 on NEON, whose tiles also
 * hold decoded MXFP4), written once over lane macros and included by simd_dense.h (x86) and
 * cpu_neon.c. Internal to src/kernels.
 *
 * Summation order (the exactness contract, kernels.h): each output (row r, vector v) has ONE
 * W-lane accumulator, zero at the start; step i (ascending, i = 0, W, 2W, ..) does
 * acc = fma(W[r][i..i+W), x[v][i..i+W), acc) — one rounding per lane per step, FMA — a last
 * partial step takes zero-padded weights and zero-padded inputs, then hsum adds the lanes in
 * its one fixed order. That is exactly the sequence of the matrix-vector loop (n = 1) and of
 * bf16_rows (n <= 5), so every batch size gives a row the same bits; only which independent
 * (row, vector) sums run side by side changes.
 *
 * Blocking (the idea of BLIS/GotoBLAS, with the accumulator's lanes running along k rather
 * than along the output, because the order above fixes them there):
 *  - a row block of GEMM_RB rows keeps its accumulators in `acc` (L2) across the columns,
 *    taken GEMM_KC at a time (a tile); per tile, every vector's columns are packed once,
 *    step-interleaved per group of GEMM_V (the rows of x lie 28 KB apart on K3, which alias
 *    in L1; packed, a group's panel is one stream), for every slab of the block's rows;
 *  - a slab is GEMM_R rows × GEMM_KC columns widened once to f32 into L1 and run against
 *    every group. Two slab buffers: while one runs, the next slab's rows are prefetched and
 *    widened into the other, one row after each group's micro-kernel call (GEMM_LAG groups
 *    after its prefetch), so the widening's loads overlap the FMAs instead of waiting in a
 *    phase of their own; the next tile's inputs are prefetched a few lines per call too;
 *  - the micro-kernel keeps GEMM_R rows × GEMM_V vectors of accumulators in registers across
 *    the slab's columns: each step loads GEMM_R weight vectors and GEMM_V input vectors for
 *    GEMM_R·GEMM_V FMAs (AVX2 3×4: 12 accumulators + 3 weights + 1 input = the 16 ymm
 *    registers, 7 loads per 12 FMAs; AVX-512 and NEON 4×6: 24 + 4 + 1 of the 32). Twelve or
 *    more independent chains cover the FMA latency (4 cycles) on two FMA pipes; the
 *    accumulators wait in `acc` between tiles (one load and one store per GEMM_KC columns).
 * mix_gemm_dense() runs the micro-kernel on an L1-resident slab and mix_fma() independent FMA
 * chains, for `k3-lab bench kernels` (k3_kernels_mix: the peaks, measured in the same run).
 * Measured (BENCHMARKS.md, issue 31): AVX-512 BF16 at 64 rows 72–74% of the mix's peak on
 * Zen 4 in quiet runs (69–70% with a whole tile widened in a phase of its own), AVX2 74–76%.
 *
 * The includer defines W, VF, VZERO, VLOADU, VLOADA, VSTOREA, VFMA, VADD, VSET1, hsum,
 * load_tail, tile_row and wsrc (with fields kind, w and cols; SRC_BF16 / SRC_F32), f32_vec
 * (simd_vec.h), GEMM_R, GEMM_V, GEMM_RB (a multiple of GEMM_R), GEMM_KC (a multiple of W) and
 * UNROLL8 (covering GEMM_R and GEMM_V). It defines the F32 table entry, f32. */

/* acc[r·K3_MAX_BATCH + v] += tile rows r < R · vectors v < V over `steps` steps of W columns;
 * xp holds the vectors' columns interleaved by step (xp[(s·GEMM_V + v)·W + l]) and zero-padded,
 * as the tile's rows are, so a last partial step is the masked tail step of the lane recipe.
 * R and V are constants at each call (the loops unroll). */
static inline __attribute__((always_inline)) void gemm_micro(const float *t, int R,
                                                             const float *xp, int V,
                                                             int64_t steps, VF *acc) {
    VF a[GEMM_R][GEMM_V];
    UNROLL8
    for (int r = 0; r < R; r++)
        UNROLL8
        for (int v = 0; v < V; v++) a[r][v] = acc[r * K3_MAX_BATCH + v];
    for (int64_t s = 0; s < steps; s++) {
        VF w[GEMM_R];
        UNROLL8
        for (int r = 0; r < R; r++) w[r] = VLOADA(t + r * GEMM_KC + s * W);
        UNROLL8
        for (int v = 0; v < V; v++) {
            VF xv = VLOADA(xp + (s * GEMM_V + v) * W);
            UNROLL8
            for (int r = 0; r < R; r++) a[r][v] = VFMA(w[r], xv, a[r][v]);
        }
    }
    UNROLL8
    for (int r = 0; r < R; r++)
        UNROLL8
        for (int v = 0; v < V; v++) acc[r * K3_MAX_BATCH + v] = a[r][v];
}

/* gemm_micro with R = GEMM_R (or 1, row by row, for a range's last rows) and V = 1..GEMM_V
 * as constants. */
#define GEMM_V4 (4 < GEMM_V ? 4 : 1) /* 4 where that is a remainder size, else unused */
#define GEMM_CALL(R_)                                                                        \
    if (V == GEMM_V) gemm_micro(t, R_, xp, GEMM_V, steps, acc);                              \
    else if (V == 1) gemm_micro(t, R_, xp, 1, steps, acc);                                   \
    else if (V == 2) gemm_micro(t, R_, xp, 2, steps, acc);                                   \
    else if (V == 3) gemm_micro(t, R_, xp, 3, steps, acc);                                   \
    else { /* 4 <= V < GEMM_V: four, then one at a time */                                   \
        gemm_micro(t, R_, xp, GEMM_V4, steps, acc);                                          \
        for (int v = GEMM_V4; v < V; v++) gemm_micro(t, R_, xp + v * W, 1, steps, acc + v);  \
    }
static void gemm_group(const float *t, int R, const float *xp, int V, int64_t steps, VF *acc) {
    if (R == GEMM_R) {
        GEMM_CALL(GEMM_R)
    } else {
        for (int r = 0; r < R; r++, t += GEMM_KC, acc += K3_MAX_BATCH) GEMM_CALL(1)
    }
}
#undef GEMM_CALL

/* xp[(s·GEMM_V + v)·W + l] = x[v·ldx + s·W + l] for v < V and columns s·W + l < kc; zeros
 * past kc (load_tail: never reads past the row). */
static void gemm_pack_x(const float *x, int64_t ldx, int V, int64_t kc, float *xp) {
    int64_t full = kc & ~(int64_t)(W - 1), tail = kc - full;
    for (int v = 0; v < V; v++) {
        const float *xv = x + v * ldx;
        int64_t s = 0;
        for (; s * W < full; s++) VSTOREA(xp + (s * GEMM_V + v) * W, VLOADU(xv + s * W));
        if (tail) VSTOREA(xp + (s * GEMM_V + v) * W, load_tail(xv + full, tail));
    }
}

/* Groups of micro-kernel calls between a row's prefetch and its widening (gemm_slab_run). */
#define GEMM_LAG 2

/* Rows [rg + r, rg + r + R) of the row block [rg, rg + nr) × columns [k0, k0 + kc): one slab
 * of gemm_dense; R = 0 past the last. */
typedef struct gemm_slab {
    int64_t rg, k0, kc;
    int nr, r, R;
} gemm_slab;

/* The slab after c in gemm_dense's order (the block's next GEMM_R rows, then its next
 * columns, then the next block), for rows below r1. */
static gemm_slab gemm_next(gemm_slab c, int64_t cols, int64_t r1) {
    if (c.r + GEMM_R < c.nr) {
        c.r += GEMM_R;
    } else if (c.k0 + c.kc < cols) {
        c.r = 0, c.k0 += c.kc;
    } else {
        c.r = 0, c.k0 = 0, c.rg += GEMM_RB;
        c.nr = r1 - c.rg < GEMM_RB ? (int)(r1 - c.rg) : GEMM_RB;
        if (c.nr < 0) c.nr = 0;
    }
    c.kc = cols - c.k0 < GEMM_KC ? cols - c.k0 : GEMM_KC;
    c.R = c.nr - c.r < GEMM_R ? c.nr - c.r : GEMM_R;
    if (c.R < 0) c.R = 0;
    return c;
}

/* The next tile's inputs (xn: x at its first column, n rows of kc floats, cols apart), part q
 * of nq: prefetched a few lines per micro-kernel call (a burst of them filled the miss buffers
 * and stalled). */
static inline void gemm_prefetch_x(const float *xn, int n, int64_t kc, int64_t cols, int64_t q,
                                   int64_t nq) {
    int64_t lpr = (kc * 4 + 63) / 64, all = (int64_t)n * lpr;
    for (int64_t l = all * q / nq; l < all * (q + 1) / nq; l++)
        __builtin_prefetch((const char *)(xn + l / lpr * cols) + l % lpr * 64);
}

/* acc (slab c's rows) += its widened rows t · the n packed vectors xp, group by group; after
 * group g, row g of the next slab nx is prefetched and row g - GEMM_LAG widened into tn (the
 * rest after the last group), and part q0 + g of nq of the next tile's inputs xn (kcn columns;
 * NULL: none) prefetched. */
static void gemm_slab_run(const wsrc *s, gemm_slab c, const float *t, const float *xp, int n,
                          gemm_slab nx, float *tn, VF *acc, const float *xn, int64_t kcn,
                          int64_t q0, int64_t nq) {
    int64_t steps = (c.kc + W - 1) / W;
    int64_t esz = s->kind == SRC_BF16 ? 2 : s->kind == SRC_F32 ? 4 : 0; /* 0: not prefetched */
    int g = 0;
    for (int b = 0; b < n; b += GEMM_V, g++) {
        gemm_group(t, c.R, xp + b * GEMM_KC, n - b < GEMM_V ? n - b : GEMM_V, steps, acc + b);
        if (g < nx.R && esz) {
            const char *w = (const char *)s->w + ((nx.rg + nx.r + g) * s->cols + nx.k0) * esz;
            for (int64_t o = 0; o < nx.kc * esz; o += 64) __builtin_prefetch(w + o);
        }
        if (xn) gemm_prefetch_x(xn, n, kcn, s->cols, q0 + g, nq);
        int h = g - GEMM_LAG;
        if (h >= 0 && h < nx.R) tile_row(s, nx.rg + nx.r + h, nx.k0, nx.kc, tn + h * GEMM_KC);
    }
    for (int h = g > GEMM_LAG ? g - GEMM_LAG : 0; h < nx.R; h++)
        tile_row(s, nx.rg + nx.r + h, nx.k0, nx.kc, tn + h * GEMM_KC);
}

/* Rows [r0, r1) of W (BF16 or F32, s) times n <= K3_MAX_BATCH vectors, slab by slab (the
 * blocking above): xp holds the tile's packed inputs (group b / GEMM_V at xp + b·GEMM_KC),
 * t the slab in use and the next. */
static void gemm_dense(const wsrc *s, int64_t rows, const float *x, int n, float *y, int64_t r0,
                       int64_t r1) {
    _Alignas(64) float t[2][GEMM_R * GEMM_KC];
    _Alignas(64) float xp[(K3_MAX_BATCH + GEMM_V - 1) / GEMM_V * GEMM_V * GEMM_KC];
    VF acc[GEMM_RB * K3_MAX_BATCH];
    int64_t cols = s->cols;
    int ng = (n + GEMM_V - 1) / GEMM_V;
    gemm_slab c = {r0 - GEMM_RB, 0, cols, 0, 0, 0}; /* before the first: the next is the first */
    c = gemm_next(c, cols, r1);
    for (int i = 0; i < c.R; i++) tile_row(s, c.rg + i, 0, c.kc, t[0] + i * GEMM_KC);
    for (int b = 0; c.R; b ^= 1) {
        gemm_slab nx = gemm_next(c, cols, r1);
        if (c.r == 0 && c.k0 == 0) /* only the n vectors' accumulators: a small product */
            for (int r = 0; r < c.nr; r++)
                for (int v = 0; v < n; v++) acc[r * K3_MAX_BATCH + v] = VZERO();
        if (c.r == 0) /* the tile's inputs, every group */
            for (int v = 0; v < n; v += GEMM_V)
                gemm_pack_x(x + (int64_t)v * cols + c.k0, cols, n - v < GEMM_V ? n - v : GEMM_V,
                            c.kc, xp + v * GEMM_KC);
        /* the next tile: these rows' next columns, or the next block's first (none past r1) */
        int last = c.k0 + c.kc >= cols;
        int64_t kn = last ? 0 : c.k0 + c.kc, kcn = cols - kn < GEMM_KC ? cols - kn : GEMM_KC;
        const float *xn = last && c.rg + GEMM_RB >= r1 ? NULL : x + kn;
        int64_t slabs = (c.nr + GEMM_R - 1) / GEMM_R;
        gemm_slab_run(s, c, t[b], xp, n, nx, t[b ^ 1], acc + c.r * K3_MAX_BATCH, xn, kcn,
                      c.r / GEMM_R * ng, slabs * ng);
        if (nx.rg != c.rg || !nx.R) /* the block's last slab */
            for (int r = 0; r < c.nr; r++)
                for (int v = 0; v < n; v++)
                    y[(int64_t)v * rows + c.rg + r] = hsum(acc[r * K3_MAX_BATCH + v]);
        c = nx;
    }
}

/* The F32 table entry of every SIMD path: simd_vec.h's matrix-vector loop for one vector, the
 * GEMM for a batch (from 2 vectors: F32 has no small-batch loop). */
static void f32(const float *w, int64_t rows, int64_t cols, const float *x, int n, float *y,
                int64_t r0, int64_t r1) {
    if (n == 1) {
        f32_vec(w, cols, x, y, r0, r1);
        return;
    }
    wsrc s = {.kind = SRC_F32, .w = w, .cols = cols};
    gemm_dense(&s, rows, x, n, y, r0, r1);
}

/* ---- the instruction mixes, for `k3-lab bench kernels` ----------------------------------- */

#define UNROLL_MIX _Pragma("GCC unroll 32")

/* GEMM_R·GEMM_V independent FMA chains in registers, reps times 64 steps: the FMA peak. Returns
 * the multiply-adds done (f32 lanes). The chains' inputs come from memory the compiler cannot
 * see through (volatile), so nothing folds away. */
static int64_t mix_fma(int64_t reps) {
    volatile float seed[2] = {0.999f, 1e-4f}; /* the compiler cannot fold the chains */
    VF m = VSET1(seed[0]), c = VSET1(seed[1]), a[GEMM_R * GEMM_V];
    UNROLL_MIX
    for (int k = 0; k < GEMM_R * GEMM_V; k++) a[k] = VSET1((float)k);
    for (int64_t i = 0; i < reps * 64; i++)
        UNROLL_MIX
        for (int k = 0; k < GEMM_R * GEMM_V; k++) a[k] = VFMA(a[k], m, c);
    VF s = VZERO();
    for (int k = 0; k < GEMM_R * GEMM_V; k++) s = VADD(s, a[k]);
    volatile float sink = hsum(s);
    (void)sink;
    return reps * 64 * GEMM_R * GEMM_V * W;
}

/* gemm_micro itself on one L1-resident tile and input panel, reps times (its loads, FMAs and
 * accumulator traffic, without the widening, the packing or a cache miss): the peak of the
 * dense GEMM's instruction mix. */
static int64_t mix_gemm_dense(int64_t reps) {
    _Alignas(64) float t[GEMM_R * GEMM_KC], xp[GEMM_V * GEMM_KC];
    VF acc[GEMM_R * K3_MAX_BATCH];
    for (int k = 0; k < GEMM_R * GEMM_KC; k++) t[k] = 1e-3f * (float)(k % 7);
    for (int k = 0; k < GEMM_V * GEMM_KC; k++) xp[k] = 1e-3f * (float)(k % 5);
    for (int k = 0; k < GEMM_R * K3_MAX_BATCH; k++) acc[k] = VZERO();
    for (int64_t i = 0; i < reps; i++) gemm_micro(t, GEMM_R, xp, GEMM_V, GEMM_KC / W, acc);
    VF sum = VZERO(); /* every accumulator is used, so no FMA is dead code */
    for (int r = 0; r < GEMM_R; r++)
        for (int v = 0; v < GEMM_V; v++) sum = VADD(sum, acc[r * K3_MAX_BATCH + v]);
    volatile float sink = hsum(sum); /* keeps every FMA live */
    (void)sink;
    return reps * GEMM_R * GEMM_V * GEMM_KC;
}
