/* tessera_quant.h: the integer contract of tessera/quant/contract.py, in C (scalar, exact).
 *
 * Kernels that quantise or dequantise include this after tessera_cpu.h.  Every function is
 * exact under the default rounding mode (round to nearest even) and needs the file to be built
 * without -ffast-math / -freciprocal-math (the divisions must stay divisions: tessera's JIT
 * flags never enable those).
 *
 *   amax  : max |x|, NaN counted as 0             tsr_absmax
 *   scale : fmaxf(amax, 1e-12f) / qmax            tsr_scale_for
 *   q     : x / scale, NaN -> 0, saturate, rint   tsr_quant_int / tsr_f32_to_e4m3 / _e5m2
 */
#ifndef TESSERA_QUANT_H
#define TESSERA_QUANT_H

#include "tessera_cpu.h"

#define TSR_QEPS 1e-12f

static inline float tsr_nan0(float v) { return v != v ? 0.0f : v; }

static inline float tsr_absmax(const float *x, int64_t n) {
    float amax = 0.0f;
    int64_t i = 0;
#if defined(TSR_NEON)
    /* NEON's FMAX returns NaN when either operand is one: NaN lanes are zeroed first (x == x);
     * max is exact, so the order changes nothing */
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0;
    for (; i + 8 <= n; i += 8) {
        const float32x4_t v0 = vld1q_f32(x + i), v1 = vld1q_f32(x + i + 4);
        a0 = vmaxq_f32(a0, vreinterpretq_f32_u32(vandq_u32(vceqq_f32(v0, v0), vreinterpretq_u32_f32(vabsq_f32(v0)))));
        a1 = vmaxq_f32(a1, vreinterpretq_f32_u32(vandq_u32(vceqq_f32(v1, v1), vreinterpretq_u32_f32(vabsq_f32(v1)))));
    }
    amax = vmaxvq_f32(vmaxq_f32(a0, a1));
#elif defined(TSR_RVV)
    return tsr_rvv_absmax(x, n);   /* tessera_rvv.h: NaN lanes masked out, all n */
#endif
    for (; i < n; i++) {
        const float a = tsr_nan0(fabsf(x[i]));
        amax = a > amax ? a : amax;
    }
    return amax;
}

static inline float tsr_scale_for(float amax, float qmax) { return fmaxf(amax, TSR_QEPS) / qmax; }

/* rint(saturate(nan0(q), lo, hi)): saturating before rounding is equivalent to rounding then
 * saturating for integer bounds, and keeps the float -> int conversion in range. */
static inline int32_t tsr_quant_int(float q, float lo, float hi) {
    q = tsr_nan0(q);
    q = q < lo ? lo : (q > hi ? hi : q);
    return (int32_t)rintf(q);
}

/* fp32 -> OCP e4m3fn bits (bias 7, max 448, no inf), saturating, round to nearest even,
 * subnormals (multiples of 2^-9 below 2^-6) included; NaN -> 0. */
static inline uint8_t tsr_f32_to_e4m3(float q) {
    q = tsr_nan0(q);
    q = q < -448.0f ? -448.0f : (q > 448.0f ? 448.0f : q);
    const float a = fabsf(q);
    const uint32_t u = tsr_bits(a), sign = (tsr_bits(q) >> 24) & 0x80u;
    uint32_t code;
    if (a < 0.015625f) {
        code = (uint32_t)rintf(a * 512.0f);
    } else {
        const uint32_t r = u + 0x7ffffu + ((u >> 20) & 1u);   /* RNE to 3 mantissa bits */
        code = (((r >> 23) - 120u) << 3) | ((r >> 20) & 7u);
    }
    return (uint8_t)(code | sign);
}

/* fp32 -> OCP e5m2 bits (bias 15, max 57344), saturating (never inf), RNE, subnormals
 * (multiples of 2^-16 below 2^-14) included; NaN -> 0. */
static inline uint8_t tsr_f32_to_e5m2(float q) {
    q = tsr_nan0(q);
    q = q < -57344.0f ? -57344.0f : (q > 57344.0f ? 57344.0f : q);
    const float a = fabsf(q);
    const uint32_t u = tsr_bits(a), sign = (tsr_bits(q) >> 24) & 0x80u;
    uint32_t code;
    if (a < 6.103515625e-05f) {
        code = (uint32_t)rintf(a * 65536.0f);
    } else {
        const uint32_t r = u + 0xfffffu + ((u >> 21) & 1u);   /* RNE to 2 mantissa bits */
        code = (((r >> 23) - 112u) << 2) | ((r >> 21) & 3u);
    }
    return (uint8_t)(code | sign);
}

/* e4m3fn bits -> fp32, exact: the 7 magnitude bits placed under fp32's exponent field give
 * the value times 2^-120 (subnormals become fp32 denormals); one multiply rescales.  0x7f/0xff
 * (NaN) decode to NaN. */
static inline float tsr_e4m3_to_f32(uint8_t b) {
    if ((b & 0x7fu) == 0x7fu) return NAN;
    const float m = tsr_float(((uint32_t)(b & 0x7fu)) << 20) * 0x1p120f;
    return (b & 0x80u) ? -m : m;
}

/* e5m2 bits -> fp32, exact; exponent 31 is inf (mantissa 0) or NaN. */
static inline float tsr_e5m2_to_f32(uint8_t b) {
    const uint32_t mag = b & 0x7fu;
    float m;
    if (mag >= 0x7cu) m = mag == 0x7cu ? INFINITY : NAN;
    else m = tsr_float(mag << 21) * 0x1p112f;
    return (b & 0x80u) ? -m : m;
}

#endif
