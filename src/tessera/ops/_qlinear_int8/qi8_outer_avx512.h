/* qi8_outer_avx512.h -- the int8 GEMM's broadcast (outer-product) micro-kernel, AVX512-VNNI.
 * Included by qlinear_int8.c inside its QI8_VNNI section; framework-free.
 *
 * Why a second GEMM kernel: the dot-product blocks of qlinear_int8.c keep a 4 x 4 block of
 * zmm accumulators whose 16 lanes each hold a partial sum along K, reduced horizontally at the
 * end (~10 instructions an output).  With the K of a convolution's im2col rows (576 for a 3x3
 * over 64 channels, 64 for a 1x1) that reduction costs as much as the VPDPBUSDs themselves
 * (measured 51 % of the VNNI peak at K = 576, 14 % at K = 64).  Here each zmm lane is one
 * output column instead, so nothing is reduced:
 *
 *   P[k4][j][0..3] = w[n0 + j][4 k4 .. 4 k4 + 3]          (a 64-column panel, j < 64; zero past
 *                                                           N and past K)
 *   acc[i][c]     += VPDPBUSD(broadcast4(a_u8[m0 + i][4 k4 ..]), P[k4][16 c .. 16 c + 15])
 *
 * for MR = 6 rows x 4 zmm (64 columns): 24 accumulators, 4 panel loads and 6 broadcasts per
 * 24 VPDPBUSDs.  The activations are qlinear_int8.c's u8 buffer (q + 128, row stride Kp, padded
 * with 128 = q 0 to Kp, a multiple of 64), so sum (q + 128) w = acc + 128 cs[n] with cs the
 * panel's row sums, subtracted once at the end (wrapping int32, exact for K <= 131071 as in
 * the dot-product path: the result is bit-identical to it and to the portable C).
 *
 * Packing costs one read of w and Kp * 64 bytes written per panel (a masked 32-bit gather per
 * 4 x 16 bytes); the driver uses this kernel only when M is large enough to amortise it
 * (qo_wanted).  Work items are (QO_MC-row chunk of M, panel) pairs, chunk-major, so a thread
 * reuses one chunk of activations from L2 across panels and two threads split a single-panel
 * GEMM (a conv with 64 output channels) by rows.
 */
#ifndef QI8_OUTER_AVX512_H
#define QI8_OUTER_AVX512_H

enum { QO_MR = 6, QO_MC = 96, QO_KC4 = 128 };   /* QO_MC: rows per work item (a multiple of QO_MR) */

/* Use this kernel for an M x K activation?  Measured (one thread, EPYC Zen 4, GOP/s new / old):
 * K = 64: faster at every M > 16 (37 / 26 at M = 17, 160 / 37 at M = 128); K = 576: even at
 * M = 32 (144 / 147), ahead from M = 48 (183 / 161); K = 2048-4608 (N = 512-2048): behind below
 * M = 96 (the panel packing, one gather pass over the weight, is not amortised: 264 / 319 at
 * M = 48), level at M = 128 (347 / 346), ahead beyond (380-390 at M = 784-3136 against
 * 270-310). */
static inline int qo_wanted(int64_t M, int64_t K) {
    return M > 16 && (K <= 128 || (K <= 1024 && M >= 40) || M >= 128);
}

/* panel p of w [N, K] into P (k4n * 256 bytes, k4n = ceil(K / 4), 64-aligned) and 128 x its 64 row
 * sums into cs (0 past N) */
