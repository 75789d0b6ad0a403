/* requant.c -- the integer-only pipeline's native CPU kernels (framework-free C11).
 *
 *   tsr_requant:  out[m, c] = clamp(MBQM(acc[m, c] + off[c], mult[c], shift[c]) + zp, qmin, qmax)
 *   (off[n] = bias[n] - x_zp * sum_k w[n, k], int64, is the zero-point correction that lets the int8
 *    GEMM run on the raw int8 x: sum (x - zp) w = sum x w - zp sum w; cpu.py derives it from the
 *    weight's row sums, computed once per weight tensor)
 *   tsr_transpose_i8: the NCHW <-> channels-last copies of int8 activations
 *   tsr_im2col:   int8/int16 NCHW or NHWC input -> rows [N*Ho*Wo, groups * (C/g)*kh*kw] in
 *                  (group, channel, ky, kx) order, padding taps = x_zp (so the correction above
 *                  makes them contribute exactly 0, TFLite's rule)
 *
 * MBQM (MultiplyByQuantizedMultiplier) is written out in ops/requantize/__init__.py; here it is
 * branch-free (selects, shifts) so the per-row loops vectorise.  The int32-accumulator modes work
 * in int32 lanes with one widening 32x32->64 product (|a * m| <= 2^62); the int64 mode in int64
 * (|x * rm| <= 2^62, x clamped to 2^47): nothing overflows for the enforced shift ranges.  With
 * AVX-512 (TSR_AVX512) the rows run through explicit intrinsics (rq_row_v: vpmuldq on even / odd
 * lanes, vpsravd / vpsravq, masked tails), bit-identical to the portable C (rq_row).
 */
#include "tessera_avx512.h"

#define INL static inline __attribute__((always_inline))

enum { RQ_DOUBLE = 0, RQ_SINGLE = 1 };

