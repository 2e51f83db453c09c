/* lossless.c — the lossless BF16 spine (issue 33): the table, the row encoder, the reference
 * decoder and the scalar path's product. Layout and invariants: kernels.h ("lossless BF16");
 * the file format around it: docs/PACKED-SPINE.md. */
#include <string.h>

#include "../util/dtype.h"
#include "dispatch.h"

void k3_lx_row_escapes(const k3_mat *m, int64_t r, uint32_t *e, uint32_t *end) {
    uint32_t a = m->esc[r], b = m->esc[r + 1];
    if (b > m->n_esc) b = m->n_esc;
    *e = a < b ? a : b;
    *end = b;
}

void k3_lx_group_u16(const uint8_t *g, const uint8_t *xtab, const uint32_t *list, uint32_t *e,
                     uint32_t end, int64_t c0, int64_t cols, uint16_t t[K3_LX_GROUP]) {
    int n = cols - c0 < K3_LX_GROUP ? (int)(cols - c0) : K3_LX_GROUP;
    for (int k = 0; k < K3_LX_GROUP; k++) {
        int p = k3_lx_pos(k);
        uint8_t code = (g[p & 15] >> (4 * (p >> 4))) & 15;
        t[k] = k < n ? (uint16_t)(xtab[code] << 8 | g[16 + p]) : 0;
    }
    for (; *e < end && (int64_t)(list[*e] >> 8) < c0 + K3_LX_GROUP; ++*e) {
        int k = (int)((int64_t)(list[*e] >> 8) - c0) & (K3_LX_GROUP - 1); /* corrupt: stays inside */
        if (k < n) t[k] = (uint16_t)((list[*e] & 0xff) << 8 | (t[k] & 0xff));
    }
}

void k3_lx_decode_row(const k3_mat *m, int64_t r, uint16_t *out) {
    const uint8_t *row = (const uint8_t *)m->data + (uint64_t)r * k3_lx_row_bytes(m->cols);
    const uint32_t *list = m->esc + m->rows + 1;
    uint32_t e, end;
    k3_lx_row_escapes(m, r, &e, &end);
    for (int64_t c0 = 0; c0 < m->cols; c0 += K3_LX_GROUP) {
        uint16_t t[K3_LX_GROUP];
        k3_lx_group_u16(row + c0 / K3_LX_GROUP * K3_LX_GROUP_BYTES, m->xtab, list, &e, end, c0,
                        m->cols, t);
        int64_t n = m->cols - c0 < K3_LX_GROUP ? m->cols - c0 : K3_LX_GROUP;
        memcpy(out + c0, t, (size_t)n * sizeof *t);
    }
}

/* One row as cpu_scalar.c's rows_bf16: ascending i, one f32 accumulator, multiply then add. */
static float row_dot(const k3_mat *w, int64_t r, const float *x) {
    const uint8_t *row = (const uint8_t *)w->data + (uint64_t)r * k3_lx_row_bytes(w->cols);
    const uint32_t *list = w->esc + w->rows + 1;
    uint32_t e, end;
    k3_lx_row_escapes(w, r, &e, &end);
    float s = 0;
    for (int64_t c0 = 0; c0 < w->cols; c0 += K3_LX_GROUP) {
        uint16_t t[K3_LX_GROUP];
        k3_lx_group_u16(row + c0 / K3_LX_GROUP * K3_LX_GROUP_BYTES, w->xtab, list, &e, end, c0,
                        w->cols, t);
        int64_t n = w->cols - c0 < K3_LX_GROUP ? w->cols - c0 : K3_LX_GROUP;
        for (int64_t k = 0; k < n; k++) s += k3_bf16_to_f32(t[k]) * x[c0 + k];
    }
    return s;
}

void k3_rows_bf16lx(const k3_mat *w, const float *x, int n, float *y, int64_t r0, int64_t r1) {
    for (int b = 0; b < n; b++)
        for (int64_t r = r0; r < r1; r++)
            y[(int64_t)b * w->rows + r] = row_dot(w, r, x + (int64_t)b * w->cols);
}
