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
 *                  tap loop; for 3-wide taps at stride 1/2 on AVX-512, exact fp32 FMA tiles)
 *
 * MBQM (MultiplyByQuantizedMultiplier) is written out in ops/requantize/__init__.py; here it is
 * branch-free (selects, shifts) so the per-row loops vectorise.  The int32-accumulator modes work
 * in int32 lanes with one widening 32x32->64 product (|a * m| <= 2^62); the int64 mode in int64
 * (|x * rm| <= 2^62, x clamped to 2^47): nothing overflows for the enforced shift ranges.  With
 * AVX-512 (TSR_AVX512) the rows run through explicit intrinsics (rq_row_v: vpmuldq on even / odd
 * lanes, vpsravd / vpsravq, masked tails), bit-identical to the portable C (rq_row).
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
#endif
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(static)
    for (int64_t i = 0; i < M; i++) {
        const char *a = (const char *)acc + i * sa * ae;
        char *o = (char *)out + i * so * oe;
        /* constant mode and channel stride: the compiler emits one vectorised loop per variant */
#ifdef TSR_AVX512
#define RQ(MODE) (cs ? rq_row_v(a, mult, shift, 1, off, C, zp, qmin, qmax, o, out16, MODE) \
                     : rq_row_v(a, mult, shift, 0, off, C, zp, qmin, qmax, o, out16, MODE))
#else
#define RQ(MODE) (cs ? rq_row(a, acc64, mult, shift, 1, off, C, zp, qmin, qmax, o, out16, MODE) \
                     : rq_row(a, acc64, mult, shift, 0, off, C, zp, qmin, qmax, o, out16, MODE))
#endif
        if (mode == 0) RQ(0);
        else if (mode == 1) RQ(1);
        else RQ(2);
#undef RQ
    }
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
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(static)
        for (int64_t ry = 0; ry < Nb * Ho; ry++) {
            const int64_t n = ry / Ho, oy = ry % Ho;
            for (int64_t ox = 0; ox < Wo; ox++) {
                char *row = (char *)cols + (ry * Wo + ox) * Kc * es;
                const int64_t ix0 = ox * st_w - pd_w;
                const int64_t k0 = ix0 < 0 ? -ix0 : 0, k1 = W - ix0 < kw ? (W - ix0 > k0 ? W - ix0 : k0) : kw;
#ifdef TSR_AVX512
                if (Kc * es <= 64) {   /* the whole column row in one register, one masked store */
                    __m512i v = es == 1 ? _mm512_set1_epi8((char)pad_value) : _mm512_set1_epi16((short)pad_value);
                    for (int64_t ky = 0; ky < kh && k1 > k0; ky++) {
                        const int64_t iy = oy * st_h - pd_h + ky * dl_h;
                        if (iy < 0 || iy >= H) continue;
                        const int64_t at = (ky * kw + k0) * C * es, nb = (k1 - k0) * C * es;
                        /* the run's bytes land at [at, at + nb): load from at bytes before the run,
                         * every byte outside the mask suppressed (no access, no fault) */
                        const __mmask64 k = (nb == 64 ? ~(__mmask64)0 : (((__mmask64)1 << nb) - 1)) << at;
                        v = _mm512_mask_loadu_epi8(v, k, xb + (n * sn + iy * sh + (ix0 + k0) * sw) * es - at);
                    }
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
        const __mmask16 k = C - c0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (C - c0)) - 1u);
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
#define RQ(MODE) (cs ? rq_row_v((const char *)acc, mult, shift, 1, init ? NULL : off, C, ozp, qmin, qmax, o, out16, MODE) \
                     : rq_row_v((const char *)acc, mult, shift, 0, init ? NULL : off, C, ozp, qmin, qmax, o, out16, MODE))
#else
#define RQ(MODE) (cs ? rq_row((const char *)acc, es == 2, mult, shift, 1, init ? NULL : off, C, ozp, qmin, qmax, o, \
                            out16, MODE) \
                     : rq_row((const char *)acc, es == 2, mult, shift, 0, init ? NULL : off, C, ozp, qmin, qmax, o, \
                              out16, MODE))
