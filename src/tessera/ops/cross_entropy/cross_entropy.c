/* Cross-entropy over the rows of a (M, V) view of logits: per-row loss, log-sum-exp, and
 * (when asked) the gradient rows, all from one read of the logits.
 *
 *   z     = softcap > 0 ? softcap * tanh(x / softcap) : x          (Gemma 2 logit softcap)
 *   lse   = log(sum_j exp(z_j))
 *   loss  = (1 - ls) (lse - z_t) + ls (lse - mean_j z_j) + zl lse^2   (t = target, ls = label
 *           smoothing, zl = PaLM's z-loss); 0 for a row whose target is ignore_index
 *   dz_j  = p_j (1 + 2 zl lse) - ls / V - (1 - ls) [j == t],   p_j = exp(z_j - lse)
 *   dx_j  = scale_i * dz_j * (1 - (z_j / softcap)^2)             (0 for an ignored row)
 *
 * scale_i = scale * row_scale[i * srs] (row_scale may be NULL): the reduction's factor (1/n for a
 * mean) and, when the gradient is recomputed for reduction="none", the upstream gradient of row i.
 *
 * One pass over DRAM per row.  The row is walked in BLOCK-element blocks: each is converted
 * (and softcapped) into an fp32 scratch row while its max is taken, then exp(z - block max) is
 * summed over the L1-resident block and kept in the scratch, and the running sum is rescaled
 * once per block when the max grows (online log-sum-exp at block granularity: one exp per
 * element, no separate max pass over DRAM).  The gradient pass then reads the L2-resident
 * scratch, not the logits: p_j = e_j * exp(m_b - lse) with the block's max m_b, so it costs a
 * multiply per element and no second exp; the target element is fixed up in the fp32 block
 * before the block is converted and stored (non-temporal when the output is larger than the
 * cache).  dx may be x itself (fused linear cross-entropy overwrites its logits chunk with
 * the gradient): every element of a row is read in the first pass before any is written.
 *
 * Numerics: fp32 for every storage dtype.  loss is assembled as (m - z_t) + log(s) with the
 * row max m and s = sum exp(z - m) >= 1, so a row whose target holds the max (logits of 1e4,
 * loss ~1e-3) does not lose its digits to lse - z_t.  A block that is entirely -inf is shifted
 * by 0 (its exps are 0, never NaN); -inf entries give p = 0 and dx = 0; a row that is all -inf
 * has lse = -inf and a NaN loss (as log_softmax gives); NaN propagates.  The smoothing term is
 * skipped when ls == 0, so -inf logits do not turn 0 * inf into NaN.
 *
 * Softcap: tanh(a) for a = |x| / softcap < 0.625 is a + a^3 P(a^2) (P of degree 4 fitted to the
 * relative error on [0, 0.625]: 0.71 ulp max in fp32); above, 1 - q with q = 2 / (1 + e^{2a}),
 * and 1 - tanh^2 = q (2 - q) without cancellation.
 *
 * A target outside [0, V) that is not ignore_index is never read: the row is skipped and the
 * call returns TSR_EINVAL (the Python glue checks the targets first and raises a clear error).
 */
#include "tessera_cpu.h"

enum { BLOCK = 2048 };

/* tanh(y) and 1 - tanh(y)^2 for one element, branch-free (both halves computed, one selected). */
static inline float softcap1(float x, float cap, float inv_cap, float *dcap) {
    const float y = x * inv_cap, a = fabsf(y);
    const float s = a < 0.625f ? a : 0.625f, u = s * s;  /* the polynomial's range (inf - inf outside) */
    float p = -5.731123499572277e-3f;
    p = p * u + 2.066466398537159e-2f;
    p = p * u - 5.374842509627342e-2f;
    p = p * u + 1.3331560790538788e-1f;
    p = p * u - 3.333328664302826e-1f;
    const float t_small = s + s * u * p;
    const float q = 2.0f / (1.0f + tsr_expf(2.0f * a));   /* 1 - tanh(a); e^{2a} = inf gives 0 */
    const int small = a < 0.625f;
    const float t = small ? t_small : 1.0f - q;
    *dcap = small ? 1.0f - t_small * t_small : q * (2.0f - q);
    return cap * copysignf(t, y);
}

/* z[0:n] = cap(float(src[0:n])) (dc[0:n] = 1 - tanh^2 when dc != NULL), returning max(z); NaN
 * loses every comparison (skipped by the max; it still reaches the sum through exp). */
