/* linear_fp8.c -- y = act(x @ (weight * weight_scale).T + bias) with fp8 weights and x
 * quantised to e4m3 on the fly (see ops/linear_fp8/__init__.py for the contract).
 *
 * 1. x rows are quantised with the integer contract (tessera_quant.h rules: fp32 absmax, scale
 *    = max(amax, 1e-12) / 448, true division, NaN -> 0, saturate, round to nearest even),
 *    per token or per (token, 128-wide K block), into zero-padded rows of KP = K rounded up to
 *    32 values: bf16 bit patterns (every e4m3 value is exactly a bf16) or fp32.
 * 2. Weight rows are decoded from their fp8 bytes, exactly, through a 128-entry magnitude
 *    table (subnormals, e5m2 inf and NaN codes included) plus the sign bit.
 * 3. bf16 path (avx512 build on a CPU with AVX512_BF16): VDPBF16PS adds the two exact
 *    products of a bf16 pair to an fp32 lane; 4 weight rows x up to 4 tokens per register
 *    tile.  Decode (M <= 4, or <= 2 for block weights): each 32-byte weight chunk is decoded
 *    in registers right before use, so the 1-byte weight streams once from memory.  Larger M
 *    (GEMM): a group of 4 weight rows is decoded once into a per-thread bf16 buffer and reused
 *    by every token tile.  fp32 path (every other build / CPU): the same loops with fp32
 *    operands and fma.
 * 4. Epilogue in fp32: y = acc * (sx * sw) + bias (block weights: sum_b acc_b * (sx_b * sw_b),
 *    the 16 lanes of a block's partial sums scaled lane-wise before the final horizontal
 *    sum), then the activation, stored in x's dtype.
 *
 * Work is split over OpenMP threads by (token tile of 256 rows, group of 4 weight rows).
 */
#include "tessera_quant.h"

#define AI static inline __attribute__((always_inline))
#define NRG 4      /* weight rows per group */
#define MB 256     /* token rows per task */
#define QB 128     /* K block of block-scaled weights */

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU = 2, ACT_GELU_TANH = 3, ACT_SILU = 4 };
enum { SK_TENSOR = 0, SK_ROW = 1, SK_BLOCK = 2 };

static inline float act_f(float v, int act) {
    switch (act) {
    case ACT_RELU: return v < 0.0f ? 0.0f : v;
    case ACT_GELU: return 0.5f * v * (1.0f + tsr_erff(v * 0.70710678118654752f));
    case ACT_GELU_TANH: {  /* 0.5 v (1 + tanh(u)) = v * sigmoid(2u) */
        const float u = 0.79788456080286536f * (v + 0.044715f * v * v * v);
        return v * tsr_sigmoidf(2.0f * u);
    }
    case ACT_SILU: return v * tsr_sigmoidf(v);
    default: return v;
    }
}

/* q (already x / scale) rounded to the e4m3 grid, as an fp32 value: identical to
 * tsr_e4m3_to_f32(tsr_f32_to_e4m3(q)), written branch-free so the row loop vectorises. */
static inline float e4m3_grid(float q) {
    q = tsr_nan0(q);
    q = q < -448.0f ? -448.0f : (q > 448.0f ? 448.0f : q);
    const float a = fabsf(q);
    const uint32_t u = tsr_bits(a);
    const float rn = tsr_float((u + 0x7ffffu + ((u >> 20) & 1u)) & 0xfff00000u);
    const float rs = rintf(a * 512.0f) * 0.001953125f;
    return copysignf(a < 0.015625f ? rs : rn, q);
}

/* Quantise one x row (K values of dtype) into KP values (bf16 bits or fp32), zero padded,
 * with one scale per kb-wide block. */
static void quant_row(const void *xr, int dtype, int64_t K, int64_t KP, int64_t kb, float *tmp, void *q,
                      int bf, float *s) {
    tsr_load_f32(tmp, xr, K, dtype);
    for (int64_t k0 = 0, b = 0; k0 < K; k0 += kb, b++) {
        const int64_t k1 = k0 + kb < K ? k0 + kb : K;
        const float sc = tsr_scale_for(tsr_absmax(tmp + k0, k1 - k0), 448.0f);
        s[b] = sc;
#pragma omp simd
        for (int64_t k = k0; k < k1; k++) tmp[k] = e4m3_grid(tmp[k] / sc);
    }
    if (bf) {
        uint16_t *d = (uint16_t *)q;
        for (int64_t k = 0; k < K; k++) d[k] = (uint16_t)(tsr_bits(tmp[k]) >> 16);
        for (int64_t k = K; k < KP; k++) d[k] = 0;
    } else {
        float *d = (float *)q;
        memcpy(d, tmp, (size_t)K * 4);
        for (int64_t k = K; k < KP; k++) d[k] = 0.0f;
    }
}

