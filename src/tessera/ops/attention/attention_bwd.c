/* attention_bwd.c -- attention backward: recompute P from lse, race-free, no atomics, deterministic.
 *
 *   P = exp(s - lse), dP = dO V^T, D_i = <dO_i, O_i>, dS = P (dP - D_i) [(1 - (s/softcap)^2)],
 *   dQ = scale dS K,  dK = scale dS^T Q,  dV = P^T dO     (dK, dV summed over the GQA group)
 *
 * Single-pass mode (default when the (sequence, kv head) items keep every thread busy): one item
 * per (sequence, kv head) runs pass 1 below over all its key blocks and also accumulates
 * dQ += dS K into a per-thread fp32 buffer of the sequence -- 5 tile products per tile pair.
 * Otherwise (few heads, many threads, or a huge sequence) the two-pass scheme below.  Both give
 * bit-identical results (every output row sums its terms in the same order).
 *
 * Pre-passes: D_i for every (token, q head), fp32; every key block packed once (K^T and V^T as
 * score operands, K as fp32 rows) for both passes.
 * Pass 1 (dK, dV): one item per (sequence, kv head, block of ATT_BN keys); it loops over every
 * q head of the group and every query block that can see these keys: S = Q K^T, dP = dO V^T, then dV += P^T dO and dK += dS^T Q read P and dS
 * transposed in place (tsr_attn_mm's strided A operand).  Each item owns its dK/dV rows.
 * Pass 2 (dQ): one item per (sequence, kv head, block of ATT_BM queries), walking the key blocks
 * as the forward does (each packed tile serves the whole GQA group); it owns its dQ rows.
 * The score tiles are recomputed in both passes (7 tile products instead of 5, in exchange for
 * no atomics and no (Lq, Lk) buffer).  bf16 inputs take the four score-type products (S and dP of
 * both passes) with VDPBF16PS where the CPU has it (attn_tiles.c).  Rows with lse = -inf
 * (no allowed key) get zero gradients.
 */
#include "attn_tiles.h"

typedef struct {
    const char *q, *k, *v, *dout;
    int64_t sqt, sqh, skt, skh, svt, svh, sdt, sdh;
    const int32_t *cu_q, *cu_k;
    int64_t Hq, Hk, D, DP, G, Tq;
    float scale, softcap;
    int64_t wl, wr;
    const float *lse, *Di;
    char *dq, *dk, *dv;
    int dtype, bfdp;
    const float *kv;          /* packed K^T, V^T (score operands) and K (fp32 rows) per key block */
    const int64_t *pre_k;
} bwd_args;

#define KV_TILE (3 * ATT_BN * a->DP)

/* the packed (K^T, V^T, K) tiles of key block kb of sequence b, kv head hk */
static const float *kv_tile(const bwd_args *a, int64_t b, int64_t kb, int64_t hk) {
    return a->kv + ((a->pre_k[b] + kb) * a->Hk + hk) * KV_TILE;
}

#define PTR(base, t, st, h, sh) ((base) + ((t) * (st) + (h) * (sh)) * es)

/* pre-pass: pack one key block once for both passes and every query block */
static void pack_kv(const bwd_args *a, int64_t b, int64_t kb, int64_t hk) {
    const int64_t es = tsr_elsize(a->dtype), D = a->D, DP = a->DP, BN = ATT_BN, k0 = a->cu_k[b], j0 = kb * BN;
    const int64_t n = att_min(BN, a->cu_k[b + 1] - k0 - j0);
    float *Kt = (float *)kv_tile(a, b, kb, hk), *Vt = Kt + DP * BN, *Kp = Vt + DP * BN;
    tsr_attn_pack_t(Kt, BN, PTR(a->k, k0 + j0, a->skt, hk, a->skh), a->skt, n, D, a->dtype, a->bfdp);
    tsr_attn_pack_t(Vt, BN, PTR(a->v, k0 + j0, a->svt, hk, a->svh), a->svt, n, D, a->dtype, a->bfdp);
    tsr_attn_load_rows(Kp, DP, PTR(a->k, k0 + j0, a->skt, hk, a->skh), a->skt, n, att_r16(n), D, a->dtype);
}

/* P and dS for rows [0, m) of a (query block i0, key block j0) tile pair: S (scores, in: Q K^T,
 * out: P) and dP (in: dO V^T, out: dS = P (dP - D_i) [dcap] scale); rows/columns outside the
 * window, padding columns and rows with lse = -inf get P = dS = 0. */
