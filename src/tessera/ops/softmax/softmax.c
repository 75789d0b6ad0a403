/* Softmax over the rows of a (M, N) view, forward and fused backward.
 *
 *   forward:   m = max(x);  ms = (m == -inf) ? 0 : m
 *              y = exp(x - ms) * inv,   inv = (s == 0) ? 0 : 1 / s,   s = sum(exp(x - ms))
 *   backward:  dx = y * (dy - sum(dy * y))
 *
 * Numerics (the contract of ref.py): a fully -inf row has m = -inf, so it is
 * shifted by 0 instead, every exp is 0 and s = 0 gives inv = 0: all zeros, no
 * NaN, and dx = 0 there.  A row holding +inf has ms = +inf, exp(inf - inf) =
 * NaN makes s NaN and inv NaN, so the whole row is NaN (as in the reference and
 * torch.softmax); NaN inputs are skipped by the max but poison s the same way.
 * The largest element contributes exp(0) = 1, so s >= 1 for every other row
 * and 1 / s never overflows; all math is fp32 whatever the storage dtype.
 *
 * Memory traffic.  Rows of up to `chunk` elements take ONE pass over DRAM: the
 * row is converted into an fp32 scratch (chunk <= 64 Ki floats = 256 KiB, L2
 * resident) while its max (backward: sum(dy * y)) is taken; exp + sum run in
 * place on the scratch; the last step computes the output straight into the
 * store, non-temporal when the output is larger than the cache (`nt`), while
 * the next row is prefetched.  DRAM is touched once per element each way.  Longer
 * rows are streamed in chunks with an online max/sum (running max m, sum
 * rescaled by exp(m_old - m_new) when the max grows), then read a second time
 * to write y: any length works with a bounded scratch.  Rows are split
 * statically across threads; offsets are int64 (row * stride may exceed 2^31).
 */
#include "tessera_cpu.h"

#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define SM_FMA(a, b, c) fmaf(a, b, c)
#else
#define SM_FMA(a, b, c) ((a) * (b) + (c))
#endif

/* exp(x) for the arguments softmax produces: x = v - shift <= 0, -inf or NaN (the
 * portable path; AVX-512 uses exp16 below).  Same Cody-Waite reduction and Cephes
 * polynomial as tsr_expf (1.01 ulp max, measured over every float in [-87.3, 0]),
 * written for this loop, which bounds the forward's speed:
 *  - explicit FMAs: the kernels build with -std=c11, which turns FP contraction off, so
 *    the shared helper pays a separate multiply and add per term;
 *  - no input clamps: x <= 0 never overflows, and every x < -87.34 (-inf included,
 *    whose reduction is NaN) is replaced by 0 by the final select; NaN fails that
 *    comparison and propagates through the polynomial;
 *  - 2^k straight from the bits of the rounding sum kf = x*log2(e) + 1.5*2^23, whose
 *    low mantissa bits hold k: (bits(kf) << 23) + (127 << 23) = (k + 127) << 23. */
