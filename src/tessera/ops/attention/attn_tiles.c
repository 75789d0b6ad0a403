/* attn_tiles.c -- fp32 tile building blocks shared by attention_fwd.c and attention_bwd.c.
 *
 * tsr_attn_mm: C (+)= A . B for small row-major fp32 tiles (M, K <= 256, N a multiple of 16),
 * register-blocked: MR = 4 rows of A broadcast against NV <= 4 vectors of 16 columns of B,
 * 16 accumulators (zmm with AVX-512, plus 4 B loads and 1 broadcast: 21 of 32 registers).
 * Every tile product of attention is of this form: QK^T uses a packed K^T (D x BN), PV the
 * packed V (BN x D), and the backward's transposed products a packed Q^T / dO^T.  The same
 * source builds for every ISA level: GCC vector extensions (64-byte vectors) become zmm FMAs
 * with AVX-512 and pairs/quads of ymm/xmm (or NEON) registers elsewhere.
 *
 * Row helpers (softmax pieces on 16-aligned rows) use the AVX-512 exp of tessera_avx512.h
 * (polynomial + vscalefps, exact 2^k, underflow to 0) where available, else the portable
 * branch-free tsr_expf in a vectorisable loop.  Exponents are clamped at -20000 so masked
 * (-inf) scores give exactly 0 and never NaN.
 */
#include "tessera_avx512.h"

typedef float v16 __attribute__((vector_size(64), aligned(64)));
#define AI static inline __attribute__((always_inline))

AI void mk(const int mr, const int nv, int64_t K, const float *restrict A, int64_t lda, int64_t sak,
           const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc, int acc) {
    v16 c[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++)
            if (r < mr && x < nv) c[r][x] = acc ? *(const v16 *)(C + r * ldc + 16 * x) : (v16){0};
    for (int64_t k = 0; k < K; k++) {
        v16 b[4];
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++)
            if (x < nv) b[x] = *(const v16 *)(B + k * ldb + 16 * x);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r < mr) {
                const float a = A[r * lda + k * sak];
#pragma GCC unroll 4
                for (int x = 0; x < 4; x++)
                    if (x < nv) c[r][x] += a * b[x];
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++)
            if (r < mr && x < nv) *(v16 *)(C + r * ldc + 16 * x) = c[r][x];
}

#define MK_CASE(MR, NV) \
    case MR * 8 + NV: mk(MR, NV, K, A + i * lda, lda, sak, B + j, ldb, C + i * ldc + j, ldc, acc); break;
#define MK_ROW(MR) MK_CASE(MR, 1) MK_CASE(MR, 2) MK_CASE(MR, 3) MK_CASE(MR, 4)

/* C[M x N] (+)= A[M x K] . B[K x N]; B, C 64-byte aligned with ldb, ldc multiples of 16; N % 16 == 0.
 * A(r, k) is read at A[r * lda + k * sak] (broadcast loads): sak = 1 row-major, or lda = 1 for the
 * transpose of a row-major tile (P^T, dS^T in the backward) without copying it. */
void tsr_attn_mm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, int64_t sak, const float *B,
                 int64_t ldb, float *C, int64_t ldc, int acc) {
    for (int64_t i = 0; i < M; i += 4) {
        const int mr = M - i < 4 ? (int)(M - i) : 4;
        for (int64_t j = 0; j < N; j += 64) {
            const int nv = N - j >= 64 ? 4 : (int)((N - j) / 16);
            switch (mr * 8 + nv) {
                MK_ROW(4) MK_ROW(3) MK_ROW(2) MK_ROW(1)
                default: break;
            }
        }
    }
}

/* e^x for x <= 0 (any larger x is fine too up to ~80), -inf -> 0, on n (multiple of 16) floats. */
AI void exp_inplace(float *restrict s, int64_t n) {
#ifdef TSR_AVX512
    for (int64_t c = 0; c < n; c += 16) {
        __m512 x = _mm512_max_ps(_mm512_load_ps(s + c), _mm512_set1_ps(-20000.0f));
        _mm512_store_ps(s + c, tsr_v_exp_nonpos(x));
    }
#else
#pragma omp simd
    for (int64_t c = 0; c < n; c++) s[c] = tsr_expf(s[c]);
#endif
}

/* softcap * tanh(x / softcap), x = scale * s; dcap = 1 - t^2 (the cap's derivative).  tanh as in
 * Cephes tanhf (~2 ulp): |y| < 0.625: y + y z P(z), z = y^2; else (1 - e) / (1 + e), e = exp(-2|y|). */
