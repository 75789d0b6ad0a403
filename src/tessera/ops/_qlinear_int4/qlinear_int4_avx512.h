/* AVX-512 tiles of qlinear_int4.c (included by it; see its header comment for the scheme).
 *
 * A tile is up to 4 weight rows [n0, n1) times the x rows [m0, m1) of one x block; rows past
 * N repeat the last row (results discarded).  W4A16 needs AVX-512 F/BW (the avx512 build);
 * W4A8 additionally AVX512-VNNI, checked at run time (the function carries target("avx512vnni"),
 * the rest of the library does not need it).
 */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__GNUC__)

/* software prefetch distance (bytes ahead in each weight row, W4A16): streaming 4 rows at once is
 * more than the hardware prefetcher keeps in flight for one core.  Measured (M = 1, 4096 x 11008
 * g128 from DRAM, interleaved): 8 KiB ahead is 1.4x (fp32 x) / 1.55x (bf16 x) faster on 2 threads
 * than 1 KiB, 16 KiB no better; L3-resident 4096^2 weights gain ~8%. */
#define QPF 8192

static inline int qlin_fast_ok(int mode) {
    if (mode == 0) return 1;
    return __builtin_cpu_supports("avx512vnni") != 0;
}

/* Decode sizes: MB (1, 2 or 4) x rows against the tile's 4 rows, decoding straight into registers
 * (no buffer round trip: at M = 1 the decode is the work; up to 4 x rows share each decode). */
TSR_BLK_INLINE void w4a16_rows(const uint8_t *const *wr, const int64_t *rowi, const float *ws,
                               const uint8_t *wz, const float *xp, float *yt, int64_t m0, int64_t n0, int nr,
                               int64_t N, int64_t K, int64_t G, const int MB) {
    const int64_t KG = K / G;
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 yv[4][4], tbl[4];
    for (int i = 0; i < MB; i++)
        for (int r = 0; r < 4; r++) yv[i][r] = _mm512_setzero_ps();
    for (int r = 0; r < 4; r++) tbl[r] = _mm512_sub_ps(iota, _mm512_set1_ps(8.0f));
    for (int64_t g = 0; g < KG; g++) {
        if (wz)
            for (int r = 0; r < 4; r++) tbl[r] = _mm512_sub_ps(iota, _mm512_set1_ps((float)wz[rowi[r] * KG + g]));
        __m512 acc[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < MB; i++)
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) acc[i][r] = _mm512_setzero_ps();
        for (int64_t b = g * G / 2; b < (g + 1) * G / 2; b += 16) {
            __m512 lo[4], hi[4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                if ((b & 63) == 0) _mm_prefetch((const char *)(wr[r] + b + QPF), _MM_HINT_T0);
                const __m512i wi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(wr[r] + b)));
                lo[r] = _mm512_permutexvar_ps(wi, tbl[r]);
                hi[r] = _mm512_permutexvar_ps(_mm512_srli_epi32(wi, 4), tbl[r]);
            }
#pragma GCC unroll 4
            for (int i = 0; i < MB; i++) {
                const float *xr = xp + (m0 + i) * K + 2 * b;
                const __m512 xe = _mm512_loadu_ps(xr), xo = _mm512_loadu_ps(xr + 16);
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
                    acc[i][r] = _mm512_fmadd_ps(hi[r], xo, _mm512_fmadd_ps(lo[r], xe, acc[i][r]));
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512 sv = _mm512_set1_ps(ws[rowi[r] * KG + g]);
#pragma GCC unroll 4
            for (int i = 0; i < MB; i++) yv[i][r] = _mm512_fmadd_ps(acc[i][r], sv, yv[i][r]);
        }
    }
    for (int i = 0; i < MB; i++)
        for (int r = 0; r < nr; r++) yt[i * 4 + r] = _mm512_reduce_add_ps(yv[i][r]);
}

/* One tile (x rows [m0, m1), at most MBB, below the GEMM sizes): 4 x rows per register decode.
 * (An L1 buffer of the decoded group shared by all 16 rows of a block measured 1.6-2.9x slower
 * at M = 4-16: its reloads cost more than decoding again per 4 rows.) */
