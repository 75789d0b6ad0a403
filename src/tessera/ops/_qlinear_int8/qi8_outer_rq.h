/* qi8_outer_rq.h -- the broadcast GEMM's requantized blocks with the requantization fused into
 * the kernel, AVX512-VNNI.  Included by qi8_outer_avx512.h (whose register and step macros it
 * uses) and called by qlinear_int8.c's q_rq_rows; framework-free.
 *
 * Why: the requantized GEMM's epilogue fused (qn2_rq_block: 12 rows x 17-32 columns;
 * qo_rq_block: 6 rows x 33-64 columns): one K block, requantized from the accumulators through the
 * f8 form (tessera_requant.h rq_f8_*) -- the int32 tile's stores and the requantization's reloads
 * skipped (MobileNetV2's stem, N = 32, K = 27, on AMD EPYC: 1.17x the layer at batch 1, 1.24x at
 * batch 8; benchmarks/results/2026-12-07j-cpu-amd/stem_ab.txt).  Bit-identical
 * to QO_ROWS + rq_tile: the same sums (acc - corr), the same arithmetic on them, the same integer
 * fallback for the distrusted blocks.
 */
#ifndef QI8_OUTER_RQ_H
#define QI8_OUTER_RQ_H

typedef struct {
    rq_f8_ch c;      /* cols <= 32: blocks 0, 1 and again as 2, 3 (two rows a register); else four */
    rq_f8_k K;
    __m512i lo32, hi32;
    __mmask64 kst;   /* a row's cols bytes */
    int flat;        /* qn2: two rows adjacent in out (so == cols == 32): one 64-byte store */
} qrq_t;

/* the per-channel parts of columns 0 .. cols (16 < cols <= 64; mult / shift already at the panel's
 * first column); 0 where a block's channels do not allow the f8 form */
VNNI_TARGET static int qrq_init(qrq_t *R, const int32_t *mult, const int32_t *shift, int cs, int64_t cols,
                                int64_t zp, int64_t qmin, int64_t qmax, int64_t so) {
    if (!rq_f8_ch_init(&R->c, mult, shift, cs, cols, zp, qmin, qmax, cols > 32 ? 4 : 2)) return 0;
    R->K = rq_f8_init(zp, qmin, qmax);
    R->lo32 = _mm512_set1_epi32((int32_t)(qmin - zp));
    R->hi32 = _mm512_set1_epi32((int32_t)(qmax - zp));
    R->kst = cols >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << cols) - 1);
    R->flat = so == 32 && cols == 32;
    return 1;
}

/* four blocks of exact int32 sums as 64 int8 (lane b = block b) */
VNNI_TARGET INL __m512i qrq_four(const qrq_t *R, __m512i a0, __m512i a1, __m512i a2, __m512i a3) {
    const __m512i a[4] = {a0, a1, a2, a3};
    return rq_f8_four(a, 4, &R->c, R->c.k, &R->K, R->lo32, R->hi32);
}

/* qn2: rows i, i + 1 (blocks a0 a1, a2 a3) into o, o + so (rq_f8_rows' RPR = 2 form) */
VNNI_TARGET INL void qn2_rq_pair(const qrq_t *R, __m512i a0, __m512i a1, __m512i a2, __m512i a3, char *o,
                                 int64_t so) {
    const __m512i v = qrq_four(R, a0, a1, a2, a3);
    if (R->flat) {
        _mm512_storeu_si512((void *)o, v);
        return;
    }
    _mm256_mask_storeu_epi8(o, (__mmask32)R->kst, _mm512_castsi512_si256(v));
    _mm256_mask_storeu_epi8(o + so, (__mmask32)R->kst, _mm512_extracti64x4_epi64(v, 1));
}

/* qo_rq: one row's four blocks into o (rq_f8_rows' RPR = 1 form) */
VNNI_TARGET INL void qo_rq_row(const qrq_t *R, __m512i a0, __m512i a1, __m512i a2, __m512i a3, char *o) {
    const __m512i v = qrq_four(R, a0, a1, a2, a3);
    if (R->kst == ~(__mmask64)0) _mm512_storeu_si512((void *)o, v);
    else _mm512_mask_storeu_epi8(o, R->kst, v);
}

/* 6 rows of A (row stride lda) x panel P's 64 columns (k4n groups: one K block), corr subtracted,
 * requantized into out rows o, o + so, ... (QO_BLOCK_FN's kernel, qo_rq_row's epilogue) */
