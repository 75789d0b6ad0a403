/* dequantize_blocks for the opencl backend (OpenCL C 1.2):
 *
 *   out[i, j] = dtype(fp32((q[i, j] - zero[b]) * scale[b]))     b = (i / br, j / bc)
 *
 * bit-identical to ref.py / dequantize.c: q - zero is exact, the product one correctly rounded
 * fp32 multiply, then one round-to-nearest-even store to the output dtype (TSR_DTYPE).
 * Build option DQKIND, the code type (cpu.py's KIND): 0 int8, 1 int16, 2 packed 4-bit (byte j =
 * c[2j] | c[2j+1] << 4, offset binary: zero 8 unless a uint8 zero is given), 3 fp8 e4m3fn,
 * 4 fp8 e5m2, 5 fp8 e4m3fnuz (fp8 decoded exactly from the bits, NaN / inf codes included;
 * tessera_quant_cl.h).  scale / zero are [Mb, Kb] row-major.
 *
 * One work-group per row.  Blocks of <= 1024 columns (`seq`): one work-item per block, a
 * sequential loop over its columns (scale and zero loop-invariant: PoCL vectorises it); larger
 * blocks: the work-group per block, each work-item a contiguous chunk.  (A flat loop over the row
 * looking each value's block scale up measured 5x slower under PoCL.)
 */
#pragma OPENCL FP_CONTRACT OFF
#include "tessera_cl.h"
#include "tessera_quant_cl.h"

#ifndef DQKIND
#define DQKIND 0
#endif
#if DQKIND == 0
#define CODE_T char
#elif DQKIND == 1
#define CODE_T short
#else
#define CODE_T uchar
#endif

/* the decoded code at value index j of a row (minus the default zero for 4-bit codes) */
inline float code_at(__global const CODE_T *qr, long j) {
#if DQKIND == 2
    return (float)((qr[j >> 1] >> ((j & 1) * 4)) & 15);
#elif DQKIND == 3
    return tsr_dq_e4m3(qr[j]);
#elif DQKIND == 4
    return tsr_dq_e5m2(qr[j]);
#elif DQKIND == 5
    return tsr_dq_e4m3fnuz(qr[j]);
#else
    return (float)qr[j];
#endif
}

/* values [j0, j0 + n) of a row with one scale and zero */
inline void dequant_span(__global const CODE_T *qr, long j0, long n, float s, float z, __global TSR_T *orow) {
    for (long j = j0; j < j0 + n; j++) tsr_st(orow, j, (code_at(qr, j) - z) * s);
}

__kernel void dequant_rows(__global const CODE_T *q, long ldq, long K, long br, long bc, long Kb, int seq,
                           __global const float *scale, __global const uchar *zero, int has_zero,
                           __global TSR_T *out) {
    const long i = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    __global const CODE_T *qr = q + i * ldq;
    __global const float *sc = scale + (i / br) * Kb;
    __global const uchar *zr = zero + (i / br) * Kb;
    __global TSR_T *orow = out + i * K;
    const float zdef = DQKIND == 2 ? 8.0f : 0.0f;
    if (seq) {
        for (long kb = lid; kb < Kb; kb += L)
            dequant_span(qr, kb * bc, min(bc, K - kb * bc), sc[kb], has_zero ? (float)zr[kb] : zdef, orow);
    } else {
        for (long kb = 0; kb < Kb; kb++) {
            const long j0 = kb * bc, n = min(bc, K - j0);
            const long C = ((n + L - 1) / L + 15) & ~15L, c0 = min(n, (long)lid * C);
            dequant_span(qr, j0 + c0, min(n, c0 + C) - c0, sc[kb], has_zero ? (float)zr[kb] : zdef, orow);
        }
    }
}
