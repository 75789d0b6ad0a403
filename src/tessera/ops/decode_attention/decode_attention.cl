/* decode_attention.cl -- paged decode attention (one query token per sequence), flash-decoding,
 * for the opencl backend (OpenCL C 1.2).
 *
 * Build options: TSR_DTYPE (q / out storage, tessera_cl.h) and DEC_CACHE, the cache dtype code of
 * append_kv/cpu.py's CACHE_CODE: 0 fp32, 1 fp16, 2 bf16, 8 int8, 9 float8_e4m3fn (the last two
 * with fp32 scales per (token, kv head): the dequantisation x = code * scale is folded into the
 * score (k_scale) and the probability (v_scale), not applied per element).
 *
 * decode_prep_q: q -> fp32, zero padded to DP = 8 ceil(D / 8) dims (q32), so the scores read q
 * eight dims at a time, aligned, with no tail.
 * decode_split: one work-group = (sequence b, kv head hk, split sp), the keys [t0, t1) of split sp
 * (of S) of the keys [lo, n) the sequence attends to (lo = n - window with a window), for all
 * G = Hq / Hk query heads of the group, so every K/V byte is read once per call.  Keys go by tiles
 * of N (a runtime value sized to local memory):
 *   rows   the cache row (page * P + slot, page = block_table[b, t / P]) of each key -> local
 *   scores s[g][j] = scale <q_g, k_j> (* k_scale_j); softcap: cap tanh(s / cap); one work-item
 *          per (key, head) pair (neighbours share the key's row), eight dims at a time -> local
 *   softmax one work-item per head: m' = max(m, max_j s), alpha = e^(m - m'), p = e^(s - m'),
 *          l = l alpha + sum p; p (* v_scale_j) replaces s       (m, l, alpha in local)
 *   acc    one work-item per (head, 8-dim chunk): acc = acc alpha + sum_j p_j v_j[chunk], kept
 *          in the group's own slice of the fp32 workspace pacc (G x DP; every chunk is owned by
 *          one work-item, so no race; it stays in cache between tiles)
 * and the group leaves its (m, l) in pml.  decode_combine merges the S splits of each (b, head):
 *   M = max_s m_s, out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s   (0 when no key).
 * Only attended keys are read (the test caches hold NaN everywhere else; a row's last chunk reads
 * only its D - 8 floor(D / 8) remaining elements).  Correct for any local size: every loop strides
 * by it, and each element's arithmetic does not depend on it (bit-identical results).
 * Cache elements are converted eight at a time from scalar loads the compiler merges (PoCL calls
 * the vloadn / vload_half built-ins out of line; fp16 goes through tessera_cl.h's integer
 * conversion, bit-exact with vload_half).
 */
#include "tessera_cl.h"
#include "tessera_quant_cl.h"   /* tsr_dq_e4m3: the exact e4m3fn decoder */

#ifndef DEC_CACHE
#define DEC_CACHE 0
#endif

#if DEC_CACHE == 0
#define CACHE_T float
#define cache_ld(p, i) ((p)[(i)])
#elif DEC_CACHE == 1
#define CACHE_T half
#define cache_ld(p, i) vload_half((i), (p))
#elif DEC_CACHE == 2
#define CACHE_T ushort
#define cache_ld(p, i) tsr_bf16_to_f32((p)[(i)])
#elif DEC_CACHE == 8
#define CACHE_T char
#define cache_ld(p, i) ((float)(p)[(i)])
#define DEC_SCALED 1
#elif DEC_CACHE == 9
#define CACHE_T uchar
#define cache_ld(p, i) tsr_dq_e4m3((p)[(i)])
#define DEC_SCALED 1
#else
#error "DEC_CACHE must be 0, 1, 2, 8 or 9"
#endif
#ifndef DEC_SCALED
#define DEC_SCALED 0
#endif

/* 8 cache elements p[0..7] -> fp32 (element loads the compiler merges; PoCL calls, rather than
 * inlines, the vloadn built-ins) */
