/* qlinear_int8.c -- int8 matmuls: int_mm, linear_w8a8, linear_a16w8 (one driver, tsr_qi8_mm).
 *
 *   acc[m, n] = sum_k a[m, k] * w[n, k]            exact (int32 for 8-bit a, int64 for 16-bit a)
 *   y[m, n]   = act(fp32(acc) * (sx[m] * sw[n]) + bias[n])    (linears; qlinear_epilogue.h)
 *
 * Phase 1 (rows in parallel): the activations become a padded integer buffer, row stride
 * Kp = K rounded up to 64 (K itself for the broadcast kernels on VNNI).  Float x is quantised
 * per row with the integer contract of
 * tessera_quant.h (x / scale as a true fp32 division, RNE, saturate, NaN -> 0); integer a is
 * copied.  For the VNNI int8 path the buffer holds u8 = q + 128 (q ^ 0x80), padding 128; int8
 * rows for the broadcast kernel skip this phase: each thread converts a chunk of QO_MC rows as it
 * reaches it (u8_chunk, into a cache-resident buffer), not all of x up front.
 *
 * Phase 2, int16 x int8 requantized (A16W8 convs and linears) with VNNI where qo_wanted says: the
 * broadcast scheme with VPDPWSSD on int16 pairs (qo16_block, outer16_gemm; exact int32 blocks of
 * K = 256 added in int64); where the int8 rule takes AMX, two int8 GEMMs on the AMX tiles, one per
 * byte of the int16 codes, added in int64 (split16_gemm).
 * Phase 2, int8 with VNNI where qi8_outer says (M > 16 and K small, or M >= 128; with AMX from
 * M = 40): the broadcast kernel of qi8_outer_avx512.h (64-column weight panels packed per call,
 * or once per weight by tsr_qi8_pack for the requantized conv / linear layers,
 * 6 x 64 outputs in registers, nothing reduced horizontally; 85 % of the VNNI peak at conv /
 * prefill sizes), or its AMX tile twin (qi8_amx.h).
 * Otherwise: dot-product micro-kernels on w's own [N, K] layout (no weight packing): a block
 * of mb <= 4 activation rows x 4 weight rows keeps 16 zmm accumulators over all of K, reduced
 * horizontally once at the end.
 *   - int8, AVX512-VNNI: VPDPBUSD (u8 x s8, 4 products per int32 lane, wrapping):
 *     sum (q + 128) w = acc + 128 sum_k w[n, k], so acc = dp - 128 * colsum(n); the column sums
 *     come from one more VPDPBUSD with a vector of ones on the weight already in registers
 *     (GEMV: during the first row block, no extra weight pass) or from a pass over the
 *     L2-resident weight panel (GEMM).  Wrapping int32 arithmetic is exact modulo 2^32, and the
 *     true sums fit int32 for K <= 131071 (enforced: 131072 * (-128)^2 = 2^31 would wrap).
 *   - int16 x int8 (A16W8), AVX512-VNNI: VPDPWSSD on int16 pairs (weights widened with
 *     VPMOVSXBW).  Each int32 lane gains at most 4 products of |a| <= 32768, |w| <= 128 per
 *     64-wide K step (2^24), so lanes are flushed into int64 every 64 steps (K = 4096):
 *     |partial| <= 2^30 < 2^31, never overflowing; the flush sums the 16 lanes in int64.
 *   - portable C (generic/avx2 levels, and CPUs without VNNI): the same blocking with plain
 *     loops (int8: int32 sums in unsigned arithmetic, i.e. wrapping; int16: int64 sums).
 * Loop orders: M <= 16 (GEMV, weight-bandwidth bound): threads take chunks of 64 weight rows
 * (dynamically), each 4-row block is read from DRAM once and reused for every activation
 * block from L1; the first activation block prefetches (into L2) the weight block after next,
 * which lifted one core's weight stream from ~14 to ~19 GB/s here (DRAM-sized weights).
 * Column sums are computed per call: in the GEMV they cost one VPDPBUSD per 64 weight bytes on
 * data already in registers (no extra memory traffic), in the GEMM one L2-resident pass per panel
 * (~1/M of the panel's VPDPBUSD work).  The one exception: tsr_qi8_mm_rq (a conv layer's weight,
 * call after call) takes the broadcast kernel's panels and sums packed once (tsr_qi8_pack), the
 * caller tracking the weight's identity and version.  M > 16
 * (GEMM): threads take 64-row weight panels (K x 64 bytes, L2-resident) and sweep all
 * activation blocks over the panel, so the weight is read from DRAM once and the activations
 * once per panel (from L3).  Where the CPU has AMX-INT8 and the OS grants the tile state, the
 * broadcast GEMM's row blocks run on AMX tiles instead (qi8_amx.h: same panels, same buffer, same
 * bits).  VNNI is chosen at run time (__builtin_cpu_supports("avx512vnni")) at the avx512 build
 * level (functions compiled with a target attribute); vnni_ok = 0 forces the portable code,
 * 2 VNNI even where AMX exists (tests), 1 the best the CPU has.
 * AArch64 (the cpu:aarch64 runner, -march=armv8-a): int8 blocks run SDOT (FEAT_DotProd) or SMMLA
 * (FEAT_I8MM) micro-kernels (tessera_neon_dot.h) where getauxval's HWCAP bits say the CPU has them,
 * else the portable loops (which gcc vectorises to smull/sadalp); there vnni_ok = 0 forces the
 * portable loops, 2 SDOT even where SMMLA exists (tests), 1 the best the CPU has.
 */
#include "tessera_quant.h"
#include "tessera_requant.h"
#include "qlinear_epilogue.h"

#if defined(__AVX512BW__) && defined(__x86_64__) && defined(__GNUC__)
#define QI8_VNNI 1
#define VNNI_TARGET __attribute__((target("avx512vnni,avx512f,avx512bw,avx512vl,avx512dq")))
#else
#define QI8_VNNI 0
#endif
#define INL static inline __attribute__((always_inline))
#if QI8_VNNI
#include "qi8_im2col.h"   /* tsr_qi8_conv_rq's rows, made in the GEMM's row chunks */
#endif

int tsr_qi8_has_vnni(void) {
#if QI8_VNNI
    return __builtin_cpu_supports("avx512vnni") != 0;
#else
    return 0;
#endif
}

enum { SRC_I8 = 8, SRC_I16 = 16 };   /* xkind: 0..2 = float dtypes (quantise), or integer input */
enum { MB = 4, NB = 4, NP = 64 };
/* tsr_take's slots (tessera_cpu.h): tsr_qi8_mm_rq's accumulators, qi8_run's per-call buffers, then
 * its per-thread ones */
enum { KS_ACC, KS_QBUF, KS_XS, KS_P, KS_CS, KS_BUF, KS_FBUF, KS_TILE, KS_BLK, KS_QB };

typedef struct {
    const char *x; int64_t sx; int xkind, bits, vnni;
    int64_t M, K, Kp, N;
    const int8_t *w; const float *wscale, *bias; int act;
    char *y; int ydtype;                 /* ydtype < 0: integer output (int32 / int64) */
    char *q; float *xs;                  /* activation buffer [M][Kp] and per-row scales */
    int arm;                             /* AArch64 int8: TSR_DOT_SDOT / TSR_DOT_SMMLA kernels, 0: portable */
    int amx;                             /* x86 int8 broadcast GEMM on AMX tiles (qi8_amx.h) */
    const struct rq_s *rq;               /* tsr_qi8_mm_rq: requantized int8 / int16 output, else NULL */
    const int8_t *packed;                /* w's VNNI panels and 128 x column sums (tsr_qi8_pack), or NULL */
    const struct ic_s *ic;               /* tsr_qi8_conv_rq: x's rows are a conv's im2col rows, made per chunk */
    int direct;                          /* AMX tiles K bytes wide (qa_narrow: x in place, or ic's rows): qa_direct_ok */
} job_t;

/* tsr_qi8_mm_rq's requantization (tessera_requant.h): out[m, n] = clamp(MBQM(acc + off[n],
 * mult[n], shift[n]) + zp, qmin, qmax) (mult / shift per channel when cs, else one of each) */
typedef struct rq_s {
    const int32_t *mult, *shift; int64_t cs; const int64_t *off;
    int64_t zp, qmin, qmax; int rounding;
    char *out; int64_t so; int out16;
    int fold;   /* the broadcast kernel subtracts -off with its 128 cs correction (no int32 overflow possible) */
    int f32;    /* int8 x, the offset folded or none: rq_tile_v_double's fp32 form (tessera_requant.h) */
#ifdef TSR_AVX512
    const rq64_t *k64;   /* int64 accumulators (int16 x): the per-channel part, formed once (tessera_requant.h) */
    int off_sat;         /* acc + off may overflow int64: the saturating add (else the plain one equals it) */
#endif
} rq_t;

