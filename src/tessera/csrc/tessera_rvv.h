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

#endif /* TESSERA_RVV_H */
