/* tessera_cpu.h -- framework-free helpers shared by every native CPU kernel.
 *
 * Kernels compute in fp32 on an L1/L2-resident scratch row and only touch
 * DRAM twice per element: one load (converted from fp32/fp16/bf16) and one
 * store (converted back, non-temporal when the output is larger than the
 * cache, so the store does not first read the line it overwrites).
 *
 * Everything here is portable C11; the x86 intrinsics are optional fast paths
 * selected by the compiler's target macros (__AVX512F__, __AVX2__, __F16C__),
 * so the same file builds for generic x86-64, AArch64 (NEON by
 * auto-vectorisation) and RISC-V.
 *
 * Conversions are bit-exact with PyTorch: fp32->bf16 and fp32->fp16 round to
 * nearest even, NaN stays NaN, overflow goes to +-inf.
 */
#ifndef TESSERA_CPU_H
#define TESSERA_CPU_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif
/* edge CPUs: fp16 conversions the compiler does not vectorise by itself (per-ISA headers) */
#if defined(__aarch64__) && defined(__ARM_NEON)
#include "tessera_neon.h"
#elif defined(__riscv_vector)
#include "tessera_rvv.h"
#endif

enum { TSR_F32 = 0, TSR_F16 = 1, TSR_BF16 = 2 };
enum { TSR_OK = 0, TSR_ENOMEM = -1, TSR_EINVAL = -2 };

static inline int tsr_elsize(int dtype) { return dtype == TSR_F32 ? 4 : 2; }

/* Conv geometry along a row, dilation 1 (the im2col gathers: _requant/requant.c, the GEMM's own
 * rows in _qlinear_int8/qi8_im2col.h).  The taps kx in [*k0, *k1) of an output column whose first
 * tap reads input column ix0 lie inside [0, W) (*k1 == *k0: none), */
static inline void tsr_taps_inside(int64_t ix0, int64_t W, int64_t kw, int64_t *k0, int64_t *k1) {
    *k0 = ix0 < 0 ? (-ix0 < kw ? -ix0 : kw) : 0;
    *k1 = W - ix0 < kw ? (W - ix0 > *k0 ? W - ix0 : *k0) : kw;
}
/* and the interior output columns [*lo, *hi) of Wo, whose every tap lies inside [0, W). */
static inline void tsr_interior_cols(int64_t W, int64_t kw, int64_t st_w, int64_t pd_w, int64_t Wo, int64_t *lo,
                                     int64_t *hi) {
    int64_t l = (pd_w + st_w - 1) / st_w, h = W - kw + pd_w < 0 ? 0 : (W - kw + pd_w) / st_w + 1;
    l = l < Wo ? l : Wo;
    *lo = l;
    *hi = h < l ? l : (h < Wo ? h : Wo);
}

static inline uint32_t tsr_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float tsr_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ------------------------------------------------------------------ bf16 */
static inline float tsr_bf2f(uint16_t b) { return tsr_float((uint32_t)b << 16); }
static inline uint16_t tsr_f2bf(float f) {
    uint32_t u = tsr_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                           /* RNE */
    return (uint16_t)(u >> 16);
}

/* ------------------------------------------------------------------ fp16 (IEEE binary16) */
static inline float tsr_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return tsr_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) { /* zero / subnormal: m * 2^-24, exact in fp32 */
        float v = (float)m * 5.9604644775390625e-8f;
        return tsr_float(sign | tsr_bits(v));
    }
    return tsr_float(sign | ((e + 112u) << 23) | (m << 13));
}
static inline uint16_t tsr_f2h(float f) {
    uint32_t x = tsr_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) return sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u);
    if (x >= 0x477ff000u) return sign | 0x7c00u;          /* >= 65520 rounds to inf */
    if (x < 0x38800000u) {                                 /* result is subnormal or zero */
        float a = tsr_float(x) + 0.5f;                     /* FPU rounds at 2^-24: RNE */
        return sign | (uint16_t)(tsr_bits(a) - 0x3f000000u);
    }
    x += 0xc8000fffu + ((x >> 13) & 1u);                   /* rebias exponent, RNE */
    return sign | (uint16_t)(x >> 13);
}

