/* tessera OpenCL C helpers (OpenCL C 1.2; framework-free).
 *
 * Activation storage dtype is a build option: -DTSR_DTYPE=0 (fp32), 1 (fp16), 2 (bf16), the
 * codes of the cpu backend.  Kernels compute in fp32 and use
 *   TSR_T                    the storage type (float, half, ushort)
 *   tsr_ld(p, i)             element i as float
 *   tsr_st(p, i, v)          store float v rounded to the storage type (round to nearest even)
 * fp16 is storage only on devices without cl_khr_fp16 (vload_half / vstore_half_rte: PoCL);
 * bf16 is a ushort with the top 16 bits of the fp32 pattern, rounded to nearest even by integer
 * arithmetic (NaN stays NaN: its payload is forced quiet before the rounding add).
 * Row offsets are `long` (int64): a (rows x cols) activation can exceed 2^31 elements.
 */
#ifndef TESSERA_CL_H
#define TESSERA_CL_H

#ifndef TSR_DTYPE
#define TSR_DTYPE 0
#endif

inline float tsr_bf16_to_f32(ushort u) { return as_float(((uint)u) << 16); }

inline ushort tsr_f32_to_bf16(float f) {
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                            /* RNE */
    return (ushort)(u >> 16);
}

#if TSR_DTYPE == 0
#define TSR_T float
#define tsr_ld(p, i) ((p)[(i)])
#define tsr_st(p, i, v) ((p)[(i)] = (v))
#elif TSR_DTYPE == 1
#define TSR_T half
#define tsr_ld(p, i) vload_half((i), (p))
#define tsr_st(p, i, v) vstore_half_rte((v), (i), (p))
#elif TSR_DTYPE == 2
#define TSR_T ushort
#define tsr_ld(p, i) tsr_bf16_to_f32((p)[(i)])
#define tsr_st(p, i, v) ((p)[(i)] = tsr_f32_to_bf16(v))
#else
#error "TSR_DTYPE must be 0 (fp32), 1 (fp16) or 2 (bf16)"
#endif

/* Work-group sum of one float per work-item through local memory (size = local size, a power
 * of two).  Every work-item gets the total.  The tree keeps fp32 rounding order fixed for a given
 * local size, so a kernel's result does not depend on scheduling. */
inline float tsr_wg_sum(float v, __local float *scratch) {
    const int lid = get_local_id(0), n = get_local_size(0);
    scratch[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n >> 1; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] += scratch[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float total = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);  /* scratch may be reused right after */
    return total;
}

inline float tsr_wg_max(float v, __local float *scratch) {
    const int lid = get_local_id(0), n = get_local_size(0);
    scratch[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n >> 1; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] = fmax(scratch[lid], scratch[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float total = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}

#endif
