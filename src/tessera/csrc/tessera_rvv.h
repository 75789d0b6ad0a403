/* tessera_rvv.h -- RISC-V Vector 1.0 paths of the tessera_cpu.h helpers (intrinsics, VLA).
 *
 * Included by tessera_cpu.h when the target has the V extension (clang-19 -march=rv64gcv: the
 * cpu:riscv64 runner).  The fp32 and bf16 arithmetic of the kernels is vectorised by the
 * compiler (GCC/Clang vector extensions lower to RVV with a fixed vl of 16 lanes, correct at
 * any VLEN >= 128).  fp16 <-> fp32 is not: the base V extension has no half-precision
 * conversion (that is Zvfhmin, optional), and the portable code converts one element at a time.
 * These loops do it with integer vector operations, vector-length agnostic: each strip asks
 * vsetvl for as many lanes as the hardware has (LMUL 2 for the 16-bit side, 4 for the 32-bit
 * side), so one binary uses 8, 16 or 32 lanes per m1 register at VLEN 128, 256 or 512.
 *
 * Numerics: bit-exact with tsr_h2f / tsr_f2h (the portable scalar conversions):
 *   fp16 -> fp32   normal: rebias the exponent (+112) and shift; inf/NaN: exponent 255,
 *                  mantissa kept; zero/subnormal: m * 2^-24 (exact in fp32), computed in fp32.
 *   fp32 -> fp16   round to nearest even by integer add (0xc8000fff + lsb: rebias and round in one
 *                  add), >= 65520 -> inf, NaN -> quiet NaN 0x7e00, results below 2^-14 through the
 *                  FPU (x + 0.5f rounds at 2^-24, RNE), as tsr_f2h.
 */
#ifndef TESSERA_RVV_H
#define TESSERA_RVV_H
#include <riscv_vector.h>
#include <stdint.h>

#define TSR_RVV 1

/* n fp16 values (bits) at s -> fp32 at d (all n, strip-mined) */
static inline int64_t tsr_rvv_h2f(float *restrict d, const uint16_t *restrict s, int64_t n) {
    for (int64_t i = 0; i < n;) {
        size_t vl = __riscv_vsetvl_e16m2((size_t)(n - i));
        vuint32m4_t w = __riscv_vzext_vf2_u32m4(__riscv_vle16_v_u16m2(s + i, vl), vl);
        vuint32m4_t sign = __riscv_vsll_vx_u32m4(__riscv_vand_vx_u32m4(w, 0x8000u, vl), 16, vl);
        vuint32m4_t e = __riscv_vand_vx_u32m4(__riscv_vsrl_vx_u32m4(w, 10, vl), 0x1fu, vl);
        vuint32m4_t m = __riscv_vand_vx_u32m4(w, 0x3ffu, vl);
        /* normal: ((e + 112) << 23) | (m << 13) */
        vuint32m4_t r = __riscv_vor_vv_u32m4(__riscv_vsll_vx_u32m4(__riscv_vadd_vx_u32m4(e, 112u, vl), 23, vl),
                                             __riscv_vsll_vx_u32m4(m, 13, vl), vl);
        /* inf / NaN: exponent 255, mantissa kept */
        vbool8_t special = __riscv_vmseq_vx_u32m4_b8(e, 0x1fu, vl);
        r = __riscv_vor_vx_u32m4_mu(special, r, __riscv_vsll_vx_u32m4(m, 13, vl), 0x7f800000u, vl);
        /* zero / subnormal: m * 2^-24, exact */
        vbool8_t tiny = __riscv_vmseq_vx_u32m4_b8(e, 0u, vl);
        vfloat32m4_t sub = __riscv_vfmul_vf_f32m4(__riscv_vfcvt_f_xu_v_f32m4(m, vl), 5.9604644775390625e-8f, vl);
        r = __riscv_vmerge_vvm_u32m4(r, __riscv_vreinterpret_v_f32m4_u32m4(sub), tiny, vl);
        r = __riscv_vor_vv_u32m4(r, sign, vl);
        __riscv_vse32_v_f32m4(d + i, __riscv_vreinterpret_v_u32m4_f32m4(r), vl);
        i += (int64_t)vl;
    }
    return n;
}

