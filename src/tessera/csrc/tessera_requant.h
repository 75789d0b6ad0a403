/* tessera_requant.h -- the integer pipeline's requantization of one accumulator row (framework-free
 * C11), shared by ops/_requant/requant.c (tsr_requant, the depthwise conv) and the int8 GEMM's
 * fused epilogue (ops/_qlinear_int8/qlinear_int8.c, tsr_qi8_mm_rq).  The formulas are written out
 * in ops/requantize/__init__.py; rq_row is the scalar form, rq_row_v (TSR_AVX512) the same
 * arithmetic 16 channels a step, bit-identical. */
#ifndef TESSERA_REQUANT_H
#define TESSERA_REQUANT_H
#include "tessera_avx512.h"

#define INL static inline __attribute__((always_inline))

/* TESSERA_RQ_FP32=0 keeps the integer form of the double rounding everywhere (rq_f_double below;
 * read per call, so tests and A/B runs can flip it) */
static inline int rq_f_enabled(void) {
    const char *v = getenv("TESSERA_RQ_FP32");
    return !(v && v[0] == '0' && v[1] == 0);
}

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

/* the mask of the first min(n, 16) lanes (n >= 1): a 16-channel block's tail */
INL __mmask16 rq_tail16(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }

/* channels c .. c + 15 of a per-channel (cs) or per-tensor int32 parameter (multiplier, shift) */
INL __m512i rq_v_chan(const int32_t *v, int cs, int64_t c, __mmask16 k) {
    return cs ? _mm512_maskz_loadu_epi32(k, v + c) : _mm512_set1_epi32(v[0]);
}

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
 *       then a = INT32_MAX or INT32_MIN by the sign of acc (skipped when no lane shifts left:
 *       the usual case, every shift <= 0, ~1/4 of the work);
 *   SRDHM h = floor((a*m + 2^30) / 2^31) (= gemmlowp's trunc with the nudge 2^30 or 1 - 2^30:
 *       ties UP, 2.5 -> 3, -2.5 -> -2), bits 31..62 of the 64-bit sum: the even lanes take them by
 *       a 31-bit right shift (low half of the qword), the odd lanes by a 1-bit left shift (high
 *       half); h == INT32_MIN only for a == m == INT32_MIN (2^31 wrapped) -> INT32_MAX;
 *   RDBPOT (h >> e) + ((h & mask) > (mask >> 1) + (h < 0)), mask = 2^e - 1: h / 2^e rounded half
 *       AWAY from zero (-1.5 -> -2, 1.5 -> 2). */
typedef struct {   /* rq_v_double's per-channel part: what depends only on (m, s) */
    __m512i m, mo, left, e, mask, half;   /* mo: m's odd lanes moved down; half = mask >> 1 */
    __m512i re, ro, te, to, se, so;       /* the one-shift form (below), even / odd lanes as int64 */
    int any_left;                          /* a lane shifts left (s > 0) */
    int any_min;                           /* a lane's m is INT32_MIN (a * m may be 2^62) */
} rq_v_dch;

INL rq_v_dch rq_v_double_ch(__m512i m, __m512i s) {
    const __m512i zero = _mm512_setzero_si512(), one = _mm512_set1_epi32(1);
    rq_v_dch c;
    c.m = m;
    c.mo = _mm512_srli_epi64(m, 32);
    c.any_left = _mm512_cmpgt_epi32_mask(s, zero) != 0;
    c.any_min = _mm512_cmpeq_epi32_mask(m, _mm512_set1_epi32(INT32_MIN)) != 0;
    c.left = _mm512_max_epi32(s, zero);
    c.e = _mm512_max_epi32(_mm512_sub_epi32(zero, s), zero);
    c.mask = _mm512_sub_epi32(_mm512_sllv_epi32(one, c.e), one);
    c.half = _mm512_srli_epi32(c.mask, 1);
    /* per int64 lane: r = 2^30 + (e > 0 ? 2^(30 + e) : 0), t = 31 + e, sub = (e > 0 ? 2^31 : 0) */
    const __m512i ee = _mm512_and_si512(c.e, _mm512_set1_epi64(0xFFFFFFFF)), eo = _mm512_srli_epi64(c.e, 32);
    const __m512i r30 = _mm512_set1_epi64((int64_t)1 << 30), z64 = _mm512_setzero_si512();
    c.re = _mm512_add_epi64(r30, _mm512_mask_sllv_epi64(z64, _mm512_cmpgt_epi64_mask(ee, z64), r30, ee));
    c.ro = _mm512_add_epi64(r30, _mm512_mask_sllv_epi64(z64, _mm512_cmpgt_epi64_mask(eo, z64), r30, eo));
    c.te = _mm512_add_epi64(ee, _mm512_set1_epi64(31));
    c.to = _mm512_add_epi64(eo, _mm512_set1_epi64(31));
    c.se = _mm512_maskz_mov_epi64(_mm512_cmpgt_epi64_mask(ee, z64), _mm512_set1_epi64((int64_t)1 << 31));
    c.so = _mm512_maskz_mov_epi64(_mm512_cmpgt_epi64_mask(eo, z64), _mm512_set1_epi64((int64_t)1 << 31));
    return c;
}