static void w4a16_tile_fast(const uint8_t *w, const float *ws, const uint8_t *wz, const float *xp, float *yt,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t N, int64_t K, int64_t G) {
    const int64_t KB = K / 2;
    const int nr = (int)(n1 - n0), nm = (int)(m1 - m0);
    const uint8_t *wr[4];
    int64_t rowi[4];
    for (int r = 0; r < 4; r++) { rowi[r] = n0 + (r < nr ? r : nr - 1); wr[r] = w + rowi[r] * KB; }
    int i = 0;
    for (; i + 4 <= nm; i += 4) w4a16_rows(wr, rowi, ws, wz, xp, yt + 4 * i, m0 + i, n0, nr, N, K, G, 4);
    if (i + 2 <= nm) { w4a16_rows(wr, rowi, ws, wz, xp, yt + 4 * i, m0 + i, n0, nr, N, K, G, 2); i += 2; }
    if (i < nm) w4a16_rows(wr, rowi, ws, wz, xp, yt + 4 * i, m0 + i, n0, nr, N, K, G, 1);
}

/* ---- W4A16 prefill (M >= 64): a register-blocked fp32 GEMM on a dequantised weight slab.
 * An item is GM = 128 x rows by GN = 32 weight rows.  K is walked in slabs of GKS (k positions in xp's
 * permuted order); each slab of the 32 rows is dequantised once, (q - z) * s in fp32 (the
 * interface's W = (q - z) * s), transposed to wt[k][32], and used by all GM rows of x: 8 x rows x
 * 2 vectors of 16 outputs = 16 accumulators, one embedded-broadcast FMA per x value. */
#define GM 128
#define GN 32
#define GKS 256

static void w4a16_gemm_item(const uint8_t *w, const float *ws, const uint8_t *wz, const float *xp, float *yacc,
                            float *wt, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t K, int64_t G) {
    const int64_t KG = K / G, KB = K / 2;
    for (int i = 0; i < (GM + 8) * GN; i++) yacc[i] = 0.0f;   /* + 8 rows: clamped tail duplicates */
    for (int64_t k0 = 0; k0 < K; k0 += GKS) {
        const int64_t ks = K - k0 < GKS ? K - k0 : GKS;      /* a multiple of 32 */
        for (int r = 0; r < GN; r++) {
            const int64_t n = n0 + r < n1 ? n0 + r : n1 - 1;
            const uint8_t *wr = w + n * KB + k0 / 2;
            for (int64_t t = 0; t < ks; t += 32) {
                const int64_t g = (k0 + t) / G;
                const float z = wz ? (float)wz[n * KG + g] : 8.0f, sc = ws[n * KG + g];
                for (int j = 0; j < 16; j++) {
                    const uint8_t b = wr[t / 2 + j];
                    wt[(t + j) * GN + r] = ((float)(b & 15) - z) * sc;
                    wt[(t + 16 + j) * GN + r] = ((float)(b >> 4) - z) * sc;
                }
            }
        }
        for (int64_t mb = m0; mb < m1; mb += 8) {
            const float *xr[8];
            for (int i = 0; i < 8; i++) xr[i] = xp + (mb + i < m1 ? mb + i : m1 - 1) * K + k0;
            __m512 a[8][2];     /* this slab's partial sums (added to yacc after: two-level fp32 sum) */
            for (int i = 0; i < 8; i++) a[i][0] = a[i][1] = _mm512_setzero_ps();
            for (int64_t k = 0; k < ks; k++) {
                const __m512 b0 = _mm512_load_ps(wt + k * GN), b1 = _mm512_load_ps(wt + k * GN + 16);
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) {
                    const __m512 xv = _mm512_set1_ps(xr[i][k]);
                    a[i][0] = _mm512_fmadd_ps(xv, b0, a[i][0]);
                    a[i][1] = _mm512_fmadd_ps(xv, b1, a[i][1]);
                }
            }
            for (int i = 0; i < 8; i++) {   /* rows past m1 are clamped duplicates: yacc has room */
                float *yr = yacc + (mb - m0 + i) * GN;
                _mm512_storeu_ps(yr, _mm512_add_ps(_mm512_loadu_ps(yr), a[i][0]));
                _mm512_storeu_ps(yr + 16, _mm512_add_ps(_mm512_loadu_ps(yr + 16), a[i][1]));
            }
        }
    }
}

