/* requant.c -- the integer-only pipeline's native CPU kernels (framework-free C11).
 *
 *   tsr_requant:  out[m, c] = clamp(MBQM(acc[m, c] + off[c], mult[c], shift[c]) + zp, qmin, qmax)
 *   tsr_rq_offset: off[n] = bias[n] - x_zp * sum_k w[n, k]   (int64: the zero-point correction
 *                  that lets the int8 GEMM run on the raw int8 x: sum (x - zp) w = sum x w - zp sum w)
 *   tsr_im2col:   int8/int16 NCHW or NHWC input -> rows [N*Ho*Wo, groups * (C/g)*kh*kw] in
 *                  (group, channel, ky, kx) order, padding taps = x_zp (so the correction above
 *                  makes them contribute exactly 0, TFLite's rule)
 *
 * MBQM (MultiplyByQuantizedMultiplier) is written out in ops/requantize/__init__.py; here it is
 * branch-free (selects, arithmetic shifts) so the per-row loops vectorise (AVX-512: vpmullq,
 * vpsravq).  All intermediate values are int64 and cannot overflow for the enforced shift
 * ranges: |acc * 2^left| <= 2^61, |a * m| <= 2^62, |x * rm| <= 2^62 (x clamped to 2^47).
 */
#include "tessera_cpu.h"

#define INL static inline __attribute__((always_inline))

enum { RQ_DOUBLE = 0, RQ_SINGLE = 1 };

INL int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* gemmlowp SaturatingRoundingDoublingHighMul (ties up: the negative nudge is 1 - 2^30) then
 * RoundingDivideByPOT (ties away from zero) */
INL int64_t mbqm_double(int64_t acc, int64_t m, int64_t s) {
    const int64_t left = s > 0 ? s : 0, e = s > 0 ? 0 : -s;
    const int64_t a = clamp64(acc * ((int64_t)1 << left), INT32_MIN, INT32_MAX);
    const int64_t ab = a * m;
    const int64_t v = ab + (ab >= 0 ? ((int64_t)1 << 30) : (1 - ((int64_t)1 << 30)));
    int64_t h = (v + (v < 0 ? (((int64_t)1 << 31) - 1) : 0)) >> 31;      /* trunc(v / 2^31) */
    h = ((a == INT32_MIN) & (m == INT32_MIN)) ? INT32_MAX : h;
    const int64_t mask = ((int64_t)1 << e) - 1;
    const int64_t thr = (mask >> 1) + (int64_t)(h < 0);
    return (h >> e) + (int64_t)((h & mask) > thr);
}

/* CMSIS-NN single rounding: floor((acc * m + 2^(30 - s)) / 2^(31 - s)), round half up */
INL int64_t mbqm_single(int64_t acc, int64_t m, int64_t s) {
    const int64_t t = 31 - s;
    return (acc * m + ((int64_t)1 << (t - 1))) >> t;
}

/* TFLite int64 MultiplyByQuantizedMultiplier: Q15 reduced multiplier, round half up */
INL int64_t mbqm_int64(int64_t acc, int64_t m, int64_t s) {
    const int64_t x = clamp64(acc, -((int64_t)1 << 47), ((int64_t)1 << 47) - 1);
    const int64_t rm = m < 0x7FFF0000 ? (m + (1 << 15)) >> 16 : 0x7FFF;
    const int64_t t = 15 - s;
    return (x * rm + ((int64_t)1 << (t - 1))) >> t;
}

INL int64_t sat_add(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) r = a > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

/* one row; MODE: 0 double (int32 acc), 1 single (int32 acc), 2 int64 acc */
INL void rq_row(const char *acc, const int acc64, const int32_t *mult, const int32_t *shift, const int64_t cs,
                const int64_t *off, int64_t C, int64_t zp, int64_t qmin, int64_t qmax, char *out, const int out16,
                const int mode) {
    int64_t tmp[256];
    for (int64_t c0 = 0; c0 < C; c0 += 256) {
        const int64_t n = C - c0 < 256 ? C - c0 : 256;
        if (acc64) {
            const int64_t *a = (const int64_t *)acc + c0;
            for (int64_t j = 0; j < n; j++) tmp[j] = off ? sat_add(a[j], off[c0 + j]) : a[j];
        } else {
            const int32_t *a = (const int32_t *)acc + c0;
            /* int32 pipeline: accumulator + bias saturated to int32 before the multiplier */
            for (int64_t j = 0; j < n; j++) tmp[j] = clamp64((int64_t)a[j] + (off ? off[c0 + j] : 0), INT32_MIN, INT32_MAX);
        }
        const int32_t *mp = mult + c0 * cs, *sp = shift + c0 * cs;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            const int64_t m = mp[j * cs], s = sp[j * cs];
            const int64_t r = mode == 0 ? mbqm_double(tmp[j], m, s)
                            : mode == 1 ? mbqm_single(tmp[j], m, s) : mbqm_int64(tmp[j], m, s);
            tmp[j] = clamp64(r + zp, qmin, qmax);
        }
        if (out16) {
            int16_t *o = (int16_t *)out + c0;
            for (int64_t j = 0; j < n; j++) o[j] = (int16_t)tmp[j];
        } else {
            int8_t *o = (int8_t *)out + c0;
            for (int64_t j = 0; j < n; j++) o[j] = (int8_t)tmp[j];
        }
    }
}