#endif
    if (mode == 0) RQ(0);
    else if (mode == 1) RQ(1);
    else RQ(2);
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

/* ------------------------------------------------------------------ int8 depthwise, 3-wide taps
 * tsr_dw_requant_k3: the int8 depthwise conv for kw = 3, horizontal dilation 1, horizontal stride 1
 * or 2 (MobileNet's layers) as fp32 FMAs over a sliding window, requantized in registers.  The
 * integer tap loop above widens every tap's bytes and multiplies with vpmulld (two uops, one port),
 * and writes its int32 row for tsr_requant to read back; here a tile of 8 output pixels x 16
 * channels keeps its sums in zmm registers, each input column is loaded and widened once for the
 * 3 (stride 1) or 1-2 (stride 2) outputs it feeds, and the finished sums go through rq_v_double /
 * rq_v_single straight to the int8/int16 output.
 * Exact: x and w are int8, so every product is an integer of magnitude <= 2^14; the sums start at
 * init[c] = bias[c] - x_zp * sum(w[c]) (padding taps read x_zp, as in the integer loop, so the
 * correction cancels them), and the launcher checks |init| + taps * 2^14 <= 2^24: every partial
 * sum is an integer fp32 holds exactly, in any order -- the integer loop's int32 accumulator, bit
 * for bit, and the same requantization.  x channels-last int8 (unit channel stride), wf fp32
 * [kh][3][C], out rows [Nb*Ho*Wo, C] (row stride so). */
#ifdef TSR_AVX512
#define DWQ_P 8
typedef struct {
    const int8_t *x; int64_t H, W, sn, sh, sw, C, kh, st_h, pd_h, pd_w, dl_h, Ho, Wo;
    const float *wf, *init; float zp;
    const int32_t *mult, *shift; int cs, mode, out16, f32;   /* f32: rq_f_double allowed (TESSERA_RQ_FP32) */
    int64_t ozp, qmin, qmax, so; char *out;
} dwq_args;

/* one channel block's requantization: the per-channel parts formed once, then dwq_put per pixel */
typedef struct {
    rq_v_dch ch; rq_f_ch fc; __m512i m, s, lo32, hi32, lo64, hi64, ozp;
    int f32, mode, out16; __mmask16 kb;
} dwq_rq;

INL dwq_rq dwq_rq_init(const dwq_args *a, int64_t c0, __mmask16 kb) {
    dwq_rq R;
    R.m = a->cs ? _mm512_maskz_loadu_epi32(kb, a->mult + c0) : _mm512_set1_epi32(a->mult[0]);
    R.s = a->cs ? _mm512_maskz_loadu_epi32(kb, a->shift + c0) : _mm512_set1_epi32(a->shift[0]);
    /* the sums are exact integers within 2^24: the double rounding through fp32 where the channels
     * allow it (tessera_requant.h rq_f_double), the integer form for the vectors it distrusts (~2 %;
     * its per-channel part is then formed there, not here: ~25 instructions a block a row) */
    R.fc = rq_f_double_ch(R.m, R.s, kb, a->qmin - a->ozp, a->qmax - a->ozp);
    R.f32 = a->f32 && a->mode == 0 && !a->out16 && R.fc.ok;
    if (!R.f32 && a->mode == 0) R.ch = rq_v_double_ch(R.m, R.s);
    R.lo32 = _mm512_set1_epi32((int32_t)(a->qmin - a->ozp));
    R.hi32 = _mm512_set1_epi32((int32_t)(a->qmax - a->ozp));
    R.lo64 = _mm512_set1_epi64(a->qmin - a->ozp);
    R.hi64 = _mm512_set1_epi64(a->qmax - a->ozp);
    R.ozp = _mm512_set1_epi32((int32_t)a->ozp);
    R.mode = a->mode;
    R.out16 = a->out16;
    R.kb = kb;
    return R;
}

