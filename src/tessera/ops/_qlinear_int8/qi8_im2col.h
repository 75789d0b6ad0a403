/* qi8_im2col.h -- a conv's im2col rows made inside the int8 broadcast GEMM, a row chunk at a time
 * (included by qlinear_int8.c, AVX-512 builds; tsr_qi8_conv_rq is its entry point).
 *
 * Why: conv2d_int8 gathered the im2col matrix [N Ho Wo, kh kw C] into memory (requant.c
 * tsr_im2col), and the GEMM then read it back a chunk at a time to make its u8 codes (u8_chunk).
 * For ResNet-18's 3x3 layers that matrix is 9x the input: 14.4 MB for a 64 x 56 x 56 layer at
 * batch 8, written once and read once from DRAM / L3.  In a whole int8 ResNet-18 at batch 8 the
 * gather and its read-back took ~45 % of the time (the same layers timed alone, their matrices
 * still in cache, took ~15 %).  Here each thread makes only the rows of the chunk it is about
 * to multiply, straight into its cache-resident u8 buffer: x is read from where it lies (itself
 * L2 / L3-resident, 1/9 of the matrix's bytes), and no matrix is written.
 *
 * Rows of at most 64 bytes (MobileNetV2's 27-byte stem rows, three 9-byte tap runs) are built
 * whole in a register, interior pixels from per-image-row bases and constant masks, as
 * tsr_im2col builds them (copied a run at a time they measured 0.6-0.7x the gathered path; in a
 * register 1.05-1.18x).  Longer rows are copied one tap row (dense pixels) or one tap at a time.
 *
 * Rows and columns are tsr_im2col's order 1 (channels-last x, one group): row m = (n, oy, ox),
 * column (ky kw + kx) C + c; a padding tap holds x_zp, as there.  The codes are the GEMM's u8
 * (q ^ 0x80); bytes K .. Kp of a row (the AMX tiles' padding) hold 128 (q = 0) and meet the
 * panels' zero weights.  Exact: the bytes are the ones u8_chunk made from tsr_im2col's matrix. */
#ifndef QI8_IM2COL_H
#define QI8_IM2COL_H

typedef struct ic_s {
    const int8_t *x;               /* channels-last int8: element (n, c, h, w) at n sn + h sh + w sw + c */
    int64_t C, H, W, sn, sh, sw;
    int64_t kh, kw, st_h, st_w, pd_h, pd_w, dl_h, dl_w, Ho, Wo;
    uint8_t pad;                   /* x_zp ^ 0x80 */
} ic_t;

/* n bytes of x's codes as u8 (q ^ 0x80) from s to d: 64-byte steps, the tail masked */
VNNI_TARGET INL void ic_copy_u8(uint8_t *d, const int8_t *s, int64_t n) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    int64_t b = 0;
    for (; b + 64 <= n; b += 64) _mm512_storeu_si512((void *)(d + b), _mm512_xor_si512(_mm512_loadu_si512(s + b), flip));
    if (b < n) {
        const __mmask64 k = ((__mmask64)1 << (n - b)) - 1;
        _mm512_mask_storeu_epi8(d + b, k, _mm512_xor_si512(_mm512_maskz_loadu_epi8(k, s + b), flip));
    }
}

/* n bytes of v at d */
VNNI_TARGET INL void ic_fill(uint8_t *d, uint8_t v, int64_t n) {
    const __m512i p = _mm512_set1_epi8((char)v);
    int64_t b = 0;
    for (; b + 64 <= n; b += 64) _mm512_storeu_si512((void *)(d + b), p);
    if (b < n) _mm512_mask_storeu_epi8(d + b, ((__mmask64)1 << (n - b)) - 1, p);
}

/* one whole row of at most 64 bytes (K <= 64: MobileNetV2's 27-byte stem rows) in one register
 * (tsr_v_row_taps, as tsr_im2col builds it), then the u8 flip, 128 past K, one masked store of the
 * row's Kp bytes */
VNNI_TARGET INL void ic_row64(const ic_t *I, const int8_t *xn, int64_t oy, int64_t ix0, uint8_t *row, __mmask64 kk,
                              __mmask64 kst) {
    int64_t k0, k1;
    tsr_taps_inside(ix0, I->W, I->kw, &k0, &k1);
    __m512i v = tsr_v_row_taps(_mm512_set1_epi8((char)(I->pad ^ 0x80u)),   /* x_zp: flipped with the rest below */
                               (const char *)xn, I->sh, I->C, I->H, I->kh, I->dl_h, oy * I->st_h - I->pd_h, I->kw, ix0,
                               k0, k1);
    v = _mm512_mask_mov_epi8(_mm512_set1_epi8((char)0x80), kk, _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)));
    _mm512_mask_storeu_epi8(row, kst, v);
}

