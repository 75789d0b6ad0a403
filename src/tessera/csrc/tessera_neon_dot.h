/* tessera_neon_dot.h -- AArch64 int8 dot-product micro-kernels, chosen at run time.
 *
 *   SDOT  (FEAT_DotProd: optional from Armv8.2, mandatory from 8.4; Cortex-A55/A75 and later):
 *         4 int8 x int8 products summed into each int32 lane (vdotq_s32).
 *   SMMLA (FEAT_I8MM: Armv8.6; Cortex-A510/A710/X2, Neoverse V1/N2 and later): a 2x8 by 8x2
 *         int8 matrix product accumulated into a 2x2 int32 tile (vmmlaq_s32), 32 products per
 *         instruction.
 *
 * The build stays -march=armv8-a: only the functions below (and the callers that inline them)
 * carry a target attribute, and a kernel calls them only where tsr_neon_dot_level() -- the
 * kernel's HWCAP bits from getauxval, which Linux (and qemu-user, from its -cpu model) fills in
 * -- says the CPU has the instructions.  (gcc 12 needs "arch=armv8.2-a+..." here: with a bare
 * "+dotprod" it refuses to inline arm_neon.h's vdotq_s32, whose own pragma names armv8.2-a.)
 *
 * Exactness: both instructions add their products into int32 lanes modulo 2^32 (the Arm
 * pseudocode truncates the sum to the lane width), and the horizontal reductions (ADDP) wrap the
 * same way, so every result is the true sum modulo 2^32, whatever the order: the same int32 as the
 * portable loops' unsigned (wrapping) sums, bit for bit.
 */
#ifndef TESSERA_NEON_DOT_H
#define TESSERA_NEON_DOT_H
#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__GNUC__)
#include <arm_neon.h>
#include <stdint.h>
#include <string.h>
#if defined(__linux__)
#include <sys/auxv.h>
#endif

#define TSR_NEON_DOT 1
#ifndef AT_HWCAP2
#define AT_HWCAP2 26
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif

#define TSR_DOTPROD_TARGET __attribute__((target("arch=armv8.2-a+dotprod")))
#define TSR_I8MM_TARGET __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))
#define TSR_DOT_INL static inline __attribute__((always_inline))

enum { TSR_DOT_NONE = 0, TSR_DOT_SDOT = 1, TSR_DOT_SMMLA = 2 };

/* the best int8 dot-product instructions this CPU has (SMMLA implies SDOT here: the SMMLA kernels
 * use SDOT for single rows) */
static inline int tsr_neon_dot_level(void) {
#if defined(__linux__)
    const unsigned long h = getauxval(AT_HWCAP), h2 = getauxval(AT_HWCAP2);
    if (!(h & HWCAP_ASIMDDP)) return TSR_DOT_NONE;
    return (h2 & HWCAP2_I8MM) ? TSR_DOT_SMMLA : TSR_DOT_SDOT;
#else
    return TSR_DOT_NONE;
#endif
}

/* ------------------------------------------------------------------ SDOT, mb x 4 rows */
/* res[i * 4 + j] = sum_{k < K} x_i[k] * w_j[k] modulo 2^32, for i < mb (<= 4) and j < 4.
 * x_i = X + i * ldx must be readable up to K rounded up to 16 (its bytes past K are multiplied
 * by zeros); w_j = W[j] exactly K bytes (the last partial 16 are copied into a zeroed buffer).
 * 16 int32x4 accumulators over all of K, reduced by pairwise adds once at the end.  mb is a
 * compile-time constant at each call (always inlined into a switch). */
TSR_DOTPROD_TARGET TSR_DOT_INL void tsr_sdot_4x4(const int8_t *X, int64_t ldx, const int mb,
                                                 const int8_t *const *W, int64_t K, int32_t *res) {
    int32x4_t acc[4][4];
    int8x16_t w[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[i][j] = vdupq_n_s32(0);
    int8_t tail[4][16];
    const int64_t K16 = K & ~(int64_t)15;
    /* one 16-k step: mb x 4 SDOT with the weight vectors already in w[] */
#define TSR_SDOT_STEP(k)                                                                   \
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {                                  \
        if (i < mb) {                                                                      \
            const int8x16_t xv = vld1q_s8(X + i * ldx + (k));                              \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[i][j] = vdotq_s32(acc[i][j], xv, w[j]); \
        }                                                                                  \
    }
    for (int64_t k = 0; k < K16; k += 16) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) w[j] = vld1q_s8(W[j] + k);
        TSR_SDOT_STEP(k)
    }
    if (K16 < K) {   /* the last partial 16: weight bytes copied into zeroed rows */
        memset(tail, 0, sizeof tail);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            memcpy(tail[j], W[j] + K16, (size_t)(K - K16));
            w[j] = vld1q_s8(tail[j]);
        }
        TSR_SDOT_STEP(K16)
    }
#undef TSR_SDOT_STEP
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        if (i < mb)
            vst1q_s32(res + 4 * i, vpaddq_s32(vpaddq_s32(acc[i][0], acc[i][1]), vpaddq_s32(acc[i][2], acc[i][3])));
}