/* requantize 16 channels' sums (accf: fp32, exact; acc32: the same as int32) into o */
INL void dwq_put(const dwq_rq *R, __m512 accf, __m512i acc32, char *o) {
    __m512i q;
    if (!(R->f32 && !(rq_f_double(accf, &R->fc, &q) & R->kb))) {
        if (R->f32) {   /* a distrusted vector */
            const rq_v_dch ch = rq_v_double_ch(R->m, R->s);
            q = _mm512_max_epi32(_mm512_min_epi32(rq_v_double_pre(acc32, &ch), R->hi32), R->lo32);
        } else if (R->mode == 0)
            q = _mm512_max_epi32(_mm512_min_epi32(rq_v_double_pre(acc32, &R->ch), R->hi32), R->lo32);
        else
            q = rq_v_single(acc32, R->m, R->s, R->lo64, R->hi64);
    }
    rq_v_store(o, R->out16, _mm512_add_epi32(q, R->ozp), R->kb);
}

/* one output row (n, oy), every channel block and tile; S = horizontal stride (1 or 2) */
INL void dwq_row(const dwq_args *a, int64_t r, const int S) {
    const int64_t n = r / a->Ho, oy = r % a->Ho, C = a->C, W = a->W, sw = a->sw, Wo = a->Wo;
    const int oe = a->out16 ? 2 : 1;
    const __m512 vzp = _mm512_set1_ps(a->zp);
    for (int64_t c0 = 0; c0 < C; c0 += 16) {
        const __mmask16 kb = C - c0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (C - c0)) - 1u);
        const __m512 init = _mm512_maskz_loadu_ps(kb, a->init + c0);
        const dwq_rq R = dwq_rq_init(a, c0, kb);
        for (int64_t ox0 = 0; ox0 < Wo; ox0 += DWQ_P) {
            const int64_t ix0 = ox0 * S - a->pd_w, np = Wo - ox0 < DWQ_P ? Wo - ox0 : DWQ_P;
            __m512 acc[DWQ_P];
            for (int p = 0; p < DWQ_P; p++) acc[p] = init;
            for (int64_t ky = 0; ky < a->kh; ky++) {
                const int64_t iy = oy * a->st_h - a->pd_h + ky * a->dl_h;
                const float *wk = a->wf + ky * 3 * C + c0;
                const __m512 w0 = _mm512_maskz_loadu_ps(kb, wk), w1 = _mm512_maskz_loadu_ps(kb, wk + C),
                             w2 = _mm512_maskz_loadu_ps(kb, wk + 2 * C);
                if (iy < 0 || iy >= a->H) {  /* a padding row: every tap reads x_zp */
                    const __m512 t = _mm512_mul_ps(vzp, _mm512_add_ps(_mm512_add_ps(w0, w1), w2));
                    for (int p = 0; p < DWQ_P; p++) acc[p] = _mm512_add_ps(acc[p], t);
                    continue;
                }
                const int8_t *xr = a->x + n * a->sn + iy * a->sh + c0;
                /* input column j feeds output p through tap k = j - S p (0 <= k < 3); after full
                 * unrolling every test below is a constant */
#pragma GCC unroll 24
                for (int j = 0; j < S * (DWQ_P - 1) + 3; j++) {
                    const int64_t ix = ix0 + j;
                    const __m512 v = (uint64_t)ix < (uint64_t)W
                        ? _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(kb, xr + ix * sw))) : vzp;
#pragma GCC unroll 8
                    for (int p = 0; p < DWQ_P; p++) {
                        const int k = j - S * p;
                        if (k >= 0 && k < 3) acc[p] = _mm512_fmadd_ps(v, k == 0 ? w0 : (k == 1 ? w1 : w2), acc[p]);
                    }
                }
            }
            char *o = a->out + ((r * Wo + ox0) * a->so + c0) * oe;
            for (int64_t p = 0; p < np; p++)   /* acc: exact integers, so the conversion does not round */
                dwq_put(&R, acc[p], _mm512_cvtps_epi32(acc[p]), o + p * a->so * oe);
        }
    }
}

static __attribute__((noinline)) void dwq_row_s1(const dwq_args *a, int64_t r) { dwq_row(a, r, 1); }
static __attribute__((noinline)) void dwq_row_s2(const dwq_args *a, int64_t r) { dwq_row(a, r, 2); }

