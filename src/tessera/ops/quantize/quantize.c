/* quantize_blocks: block-wise quantisation by the integer contract (tessera/quant/contract.py,
 * csrc/tessera_quant.h), bit-identical to the torch reference in ref.py.
 *
 * x: M rows of K values (row stride ldx elements, fp32/fp16/bf16).  Scale block (bi, kb)
 * covers rows [bi*br, bi*br+br) x columns [kb*bc, kb*bc+bc), edge blocks partial; scale and
 * zero are [Mb, Kb] row-major.  Codes are written row-major: int8 / int16 / fp8 bits (1 byte)
 * [M, K], or 4-bit codes packed two per byte [M, K/2] (byte j = c[2j] | c[2j+1] << 4).
 *
 * Per-row blocks (br == 1) run in one pass: each thread loads a row into an fp32 scratch row
 * (L1/L2 resident), computes the statistics of its column blocks, the scales, then the codes.
 * Multi-row blocks (per-tensor, 128x128) need every row of a block first: pass 1 stores the
 * per-(row, column block) statistics, they are merged in row order per block (so "first
 * occurrence" ties resolve row-major, as in the reference), pass 2 re-reads x for the codes.
 *
 * Rules per kind (NaN counts as 0 everywhere, divisions are IEEE fp32 divisions -- the file is
 * built without -ffast-math/-freciprocal-math):
 *   I8/I16/I4/E4M3/E5M2/FNUZ : scale = max(amax, 1e-12f) / QMAX (127, 32767, 7, 448, 57344, 240)
 *   I4ZP                : lo = min(x, 0), hi = max(x, 0), scale = max(hi - lo, 1e-12f) / 15,
 *                         zero = sat(rint(-lo / scale), 0, 15), code = sat(rint(x/s) + zero, 0, 15)
 *   Q40 (ggml Q4_0)     : m = first entry of largest |x|, scale = copysign(max(|m|,1e-12f), m) / -8
 *   codes               : int: sat(rint(x / scale)) (+8 offset for I4/Q40); fp8: RNE encode.
 *
 * Portable C everywhere; AVX-512 (and AVX2 for the statistics) fast paths for the block
 * statistics, the integer codes and the fp8 encoders, each the same bits as the scalar code
 * (max/min are exact, the conversions round to nearest even, NaN lanes are zeroed first);
 * NEON (tessera_neon.h / tessera_quant.h) for the statistics and the integer codes; RVV 1.0
 * (tessera_rvv.h, vector-length agnostic) for the statistics, the integer codes and the fp8
 * encoders.  fp32 rows are read in place (fp16/bf16 rows are converted into the scratch row).
 */
#include "tessera_quant.h"

enum { QK_I8 = 0, QK_I16 = 1, QK_I4 = 2, QK_I4ZP = 3, QK_Q40 = 4, QK_E4M3 = 5, QK_E5M2 = 6, QK_FNUZ = 7 };

/* fp32 -> AMD float8_e4m3fnuz bits (bias 8, max 240, no inf, NaN = 0x80, no negative zero),
 * saturating, round to nearest even, subnormals (multiples of 2^-10 below 2^-7); NaN -> 0.
 * Same construction as tsr_f32_to_e4m3 with the exponent bias moved by one. */
static inline uint8_t f32_to_e4m3fnuz(float q) {
    q = tsr_nan0(q);
    q = q < -240.0f ? -240.0f : (q > 240.0f ? 240.0f : q);
    const float a = fabsf(q);
    const uint32_t u = tsr_bits(a);
    uint32_t code;
    if (a < 0.0078125f) {
        code = (uint32_t)rintf(a * 1024.0f);
    } else {
        const uint32_t r = u + 0x7ffffu + ((u >> 20) & 1u);
        code = (((r >> 23) - 119u) << 3) | ((r >> 20) & 7u);
    }
    return (uint8_t)(code | (code && q < 0.0f ? 0x80u : 0u));
}

typedef struct { float a, b; } qstat;   /* amax (, signed max for Q40) | lo, hi for I4ZP */

