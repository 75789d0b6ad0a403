/* tessera_avx512.h -- AVX-512 building blocks for elementwise kernels (added with the
 * activation family, ops/_elementwise/activations.c; usable by any op).
 *
 * At memory speed an exp + divide per element, not DRAM, bounds an activation kernel on
 * two cores, so these helpers keep everything in registers and avoid divides:
 *
 * - tsr_v_exp_nonpos: e^x for x <= 0, polynomial + vscalefps (exact 2^k, underflows to 0);
 * - tsr_v_rcp: 1/d as rcp14 + one Newton step (~1 ulp);
 * - tsr_v_sigmoid: sigmoid(z) and 1 - sigmoid(z), each without cancellation;
 * - tsr_v2_load / tsr_v2_store: 32 elements of fp32 / fp16 / bf16 as two fp32 vectors,
 *   masked tails, round-to-nearest-even narrowing (bit-identical to tsr_f2bf/tsr_f2h for
 *   normal results), optional non-temporal stores.
 *
 * Everything here exists only when the compiler targets AVX-512 F/BW/VL/DQ (TSR_AVX512 is
 * then defined); kernels keep a portable path for the other ISA levels.
 */
#ifndef TESSERA_AVX512_H
#define TESSERA_AVX512_H

#include "tessera_cpu.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define TSR_AVX512 1

static inline __m512 tsr_v1(float v) { return _mm512_set1_ps(v); }

/* e^x for x in [-20000, 0] or NaN (NaN stays NaN).  k = round(x / ln2) by the 1.5 * 2^23
 * shifter; r = x - k ln2 in one FMA (the product is exact inside it; fp32 ln2 is off by
 * 1.9e-9, so r is off by at most |k| * 1.9e-9: < 6e-8 while |x| <= 20, and for larger |x|
 * e^x is below 2e-9 anyway); e^r = 1 + r q(r) with q of degree 4 fitted to minimise the
 * relative error on |r| <= ln2/2 (1.5e-7 evaluated in fp32); vscalefps multiplies by 2^k
 * exactly and underflows to 0 -- no clamps, no exponent-field integer tricks. */
static inline __m512 tsr_v_exp_nonpos(__m512 x) {
    const __m512 shifter = tsr_v1(0x1.8p23f);
    const __m512 k = _mm512_sub_ps(_mm512_fmadd_ps(x, tsr_v1(1.44269504088896341f), shifter), shifter);
    const __m512 r = _mm512_fnmadd_ps(k, tsr_v1(0.693147180559945309f), x);
    __m512 q = tsr_v1(0x1.0fa81ap-7f);
    q = _mm512_fmadd_ps(q, r, tsr_v1(0x1.573a74p-5f));
    q = _mm512_fmadd_ps(q, r, tsr_v1(0x1.555a6cp-3f));
    q = _mm512_fmadd_ps(q, r, tsr_v1(0x1.fffdc4p-2f));
    q = _mm512_fmadd_ps(q, r, tsr_v1(0x1.fffff6p-1f));
    return _mm512_scalef_ps(_mm512_fmadd_ps(q, r, tsr_v1(1.0f)), k);
}

/* 1/d for d in [1, 2^100]: 14-bit estimate + one Newton step (~1 ulp). */
static inline __m512 tsr_v_rcp(__m512 d) {
    const __m512 r = _mm512_rcp14_ps(d);
    return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, tsr_v1(1.0f)), r);
}

/* sigmoid(z) and *s1m = 1 - sigmoid(z), for |z| <= 20000 or NaN: e = exp(-|z|) <= 1 never
 * overflows, r = 1/(1+e) is the sigmoid of |z| and e*r that of -|z|; z's sign picks. */
static inline __m512 tsr_v_sigmoid(__m512 z, __m512 *s1m) {
    const __m512 e = tsr_v_exp_nonpos(_mm512_or_ps(z, tsr_v1(-0.0f)));
    const __m512 r = tsr_v_rcp(_mm512_add_ps(tsr_v1(1.0f), e));
    const __mmask16 neg = _mm512_movepi32_mask(_mm512_castps_si512(z)); /* sign bit */
    *s1m = _mm512_mask_mul_ps(r, (__mmask16)~neg, e, r);
    return _mm512_mask_mul_ps(r, neg, e, r);
}

/* ------------------------------------------------------------------ 32-element load / store */
/* bf16 narrowed by the AVX512-BF16 instruction (tsr_v2_store with this dtype code). */
#define TSR_BF16_HW 3

/* TSR_BF16_HW when the CPU converts fp32 -> bf16 in hardware (vcvtne2ps2bf16: 32 floats per
 * instruction, round to nearest even; it treats fp32 values below FLT_MIN = 1.2e-38 as zero,
 * so such tiny results become +-0 instead of bf16 subnormals; every other value converts
 * bit-identically to the software rounding).  Define TSR_NO_HW_BF16 to test the software path. */
static inline int tsr_v_dtype(int dtype) {
#ifndef TSR_NO_HW_BF16
    if (dtype == TSR_BF16 && __builtin_cpu_supports("avx512bf16")) return TSR_BF16_HW;
#endif
    return dtype;
}

typedef struct { __m512 a, b; } tsr_v2f;

/* Valid-element mask of a 32-element step with len elements left. */
static inline __mmask32 tsr_v_mask32(int64_t len) {
    return len >= 32 ? 0xffffffffu : (__mmask32)((1u << len) - 1u);
}

/* 32 elements as two fp32 vectors; m = valid elements (memory order), full = all 32.  bf16 is
 * widened by interleaving with zero words (vpunpck{l,h}wd, within 128-bit lanes): the two
 * vectors then hold the elements in a permuted order, which tsr_v2_store undoes and which
 * elementwise math does not care about. */
