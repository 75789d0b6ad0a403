/* RMSNorm forward/backward, optionally fused with a residual add.
 *
 *   h    = x + residual                 (or h = x; rounded to the activation dtype)
 *   rstd = 1 / sqrt(mean(h^2) + eps)    (fp32, saved for backward)
 *   y    = h * rstd * w                 (w = 1 when absent)
 *
 * Backward, with xhat = h * rstd and g = dy * w:
 *   dh = rstd * (g - xhat * mean(g * xhat)) + dh_out     (dh_out: grad of the h output)
 *   dw = sum_rows dy * xhat                             (per-thread partials, then one reduction)
 *
 * Memory: DRAM is touched once per element.  Pass 1 streams the row in (x, plus
 * residual -> h, which is written out and copied to a cache-resident scratch row)
 * and sums the squares; pass 2 re-reads the row from L1/L2, writes y with non-temporal
 * stores (nt) and prefetches the next row into L2, so DRAM reads overlap the
 * writes.  Threads take chunks of contiguous rows dynamically; activations have
 * unit inner stride and any row stride (0 = broadcast).
 *
 * Compute: rows go through 32-element blocks of fp32 vectors (tsr_blk_*, AVX-512
 * zmm code on x86-64).  The row loops are always-inlined and instantiated per
 * dtype and per optional input (residual / dh_out) with constant arguments, so the
 * hot loops carry no run-time branches and keep their accumulators in registers;
 * this matters for bf16/fp16, whose conversions make the loops compute-heavy
 * enough to fall behind DRAM otherwise.  A missing weight is a row of ones.
 */
#include "tessera_rows.h"

/* weight, or a row of ones when absent (multiplying by 1 is exact) */
static float *ones_row(const float *w, int64_t Np) {
    if (w) return NULL;
    float *o = tsr_scratch(Np);
    for (int64_t j = 0; o && j < Np; j++) o[j] = 1.0f;
    return o;
}

#if defined(TSR_NEON)
/* fp32 rows with NEON intrinsics: gcc lowers the 64-byte block vectors of the generic rows through
 * the stack on NEON (~3.3 instructions per element); here 16 elements per step stay in registers.
 * The same formula; the sum of squares runs in 16 lanes then a pairwise tree (another order of the
 * fp32 additions), h (fp32: x + residual, no rounding step) is read back from the h output. */