void tsr_attn_scores(float *restrict s, int64_t n, float scale, float softcap, float *restrict dcap) {
    if (softcap <= 0.0f) {
#pragma omp simd
        for (int64_t c = 0; c < n; c++) s[c] *= scale;
        return;
    }
    const float k = scale / softcap;
    float e[256] __attribute__((aligned(64)));
#pragma omp simd
    for (int64_t c = 0; c < n; c++) e[c] = -2.0f * fabsf(s[c] * k);
    exp_inplace(e, n);
#pragma omp simd
    for (int64_t c = 0; c < n; c++) {
        const float y = s[c] * k, a = fabsf(y), z = y * y;
        float p = -5.70498872745e-3f;
        p = p * z + 2.06390887954e-2f;
        p = p * z - 5.37397155531e-2f;
        p = p * z + 1.33314422036e-1f;
        p = p * z - 3.33332819422e-1f;
        const float small = y + y * z * p;
        float big = (1.0f - e[c]) / (1.0f + e[c]);
        big = y < 0.0f ? -big : big;
        const float t = a < 0.625f ? small : big;
        s[c] = softcap * t;
        if (dcap) dcap[c] = 1.0f - t * t;
    }
}

/* s[c] = exp(s[c] - m) (masked -inf -> 0); returns the sum. */
float tsr_attn_exp_sum(float *restrict s, int64_t n, float m) {
#pragma omp simd
    for (int64_t c = 0; c < n; c++) s[c] -= m;
    exp_inplace(s, n);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < n; c++) sum += s[c];
    return sum;
}

/* s[c] = exp(s[c] - sub[c]) with a per-column shift (sub = +inf gives 0). */
void tsr_attn_exp_cols(float *restrict s, int64_t n, const float *restrict sub) {
#pragma omp simd
    for (int64_t c = 0; c < n; c++) s[c] -= sub[c];
    exp_inplace(s, n);
}

/* dS = P * (dP - d) [* dcap] * scale, with a scalar d (row) or a per-column d (dcol). */
void tsr_attn_ds(float *restrict ds, const float *restrict p, int64_t n, float d, const float *restrict dcol,
                 const float *restrict dcap, float scale) {
    if (dcol) {
#pragma omp simd
        for (int64_t c = 0; c < n; c++) ds[c] = p[c] * (ds[c] - dcol[c]) * scale;
    } else {
#pragma omp simd
        for (int64_t c = 0; c < n; c++) ds[c] = p[c] * (ds[c] - d) * scale;
    }
    if (dcap) {
#pragma omp simd
        for (int64_t c = 0; c < n; c++) ds[c] *= dcap[c];
    }
}

/* rows [0, nrows) of a (tokens, heads, D) tensor (head base `src`, token stride st elements) into
 * dst (rows x ld fp32, columns D..ld zeroed); rows [nrows, pad_rows) zeroed. */
void tsr_attn_load_rows(float *restrict dst, int64_t ld, const char *src, int64_t st, int64_t nrows,
                        int64_t pad_rows, int64_t D, int dtype) {
    const int64_t es = tsr_elsize(dtype);
    for (int64_t r = 0; r < nrows; r++) {
        tsr_load_f32(dst + r * ld, src + r * st * es, D, dtype);
        for (int64_t d = D; d < ld; d++) dst[r * ld + d] = 0.0f;
    }
    for (int64_t r = nrows; r < pad_rows; r++) memset(dst + r * ld, 0, (size_t)ld * 4);
}

/* the same rows transposed: dst[d * ld + r] (D x ld), columns [nrows, ld) zeroed. */
void tsr_attn_load_t(float *restrict dst, int64_t ld, const char *src, int64_t st, int64_t nrows, int64_t D,
                     int dtype) {
    const int64_t es = tsr_elsize(dtype);
    float row[256];
    for (int64_t r = 0; r < nrows; r++) {
        tsr_load_f32(row, src + r * st * es, D, dtype);
        for (int64_t d = 0; d < D; d++) dst[d * ld + r] = row[d];
    }
    for (int64_t d = 0; d < D; d++)
        for (int64_t r = nrows; r < ld; r++) dst[d * ld + r] = 0.0f;
}

/* row max over [lo, hi) */
float tsr_attn_max(const float *s, int64_t lo, int64_t hi) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t c = lo; c < hi; c++) m = s[c] > m ? s[c] : m;
    return m;
}

