/* linear_fp8 for the opencl backend (OpenCL C 1.2): y = act(x @ (weight * weight_scale).T + bias)
 * with fp8 weights (e4m3fn / e5m2) and x quantised to e4m3 on the fly (ops/linear_fp8/__init__.py).
 *
 * Build options: TSR_DTYPE (x's and y's storage type), E5M2 (weight format), SKIND (the scale
 * kind: 0 per tensor, 1 per row, 2 128x128 blocks).
 *
 * f8_quant_rows  x rows -> e4m3 values (as fp32, exact) in a workspace qx [M, K] and fp32 scales
 *                sx [M, KB] (KB = 1, or ceil(K/128) for block weights): the integer contract of
 *                tessera_quant_cl.h (amax NaN as 0, scale = max(amax, 1e-12) / 448, correctly
 *                rounded division, NaN -> 0, saturate, round to nearest even).  One work-group
 *                per row; per-token scales reduce through local memory, 128-blocks one work-item
 *                each.
 * f8_dot14/24    one work-item per DR x DC block of outputs: per K block, the dot products in
 *                explicit float8 vectors (an fp32 sum in a fixed order is not reassociated by the
 *                compiler, so a scalar loop would not vectorise), the weight decoded from its
 *                bits exactly (subnormals, e5m2 inf / NaN included).  Every e4m3 x e4m3 / e5m2
 *                product is exact in fp32; only the sums round.  Epilogue in fp32, this order:
 *                  per tensor / row : y = acc * (sx * sw[n]) + bias[n]
 *                  block            : y = sum_b acc_b * (sx_b * sw[n/128, b]) + bias[n]
 *                then the activation (tessera_quant_cl.h's tsr_qact).
 * Rows / columns past M / N repeat the last one (read, never stored).
 */
#pragma OPENCL FP_CONTRACT OFF
#include "tessera_cl.h"
#include "tessera_quant_cl.h"

#ifndef SKIND
#define SKIND 1
#endif
#ifndef E5M2
#define E5M2 0
#endif
#define QB 128

/* ------------------------------------------------------------------ activations */

inline void quant_span(__global const TSR_T *xr, long j0, long n, float s, __global float *qr) {
    for (long j = j0; j < j0 + n; j++) qr[j] = tsr_dq_e4m3(tsr_q_e4m3(tsr_div_rn(tsr_ld(xr, j), s)));
}

__kernel void f8_quant_rows(__global const TSR_T *x, long ldx, long K, __global float *qx, __global float *sx,
                            __local float *scratch) {
    const long i = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    __global const TSR_T *xr = x + i * ldx;
    __global float *qr = qx + i * K;
#if SKIND == 2
    const long KB = (K + QB - 1) / QB;
    for (long b = lid; b < KB; b += L) {
        const long j0 = b * QB, n = min((long)QB, K - j0);
        uint am = 0;
        for (long j = j0; j < j0 + n; j++) { const uint k = tsr_q_abs_key(tsr_ld(xr, j)); am = k > am ? k : am; }
        const float s = tsr_q_scale(as_float(am), 448.0f);
        sx[i * KB + b] = s;
        quant_span(xr, j0, n, s, qr);
    }
#else
    /* work-item lid: a contiguous chunk (a multiple of 16 columns) */
    const long C = ((K + L - 1) / L + 15) & ~15L, c0 = min(K, (long)lid * C), c1 = min(K, c0 + C);
    uint am = 0;
    for (long j = c0; j < c1; j++) { const uint k = tsr_q_abs_key(tsr_ld(xr, j)); am = k > am ? k : am; }
    const float s = tsr_q_scale(tsr_wg_max(as_float(am), scratch), 448.0f);
    if (lid == 0) sx[i] = s;
    quant_span(xr, c0, c1 - c0, s, qr);
#endif
}

/* ------------------------------------------------------------------ weights */
/* 8 fp8 codes (widened to uint) -> fp32, exact; vector ternaries and bit tricks, no built-in
 * calls (select / convert_float8 are out-of-line calls on PoCL 3.0): a small integer m is
 * as_float(2^23 bits | m) - 2^23 */
inline float8 dq8(uint8 b) {
#if E5M2
    const uint8 e = (b >> 2) & 31u, m = b & 3u;
    const float8 sub = (as_float8(m | 0x4B000000u) - 8388608.0f) * 0x1p-16f;
    float8 v = e == 0u ? sub : as_float8(((e + 112u) << 23) | (m << 21));
    v = e == 31u ? (m == 0u ? (float8)(INFINITY) : (float8)(NAN)) : v;
#else
    const uint8 e = (b >> 3) & 15u, m = b & 7u;
    const float8 sub = (as_float8(m | 0x4B000000u) - 8388608.0f) * 0x1p-9f;
    float8 v = e == 0u ? sub : as_float8(((e + 120u) << 23) | (m << 20));
    v = (b & 0x7fu) == 0x7fu ? (float8)(NAN) : v;
#endif
    return as_float8(as_uint8(v) | ((b & 0x80u) << 24));
}