static inline float sm_exp(float x) {
    const float kf = SM_FMA(x, 1.44269504088896341f, 12582912.0f);
    const float k = kf - 12582912.0f;
    float r = SM_FMA(k, -0.693359375f, x);
    r = SM_FMA(k, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = SM_FMA(p, r, 1.3981999507e-3f);
    p = SM_FMA(p, r, 8.3334519073e-3f);
    p = SM_FMA(p, r, 4.1665795894e-2f);
    p = SM_FMA(p, r, 1.6666665459e-1f);
    p = SM_FMA(p, r, 5.0000001201e-1f);
    p = SM_FMA(p, r * r, r) + 1.0f;
    const float res = p * tsr_float((tsr_bits(kf) << 23) + (127u << 23));
    return x < -87.33654022216797f ? 0.0f : res;
}

static inline float safe_shift(float m) { return m == -INFINITY ? 0.0f : m; }
/* s == 0 only for a fully masked row; NaN s stays NaN so a +inf/NaN row is NaN everywhere. */
static inline float safe_inv(float s) { return s == 0.0f ? 0.0f : 1.0f / s; }

/* ------------------------------------------------------------------ loads fused with a reduction */
/* buf = float(src), returning its max.  NaN entries lose every comparison, so the max skips
 * them; they still reach the sum through exp and make the whole row NaN. */
static inline float load_max(float *restrict buf, const void *restrict src, int64_t n, int dtype) {
    float m = -INFINITY;
#if defined(TSR_NEON) || defined(TSR_RVV)
    /* NEON FMAXNM / RVV vfmax return the number when one operand is NaN: NaN entries are skipped
     * as above (a -0 / +0 tie may pick the other zero: x - (+-0) and exp are the same either way) */
    if (dtype == TSR_F32) {
        const float *s = (const float *)src;
        int64_t j = 0;
#if defined(TSR_NEON)
        float32x4_t m0 = vdupq_n_f32(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
        for (; j + 16 <= n; j += 16) {
            const float32x4x4_t v = vld1q_f32_x4(s + j);
            vst1q_f32_x4(buf + j, v);
            m0 = vmaxnmq_f32(m0, v.val[0]);
            m1 = vmaxnmq_f32(m1, v.val[1]);
            m2 = vmaxnmq_f32(m2, v.val[2]);
            m3 = vmaxnmq_f32(m3, v.val[3]);
        }
        m = vmaxnmvq_f32(vmaxnmq_f32(vmaxnmq_f32(m0, m1), vmaxnmq_f32(m2, m3)));
#else
        const size_t vlmax = __riscv_vsetvlmax_e32m8();
        vfloat32m8_t acc = __riscv_vfmv_v_f_f32m8(-INFINITY, vlmax);
        for (; j < n;) {
            const size_t vl = __riscv_vsetvl_e32m8((size_t)(n - j));
            const vfloat32m8_t v = __riscv_vle32_v_f32m8(s + j, vl);
            __riscv_vse32_v_f32m8(buf + j, v, vl);
            acc = __riscv_vfmax_vv_f32m8_tu(acc, acc, v, vl);
            j += (int64_t)vl;
        }
        m = __riscv_vfmv_f_s_f32m1_f32(
            __riscv_vfredmax_vs_f32m8_f32m1(acc, __riscv_vfmv_s_f_f32m1(-INFINITY, 1), vlmax));
#endif
        for (; j < n; j++) { const float v = s[j]; buf[j] = v; m = v > m ? v : m; }
        return m;
    }
#endif
    if (dtype == TSR_F32) {
        const float *s = (const float *)src;
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < n; j++) { const float v = s[j]; buf[j] = v; m = v > m ? v : m; }
    } else if (dtype == TSR_BF16) {
        const uint16_t *s = (const uint16_t *)src;
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < n; j++) {
            const float v = tsr_float((uint32_t)s[j] << 16);
            buf[j] = v; m = v > m ? v : m;
        }
    } else { /* fp16 */
        int64_t j = 0;
#if defined(__AVX512F__)
        const uint16_t *s = (const uint16_t *)src;
        __m512 vm = _mm512_set1_ps(-INFINITY);
        for (; j + 16 <= n; j += 16) {
            const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + j)));
            _mm512_storeu_ps(buf + j, v);
            vm = _mm512_max_ps(v, vm); /* maxps returns its 2nd operand when the 1st is NaN */
        }
        m = _mm512_reduce_max_ps(vm);
#endif
        tsr_load_f32(buf + j, (const uint16_t *)src + j, n - j, dtype);
        for (; j < n; j++) m = buf[j] > m ? buf[j] : m;
    }
    return m;
}

#if !defined(__AVX512F__)
/* gb = float(g), yb = float(y), returning sum(g * y): the backward's first pass on ISAs
 * without the direct AVX-512 path (bwd_row_avx512). */