/* ------------------------------------------------------------------ int8 depthwise 3x3, VNNI
 * dwv_rows: the 3x3 layers of stride 1 or 2 (MobileNet's) as VPDPBUSD.  Four input rows iy0 ..
 * iy0 + 3 are interleaved byte by byte per channel into a quad buffer, Q[j][c] = the 4 codes of
 * column j - pd_w, channel c, plus 128 (uint8, VPDPBUSD's unsigned operand); one VPDPBUSD of a
 * Q column then adds that column's 3 taps for output row oy (weights (w0, w1, w2, 0)) and, at
 * stride 1, another for oy + 1 ((0, w0, w1, w2)): 3 instructions per output and 16 channels where
 * the fp32 kernel takes 9 FMAs and widens every tap's codes (at stride 2 a quad serves one row).
 * Exact: int32 sums of u8 x s8 products started at init - 128 sum w (the codes' +128), equal to
 * the fp32 kernel's (|sum| < 2^24, the launcher's check); padding reads x_zp + 128, cancelled as
 * there.  Needs AVX512-VNNI (VPDPBUSD) and VBMI (VPERMT2B, the interleave): tsr_dw_requant_k3
 * checks the CPU, and TESSERA_DW_VNNI=0 keeps the fp32 kernel (tests compare the two). */
#define DWV_P 8
#define DWV_TARGET __attribute__((target("avx512vnni,avx512vbmi")))

typedef struct {
    const dwq_args *a;
    const int32_t *wq;     /* [Cp / 16][6][16]: per 16-channel block (w0, w1, w2, 0) for kx 0..2, then (0, w0, w1, w2) */
    const int32_t *init;   /* [Cp]: init - 128 sum w */
    int64_t Cp, qbuilt, qcols;   /* C rounded up to 16; Q's columns: S (Wo - 1) + 3 built, then S DWV_P of slack */
} dwv_args;

/* Q for input rows iy0 .. iy0 + 3 of image n: [qcols][Cp] dwords, byte r of Q[j][c] from row iy0 + r */
DWV_TARGET static void dwv_build(const dwv_args *v, int64_t n, int64_t iy0, uint8_t *Q) {
    const dwq_args *a = v->a;
    const int64_t C = a->C, Cp = v->Cp, Wq = v->qbuilt;
    const __m512i pad = _mm512_set1_epi8((char)(uint8_t)((int)a->zp + 128)), flip = _mm512_set1_epi8((char)0x80);
    /* byte pairs of rows (0, 1) / (2, 3): positions 0..31 (lo) and 32..63 (hi); then word pairs of
     * those: channels 0..15 / 16..31 of each half, 4 rows each */
    __m512i ilo, ihi, iwa, iwb;
    {
        int8_t b[2][64];
        int16_t w[2][32];
        for (int i = 0; i < 64; i++) {
            b[0][i] = (int8_t)((i & 1 ? 64 : 0) + i / 2);
            b[1][i] = (int8_t)((i & 1 ? 64 : 0) + 32 + i / 2);
        }
        for (int i = 0; i < 32; i++) {
            w[0][i] = (int16_t)((i & 1 ? 32 : 0) + i / 2);
            w[1][i] = (int16_t)((i & 1 ? 32 : 0) + 16 + i / 2);
        }
        ilo = _mm512_loadu_si512(b[0]);
        ihi = _mm512_loadu_si512(b[1]);
        iwa = _mm512_loadu_si512(w[0]);
        iwb = _mm512_loadu_si512(w[1]);
    }
    const int8_t *rows[4];
    for (int r = 0; r < 4; r++) {
        const int64_t iy = iy0 + r;
        rows[r] = iy >= 0 && iy < a->H ? a->x + n * a->sn + iy * a->sh : NULL;
    }
    for (int64_t j = 0; j < Wq; j++) {
        const int64_t ix = j - a->pd_w;
        const int col = ix >= 0 && ix < a->W;
        for (int64_t c0 = 0; c0 < C; c0 += 64) {
            const __mmask64 k = C - c0 >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (C - c0)) - 1);
            __m512i r[4];
            for (int q = 0; q < 4; q++)
                r[q] = col && rows[q] ? _mm512_xor_si512(_mm512_maskz_loadu_epi8(k, rows[q] + ix * a->sw + c0), flip)
                                      : pad;
            const __m512i l01 = _mm512_permutex2var_epi8(r[0], ilo, r[1]), h01 = _mm512_permutex2var_epi8(r[0], ihi, r[1]);
            const __m512i l23 = _mm512_permutex2var_epi8(r[2], ilo, r[3]), h23 = _mm512_permutex2var_epi8(r[2], ihi, r[3]);
            uint8_t *d = Q + (j * Cp + c0) * 4;
            const int64_t nb = (Cp - c0 < 64 ? Cp - c0 : 64) / 16;   /* 16-channel blocks here: 1..4 */
            _mm512_store_si512(d, _mm512_permutex2var_epi16(l01, iwa, l23));
            if (nb > 1) _mm512_store_si512(d + 64, _mm512_permutex2var_epi16(l01, iwb, l23));
            if (nb > 2) _mm512_store_si512(d + 128, _mm512_permutex2var_epi16(h01, iwa, h23));
            if (nb > 3) _mm512_store_si512(d + 192, _mm512_permutex2var_epi16(h01, iwb, h23));
        }
    }
}

