/* Int4-weight linears: W4A16 (float x) and W4A8 (per-token int8 x), one kernel per op.
 *
 * Weight w uint8 [N, K/2] (byte j = code[2j] | code[2j+1] << 4), scale s fp32 [N, K/G], zero z
 * uint8 [N, K/G] or NULL (= 8); K % G == 0, G in {32, 64, 128}, so K % 32 == 0.
 *
 *   W4A16: y = act(sum_g s_g * sum_{k in g} x_k * (q_k - z_g) + bias)          fp32 sums
 *   W4A8 : qx, sx = per-token int8 (tessera_quant.h, the contract's fp32 rules)
 *          acc_g = sum_{k in g} qx_k * (q_k - z_g)                              int32, exact
 *          y = act(sx * sum_g fp32(acc_g) * s_g + bias)                         fp32 epilogue
 *          (the AVX-512 path splits each acc_g into exact per-lane integer pieces: see below)
 *
 * Layout trick (no nibble interleaving at run time): x is permuted once per call so that the
 * low and high nibbles of a contiguous run of weight bytes meet their x values lane by lane.
 *   W4A16: per 32-k block, fp32 [16 even k][16 odd k];  W4A8: per 128-k chunk, int8 [64 even][64 odd]
 *
 * Loop structure: work items are (block of MBB x rows) x (tile of 4 weight rows), handed out to
 * the OpenMP threads dynamically in contiguous runs; each tile writes its finished outputs
 * (bias, activation, conversion) directly, so a call has no barrier but the final join (x is
 * prepared serially first when small).  Decode (M <= 16) is one x block: the weight crosses
 * DRAM once.  Each weight tile is unpacked once per 128-k chunk (W4A8) across the MBB rows of
 * the block, or decoded into registers once per 4 x rows (W4A16 below the GEMM sizes).
 *
 * AVX-512 paths (__AVX512F__ builds):
 *   W4A16: 16 bytes -> vpmovzxbd -> vpermps through a 16-entry table {i - z} (low nibble = the
 *          index's low 4 bits; >> 4 for the high nibble): (q - z) as fp32 in 3 ops, then FMAs with
 *          the permuted x, per-group vector sums times s_g (one FMA per group).  bf16 x at M < 64
 *          (where the CPU has AVX512-BF16): vdpbf16ps on the bf16 bits, see the header file.
 *   W4A8 : vpdpbusd with the nibbles (0..15) as the UNSIGNED operand and qx (-127..127) as the
 *          signed one (chosen at run time where the CPU has AVX512-VNNI; else the portable loop).
 *          Lane l of a 128-k chunk sums the 8 products of k in [8l, 8l + 8); it starts from
 *          -z * X_l (X_l = the lane's sum of qx, from the x prep), so it ends as the EXACT integer
 *          sum_{k in lane} qx_k (q_k - z) (|.| <= 8 * 127 * 15).  A lane lies inside one group; it
 *          is converted to fp32 (exact) and multiplied by its group scale into an fp32 lane
 *          accumulator (vcvtdq2ps + one FMA per 128 k and weight row: no horizontal work per
 *          group); one horizontal sum per output at the end of K, then * sx.  So every integer
 *          term is exact, and the float epilogue is
 *              y = act(sx * sum_{lanes, groups} fp32(acc_lane,g) * s_g + bias)
 *          (fp32, lane-parallel then a tree over the 16 lanes); the portable loop sums the same
 *          exact group totals acc_g = sum of its lanes in group order.  x is quantised with
 *          vector code (true fp32 division, RNE: the same integers as the scalar contract).
 *          Decode: 4 weight rows per work item, x rows in sub-blocks of 4/2/1 (register
 *          accumulators), the next item's 8 KB prefetched while the current one is computed.
 * AArch64 W4A8 (the cpu:aarch64 runner): where getauxval's HWCAP says the CPU has SDOT
 *          (FEAT_DotProd; tessera_neon_dot.h), the portable loop's group sums run as SDOT on the
 *          nibbles minus the zero point ((q - z) in [-15, 15]: exact int8 operands) against the
 *          permuted qx; same exact acc_g, same float epilogue.  force_c = 1 keeps the plain loop.
 * Portable C computes the same integers in the same groups (any ISA, any compiler).
 */
#include "tessera_quant.h"

#define MBB 16        /* x rows per block */