INL int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }
INL int32_t clamp32(int32_t v, int32_t lo, int32_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* gemmlowp SaturatingRoundingDoublingHighMul (ties up: the negative nudge is 1 - 2^30) then
 * RoundingDivideByPOT (ties away from zero), in int32 lanes plus one widening 32x32->64 product
 * (gcc vectorises this form for AVX2 / NEON; its int64 form ran at 3-10 ns an element):
 *   a = saturate_int32(acc * 2^left): acc clamped to [INT32_MIN >> left, INT32_MAX >> left], then shifted;
 *   h = trunc((a*m + nudge) / 2^31), nudge = 2^30 (a*m >= 0) or 1 - 2^30 (a*m < 0), equals
 *       floor((a*m + 2^30) / 2^31) in both cases (a negative a*m + 1 - 2^30 is negative and its
 *       trunc is floor after adding 2^31 - 1, and 1 - 2^30 + 2^31 - 1 = 2^30): a*m / 2^31 rounded
 *       to nearest, ties UP (2.5 -> 3, -2.5 -> -2).  |a*m| <= 2^62, so that floor is bits 31..62 of
 *       the sum (a logical shift then the low 32 bits, two's complement), in int32 range except for
 *       a == m == INT32_MIN (2^31, read as INT32_MIN; a*m > -2^62 keeps every other h above it),
 *       which saturates to INT32_MAX;
 *   RDBPOT: (h >> e) + ((h & mask) > (mask >> 1) + (h < 0)), mask = 2^e - 1 (e <= 31 fits), i.e.
 *       h / 2^e rounded half AWAY from zero (-1.5 -> -2, 1.5 -> 2; the + (h < 0) moves the
 *       threshold for negatives). */
INL int32_t mbqm_double(int32_t acc, int32_t m, int32_t s) {
    const int32_t left = s > 0 ? s : 0, e = s > 0 ? 0 : -s;
    const int32_t hi = INT32_MAX >> left, lo = INT32_MIN >> left;
    /* (INT32_MIN >> left) << left == INT32_MIN; (INT32_MAX >> left) << left needs its low bits set */
    const int32_t a = (int32_t)(((uint32_t)clamp32(acc, lo, hi) << left) |
                                ((((uint32_t)1 << left) - 1u) & (0u - (uint32_t)(acc > hi))));
    const uint64_t v = (uint64_t)((int64_t)a * m) + ((uint64_t)1 << 30);
    int32_t h = (int32_t)(uint32_t)(v >> 31);
    h = h == INT32_MIN ? INT32_MAX : h;
    const int32_t mask = (int32_t)(((uint32_t)1 << e) - 1u);
    const int32_t thr = (mask >> 1) + (int32_t)(h < 0);
    return (h >> e) + (int32_t)((h & mask) > thr);
}

/* CMSIS-NN single rounding: floor((acc * m + 2^(30 - s)) / 2^(31 - s)), round half up (toward
 * +inf: -2.5 -> -2); int32 acc and m (the widening product is what gcc vectorises): |acc * m| <=
 * 2^62, so the sum fits int64 */
INL int64_t mbqm_single(int32_t acc, int32_t m, int32_t s) {
    const int t = 31 - s;
    return ((int64_t)acc * m + ((int64_t)1 << (t - 1))) >> t;
}

/* TFLite int64 MultiplyByQuantizedMultiplier: Q15 reduced multiplier, round half up */
INL int64_t mbqm_int64(int64_t acc, int64_t m, int64_t s) {
    const int64_t x = clamp64(acc, -((int64_t)1 << 47), ((int64_t)1 << 47) - 1);
    const int64_t rm = m < 0x7FFF0000 ? (m + (1 << 15)) >> 16 : 0x7FFF;
    const int64_t t = 15 - s;
    return (x * rm + ((int64_t)1 << (t - 1))) >> t;
}

INL int64_t sat_add(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) r = a > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

/* one row; MODE: 0 double (int32 acc), 1 single (int32 acc), 2 int64 acc.
 * clamp(r + zp, qmin, qmax) == clamp(r, qmin - zp, qmax - zp) + zp: the bounds lie within +-2^16,
 * so the int32 modes clamp in int32 and never add zp to an out-of-range r. */
INL void rq_row(const char *acc, const int acc64, const int32_t *mult, const int32_t *shift, const int64_t cs,
                const int64_t *off, int64_t C, int64_t zp, int64_t qmin, int64_t qmax, char *out, const int out16,
                const int mode) {
    int64_t tmp[256];
    int32_t t32[256];
    const int32_t lo = (int32_t)(qmin - zp), hi = (int32_t)(qmax - zp), z = (int32_t)zp;
    for (int64_t c0 = 0; c0 < C; c0 += 256) {
        const int64_t n = C - c0 < 256 ? C - c0 : 256;
        const int32_t *mp = mult + c0 * cs, *sp = shift + c0 * cs;
        if (acc64) {
            const int64_t *a = (const int64_t *)acc + c0;
            for (int64_t j = 0; j < n; j++) tmp[j] = off ? sat_add(a[j], off[c0 + j]) : a[j];
#pragma omp simd
            for (int64_t j = 0; j < n; j++)
                t32[j] = (int32_t)clamp64(mbqm_int64(tmp[j], mp[j * cs], sp[j * cs]), lo, hi) + z;
        } else {
            const int32_t *a = (const int32_t *)acc + c0;
            /* int32 pipeline: accumulator + bias saturated to int32 before the multiplier */
            if (off)
                for (int64_t j = 0; j < n; j++) t32[j] = (int32_t)clamp64((int64_t)a[j] + off[c0 + j], INT32_MIN, INT32_MAX);
            else
                for (int64_t j = 0; j < n; j++) t32[j] = a[j];
            if (mode == 0) {
#pragma omp simd
                for (int64_t j = 0; j < n; j++) t32[j] = clamp32(mbqm_double(t32[j], mp[j * cs], sp[j * cs]), lo, hi) + z;
            } else {
#pragma omp simd
                for (int64_t j = 0; j < n; j++)
                    t32[j] = (int32_t)clamp64(mbqm_single(t32[j], mp[j * cs], sp[j * cs]), lo, hi) + z;
            }
        }
        if (out16) {
            int16_t *o = (int16_t *)out + c0;
            for (int64_t j = 0; j < n; j++) o[j] = (int16_t)t32[j];
        } else {
            int8_t *o = (int8_t *)out + c0;
            for (int64_t j = 0; j < n; j++) o[j] = (int8_t)t32[j];
        }
    }
}

#ifdef TSR_AVX512 /* ------------------------------------------------------------ AVX-512 path */
/* The same arithmetic, 16 channels a step, bit-identical to the scalar functions above.  The int32
 * modes keep 32-bit lanes and form the one 64-bit product a*m with vpmuldq (_mm512_mul_epi32) on
 * the even lanes and on the odd lanes shifted down (gcc 12's own vectorisation of the int64 C ran
 * at 3-10 ns an element; this runs at ~0.3-0.5 on a (12544, 96) call, one thread). */

/* 16 int32 accumulators (+ off, int64, the sum saturated to int32: vpmovsqd) */
INL __m512i rq_v_acc32(const int32_t *a, const int64_t *off, __mmask16 k) {
    const __m512i x = _mm512_maskz_loadu_epi32(k, a);
    if (!off) return x;
    const __m512i lo = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(x)),
                                        _mm512_maskz_loadu_epi64((__mmask8)k, off));
    const __m512i hi = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(x, 1)),
                                        _mm512_maskz_loadu_epi64((__mmask8)(k >> 8), off + 8));
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtsepi64_epi32(lo)), _mm512_cvtsepi64_epi32(hi), 1);
}