/* rq_v_double's steps after the per-channel part.  The usual case (no m == INT32_MIN) in one
 * rounding shift per int64 lane: with u = a*m + 2^30, SRDHM is h = floor(u / 2^31) and RDBPOT by
 * e >= 1 is floor((h + 2^(e-1) - [h < 0]) / 2^e); floor(floor(v / 2^31) / 2^e) = floor(v / 2^(31+e))
 * and h < 0 iff u < 0, so
 *     r = (a*m + 2^30 + 2^(30+e) - [a*m < -2^30] 2^31) >> (31 + e)      (e = 0: (a*m + 2^30) >> 31)
 * exactly (|a*m| <= 2^62, so nothing overflows int64).  5 instructions on the shift / multiply port
 * where the two-step form took 7.  Where a lane's m is INT32_MIN the two-step form runs (its
 * a == m == INT32_MIN saturation: 2^31 -> INT32_MAX, which this form misses at e = 0). */
INL __m512i rq_v_double_pre(__m512i a, const rq_v_dch *c) {
    const __m512i one = _mm512_set1_epi32(1);
    if (c->any_left) {   /* a left shift somewhere (rare: scales >= 1) */
        const __m512i sl = _mm512_sllv_epi32(a, c->left);
        const __mmask16 ovf = _mm512_cmpneq_epi32_mask(_mm512_srav_epi32(sl, c->left), a);
        a = _mm512_mask_mov_epi32(sl, ovf, _mm512_xor_si512(_mm512_srai_epi32(a, 31), _mm512_set1_epi32(INT32_MAX)));
    }
    if (!c->any_min) {
        const __m512i lim = _mm512_set1_epi64(-((int64_t)1 << 30));
        const __m512i pe = _mm512_mul_epi32(a, c->m), po = _mm512_mul_epi32(_mm512_srli_epi64(a, 32), c->mo);
        const __m512i ve = _mm512_mask_sub_epi64(_mm512_add_epi64(pe, c->re), _mm512_cmplt_epi64_mask(pe, lim),
                                                 _mm512_add_epi64(pe, c->re), c->se);
        const __m512i vo = _mm512_mask_sub_epi64(_mm512_add_epi64(po, c->ro), _mm512_cmplt_epi64_mask(po, lim),
                                                 _mm512_add_epi64(po, c->ro), c->so);
        /* the low dwords of the shifted even / odd lanes, interleaved back */
        return _mm512_permutex2var_epi32(_mm512_srav_epi64(ve, c->te),
                                         _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30),
                                         _mm512_srav_epi64(vo, c->to));
    }
    const __m512i r30 = _mm512_set1_epi64((int64_t)1 << 30);
    const __m512i pe = _mm512_add_epi64(_mm512_mul_epi32(a, c->m), r30);
    const __m512i po = _mm512_add_epi64(_mm512_mul_epi32(_mm512_srli_epi64(a, 32), c->mo), r30);
    __m512i h = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 31), _mm512_slli_epi64(po, 1));
    /* only a == m == INT32_MIN wraps h to INT32_MIN */
    h = _mm512_mask_sub_epi32(h, _mm512_cmpeq_epi32_mask(h, _mm512_set1_epi32(INT32_MIN)), h, one);
    const __m512i thr = _mm512_sub_epi32(c->half, _mm512_srai_epi32(h, 31));
    const __mmask16 up = _mm512_cmpgt_epi32_mask(_mm512_and_si512(h, c->mask), thr);
    const __m512i r = _mm512_srav_epi32(h, c->e);
    return _mm512_mask_add_epi32(r, up, r, one);
}

INL __m512i rq_v_double(__m512i a, __m512i m, __m512i s) {
    const rq_v_dch c = rq_v_double_ch(m, s);
    return rq_v_double_pre(a, &c);
}

