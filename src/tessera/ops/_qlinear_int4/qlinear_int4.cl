/* Int4-weight linears for the opencl backend (OpenCL C 1.2): W4A16 (MODE 0) and W4A8 (MODE 1).
 *
 * Weight w uint8 [N, K/2] (byte j = code[2j] | code[2j+1] << 4, low nibble = even k), scale s
 * fp32 [N, K/G], zero z uint8 [N, K/G] or none (= 8); K % G == 0, G in {32, 64, 128}.
 *
 *   W4A16: y = act(sum_g s_g * sum_{k in g} x_k * (q_k - z_g) + bias)          fp32 sums
 *   W4A8 : qx, sx = per-token int8 (ops/_qlinear_int8's qi8_quant_rows: the integer contract)
 *          acc_g = sum_{k in g} qx_k * (q_k - z_g)                              int32, exact
 *          y = act(sx * sum_g fp32(acc_g) * s_g + bias)                         fp32, groups in order
 *
 * as ops/_qlinear_int4/qlinear_int4.c's portable loops.  Build options: MODE, TSR_DTYPE (x's and
 * y's storage type; W4A8 reads int8 qx), and the activation code is a run-time argument
 * (tessera_quant_cl.h's tsr_qact).
 *
 * One work-item per DR x DC block of outputs: for each group, a loop over the group's weight bytes
 * (both nibbles against x[2j], x[2j + 1]) with the zero point loop-invariant -- the loop a CPU
 * compiler vectorises (PoCL: measured ~10x faster than a local-memory tiled kernel, whose
 * work-item loops it does not vectorise).  q4_dot11 / q4_dot14 for decode (M <= 2: the weight is
 * read once), q4_dot24 (2 x 4 outputs: each weight byte serves two x rows) above; the launcher
 * picks them (opencl.py BLOCK).
 * Rows / columns past M / N repeat the last one (read, never stored).  On a GPU these loops read
 * with a stride of one weight row between neighbouring work-items: correct, not coalesced.
 */
#pragma OPENCL FP_CONTRACT OFF
#include "tessera_cl.h"
#include "tessera_quant_cl.h"

#ifndef MODE
#define MODE 0
#endif
/* sums across groups: with fp64 (TSR_Q_FP64) group total * s_g and their sum are in double
 * (W4A8: exact products of exact integers; the rounding happens once, at the end), else fp32 as
 * the cpu kernel (inputs of magnitude ~100 then come close to the fp32 tolerance) */
#if TSR_Q_FP64
#define T_T double
#else
#define T_T float
#endif
#if MODE == 0
#define X_T float   /* the q4_prep_x workspace */
#else
#define X_T char
#endif

#if MODE == 0
/* W4A16's x, once per call: fp32, each 16-column chunk permuted to [8 even k][8 odd k], so that
 * 8 weight bytes meet their x values as two plain vector loads (no shuffles per weight row) */
__kernel void q4_prep_x(__global const TSR_T *x, long ldx, long K, __global float *xp) {
    const long i = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    for (long j = lid; j < K; j += L) {
        const long c = j & 15;
        xp[i * K + (j - c) + ((c & 1) ? 8 + (c >> 1) : (c >> 1))] = tsr_ld(x + i * ldx, j);
    }
}

inline T_T hsum8(float8 v) {
    const float4 a = v.lo + v.hi;   /* lanes in pairs: fp32, then the rest in T_T */
    return ((T_T)a.x + (T_T)a.y) + ((T_T)a.z + (T_T)a.w);
}

/* W4A16 group sums with explicit float8 vectors (x even / odd lanes against the low / high
 * nibbles of 8 weight bytes): fp32 sums in a fixed order are not reassociated, so a scalar
 * loop would not vectorise.  Loads are tessera_cl.h's merged scalar accesses and a nibble n
 * becomes n - z exactly as as_float(2^23 bits | n) - (2^23 + z): vload8 / convert_float8 are
 * out-of-line calls on PoCL 3.0. */
