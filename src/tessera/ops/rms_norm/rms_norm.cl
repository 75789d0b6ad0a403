/* RMSNorm forward/backward for the opencl backend (OpenCL C 1.2), optionally with a residual.
 *
 *   h = x + residual (rounded to the storage dtype);  rstd = 1/sqrt(mean(h^2) + eps)
 *   y = h * rstd * w
 *   backward (xhat = h*rstd, g = dy*w):  dx = rstd*(g - xhat*mean(g*xhat)) + dh_out
 *                                        dw = sum_rows dy*xhat
 *
 * One work-group per row: work-item `lid` takes columns lid, lid+L, ... so neighbouring
 * work-items touch neighbouring elements (coalesced on a GPU; PoCL vectorises the work-item
 * loop across them on a CPU).  The row's sums reduce through local memory in a fixed tree.
 * dw: work-group g sums dy*xhat over its block of rows into partial row g of `part` (fp32), and
 * a second kernel adds the partial rows in a fixed order, so the result is deterministic.
 * Optional inputs are flags plus a dummy buffer (OpenCL has no null buffer argument).
 */
#include "tessera_cl.h"

__kernel void rms_norm_fwd(__global const TSR_T *x, long sx, __global const TSR_T *res, long sr, int has_res,
                           __global const float *w, int has_w, __global TSR_T *y, __global TSR_T *h,
                           __global float *rstd, long N, float eps, __local float *scratch) {
    const long i = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    __global const TSR_T *xr = x + i * sx;
    __global const TSR_T *rr = res + i * sr;
    __global TSR_T *yr = y + i * N;
    __global TSR_T *hr = h + i * N;
    float s = 0.0f;
    for (long j = lid; j < N; j += L) {
        float v = tsr_ld(xr, j);
        if (has_res) {
            tsr_st(hr, j, v + tsr_ld(rr, j));
            v = tsr_ld(hr, j);  /* normalise the rounded h, as backward recomputes it */
        }
        s += v * v;
    }
    const float r = 1.0f / sqrt(tsr_wg_sum(s, scratch) / (float)N + eps);
    if (lid == 0) rstd[i] = r;
    for (long j = lid; j < N; j += L) {
        const float v = has_res ? tsr_ld(hr, j) : tsr_ld(xr, j);
        const float wj = has_w ? w[j] : 1.0f;
        tsr_st(yr, j, v * r * wj);
    }
}

/* dx for every row of this group's block; partial dw of the block into part[g*N ...]. */
__kernel void rms_norm_bwd(__global const TSR_T *dy, long sdy, __global const TSR_T *dh, long sdh, int has_dh,
                           __global const TSR_T *h, long sh, __global const float *w, int has_w,
                           __global const float *rstd, __global TSR_T *dx, __global float *part,
                           long M, long N, long rows_per_group, __local float *scratch) {
    const long g = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    const long i0 = g * rows_per_group, i1 = min(M, i0 + rows_per_group);
    __global float *pg = part + g * N;
    if (has_w)
        for (long j = lid; j < N; j += L) pg[j] = 0.0f;
    for (long i = i0; i < i1; i++) {
        __global const TSR_T *dyr = dy + i * sdy, *hr = h + i * sh, *dhr = dh + i * sdh;
        __global TSR_T *dxr = dx + i * N;
        const float r = rstd[i];
        float s = 0.0f;
        for (long j = lid; j < N; j += L) {
            const float gj = tsr_ld(dyr, j) * (has_w ? w[j] : 1.0f);
            s += gj * tsr_ld(hr, j) * r;
        }
        const float mean_gx = tsr_wg_sum(s, scratch) / (float)N;
        for (long j = lid; j < N; j += L) {
            const float dyj = tsr_ld(dyr, j), xhat = tsr_ld(hr, j) * r;
            const float gj = dyj * (has_w ? w[j] : 1.0f);
            float d = r * (gj - xhat * mean_gx);
            if (has_dh) d += tsr_ld(dhr, j);
            tsr_st(dxr, j, d);
            if (has_w) pg[j] += dyj * xhat;
        }
    }
}

/* dw[j] = sum over groups of part[g*N + j], in group order. */
__kernel void rms_norm_dw(__global const float *part, long G, long N, __global float *dw) {
    const long j = get_global_id(0);
    if (j >= N) return;
    float s = 0.0f;
    for (long g = 0; g < G; g++) s += part[g * N + j];
    dw[j] = s;
}