typedef struct {
    const uint8_t *w;
    const float *ws, *bias;
    char *y;
    int64_t M, N, K, KP, KB, LD;   /* LD: row stride of quantised x / decoded weight rows */
    int kind, dtype, e5m2, act;
    const uint16_t *lut16;   /* 128 magnitudes -> bf16 bits */
    const float *lut32;      /* 256 codes -> fp32 */
} ctx_t;

/* Finish outputs [m][n0, n0 + nv) from accumulated dot products (row / tensor scales). */
static void epilogue(const ctx_t *c, int64_t m, int64_t n0, int nv, const float *acc, const float *sxm) {
    float v[NRG];
    for (int r = 0; r < nv; r++) {
        float val = acc[r];
        if (c->kind != SK_BLOCK) val = val * (sxm[0] * c->ws[c->kind == SK_ROW ? n0 + r : 0]);
        if (c->bias) val += c->bias[n0 + r];
        v[r] = act_f(val, c->act);
    }
    const int es = tsr_elsize(c->dtype);
    tsr_store_conv(c->y + (m * c->N + n0) * es, v, nv, c->dtype);
}

/* ------------------------------------------------------------------ fp32 path (portable) */
static void decode_rows_f32(const ctx_t *c, int64_t n0, int nv, float *wf) {
    for (int r = 0; r < NRG; r++) {
        float *d = wf + r * c->LD;
        if (r < nv) {
            const uint8_t *src = c->w + (n0 + r) * c->K;
            for (int64_t k = 0; k < c->K; k++) d[k] = c->lut32[src[k]];
            for (int64_t k = c->K; k < c->KP; k++) d[k] = 0.0f;
        } else {
            memset(d, 0, (size_t)c->KP * 4);
        }
    }
}

static inline float dot_f32(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t k = 0; k < n; k++) s += a[k] * b[k];
    return s;
}

static void task_f32(const ctx_t *c, const float *qx, const float *sx, int64_t m0, int64_t m1, int64_t n0,
                     float *wf) {
    const int nv = c->N - n0 < NRG ? (int)(c->N - n0) : NRG;
    decode_rows_f32(c, n0, nv, wf);
    for (int64_t m = m0; m < m1; m++) {
        const float *xr = qx + m * c->LD, *sxm = sx + m * c->KB;
        float acc[NRG];
        for (int r = 0; r < nv; r++) {
            const float *wr = wf + r * c->LD;
            if (c->kind != SK_BLOCK) { acc[r] = dot_f32(xr, wr, c->KP); continue; }
            const float *swr = c->ws + ((n0 + r) / QB) * c->KB;
            float t = 0.0f;
            for (int64_t b = 0; b < c->KB; b++) {
                const int64_t k0 = b * QB, k1 = k0 + QB < c->KP ? k0 + QB : c->KP;
                t += dot_f32(xr + k0, wr + k0, k1 - k0) * (sxm[b] * swr[b]);
            }
            acc[r] = t;
        }
        epilogue(c, m, n0, nv, acc, sxm);
    }
}

/* ------------------------------------------------------------------ bf16 path (AVX512_BF16) */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__GNUC__) && \
    !defined(__clang__)
#define HAVE_BF16DP 1
#define BF16_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq")))

/* 32 fp8 bytes (masked: lanes past `mask` read as 0) -> 32 exact bf16 values. */
BF16_TARGET AI __m512i dec32(const uint8_t *p, __mmask32 mask, const __m512i *t) {
    const __m512i b = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(mask, p));
    const __m512i idx = _mm512_and_si512(b, _mm512_set1_epi16(0x7f));
    const __m512i lo = _mm512_permutex2var_epi16(t[0], idx, t[1]);
    const __m512i hi = _mm512_permutex2var_epi16(t[2], idx, t[3]);
    const __m512i v = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(b, _mm512_set1_epi16(0x40)), lo, hi);
    return _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(b, _mm512_set1_epi16(0x80)), 8));
}

/* One register tile: mr tokens x 4 weight rows over all of K.  direct: the weight comes as fp8
 * bytes (row stride K) and is decoded here; else as decoded bf16 (row stride LD).  blk: the
 * 128-wide K blocks are scaled one by one (mr <= 2).  Writes mr x 4 finished dot products. */