/* ---- W4A16 with bf16 x below the GEMM sizes (M < 64): vdpbf16ps.  (q - z) is exact in bf16 and so is each
 * product; the instruction adds the two products of a pair to the fp32 lane in turn (RNE; it
 * flushes denormal inputs and results to zero: |error| < 2^-126 per term).  Per 32 weight bytes
 * (64 k): vpmovzxbw, a shift, two vpermw through a 32-entry bf16 table {(i & 15) - z}, two
 * vdpbf16ps -- half the work of the fp32 decode per byte.  x is kept as bf16 bits, permuted per
 * 64-k block to [32 even][32 odd].  A block spans two groups when G = 32: the fp32 lanes 0-7
 * hold the first group's pairs and 8-15 the second's, so the scale vector is split likewise. */
static inline int qlin_bf16_ok(void) { return __builtin_cpu_supports("avx512bf16") != 0; }

__attribute__((target("avx512bf16")))
static inline __m512i bf16_table(int zA, int zB) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 a = _mm512_cvtepi32_ps(_mm512_sub_epi32(iota, _mm512_set1_epi32(zA)));
    const __m512 b = _mm512_cvtepi32_ps(_mm512_sub_epi32(iota, _mm512_set1_epi32(zB)));
    return (__m512i)_mm512_cvtne2ps_pbh(b, a);     /* words 0-15: i - zA, 16-31: i - zB (exact) */
}

/* MB x rows (compile-time; rows past m1 repeat the last one, results discarded) against the
 * tile's 4 weight rows: each 64-k block of the 4 rows is decoded once into registers and used by
 * the MB x rows, so at M = 4-63 the decode is shared instead of repeated per x row. */
__attribute__((target("avx512bf16"), always_inline))
static inline void w4a16_bf16_rows(const uint8_t *const *wr, const int64_t *rowi, const float *ws, const uint8_t *wz,
                                   const uint16_t *xb, float *yt, int64_t m0, int64_t m1, int64_t K, int64_t G,
                                   const int MB) {
    const int64_t KG = K / G, KB = K / 2, K64 = (K + 63) / 64 * 64, NBLK = K64 / 64;
    const __m512i tsym = bf16_table(8, 8), m4 = _mm512_set1_epi16(0x0F);
    const __m512i off = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(16), 1);
    const uint16_t *xr[4];
    for (int i = 0; i < MB; i++) xr[i] = xb + (m0 + i < m1 ? m0 + i : m1 - 1) * K64;
    __m512 yv[4][4], acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < MB; i++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) yv[i][r] = acc[i][r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < NBLK; b++) {
        const int full = KB - 32 * b >= 32;
        const __mmask32 km = full ? 0xFFFFFFFFu : 0xFFFFu;
        const int64_t gA = 64 * b / G, gB = full ? (64 * b + 32) / G : gA;
        __m512i lo[4], hi[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if ((b & 1) == 0) _mm_prefetch((const char *)(wr[r] + 32 * b + QPF), _MM_HINT_T0);
            const __m512i wv = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(km, wr[r] + 32 * b));
            if (!wz) {
                lo[r] = _mm512_permutexvar_epi16(wv, tsym);                 /* index: low 5 bits */
                hi[r] = _mm512_permutexvar_epi16(_mm512_srli_epi16(wv, 4), tsym);
            } else {
                const __m512i t = bf16_table(wz[rowi[r] * KG + gA], wz[rowi[r] * KG + gB]);
                lo[r] = _mm512_permutexvar_epi16(_mm512_or_si512(_mm512_and_si512(wv, m4), off), t);
                hi[r] = _mm512_permutexvar_epi16(_mm512_or_si512(_mm512_srli_epi16(wv, 4), off), t);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < MB; i++) {
            const __m512bh xe = (__m512bh)_mm512_loadu_si512(xr[i] + 64 * b);
            const __m512bh xo = (__m512bh)_mm512_loadu_si512(xr[i] + 64 * b + 32);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
                acc[i][r] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[i][r], (__m512bh)lo[r], xe), (__m512bh)hi[r], xo);
        }
        if (G == 32 || !full || (64 * b + 64) % G == 0) {   /* the block ends its group(s) */
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const float sA = ws[rowi[r] * KG + gA], sB = ws[rowi[r] * KG + gB];
                const __m512 sv = _mm512_insertf32x8(_mm512_set1_ps(sA), _mm256_set1_ps(sB), 1);
#pragma GCC unroll 4
                for (int i = 0; i < MB; i++) {
                    yv[i][r] = _mm512_fmadd_ps(acc[i][r], sv, yv[i][r]);
                    acc[i][r] = _mm512_setzero_ps();
                }
            }
        }
    }
    for (int i = 0; i < MB && m0 + i < m1; i++)
        for (int r = 0; r < 4; r++) yt[i * 4 + r] = _mm512_reduce_add_ps(yv[i][r]);
}