static inline float load2_dot(float *restrict gb, float *restrict yb, const void *restrict g,
                              const void *restrict y, int64_t n, int dtype) {
    float s = 0.0f;
    if (dtype == TSR_F32) {
        const float *gs = (const float *)g, *ys = (const float *)y;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < n; j++) {
            const float a = gs[j], b = ys[j];
            gb[j] = a; yb[j] = b; s = SM_FMA(a, b, s);
        }
    } else if (dtype == TSR_BF16) {
        const uint16_t *gs = (const uint16_t *)g, *ys = (const uint16_t *)y;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < n; j++) {
            const float a = tsr_float((uint32_t)gs[j] << 16), b = tsr_float((uint32_t)ys[j] << 16);
            gb[j] = a; yb[j] = b; s = SM_FMA(a, b, s);
        }
    } else {
        tsr_load_f32(gb, g, n, dtype);
        tsr_load_f32(yb, y, n, dtype);
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < n; j++) s = SM_FMA(gb[j], yb[j], s);
    }
    return s;
}
#endif

/* Overlap DRAM with compute: while a row is worked on in cache, the next row is
 * prefetched, so its load finds it in cache instead of waiting for the hardware
 * prefetcher to ramp up again at every row start (without it the load and compute
 * phases of a row alternate).  Forward: one or two lines per iteration of the exp loop
 * (the compute-heavy pass); backward, which has little compute to hide behind: after
 * each PF_BLOCK-element block of the fused store.  Each was the faster of the two in
 * interleaved A/B runs on 8192 x 4096 fp32 rows (the machine is noisy: a few % apart). */
enum { PF_BLOCK = 1024 };

static inline void prefetch_row(const char *next, int64_t n, int es) {
    if (!next) return;
    for (int64_t o = 0; o < n * es; o += 64) __builtin_prefetch(next + o, 0, 2);
}

/* r[j] = exp(r[j] - shift) in place; returns the sum of the new r. */
#if defined(__AVX512F__)
/* AVX-512: exp through a 16-entry table, exp(x) = 2^(k/16) * e^t with k = round(16 x / ln 2),
 * t = x - k ln2/16 (two-constant Cody-Waite with FMA, |t| <= ln2/32) and a degree-3
 * Taylor polynomial (truncation 9e-9 relative): 1.7 ulp max over every float in
 * [-87.3, 0], 18 instructions per 16 values against 23 for sm_exp (measured: the exp
 * pass drops from ~0.19 to ~0.10 ns per element on one core).  The table index is the low 4 bits
 * of the rounding sum kf = 16 x / ln2 + 1.5*2^23 (vpermps reads only those), and
 * floor(k / 16) << 23 = (bits(kf) >> 4) << 23 is added to the entry's exponent.
 * x < -87.34 (-inf included) gives 0 through the zero-masked multiply; NaN compares
 * unordered, keeps its lane and propagates. */
static const float SM_EXP2_16[16] = {
    1.0f, 1.0442737340927124f, 1.0905077457427979f, 1.1387885808944702f,
    1.1892070770263672f, 1.2418577671051025f, 1.2968395948410034f, 1.3542555570602417f,
    1.4142135381698608f, 1.4768261909484863f, 1.5422108173370361f, 1.610490322113037f,
    1.6817928552627563f, 1.7562521696090698f, 1.8340080976486206f, 1.9152065515518188f};

static inline __m512 exp16(__m512 x, __m512 tab) {
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 kf = _mm512_fmadd_ps(x, _mm512_set1_ps(23.083120654223414f), magic);
    const __m512 k = _mm512_sub_ps(kf, magic);
    __m512 t = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.043321698904037476f), x); /* ln2/16, hi */
    t = _mm512_fnmadd_ps(k, _mm512_set1_ps(-1.1904089519676475e-10f), t);   /* ... and lo */
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 6.0f), t, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f));
    const __m512i kb = _mm512_castps_si512(kf);
    const __m512i scale = _mm512_add_epi32(_mm512_castps_si512(_mm512_permutexvar_ps(kb, tab)),
                                           _mm512_slli_epi32(_mm512_srli_epi32(kb, 4), 23));
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654022216797f), _CMP_NLT_UQ);
    return _mm512_maskz_mul_ps(live, p, _mm512_castsi512_ps(scale));
}