/* stride 1: output rows oy, oy + 1 (if any) of image n, item = n ceil(Ho / 2) + oy / 2; stride 2:
 * output row oy, item = n Ho + oy */
DWV_TARGET INL void dwv_rows(const dwv_args *v, int64_t item, uint8_t *Q, const int S) {
    const dwq_args *a = v->a;
    const int64_t hp = S == 1 ? (a->Ho + 1) / 2 : a->Ho, n = item / hp, oy = (item % hp) * (3 - S);
    const int64_t Wo = a->Wo, Cp = v->Cp;
    const int two = S == 1 && oy + 1 < a->Ho, oe = a->out16 ? 2 : 1;
    dwv_build(v, n, oy * S - a->pd_h, Q);
    for (int64_t c0 = 0; c0 < a->C; c0 += 16) {
        const __mmask16 kb = a->C - c0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (a->C - c0)) - 1u);
        const dwq_rq R = dwq_rq_init(a, c0, kb);
        const int32_t *wb = v->wq + c0 * 6;
        const __m512i wa0 = _mm512_load_si512(wb), wa1 = _mm512_load_si512(wb + 16), wa2 = _mm512_load_si512(wb + 32);
        const __m512i wb0 = _mm512_load_si512(wb + 48), wb1 = _mm512_load_si512(wb + 64), wb2 = _mm512_load_si512(wb + 80);
        const __m512i init = _mm512_load_si512(v->init + c0);
        char *o0 = a->out + (((n * a->Ho + oy) * Wo) * a->so + c0) * oe;
        char *o1 = o0 + Wo * a->so * oe;
        for (int64_t ox0 = 0; ox0 < Wo; ox0 += DWV_P) {
            const int64_t np = Wo - ox0 < DWV_P ? Wo - ox0 : DWV_P;
            __m512i ua[DWV_P], ub[DWV_P];
            for (int p = 0; p < DWV_P; p++) ua[p] = ub[p] = init;
            const uint8_t *qc = Q + (ox0 * S * Cp + c0) * 4;
            /* Q column S ox0 + j feeds output p through kx = j - S p (the last tile reads slack columns) */
#pragma GCC unroll 17
            for (int j = 0; j < S * (DWV_P - 1) + 3; j++) {
                const __m512i q = _mm512_load_si512(qc + j * Cp * 4);
#pragma GCC unroll 8
                for (int p = 0; p < DWV_P; p++) {
                    const int k = j - S * p;
                    if (k < 0 || k > 2) continue;
                    ua[p] = _mm512_dpbusd_epi32(ua[p], q, k == 0 ? wa0 : (k == 1 ? wa1 : wa2));
                    if (S == 1) ub[p] = _mm512_dpbusd_epi32(ub[p], q, k == 0 ? wb0 : (k == 1 ? wb1 : wb2));
                }
            }
            for (int64_t p = 0; p < np; p++) {
                dwq_put(&R, _mm512_cvtepi32_ps(ua[p]), ua[p], o0 + (ox0 + p) * a->so * oe);
                if (two) dwq_put(&R, _mm512_cvtepi32_ps(ub[p]), ub[p], o1 + (ox0 + p) * a->so * oe);
            }
        }
    }
}

