/* simd_mxgemm.h — the driver of the x86 batched MXFP4 product (n >= MXG_MIN vectors): the
 * tiling of simd_gemm.h's gemm_dense around each file's MXFP4 micro-kernel, written once and
 * included by cpu_avx2.c and cpu_avx512.c at their end (after simd_dense.h), inside their
 * target pragma. Also the x86 table entries mxfp4 (which loop for which batch) and mix.
 * Internal to src/kernels.
 *
 * The includer defines, before including: simd_dense.h's lane macros (VF, VZERO, VADD) and
 * hsum, simd_gemm.h's GEMM_KC and gemm_dense's mix functions (mix_fma, mix_gemm_dense), and
 * for MXFP4:
 *  - MXG_R, MXG_V: the micro-kernel's rows × vectors (MXG_V 3 or 4); MXG_RB: rows per tile
 *    (a multiple of MXG_R); MXG_NB = GEMM_KC / 32, blocks per tile row;
 *  - MXG_TILE_ONE: the tile's value for E2M1 1.0 (the tiles may hold 2·E2M1 with halved
 *    scales), only for the mix's made-up tile;
 *  - mxg_tile_row(packed, scale, cols, r, k0, nb, tile, sf): row r's nb blocks from column k0
 *    decoded into the tile row and its per-block scale factors (at least W floats of room
 *    past the row's nb), nonzero when some scale is E8M0 253..255 (overflow or NaN);
 *  - mxg_pack_x(x, ldx, V, kc, xp): V vectors' kc columns packed in the micro-kernel's order;
 *  - mxg_micro(t, sf, R, xp, V, nb, big, acc): acc[i·K3_MAX_BATCH + v] += tile rows i < R ·
 *    vectors v < V over nb blocks, R, V and big constants at each call, big = 0 promising no
 *    block of these rows has an overflowing or NaN scale;
 *  - mxfp4_rows: the product for the batches below MXG_MIN (matrix-vector included).
 *
 * Exactness: this file only chooses which (row, vector) sums run when; each sum's operations
 * are the micro-kernel's, the same as mxfp4_rows' (each file's comment), and hsum adds the
 * lanes at the end, so row b of any batch has the bits of the matrix-vector product. */

#define MXG_MIN 8 /* batches from this size take the tiled loop (below: mxfp4_rows) */

#define MXG_CALL(R_, big_)                                                           \
    switch (V) {                                                                     \
    case 1: mxg_micro(t, sf, R_, xp, 1, nb, big_, acc); break;                       \
    case 2: mxg_micro(t, sf, R_, xp, 2, nb, big_, acc); break;                       \
    case MXG_V: mxg_micro(t, sf, R_, xp, MXG_V, nb, big_, acc); break;               \
    default: mxg_micro(t, sf, R_, xp, 3, nb, big_, acc); break; /* MXG_V = 4 only */ \
    }
/* R rows (MXG_R, or fewer at a range's end: then one at a time), V vectors; big: some block of
 * these rows has an overflowing or NaN scale (then row by row through the checking loop). */
static void mxg_group(const float *t, const float *sf, int R, const float *xp, int V, int64_t nb,
                      int big, VF *acc) {
    if (R == MXG_R && !big) {
        MXG_CALL(MXG_R, 0)
        return;
    }
    for (int i = 0; i < R; i++, t += GEMM_KC, sf += MXG_NB, acc += K3_MAX_BATCH) {
        if (big) MXG_CALL(1, 1)
        else MXG_CALL(1, 0)
    }
}
#undef MXG_CALL

/* Rows [r0, r1) of an MXFP4 matrix times n <= K3_MAX_BATCH vectors, n >= MXG_MIN: per tile of
 * MXG_RB rows × GEMM_KC columns, every row decoded once, then each group of MXG_V vectors
 * packed and run against the tile MXG_R rows at a time; the accumulators wait on the stack. */
