/* int8 matmuls for the opencl backend (OpenCL C 1.2): int_mm, linear_w8a8, linear_a16w8.
 *
 *   acc[m, n] = sum_k a[m, k] * w[n, k]           exact: int32 for 8-bit a, int64 for 16-bit a
 *   y[m, n]   = act(fp32(acc) * (sx[m] * sw[n]) + bias[n])     (linears; fp32, this order)
 *
 * Build options and the output step: qlinear_int8.h.  This program: the linears' activation
 * quantisation and the matmul for CPU devices; qlinear_int8_tiled.cl holds the GPU matmuls.
 *
 * qi8_quant_rows  the linears' activations: one work-group per row, amax (NaN as 0; integer
 *                 order keys, each work-item a contiguous chunk) through local memory, scale =
 *                 max(amax, 1e-12) / QMAX, q = sat(rint(x / scale)) with a correctly rounded
 *                 division (tessera_quant_cl.h): the integer contract, the same integers as the
 *                 cpu kernel and triton_lang.quantize_rows, into a workspace.
 * qi8_dot11/24    per-work-item dot products along K (PoCL: a local-memory tiled GEMM runs ~10x
 *                 slower, its work-item loops do not vectorise).
 * Integer sums are exact in any order (8-bit: |acc| <= K * 2^14 < 2^31 for K <= 131071, enforced).
 */
#pragma OPENCL FP_CONTRACT OFF
#include "qlinear_int8.h"

/* ------------------------------------------------------------------ activations */
__kernel void qi8_quant_rows(__global const TSR_T *x, long ldx, long K, __global A_T *qa, __global float *sx,
                             __local float *scratch) {
    const long i = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    __global const TSR_T *xr = x + i * ldx;
    __global A_T *qr = qa + i * K;
    const long C = ((K + L - 1) / L + 15) & ~15L, c0 = min(K, (long)lid * C), c1 = min(K, c0 + C);
    uint am = 0;
    for (long j = c0; j < c1; j++) { const uint k = tsr_q_abs_key(tsr_ld(xr, j)); am = k > am ? k : am; }
    const float s = tsr_q_scale(tsr_wg_max(as_float(am), scratch), QMAXA);
    if (lid == 0) sx[i] = s;
    for (long j = c0; j < c1; j++) qr[j] = (A_T)tsr_q_int(tsr_div_rn(tsr_ld(xr, j), s), -QMAXA, QMAXA);
}

/* ------------------------------------------------------------------ matmul: dot products */
/* One work-item per DR x DC block of outputs (rows m0.., columns n0..), each a dot product along
 * K read with unit stride: the loop a CPU compiler vectorises.  16-bit a: the int32 sums are moved
 * into int64 every 256 k (256 * 2^22 = 2^30).  Rows / columns past M / N repeat the last one
 * (read, never stored).  Global dimension 0 walks row blocks, so a work-group spans the rows of
 * one set of weight rows (opencl.py dot_grid): the weight streams once per 16 row blocks. */
#if ABITS == 8
#define DOT_KC (1L << 40)
#else
#define DOT_KC 256L
#endif
/* QI8_INT_DOT (qlinear_int8.h): the k loop first takes 4 k at a time as char4 dot products (four
 * scalar loads build each char4: any alignment), then the scalar loop below finishes K % 4 */
#if QI8_INT_DOT
#define DOT4_STEPS(DR, DC)                                                                        \
        long k1 = k0;                                                                           \
        for (; k1 + 4 <= min(K, k0 + DOT_KC); k1 += 4) {                                        \
            char4 av4[DR], wv4[DC];                                                             \
            _Pragma("unroll") for (int r = 0; r < DR; r++)                                      \
                av4[r] = (char4)(ar[r][k1], ar[r][k1 + 1], ar[r][k1 + 2], ar[r][k1 + 3]);       \
            _Pragma("unroll") for (int c = 0; c < DC; c++)                                      \
                wv4[c] = (char4)(wr[c][k1], wr[c][k1 + 1], wr[c][k1 + 2], wr[c][k1 + 3]);       \
            _Pragma("unroll") for (int r = 0; r < DR; r++)                                      \
                _Pragma("unroll") for (int c = 0; c < DC; c++) s[r][c] += tsr_dot4(av4[r], wv4[c]); \
        }
#else
#define DOT4_STEPS(DR, DC) const long k1 = k0;
#endif
#define DOT_ARGS (__global const A_T *a, long lda, __global const char *w, long M, long N, long K,      \
                  __global const float *sx, __global const float *sw, __global const float *bias,      \
                  int has_bias, int act, __global Y_T *y)
#define DOT_BODY(DR, DC) {                                                                        \
    const long m0 = get_global_id(0) * DR, n0 = get_global_id(1) * DC;                            \
    if (n0 >= N || m0 >= M) return;                                                             \
    __global const A_T *ar[DR];                                                                 \
    __global const char *wr[DC];                                                                \
    _Pragma("unroll") for (int r = 0; r < DR; r++) ar[r] = a + min(m0 + r, M - 1) * lda;        \
    _Pragma("unroll") for (int c = 0; c < DC; c++) wr[c] = w + min(n0 + c, N - 1) * K;          \
    ACC_T acc[DR][DC];                                                                          \
    _Pragma("unroll") for (int r = 0; r < DR; r++)                                              \
        _Pragma("unroll") for (int c = 0; c < DC; c++) acc[r][c] = 0;                           \
    for (long k0 = 0; k0 < K; k0 += DOT_KC) {                                                   \
        int s[DR][DC];                                                                          \
        _Pragma("unroll") for (int r = 0; r < DR; r++)                                          \
            _Pragma("unroll") for (int c = 0; c < DC; c++) s[r][c] = 0;                         \
        DOT4_STEPS(DR, DC)                                                                      \
        for (long k = k1; k < min(K, k0 + DOT_KC); k++) {                                       \
            int av[DR], wv[DC];                                                                 \
            _Pragma("unroll") for (int r = 0; r < DR; r++) av[r] = ar[r][k];                    \
            _Pragma("unroll") for (int c = 0; c < DC; c++) wv[c] = wr[c][k];                    \
            _Pragma("unroll") for (int r = 0; r < DR; r++)                                      \
                _Pragma("unroll") for (int c = 0; c < DC; c++) s[r][c] += av[r] * wv[c];        \
        }                                                                                       \
        _Pragma("unroll") for (int r = 0; r < DR; r++)                                          \
            _Pragma("unroll") for (int c = 0; c < DC; c++) acc[r][c] += s[r][c];                \
    }                                                                                           \
    for (int r = 0; r < DR; r++)                                                                \
        for (int c = 0; c < DC; c++)                                                            \
            if (m0 + r < M && n0 + c < N) put(y, m0 + r, n0 + c, N, acc[r][c], sx, sw, bias, has_bias, act); \
}

__kernel void qi8_dot11 DOT_ARGS DOT_BODY(1, 1)
__kernel void qi8_dot24 DOT_ARGS DOT_BODY(2, 4)