static void tile_rows(const bwd_args *a, float *S, float *dP, float *F, int64_t m, int64_t n, int64_t NP,
                      int64_t i0, int64_t j0, int64_t off, int64_t h, int64_t t0) {
    for (int64_t r = 0; r < m; r++) {
        float *s = S + r * ATT_BN, *dp = dP + r * ATT_BN, *f = a->softcap > 0.0f ? F + r * ATT_BN : NULL;
        const float l = a->lse[h * a->Tq + t0 + r];
        const int64_t gi = i0 + r + off;
        int64_t clo = 0, chi = n;
        if (a->wl >= 0) clo = att_max(clo, gi - a->wl - j0);
        if (a->wr >= 0) chi = att_min(chi, gi + a->wr + 1 - j0);
        if (chi <= clo || l == -INFINITY) {
            memset(s, 0, (size_t)NP * 4);
            memset(dp, 0, (size_t)NP * 4);
            continue;
        }
        tsr_attn_scores(s, NP, a->scale, a->softcap, f);
        for (int64_t c = 0; c < clo; c++) s[c] = -INFINITY;
        for (int64_t c = chi; c < NP; c++) s[c] = -INFINITY;
        tsr_attn_exp_sum(s, NP, l);
        tsr_attn_ds(dp, s, NP, a->Di[h * a->Tq + t0 + r], NULL, f, a->scale);
    }
}

/* workspace floats of one item (either pass) */
static int64_t ws_floats(int64_t DP, int64_t G) {
    const int64_t BM = ATT_BM, BN = ATT_BN;
    const int64_t p1 = 4 * BM * DP + 3 * BM * BN + 2 * BN * DP;
    const int64_t p2 = 3 * G * BM * DP + 3 * BM * BN;
    return p1 > p2 ? p1 : p2;
}

/* dQs != NULL (single-pass mode): also dQ[g][i] += dS K into the sequence's fp32 dQ buffer
 * (G x Lq x DP), owned by this item's thread for the whole (sequence, kv head). */
static void dkdv_item(const bwd_args *a, float *w, int64_t b, int64_t kb, int64_t hk, float *dQs) {
    const int64_t es = tsr_elsize(a->dtype), D = a->D, DP = a->DP, BM = ATT_BM, BN = ATT_BN;
    const int64_t q0 = a->cu_q[b], Lq = a->cu_q[b + 1] - q0, k0 = a->cu_k[b], Lk = a->cu_k[b + 1] - k0;
    const int64_t off = Lk - Lq, j0 = kb * BN, n = att_min(BN, Lk - j0), NP = att_r16(n);
    const float *Kt = kv_tile(a, b, kb, hk), *Vt = Kt + DP * BN, *Kp = Vt + DP * BN;
    float *Qs = w, *dOs = Qs + BM * DP, *Qr = dOs + BM * DP;
    float *dOr = Qr + BM * DP, *S = dOr + BM * DP, *dP = S + BM * BN, *F = dP + BM * BN, *dK = F + BM * BN;
    float *dV = dK + BN * DP;
    int64_t ilo = 0, ihi = Lq;
    if (a->wr >= 0) ilo = att_max(0, j0 - off - a->wr);
    if (a->wl >= 0) ihi = att_min(Lq, j0 + n - 1 - off + a->wl + 1);
    memset(dK, 0, (size_t)(2 * BN * DP) * 4);
    for (int64_t g = 0; g < a->G; g++) {
        const int64_t h = hk * a->G + g;
        for (int64_t i0 = ilo; i0 < ihi; i0 += BM) {
            const int64_t m = att_min(BM, ihi - i0), t0 = q0 + i0;
            const char *qp = PTR(a->q, t0, a->sqt, h, a->sqh), *dop = PTR(a->dout, t0, a->sdt, h, a->sdh);
            tsr_attn_pack_rows(Qs, DP, qp, a->sqt, m, m, D, a->dtype, a->bfdp);
            tsr_attn_pack_rows(dOs, DP, dop, a->sdt, m, m, D, a->dtype, a->bfdp);
            const float *Q = Qs, *dO = dOs;
            if (a->bfdp) {   /* the fp32 copies for the dK, dV products */
                tsr_attn_load_rows(Qr, DP, qp, a->sqt, m, m, D, a->dtype);
                tsr_attn_load_rows(dOr, DP, dop, a->sdt, m, m, D, a->dtype);
                Q = Qr; dO = dOr;
            }
            tsr_attn_smm(m, NP, D, Qs, DP, Kt, BN, S, BN, a->bfdp);
            tsr_attn_smm(m, NP, D, dOs, DP, Vt, BN, dP, BN, a->bfdp);
            tile_rows(a, S, dP, F, m, n, NP, i0, j0, off, h, t0);
            tsr_attn_mm(n, DP, m, S, 1, BN, dO, DP, dV, DP, 1);    /* dV += P^T dO  */
            tsr_attn_mm(n, DP, m, dP, 1, BN, Q, DP, dK, DP, 1);    /* dK += dS^T Q  */
            if (dQs) tsr_attn_mm(m, DP, NP, dP, BN, 1, Kp, DP, dQs + (g * Lq + i0) * DP, DP, 1);  /* dQ += dS K */
        }
    }
    for (int64_t jr = 0; jr < n; jr++) {
        const int64_t t = k0 + j0 + jr;
        tsr_store_conv(a->dk + ((t * a->Hk + hk) * D) * es, dK + jr * DP, D, a->dtype);
        tsr_store_conv(a->dv + ((t * a->Hk + hk) * D) * es, dV + jr * DP, D, a->dtype);
    }
}