/* requantize acc (n int32 or int64 values: columns n0 .. n0 + n of row m) into the output row */
static void rq_put(const rq_t *R, const char *acc, int acc64, int64_t m, int64_t n0, int64_t n, int folded) {
    char *o = R->out + (m * R->so + n0) * (R->out16 ? 2 : 1);
    const int32_t *mu = R->mult + n0 * R->cs, *sh = R->shift + n0 * R->cs;
    const int64_t *off = R->off && !folded ? R->off + n0 : NULL;
    const int mode = acc64 ? 2 : (R->rounding == RQ_SINGLE ? 1 : 0);
#ifdef TSR_AVX512
    if (acc64) {   /* R->k64: formed by tsr_qi8_mm_rq for every int16 call */
        rq_row_v64k((const int64_t *)acc, off, R->off_sat, R->k64, n0, n, R->zp, R->qmin, R->qmax, o, R->out16);
        return;
    }
#define RQ(MODE) (R->cs ? rq_row_v(acc, mu, sh, 1, off, n, R->zp, R->qmin, R->qmax, o, R->out16, MODE) \
                        : rq_row_v(acc, mu, sh, 0, off, n, R->zp, R->qmin, R->qmax, o, R->out16, MODE))
    if (mode == 0) RQ(0);
    else RQ(1);
#else
#define RQ(MODE) (R->cs ? rq_row(acc, acc64, mu, sh, 1, off, n, R->zp, R->qmin, R->qmax, o, R->out16, MODE) \
                        : rq_row(acc, acc64, mu, sh, 0, off, n, R->zp, R->qmin, R->qmax, o, R->out16, MODE))
    if (mode == 0) RQ(0);
    else if (mode == 1) RQ(1);
    else RQ(2);
#endif
#undef RQ
}

/* the broadcast GEMM's int32 tile (rows x n, row stride 64; -off already folded in when R->fold)
 * into output rows m0.. columns n0.. */
static void rq_tile(const rq_t *R, const int32_t *tile, int64_t rows, int64_t m0, int64_t n0, int64_t n) {
#ifdef TSR_AVX512
    if (R->rounding != RQ_SINGLE) {   /* int32 accumulators: mode 0 */
        rq_tile_v_double(tile, 64, rows, R->mult + n0 * R->cs, R->shift + n0 * R->cs, (int)R->cs,
                         R->off && !R->fold ? R->off + n0 : NULL, n, R->zp, R->qmin, R->qmax,
                         R->out + (m0 * R->so + n0) * (R->out16 ? 2 : 1), R->so, R->out16, R->f32);
        return;
    }
#endif
    for (int64_t i = 0; i < rows; i++) rq_put(R, (const char *)(tile + i * 64), 0, m0 + i, n0, n, R->fold);
}

/* ------------------------------------------------------------------ phase 1: activations */
/* one int8 row as the VNNI kernels' u8 codes q + 128 (q ^ 0x80), padded to Kp with 128 (q = 0):
 * masked 64-byte steps (gcc left a K = 27 im2col row to its scalar loop: 1/3 of the stem's GEMM) */
#if QI8_VNNI
VNNI_TARGET static inline void u8_row(const uint8_t *src, int64_t K, uint8_t *d, int64_t Kp) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int64_t k = 0; k < Kp; k += 64) {
        const int64_t n = K - k, t = Kp - k;
        const __mmask64 ms = n >= 64 ? ~(__mmask64)0 : n <= 0 ? 0 : ((__mmask64)1 << n) - 1;
        const __mmask64 md = t >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << t) - 1;
        _mm512_mask_storeu_epi8(d + k, md, _mm512_xor_si512(_mm512_maskz_loadu_epi8(ms, src + k), bias));
    }
}
#else
static inline void u8_row(const uint8_t *src, int64_t K, uint8_t *d, int64_t Kp) {
    for (int64_t k = 0; k < K; k++) d[k] = src[k] ^ 0x80u;
    for (int64_t k = K; k < Kp; k++) d[k] = 0x80u;
}
#endif

/* rows m0 .. m0 + rows of int8 x as the VNNI / AMX kernels' u8 codes (q ^ 0x80, rows of Kp padded
 * with 128) into d: one flat pass where x's rows are contiguous and unpadded, else u8_row.  qi8_run
 * converts all of x this way before the dot micro-kernels, outer_gemm a chunk at a time */
static void u8_chunk(const job_t *J, int64_t m0, int64_t rows, uint8_t *d) {
#if QI8_VNNI
    if (J->ic) {   /* no x to read: the im2col rows, made here */
        ic_rows(J->ic, m0, rows, d, J->Kp);
        return;
    }
#endif
    if (J->sx == J->K && J->Kp == J->K) {
        const uint8_t *src = (const uint8_t *)J->x + m0 * J->K;
        const int64_t n = rows * J->K;
_Pragma("omp simd")
        for (int64_t k = 0; k < n; k++) d[k] = src[k] ^ 0x80u;
        return;
    }
    for (int64_t i = 0; i < rows; i++) u8_row((const uint8_t *)J->x + (m0 + i) * J->sx, J->K, d + i * J->Kp, J->Kp);
}

static void prep_row(const job_t *J, int64_t i, float *buf) {
    const int64_t K = J->K, Kp = J->Kp;
    const int u8 = J->bits == 8 && J->vnni;
    if (J->bits == 8) {
        int8_t *q = (int8_t *)J->q + i * Kp;
        /* (int8 x for the VNNI kernels never comes here: u8_chunk) */
        if (J->xkind == SRC_I8) {
            memcpy(q, J->x + i * J->sx, (size_t)K);
        } else {
            tsr_load_f32(buf, J->x + i * J->sx * tsr_elsize(J->xkind), K, J->xkind);
            const float s = tsr_scale_for(tsr_absmax(buf, K), 127.0f);
            J->xs[i] = s;
            int64_t k0 = 0;
#if defined(TSR_NEON)
            k0 = tsr_neon_quant_ints(buf, K, s, -127.0f, 127.0f, 0, 0, q);   /* the same integers */
#endif
            for (int64_t k = k0; k < K; k++) q[k] = (int8_t)tsr_quant_int(buf[k] / s, -127.0f, 127.0f);
        }
        for (int64_t k = K; k < Kp; k++) q[k] = 0;
        if (u8)
            for (int64_t k = 0; k < Kp; k++) q[k] = (int8_t)((uint8_t)q[k] ^ 0x80u);
    } else {
        int16_t *q = (int16_t *)J->q + i * Kp;
        if (J->xkind == SRC_I16) {
            memcpy(q, J->x + i * J->sx * 2, (size_t)K * 2);
        } else {
            tsr_load_f32(buf, J->x + i * J->sx * tsr_elsize(J->xkind), K, J->xkind);
            const float s = tsr_scale_for(tsr_absmax(buf, K), 32767.0f);
            J->xs[i] = s;
            int64_t k0 = 0;
#if defined(TSR_NEON)
            k0 = tsr_neon_quant_ints(buf, K, s, -32767.0f, 32767.0f, 0, 1, q);
#endif
            for (int64_t k = k0; k < K; k++) q[k] = (int16_t)tsr_quant_int(buf[k] / s, -32767.0f, 32767.0f);
        }
        for (int64_t k = K; k < Kp; k++) q[k] = 0;
    }
}

/* ------------------------------------------------------------------ portable micro-kernels */
/* res[i*NB + j] = sum_k X[i][k] * Wr[j][k] (int8: wrapped to int32) for i < mb, j < NB */
INL void dot_portable(const job_t *J, const char *X, const int mb, const int8_t *const *Wr, int64_t *res) {
    const int64_t K = J->K, Kp = J->Kp;
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < NB; j++) {
            const int8_t *w = Wr[j];
            if (J->bits == 8) {
                const int8_t *x = (const int8_t *)X + i * Kp;
                uint32_t s = 0;
#pragma omp simd reduction(+ : s)
                for (int64_t k = 0; k < K; k++) s += (uint32_t)((int32_t)x[k] * (int32_t)w[k]);
                res[i * NB + j] = (int32_t)s;
            } else {
                const int16_t *x = (const int16_t *)X + i * Kp;
                int64_t s = 0;
#pragma omp simd reduction(+ : s)
                for (int64_t k = 0; k < K; k++) s += (int32_t)x[k] * (int32_t)w[k];
                res[i * NB + j] = s;
            }
        }
}