BF16_TARGET AI void tile(const int mr, const int blk, const int direct, const ctx_t *c, const uint16_t *xq,
                         const float *sx, const void *wsrc, const float *swr, const __m512i *lut,
                         float out[4][NRG]) {
    const int64_t K = c->K, KP = c->KP, LD = c->LD;
    __m512 acc[4][NRG], part[2][NRG];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
    #pragma GCC unroll 4
        for (int r = 0; r < NRG; r++) acc[i][r] = _mm512_setzero_ps();
    for (int64_t k0 = 0, b = 0; k0 < KP; k0 += QB, b++) {
        const int64_t k1 = k0 + QB < KP ? k0 + QB : KP;
        if (blk) {
#pragma GCC unroll 4
            for (int i = 0; i < 2; i++)
#pragma GCC unroll 4
                for (int r = 0; r < NRG; r++) part[i][r] = _mm512_setzero_ps();
        }
        for (int64_t k = k0; k < k1; k += 32) {
            __m512i wv[NRG];
            if (direct) {
                const __mmask32 mk = K - k >= 32 ? 0xffffffffu : ((1u << (K - k)) - 1u);
    #pragma GCC unroll 4
                for (int r = 0; r < NRG; r++) wv[r] = dec32((const uint8_t *)wsrc + r * K + k, mk, lut);
            } else {
    #pragma GCC unroll 4
                for (int r = 0; r < NRG; r++) wv[r] = _mm512_loadu_si512((const uint16_t *)wsrc + r * LD + k);
            }
#pragma GCC unroll 4
            for (int i = 0; i < mr; i++) {
                const __m512bh xv = (__m512bh)_mm512_loadu_si512(xq + i * LD + k);
    #pragma GCC unroll 4
                for (int r = 0; r < NRG; r++) {
                    if (blk) part[i][r] = _mm512_dpbf16_ps(part[i][r], xv, (__m512bh)wv[r]);
                    else acc[i][r] = _mm512_dpbf16_ps(acc[i][r], xv, (__m512bh)wv[r]);
                }
            }
        }
        if (blk) {
#pragma GCC unroll 4
            for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
                for (int r = 0; r < NRG; r++)
                    acc[i][r] = _mm512_fmadd_ps(part[i][r], _mm512_set1_ps(sx[i * c->KB + b] * swr[b]), acc[i][r]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
    #pragma GCC unroll 4
        for (int r = 0; r < NRG; r++) out[i][r] = _mm512_reduce_add_ps(acc[i][r]);
}

#define TILE_CASE(MR, BLK, DIR) \
    case (MR) * 4 + (BLK) * 2 + (DIR): tile(MR, BLK, DIR, c, xq, sx, wsrc, swr, lut, out); break;

BF16_TARGET static void tile_any(int mr, int blk, int direct, const ctx_t *c, const uint16_t *xq, const float *sx,
                                 const void *wsrc, const float *swr, const __m512i *lut, float out[4][NRG]) {
    switch (mr * 4 + blk * 2 + direct) {
        TILE_CASE(1, 0, 0) TILE_CASE(1, 0, 1) TILE_CASE(1, 1, 0) TILE_CASE(1, 1, 1)
        TILE_CASE(2, 0, 0) TILE_CASE(2, 0, 1) TILE_CASE(2, 1, 0) TILE_CASE(2, 1, 1)
        TILE_CASE(3, 0, 0) TILE_CASE(3, 0, 1) TILE_CASE(4, 0, 0) TILE_CASE(4, 0, 1)
        default: break;
    }
}

BF16_TARGET static void task_bf16(const ctx_t *c, const uint16_t *qx, const float *sx, int64_t m0, int64_t m1,
                                  int64_t n0, int direct, uint16_t *wb) {
    const int nv = c->N - n0 < NRG ? (int)(c->N - n0) : NRG;
    const int blk = c->kind == SK_BLOCK, mrmax = blk ? 2 : 4;
    __m512i lut[4];
    for (int i = 0; i < 4; i++) lut[i] = _mm512_loadu_si512(c->lut16 + 32 * i);
    const float *swr = blk ? c->ws + (n0 / QB) * c->KB : NULL;  /* 4-row groups never straddle blocks */
    const void *wsrc = c->w + n0 * c->K;
    if (nv < NRG) direct = 0;  /* a partial group is decoded: its missing rows repeat the last one */
    if (!direct) {             /* (their results are discarded) */
        for (int r = 0; r < NRG; r++) {
            const uint8_t *src = c->w + (n0 + (r < nv ? r : nv - 1)) * c->K;
            for (int64_t k = 0; k < c->KP; k += 32) {
                const __mmask32 mk = c->K - k >= 32 ? 0xffffffffu : ((1u << (c->K - k)) - 1u);
                _mm512_storeu_si512(wb + r * c->LD + k, dec32(src + k, mk, lut));
            }
        }
        wsrc = wb;
    }
    for (int64_t m = m0; m < m1; m += mrmax) {
        const int mr = m1 - m < mrmax ? (int)(m1 - m) : mrmax;
        float out[4][NRG];
        tile_any(mr, blk, direct, c, qx + m * c->LD, sx + m * c->KB, wsrc, swr, lut, out);
        for (int i = 0; i < mr; i++) epilogue(c, m + i, n0, nv, out[i], sx + (m + i) * c->KB);
    }
}
#else
#define HAVE_BF16DP 0
#endif

int tsr_linear_fp8_bf16dp(void) {
#if HAVE_BF16DP
    return tsr_bf16_hw();
#else
    return 0;
#endif
}

static void build_luts(int e5m2, uint16_t *lut16, float *lut32) {
    for (int b = 0; b < 256; b++) lut32[b] = e5m2 ? tsr_e5m2_to_f32((uint8_t)b) : tsr_e4m3_to_f32((uint8_t)b);
    for (int b = 0; b < 128; b++) {
        const uint32_t u = tsr_bits(lut32[b]);
        lut16[b] = lut32[b] != lut32[b] ? (uint16_t)0x7fc0u : (uint16_t)(u >> 16);  /* exact: <= 3 mantissa bits */
    }
}

/* x: [M, K] rows of dtype with row stride ldx (elements); w: [N, K] fp8 bytes; ws: fp32 scales
 * (kind: 0 tensor [], 1 row [N], 2 block [ceil(N/128), ceil(K/128)]); bias fp32 [N] or NULL;
 * y: [M, N] contiguous, dtype.  use_bf16: 1 to use VDPBF16PS where available. */
int tsr_linear_fp8(const void *x, int64_t ldx, const uint8_t *w, const float *ws, const float *bias, void *y,
                   int64_t M, int64_t N, int64_t K, int kind, int dtype, int e5m2, int act, int use_bf16,
                   int threads) {
    const int bf = use_bf16 && tsr_linear_fp8_bf16dp();
    const int64_t KP = (K + 31) / 32 * 32, kb = kind == SK_BLOCK ? QB : K, KB = (K + kb - 1) / kb;
    const int es = tsr_elsize(dtype), qes = bf ? 2 : 4;
    uint16_t lut16[128] __attribute__((aligned(64)));
    float lut32[256];
    build_luts(e5m2, lut16, lut32);
    /* rows 64 bytes apart from a multiple of 4 KiB: no L1 set / 4K-aliasing conflicts between the
     * rows a register tile reads together */
    const int64_t LD = KP + ((KP * qes) % 4096 == 0 ? 64 / qes : 0);
    const ctx_t c = {w, ws, bias, (char *)y, M, N, K, KP, KB, LD, kind, dtype, e5m2, act, lut16, lut32};
    void *qx = aligned_alloc(64, (size_t)(M * LD * qes + 64));
    float *sx = (float *)malloc((size_t)(M * KB + 1) * 4);
    if (!qx || !sx) { free(qx); free(sx); return TSR_ENOMEM; }
    const int direct = M <= (kind == SK_BLOCK ? 2 : 4);
    const int64_t ng = (N + NRG - 1) / NRG, nmb = (M + MB - 1) / MB, ntask = ng * nmb;
    int rc = TSR_OK;
#pragma omp parallel num_threads(tsr_threads(threads))
    {
        float *tmp = tsr_scratch(K);
        void *wbuf = aligned_alloc(64, (size_t)(NRG * LD * qes + 64));
        if (!tmp || !wbuf) {
#pragma omp atomic write
            rc = TSR_ENOMEM;
        }
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++)
            if (tmp) quant_row((const char *)x + m * ldx * es, dtype, K, KP, kb, tmp, (char *)qx + m * LD * qes, bf,
                               sx + m * KB);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < ntask; t++) {
            if (!tmp || !wbuf) continue;
            const int64_t mb = t / ng, n0 = (t % ng) * NRG, m0 = mb * MB, m1 = m0 + MB < M ? m0 + MB : M;
#if HAVE_BF16DP
            if (bf) { task_bf16(&c, (const uint16_t *)qx, sx, m0, m1, n0, direct, (uint16_t *)wbuf); continue; }
#endif
            task_f32(&c, (const float *)qx, sx, m0, m1, n0, (float *)wbuf);
        }
        free(tmp);
        free(wbuf);
    }
    free(qx);
    free(sx);
    (void)direct;
    return rc;
}
