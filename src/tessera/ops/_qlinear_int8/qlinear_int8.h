/* qlinear_int8.h: build options, types and the output step shared by the int8 matmul programs of
 * the opencl backend (qlinear_int8.cl: activations + CPU-device kernels; qlinear_int8_tiled.cl:
 * GPU kernels).
 *
 *   ABITS   8: a int8 (int32 sums), 16: a int16 (int64 sums)
 *   OUT_INT 1: the integer sums are the output (int_mm); 0: the linears' fp32 epilogue
 *           y = act(fp32(acc) * (sx[m] * sw[n]) + bias[n]), stored as TSR_DTYPE
 */
#ifndef QLINEAR_INT8_H
#define QLINEAR_INT8_H
#include "tessera_cl.h"
#include "tessera_quant_cl.h"

#ifndef ABITS
#define ABITS 8
#endif
#ifndef OUT_INT
#define OUT_INT 0
#endif
#if ABITS == 8
#define A_T char
#define ACC_T int
#define QMAXA 127.0f
#else
#define A_T short
#define ACC_T long
#define QMAXA 32767.0f
#endif
/* QI8_INT_DOT: the K loops of 8-bit a take 4 k at a time through tsr_dot4 (tessera_cl.h:
 * cl_khr_integer_dot_product's non-saturating dot(char4, char4) where the device has it, or
 * emulated in tests), added to int sums with plain wrapping addition: the same integers as the
 * portable loops (exact sums; the int32 wrap of the contract is the same in any order). */
#define QI8_INT_DOT (TSR_HAS_INT_DOT && ABITS == 8)
#if OUT_INT
#define Y_T ACC_T
#else
#define Y_T TSR_T
#endif

/* ------------------------------------------------------------------ output */
inline void put(__global Y_T *y, long m, long n, long N, ACC_T acc, __global const float *sx,
                __global const float *sw, __global const float *bias, int has_bias, int act) {
#if OUT_INT
    y[m * N + n] = acc;
#else
    float v = (float)acc * (sx[m] * sw[n]);
    if (has_bias) v = v + bias[n];
    tsr_st(y, m * N + n, tsr_qact(v, act));
#endif
}

#endif