/* max |x| (NaN as 0) and, with lohi, min(x, 0) / max(x, 0) (NaN as 0).  The AVX-512 / AVX2
 * paths rely on VMAXPS/VMINPS returning the second operand when either is NaN: the accumulator
 * (which starts at 0) is kept, exactly as counting NaN as 0.  max/min are exact, so the
 * vector and scalar paths give the same bits. */
static inline float span_absmax(const float *restrict x, int64_t n) {
    int64_t i = 0;
    float amax = 0.0f;
#if defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i)), a0);
        a1 = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i + 16)), a1);
    }
    amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
#elif defined(__AVX2__)
    const __m256 mag = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), mag), a0);
        a1 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i + 8), mag), a1);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_max_ps(a0, a1));
    for (int k = 0; k < 8; k++) amax = lanes[k] > amax ? lanes[k] : amax;
#elif defined(TSR_NEON) || defined(TSR_RVV)
    return tsr_absmax(x, n);   /* tessera_quant.h's NEON / RVV loop (NaN lanes zeroed / masked out) */
#endif
    for (; i < n; i++) {
        const float a = tsr_nan0(fabsf(x[i]));
        amax = a > amax ? a : amax;
    }
    return amax;
}

static inline void span_lohi(const float *restrict x, int64_t n, float *lo_out, float *hi_out) {
    int64_t i = 0;
    float lo = 0.0f, hi = 0.0f;
#if defined(__AVX512F__)
    __m512 l = _mm512_setzero_ps(), h = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        l = _mm512_min_ps(v, l);
        h = _mm512_max_ps(v, h);
    }
    lo = _mm512_reduce_min_ps(l);
    hi = _mm512_reduce_max_ps(h);
#elif defined(__AVX2__)
    __m256 l = _mm256_setzero_ps(), h = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        l = _mm256_min_ps(v, l);
        h = _mm256_max_ps(v, h);
    }
    float ll[8], hh[8];
    _mm256_storeu_ps(ll, l);
    _mm256_storeu_ps(hh, h);
    for (int k = 0; k < 8; k++) {
        lo = ll[k] < lo ? ll[k] : lo;
        hi = hh[k] > hi ? hh[k] : hi;
    }
#elif defined(TSR_NEON)
    float32x4_t l = vdupq_n_f32(0.0f), h = l;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(x + i);
        const float32x4_t w = vreinterpretq_f32_u32(vandq_u32(vceqq_f32(v, v), vreinterpretq_u32_f32(v)));  /* NaN -> 0 */
        l = vminq_f32(l, w);
        h = vmaxq_f32(h, w);
    }
    lo = vminvq_f32(l);
    hi = vmaxvq_f32(h);
#elif defined(TSR_RVV)
    tsr_rvv_lohi(x, n, lo_out, hi_out);   /* tessera_rvv.h: all n */
    return;
#endif
    for (; i < n; i++) {
        const float v = tsr_nan0(x[i]);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    *lo_out = lo;
    *hi_out = hi;
}

static inline qstat stat_span(const float *restrict x, int64_t n, int kind) {
    qstat s = {0.0f, 0.0f};
    if (kind == QK_I4ZP) {
        span_lohi(x, n, &s.a, &s.b);
    } else {
        s.a = span_absmax(x, n);
        if (kind == QK_Q40 && s.a > 0.0f) {   /* the first entry of largest magnitude */
            int64_t i = 0;
            while (tsr_nan0(fabsf(x[i])) != s.a) i++;
            s.b = x[i];
        }
    }
    return s;
}

/* s followed (in row-major order) by t */
static inline qstat stat_merge(qstat s, qstat t, int kind) {
    if (kind == QK_I4ZP) {
        s.a = t.a < s.a ? t.a : s.a;
        s.b = t.b > s.b ? t.b : s.b;
    } else if (kind == QK_Q40) {
        if (t.a > s.a) s = t;
    } else {
        s.a = t.a > s.a ? t.a : s.a;
    }
    return s;
}

static inline float qmax_of(int kind) {
    switch (kind) {
    case QK_I8: return 127.0f;
    case QK_I16: return 32767.0f;
    case QK_E4M3: return 448.0f;
    case QK_E5M2: return 57344.0f;
    case QK_FNUZ: return 240.0f;
    default: return 7.0f;
    }
}