static inline float load_block(float *restrict z, float *restrict dc, const char *src, int64_t n, int dtype,
                               float cap, float *sumz, int smooth) {
    tsr_load_f32(z, src, n, dtype);
    float m = -INFINITY, s = 0.0f;
    if (cap > 0.0f) {
        const float inv = 1.0f / cap;
        if (dc) {
#pragma omp simd reduction(max : m) reduction(+ : s)
            for (int64_t j = 0; j < n; j++) {
                float d;
                const float v = softcap1(z[j], cap, inv, &d);
                z[j] = v; dc[j] = d; m = v > m ? v : m; s += v;
            }
        } else {
#pragma omp simd reduction(max : m) reduction(+ : s)
            for (int64_t j = 0; j < n; j++) {
                float d;
                const float v = softcap1(z[j], cap, inv, &d);
                z[j] = v; m = v > m ? v : m; s += v;
            }
        }
    } else if (smooth) {
#pragma omp simd reduction(max : m) reduction(+ : s)
        for (int64_t j = 0; j < n; j++) { const float v = z[j]; m = v > m ? v : m; s += v; }
    } else {
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < n; j++) { const float v = z[j]; m = v > m ? v : m; }
    }
    if (smooth) *sumz += s;
    return m;
}

/* z[0:n] = exp(z[0:n] - shift) in place; returns their sum. */
static inline float exp_block(float *restrict z, int64_t n, float shift) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) { const float e = tsr_expf(z[j] - shift); z[j] = e; s += e; }
    return s;
}

typedef struct {
    float ls, zl, cap;
    int64_t ignore, N;
    int dtype, nt;
} ce_args;

/* One row.  z: N floats of scratch when dx is written, else BLOCK; dc: N floats (softcap + dx);
 * bmax: one float per block; tmp: BLOCK halves.  Returns 0, or 1 for an out-of-range target. */
static int ce_row(const ce_args *a, const char *xr, int64_t t, char *dxr, float *loss, float *lse_out,
                  float scale_i, float *z, float *dc, float *bmax, uint16_t *tmp) {
    const int64_t N = a->N;
    const int es = tsr_elsize(a->dtype);
    const int valid = t != a->ignore;
    if (valid && (t < 0 || t >= N)) return 1;
    const int keep = dxr != NULL, smooth = a->ls > 0.0f;
    float m = -INFINITY, s = 0.0f, sumz = 0.0f, zt = 0.0f;
    int64_t b = 0;
    for (int64_t j0 = 0; j0 < N; j0 += BLOCK, b++) {
        const int64_t n = N - j0 < BLOCK ? N - j0 : BLOCK;
        float *zb = keep ? z + j0 : z;
        const float bm = load_block(zb, keep && dc ? dc + j0 : NULL, xr + j0 * es, n, a->dtype, a->cap, &sumz,
                                    smooth);
        if (valid && t >= j0 && t < j0 + n) zt = zb[t - j0];
        const float shift = bm == -INFINITY ? 0.0f : bm; /* an all -inf block: exps are 0, not NaN */
        const float bs = exp_block(zb, n, shift);
        bmax[b] = bm;   /* -inf for an all -inf block: its gradient factor exp(-inf - lse) is 0 */
        /* online log-sum-exp: keep (m, s) with s = sum exp(z - m) over the blocks seen; an all
         * -inf block (bs = 0) adds nothing and must not move m (its shift 0 is not a max) */
        if (bs == 0.0f) continue;
        if (shift > m) { s = s * tsr_expf(m - shift) + bs; m = shift; }
        else s += bs * tsr_expf(shift - m);   /* a NaN anywhere makes bs, then s, NaN */
    }
    if (m == -INFINITY) m = 0.0f;              /* every block was -inf: s = 0, lse = -inf */
    const float ls_ = logf(s), lse = m + ls_;
    *lse_out = lse;
    float l = 0.0f;
    if (valid) {
        l = (1.0f - a->ls) * (m - zt) + ls_;
        if (smooth) l += a->ls * (m - sumz / (float)N);
        if (a->zl > 0.0f) l += a->zl * lse * lse;
    }
    *loss = l;
    if (!keep) return 0;
    /* gradient rows: dx_j = scale_i dc_j (e_j f_b - c),  f_b = exp(m_b - lse) (1 + 2 zl lse) */
    const float amp = scale_i * (1.0f + 2.0f * a->zl * lse), c = scale_i * a->ls / (float)N;
    b = 0;
    for (int64_t j0 = 0; j0 < N; j0 += BLOCK, b++) {
        const int64_t n = N - j0 < BLOCK ? N - j0 : BLOCK;
        float *g = z + j0;
        if (!valid) {
            memset(g, 0, (size_t)n * 4);
        } else {
            const float f = tsr_expf(bmax[b] - lse) * amp;
            if (dc) {
                const float *d = dc + j0;
#pragma omp simd
                for (int64_t j = 0; j < n; j++) g[j] = (g[j] * f - c) * d[j];
            } else {
#pragma omp simd
                for (int64_t j = 0; j < n; j++) g[j] = g[j] * f - c;
            }
            if (t >= j0 && t < j0 + n) g[t - j0] -= scale_i * (1.0f - a->ls) * (dc ? dc[t] : 1.0f);
        }
        tsr_store_row(dxr + j0 * es, g, n, a->dtype, a->nt, tmp);
    }
    return 0;
}