static inline float act_f(float v, int act) {
    switch (act) {
    case 1: return v < 0.0f ? 0.0f : v;                                     /* relu (NaN stays) */
    case 2: return 0.5f * v * (1.0f + tsr_erff(v * 0.70710678118654752f)); /* gelu (erf) */
    case 3: {                                                               /* 0.5(1+tanh u) = sigmoid(2u) */
        const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
        return v * tsr_sigmoidf(2.0f * u);
    }
    case 4: return v * tsr_sigmoidf(v);                                    /* silu */
    default: return v;
    }
}

/* ------------------------------------------------------------------ x preparation */
/* W4A16: row -> fp32, permuted per 32-k block to [16 even][16 odd]. */
static void prep_f32(const char *x, int64_t sx, int dtype, float *xp, float *tmp, int64_t m, int64_t K) {
    tsr_load_f32(tmp, x + m * sx * tsr_elsize(dtype), K, dtype);
    float *d = xp + m * K;
    for (int64_t t = 0; t < K; t += 32)
        for (int j = 0; j < 16; j++) { d[t + j] = tmp[t + 2 * j]; d[t + 16 + j] = tmp[t + 2 * j + 1]; }
}

/* W4A16 bf16 decode path: bf16 bits of the row, permuted per 64-k block to [32 even][32 odd],
 * zero padded to K64 = ceil(K/64)*64. */
static void prep_bf16(const char *x, int64_t sx, uint16_t *xb, int64_t m, int64_t K) {
    const uint16_t *s = (const uint16_t *)x + m * sx;
    const int64_t K64 = (K + 63) / 64 * 64;
    uint16_t *d = xb + m * K64;
    for (int64_t t = 0; t < K64; t += 64)
        for (int j = 0; j < 32; j++) {
            d[t + j] = t + 2 * j < K ? s[t + 2 * j] : 0;
            d[t + 32 + j] = t + 2 * j + 1 < K ? s[t + 2 * j + 1] : 0;
        }
}

/* W4A8: row -> per-token int8 (contract), permuted per 128-k chunk to [64 even][64 odd] (zero padded
 * to Kc = ceil(K/128)*128), its scale, and per chunk 16 int32 lane terms: lane l = -(sum of qx over
 * k in [8l, 8l + 8) of the chunk), the k that meet lane l of the vpdpbusd (the vector kernel starts
 * each lane from z times this: the zero point removed exactly, per lane). */
static void prep_i8(const char *x, int64_t sx, int dtype, int8_t *qx, int32_t *xs, float *sxs, float *tmp,
                    int64_t m, int64_t K) {
    const int64_t Kc = (K + 127) / 128 * 128, C = Kc / 128;
    tsr_load_f32(tmp, x + m * sx * tsr_elsize(dtype), K, dtype);
    const float scale = tsr_scale_for(tsr_absmax(tmp, K), 127.0f);
    sxs[m] = scale;
    int8_t *d = qx + m * Kc;
    int32_t *s = xs + m * C * 16;
#if defined(TSR_NEON)
    /* NEON: the codes of each 128-k chunk (tsr_neon_quant_ints: the same integers), split into
     * even / odd k by LD2, lane sums by pairwise widening adds (exact integers) */
    for (int64_t k = K; k < Kc; k++) tmp[k] = 0.0f;
    for (int64_t c = 0; c < C; c++) {
        int8_t qc[128];
        tsr_neon_quant_ints(tmp + 128 * c, 128, scale, -127.0f, 127.0f, 0, 0, qc);
        for (int h = 0; h < 4; h++) {
            const int8x16x2_t e = vld2q_s8(qc + 32 * h);
            vst1q_s8(d + 128 * c + 16 * h, e.val[0]);
            vst1q_s8(d + 128 * c + 64 + 16 * h, e.val[1]);
        }
        for (int l = 0; l < 16; l += 4) {
            const int32x4_t a = vpaddlq_s16(vpaddlq_s8(vld1q_s8(qc + 8 * l)));
            const int32x4_t b = vpaddlq_s16(vpaddlq_s8(vld1q_s8(qc + 8 * l + 16)));
            vst1q_s32(s + 16 * c + l, vnegq_s32(vpaddq_s32(a, b)));
        }
    }
    return;
#endif
    for (int64_t k = 0; k < K; k++) tmp[k] = (float)tsr_quant_int(tmp[k] / scale, -127.0f, 127.0f);
    for (int64_t k = K; k < Kc; k++) tmp[k] = 0.0f;
    for (int64_t c = 0; c < C; c++) {
        /* tmp holds whole numbers: lrintf converts them exactly, like a cast, but as a
         * round-to-nearest conversion -- clang lowers a cast to RVV's vfncvt.rtz, on which
         * qemu 7.2's translator aborts (decode_save_opc assertion) */
        for (int j = 0; j < 64; j++) {
            d[128 * c + j] = (int8_t)lrintf(tmp[128 * c + 2 * j]);
            d[128 * c + 64 + j] = (int8_t)lrintf(tmp[128 * c + 2 * j + 1]);
        }
        for (int l = 0; l < 16; l++) {
            int32_t sum = 0;
            for (int k = 0; k < 8; k++) sum += (int32_t)lrintf(tmp[128 * c + 8 * l + k]);
            s[16 * c + l] = -sum;
        }
    }
}

