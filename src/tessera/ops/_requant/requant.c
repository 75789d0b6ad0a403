/* requant.c -- the integer-only pipeline's native CPU kernels (framework-free C11).
 *
 *   tsr_requant:  out[m, c] = clamp(MBQM(acc[m, c] + off[c], mult[c], shift[c]) + zp, qmin, qmax)
 *   (off[n] = bias[n] - x_zp * sum_k w[n, k], int64, is the zero-point correction that lets the int8
 *    GEMM run on the raw int8 x: sum (x - zp) w = sum x w - zp sum w; cpu.py derives it from the
 *    weight's row sums, computed once per weight tensor)
 *   tsr_transpose_i8: the NCHW <-> channels-last copies of int8 activations
 *   tsr_im2col:   int8/int16 NCHW or NHWC input -> rows [N*Ho*Wo, groups * (C/g)*kh*kw] in
 *                  (group, channel, ky, kx) order, padding taps = x_zp (so the correction above
 *                  makes them contribute exactly 0, TFLite's rule)
 *   tsr_dw_requant / tsr_dw_requant_k3: the depthwise conv, requantized per output row (an integer
 *                  tap loop; for 3-wide taps at stride 1/2 on AVX-512, dw_int8_k3.h: 3x3 as
 *                  VPDPBUSD over interleaved row quads with VNNI + VBMI, else exact fp32 FMA tiles)
 *
 * MBQM (MultiplyByQuantizedMultiplier) is written out in ops/requantize/__init__.py; here it is
 * branch-free (selects, shifts) so the per-row loops vectorise.  The int32-accumulator modes work
 * in int32 lanes with one widening 32x32->64 product (|a * m| <= 2^62); the int64 mode in int64
 * (|x * rm| <= 2^62, x clamped to 2^47): nothing overflows for the enforced shift ranges.  With
 * AVX-512 (TSR_AVX512) the rows run through explicit intrinsics (rq_row_v: vpmuldq on even / odd
 * lanes, vpsravd / vpsravq, masked tails), bit-identical to the portable C (rq_row); the double
 * rounding of int8 outputs goes through fp32 with an exactness check where the channels allow it
 * (tessera_requant.h rq_f_double; TESSERA_RQ_FP32=0 keeps the integer form).
 */

#include "tessera_requant.h"


/* acc rows [M, C] (row stride sa elements), out rows [M, C] (row stride so); mult/shift have
 * C entries (cs = 1) or one (cs = 0); off (int64 [C]) is optional. */
int tsr_requant(const void *acc, int64_t sa, int acc64, const int32_t *mult, const int32_t *shift, int64_t cs,
                const int64_t *off, int64_t M, int64_t C, int64_t zp, int64_t qmin, int64_t qmax, int rounding,
                void *out, int64_t so, int out16, int nthreads) {
    const int mode = acc64 ? 2 : (rounding == RQ_SINGLE ? 1 : 0);
    const int ae = acc64 ? 8 : 4, oe = out16 ? 2 : 1;
#ifdef TSR_AVX512
    if (mode == 0) {   /* blocks of rows: the per-channel part once per block, the fp32 form where it applies */
        const int f32 = rq_f_enabled();
        const int64_t nb = (M + 63) / 64;
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(static)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t i0 = b * 64, rows = M - i0 < 64 ? M - i0 : 64;
            if (cs)
                rq_tile_v_double((const int32_t *)acc + i0 * sa, sa, rows, mult, shift, 1, off, C, zp, qmin, qmax,
                                 (char *)out + i0 * so * oe, so, out16, f32);
            else
                rq_tile_v_double((const int32_t *)acc + i0 * sa, sa, rows, mult, shift, 0, off, C, zp, qmin, qmax,
                                 (char *)out + i0 * so * oe, so, out16, f32);
        }
        return TSR_OK;
    }
    if (mode == 2) {   /* int64 accumulators: the per-channel part once (rq64_t), the saturating offset add */
        rq64_t k64;
        if (rq64_init(&k64, mult, shift, cs, C)) return TSR_ENOMEM;
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(static)
        for (int64_t i = 0; i < M; i++)
            rq_row_v64k((const int64_t *)acc + i * sa, off, 1, &k64, 0, C, zp, qmin, qmax, (char *)out + i * so * oe,
                        out16);
        rq64_free(&k64);
        return TSR_OK;
    }
#define RQ(MODE) (cs ? rq_row_v(a, mult, shift, 1, off, C, zp, qmin, qmax, o, out16, MODE) \
                     : rq_row_v(a, mult, shift, 0, off, C, zp, qmin, qmax, o, out16, MODE))
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(static)
    for (int64_t i = 0; i < M; i++) {   /* mode 1 (mode 0 ran as tiles above) */
        const char *a = (const char *)acc + i * sa * ae;
        char *o = (char *)out + i * so * oe;
        RQ(1);
    }