/* mbqm_double on 16 int32 lanes (acc already saturated to int32), the scalar mbqm_double's steps:
 *   a = saturate_int32(acc * 2^left): the shift overflowed iff shifting back changes the value,
 *       then a = INT32_MAX or INT32_MIN by the sign of acc;
 *   SRDHM h = floor((a*m + 2^30) / 2^31) (= gemmlowp's trunc with the nudge 2^30 or 1 - 2^30:
 *       ties UP, 2.5 -> 3, -2.5 -> -2), bits 31..62 of the 64-bit sum: the even lanes take them by
 *       a 31-bit right shift (low half of the qword), the odd lanes by a 1-bit left shift (high
 *       half); h == INT32_MIN only for a == m == INT32_MIN (2^31 wrapped) -> INT32_MAX;
 *   RDBPOT (h >> e) + ((h & mask) > (mask >> 1) + (h < 0)), mask = 2^e - 1: h / 2^e rounded half
 *       AWAY from zero (-1.5 -> -2, 1.5 -> 2). */
INL __m512i rq_v_double(__m512i a, __m512i m, __m512i s) {
    const __m512i zero = _mm512_setzero_si512(), one = _mm512_set1_epi32(1);
    const __m512i left = _mm512_max_epi32(s, zero), e = _mm512_max_epi32(_mm512_sub_epi32(zero, s), zero);
    const __m512i sl = _mm512_sllv_epi32(a, left);
    const __mmask16 ovf = _mm512_cmpneq_epi32_mask(_mm512_srav_epi32(sl, left), a);
    a = _mm512_mask_mov_epi32(sl, ovf, _mm512_xor_si512(_mm512_srai_epi32(a, 31), _mm512_set1_epi32(INT32_MAX)));
    const __m512i r30 = _mm512_set1_epi64((int64_t)1 << 30);
    const __m512i pe = _mm512_add_epi64(_mm512_mul_epi32(a, m), r30);
    const __m512i po = _mm512_add_epi64(_mm512_mul_epi32(_mm512_srli_epi64(a, 32), _mm512_srli_epi64(m, 32)), r30);
    __m512i h = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 31), _mm512_slli_epi64(po, 1));
    h = _mm512_mask_sub_epi32(h, _mm512_cmpeq_epi32_mask(h, _mm512_set1_epi32(INT32_MIN)), h, one);
    const __m512i mask = _mm512_sub_epi32(_mm512_sllv_epi32(one, e), one);
    const __m512i thr = _mm512_sub_epi32(_mm512_srli_epi32(mask, 1), _mm512_srai_epi32(h, 31));
    const __mmask16 up = _mm512_cmpgt_epi32_mask(_mm512_and_si512(h, mask), thr);
    const __m512i r = _mm512_srav_epi32(h, e);
    return _mm512_mask_add_epi32(r, up, r, one);
}

/* mbqm_single on 16 int32 lanes, clamped to [lo, hi] (the output range less the zero point, so the
 * 64-bit result fits int32): floor((a*m + 2^(t-1)) / 2^t), t = 31 - s in [1, 62], |a*m| <= 2^62 so
 * the sum fits int64; round half UP (toward +inf: -2.5 -> -2) as the scalar code. */
INL __m512i rq_v_single(__m512i a, __m512i m, __m512i s, __m512i lo, __m512i hi) {
    const __m512i t = _mm512_sub_epi32(_mm512_set1_epi32(31), s);
    const __m512i te = _mm512_and_si512(t, _mm512_set1_epi64(0xFFFFFFFF)), to = _mm512_srli_epi64(t, 32);
    const __m512i one = _mm512_set1_epi64(1);
    const __m512i re = _mm512_sllv_epi64(one, _mm512_sub_epi64(te, one));
    const __m512i ro = _mm512_sllv_epi64(one, _mm512_sub_epi64(to, one));
    __m512i ve = _mm512_srav_epi64(_mm512_add_epi64(_mm512_mul_epi32(a, m), re), te);
    __m512i vo = _mm512_srav_epi64(_mm512_add_epi64(_mm512_mul_epi32(_mm512_srli_epi64(a, 32),
                                                                     _mm512_srli_epi64(m, 32)), ro), to);
    ve = _mm512_max_epi64(_mm512_min_epi64(ve, hi), lo);
    vo = _mm512_max_epi64(_mm512_min_epi64(vo, hi), lo);
    return _mm512_mask_blend_epi32(0xAAAA, ve, _mm512_slli_epi64(vo, 32));
}

/* mbqm_int64 on 8 int64 lanes (x = sat_add(acc, off)), clamped to [lo, hi]: x clamped to
 * [-2^47, 2^47), |x * rm| <= 2^62, floor((x*rm + 2^(t-1)) / 2^t), t = 15 - s in [8, 46] */