static inline __attribute__((always_inline)) float8 cache_ld8(__global const CACHE_T *p) {
#if DEC_CACHE == 1
    __global const ushort *u = (__global const ushort *)p;   /* the bits; converted by integer ops */
    return tsr_half8_to_f32((ushort8)(TSR_G8(u, 0)));
#elif DEC_CACHE == 2
    const uint8 u = (uint8)(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
    return as_float8(u << 16);
#else
    return (float8)(cache_ld(p, 0), cache_ld(p, 1), cache_ld(p, 2), cache_ld(p, 3), cache_ld(p, 4), cache_ld(p, 5),
                    cache_ld(p, 6), cache_ld(p, 7));
#endif
}

/* elements p[0..r-1] (r < 8) -> fp32, zeros after: the last chunk of a row never reads past it */
static inline __attribute__((always_inline)) float8 cache_ld_tail(__global const CACHE_T *p, int r) {
    float t[8];
    for (int k = 0; k < 8; k++) t[k] = k < r ? cache_ld(p, k) : 0.0f;
    return (float8)(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
}

static inline __attribute__((always_inline)) float dec_hsum(float8 a) {
    const float4 b = a.lo + a.hi;
    return (b.x + b.y) + (b.z + b.w);
}

/* q (B, Hq, D) of the storage dtype -> q32 (B, Hq, DP) fp32, zero padded to DP = 8 ceil(D / 8):
 * the split kernel then reads q eight dims at a time, aligned, with no tail */
__kernel void decode_prep_q(__global const TSR_T *q, int D, int DP, long total, __global float *q32) {
    const long e = get_global_id(0);
    if (e >= total) return;
    const long r = e / DP;
    const int d = e - r * DP;
    q32[e] = d < D ? tsr_ld(q, r * D + d) : 0.0f;
}

__kernel void decode_split(__global const float8 *q32, __global const CACHE_T *kc, __global const CACHE_T *vc,
                           __global const float *ks, __global const float *vs, __global const int *bt,
                           __global const int *seq_lens, int Hk, int G, int D, int P, int MB, int S, int window,
                           float scale, float softcap, int N, __global float *pml, __global float8 *pacc,
                           __local float *sc, __local float *ml, __local int *rows) {
    const int lid = get_local_id(0), L = get_local_size(0);
    const long task = get_group_id(0);                /* (b * Hk + hk) * S + sp */
    const int sp = task % S, hk = (task / S) % Hk;
    const long b = task / ((long)S * Hk);
    const int n = seq_lens[b], lo = window > 0 && n > window ? n - window : 0;
    const int per = (n - lo + S - 1) / S, t0 = lo + sp * per, t1 = t0 + per < n ? t0 + per : n;
    const int D8 = (D + 7) / 8, GD8 = G * D8, full = D / 8;
    __local float *m = ml, *l = ml + G, *alpha = ml + 2 * G;
    __global float8 *acc = pacc + task * GD8;          /* this group's G x D8 accumulator chunks */
    __global const float8 *qb = q32 + (b * G * Hk + (long)hk * G) * D8;
    for (int e = lid; e < GD8; e += L) acc[e] = (float8)(0.0f);
    for (int g = lid; g < G; g += L) { m[g] = -INFINITY; l[g] = 0.0f; }
    for (int t = t0; t < t1; t += N) {
        const int nt = N < t1 - t ? N : t1 - t;
        for (int j = lid; j < nt; j += L) rows[j] = bt[b * MB + (t + j) / P] * P + (t + j) % P;
        barrier(CLK_LOCAL_MEM_FENCE);
        /* scores: work-item per (key j, head g); neighbouring work-items share the key's row */
        for (int e = lid; e < nt * G; e += L) {
            const int j = e / G, g = e - j * G;
            const long row = (long)rows[j] * Hk + hk;
            __global const CACHE_T *kr = kc + row * D;
            __global const float8 *qr = qb + g * D8;
            float8 a = (float8)(0.0f);
            for (int c = 0; c < full; c++) a += qr[c] * cache_ld8(kr + 8 * c);
            if (full < D8) a += qr[full] * cache_ld_tail(kr + 8 * full, D - 8 * full);
            float s = dec_hsum(a) * scale;
#if DEC_SCALED
            s *= ks[row];
#endif
            if (softcap > 0.0f) s = softcap * tanh(s / softcap);
            sc[g * N + j] = s;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* online softmax bookkeeping: work-item per head */
        for (int g = lid; g < G; g += L) {
            __local float *sg = sc + g * N;
            float mx = m[g], sum = 0.0f;
            for (int j = 0; j < nt; j++) mx = sg[j] > mx ? sg[j] : mx;
            for (int j = 0; j < nt; j++) {
                const float p = exp(sg[j] - mx);
                sum += p;
#if DEC_SCALED
                sg[j] = p * vs[(long)rows[j] * Hk + hk];
#else
                sg[j] = p;
#endif
            }
            alpha[g] = exp(m[g] - mx);   /* 0 on the first tile (m = -inf) */
            l[g] = l[g] * alpha[g] + sum;
            m[g] = mx;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* acc = acc alpha + P V: work-item per (head, 8-dim chunk); neighbouring work-items read
         * neighbouring chunks of a value row */
        for (int e = lid; e < GD8; e += L) {
            const int g = e / D8, c = e - g * D8;
            __local const float *pg = sc + g * N;
            __global const CACHE_T *vb = vc + (long)hk * D + 8 * c;
            float8 a = acc[e] * alpha[g];
            if (c < full)
                for (int j = 0; j < nt; j++) a += pg[j] * cache_ld8(vb + (long)rows[j] * Hk * D);
            else
                for (int j = 0; j < nt; j++) a += pg[j] * cache_ld_tail(vb + (long)rows[j] * Hk * D, D - 8 * c);
            acc[e] = a;
        }
        barrier(CLK_LOCAL_MEM_FENCE);   /* rows / sc are rewritten by the next tile */
    }
    for (int g = lid; g < G; g += L) {
        pml[task * 2 * G + g] = m[g];
        pml[task * 2 * G + G + g] = l[g];
    }
}

/* out[b, h, d] = merge of the S split partials of (b, h); one work-item per output element. */
__kernel void decode_combine(__global const float *pml, __global const float *pacc, int Hk, int G, int D, int S,
                             long total, __global TSR_T *out) {
    const long e = get_global_id(0);
    if (e >= total) return;
    const int d = e % D, DP = (D + 7) / 8 * 8;
    const long bh = e / D;                       /* b * Hq + h */
    const int h = bh % (G * Hk), g = h % G, hk = h / G;
    const long b = bh / (G * Hk), base = (b * Hk + hk) * S;
    float M = -INFINITY;
    for (int s = 0; s < S; s++) {
        const float ms = pml[(base + s) * 2 * G + g];
        M = ms > M ? ms : M;
    }
    float o = 0.0f;
    if (M != -INFINITY) {
        float den = 0.0f;
        for (int s = 0; s < S; s++) {
            const long task = base + s;
            const float w = exp(pml[task * 2 * G + g] - M);
            den += w * pml[task * 2 * G + G + g];
            o += w * pacc[(task * G + g) * DP + d];
        }
        o /= den;
    }
    tsr_st(out, e, o);
}
