/* LayerNorm forward/backward for the opencl backend (OpenCL C 1.2), optionally with a residual.
 *
 *   h    = x + residual                   (or h = x; rounded to the activation dtype)
 *   mean = mean(h),  rstd = 1 / sqrt(mean((h - mean)^2) + eps)   (fp32, saved for backward)
 *   y    = (h - mean) * rstd * w + b      (w = 1, b = 0 when absent)
 *
 * Backward, with xhat = (h - mean) * rstd and g = dy * w:
 *   dh = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dh_out    (dh_out: grad of the h output)
 *   dw = sum_rows dy * xhat,  db = sum_rows dy   (per-group partial rows, then one reduction)
 *
 * Numerics (those of the cpu kernel, layer_norm.c): two-pass statistics over the row -- the
 * mean first, then the sum of squared deviations -- so |mean| >> std does not cancel the way
 * E[h^2] - E[h]^2 does.  The mean is summed as h - h[0] (a shift by the row's first element,
 * as stored): a constant row gives h - mean == 0 exactly (variance 0, y == b), and h - mean is
 * formed as (h - shift) - (mean - shift), which keeps the low bits a rounded fp32 mean would
 * lose.  A row of one element gives dx = dh_out exactly (xhat = 0 and g - mean(g) = 0; the
 * formula would leave the rounding error of a contracted dy*w times rstd = 1/sqrt(eps)).
 *
 * Work layout: as rms_norm.cl -- a work-group walks rows, its work-items take 8-element chunks
 * (float8 arithmetic through tsr_ld8/tsr_st8) and the N % 8 tail, row sums reduce in a fixed
 * tree through local memory, so results do not depend on scheduling.  The statistics passes
 * re-read the row from cache.  dw/db: work-group g accumulates its block of rows into partial
 * rows part[g][0] (dw) and part[g][1] (db); layer_norm_dwdb adds them in group order.
 */
#include "tessera_cl.h"

#define FOR_CHUNKS(j) for (long j = 8 * (long)get_local_id(0); j + 8 <= N; j += 8 * (long)get_local_size(0))
#define FOR_TAIL(j) for (long j = (N & ~7L) + get_local_id(0); j < N; j += get_local_size(0))

/* v rounded to the storage dtype (the value tsr_st would store), as a float */
inline float ln_round(float v) {
#if TSR_DTYPE == 0
    return v;
#elif TSR_DTYPE == 1
    return tsr_half8_to_f32(tsr_f32_to_half8((float8)v)).s0;  /* no private half without cl_khr_fp16 */
#else
    return tsr_bf16_to_f32(tsr_f32_to_bf16(v));
#endif
}

__kernel void layer_norm_fwd(__global const TSR_T *x, long sx, __global const TSR_T *res, long sr, int has_res,
                             __global const float *w, int has_w, __global const float *b, int has_b,
                             __global TSR_T *y, __global TSR_T *h, __global float *mean, __global float *rstd,
                             long M, long N, float eps, __local float *scratch) {
    for (long i = get_group_id(0); i < M; i += get_num_groups(0)) {
        __global const TSR_T *xr = x + i * sx, *rr = res + i * sr;
        __global TSR_T *yr = y + i * N, *hr = h + i * N;
        /* the shift: h[0] exactly as stored (every work-item derives it; no barrier needed) */
        const float shift = has_res ? ln_round(tsr_ld(xr, 0) + tsr_ld(rr, 0)) : tsr_ld(xr, 0);
        /* pass 1: h (rounded and stored) and the sum of h - shift */
        float8 s8 = 0.0f;
        float s = 0.0f;
        FOR_CHUNKS(j) {
            float8 v = tsr_ld8(xr, j);
            if (has_res) {
                tsr_st8(hr, j, v + tsr_ld8(rr, j));
                v = tsr_ld8(hr, j);
            }
            s8 += v - shift;
        }
        FOR_TAIL(j) {
            float v = tsr_ld(xr, j);
            if (has_res) {
                tsr_st(hr, j, v + tsr_ld(rr, j));
                v = tsr_ld(hr, j);
            }
            s += v - shift;
        }
        const float delta = tsr_wg_sum(tsr_hsum8(s8) + s, scratch) / (float)N;  /* mean - shift */
        /* pass 2: the sum of squared deviations (the row is in cache now) */
        __global const TSR_T *src = has_res ? (__global const TSR_T *)hr : xr;
        s8 = 0.0f;
        s = 0.0f;
        FOR_CHUNKS(j) {
            const float8 d = (tsr_ld8(src, j) - shift) - delta;
            s8 += d * d;
        }
        FOR_TAIL(j) {
            const float d = (tsr_ld(src, j) - shift) - delta;
            s += d * d;
        }
        const float r = 1.0f / sqrt(tsr_wg_sum(tsr_hsum8(s8) + s, scratch) / (float)N + eps);
        if (get_local_id(0) == 0) {
            mean[i] = shift + delta;
            rstd[i] = r;
        }
        /* pass 3: y = (h - mean) * rstd * w + b */
        FOR_CHUNKS(j) {
            const float8 xh = ((tsr_ld8(src, j) - shift) - delta) * r;
            const float8 wj = has_w ? tsr_ld8f(w, j) : (float8)1.0f, bj = has_b ? tsr_ld8f(b, j) : (float8)0.0f;
            tsr_st8_nt(yr, j, xh * wj + bj);
        }
        FOR_TAIL(j) {
            const float xh = ((tsr_ld(src, j) - shift) - delta) * r;
            tsr_st(yr, j, xh * (has_w ? w[j] : 1.0f) + (has_b ? b[j] : 0.0f));
        }
    }
    TSR_NT_FENCE();  /* streamed stores of the output (tessera_cl.h) */
}