/* one tile (x rows [m0, m1) of a block, at most MBB): x rows 4 at a time, the rest 2 and 1 */
__attribute__((target("avx512bf16")))
static void w4a16_tile_bf16(const uint8_t *w, const float *ws, const uint8_t *wz, const uint16_t *xb, float *yt,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t K, int64_t G) {
    const int64_t KB = K / 2;
    const int nr = (int)(n1 - n0);
    const uint8_t *wr[4];
    int64_t rowi[4];
    for (int r = 0; r < 4; r++) { rowi[r] = n0 + (r < nr ? r : nr - 1); wr[r] = w + rowi[r] * KB; }
    int64_t m = m0;
    for (; m + 4 <= m1; m += 4) w4a16_bf16_rows(wr, rowi, ws, wz, xb, yt + (m - m0) * 4, m, m1, K, G, 4);
    if (m + 2 <= m1) { w4a16_bf16_rows(wr, rowi, ws, wz, xb, yt + (m - m0) * 4, m, m1, K, G, 2); m += 2; }
    if (m < m1) w4a16_bf16_rows(wr, rowi, ws, wz, xb, yt + (m - m0) * 4, m, m1, K, G, 1);
}

/* ---- W4A8 (AVX512-VNNI).  A 64-byte run of a weight row (128 k of one chunk) is split into its
 * low and high nibbles (and, shift, and: codes 0..15 as the UNSIGNED operand of vpdpbusd) and meets
 * the chunk's permuted int8 x ([64 even][64 odd]): lane l of the two vpdpbusd sums the 8 products
 * of k in [8l, 8l + 8) of the chunk.  The lane starts from -z * X_l (X_l: the per-lane sum of qx,
 * precomputed per x row and chunk by the prep), so after the two vpdpbusd it holds the EXACT
 * integer sum_{k in lane} qx_k * (q_k - z) (|.| <= 8 * 127 * 15).  A lane lies in one group (a
 * 32-k sub-group is 4 lanes), so it is converted (vcvtdq2ps, exact: < 2^24) and multiplied by its
 * group's scale into a per-(x row, weight row) fp32 accumulator vector: vcvtdq2ps + one FMA per
 * 128 k -- no horizontal work per group.  One horizontal sum per output at the end of K, then
 * "* sx".  Epilogue: y = sx * sum over lanes and groups of fp32(acc_lane,g) * s_g. */

/* One 128-k chunk c (nb weight bytes present: 64, or fewer in a tail chunk) of the tile's 4 rows:
 * unpacked nibbles lo/hi, group scales sv (per lane), zero points zv (per lane, ZP only).  G, ZP,
 * TAIL are compile-time constants. */
__attribute__((target("avx512vnni"))) TSR_BLK_INLINE void w4a8_unpack(
        const uint8_t *const *wr, const float *const *sr, const uint8_t *const *zr, int64_t c, int64_t nb,
        __m512i *lo, __m512i *hi, __m512 *sv, __m512i *zv, const int G, const int ZP, const int TAIL) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i gidx = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           G == 32 ? 2 : 3);      /* lane -> group of the chunk */
    const int gpc = 128 / G;
    const __mmask16 gm = TAIL ? (__mmask16)((1u << (nb * 2 / G)) - 1) : (__mmask16)((1u << gpc) - 1);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        const __m512i wv = TAIL ? _mm512_maskz_loadu_epi8((((__mmask64)1) << nb) - 1, wr[r] + 64 * c)
                                : _mm512_loadu_si512(wr[r] + 64 * c);
        lo[r] = _mm512_and_si512(wv, m4);
        hi[r] = _mm512_and_si512(_mm512_srli_epi16(wv, 4), m4);
        if (G == 128) {
            sv[r] = _mm512_set1_ps(sr[r][c]);
            if (ZP) zv[r] = _mm512_set1_epi32(zr[r][c]);
        } else {   /* lanes past a tail chunk's end hold 0 products: scale 0 */
            sv[r] = _mm512_permutexvar_ps(gidx, _mm512_castps128_ps512(_mm_maskz_loadu_ps(gm, sr[r] + c * gpc)));
            if (ZP)
                zv[r] = _mm512_permutexvar_epi32(gidx, _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(gm, zr[r] + c * gpc)));
        }
    }
}