/* ------------------------------------------------------------------ row load / store */
/* dst[0:n] = (float)src[0:n] */
static inline void tsr_load_f32(float *restrict dst, const void *restrict src, int64_t n, int dtype) {
    if (dtype == TSR_F32) { memcpy(dst, src, (size_t)n * 4); return; }
    const uint16_t *s = (const uint16_t *)src;
    if (dtype == TSR_BF16) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = tsr_float((uint32_t)s[i] << 16);
        return;
    }
    int64_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#elif defined(TSR_NEON)
    i = tsr_neon_h2f(dst, s, n);
#elif defined(TSR_RVV)
    i = tsr_rvv_h2f(dst, s, n);
#endif
    for (; i < n; i++) dst[i] = tsr_h2f(s[i]);
}

/* dst[0:n] = convert(src[0:n]) with ordinary stores */
static inline void tsr_store_conv(void *restrict dst, const float *restrict src, int64_t n, int dtype) {
    if (dtype == TSR_F32) { memcpy(dst, src, (size_t)n * 4); return; }
    uint16_t *d = (uint16_t *)dst;
    if (dtype == TSR_BF16) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = tsr_bits(src[i]);
            uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            d[i] = (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? ((u >> 16) | 0x40u) : r);
        }
        return;
    }
    int64_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(TSR_NEON)
    i = tsr_neon_f2h(d, src, n);
#elif defined(TSR_RVV)
    i = tsr_rvv_f2h(d, src, n);
#endif
    for (; i < n; i++) d[i] = tsr_f2h(src[i]);
}

/* Copy bytes from a cache-resident buffer to DRAM with non-temporal stores where
 * the ISA has them (the destination's cache lines are not read first).  Callers
 * issue tsr_sfence() once after their last streaming store. */
static inline void tsr_stream_copy(void *restrict dst, const void *restrict src, int64_t bytes) {
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
#if defined(__AVX512F__)
    int64_t head = (int64_t)((64 - ((uintptr_t)d & 63)) & 63);
    if (head > bytes) head = bytes;
    memcpy(d, s, (size_t)head); d += head; s += head; bytes -= head;
    for (; bytes >= 64; bytes -= 64, d += 64, s += 64)
        _mm512_stream_si512((void *)d, _mm512_loadu_si512((const void *)s));
#elif defined(__AVX2__)
    int64_t head = (int64_t)((32 - ((uintptr_t)d & 31)) & 31);
    if (head > bytes) head = bytes;
    memcpy(d, s, (size_t)head); d += head; s += head; bytes -= head;
    for (; bytes >= 32; bytes -= 32, d += 32, s += 32)
        _mm256_stream_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s));
#endif
    memcpy(d, s, (size_t)bytes);
}

static inline void tsr_sfence(void) {
#if defined(__AVX2__) || defined(__AVX512F__)
    _mm_sfence();
#endif
}

/* Store a finished fp32 row: convert, and stream when nt != 0.  tmp holds n halves. */
static inline void tsr_store_row(void *restrict dst, const float *restrict src, int64_t n, int dtype,
                                 int nt, uint16_t *restrict tmp) {
    if (!nt) { tsr_store_conv(dst, src, n, dtype); return; }
    if (dtype == TSR_F32) { tsr_stream_copy(dst, src, n * 4); return; }
    tsr_store_conv(tmp, src, n, dtype);
    tsr_stream_copy(dst, tmp, n * 2);
}

/* ------------------------------------------------------------------ math (vectorisable, branch-free) */
/* expf: Cody-Waite range reduction + degree-6 polynomial (Cephes coefficients), < 2 ulp on the
 * normal range; x < -87.33 gives 0, x > 88.72 gives inf, NaN stays NaN. */
static inline float tsr_expf(float x) {
    float xc = x > 88.72283935546875f ? 88.72283935546875f : x;
    xc = xc < -87.33654022216797f ? -87.33654022216797f : xc;
    float k = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = xc - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    float scale = tsr_float((uint32_t)((int32_t)k + 127) << 23);
    float res = p * scale;
    res = x > 88.72283935546875f ? INFINITY : res;
    res = x < -87.33654022216797f ? 0.0f : res;
    return x != x ? x : res;
}

/* 1 / (1 + exp(-x)) with the right limits at +-inf. */
static inline float tsr_sigmoidf(float x) { return 1.0f / (1.0f + tsr_expf(-x)); }

/* erf: Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), odd extension, exact +-1 for large |x|. */
static inline float tsr_erff(float x) {
    float a = fabsf(x);
    float t = 1.0f / (1.0f + 0.3275911f * a);
    float y = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    float r = 1.0f - y * tsr_expf(-a * a);
    return copysignf(r, x);
}