/* single-pass mode: one item per (sequence, kv head) computes dK, dV and dQ (5 tile products per
 * tile pair instead of 7); deterministic, since the item owns all three outputs of its rows. */
static void seq_item(const bwd_args *a, float *w, float *dQs, int64_t b, int64_t hk) {
    const int64_t es = tsr_elsize(a->dtype), D = a->D, DP = a->DP, G = a->G;
    const int64_t q0 = a->cu_q[b], Lq = a->cu_q[b + 1] - q0, Lk = a->cu_k[b + 1] - a->cu_k[b];
    memset(dQs, 0, (size_t)(G * Lq * DP) * 4);
    for (int64_t kb = 0; kb * ATT_BN < Lk; kb++) dkdv_item(a, w, b, kb, hk, dQs);
    for (int64_t g = 0; g < G; g++)
        for (int64_t i = 0; i < Lq; i++)
            tsr_store_conv(a->dq + (((q0 + i) * a->Hq + hk * G + g) * D) * es, dQs + (g * Lq + i) * DP, D, a->dtype);
}

static void dq_item(const bwd_args *a, float *w, int64_t b, int64_t blk, int64_t hk) {
    const int64_t es = tsr_elsize(a->dtype), D = a->D, DP = a->DP, G = a->G, BM = ATT_BM, BN = ATT_BN;
    const int64_t q0 = a->cu_q[b], Lq = a->cu_q[b + 1] - q0, k0 = a->cu_k[b], Lk = a->cu_k[b + 1] - k0;
    const int64_t i0 = blk * BM, m = att_min(BM, Lq - i0), off = Lk - Lq, t0 = q0 + i0;
    float *Q = w, *dO = Q + G * BM * DP;
    float *dQ = dO + G * BM * DP, *S = dQ + G * BM * DP, *dP = S + BM * BN, *F = dP + BM * BN;
    int64_t lo = 0, hi = Lk;
    if (a->wl >= 0) lo = att_max(0, i0 + off - a->wl);
    if (a->wr >= 0) hi = att_min(Lk, i0 + m - 1 + off + a->wr + 1);
    for (int64_t g = 0; g < G; g++) {
        const int64_t h = hk * G + g;
        tsr_attn_pack_rows(Q + g * BM * DP, DP, PTR(a->q, t0, a->sqt, h, a->sqh), a->sqt, m, m, D, a->dtype, a->bfdp);
        tsr_attn_pack_rows(dO + g * BM * DP, DP, PTR(a->dout, t0, a->sdt, h, a->sdh), a->sdt, m, m, D, a->dtype,
                           a->bfdp);
    }
    memset(dQ, 0, (size_t)(G * BM * DP) * 4);
    for (int64_t j0 = lo / BN * BN; j0 < hi; j0 += BN) {   /* aligned (pre-packed) blocks; the window masks */
        const int64_t n = att_min(BN, Lk - j0), NP = att_r16(n);
        const float *Kt = kv_tile(a, b, j0 / BN, hk), *Vt = Kt + DP * BN, *Kp = Vt + DP * BN;
        for (int64_t g = 0; g < G; g++) {
            tsr_attn_smm(m, NP, D, Q + g * BM * DP, DP, Kt, BN, S, BN, a->bfdp);
            tsr_attn_smm(m, NP, D, dO + g * BM * DP, DP, Vt, BN, dP, BN, a->bfdp);
            tile_rows(a, S, dP, F, m, n, NP, i0, j0, off, hk * G + g, t0);
            tsr_attn_mm(m, DP, NP, dP, BN, 1, Kp, DP, dQ + g * BM * DP, DP, 1);   /* dQ += dS K */
        }
    }
    for (int64_t g = 0; g < G; g++)
        for (int64_t r = 0; r < m; r++)
            tsr_store_conv(a->dq + (((t0 + r) * a->Hq + hk * G + g) * D) * es, dQ + (g * BM + r) * DP, D, a->dtype);
}