/* The double rounding through fp32, 16 lanes in ~8 instructions where the int64 form takes ~14
 * (the depthwise kernels' register sums, the int8 GEMM's tile).  With m > 0 and s = -e,
 * 0 <= e <= 31, the one-shift form above is
 *     r = floor(x + 1/2 + d),  x = a m / 2^(31+e),  d = 0 (e = 0), +2^-(e+1) (a >= 0), -2^-(e+1) (a < 0)
 * (divide its numerator by 2^(31+e); a m < 0 iff a < 0 as m > 0, and for -2^30 <= a m < 0 both
 * [a m < -2^30] and [a < 0] give r = 0).  Computed: y = fl(fl(a) S + copysign(2^-(e+1), a)) with
 * S = fl(m 2^-(31+e)) (scalef: exact power-of-two scaling; S and 2^-(e+1) are normal fp32),
 * clamped to [lo, hi] = [qmin - zp, qmax - zp] (integers), rounded to nearest.  Error: fl(a) and
 * S are each within 2^-24 relative, so |fl(a) S - x| <= |x| 2^-22.9, and the fma's rounding adds
 * <= |y| 2^-24: below 2^-13 wherever |y| <= 2^9 + 1 (|lo|, |hi| <= 512: int8 outputs).  A lane that
 * the clamp decides is right whenever the error is below 1/2 (|x| < 2^20; beyond, x is far outside
 * [lo, hi]).  An unclamped y more than the error away from a half-integer rounds as
 * floor(y_exact + 1/2) does; a lane within EPS = 2^-11 of one (exact ties included, where rounding
 * to even would differ) is not trusted, and the caller runs the integer form for its vector (~2 %
 * of vectors). */
typedef struct {
    __m512 S, d, lo, hi;
    int ok;   /* every (masked-in) lane has m > 0 and 0 <= e <= 31 (no left shift), and |lo|, |hi| <= 512 */
} rq_f_ch;

#define RQ_F_EPS (1.0f / 2048)

INL rq_f_ch rq_f_double_ch(__m512i m, __m512i s, __mmask16 k, int64_t lo, int64_t hi) {
    const __m512i zero = _mm512_setzero_si512(), e = _mm512_sub_epi32(zero, s);
    rq_f_ch c;
    c.ok = lo >= -512 && hi <= 512 && _mm512_mask_cmpgt_epi32_mask(k, m, zero) == k &&
           _mm512_mask_cmpge_epi32_mask(k, e, zero) == k && _mm512_mask_cmple_epi32_mask(k, e, _mm512_set1_epi32(31)) == k;
    c.S = _mm512_scalef_ps(_mm512_cvtepi32_ps(m), _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_set1_epi32(-31), e)));
    c.d = _mm512_maskz_scalef_ps(_mm512_cmpgt_epi32_mask(e, zero), _mm512_set1_ps(1.0f),
                                 _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_set1_epi32(-1), e)));
    c.lo = _mm512_set1_ps((float)lo);
    c.hi = _mm512_set1_ps((float)hi);
    return c;
}

/* r = the clamped double rounding of 16 exact fp32 accumulators; returns the lanes not trusted */
INL __mmask16 rq_f_double(__m512 a, const rq_f_ch *c, __m512i *r) {
    /* (a & sign) | d: d with a's sign (ternary-logic truth table A & B | C = 0xEA) */
    const __m512 t = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN),
                                                                   _mm512_castps_si512(c->d), 0xEA));
    const __m512 y = _mm512_min_ps(_mm512_max_ps(_mm512_fmadd_ps(a, c->S, t), c->lo), c->hi);
    *r = _mm512_cvt_roundps_epi32(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* y - round(y) in [-1/2, 1/2] (vreduceps, imm 8: no fraction bits kept, nearest, quiet) */
    const __m512 f = _mm512_abs_ps(_mm512_reduce_ps(y, 8));
    return _mm512_cmp_ps_mask(f, _mm512_set1_ps(0.5f - RQ_F_EPS), _CMP_GT_OQ);
}

/* rq_f_double's fallback for a vector it distrusts (~2 %): the integer form, clamped to [lo, hi],
 * its per-channel part formed here rather than for every vector */
