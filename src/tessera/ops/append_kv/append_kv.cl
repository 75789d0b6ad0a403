/* append_kv.cl -- write new K/V tokens into a paged cache, in place (OpenCL C 1.2).
 *
 * Build options: TSR_DTYPE (the new tokens' storage dtype, tessera_cl.h) and AKV_CACHE, the cache
 * dtype code of append_kv/cpu.py's CACHE_CODE (0 fp32, 1 fp16, 2 bf16, 8 int8, 9 float8_e4m3fn).
 * One work-item per (k or v, sequence b, new token i, kv head h) vector of D values (k and v in one
 * launch), written to cache row
 * ((page * P + slot) * Hk + h), page = block_table[b, t / P], slot = t % P, t = positions[b] + i.
 * The host validated every index before the launch.  The cache buffer is the cache tensor's own
 * memory (zero-copy), so the write lands in place.  A work-item walks its vector's D contiguous
 * values (no barrier: any local size).
 *
 * Float caches: convert with round to nearest even (vstore_half_rte; bf16 by integer RNE),
 * exactly torch's .to().  int8 / e4m3fn caches: the integer contract of ref.py, bit for bit, with
 * the contract's OpenCL definitions (csrc/opencl/tessera_quant_cl.h, shared with quantize):
 *   amax = max |x| (NaN counts as 0), scale = max(amax, 1e-12f) / QMAX and q = x / scale (both
 *   correctly rounded divisions on any device), NaN -> 0, saturate to +-QMAX, round half to even
 *   (int8), or the RNE e4m3fn encoding (subnormals included).
 */
#include "tessera_cl.h"
#include "tessera_quant_cl.h"

#ifndef AKV_CACHE
#define AKV_CACHE 0
#endif

#if AKV_CACHE == 0
#define CACHE_T float
#elif AKV_CACHE == 1
#define CACHE_T half
#elif AKV_CACHE == 2
#define CACHE_T ushort
#elif AKV_CACHE == 8
#define CACHE_T char
#define AKV_QMAX 127.0f
#elif AKV_CACHE == 9
#define CACHE_T uchar
#define AKV_QMAX 448.0f
#else
#error "AKV_CACHE must be 0, 1, 2, 8 or 9"
#endif

/* work-items [0, rows) write k into k_cache (+ k_scale), [rows, 2 rows) v into v_cache (one launch) */
__kernel void append_kv(__global const TSR_T *xk, __global CACHE_T *ck, __global float *sk,
                        __global const TSR_T *xv, __global CACHE_T *cv, __global float *sv,
                        __global const int *bt, __global const int *pos, int n_new, int Hk, int D, int P, int MB,
                        long rows) {
    const long gid = get_global_id(0);
    if (gid >= 2 * rows) return;
    const int is_v = gid >= rows;
    const long r = is_v ? gid - rows : gid;          /* (b * n_new + i) * Hk + h */
    __global const TSR_T *x = is_v ? xv : xk;
    __global CACHE_T *cache = is_v ? cv : ck;
    __global float *cscale = is_v ? sv : sk;
    const int h = r % Hk;
    const long bi = r / Hk, b = bi / n_new;
    const long t = (long)pos[b] + bi % n_new;
    const long crow = ((long)bt[b * MB + t / P] * P + t % P) * Hk + h;
    __global const TSR_T *xr = x + r * D;
    __global CACHE_T *dst = cache + crow * D;
#ifdef AKV_QMAX
    float amax = 0.0f;
    for (int d = 0; d < D; d++) {
        const float a = tsr_q_abs0(tsr_ld(xr, d));
        amax = a > amax ? a : amax;
    }
    const float scale = tsr_q_scale(amax, AKV_QMAX), rcp = 1.0f / scale;
    cscale[crow] = scale;
    for (int d = 0; d < D; d++) {
        const float q = tsr_div_rn_r(tsr_ld(xr, d), scale, rcp);
#if AKV_CACHE == 8
        dst[d] = (char)tsr_q_int(q, -127.0f, 127.0f);
#else
        dst[d] = (uchar)tsr_q_e4m3(q);
#endif
    }
#else
    for (int d = 0; d < D; d++) {
        const float v = tsr_ld(xr, d);
#if AKV_CACHE == 0
        dst[d] = v;
#elif AKV_CACHE == 1
        vstore_half_rte(v, d, dst);
#else
        dst[d] = tsr_f32_to_bf16(v);
#endif
    }
#endif
}