#define QO_RQ(i) qo_rq_row(R, _mm512_sub_epi32(c##i##0, k0), _mm512_sub_epi32(c##i##1, k1), \
                           _mm512_sub_epi32(c##i##2, k2), _mm512_sub_epi32(c##i##3, k3), o + (i) * so);
VNNI_TARGET static __attribute__((noinline)) void qo_rq_block(const uint8_t *A, int64_t lda, const int8_t *P,
                                                              int64_t k4n, const int32_t *corr, const qrq_t *R,
                                                              char *o, int64_t so) {
    const int mr = 6;
    QO_ACC(0, "zmm8", "zmm9", "zmm10", "zmm11"); QO_ACC(1, "zmm12", "zmm13", "zmm14", "zmm15");
    QO_ACC(2, "zmm16", "zmm17", "zmm18", "zmm19"); QO_ACC(3, "zmm20", "zmm21", "zmm22", "zmm23");
    QO_ACC(4, "zmm24", "zmm25", "zmm26", "zmm27"); QO_ACC(5, "zmm28", "zmm29", "zmm30", "zmm31");
    for (int64_t k4 = 0; k4 < k4n; k4++) {
        const int8_t *p = P + k4 * 256;
        const __m512i b0 = _mm512_load_si512((const void *)p), b1 = _mm512_load_si512((const void *)(p + 64));
        const __m512i b2 = _mm512_load_si512((const void *)(p + 128));
        const __m512i b3 = _mm512_load_si512((const void *)(p + 192));
        QO_STEP(0) QO_STEP(1) QO_STEP(2) QO_STEP(3) QO_STEP(4) QO_STEP(5)
    }
    const __m512i k0 = _mm512_loadu_si512((const void *)corr), k1 = _mm512_loadu_si512((const void *)(corr + 16));
    const __m512i k2 = _mm512_loadu_si512((const void *)(corr + 32));
    const __m512i k3 = _mm512_loadu_si512((const void *)(corr + 48));
    QO_RQ(0) QO_RQ(1) QO_RQ(2) QO_RQ(3) QO_RQ(4) QO_RQ(5)
}
#undef QO_RQ

#define QN_RQ(i, x0, x1, y0, y1)                                                                      \
    qn2_rq_pair(R, _mm512_sub_epi32(r##x0, k0), _mm512_sub_epi32(r##x1, k1), _mm512_sub_epi32(r##y0, k0), \
                _mm512_sub_epi32(r##y1, k1), o + (i) * so, so);
/* 12 rows of A from a (row stride lda) x panel P's first 32 columns (k4n groups: one K block, as
 * qo_kblock), corr subtracted (the K block that ends K), requantized into out rows o, o + so, ... */
VNNI_TARGET static __attribute__((noinline)) void qn2_rq_block(const uint8_t *A, int64_t lda, const int8_t *P,
                                                               int64_t k4n, const int32_t *corr, const qrq_t *R,
                                                               char *o, int64_t so) {
    enum { FULL = 1 };
    const int mr = 12;
    (void)mr;
    QO_REG(r0, "zmm8"); QO_REG(r1, "zmm9"); QO_REG(r2, "zmm10"); QO_REG(r3, "zmm11");
    QO_REG(r4, "zmm12"); QO_REG(r5, "zmm13"); QO_REG(r6, "zmm14"); QO_REG(r7, "zmm15");
    QO_REG(r8, "zmm16"); QO_REG(r9, "zmm17"); QO_REG(r10, "zmm18"); QO_REG(r11, "zmm19");
    QO_REG(r12, "zmm20"); QO_REG(r13, "zmm21"); QO_REG(r14, "zmm22"); QO_REG(r15, "zmm23");
    QO_REG(r16, "zmm24"); QO_REG(r17, "zmm25"); QO_REG(r18, "zmm26"); QO_REG(r19, "zmm27");
    QO_REG(r20, "zmm28"); QO_REG(r21, "zmm29"); QO_REG(r22, "zmm30"); QO_REG(r23, "zmm31");
    for (int64_t k4 = 0; k4 < k4n; k4++) {
        const __m512i b0 = _mm512_load_si512((const void *)(P + k4 * 256));
        const __m512i b1 = _mm512_load_si512((const void *)(P + k4 * 256 + 64));
        QN_STEP2(0, 0, 1) QN_STEP2(1, 2, 3) QN_STEP2(2, 4, 5) QN_STEP2(3, 6, 7) QN_STEP2(4, 8, 9)
        QN_STEP2(5, 10, 11) QN_STEP2(6, 12, 13) QN_STEP2(7, 14, 15) QN_STEP2(8, 16, 17)
        QN_STEP2(9, 18, 19) QN_STEP2(10, 20, 21) QN_STEP2(11, 22, 23)
    }
    const __m512i k0 = _mm512_loadu_si512((const void *)corr), k1 = _mm512_loadu_si512((const void *)(corr + 16));
    QN_RQ(0, 0, 1, 2, 3) QN_RQ(2, 4, 5, 6, 7) QN_RQ(4, 8, 9, 10, 11) QN_RQ(6, 12, 13, 14, 15)
    QN_RQ(8, 16, 17, 18, 19) QN_RQ(10, 20, 21, 22, 23)
}
#undef QN_RQ

#endif /* QI8_OUTER_RQ_H */
