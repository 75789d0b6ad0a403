/* Softmax over the rows of a (M, N) view for the opencl backend (OpenCL C 1.2), forward and
 * fused backward.
 *
 *   forward:   m = max(x);  ms = (m == -inf) ? 0 : m
 *              y = exp(x - ms) * inv,   inv = (s == 0) ? 0 : 1 / s,   s = sum(exp(x - ms))
 *   backward:  dx = y * (dy - sum(dy * y))
 *
 * Numerics (the contract of ref.py, as softmax.c): a fully -inf row is shifted by 0, every exp
 * is 0 and s = 0 gives inv = 0: all zeros, no NaN, and dx = 0 there.  A row holding +inf has
 * ms = +inf, exp(inf - inf) = NaN makes s and the whole row NaN; NaN inputs lose every max
 * comparison (the max skips them) but reach s through exp and poison the row the same way.  The
 * largest element contributes exp(0) = 1, so s >= 1 for every other row and 1 / s never
 * overflows.  All math is fp32.
 *
 * exp: sm_exp8 below, from arithmetic only (Cody-Waite reduction, ln2 in two parts whose first
 * has 9 bits so k * part is exact; Cephes' degree-7 polynomial; 2^k from the bits of the
 * rounding sum, k >= -126 on the kept range): ~1-2 ulp, with or without FMA contraction.  Not
 * the built-in exp: PoCL 3.0 calls math built-ins out of line, which costs more than the memory
 * traffic.  The argument is x - max <= 0, -inf or NaN: x < -87.34 gives 0 (-inf included), NaN
 * fails that comparison and flows through.
 *
 * Work layout (as rms_norm.cl): one work-group per row, its work-items take 8-element chunks
 * (float8 arithmetic) and the N % 8 tail; the max and the sums reduce in a fixed tree through
 * local memory.  Three passes over the row (max, sum of exp, scaled exp): the first reads DRAM,
 * the later ones find a row of up to ~L2 size in cache.  The last pass either rescales the exp
 * values the second kept in local memory (`keep`: the launcher's choice on a CPU device, where
 * exp is the bottleneck and a row of up to 128K floats fits) or evaluates exp again (a GPU,
 * and rows too long for local memory).
 */
#include "tessera_cl.h"

#define FOR_CHUNKS(j) for (long j = 8 * (long)get_local_id(0); j + 8 <= N; j += 8 * (long)get_local_size(0))
#define FOR_TAIL(j) for (long j = (N & ~7L) + get_local_id(0); j < N; j += get_local_size(0))

inline float8 sm_exp8(float8 x) {
    const float8 kf = x * 1.44269504088896341f + 12582912.0f;  /* round(x / ln2) in the low bits */
    const float8 k = kf - 12582912.0f;
    float8 r = x - k * 0.693359375f;
    r = r + k * 2.12194440e-4f;
    float8 p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const float8 res = p * as_float8((as_uint8(kf) << 23) + (127u << 23));
    return x < -87.33654022216797f ? (float8)0.0f : res;
}

inline float sm_exp(float x) { return sm_exp8((float8)x).s0; }

inline float sm_hmax8(float8 v) {
    const float4 a = v.lo > v.hi ? v.lo : v.hi;
    const float2 b = a.lo > a.hi ? a.lo : a.hi;
    return b.x > b.y ? b.x : b.y;
}

/* e: with keep, N floats of local memory where each work-item keeps exp(x - ms) of its own
 * chunks for the last pass, instead of evaluating exp a second time (no barrier needed). */
__kernel void softmax_fwd(__global const TSR_T *x, long sx, __global TSR_T *y, long M, long N,
                          __local float *e, int keep, __local float *scratch) {
    for (long i = get_group_id(0); i < M; i += get_num_groups(0)) {
        __global const TSR_T *xr = x + i * sx;
        __global TSR_T *yr = y + i * N;
        /* NaN entries lose every comparison: the max skips them */
        float8 m8 = -INFINITY;
        float m = -INFINITY;
        FOR_CHUNKS(j) {
            const float8 v = tsr_ld8(xr, j);
            m8 = v > m8 ? v : m8;
        }
        FOR_TAIL(j) {
            const float v = tsr_ld(xr, j);
            m = v > m ? v : m;
        }
        const float h8 = sm_hmax8(m8);
        m = tsr_wg_max(h8 > m ? h8 : m, scratch);
        const float ms = m == -INFINITY ? 0.0f : m;
        float8 s8 = 0.0f;
        float s = 0.0f;
        if (keep) {
            FOR_CHUNKS(j) {
                const float8 ej = sm_exp8(tsr_ld8(xr, j) - ms);
                TSR_S8(e, j, ej);
                s8 += ej;
            }
            FOR_TAIL(j) s += e[j] = sm_exp(tsr_ld(xr, j) - ms);
        } else {
            FOR_CHUNKS(j) s8 += sm_exp8(tsr_ld8(xr, j) - ms);
            FOR_TAIL(j) s += sm_exp(tsr_ld(xr, j) - ms);
        }
        s = tsr_wg_sum(tsr_hsum8(s8) + s, scratch);
        const float inv = s == 0.0f ? 0.0f : 1.0f / s;  /* NaN s stays NaN */
        if (keep) {
            FOR_CHUNKS(j) tsr_st8_nt(yr, j, (float8)(TSR_G8(e, j)) * inv);
            FOR_TAIL(j) tsr_st(yr, j, e[j] * inv);
        } else {
            FOR_CHUNKS(j) tsr_st8_nt(yr, j, sm_exp8(tsr_ld8(xr, j) - ms) * inv);
            FOR_TAIL(j) tsr_st(yr, j, sm_exp(tsr_ld(xr, j) - ms) * inv);
        }
    }
    TSR_NT_FENCE();  /* streamed stores of the output (tessera_cl.h) */
}

__kernel void softmax_bwd(__global const TSR_T *dy, long sdy, __global const TSR_T *y, long sy,
                          __global TSR_T *dx, long M, long N, __local float *scratch) {
    for (long i = get_group_id(0); i < M; i += get_num_groups(0)) {
        __global const TSR_T *gr = dy + i * sdy, *yr = y + i * sy;
        __global TSR_T *dr = dx + i * N;
        float8 s8 = 0.0f;
        float s = 0.0f;
        FOR_CHUNKS(j) s8 += tsr_ld8(gr, j) * tsr_ld8(yr, j);
        FOR_TAIL(j) s += tsr_ld(gr, j) * tsr_ld(yr, j);
        const float dot = tsr_wg_sum(tsr_hsum8(s8) + s, scratch);
        FOR_CHUNKS(j) tsr_st8_nt(dr, j, tsr_ld8(yr, j) * (tsr_ld8(gr, j) - dot));
        FOR_TAIL(j) tsr_st(dr, j, tsr_ld(yr, j) * (tsr_ld(gr, j) - dot));
    }
    TSR_NT_FENCE();  /* streamed stores of the output (tessera_cl.h) */
}
