/* LayerNorm forward/backward, optionally fused with a residual add.
 *
 *   h    = x + residual                   (or h = x; rounded to the activation dtype)
 *   mean = mean(h),  rstd = 1 / sqrt(mean((h - mean)^2) + eps)   (fp32, saved for backward)
 *   y    = (h - mean) * rstd * w + b      (w = 1, b = 0 when absent)
 *
 * Backward, with xhat = (h - mean) * rstd and g = dy * w:
 *   dh = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dh_out    (dh_out: grad of the h output)
 *   dw = sum_rows dy * xhat,  db = sum_rows dy   (per-thread partials, then one reduction)
 *
 * Numerics: the statistics are two-pass over the cached row -- the mean first, then
 * the sum of squared deviations -- so |mean| >> std does not cancel the way
 * E[h^2] - E[h]^2 does.  The mean is summed as h - h[0] (a shift by the row's first
 * element): a constant row then gives h - mean == 0 exactly (variance 0, y == b), and
 * h - mean is formed as (h - shift) - (mean - shift), which keeps the low bits a
 * rounded fp32 mean would lose when |mean| >> std.
 *
 * Memory: DRAM is touched once per element.  Pass 1 streams the row in (x, plus
 * residual -> h, which is written out and copied to a cache-resident scratch row);
 * the later passes re-read it from L1/L2.  The store pass writes y with non-temporal stores
 * (nt) and prefetches the next row into L2, so DRAM reads overlap the writes.
 *
 * Compute: as in rms_norm.c -- 32-element blocks of fp32 vectors (tsr_blk_*), row
 * loops instantiated per dtype and per optional input with constant arguments, bf16
 * stores through the AVX512_BF16 instruction where the CPU has it; a missing weight
 * is a row of ones and a missing bias a row of zeros (exact).
 */
#include "tessera_rows.h"

/* p, or a row of `v` when p is absent */
static float *const_row(const float *p, int64_t Np, float v) {
    if (p) return NULL;
    float *o = tsr_scratch(Np);
    for (int64_t j = 0; o && j < Np; j++) o[j] = v;
    return o;
}

#if defined(TSR_NEON)
/* One fp32 row without residual on 4-lane registers, the same three passes and formulas as
 * fwd_rows (shift = x[0], delta = mean - shift, rstd from the centred squares; y = ((x - shift)
 * - delta) * rstd * w + b): gcc's lowering of the 32-lane blocks moves every block through the
 * stack (~1.8x the instructions).  Sums run in 16 lanes (4 registers), then across. */
static void neon_row_f32(const float *restrict x, const float *restrict w, const float *restrict b,
                         float *restrict y, int64_t N, float eps, float *mean, float *rstd) {
    const float shift = x[0];
    const float32x4_t vs = vdupq_n_f32(shift);
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t j = 0;
    for (; j + 16 <= N; j += 16) {
        const float32x4x4_t v = vld1q_f32_x4(x + j);
        a0 = vaddq_f32(a0, vsubq_f32(v.val[0], vs)); a1 = vaddq_f32(a1, vsubq_f32(v.val[1], vs));
        a2 = vaddq_f32(a2, vsubq_f32(v.val[2], vs)); a3 = vaddq_f32(a3, vsubq_f32(v.val[3], vs));
    }
    float t = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; j < N; j++) t += x[j] - shift;
    const float delta = t / (float)N;
    const float32x4_t vd = vdupq_n_f32(delta);
    a0 = vdupq_n_f32(0.0f); a1 = a0; a2 = a0; a3 = a0;
    for (j = 0; j + 16 <= N; j += 16) {
        const float32x4x4_t v = vld1q_f32_x4(x + j);
        const float32x4_t d0 = vsubq_f32(vsubq_f32(v.val[0], vs), vd), d1 = vsubq_f32(vsubq_f32(v.val[1], vs), vd);
        const float32x4_t d2 = vsubq_f32(vsubq_f32(v.val[2], vs), vd), d3 = vsubq_f32(vsubq_f32(v.val[3], vs), vd);
        a0 = vfmaq_f32(a0, d0, d0); a1 = vfmaq_f32(a1, d1, d1);
        a2 = vfmaq_f32(a2, d2, d2); a3 = vfmaq_f32(a3, d3, d3);
    }
    t = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; j < N; j++) { const float d = (x[j] - shift) - delta; t = fmaf(d, d, t); }
    const float r = 1.0f / sqrtf(t / (float)N + eps);
    *mean = shift + delta;
    *rstd = r;
    for (j = 0; j + 16 <= N; j += 16) {
        const float32x4x4_t v = vld1q_f32_x4(x + j), wv = vld1q_f32_x4(w + j), bv = vld1q_f32_x4(b + j);
        float32x4x4_t o;
        for (int k = 0; k < 4; k++)
            o.val[k] = vfmaq_f32(bv.val[k], vmulq_n_f32(vsubq_f32(vsubq_f32(v.val[k], vs), vd), r), wv.val[k]);
        vst1q_f32_x4(y + j, o);
    }
    for (; j < N; j++) y[j] = fmaf(((x[j] - shift) - delta) * r, w[j], b[j]);
}
#endif

