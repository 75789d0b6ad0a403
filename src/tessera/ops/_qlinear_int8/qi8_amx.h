/* qi8_amx.h -- the int8 GEMM's AMX tile kernel (Sapphire Rapids and later), framework-free.
 * Included by qlinear_int8.c after qi8_outer_avx512.h, whose packed panels and u8 activation
 * buffer it reads unchanged.
 *
 * Why: VPDPBUSD does 64 byte products per instruction; TDPBUSD does 16 x 16 x 64 = 16384 on
 * tiles (the bench's register-only peaks on the Sapphire Rapids VM: 821 GOP/s VNNI, 6638
 * AMX).  The layouts already fit:
 *
 *   A tile (16 rows x 64 bytes) = 16 rows of the u8 buffer (q + 128, row stride Kp, a multiple
 *                                 of 64 padded with 128), bytes 4 kb .. 4 kb + 63;
 *   B tile (16 rows x 64 bytes) = 16 groups k4 = kb .. kb + 15 of a packed panel, 16 columns
 *                                 (P[k4][j][0..3] = w[n0 + j][4 k4 .. 4 k4 + 3], row stride 256);
 *   C tile (16 x 16 int32)      += sum over the 64 bytes of u8 A x s8 B  (TDPBUSD: wrapping int32
 *                                 sums, no saturation, exactly VPDPBUSD's arithmetic)
 *
 * so the result is bit-identical to the VNNI kernel and the portable C: sum (q + 128) w - 128 cs,
 * exact for K <= 131071 (qlinear_int8.c).  Panels are packed with kp4 = Kp / 4 groups (a multiple
 * of 16: zero past K, where A holds 128 = q 0, so the extra products are 0).
 *
 * Blocking: 8 tiles = 4 C (32 rows x 32 columns) + 2 A + 2 B; a 64-column panel is two 32-column
 * halves, K runs whole in the C tiles (no partial sums in memory).  Row blocks of 32, then one of
 * 16; the last rows % 16 go to the VNNI kernel (a tile load of 16 rows would read past the buffer).
 * C is stored to a 32 x 64 int32 scratch, the correction subtracted on the way out.  K <= 64 (one
 * tile step; the requantized GEMM's 48 < K <= 64) runs qa_k64 instead: B loaded once per column
 * half, C started from the negated correction, two tile sets alternating between row blocks.  Int8
 * x at K <= 64 (K % 4 == 0) skips the u8 buffer: qa_direct reads x's rows in place, signed x signed.
 *
 * The OS must grant the tile state once per process (arch_prctl ARCH_REQ_XCOMP_PERM,
 * XFEATURE_XTILEDATA = 18, Linux >= 5.16); each thread loads the tile configuration before its
 * first tile instruction and releases the tiles after its last (qa_begin / qa_end).  Tile
 * instructions are inline asm (AT&T operand order: B, A, C) so no -mamx flag is needed to build.
 */
#ifndef QI8_AMX_H
#define QI8_AMX_H

#if defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
long syscall(long number, ...); /* unistd.h hides it under -std=c11 */
#define QI8_AMX 1
#else
#define QI8_AMX 0
#endif

#if QI8_AMX
/* CPUID.(7, 0):EDX bit 24 AMX-TILE, bit 25 AMX-INT8; then the kernel's permission for the tile
 * data.  Asked once (the answer is per process); 0 where either is missing. */
static int qa_available_uncached(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!((d >> 24) & 1u) || !((d >> 25) & 1u)) return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}

int tsr_qi8_has_amx(void) {
    static int state = -1;   /* a benign race: every thread computes the same answer */
    if (state < 0) state = qa_available_uncached();
    return state;
}

/* palette 1, tiles 0-7 all 16 rows x 64 bytes */
static void qa_begin(void) {
    uint8_t cfg[64] __attribute__((aligned(64))) = {0};
    cfg[0] = 1;
    for (int t = 0; t < 8; t++) { cfg[16 + 2 * t] = 64; cfg[48 + t] = 16; }
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}
static void qa_end(void) { __asm__ volatile("tilerelease" ::: "memory"); }

#define QA_LOAD(t, p, stride) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t : : "r"(p), "r"((int64_t)(stride)) : "memory")
#define QA_STORE(t, p, stride) \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" : : "r"(p), "r"((int64_t)(stride)) : "memory")
#define QA_DP(c, a, b) __asm__ volatile("tdpbusd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")

/* rows r0 .. r0 + 16 (two: + 32) of A x columns 32 h .. 32 h + 31 of panel P (kp4 groups) into
 * buf (32 x 64 int32, row stride 64): raw sums, correction not applied */