/* x row i of the sub-block against the 4 unpacked rows: 4 lane sums, exact, then converted and
 * scaled into y<i>0..y<i>3 (named variables: GCC keeps them in registers). */
#define W4A8_XROW(i)                                                                                          \
    do {                                                                                                      \
        const int8_t *xr_ = qx + (i) * Kc + 128 * c;                                                          \
        const __m512i xe_ = _mm512_loadu_si512(xr_), xo_ = _mm512_loadu_si512(xr_ + 64);                     \
        const __m512i nx_ = _mm512_loadu_si512(xs + ((i) * C + c) * 16);   /* -X_l */                        \
        const __m512i a8_ = _mm512_slli_epi32(nx_, 3);                     /* -8 X_l */                      \
        __m512i a_;                                                                                           \
        a_ = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ZP ? _mm512_mullo_epi32(zv[0], nx_) : a8_, lo[0], xe_), hi[0], xo_); \
        y##i##0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a_), sv[0], y##i##0);                                   \
        a_ = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ZP ? _mm512_mullo_epi32(zv[1], nx_) : a8_, lo[1], xe_), hi[1], xo_); \
        y##i##1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a_), sv[1], y##i##1);                                   \
        a_ = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ZP ? _mm512_mullo_epi32(zv[2], nx_) : a8_, lo[2], xe_), hi[2], xo_); \
        y##i##2 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a_), sv[2], y##i##2);                                   \
        a_ = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ZP ? _mm512_mullo_epi32(zv[3], nx_) : a8_, lo[3], xe_), hi[3], xo_); \
        y##i##3 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a_), sv[3], y##i##3);                                   \
    } while (0)

#define W4A8_CHUNK(TAIL, NB)                                                                                  \
    do {                                                                                                      \
        __m512i lo[4], hi[4], zv[4];                                                                          \
        __m512 sv[4];                                                                                         \
        w4a8_unpack(wr, sr, zr, c, NB, lo, hi, sv, zv, G, ZP, TAIL);                                          \
        W4A8_XROW(0);                                                                                         \
        if (MB > 1) W4A8_XROW(1);                                                                             \
        if (MB > 2) { W4A8_XROW(2); W4A8_XROW(3); }                                                           \
    } while (0)

/* MB (1, 2 or 4) x rows (qx, xs already offset to the first) times the tile's 4 rows over all of K:
 * yv[i * 4 + r] = the fp32 lane vectors.  The first sub-block of a tile prefetches the tile after
 * next into L2 (pf, pfn bytes: tile rows are contiguous; 256 bytes of it per chunk).  Measured on
 * Zen4 (M = 1, K = 4096, one thread, interleaved A/B): 2 tiles ahead into L2 (T1) beat 1 tile ahead
 * into L1 by ~1.4x at N = 11008 (the weight streams from DRAM) and matched it at N = 4096. */
__attribute__((target("avx512vnni"))) TSR_BLK_INLINE void w4a8_rows(
        const uint8_t *const *wr, const float *const *sr, const uint8_t *const *zr, const int8_t *qx,
        const int32_t *xs, __m512 *yv, int64_t K, const uint8_t *pf, int64_t pfn, const int MB, const int G,
        const int ZP) {
    const int64_t KB = K / 2, Kc = (K + 127) / 128 * 128, C = Kc / 128, CF = KB / 64;
    const __m512 z = _mm512_setzero_ps();
    __m512 y00 = z, y01 = z, y02 = z, y03 = z, y10 = z, y11 = z, y12 = z, y13 = z;
    __m512 y20 = z, y21 = z, y22 = z, y23 = z, y30 = z, y31 = z, y32 = z, y33 = z;
    int64_t c = 0;
    for (; c < CF; c++) {
        if (pf && 256 * c < pfn)
            for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(pf + 256 * c + 64 * l), _MM_HINT_T1);
        W4A8_CHUNK(0, 64);
    }
    if (CF < C) W4A8_CHUNK(1, KB - 64 * CF);
    yv[0] = y00; yv[1] = y01; yv[2] = y02; yv[3] = y03;
    if (MB > 1) { yv[4] = y10; yv[5] = y11; yv[6] = y12; yv[7] = y13; }
    if (MB > 2) {
        yv[8] = y20; yv[9] = y21; yv[10] = y22; yv[11] = y23;
        yv[12] = y30; yv[13] = y31; yv[14] = y32; yv[15] = y33;
    }
}