static inline float block_scale(qstat s, int kind, uint8_t *zero) {
    if (kind == QK_I4ZP) {
        const float sc = fmaxf(s.b - s.a, TSR_QEPS) / 15.0f;
        *zero = (uint8_t)tsr_quant_int(-s.a / sc, 0.0f, 15.0f);
        return sc;
    }
    if (kind == QK_Q40) {
        const float ma = fmaxf(s.a, TSR_QEPS);
        return (s.b < 0.0f ? -ma : ma) / -8.0f;
    }
    return tsr_scale_for(s.a, qmax_of(kind));
}

#if defined(__AVX512F__)
/* 16 integer codes sat(rint(nan0(x / s)), lo, hi) (+ off), as tsr_quant_int: IEEE division,
 * NaN lanes zeroed, clamp, then a conversion rounding to nearest even.  The compiler's own
 * vectorisation of the scalar loop spills mask registers; this is ~3x faster. */
static inline __m512i q16(const float *x, __m512 s, __m512 lo, __m512 hi, __m512i off) {
    __m512 q = _mm512_div_ps(_mm512_loadu_ps(x), s);
    q = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(q, q, _CMP_ORD_Q), q);
    q = _mm512_min_ps(_mm512_max_ps(q, lo), hi);
    return _mm512_add_epi32(_mm512_cvt_roundps_epi32(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), off);
}
#endif

#if defined(__AVX512F__)
/* 16 fp8 codes of x / s: the integer-op encoders of tessera_quant.h (tsr_f32_to_e4m3 /
 * _e5m2, f32_to_e4m3fnuz above) lane-wise -- saturate, RNE to `mb` mantissa bits by adding
 * half an ulp (+1 on odd), rebias; subnormals by rint(|q| * 2^k) -- the same bits. */
static inline __m512i fp8_16(const float *x, __m512 s, float qmax, int mb, uint32_t bias, float sub_lim,
                             float sub_mul, int fnuz) {
    __m512 q = _mm512_div_ps(_mm512_loadu_ps(x), s);
    q = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(q, q, _CMP_ORD_Q), q);
    q = _mm512_min_ps(_mm512_max_ps(q, _mm512_set1_ps(-qmax)), _mm512_set1_ps(qmax));
    const __m512 a = _mm512_abs_ps(q);
    const __m512i u = _mm512_castps_si512(a);
    const int sh = 23 - mb;
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32((1 << (sh - 1)) - 1)),
                                       _mm512_and_si512(_mm512_srli_epi32(u, sh), _mm512_set1_epi32(1)));
    const __m512i normal = _mm512_or_si512(
        _mm512_slli_epi32(_mm512_sub_epi32(_mm512_srli_epi32(r, 23), _mm512_set1_epi32((int)bias)), mb),
        _mm512_and_si512(_mm512_srli_epi32(r, sh), _mm512_set1_epi32((1 << mb) - 1)));
    const __m512i sub = _mm512_cvt_roundps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(sub_mul)),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512i code = _mm512_mask_mov_epi32(normal, _mm512_cmp_ps_mask(a, _mm512_set1_ps(sub_lim), _CMP_LT_OQ), sub);
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(q), 24), _mm512_set1_epi32(0x80));
    if (fnuz) sign = _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(code, code), sign);   /* no -0 */
    return _mm512_or_si512(code, sign);
}
#endif

#if defined(TSR_RVV)
/* fp8 codes of x[0:n) / s, vector-length agnostic (LMUL 4 for the fp32 side): fp8_16 above with
 * RVV 1.0 -- IEEE division, NaN lanes to 0 (the clamp runs on ordered lanes only), saturate,
 * RNE to `mb` mantissa bits by integer add, rebias; subnormals by vfcvt.x.f (round to nearest
 * even: rintf) of |q| * 2^k, exact; the same bits as tsr_f32_to_e4m3 / _e5m2 / f32_to_e4m3fnuz. */