/* The targets' check and count in one O(M) pass (the op's host version is six torch ops, most of a
 * tiny call): TSR_EINVAL when a target other than `ignore` is outside [0, V), else *n_valid = the
 * number of rows not ignored (a mean's denominator, needed before the forward writes gradients). */
int tsr_cross_entropy_targets(const int64_t *target, int64_t M, int64_t ignore, int64_t V, int64_t *n_valid) {
    int64_t n = 0;
    for (int64_t i = 0; i < M; i++) {
        const int64_t t = target[i];
        if (t == ignore) continue;
        if (t < 0 || t >= V) return TSR_EINVAL;
        n++;
    }
    *n_valid = n;
    return TSR_OK;
}

/* x: (M, N) rows with row stride sx (elements); target: M int64; dx: NULL or rows with stride
 * sdx (may be x itself); loss, lse: M floats. */
int tsr_cross_entropy_fwd(const void *x, int64_t sx, const int64_t *target, int64_t ignore, float ls, float zl,
                          float cap, const float *row_scale, int64_t srs, float scale, void *dx, int64_t sdx,
                          float *loss, float *lse, int64_t M, int64_t N, int dtype, int nt, int nthreads) {
    const ce_args a = {ls, zl, cap, ignore, N, dtype, nt};
    const int es = tsr_elsize(dtype);
    const int64_t nblocks = (N + BLOCK - 1) / BLOCK;
    const int64_t zn = dx ? N : (N < BLOCK ? N : BLOCK);
    int failed = 0, bad = 0;
    TSR_TEAM(tsr_threads(nthreads), reduction(| : failed, bad), {
        float *z = tsr_scratch(zn), *dc = dx && cap > 0.0f ? tsr_scratch(N) : NULL;
        float *bmax = tsr_scratch(nblocks);
        uint16_t *tmp = (uint16_t *)tsr_scratch(BLOCK / 2);
        failed = !z || !bmax || !tmp || (dx && cap > 0.0f && !dc);
        /* every thread reaches the worksharing loop; one without scratch skips its rows */
_Pragma("omp for schedule(dynamic, 4)")
        for (int64_t i = 0; i < M; i++) {
            if (failed) continue;
            const float si = row_scale ? scale * row_scale[i * srs] : scale;
            bad |= ce_row(&a, (const char *)x + i * sx * es, target[i], dx ? (char *)dx + i * sdx * es : NULL,
                          loss + i, lse + i, si, z, dc, bmax, tmp);
        }
        tsr_sfence();
        free(z); free(dc); free(bmax); free(tmp);
    });
    return failed ? TSR_ENOMEM : (bad ? TSR_EINVAL : TSR_OK);
}

/* Backward: dx[i, :] = d[i, :] * g[i * sg] (the saved gradient rows times the upstream gradient:
 * a scalar broadcast with sg = 0 for mean/sum, per row for reduction="none"). */
int tsr_cross_entropy_bwd(const void *d, int64_t sd, const float *g, int64_t sg, void *dx, int64_t M, int64_t N,
                          int dtype, int nt, int nthreads) {
    const int es = tsr_elsize(dtype);
    int failed = 0;
    TSR_TEAM(tsr_threads(nthreads), reduction(| : failed), {
        float *buf = tsr_scratch(BLOCK);
        uint16_t *tmp = (uint16_t *)tsr_scratch(BLOCK / 2);
        failed = !buf || !tmp;
_Pragma("omp for schedule(static)")
        for (int64_t i = 0; i < M; i++) {
            if (failed) continue;
            const float gi = g[i * sg];
            const char *dr = (const char *)d + i * sd * es;
            char *xr = (char *)dx + i * N * es;
            for (int64_t j0 = 0; j0 < N; j0 += BLOCK) {
                const int64_t n = N - j0 < BLOCK ? N - j0 : BLOCK;
                tsr_load_f32(buf, dr + j0 * es, n, dtype);
_Pragma("omp simd")
                for (int64_t j = 0; j < n; j++) buf[j] *= gi;
                tsr_store_row(xr + j0 * es, buf, n, dtype, nt, tmp);
            }
        }
        tsr_sfence();
        free(buf); free(tmp);
    });
    return failed ? TSR_ENOMEM : TSR_OK;
}
