/* tessera_quant_cl.h: the integer contract (tessera/quant/contract.py, csrc/tessera_quant.h) in
 * OpenCL C 1.2, bit-exact on any conforming device.
 *
 *   amax  : max |x|, NaN counted as 0                 tsr_q_abs0
 *   scale : fmax(amax, 1e-12f) / qmax                 tsr_q_scale
 *   q     : x / scale (correctly rounded), NaN -> 0,   tsr_q_int / tsr_q_e4m3 / _e5m2 / _e4m3fnuz
 *           saturate, round to nearest even
 *
 * Division.  OpenCL 1.2 lets a device round x / y to within 2.5 ulp unless the program is built
 * with -cl-fp32-correctly-rounded-divide-sqrt (an optional device capability), and a code one
 * step off at a rounding tie breaks the contract.  tsr_div_rn is correctly rounded on any device:
 *  - with cl_khr_fp64 (and not TSR_PORTABLE): the double quotient, which OpenCL requires to be
 *    correctly rounded, rounded to float.  Rounding twice is exact here: a quotient computed to
 *    53 >= 2*24 + 2 bits and then rounded to 24 is the correctly rounded one (Figueroa, "When is
 *    double rounding innocuous?", 1995).  Fast on CPUs (PoCL: vdivpd).
 *  - otherwise: the device's quotient corrected with exact residuals.  r = fma(-q, y, x) is exact
 *    once q is within an ulp of x / y (operands and quotient normal); one Newton step brings the
 *    device's quotient there, and the neighbour on the true quotient's side wins if its residual
 *    is smaller.  A quotient of two floats is never exactly halfway between two floats (outside
 *    the subnormal range), so no tie-break is needed.  Special values (0, inf, NaN quotients; an
 *    inf divisor) pass through.  GPUs have a hardware fma; PoCL 3.0 on this CPU runs fma in
 *    software (~5x slower kernels), which is why the fp64 path exists.
 * fma and the basic operations are exact in OpenCL C.  Rounding to an integer is done as
 * (q + 1.5 * 2^23) - 1.5 * 2^23 on a value already saturated to |q| < 2^22 (exact round half to
 * even in the default rounding mode; FP_CONTRACT / fast-math never apply to it here), not with
 * rint / convert_int_rte: PoCL 3.0 compiles those built-ins (and min / max / fmax, vload8, ...)
 * as out-of-line calls that stop its vectoriser.
 *
 * Subnormals.  Devices may flush fp32 subnormals (CL_FP_DENORM is optional), so the fp8 decoders
 * build subnormal fp8 values as (small integer) * 2^-k instead of placing bits under fp32's
 * exponent field; quotients that small round to code 0 in every format anyway.
 *
 * Kernels including this must keep the divisions and products as written: build without
 * -cl-fast-relaxed-math / -cl-unsafe-math-optimizations (tessera never passes them).
 */
#ifndef TESSERA_QUANT_CL_H
#define TESSERA_QUANT_CL_H

#define TSR_QEPS 1e-12f

inline float tsr_nan0(float v) { return v != v ? 0.0f : v; }

/* |v| with NaN as 0: the term of every block statistic */
inline float tsr_q_abs0(float v) { return tsr_nan0(as_float(as_uint(v) & 0x7fffffffu)); }

/* the same as an order key: the uint order of tsr_q_abs_key(v) is the order of tsr_q_abs0(v), and
 * as_float(max of keys) is the amax.  Integer max reductions vectorise where float
 * compare-and-select ones do not (PoCL), and give the same value. */
inline uint tsr_q_abs_key(float v) {
    const uint u = as_uint(v) & 0x7fffffffu;
    return u > 0x7f800000u ? 0u : u;
}

/* TSR_Q_FP64: double is enabled (cl_khr_fp64, not TSR_PORTABLE) for the divisions below and for
 * kernels' exact-product epilogue sums (ops/_qlinear_int4) */
#if defined(cl_khr_fp64) && !TSR_PORTABLE && !defined(TSR_QDIV_FP32)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define TSR_Q_FP64 1
#else
#define TSR_Q_FP64 0
#endif

/* the device's own fp32 quotient (tests/csrc/quant_contract.cl substitutes one that is off by up
 * to two ulps, to check the correction below on a device whose division is exact) */
#ifndef TSR_DIV_APPROX
#define TSR_DIV_APPROX(x, y) ((x) / (y))
#endif

/* x / y rounded to nearest even (see the header comment); rcp ~ 1/y to a few ulps */
inline float tsr_div_rn_r(float x, float y, float rcp) {
#if TSR_Q_FP64
    return (float)((double)x / (double)y);
#else
    float q = TSR_DIV_APPROX(x, y);
    if (q == 0.0f || !isfinite(q) || !isfinite(y)) return q;
    q = q + fma(-q, y, x) * rcp;               /* one Newton step: within an ulp of x / y */
    if (q == 0.0f || !isfinite(q)) return q;
    const float r = fma(-q, y, x);            /* exact */
    /* the neighbour of q towards the true quotient (sign of r / y); q != 0, so +-1 on the bits
     * moves one ulp away from / towards zero */
    const int away = (r > 0.0f) == (y > 0.0f) ? (q > 0.0f) : (q < 0.0f);
    const float c = as_float(as_int(q) + (away ? 1 : -1));
    return fabs(fma(-c, y, x)) < fabs(r) ? c : q;
#endif
}

