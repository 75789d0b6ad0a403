/* add_int8.c -- tessera.add_int8's native CPU kernel (framework-free C11): TFLite's quantized
 * ADD on flat int8 / int16 runs (the launcher lays both operands out in the output's order).
 *
 *   y = clamp(MBQM(sat32(MBQM((a - za) 2^L, ma, sa) + MBQM((b - zb) 2^L, mb, sb)), mo, so) + zo,
 *             qmin, qmax)
 *
 * MBQM is tessera_requant.h's double rounding (mbqm_double; 16 lanes a step with AVX-512:
 * rq_v_double_pre, bit-identical).  (x - z) 2^L never overflows int32 (the op checks
 * max|x - z| 2^L < 2^31), so it is a plain multiply.  The int32 sum of the two scaled inputs is
 * saturated; whether it can overflow at all is decided once per call from the extremes of the
 * codes (MBQM is monotonic in its input, so the largest |ra| is at an end of the code range), and
 * the vector loop adds without the saturation check where it cannot (TFLite's parameters:
 * multipliers below one, |ra| <= 2^28).
 */
#include "tessera_requant.h"

typedef struct {
    int32_t za, ma, sa, zb, mb, sb, mo, so, zo, lo, hi, scale;   /* lo / hi: qmin - zo, qmax - zo; scale 2^L */
} add_p;

static inline int32_t add_one(int32_t xa, int32_t xb, const add_p *P) {
    const int32_t ra = mbqm_double((xa - P->za) * P->scale, P->ma, P->sa);
    const int32_t rb = mbqm_double((xb - P->zb) * P->scale, P->mb, P->sb);
    const int64_t s = (int64_t)ra + rb;
    const int32_t raw = (int32_t)(s > INT32_MAX ? INT32_MAX : (s < INT32_MIN ? INT32_MIN : s));
    return clamp32(mbqm_double(raw, P->mo, P->so), P->lo, P->hi) + P->zo;
}

/* the largest |MBQM((x - z) 2^L, m, s)| over the codes x in [xlo, xhi] */
static int64_t max_scaled(int32_t xlo, int32_t xhi, int32_t z, int32_t m, int32_t s, int32_t scale) {
    const int64_t r0 = mbqm_double((xlo - z) * scale, m, s), r1 = mbqm_double((xhi - z) * scale, m, s);
    const int64_t a0 = r0 < 0 ? -r0 : r0, a1 = r1 < 0 ? -r1 : r1;
    return a0 > a1 ? a0 : a1;
}

static void add_range_scalar(const char *a, const char *b, char *out, int64_t i0, int64_t i1, int bits16,
                             const add_p *P) {
    if (bits16) {
        const int16_t *x = (const int16_t *)a, *y = (const int16_t *)b;
        for (int64_t i = i0; i < i1; i++) ((int16_t *)out)[i] = (int16_t)add_one(x[i], y[i], P);
    } else {
        const int8_t *x = (const int8_t *)a, *y = (const int8_t *)b;
        for (int64_t i = i0; i < i1; i++) ((int8_t *)out)[i] = (int8_t)add_one(x[i], y[i], P);
    }
}

#ifdef TSR_AVX512
typedef struct {
    rq_v_dch ca, cb, co;   /* MBQM's per-(m, s) parts */
    __m512i za, zb, scale, zo, lo, hi;
} add_v;

static inline __m512i load16(const char *p, int64_t i, int bits16, __mmask16 k) {
    return bits16 ? _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(k, (const int16_t *)p + i))
                  : _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, (const int8_t *)p + i));
}

static void add_range_v(const char *a, const char *b, char *out, int64_t i0, int64_t i1, int bits16, int sat,
                        const add_v *V) {
    for (int64_t i = i0; i < i1; i += 16) {
        const __mmask16 k = i1 - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (i1 - i)) - 1u);
        const __m512i xa = _mm512_mullo_epi32(_mm512_sub_epi32(load16(a, i, bits16, k), V->za), V->scale);
        const __m512i xb = _mm512_mullo_epi32(_mm512_sub_epi32(load16(b, i, bits16, k), V->zb), V->scale);
        const __m512i ra = rq_v_double_pre(xa, &V->ca), rb = rq_v_double_pre(xb, &V->cb);
        __m512i s = _mm512_add_epi32(ra, rb);
        if (sat) {   /* signed overflow iff ra and rb share a sign that s lacks: INT32_MAX / MIN by ra's sign */
            const __mmask16 ovf = _mm512_movepi32_mask(_mm512_and_si512(_mm512_xor_si512(ra, s),
                                                                        _mm512_xor_si512(rb, s)));
            s = _mm512_mask_mov_epi32(s, ovf, _mm512_xor_si512(_mm512_srai_epi32(ra, 31),
                                                               _mm512_set1_epi32(INT32_MAX)));
        }
        __m512i r = rq_v_double_pre(s, &V->co);
        r = _mm512_add_epi32(_mm512_max_epi32(_mm512_min_epi32(r, V->hi), V->lo), V->zo);
        rq_v_store(out + i * (bits16 ? 2 : 1), bits16, r, k);
    }
}
#endif

/* out[i] = add(a[i], b[i]) for i < n; bits 8 or 16 (the codes' dtype) */
int tsr_add_int8(const void *a, const void *b, int64_t n, int bits, int za, int ma, int sa, int zb, int mb, int sb,
                 int mo, int so, int zo, int qmin, int qmax, int left, void *out, int nthreads) {
    const add_p P = {za, ma, sa, zb, mb, sb, mo, so, zo, qmin - zo, qmax - zo, (int32_t)1 << left};
    const int bits16 = bits == 16;
    const int32_t xlo = bits16 ? INT16_MIN : INT8_MIN, xhi = bits16 ? INT16_MAX : INT8_MAX;
    const int sat = max_scaled(xlo, xhi, za, ma, sa, P.scale) + max_scaled(xlo, xhi, zb, mb, sb, P.scale) > INT32_MAX;
#ifdef TSR_AVX512
    add_v V;
    V.ca = rq_v_double_ch(_mm512_set1_epi32(ma), _mm512_set1_epi32(sa));
    V.cb = rq_v_double_ch(_mm512_set1_epi32(mb), _mm512_set1_epi32(sb));
    V.co = rq_v_double_ch(_mm512_set1_epi32(mo), _mm512_set1_epi32(so));
    V.za = _mm512_set1_epi32(za), V.zb = _mm512_set1_epi32(zb), V.scale = _mm512_set1_epi32(P.scale);
    V.zo = _mm512_set1_epi32(zo), V.lo = _mm512_set1_epi32(P.lo), V.hi = _mm512_set1_epi32(P.hi);
#else
    (void)sat;
#endif
    enum { BLK = 4096 };   /* elements per work item: a multiple of 16 */
    const int64_t nblk = (n + BLK - 1) / BLK;
    TSR_TEAM(tsr_threads(nthreads), , {
_Pragma("omp for schedule(static)")
        for (int64_t blk = 0; blk < nblk; blk++) {
            const int64_t i0 = blk * BLK, i1 = i0 + BLK < n ? i0 + BLK : n;
#ifdef TSR_AVX512
            add_range_v((const char *)a, (const char *)b, (char *)out, i0, i1, bits16, sat, &V);
#else
            add_range_scalar((const char *)a, (const char *)b, (char *)out, i0, i1, bits16, &P);
#endif
        }
    });
    return TSR_OK;
}

