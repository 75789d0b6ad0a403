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
                             const add_p *Pp) {
    const add_p p = *Pp, *P = &p;   /* a local copy: the int8 stores cannot alias it (they could *Pp) */
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
        const __mmask16 k = rq_tail16(i1 - i);
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

/* int8 codes, AVX-512 VBMI: ra and rb depend on one byte each, so they are looked up instead of
 * computed.  Each int32 table of 256 entries is held as four byte planes (plane p = byte p of
 * every entry, 4 zmm); VPERMI2B looks a plane up for 64 codes at once (two 128-entry halves,
 * selected by the code's top bit), and two rounds of byte / word unpacks turn the four planes
 * into 4 x 16 int32.  Those unpacks work inside 128-bit lanes, so vector j holds the elements
 * 16 L + 4 j .. 16 L + 4 j + 3 of lane L; the output's MBQM is elementwise, and the saturating
 * packs (dword -> word -> byte) also work inside lanes, in the inverse order, so the 64 output
 * bytes come back in memory order.  Packing saturates to int16, the zero point is added with
 * int16 saturation and the int8 pack saturates again before the clamp to [qmin, qmax]: each step
 * is monotonic and exact inside the int8 range, so the result is clamp(r + zo, qmin, qmax).
 * ~2x the 16-lane loop's speed (which computes the two input MBQMs: 2/3 of its work). */
#define VBMI_TARGET __attribute__((target("avx512vbmi,avx512f,avx512bw,avx512vl,avx512dq")))

typedef struct {
    __m512i a[4][4], b[4][4];   /* [plane][64-entry quarter] */
} add_tab;

VBMI_TARGET static void tab_planes(int32_t z, int32_t scale, const rq_v_dch *c, __m512i planes[4][4]) {
    uint8_t bytes[4][256] __attribute__((aligned(64)));
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int u0 = 0; u0 < 256; u0 += 16) {   /* entry u: the code (int8)u */
        const __m512i code = _mm512_srai_epi32(_mm512_slli_epi32(_mm512_add_epi32(iota, _mm512_set1_epi32(u0)), 24), 24);
        const __m512i r = rq_v_double_pre(_mm512_mullo_epi32(_mm512_sub_epi32(code, _mm512_set1_epi32(z)),
                                                             _mm512_set1_epi32(scale)), c);
        for (int p = 0; p < 4; p++)
            _mm_store_si128((__m128i *)(bytes[p] + u0), _mm512_cvtepi32_epi8(_mm512_srli_epi32(r, 8 * p)));
    }
    for (int p = 0; p < 4; p++)
        for (int q = 0; q < 4; q++) planes[p][q] = _mm512_load_si512((const void *)(bytes[p] + 64 * q));
}

/* 64 looked-up int32 as 4 vectors (lane order above) */
VBMI_TARGET static inline void tab_lookup(__m512i x, const __m512i t[4][4], __m512i r[4]) {
    const __mmask64 top = _mm512_movepi8_mask(x);
    __m512i p[4];
    for (int j = 0; j < 4; j++)
        p[j] = _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(t[j][0], x, t[j][1]),
                                      _mm512_permutex2var_epi8(t[j][2], x, t[j][3]));
    const __m512i w01l = _mm512_unpacklo_epi8(p[0], p[1]), w01h = _mm512_unpackhi_epi8(p[0], p[1]);
    const __m512i w23l = _mm512_unpacklo_epi8(p[2], p[3]), w23h = _mm512_unpackhi_epi8(p[2], p[3]);
    r[0] = _mm512_unpacklo_epi16(w01l, w23l), r[1] = _mm512_unpackhi_epi16(w01l, w23l);
    r[2] = _mm512_unpacklo_epi16(w01h, w23h), r[3] = _mm512_unpackhi_epi16(w01h, w23h);
}

VBMI_TARGET static void add_range_tab(const int8_t *a, const int8_t *b, int8_t *out, int64_t i0, int64_t i1,
                                      int sat, const add_tab *T, const add_v *V, const add_p *P) {
    const __m512i zo16 = _mm512_set1_epi16((int16_t)P->zo);
    const __m512i lo8 = _mm512_set1_epi8((int8_t)(P->lo + P->zo)), hi8 = _mm512_set1_epi8((int8_t)(P->hi + P->zo));
    for (int64_t i = i0; i < i1; i += 64) {
        const __mmask64 k = _cvtu64_mask64(i1 - i >= 64 ? ~0ULL : (~0ULL >> (64 - (i1 - i))));
        __m512i ra[4], rb[4], r[4];
        tab_lookup(_mm512_maskz_loadu_epi8(k, a + i), T->a, ra);
        tab_lookup(_mm512_maskz_loadu_epi8(k, b + i), T->b, rb);
        for (int j = 0; j < 4; j++) {
            __m512i s = _mm512_add_epi32(ra[j], rb[j]);
            if (sat) {
                const __mmask16 ovf = _mm512_movepi32_mask(_mm512_and_si512(_mm512_xor_si512(ra[j], s),
                                                                            _mm512_xor_si512(rb[j], s)));
                s = _mm512_mask_mov_epi32(s, ovf, _mm512_xor_si512(_mm512_srai_epi32(ra[j], 31),
                                                                   _mm512_set1_epi32(INT32_MAX)));
            }
            r[j] = rq_v_double_pre(s, &V->co);
        }
        const __m512i w01 = _mm512_adds_epi16(_mm512_packs_epi32(r[0], r[1]), zo16);
        const __m512i w23 = _mm512_adds_epi16(_mm512_packs_epi32(r[2], r[3]), zo16);
        const __m512i y = _mm512_max_epi8(_mm512_min_epi8(_mm512_packs_epi16(w01, w23), hi8), lo8);
        _mm512_mask_storeu_epi8(out + i, k, y);
    }
}
#endif

/* out[i] = add(a[i], b[i]) for i < n; bits 8 or 16 (the codes' dtype); table: allow the int8
 * lookup path (0: the 16-lane loop, for tests) */
int tsr_add_int8(const void *a, const void *b, int64_t n, int bits, int za, int ma, int sa, int zb, int mb, int sb,
                 int mo, int so, int zo, int qmin, int qmax, int left, int table, void *out, int nthreads) {
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
    add_tab T;
    table = table && !bits16 && __builtin_cpu_supports("avx512vbmi");
    if (table) {
        tab_planes(za, P.scale, &V.ca, T.a);
        tab_planes(zb, P.scale, &V.cb, T.b);
    }
#else
    (void)sat, (void)table;
#endif
    enum { BLK = 4096 };   /* elements per work item: a multiple of 16 */
    const int64_t nblk = (n + BLK - 1) / BLK;
    TSR_TEAM(tsr_threads(nthreads), , {
_Pragma("omp for schedule(static)")
        for (int64_t blk = 0; blk < nblk; blk++) {
            const int64_t i0 = blk * BLK, i1 = i0 + BLK < n ? i0 + BLK : n;
#ifdef TSR_AVX512
            if (table)
                add_range_tab((const int8_t *)a, (const int8_t *)b, (int8_t *)out, i0, i1, sat, &T, &V, &P);
            else
                add_range_v((const char *)a, (const char *)b, (char *)out, i0, i1, bits16, sat, &V);
#else
            add_range_scalar((const char *)a, (const char *)b, (char *)out, i0, i1, bits16, &P);
#endif
        }
    });
    return TSR_OK;
}

