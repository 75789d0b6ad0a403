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

enum { TSR_F32 = 0, TSR_F16 = 1, TSR_BF16 = 2 };
enum { TSR_OK = 0, TSR_ENOMEM = -1, TSR_EINVAL = -2 };

static inline int tsr_elsize(int dtype) { return dtype == TSR_F32 ? 4 : 2; }

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

/* 64-byte aligned scratch of `floats` fp32 elements; NULL on failure. */
static inline float *tsr_scratch(int64_t floats) {
    size_t bytes = ((size_t)(floats > 0 ? floats : 1) * 4 + 63) & ~(size_t)63;
    return (float *)aligned_alloc(64, bytes);
}

#endif /* TESSERA_CPU_H */
