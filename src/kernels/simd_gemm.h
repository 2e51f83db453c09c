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
 *  - the weights of GEMM_RB rows × GEMM_KC columns are widened once to f32 into a tile (96
 *    or 64 rows × 512 columns: L2) and used for every vector; while a tile is widened, the
 *    same rows' next columns are prefetched (short runs at a large stride, which the hardware
 *    prefetcher does not follow);
 *  - each group of GEMM_V vectors' GEMM_KC columns is packed step-interleaved into L1 (the
 *    rows of x lie 28 KB apart on K3, which alias in L1), the next group's prefetched;
 *  - the micro-kernel keeps GEMM_R rows × GEMM_V vectors of accumulators in registers across
 *    the tile's columns: each step loads GEMM_R weight vectors and GEMM_V input vectors for
 *    GEMM_R·GEMM_V FMAs (AVX2 3×4: 12 accumulators + 3 weights + 1 input = the 16 ymm
 *    registers, 7 loads per 12 FMAs; AVX-512 and NEON 4×6: 24 + 4 + 1 of the 32). Twelve or
 *    more independent chains cover the FMA latency (4 cycles) on two FMA pipes; the
 *    accumulators wait in `acc` between tiles (one load and one store per GEMM_KC columns).
 * mix_gemm_dense() runs the micro-kernel on an L1-resident tile and mix_fma() independent FMA
 * chains, for `k3-lab bench kernels` (k3_kernels_mix: the peaks, measured in the same run).
 * Measured (BENCHMARKS.md, issue 31): 71–75% of the mix's peak at 64 rows on Zen 4.
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

/* Asks for the cache lines of p[0..bytes) ahead of their use: the next group's inputs and the
 * next tile's weights are short runs at large strides, which the hardware prefetcher does not
 * follow (without this the loads waited on L3 / memory for ~40% of the time). */
static inline void gemm_prefetch(const void *p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o);
}

/* Rows [r0, r1) of W (BF16 or F32, s) times n <= K3_MAX_BATCH vectors. */
static void gemm_dense(const wsrc *s, int64_t rows, const float *x, int n, float *y, int64_t r0,
                       int64_t r1) {
    _Alignas(64) float tile[GEMM_RB * GEMM_KC], xp[GEMM_V * GEMM_KC];
    VF acc[GEMM_RB * K3_MAX_BATCH];
    int64_t cols = s->cols;
    for (int64_t rg = r0; rg < r1; rg += GEMM_RB) {
        int nr = r1 - rg < GEMM_RB ? (int)(r1 - rg) : GEMM_RB;
        for (int r = 0; r < nr; r++) /* only the n vectors' accumulators: a small product */
            for (int b = 0; b < n; b++) acc[r * K3_MAX_BATCH + b] = VZERO();
        for (int64_t k0 = 0; k0 < cols; k0 += GEMM_KC) {
            int64_t kc = cols - k0 < GEMM_KC ? cols - k0 : GEMM_KC, steps = (kc + W - 1) / W;
            /* bytes per weight of the row's next tile (0: a format not prefetched) */
            int64_t esz = s->kind == SRC_BF16 ? 2 : s->kind == SRC_F32 ? 4 : 0;
            int64_t kn = cols - k0 - kc;
            for (int r = 0; r < nr; r++) {
                tile_row(s, rg + r, k0, kc, tile + r * GEMM_KC);
                if (kn > 0 && esz) /* this row's next tile */
                    gemm_prefetch((const char *)s->w + ((rg + r) * cols + k0 + kc) * esz,
                                  (kn < GEMM_KC ? kn : GEMM_KC) * esz);
            }
            for (int b = 0; b < n; b += GEMM_V) {
                int V = n - b < GEMM_V ? n - b : GEMM_V;
                for (int v = b + GEMM_V; v < n && v < b + 2 * GEMM_V; v++) /* the next group's */
                    gemm_prefetch(x + (int64_t)v * cols + k0, kc * 4);
                gemm_pack_x(x + (int64_t)b * cols + k0, cols, V, kc, xp);
                for (int r = 0; r < nr; r += GEMM_R)
                    gemm_group(tile + r * GEMM_KC, nr - r < GEMM_R ? nr - r : GEMM_R, xp, V,
                               steps, acc + r * K3_MAX_BATCH + b);
            }
        }
        for (int r = 0; r < nr; r++)
            for (int b = 0; b < n; b++) y[(int64_t)b * rows + rg + r] = hsum(acc[r * K3_MAX_BATCH + b]);
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