ROWS fwd_rows(const char *x, int64_t sx, const char *res, int64_t sr, const float *w, const float *b,
              char *y, char *h, float *mean, float *rstd, float *hs, int64_t i0, int64_t i1, int64_t M,
              int64_t N, float eps, int nt, const int has_res, const int dtype) {
    const int es = tsr_elsize(dtype);
    for (int64_t i = i0; i < i1; i++) {
        const char *xr = x + i * sx * es, *rr = has_res ? res + i * sr * es : NULL;
        char *yr = y + i * N * es, *hr = has_res ? h + i * N * es : NULL;
#if defined(TSR_NEON)
        if (dtype == TSR_F32 && !has_res) {
            neon_row_f32((const float *)xr, w, b, (float *)yr, N, eps, mean + i, rstd + i);
            continue;
        }
#endif
        const int nth = nt && tsr_aligned64(hr), nty = nt && tsr_aligned64(yr);
        /* the shift: h[0] exactly as stored (x[0] + residual[0] rounded to the dtype) */
        tsr_blk s = tsr_blk_load(xr, 0, 1, dtype, 0.0f, 1);
        if (has_res) {
            tsr_blk r0 = tsr_blk_load(rr, 0, 1, dtype, 0.0f, 1);
            s.lo += r0.lo;
            tsr_v16h hh = tsr_v16_to_half(s.lo, dtype);
            if (dtype != TSR_F32) s.lo = tsr_v16_load(&hh, dtype);
        }
        const float shift = s.lo[0];
        /* pass 1: h (rounded, stored, copied to the scratch row), and the sum of h - shift */
        tsr_v16 s0 = {0}, s1 = {0};
        TSR_FOR_BLOCKS(j, N, {
            tsr_blk v = tsr_blk_load(xr, j, N, dtype, shift, tail);
            if (has_res) {
                tsr_blk r = tsr_blk_load(rr, j, N, dtype, 0.0f, tail);
                v.lo += r.lo; v.hi += r.hi;
                tsr_blk_store_r(hr, j, N, &v, dtype, nth, tail, 1, hs);   /* h: stored, rounded, kept */
            }
            s0 += v.lo - shift; s1 += v.hi - shift;
        });
        const float delta = tsr_v16_sum(s0 + s1) / (float)N;   /* mean - shift */
        /* pass 2: sum of squared deviations, from the cached row */
        const char *src = has_res ? (const char *)hs : xr;
        s0 = (tsr_v16){0}; s1 = s0;
        TSR_FOR_BLOCKS(j, N, {
            tsr_blk v = tsr_blk_load(src, j, N, dtype, 0.0f, tail);
            v.lo = (v.lo - shift) - delta; v.hi = (v.hi - shift) - delta;
            if (tail) tsr_blk_zero_from(&v, N - j);   /* lanes past the row end add nothing */
            s0 = tsr_v16_fma(v.lo, v.lo, s0); s1 = tsr_v16_fma(v.hi, v.hi, s1);
        });
        const float r = 1.0f / sqrtf(tsr_v16_sum(s0 + s1) / (float)N + eps);
        mean[i] = shift + delta;
        rstd[i] = r;
        /* pass 3: y = (h - mean) * rstd * w + b; meanwhile pull the next row into L2
         * (the last row "prefetches" itself: no branch in the loop) */
        const int64_t step = i + 1 < M;
        const char *xn = xr + step * sx * es, *rn = has_res ? rr + step * sr * es : NULL;
        TSR_FOR_BLOCKS(j, N, {
            tsr_prefetch_l2(xn + j * es, 32 * es);
            if (has_res) tsr_prefetch_l2(rn + j * es, 32 * es);
            tsr_blk v = tsr_blk_load(src, j, N, dtype, shift, tail);
            tsr_blk wb = tsr_blk_load(w, j, N, TSR_F32, 1.0f, tail);
            tsr_blk bb = tsr_blk_load(b, j, N, TSR_F32, 0.0f, tail);
            v.lo = tsr_v16_fma(((v.lo - shift) - delta) * r, wb.lo, bb.lo);
            v.hi = tsr_v16_fma(((v.hi - shift) - delta) * r, wb.hi, bb.hi);
            tsr_blk_store(yr, j, N, v, dtype, nty, tail);
        });
    }
}