INL __m256i rq_v_int64(const int64_t *a, const int64_t *off, __mmask8 k, __m256i m, __m256i s, __m512i lo,
                       __m512i hi) {
    __m512i x = _mm512_maskz_loadu_epi64(k, a);
    if (off) {
        const __m512i b = _mm512_maskz_loadu_epi64(k, off), r = _mm512_add_epi64(x, b);
        /* signed overflow iff x and b share a sign that r lacks; then INT64_MAX / INT64_MIN by x's sign */
        const __mmask8 ovf = _mm512_movepi64_mask(_mm512_and_si512(_mm512_xor_si512(x, r), _mm512_xor_si512(b, r)));
        x = _mm512_mask_mov_epi64(r, ovf, _mm512_xor_si512(_mm512_srai_epi64(x, 63), _mm512_set1_epi64(INT64_MAX)));
    }
    x = _mm512_max_epi64(_mm512_min_epi64(x, _mm512_set1_epi64(((int64_t)1 << 47) - 1)),
                         _mm512_set1_epi64(-((int64_t)1 << 47)));
    /* rm = (m + 2^15) >> 16 if m < 0x7FFF0000 else 0x7FFF (the sum may wrap only where unused) */
    const __m256i rm32 = _mm256_mask_mov_epi32(
        _mm256_srai_epi32(_mm256_add_epi32(m, _mm256_set1_epi32(1 << 15)), 16),
        _mm256_cmpge_epi32_mask(m, _mm256_set1_epi32(0x7FFF0000)), _mm256_set1_epi32(0x7FFF));
    const __m512i rm = _mm512_cvtepi32_epi64(rm32);
    const __m512i t = _mm512_cvtepi32_epi64(_mm256_sub_epi32(_mm256_set1_epi32(15), s));
    const __m512i one = _mm512_set1_epi64(1);
    const __m512i rnd = _mm512_sllv_epi64(one, _mm512_sub_epi64(t, one));
    __m512i v = _mm512_srav_epi64(_mm512_add_epi64(_mm512_mullo_epi64(x, rm), rnd), t);
    v = _mm512_max_epi64(_mm512_min_epi64(v, hi), lo);
    return _mm512_cvtepi64_epi32(v);
}

INL void rq_v_store(char *out, int out16, __m512i v, __mmask16 k) {
    if (out16) _mm512_mask_cvtepi32_storeu_epi16(out, k, v);
    else _mm512_mask_cvtepi32_storeu_epi8(out, k, v);
}

/* one row, 16 channels a step (masked tail) */
INL void rq_row_v(const char *acc, const int32_t *mult, const int32_t *shift, const int cs, const int64_t *off,
                  int64_t C, int64_t zp, int64_t qmin, int64_t qmax, char *out, const int out16, const int mode) {
    /* clamp(r + zp, qmin, qmax) == clamp(r, qmin - zp, qmax - zp) + zp, the bounds within +-2^16 */
    const __m512i lo32 = _mm512_set1_epi32((int32_t)(qmin - zp)), hi32 = _mm512_set1_epi32((int32_t)(qmax - zp));
    const __m512i lo64 = _mm512_set1_epi64(qmin - zp), hi64 = _mm512_set1_epi64(qmax - zp);
    const __m512i vzp = _mm512_set1_epi32((int32_t)zp);
    const __m512i m0 = _mm512_set1_epi32(mult[0]), s0 = _mm512_set1_epi32(shift[0]);
    const int oe = out16 ? 2 : 1;
    for (int64_t c = 0; c < C; c += 16) {
        const __mmask16 k = C - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (C - c)) - 1u);
        const __m512i m = cs ? _mm512_maskz_loadu_epi32(k, mult + c) : m0;
        const __m512i s = cs ? _mm512_maskz_loadu_epi32(k, shift + c) : s0;
        const int64_t *oc = off ? off + c : NULL;
        __m512i r;
        if (mode == 0) {
            r = rq_v_double(rq_v_acc32((const int32_t *)acc + c, oc, k), m, s);
            r = _mm512_max_epi32(_mm512_min_epi32(r, hi32), lo32);
        } else if (mode == 1) {
            r = rq_v_single(rq_v_acc32((const int32_t *)acc + c, oc, k), m, s, lo64, hi64);
        } else {
            const __m256i rl = rq_v_int64((const int64_t *)acc + c, oc, (__mmask8)k, _mm512_castsi512_si256(m),
                                          _mm512_castsi512_si256(s), lo64, hi64);
            const __m256i rh = rq_v_int64((const int64_t *)acc + c + 8, oc ? oc + 8 : NULL, (__mmask8)(k >> 8),
                                          _mm512_extracti64x4_epi64(m, 1), _mm512_extracti64x4_epi64(s, 1), lo64, hi64);
            r = _mm512_inserti64x4(_mm512_castsi256_si512(rl), rh, 1);
        }
        rq_v_store(out + c * oe, out16, _mm512_add_epi32(r, vzp), k);
    }
}
#endif /* TSR_AVX512 */