DWV_TARGET static __attribute__((noinline)) void dwv_rows_s1(const dwv_args *v, int64_t it, uint8_t *Q) {
    dwv_rows(v, it, Q, 1);
}
DWV_TARGET static __attribute__((noinline)) void dwv_rows_s2(const dwv_args *v, int64_t it, uint8_t *Q) {
    dwv_rows(v, it, Q, 2);
}

/* the 3x3 layers of stride S (1 or 2) through dwv_rows; TSR_EINVAL where the CPU lacks VNNI / VBMI */
static int dwv_run(const dwq_args *a, int64_t Nb, const int S, int nthreads) {
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512vbmi")) return TSR_EINVAL;
    const int64_t C = a->C, Cp = (C + 15) & ~(int64_t)15, qbuilt = S * (a->Wo - 1) + 3, qcols = qbuilt + S * DWV_P;
    int32_t *wq = (int32_t *)aligned_alloc(64, (size_t)(Cp * 7 * 4));
    if (!wq) return TSR_ENOMEM;
    int32_t *init = wq + Cp * 6;
    /* per 16-channel block: the taps' codes (exact in wf) as bytes of (w0, w1, w2, 0) dwords, and
     * (0, w0, w1, w2) = those shifted up a byte; init - 128 sum w */
    for (int64_t c0 = 0; c0 < Cp; c0 += 16) {
        const __mmask16 kb = C - c0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (C - c0)) - 1u);
        const __m512i byte = _mm512_set1_epi32(0xFF);
        __m512i sum = _mm512_setzero_si512();
        for (int kx = 0; kx < 3; kx++) {
            __m512i d = _mm512_setzero_si512();
            for (int ky = 0; ky < 3; ky++) {
                const __m512i w = _mm512_cvtps_epi32(_mm512_maskz_loadu_ps(kb, a->wf + (ky * 3 + kx) * C + c0));
                sum = _mm512_add_epi32(sum, w);
                d = _mm512_or_si512(d, _mm512_slli_epi32(_mm512_and_si512(w, byte), 8 * ky));
            }
            _mm512_store_si512(wq + c0 * 6 + kx * 16, d);
            _mm512_store_si512(wq + c0 * 6 + (3 + kx) * 16, _mm512_slli_epi32(d, 8));
        }
        const __m512i i0 = _mm512_cvtps_epi32(_mm512_maskz_loadu_ps(kb, a->init + c0));
        _mm512_store_si512(init + c0, _mm512_sub_epi32(i0, _mm512_slli_epi32(sum, 7)));
    }
    const dwv_args v = {a, wq, init, Cp, qbuilt, qcols};
    const int64_t items = Nb * (S == 1 ? (a->Ho + 1) / 2 : a->Ho);
    const size_t qbytes = (size_t)(qcols * Cp * 4);
    int failed = 0;
#pragma omp parallel num_threads(tsr_threads(nthreads))
    {
        uint8_t *Q = (uint8_t *)aligned_alloc(64, qbytes);
        const size_t built = (size_t)(qbuilt * Cp * 4);
        if (Q) memset(Q + built, 0, qbytes - built);   /* the slack columns: read, never used */
        else {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++)
            if (Q && S == 1) dwv_rows_s1(&v, it, Q);
            else if (Q) dwv_rows_s2(&v, it, Q);
        free(Q);
    }
    free(wq);
    return failed ? TSR_ENOMEM : TSR_OK;
}
#endif

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
            if (rc != TSR_EINVAL) return rc;   /* EINVAL: no VNNI / VBMI here, the fp32 kernel below */
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
