/* RMSNorm forward/backward for the opencl backend (OpenCL C 1.2), optionally with a residual.
 *
 *   h = x + residual (rounded to the storage dtype);  rstd = 1/sqrt(mean(h^2) + eps)
 *   y = h * rstd * w
 *   backward (xhat = h*rstd, g = dy*w):  dx = rstd*(g - xhat*mean(g*xhat)) + dh_out
 *                                        dw = sum_rows dy*xhat
 *
 * Layout of the work: a work-group walks rows; its L work-items split a row into 8-element
 * chunks, chunk c going to work-item c mod L (neighbouring work-items touch neighbouring
 * memory: coalesced on a GPU), and the N % 8 tail elements likewise one by one.  Each
 * work-item's chunk is float8 arithmetic (tsr_ld8/tsr_st8), so on a CPU runtime the launcher
 * picks L = 1 and the row loop is plain SIMD code (PoCL vectorises across work-items only in
 * loop-free regions); on a GPU, L covers the row.  Row sums reduce through local memory in a
 * fixed tree (tsr_wg_sum), lanes in a fixed order (tsr_hsum8): results do not depend on
 * scheduling.  The row is read from DRAM once; the second pass finds it in cache.
 * dw: work-group g sums dy*xhat over its block of rows into partial row g of `part` (fp32), and
 * a second kernel adds the partial rows in group order, so the result is deterministic.
 * Optional inputs are flags plus a dummy buffer (OpenCL has no null buffer argument).
 */
#include "tessera_cl.h"

/* the row loops: whole chunks (float8) and the tail, each work-item its share */
#define FOR_CHUNKS(j) for (long j = 8 * (long)get_local_id(0); j + 8 <= N; j += 8 * (long)get_local_size(0))
#define FOR_TAIL(j) for (long j = (N & ~7L) + get_local_id(0); j < N; j += get_local_size(0))

__kernel void rms_norm_fwd(__global const TSR_T *x, long sx, __global const TSR_T *res, long sr, int has_res,
                           __global const float *w, int has_w, __global TSR_T *y, __global TSR_T *h,
                           __global float *rstd, long M, long N, float eps, __local float *scratch) {
    for (long i = get_group_id(0); i < M; i += get_num_groups(0)) {
        __global const TSR_T *xr = x + i * sx, *rr = res + i * sr;
        __global TSR_T *yr = y + i * N, *hr = h + i * N;
        float8 s8 = 0.0f;
        float s = 0.0f;
        FOR_CHUNKS(j) {
            float8 v = tsr_ld8(xr, j);
            if (has_res) {
                tsr_st8(hr, j, v + tsr_ld8(rr, j));
                v = tsr_ld8(hr, j);  /* normalise the rounded h, as backward recomputes it */
            }
            s8 += v * v;
        }
        FOR_TAIL(j) {
            float v = tsr_ld(xr, j);
            if (has_res) {
                tsr_st(hr, j, v + tsr_ld(rr, j));
                v = tsr_ld(hr, j);
            }
            s += v * v;
        }
        const float r = 1.0f / sqrt(tsr_wg_sum(tsr_hsum8(s8) + s, scratch) / (float)N + eps);
        if (get_local_id(0) == 0) rstd[i] = r;
        __global const TSR_T *src = has_res ? (__global const TSR_T *)hr : xr;
        FOR_CHUNKS(j) tsr_st8_nt(yr, j, tsr_ld8(src, j) * r * (has_w ? tsr_ld8f(w, j) : (float8)1.0f));
        FOR_TAIL(j) tsr_st(yr, j, tsr_ld(src, j) * r * (has_w ? w[j] : 1.0f));
    }
    TSR_NT_FENCE();  /* streamed stores of the output (tessera_cl.h) */
}

/* dx for every row of this group's block; partial dw of the block into part[g*N ...]. */
__kernel void rms_norm_bwd(__global const TSR_T *dy, long sdy, __global const TSR_T *dh, long sdh, int has_dh,
                           __global const TSR_T *h, long sh, __global const float *w, int has_w,
                           __global const float *rstd, __global TSR_T *dx, __global float *part,
                           long M, long N, long rows_per_group, __local float *scratch) {
    const long g = get_group_id(0);
    const long i0 = g * rows_per_group, i1 = min(M, i0 + rows_per_group);
    __global float *pg = part + g * N;
    if (has_w) {
        FOR_CHUNKS(j) { const float8 z = 0.0f; TSR_S8(pg, j, z); }
        FOR_TAIL(j) pg[j] = 0.0f;
    }
    for (long i = i0; i < i1; i++) {
        __global const TSR_T *dyr = dy + i * sdy, *hr = h + i * sh, *dhr = dh + i * sdh;
        __global TSR_T *dxr = dx + i * N;
        const float r = rstd[i];
        float8 s8 = 0.0f;
        float s = 0.0f;
        FOR_CHUNKS(j) s8 += tsr_ld8(dyr, j) * (has_w ? tsr_ld8f(w, j) : (float8)1.0f) * tsr_ld8(hr, j);
        FOR_TAIL(j) s += tsr_ld(dyr, j) * (has_w ? w[j] : 1.0f) * tsr_ld(hr, j);
        const float mean_gx = tsr_wg_sum(tsr_hsum8(s8) + s, scratch) * r / (float)N;
        FOR_CHUNKS(j) {
            const float8 dyj = tsr_ld8(dyr, j), xhat = tsr_ld8(hr, j) * r;
            const float8 gj = dyj * (has_w ? tsr_ld8f(w, j) : (float8)1.0f);
            float8 d = r * (gj - xhat * mean_gx);
            if (has_dh) d += tsr_ld8(dhr, j);
            tsr_st8_nt(dxr, j, d);
            if (has_w) {
                const float8 p = tsr_ld8f(pg, j) + dyj * xhat;
                TSR_S8(pg, j, p);
            }
        }
        FOR_TAIL(j) {
            const float dyj = tsr_ld(dyr, j), xhat = tsr_ld(hr, j) * r;
            const float gj = dyj * (has_w ? w[j] : 1.0f);
            float d = r * (gj - xhat * mean_gx);
            if (has_dh) d += tsr_ld(dhr, j);
            tsr_st(dxr, j, d);
            if (has_w) pg[j] += dyj * xhat;
        }
    }
    TSR_NT_FENCE();  /* streamed stores of the output (tessera_cl.h) */
}

/* dw[j] = sum over groups of part[g*N + j], in group order; work-item k takes columns 8k..8k+7. */
__kernel void rms_norm_dw(__global const float *part, long G, long N, __global float *dw) {
    const long j = 8 * (long)get_global_id(0);
    if (j + 8 <= N) {
        float8 s = 0.0f;
        for (long g = 0; g < G; g++) s += tsr_ld8f(part + g * N, j);
        TSR_S8(dw, j, s);
    } else {
        for (long k = j; k < N; k++) {
            float s = 0.0f;
            for (long g = 0; g < G; g++) s += part[g * N + k];
            dw[k] = s;
        }
    }
}