/* acc rows [M, C] (row stride sa elements), out rows [M, C] (row stride so); mult/shift have
 * C entries (cs = 1) or one (cs = 0); off (int64 [C]) is optional. */
int tsr_requant(const void *acc, int64_t sa, int acc64, const int32_t *mult, const int32_t *shift, int64_t cs,
                const int64_t *off, int64_t M, int64_t C, int64_t zp, int64_t qmin, int64_t qmax, int rounding,
                void *out, int64_t so, int out16, int nthreads) {
    const int mode = acc64 ? 2 : (rounding == RQ_SINGLE ? 1 : 0);
    const int ae = acc64 ? 8 : 4, oe = out16 ? 2 : 1;
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(static)
    for (int64_t i = 0; i < M; i++) {
        const char *a = (const char *)acc + i * sa * ae;
        char *o = (char *)out + i * so * oe;
        /* constant mode and channel stride: the compiler emits one vectorised loop per variant */
#ifdef TSR_AVX512
#define RQ(MODE) (cs ? rq_row_v(a, mult, shift, 1, off, C, zp, qmin, qmax, o, out16, MODE) \
                     : rq_row_v(a, mult, shift, 0, off, C, zp, qmin, qmax, o, out16, MODE))
#else
#define RQ(MODE) (cs ? rq_row(a, acc64, mult, shift, 1, off, C, zp, qmin, qmax, o, out16, MODE) \
                     : rq_row(a, acc64, mult, shift, 0, off, C, zp, qmin, qmax, o, out16, MODE))
#endif
        if (mode == 0) RQ(0);
        else if (mode == 1) RQ(1);
        else RQ(2);
#undef RQ
    }
    return TSR_OK;
}

/* dst[b][s][r] = src[b][r][s] for int8 matrices R x S (row strides ss / ds, batch strides bs / bd):
 * the NCHW <-> channels-last copies around the int8 conv (per image, C x H*W one way and
 * H*W x C the other).  torch's int8 permute copies ran at ~1.5 GB/s here (0.13-0.19 ms for one
 * 64x56x56 activation, a sixth of the conv); 16 x 16 blocks go through SSE2 unpacks (4 stages
 * of byte / word / dword / qword interleaves), the edges element by element. */
#if defined(__SSE2__)
#include <emmintrin.h>
INL void tr16x16(const int8_t *src, int64_t ss, int8_t *dst, int64_t ds) {
    __m128i a[16], b[16], c[16], d[16];
    for (int i = 0; i < 16; i++) a[i] = _mm_loadu_si128((const __m128i *)(src + i * ss));
    for (int i = 0; i < 8; i++) {   /* rows 2i, 2i+1 interleaved: columns 0-7 / 8-15 */
        b[2 * i] = _mm_unpacklo_epi8(a[2 * i], a[2 * i + 1]);
        b[2 * i + 1] = _mm_unpackhi_epi8(a[2 * i], a[2 * i + 1]);
    }
    for (int q = 0; q < 4; q++) {   /* rows 4q..4q+3: columns 0-3, 4-7, 8-11, 12-15 */
        c[4 * q] = _mm_unpacklo_epi16(b[4 * q], b[4 * q + 2]);
        c[4 * q + 1] = _mm_unpackhi_epi16(b[4 * q], b[4 * q + 2]);
        c[4 * q + 2] = _mm_unpacklo_epi16(b[4 * q + 1], b[4 * q + 3]);
        c[4 * q + 3] = _mm_unpackhi_epi16(b[4 * q + 1], b[4 * q + 3]);
    }
    for (int h = 0; h < 2; h++)     /* rows 8h..8h+7: column pairs (0,1), (2,3), ... (14,15) */
        for (int j = 0; j < 4; j++) {
            d[8 * h + 2 * j] = _mm_unpacklo_epi32(c[8 * h + j], c[8 * h + 4 + j]);
            d[8 * h + 2 * j + 1] = _mm_unpackhi_epi32(c[8 * h + j], c[8 * h + 4 + j]);
        }
    for (int j = 0; j < 8; j++) {   /* column 2j and 2j+1, all 16 rows */
        _mm_storeu_si128((__m128i *)(dst + 2 * j * ds), _mm_unpacklo_epi64(d[j], d[8 + j]));
        _mm_storeu_si128((__m128i *)(dst + (2 * j + 1) * ds), _mm_unpackhi_epi64(d[j], d[8 + j]));
    }
}
#endif