inline float dq1(uchar b) {
#if E5M2
    return tsr_dq_e5m2(b);
#else
    return tsr_dq_e4m3(b);
#endif
}

inline float hsum8(float8 v) {
    const float4 a = v.lo + v.hi;
    const float2 c = a.lo + a.hi;
    return c.x + c.y;
}

/* the weight scale of output n, K block b */
inline float wscale(__global const float *sw, long n, long b, long K) {
#if SKIND == 0
    return sw[0];
#elif SKIND == 1
    return sw[n];
#else
    return sw[(n / QB) * ((K + QB - 1) / QB) + b];
#endif
}

/* ------------------------------------------------------------------ matmul */
#define DOT_ARGS (__global const float *qx, __global const float *sx, __global const uchar *w,         \
                  __global const float *sw, __global const float *bias, int has_bias, int act,          \
                  long M, long N, long K, __global TSR_T *y)
#define DOT_BODY(DR, DC) {                                                                          \
    const long m0 = get_global_id(0) * DR, n0 = get_global_id(1) * DC;                            \
    if (n0 >= N || m0 >= M) return;                                                             \
    const long KB = SKIND == 2 ? (K + QB - 1) / QB : 1, BS = SKIND == 2 ? QB : K;               \
    long mm[DR], nn[DC];                                                                        \
    _Pragma("unroll") for (int r = 0; r < DR; r++) mm[r] = min(m0 + r, M - 1);                 \
    _Pragma("unroll") for (int c = 0; c < DC; c++) nn[c] = min(n0 + c, N - 1);                 \
    float t[DR][DC];                                                                            \
    _Pragma("unroll") for (int r = 0; r < DR; r++)                                              \
        _Pragma("unroll") for (int c = 0; c < DC; c++) t[r][c] = 0.0f;                          \
    for (long b = 0; b < KB; b++) {                                                             \
        const long j0 = b * BS, j1 = min(K, j0 + BS), j8 = j0 + (j1 - j0) / 8 * 8;              \
        float8 acc[DR][DC];                                                                     \
        _Pragma("unroll") for (int r = 0; r < DR; r++)                                          \
            _Pragma("unroll") for (int c = 0; c < DC; c++) acc[r][c] = (float8)(0.0f);          \
        for (long j = j0; j < j8; j += 8) {                                                     \
            float8 xv[DR];                                                                      \
            _Pragma("unroll") for (int r = 0; r < DR; r++) xv[r] = tsr_ld8f(qx + mm[r] * K, j);  \
            _Pragma("unroll") for (int c = 0; c < DC; c++) {                                    \
                const float8 wv = dq8((uint8)(TSR_G8(w + nn[c] * K, j)));                       \
                _Pragma("unroll") for (int r = 0; r < DR; r++) acc[r][c] += xv[r] * wv;         \
            }                                                                                   \
        }                                                                                       \
        float tail[DR][DC];                                                                     \
        _Pragma("unroll") for (int r = 0; r < DR; r++)                                          \
            _Pragma("unroll") for (int c = 0; c < DC; c++) tail[r][c] = 0.0f;                   \
        for (long j = j8; j < j1; j++)                                                          \
            _Pragma("unroll") for (int c = 0; c < DC; c++) {                                    \
                const float wv = dq1(w[nn[c] * K + j]);                                         \
                _Pragma("unroll") for (int r = 0; r < DR; r++) tail[r][c] += qx[mm[r] * K + j] * wv; \
            }                                                                                   \
        _Pragma("unroll") for (int r = 0; r < DR; r++)                                          \
            _Pragma("unroll") for (int c = 0; c < DC; c++)                                      \
                t[r][c] += (hsum8(acc[r][c]) + tail[r][c]) * (sx[mm[r] * KB + b] * wscale(sw, nn[c], b, K)); \
    }                                                                                           \
    for (int r = 0; r < DR; r++)                                                                \
        for (int c = 0; c < DC; c++) {                                                          \
            const long m = m0 + r, n = n0 + c;                                                  \
            if (m >= M || n >= N) continue;                                                     \
            float v = t[r][c];                                                                  \
            if (has_bias) v = v + bias[n];                                                      \
            tsr_st(y, m * N + n, tsr_qact(v, act));                                             \
        }                                                                                       \
}

__kernel void f8_dot14 DOT_ARGS DOT_BODY(1, 4)
__kernel void f8_dot24 DOT_ARGS DOT_BODY(2, 4)