INL __m512i rq_v_double_lazy(__m512i a, __m512i m, __m512i s, __m512i lo32, __m512i hi32) {
    const rq_v_dch ch = rq_v_double_ch(m, s);
    return _mm512_max_epi32(_mm512_min_epi32(rq_v_double_pre(a, &ch), hi32), lo32);
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

INL void rq_v_store(char *out, int out16, __m512i v, __mmask16 k) {
    if (k == 0xFFFF) {   /* a register narrowing then a plain store: fewer uops than the masked store */
        if (out16) _mm256_storeu_si256((__m256i *)out, _mm512_cvtepi32_epi16(v));
        else _mm_storeu_si128((__m128i *)out, _mm512_cvtepi32_epi8(v));
    } else if (out16) _mm512_mask_cvtepi32_storeu_epi16(out, k, v);
    else _mm512_mask_cvtepi32_storeu_epi8(out, k, v);
}

/* mbqm_int64's per-channel part formed once per call: the Q15 multiplier rm, t = 15 - s and the
 * rounding 2^(t - 1), int64 per channel (a per-tensor multiplier is repeated).  Formed again for
 * every 8 lanes they were 9 of the requantization's ~21 instructions (and the saturating offset
 * add 8 more): the int16-activation layers' requantization cost more than their VPDPWSSD GEMM. */
typedef struct {
    int64_t *rm, *t, *rnd;
} rq64_t;

static inline int rq64_init(rq64_t *k, const int32_t *mult, const int32_t *shift, int64_t cs, int64_t C) {
    int64_t *buf = (int64_t *)aligned_alloc(64, (size_t)((3 * C * 8 + 63) & ~(int64_t)63));
    if (!buf) return -1;
    k->rm = buf, k->t = buf + C, k->rnd = buf + 2 * C;
    for (int64_t c = 0; c < C; c++) {
        const int64_t m = mult[cs ? c : 0], t = 15 - (int64_t)shift[cs ? c : 0];
        k->rm[c] = m < 0x7FFF0000 ? (m + (1 << 15)) >> 16 : 0x7FFF;   /* Q31 -> Q15, rounded; 0x7FFF at the top */
        k->t[c] = t;
        k->rnd[c] = (int64_t)1 << (t - 1);
    }
    return 0;
}

static inline void rq64_free(rq64_t *k) { free(k->rm); }

/* mbqm_int64 on 8 int64 lanes (x = acc + off, saturating), clamped to [lo, hi]: x clamped to
 * [-2^47, 2^47), |x * rm| <= 2^62, floor((x*rm + 2^(t-1)) / 2^t), t = 15 - s in [8, 46], the
 * per-channel part loaded from K (channels c .. c + 7); off_sat 0 where the caller has shown
 * acc + off cannot overflow int64 (the plain add is then the saturating one) */
INL __m256i rq_v_int64k(const int64_t *a, const int64_t *off, int off_sat, __mmask8 k, const rq64_t *K, int64_t c,
                        __m512i lo, __m512i hi) {
    __m512i x = _mm512_maskz_loadu_epi64(k, a);
    if (off) {
        const __m512i b = _mm512_maskz_loadu_epi64(k, off), r = _mm512_add_epi64(x, b);
        if (off_sat) {
            const __mmask8 ovf = _mm512_movepi64_mask(_mm512_and_si512(_mm512_xor_si512(x, r), _mm512_xor_si512(b, r)));
            x = _mm512_mask_mov_epi64(r, ovf, _mm512_xor_si512(_mm512_srai_epi64(x, 63), _mm512_set1_epi64(INT64_MAX)));
        } else {
            x = r;
        }
    }
    x = _mm512_max_epi64(_mm512_min_epi64(x, _mm512_set1_epi64(((int64_t)1 << 47) - 1)),
                         _mm512_set1_epi64(-((int64_t)1 << 47)));
    __m512i v = _mm512_add_epi64(_mm512_mullo_epi64(x, _mm512_maskz_loadu_epi64(k, K->rm + c)),
                                 _mm512_maskz_loadu_epi64(k, K->rnd + c));
    v = _mm512_srav_epi64(v, _mm512_maskz_loadu_epi64(k, K->t + c));
    return _mm512_cvtepi64_epi32(_mm512_max_epi64(_mm512_min_epi64(v, hi), lo));
}

/* one row of C int64 accumulators (channels c0 .. c0 + C of K) into out, 16 channels a step */
INL void rq_row_v64k(const int64_t *acc, const int64_t *off, int off_sat, const rq64_t *K, int64_t c0, int64_t C,
                     int64_t zp, int64_t qmin, int64_t qmax, char *out, const int out16) {
    const __m512i lo = _mm512_set1_epi64(qmin - zp), hi = _mm512_set1_epi64(qmax - zp);
    const __m512i vzp = _mm512_set1_epi32((int32_t)zp);
    for (int64_t c = 0; c < C; c += 16) {
        const __mmask16 k = rq_tail16(C - c);
        const __m256i rl = rq_v_int64k(acc + c, off ? off + c : NULL, off_sat, (__mmask8)k, K, c0 + c, lo, hi);
        const __m256i rh = rq_v_int64k(acc + c + 8, off ? off + c + 8 : NULL, off_sat, (__mmask8)(k >> 8), K,
                                       c0 + c + 8, lo, hi);
        const __m512i r = _mm512_inserti64x4(_mm512_castsi256_si512(rl), rh, 1);
        rq_v_store(out + c * (out16 ? 2 : 1), out16, _mm512_add_epi32(r, vzp), k);
    }
}

/* one row of int32 accumulators, mode 0 (double rounding) or 1 (single), 16 channels a step
 * (masked tail); int64 rows take rq_row_v64k */
INL void rq_row_v(const char *acc, const int32_t *mult, const int32_t *shift, const int cs, const int64_t *off,
                  int64_t C, int64_t zp, int64_t qmin, int64_t qmax, char *out, const int out16, const int mode) {
    /* clamp(r + zp, qmin, qmax) == clamp(r, qmin - zp, qmax - zp) + zp, the bounds within +-2^16 */
    const __m512i lo32 = _mm512_set1_epi32((int32_t)(qmin - zp)), hi32 = _mm512_set1_epi32((int32_t)(qmax - zp));
    const __m512i lo64 = _mm512_set1_epi64(qmin - zp), hi64 = _mm512_set1_epi64(qmax - zp);
    const __m512i vzp = _mm512_set1_epi32((int32_t)zp);
    const int oe = out16 ? 2 : 1;
    for (int64_t c = 0; c < C; c += 16) {
        const __mmask16 k = rq_tail16(C - c);
        const __m512i m = rq_v_chan(mult, cs, c, k), s = rq_v_chan(shift, cs, c, k);
        const int64_t *oc = off ? off + c : NULL;
        __m512i r;
        if (mode == 0) {
            r = rq_v_double(rq_v_acc32((const int32_t *)acc + c, oc, k), m, s);
            r = _mm512_max_epi32(_mm512_min_epi32(r, hi32), lo32);
        } else {
            r = rq_v_single(rq_v_acc32((const int32_t *)acc + c, oc, k), m, s, lo64, hi64);
        }
        rq_v_store(out + c * oe, out16, _mm512_add_epi32(r, vzp), k);
    }
}
/* The fp32 double rounding for int8 outputs, four 16-lane blocks at a time (rq_tile_f8: the GEMM's
 * tile and tsr_requant; dw_int8_k3.h's dwq_put4: the depthwise kernels).  Per 16 values: convert,
 * sign the addend, fma, round -- ~5 instructions where rq_f_double's clamped form takes ~12 with
 * its store:
 *   - no clamp in fp32: every lane's e >= 1 (rq_f8_ok), so S < 2^-e <= 1/2 and |y| < 2^30 converts
 *     without overflow.  clamp(round(y)) equals rq_f_double's round(clamp(y)) (integer bounds), and
 *     a lane far outside [lo, hi] (|y| > 2^9 + 1, beyond rq_f_double's error bound) stays beyond the
 *     bound it is clamped to: its error is below 1/2 up to |x| = 2^20, and larger x are far outside.
 *   - the distrust test on the four blocks at once: vrangeps (imm 0x0B: the larger magnitude, sign
 *     cleared) folds |y - round(y)| of two blocks into one register, so one compare (and one branch)
 *     serves 64 lanes, where four compares, four k-register ANDs and ORs did (the k-register ops run
 *     on one port).  A distrusted group (an unclamped lane may now trip it: ~2^-10 a lane) takes the
 *     integer form for its distrusted blocks, as before.
 *   - the blocks leave through saturating packs: int32 -> int16 (monotone), + zp in int16 (|zp| <=
 *     640 by rq_f_double_ch's bounds, so a saturated value stays beyond +-2^15 - 640), -> int8
 *     (monotone), then the clamp to [qmin, qmax] on 64 bytes at once; one dword permute undoes the
 *     packs' in-lane order: 16-byte lane b of the result is block b. */
typedef struct {
    __m512i z16, bmin, bmax, tr, sgn;
    __m512 lim;
} rq_f8_k;

/* may a block with these channels (rq_f_double_ch's c, shifts s, lanes k) take the f8 form? */
INL int rq_f8_ok(const rq_f_ch *c, __m512i s, __mmask16 k, int64_t qmin, int64_t qmax) {
    return c->ok && _mm512_mask_cmplt_epi32_mask(k, s, _mm512_setzero_si512()) == k && qmin >= -128 && qmax <= 127;
}

INL rq_f8_k rq_f8_init(int64_t zp, int64_t qmin, int64_t qmax) {
    rq_f8_k K;
    K.z16 = _mm512_set1_epi16((short)zp);
    K.bmin = _mm512_set1_epi8((char)qmin);
    K.bmax = _mm512_set1_epi8((char)qmax);
    K.tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    K.sgn = _mm512_set1_epi32(INT32_MIN);
    K.lim = _mm512_set1_ps(0.5f - RQ_F_EPS);
    return K;
}

/* one block: *r = round(y), y = fl(a) S + copysign(d, a) unclamped; returns y - round(y) (0 outside k) */
INL __m512 rq_f8_block(__m512i a, const rq_f_ch *f, __mmask16 k, const rq_f8_k *K, __m512i *r) {
    const __m512 af = _mm512_cvtepi32_ps(a);
    /* (a & sign) | d: d with a's sign (rq_f_double) */
    const __m512 t = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(af), K->sgn,
                                                                   _mm512_castps_si512(f->d), 0xEA));
    const __m512 y = _mm512_fmadd_ps(af, f->S, t);
    *r = _mm512_cvt_roundps_epi32(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_maskz_reduce_ps(k, y, 8);   /* vreduceps imm 8: y - round(y), nearest, quiet */
}