/* ------------------------------------------------------------------ threads + scratch */
static inline int tsr_threads(int requested) {
#ifdef _OPENMP
    return requested > 0 ? requested : 1;
#else
    (void)requested;
    return 1;
#endif
}

/* TSR_TEAM(T, CLAUSES, { body }): `body` as an OpenMP parallel region of T threads with
 * CLAUSES (e.g. reduction(| : failed)), or, when T <= 1, inline with no region at all.
 * Why: entering a region costs libgomp ~0.55 us even for a team of one (gcc 12, measured),
 * as much as the rest of a tiny decode-time call, and T is 1 for every call under the
 * parallel threshold.  Inline, the body's worksharing loops run orphaned (serially, ~0.05 us)
 * and a reduction variable is the caller's own (it must be 0 before, as a reduction's
 * private copy would be).  A #pragma cannot sit in a macro argument: the body writes
 * _Pragma("omp for ...") for its loops. */
#define TSR_PRAGMA(x) _Pragma(#x)
#define TSR_TEAM(T, CLAUSES, ...)                                               \
    do {                                                                        \
        const int tsr_team_n_ = (T);                                            \
        if (tsr_team_n_ <= 1) {                                                 \
            __VA_ARGS__                                                         \
        } else {                                                                \
            TSR_PRAGMA(omp parallel num_threads(tsr_team_n_) CLAUSES) { __VA_ARGS__ } \
        }                                                                       \
    } while (0)

/* 64-byte aligned scratch of `floats` fp32 elements; NULL on failure. */
static inline float *tsr_scratch(int64_t floats) {
    size_t bytes = ((size_t)(floats > 0 ? floats : 1) * 4 + 63) & ~(size_t)63;
    return (float *)aligned_alloc(64, bytes);
}

/* Kept scratch: tsr_take(slot, bytes, &own) is this thread's buffer for `slot` (64-byte aligned,
 * >= bytes), grown as needed and kept for the thread's next call (own = 0), or, past
 * TSR_KEEP_MAX bytes, a fresh allocation the caller frees (own = 1: tsr_give).  NULL on failure.
 * Slots are per translation unit and per thread; a caller must not hold one slot twice.  Why: a
 * small requantized conv allocated and freed a 48 KiB GEMM tile and a few smaller buffers per
 * call, and glibc coalesced, consolidated and trimmed them and faulted the pages back in on the
 * next call: keeping them took 0.4-0.6 us off a ~3 us fixed cost (MobileNetV2's layers run in
 * 10-60 us).  At most TSR_KEEP_SLOTS x 1 MiB stays with a thread, freed when it exits (a pthread
 * key's destructor). */
#include <pthread.h>
enum { TSR_KEEP_SLOTS = 10 };
#define TSR_KEEP_MAX ((size_t)1 << 20)
typedef struct { void *p[TSR_KEEP_SLOTS]; size_t n[TSR_KEEP_SLOTS]; int keyed; } tsr_keep_t;
static _Thread_local tsr_keep_t tsr_keep_tls;
static pthread_key_t tsr_keep_key;
static pthread_once_t tsr_keep_once = PTHREAD_ONCE_INIT;
static void tsr_keep_free(void *v) {
    tsr_keep_t *t = (tsr_keep_t *)v;
    for (int i = 0; i < TSR_KEEP_SLOTS; i++) { free(t->p[i]); t->p[i] = NULL; t->n[i] = 0; }
}
static void tsr_keep_init(void) { (void)pthread_key_create(&tsr_keep_key, tsr_keep_free); }

static inline void *tsr_take(int slot, size_t bytes, int *own) {
    bytes = ((bytes ? bytes : 1) + 63) & ~(size_t)63;
    *own = bytes > TSR_KEEP_MAX;
    if (*own) return aligned_alloc(64, bytes);
    tsr_keep_t *t = &tsr_keep_tls;
    if (bytes > t->n[slot]) {
        if (!t->keyed) {   /* first buffer of this thread: free them all at its exit */
            (void)pthread_once(&tsr_keep_once, tsr_keep_init);
            t->keyed = pthread_setspecific(tsr_keep_key, t) == 0;
        }
        free(t->p[slot]);
        t->p[slot] = aligned_alloc(64, bytes);
        t->n[slot] = t->p[slot] ? bytes : 0;
    }
    return t->p[slot];
}
static inline void tsr_give(void *p, int own) {
    if (own) free(p);
}