#if QI8_VNNI
/* ------------------------------------------------------------------ VNNI micro-kernels */
VNNI_TARGET INL __mmask64 tail_mask(int64_t r) { return _cvtu64_mask64(r >= 64 ? ~0ULL : (~0ULL >> (64 - r))); }

VNNI_TARGET INL int64_t hsum64(__m512i v) {   /* 16 int32 lanes summed in int64 */
    const __m512i a = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(v));
    const __m512i b = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1));
    return _mm512_reduce_add_epi64(_mm512_add_epi64(a, b));
}

/* int8: X holds u8 = q + 128.  res = wrapped int32 of sum (x_u8 * w); cs (when with_cs) = the
 * weight rows' sums.  Callers subtract 128 * cs. */
VNNI_TARGET INL void dot8_vnni(const uint8_t *X, int64_t ldx, const int mb, const int8_t *const *Wr, int64_t K,
                               uint32_t *res, uint32_t *cs, const int with_cs) {
    const int64_t pf = with_cs ? 2 * NB * K : 0;   /* GEMV first pass: pull the block after next into L2 */
    __m512i acc[MB][NB], c[NB], w[NB];
    const __m512i ones = _mm512_set1_epi8(1);
#pragma GCC unroll 4
    for (int j = 0; j < NB; j++) {
        c[j] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int i = 0; i < MB; i++) acc[i][j] = _mm512_setzero_si512();
    }
    for (int64_t k = 0; k < K; k += 64) {
        const __mmask64 m = tail_mask(K - k);
#pragma GCC unroll 4
        for (int j = 0; j < NB; j++) w[j] = _mm512_maskz_loadu_epi8(m, Wr[j] + k);
        if (with_cs) {
#pragma GCC unroll 4
            for (int j = 0; j < NB; j++) _mm_prefetch((const char *)(Wr[j] + k + pf), _MM_HINT_T1);
#pragma GCC unroll 4
            for (int j = 0; j < NB; j++) c[j] = _mm512_dpbusd_epi32(c[j], ones, w[j]);
        }
#pragma GCC unroll 4
        for (int i = 0; i < MB; i++) {
            if (i < mb) {
                const __m512i xv = _mm512_loadu_si512((const void *)(X + i * ldx + k));
#pragma GCC unroll 4
                for (int j = 0; j < NB; j++) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], xv, w[j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; j++) {
        if (with_cs) cs[j] = (uint32_t)_mm512_reduce_add_epi32(c[j]);
#pragma GCC unroll 4
        for (int i = 0; i < MB; i++)
            if (i < mb) res[i * NB + j] = (uint32_t)_mm512_reduce_add_epi32(acc[i][j]);
    }
}

/* int16 x int8 with VPDPWSSD; int32 lanes flushed to int64 every 64 steps (see the header). */
VNNI_TARGET INL void dot16_vnni(const int16_t *X, int64_t ldx, const int mb, const int8_t *const *Wr, int64_t K,
                                int64_t *res, const int first) {
    const int64_t pf = first ? 2 * NB * K : 0;   /* GEMV first pass: pull the block after next into L2 */
    __m512i acc[MB][NB], wl[NB], wh[NB];
    int64_t tot[MB][NB];
#pragma GCC unroll 4
    for (int i = 0; i < MB; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NB; j++) { acc[i][j] = _mm512_setzero_si512(); tot[i][j] = 0; }
    int steps = 0;
    for (int64_t k = 0; k < K; k += 64) {
        const __mmask64 m = tail_mask(K - k);
#pragma GCC unroll 4
        for (int j = 0; j < NB; j++) {
            const __m512i wb = _mm512_maskz_loadu_epi8(m, Wr[j] + k);
            if (first) _mm_prefetch((const char *)(Wr[j] + k + pf), _MM_HINT_T1);
            wl[j] = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(wb));
            wh[j] = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(wb, 1));
        }
#pragma GCC unroll 4
        for (int i = 0; i < MB; i++) {
            if (i < mb) {
                const __m512i xl = _mm512_loadu_si512((const void *)(X + i * ldx + k));
                const __m512i xh = _mm512_loadu_si512((const void *)(X + i * ldx + k + 32));
#pragma GCC unroll 4
                for (int j = 0; j < NB; j++)
                    acc[i][j] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(acc[i][j], xl, wl[j]), xh, wh[j]);
            }
        }
        if (++steps == 64 || k + 64 >= K) {
            steps = 0;
#pragma GCC unroll 4
            for (int i = 0; i < MB; i++)
#pragma GCC unroll 4
                for (int j = 0; j < NB; j++)
                    if (i < mb) { tot[i][j] += hsum64(acc[i][j]); acc[i][j] = _mm512_setzero_si512(); }
        }
    }
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < NB; j++) res[i * NB + j] = tot[i][j];
}

/* one activation block x one 4-row weight block -> exact results (int8: 128 * cs removed) */
VNNI_TARGET static void block_vnni(const job_t *J, const char *X, int mb, const int8_t *const *Wr, int64_t *res,
                                   uint32_t *cs, int with_cs) {
    if (J->bits == 16) {
        const int16_t *X16 = (const int16_t *)X;
#define D16(MBC) (with_cs ? dot16_vnni(X16, J->Kp, MBC, Wr, J->K, res, 1) : dot16_vnni(X16, J->Kp, MBC, Wr, J->K, res, 0))
        switch (mb) {
        case 1: D16(1); break;
        case 2: D16(2); break;
        case 3: D16(3); break;
        default: D16(4); break;
        }
#undef D16
        return;
    }
    uint32_t r[MB * NB];
    const uint8_t *X8 = (const uint8_t *)X;
#define D8(MBC) (with_cs ? dot8_vnni(X8, J->Kp, MBC, Wr, J->K, r, cs, 1) : dot8_vnni(X8, J->Kp, MBC, Wr, J->K, r, cs, 0))
    switch (mb) {
    case 1: D8(1); break;
    case 2: D8(2); break;
    case 3: D8(3); break;
    default: D8(4); break;
    }
#undef D8
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < NB; j++) res[i * NB + j] = (int32_t)(r[i * NB + j] - 128u * cs[j]);
}
#endif

#if defined(__aarch64__)
/* ------------------------------------------------------------------ AArch64 SDOT / SMMLA micro-kernels */
/* int8 only (A16W8 keeps the portable loops: no int16 x int8 dot instruction).  X holds q itself
 * (SDOT and SMMLA are signed x signed: no +128 bias), rows zero-padded to Kp (a multiple of 64, so
 * the kernels' 16-byte loads past K stay inside the row); weight rows are read as they are. */
#include "tessera_neon_dot.h"
#endif
#if defined(TSR_NEON_DOT)
#define QI8_ARM 1
/* the kernels a call runs: vnni_ok 0 = portable, 2 = at most SDOT, else the best the CPU has */
static int qi8_arm_level(int ok, int bits) {
    const int have = bits == 8 && ok ? tsr_neon_dot_level() : TSR_DOT_NONE;
    return ok == 2 && have > TSR_DOT_SDOT ? TSR_DOT_SDOT : have;
}

#define QI8_ARM_SWITCH(KERNEL)                                                                  \
    switch (mb) {                                                                               \
    case 1: tsr_sdot_4x4((const int8_t *)X, J->Kp, 1, Wr, J->K, r); break;                      \
    case 2: KERNEL((const int8_t *)X, J->Kp, 2, Wr, J->K, r); break;                            \
    case 3: KERNEL((const int8_t *)X, J->Kp, 3, Wr, J->K, r); break;                            \
    default: KERNEL((const int8_t *)X, J->Kp, 4, Wr, J->K, r); break;                           \
    }                                                                                           \
    for (int i = 0; i < mb; i++)                                                                \
        for (int j = 0; j < NB; j++) res[i * NB + j] = r[i * NB + j];

TSR_DOTPROD_TARGET static void block_sdot(const job_t *J, const char *X, int mb, const int8_t *const *Wr,
                                          int64_t *res) {
    int32_t r[MB * NB];
    QI8_ARM_SWITCH(tsr_sdot_4x4)
}

/* SMMLA pairs rows: a single row (mb = 1) takes SDOT */
TSR_I8MM_TARGET static void block_smmla(const job_t *J, const char *X, int mb, const int8_t *const *Wr,
                                        int64_t *res) {
    int32_t r[MB * NB];
    QI8_ARM_SWITCH(tsr_smmla_4x4)
}
#undef QI8_ARM_SWITCH
#else
#define QI8_ARM 0
#endif