VNNI_TARGET static void qo_pack_panel(const int8_t *w, int64_t N, int64_t K, int64_t k4n, int64_t n0, int8_t *P,
                                      int32_t *cs) {
    const int64_t kfull = K / 4;                   /* 4-byte groups entirely inside a row */
    for (int c = 0; c < 4; c++) {
        const int64_t nb = n0 + 16 * c;
        const int64_t valid = N - nb <= 0 ? 0 : (N - nb >= 16 ? 16 : N - nb);
        const __mmask16 m = (__mmask16)((1u << valid) - 1u);
        const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)K));
        const int8_t *base = w + (valid ? nb * K : 0);
        int32_t *dst = (int32_t *)P + 16 * c;
        for (int64_t k4 = 0; k4 < kfull; k4++)   /* row offsets < 16 K <= 2^21: int32 indices */
            _mm512_store_si512((void *)(dst + k4 * 64),
                               _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, base + 4 * k4, 1));
        for (int64_t k4 = kfull; k4 < k4n; k4++)
            for (int j = 0; j < 16; j++) {
                int8_t b[4] = {0, 0, 0, 0};
                for (int t = 0; t < 4; t++)
                    if (j < valid && 4 * k4 + t < K) b[t] = base[j * K + 4 * k4 + t];
                memcpy(dst + k4 * 64 + j, b, 4);
            }
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            if (j < valid) {
                const int8_t *r = base + j * K;
#pragma omp simd reduction(+ : s)
                for (int64_t k = 0; k < K; k++) s += r[k];
            }
            cs[16 * c + j] = (int32_t)((uint32_t)s << 7);   /* 128 cs, wrapping as the sums do */
        }
    }
}

/* rows [0, mr) of A x the panel's 64 columns: exact int32 results into out (row stride ldo,
 * `cols` valid columns, masked stores).  The 24 accumulators are register variables pinned to
 * zmm8..zmm31 and VPDPBUSD is inline asm with the accumulator as an in-out operand: with
 * intrinsics, an array or plain named variables, gcc 12 kept copying the accumulators through
 * the stack on every step (a quarter to a half of the peak).  acc += dot4(u8 a, s8 b) per 32-bit lane, as _mm512_dpbusd_epi32(acc, a, b). */
