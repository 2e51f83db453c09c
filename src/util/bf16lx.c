/* bf16lx.c — the lossless BF16 table rule and row encoder (bf16lx.h). */
#include "bf16lx.h"

#include <string.h>

void k3_lx_table(const uint64_t hist[256], uint8_t xtab[16], uint8_t code_of[256]) {
    int taken[256] = {0};
    memset(xtab, 0, 16);
    memset(code_of, K3_LX_ESCAPE, 256);
    for (int c = 0; c < K3_LX_ESCAPE; c++) {
        int best = -1;
        for (int b = 0; b < 256; b++) /* strictly greater: ties go to the smaller byte */
            if (!taken[b] && hist[b] && (best < 0 || hist[b] > hist[best])) best = b;
        if (best < 0) break;
        taken[best] = 1;
        xtab[c] = (uint8_t)best;
        code_of[best] = (uint8_t)c;
    }
}

int64_t k3_lx_encode_row(const uint16_t *w, int64_t cols, const uint8_t code_of[256],
                         uint8_t *out, uint32_t *esc) {
    int64_t n_esc = 0;
    memset(out, 0, k3_lx_row_bytes(cols));
    for (int64_t i = 0; i < cols; i++) {
        uint8_t *g = out + (i / K3_LX_GROUP) * K3_LX_GROUP_BYTES;
        int p = k3_lx_pos((int)(i % K3_LX_GROUP));
        uint8_t hi = (uint8_t)(w[i] >> 8), code = code_of[hi];
        g[p & 15] |= (uint8_t)(code << (4 * (p >> 4)));
        g[16 + p] = (uint8_t)w[i];
        if (code == K3_LX_ESCAPE) {
            if (esc) esc[n_esc] = (uint32_t)i << 8 | hi;
            n_esc++;
        }
    }
    return n_esc;
}