int tsr_layer_norm_fwd(const void *x, int64_t sx, const void *res, int64_t sr, const float *w, const float *b,
                       void *y, void *h, float *mean, float *rstd, int64_t M, int64_t N, float eps,
                       int dtype, int nt, int nthreads) {
    const int T = tsr_threads(nthreads);
    const int64_t Np = (N + 31) & ~(int64_t)31, CH = chunk_rows(M, T);
    float *ones = const_row(w, Np, 1.0f), *zeros = const_row(b, Np, 0.0f);
    if ((!w && !ones) || (!b && !zeros)) { free(ones); free(zeros); return TSR_ENOMEM; }
    const float *wv = w ? w : ones, *bv = b ? b : zeros;
    int failed = 0;
    TSR_TEAM(T, reduction(| : failed), {
        float *hs = res ? tsr_scratch(Np) : NULL;   /* copy of the h row (x's dtype) with a residual */
        if (res && !hs) failed = 1;
_Pragma("omp for schedule(dynamic, 1)")
        for (int64_t c = 0; c < (M + CH - 1) / CH; c++) {
            if (failed) continue;
            const int64_t i0 = c * CH, i1 = i0 + CH < M ? i0 + CH : M;
            DISPATCH(fwd_rows, dtype, res != NULL, (const char *)x, sx, (const char *)res, sr, wv, bv,
                     (char *)y, (char *)h, mean, rstd, hs, i0, i1, M, N, eps, nt);
        }
        tsr_sfence();
        free(hs);
    });
    free(ones); free(zeros);
    return failed ? TSR_ENOMEM : TSR_OK;
}

