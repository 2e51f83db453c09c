/* simd_xw.h — k3_matmul_xw_rows (kernels.h), y[b][c] = Σ_i x[b][i]·w[i][c], written once over
 * simd_vec.h's lane macros and included by it (x86 and NEON). Internal to src/kernels.
 *
 * Order: each output has one accumulator, zero at the start, and step i = 0, 1, .. k-1 does
 * acc = fma(x[b][i], w[i][c], acc) (the scalar path multiplies, then adds). The lanes run
 * along the output columns c, not along i, so a vector of W outputs is W independent chains
 * of that sequence: the bits do not depend on the vector width, the column range or the rows
 * beside; the columns past the last full vector take the same steps on zero-padded weights.
 *
 * Blocking (BLIS's micro-kernel in its usual layout): XW_R rows of x × XW_C vectors of
 * columns stay in registers for the whole k loop; each step loads XW_C vectors of w's row i
 * (contiguous) and broadcasts XW_R values of x, for XW_R·XW_C FMAs. AVX2 (16 ymm): 4 × 3 = 12
 * accumulators + 3 weights + 1 broadcast; AVX-512F and NEON (32 registers): 6 × 4 = 24 + 4 + 1.
 * w's rows are read once per XW_R rows of x; an MLA tile's panel of XW_C·W columns × 512
 * positions (AVX-512F: 128 KB) stays in L2 between them. */
#if W == 8
#define XW_R 4
#define XW_C 3
#else
#define XW_R 6
#define XW_C 4
#endif

/* Rows b < R of x (R, C constants at each call: the loops unroll) times columns c .. c + C·W
 * of w over k steps, into y. */
static inline __attribute__((always_inline)) void xw_micro(const float *w, int64_t ldw,
                                                           int64_t k, const float *x,
                                                           int64_t ldx, int R, int C,
                                                           float *y, int64_t ldy) {
    VF a[XW_R][XW_C];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8") for (int u = 0; u < C; u++) a[r][u] = VZERO();
    for (int64_t i = 0; i < k; i++) {
        VF wv[XW_C];
        _Pragma("GCC unroll 8") for (int u = 0; u < C; u++) wv[u] = VLOADU(w + i * ldw + u * W);
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            VF xb = VSET1(x[r * ldx + i]);
            _Pragma("GCC unroll 8") for (int u = 0; u < C; u++) a[r][u] = VFMA(xb, wv[u], a[r][u]);
        }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8") for (int u = 0; u < C; u++) VSTOREU(y + r * ldy + u * W, a[r][u]);
}

/* One row of x times the nc < W columns of w from its first, zero-padded (never reading past
 * them), into y[0..nc). */
static void xw_tail(const float *w, int64_t ldw, int64_t k, const float *x, int64_t nc,
                    float *y) {
    VF a = VZERO();
    float t[W];
    for (int64_t i = 0; i < k; i++) a = VFMA(VSET1(x[i]), load_tail(w + i * ldw, nc), a);
    VSTOREU(t, a);
    memcpy(y, t, (size_t)nc * sizeof(float));
}

/* xw_micro for R = 1..XW_R rows and C = XW_C or 1 vectors, as constants. */
static void xw_group(const float *w, int64_t ldw, int64_t k, const float *x, int64_t ldx, int R,
                     int full, float *y, int64_t ldy) {
#define XW_CASE(R_)                                                                           \
    case R_:                                                                                  \
        if (full) xw_micro(w, ldw, k, x, ldx, R_ <= XW_R ? R_ : 1, XW_C, y, ldy);             \
        else xw_micro(w, ldw, k, x, ldx, R_ <= XW_R ? R_ : 1, 1, y, ldy);                     \
        break;
    switch (R) {
        XW_CASE(1) XW_CASE(2) XW_CASE(3) XW_CASE(4) XW_CASE(5) XW_CASE(6)
    }
#undef XW_CASE
}

static void xw(const float *w, int64_t ldw, int64_t k, const float *x, int64_t ldx, int n,
               float *y, int64_t ldy, int64_t c0, int64_t c1) {
    int64_t c = c0;
    for (; c + XW_C * W <= c1; c += XW_C * W) /* XW_C vectors at a time */
        for (int b = 0; b < n; b += XW_R)
            xw_group(w + c, ldw, k, x + b * ldx, ldx, n - b < XW_R ? n - b : XW_R, 1,
                     y + b * ldy + c, ldy);
    for (; c + W <= c1; c += W) /* then one vector at a time */
        for (int b = 0; b < n; b += XW_R)
            xw_group(w + c, ldw, k, x + b * ldx, ldx, n - b < XW_R ? n - b : XW_R, 0,
                     y + b * ldy + c, ldy);
    if (c < c1) /* the last columns, zero-padded */
        for (int b = 0; b < n; b++) xw_tail(w + c, ldw, k, x + b * ldx, c1 - c, y + b * ldy + c);
}
#undef XW_R
#undef XW_C