int tsr_transpose_i8(const int8_t *src, int64_t B, int64_t R, int64_t S, int64_t ss, int64_t bs, int8_t *dst,
                     int64_t ds, int64_t bd, int nthreads) {
    const int64_t nr = (R + 15) / 16, ns = (S + 15) / 16;
#pragma omp parallel for collapse(2) num_threads(tsr_threads(nthreads)) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < nr * ns; t++) {
            const int64_t r0 = t / ns * 16, s0 = t % ns * 16;
            const int8_t *sp = src + b * bs + r0 * ss + s0;
            int8_t *dp = dst + b * bd + s0 * ds + r0;
#if defined(__SSE2__)
            if (r0 + 16 <= R && s0 + 16 <= S) {
                tr16x16(sp, ss, dp, ds);
                continue;
            }
#endif
            const int64_t r1 = R - r0 < 16 ? R - r0 : 16, s1 = S - s0 < 16 ? S - s0 : 16;
            for (int64_t r = 0; r < r1; r++)
                for (int64_t s = 0; s < s1; s++) dp[s * ds + r] = sp[r * ss + s];
        }
    return TSR_OK;
}

/* x: [N, C, H, W] with element strides (sn, sc, sh, sw) (any memory format), int8 (es 1) or
 * int16 (es 2) -> cols [N*Ho*Wo, C*kh*kw]; each group's columns are one contiguous slice.
 *   order 0 (NCHW x): column (c * kh + ky) * kw + kx, the weight's own [O, C/g, kh, kw] order
 *   order 1 (channels-last x, sc == 1): column g*Kg + (ky * kw + kx) * Cg + cg, so a tap copies Cg
 *            contiguous channels (memcpy) -- the launcher hands the weight as [O, kh, kw, C/g]
 * Padding taps hold pad_value (x_zp). */
INL void fill(char *dst, int es, int64_t n, int64_t v) {
    if (es == 1) memset(dst, (int)(int8_t)v, (size_t)n);
    else for (int64_t i = 0; i < n; i++) ((int16_t *)dst)[i] = (int16_t)v;
}

int tsr_im2col(const void *x, int es, int64_t Nb, int64_t C, int64_t H, int64_t W, int64_t sn, int64_t sc,
               int64_t sh, int64_t sw, int64_t kh, int64_t kw, int64_t st_h, int64_t st_w, int64_t pd_h,
               int64_t pd_w, int64_t dl_h, int64_t dl_w, int64_t Ho, int64_t Wo, int64_t pad_value, int64_t groups,
               int order, void *cols, int nthreads) {
    const int64_t Kc = C * kh * kw, rows = Nb * Ho * Wo, Cg = C / groups, Kg = Cg * kh * kw;
    const char *xb = (const char *)x;
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t n = r / (Ho * Wo), oy = (r / Wo) % Ho, ox = r % Wo;
        char *row = (char *)cols + r * Kc * es;
        if (order == 1) {
            for (int64_t g = 0; g < groups; g++)
                for (int64_t ky = 0; ky < kh; ky++) {
                    const int64_t iy = oy * st_h - pd_h + ky * dl_h;
                    for (int64_t kx = 0; kx < kw; kx++) {
                        const int64_t ix = ox * st_w - pd_w + kx * dl_w;
                        char *dst = row + (g * Kg + (ky * kw + kx) * Cg) * es;
                        if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                            memcpy(dst, xb + (n * sn + g * Cg + iy * sh + ix * sw) * es, (size_t)(Cg * es));
                        else
                            fill(dst, es, Cg, pad_value);
                    }
                }
            continue;
        }
        for (int64_t c = 0; c < C; c++)
            for (int64_t ky = 0; ky < kh; ky++) {
                const int64_t iy = oy * st_h - pd_h + ky * dl_h;
                const int64_t col0 = (c * kh + ky) * kw;
                for (int64_t kx = 0; kx < kw; kx++) {
                    const int64_t ix = ox * st_w - pd_w + kx * dl_w;
                    const int inb = iy >= 0 && iy < H && ix >= 0 && ix < W;
                    const int64_t src = n * sn + c * sc + iy * sh + ix * sw;
                    if (es == 1)
                        ((int8_t *)row)[col0 + kx] = inb ? ((const int8_t *)x)[src] : (int8_t)pad_value;
                    else
                        ((int16_t *)row)[col0 + kx] = inb ? ((const int16_t *)x)[src] : (int16_t)pad_value;
                }
            }
    }
    return TSR_OK;
}

/* Depthwise (one input channel a group, one output per group) integer accumulator, no im2col:
 *   acc[(n, oy, ox), c] = sum_{ky, kx} xv * wt[ky * kw + kx, c],   xv = x[n, c, iy, ix] or x_zp
 * (a padding tap holds x_zp, as in tsr_im2col, so the offset's correction cancels it exactly).
 * wt is the weight widened to int32 and transposed to taps-major [kh*kw, C], so the loop over c is
 * unit-stride in wt, acc and -- for a channels-last x (sc == 1) -- in x: it vectorises.  int8 x:
 * int32 sums (exact: |sum| <= kh*kw * 2^15); int16 x: int64 sums (CMSIS-NN's s16 path). */