/* dx for every row of this group's block; partial dw, db of the block into part[g][0], part[g][1]. */
__kernel void layer_norm_bwd(__global const TSR_T *dy, long sdy, __global const TSR_T *dh, long sdh, int has_dh,
                             __global const TSR_T *h, long sh, __global const float *w, int has_w,
                             __global const float *mean, __global const float *rstd, __global TSR_T *dx,
                             __global float *part, int want_part, long M, long N, long rows_per_group,
                             __local float *scratch) {
    const long g = get_group_id(0);
    const long i0 = g * rows_per_group, i1 = min(M, i0 + rows_per_group);
    __global float *pw = part + 2 * g * N, *pb = pw + N;
    if (want_part) {
        FOR_CHUNKS(j) { const float8 z = 0.0f; TSR_S8(pw, j, z); TSR_S8(pb, j, z); }
        FOR_TAIL(j) { pw[j] = 0.0f; pb[j] = 0.0f; }
    }
    for (long i = i0; i < i1; i++) {
        __global const TSR_T *dyr = dy + i * sdy, *hr = h + i * sh, *dhr = dh + i * sdh;
        __global TSR_T *dxr = dx + i * N;
        const float mu = mean[i], r = rstd[i];
        /* pass 1: sums of g and g * xhat; the dw/db partials */
        float8 a8 = 0.0f, c8 = 0.0f;
        float a = 0.0f, c = 0.0f;
        FOR_CHUNKS(j) {
            const float8 d = tsr_ld8(dyr, j), xh = (tsr_ld8(hr, j) - mu) * r;
            const float8 gj = d * (has_w ? tsr_ld8f(w, j) : (float8)1.0f);
            a8 += gj;
            c8 += gj * xh;
            if (want_part) {
                const float8 p = tsr_ld8f(pw, j) + d * xh, q = tsr_ld8f(pb, j) + d;
                TSR_S8(pw, j, p);
                TSR_S8(pb, j, q);
            }
        }
        FOR_TAIL(j) {
            const float d = tsr_ld(dyr, j), xh = (tsr_ld(hr, j) - mu) * r;
            const float gj = d * (has_w ? w[j] : 1.0f);
            a += gj;
            c += gj * xh;
            if (want_part) {
                pw[j] += d * xh;
                pb[j] += d;
            }
        }
        const float mg = tsr_wg_sum(tsr_hsum8(a8) + a, scratch) / (float)N;
        const float cx = r * (tsr_wg_sum(tsr_hsum8(c8) + c, scratch) / (float)N);  /* rstd * mean(g xhat) */
        const float rx = N == 1 ? 0.0f : r;
        /* pass 2: dx = rstd * (g - mean(g) - (h - mean) * rstd * mean(g xhat)) (+ dh_out) */
        FOR_CHUNKS(j) {
            const float8 gj = tsr_ld8(dyr, j) * (has_w ? tsr_ld8f(w, j) : (float8)1.0f);
            float8 d = rx * ((gj - mg) - (tsr_ld8(hr, j) - mu) * cx);
            if (has_dh) d += tsr_ld8(dhr, j);
            tsr_st8_nt(dxr, j, d);
        }
        FOR_TAIL(j) {
            const float gj = tsr_ld(dyr, j) * (has_w ? w[j] : 1.0f);
            float d = rx * ((gj - mg) - (tsr_ld(hr, j) - mu) * cx);
            if (has_dh) d += tsr_ld(dhr, j);
            tsr_st(dxr, j, d);
        }
    }
    TSR_NT_FENCE();  /* streamed stores of the output (tessera_cl.h) */
}

/* dw[j] / db[j] = sum over groups of part[g][0][j] / part[g][1][j], in group order; work-item k
 * takes columns 8k..8k+7. */
__kernel void layer_norm_dwdb(__global const float *part, long G, long N, __global float *dw, int has_dw,
                              __global float *db, int has_db) {
    const long j = 8 * (long)get_global_id(0);
    if (j + 8 <= N) {
        float8 sw = 0.0f, sb = 0.0f;
        for (long g = 0; g < G; g++) {
            sw += tsr_ld8f(part + 2 * g * N, j);
            sb += tsr_ld8f(part + (2 * g + 1) * N, j);
        }
        if (has_dw) TSR_S8(dw, j, sw);
        if (has_db) TSR_S8(db, j, sb);
    } else {
        for (long k = j; k < N; k++) {
            float sw = 0.0f, sb = 0.0f;
            for (long g = 0; g < G; g++) {
                sw += part[2 * g * N + k];
                sb += part[(2 * g + 1) * N + k];
            }
            if (has_dw) dw[k] = sw;
            if (has_db) db[k] = sb;
        }
    }
}
