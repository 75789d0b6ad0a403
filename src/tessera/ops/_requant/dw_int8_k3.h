/* dw_int8_k3.h -- the int8 depthwise kernels for 3-wide taps (MobileNet's layers), AVX-512.
 * Included once by requant.c (its launcher tsr_dw_requant_k3 is there); framework-free C11.
 *   dwq_row:  fp32 FMAs over a sliding window (any kh, horizontal stride 1 or 2, vertical
 *             dilation), the fallback where VNNI / VBMI are missing;
 *   dwv_rows: 3x3 at stride 1 or 2 as VPDPBUSD over interleaved row quads.
 * Both requantize their register sums (dwq_put: tessera_requant.h's fp32 form where it applies). */
#ifndef DW_INT8_K3_H
#define DW_INT8_K3_H

/* ------------------------------------------------------------------ int8 depthwise, 3-wide taps
 * tsr_dw_requant_k3: the int8 depthwise conv for kw = 3, horizontal dilation 1, horizontal stride 1
 * or 2 (MobileNet's layers) as fp32 FMAs over a sliding window, requantized in registers.  The
 * integer tap loop (requant.c, tsr_dw_requant) widens every tap's bytes and multiplies with vpmulld
 * (two uops, one port), and writes its int32 row for tsr_requant to read back; here a tile of 8
 * output pixels x 16 channels keeps its sums in zmm registers, each input column is loaded and
 * widened once for the 3 (stride 1) or 1-2 (stride 2) outputs it feeds, and the finished sums go
 * through dwq_put straight to the int8/int16 output.
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
    rq_v_dch ch; rq_f_ch fc; rq_f8_k K; __m512i m, s, lo32, hi32, lo64, hi64, ozp;
    int f32, f8, mode, out16; __mmask16 kb;   /* f8: dwq_put4 (tessera_requant.h rq_f8_*) allowed */
} dwq_rq;

INL dwq_rq dwq_rq_init(const dwq_args *a, int64_t c0, __mmask16 kb) {
    dwq_rq R;
    R.m = rq_v_chan(a->mult, a->cs, c0, kb);
    R.s = rq_v_chan(a->shift, a->cs, c0, kb);
    /* the sums are exact integers within 2^24: the double rounding through fp32 where the channels
     * allow it (tessera_requant.h rq_f_double), the integer form for the vectors it distrusts (~2 %;
     * its per-channel part is then formed there, not here: ~25 instructions a block a row) */
    R.fc = rq_f_double_ch(R.m, R.s, kb, a->qmin - a->ozp, a->qmax - a->ozp);
    R.f32 = a->f32 && a->mode == 0 && !a->out16 && R.fc.ok;
    R.f8 = R.f32 && rq_f8_ok(&R.fc, R.s, kb, a->qmin, a->qmax);
    R.K = rq_f8_init(a->ozp, a->qmin, a->qmax);
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
    if (R->f32) {
        if (rq_f_double(accf, &R->fc, &q) & R->kb) q = rq_v_double_lazy(acc32, R->m, R->s, R->lo32, R->hi32);
    } else if (R->mode == 0) {
        q = _mm512_max_epi32(_mm512_min_epi32(rq_v_double_pre(acc32, &R->ch), R->hi32), R->lo32);
    } else {
        q = rq_v_single(acc32, R->m, R->s, R->lo64, R->hi64);
    }
    rq_v_store(o, R->out16, _mm512_add_epi32(q, R->ozp), R->kb);
}

/* requantize n (1..4) pixels' sums of one 16-channel block (acc[0 .. n - 1], int32, exact) into o,
 * o + step, ...: the four-block fp32 form (rq_f8_*: ~10 instructions per 16 values where dwq_put
 * takes ~15); R->f8 */
INL void dwq_put4(const dwq_rq *R, const __m512i *acc, int n, char *o, int64_t step) {
    __m512i r[4];
    __m512 fr[4];
    for (int b = 0; b < 4; b++) fr[b] = rq_f8_block(acc[b], &R->fc, b < n ? R->kb : 0, &R->K, &r[b]);
    if (rq_f8_distrust(fr, 4, &R->K))   /* the integer form for the distrusted pixels */
        for (int b = 0; b < n; b++)
            if (rq_f8_distrust1(fr[b], &R->K)) r[b] = rq_v_double_lazy(acc[b], R->m, R->s, R->lo32, R->hi32);
    rq_f8_store4(rq_f8_pack4(r, &R->K), n, o, step, R->kb);
}