static inline float row_exp_sum(float *restrict r, int64_t n, float shift, const char *next, int es) {
    const __m512 vs = _mm512_set1_ps(shift), tab = _mm512_loadu_ps(SM_EXP2_16);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) { /* two accumulators: the adds are not the critical path */
        if (next) { /* 32 values: one line of halves, two of floats */
            _mm_prefetch(next + j * es, _MM_HINT_T0);
            if (es == 4) _mm_prefetch(next + j * es + 64, _MM_HINT_T0);
        }
        const __m512 e0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(r + j), vs), tab);
        const __m512 e1 = exp16(_mm512_sub_ps(_mm512_loadu_ps(r + j + 16), vs), tab);
        _mm512_storeu_ps(r + j, e0);
        _mm512_storeu_ps(r + j + 16, e1);
        acc0 = _mm512_add_ps(acc0, e0);
        acc1 = _mm512_add_ps(acc1, e1);
    }
    for (; j < n; j += 16) {
        const __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, r + j), vs), tab);
        _mm512_mask_storeu_ps(r + j, m, e);
        acc0 = _mm512_mask_add_ps(acc0, m, acc0, e);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}
#elif defined(TSR_NEON)
/* sm_exp on 4 lanes (the same reduction, polynomial and select), 8 values an iteration: gcc's own
 * NEON of the scalar loop is ~1.7x longer */
static inline float32x4_t sm_exp4(float32x4_t x) {
    const float32x4_t magic = vdupq_n_f32(12582912.0f);
    const float32x4_t kf = vfmaq_f32(magic, x, vdupq_n_f32(1.44269504088896341f));
    const float32x4_t k = vsubq_f32(kf, magic);
    float32x4_t r = vfmaq_f32(x, k, vdupq_n_f32(-0.693359375f));
    r = vfmaq_f32(r, k, vdupq_n_f32(2.12194440e-4f));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), vdupq_n_f32(1.9875691500e-4f), r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vaddq_f32(vfmaq_f32(r, p, vmulq_f32(r, r)), vdupq_n_f32(1.0f));
    const uint32x4_t e = vaddq_u32(vshlq_n_u32(vreinterpretq_u32_f32(kf), 23), vdupq_n_u32(127u << 23));
    const float32x4_t res = vmulq_f32(p, vreinterpretq_f32_u32(e));
    /* x < -87.34 (-inf included) -> 0; NaN fails the compare and propagates */
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(res),
                                           vcltq_f32(x, vdupq_n_f32(-87.33654022216797f))));
}

static inline float row_exp_sum(float *restrict r, int64_t n, float shift, const char *next, int es) {
    const float32x4_t vs = vdupq_n_f32(shift);
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const float32x4_t e0 = sm_exp4(vsubq_f32(vld1q_f32(r + j), vs));
        const float32x4_t e1 = sm_exp4(vsubq_f32(vld1q_f32(r + j + 4), vs));
        vst1q_f32(r + j, e0);
        vst1q_f32(r + j + 4, e1);
        a0 = vaddq_f32(a0, e0);
        a1 = vaddq_f32(a1, e1);
    }
    float s = vaddvq_f32(vaddq_f32(a0, a1));
    for (; j < n; j++) { const float e = sm_exp(r[j] - shift); r[j] = e; s += e; }
    prefetch_row(next, n, es);
    return s;
}
#else
static inline float row_exp_sum(float *restrict r, int64_t n, float shift, const char *next, int es) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) { const float e = sm_exp(r[j] - shift); r[j] = e; s += e; }
    prefetch_row(next, n, es);
    return s;
}
#endif

/* ------------------------------------------------------------------ the final step fused into the store */
/* out[j] = buf[j] * a (forward, aux unused) or aux[j] * (buf[j] - a) (backward: buf = dy, aux = y) */
static inline float fin1(const float *buf, const float *aux, int64_t j, float a, int bwd) {
    return bwd ? aux[j] * (buf[j] - a) : buf[j] * a;
}