/* n fp32 values at s -> fp16 bits at d (round to nearest even; all n, strip-mined) */
static inline int64_t tsr_rvv_f2h(uint16_t *restrict d, const float *restrict s, int64_t n) {
    for (int64_t i = 0; i < n;) {
        size_t vl = __riscv_vsetvl_e32m4((size_t)(n - i));
        vuint32m4_t u = __riscv_vle32_v_u32m4((const uint32_t *)(s + i), vl);
        vuint32m4_t sign = __riscv_vand_vx_u32m4(__riscv_vsrl_vx_u32m4(u, 16, vl), 0x8000u, vl);
        vuint32m4_t x = __riscv_vand_vx_u32m4(u, 0x7fffffffu, vl);
        /* normal range: rebias and round to nearest even in one add */
        vuint32m4_t lsb = __riscv_vand_vx_u32m4(__riscv_vsrl_vx_u32m4(x, 13, vl), 1u, vl);
        vuint32m4_t r = __riscv_vsrl_vx_u32m4(
            __riscv_vadd_vv_u32m4(__riscv_vadd_vx_u32m4(x, 0xc8000fffu, vl), lsb, vl), 13, vl);
        /* below 2^-14: the FPU rounds x + 0.5f at 2^-24 (RNE); the half is the low bits */
        vbool8_t tiny = __riscv_vmsltu_vx_u32m4_b8(x, 0x38800000u, vl);
        vfloat32m4_t a = __riscv_vfadd_vf_f32m4(__riscv_vreinterpret_v_u32m4_f32m4(x), 0.5f, vl);
        r = __riscv_vmerge_vvm_u32m4(r, __riscv_vsub_vx_u32m4(__riscv_vreinterpret_v_f32m4_u32m4(a), 0x3f000000u, vl),
                                     tiny, vl);
        /* overflow (>= 65520 rounds up) and inf -> inf; NaN -> quiet NaN */
        r = __riscv_vmerge_vxm_u32m4(r, 0x7c00u, __riscv_vmsgeu_vx_u32m4_b8(x, 0x477ff000u, vl), vl);
        r = __riscv_vmerge_vxm_u32m4(r, 0x7e00u, __riscv_vmsgtu_vx_u32m4_b8(x, 0x7f800000u, vl), vl);
        r = __riscv_vor_vv_u32m4(r, sign, vl);
        __riscv_vse16_v_u16m2(d + i, __riscv_vnsrl_wx_u16m2(r, 0, vl), vl);
        i += (int64_t)vl;
    }
    return n;
}

/* max |x| of x[0:n), NaN counted as 0 (tessera_quant.h's tsr_absmax).  NaN lanes are masked out
 * of the accumulation (vmfeq x == x; RVV's vfmax would already skip a quiet NaN, the mask makes
 * it independent of that); the accumulator starts at 0 and keeps its tail lanes (tumu), and max
 * is exact, so lane order changes nothing.  LMUL 8: 32/64/128 lanes a strip at VLEN 128/256/512. */
static inline float tsr_rvv_absmax(const float *x, int64_t n) {
    const size_t vlmax = __riscv_vsetvlmax_e32m8();
    vfloat32m8_t acc = __riscv_vfmv_v_f_f32m8(0.0f, vlmax);
    for (int64_t i = 0; i < n;) {
        const size_t vl = __riscv_vsetvl_e32m8((size_t)(n - i));
        const vfloat32m8_t v = __riscv_vle32_v_f32m8(x + i, vl);
        const vbool4_t ok = __riscv_vmfeq_vv_f32m8_b4(v, v, vl);
        acc = __riscv_vfmax_vv_f32m8_tumu(ok, acc, acc, __riscv_vfabs_v_f32m8(v, vl), vl);
        i += (int64_t)vl;
    }
    const vfloat32m1_t z = __riscv_vfmv_s_f_f32m1(0.0f, 1);
    return __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredmax_vs_f32m8_f32m1(acc, z, vlmax));
}