/* one output row (n, oy), every channel block and tile; S = horizontal stride (1 or 2) */
INL void dwq_row(const dwq_args *a, int64_t r, const int S) {
    const int64_t n = r / a->Ho, oy = r % a->Ho, C = a->C, W = a->W, sw = a->sw, Wo = a->Wo;
    const int oe = a->out16 ? 2 : 1;
    const __m512 vzp = _mm512_set1_ps(a->zp);
    for (int64_t c0 = 0; c0 < C; c0 += 16) {
        const __mmask16 kb = rq_tail16(C - c0);
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
 * the fp32 kernel takes 9 FMAs and widens every tap's codes (at stride 2, 4.5: dwv_rows).
 * Exact: int32 sums of u8 x s8 products started at init - 128 sum w (the codes' +128), equal to
 * the fp32 kernel's (|sum| < 2^24, the launcher's check); padding reads x_zp + 128, cancelled as
 * there.  Needs AVX512-VNNI (VPDPBUSD) and VBMI (VPERMT2B, the interleave): tsr_dw_requant_k3
 * checks the CPU, and TESSERA_DW_VNNI=0 keeps the fp32 kernel (tests compare the two). */
#define DWV_P 4   /* one dwq_put4 register of pixels; 8 spilled the 2 x 8 accumulators: ~5-10 % slower */
#define DWV_TARGET __attribute__((target("avx512vnni,avx512vbmi")))

typedef struct {
    const dwq_args *a;
    const int32_t *wq;     /* [Cp / 16][9][16]: per 16-channel block, for kx 0..2, (w0, w1, w2, 0), then (0, w0, w1, w2)
                            * (stride 1: row oy + 1), then (0, 0, w0, w1) and (w2, 0, 0, 0) (stride 2: row oy + 1) */
    const int32_t *init;   /* [Cp]: init - 128 sum w */
    const dwq_rq *rq;      /* [Cp / 16]: each channel block's requantization, formed once a call (~30
                            * instructions a block; formed per row pair it cost MobileNetV2's depthwise
                            * layers 3-9 % at batch 8) */
    int64_t Cp, qbuilt, qcols;   /* C rounded up to 16; Q's columns: S (Wo - 1) + 3 built, then S DWV_P of slack */
    /* dwv_build's byte permutations (dwv_run forms them once): byte pairs of rows (0, 1) / (2, 3),
     * channels 0..31 (ilo) and 32..63 (ihi), placed so that unpack{lo,hi}_epi16 of the two pair
     * vectors gives the quads of channels 0..15 / 16..31 in order (one in-lane unpack where a
     * two-source word permute took ~4-7 % more of a depthwise layer) */
    __m512i ilo, ihi;
} dwv_args;

/* one Q column's 64-channel chunk from its four rows' codes (r: x ^ 0x80, or the pad): nb (1..4)
 * 16-channel blocks of quads stored at d */
DWV_TARGET INL void dwv_quads(const __m512i *r, __m512i ilo, __m512i ihi, uint8_t *d, int64_t nb) {
    const __m512i l01 = _mm512_permutex2var_epi8(r[0], ilo, r[1]), l23 = _mm512_permutex2var_epi8(r[2], ilo, r[3]);
    _mm512_store_si512(d, _mm512_unpacklo_epi16(l01, l23));
    if (nb > 1) _mm512_store_si512(d + 64, _mm512_unpackhi_epi16(l01, l23));
    if (nb > 2) {
        const __m512i h01 = _mm512_permutex2var_epi8(r[0], ihi, r[1]), h23 = _mm512_permutex2var_epi8(r[2], ihi, r[3]);
        _mm512_store_si512(d + 128, _mm512_unpacklo_epi16(h01, h23));
        if (nb > 3) _mm512_store_si512(d + 192, _mm512_unpackhi_epi16(h01, h23));
    }
}

/* Q for input rows iy0 .. iy0 + 3 of image n: [qcols][Cp] dwords, byte r of Q[j][c] from row iy0 + r.
 * Columns outside the image are all pad; inside, rows outside it read the pad too.  Whole 64-channel
 * chunks load unmasked, x's geometry is in locals (Q's uint8_t stores may alias *a, so the compiler
 * reloaded a->sw at every load): 3-8 % of a stride-2 layer, level at stride 1.  One quad per output
 * row was ~57 % of a stride-2 layer's time (dwv_rows now builds one per two output rows). */
DWV_TARGET INL void dwv_build(const dwv_args *v, int64_t n, int64_t iy0, uint8_t *Q) {
    const dwq_args *a = v->a;
    const int64_t C = a->C, Cp = v->Cp, Wq = v->qbuilt, sw = a->sw, W = a->W, pd_w = a->pd_w;
    const __m512i pad = _mm512_set1_epi8((char)(uint8_t)((int)a->zp + 128)), flip = _mm512_set1_epi8((char)0x80);
    const __m512i ilo = v->ilo, ihi = v->ihi;
    const int8_t *rows[4];
    for (int r = 0; r < 4; r++) {
        const int64_t iy = iy0 + r;
        rows[r] = iy >= 0 && iy < a->H ? a->x + n * a->sn + iy * a->sh : NULL;
    }
    const int64_t j0 = pd_w < 0 ? 0 : pd_w < Wq ? pd_w : Wq, j1 = pd_w + W < Wq ? pd_w + W : Wq;
    const int64_t cf = C & ~(int64_t)63;   /* whole 64-channel chunks */
    const __mmask64 kt = C > cf ? ((__mmask64)1 << (C - cf)) - 1 : 0;
    for (int64_t j = 0; j < Wq; j++) {
        uint8_t *d = Q + j * Cp * 4;
        if (j < j0 || j >= j1) {   /* a padding column */
            for (int64_t b = 0; b < Cp * 4; b += 64) _mm512_store_si512(d + b, pad);
            continue;
        }
        const int64_t off = (j - pd_w) * sw;
        __m512i r[4];
        for (int64_t c0 = 0; c0 < cf; c0 += 64) {
            for (int q = 0; q < 4; q++)
                r[q] = rows[q] ? _mm512_xor_si512(_mm512_loadu_si512(rows[q] + off + c0), flip) : pad;
            dwv_quads(r, ilo, ihi, d + c0 * 4, 4);
        }
        if (kt) {   /* the last C % 64 channels, in (Cp - cf) / 16 blocks */
            for (int q = 0; q < 4; q++)
                r[q] = rows[q] ? _mm512_xor_si512(_mm512_maskz_loadu_epi8(kt, rows[q] + off + cf), flip) : pad;
            dwv_quads(r, ilo, ihi, d + cf * 4, (Cp - cf) / 16);
        }
    }
}

/* a tile's n (1..4) pixels of one channel block, row oy (ua) and, where `two`, oy + 1 (ub) */
DWV_TARGET INL void dwv_put4(const dwq_rq *R, const __m512i *ua, const __m512i *ub, int n, int two, char *o0,
                             char *o1, int64_t step) {
    dwq_put4(R, ua, n, o0, step);
    if (two) dwq_put4(R, ub, n, o1, step);
}

/* output rows oy, oy + 1 (if any) of image n, item = n ceil(Ho / 2) + oy / 2.  Stride 1: one quad Q of
 * input rows iy0 .. iy0 + 3 (iy0 = oy - pd_h) serves both rows, weights (w0, w1, w2, 0) and (0, w0, w1,
 * w2).  Stride 2: row oy reads input rows iy0 .. iy0 + 2 (iy0 = 2 oy - pd_h) and row oy + 1 rows
 * iy0 + 2 .. iy0 + 4, so Q (rows iy0 .. iy0 + 3) serves row oy as (w0, w1, w2, 0) and row oy + 1 as
 * (0, 0, w0, w1), and Qn (rows iy0 + 4 .. iy0 + 7: the next item's Q) adds row oy + 1's last taps as
 * (w2, 0, 0, 0).  One quad built per two output rows where it was one per row: the build (~57 % of a
 * stride-2 layer's time) halves for 3 VPDPBUSD more per pixel pair.  have_q: Q already holds this
 * item's quad (the previous item's Qn: dwv_run's loop). */
DWV_TARGET INL void dwv_rows(const dwv_args *v, int64_t item, uint8_t *Q, uint8_t *Qn, int have_q, const int S) {
    const dwq_args *a = v->a;
    const int64_t hp = (a->Ho + 1) / 2, n = item / hp, oy = (item % hp) * 2;
    const int64_t Wo = a->Wo, Cp = v->Cp;
    const int two = oy + 1 < a->Ho, oe = a->out16 ? 2 : 1;
    const int64_t iy0 = oy * S - a->pd_h;
    if (!have_q) dwv_build(v, n, iy0, Q);
    if (S == 2 && two) dwv_build(v, n, iy0 + 4, Qn);
    for (int64_t c0 = 0; c0 < a->C; c0 += 16) {
        const dwq_rq *R = v->rq + c0 / 16;
        const int32_t *wb = v->wq + c0 * 9;
        const __m512i wa0 = _mm512_load_si512(wb), wa1 = _mm512_load_si512(wb + 16), wa2 = _mm512_load_si512(wb + 32);
        const __m512i wb0 = _mm512_load_si512(wb + 48), wb1 = _mm512_load_si512(wb + 64), wb2 = _mm512_load_si512(wb + 80);
        const __m512i wd0 = _mm512_load_si512(wb + 96), wd1 = _mm512_load_si512(wb + 112);
        const __m512i wd2 = _mm512_load_si512(wb + 128);
        const __m512i init = _mm512_load_si512(v->init + c0);
        char *o0 = a->out + (((n * a->Ho + oy) * Wo) * a->so + c0) * oe;
        char *o1 = o0 + Wo * a->so * oe;
        for (int64_t ox0 = 0; ox0 < Wo; ox0 += DWV_P) {
            const int64_t np = Wo - ox0 < DWV_P ? Wo - ox0 : DWV_P;
            __m512i ua[DWV_P], ub[DWV_P];
            for (int p = 0; p < DWV_P; p++) ua[p] = ub[p] = init;
            const uint8_t *qc = Q + (ox0 * S * Cp + c0) * 4, *qn = Qn + (ox0 * S * Cp + c0) * 4;
            /* Q column S ox0 + j feeds output p through kx = j - S p (the last tile reads slack columns) */
#pragma GCC unroll 17
            for (int j = 0; j < S * (DWV_P - 1) + 3; j++) {
                const __m512i q = _mm512_load_si512(qc + j * Cp * 4);
                const __m512i q2 = S == 2 && two ? _mm512_load_si512(qn + j * Cp * 4) : q;
#pragma GCC unroll 8
                for (int p = 0; p < DWV_P; p++) {
                    const int k = j - S * p;
                    if (k < 0 || k > 2) continue;
                    ua[p] = _mm512_dpbusd_epi32(ua[p], q, k == 0 ? wa0 : (k == 1 ? wa1 : wa2));
                    if (S == 1) ub[p] = _mm512_dpbusd_epi32(ub[p], q, k == 0 ? wb0 : (k == 1 ? wb1 : wb2));
                    if (S == 2 && two) {   /* (0, 0, w0, w1) of Q, (w2, 0, 0, 0) of Qn */
                        ub[p] = _mm512_dpbusd_epi32(ub[p], q, k == 0 ? wb0 : (k == 1 ? wb1 : wb2));
                        ub[p] = _mm512_dpbusd_epi32(ub[p], q2, k == 0 ? wd0 : (k == 1 ? wd1 : wd2));
                    }
                }
            }
            if (R->f8) {   /* four pixels a register; a full tile's count a constant (no store branches) */
                char *p0 = o0 + ox0 * a->so * oe, *p1 = o1 + ox0 * a->so * oe;
                if (np == DWV_P) dwv_put4(R, ua, ub, DWV_P, two, p0, p1, a->so * oe);
                else dwv_put4(R, ua, ub, (int)np, two, p0, p1, a->so * oe);
                continue;
            }
            for (int64_t p = 0; p < np; p++) {
                dwq_put(R, _mm512_cvtepi32_ps(ua[p]), ua[p], o0 + (ox0 + p) * a->so * oe);
                if (two) dwq_put(R, _mm512_cvtepi32_ps(ub[p]), ub[p], o1 + (ox0 + p) * a->so * oe);
            }
        }
    }
}

DWV_TARGET static __attribute__((noinline)) void dwv_rows_s1(const dwv_args *v, int64_t it, uint8_t *Q) {
    dwv_rows(v, it, Q, Q, 0, 1);
}
DWV_TARGET static __attribute__((noinline)) void dwv_rows_s2(const dwv_args *v, int64_t it, uint8_t *Q, uint8_t *Qn,
                                                             int have_q) {
    dwv_rows(v, it, Q, Qn, have_q, 2);
}

/* the 3x3 layers of stride S (1 or 2) through dwv_rows; TSR_EINVAL (the caller then runs the fp32
 * kernel) where the CPU lacks VNNI / VBMI or the quad buffers cannot be had */
static int dwv_run(const dwq_args *a, int64_t Nb, const int S, int nthreads) {
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512vbmi")) return TSR_EINVAL;
    const int64_t C = a->C, Cp = (C + 15) & ~(int64_t)15, qbuilt = S * (a->Wo - 1) + 3, qcols = qbuilt + S * DWV_P;
    int32_t *wq = (int32_t *)aligned_alloc(64, (size_t)(Cp * 10 * 4));
    dwq_rq *rq = (dwq_rq *)aligned_alloc(64, (size_t)(Cp / 16) * sizeof(dwq_rq));
    if (!wq || !rq) {
        free(wq);
        free(rq);
        return TSR_EINVAL;
    }
    int32_t *init = wq + Cp * 9;
    for (int64_t c0 = 0; c0 < Cp; c0 += 16) rq[c0 / 16] = dwq_rq_init(a, c0, rq_tail16(C - c0));
    /* per 16-channel block: the taps' codes (exact in wf) as bytes of (w0, w1, w2, 0) dwords, then
     * (0, w0, w1, w2) = those shifted up a byte, (0, 0, w0, w1) up two, (w2, 0, 0, 0) down two; init -
     * 128 sum w */
    for (int64_t c0 = 0; c0 < Cp; c0 += 16) {
        const __mmask16 kb = rq_tail16(C - c0);
        const __m512i byte = _mm512_set1_epi32(0xFF);
        __m512i sum = _mm512_setzero_si512();
        for (int kx = 0; kx < 3; kx++) {
            __m512i d = _mm512_setzero_si512();
            for (int ky = 0; ky < 3; ky++) {
                const __m512i w = _mm512_cvtps_epi32(_mm512_maskz_loadu_ps(kb, a->wf + (ky * 3 + kx) * C + c0));
                sum = _mm512_add_epi32(sum, w);
                d = _mm512_or_si512(d, _mm512_slli_epi32(_mm512_and_si512(w, byte), 8 * ky));
            }
            _mm512_store_si512(wq + c0 * 9 + kx * 16, d);
            _mm512_store_si512(wq + c0 * 9 + (3 + kx) * 16, _mm512_slli_epi32(d, S == 1 ? 8 : 16));
            _mm512_store_si512(wq + c0 * 9 + (6 + kx) * 16, _mm512_srli_epi32(d, 16));
        }
        const __m512i i0 = _mm512_cvtps_epi32(_mm512_maskz_loadu_ps(kb, a->init + c0));
        _mm512_store_si512(init + c0, _mm512_sub_epi32(i0, _mm512_slli_epi32(sum, 7)));
    }
    int8_t p8[2][64];   /* dwv_args.ilo / ihi */
    for (int i = 0; i < 64; i++) {
        /* byte i: row i & 1 of word w = i / 2, which unpack{lo,hi}_epi16 put in 128-bit lane L = w / 8,
         * dword w % 8 (lo: 0..3) or w % 8 - 4 (hi): channel 4 L + w % 8, or 16 + 4 L + w % 8 - 4 */
        const int w = i / 2, L = w / 8, j = w % 8, ch = j < 4 ? 4 * L + j : 16 + 4 * L + j - 4;
        p8[0][i] = (int8_t)((i & 1 ? 64 : 0) + ch);
        p8[1][i] = (int8_t)((i & 1 ? 64 : 0) + 32 + ch);
    }
    const dwv_args v = {a, wq, init, rq, Cp, qbuilt, qcols, _mm512_loadu_si512(p8[0]), _mm512_loadu_si512(p8[1])};
    const int64_t hp = (a->Ho + 1) / 2, items = Nb * hp;
    const size_t qbytes = (size_t)(qcols * Cp * 4), built = (size_t)(qbuilt * Cp * 4);
    const int nt = tsr_threads(nthreads);
    /* every thread's Q (and Qn) up front: without the memory the fp32 kernel runs instead (TSR_EINVAL) */
    uint8_t *Qs = (uint8_t *)aligned_alloc(64, qbytes * 2 * (size_t)nt);
    if (!Qs) {
        free(wq);
        free(rq);
        return TSR_EINVAL;
    }
    for (int64_t b = 0; b < 2 * nt; b++) memset(Qs + b * qbytes + built, 0, qbytes - built);   /* slack: read, unused */
#pragma omp parallel num_threads(nt)
    {
        uint8_t *Q = Qs + (size_t)omp_get_thread_num() * 2 * qbytes, *Qn = Q + qbytes;
        int64_t prev = -2;   /* stride 2: the item whose Qn (this item's Q) was built last */
#pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++) {
            if (S == 1) {
                dwv_rows_s1(&v, it, Q);
                continue;
            }
            dwv_rows_s2(&v, it, Q, Qn, it == prev + 1 && it % hp != 0);
            uint8_t *t = Q;
            Q = Qn;
            Qn = t;
            prev = it;
        }
    }
    free(Qs);
    free(wq);
    free(rq);
    return TSR_OK;
}
#endif

#endif /* DW_INT8_K3_H */