#define W4A8_ROWS(MB, G, ZP)                                                                                  \
    __attribute__((target("avx512vnni"))) static void w4a8_rows_##MB##_##G##_##ZP(                          \
            const uint8_t *const *wr, const float *const *sr, const uint8_t *const *zr, const int8_t *qx,     \
            const int32_t *xs, __m512 *yv, int64_t K, const uint8_t *pf, int64_t pfn) {                      \
        w4a8_rows(wr, sr, zr, qx, xs, yv, K, pf, pfn, MB, G, ZP);                                             \
    }
#define W4A8_ROWS_G(MB, ZP) W4A8_ROWS(MB, 32, ZP) W4A8_ROWS(MB, 64, ZP) W4A8_ROWS(MB, 128, ZP)
W4A8_ROWS_G(1, 0) W4A8_ROWS_G(2, 0) W4A8_ROWS_G(4, 0) W4A8_ROWS_G(1, 1) W4A8_ROWS_G(2, 1) W4A8_ROWS_G(4, 1)

typedef void (*w4a8_rows_fn)(const uint8_t *const *, const float *const *, const uint8_t *const *, const int8_t *,
                             const int32_t *, __m512 *, int64_t, const uint8_t *, int64_t);
/* [zp][mb: 1, 2, 4 -> 0, 1, 2][G: 32, 64, 128 -> 0, 1, 2] */
static const w4a8_rows_fn W4A8_FNS[2][3][3] = {
    {{w4a8_rows_1_32_0, w4a8_rows_1_64_0, w4a8_rows_1_128_0},
     {w4a8_rows_2_32_0, w4a8_rows_2_64_0, w4a8_rows_2_128_0},
     {w4a8_rows_4_32_0, w4a8_rows_4_64_0, w4a8_rows_4_128_0}},
    {{w4a8_rows_1_32_1, w4a8_rows_1_64_1, w4a8_rows_1_128_1},
     {w4a8_rows_2_32_1, w4a8_rows_2_64_1, w4a8_rows_2_128_1},
     {w4a8_rows_4_32_1, w4a8_rows_4_64_1, w4a8_rows_4_128_1}}};

/* One tile: the block's x rows in sub-blocks of 4, 2, 1 (the tile's weight, 8 KB at K = 4096,
 * stays in L1 between sub-blocks).  Prefetch target: the tile 2 ahead (8 rows past n1 - 4). */
__attribute__((target("avx512vnni")))
static void w4a8_tile_fast(const uint8_t *w, const float *ws, const uint8_t *wz, const int8_t *qx,
                           const int32_t *xs, const float *sxs, float *yt, int64_t m0, int64_t m1,
                           int64_t n0, int64_t n1, int64_t N, int64_t K, int64_t G) {
    const int64_t KB = K / 2, KG = K / G, Kc = (K + 127) / 128 * 128, C = Kc / 128;
    const int nr = (int)(n1 - n0), nm = (int)(m1 - m0);
    const uint8_t *wr[4], *zr[4];
    const float *sr[4];
    for (int r = 0; r < 4; r++) {
        const int64_t n = n0 + (r < nr ? r : nr - 1);
        wr[r] = w + n * KB; sr[r] = ws + n * KG; zr[r] = wz ? wz + n * KG : NULL;
    }
    const int64_t nahead = N - n1 - 4 < 4 ? N - n1 - 4 : 4;     /* rows of the tile 2 ahead (<= 0: none) */
    const int gi = G == 32 ? 0 : (G == 64 ? 1 : 2);
    __m512 yv[16];
    int i = 0;
    while (i < nm) {
        const int mb = nm - i >= 4 ? 4 : (nm - i >= 2 ? 2 : 1);
        W4A8_FNS[wz != NULL][mb == 4 ? 2 : mb - 1][gi](wr, sr, zr, qx + (m0 + i) * Kc, xs + (m0 + i) * C * 16, yv, K,
                                                        i == 0 && nahead > 0 ? w + (n1 + 4) * KB : NULL, nahead * KB);
        for (int j = 0; j < mb; j++)
            for (int r = 0; r < nr; r++) yt[(i + j) * 4 + r] = sxs[m0 + i + j] * _mm512_reduce_add_ps(yv[j * 4 + r]);
        i += mb;
    }
}