#else
#define RQ(MODE) (cs ? rq_row(a, acc64, mult, shift, 1, off, C, zp, qmin, qmax, o, out16, MODE) \
                     : rq_row(a, acc64, mult, shift, 0, off, C, zp, qmin, qmax, o, out16, MODE))
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(static)
    for (int64_t i = 0; i < M; i++) {
        const char *a = (const char *)acc + i * sa * ae;
        char *o = (char *)out + i * so * oe;
        /* constant mode and channel stride: the compiler emits one vectorised loop per variant */
        if (mode == 0) RQ(0);
        else if (mode == 1) RQ(1);
        else RQ(2);
    }
#endif
#undef RQ
    return TSR_OK;
}

/* dst[b][s][r] = src[b][r][s] for int8 matrices R x S (row strides ss / ds, batch strides bs / bd):
 * the NCHW <-> channels-last copies around the int8 conv (per image, C x H*W one way and
 * H*W x C the other).  torch's int8 permute copies ran at ~1.5 GB/s here (0.13-0.19 ms for one
 * 64x56x56 activation, a sixth of the conv); 16 x 16 blocks go through SSE2 unpacks (4 stages
 * of byte / word / dword / qword interleaves), the edges element by element. */
#if defined(__SSE2__)
#include <emmintrin.h>
INL void tr16x16(const int8_t *src, int64_t ss, int8_t *dst, int64_t ds) {
    __m128i a[16], b[16], c[16], d[16];
    for (int i = 0; i < 16; i++) a[i] = _mm_loadu_si128((const __m128i *)(src + i * ss));
    for (int i = 0; i < 8; i++) {   /* rows 2i, 2i+1 interleaved: columns 0-7 / 8-15 */
        b[2 * i] = _mm_unpacklo_epi8(a[2 * i], a[2 * i + 1]);
        b[2 * i + 1] = _mm_unpackhi_epi8(a[2 * i], a[2 * i + 1]);
    }
    for (int q = 0; q < 4; q++) {   /* rows 4q..4q+3: columns 0-3, 4-7, 8-11, 12-15 */
        c[4 * q] = _mm_unpacklo_epi16(b[4 * q], b[4 * q + 2]);
        c[4 * q + 1] = _mm_unpackhi_epi16(b[4 * q], b[4 * q + 2]);
        c[4 * q + 2] = _mm_unpacklo_epi16(b[4 * q + 1], b[4 * q + 3]);
        c[4 * q + 3] = _mm_unpackhi_epi16(b[4 * q + 1], b[4 * q + 3]);
    }
    for (int h = 0; h < 2; h++)     /* rows 8h..8h+7: column pairs (0,1), (2,3), ... (14,15) */
        for (int j = 0; j < 4; j++) {
            d[8 * h + 2 * j] = _mm_unpacklo_epi32(c[8 * h + j], c[8 * h + 4 + j]);
            d[8 * h + 2 * j + 1] = _mm_unpackhi_epi32(c[8 * h + j], c[8 * h + 4 + j]);
        }
    for (int j = 0; j < 8; j++) {   /* column 2j and 2j+1, all 16 rows */
        _mm_storeu_si128((__m128i *)(dst + 2 * j * ds), _mm_unpacklo_epi64(d[j], d[8 + j]));
        _mm_storeu_si128((__m128i *)(dst + (2 * j + 1) * ds), _mm_unpackhi_epi64(d[j], d[8 + j]));
    }
}
#endif