static void mxfp4_gemm(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols,
                       const float *x, int n, float *y, int64_t r0, int64_t r1) {
    _Alignas(64) float tile[MXG_RB * GEMM_KC], xp[MXG_V * GEMM_KC];
    _Alignas(64) float sf[MXG_RB * MXG_NB + W]; /* a decoder may store whole vectors of W */
    VF acc[MXG_RB * K3_MAX_BATCH];
    for (int64_t rg = r0; rg < r1; rg += MXG_RB) {
        int nr = r1 - rg < MXG_RB ? (int)(r1 - rg) : MXG_RB;
        for (int i = 0; i < nr; i++) /* only the n vectors' accumulators */
            for (int b = 0; b < n; b++) acc[i * K3_MAX_BATCH + b] = VZERO();
        for (int64_t k0 = 0; k0 < cols; k0 += GEMM_KC) {
            int64_t kc = cols - k0 < GEMM_KC ? cols - k0 : GEMM_KC, nb = kc / 32;
            int big[MXG_RB / MXG_R] = {0};
            for (int i = 0; i < nr; i++)
                big[i / MXG_R] |= mxg_tile_row(packed, scale, cols, rg + i, k0, nb,
                                               tile + i * GEMM_KC, sf + i * MXG_NB);
            for (int b = 0; b < n; b += MXG_V) {
                int V = n - b < MXG_V ? n - b : MXG_V;
                mxg_pack_x(x + (int64_t)b * cols + k0, cols, V, kc, xp);
                for (int i = 0; i < nr; i += MXG_R)
                    mxg_group(tile + i * GEMM_KC, sf + i * MXG_NB, nr - i < MXG_R ? nr - i : MXG_R,
                              xp, V, nb, big[i / MXG_R], acc + i * K3_MAX_BATCH + b);
            }
        }
        for (int i = 0; i < nr; i++)
            for (int b = 0; b < n; b++)
                y[(int64_t)b * rows + rg + i] = hsum(acc[i * K3_MAX_BATCH + b]);
    }
}

/* Every batch size: the tiled GEMM from MXG_MIN vectors, mxfp4_rows below. */
static void mxfp4(const uint8_t *packed, const uint8_t *scale, int64_t rows, int64_t cols,
                  const float *x, int n, float *y, int64_t r0, int64_t r1) {
    if (n >= MXG_MIN) mxfp4_gemm(packed, scale, rows, cols, x, n, y, r0, r1);
    else mxfp4_rows(packed, scale, rows, cols, x, n, y, r0, r1);
}

/* mxg_micro on one L1-resident tile: the MXFP4 GEMM's instruction mix (counting the product's
 * multiply-adds, not the scale FMAs). The tile holds E2M1 values -1.5 .. 1.5 with scale 1. */
static int64_t mix_gemm_mxfp4(int64_t reps) {
    _Alignas(64) float t[MXG_R * GEMM_KC], xp[MXG_V * GEMM_KC], sf[MXG_R * MXG_NB];
    VF acc[MXG_R * K3_MAX_BATCH];
    for (int k = 0; k < MXG_R * GEMM_KC; k++) t[k] = (float)(k % 7 - 3) * (MXG_TILE_ONE * 0.5f);
    for (int k = 0; k < MXG_V * GEMM_KC; k++) xp[k] = 1e-3f * (float)(k % 5);
    for (int k = 0; k < MXG_R * MXG_NB; k++) sf[k] = 1.0f / MXG_TILE_ONE;
    for (int k = 0; k < MXG_R * K3_MAX_BATCH; k++) acc[k] = VZERO();
    for (int64_t i = 0; i < reps; i++) mxg_micro(t, sf, MXG_R, xp, MXG_V, MXG_NB, 0, acc);
    VF sum = VZERO();
    for (int r = 0; r < MXG_R; r++)
        for (int v = 0; v < MXG_V; v++) sum = VADD(sum, acc[r * K3_MAX_BATCH + v]);
    volatile float sink = hsum(sum); /* keeps every FMA live */
    (void)sink;
    return reps * MXG_R * MXG_V * GEMM_KC;
}

static int64_t mix(int which, int64_t reps) {
    switch (which) {
    case K3_MIX_FMA: return mix_fma(reps);
    case K3_MIX_GEMM_BF16: return mix_gemm_dense(reps);
    case K3_MIX_GEMM_MXFP4: return mix_gemm_mxfp4(reps);
    default: return 0;
    }
}