static void fwd_rows_f32_neon(const float *x, int64_t sx, const float *res, int64_t sr, const float *w, float *y,
                              float *h, float *rstd, int64_t i0, int64_t i1, int64_t N, float eps) {
    for (int64_t i = i0; i < i1; i++) {
        const float *xr = x + i * sx, *rr = res ? res + i * sr : NULL;
        float *yr = y + i * N, *hr = res ? h + i * N : NULL;
        float32x4_t s[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
        int64_t j = 0;
        if (rr) {
            for (; j + 16 <= N; j += 16)
                for (int t = 0; t < 4; t++) {
                    const float32x4_t v = vaddq_f32(vld1q_f32(xr + j + 4 * t), vld1q_f32(rr + j + 4 * t));
                    vst1q_f32(hr + j + 4 * t, v);
                    s[t] = vfmaq_f32(s[t], v, v);
                }
        } else {
            for (; j + 16 <= N; j += 16)
                for (int t = 0; t < 4; t++) {
                    const float32x4_t v = vld1q_f32(xr + j + 4 * t);
                    s[t] = vfmaq_f32(s[t], v, v);
                }
        }
        float ss = vaddvq_f32(vaddq_f32(vaddq_f32(s[0], s[1]), vaddq_f32(s[2], s[3])));
        for (; j < N; j++) {
            const float v = rr ? xr[j] + rr[j] : xr[j];
            if (rr) hr[j] = v;
            ss += v * v;
        }
        const float r = 1.0f / sqrtf(ss / (float)N + eps);
        rstd[i] = r;
        const float *src = rr ? hr : xr;
        const float32x4_t rv = vdupq_n_f32(r);
        for (j = 0; j + 16 <= N; j += 16)
            for (int t = 0; t < 4; t++)
                vst1q_f32(yr + j + 4 * t, vmulq_f32(vmulq_f32(vld1q_f32(src + j + 4 * t), rv), vld1q_f32(w + j + 4 * t)));
        for (; j < N; j++) yr[j] = src[j] * r * w[j];
    }
}
#endif

ROWS fwd_rows(const char *x, int64_t sx, const char *res, int64_t sr, const float *w, char *y, char *h,
              float *rstd, float *hs, int64_t i0, int64_t i1, int64_t M, int64_t N, float eps, int nt,
              const int has_res, const int dtype) {
#if defined(TSR_NEON)
    if (dtype == TSR_F32) {
        fwd_rows_f32_neon((const float *)x, sx, has_res ? (const float *)res : NULL, sr, w, (float *)y,
                          (float *)h, rstd, i0, i1, N, eps);
        return;
    }
#endif
    const int es = tsr_elsize(dtype);
    for (int64_t i = i0; i < i1; i++) {
        const char *xr = x + i * sx * es, *rr = has_res ? res + i * sr * es : NULL;
        char *yr = y + i * N * es, *hr = has_res ? h + i * N * es : NULL;
        const int nth = nt && tsr_aligned64(hr), nty = nt && tsr_aligned64(yr);
        /* pass 1: h (rounded to the activation dtype, stored; the norm uses that rounded h
         * so the forward matches what backward recomputes from the saved h), sum of squares */
        tsr_v16 s0 = {0}, s1 = {0};
        TSR_FOR_BLOCKS(j, N, {
            tsr_blk v = tsr_blk_load(xr, j, N, dtype, 0.0f, tail);
            if (has_res) {
                tsr_blk r = tsr_blk_load(rr, j, N, dtype, 0.0f, tail);
                v.lo += r.lo; v.hi += r.hi;
                tsr_blk_store_r(hr, j, N, &v, dtype, nth, tail, 1, hs);   /* h: stored, rounded, kept */
            }
            s0 = tsr_v16_fma(v.lo, v.lo, s0); s1 = tsr_v16_fma(v.hi, v.hi, s1);
        });
        const float r = 1.0f / sqrtf(tsr_v16_sum(s0 + s1) / (float)N + eps);
        rstd[i] = r;
        /* pass 2: y = h * rstd * w from the cached row; meanwhile pull the next row into L2
         * (the last row "prefetches" itself: no branch in the loop) */
        const char *src = has_res ? (const char *)hs : xr;
        const int64_t step = i + 1 < M;
        const char *xn = xr + step * sx * es, *rn = has_res ? rr + step * sr * es : NULL;
        TSR_FOR_BLOCKS(j, N, {
            tsr_prefetch_l2(xn + j * es, 32 * es);
            if (has_res) tsr_prefetch_l2(rn + j * es, 32 * es);
            tsr_blk v = tsr_blk_load(src, j, N, dtype, 0.0f, tail);
            tsr_blk wb = tsr_blk_load(w, j, N, TSR_F32, 1.0f, tail);
            v.lo = v.lo * r * wb.lo;
            v.hi = v.hi * r * wb.hi;
            tsr_blk_store(yr, j, N, v, dtype, nty, tail);
        });
    }
}

int tsr_rms_norm_fwd(const void *x, int64_t sx, const void *res, int64_t sr, const float *w,
                     void *y, void *h, float *rstd, int64_t M, int64_t N, float eps,
                     int dtype, int nt, int nthreads) {
    const int64_t Np = (N + 31) & ~(int64_t)31;
    float *ones = ones_row(w, Np);
    if (!w && !ones) return TSR_ENOMEM;
    const float *wv = w ? w : ones;
    const int64_t CH = chunk_rows(M, tsr_threads(nthreads));
    int failed = 0;
    TSR_TEAM(tsr_threads(nthreads), reduction(| : failed), {
        float *hs = res ? tsr_scratch(Np) : NULL;   /* copy of the h row (x's dtype) with a residual */
        if (res && !hs) failed = 1;
_Pragma("omp for schedule(dynamic, 1)")
        for (int64_t c = 0; c < (M + CH - 1) / CH; c++) {
            if (failed) continue;
            const int64_t i0 = c * CH, i1 = i0 + CH < M ? i0 + CH : M;
            DISPATCH(fwd_rows, dtype, res != NULL, (const char *)x, sx, (const char *)res, sr, wv, (char *)y,
                     (char *)h, rstd, hs, i0, i1, M, N, eps, nt);
        }
        tsr_sfence();
        free(hs);
    });
    free(ones);
    return failed ? TSR_ENOMEM : TSR_OK;
}

ROWS bwd_rows(const char *dy, int64_t sdy, const char *dh_out, int64_t sdh, const char *h, int64_t sh,
              const float *w, const float *rstd, char *dx, float *pw, int64_t i0, int64_t i1, int64_t M,
              int64_t N, int nt, const int has_dh, const int dtype) {
    const int es = tsr_elsize(dtype);
    for (int64_t i = i0; i < i1; i++) {
        const char *dyr = dy + i * sdy * es, *hr = h + i * sh * es;
        const char *dhr = has_dh ? dh_out + i * sdh * es : NULL;
        char *dxr = dx + i * N * es;
        const float r = rstd[i];
        /* pass 1 (streams dy, h in): dot = sum(g * h); dw partial += dy * h * rstd */
        tsr_v16 c0 = {0}, c1 = {0};
        TSR_FOR_BLOCKS(j, N, {
            tsr_blk d = tsr_blk_load(dyr, j, N, dtype, 0.0f, tail);
            tsr_blk hv = tsr_blk_load(hr, j, N, dtype, 0.0f, tail);
            tsr_blk p = tsr_blk_load(pw, j, N, TSR_F32, 0.0f, 0);  /* padded to whole blocks */
            p.lo = tsr_v16_fma(d.lo, hv.lo * r, p.lo); p.hi = tsr_v16_fma(d.hi, hv.hi * r, p.hi);
            memcpy(pw + j, &p.lo, 64); memcpy(pw + j + 16, &p.hi, 64);
            tsr_blk wb = tsr_blk_load(w, j, N, TSR_F32, 1.0f, tail);
            c0 = tsr_v16_fma(d.lo * wb.lo, hv.lo, c0); c1 = tsr_v16_fma(d.hi * wb.hi, hv.hi, c1);
        });
        const float c = tsr_v16_sum(c0 + c1) * r * r / (float)N; /* mean(g * xhat) * rstd */
        /* pass 2: dx = rstd * (g - h * c) (+ dh_out) from the cached rows; prefetch the next row */
        const int ntx = nt && tsr_aligned64(dxr);
        const int64_t step = i + 1 < M;
        const char *dyn = dyr + step * sdy * es, *hn = hr + step * sh * es;
        TSR_FOR_BLOCKS(j, N, {
            tsr_prefetch_l2(dyn + j * es, 32 * es);
            tsr_prefetch_l2(hn + j * es, 32 * es);
            tsr_blk d = tsr_blk_load(dyr, j, N, dtype, 0.0f, tail);
            tsr_blk hv = tsr_blk_load(hr, j, N, dtype, 0.0f, tail);
            tsr_blk wb = tsr_blk_load(w, j, N, TSR_F32, 1.0f, tail);
            d.lo = r * (d.lo * wb.lo - hv.lo * c);
            d.hi = r * (d.hi * wb.hi - hv.hi * c);
            if (has_dh) {
                tsr_blk e = tsr_blk_load(dhr, j, N, dtype, 0.0f, tail);
                d.lo += e.lo; d.hi += e.hi;
            }
            tsr_blk_store(dxr, j, N, d, dtype, ntx, tail);
        });
    }
}

int tsr_rms_norm_bwd(const void *dy, int64_t sdy, const void *dh_out, int64_t sdh,
                     const void *h, int64_t sh, const float *w, const float *rstd,
                     void *dx, float *dw, int64_t M, int64_t N, int dtype, int nt, int nthreads) {
    const int T = tsr_threads(nthreads);
    const int64_t Np = (N + 31) & ~(int64_t)31;
    /* per-thread partial rows of dw, padded to whole blocks (padding lanes stay 0); always
     * computed (branch-free loop), reduced only when dw is wanted */
    float *partial = (float *)calloc((size_t)T * (size_t)Np, sizeof(float));
    float *ones = ones_row(w, Np);
    if (!partial || (!w && !ones)) { free(partial); free(ones); return TSR_ENOMEM; }
    const float *wv = w ? w : ones;
    const int64_t CH = chunk_rows(M, T);
#pragma omp parallel num_threads(T)
    {
#ifdef _OPENMP
        float *pw = partial + (size_t)omp_get_thread_num() * (size_t)Np;
#else
        float *pw = partial;
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < (M + CH - 1) / CH; c++) {
            const int64_t i0 = c * CH, i1 = i0 + CH < M ? i0 + CH : M;
            DISPATCH(bwd_rows, dtype, dh_out != NULL, (const char *)dy, sdy, (const char *)dh_out, sdh,
                     (const char *)h, sh, wv, rstd, (char *)dx, pw, i0, i1, M, N, nt);
        }
        tsr_sfence();
    }
    /* one reduction of the per-thread partials, in thread order (deterministic) */
    for (int64_t j = 0; dw && j < N; j++) {
        float s = 0.0f;
        for (int t = 0; t < T; t++) s += partial[(size_t)t * Np + j];
        dw[j] = s;
    }
    free(partial); free(ones);
    return TSR_OK;
}