/* rows m0 .. m0 + rows of the im2col matrix as u8 codes into d (row stride Kp >= K = kh kw C) */
VNNI_TARGET static void ic_rows(const ic_t *I, int64_t m0, int64_t rows, uint8_t *d, int64_t Kp) {
    const int64_t C = I->C, kw = I->kw, K = I->kh * kw * C, run = kw * C;
    const int dense = I->sw == C && I->dl_w == 1;   /* a tap row's in-image taps: one run of x */
    int64_t ox = m0 % I->Wo, oy = (m0 / I->Wo) % I->Ho, n = m0 / (I->Wo * I->Ho);
    if (dense && Kp <= 64 && I->kh <= 16) {   /* whole rows in a register */
        const __mmask64 kk = K == 64 ? ~(__mmask64)0 : (((__mmask64)1 << K) - 1);
        const __mmask64 kst = Kp == 64 ? ~(__mmask64)0 : (((__mmask64)1 << Kp) - 1);
        const __mmask64 krun = run == 64 ? ~(__mmask64)0 : (((__mmask64)1 << run) - 1);
        const __m512i flip = _mm512_set1_epi8((char)0x80), padv = _mm512_set1_epi8((char)(I->pad ^ 0x80u));
        /* interior pixels (every tap column inside the image): tap row ky's run at byte ky run,
         * loaded from a base fixed per image row (tsr_im2col's interior rows, made here) */
        int64_t oxL, oxR;
        tsr_interior_cols(I->W, kw, I->st_w, I->pd_w, I->Wo, &oxL, &oxR);
        const int64_t step = I->st_w * C;
        for (int64_t i = 0; i < rows;) {
            const int64_t seg = rows - i < I->Wo - ox ? rows - i : I->Wo - ox;   /* pixels left in this image row */
            const int8_t *xn = I->x + n * I->sn;
            const int8_t *src[16];
            int nl = 0;
            __mmask64 km[16];
            for (int64_t ky = 0; ky < I->kh; ky++) {
                const int64_t iy = oy * I->st_h - I->pd_h + ky * I->dl_h;
                if (iy < 0 || iy >= I->H) continue;
                src[nl] = xn + iy * I->sh - I->pd_w * C - ky * run;
                km[nl++] = krun << (ky * run);
            }
            for (int64_t p = ox; p < ox + seg; p++, i++) {
                uint8_t *row = d + i * Kp;
                if (p < oxL || p >= oxR) {
                    ic_row64(I, xn, oy, p * I->st_w - I->pd_w, row, kk, kst);
                    continue;
                }
                __m512i v = padv;
                for (int t = 0; t < nl; t++) v = _mm512_mask_loadu_epi8(v, km[t], src[t] + p * step);
                _mm512_mask_storeu_epi8(row, kst, _mm512_mask_mov_epi8(flip, kk, _mm512_xor_si512(v, flip)));
            }
            ox += seg;
            if (ox == I->Wo) {
                ox = 0;
                if (++oy == I->Ho) oy = 0, n++;
            }
        }
        return;
    }
    for (int64_t i = 0; i < rows; i++) {
        uint8_t *row = d + i * Kp;
        const int64_t ix0 = ox * I->st_w - I->pd_w;
        const int8_t *xn = I->x + n * I->sn;
        for (int64_t ky = 0; ky < I->kh; ky++) {
            const int64_t iy = oy * I->st_h - I->pd_h + ky * I->dl_h;
            uint8_t *dst = row + ky * run;
            if (iy < 0 || iy >= I->H) {   /* a row of padding */
                ic_fill(dst, I->pad, run);
                continue;
            }
            const int8_t *xr = xn + iy * I->sh;
            if (dense) {   /* taps k0 .. k1 inside the image: one copy; padding either side */
                int64_t k0, k1;
                tsr_taps_inside(ix0, I->W, kw, &k0, &k1);
                if (k0) ic_fill(dst, I->pad, k0 * C);
                if (k1 > k0) ic_copy_u8(dst + k0 * C, xr + (ix0 + k0) * C, (k1 - k0) * C);
                if (k1 < kw) ic_fill(dst + k1 * C, I->pad, (kw - k1) * C);
                continue;
            }
            for (int64_t kx = 0; kx < kw; kx++) {   /* strided pixels or dilated taps: a copy a tap */
                const int64_t ix = ix0 + kx * I->dl_w;
                if (ix < 0 || ix >= I->W) ic_fill(dst + kx * C, I->pad, C);
                else ic_copy_u8(dst + kx * C, xr + ix * I->sw, C);
            }
        }
        if (Kp > K) ic_fill(row + K, 0x80, Kp - K);
        if (++ox == I->Wo) {
            ox = 0;
            if (++oy == I->Ho) oy = 0, n++;
        }
    }
}

#endif /* QI8_IM2COL_H */