/* ------------------------------------------------------------------ portable kernels */
static void w4a16_tile_c(const uint8_t *w, const float *ws, const uint8_t *wz, const float *xp, float *yt,
                         int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t N, int64_t K, int64_t G) {
    const int64_t KG = K / G, KB = K / 2;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = w + n * KB;
        for (int64_t m = m0; m < m1; m++) {
            const float *xr = xp + m * K;
            float t = 0.0f;
            for (int64_t g = 0; g < KG; g++) {
                const float z = wz ? (float)wz[n * KG + g] : 8.0f;
                float p = 0.0f;
                /* byte b holds columns blk + j (low nibble) and blk + 16 + j (high), blk = b / 16 * 32,
                 * j = b % 16: walked as runs of consecutive j, so the loop is unit-stride and vectorises
                 * (NEON, RVV, SSE/AVX2 builds) */
                for (int64_t b0 = g * G / 2, be = (g + 1) * G / 2; b0 < be;) {
                    const int64_t j0 = b0 % 16, n = 16 - j0 < be - b0 ? 16 - j0 : be - b0;
                    const uint8_t *wb = wr + b0;
                    const float *x0 = xr + b0 / 16 * 32 + j0, *x1 = x0 + 16;
#pragma omp simd reduction(+ : p)
                    for (int64_t j = 0; j < n; j++)
                        p += ((float)(wb[j] & 15) - z) * x0[j] + ((float)(wb[j] >> 4) - z) * x1[j];
                    b0 += n;
                }
                t += p * ws[n * KG + g];
            }
            yt[(m - m0) * 4 + (n - n0)] = t;
        }
    }
}

static void w4a8_tile_c(const uint8_t *w, const float *ws, const uint8_t *wz, const int8_t *qx,
                        const float *sxs, float *yt, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                        int64_t N, int64_t K, int64_t G) {
    const int64_t KG = K / G, KB = K / 2, Kc = (K + 127) / 128 * 128;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = w + n * KB;
        for (int64_t m = m0; m < m1; m++) {
            const int8_t *xr = qx + m * Kc;
            float t = 0.0f;
            for (int64_t g = 0; g < KG; g++) {
                const int32_t z = wz ? (int32_t)wz[n * KG + g] : 8;
                int32_t acc = 0;
                /* byte b: columns c + j and c + 64 + j, c = b / 64 * 128, j = b % 64; runs of consecutive j
                 * (unit stride: the loop vectorises; integer sums, so the order changes nothing) */
                for (int64_t b0 = g * G / 2, be = (g + 1) * G / 2; b0 < be;) {
                    const int64_t j0 = b0 % 64, n = 64 - j0 < be - b0 ? 64 - j0 : be - b0;
                    const uint8_t *wb = wr + b0;
                    const int8_t *x0 = xr + b0 / 64 * 128 + j0, *x1 = x0 + 64;
#pragma omp simd reduction(+ : acc)
                    for (int64_t j = 0; j < n; j++)
                        acc += ((int32_t)(wb[j] & 15) - z) * x0[j] + ((int32_t)(wb[j] >> 4) - z) * x1[j];
                    b0 += n;
                }
                t += (float)acc * ws[n * KG + g];
            }
            yt[(m - m0) * 4 + (n - n0)] = sxs[m] * t;
        }
    }
}

#include "qlinear_int4_avx512.h"

#if defined(__aarch64__)
/* ------------------------------------------------------------------ AArch64 SDOT (W4A8) */
#include "tessera_neon_dot.h"
#endif
#if defined(TSR_NEON_DOT)
/* w4a8_tile_c with each run's integer sum on SDOT (runs are multiples of 16 bytes: G / 2 in
 * {16, 32, 64} and the 64-byte chunk edges are multiples of 16) */