static inline void put1(char *dst, int64_t j, float v, int dtype) {
    if (dtype == TSR_F32) ((float *)dst)[j] = v;
    else ((uint16_t *)dst)[j] = dtype == TSR_BF16 ? tsr_f2bf(v) : tsr_f2h(v);
}

#if defined(__AVX512F__)
static inline __m512 fin16(const float *buf, const float *aux, int64_t j, __m512 va, int bwd) {
    const __m512 b = _mm512_loadu_ps(buf + j);
    return bwd ? _mm512_mul_ps(_mm512_loadu_ps(aux + j), _mm512_sub_ps(b, va)) : _mm512_mul_ps(b, va);
}

/* 16 floats -> 16 halves, round to nearest even, bit-exact with tsr_f2h / tsr_f2bf (NaN stays NaN). */
static inline __m256i cvt16(__m512 v, int dtype) {
    if (dtype == TSR_F16) return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

/* 32 floats -> 32 halves (one 64-byte line).  With hwbf (bf16 on a CPU with AVX512_BF16)
 * one VCVTNE2PS2BF16 replaces ~16 integer ops; it rounds to nearest even and quiets NaN
 * like tsr_f2bf but treats denormal inputs as zero, so a line holding an fp32 denormal
 * takes the integer path (bit-exact either way).  Inline asm: the library is not built
 * with -mavx512bf16, and hwbf is set only where the CPU reports the instruction. */
static inline __m512i cvt32(__m512 lo, __m512 hi, int dtype, int hwbf) {
#if defined(__AVX512DQ__) && defined(__x86_64__) && defined(__GNUC__)
    if (hwbf) {
        const __mmask16 den = _mm512_fpclass_ps_mask(lo, 0x20) | _mm512_fpclass_ps_mask(hi, 0x20);
        if (__builtin_expect(!den, 1)) {
            __m512i r;
            __asm__("vcvtne2ps2bf16 %2, %1, %0" : "=v"(r) : "v"(hi), "v"(lo));
            return r;
        }
    }
#else
    (void)hwbf;
#endif
    return _mm512_inserti64x4(_mm512_castsi256_si512(cvt16(lo, dtype)), cvt16(hi, dtype), 1);
}
#endif

/* May the AVX-512 paths use VCVTNE2PS2BF16 for this dtype on this CPU? */
static inline int hw_bf16(int dtype) {
#if defined(__AVX512DQ__) && defined(__x86_64__) && defined(__GNUC__)
    return dtype == TSR_BF16 && __builtin_cpu_supports("avx512bf16");
#else
    (void)dtype;
    return 0;
#endif
}

/* dst[0:n] = convert(fin(j)).  AVX-512 with streaming stores computes each vector straight
 * into a 64-byte non-temporal store; otherwise the row is finished in place on the
 * scratch and stored with the shared tsr_store_row (fp32 without NT: one direct loop). */
static void finish_row(char *restrict dst, float *restrict buf, const float *restrict aux, int64_t n,
                       float a, int bwd, int dtype, int nt, int hwbf, uint16_t *restrict tmp) {
#if defined(__AVX512F__)
    if (nt) {
        const int es = tsr_elsize(dtype);
        const __m512 va = _mm512_set1_ps(a);
        int64_t j = 0;
        const int64_t head = (int64_t)(((64 - ((uintptr_t)dst & 63)) & 63) / (uintptr_t)es);
        for (; j < head && j < n; j++) put1(dst, j, fin1(buf, aux, j, a, bwd), dtype);
        if (dtype == TSR_F32) {
            for (; j + 16 <= n; j += 16) _mm512_stream_ps((float *)dst + j, fin16(buf, aux, j, va, bwd));
        } else {
            for (; j + 32 <= n; j += 32)
                _mm512_stream_si512((void *)((uint16_t *)dst + j),
                                    cvt32(fin16(buf, aux, j, va, bwd), fin16(buf, aux, j + 16, va, bwd), dtype, hwbf));
        }
        for (; j < n; j++) put1(dst, j, fin1(buf, aux, j, a, bwd), dtype);
        return;
    }
#else
    (void)hwbf;
#endif
    if (dtype == TSR_F32 && !nt) {
        float *d = (float *)dst;
#if defined(TSR_NEON)
        if (!bwd) {   /* 16 an iteration (gcc's own loop runs 4) */
            int64_t j = 0;
            for (; j + 16 <= n; j += 16) {
                float32x4x4_t v = vld1q_f32_x4(buf + j);
                for (int k = 0; k < 4; k++) v.val[k] = vmulq_n_f32(v.val[k], a);
                vst1q_f32_x4(d + j, v);
            }
            for (; j < n; j++) d[j] = buf[j] * a;
            return;
        }
#endif
        if (bwd) {
#pragma omp simd
            for (int64_t j = 0; j < n; j++) d[j] = aux[j] * (buf[j] - a);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < n; j++) d[j] = buf[j] * a;
        }
        return;
    }
    if (bwd) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) buf[j] = aux[j] * (buf[j] - a);
    } else {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) buf[j] *= a;
    }
    tsr_store_row(dst, buf, n, dtype, nt, tmp);
}