/* ------------------------------------------------------------------ bf16 score products
 * For bf16 storage the score-type products (Q K^T, dO V^T and their transposes) take their operands
 * as stored: pairs of bf16 along head_dim are one 32-bit word, and VDPBF16PS (AVX512_BF16) adds
 * both products of a pair into an fp32 accumulator -- half the instructions of fp32 FMAs, on
 * exactly the same (exact) bf16 inputs.  Compiled at the avx512 level with a target attribute and
 * used only where the CPU reports avx512bf16 (tsr_attn_bf16dp); everything else uses fp32 tiles.
 * (The instruction treats bf16/fp32 denormals as zero.) */
int tsr_attn_bf16dp(int dtype) {
#if defined(TSR_AVX512) && defined(__GNUC__) && !defined(__clang__)
    return dtype == TSR_BF16 && __builtin_cpu_supports("avx512bf16");
#else
    (void)dtype;
    return 0;
#endif
}

#if defined(TSR_AVX512) && defined(__GNUC__) && !defined(__clang__)
#define BF16_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq")))
BF16_TARGET static inline __attribute__((always_inline)) void mkb(const int mr, const int nv, int64_t K2,
        const uint32_t *restrict A, int64_t lda, const uint32_t *restrict B, int64_t ldb, float *restrict C,
        int64_t ldc) {
    __m512 c[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++) c[r][x] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < K2; kk++) {
        __m512bh b[4];
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++)
            if (x < nv) b[x] = (__m512bh)_mm512_load_si512((const void *)(B + kk * ldb + 16 * x));
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r < mr) {
                const __m512bh a = (__m512bh)_mm512_set1_epi32((int)A[r * lda + kk]);
#pragma GCC unroll 4
                for (int x = 0; x < 4; x++)
                    if (x < nv) c[r][x] = _mm512_dpbf16_ps(c[r][x], a, b[x]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++)
            if (r < mr && x < nv) _mm512_store_ps(C + r * ldc + 16 * x, c[r][x]);
}

#define MKB_CASE(MR, NV) case MR * 8 + NV: mkb(MR, NV, K2, A + i * lda, lda, B + j, ldb, C + i * ldc + j, ldc); break;
#define MKB_ROW(MR) MKB_CASE(MR, 1) MKB_CASE(MR, 2) MKB_CASE(MR, 3) MKB_CASE(MR, 4)

BF16_TARGET static void mm_bf16(int64_t M, int64_t N, int64_t K2, const uint32_t *A, int64_t lda,
                                const uint32_t *B, int64_t ldb, float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i += 4) {
        const int mr = M - i < 4 ? (int)(M - i) : 4;
        for (int64_t j = 0; j < N; j += 64) {
            const int nv = N - j >= 64 ? 4 : (int)((N - j) / 16);
            switch (mr * 8 + nv) {
                MKB_ROW(4) MKB_ROW(3) MKB_ROW(2) MKB_ROW(1)
                default: break;
            }
        }
    }
}

BF16_TARGET static float dot_bf16_impl(const uint16_t *a, const uint16_t *b, int64_t D) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 2) {
        uint32_t wa = a[d], wb = b[d];
        if (d + 1 < D) { wa |= (uint32_t)a[d + 1] << 16; wb |= (uint32_t)b[d + 1] << 16; }
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)wa), (__m512bh)_mm512_set1_epi32((int)wb));
    }
    return _mm512_cvtss_f32(acc);
}
#endif

/* C[M x N] = A[M x D] . B[D x N] for score operands packed by tsr_attn_pack_rows / tsr_attn_pack_t. */
void tsr_attn_smm(int64_t M, int64_t N, int64_t D, const float *A, int64_t lda, const float *B, int64_t ldb,
                  float *C, int64_t ldc, int bfdp) {
#if defined(TSR_AVX512) && defined(__GNUC__) && !defined(__clang__)
    if (bfdp) { mm_bf16(M, N, (D + 1) / 2, (const uint32_t *)A, lda, (const uint32_t *)B, ldb, C, ldc); return; }
#endif
    (void)bfdp;
    tsr_attn_mm(M, N, D, A, lda, 1, B, ldb, C, ldc, 0);
}