/* ------------------------------------------------------------------ 32-element row blocks
 * (appended for the norm family; usable by any row kernel that streams rows through fp32)
 *
 * A block is 32 consecutive elements of a row held as two 16-lane fp32 vectors
 * (GCC/Clang vector extensions: 2 zmm with AVX-512, 4 ymm with AVX2, SSE/NEON or
 * scalar code elsewhere).  Block loads convert fp32/fp16/bf16 to fp32; block stores
 * convert back with the same round-to-nearest-even as tsr_f2bf/tsr_f2h and, when
 * asked, stream 64-byte lines with non-temporal stores.  A block that runs past the
 * row end (j + 32 > n, the `tail` block) is loaded with `fill` in the missing lanes --
 * callers pick a fill that contributes nothing to their sums -- and stored element by
 * element.  `tail` is a compile-time constant in TSR_FOR_BLOCKS, so the main loop has
 * no bounds branch and its vectors stay in registers.  Kernels should instantiate
 * their row loops with a constant dtype (the helpers branch on it).
 *
 * TSR_BF16HW is a kernel-internal dtype: bf16 data whose fp32 -> bf16 stores use the
 * AVX512_BF16 instruction VCVTNE2PS2BF16 (one instruction per block instead of ~16
 * integer ops).  It rounds to nearest even and quiets NaN exactly as tsr_f2bf, but
 * flushes denormal inputs to zero, so a block holding an fp32 denormal takes the
 * integer path.  Select it only when tsr_bf16_hw() is true.  (Inline asm: the
 * library is not compiled with -mavx512bf16, the instruction runs only where the
 * CPU reports it.)
 */
/* always inlined: hot-loop helpers, and no out-of-line copy whose vector ABI gcc warns about */
#define TSR_BLK_INLINE static inline __attribute__((always_inline))
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef float tsr_v16 __attribute__((vector_size(64)));
typedef uint32_t tsr_v16u __attribute__((vector_size(64)));
typedef uint16_t tsr_v16h __attribute__((vector_size(32)));
typedef uint16_t tsr_v32h __attribute__((vector_size(64)));   /* a block's 32 halves */
typedef struct { tsr_v16 lo, hi; } tsr_blk;

enum { TSR_BF16HW = 3 };
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__x86_64__) && defined(__GNUC__)
#define TSR_HAVE_BF16HW 1
#else
#define TSR_HAVE_BF16HW 0
#endif
static inline int tsr_bf16_hw(void) {
#if TSR_HAVE_BF16HW
    return __builtin_cpu_supports("avx512bf16") != 0;
#else
    return 0;
#endif
}
/* the storage dtype of a kernel dtype (TSR_BF16HW stores bf16) */
#define TSR_IO(dtype) ((dtype) == TSR_BF16HW ? TSR_BF16 : (dtype))

TSR_BLK_INLINE float tsr_v16_sum(tsr_v16 v) {
    float s = 0.0f;
    for (int k = 0; k < 16; k++) s += v[k];
    return s;
}

/* a * b + c, fused where the ISA has it */
TSR_BLK_INLINE tsr_v16 tsr_v16_fma(tsr_v16 a, tsr_v16 b, tsr_v16 c) {
#if defined(__AVX512F__)
    return (tsr_v16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#else
    return a * b + c;
#endif
}

/* 16 elements at p (dtype) -> fp32 */
TSR_BLK_INLINE tsr_v16 tsr_v16_load(const void *p, int dtype) {
    tsr_v16 v;
    if (dtype == TSR_F32) { memcpy(&v, p, 64); return v; }
    tsr_v16h h;
    memcpy(&h, p, 32);
#if defined(__AVX512F__)
    if (TSR_IO(dtype) == TSR_BF16) return (tsr_v16)_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16);
    return (tsr_v16)_mm512_cvtph_ps((__m256i)h);
#else
    if (TSR_IO(dtype) == TSR_BF16) return (tsr_v16)(__builtin_convertvector(h, tsr_v16u) << 16);
#if defined(__F16C__)
    __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + 8)));
    memcpy(&v, &lo, 32); memcpy((char *)&v + 32, &hi, 32);
