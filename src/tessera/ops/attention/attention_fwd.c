/* attention_fwd.c -- tiled online-softmax attention forward (FlashAttention-2, Dao 2023, Alg. 1).
 *
 * Inputs are packed varlen (tokens, heads, D) with int64 token/head strides (unit last stride),
 * cu_q / cu_k int32 (B+1,).  A pre-pass packs every key block once: K^T (D x BN, fp32 or bf16 pairs)
 * and V (BN x D, fp32) per (key block, kv head).  One work item = (sequence b, kv head hk, block
 * of BM queries); it walks the key blocks overlapping [lo, hi) -- the keys any of its rows may see
 * (blocks outside the causal/sliding window are never touched) -- and reuses each packed tile
 * for all G = Hq / Hk q heads of the GQA group.
 * Per head: S = Q K^T (tsr_attn_mm), scale/softcap, mask (per row the allowed column range
 * [clo, chi), bottom-right aligned: off = Lk - Lq), online softmax (running max m, sum l,
 * O rescaled by exp(m_old - m_new) when the max grows), O += P V.  End: out = O / l,
 * lse = m + log l; a row that never saw an allowed key keeps l = 0: out = 0, lse = -inf.
 * All accumulation is fp32; bf16 inputs take Q K^T with VDPBF16PS where the CPU has it
 * (attn_tiles.c).  Items are handed out dynamically (OpenMP), heaviest first.
 */
#include "attn_tiles.h"

typedef struct {
    const char *q, *k, *v;
    int64_t sqt, sqh, skt, skh, svt, svh;
    const int32_t *cu_q, *cu_k;
    int64_t Hq, Hk, D, DP, G, Tq;
    float scale, softcap;
    int64_t wl, wr;
    char *out;
    float *lse;
    int dtype, bfdp;
    int64_t BM;     /* query rows per work item (ATT_BM or a multiple of it) */
    const float *kv; /* packed K^T / V tiles of every (key block, kv head), see pack_kv */
    const int64_t *pre_k;
} fwd_args;

/* the packed (K^T, V) tile pair of key block kb of sequence b, kv head hk */
static const float *kv_tile(const fwd_args *a, int64_t b, int64_t kb, int64_t hk) {
    return a->kv + ((a->pre_k[b] + kb) * a->Hk + hk) * 2 * ATT_BN * a->DP;
}

/* pre-pass: K^T (D x BN, score operand) and V (BN x DP, fp32) of one key block, packed once for all
 * the query blocks that read it (instead of once per query block) */
static void pack_kv(const fwd_args *a, int64_t b, int64_t kb, int64_t hk) {
    const int64_t es = tsr_elsize(a->dtype), k0 = a->cu_k[b], j0 = kb * ATT_BN;
    const int64_t n = att_min(ATT_BN, a->cu_k[b + 1] - k0 - j0);
    float *Kt = (float *)kv_tile(a, b, kb, hk), *V = Kt + ATT_BN * a->DP;
    tsr_attn_pack_t(Kt, ATT_BN, a->k + ((k0 + j0) * a->skt + hk * a->skh) * es, a->skt, n, a->D, a->dtype, a->bfdp);
    tsr_attn_load_rows(V, a->DP, a->v + ((k0 + j0) * a->svt + hk * a->svh) * es, a->svt, n, att_r16(n), a->D,
                       a->dtype);
}

typedef struct { float *Q, *O, *S, *m, *l; } fwd_ws;