static __attribute__((noinline)) void qa_block(const uint8_t *A, int64_t lda, const int two, const int8_t *P,
                                               int64_t kp4, int h, int32_t *buf) {
    __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::: "memory");
    const int8_t *b = P + 128 * h;
    for (int64_t kb = 0; kb < kp4; kb += 16, b += 16 * 256) {
        QA_LOAD(4, A + 4 * kb, lda);
        QA_LOAD(6, b, 256);
        QA_LOAD(7, b + 64, 256);
        QA_DP(0, 4, 6);
        QA_DP(1, 4, 7);
        if (two) {
            QA_LOAD(5, A + 16 * lda + 4 * kb, lda);
            QA_DP(2, 5, 6);
            QA_DP(3, 5, 7);
        }
    }
    QA_STORE(0, buf + 32 * h, 256);
    QA_STORE(1, buf + 32 * h + 16, 256);
    if (two) {
        QA_STORE(2, buf + 16 * 64 + 32 * h, 256);
        QA_STORE(3, buf + 16 * 64 + 32 * h + 16, 256);
    }
}

/* K <= 64 (kp4 = 16: one tile step), nblk blocks of 16 rows x columns 32 h .. 32 h + 31 into out
 * (row stride ldo int32, all 32 columns written): the panel's two B tiles stay loaded for every
 * block, the C tiles start from -cs (a stride-0 load of one 64-byte row: no subtraction pass after),
 * and consecutive blocks alternate between two tile sets (C0 C1 A4, C2 C3 A5).  Tiles are not
 * renamed: with one set (qa_block) each block waits for the previous block's load -> TDPBUSD ->
 * store chain, ~370 cycles per 32 x 32 outputs at K = 32, slower than VPDPBUSD. */
static __attribute__((noinline)) void qa_k64(const uint8_t *A, int64_t lda, int64_t nblk, const int8_t *P, int h,
                                             const int32_t *ncs, int32_t *out, int64_t ldo) {
    const int8_t *b = P + 128 * h;
    const int32_t *nc = ncs + 32 * h;
    const int64_t so = 4 * ldo;
    QA_LOAD(6, b, 256);
    QA_LOAD(7, b + 64, 256);
    int64_t r = 0;
    for (; r + 2 <= nblk; r += 2) {
        const uint8_t *a = A + r * 16 * lda;
        int32_t *o = out + r * 16 * ldo + 32 * h;
        QA_LOAD(0, nc, 0);
        QA_LOAD(1, nc + 16, 0);
        QA_LOAD(4, a, lda);
        QA_DP(0, 4, 6);
        QA_DP(1, 4, 7);
        QA_STORE(0, o, so);
        QA_STORE(1, o + 16, so);
        QA_LOAD(2, nc, 0);
        QA_LOAD(3, nc + 16, 0);
        QA_LOAD(5, a + 16 * lda, lda);
        QA_DP(2, 5, 6);
        QA_DP(3, 5, 7);
        QA_STORE(2, o + 16 * ldo, so);
        QA_STORE(3, o + 16 * ldo + 16, so);
    }
    if (r < nblk) {
        int32_t *o = out + r * 16 * ldo + 32 * h;
        QA_LOAD(0, nc, 0);
        QA_LOAD(1, nc + 16, 0);
        QA_LOAD(4, A + r * 16 * lda, lda);
        QA_DP(0, 4, 6);
        QA_DP(1, 4, 7);
        QA_STORE(0, o, so);
        QA_STORE(1, o + 16, so);
    }
}
/* palette 1 for qa_narrow: C tiles 0-3 16 rows x 64 bytes, A tiles 4-5 16 rows x K bytes (x's own
 * rows, no padding), B tiles 6-7 K / 4 rows (4-byte groups) x 64 bytes.  K a multiple of 4, <= 64. */
