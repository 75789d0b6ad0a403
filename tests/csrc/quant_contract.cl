/* Test shim: csrc/opencl/tessera_quant_cl.h's rules applied element-wise, so
 * tests/test_quant_contract.py can compare them with tessera.quant.contract (torch).
 * TSR_QDIV_FP32 forces tsr_div_rn's fp32 path (else the fp64 one where the device has it);
 * TSR_DIV_SKEW=1 replaces the device's fp32 division by one that is off by -2..+2 ulps (as OpenCL
 * 1.2 allows without -cl-fp32-correctly-rounded-divide-sqrt): tsr_div_rn must still be exact. */
#if TSR_DIV_SKEW
inline float skewed_div(float x, float y) {
    const float q = x / y;
    const int k = (int)((as_uint(x) ^ (as_uint(y) >> 3)) % 5u) - 2;
    if (q == 0.0f || !isfinite(q) || (as_uint(q) & 0x7fffffffu) < 3u) return q;
    return as_float(as_int(q) + k);
}
#define TSR_DIV_APPROX(x, y) skewed_div((x), (y))
#endif
#include "tessera_quant_cl.h"

__kernel void test_div(__global const float *x, __global const float *y, long n, __global float *out) {
    const long i = get_global_id(0);
    if (i < n) out[i] = tsr_div_rn(x[i], y[i]);
}

/* kind 0 int8, 1 int16, 2 e4m3fn, 3 e5m2, 4 e4m3fnuz: the code of x / scale, as an int */
__kernel void test_quant(__global const float *x, __global const float *scale, long n, int kind, __global int *out) {
    const long i = get_global_id(0);
    if (i >= n) return;
    const float q = tsr_div_rn(x[i], scale[i]);
    out[i] = kind == 0 ? tsr_q_int(q, -127.0f, 127.0f) : kind == 1 ? tsr_q_int(q, -32767.0f, 32767.0f)
           : kind == 2 ? (int)tsr_q_e4m3(q) : kind == 3 ? (int)tsr_q_e5m2(q) : (int)tsr_q_e4m3fnuz(q);
}

__kernel void test_fp8_decode(int kind, __global float *out) {
    const uint b = get_global_id(0);
    out[b] = kind == 2 ? tsr_dq_e4m3(b) : kind == 3 ? tsr_dq_e5m2(b) : tsr_dq_e4m3fnuz(b);
}

__kernel void test_scale(__global const float *amax, long n, float qmax, __global float *out) {
    const long i = get_global_id(0);
    if (i < n) out[i] = tsr_q_scale(amax[i], qmax);
}
