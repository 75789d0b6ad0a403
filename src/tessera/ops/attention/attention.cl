/* attention.cl -- tiled online-softmax attention forward for the opencl backend (OpenCL C 1.2).
 *
 * Inputs are packed varlen (tokens, heads, D) with int64 token/head strides and unit last stride;
 * cu_q / cu_k int32 (B+1,).  One work-group = (block of L query rows of one sequence, q head h);
 * `blocks` (host-built, int32 pairs) names each block's sequence and first row.  Work-item `lid`
 * owns query row i = i0 + lid: its q (fp32), running max m, sum l and accumulator O
 * stay in private memory.  The group walks the keys any of its rows may see ([lo, hi): blocks
 * outside the causal / sliding window are never loaded) in tiles of ATT_BN keys; each tile of K
 * and V of kv head h / G is loaded once into local memory (converted to fp32, coalesced: neighbouring
 * work-items load neighbouring elements) and shared by the L rows.  Per row and tile:
 *   s_j = scale <q_i, k_j>   (softcap: s = softcap tanh(s / softcap)), only the row's allowed
 *   columns [clo, chi) (bottom-right aligned window, off = Lk - Lq);
 *   m' = max(m, max_j s_j), alpha = exp(m - m'), p_j = exp(s_j - m'), l = l alpha + sum p_j,
 *   O = O alpha + sum_j p_j v_j  (FlashAttention-2, Dao 2023, Alg. 1).
 * End: out = O / l, lse = m + log l; a row without an allowed key keeps l = 0: out 0, lse -inf.
 *
 * Every row's arithmetic is independent of the local size L (which only groups rows): tiles are
 * aligned to multiples of ATT_BN of the key index (not to the group's first key), so every row
 * sees the same partition of its keys, and scores, exponentials and sums are taken in the same
 * order in any block: outputs are bit-identical for any L (tests/test_attention_fuzz.py).
 * Control flow around the barriers is uniform over the group (tile loop bounds are the group's);
 * rows past the block end (L > rows left) only help load tiles.  fp32 math for every storage
 * dtype; head_dim is a runtime value <= ATT_DMAX (private arrays are sized by that build option,
 * a power of two >= 16), padded with zeros to a multiple of 8 in q and the tiles.
 * Inner loops are float8 arithmetic on private and local arrays indexed directly, eight keys per
 * pass over q for the scores and four per pass over O for P V (fewer loads per FMA), exponentials
 * and the softcap's tanh eight scores at a time (a masked score is -inf: its weight is 0).  No
 * vloadn / min / max built-ins in the loops: PoCL 3.0 calls them out of line.
 */
#include "tessera_cl.h"

#ifndef ATT_DMAX
#define ATT_DMAX 64
#endif
#ifndef ATT_BN
#define ATT_BN 64
#endif

static inline __attribute__((always_inline)) long att_min(long a, long b) { return a < b ? a : b; }
static inline __attribute__((always_inline)) long att_max(long a, long b) { return a > b ? a : b; }
static inline __attribute__((always_inline)) float att_hsum(float8 a) {
    const float4 b = a.lo + a.hi;
    return (b.x + b.y) + (b.z + b.w);
}