/* is a lane of blocks 0 .. NU - 1 (3 or 4) within EPS of a half-integer? */
INL int rq_f8_distrust(const __m512 fr[4], const int NU, const rq_f8_k *K) {
    __m512 g = _mm512_range_ps(fr[0], fr[1], 0x0B);
    g = NU == 3 ? _mm512_range_ps(g, fr[2], 0x0B) : _mm512_range_ps(g, _mm512_range_ps(fr[2], fr[3], 0x0B), 0x0B);
    return _mm512_cmp_ps_mask(g, K->lim, _CMP_GT_OQ) != 0;
}

INL int rq_f8_distrust1(__m512 fr, const rq_f8_k *K) {
    return _mm512_cmp_ps_mask(_mm512_abs_ps(fr), K->lim, _CMP_GT_OQ) != 0;
}

/* four blocks' results (clamped or not: any int32) + zp, clamped to [qmin, qmax], as 64 int8 */
INL __m512i rq_f8_pack4(const __m512i r[4], const rq_f8_k *K) {
    const __m512i p01 = _mm512_adds_epi16(_mm512_packs_epi32(r[0], r[1]), K->z16);
    const __m512i p23 = _mm512_adds_epi16(_mm512_packs_epi32(r[2], r[3]), K->z16);
    const __m512i v8 = _mm512_max_epi8(_mm512_min_epi8(_mm512_packs_epi16(p01, p23), K->bmax), K->bmin);
    return _mm512_permutexvar_epi32(K->tr, v8);
}