int tsr_transpose_i8(const int8_t *src, int64_t B, int64_t R, int64_t S, int64_t ss, int64_t bs, int8_t *dst,
                     int64_t ds, int64_t bd, int nthreads) {
    const int64_t nr = (R + 15) / 16, ns = (S + 15) / 16;
#pragma omp parallel for collapse(2) num_threads(tsr_threads(nthreads)) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < nr * ns; t++) {
            const int64_t r0 = t / ns * 16, s0 = t % ns * 16;
            const int8_t *sp = src + b * bs + r0 * ss + s0;
            int8_t *dp = dst + b * bd + s0 * ds + r0;
#if defined(__SSE2__)
            if (r0 + 16 <= R && s0 + 16 <= S) {
                tr16x16(sp, ss, dp, ds);
                continue;
            }
#endif
            const int64_t r1 = R - r0 < 16 ? R - r0 : 16, s1 = S - s0 < 16 ? S - s0 : 16;
            for (int64_t r = 0; r < r1; r++)
                for (int64_t s = 0; s < s1; s++) dp[s * ds + r] = sp[r * ss + s];
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
    if (order == 1 && groups == 1 && sw == C && dl_w == 1) {
        /* dense pixels, one group: a tap row's in-bounds taps are one contiguous run of x and of
         * the column row -- one copy per (row, ky), not one per tap (a 3-channel stem copied 3
         * bytes a call: 2.9 ms of ResNet-18's 7x7 stem im2col).  Image rows outer, pixels inner
         * (no divisions per pixel); runs of up to 64 bytes as one masked load / store, not a
         * memcpy call (MobileNetV2's stem: 9-byte runs, 3 a pixel) */
#ifdef TSR_AVX512
        /* interior pixels (every tap column inside the image): ix0 >= 0 and ix0 + kw <= W */
        int64_t oxL, oxR;
        tsr_interior_cols(W, kw, st_w, pd_w, Wo, &oxL, &oxR);
        const int64_t rb = Kc * es, run = kw * C * es;   /* a column row's and a tap row's bytes */
#endif
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(static)
        for (int64_t ry = 0; ry < Nb * Ho; ry++) {
            const int64_t n = ry / Ho, oy = ry % Ho;
#ifdef TSR_AVX512
            if (rb <= 64 && oxR > oxL) {
                /* the interior's column rows from constant masks: tap row ky is the run at byte
                 * ky * run of the column row, loaded from `run` bytes before its pixels (bytes
                 * outside the mask suppressed); two pixels a register where two rows fit (their
                 * column rows are adjacent): 2 x 27 bytes a store for MobileNetV2's stem */
                const char *src[64];
                __mmask64 km[64], km2[64];   /* km2: the second pixel's */
                for (int64_t ky = 0; ky < kh; ky++) {
                    const int64_t iy = oy * st_h - pd_h + ky * dl_h;
                    src[ky] = iy < 0 || iy >= H ? NULL : xb + (n * sn + iy * sh - pd_w * sw) * es - ky * run;
                    km[ky] = (run == 64 ? ~(__mmask64)0 : (((__mmask64)1 << run) - 1)) << (ky * run);
                    km2[ky] = 2 * rb <= 64 ? km[ky] << rb : 0;
                }
                const __m512i pad = es == 1 ? _mm512_set1_epi8((char)pad_value) : _mm512_set1_epi16((short)pad_value);
                const int64_t step = st_w * C * es;   /* source bytes from one pixel to the next */
                int64_t ox = oxL;
                if (2 * rb <= 64) {
                    const __mmask64 ks = (2 * rb == 64 ? ~(__mmask64)0 : (((__mmask64)1 << (2 * rb)) - 1));
                    for (; ox + 1 < oxR; ox += 2) {
                        __m512i v = pad;
                        for (int64_t ky = 0; ky < kh; ky++) {
                            if (!src[ky]) continue;
                            v = _mm512_mask_loadu_epi8(v, km[ky], src[ky] + ox * step);
                            v = _mm512_mask_loadu_epi8(v, km2[ky], src[ky] + (ox + 1) * step - rb);
                        }
                        _mm512_mask_storeu_epi8((char *)cols + (ry * Wo + ox) * rb, ks, v);
                    }
                }
                const __mmask64 k1s = rb == 64 ? ~(__mmask64)0 : (((__mmask64)1 << rb) - 1);
                for (; ox < oxR; ox++) {
                    __m512i v = pad;
                    for (int64_t ky = 0; ky < kh; ky++)
                        if (src[ky]) v = _mm512_mask_loadu_epi8(v, km[ky], src[ky] + ox * step);
                    _mm512_mask_storeu_epi8((char *)cols + (ry * Wo + ox) * rb, k1s, v);
                }
            } else if (rb <= 256 && kh <= 16 && oxR > oxL) {
                /* the same for column rows of 65..256 bytes (ResNet-18's 7x7 stem: 147 bytes, 7 tap
                 * rows of 21), nr registers a row: tap row ky's bytes [ky run, (ky + 1) run) meet
                 * register r in a constant mask (none: skipped), loaded from the run's source less
                 * its offset in the column row.  A register's loads are zero-masked and ORed (each
                 * merge-masked load waited for the one before: a 7-long chain), then the bytes no
                 * run covers take the padding.  The per-tap-row copies below cost ~95 cycles a
                 * pixel there, ~2.6 ms of the stem's im2col at batch 8. */
                const int64_t nr = (rb + 63) / 64;
                const char *src[4][16];
                __mmask64 km[4][16], cov[4] = {0, 0, 0, 0};
                int nl[4] = {0, 0, 0, 0};
                for (int64_t ky = 0; ky < kh; ky++) {
                    const int64_t iy = oy * st_h - pd_h + ky * dl_h;
                    if (iy < 0 || iy >= H) continue;   /* a row of padding */
                    const char *sy = xb + (n * sn + iy * sh - pd_w * sw) * es - ky * run;
                    for (int64_t r = 0; r < nr; r++) {   /* bytes [ky run, (ky + 1) run) within [64 r, 64 r + 64) */
                        const int64_t lo = ky * run - 64 * r, hi = lo + run;
                        const int64_t a = lo < 0 ? 0 : lo, b = hi > 64 ? 64 : hi;
                        if (b <= a) continue;
                        const __mmask64 k = (b - a == 64 ? ~(__mmask64)0 : (((__mmask64)1 << (b - a)) - 1)) << a;
                        km[r][nl[r]] = k;
                        src[r][nl[r]++] = sy + 64 * r;
                        cov[r] |= k;
                    }
                }
                const __m512i pad = es == 1 ? _mm512_set1_epi8((char)pad_value) : _mm512_set1_epi16((short)pad_value);
                const int64_t step = st_w * C * es;
                const __mmask64 kt = rb % 64 ? (((__mmask64)1 << (rb % 64)) - 1) : ~(__mmask64)0;   /* the last register's */
                for (int64_t ox = oxL; ox < oxR; ox++) {
                    char *row = (char *)cols + (ry * Wo + ox) * rb;
                    for (int64_t r = 0; r < nr; r++) {
                        __m512i v = _mm512_setzero_si512();
                        for (int t = 0; t < nl[r]; t++)
                            v = _mm512_or_si512(v, _mm512_maskz_loadu_epi8(km[r][t], src[r][t] + ox * step));
                        v = _mm512_mask_mov_epi8(pad, cov[r], v);
                        if (r + 1 < nr) _mm512_storeu_si512((void *)(row + 64 * r), v);
                        else _mm512_mask_storeu_epi8(row + 64 * r, kt, v);
                    }
                }
            }
#endif
            for (int64_t ox = 0; ox < Wo; ox++) {
#ifdef TSR_AVX512
                if ((rb <= 64 || (rb <= 256 && kh <= 16)) && ox == oxL && oxR > oxL) {   /* done above */
                    ox = oxR - 1;
                    continue;
                }
#endif
                char *row = (char *)cols + (ry * Wo + ox) * Kc * es;
                const int64_t ix0 = ox * st_w - pd_w;
                int64_t k0, k1;   /* (k1 <= k0: every tap a pad) */
                tsr_taps_inside(ix0, W, kw, &k0, &k1);
#ifdef TSR_AVX512
                if (Kc * es <= 64) {   /* the whole column row in one register, one masked store */
                    const __m512i v = tsr_v_row_taps(
                        es == 1 ? _mm512_set1_epi8((char)pad_value) : _mm512_set1_epi16((short)pad_value),
                        xb + n * sn * es, sh * es, C * es, H, kh, dl_h, oy * st_h - pd_h, kw, ix0, k0, k1);
                    const int64_t rb = Kc * es;
                    _mm512_mask_storeu_epi8(row, rb == 64 ? ~(__mmask64)0 : (((__mmask64)1 << rb) - 1), v);
                    continue;
                }
#endif
                for (int64_t ky = 0; ky < kh; ky++) {
                    const int64_t iy = oy * st_h - pd_h + ky * dl_h;
                    char *dst = row + ky * kw * C * es;
                    if (iy < 0 || iy >= H || k1 <= k0) {
                        fill(dst, es, kw * C, pad_value);
                        continue;
                    }
                    if (k0) fill(dst, es, k0 * C, pad_value);
                    const char *src = xb + (n * sn + iy * sh + (ix0 + k0) * sw) * es;
                    const int64_t nb = (k1 - k0) * C * es;
#ifdef TSR_AVX512
                    if (nb <= 64) {
                        const __mmask64 k = nb == 64 ? ~(__mmask64)0 : (((__mmask64)1 << nb) - 1);
                        _mm512_mask_storeu_epi8(dst + k0 * C * es, k, _mm512_maskz_loadu_epi8(k, src));
                    } else
#endif
                        memcpy(dst + k0 * C * es, src, (size_t)nb);
                    if (k1 < kw) fill(dst + k1 * C * es, es, (kw - k1) * C, pad_value);
                }
            }
        }
        return TSR_OK;
    }
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
 * (a padding tap holds x_zp, as in tsr_im2col, so the offset's correction cancels it exactly).
 * wt is the weight widened to int32 and transposed to taps-major [kh*kw, C], so the loop over c is
 * unit-stride in wt, acc and -- for a channels-last x (sc == 1) -- in x: it vectorises.  int8 x:
 * int32 sums (exact: |sum| <= kh*kw * 2^15); int16 x: int64 sums (CMSIS-NN's s16 path). */
#define DW_ROW(AT, XT)                                                                                  \
    do {                                                                                                \
        AT *a = (AT *)acc;                                                                              \
        for (int64_t c = 0; c < C; c++) a[c] = init ? (AT)init[c] : 0;                                  \
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

#ifdef TSR_AVX512
/* DW_ROW for int8 channels-last x (sc == 1), 64 channels a step in 4 x 16 int32 lanes: a tap's 64
 * input bytes widened (vpmovsxbd) and multiplied by its int32 weights (vpmulld), the sums kept in
 * registers over the taps (the C loop above loads and stores the accumulator row once a tap:
 * 3-8x slower than fp32 F.conv2d on MobileNetV2's depthwise layers).  Exact: |sum| <= taps * 2^15. */
INL void dw_row_v(const int8_t *xb, int64_t sh, int64_t sw, const int32_t *wt, const int32_t *init, int64_t C,
                  int64_t H, int64_t W,
                  int64_t kh, int64_t kw, int64_t iy0, int64_t ix0, int64_t dl_h, int64_t dl_w, int32_t zp,
                  int32_t *a) {
    const __m512i vzp = _mm512_set1_epi32(zp);
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
        const int64_t n = C - c0 < 64 ? C - c0 : 64;
        const __mmask64 kb = n == 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1);
        __mmask16 k[4];
        __m512i acc[4];
        for (int j = 0; j < 4; j++) {
            const int64_t v = n - 16 * j;
            k[j] = (__mmask16)(v <= 0 ? 0 : (v >= 16 ? 0xFFFF : (1u << v) - 1u));
            acc[j] = init ? _mm512_maskz_loadu_epi32(k[j], init + c0 + 16 * j) : _mm512_setzero_si512();
        }
        for (int64_t ky = 0; ky < kh; ky++) {
            const int64_t iy = iy0 + ky * dl_h;
            for (int64_t kx = 0; kx < kw; kx++) {
                const int64_t ix = ix0 + kx * dl_w;
                const int32_t *w = wt + (ky * kw + kx) * C + c0;
                if (iy >= 0 && iy < H && ix >= 0 && ix < W) {
                    const __m512i xv = _mm512_maskz_loadu_epi8(kb, xb + iy * sh + ix * sw + c0);
                    const __m128i q[4] = {_mm512_castsi512_si128(xv), _mm512_extracti32x4_epi32(xv, 1),
                                          _mm512_extracti32x4_epi32(xv, 2), _mm512_extracti32x4_epi32(xv, 3)};
                    for (int j = 0; j < 4; j++)
                        acc[j] = _mm512_add_epi32(acc[j], _mm512_mullo_epi32(_mm512_cvtepi8_epi32(q[j]),
                                                                            _mm512_maskz_loadu_epi32(k[j], w + 16 * j)));
                } else {
                    for (int j = 0; j < 4; j++)
                        acc[j] = _mm512_add_epi32(acc[j], _mm512_mullo_epi32(vzp, _mm512_maskz_loadu_epi32(k[j], w + 16 * j)));
                }
            }
        }
        for (int j = 0; j < 4; j++) _mm512_mask_storeu_epi32(a + c0 + 16 * j, k[j], acc[j]);
    }
}

/* dw_row_v for int16 channels-last x (CMSIS-NN s16, int64 accumulators): 16 channels a step,
 * each tap's int16 codes widened (vpmovsxwd) and multiplied by the int32 weights in int32 lanes
 * (|x w| <= 2^15 * 2^7 = 2^22, so a window of up to 511 taps sums exactly in int32: the caller
 * checks), the sums sign-extended into the int64 row (the scalar loop it replaces loaded and
 * stored that int64 row once a tap).  The zero point enters as the padding taps' value (the
 * offset subtracts zp * sum w); the row starts at 0. */
INL void dw_row_v16(const int16_t *xb, int64_t sh, int64_t sw, const int32_t *wt, int64_t C, int64_t H, int64_t W,
                    int64_t kh, int64_t kw, int64_t iy0, int64_t ix0, int64_t dl_h, int64_t dl_w, int32_t zp,
                    int64_t *a) {
    const __m512i vzp = _mm512_set1_epi32(zp);
    for (int64_t c0 = 0; c0 < C; c0 += 16) {
        const __mmask16 k = rq_tail16(C - c0);
        __m512i acc = _mm512_setzero_si512();
        for (int64_t ky = 0; ky < kh; ky++) {
            const int64_t iy = iy0 + ky * dl_h;
            for (int64_t kx = 0; kx < kw; kx++) {
                const int64_t ix = ix0 + kx * dl_w;
                const __m512i w = _mm512_maskz_loadu_epi32(k, wt + (ky * kw + kx) * C + c0);
                const __m512i xv = iy >= 0 && iy < H && ix >= 0 && ix < W
                    ? _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(k, xb + iy * sh + ix * sw + c0)) : vzp;
                acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(xv, w));
            }
        }
        _mm512_mask_storeu_epi64(a + c0, (__mmask8)k, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(acc)));
        _mm512_mask_storeu_epi64(a + c0 + 8, (__mmask8)(k >> 8), _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(acc, 1)));
    }
}
#endif