/* ------------------------------------------------------------------ SMMLA, 4 x 4 rows */
/* The same contract as tsr_sdot_4x4 for mb in 2..4 (a missing 4th row repeats the 3rd; its
 * results are not stored).  Per 16 k: each row pair's two 16-byte loads are zipped into
 * [x_a[k..k+8] | x_b[k..k+8]] and [x_a[k+8..k+16] | x_b[k+8..k+16]] (ZIP1/ZIP2 on 64-bit lanes),
 * likewise the weight pairs, and 8 SMMLA (2 row pairs x 2 weight pairs x 2 halves) produce the
 * 2x2 tiles; lanes of tile (p, q) = [r(2p,2q), r(2p,2q+1), r(2p+1,2q), r(2p+1,2q+1)]. */
TSR_I8MM_TARGET TSR_DOT_INL void tsr_smmla_4x4(const int8_t *X, int64_t ldx, const int mb,
                                               const int8_t *const *W, int64_t K, int32_t *res) {
    const int8_t *x[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) x[i] = X + (i < mb ? i : mb - 1) * ldx;
    int32x4_t acc[2][2];
#pragma GCC unroll 2
    for (int p = 0; p < 2; p++) { acc[p][0] = vdupq_n_s32(0); acc[p][1] = vdupq_n_s32(0); }
    int8_t tail[4][16];
    int64x2_t w[4];
    const int64_t K16 = K & ~(int64_t)15;
    /* one 16-k step with the weight rows in w[]: zip them into pairs, then the row pairs */
#define TSR_SMMLA_STEP(k)                                                                              \
    {                                                                                                  \
        int8x16_t b[2][2];                                                                             \
        _Pragma("GCC unroll 2") for (int q = 0; q < 2; q++) {                                          \
            b[q][0] = vreinterpretq_s8_s64(vzip1q_s64(w[2 * q], w[2 * q + 1]));                        \
            b[q][1] = vreinterpretq_s8_s64(vzip2q_s64(w[2 * q], w[2 * q + 1]));                        \
        }                                                                                              \
        _Pragma("GCC unroll 2") for (int p = 0; p < 2; p++) {                                          \
            if (2 * p < mb) {                                                                          \
                const int64x2_t xa = vreinterpretq_s64_s8(vld1q_s8(x[2 * p] + (k)));                   \
                const int64x2_t xb = vreinterpretq_s64_s8(vld1q_s8(x[2 * p + 1] + (k)));               \
                const int8x16_t a0 = vreinterpretq_s8_s64(vzip1q_s64(xa, xb));                         \
                const int8x16_t a1 = vreinterpretq_s8_s64(vzip2q_s64(xa, xb));                         \
                _Pragma("GCC unroll 2") for (int q = 0; q < 2; q++)                                    \
                    acc[p][q] = vmmlaq_s32(vmmlaq_s32(acc[p][q], a0, b[q][0]), a1, b[q][1]);          \
            }                                                                                          \
        }                                                                                              \
    }
    for (int64_t k = 0; k < K16; k += 16) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) w[j] = vreinterpretq_s64_s8(vld1q_s8(W[j] + k));
        TSR_SMMLA_STEP(k)
    }
    if (K16 < K) {   /* the last partial 16: weight bytes copied into zeroed rows */
        memset(tail, 0, sizeof tail);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            memcpy(tail[j], W[j] + K16, (size_t)(K - K16));
            w[j] = vreinterpretq_s64_s8(vld1q_s8(tail[j]));
        }
        TSR_SMMLA_STEP(K16)
    }
#undef TSR_SMMLA_STEP
#pragma GCC unroll 2
    for (int p = 0; p < 2; p++) {
        if (2 * p < mb) {
            const int64x2_t t0 = vreinterpretq_s64_s32(acc[p][0]), t1 = vreinterpretq_s64_s32(acc[p][1]);
            vst1q_s32(res + 8 * p, vreinterpretq_s32_s64(vzip1q_s64(t0, t1)));
            if (2 * p + 1 < mb) vst1q_s32(res + 8 * p + 4, vreinterpretq_s32_s64(vzip2q_s64(t0, t1)));
        }
    }
}

/* ------------------------------------------------------------------ SDOT on int4 nibbles */
/* acc + sum_{j < n} ((wb[j] & 15) - z) * x0[j] + ((wb[j] >> 4) - z) * x1[j] in int32 lanes, n % 16 == 0
 * (the caller's runs; (q - z) lies in [-15, 15], so it is an exact int8 operand of SDOT). */
TSR_DOTPROD_TARGET TSR_DOT_INL int32x4_t tsr_sdot_nibbles(int32x4_t acc, const uint8_t *wb, const int8_t *x0,
                                                          const int8_t *x1, int64_t n, int8x16_t zv) {
    const uint8x16_t lo4 = vdupq_n_u8(15);
    for (int64_t j = 0; j < n; j += 16) {
        const uint8x16_t b = vld1q_u8(wb + j);
        const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, lo4)), zv);
        const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b, 4)), zv);
        acc = vdotq_s32(vdotq_s32(acc, lo, vld1q_s8(x0 + j)), hi, vld1q_s8(x1 + j));
    }
    return acc;
}

#endif
#endif /* TESSERA_NEON_DOT_H */