/* the n (1..4) 16-byte lanes of v to o, o + step, ...: four rows / pixels of one 16-channel block */
INL void rq_f8_store4(__m512i v, int n, char *o, int64_t step, __mmask16 k) {
    _mm_mask_storeu_epi8(o, k, _mm512_castsi512_si128(v));
    if (n > 1) _mm_mask_storeu_epi8(o + step, k, _mm512_extracti32x4_epi32(v, 1));
    if (n > 2) _mm_mask_storeu_epi8(o + 2 * step, k, _mm512_extracti32x4_epi32(v, 2));
    if (n > 3) _mm_mask_storeu_epi8(o + 3 * step, k, _mm512_extracti32x4_epi32(v, 3));
}

/* The f8 form's per-channel parts of one register of four 16-lane blocks (rq_tile_f8, and the int8
 * GEMM's fused epilogue, _qlinear_int8/qi8_outer_rq.h): NB (1..4) blocks of columns from column 0
 * (mult / shift at column 0; cs: per channel).  Where NB divides 4, block b takes block b % NB's
 * channels (4 / NB rows of the register side by side); for NB = 3 there is no block 3 (rq_f8_rows
 * reads three), and a block past C has k 0.  Returns 0 where a block's channels do not allow the f8 form. */
typedef struct {
    rq_f_ch f[4];
    __mmask16 k[4];
    __m512i mv[4], sv[4];
} rq_f8_ch;

INL int rq_f8_ch_init(rq_f8_ch *c, const int32_t *mult, const int32_t *shift, int cs, int64_t C, int64_t zp,
                      int64_t qmin, int64_t qmax, const int NB) {
    for (int b = 0; b < NB; b++) {
        c->k[b] = C > 16 * b ? rq_tail16(C - 16 * b) : 0;   /* (rq_tail16 takes n >= 0) */
        c->mv[b] = rq_v_chan(mult, cs, 16 * b, c->k[b]);
        c->sv[b] = rq_v_chan(shift, cs, 16 * b, c->k[b]);
        c->f[b] = rq_f_double_ch(c->mv[b], c->sv[b], c->k[b], qmin - zp, qmax - zp);
        if (c->k[b] && !rq_f8_ok(&c->f[b], c->sv[b], c->k[b], qmin, qmax)) return 0;
    }
    for (int b = NB; b < 4 && NB != 3; b++)   /* block b: row b / NB of the register, channels of block b % NB */
        c->f[b] = c->f[b % NB], c->k[b] = c->k[b % NB], c->mv[b] = c->mv[b % NB], c->sv[b] = c->sv[b % NB];
    return 1;
}