ROWS bwd_rows(const char *dy, int64_t sdy, const char *dh_out, int64_t sdh, const char *h, int64_t sh,
              const float *w, const float *mean, const float *rstd, char *dx, float *pw, float *pb,
              int64_t i0, int64_t i1, int64_t M, int64_t N, int nt, const int has_dh, const int dtype) {
    const int es = tsr_elsize(dtype);
    for (int64_t i = i0; i < i1; i++) {
        const char *dyr = dy + i * sdy * es, *hr = h + i * sh * es;
        const char *dhr = has_dh ? dh_out + i * sdh * es : NULL;
        char *dxr = dx + i * N * es;
        const float mu = mean[i], r = rstd[i];
        /* pass 1 (streams dy, h in): sums of g and g * xhat; dw/db partials.  Everything is
         * recomputed from dy and h in pass 2 rather than kept in scratch rows: stores are the
         * scarce resource of this loop, loads and arithmetic are not. */
        tsr_v16 a0 = {0}, a1 = {0}, c0 = {0}, c1 = {0};
        TSR_FOR_BLOCKS(j, N, {
            tsr_blk d = tsr_blk_load(dyr, j, N, dtype, 0.0f, tail);
            tsr_blk xh = tsr_blk_load(hr, j, N, dtype, mu, tail);
            xh.lo = (xh.lo - mu) * r; xh.hi = (xh.hi - mu) * r;
            tsr_blk p = tsr_blk_load(pw, j, N, TSR_F32, 0.0f, 0);   /* partials: padded rows */
            tsr_blk q = tsr_blk_load(pb, j, N, TSR_F32, 0.0f, 0);
            p.lo = tsr_v16_fma(d.lo, xh.lo, p.lo); p.hi = tsr_v16_fma(d.hi, xh.hi, p.hi);
            q.lo += d.lo; q.hi += d.hi;
            memcpy(pw + j, &p.lo, 64); memcpy(pw + j + 16, &p.hi, 64);
            memcpy(pb + j, &q.lo, 64); memcpy(pb + j + 16, &q.hi, 64);
            tsr_blk wb = tsr_blk_load(w, j, N, TSR_F32, 1.0f, tail);
            d.lo *= wb.lo; d.hi *= wb.hi;
            a0 += d.lo; a1 += d.hi;
            c0 = tsr_v16_fma(d.lo, xh.lo, c0); c1 = tsr_v16_fma(d.hi, xh.hi, c1);
        });
        const float mg = tsr_v16_sum(a0 + a1) / (float)N, mgx = tsr_v16_sum(c0 + c1) / (float)N;
        /* pass 2: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (+ dh_out) from the cached
         * rows; meanwhile pull the next row into L2 (the last row "prefetches" itself) */
        const int ntx = nt && tsr_aligned64(dxr);
        const int64_t step = i + 1 < M;
        const char *dyn = dyr + step * sdy * es, *hn = hr + step * sh * es;
        const float cx = r * mgx;
        const tsr_v16 nmg = (tsr_v16){0} - mg;
        /* a row of one element: xhat == 0 and g - mean(g) == 0 exactly, so dx is dh_out alone.
         * The formula below would give fma(dy, w, -round(dy * w)) * rstd instead: the rounding
         * error of dy * w (the contracted product is exact) times rstd = 1/sqrt(eps), ~1e-5. */
        const float rx = N == 1 ? 0.0f : r;
        TSR_FOR_BLOCKS(j, N, {
            tsr_prefetch_l2(dyn + j * es, 32 * es);
            tsr_prefetch_l2(hn + j * es, 32 * es);
            tsr_blk d = tsr_blk_load(dyr, j, N, dtype, 0.0f, tail);
            tsr_blk xh = tsr_blk_load(hr, j, N, dtype, mu, tail);
            tsr_blk wb = tsr_blk_load(w, j, N, TSR_F32, 1.0f, tail);
            d.lo = rx * (tsr_v16_fma(d.lo, wb.lo, nmg) - (xh.lo - mu) * cx);
            d.hi = rx * (tsr_v16_fma(d.hi, wb.hi, nmg) - (xh.hi - mu) * cx);
            if (has_dh) {
                tsr_blk e = tsr_blk_load(dhr, j, N, dtype, 0.0f, tail);
                d.lo += e.lo; d.hi += e.hi;
            }
            tsr_blk_store(dxr, j, N, d, dtype, ntx, tail);
        });
    }
}

int tsr_layer_norm_bwd(const void *dy, int64_t sdy, const void *dh_out, int64_t sdh, const void *h, int64_t sh,
                       const float *w, const float *mean, const float *rstd, void *dx, float *dw, float *db,
                       int64_t M, int64_t N, int dtype, int nt, int nthreads) {
    const int T = tsr_threads(nthreads);
    const int64_t Np = (N + 31) & ~(int64_t)31, CH = chunk_rows(M, T);
    /* per-thread partial rows of dw and db, padded to whole blocks (padding lanes stay 0);
     * always computed (branch-free loop), reduced only where wanted */
    float *part = (float *)calloc((size_t)2 * T * (size_t)Np, sizeof(float));
    float *ones = const_row(w, Np, 1.0f);
    if (!part || (!w && !ones)) { free(part); free(ones); return TSR_ENOMEM; }
    const float *wv = w ? w : ones;
#pragma omp parallel num_threads(T)
    {
#ifdef _OPENMP
        const size_t t = (size_t)omp_get_thread_num();
#else
        const size_t t = 0;
#endif
        float *pw = part + 2 * t * (size_t)Np, *pb = pw + Np;
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < (M + CH - 1) / CH; c++) {
            const int64_t i0 = c * CH, i1 = i0 + CH < M ? i0 + CH : M;
            DISPATCH(bwd_rows, dtype, dh_out != NULL, (const char *)dy, sdy, (const char *)dh_out, sdh,
                     (const char *)h, sh, wv, mean, rstd, (char *)dx, pw, pb, i0, i1, M, N, nt);
        }
        tsr_sfence();
    }
    /* one reduction of the per-thread partials, in thread order (deterministic) */
    for (int64_t j = 0; j < N; j++) {
        float sw = 0.0f, sb = 0.0f;
        for (int t = 0; t < T; t++) {
            sw += part[(size_t)2 * t * Np + j];
            sb += part[(size_t)2 * t * Np + Np + j];
        }
        if (dw) dw[j] = sw;
        if (db) db[j] = sb;
    }
    free(part); free(ones);
    return TSR_OK;
}