#elif defined(TSR_NEON) || defined(TSR_RVV)
    float f[16];
    tsr_load_f32(f, p, 16, TSR_F16);   /* the per-ISA vector conversion */
    memcpy(&v, f, 64);
#else
    for (int k = 0; k < 16; k++) v[k] = tsr_h2f(h[k]);
#endif
    return v;
#endif
}

/* fp32 -> 16 halves (bf16 or fp16 bits), round to nearest even, NaN stays NaN */
TSR_BLK_INLINE tsr_v16h tsr_v16_to_half(tsr_v16 v, int dtype) {
#if defined(__AVX512F__)
    if (TSR_IO(dtype) == TSR_BF16) {
        __m512i u = (__m512i)v;
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                     _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
        __mmask16 nan = _mm512_cmp_ps_mask((__m512)v, (__m512)v, _CMP_UNORD_Q);
        r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000)); /* quiet NaN, as tsr_f2bf */
        return (tsr_v16h)_mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
    }
    return (tsr_v16h)_mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    if (TSR_IO(dtype) == TSR_BF16) {
        tsr_v16u u = (tsr_v16u)v;
        tsr_v16u r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        tsr_v16u nan = (tsr_v16u)(v != v);                      /* all-ones lanes where NaN */
        r = (r & ~nan) | (((u >> 16) | 0x40u) & nan);           /* quiet NaN, as tsr_f2bf */
        return __builtin_convertvector(r, tsr_v16h);
    }
    tsr_v16h h;
    float f[16];
    memcpy(f, &v, 64);
    tsr_store_conv(&h, f, 16, TSR_F16);
    return h;
#endif
}

/* A whole block -> its 32 halves (64 bytes) of dtype (bf16 or fp16). */
TSR_BLK_INLINE tsr_v32h tsr_blk_to_half(tsr_blk b, int dtype) {
#if TSR_HAVE_BF16HW
    if (dtype == TSR_BF16HW) {
        __mmask16 den = _mm512_fpclass_ps_mask((__m512)b.lo, 0x20) | _mm512_fpclass_ps_mask((__m512)b.hi, 0x20);
        if (__builtin_expect(!den, 1)) {
            __m512i r;
            __asm__("vcvtne2ps2bf16 %2, %1, %0" : "=v"(r) : "v"(b.hi), "v"(b.lo));
            return (tsr_v32h)r;
        }
    }
#endif
    tsr_v16h lo = tsr_v16_to_half(b.lo, dtype), hi = tsr_v16_to_half(b.hi, dtype);
#if defined(__AVX512F__)
    return (tsr_v32h)_mm512_inserti64x4(_mm512_castsi256_si512((__m256i)lo), (__m256i)hi, 1);
#else
    tsr_v32h h;
    memcpy(&h, &lo, 32); memcpy((char *)&h + 32, &hi, 32);
    return h;
#endif
}

/* 32 halves of dtype -> an fp32 block */
TSR_BLK_INLINE tsr_blk tsr_blk_from_half(tsr_v32h h, int dtype) {
    tsr_blk b;
#if defined(__AVX512BW__)
    if (TSR_IO(dtype) == TSR_BF16) {
        /* each bf16 moves to the high half of its fp32 lane and the low halves are zeroed by
         * the mask: one vpermw per 16 values (instead of widen + shift) */
        const __m512i il = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0,
                                            7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
        b.lo = (tsr_v16)_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, il, (__m512i)h);
        b.hi = (tsr_v16)_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, _mm512_add_epi16(il, _mm512_set1_epi16(16)),
                                                       (__m512i)h);
        return b;
    }
#endif
    b.lo = tsr_v16_load(&h, dtype);
    b.hi = tsr_v16_load((const char *)&h + 32, dtype);
    return b;
}

/* Elements [j, j+32) of a row of n elements; with tail, lanes past n get `fill`. */
TSR_BLK_INLINE tsr_blk tsr_blk_load(const void *row, int64_t j, int64_t n, int dtype, float fill, int tail) {
    const char *p = (const char *)row + j * tsr_elsize(dtype);
    tsr_blk b;
    if (!tail) {
        if (dtype != TSR_F32) {
            tsr_v32h h;
            memcpy(&h, p, 64);
            return tsr_blk_from_half(h, dtype);
        }
        b.lo = tsr_v16_load(p, TSR_F32);
        b.hi = tsr_v16_load(p + 64, TSR_F32);
        return b;
    }
    float f[32];
    int64_t k, m = n - j;
    tsr_load_f32(f, p, m, TSR_IO(dtype));
    for (k = m; k < 32; k++) f[k] = fill;
    memcpy(&b.lo, f, 64); memcpy(&b.hi, f + 16, 64);
    return b;
}