#define GROUP_SUMS(DR, DC)                                                                        \
        float8 acc[DR][DC];                                                                     \
        _Pragma("unroll") for (int r = 0; r < DR; r++)                                          \
            _Pragma("unroll") for (int c = 0; c < DC; c++) acc[r][c] = (float8)(0.0f);          \
        for (long j = 0; j < GB; j += 8) {                                                      \
            const long k = 2 * (g * GB + j);                                                    \
            float8 xe[DR], xo[DR];                                                              \
            _Pragma("unroll") for (int r = 0; r < DR; r++) {                                    \
                xe[r] = tsr_ld8f(xr[r], k);                                                     \
                xo[r] = tsr_ld8f(xr[r], k + 8);                                                 \
            }                                                                                   \
            _Pragma("unroll") for (int c = 0; c < DC; c++) {                                    \
                const uint8 bw = (uint8)(TSR_G8(wb[c], j));                                     \
                const float8 q0 = as_float8((bw & 15u) | 0x4B000000u) - zc[c];                  \
                const float8 q1 = as_float8((bw >> 4) | 0x4B000000u) - zc[c];                   \
                _Pragma("unroll") for (int r = 0; r < DR; r++) acc[r][c] += xe[r] * q0 + xo[r] * q1; \
            }                                                                                   \
        }                                                                                       \
        _Pragma("unroll") for (int c = 0; c < DC; c++) {                                        \
            const T_T s = ws[nn[c] * NG + g];                                                   \
            _Pragma("unroll") for (int r = 0; r < DR; r++) t[r][c] += hsum8(acc[r][c]) * s;     \
        }
#define ZC_T float
#define ZC_OF(z) (8388608.0f + (float)(z))   /* 2^23 + z: see GROUP_SUMS */
#elif TSR_HAS_INT_DOT
/* W4A8 group sums with cl_khr_integer_dot_product (tessera_cl.h tsr_dot4_su; emulated in tests):
 * 2 weight bytes = 4 codes q against 4 x values, one dot(char4 x, uchar4 q) each, and the zero
 * point once per group: sum x (q - z) = sum x q - z * sum x.  Exact int32 sums, so the same
 * integers as the scalar loop below (GB = G / 2 is even). */
#define GROUP_SUMS(DR, DC)                                                                        \
        int acc[DR][DC], xs[DR];                                                                \
        _Pragma("unroll") for (int r = 0; r < DR; r++) {                                        \
            xs[r] = 0;                                                                          \
            _Pragma("unroll") for (int c = 0; c < DC; c++) acc[r][c] = 0;                       \
        }                                                                                       \
        for (long j = 0; j < GB; j += 2) {                                                      \
            const long k = 2 * (g * GB + j);                                                    \
            char4 x4[DR];                                                                       \
            _Pragma("unroll") for (int r = 0; r < DR; r++) {                                    \
                x4[r] = (char4)(xr[r][k], xr[r][k + 1], xr[r][k + 2], xr[r][k + 3]);            \
                xs[r] += tsr_dot4(x4[r], (char4)(1));                                           \
            }                                                                                   \
            _Pragma("unroll") for (int c = 0; c < DC; c++) {                                    \
                const uchar b0 = wb[c][j], b1 = wb[c][j + 1];                                   \
                const uchar4 q4 = (uchar4)((uchar)(b0 & 15), (uchar)(b0 >> 4), (uchar)(b1 & 15), (uchar)(b1 >> 4)); \
                _Pragma("unroll") for (int r = 0; r < DR; r++) acc[r][c] += tsr_dot4_su(x4[r], q4); \
            }                                                                                   \
        }                                                                                       \
        _Pragma("unroll") for (int c = 0; c < DC; c++) {                                        \
            const T_T s = ws[nn[c] * NG + g];                                                   \
            _Pragma("unroll") for (int r = 0; r < DR; r++)                                      \
                t[r][c] += (T_T)(acc[r][c] - zc[c] * xs[r]) * s;                                \
        }