TSR_DOTPROD_TARGET static void w4a8_tile_sdot(const uint8_t *w, const float *ws, const uint8_t *wz, const int8_t *qx,
                                              const float *sxs, float *yt, int64_t m0, int64_t m1, int64_t n0,
                                              int64_t n1, int64_t K, int64_t G) {
    const int64_t KG = K / G, KB = K / 2, Kc = (K + 127) / 128 * 128;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = w + n * KB;
        for (int64_t m = m0; m < m1; m++) {
            const int8_t *xr = qx + m * Kc;
            float t = 0.0f;
            for (int64_t g = 0; g < KG; g++) {
                const int8x16_t zv = vdupq_n_s8((int8_t)(wz ? wz[n * KG + g] : 8));
                int32x4_t acc = vdupq_n_s32(0);
                for (int64_t b0 = g * G / 2, be = (g + 1) * G / 2; b0 < be;) {
                    const int64_t j0 = b0 % 64, r = 64 - j0 < be - b0 ? 64 - j0 : be - b0;
                    const int8_t *x0 = xr + b0 / 64 * 128 + j0;
                    acc = tsr_sdot_nibbles(acc, wr + b0, x0, x0 + 64, r, zv);
                    b0 += r;
                }
                t += (float)vaddvq_s32(acc) * ws[n * KG + g];
            }
            yt[(m - m0) * 4 + (n - n0)] = sxs[m] * t;
        }
    }
}
#endif

/* ------------------------------------------------------------------ driver */
/* Epilogue of one tile (fp32 results yt[i * 4 + r]): bias, activation, conversion, store. */
static void put_tile(const float *yt, int ldt, void *y, int dtype, const float *bias, int act, int64_t m0,
                     int64_t m1, int64_t n0, int64_t n1, int64_t N) {
    for (int64_t m = m0; m < m1; m++)
        for (int64_t n = n0; n < n1; n++) {
            const float v = act_f(yt[(m - m0) * ldt + (n - n0)] + (bias ? bias[n] : 0.0f), act);
            if (dtype == TSR_F32) ((float *)y)[m * N + n] = v;
            else ((uint16_t *)y)[m * N + n] = dtype == TSR_BF16 ? tsr_f2bf(v) : tsr_f2h(v);
        }
}

/* mode 0 = W4A16, 1 = W4A8.  x: M rows of K (row stride sx elements, unit inner stride), dtype;
 * bias fp32 [N] or NULL; y contiguous [M, N] of dtype.  force_c = 1 takes the portable loops.
 *
 * Threads: x is prepared first (serially when small: decode calls then have no barrier but the
 * final join), then every (x block, 4-row tile) pair is one work item, handed out dynamically in
 * contiguous runs, and each tile writes its finished outputs (no second pass over y).  On a busy
 * machine a late thread therefore never holds the others at an intermediate barrier. */