__kernel void attention_fwd(__global const TSR_T *q, long sqt, long sqh, __global const TSR_T *k, long skt,
                            long skh, __global const TSR_T *v, long svt, long svh, __global const int *cu_q,
                            __global const int *cu_k, __global const int *blocks, int G, int D, long Tq,
                            float scale, long wl, long wr, float softcap, __global TSR_T *out, __global float *lse,
                            __local float8 *K8, __local float8 *V8) {
    const int lid = get_local_id(0), L = get_local_size(0);
    const long blk = get_group_id(0);
    const int h = get_group_id(1), Hq = get_num_groups(1), hk = h / G;
    const int b = blocks[2 * blk];
    const long i0 = blocks[2 * blk + 1];
    const long q0 = cu_q[b], Lq = cu_q[b + 1] - q0, k0 = cu_k[b], Lk = cu_k[b + 1] - k0, off = Lk - Lq;
    const long rows = att_min(L, Lq - i0), i = i0 + lid;
    const int live = lid < rows;
    const int D8 = (D + 7) / 8, DP = 8 * D8;
    /* keys any row of the group may see, and this row's own allowed range */
    long lo = 0, hi = Lk, clo = 0, chi = Lk;
    /* clo may be negative (max(clo, j0) below clamps it): clamped here, max(clo, j0) - j0 of two
     * non-negative values becomes llvm.usub.sat, which the Oclgrind simulator cannot run */
    if (wl >= 0) { lo = att_max(0, i0 + off - wl); clo = i + off - wl; }
    if (wr >= 0) { hi = att_min(Lk, i0 + rows - 1 + off + wr + 1); chi = att_min(Lk, i + off + wr + 1); }

    /* float8 arrays indexed directly (PoCL calls, rather than inlines, vload/vstore and min/max) */
    float8 q8[ATT_DMAX / 8], O8[ATT_DMAX / 8], s8[ATT_BN / 8];
    float *sf = (float *)s8;
    float m = -INFINITY, l = 0.0f;
    {
        __global const TSR_T *qr = q + (q0 + (live ? i : i0)) * sqt + h * sqh;
        float *qf = (float *)q8;
        for (int d = 0; d < DP; d++) qf[d] = (live && d < D) ? tsr_ld(qr, d) : 0.0f;
        for (int c = 0; c < D8; c++) O8[c] = (float8)(0.0f);
    }
    /* tiles aligned to multiples of ATT_BN (not to lo): the same partition of the keys for every
     * row, whatever block (and local size) it is computed in */
    for (long j0 = lo / ATT_BN * ATT_BN; j0 < hi; j0 += ATT_BN) {
        const int n = (int)att_min(ATT_BN, Lk - j0);
        /* K and V tile rows j0 .. j0+n-1 of kv head hk -> local fp32 (n x DP, zero padded), eight
         * dims per work-item step (tsr_ld8: merged scalar loads, integer fp16 / bf16 conversion) */
        for (int e = lid; e < n * D8; e += L) {
            const int j = e / D8, c = e - j * D8, d0 = 8 * c;
            const long t = k0 + j0 + j;
            __global const TSR_T *kr = k + t * skt + hk * skh, *vr = v + t * svt + hk * svh;
            if (d0 + 8 <= D) {
                K8[e] = tsr_ld8(kr, d0);
                V8[e] = tsr_ld8(vr, d0);
            } else {   /* the row's last, partial chunk: never read past it */
                float kt[8], vt[8];
                for (int u = 0; u < 8; u++) {
                    kt[u] = d0 + u < D ? tsr_ld(kr, d0 + u) : 0.0f;
                    vt[u] = d0 + u < D ? tsr_ld(vr, d0 + u) : 0.0f;
                }
                K8[e] = (float8)(kt[0], kt[1], kt[2], kt[3], kt[4], kt[5], kt[6], kt[7]);
                V8[e] = (float8)(vt[0], vt[1], vt[2], vt[3], vt[4], vt[5], vt[6], vt[7]);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        const int jlo = (int)(att_max(clo, j0) - j0), jhi = (int)(att_min(chi, j0 + n) - j0);
        if (live && jlo < jhi) {
            const int c0 = jlo / 8, c1 = (jhi + 7) / 8;   /* score chunks covering [jlo, jhi) */
            int j = jlo;
            for (; j + 8 <= jhi; j += 8) {   /* eight keys per pass: each q chunk loaded once for eight */
                __local const float8 *kr = K8 + j * D8;
                float8 a0 = (float8)(0.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
                for (int c = 0; c < D8; c++) {
                    const float8 qc = q8[c];
                    a0 += qc * kr[c];
                    a1 += qc * kr[D8 + c];
                    a2 += qc * kr[2 * D8 + c];
                    a3 += qc * kr[3 * D8 + c];
                    a4 += qc * kr[4 * D8 + c];
                    a5 += qc * kr[5 * D8 + c];
                    a6 += qc * kr[6 * D8 + c];
                    a7 += qc * kr[7 * D8 + c];
                }
                sf[j] = att_hsum(a0) * scale;
                sf[j + 1] = att_hsum(a1) * scale;
                sf[j + 2] = att_hsum(a2) * scale;
                sf[j + 3] = att_hsum(a3) * scale;
                sf[j + 4] = att_hsum(a4) * scale;
                sf[j + 5] = att_hsum(a5) * scale;
                sf[j + 6] = att_hsum(a6) * scale;
                sf[j + 7] = att_hsum(a7) * scale;
            }
            for (; j < jhi; j++) {
                __local const float8 *kr = K8 + j * D8;
                float8 a0 = (float8)(0.0f);
                for (int c = 0; c < D8; c++) a0 += q8[c] * kr[c];
                sf[j] = att_hsum(a0) * scale;
            }
            for (j = 8 * c0; j < jlo; j++) sf[j] = 0.0f;
            for (j = jhi; j < 8 * c1; j++) sf[j] = 0.0f;
            if (softcap > 0.0f)
                for (int c = c0; c < c1; c++) s8[c] = softcap * tanh(s8[c] / softcap);
            for (j = 8 * c0; j < jlo; j++) sf[j] = -INFINITY;   /* masked: exp gives 0 */
            for (j = jhi; j < 8 * c1; j++) sf[j] = -INFINITY;
            float8 mx8 = (float8)(m);
            for (int c = c0; c < c1; c++) mx8 = s8[c] > mx8 ? s8[c] : mx8;
            const float4 mx4 = mx8.lo > mx8.hi ? mx8.lo : mx8.hi;
            const float2 mx2 = mx4.lo > mx4.hi ? mx4.lo : mx4.hi;
            const float mx = mx2.x > mx2.y ? mx2.x : mx2.y;
            const float alpha = exp(m - mx);   /* 0 on the row's first allowed tile (m = -inf) */
            float8 sum8 = (float8)(0.0f);
            for (int c = c0; c < c1; c++) {
                s8[c] = exp(s8[c] - mx);
                sum8 += s8[c];
            }
            for (int c = 0; c < D8; c++) O8[c] *= alpha;
            for (j = jlo; j + 4 <= jhi; j += 4) {   /* O += p v, four keys per pass over O */
                __local const float8 *vr = V8 + j * D8;
                const float p0 = sf[j], p1 = sf[j + 1], p2 = sf[j + 2], p3 = sf[j + 3];
                for (int c = 0; c < D8; c++)
                    O8[c] += p0 * vr[c] + p1 * vr[D8 + c] + p2 * vr[2 * D8 + c] + p3 * vr[3 * D8 + c];
            }
            for (; j < jhi; j++) {
                __local const float8 *vr = V8 + j * D8;
                const float p0 = sf[j];
                for (int c = 0; c < D8; c++) O8[c] += p0 * vr[c];
            }
            l = l * alpha + att_hsum(sum8);
            m = mx;
        }
        barrier(CLK_LOCAL_MEM_FENCE);   /* the next tile overwrites K8 / V8 */
    }
    if (!live) return;
    const long t = q0 + i;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const float *Of = (const float *)O8;
    __global TSR_T *orow = out + (t * Hq + h) * D;
    for (int d = 0; d < D; d++) tsr_st(orow, d, Of[d] * inv);
    lse[h * Tq + t] = l > 0.0f ? m + log(l) : -INFINITY;
}