static void rvv_fp8(const float *restrict x, int64_t n, float s, float qmax, int mb, uint32_t bias, float sub_lim,
                    float sub_mul, int fnuz, uint8_t *restrict o) {
    const vfloat32m4_t zero = __riscv_vfmv_v_f_f32m4(0.0f, __riscv_vsetvlmax_e32m4());
    const int sh = 23 - mb;
    for (int64_t i = 0; i < n;) {
        const size_t vl = __riscv_vsetvl_e32m4((size_t)(n - i));
        vfloat32m4_t q = __riscv_vfdiv_vf_f32m4(__riscv_vle32_v_f32m4(x + i, vl), s, vl);
        const vbool8_t ok = __riscv_vmfeq_vv_f32m4_b8(q, q, vl);
        q = __riscv_vfmin_vf_f32m4(__riscv_vfmax_vf_f32m4_mu(ok, zero, q, -qmax, vl), qmax, vl);
        const vfloat32m4_t a = __riscv_vfabs_v_f32m4(q, vl);
        const vuint32m4_t u = __riscv_vreinterpret_v_f32m4_u32m4(a);
        const vuint32m4_t r = __riscv_vadd_vv_u32m4(
            __riscv_vadd_vx_u32m4(u, (1u << (sh - 1)) - 1u, vl),
            __riscv_vand_vx_u32m4(__riscv_vsrl_vx_u32m4(u, (size_t)sh, vl), 1u, vl), vl);
        vuint32m4_t code = __riscv_vor_vv_u32m4(
            __riscv_vsll_vx_u32m4(__riscv_vsub_vx_u32m4(__riscv_vsrl_vx_u32m4(r, 23, vl), bias, vl), (size_t)mb, vl),
            __riscv_vand_vx_u32m4(__riscv_vsrl_vx_u32m4(r, (size_t)sh, vl), (1u << mb) - 1u, vl), vl);
        const vuint32m4_t sub = __riscv_vreinterpret_v_i32m4_u32m4(
            __riscv_vfcvt_x_f_v_i32m4(__riscv_vfmul_vf_f32m4(a, sub_mul, vl), vl));
        code = __riscv_vmerge_vvm_u32m4(code, sub, __riscv_vmflt_vf_f32m4_b8(a, sub_lim, vl), vl);
        vuint32m4_t sign = __riscv_vand_vx_u32m4(
            __riscv_vsrl_vx_u32m4(__riscv_vreinterpret_v_f32m4_u32m4(q), 24, vl), 0x80u, vl);
        if (fnuz) sign = __riscv_vmerge_vxm_u32m4(sign, 0u, __riscv_vmseq_vx_u32m4_b8(code, 0u, vl), vl);  /* no -0 */
        code = __riscv_vor_vv_u32m4(code, sign, vl);
        __riscv_vse8_v_u8m1(o + i, __riscv_vncvt_x_x_w_u8m1(__riscv_vncvt_x_x_w_u16m2(code, vl), vl), vl);
        i += (int64_t)vl;
    }
}
#endif

static void quant_fp8(const float *restrict x, int64_t n, float s, int kind, uint8_t *restrict o) {
    int64_t i = 0;
#if defined(TSR_RVV)
    if (kind == QK_E4M3) rvv_fp8(x, n, s, 448.0f, 3, 120, 0.015625f, 512.0f, 0, o);
    else if (kind == QK_E5M2) rvv_fp8(x, n, s, 57344.0f, 2, 112, 6.103515625e-05f, 65536.0f, 0, o);
    else rvv_fp8(x, n, s, 240.0f, 3, 119, 0.0078125f, 1024.0f, 1, o);
    return;
#endif
#if defined(__AVX512F__)
    const __m512 sv = _mm512_set1_ps(s);
    if (kind == QK_E4M3)
        for (; i + 16 <= n; i += 16)
            _mm_storeu_si128((__m128i *)(o + i), _mm512_cvtepi32_epi8(fp8_16(x + i, sv, 448.0f, 3, 120, 0.015625f, 512.0f, 0)));
    else if (kind == QK_E5M2)
        for (; i + 16 <= n; i += 16)
            _mm_storeu_si128((__m128i *)(o + i),
                             _mm512_cvtepi32_epi8(fp8_16(x + i, sv, 57344.0f, 2, 112, 6.103515625e-05f, 65536.0f, 0)));
    else
        for (; i + 16 <= n; i += 16)
            _mm_storeu_si128((__m128i *)(o + i), _mm512_cvtepi32_epi8(fp8_16(x + i, sv, 240.0f, 3, 119, 0.0078125f, 1024.0f, 1)));
#endif
    for (; i < n; i++)
        o[i] = kind == QK_E4M3 ? tsr_f32_to_e4m3(x[i] / s) : kind == QK_E5M2 ? tsr_f32_to_e5m2(x[i] / s)
                                                                             : f32_to_e4m3fnuz(x[i] / s);
}