static void block(const job_t *J, const char *X, int mb, const int8_t *const *Wr, int64_t *res, uint32_t *cs,
                  int with_cs) {
#if QI8_VNNI
    if (J->vnni) { block_vnni(J, X, mb, Wr, res, cs, with_cs); return; }
#endif
#if QI8_ARM
    if (J->arm == TSR_DOT_SMMLA) { block_smmla(J, X, mb, Wr, res); return; }
    if (J->arm == TSR_DOT_SDOT) { block_sdot(J, X, mb, Wr, res); return; }
#endif
    (void)cs; (void)with_cs;
    switch (mb) {
    case 1: dot_portable(J, X, 1, Wr, res); break;
    case 2: dot_portable(J, X, 2, Wr, res); break;
    case 3: dot_portable(J, X, 3, Wr, res); break;
    default: dot_portable(J, X, 4, Wr, res); break;
    }
}

/* ------------------------------------------------------------------ outputs */
/* row m, columns [n0, n0 + n) from exact accumulators */
static void finish(const job_t *J, int64_t m, int64_t n0, int64_t n, const int64_t *acc, float *fbuf) {
    if (J->ydtype < 0) {
        if (J->bits == 8) {
            int32_t *y = (int32_t *)J->y + m * J->N + n0;
            for (int64_t j = 0; j < n; j++) y[j] = (int32_t)acc[j];
        } else {
            memcpy((int64_t *)J->y + m * J->N + n0, acc, (size_t)n * 8);
        }
        return;
    }
    tsr_qepi_i64(acc, n, J->xs[m], J->wscale + n0, J->bias ? J->bias + n0 : NULL, J->act, fbuf);
    tsr_store_conv(J->y + (m * J->N + n0) * tsr_elsize(J->ydtype), fbuf, n, J->ydtype);
}

static void wrows(const job_t *J, int64_t n0, const int8_t **Wr) {   /* past-the-end rows repeat N-1 */
    for (int j = 0; j < NB; j++) Wr[j] = J->w + (n0 + j < J->N ? n0 + j : J->N - 1) * J->K;
}

/* GEMV (M <= 16): each 4-row weight block is read once, for every activation block */
static void gemv_range(const job_t *J, int64_t b0, int64_t b1) {
    int64_t res[MB * NB];
    float fbuf[NB];
    uint32_t cs[NB] = {0};
    const int es = J->bits == 8 ? 1 : 2;
    for (int64_t b = b0; b < b1; b++) {
        const int64_t n0 = b * NB, nn = J->N - n0 < NB ? J->N - n0 : NB;
        const int8_t *Wr[NB];
        wrows(J, n0, Wr);
        for (int64_t m0 = 0; m0 < J->M; m0 += MB) {
            const int mb = (int)(J->M - m0 < MB ? J->M - m0 : MB);
            block(J, J->q + m0 * J->Kp * es, mb, Wr, res, cs, m0 == 0);
            for (int i = 0; i < mb; i++) {
                int64_t r[NB];
                for (int j = 0; j < NB; j++) r[j] = res[i * NB + j];
                finish(J, m0 + i, n0, nn, r, fbuf);
            }
        }
    }
}

/* GEMM (M > 16): one 64-row weight panel, all activation blocks */
static void gemm_panel(const job_t *J, int64_t p, int64_t *tile, float *fbuf) {
    const int64_t n0 = p * NP, pn = J->N - n0 < NP ? J->N - n0 : NP;
    const int es = J->bits == 8 ? 1 : 2;
    uint32_t cs[NP];
    if (J->bits == 8 && J->vnni) {   /* column sums of the panel (also pulls it into L2) */
        for (int64_t j = 0; j < pn; j++) {
            const int8_t *w = J->w + (n0 + j) * J->K;
            int32_t s = 0;
#pragma omp simd reduction(+ : s)
            for (int64_t k = 0; k < J->K; k++) s += w[k];
            cs[j] = (uint32_t)s;
        }
    }
    for (int64_t m0 = 0; m0 < J->M; m0 += MB) {
        const int mb = (int)(J->M - m0 < MB ? J->M - m0 : MB);
        const char *X = J->q + m0 * J->Kp * es;
        for (int64_t jj = 0; jj < pn; jj += NB) {
            const int8_t *Wr[NB];
            int64_t res[MB * NB];
            uint32_t c4[NB];
            wrows(J, n0 + jj, Wr);
            for (int j = 0; j < NB; j++) c4[j] = jj + j < pn ? cs[jj + j] : 0;
            block(J, X, mb, Wr, res, c4, 0);
            for (int i = 0; i < mb; i++)
                for (int j = 0; j < NB; j++) tile[i * NP + jj + j] = res[i * NB + j];
        }
        for (int i = 0; i < mb; i++) finish(J, m0 + i, n0, pn, tile + i * NP, fbuf);
    }
}

/* 4-byte K groups of a packed panel: ceil(K / 4), or Kp / 4 (a multiple of 16) for the AMX tiles */
#define QO_GROUPS(J) ((J)->amx ? (J)->Kp / 4 : ((J)->K + 3) / 4)

#if QI8_VNNI
#include "qi8_outer_avx512.h"
#include "qi8_amx.h"

/* rows m0 .. m0 + done of a requantized call's row chunk A straight to the output, where a fused
 * kernel applies (qn2_rq_block: 12-row blocks, 16 < cols <= 32; qo_rq_block: 6-row blocks, cols >
 * 32; both: one K block, int8 outputs in the double rounding's f8 form, the offset folded or
 * none); returns done (the rows % the block: the tile) */
VNNI_TARGET static int64_t q_rq_rows(const job_t *J, const uint8_t *A, int64_t rows, const int8_t *Pp, int64_t k4n,
                                     const int32_t *cs, int64_t m0, int64_t n0, int64_t cols) {
    const rq_t *R = J->rq;
    const int64_t mb = cols > 32 ? 6 : 12;
    if (cols <= 16 || k4n > QO_KC4 || rows < mb || R->rounding == RQ_SINGLE || R->out16 || !R->f32 ||
        (R->off && !R->fold))
        return 0;
    qrq_t Q;
    if (!qrq_init(&Q, R->mult + n0 * R->cs, R->shift + n0 * R->cs, (int)R->cs, cols, R->zp, R->qmin, R->qmax, R->so))
        return 0;
    const int64_t done = rows / mb * mb;
    for (int64_t m = 0; m < done; m += mb) {
        char *o = R->out + (m0 + m) * R->so + n0;
        if (mb == 6) qo_rq_block(A + m * J->Kp, J->Kp, Pp, k4n, cs, &Q, o, R->so);
        else qn2_rq_block(A + m * J->Kp, J->Kp, Pp, k4n, cs, &Q, o, R->so);
    }
    return done;
}

/* the broadcast GEMM (int8, VNNI, qo_wanted(M, K)): panels packed by all threads, then (row chunk,
 * panel) items; int32 outputs straight into y, float epilogues through a per-thread int32 tile
 * (`tile`: 2 x QO_MC x 64 int32, the int64 tile's bytes) */