/* min(x, 0) and max(x, 0) of x[0:n), NaN counted as 0, as above (masked min/max, exact) */
static inline void tsr_rvv_lohi(const float *x, int64_t n, float *lo, float *hi) {
    const size_t vlmax = __riscv_vsetvlmax_e32m8();
    vfloat32m8_t l = __riscv_vfmv_v_f_f32m8(0.0f, vlmax), h = l;
    for (int64_t i = 0; i < n;) {
        const size_t vl = __riscv_vsetvl_e32m8((size_t)(n - i));
        const vfloat32m8_t v = __riscv_vle32_v_f32m8(x + i, vl);
        const vbool4_t ok = __riscv_vmfeq_vv_f32m8_b4(v, v, vl);
        l = __riscv_vfmin_vv_f32m8_tumu(ok, l, l, v, vl);
        h = __riscv_vfmax_vv_f32m8_tumu(ok, h, h, v, vl);
        i += (int64_t)vl;
    }
    const vfloat32m1_t z = __riscv_vfmv_s_f_f32m1(0.0f, 1);
    *lo = __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredmin_vs_f32m8_f32m1(l, z, vlmax));
    *hi = __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredmax_vs_f32m8_f32m1(h, z, vlmax));
}

/* Integer codes sat(rint(nan0(x / s)), lo, hi) + off of x[0:n) (all n, strip-mined), as
 * tessera_quant.h's tsr_quant_int and tessera_neon.h's tsr_neon_quant_ints: vfdiv is the IEEE
 * division (correctly rounded, like the scalar x / s); NaN quotients become 0 (the clamp's
 * vfmax runs only on ordered lanes, the others take 0 -- lo <= 0 <= hi for every caller, so that
 * is nan0-then-clamp); the clamped value is converted by vfncvt.x.f.w under the dynamic rounding
 * mode (round to nearest even, as rintf; in range after the clamp), offset in int16, then stored
 * as int16 (out16) or narrowed to bytes (vncvt: truncation, the (uint8_t) / (int8_t) cast).
 * LMUL 8 for the fp32 side.  Returns n. */
static inline int64_t tsr_rvv_quant_ints(const float *restrict x, int64_t n, float s, float lo, float hi, int off,
                                         int out16, void *restrict dst) {
    const vfloat32m8_t zero = __riscv_vfmv_v_f_f32m8(0.0f, __riscv_vsetvlmax_e32m8());
    for (int64_t i = 0; i < n;) {
        const size_t vl = __riscv_vsetvl_e32m8((size_t)(n - i));
        vfloat32m8_t q = __riscv_vfdiv_vf_f32m8(__riscv_vle32_v_f32m8(x + i, vl), s, vl);
        const vbool4_t ok = __riscv_vmfeq_vv_f32m8_b4(q, q, vl);
        q = __riscv_vfmin_vf_f32m8(__riscv_vfmax_vf_f32m8_mu(ok, zero, q, lo, vl), hi, vl);
        const vint16m4_t c = __riscv_vadd_vx_i16m4(__riscv_vfncvt_x_f_w_i16m4(q, vl), (int16_t)off, vl);
        if (out16)
            __riscv_vse16_v_i16m4((int16_t *)dst + i, c, vl);
        else
            __riscv_vse8_v_i8m2((int8_t *)dst + i, __riscv_vncvt_x_x_w_i8m2(c, vl), vl);
        i += (int64_t)vl;
    }
    return n;
}

#endif /* TESSERA_RVV_H */