/* integer codes of x[0:n): 1-byte (out16 == 0) or 2-byte, sat(rint(x / s), lo, hi) + off */
static void quant_ints(const float *restrict x, int64_t n, float s, float lo, float hi, int off, int out16,
                       void *restrict dst) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 sv = _mm512_set1_ps(s), lv = _mm512_set1_ps(lo), hv = _mm512_set1_ps(hi);
    const __m512i ov = _mm512_set1_epi32(off);
    if (out16)
        for (; i + 16 <= n; i += 16)
            _mm256_storeu_si256((__m256i *)((int16_t *)dst + i), _mm512_cvtepi32_epi16(q16(x + i, sv, lv, hv, ov)));
    else
        for (; i + 16 <= n; i += 16)
            _mm_storeu_si128((__m128i *)((uint8_t *)dst + i), _mm512_cvtepi32_epi8(q16(x + i, sv, lv, hv, ov)));
#elif defined(TSR_NEON)
    i = tsr_neon_quant_ints(x, n, s, lo, hi, off, out16, dst);   /* tessera_neon.h */
#elif defined(TSR_RVV)
    i = tsr_rvv_quant_ints(x, n, s, lo, hi, off, out16, dst);    /* tessera_rvv.h: all n */
#endif
    if (out16) {
        int16_t *o = (int16_t *)dst;
        for (; i < n; i++) o[i] = (int16_t)(tsr_quant_int(x[i] / s, lo, hi) + off);
    } else {
        uint8_t *o = (uint8_t *)dst;
        for (; i < n; i++) o[i] = (uint8_t)(tsr_quant_int(x[i] / s, lo, hi) + off);
    }
}

/* codes of x[0:n) with one scale (and zero); dst points at the first code (1- or 2-byte codes)
 * or, for the 4-bit kinds, into an unpacked uint8 scratch row */
static void quant_span(const float *restrict x, int64_t n, int kind, float s, int z, void *restrict dst) {
    switch (kind) {
    case QK_I8: quant_ints(x, n, s, -127.0f, 127.0f, 0, 0, dst); break;
    case QK_I16: quant_ints(x, n, s, -32767.0f, 32767.0f, 0, 1, dst); break;
    case QK_I4: case QK_Q40: quant_ints(x, n, s, -8.0f, 7.0f, 8, 0, dst); break;
    case QK_I4ZP: quant_ints(x, n, s, (float)-z, (float)(15 - z), z, 0, dst); break;
    default: quant_fp8(x, n, s, kind, (uint8_t *)dst); break;
    }
}

static inline int is4(int kind) { return kind == QK_I4 || kind == QK_I4ZP || kind == QK_Q40; }
static inline int code_size(int kind) { return kind == QK_I16 ? 2 : 1; }

/* codes of one fp32 row (scales of its block row: sc[0:Kb], zero z[0:Kb] or NULL) */
static void quant_row(const float *restrict xr, int64_t K, int64_t bc, int64_t Kb, int kind,
                      const float *sc, const uint8_t *z, uint8_t *restrict tmp, void *restrict out) {
    const int cs = code_size(kind);
    for (int64_t kb = 0; kb < Kb; kb++) {
        const int64_t j0 = kb * bc, n = (j0 + bc <= K ? bc : K - j0);
        void *d = is4(kind) ? (void *)(tmp + j0) : (void *)((char *)out + j0 * cs);
        quant_span(xr + j0, n, kind, sc[kb], z ? z[kb] : 0, d);
    }
    if (is4(kind)) {
        uint8_t *o = (uint8_t *)out;
#pragma omp simd
        for (int64_t j = 0; j < K / 2; j++) o[j] = (uint8_t)(tmp[2 * j] | (tmp[2 * j + 1] << 4));
    }
}