/* score operand rows: fp32 rows (tsr_attn_load_rows), or with bfdp the raw bf16 pairs (odd D padded). */
void tsr_attn_pack_rows(float *dst, int64_t ld, const char *src, int64_t st, int64_t nrows, int64_t pad_rows,
                        int64_t D, int dtype, int bfdp) {
    if (!bfdp) { tsr_attn_load_rows(dst, ld, src, st, nrows, pad_rows, D, dtype); return; }
    for (int64_t r = 0; r < pad_rows; r++) {
        uint16_t *d = (uint16_t *)(dst + r * ld);
        if (r < nrows) memcpy(d, src + r * st * 2, (size_t)D * 2);
        else memset(d, 0, (size_t)D * 2);
        if (D & 1) d[D] = 0;
    }
}

/* score operand transposed (D x ld): fp32 (tsr_attn_load_t), or with bfdp words of bf16 pairs
 * dst[p * ld + r] = (x[r][2p], x[r][2p+1]); columns [nrows, ld) zeroed. */
void tsr_attn_pack_t(float *dst, int64_t ld, const char *src, int64_t st, int64_t nrows, int64_t D, int dtype,
                     int bfdp) {
    if (!bfdp) { tsr_attn_load_t(dst, ld, src, st, nrows, D, dtype); return; }
    const int64_t D2 = (D + 1) / 2;
    uint32_t *w = (uint32_t *)dst, row[128];
    for (int64_t r = 0; r < nrows; r++) {
        row[D2 - 1] = 0;
        memcpy(row, src + r * st * 2, (size_t)D * 2);
        for (int64_t p = 0; p < D2; p++) w[p * ld + r] = row[p];
    }
    for (int64_t p = 0; p < D2; p++)
        for (int64_t r = nrows; r < ld; r++) w[p * ld + r] = 0;
}

/* <a, b> over D bf16 values with the same VDPBF16PS chain (pair by pair, a broadcast as in
 * tsr_attn_smm) that the dP = dO V^T product uses, so D_i = <dO_i, O_i> equals dP_ij bit for bit
 * when O_i == v_j (one-hot rows give dS = 0 exactly, as in the reference). */
float tsr_attn_dot_bf16(const uint16_t *a, const uint16_t *b, int64_t D) {
#if defined(TSR_AVX512) && defined(__GNUC__) && !defined(__clang__)
    return dot_bf16_impl(a, b, D);
#else
    float s = 0.0f;
    for (int64_t d = 0; d < D; d++) s += tsr_bf2f(a[d]) * tsr_bf2f(b[d]);
    return s;
#endif
}

/* One online-softmax row step of the forward (no softcap): s = scale * s on [clo, chi), -inf
 * elsewhere; mnew = max(m_old, max s); s = exp(s - mnew); returns sum s.  Two passes over the
 * row instead of the generic five (scores, mask, max, shift + exp, sum). */
float tsr_attn_row_step(float *restrict s, int64_t np, float scale, int64_t clo, int64_t chi, float mold,
                        float *restrict mnew_out) {
#ifdef TSR_AVX512
    __m512 vmax = _mm512_set1_ps(mold);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 ninf = _mm512_set1_ps(-INFINITY), vs = _mm512_set1_ps(scale);
    for (int64_t c = 0; c < np; c += 16) {
        const __m512i idx = _mm512_add_epi32(lane, _mm512_set1_epi32((int)c));
        const __mmask16 ok = _mm512_cmpge_epi32_mask(idx, _mm512_set1_epi32((int)clo)) &
                             _mm512_cmplt_epi32_mask(idx, _mm512_set1_epi32((int)chi));
        const __m512 x = _mm512_mask_mul_ps(ninf, ok, _mm512_load_ps(s + c), vs);
        _mm512_store_ps(s + c, x);
        vmax = _mm512_max_ps(vmax, x);
    }
    const float mnew = _mm512_reduce_max_ps(vmax);
    const __m512 vm = _mm512_set1_ps(mnew), lo = _mm512_set1_ps(-20000.0f);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t c = 0; c < np; c += 16) {
        const __m512 p = tsr_v_exp_nonpos(_mm512_max_ps(_mm512_sub_ps(_mm512_load_ps(s + c), vm), lo));
        _mm512_store_ps(s + c, p);
        vsum = _mm512_add_ps(vsum, p);
    }
    *mnew_out = mnew;
    return _mm512_reduce_add_ps(vsum);
#else
    tsr_attn_scores(s, np, scale, 0.0f, NULL);
    for (int64_t c = 0; c < clo; c++) s[c] = -INFINITY;
    for (int64_t c = chi; c < np; c++) s[c] = -INFINITY;
    const float mx = tsr_attn_max(s, clo, chi), mnew = mold > mx ? mold : mx;
    *mnew_out = mnew;
    return tsr_attn_exp_sum(s, np, mnew);
#endif
}