/* acc rows [M, C] (row stride sa elements), out rows [M, C] (row stride so); mult/shift have
 * C entries (cs = 1) or one (cs = 0); off (int64 [C]) is optional. */
int tsr_requant(const void *acc, int64_t sa, int acc64, const int32_t *mult, const int32_t *shift, int64_t cs,
                const int64_t *off, int64_t M, int64_t C, int64_t zp, int64_t qmin, int64_t qmax, int rounding,
                void *out, int64_t so, int out16, int nthreads) {
    const int mode = acc64 ? 2 : (rounding == RQ_SINGLE ? 1 : 0);
    const int ae = acc64 ? 8 : 4, oe = out16 ? 2 : 1;
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(static)
    for (int64_t i = 0; i < M; i++) {
        const char *a = (const char *)acc + i * sa * ae;
        char *o = (char *)out + i * so * oe;
        /* constant mode and channel stride: the compiler emits one vectorised loop per variant */
#define RQ(MODE) (cs ? rq_row(a, acc64, mult, shift, 1, off, C, zp, qmin, qmax, o, out16, MODE) \
                     : rq_row(a, acc64, mult, shift, 0, off, C, zp, qmin, qmax, o, out16, MODE))
        if (mode == 0) RQ(0);
        else if (mode == 1) RQ(1);
        else RQ(2);
#undef RQ
    }
    return TSR_OK;
}

/* off[n] = (bias ? bias[n] : 0) - x_zp * sum_k w[n, k]; bias int32 or int64 (bias64) */
int tsr_rq_offset(const int8_t *w, int64_t N, int64_t K, const void *bias, int bias64, int64_t xzp, int64_t *off) {
    for (int64_t n = 0; n < N; n++) {
        int64_t s = 0;
        const int8_t *wr = w + n * K;
#pragma omp simd reduction(+ : s)
        for (int64_t k = 0; k < K; k++) s += wr[k];
        const int64_t b = !bias ? 0 : bias64 ? ((const int64_t *)bias)[n] : ((const int32_t *)bias)[n];
        off[n] = b - xzp * s;
    }
    return TSR_OK;
}

/* x: [N, C, H, W] with element strides (sn, sc, sh, sw) (any memory format), int8 (es 1) or
 * int16 (es 2) -> cols [N*Ho*Wo, C*kh*kw]; each group's columns are one contiguous slice.
 *   order 0 (NCHW x): column (c * kh + ky) * kw + kx, the weight's own [O, C/g, kh, kw] order
 *   order 1 (channels-last x, sc == 1): column g*Kg + (ky * kw + kx) * Cg + cg, so a tap copies Cg
 *            contiguous channels (memcpy) -- the launcher hands the weight as [O, kh, kw, C/g]
 * Padding taps hold pad_value (x_zp). */
INL void fill(char *dst, int es, int64_t n, int64_t v) {
    if (es == 1) memset(dst, (int)(int8_t)v, (size_t)n);
    else for (int64_t i = 0; i < n; i++) ((int16_t *)dst)[i] = (int16_t)v;
}