/* one requantized output row of the depthwise conv (tsr_dw_requant) */
INL void dw_requant_row(const void *x, int es, int64_t r, int64_t C, int64_t H, int64_t W, int64_t sn, int64_t sc,
                        int64_t sh, int64_t sw, const int32_t *wt, int64_t kh, int64_t kw, int64_t st_h,
                        int64_t st_w, int64_t pd_h, int64_t pd_w, int64_t dl_h, int64_t dl_w, int64_t Ho, int64_t Wo,
                        int64_t zp, const int32_t *mult, const int32_t *shift, int64_t cs, const int64_t *off,
                        const int32_t *init, int64_t ozp, int64_t qmin, int64_t qmax, int mode, char *o, int out16,
                        void *acc, const void *k64v, int off_sat) {
    const int64_t n = r / (Ho * Wo), oy = (r / Wo) % Ho, ox = r % Wo;
#ifdef TSR_AVX512
    const rq64_t *k64 = (const rq64_t *)k64v;
    if (es == 2 && sc == 1 && k64 && kh * kw <= 511) {   /* int16 x: the vector taps, the int64 constants */
        dw_row_v16((const int16_t *)x + n * sn, sh, sw, wt, C, H, W, kh, kw, oy * st_h - pd_h, ox * st_w - pd_w,
                   dl_h, dl_w, (int32_t)zp, (int64_t *)acc);
        rq_row_v64k((const int64_t *)acc, off, off_sat, k64, 0, C, ozp, qmin, qmax, o, out16);
        return;
    }
    if (es == 1 && sc == 1)
        dw_row_v((const int8_t *)x + n * sn, sh, sw, wt, init, C, H, W, kh, kw, oy * st_h - pd_h, ox * st_w - pd_w, dl_h,
                 dl_w, (int32_t)zp, (int32_t *)acc);
    else
#endif
    if (es == 1) DW_ROW(int32_t, int8_t);
    else DW_ROW(int64_t, int16_t);
#ifdef TSR_AVX512
    if (mode == 2) {   /* k64: formed by tsr_dw_requant for every int16 call */
        rq_row_v64k((const int64_t *)acc, off, off_sat, k64, 0, C, ozp, qmin, qmax, o, out16);
        return;
    }
#define RQ(MODE) (cs ? rq_row_v((const char *)acc, mult, shift, 1, init ? NULL : off, C, ozp, qmin, qmax, o, out16, MODE) \
                     : rq_row_v((const char *)acc, mult, shift, 0, init ? NULL : off, C, ozp, qmin, qmax, o, out16, MODE))
    if (mode == 0) RQ(0);
    else RQ(1);