VNNI_TARGET static void outer_gemm(const job_t *J, int8_t *P, int32_t *CS, int32_t *tile, float *fbuf, uint8_t *qb,
                                   const int failed) {
    const int64_t k4n = QO_GROUPS(J), np = (J->N + 63) / 64, nmc = (J->M + QO_MC - 1) / QO_MC;
    /* panel stride in groups: the cache's Kp / 4 (tsr_qi8_pack: both kernels' layout), else k4n */
    const int64_t kst = J->packed ? ((J->K + 63) & ~(int64_t)63) / 4 : k4n;
_Pragma("omp for schedule(static)")
    for (int64_t p = 0; p < np; p++) {
        if (failed) continue;
        if (J->packed)   /* P is the cache; its sums copied, as the fold below changes them per call */
            memcpy(CS + p * 64, J->packed + np * kst * 256 + p * 64 * 4, 64 * 4);
        else
            qo_pack_panel(J->w, J->N, J->K, k4n, p * 64, P + p * k4n * 256, CS + p * 64);
        if (J->rq && J->rq->fold)   /* acc + off = acc - (-off): one int32 correction (rq_t.fold) */
            for (int64_t j = 0; j < 64 && p * 64 + j < J->N; j++)
                CS[p * 64 + j] = (int32_t)((uint32_t)CS[p * 64 + j] - (uint32_t)(int32_t)J->rq->off[p * 64 + j]);
        /* AMX: the C tiles' start -- qa_k64's -cs, or qa_direct's folded offset (signed rows need no 128 cs) */
        for (int64_t j = 0; J->amx && j < 64; j++)
            CS[np * 64 + p * 64 + j] = !J->direct || J->ic ? (int32_t)(0u - (uint32_t)CS[p * 64 + j])
                                     : J->rq->fold && p * 64 + j < J->N ? (int32_t)J->rq->off[p * 64 + j] : 0;
    }
#if QI8_AMX
    if (J->direct) qa_begin_direct((J->K + 3) & ~(int64_t)3);
    else if (J->amx) qa_begin();
#define QO_ROWS(...) (J->amx ? qa_rows(__VA_ARGS__, CS + np * 64 + p * 64) : qo_rows(__VA_ARGS__))
#else
#define QO_ROWS qo_rows
#endif
    int64_t last_mc = -1;   /* the chunk in qb: items come chunk-major, so a thread's next panel reuses it */
_Pragma("omp for schedule(dynamic, 1)")
    for (int64_t it = 0; it < nmc * np; it++) {
        if (failed) continue;   /* this thread's scratch failed: its items stay unwritten, the call fails */
        const int64_t mc = it / np, p = it % np, m0 = mc * QO_MC, n0 = p * 64;
        const int64_t rows = J->M - m0 < QO_MC ? J->M - m0 : QO_MC, cols = J->N - n0 < 64 ? J->N - n0 : 64;
        const uint8_t *A = (const uint8_t *)J->q + m0 * J->Kp;
        if (qb && !J->direct) {   /* int8 rows as u8 codes, a chunk at a time into this thread's buffer (qi8_run) */
            if (mc != last_mc) u8_chunk(J, m0, rows, qb);
            last_mc = mc;
            A = qb;
        }
        int32_t *tmp = tile + QO_MC * 64;   /* the tile's second half: qo_rows' K-block scratch */
#if QI8_AMX
        if (J->direct) {   /* AMX on tiles K bytes wide (qa_narrow): 16-row blocks; the rows % 16 to VNNI */
            const int64_t full = rows / 16 * 16, K16 = 16 * J->Kp;
            const int8_t *Pp = P + p * kst * 256;
            const int32_t *init = CS + np * 64 + p * 64;
            const int fresh = mc != last_mc;   /* qb holds another chunk's rows */
            last_mc = mc;
            if (!J->ic) {   /* x's own rows; only the rows % 16 become u8 codes */
                qa_direct((const int8_t *)J->x + m0 * J->sx, J->sx, full / 16, Pp, cols, init, tile, 64);
                if (fresh && full < rows) u8_chunk(J, m0 + full, rows - full, qb + full * J->Kp);
            } else if (fresh) {
                /* im2col rows made a 16-row block ahead of the tiles: a tile load waits until the
                 * stores of the rows it reads have drained (made a whole chunk first, that wait was
                 * ~2/3 of qa_narrow_u8's time) */
                u8_chunk(J, m0, rows < 16 ? rows : 16, qb);
                for (int64_t b = 0; b < full / 16; b++) {
                    const int64_t nx = rows - (b + 1) * 16;
                    if (nx > 0) u8_chunk(J, m0 + (b + 1) * 16, nx < 16 ? nx : 16, qb + (b + 1) * K16);
                    qa_narrow_u8(qb + b * K16, J->Kp, 1, Pp, cols, init, tile + b * 16 * 64, 64);
                }
            } else {
                qa_narrow_u8(qb, J->Kp, full / 16, Pp, cols, init, tile, 64);
            }
            if (full < rows)
                qo_rows(qb + full * J->Kp, J->Kp, rows - full, Pp, k4n, CS + p * 64, tile + full * 64, 64, cols, tmp);
            rq_tile(J->rq, tile, rows, m0, n0, cols);
            continue;
        }
#endif
        if (J->rq) {   /* requantized from the L1/L2-resident tile: no int32 [M, N] round trip */
            const int64_t done = J->amx ? 0 : q_rq_rows(J, A, rows, P + p * kst * 256, k4n, CS + p * 64, m0, n0, cols);
            if (done < rows) {
                QO_ROWS(A + done * J->Kp, J->Kp, rows - done, P + p * kst * 256, k4n, CS + p * 64, tile, 64, cols, tmp);
                rq_tile(J->rq, tile, rows - done, m0 + done, n0, cols);
            }
            continue;
        }
        if (J->ydtype < 0) {
            QO_ROWS(A, J->Kp, rows, P + p * kst * 256, k4n, CS + p * 64, (int32_t *)J->y + m0 * J->N + n0, J->N,
                    cols, tmp);
            continue;
        }
        QO_ROWS(A, J->Kp, rows, P + p * kst * 256, k4n, CS + p * 64, tile, 64, cols, tmp);
        for (int64_t i = 0; i < rows; i++) {
            int64_t r[64];
            for (int64_t j = 0; j < cols; j++) r[j] = tile[i * 64 + j];
            finish(J, m0 + i, n0, cols, r, fbuf);
        }
    }
#undef QO_ROWS
#if QI8_AMX
    if (J->amx) qa_end();
#endif
}

/* the A16W8 broadcast GEMM (int16 x int8, VNNI, requantized: qi8_outer16): panels widened to
 * int16 pairs by all threads, then (row chunk, panel) items; each tile's exact int64 sums are
 * requantized by the int64 path (rq_put, mode 2) while in cache.  tile: QO_MC x 64 int64, blk:
 * QO_MC x 64 int32 (per thread) */
VNNI_TARGET static void outer16_gemm(const job_t *J, int8_t *P, int64_t *tile, int32_t *blk, const int failed) {
    const int64_t k2n = (J->K + 1) / 2, np = (J->N + 63) / 64, nmc = (J->M + QO_MC - 1) / QO_MC;
_Pragma("omp for schedule(static)")
    for (int64_t p = 0; p < np; p++)
        if (!failed) qo16_pack_panel(J->w, J->N, J->K, k2n, p * 64, P + p * k2n * 256);
_Pragma("omp for schedule(dynamic, 1)")
    for (int64_t it = 0; it < nmc * np; it++) {
        if (failed) continue;
        const int64_t mc = it / np, p = it % np, m0 = mc * QO_MC, n0 = p * 64;
        const int64_t rows = J->M - m0 < QO_MC ? J->M - m0 : QO_MC, cols = J->N - n0 < 64 ? J->N - n0 : 64;
        qo16_rows((const uint8_t *)J->q + m0 * J->Kp * 2, J->Kp * 2, rows, P + p * k2n * 256, k2n, tile, blk, cols);
        for (int64_t i = 0; i < rows; i++) rq_put(J->rq, (const char *)(tile + i * 64), 1, m0 + i, n0, cols, 0);
    }
}

#if QI8_AMX
/* A16W8 on the int8 AMX tiles (qi8_split16): an int16 code a = 256 hi + lo, hi = a >> 8 (signed
 * byte), lo = a & 255, so
 *     sum_k a w = 256 sum hi w + sum (lo - 128) w + 128 sum_k w,
 * and each half is an exact int8 GEMM of qa_rows (|sum| <= K 2^14 < 2^31): the u8 row buffer holds
 * lo then hi + 128 (split16_row), each Kp bytes, read as q + 128 -- qa_rows returns sum (lo - 128) w
 * and sum hi w -- and the third term is the panel's correction cs itself (128 x the column sums,
 * never folded for int16 rows).  Two TDPBUSD tiles per K step where VPDPWSSD took 16 instructions;
 * the int64 sums go through the int64 requantization (rq_put, mode 2), as outer16_gemm's.  P: int8
 * panels of Kp / 4 groups (J->packed or packed here), CS their corrections; t64: QO_MC x 64 int64;
 * s3: 3 x QO_MC x 64 int32 (lo, hi, qa_rows' VNNI scratch), per thread. */