int tsr_im2col(const void *x, int es, int64_t Nb, int64_t C, int64_t H, int64_t W, int64_t sn, int64_t sc,
               int64_t sh, int64_t sw, int64_t kh, int64_t kw, int64_t st_h, int64_t st_w, int64_t pd_h,
               int64_t pd_w, int64_t dl_h, int64_t dl_w, int64_t Ho, int64_t Wo, int64_t pad_value, int64_t groups,
               int order, void *cols, int nthreads) {
    const int64_t Kc = C * kh * kw, rows = Nb * Ho * Wo, Cg = C / groups, Kg = Cg * kh * kw;
    const char *xb = (const char *)x;
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t n = r / (Ho * Wo), oy = (r / Wo) % Ho, ox = r % Wo;
        char *row = (char *)cols + r * Kc * es;
        if (order == 1) {
            for (int64_t g = 0; g < groups; g++)
                for (int64_t ky = 0; ky < kh; ky++) {
                    const int64_t iy = oy * st_h - pd_h + ky * dl_h;
                    for (int64_t kx = 0; kx < kw; kx++) {
                        const int64_t ix = ox * st_w - pd_w + kx * dl_w;
                        char *dst = row + (g * Kg + (ky * kw + kx) * Cg) * es;
                        if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                            memcpy(dst, xb + (n * sn + g * Cg + iy * sh + ix * sw) * es, (size_t)(Cg * es));
                        else
                            fill(dst, es, Cg, pad_value);
                    }
                }
            continue;
        }
        for (int64_t c = 0; c < C; c++)
            for (int64_t ky = 0; ky < kh; ky++) {
                const int64_t iy = oy * st_h - pd_h + ky * dl_h;
                const int64_t col0 = (c * kh + ky) * kw;
                for (int64_t kx = 0; kx < kw; kx++) {
                    const int64_t ix = ox * st_w - pd_w + kx * dl_w;
                    const int inb = iy >= 0 && iy < H && ix >= 0 && ix < W;
                    const int64_t src = n * sn + c * sc + iy * sh + ix * sw;
                    if (es == 1)
                        ((int8_t *)row)[col0 + kx] = inb ? ((const int8_t *)x)[src] : (int8_t)pad_value;
                    else
                        ((int16_t *)row)[col0 + kx] = inb ? ((const int16_t *)x)[src] : (int16_t)pad_value;
                }
            }
    }
    return TSR_OK;
}

/* Depthwise (one input channel a group, one output per group) integer accumulator, no im2col:
 *   acc[(n, oy, ox), c] = sum_{ky, kx} xv * wt[ky * kw + kx, c],   xv = x[n, c, iy, ix] or x_zp
 * (a padding tap holds x_zp, as in tsr_im2col, so tsr_rq_offset's correction cancels it exactly).
 * wt is the weight widened to int32 and transposed to taps-major [kh*kw, C], so the loop over c is
 * unit-stride in wt, acc and -- for a channels-last x (sc == 1) -- in x: it vectorises.  int8 x:
 * int32 sums (exact: |sum| <= kh*kw * 2^15); int16 x: int64 sums (CMSIS-NN's s16 path). */
#define DW_ROW(AT, XT)                                                                                  \
    do {                                                                                                \
        AT *a = (AT *)acc + r * C;                                                                      \
        for (int64_t c = 0; c < C; c++) a[c] = 0;                                                       \
        for (int64_t ky = 0; ky < kh; ky++) {                                                           \
            const int64_t iy = oy * st_h - pd_h + ky * dl_h;                                            \
            for (int64_t kx = 0; kx < kw; kx++) {                                                       \
                const int64_t ix = ox * st_w - pd_w + kx * dl_w;                                        \
                const int32_t *w = wt + (ky * kw + kx) * C;                                             \
                if (iy >= 0 && iy < H && ix >= 0 && ix < W) {                                           \
                    const XT *xp = (const XT *)x + n * sn + iy * sh + ix * sw;                           \
                    if (sc == 1)                                                                        \
                        for (int64_t c = 0; c < C; c++) a[c] += (AT)xp[c] * (AT)w[c];                   \
                    else                                                                                \
                        for (int64_t c = 0; c < C; c++) a[c] += (AT)xp[c * sc] * (AT)w[c];              \
                } else {                                                                                \
                    for (int64_t c = 0; c < C; c++) a[c] += (AT)zp * (AT)w[c];                          \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
    } while (0)

int tsr_dw_acc(const void *x, int es, int64_t Nb, int64_t C, int64_t H, int64_t W, int64_t sn, int64_t sc,
               int64_t sh, int64_t sw, const int32_t *wt, int64_t kh, int64_t kw, int64_t st_h, int64_t st_w,
               int64_t pd_h, int64_t pd_w, int64_t dl_h, int64_t dl_w, int64_t Ho, int64_t Wo, int64_t zp,
               void *acc, int acc64, int nthreads) {
    if ((es != 1 && es != 2) || (es == 2) != (acc64 != 0)) return TSR_EINVAL;
    const int64_t rows = Nb * Ho * Wo;
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t n = r / (Ho * Wo), oy = (r / Wo) % Ho, ox = r % Wo;
        if (es == 1) DW_ROW(int32_t, int8_t);
        else DW_ROW(int64_t, int16_t);
    }
    return TSR_OK;
}
#undef DW_ROW