/* one row as fp32: an fp32 row in place, fp16/bf16 converted into the scratch row */
static inline const float *load_row(float *restrict row, const char *src, int64_t K, int dtype) {
    if (dtype == TSR_F32) return (const float *)src;
    tsr_load_f32(row, src, K, dtype);
    return row;
}

int tsr_quantize_blocks(const void *x, int64_t ldx, int64_t M, int64_t K, int dtype, int kind,
                        int64_t br, int64_t bc, int64_t Mb, int64_t Kb,
                        void *codes, float *scale, uint8_t *zero, int nthreads) {
    const int xs = tsr_elsize(dtype);
    const int64_t row_bytes = is4(kind) ? K / 2 : K * code_size(kind);
    const int zp = kind == QK_I4ZP;
    const int multi = br != 1 || Mb != M;   /* per-tensor of an empty x too: its one scale is still written */
    qstat *st = NULL;
    int err = 0;
    if (multi) {
        st = (qstat *)malloc((size_t)(M > 0 ? M : 1) * (size_t)Kb * sizeof(qstat));
        if (!st) return TSR_ENOMEM;
    }
    /* pass 1 (multi-row blocks): per (row, column block) statistics */
    if (multi && M > 0) {
        TSR_TEAM(tsr_threads(nthreads), reduction(| : err), {
            float *row = tsr_scratch(K);
            /* every thread reaches the work-sharing loop, even one whose allocation failed */
_Pragma("omp for schedule(static)")
            for (int64_t i = 0; i < M; i++) {
                if (!row) { err = 1; continue; }
                const float *xr = load_row(row, (const char *)x + i * ldx * xs, K, dtype);
                for (int64_t kb = 0; kb < Kb; kb++) {
                    const int64_t j0 = kb * bc;
                    st[i * Kb + kb] = stat_span(xr + j0, (j0 + bc <= K ? bc : K - j0), kind);
                }
            }
            free(row);
        });
        if (err) { free(st); return TSR_ENOMEM; }
    }
    if (multi) {   /* merge in row order -> block scales */
        for (int64_t bi = 0; bi < Mb; bi++)
            for (int64_t kb = 0; kb < Kb; kb++) {
                qstat s = {0.0f, 0.0f};
                const int64_t r1 = (bi + 1) * br < M ? (bi + 1) * br : M;
                for (int64_t i = bi * br; i < r1; i++) s = stat_merge(s, st[i * Kb + kb], kind);
                uint8_t zz = 0;
                scale[bi * Kb + kb] = block_scale(s, kind, &zz);
                if (zp) zero[bi * Kb + kb] = zz;
            }
        free(st);
    }
    if (M == 0) return TSR_OK;
    /* codes (br == 1: statistics and scales of the row first, in the same pass) */
    TSR_TEAM(tsr_threads(nthreads), reduction(| : err), {
        float *row = tsr_scratch(K + K / 4 + 16);   /* fp32 row, then K bytes of 4-bit codes */
        uint8_t *tmp = row ? (uint8_t *)(row + K) : NULL;
_Pragma("omp for schedule(static)")
        for (int64_t i = 0; i < M; i++) {
            if (!row) { err = 1; continue; }
            const float *xr = load_row(row, (const char *)x + i * ldx * xs, K, dtype);
            float *sc = scale + (i / br) * Kb;
            uint8_t *z = zp ? zero + (i / br) * Kb : NULL;
            if (!multi) {
                for (int64_t kb = 0; kb < Kb; kb++) {
                    const int64_t j0 = kb * bc;
                    uint8_t zz = 0;
                    sc[kb] = block_scale(stat_span(xr + j0, (j0 + bc <= K ? bc : K - j0), kind), kind, &zz);
                    if (zp) z[kb] = zz;
                }
            }
            quant_row(xr, K, bc, Kb, kind, sc, z, tmp, (char *)codes + i * row_bytes);
        }
        free(row);
    });
    return err ? TSR_ENOMEM : TSR_OK;
}
