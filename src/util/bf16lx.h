/* bf16lx.h — the lossless BF16 matrix encoding (issue 33), below both its users: src/format
 * (k3 pack lays the file out with it) and src/kernels (which decode it; the layout and why it
 * is ordered so are in kernels.h, "lossless BF16"). Pure functions on bytes. */
#ifndef K3_BF16LX_H
#define K3_BF16LX_H

#include <stdint.h>

#define K3_LX_GROUP 32
#define K3_LX_GROUP_BYTES 48
#define K3_LX_ESCAPE 15
#define K3_LX_MAX_COLS (1 << 24) /* the column must fit an escape's 24 bits */

static inline int k3_lx_pos(int k) { return 16 * ((k >> 2) & 1) + 4 * (k >> 3) + (k & 3); }
static inline uint64_t k3_lx_row_bytes(int64_t cols) {
    return (uint64_t)((cols + K3_LX_GROUP - 1) / K3_LX_GROUP) * K3_LX_GROUP_BYTES;
}

/* The table for a matrix whose high bytes have histogram hist[256]: the 15 most frequent
 * (ties to the smaller byte; xtab[15] = 0) into xtab, and code_of[b] = b's code (15 when b is
 * not in the table). Deterministic. */
void k3_lx_table(const uint64_t hist[256], uint8_t xtab[16], uint8_t code_of[256]);
/* Encodes one BF16 row of cols values into k3_lx_row_bytes(cols) bytes at out (padding
 * zeroed) and its escapes into esc (if non-NULL; room for cols entries). Returns the number
 * of escapes. cols <= K3_LX_MAX_COLS. */
int64_t k3_lx_encode_row(const uint16_t *w, int64_t cols, const uint8_t code_of[256],
                         uint8_t *out, uint32_t *esc);
#endif