/* one register: blocks 0 .. NU - 1 of exact int32 sums a[b] (lanes k[b]) requantized with c's block
 * b, the integer form for the distrusted blocks, as 64 int8 (lane b = block b; absent blocks 0) */
INL __m512i rq_f8_four(const __m512i *a, const int NU, const rq_f8_ch *c, const __mmask16 *k, const rq_f8_k *K,
                       __m512i lo32, __m512i hi32) {
    __m512i r[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    __m512 fr[4];
    for (int b = 0; b < NU; b++) fr[b] = rq_f8_block(a[b], &c->f[b], k[b], K, &r[b]);
    if (rq_f8_distrust(fr, NU, K))   /* the integer form for the distrusted blocks */
        for (int b = 0; b < NU; b++)
            if (rq_f8_distrust1(fr[b], K)) r[b] = rq_v_double_lazy(a[b], c->mv[b], c->sv[b], lo32, hi32);
    return rq_f8_pack4(r, K);
}

/* rq_tile_f8's register: nr (1..RPR) rows of the tile from acc (row stride lda) into o (row stride so) */
INL void rq_f8_rows(const int32_t *acc, int64_t lda, const int nr, const int NB, const rq_f8_ch *c,
                    const rq_f8_k *K, __m512i lo32, __m512i hi32, char *o, int64_t so, __mmask64 kst, int flat,
                    int64_t C) {
    const int RPR = NB == 1 ? 4 : (NB == 2 ? 2 : 1), NU = NB == 3 ? 3 : 4;
    __m512i r[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    __m512 fr[4];
    __mmask16 kr[4];
    for (int b = 0; b < NU; b++) {
        kr[b] = b / NB < nr ? c->k[b] : 0;   /* a missing row's block: zeros, not loaded, not stored */
        fr[b] = rq_f8_block(_mm512_maskz_loadu_epi32(kr[b], acc + (b / NB) * lda + 16 * (b % NB)), &c->f[b], kr[b],
                            K, &r[b]);
    }
    /* the integer form for the distrusted blocks, their sums read again from the tile: through
     * rq_f8_four, which keeps them live across the test, gcc 12's rq_tile had 655 stack operands
     * against 461 (rq_f8_four serves the fused GEMM epilogue, whose sums are in registers) */
    if (rq_f8_distrust(fr, NU, K))
        for (int b = 0; b < NU; b++)
            if (rq_f8_distrust1(fr[b], K))
                r[b] = rq_v_double_lazy(_mm512_maskz_loadu_epi32(kr[b], acc + (b / NB) * lda + 16 * (b % NB)),
                                        c->mv[b], c->sv[b], lo32, hi32);
    const __m512i v = rq_f8_pack4(r, K);
    if (RPR == 1) {
        if (C >= 64) _mm512_storeu_si512((void *)o, v);   /* the masked store costs more */
        else _mm512_mask_storeu_epi8(o, kst, v);
    } else if (flat && nr == RPR) {
        _mm512_storeu_si512((void *)o, v);
    } else if (RPR == 2) {
        _mm256_mask_storeu_epi8(o, (__mmask32)kst, _mm512_castsi512_si256(v));
        if (nr > 1) _mm256_mask_storeu_epi8(o + so, (__mmask32)kst, _mm512_extracti64x4_epi64(v, 1));
    } else {
        rq_f8_store4(v, nr, o, so, (__mmask16)kst);
    }
}

/* rq_tile_v_double's f8 form for a 1..64-column chunk, NB = ceil(C / 16) blocks of 16 (a
 * compile-time constant: rq_chunk_f8 instantiates 1..4).  One register holds four blocks: a row of
 * 64 columns, or 2 rows of <= 32 / 4 rows of <= 16 (RPR rows a register: MobileNetV2's 16- and
 * 32-channel layers pay the packing once per 64 values, not once a row).  Returns 0 (nothing
 * written) where a block's channels do not allow it. */
INL int rq_tile_f8(const int32_t *acc, int64_t lda, int64_t rows, const int32_t *mult, const int32_t *shift,
                   const int cs, int64_t C, int64_t zp, int64_t qmin, int64_t qmax, char *out, int64_t so, const int NB) {
    const int RPR = NB == 1 ? 4 : (NB == 2 ? 2 : 1);   /* rows a register */
    rq_f8_ch c;
    if (!rq_f8_ch_init(&c, mult, shift, cs, C, zp, qmin, qmax, NB)) return 0;
    const rq_f8_k K = rq_f8_init(zp, qmin, qmax);
    const int64_t w = 16 * (4 / RPR);   /* a row's bytes in the register */
    const __mmask64 kst = C >= w ? ~(__mmask64)0 >> (64 - w) : (((__mmask64)1 << C) - 1);
    const int flat = so == C && C == w;   /* the register's rows are adjacent in out: one store */
    const __m512i lo32 = _mm512_set1_epi32((int32_t)(qmin - zp)), hi32 = _mm512_set1_epi32((int32_t)(qmax - zp));
    int64_t i = 0;
    for (; i + RPR <= rows; i += RPR)   /* full registers: constant masks */
        rq_f8_rows(acc + i * lda, lda, RPR, NB, &c, &K, lo32, hi32, out + i * so, so, kst, flat, C);
    if (i < rows)
        rq_f8_rows(acc + i * lda, lda, (int)(rows - i), NB, &c, &K, lo32, hi32, out + i * so, so, kst, 0, C);
    return 1;
}

INL int rq_chunk_f8(const int32_t *acc, int64_t lda, int64_t rows, const int32_t *mult, const int32_t *shift,
                    const int cs, int64_t C, int64_t zp, int64_t qmin, int64_t qmax, char *out, int64_t so) {
    switch ((C + 15) / 16) {
    case 1: return rq_tile_f8(acc, lda, rows, mult, shift, cs, C, zp, qmin, qmax, out, so, 1);
    case 2: return rq_tile_f8(acc, lda, rows, mult, shift, cs, C, zp, qmin, qmax, out, so, 2);
    case 3: return rq_tile_f8(acc, lda, rows, mult, shift, cs, C, zp, qmin, qmax, out, so, 3);
    default: return rq_tile_f8(acc, lda, rows, mult, shift, cs, C, zp, qmin, qmax, out, so, 4);
    }
}

/* rows x C int32 accumulators (row stride lda) into output rows (row stride so), the double
 * rounding (mode 0): rq_row_v's arithmetic with the per-channel part formed once per 16 columns for
 * all the rows, not once per row (a pointwise conv's GEMM tile: ~1/3 of the requantization's work).
 * Where FAST (no offset to add: the tile holds whole accumulators): int8 outputs through
 * rq_chunk_f8 64 columns at a time, else (or where a chunk's channels do not allow that) 16 at a
 * time through rq_f_double where the channels allow it, else the integer form. */
INL void rq_tile_v_double(const int32_t *acc, int64_t lda, int64_t rows, const int32_t *mult, const int32_t *shift,
                          const int cs, const int64_t *off, int64_t C, int64_t zp, int64_t qmin, int64_t qmax,
                          char *out, int64_t so, const int out16, const int fast) {
    const __m512i lo32 = _mm512_set1_epi32((int32_t)(qmin - zp)), hi32 = _mm512_set1_epi32((int32_t)(qmax - zp));
    const __m512i vzp = _mm512_set1_epi32((int32_t)zp);
    const int oe = out16 ? 2 : 1;
    int64_t c1 = 0;   /* columns below c1 written 64 at a time */
    for (int64_t c = 0; c < C; c += 16) {
        if (c >= c1 && fast && !off && !out16) {
            const int64_t n = C - c < 64 ? C - c : 64;
            if (rq_chunk_f8(acc + c, lda, rows, mult + c * cs, shift + c * cs, cs, n, zp, qmin, qmax, out + c, so)) {
                c1 = c + n;
                c += n - 16;
                continue;
            }
            c1 = c + n;   /* not for these channels: 16 at a time below */
        }
        const __mmask16 k = rq_tail16(C - c);
        const __m512i mv = rq_v_chan(mult, cs, c, k), sv = rq_v_chan(shift, cs, c, k);
        const rq_f_ch fc = rq_f_double_ch(mv, sv, k, qmin - zp, qmax - zp);
        if (fast && !off && !out16 && fc.ok) {
            for (int64_t i = 0; i < rows; i++) {
                const __m512i a = _mm512_maskz_loadu_epi32(k, acc + i * lda + c);
                __m512i r;
                if (rq_f_double(_mm512_cvtepi32_ps(a), &fc, &r) & k) r = rq_v_double_lazy(a, mv, sv, lo32, hi32);
                rq_v_store(out + (i * so + c) * oe, out16, _mm512_add_epi32(r, vzp), k);
            }
            continue;
        }
        const rq_v_dch ch = rq_v_double_ch(mv, sv);
        const int64_t *oc = off ? off + c : NULL;
        for (int64_t i = 0; i < rows; i++) {
            __m512i r = rq_v_double_pre(rq_v_acc32(acc + i * lda + c, oc, k), &ch);
            r = _mm512_max_epi32(_mm512_min_epi32(r, hi32), lo32);
            rq_v_store(out + (i * so + c) * oe, out16, _mm512_add_epi32(r, vzp), k);
        }
    }
}
#endif /* TSR_AVX512 */

#endif /* TESSERA_REQUANT_H */