/* Zero the lanes of a tail block from element m on (m = n - j valid elements). */
TSR_BLK_INLINE void tsr_blk_zero_from(tsr_blk *b, int64_t m) {
    float f[32];
    memcpy(f, &b->lo, 64); memcpy(f + 16, &b->hi, 64);
    for (int64_t k = m; k < 32; k++) f[k] = 0.0f;
    memcpy(&b->lo, f, 64); memcpy(&b->hi, f + 16, 64);
}

/* 64 bytes to dst; nt != 0 bypasses the cache where the ISA can (dst 64-byte aligned). */
TSR_BLK_INLINE void tsr_put64(void *dst, tsr_v32h v, int nt) {
#if defined(__AVX512F__)
    if (nt) _mm512_stream_si512(dst, (__m512i)v);
    else _mm512_storeu_si512(dst, (__m512i)v);
#elif defined(__AVX2__)
    if (nt) {
        __m256i a, c;
        memcpy(&a, &v, 32); memcpy(&c, (const char *)&v + 32, 32);
        _mm256_stream_si256((__m256i *)dst, a);
        _mm256_stream_si256((__m256i *)dst + 1, c);
    } else {
        memcpy(dst, &v, 64);
    }
#else
    (void)nt;
    memcpy(dst, &v, 64);
#endif
}

/* Store elements [j, j+32) of a row of n elements (only [j, n) when tail), converted to
 * dtype.  nt != 0 streams the block; it needs the row start 64-byte aligned (callers check
 * once per row); issue tsr_sfence() after the last streaming store.  With round != 0 the
 * block is replaced by its rounded value (what a reload of the stored data gives: h = x +
 * residual is normalised as stored); with copy != NULL the same bytes (a whole block) also
 * go to element j of `copy`, a cache-resident scratch row the caller re-reads. */
TSR_BLK_INLINE void tsr_blk_store_r(void *row, int64_t j, int64_t n, tsr_blk *b, int dtype, int nt, int tail,
                                    int round, void *copy) {
    char *p = (char *)row + j * tsr_elsize(dtype);
    if (dtype == TSR_F32) {
        const tsr_v16 lo = b->lo, hi = b->hi;
        if (tail) {
            float f[32];
            memcpy(f, &lo, 64); memcpy(f + 16, &hi, 64);
            memcpy(p, f, (size_t)(n - j) * 4);
        } else {
            tsr_put64(p, (tsr_v32h)lo, nt);
            tsr_put64(p + 64, (tsr_v32h)hi, nt);
        }
        if (copy) { memcpy((char *)copy + j * 4, &lo, 64); memcpy((char *)copy + j * 4 + 64, &hi, 64); }
        return;
    }
    tsr_v32h h = tsr_blk_to_half(*b, dtype);
    if (tail) memcpy(p, &h, (size_t)(n - j) * 2);
    else tsr_put64(p, h, nt);
    if (copy) memcpy((char *)copy + j * 2, &h, 64);
    if (round) *b = tsr_blk_from_half(h, dtype);
}

TSR_BLK_INLINE void tsr_blk_store(void *row, int64_t j, int64_t n, tsr_blk b, int dtype, int nt, int tail) {
    tsr_blk_store_r(row, j, n, &b, dtype, nt, tail, 0, NULL);
}

/* Run the statement(s) for every block of a row of n elements: whole blocks with
 * tail = 0, then the partial last block (if any) with tail = 1.  Declares `j`. */
#define TSR_FOR_BLOCKS(j, n, ...)                                                  \
    do {                                                                           \
        int64_t j = 0;                                                             \
        for (; j + 32 <= (n); j += 32) { enum { tail = 0 }; __VA_ARGS__ }          \
        if (j < (n)) { enum { tail = 1 }; __VA_ARGS__ }                            \
    } while (0)

TSR_BLK_INLINE int tsr_aligned64(const void *p) { return ((uintptr_t)p & 63) == 0; }

/* Ask for the cache lines of [p, p + bytes) to be brought into L2 ahead of use. */
TSR_BLK_INLINE void tsr_prefetch_l2(const void *p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 2);
}

#endif /* TESSERA_CPU_H */