static inline __attribute__((always_inline)) tsr_v2f tsr_v2_load(const char *p, int dt, __mmask32 m, int full) {
    tsr_v2f v;
    if (dt == TSR_F32) {
        v.a = full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps((__mmask16)m, p);
        v.b = full ? _mm512_loadu_ps(p + 64) : _mm512_maskz_loadu_ps((__mmask16)(m >> 16), p + 64);
        return v;
    }
    const __m512i h = full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(m, p);
    if (dt == TSR_F16) {
        v.a = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 0));
        v.b = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    } else {
        v.a = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), h));
        v.b = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), h));
    }
    return v;
}

/* fp32 -> bf16 (round to nearest even) in the HIGH half of each lane: u + 0x7fff + lsb, the lsb
 * (bit 16) added as a masked +1.  NaN needs no special case as long as every NaN reaching it
 * has a zero low half (widened bf16 NaNs, and the default NaN of invalid operations): the
 * rounding add then cannot carry out of the mantissa.  Kernels on bf16 data only. */
static inline __m512i tsr_v_bf16_rne_hi(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __mmask16 odd = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x10000));
    const __m512i t = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
    return _mm512_mask_add_epi32(t, odd, t, _mm512_set1_epi32(1));
}

/* Word indices that put the results of an unpacked (a, b) pair back in memory order: the high
 * halves of (a, b) for the software rounding (indices >= 32 select from b), and the words of
 * the hardware conversion, which puts a's 16 results below b's. */
static const int16_t tsr_bf16_gather[2][32] __attribute__((aligned(64))) = {
    {1, 3, 5, 7, 33, 35, 37, 39, 9, 11, 13, 15, 41, 43, 45, 47,
     17, 19, 21, 23, 49, 51, 53, 55, 25, 27, 29, 31, 57, 59, 61, 63},
    {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23,
     8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31}};

/* Store 32 results (dt: TSR_F32, TSR_F16, TSR_BF16 or TSR_BF16_HW); full, 64-byte aligned
 * stores are non-temporal when stream != 0 (the caller issues tsr_sfence() at the end). */
static inline __attribute__((always_inline)) void tsr_v2_store(char *p, tsr_v2f v, int dt, __mmask32 m, int full,
                                                               int stream) {
    stream = stream && full && !((uintptr_t)p & 63);
    if (dt == TSR_F32) {
        if (stream) {
            _mm512_stream_ps((float *)p, v.a);
            _mm512_stream_ps((float *)(p + 64), v.b);
        } else if (full) {
            _mm512_storeu_ps(p, v.a);
            _mm512_storeu_ps(p + 64, v.b);
        } else {
            _mm512_mask_storeu_ps(p, (__mmask16)m, v.a);
            _mm512_mask_storeu_ps(p + 64, (__mmask16)(m >> 16), v.b);
        }
        return;
    }
    __m512i h;
    if (dt == TSR_F16) {
        const int rc = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        h = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(v.a, rc)), _mm512_cvtps_ph(v.b, rc), 1);
    } else if (dt == TSR_BF16_HW) { /* assembler mnemonic: no -mavx512bf16 needed to build */
        __asm__("vcvtne2ps2bf16 %2, %1, %0" : "=v"(h) : "v"(v.b), "v"(v.a));
        h = _mm512_permutexvar_epi16(_mm512_load_si512(tsr_bf16_gather[1]), h);
    } else {
        h = _mm512_permutex2var_epi16(tsr_v_bf16_rne_hi(v.a), _mm512_load_si512(tsr_bf16_gather[0]),
                                      tsr_v_bf16_rne_hi(v.b));
    }
    if (stream) _mm512_stream_si512((void *)p, h);
    else if (full) _mm512_storeu_si512(p, h);
    else _mm512_mask_storeu_epi16(p, m, h);
}

/* One conv pixel's im2col row of at most 64 bytes (one group, dense pixels: a pixel's C channels
 * adjacent, the taps along a row undilated) built in v, whose bytes start as the padding: tap row
 * ky's in-image taps [k0, k1) (tsr_taps_inside) land at byte (ky kw + k0) pb, merge-loaded from that
 * many bytes before their first pixel -- bytes outside the mask are not accessed, so nothing is read
 * outside x.  xn: the image's first byte; rb / pb: an input row's / a pixel's bytes; iy0 / ix0: the
 * first tap's input row / column.  Shared by the gathered matrix (_requant/requant.c tsr_im2col)
 * and the int8 GEMM's own rows (_qlinear_int8/qi8_im2col.h ic_row64). */
static inline __m512i tsr_v_row_taps(__m512i v, const char *xn, int64_t rb, int64_t pb, int64_t H, int64_t kh,
                                     int64_t dl_h, int64_t iy0, int64_t kw, int64_t ix0, int64_t k0, int64_t k1) {
    for (int64_t ky = 0; ky < kh && k1 > k0; ky++) {
        const int64_t iy = iy0 + ky * dl_h;
        if (iy < 0 || iy >= H) continue;
        const int64_t at = (ky * kw + k0) * pb, nb = (k1 - k0) * pb;
        const __mmask64 k = (nb == 64 ? ~(__mmask64)0 : (((__mmask64)1 << nb) - 1)) << at;
        v = _mm512_mask_loadu_epi8(v, k, xn + iy * rb + (ix0 + k0) * pb - at);
    }
    return v;
}

#endif /* AVX-512 F/BW/VL/DQ */
#endif /* TESSERA_AVX512_H */