static void fwd_item(const fwd_args *a, fwd_ws *w, int64_t b, int64_t blk, int64_t hk) {
    const int64_t es = tsr_elsize(a->dtype), D = a->D, DP = a->DP, G = a->G;
    const int64_t q0 = a->cu_q[b], Lq = a->cu_q[b + 1] - q0, k0 = a->cu_k[b], Lk = a->cu_k[b + 1] - k0;
    const int64_t i0 = blk * a->BM, m = att_min(a->BM, Lq - i0), off = Lk - Lq;
    int64_t lo = 0, hi = Lk;
    if (a->wl >= 0) lo = att_max(0, i0 + off - a->wl);
    if (a->wr >= 0) hi = att_min(Lk, i0 + m - 1 + off + a->wr + 1);
    for (int64_t g = 0; g < G; g++) {
        const int64_t h = hk * G + g;
        tsr_attn_pack_rows(w->Q + g * a->BM * DP, DP, a->q + ((q0 + i0) * a->sqt + h * a->sqh) * es, a->sqt, m,
                           m, D, a->dtype, a->bfdp);
        memset(w->O + g * a->BM * DP, 0, (size_t)(m * DP) * 4);
        for (int64_t r = 0; r < m; r++) { w->m[g * a->BM + r] = -INFINITY; w->l[g * a->BM + r] = 0.0f; }
    }
    for (int64_t j0 = lo / ATT_BN * ATT_BN; j0 < hi; j0 += ATT_BN) {   /* aligned blocks; the window masks */
        const int64_t n = att_min(ATT_BN, Lk - j0), NP = att_r16(n);
        const float *Kt = kv_tile(a, b, j0 / ATT_BN, hk), *V = Kt + ATT_BN * DP;
        for (int64_t g = 0; g < G; g++) {
            float *O = w->O + g * a->BM * DP, *mr = w->m + g * a->BM, *lr = w->l + g * a->BM;
            tsr_attn_smm(m, NP, D, w->Q + g * a->BM * DP, DP, Kt, ATT_BN, w->S, ATT_BN, a->bfdp);
            for (int64_t r = 0; r < m; r++) {
                float *s = w->S + r * ATT_BN;
                const int64_t gi = i0 + r + off;
                int64_t clo = 0, chi = n;
                if (a->wl >= 0) clo = att_max(clo, gi - a->wl - j0);
                if (a->wr >= 0) chi = att_min(chi, gi + a->wr + 1 - j0);
                if (chi <= clo) { memset(s, 0, (size_t)NP * 4); continue; }
                const float mold = mr[r];
                float mnew, sum;
                if (a->softcap > 0.0f) {
                    tsr_attn_scores(s, NP, a->scale, a->softcap, NULL);
                    for (int64_t c = 0; c < clo; c++) s[c] = -INFINITY;
                    for (int64_t c = chi; c < NP; c++) s[c] = -INFINITY;
                    const float mx = tsr_attn_max(s, clo, chi);
                    mnew = mold > mx ? mold : mx;
                    sum = tsr_attn_exp_sum(s, NP, mnew);
                } else {
                    sum = tsr_attn_row_step(s, NP, a->scale, clo, chi, mold, &mnew);
                }
                if (mold != -INFINITY && mold < mnew) {
                    const float alpha = expf(mold - mnew);
                    lr[r] *= alpha;
                    float *o = O + r * DP;
#pragma omp simd
                    for (int64_t d = 0; d < DP; d++) o[d] *= alpha;
                }
                lr[r] += sum;
                mr[r] = mnew;
            }
            tsr_attn_mm(m, DP, NP, w->S, ATT_BN, 1, V, DP, O, DP, 1);
        }
    }
    for (int64_t g = 0; g < G; g++) {
        const int64_t h = hk * G + g;
        for (int64_t r = 0; r < m; r++) {
            const int64_t t = q0 + i0 + r;
            const float l = w->l[g * a->BM + r], inv = l > 0.0f ? 1.0f / l : 0.0f;
            float *o = w->O + (g * a->BM + r) * DP;
#pragma omp simd
            for (int64_t d = 0; d < D; d++) o[d] *= inv;
            tsr_store_conv(a->out + ((t * a->Hq + h) * D) * es, o, D, a->dtype);
            a->lse[h * a->Tq + t] = l > 0.0f ? w->m[g * a->BM + r] + logf(l) : -INFINITY;
        }
    }
}

int tsr_attn_fwd(const void *q, int64_t sqt, int64_t sqh, const void *k, int64_t skt, int64_t skh, const void *v,
                 int64_t svt, int64_t svh, const int32_t *cu_q, const int32_t *cu_k, int64_t B, int64_t Hq,
                 int64_t Hk, int64_t D, float scale, int64_t wl, int64_t wr, float softcap, void *out, float *lse,
                 int dtype, int64_t bm, int threads) {
    fwd_args a = {(const char *)q, (const char *)k, (const char *)v, sqt, sqh, skt, skh, svt, svh, cu_q, cu_k,
                  Hq, Hk, D, att_r16(D), Hq / Hk, cu_q[B], scale, softcap, wl, wr, (char *)out, lse, dtype,
                  tsr_attn_bf16dp(dtype), bm, NULL, NULL};
    int64_t *pre = att_prefix(cu_q, B, bm), *pre_k = att_prefix(cu_k, B, ATT_BN);
    float *kv = pre_k ? tsr_scratch(pre_k[B] * Hk * 2 * ATT_BN * a.DP) : NULL;
    if (!pre || !pre_k || !kv) { free(pre); free(pre_k); free(kv); return TSR_ENOMEM; }
    a.kv = kv;
    a.pre_k = pre_k;
    const int64_t total = pre[B] * Hk, nkv = pre_k[B] * Hk, DP = a.DP, G = a.G;
    int rc = TSR_OK;
#pragma omp parallel num_threads(tsr_threads(threads))
    {
        fwd_ws w = {0};
#pragma omp for schedule(static)
        for (int64_t it = 0; it < nkv; it++) {
            const int64_t p = it / Hk, b = att_find(pre_k, B, p);
            pack_kv(&a, b, p - pre_k[b], it % Hk);
        }
        float *buf = tsr_scratch(2 * G * bm * DP + bm * ATT_BN + 2 * G * bm);
        if (!buf) {
#pragma omp atomic write
            rc = TSR_ENOMEM;
        } else {
            w.Q = buf; w.O = w.Q + G * bm * DP;
            w.S = w.O + G * bm * DP; w.m = w.S + bm * ATT_BN; w.l = w.m + G * bm;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < total; it++) {
            if (!buf) continue;
            const int64_t idx = total - 1 - it, p = idx / Hk, hk = idx % Hk;   /* last (heaviest) blocks first */
            const int64_t b = att_find(pre, B, p);
            fwd_item(&a, &w, b, p - pre[b], hk);
        }
        free(buf);
    }
    free(pre); free(pre_k); free(kv);
    return rc;
}