#define QO_DP(acc, a, b) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b))
#define QO_REG(v, r) register __m512i v __asm__(r) = _mm512_setzero_si512()
#define QO_ACC(i, r0, r1, r2, r3) QO_REG(c##i##0, r0); QO_REG(c##i##1, r1); QO_REG(c##i##2, r2); QO_REG(c##i##3, r3)
#define QO_STEP(i)                                                                                    \
    if (mr > i) {                                                                                     \
        int32_t q_;                                                                                   \
        memcpy(&q_, A + i * lda + 4 * k4, 4);                                                         \
        const __m512i a_ = _mm512_set1_epi32(q_);                                                     \
        QO_DP(c##i##0, a_, b0); QO_DP(c##i##1, a_, b1); QO_DP(c##i##2, a_, b2); QO_DP(c##i##3, a_, b3); \
    }
#define QO_STORE(i)                                                                                   \
    if (mr > i) {                                                                                     \
        int32_t *o_ = out + i * ldo;                                                                  \
        _mm512_mask_storeu_epi32(o_, m0, _mm512_sub_epi32(c##i##0, k0));                              \
        _mm512_mask_storeu_epi32(o_ + 16, m1, _mm512_sub_epi32(c##i##1, k1));                         \
        _mm512_mask_storeu_epi32(o_ + 32, m2, _mm512_sub_epi32(c##i##2, k2));                         \
        _mm512_mask_storeu_epi32(o_ + 48, m3, _mm512_sub_epi32(c##i##3, k3));                         \
    }

VNNI_TARGET INL __mmask16 qo_mask(int64_t v) {
    return (__mmask16)(v <= 0 ? 0 : (v >= 16 ? 0xFFFF : (1u << v) - 1u));
}

/* out = this K block's sums - corr (128 cs for the block that ends K: sum (q + 128) w - 128 cs =
 * sum q w; zeros for the others).  QO_BLOCK_FN defines it for one dot instruction: qo_block with
 * VPDPBUSD (u8 x s8 quads), qo16_block with VPDPWSSD (int16 x int16 pairs: the A16W8 GEMM). */
#define QO_BLOCK_FN(name)                                                                             \
VNNI_TARGET static __attribute__((noinline)) void name(const uint8_t *A, int64_t lda, const int mr,   \
                                                       const int8_t *P, int64_t k4n, const int32_t *corr, \
                                                       int32_t *out, int64_t ldo, int64_t cols) {     \
    QO_ACC(0, "zmm8", "zmm9", "zmm10", "zmm11"); QO_ACC(1, "zmm12", "zmm13", "zmm14", "zmm15");       \
    QO_ACC(2, "zmm16", "zmm17", "zmm18", "zmm19"); QO_ACC(3, "zmm20", "zmm21", "zmm22", "zmm23");     \
    QO_ACC(4, "zmm24", "zmm25", "zmm26", "zmm27"); QO_ACC(5, "zmm28", "zmm29", "zmm30", "zmm31");     \
    for (int64_t k4 = 0; k4 < k4n; k4++) {                                                            \
        const int8_t *p = P + k4 * 256;                                                              \
        const __m512i b0 = _mm512_load_si512((const void *)p), b1 = _mm512_load_si512((const void *)(p + 64)); \
        const __m512i b2 = _mm512_load_si512((const void *)(p + 128));                                \
        const __m512i b3 = _mm512_load_si512((const void *)(p + 192));                                \
        QO_STEP(0) QO_STEP(1) QO_STEP(2) QO_STEP(3) QO_STEP(4) QO_STEP(5)                             \
    }                                                                                                 \
    const __m512i k0 = _mm512_loadu_si512((const void *)corr), k1 = _mm512_loadu_si512((const void *)(corr + 16)); \
    const __m512i k2 = _mm512_loadu_si512((const void *)(corr + 32));                                 \
    const __m512i k3 = _mm512_loadu_si512((const void *)(corr + 48));                                 \
    const __mmask16 m0 = qo_mask(cols), m1 = qo_mask(cols - 16), m2 = qo_mask(cols - 32), m3 = qo_mask(cols - 48); \
    QO_STORE(0) QO_STORE(1) QO_STORE(2) QO_STORE(3) QO_STORE(4) QO_STORE(5)                           \
}
QO_BLOCK_FN(qo_block)
#undef QO_DP
#define QO_DP(acc, a, b) __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b))
QO_BLOCK_FN(qo16_block)
#undef QO_BLOCK_FN
#undef QO_DP
#define QO_DP(acc, a, b) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b))

/* Narrow panels (a conv with 16 - 32 output channels, MobileNetV2's projections): the 64-column
 * kernel above spends 3/4 (1/2) of its VPDPBUSDs on the zero columns of the panel.  These read
 * only the panel's first one (two) 16-column blocks and keep 24 (12) rows in the 24 accumulators
 * instead: every VPDPBUSD is useful, one broadcast each (two). */
#define QN_BCAST(i) ({ int32_t q_; memcpy(&q_, A + (i) * lda + 4 * k4, 4); _mm512_set1_epi32(q_); })
/* both narrow kernels: the 24 accumulators r0..r23 pinned to zmm8..zmm31 (as QO_ACC above) */
#define QN_HEAD(name, FULL_)                                                                          \
VNNI_TARGET static __attribute__((noinline)) void name(const uint8_t *A, int64_t lda, const int mr,   \
                                                       const int8_t *P, int64_t k4n, const int32_t *corr, \
                                                       int32_t *out, int64_t ldo, int64_t cols) {     \
    enum { FULL = FULL_ };   /* 1: mr is the full row count, no row tests */                         \
    QO_REG(r0, "zmm8"); QO_REG(r1, "zmm9"); QO_REG(r2, "zmm10"); QO_REG(r3, "zmm11");                 \
    QO_REG(r4, "zmm12"); QO_REG(r5, "zmm13"); QO_REG(r6, "zmm14"); QO_REG(r7, "zmm15");               \
    QO_REG(r8, "zmm16"); QO_REG(r9, "zmm17"); QO_REG(r10, "zmm18"); QO_REG(r11, "zmm19");             \
    QO_REG(r12, "zmm20"); QO_REG(r13, "zmm21"); QO_REG(r14, "zmm22"); QO_REG(r15, "zmm23");           \
    QO_REG(r16, "zmm24"); QO_REG(r17, "zmm25"); QO_REG(r18, "zmm26"); QO_REG(r19, "zmm27");           \
    QO_REG(r20, "zmm28"); QO_REG(r21, "zmm29"); QO_REG(r22, "zmm30"); QO_REG(r23, "zmm31");
/* one column block: row i in r_i */
#define QN_STEP1(i) if (FULL || mr > i) { const __m512i a_ = QN_BCAST(i); QO_DP(r##i, a_, b0); }
#define QN_STORE1(i) if (FULL || mr > i) _mm512_mask_storeu_epi32(out + (i) * ldo, m0, _mm512_sub_epi32(r##i, k0));
/* two column blocks: row i in r_x (columns 0..15) and r_y (16..31), x = 2i, y = 2i + 1 */
#define QN_STEP2(i, x, y) if (FULL || mr > i) { const __m512i a_ = QN_BCAST(i); QO_DP(r##x, a_, b0); QO_DP(r##y, a_, b1); }
#define QN_STORE2(i, x, y)                                                                            \
    if (FULL || mr > i) {                                                                             \
        _mm512_mask_storeu_epi32(out + (i) * ldo, m0, _mm512_sub_epi32(r##x, k0));                    \
        _mm512_mask_storeu_epi32(out + (i) * ldo + 16, m1, _mm512_sub_epi32(r##y, k1));               \
    }
#define QN_BLOCK1(name, FULL_)                                                                        \
QN_HEAD(name, FULL_)                                                                                  \
    for (int64_t k4 = 0; k4 < k4n; k4++) {                                                            \
        const __m512i b0 = _mm512_load_si512((const void *)(P + k4 * 256));                           \
        QN_STEP1(0) QN_STEP1(1) QN_STEP1(2) QN_STEP1(3) QN_STEP1(4) QN_STEP1(5) QN_STEP1(6) QN_STEP1(7) \
        QN_STEP1(8) QN_STEP1(9) QN_STEP1(10) QN_STEP1(11) QN_STEP1(12) QN_STEP1(13) QN_STEP1(14)      \
        QN_STEP1(15) QN_STEP1(16) QN_STEP1(17) QN_STEP1(18) QN_STEP1(19) QN_STEP1(20) QN_STEP1(21)    \
        QN_STEP1(22) QN_STEP1(23)                                                                     \
    }                                                                                                 \
    const __m512i k0 = _mm512_loadu_si512((const void *)corr);                                        \
    const __mmask16 m0 = qo_mask(cols);                                                               \
    QN_STORE1(0) QN_STORE1(1) QN_STORE1(2) QN_STORE1(3) QN_STORE1(4) QN_STORE1(5) QN_STORE1(6)        \
    QN_STORE1(7) QN_STORE1(8) QN_STORE1(9) QN_STORE1(10) QN_STORE1(11) QN_STORE1(12) QN_STORE1(13)    \
    QN_STORE1(14) QN_STORE1(15) QN_STORE1(16) QN_STORE1(17) QN_STORE1(18) QN_STORE1(19)              \
    QN_STORE1(20) QN_STORE1(21) QN_STORE1(22) QN_STORE1(23)                                           \
}
#define QN_BLOCK2(name, FULL_)                                                                        \
QN_HEAD(name, FULL_)                                                                                  \
    for (int64_t k4 = 0; k4 < k4n; k4++) {                                                            \
        const __m512i b0 = _mm512_load_si512((const void *)(P + k4 * 256));                           \
        const __m512i b1 = _mm512_load_si512((const void *)(P + k4 * 256 + 64));                      \
        QN_STEP2(0, 0, 1) QN_STEP2(1, 2, 3) QN_STEP2(2, 4, 5) QN_STEP2(3, 6, 7) QN_STEP2(4, 8, 9)      \
        QN_STEP2(5, 10, 11) QN_STEP2(6, 12, 13) QN_STEP2(7, 14, 15) QN_STEP2(8, 16, 17)               \
        QN_STEP2(9, 18, 19) QN_STEP2(10, 20, 21) QN_STEP2(11, 22, 23)                                 \
    }                                                                                                 \
    const __m512i k0 = _mm512_loadu_si512((const void *)corr);                                        \
    const __m512i k1 = _mm512_loadu_si512((const void *)(corr + 16));                                 \
    const __mmask16 m0 = qo_mask(cols), m1 = qo_mask(cols - 16);                                      \
    QN_STORE2(0, 0, 1) QN_STORE2(1, 2, 3) QN_STORE2(2, 4, 5) QN_STORE2(3, 6, 7) QN_STORE2(4, 8, 9)    \
    QN_STORE2(5, 10, 11) QN_STORE2(6, 12, 13) QN_STORE2(7, 14, 15) QN_STORE2(8, 16, 17)             \
    QN_STORE2(9, 18, 19) QN_STORE2(10, 20, 21) QN_STORE2(11, 22, 23)                                 \
}
QN_BLOCK1(qo_block_n1, 0)
QN_BLOCK1(qo_block_n1_full, 1)
QN_BLOCK2(qo_block_n2, 0)
QN_BLOCK2(qo_block_n2_full, 1)
/* the requantized kernels with their epilogue fused (they use the macros above) */
#include "qi8_outer_rq.h"

#undef QN_HEAD
#undef QN_BLOCK1
#undef QN_BLOCK2
#undef QN_BCAST
#undef QN_STEP1
#undef QN_STEP2
#undef QN_STORE1
#undef QN_STORE2
#undef QO_ACC
#undef QO_REG
#undef QO_DP
#undef QO_STEP
#undef QO_STORE

typedef void (*qo_block_fn)(const uint8_t *, int64_t, int, const int8_t *, int64_t, const int32_t *, int32_t *,
                            int64_t, int64_t);

/* rows [0, rows) of A x packed panel P, one K block (kn groups of 4 bytes from group kb), by `block` */
VNNI_TARGET static void qo_kblock_with(qo_block_fn block, const uint8_t *A, int64_t lda, int64_t rows,
                                       const int8_t *P, int64_t kb, int64_t kn, const int32_t *corr, int32_t *out,
                                       int64_t ldo, int64_t cols) {
    for (int64_t m = 0; m < rows; m += QO_MR) {
        const uint8_t *a = A + m * lda + 4 * kb;
        const int8_t *pk = P + kb * 256;
        int32_t *o = out + m * ldo;
        block(a, lda, rows - m < QO_MR ? (int)(rows - m) : QO_MR, pk, kn, corr, o, ldo, cols);
    }
}

/* the int8 kernel for `cols` valid columns: the 64-wide block, or a narrow one (24 / 12 rows a call) */
VNNI_TARGET static void qo_kblock(const uint8_t *A, int64_t lda, int64_t rows, const int8_t *P, int64_t kb,
                                  int64_t kn, const int32_t *corr, int32_t *out, int64_t ldo, int64_t cols) {
    if (cols > 32) {
        qo_kblock_with(qo_block, A, lda, rows, P, kb, kn, corr, out, ldo, cols);
        return;
    }
    const int mr = cols > 16 ? 12 : 24;
    for (int64_t m = 0; m < rows; m += mr) {
        const uint8_t *a = A + m * lda + 4 * kb;
        const int8_t *pk = P + kb * 256;
        int32_t *o = out + m * ldo;
        const int r = rows - m < mr ? (int)(rows - m) : mr;
        if (cols > 16) (r == mr ? qo_block_n2_full : qo_block_n2)(a, lda, r, pk, kn, corr, o, ldo, cols);
        else (r == mr ? qo_block_n1_full : qo_block_n1)(a, lda, r, pk, kn, corr, o, ldo, cols);
    }
}

/* one work item: `rows` (<= QO_MC) rows of the u8 buffer (from A) against packed panel P (k4n
 * groups of 4, corrections cs), into out.  K runs in blocks of QO_KC4 groups (a 32 KiB panel
 * slice, L1/L2-resident while every row block of the item streams it: with all of a K = 4608
 * panel, 295 KiB, the kernel fell from ~86 % to ~60 % of the VNNI peak); the first block writes
 * out, the others write tmp (QO_MC x 64 int32), added to out. */
VNNI_TARGET static void qo_rows(const uint8_t *A, int64_t lda, int64_t rows, const int8_t *P, int64_t k4n,
                                const int32_t *cs, int32_t *out, int64_t ldo, int64_t cols, int32_t *tmp) {
    static const int32_t zeros[64] = {0};
    const int64_t nkb = (k4n + QO_KC4 - 1) / QO_KC4, kc = (k4n + nkb - 1) / nkb;   /* equal blocks */
    for (int64_t kb = 0; kb < k4n; kb += kc) {
        const int64_t kn = k4n - kb < kc ? k4n - kb : kc;
        const int32_t *corr = kb + kn == k4n ? cs : zeros;
        if (kb == 0) {
            qo_kblock(A, lda, rows, P, kb, kn, corr, out, ldo, cols);
            continue;
        }
        qo_kblock(A, lda, rows, P, kb, kn, corr, tmp, 64, cols);
        for (int64_t i = 0; i < rows; i++) {
            int32_t *o = out + i * ldo;
            const int32_t *t = tmp + i * 64;
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) o[j] = (int32_t)((uint32_t)o[j] + (uint32_t)t[j]);
        }
    }
}

/* ---------------------------------------------------------------- int16 x int8 (A16W8)
 * The same broadcast scheme with VPDPWSSD: a 4-byte group is a pair of int16 activations (the
 * int16 buffer of qlinear_int8.c, row stride Kp int16, read 4 bytes at a time), and the panel
 * holds each column's pair of weights widened to int16:
 *   P16[g][j] = (int16) w[n0 + j][2 g] | (int16) w[n0 + j][2 g + 1] << 16   (zero past N and K)
 * Each int32 lane gains at most 2 * 2^15 * 2^7 = 2^23 a step, so a block of QO16_KB = 128 pairs
 * (K = 256) is exact in int32 (2^30); the driver adds the blocks in int64.  No correction term. */
enum { QO16_KB = 128 };

VNNI_TARGET static void qo16_pack_panel(const int8_t *w, int64_t N, int64_t K, int64_t k2n, int64_t n0, int8_t *P) {
    int32_t *dst = (int32_t *)P;
    const int64_t gfull = K >= 4 ? (K - 4) / 2 + 1 : 0;   /* pairs whose 4-byte gather stays inside a row */
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)K));
    for (int c = 0; c < 4; c++) {
        const int64_t nb = n0 + 16 * c;
        const int64_t valid = N - nb <= 0 ? 0 : (N - nb >= 16 ? 16 : N - nb);
        const __mmask16 m = (__mmask16)((1u << valid) - 1u);
        const int8_t *base = w + (valid ? nb * K : 0);
        for (int64_t g = 0; g < gfull && g < k2n; g++) {   /* bytes 2g, 2g + 1 of 16 rows, widened */
            const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, base + 2 * g, 1);
            const __m512i lo = _mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24),
                                                _mm512_set1_epi32(0xFFFF));
            const __m512i hi = _mm512_slli_epi32(_mm512_srai_epi32(_mm512_slli_epi32(v, 16), 24), 16);
            _mm512_store_si512((void *)(dst + g * 64 + 16 * c), _mm512_or_si512(lo, hi));
        }
        for (int64_t g = gfull; g < k2n; g++)
            for (int j = 0; j < 16; j++) {
                const int16_t a = j < valid && 2 * g < K ? base[j * K + 2 * g] : 0;
                const int16_t b = j < valid && 2 * g + 1 < K ? base[j * K + 2 * g + 1] : 0;
                dst[g * 64 + 16 * c + j] = (int32_t)(((uint32_t)(uint16_t)b << 16) | (uint16_t)a);
            }
    }
}

/* rows [0, rows) of the int16 buffer (row stride lda bytes) x int16 panel P (k2n pairs): exact
 * int64 sums into acc (row stride 64), one int32 block of QO16_KB pairs at a time through blk */
VNNI_TARGET static void qo16_rows(const uint8_t *A, int64_t lda, int64_t rows, const int8_t *P, int64_t k2n,
                                  int64_t *acc, int32_t *blk, int64_t cols) {
    static const int32_t zeros[64] = {0};
    for (int64_t kb = 0; kb < k2n; kb += QO16_KB) {
        qo_kblock_with(qo16_block, A, lda, rows, P, kb, k2n - kb < QO16_KB ? k2n - kb : QO16_KB, zeros, blk, 64, cols);
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) acc[i * 64 + j] = (kb ? acc[i * 64 + j] : 0) + blk[i * 64 + j];
    }
}

#endif /* QI8_OUTER_AVX512_H */