#else
#define RQ(MODE) (cs ? rq_row((const char *)acc, es == 2, mult, shift, 1, init ? NULL : off, C, ozp, qmin, qmax, o, \
                            out16, MODE) \
                     : rq_row((const char *)acc, es == 2, mult, shift, 0, init ? NULL : off, C, ozp, qmin, qmax, o, \
                              out16, MODE))
    if (mode == 0) RQ(0);
    else if (mode == 1) RQ(1);
    else RQ(2);
#endif
#undef RQ
}

/* Depthwise conv, requantized: each output row's accumulators (DW_ROW, or dw_row_v) then
 * tsr_requant's row function on them, so the int32 / int64 accumulators never leave a per-thread
 * row buffer.  out rows [Nb*Ho*Wo, C] (row stride so); mult / shift / off as tsr_requant. */
int tsr_dw_requant(const void *x, int es, int64_t Nb, int64_t C, int64_t H, int64_t W, int64_t sn, int64_t sc,
                   int64_t sh, int64_t sw, const int32_t *wt, int64_t kh, int64_t kw, int64_t st_h, int64_t st_w,
                   int64_t pd_h, int64_t pd_w, int64_t dl_h, int64_t dl_w, int64_t Ho, int64_t Wo, int64_t zp,
                   const int32_t *mult, const int32_t *shift, int64_t cs, const int64_t *off, int64_t ozp, int64_t qmin,
                   int64_t qmax, int rounding, void *out, int64_t so, int out16, int nthreads) {
    if (es != 1 && es != 2) return TSR_EINVAL;
    const int mode = es == 2 ? 2 : (rounding == RQ_SINGLE ? 1 : 0), oe = out16 ? 2 : 1;
    const int64_t rows = Nb * Ho * Wo;
    /* int8 x: the offset starts the int32 sums instead of a saturating int64 add per element when
     * no sum can overflow (|x w| <= 2^14 a tap): bit-identical, and ~a third of the requantization */
    int32_t *init = NULL;
    if (es == 1 && off) {
        const int64_t lim = INT32_MAX - kh * kw * ((int64_t)1 << 14);
        int64_t big = 0;
        for (int64_t c = 0; c < C; c++) big |= off[c] > lim || off[c] < -lim;
        init = big ? NULL : (int32_t *)aligned_alloc(64, (size_t)((C * 4 + 63) & ~(int64_t)63));
        for (int64_t c = 0; init && c < C; c++) init[c] = (int32_t)off[c];
    }
    /* int16 x: the int64 requantization's per-channel part once; |sum x w| <= taps 2^22, so an
     * offset below INT64_MAX - taps 2^22 needs no saturating add */
    void *k64 = NULL;
    int off_sat = 0;
#ifdef TSR_AVX512
    rq64_t k64s;
    if (es == 2) {
        if (rq64_init(&k64s, mult, shift, cs, C)) {
            free(init);
            return TSR_ENOMEM;
        }
        k64 = &k64s;
        const int64_t lim = INT64_MAX - kh * kw * ((int64_t)1 << 22);
        for (int64_t c = 0; off && c < C; c++) off_sat |= off[c] > lim || off[c] < -lim;
    }
#endif
    int failed = 0;
    TSR_TEAM(tsr_threads(nthreads), reduction(| : failed), {
        void *acc = aligned_alloc(64, (size_t)((C * 8 + 63) & ~(int64_t)63));
        if (!acc) failed = 1;
_Pragma("omp for schedule(static)")
        for (int64_t r = 0; r < rows; r++)
            if (!failed)
                dw_requant_row(x, es, r, C, H, W, sn, sc, sh, sw, wt, kh, kw, st_h, st_w, pd_h, pd_w, dl_h, dl_w, Ho,
                               Wo, zp, mult, shift, cs, off, init, ozp, qmin, qmax, mode, (char *)out + r * so * oe,
                               out16, acc, k64, off_sat);
        free(acc);
    });
    free(init);
#ifdef TSR_AVX512
    if (k64) rq64_free(&k64s);
#endif
    return failed ? TSR_ENOMEM : TSR_OK;
}
#undef DW_ROW