/* W4A8 x preparation, vectorised (the same integers as prep_i8's scalar loop: x / scale as a true
 * fp32 division, NaN -> 0, saturate to +-127, round half to even). */
__attribute__((target("avx512vnni")))
static void prep_i8_fast(const char *x, int64_t sx, int dtype, int8_t *qx, int32_t *xs, float *sxs, float *tmp,
                         int64_t m, int64_t K) {
    const int64_t Kc = (K + 127) / 128 * 128, C = Kc / 128;
    tsr_load_f32(tmp, x + m * sx * tsr_elsize(dtype), K, dtype);
    for (int64_t k = K; k < Kc; k++) tmp[k] = 0.0f;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 am = _mm512_setzero_ps();
    for (int64_t k = 0; k < Kc; k += 16)   /* max_ps returns the 2nd operand when the 1st is NaN */
        am = _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(tmp + k)), am);
    const float scale = tsr_scale_for(_mm512_reduce_max_ps(am), 127.0f);
    sxs[m] = scale;
    const __m512 sv = _mm512_set1_ps(scale), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    const __m512i ones = _mm512_set1_epi8(1);
    int8_t *d = qx + m * Kc;
    int32_t *s = xs + m * C * 16;
    for (int64_t c = 0; c < C; c++) {
        for (int h = 0; h < 4; h++) {          /* 32 k -> 16 even + 16 odd bytes */
            __m512i q[2];
            for (int u = 0; u < 2; u++) {
                __m512 v = _mm512_div_ps(_mm512_loadu_ps(tmp + 128 * c + 32 * h + 16 * u), sv);
                v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);       /* NaN -> 0 */
                v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
                q[u] = _mm512_cvtps_epi32(v);                                             /* RNE */
            }
            _mm_storeu_si128((__m128i *)(d + 128 * c + 16 * h), _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[0], ev, q[1])));
            _mm_storeu_si128((__m128i *)(d + 128 * c + 64 + 16 * h), _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[0], od, q[1])));
        }
        const __m512i xe = _mm512_loadu_si512(d + 128 * c), xo = _mm512_loadu_si512(d + 128 * c + 64);
        const __m512i X = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, xe), ones, xo);
        _mm512_storeu_si512(s + 16 * c, _mm512_sub_epi32(_mm512_setzero_si512(), X));
    }
}

#else

static inline int qlin_fast_ok(int mode) { (void)mode; return 0; }
static inline int qlin_bf16_ok(void) { return 0; }
static void prep_i8_fast(const char *x, int64_t sx, int dtype, int8_t *qx, int32_t *xs, float *sxs, float *tmp,
                         int64_t m, int64_t K) {
    prep_i8(x, sx, dtype, qx, xs, sxs, tmp, m, K);
}
#define GM 128
#define GN 32
#define GKS 256
static void w4a16_gemm_item(const uint8_t *w, const float *ws, const uint8_t *wz, const float *xp, float *yacc,
                            float *wt, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t K, int64_t G) {
    (void)w; (void)ws; (void)wz; (void)xp; (void)yacc; (void)wt; (void)m0; (void)m1; (void)n0; (void)n1;
    (void)K; (void)G;
}
static void w4a16_tile_bf16(const uint8_t *w, const float *ws, const uint8_t *wz, const uint16_t *xb, float *yt,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t K, int64_t G) {
    (void)w; (void)ws; (void)wz; (void)xb; (void)yt; (void)m0; (void)m1; (void)n0; (void)n1; (void)K; (void)G;
}
static void w4a16_tile_fast(const uint8_t *w, const float *ws, const uint8_t *wz, const float *xp, float *yt,
                            int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t N, int64_t K, int64_t G) {
    w4a16_tile_c(w, ws, wz, xp, yt, m0, m1, n0, n1, N, K, G);
}
static void w4a8_tile_fast(const uint8_t *w, const float *ws, const uint8_t *wz, const int8_t *qx,
                           const int32_t *xs, const float *sxs, float *yt, int64_t m0, int64_t m1,
                           int64_t n0, int64_t n1, int64_t N, int64_t K, int64_t G) {
    (void)xs;
    w4a8_tile_c(w, ws, wz, qx, sxs, yt, m0, m1, n0, n1, N, K, G);
}

#endif