#if defined(__AVX512F__)
/* 16 elements of a row at index j as fp32; `m` masks a partial tail (lanes past it read 0). */
static inline __m512 ld16(const char *p, int64_t j, int dtype, __mmask16 m) {
    if (dtype == TSR_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + j);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + j);
    if (dtype == TSR_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

static inline __mmask16 tail16(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

/* Backward of one row straight from dy and y, no scratch: pass 1 takes sum(dy * y) while
 * reading the row from DRAM; pass 2 reads it again from cache (the 2-4 rows of 16 KiB fit
 * L1/L2) and stores dx = y * (dy - dot), prefetching the next rows a line per stream and
 * iteration.  Measured against the scratch version (which copies both rows into 2 x 16 KiB
 * of scratch, all of L1 for fp32 x 4096): ~25% faster on 8192 x 4096. */
static void bwd_row_avx512(const char *gr, const char *yr, const char *gnext, const char *ynext, char *dr,
                           int64_t N, int dtype, int nt, int hwbf) {
    const int es = tsr_elsize(dtype);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= N; j += 32) {
        acc0 = _mm512_fmadd_ps(ld16(gr, j, dtype, 0xffff), ld16(yr, j, dtype, 0xffff), acc0);
        acc1 = _mm512_fmadd_ps(ld16(gr, j + 16, dtype, 0xffff), ld16(yr, j + 16, dtype, 0xffff), acc1);
    }
    for (; j < N; j += 16) {
        const __mmask16 m = tail16(N - j);
        acc0 = _mm512_fmadd_ps(ld16(gr, j, dtype, m), ld16(yr, j, dtype, m), acc0);
    }
    const float dot = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    const __m512 vd = _mm512_set1_ps(dot);
    j = 0;
    if (nt) { /* elements before the first 64-byte boundary of dx: plain stores */
        const int64_t head = (int64_t)(((64 - ((uintptr_t)dr & 63)) & 63) / (uintptr_t)es);
        for (; j < head && j < N; j += 16) {
            const __mmask16 m = tail16((head < N ? head : N) - j);
            const __m512 g = ld16(gr, j, dtype, m), yv = ld16(yr, j, dtype, m);
            const __m512 d = _mm512_mul_ps(yv, _mm512_sub_ps(g, vd));
            if (dtype == TSR_F32) _mm512_mask_storeu_ps((float *)dr + j, m, d);
            else _mm256_mask_storeu_epi16((uint16_t *)dr + j, m, cvt16(d, dtype));
        }
        j = head < N ? head : N;
    }
    for (; j + 32 <= N; j += 32) {
        if (gnext) _mm_prefetch(gnext + j * es, _MM_HINT_T0);
        if (ynext) _mm_prefetch(ynext + j * es, _MM_HINT_T0);
        if (es == 4) {
            if (gnext) _mm_prefetch(gnext + j * es + 64, _MM_HINT_T0);
            if (ynext) _mm_prefetch(ynext + j * es + 64, _MM_HINT_T0);
        }
        const __m512 d0 = _mm512_mul_ps(ld16(yr, j, dtype, 0xffff), _mm512_sub_ps(ld16(gr, j, dtype, 0xffff), vd));
        const __m512 d1 = _mm512_mul_ps(ld16(yr, j + 16, dtype, 0xffff),
                                        _mm512_sub_ps(ld16(gr, j + 16, dtype, 0xffff), vd));
        if (dtype == TSR_F32) {
            float *d = (float *)dr + j;
            if (nt) { _mm512_stream_ps(d, d0); _mm512_stream_ps(d + 16, d1); }
            else { _mm512_storeu_ps(d, d0); _mm512_storeu_ps(d + 16, d1); }
        } else {
            const __m512i h = cvt32(d0, d1, dtype, hwbf);
            if (nt) _mm512_stream_si512((void *)((uint16_t *)dr + j), h);
            else _mm512_storeu_si512((void *)((uint16_t *)dr + j), h);
        }
    }
    for (; j < N; j += 16) { /* tail: masked plain stores */
        const __mmask16 m = tail16(N - j);
        const __m512 d = _mm512_mul_ps(ld16(yr, j, dtype, m), _mm512_sub_ps(ld16(gr, j, dtype, m), vd));
        if (dtype == TSR_F32) _mm512_mask_storeu_ps((float *)dr + j, m, d);
        else _mm256_mask_storeu_epi16((uint16_t *)dr + j, m, cvt16(d, dtype));
    }
}
#endif

/* ------------------------------------------------------------------ rows */
static void fwd_row(const char *xr, const char *xnext, char *yr, int64_t N, int64_t chunk, int dtype, int nt,
                    int hwbf, float *buf, uint16_t *tmp) {
    const int es = tsr_elsize(dtype);
    if (N <= chunk) { /* one read of x; everything else on the L2-resident scratch */
        const float ms = safe_shift(load_max(buf, xr, N, dtype));
        const float s = row_exp_sum(buf, N, ms, xnext, es);
        finish_row(yr, buf, NULL, N, safe_inv(s), 0, dtype, nt, hwbf, tmp);
        return;
    }
    float m = -INFINITY, s = 0.0f; /* online max / sum over chunks */
    for (int64_t c0 = 0; c0 < N; c0 += chunk) {
        const int64_t n = N - c0 < chunk ? N - c0 : chunk;
        const float cm = load_max(buf, xr + c0 * es, n, dtype);
        const float mn = cm > m ? cm : m, ms = safe_shift(mn);
        /* rescale the running sum to the new max; exp(-inf) = 0 while nothing was seen yet */
        s = s * sm_exp(m - ms) + row_exp_sum(buf, n, ms, NULL, es);
        m = mn;
    }
    const float ms = safe_shift(m), inv = safe_inv(s);
    for (int64_t c0 = 0; c0 < N; c0 += chunk) { /* second read: the same exp, scaled and stored */
        const int64_t n = N - c0 < chunk ? N - c0 : chunk;
        load_max(buf, xr + c0 * es, n, dtype);
        row_exp_sum(buf, n, ms, NULL, es);
        finish_row(yr + c0 * es, buf, NULL, n, inv, 0, dtype, nt, hwbf, tmp);
    }
}

static void bwd_row(const char *gr, const char *yr, const char *gnext, const char *ynext, char *dr, int64_t N,
                    int64_t chunk, int dtype, int nt, int hwbf, float *gb, float *yb, uint16_t *tmp) {
#if defined(__AVX512F__)
    (void)chunk; (void)gb; (void)yb; (void)tmp;
    bwd_row_avx512(gr, yr, gnext, ynext, dr, N, dtype, nt, hwbf); /* any length: two direct passes */
#else
    const int es = tsr_elsize(dtype);
    if (N <= chunk) {
        const float dot = load2_dot(gb, yb, gr, yr, N, dtype);
        for (int64_t b = 0; b < N; b += PF_BLOCK) { /* store a block, then prefetch the next rows' */
            const int64_t n = N - b < PF_BLOCK ? N - b : PF_BLOCK;
            finish_row(dr + b * es, gb + b, yb + b, n, dot, 1, dtype, nt, hwbf, tmp);
            prefetch_row(gnext ? gnext + b * es : NULL, n, es);
            prefetch_row(ynext ? ynext + b * es : NULL, n, es);
        }
        return;
    }
    float dot = 0.0f; /* long row: sum(dy * y) over chunks, then a second read */
    for (int64_t c0 = 0; c0 < N; c0 += chunk) {
        const int64_t n = N - c0 < chunk ? N - c0 : chunk;
        dot += load2_dot(gb, yb, gr + c0 * es, yr + c0 * es, n, dtype);
    }
    for (int64_t c0 = 0; c0 < N; c0 += chunk) {
        const int64_t n = N - c0 < chunk ? N - c0 : chunk;
        load2_dot(gb, yb, gr + c0 * es, yr + c0 * es, n, dtype);
        finish_row(dr + c0 * es, gb, yb, n, dot, 1, dtype, nt, hwbf, tmp);
    }
#endif
}

/* ------------------------------------------------------------------ entry points */
int tsr_softmax_fwd(const void *x, int64_t sx, void *y, int64_t M, int64_t N, int dtype, int nt,
                    int64_t chunk, int nthreads) {
    if (chunk < 1) return TSR_EINVAL;
    const int es = tsr_elsize(dtype);
    const int64_t C = N < chunk ? N : chunk;
    const int hwbf = hw_bf16(dtype);
    int failed = 0;
    TSR_TEAM(tsr_threads(nthreads), reduction(| : failed), {
        float *buf = tsr_scratch(C);
        uint16_t *tmp = (uint16_t *)tsr_scratch(C); /* C floats hold 2C halves */
        failed = !buf || !tmp;
        /* every thread reaches the worksharing loop; one without scratch skips its rows */
_Pragma("omp for schedule(static)")
        for (int64_t i = 0; i < M; i++) {
            if (failed) continue;
            const char *xr = (const char *)x + i * sx * es;
            /* the next row, unless it is this one again (broadcast) or there is none */
            const char *xnext = i + 1 < M && sx != 0 ? xr + sx * es : NULL;
            fwd_row(xr, xnext, (char *)y + i * N * es, N, chunk, dtype, nt, hwbf, buf, tmp);
        }
        tsr_sfence();
        free(buf); free(tmp);
    });
    return failed ? TSR_ENOMEM : TSR_OK;
}

int tsr_softmax_bwd(const void *dy, int64_t sdy, const void *y, int64_t sy, void *dx, int64_t M, int64_t N,
                    int dtype, int nt, int64_t chunk, int nthreads) {
    if (chunk < 1) return TSR_EINVAL;
    const int es = tsr_elsize(dtype);
    const int64_t C = N < chunk ? N : chunk;
    const int hwbf = hw_bf16(dtype);
    int failed = 0;
    TSR_TEAM(tsr_threads(nthreads), reduction(| : failed), {
        float *gb = tsr_scratch(C), *yb = tsr_scratch(C);
        uint16_t *tmp = (uint16_t *)tsr_scratch(C);
        failed = !gb || !yb || !tmp;
_Pragma("omp for schedule(static)")
        for (int64_t i = 0; i < M; i++) {
            if (failed) continue;
            const char *gr = (const char *)dy + i * sdy * es, *yr = (const char *)y + i * sy * es;
            const int more = i + 1 < M;
            bwd_row(gr, yr, more && sdy ? gr + sdy * es : NULL, more && sy ? yr + sy * es : NULL,
                    (char *)dx + i * N * es, N, chunk, dtype, nt, hwbf, gb, yb, tmp);
        }
        tsr_sfence();
        free(gb); free(yb); free(tmp);
    });
    return failed ? TSR_ENOMEM : TSR_OK;
}