VNNI_TARGET static void split16_gemm(const job_t *J, int8_t *P, int32_t *CS, int64_t *t64, int32_t *s3,
                                     const int failed) {
    const int64_t kp4 = J->Kp / 4, np = (J->N + 63) / 64, nmc = (J->M + QO_MC - 1) / QO_MC;
_Pragma("omp for schedule(static)")
    for (int64_t p = 0; p < np; p++) {
        if (failed) continue;
        if (J->packed) memcpy(CS + p * 64, J->packed + np * kp4 * 256 + p * 64 * 4, 64 * 4);
        else qo_pack_panel(J->w, J->N, J->K, kp4, p * 64, P + p * kp4 * 256, CS + p * 64);
    }
    int32_t *lo = s3, *hi = s3 + QO_MC * 64, *tmp = s3 + 2 * QO_MC * 64;
    qa_begin();
_Pragma("omp for schedule(dynamic, 1)")
    for (int64_t it = 0; it < nmc * np; it++) {
        if (failed) continue;
        const int64_t mc = it / np, p = it % np, m0 = mc * QO_MC, n0 = p * 64;
        const int64_t rows = J->M - m0 < QO_MC ? J->M - m0 : QO_MC, cols = J->N - n0 < 64 ? J->N - n0 : 64;
        const uint8_t *A = (const uint8_t *)J->q + m0 * 2 * J->Kp;
        const int8_t *Pp = P + p * kp4 * 256;
        const int32_t *cs = CS + p * 64;
        qa_rows(A, 2 * J->Kp, rows, Pp, kp4, cs, lo, 64, cols, tmp, NULL);
        qa_rows(A + J->Kp, 2 * J->Kp, rows, Pp, kp4, cs, hi, 64, cols, tmp, NULL);
        for (int64_t i = 0; i < rows; i++) {
#pragma omp simd
            for (int64_t j = 0; j < cols; j++)
                t64[i * 64 + j] = 256 * (int64_t)hi[i * 64 + j] + lo[i * 64 + j] + cs[j];
            rq_put(J->rq, (const char *)(t64 + i * 64), 1, m0 + i, n0, cols, 0);
        }
    }
    qa_end();
}

/* one int16 row as split16_gemm's two u8 halves: d[0, Kp) = lo, d[Kp, 2 Kp) = hi + 128 ((a >> 8) ^
 * 0x80); the padding past K (any bytes: 0 and 128 here) meets the panels' zero weights */
VNNI_TARGET static void split16_row(const int16_t *src, int64_t K, uint8_t *d, int64_t Kp) {
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int64_t k = 0; k < Kp; k += 32) {
        const int64_t n = K - k;
        const __mmask32 ms = n >= 32 ? ~(__mmask32)0 : n <= 0 ? 0 : ((__mmask32)1 << n) - 1;
        const __m512i a = _mm512_maskz_loadu_epi16(ms, src + k);
        _mm256_storeu_si256((__m256i *)(d + k), _mm512_cvtepi16_epi8(a));
        _mm256_storeu_si256((__m256i *)(d + Kp + k), _mm256_xor_si256(_mm512_cvtepi16_epi8(_mm512_srai_epi16(a, 8)), bias));
    }
}
#endif
#endif

#ifndef QI8_AMX
#define QI8_AMX 0   /* not an x86-64 VNNI build, or not Linux (qi8_amx.h) */
#endif
#if !QI8_AMX
int tsr_qi8_has_amx(void) { return 0; }
#endif

/* Does this call take the broadcast GEMM (packed panels), and on AMX tiles (*amx)?  VNNI: where
 * qo_wanted(M, K).  AMX (vnni_ok 1; vnni_ok 2 keeps VNNI even where AMX exists): from M = 40 at
 * any K > 128, the tiles' speed amortising the panel packing that VNNI does not below M = 96 at
 * K >= 2048 (Sapphire Rapids, 2 threads, int_mm: 1.33-1.36x at M = 49, K = 2304-4608, N = 512;
 * 1.44x at M = 64, K = N = 4096; but 0.93x at M = 32 and 0.61x at 17, where the weight's packing
 * and the rows % 16 left to VNNI dominate).  K <= 128 stays on VNNI: a tile step per row block is
 * all there is to amortise the tile loads and stores (0.74x at K = 64, level at 128) -- except a
 * requantized call (conv2d_int8, linear_int8_requant) at 48 < K <= 64, one tile step, where qa_k64
 * keeps B loaded and alternates two tile sets: 1.15-1.42x VNNI at K = 64 (M = 49 - 6272, N = 64 -
 * 384; Sapphire Rapids, one thread), 1.12x at K = 56, 1.04x at 48, 0.76-0.88x at K = 16-32 (the
 * tile's padding costs what a short VPDPBUSD loop does not) -- and any requantized call at K <=
 * 64 whose rows the tiles can read K bytes wide (qa_direct_ok): int8 x in place, K % 4 == 0, with
 * no u8 conversion pass (requantized 1x1 convs 1.07-1.50x VNNI at K = 24-64, MobileNetV2's
 * 32x112 -> 16 1.50x at batch 8 and 1.36x at batch 1; level, 1.01-1.04x, at K = 16), or a conv's
 * im2col rows (its 27-byte stem rows: 1.04-1.06x). */
static int qa_direct_ok(const job_t *J) {
    return J->rq && J->K <= 64 && (J->ic || (J->xkind == SRC_I8 && J->K % 4 == 0));
}

static int qi8_outer(const job_t *J, int vnni_ok, int *amx) {
    *amx = 0;
#if QI8_VNNI
    if (!J->vnni || J->bits != 8 || J->M <= 16) return 0;
    *amx = vnni_ok == 1 && (J->K > 128 || (J->rq && J->K > 48 && J->K <= 64) || qa_direct_ok(J)) && J->M >= 40 &&
           tsr_qi8_has_amx();
    return *amx || qo_wanted(J->M, J->K);
#else
    (void)J; (void)vnni_ok;
    return 0;
#endif
}

/* Does this call take the int16 broadcast GEMM (outer16_gemm)?  int16 x int8 requantized (A16W8
 * convs / linears) where the int8 one would (qo_wanted): the dot micro-kernels padded K to 64 and
 * reduced each output horizontally, 1/6 of this kernel's speed on MobileNetV2's pointwise layers. */
static int qi8_outer16(const job_t *J) {
#if QI8_VNNI
    return J->vnni && J->bits == 16 && J->rq && qo_wanted(J->M, J->K);
#else
    (void)J;
    return 0;
#endif
}

/* Does this int16 x int8 requantized call run as two int8 GEMMs on AMX tiles (split16_gemm)?  Where
 * the int8 rule would take AMX (qi8_outer: vnni_ok 1, K > 128, M >= 40), at any M there (the
 * VPDPWSSD broadcast kernel only where qo_wanted): ResNet-18 a16w8 at batch 1 from 23.5 to 13.8 ms (int8: 7.9).
 * Elsewhere (no AMX: Zen 4, or vnni_ok 2) outer16_gemm or the dot micro-kernels, as before. */
static int qi8_split16(const job_t *J, int vnni_ok) {
#if QI8_VNNI && QI8_AMX
    return J->vnni && J->bits == 16 && J->rq && vnni_ok == 1 && J->K > 128 && J->M >= 40 && tsr_qi8_has_amx();
#else
    (void)J; (void)vnni_ok;
    return 0;
#endif
}

/* ------------------------------------------------------------------ entry point */
static int qi8_run(job_t J, int vnni_ok, int nthreads);

int tsr_qi8_mm(const void *x, int64_t sx, int xkind, int bits, int64_t M, int64_t K, const int8_t *w, int64_t N,
               const float *wscale, const float *bias, int act, void *y, int ydtype, int vnni_ok, int nthreads) {
    if (M == 0 || N == 0) return TSR_OK;
    job_t J = {(const char *)x, sx, xkind, bits, vnni_ok && tsr_qi8_has_vnni(), M, K, (K + 63) & ~(int64_t)63, N,
               w, wscale, bias, act, (char *)y, ydtype, NULL, NULL, 0, 0, NULL, NULL};
    return qi8_run(J, vnni_ok, nthreads);
}

/* int_mm of integer a [M, K] (int8 / int16, row stride sx) by w [N, K], requantized into out
 * (int8 / int16 rows, row stride so): linear_int8_requant and conv2d_int8's GEMM + epilogue.  The
 * broadcast kernel requantizes each tile while it is in cache; the other paths write the exact
 * int32 / int64 accumulators to a scratch buffer first. */
