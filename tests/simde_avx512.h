/* simde_avx512.h — AVX-512F for src/kernels/cpu_avx512.c on a CPU without it (make
 * test-avx512-emu): SIMDe's portable implementations under the native names, plus the few
 * intrinsics SIMDe 0.7.4 (Debian 12) lacks, written out lane by lane. Test build only: the
 * real binary compiles cpu_avx512.c for the CPU's own AVX-512F. */
#ifndef K3_SIMDE_AVX512_H
#define K3_SIMDE_AVX512_H

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <stdint.h>
#include <string.h>

typedef simde__mmask16 __mmask16;

static inline simde__m512i _mm512_cvtepu8_epi32(simde__m128i a) {
    uint8_t b[16];
    int32_t d[16];
    memcpy(b, &a, sizeof b);
    for (int i = 0; i < 16; i++) d[i] = b[i];
    simde__m512i r;
    memcpy(&r, d, sizeof r);
    return r;
}

static inline simde__m512i _mm512_cvtepu16_epi32(simde__m256i a) {
    uint16_t b[16];
    int32_t d[16];
    memcpy(b, &a, sizeof b);
    for (int i = 0; i < 16; i++) d[i] = b[i];
    simde__m512i r;
    memcpy(&r, d, sizeof r);
    return r;
}

/* Lanes whose mask bit is clear read nothing (as the instruction: no fault past the end). */
static inline simde__m512 _mm512_maskz_loadu_ps(__mmask16 k, const float *p) {
    float d[16];
    for (int i = 0; i < 16; i++) d[i] = (k >> i) & 1 ? p[i] : 0.0f;
    simde__m512 r;
    memcpy(&r, d, sizeof r);
    return r;
}

#endif