#include "dw_int8_k3.h"

/* 1 where this build has tsr_dw_requant_k3 (AVX-512), else 0: the launcher keeps the tap loop */
int tsr_dw_requant_k3_available(void) {
#ifdef TSR_AVX512
    return 1;
#else
    return 0;
#endif
}

/* x: [Nb, C, H, W] int8 with element strides (sn, sh, sw), unit channel stride; wf fp32 [kh][3][C];
 * init fp32 [C] (exact integers, see above); st_w 1 or 2; rounding / mult / shift as tsr_requant */
int tsr_dw_requant_k3(const int8_t *x, int64_t Nb, int64_t C, int64_t H, int64_t W, int64_t sn, int64_t sh,
                      int64_t sw, const float *wf, const float *init, int64_t kh, int64_t st_h, int64_t st_w,
                      int64_t pd_h, int64_t pd_w, int64_t dl_h, int64_t Ho, int64_t Wo, int64_t zp,
                      const int32_t *mult, const int32_t *shift, int64_t cs, int64_t ozp, int64_t qmin, int64_t qmax,
                      int rounding, void *out, int64_t so, int out16, int nthreads) {
#ifdef TSR_AVX512
    if (st_w != 1 && st_w != 2) return TSR_EINVAL;
    const dwq_args a = {x, H, W, sn, sh, sw, C, kh, st_h, pd_h, pd_w, dl_h, Ho, Wo, wf, init, (float)zp, mult, shift,
                        (int)cs, rounding == RQ_SINGLE ? 1 : 0, out16, rq_f_enabled(), ozp, qmin, qmax, so,
                        (char *)out};
    if (st_w == st_h && kh == 3 && dl_h == 1) {
        const char *e = getenv("TESSERA_DW_VNNI");
        if (!(e && e[0] == '0' && e[1] == 0)) {
            const int rc = dwv_run(&a, Nb, (int)st_w, nthreads);
            if (rc != TSR_EINVAL) return rc;   /* EINVAL: no VNNI / VBMI or no memory: the fp32 kernel below */
        }
    }
    const int64_t rows = Nb * Ho;
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        if (st_w == 1) dwq_row_s1(&a, r);
        else dwq_row_s2(&a, r);
    }
    return TSR_OK;