#define ZC_T int
#define ZC_OF(z) ((int)(z))
#else
/* W4A8 group sums: exact int32, a scalar loop (integer sums vectorise as written) */
#define GROUP_SUMS(DR, DC)                                                                        \
        int acc[DR][DC];                                                                        \
        _Pragma("unroll") for (int r = 0; r < DR; r++)                                          \
            _Pragma("unroll") for (int c = 0; c < DC; c++) acc[r][c] = 0;                       \
        for (long j = 0; j < GB; j++) {                                                         \
            const long k = 2 * (g * GB + j);                                                    \
            int x0[DR], x1[DR];                                                                 \
            _Pragma("unroll") for (int r = 0; r < DR; r++) {                                    \
                x0[r] = xr[r][k];                                                               \
                x1[r] = xr[r][k + 1];                                                           \
            }                                                                                   \
            _Pragma("unroll") for (int c = 0; c < DC; c++) {                                    \
                const uint b = wb[c][j];                                                        \
                const int q0 = (int)(b & 15u) - zc[c], q1 = (int)(b >> 4) - zc[c];              \
                _Pragma("unroll") for (int r = 0; r < DR; r++) acc[r][c] += x0[r] * q0 + x1[r] * q1; \
            }                                                                                   \
        }                                                                                       \
        _Pragma("unroll") for (int c = 0; c < DC; c++) {                                        \
            const T_T s = ws[nn[c] * NG + g];                                                   \
            _Pragma("unroll") for (int r = 0; r < DR; r++) t[r][c] += (T_T)acc[r][c] * s;       \
        }
#define ZC_T int
#define ZC_OF(z) ((int)(z))
#endif

#define DOT_ARGS (__global const X_T *x, long ldx, __global const float *sx,                           \
                  __global const uchar *w, __global const float *ws, __global const uchar *wz,          \
                  int has_zero, __global const float *bias, int has_bias, int act,                      \
                  long M, long N, long K, long G, __global TSR_T *y)
#define DOT_BODY(DR, DC) {                                                                          \
    const long m0 = get_global_id(0) * DR, n0 = get_global_id(1) * DC;                            \
    if (n0 >= N || m0 >= M) return;                                                             \
    const long NG = K / G, KB = K / 2, GB = G / 2;                                              \
    __global const X_T *xr[DR];                                                                 \
    long nn[DC];                                                                                \
    _Pragma("unroll") for (int r = 0; r < DR; r++) xr[r] = x + min(m0 + r, M - 1) * ldx;        \
    _Pragma("unroll") for (int c = 0; c < DC; c++) nn[c] = min(n0 + c, N - 1);                  \
    T_T t[DR][DC];                                                                              \
    _Pragma("unroll") for (int r = 0; r < DR; r++)                                              \
        _Pragma("unroll") for (int c = 0; c < DC; c++) t[r][c] = 0;                             \
    for (long g = 0; g < NG; g++) {                                                             \
        __global const uchar *wb[DC];                                                           \
        ZC_T zc[DC];                                                                            \
        _Pragma("unroll") for (int c = 0; c < DC; c++) {                                        \
            wb[c] = w + nn[c] * KB + g * GB;                                                    \
            zc[c] = ZC_OF(has_zero ? wz[nn[c] * NG + g] : 8);                                   \
        }                                                                                       \
        GROUP_SUMS(DR, DC)                                                                      \
    }                                                                                           \
    for (int r = 0; r < DR; r++)                                                                \
        for (int c = 0; c < DC; c++) {                                                          \
            const long m = m0 + r, n = n0 + c;                                                  \
            if (m >= M || n >= N) continue;                                                     \
            float v = MODE == 1 ? sx[m] * (float)t[r][c] : (float)t[r][c];                      \
            if (has_bias) v = v + bias[n];                                                      \
            tsr_st(y, m * N + n, tsr_qact(v, act));                                             \
        }                                                                                       \
}

__kernel void q4_dot11 DOT_ARGS DOT_BODY(1, 1)
__kernel void q4_dot14 DOT_ARGS DOT_BODY(1, 4)
__kernel void q4_dot24 DOT_ARGS DOT_BODY(2, 4)