#define DW_ROW(AT, XT)                                                                                  \
    do {                                                                                                \
        AT *a = (AT *)acc;                                                                              \
        for (int64_t c = 0; c < C; c++) a[c] = init ? (AT)init[c] : 0;                                  \
        for (int64_t ky = 0; ky < kh; ky++) {                                                           \
            const int64_t iy = oy * st_h - pd_h + ky * dl_h;                                            \
            for (int64_t kx = 0; kx < kw; kx++) {                                                       \
                const int64_t ix = ox * st_w - pd_w + kx * dl_w;                                        \
                const int32_t *w = wt + (ky * kw + kx) * C;                                             \
                if (iy >= 0 && iy < H && ix >= 0 && ix < W) {                                           \
                    const XT *xp = (const XT *)x + n * sn + iy * sh + ix * sw;                           \
                    if (sc == 1)                                                                        \
                        for (int64_t c = 0; c < C; c++) a[c] += (AT)xp[c] * (AT)w[c];                   \
                    else                                                                                \
                        for (int64_t c = 0; c < C; c++) a[c] += (AT)xp[c * sc] * (AT)w[c];              \
                } else {                                                                                \
                    for (int64_t c = 0; c < C; c++) a[c] += (AT)zp * (AT)w[c];                          \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
    } while (0)

#ifdef TSR_AVX512
/* DW_ROW for int8 channels-last x (sc == 1), 64 channels a step in 4 x 16 int32 lanes: a tap's 64
 * input bytes widened (vpmovsxbd) and multiplied by its int32 weights (vpmulld), the sums kept in
 * registers over the taps (the C loop above loads and stores the accumulator row once a tap:
 * 3-8x slower than fp32 F.conv2d on MobileNetV2's depthwise layers).  Exact: |sum| <= taps * 2^15. */
INL void dw_row_v(const int8_t *xb, int64_t sh, int64_t sw, const int32_t *wt, const int32_t *init, int64_t C,
                  int64_t H, int64_t W,
                  int64_t kh, int64_t kw, int64_t iy0, int64_t ix0, int64_t dl_h, int64_t dl_w, int32_t zp,
                  int32_t *a) {
    const __m512i vzp = _mm512_set1_epi32(zp);
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
        const int64_t n = C - c0 < 64 ? C - c0 : 64;
        const __mmask64 kb = n == 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1);
        __mmask16 k[4];
        __m512i acc[4];
        for (int j = 0; j < 4; j++) {
            const int64_t v = n - 16 * j;
            k[j] = (__mmask16)(v <= 0 ? 0 : (v >= 16 ? 0xFFFF : (1u << v) - 1u));
            acc[j] = init ? _mm512_maskz_loadu_epi32(k[j], init + c0 + 16 * j) : _mm512_setzero_si512();
        }
        for (int64_t ky = 0; ky < kh; ky++) {
            const int64_t iy = iy0 + ky * dl_h;
            for (int64_t kx = 0; kx < kw; kx++) {
                const int64_t ix = ix0 + kx * dl_w;
                const int32_t *w = wt + (ky * kw + kx) * C + c0;
                if (iy >= 0 && iy < H && ix >= 0 && ix < W) {
                    const __m512i xv = _mm512_maskz_loadu_epi8(kb, xb + iy * sh + ix * sw + c0);
                    const __m128i q[4] = {_mm512_castsi512_si128(xv), _mm512_extracti32x4_epi32(xv, 1),
                                          _mm512_extracti32x4_epi32(xv, 2), _mm512_extracti32x4_epi32(xv, 3)};
                    for (int j = 0; j < 4; j++)
                        acc[j] = _mm512_add_epi32(acc[j], _mm512_mullo_epi32(_mm512_cvtepi8_epi32(q[j]),
                                                                            _mm512_maskz_loadu_epi32(k[j], w + 16 * j)));
                } else {
                    for (int j = 0; j < 4; j++)
                        acc[j] = _mm512_add_epi32(acc[j], _mm512_mullo_epi32(vzp, _mm512_maskz_loadu_epi32(k[j], w + 16 * j)));
                }
            }
        }
        for (int j = 0; j < 4; j++) _mm512_mask_storeu_epi32(a + c0 + 16 * j, k[j], acc[j]);
    }
}
#endif

/* one requantized output row of the depthwise conv (tsr_dw_requant) */
INL void dw_requant_row(const void *x, int es, int64_t r, int64_t C, int64_t H, int64_t W, int64_t sn, int64_t sc,
                        int64_t sh, int64_t sw, const int32_t *wt, int64_t kh, int64_t kw, int64_t st_h,
                        int64_t st_w, int64_t pd_h, int64_t pd_w, int64_t dl_h, int64_t dl_w, int64_t Ho, int64_t Wo,
                        int64_t zp, const int32_t *mult, const int32_t *shift, int64_t cs, const int64_t *off,
                        const int32_t *init, int64_t ozp, int64_t qmin, int64_t qmax, int mode, char *o, int out16,
                        void *acc) {
    const int64_t n = r / (Ho * Wo), oy = (r / Wo) % Ho, ox = r % Wo;
#ifdef TSR_AVX512
    if (es == 1 && sc == 1)
        dw_row_v((const int8_t *)x + n * sn, sh, sw, wt, init, C, H, W, kh, kw, oy * st_h - pd_h, ox * st_w - pd_w, dl_h,
                 dl_w, (int32_t)zp, (int32_t *)acc);
    else
#endif
    if (es == 1) DW_ROW(int32_t, int8_t);
    else DW_ROW(int64_t, int16_t);
#ifdef TSR_AVX512
#define RQ(MODE) (cs ? rq_row_v((const char *)acc, mult, shift, 1, init ? NULL : off, C, ozp, qmin, qmax, o, out16, MODE) \
                     : rq_row_v((const char *)acc, mult, shift, 0, init ? NULL : off, C, ozp, qmin, qmax, o, out16, MODE))
#else
#define RQ(MODE) (cs ? rq_row((const char *)acc, es == 2, mult, shift, 1, init ? NULL : off, C, ozp, qmin, qmax, o, \
                            out16, MODE) \
                     : rq_row((const char *)acc, es == 2, mult, shift, 0, init ? NULL : off, C, ozp, qmin, qmax, o, \
                              out16, MODE))