#else
    (void)x; (void)Nb; (void)C; (void)H; (void)W; (void)sn; (void)sh; (void)sw; (void)wf; (void)init; (void)kh;
    (void)st_h; (void)st_w; (void)pd_h; (void)pd_w; (void)dl_h; (void)Ho; (void)Wo; (void)zp; (void)mult;
    (void)shift; (void)cs; (void)ozp; (void)qmin; (void)qmax; (void)rounding; (void)out; (void)so; (void)out16;
    (void)nthreads;
    return TSR_EINVAL;
#endif
}

/* ------------------------------------------------------------------ float -> channels-last codes
 * tsr_quantize_cl: a quantized model's float input x [N, C, H, W] (fp32, element strides sn, sc,
 * sh, sw) -> codes [N, H, W, C] (contiguous channels-last, int8 or int16) of
 *     q = clamp(rint(x / scale) + zp, qmin, qmax),  NaN -> 0 before the rounding
 * in fp32 arithmetic, step for step the torch ops of quant/static.py QParams.quantize (a true
 * fp32 division, round half to even, the add and clamp in fp32; every result is an integer fp32
 * holds exactly, so the conversion does not round).  One pass where those ops and the
 * channels-last copy after them made seven over a batch-8 input (~3-5 ms of a 40 ms int8
 * ResNet-18).  A row of each plane at a time into int32 scratch, then interleaved. */