inline float tsr_div_rn(float x, float y) { return tsr_div_rn_r(x, y, 1.0f / y); }

/* scale = max(amax, 1e-12) / qmax, one correctly rounded division (amax is never NaN here) */
inline float tsr_q_scale(float amax, float qmax) { return tsr_div_rn(amax > TSR_QEPS ? amax : TSR_QEPS, qmax); }

/* round half to even of |q| < 2^22 (see the header comment) */
inline float tsr_q_rne(float q) { return (q + 12582912.0f) - 12582912.0f; }

/* rint(saturate(nan0(q), lo, hi)) as an int (|lo|, |hi| < 2^22): saturating first equals
 * rounding first for integer bounds and keeps the rounding trick in range */
inline int tsr_q_int(float q, float lo, float hi) {
    q = tsr_nan0(q);
    q = q < lo ? lo : (q > hi ? hi : q);
    return (int)tsr_q_rne(q);
}

/* fp32 -> fp8 bits: saturate to +-qmax, round to nearest even to `mb` mantissa bits, rebias;
 * below the smallest normal (sub_lim) the code is rint(|q| * sub_mul) (subnormals).  NaN -> 0.
 * fnuz (AMD e4m3fnuz) has no negative zero: a negative value that rounds to 0 is code 0x00. */
inline uint tsr_q_fp8(float q, float qmax, int mb, uint bias, float sub_lim, float sub_mul, int fnuz) {
    q = tsr_nan0(q);
    q = q < -qmax ? -qmax : (q > qmax ? qmax : q);
    const uint u = as_uint(q) & 0x7fffffffu;   /* |q| by its bits (fabs is a call on PoCL) */
    const float a = as_float(u);
    const int sh = 23 - mb;
    const uint r = u + ((1u << (sh - 1)) - 1u) + ((u >> sh) & 1u);   /* RNE to mb bits */
    const uint normal = (((r >> 23) - bias) << mb) | ((r >> sh) & ((1u << mb) - 1u));
    const uint code = a < sub_lim ? (uint)tsr_q_rne(a * sub_mul) : normal;
    const uint sign = (as_uint(q) >> 24) & 0x80u;
    return code | (fnuz && code == 0u ? 0u : sign);
}

inline uint tsr_q_e4m3(float q) { return tsr_q_fp8(q, 448.0f, 3, 120u, 0.015625f, 512.0f, 0); }
inline uint tsr_q_e5m2(float q) { return tsr_q_fp8(q, 57344.0f, 2, 112u, 6.103515625e-05f, 65536.0f, 0); }
inline uint tsr_q_e4m3fnuz(float q) { return tsr_q_fp8(q, 240.0f, 3, 119u, 0.0078125f, 1024.0f, 1); }

/* fp8 bits -> fp32, exact.  e4m3fn: 0x7f / 0xff are NaN; e5m2: exponent 31 is inf / NaN;
 * e4m3fnuz: 0x80 is the NaN (no inf, no -0). */
inline float tsr_dq_e4m3(uint b) {
    const uint e = (b >> 3) & 15u, m = b & 7u;
    float v = e == 0u ? (float)m * 0x1p-9f : as_float(((e + 120u) << 23) | (m << 20));
    v = (b & 0x7fu) == 0x7fu ? NAN : v;
    return (b & 0x80u) ? -v : v;
}

inline float tsr_dq_e5m2(uint b) {
    const uint e = (b >> 2) & 31u, m = b & 3u;
    float v = e == 0u ? (float)m * 0x1p-16f : as_float(((e + 112u) << 23) | (m << 21));
    v = e == 31u ? (m == 0u ? INFINITY : NAN) : v;
    return (b & 0x80u) ? -v : v;
}

inline float tsr_dq_e4m3fnuz(uint b) {
    const uint e = (b >> 3) & 15u, m = b & 7u;
    float v = e == 0u ? (float)m * 0x1p-10f : as_float(((e + 119u) << 23) | (m << 20));
    v = (b & 0x80u) ? -v : v;
    return b == 0x80u ? NAN : v;
}

/* The float epilogue's activation of every quantised linear (codes of ops/_qlinear_int8/ref.py
 * ACT_CODE): 0 none, 1 relu (NaN stays NaN), 2 gelu (erf), 3 gelu_tanh, 4 silu, in fp32.
 * gelu = v * Phi(v) with Phi(-|v|) = erfc(|v| / sqrt2) / 2 (no 1 + erf cancellation for v < 0);
 * gelu_tanh = v * sigmoid(2u), u = sqrt(2/pi) (v + 0.044715 v^3) (= 0.5 v (1 + tanh u));
 * silu = v * sigmoid(v).  The builtins' accuracy (exp <= 3 ulp, erfc <= 16 ulp) is far inside
 * the linears' fp32 tolerance; the cpu backend's polynomial versions are not bit-identical. */
inline float tsr_qact(float v, int act) {
    if (act == 1) return v < 0.0f ? 0.0f : v;
    if (act == 2) {
        const float h = 0.5f * erfc(fabs(v) * 0.70710678118654752f);
        return v * (v < 0.0f ? h : 1.0f - h);
    }
    if (act == 3) {
        const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
        return v / (1.0f + exp(-2.0f * u));
    }
    if (act == 4) return v / (1.0f + exp(-v));
    return v;
}

#endif