int tsr_qlinear_int4(int mode, const void *x, int64_t sx, int dtype, const uint8_t *w, const float *ws,
                     const uint8_t *wz, const float *bias, void *y, int64_t M, int64_t N, int64_t K, int64_t G,
                     int act, int nthreads, int force_c) {
    const int64_t Kc = (K + 127) / 128 * 128, C = Kc / 128;
    const int T = tsr_threads(nthreads);
    float *xp = NULL, *sxs = NULL;
    int8_t *qx = NULL;
    int32_t *xs = NULL;
    if (mode == 0) {
        xp = tsr_scratch(M * K);
    } else {
        qx = (int8_t *)tsr_scratch((M * Kc + 3) / 4);
        xs = (int32_t *)tsr_scratch(M * C * 16);
        sxs = tsr_scratch(M);
    }
    int failed = mode == 0 ? !xp : (!qx || !xs || !sxs);
    const int fast = !force_c && qlin_fast_ok(mode);
#if defined(TSR_NEON_DOT)
    const int sdot = !force_c && mode == 1 && tsr_neon_dot_level() >= TSR_DOT_SDOT;
#endif
    /* bf16 x below the GEMM sizes: vdpbf16ps on the bf16 bits (no fp32 copy of x) */
    const int dpbf16 = fast && mode == 0 && dtype == TSR_BF16 && M < 64 && qlin_bf16_ok();
    uint16_t *xb = NULL;
    if (dpbf16) {
        free(xp);
        xp = NULL;
        xb = (uint16_t *)tsr_scratch((M * ((K + 63) / 64 * 64) + 1) / 2);
        failed = !xb;
        for (int64_t m = 0; xb && m < M; m++) prep_bf16((const char *)x, sx, xb, m, K);
    }
    /* prefill W4A16: GM x GN items of the register-blocked GEMM (AVX-512 builds) */
    const int gemm = fast && mode == 0 && !dpbf16 && M >= 64;
    const int64_t TN = gemm ? GN : 4, BM = gemm ? GM : MBB;
    const int64_t tiles = (N + TN - 1) / TN, blocks = (M + BM - 1) / BM, items = tiles * blocks;
    const int64_t run = items / (8 * (int64_t)T) > 1 ? items / (8 * (int64_t)T) : 1;
    const int serial_prep = M * K <= (1 << 16);
    if (!failed && serial_prep && !dpbf16) {
        float *tmp = tsr_scratch(Kc);
        if (!tmp) failed = 1;
        for (int64_t m = 0; tmp && m < M; m++) {
            if (mode == 0) prep_f32((const char *)x, sx, dtype, xp, tmp, m, K);
            else if (fast) prep_i8_fast((const char *)x, sx, dtype, qx, xs, sxs, tmp, m, K);
            else prep_i8((const char *)x, sx, dtype, qx, xs, sxs, tmp, m, K);
        }
        free(tmp);
    }
    if (!failed) {
        TSR_TEAM(T, , {
            int ok = 1;
            if (!serial_prep && !dpbf16) {
                float *tmp = tsr_scratch(Kc);
                ok = tmp != NULL;
_Pragma("omp for schedule(static)")
                for (int64_t m = 0; m < M; m++) {
                    if (!tmp) continue;
                    if (mode == 0) prep_f32((const char *)x, sx, dtype, xp, tmp, m, K);
                    else if (fast) prep_i8_fast((const char *)x, sx, dtype, qx, xs, sxs, tmp, m, K);
                    else prep_i8((const char *)x, sx, dtype, qx, xs, sxs, tmp, m, K);
                }
                free(tmp);
            }
            float yt[MBB * 4];
            float *yacc = gemm ? tsr_scratch((GM + 8) * GN) : NULL, *wt = gemm ? tsr_scratch(GKS * GN) : NULL;
            if (gemm && (!yacc || !wt)) ok = 0;
            if (!ok) {
_Pragma("omp atomic write")
                failed = 1;
            }
            if (gemm || !serial_prep) {   /* uniform condition; decode calls keep no barrier */
_Pragma("omp barrier")
            }
            /* every thread enters the work-sharing loop; after a failed allocation anywhere none
             * computes (the result is discarded: TSR_ENOMEM) */
            int go;
_Pragma("omp atomic read")
            go = failed;
            go = !go;
_Pragma("omp for schedule(dynamic, run) nowait")
            for (int64_t it = 0; it < items; it++) {
                if (!go) continue;
                const int64_t b = it / tiles, t = it % tiles;
                const int64_t m0 = b * BM, m1 = m0 + BM < M ? m0 + BM : M;
                const int64_t n0 = TN * t, n1 = n0 + TN < N ? n0 + TN : N;
                if (gemm) {
                    w4a16_gemm_item(w, ws, wz, xp, yacc, wt, m0, m1, n0, n1, K, G);
                    put_tile(yacc, GN, y, dtype, bias, act, m0, m1, n0, n1, N);
                } else if (dpbf16) {
                    w4a16_tile_bf16(w, ws, wz, xb, yt, m0, m1, n0, n1, K, G);
                    put_tile(yt, 4, y, dtype, bias, act, m0, m1, n0, n1, N);
                } else {
                    if (mode == 0) {
                        if (fast) w4a16_tile_fast(w, ws, wz, xp, yt, m0, m1, n0, n1, N, K, G);
                        else w4a16_tile_c(w, ws, wz, xp, yt, m0, m1, n0, n1, N, K, G);
                    } else {
                        if (fast) w4a8_tile_fast(w, ws, wz, qx, xs, sxs, yt, m0, m1, n0, n1, N, K, G);
#if defined(TSR_NEON_DOT)
                        else if (sdot) w4a8_tile_sdot(w, ws, wz, qx, sxs, yt, m0, m1, n0, n1, K, G);
#endif
                        else w4a8_tile_c(w, ws, wz, qx, sxs, yt, m0, m1, n0, n1, N, K, G);
                    }
                    put_tile(yt, 4, y, dtype, bias, act, m0, m1, n0, n1, N);
                }
            }
            free(yacc); free(wt);
        });
    }
    free(xp); free(xb); free(qx); free(xs); free(sxs);
    return failed ? TSR_ENOMEM : TSR_OK;
}
