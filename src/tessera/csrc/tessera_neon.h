/* tessera_neon.h -- AArch64 NEON (Armv8.0 baseline) paths of the tessera_cpu.h helpers.
 *
 * Included by tessera_cpu.h when the target is AArch64 (cross-compiled into the cpu:aarch64
 * runner; also what a native Arm build of the cpu backend gets).  The portable C of the kernels
 * already auto-vectorises to NEON for fp32/bf16 (vector extensions -> fmla/fmul on v-registers);
 * what the compiler cannot find by itself is fp16 <-> fp32: Armv8.0 has it in every core as
 * FCVTL/FCVTN (4 lanes per instruction) while the portable path converts one element at a time
 * with integer code.  Everything here is exact and matches tsr_h2f / tsr_f2h:
 *   fp16 -> fp32   FCVTL is exact (every half is a float); subnormal halves are normal floats.
 *   fp32 -> fp16   FCVTN rounds to nearest even (the FPCR default, which Linux keeps), overflow
 *                  goes to +-inf, fp16 subnormals are produced (FZ16 is off by default).  A NaN
 *                  stays a NaN (its payload's top bits are kept, as x86's VCVTPS2PH does; the
 *                  portable tsr_f2h returns the canonical quiet NaN: NaN payloads are not part of
 *                  the contract).
 */
#ifndef TESSERA_NEON_H
#define TESSERA_NEON_H
#include <arm_neon.h>
#include <stdint.h>

#define TSR_NEON 1

/* n fp16 values (bits) at s -> fp32 at d; the tail (n % 4) is left to the caller */
static inline int64_t tsr_neon_h2f(float *restrict d, const uint16_t *restrict s, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(s + i));
        vst1q_f32(d + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(d + i + 4, vcvt_high_f32_f16(h));
    }
    for (; i + 4 <= n; i += 4) vst1q_f32(d + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(s + i))));
    return i;
}

/* n fp32 values at s -> fp16 bits at d (round to nearest even); returns how many were done */
static inline int64_t tsr_neon_f2h(uint16_t *restrict d, const float *restrict s, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x8_t h = vcvt_high_f16_f32(vcvt_f16_f32(vld1q_f32(s + i)), vld1q_f32(s + i + 4));
        vst1q_u16(d + i, vreinterpretq_u16_f16(h));
    }
    for (; i + 4 <= n; i += 4) vst1_u16(d + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(s + i))));
    return i;
}

/* Integer codes sat(rint(nan0(x / s)), lo, hi) + off of x[0:n), 16 at a time (the tail, n % 16, is
 * left to the caller), as tessera_quant.h's tsr_quant_int: FDIV is the IEEE division; a NaN
 * quotient stays NaN through FMAX/FMIN and FCVTNS turns it into 0 (lo <= 0 <= hi for every
 * caller, so 0 is what nan0-then-clamp gives); clamping to integer bounds before FCVTNS (round to
 * nearest even) equals rounding then clamping.  Codes stored as bytes (out16 == 0: XTN truncates,
 * i.e. the (uint8_t) / (int8_t) cast) or int16.  Returns how many were done. */
static inline int64_t tsr_neon_quant_ints(const float *restrict x, int64_t n, float s, float lo, float hi, int off,
                                          int out16, void *restrict dst) {
    const float32x4_t sv = vdupq_n_f32(s), lv = vdupq_n_f32(lo), hv = vdupq_n_f32(hi);
    const int32x4_t ov = vdupq_n_s32(off);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        int16x8_t h[2];
        for (int t = 0; t < 2; t++) {
            int32x4_t c[2];
            for (int u = 0; u < 2; u++) {
                const float32x4_t q = vdivq_f32(vld1q_f32(x + i + 8 * t + 4 * u), sv);
                c[u] = vaddq_s32(vcvtnq_s32_f32(vminq_f32(vmaxq_f32(q, lv), hv)), ov);
            }
            h[t] = vmovn_high_s32(vmovn_s32(c[0]), c[1]);
        }
        if (out16) {
            vst1q_s16((int16_t *)dst + i, h[0]);
            vst1q_s16((int16_t *)dst + i + 8, h[1]);
        } else {
            vst1q_s8((int8_t *)dst + i, vmovn_high_s16(vmovn_s16(h[0]), h[1]));
        }
    }
    return i;
}

/* tsr_expf (tessera_cpu.h) on 4 lanes: the same clamps, Cody-Waite reduction and polynomial
 * (fused multiply-adds where -ffp-contract=fast fuses the scalar code); x < -87.33 gives 0,
 * x > 88.72 inf, NaN stays NaN (it runs through FMIN/FMAX and the arithmetic). */
static inline float32x4_t tsr_neon_expf(float32x4_t x) {
    const float32x4_t hi = vdupq_n_f32(88.72283935546875f), lo = vdupq_n_f32(-87.33654022216797f);
    const float32x4_t big = vdupq_n_f32(12582912.0f);
    const float32x4_t xc = vmaxq_f32(vminq_f32(x, hi), lo);
    const float32x4_t k = vsubq_f32(vfmaq_f32(big, xc, vdupq_n_f32(1.44269504088896341f)), big);
    float32x4_t r = vfmsq_f32(xc, k, vdupq_n_f32(0.693359375f));
    r = vfmaq_f32(r, k, vdupq_n_f32(2.12194440e-4f));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), vdupq_n_f32(1.9875691500e-4f), r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vaddq_f32(vfmaq_f32(r, r, vmulq_f32(p, r)), vdupq_n_f32(1.0f));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23);
    float32x4_t res = vmulq_f32(p, vreinterpretq_f32_s32(e));
    res = vbslq_f32(vcgtq_f32(x, hi), vdupq_n_f32(__builtin_inff()), res);
    return vbslq_f32(vcltq_f32(x, lo), vdupq_n_f32(0.0f), res);
}

/* silu(x) = x / (1 + exp(-x)) as activations.c's act_silu: +-inf -> +-FLT_MAX first (NaN stays),
 * silu(+inf) = +inf */
static inline float32x4_t tsr_neon_silu(float32x4_t xin) {
    const float32x4_t fmax = vdupq_n_f32(3.40282346638528859812e+38F);
    const float32x4_t x = vmaxq_f32(vminq_f32(xin, fmax), vnegq_f32(fmax));
    const float32x4_t s = vdivq_f32(vdupq_n_f32(1.0f), vaddq_f32(vdupq_n_f32(1.0f), tsr_neon_expf(vnegq_f32(x))));
    return vbslq_f32(vcgtq_f32(xin, fmax), xin, vmulq_f32(x, s));
}

#endif /* TESSERA_NEON_H */