static int mm_rq(const void *x, int64_t sx, int bits, int64_t M, int64_t K, const int8_t *w, int64_t N,
                 const int32_t *mult, const int32_t *shift, int64_t cs, const int64_t *off, int64_t zp, int64_t qmin,
                 int64_t qmax, int rounding, void *out, int64_t so, int out16, int vnni_ok, int nthreads,
                 const int8_t *packed, const struct ic_s *ic) {
    if (M == 0 || N == 0) return TSR_OK;
    /* |sum q w| <= K 2^14: with |off| below INT32_MAX - K 2^14 no int32 sum can overflow, so the
     * saturating int64 add of the contract equals the broadcast kernel's wrapping one */
    int fold = bits == 8 && off != NULL;
    for (int64_t n = 0; fold && n < N; n++) fold = off[n] >= -(INT32_MAX - K * 16384) && off[n] <= INT32_MAX - K * 16384;
    /* the tile then holds the whole accumulator, sum q w (+ off, folded) */
    const int f32 = bits == 8 && (fold || off == NULL) && rq_f_enabled();
    rq_t R = {mult, shift, cs, off, zp, qmin, qmax, rounding, (char *)out, so, out16, fold, f32};
    const int acc64 = bits == 16;
#ifdef TSR_AVX512
    rq64_t k64 = {NULL, NULL, NULL};
    if (acc64) {   /* |sum q w| <= K 2^22: an offset below INT64_MAX - K 2^22 cannot overflow the add */
        if (rq64_init(&k64, mult, shift, cs, N)) return TSR_ENOMEM;
        R.k64 = &k64;
        for (int64_t n = 0; off && n < N; n++)
            R.off_sat |= off[n] > INT64_MAX - K * ((int64_t)1 << 22) || off[n] < -(INT64_MAX - K * ((int64_t)1 << 22));
    }
#endif
    job_t J = {(const char *)x, sx, bits, bits, vnni_ok && tsr_qi8_has_vnni(), M, K, (K + 63) & ~(int64_t)63, N,
               w, NULL, NULL, 0, NULL, -1, NULL, NULL, 0, 0, &R,
               packed && !((uintptr_t)packed & 63) ? packed : NULL, ic};
    int amx, rc;
    if (ic && !qi8_outer(&J, vnni_ok, &amx)) return TSR_EINVAL;   /* before anything is written (int8: no k64) */
    if (qi8_outer(&J, vnni_ok, &amx) || qi8_outer16(&J) || qi8_split16(&J, vnni_ok)) {
        rc = qi8_run(J, vnni_ok, nthreads);
    } else {
        int own;
        char *acc = (char *)tsr_take(KS_ACC, (size_t)(M * N * (acc64 ? 8 : 4)), &own);
        rc = acc ? TSR_OK : TSR_ENOMEM;
        J.y = acc;
        J.rq = NULL;
        if (rc == TSR_OK) rc = qi8_run(J, vnni_ok, nthreads);
        if (rc == TSR_OK) {
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(static)
            for (int64_t m = 0; m < M; m++) rq_put(&R, acc + m * N * (acc64 ? 8 : 4), acc64, m, 0, N, 0);
        }
        tsr_give(acc, own);
    }
#ifdef TSR_AVX512
    if (acc64) rq64_free(&k64);
#endif
    return rc;
}

int tsr_qi8_mm_rq(const void *x, int64_t sx, int bits, int64_t M, int64_t K, const int8_t *w, int64_t N,
                  const int32_t *mult, const int32_t *shift, int64_t cs, const int64_t *off, int64_t zp, int64_t qmin,
                  int64_t qmax, int rounding, void *out, int64_t so, int out16, int vnni_ok, int nthreads,
                  const int8_t *packed) {
    return mm_rq(x, sx, bits, M, K, w, N, mult, shift, cs, off, zp, qmin, qmax, rounding, out, so, out16, vnni_ok,
                 nthreads, packed, NULL);
}

/* tsr_qi8_mm_rq of a conv's im2col rows without the matrix (qi8_im2col.h): int8 x channels-last
 * (element (n, c, h, w) at n sn + h sh + w sw + c, sw >= C), one group, weight w [N, kh kw C] in
 * (ky, kx, c) column order, rows [Nb Ho Wo] of out.  TSR_EINVAL, with nothing written, where the
 * call would not take the broadcast GEMM (no VNNI, M <= 16, ...): the caller then gathers the
 * matrix (tsr_im2col) and calls tsr_qi8_mm_rq. */
int tsr_qi8_conv_rq(const int8_t *x, int64_t Nb, int64_t C, int64_t H, int64_t W, int64_t sn, int64_t sh, int64_t sw,
                    int64_t kh, int64_t kw, int64_t st_h, int64_t st_w, int64_t pd_h, int64_t pd_w, int64_t dl_h,
                    int64_t dl_w, int64_t Ho, int64_t Wo, int64_t x_zp, const int8_t *w, int64_t N,
                    const int32_t *mult, const int32_t *shift, int64_t cs, const int64_t *off, int64_t zp,
                    int64_t qmin, int64_t qmax, int rounding, void *out, int64_t so, int vnni_ok, int nthreads,
                    const int8_t *packed) {
#if QI8_VNNI
    if (C <= 0 || kh <= 0 || kw <= 0 || sw < C || x_zp < -128 || x_zp > 127) return TSR_EINVAL;
    ic_t ic = {x, C, H, W, sn, sh, sw, kh, kw, st_h, st_w, pd_h, pd_w, dl_h, dl_w, Ho, Wo,
               (uint8_t)((uint8_t)(int8_t)x_zp ^ 0x80u)};
    ic_four_init(&ic);
    const int64_t K = kh * kw * C;
    return mm_rq(NULL, K, 8, Nb * Ho * Wo, K, w, N, mult, shift, cs, off, zp, qmin, qmax, rounding, out, so, 0,
                 vnni_ok, nthreads, packed, &ic);
#else
    (void)x; (void)Nb; (void)C; (void)H; (void)W; (void)sn; (void)sh; (void)sw; (void)kh; (void)kw; (void)st_h;
    (void)st_w; (void)pd_h; (void)pd_w; (void)dl_h; (void)dl_w; (void)Ho; (void)Wo; (void)x_zp; (void)w; (void)N;
    (void)mult; (void)shift; (void)cs; (void)off; (void)zp; (void)qmin; (void)qmax; (void)rounding; (void)out;
    (void)so; (void)vnni_ok; (void)nthreads; (void)packed;
    return TSR_EINVAL;
#endif
}