INL float qcl_one(float v, float scale, float zp, float qmin, float qmax) {
    float r = v / scale;
    if (r != r) r = 0.0f;
    r = rintf(r) + zp;
    return r < qmin ? qmin : (r > qmax ? qmax : r);
}

int tsr_quantize_cl(const float *x, int64_t N, int64_t C, int64_t H, int64_t W, int64_t sn, int64_t sc, int64_t sh,
                    int64_t sw, float scale, float zp, float qmin, float qmax, int out16, void *out, int nthreads) {
    if (N <= 0 || C <= 0 || H <= 0 || W <= 0) return TSR_OK;
    if (C > 64) return TSR_EINVAL;   /* (the scratch below; a model's input has a few channels) */
    int rc = TSR_OK;
#pragma omp parallel num_threads(tsr_threads(nthreads))
    {
        int32_t *codes = (int32_t *)malloc((size_t)(C * W) * sizeof(int32_t));
        if (!codes) {
#pragma omp atomic write
            rc = TSR_ENOMEM;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < N * H; r++) {
            if (!codes) continue;
            const int64_t n = r / H, h = r % H;
            for (int64_t c = 0; c < C; c++) {
                const float *xr = x + n * sn + c * sc + h * sh;
                int32_t *cr = codes + c * W;
                int64_t w = 0;
#ifdef TSR_AVX512
                if (sw == 1) {
                    const __m512 vs = _mm512_set1_ps(scale), vz = _mm512_set1_ps(zp);
                    const __m512 lo = _mm512_set1_ps(qmin), hi = _mm512_set1_ps(qmax);
                    for (; w + 16 <= W; w += 16) {
                        __m512 v = _mm512_div_ps(_mm512_loadu_ps(xr + w), vs);
                        v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);   /* NaN -> 0 */
                        v = _mm512_add_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
                        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
                        _mm512_storeu_si512((void *)(cr + w), _mm512_cvtps_epi32(v));
                    }
                }
#endif
                for (; w < W; w++) cr[w] = (int32_t)qcl_one(xr[w * sw], scale, zp, qmin, qmax);
            }
            if (out16) {
                int16_t *o = (int16_t *)out + r * W * C;
                for (int64_t w = 0; w < W; w++)
                    for (int64_t c = 0; c < C; c++) o[w * C + c] = (int16_t)codes[c * W + w];
            } else {
                int8_t *o = (int8_t *)out + r * W * C;
                for (int64_t w = 0; w < W; w++)
                    for (int64_t c = 0; c < C; c++) o[w * C + c] = (int8_t)codes[c * W + w];
            }
        }
        free(codes);
    }
    return rc;
}
