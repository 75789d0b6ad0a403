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

typedef struct {
    __m512i idx[2];     /* rows 0, 1 / rows 2, 3: byte k of row r <- tap row ky = k / run's byte r step + k % run */
    __mmask64 keep;     /* bytes k < K of both 32-byte rows */
    __mmask32 span;     /* 3 step + run bytes of a tap row */
    int ok;             /* ic_fours may run (ic_four_init) */
} ic_four_t;

typedef struct ic_s {
    const int8_t *x;               /* channels-last int8: element (n, c, h, w) at n sn + h sh + w sw + c */
    int64_t C, H, W, sn, sh, sw;
    int64_t kh, kw, st_h, st_w, pd_h, pd_w, dl_h, dl_w, Ho, Wo;
    uint8_t pad;                   /* x_zp ^ 0x80 */
    ic_four_t four;                /* ic_fours' tables, for rows of 32 bytes (ic_four_init) */
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

/* Four interior pixels' rows at once, for rows of at most 32 bytes (Kp == 32: the VNNI kernel's
 * stride for K <= 32) from at most 4 tap rows whose four runs lie within 32 bytes (3 step + run
 * <= 32: MobileNetV2's stem, 9-byte runs 6 bytes apart).  Tap row ky's 32 bytes from the first
 * pixel's run are loaded once (masked to the span: nothing read past it), two tap rows a zmm, and
 * one two-source byte permute (VPERMT2B) makes two whole rows, zeroing the bytes past K; the flip
 * then gives the codes and 128 there.  ~10 instructions for four rows where ic_rows' merge loads
 * took ~6 a row, with unaligned stores of 27 bytes (AMD EPYC, batch 8: the build was ~0.45 of
 * the stem's 1.55 ms; 1.2x the layer with ic_fours).  ic_four_init forms the permutations once a
 * call (tsr_qi8_conv_rq): formed per row chunk, their 128 divisions were 9 % of the stem. */
static void ic_four_init(ic_t *I) {
    ic_four_t *F = &I->four;
    const int64_t run = I->kw * I->C, K = I->kh * run, step = I->st_w * I->C;
    F->ok = I->sw == I->C && I->dl_w == 1 && I->kh <= 4 && K <= 32 && 3 * step + run <= 32 &&
            __builtin_cpu_supports("avx512vbmi");
    if (!F->ok) return;
    int8_t ix[2][64];
    F->keep = 0;
    for (int h = 0; h < 2; h++)
        for (int b = 0; b < 64; b++) {
            const int64_t r = 2 * h + b / 32, k = b % 32, ky = k / run;
            /* zmm a = tap rows (0, 1), zmm b = (2, 3): 32 bytes each; index bit 6 picks b */
            ix[h][b] = k < K ? (int8_t)((ky >= 2 ? 64 : 0) + (ky & 1) * 32 + r * step + k % run) : 0;
            if (k < K) F->keep |= (__mmask64)1 << b;
        }
    F->idx[0] = _mm512_loadu_si512(ix[0]);
    F->idx[1] = _mm512_loadu_si512(ix[1]);
    F->span = (__mmask32)(((uint64_t)1 << (3 * step + run)) - 1);
}

/* rows of n4 groups of four interior pixels into d (n4 x 4 x 32 bytes); base[ky]: tap row ky's
 * byte of the first pixel's first tap, NULL for a row of padding (raw: x_zp in every byte); step:
 * bytes from one pixel's taps to the next's.  Not inlined: VBMI is its own target (ic_four_init
 * checks the CPU) */
__attribute__((target("avx512vbmi,avx512f,avx512bw,avx512vl"), noinline)) static void
ic_fours(const ic_four_t *F, const int8_t *const *base, int64_t kh, int64_t step, int64_t n4, __m256i raw, uint8_t *d) {
    const __m512i flip = _mm512_set1_epi8((char)0x80), i0 = F->idx[0], i1 = F->idx[1];
    for (int64_t g = 0; g < n4; g++, d += 128) {
        __m256i t[4] = {raw, raw, raw, raw};
        for (int64_t ky = 0; ky < kh; ky++)
            if (base[ky]) t[ky] = _mm256_maskz_loadu_epi8(F->span, base[ky] + 4 * g * step);
        const __m512i a = _mm512_inserti64x4(_mm512_castsi256_si512(t[0]), t[1], 1);
        const __m512i b = _mm512_inserti64x4(_mm512_castsi256_si512(t[2]), t[3], 1);
        _mm512_storeu_si512(d, _mm512_xor_si512(_mm512_maskz_permutex2var_epi8(F->keep, a, i0, b), flip));
        _mm512_storeu_si512(d + 64, _mm512_xor_si512(_mm512_maskz_permutex2var_epi8(F->keep, a, i1, b), flip));
    }
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
        const int four = Kp == 32 && I->four.ok;
        const __m256i raw = _mm256_set1_epi8((char)(I->pad ^ 0x80u));
        for (int64_t i = 0; i < rows;) {
            const int64_t seg = rows - i < I->Wo - ox ? rows - i : I->Wo - ox;   /* pixels left in this image row */
            const int8_t *xn = I->x + n * I->sn;
            const int8_t *src[16], *base[4];
            int nl = 0;
            __mmask64 km[16];
            for (int64_t ky = 0; ky < I->kh; ky++) {
                const int64_t iy = oy * I->st_h - I->pd_h + ky * I->dl_h;
                const int in = iy >= 0 && iy < I->H;
                if (ky < 4) base[ky] = in ? xn + iy * I->sh - I->pd_w * C : NULL;
                if (!in) continue;
                src[nl] = xn + iy * I->sh - I->pd_w * C - ky * run;
                km[nl++] = krun << (ky * run);
            }
            for (int64_t p = ox; p < ox + seg; p++, i++) {
                uint8_t *row = d + i * Kp;
                const int64_t n4 = four && p >= oxL ? ((oxR < ox + seg ? oxR : ox + seg) - p) / 4 : 0;
                if (n4 > 0) {   /* groups of four interior pixels */
                    const int8_t *b4[4];
                    for (int64_t ky = 0; ky < I->kh; ky++) b4[ky] = base[ky] ? base[ky] + p * step : NULL;
                    ic_fours(&I->four, b4, I->kh, step, n4, raw, row);
                    p += 4 * n4 - 1, i += 4 * n4 - 1;
                    continue;
                }
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