int tsr_attn_bwd(const void *dout, int64_t sdt, int64_t sdh, const void *q, int64_t sqt, int64_t sqh,
                 const void *k, int64_t skt, int64_t skh, const void *v, int64_t svt, int64_t svh,
                 const void *out, int64_t sot, int64_t soh, const float *lse, const int32_t *cu_q,
                 const int32_t *cu_k, int64_t B, int64_t Hq, int64_t Hk, int64_t D, float scale, int64_t wl,
                 int64_t wr, float softcap, void *dq, void *dk, void *dv, int dtype, int mode, int threads) {
    const int64_t Tq = cu_q[B], DP = att_r16(D), G = Hq / Hk, es = tsr_elsize(dtype);
    float *Di = tsr_scratch(Hq * Tq);
    int64_t *pre_q = att_prefix(cu_q, B, ATT_BM), *pre_k = att_prefix(cu_k, B, ATT_BN);
    float *kv = pre_k ? tsr_scratch(pre_k[B] * Hk * 3 * ATT_BN * DP) : NULL;
    if (!Di || !pre_q || !pre_k || !kv) { free(Di); free(pre_q); free(pre_k); free(kv); return TSR_ENOMEM; }
    bwd_args a = {(const char *)q, (const char *)k, (const char *)v, (const char *)dout, sqt, sqh, skt, skh, svt,
                  svh, sdt, sdh, cu_q, cu_k, Hq, Hk, D, DP, G, Tq, scale, softcap, wl, wr, lse, Di,
                  (char *)dq, (char *)dk, (char *)dv, dtype, tsr_attn_bf16dp(dtype), kv, pre_k};
    const int64_t n1 = pre_k[B] * Hk, n2 = pre_q[B] * Hk, nt = tsr_threads(threads);
    int64_t max_q = 0;
    for (int64_t b = 0; b < B; b++) max_q = att_max(max_q, (int64_t)cu_q[b + 1] - cu_q[b]);
    /* single pass when the (sequence, kv head) items keep every thread busy and a per-thread fp32 dQ
     * buffer of one sequence's group stays small; otherwise the two-pass scheme (finer items) */
    const int fits = max_q * G * DP <= ((int64_t)1 << 24);   /* mode: -1 auto, 0 two-pass, 1 single if it fits */
    const int single = fits && (mode == 1 || (mode < 0 && (B * Hk % nt == 0 || B * Hk >= 4 * nt)));
    int rc = TSR_OK;
#pragma omp parallel num_threads(tsr_threads(threads))
    {
        float *row = tsr_scratch(2 * DP), *w = tsr_scratch(ws_floats(DP, G));
        float *dQs = single ? tsr_scratch(max_q * G * DP) : NULL;
        if (!row || !w || (single && !dQs)) {
#pragma omp atomic write
            rc = TSR_ENOMEM;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < Tq; t++) {
            if (!row) continue;
            for (int64_t h = 0; h < Hq; h++) {
                if (a.bfdp) {
                    Di[h * Tq + t] = tsr_attn_dot_bf16((const uint16_t *)dout + t * sdt + h * sdh,
                                                       (const uint16_t *)out + t * sot + h * soh, D);
                    continue;
                }
                tsr_load_f32(row, (const char *)dout + (t * sdt + h * sdh) * es, D, dtype);
                tsr_load_f32(row + DP, (const char *)out + (t * sot + h * soh) * es, D, dtype);
                /* sequential fp32 FMA chain over d: the same operation order as the dP = dO V^T tile
                 * product, so a one-hot row (out_i == v_j) gives dP_ij - D_i == 0 exactly */
                float s = 0.0f;
                for (int64_t d = 0; d < D; d++) s += row[d] * row[DP + d];
                Di[h * Tq + t] = s;
            }
        }
#pragma omp for schedule(static)
        for (int64_t it = 0; it < n1; it++) {
            const int64_t p = it / Hk, b = att_find(pre_k, B, p);
            pack_kv(&a, b, p - pre_k[b], it % Hk);
        }
        if (single) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < B * Hk; it++) {
                if (!w || !dQs) continue;
                seq_item(&a, w, dQs, it / Hk, it % Hk);
            }
        } else {
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n1; it++) {
            if (!w) continue;
            const int64_t p = it / Hk, b = att_find(pre_k, B, p);   /* early key blocks see the most queries */
            dkdv_item(&a, w, b, p - pre_k[b], it % Hk, NULL);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n2; it++) {
            if (!w) continue;
            const int64_t idx = n2 - 1 - it, p = idx / Hk, b = att_find(pre_q, B, p);
            dq_item(&a, w, b, p - pre_q[b], idx % Hk);
        }
        }
        free(row);
        free(w);
        free(dQs);
    }
    free(Di); free(pre_q); free(pre_k); free(kv);
    return rc;
}