static int qi8_run(job_t J, int vnni_ok, int nthreads) {
    const int64_t M = J.M, K = J.K, N = J.N;
    const int bits = J.bits, xkind = J.xkind;
    const int es = bits == 8 ? 1 : 2;
    /* the broadcast kernel's packed panels (qi8_outer_avx512.h) */
    const int outer = qi8_outer(&J, vnni_ok, &J.amx);
    const int split16 = !outer && qi8_split16(&J, vnni_ok);
    const int outer16 = !outer && !split16 && qi8_outer16(&J);
    if (split16) J.amx = 1;   /* the int8 AMX layout: Kp / 4 groups a panel */
    /* its VNNI rows are read 4 bytes at a time, ceil(K / 4) groups: the buffer can keep x's own
     * row length K (a pointwise conv's K = 16 - 32 had the copy write 2 - 4x its bytes at 64, and
     * contiguous rows copy in one flat pass).  The up to 3 bytes read past a row's K meet the
     * panel's zero weights (qo_pack_panel), and the buffer has 64 bytes of slack after the last
     * row.  The dot micro-kernels and the AMX tiles read whole 64-byte rows: Kp stays 64k there.
     * A conv's own rows of K <= 32 are 32 bytes apart (qi8_im2col.h ic_fours: two rows a store). */
    if ((outer && !J.amx) || outer16) J.Kp = J.ic && K <= 32 ? 32 : K;
    /* int16 rows for the int16 broadcast kernel need no conversion (VPDPWSSD is signed x signed):
     * contiguous rows of an even K (its int16 pairs end within the row) are read in place -- the
     * copy was ~10 % of an a16w8 ResNet-18 */
    const int in_place = outer16 && xkind == SRC_I16 && J.sx == K && K % 2 == 0;
    /* split16: per row, lo then hi + 128 as u8, Kp bytes each (split16_row) -- the same bytes as an int16 row */
    /* int8 rows for the broadcast kernel: converted a row chunk at a time (outer_gemm's qb, per
     * thread, L1 / L2-resident) rather than in one pass over all of x before it -- at batch 8 that
     * pass wrote and re-read MiBs (MobileNetV2's 32x112 -> 16 at batch 8: 1.25x fp32 F.conv2d
     * before, 1.79x after) */
    const int per_chunk = outer && bits == 8 && xkind == SRC_I8 && J.vnni;
    if (J.ic && !per_chunk) return TSR_EINVAL;   /* im2col rows exist only chunk by chunk (u8_chunk) */
    J.direct = per_chunk && J.amx && qa_direct_ok(&J);
    int own_q = 0, own_xs, own_p = 0, own_cs = 0;   /* kept scratch (tsr_take) or freed here */
    char *qbuf = in_place || per_chunk ? NULL : (char *)tsr_take(KS_QBUF, (size_t)(M * J.Kp * es + 64), &own_q);
    J.q = in_place ? (char *)J.x : qbuf;
    J.xs = (float *)tsr_take(KS_XS, (size_t)M * 4, &own_xs);
    if ((!J.q && !per_chunk) || !J.xs) { tsr_give(qbuf, own_q); tsr_give(J.xs, own_xs); return TSR_ENOMEM; }
#if QI8_ARM
    J.arm = qi8_arm_level(vnni_ok, bits);
#endif
    const int T = tsr_threads(nthreads);
#if QI8_VNNI
    const int64_t tile_rows = outer || outer16 || split16 ? QO_MC : MB;
#else
    const int64_t tile_rows = MB;
#endif
    const int64_t k4n = QO_GROUPS(&J), np = (N + 63) / 64;
    const int int8p = outer || split16;   /* int8 panels (qo_pack_panel) and their corrections */
    if (!int8p) J.packed = NULL;
    int8_t *P = int8p && J.packed ? (int8_t *)J.packed
              : int8p ? (int8_t *)tsr_take(KS_P, (size_t)(np * k4n * 256), &own_p)
              : outer16 ? (int8_t *)tsr_take(KS_P, (size_t)(np * ((K + 1) / 2) * 256), &own_p) : NULL;
    /* the corrections, then (AMX) their negations: qa_k64's C tiles start from them */
    int32_t *CS = int8p ? (int32_t *)tsr_take(KS_CS, (size_t)(np * 128 * 4), &own_cs) : NULL;
    if ((int8p && (!P || !CS)) || (outer16 && !P)) {
        if (!J.packed) tsr_give(P, own_p);
        tsr_give(CS, own_cs); tsr_give(qbuf, own_q); tsr_give(J.xs, own_xs);
        return TSR_ENOMEM;
    }
    int failed = 0;
    /* prep_row's call and loop set-up cost ~10 ns a row: 1/6 of a K = 16 GEMM + requantization */
    const int u8rows = bits == 8 && xkind == SRC_I8 && J.vnni && !per_chunk;
    const int64_t u8ch = K >= 4096 ? 1 : 4096 / K;   /* rows a chunk of the up-front pass: ~4 KiB */
    TSR_TEAM(T, reduction(| : failed), {
        int own_b = 0, own_f, own_t, own_k = 0, own_qb = 0;   /* this thread's kept scratch (tsr_take) */
        float *buf = xkind < SRC_I8 ? (float *)tsr_take(KS_BUF, (size_t)K * 4, &own_b) : NULL;
        float *fbuf = (float *)tsr_take(KS_FBUF, NP * 4, &own_f);
        int64_t *tile = (int64_t *)tsr_take(KS_TILE, (size_t)tile_rows * NP * sizeof(int64_t), &own_t);
        /* outer16: one int32 block; split16: three (lo, hi, qa_rows' scratch) */
        int32_t *blk16 = outer16 || split16
            ? (int32_t *)tsr_take(KS_BLK, (size_t)(split16 ? 3 : 1) * tile_rows * NP * sizeof(int32_t), &own_k) : NULL;
        if ((outer16 || split16) && !blk16) failed = 1;
        if ((xkind < SRC_I8 && !buf) || !fbuf || !tile) failed = 1;
#if QI8_VNNI
        uint8_t *qb = per_chunk ? (uint8_t *)tsr_take(KS_QB, (size_t)(QO_MC * J.Kp + 64), &own_qb) : NULL;
#else
        uint8_t *qb = NULL;   /* per_chunk is the broadcast kernel's, x86 only */
#endif
        if (per_chunk && !qb) failed = 1;
        if (u8rows) {   /* prep_row's u8 codes, padding 128 (q 0), inline: chunks of rows */
_Pragma("omp for schedule(static)")
            for (int64_t m0 = 0; m0 < M; m0 += u8ch)
                u8_chunk(&J, m0, M - m0 < u8ch ? M - m0 : u8ch, (uint8_t *)J.q + m0 * J.Kp);
        } else if (split16) {
#if QI8_VNNI && QI8_AMX
_Pragma("omp for schedule(static)")
            for (int64_t i = 0; i < M; i++)
                split16_row((const int16_t *)J.x + i * J.sx, K, (uint8_t *)J.q + i * 2 * J.Kp, J.Kp);
#endif
        } else if (!in_place && !per_chunk) {
_Pragma("omp for schedule(static)")
            for (int64_t i = 0; i < M; i++)
                if (!failed) prep_row(&J, i, buf);
        }
        /* the implicit barrier: every row is ready */
        if (outer) {
#if QI8_VNNI
            outer_gemm(&J, P, CS, (int32_t *)tile, fbuf, qb, failed);
#endif
        } else if (outer16) {
#if QI8_VNNI
            outer16_gemm(&J, P, tile, blk16, failed);
#endif
        } else if (split16) {
#if QI8_VNNI && QI8_AMX
            split16_gemm(&J, P, CS, tile, blk16, failed);
#endif
        } else if (M <= 16) {
            /* chunks of 16 weight blocks (64 rows: K x 64 contiguous bytes), handed out
             * dynamically: a thread that loses its core on a shared machine does not hold
             * the others back at the end */
            const int64_t nblk = (N + NB - 1) / NB, CHB = 16;
_Pragma("omp for schedule(dynamic, 1)")
            for (int64_t c = 0; c < (nblk + CHB - 1) / CHB; c++)
                if (!failed) gemv_range(&J, c * CHB, (c + 1) * CHB < nblk ? (c + 1) * CHB : nblk);
        } else {
_Pragma("omp for schedule(dynamic, 1)")
            for (int64_t p = 0; p < (N + NP - 1) / NP; p++)
                if (!failed) gemm_panel(&J, p, tile, fbuf);
        }
        tsr_give(buf, own_b); tsr_give(fbuf, own_f); tsr_give(tile, own_t); tsr_give(blk16, own_k);
        tsr_give(qb, own_qb);
    });
    tsr_give(qbuf, own_q); tsr_give(J.xs, own_xs); tsr_give(CS, own_cs);
    if (!J.packed) tsr_give(P, own_p);
    return failed ? TSR_ENOMEM : TSR_OK;
}

/* The broadcast GEMM's weight panels, packed once by the caller for a weight used call after call
 * (a conv layer's): tsr_qi8_pack_bytes(N, K) bytes (0 where this build or CPU has no VNNI kernel,
 * or past 2 GiB: nothing to cache), the np = ceil(N / 64) panels of Kp / 4 4-byte groups (qo_pack_panel;
 * zero past K: the AMX tiles read all Kp / 4, the VNNI kernel the first ceil(K / 4) at that stride),
 * then np x 64 int32 column sums (x 128).  tsr_qi8_mm_rq reads them in place of packing per call
 * (~3 us of a 45 us MobileNetV2 pointwise layer, more at larger K x N); the caller keeps the buffer
 * 64-byte aligned and rebuilds it when the weight changes (ops/_requant/cpu.py: per_tensor). */
int tsr_qi8_pack_bytes(int64_t N, int64_t K) {
#if QI8_VNNI
    if (!tsr_qi8_has_vnni() || N <= 0 || K <= 0) return 0;
    const int64_t np = (N + 63) / 64, n = np * (((K + 63) & ~(int64_t)63) / 4) * 256 + np * 64 * 4;
    return n <= INT32_MAX ? (int)n : 0;   /* beyond 2 GiB: packed per call */
#else
    (void)N; (void)K;
    return 0;
#endif
}

int tsr_qi8_pack(const int8_t *w, int64_t N, int64_t K, int8_t *buf) {
#if QI8_VNNI
    if (!tsr_qi8_pack_bytes(N, K) || ((uintptr_t)buf & 63)) return TSR_EINVAL;
    const int64_t np = (N + 63) / 64, kp4 = ((K + 63) & ~(int64_t)63) / 4;   /* zero groups past K */
    for (int64_t p = 0; p < np; p++)
        qo_pack_panel(w, N, K, kp4, p * 64, buf + p * kp4 * 256, (int32_t *)(buf + np * kp4 * 256) + p * 64);
    return TSR_OK;
#else
    (void)w; (void)N; (void)K; (void)buf;
    return TSR_EINVAL;
#endif
}