#endif
    if (mode == 0) RQ(0);
    else if (mode == 1) RQ(1);
    else RQ(2);
#undef RQ
}

/* Depthwise conv, requantized: each output row's accumulators (DW_ROW, or dw_row_v) then
 * tsr_requant's row function on them, so the int32 / int64 accumulators never leave a per-thread
 * row buffer.  out rows [Nb*Ho*Wo, C] (row stride so); mult / shift / off as tsr_requant. */
int tsr_dw_requant(const void *x, int es, int64_t Nb, int64_t C, int64_t H, int64_t W, int64_t sn, int64_t sc,
                   int64_t sh, int64_t sw, const int32_t *wt, int64_t kh, int64_t kw, int64_t st_h, int64_t st_w,
                   int64_t pd_h, int64_t pd_w, int64_t dl_h, int64_t dl_w, int64_t Ho, int64_t Wo, int64_t zp,
                   const int32_t *mult, const int32_t *shift, int64_t cs, const int64_t *off, int64_t ozp, int64_t qmin,
                   int64_t qmax, int rounding, void *out, int64_t so, int out16, int nthreads) {
    if (es != 1 && es != 2) return TSR_EINVAL;
    const int mode = es == 2 ? 2 : (rounding == RQ_SINGLE ? 1 : 0), oe = out16 ? 2 : 1;
    const int64_t rows = Nb * Ho * Wo;
    /* int8 x: the offset starts the int32 sums instead of a saturating int64 add per element when
     * no sum can overflow (|x w| <= 2^14 a tap): bit-identical, and ~a third of the requantization */
    int32_t *init = NULL;
    if (es == 1 && off) {
        const int64_t lim = INT32_MAX - kh * kw * ((int64_t)1 << 14);
        int64_t big = 0;
        for (int64_t c = 0; c < C; c++) big |= off[c] > lim || off[c] < -lim;
        init = big ? NULL : (int32_t *)aligned_alloc(64, (size_t)((C * 4 + 63) & ~(int64_t)63));
        for (int64_t c = 0; init && c < C; c++) init[c] = (int32_t)off[c];
    }
    int failed = 0;
    TSR_TEAM(tsr_threads(nthreads), reduction(| : failed), {
        void *acc = aligned_alloc(64, (size_t)((C * 8 + 63) & ~(int64_t)63));
        if (!acc) failed = 1;
_Pragma("omp for schedule(static)")
        for (int64_t r = 0; r < rows; r++)
            if (!failed)
                dw_requant_row(x, es, r, C, H, W, sn, sc, sh, sw, wt, kh, kw, st_h, st_w, pd_h, pd_w, dl_h, dl_w, Ho,
                               Wo, zp, mult, shift, cs, off, init, ozp, qmin, qmax, mode, (char *)out + r * so * oe,
                               out16, acc);
        free(acc);
    });
    free(init);
    return failed ? TSR_ENOMEM : TSR_OK;
}
#undef DW_ROW