static void qa_begin_direct(int64_t K) {
    uint8_t cfg[64] __attribute__((aligned(64))) = {0};
    cfg[0] = 1;
    for (int t = 0; t < 8; t++) {
        cfg[16 + 2 * t] = t == 4 || t == 5 ? (uint8_t)K : 64;
        cfg[48 + t] = t >= 6 ? (uint8_t)(K / 4) : 16;
    }
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

#define QA_DPS(c, a, b) __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")

/* The requantized GEMM at K <= 64 on tiles K bytes wide (qa_begin_direct(K rounded up to 4)), the
 * rows either
 *   int8 x read where it lies (qa_direct: K % 4 == 0, pointwise convs and small linears) --
 *     TDPBSSD multiplies signed x signed bytes, so no u8 conversion pass (u8_chunk was ~20 % of
 *     MobileNetV2's 32x112 -> 16 at batch 8) and no padding to 64 bytes; init = the folded offset
 *     (or 0): out = sum q w (+ off);
 *   or a conv's im2col rows as u8 codes in the chunk buffer (qa_narrow_u8: the 27-byte rows of a
 *     3-channel 3x3 stem) -- TDPBUSD, init = -cs as qa_k64's: out = sum (q + 128) w - cs;
 * both exactly the VNNI kernel's wrapping int32 sums.  nblk blocks of 16 rows (stride lda) x `cols`
 * columns of panel P (its first K / 4 groups) into out (row stride ldo int32), each C tile started
 * from init by a stride-0 load.  Column halves of 32 as qa_k64 (B loaded once per half, two tile
 * sets alternating between row blocks); a half of at most 16 valid columns takes one B tile and
 * one C tile a block. */
INL void qa_narrow(const int8_t *A, int64_t lda, int64_t nblk, const int8_t *P, int64_t cols, const int32_t *init,
                   int32_t *out, int64_t ldo, const int u8) {
#define QA_DPX(c, a, b) do { if (u8) QA_DP(c, a, b); else QA_DPS(c, a, b); } while (0)
    const int64_t so = 4 * ldo;
    for (int64_t h = 0; 32 * h < cols; h++) {
        const int8_t *b = P + 128 * h;
        const int32_t *nc = init + 32 * h;
        const int w2 = cols - 32 * h > 16;
        QA_LOAD(6, b, 256);
        if (w2) QA_LOAD(7, b + 64, 256);
/* one 16-row block on tile set (C0, C1, AT): C from init, A from a, out at o */
#define QA_NARROW_BLOCK(C0, C1, AT, a, o)                                                        \
    do {                                                                                       \
        QA_LOAD(C0, nc, 0);                                                                    \
        QA_LOAD(AT, a, lda);                                                                   \
        QA_DPX(C0, AT, 6);                                                                     \
        QA_STORE(C0, o, so);                                                                   \
        if (w2) {                                                                              \
            QA_LOAD(C1, nc + 16, 0);                                                           \
            QA_DPX(C1, AT, 7);                                                                 \
            QA_STORE(C1, (o) + 16, so);                                                        \
        }                                                                                      \
    } while (0)
        int64_t r = 0;
        for (; r + 2 <= nblk; r += 2) {   /* two blocks, one on each tile set */
            const int8_t *a = A + r * 16 * lda;
            int32_t *o = out + r * 16 * ldo + 32 * h;
            QA_NARROW_BLOCK(0, 1, 4, a, o);
            QA_NARROW_BLOCK(2, 3, 5, a + 16 * lda, o + 16 * ldo);
        }
        if (r < nblk) QA_NARROW_BLOCK(0, 1, 4, A + r * 16 * lda, out + r * 16 * ldo + 32 * h);
#undef QA_NARROW_BLOCK
    }
}
#undef QA_DPX
static __attribute__((noinline)) void qa_direct(const int8_t *A, int64_t lda, int64_t nblk, const int8_t *P,
                                                int64_t cols, const int32_t *init, int32_t *out, int64_t ldo) {
    qa_narrow(A, lda, nblk, P, cols, init, out, ldo, 0);
}
static __attribute__((noinline)) void qa_narrow_u8(const uint8_t *A, int64_t lda, int64_t nblk, const int8_t *P,
                                                   int64_t cols, const int32_t *init, int32_t *out, int64_t ldo) {
    qa_narrow((const int8_t *)A, lda, nblk, P, cols, init, out, ldo, 1);
}
#undef QA_DPS
#undef QA_LOAD
#undef QA_STORE
#undef QA_DP

/* qo_rows' contract with tiles: rows [0, rows) of A x packed panel P (kp4 groups, a multiple of
 * 16) minus the correction cs, exact int32 into out (row stride ldo, `cols` valid columns);
 * tmp: the VNNI kernel's scratch, for the rows % 16 it takes; ncs: -cs (or NULL), for qa_k64, which
 * takes a one-step K (kp4 16) into a 64-column scratch (ldo 64: it writes whole 32-column halves).
 * The caller has run qa_begin. */
VNNI_TARGET static void qa_rows(const uint8_t *A, int64_t lda, int64_t rows, const int8_t *P, int64_t kp4,
                                const int32_t *cs, int32_t *out, int64_t ldo, int64_t cols, int32_t *tmp,
                                const int32_t *ncs) {
    int32_t buf[32 * 64] __attribute__((aligned(64)));
    int64_t m = 0;
    if (kp4 == 16 && ldo == 64 && ncs) {   /* one tile step into a 64-column scratch tile: qa_k64 */
        qa_k64(A, lda, rows / 16, P, 0, ncs, out, ldo);
        if (cols > 32) qa_k64(A, lda, rows / 16, P, 1, ncs, out, ldo);
        m = rows / 16 * 16;
    }
    while (rows - m >= 16) {
        const int two = rows - m >= 32, nr = two ? 32 : 16;
        qa_block(A + m * lda, lda, two, P, kp4, 0, buf);
        if (cols > 32) qa_block(A + m * lda, lda, two, P, kp4, 1, buf);
        for (int i = 0; i < nr; i++) {
            int32_t *o = out + (m + i) * ldo;
            const int32_t *s = buf + i * 64;
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) o[j] = (int32_t)((uint32_t)s[j] - (uint32_t)cs[j]);
        }
        m += nr;
    }
    if (m < rows) qo_rows(A + m * lda, lda, rows - m, P, kp4, cs, out + m * ldo, ldo, cols, tmp);
}
#endif  /* without QI8_AMX, qlinear_int8.c defines tsr_qi8_has_amx as 0 */

#endif /* QI8_AMX_H */
