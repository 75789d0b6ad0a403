/* Paged decode attention (one query token per sequence), flash-decoding on the CPU.
 *
 * Task = (sequence b, split s): the keys [t0, t1) of split s, for every kv head h and the G = Hq/Hk
 * query heads sharing it (each K/V byte is read once per call).  Keys go by chunks (at the avx512
 * level 32 tokens for 16/32-bit caches and 64 for 8-bit ones, df_chunk_keys; CH elsewhere)
 * through the page table (token t: page block_table[b, t / P], slot t % P); inside a chunk the kv
 * heads are taken in turn, so the task streams whole token rows (all heads are contiguous in NHD
 * pages).  Per (chunk, head):
 *   scores  s[g][i] = <q_g, k_i> * scale (* k_scale_i for int8/fp8: the dequantisation is folded
 *                     into the score, not applied per element); softcap: cap * tanh(s / cap)
 *   online softmax  m' = max(m, max_i s), alpha = e^(m - m'), p = e^(s - m'), l = l alpha + sum p
 *   acc[g] = acc[g] alpha + sum_i p[g][i] (* v_scale_i) v_i
 * and (avx512) head h's rows of the next chunk are prefetched into L2 a few lines at a time while
 * head h computes (df_heads; measured 1.9x faster from DRAM than no prefetch or one burst per
 * (chunk, head), the old scheme).  The running (m, l, acc) of a
 * task live in per-thread scratch; each (b, h, s) then leaves a partial (m, l, acc) in part, and
 * a second pass combines the splits of each (b, h, g):
 *   M = max m_s, out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s   (0 when there is no key).
 *
 * Inner loops: at the avx512 level decode_fast.h (16 dot products per transpose-reduction;
 * vdpbf16ps for bf16 q over a bf16 cache, int16 vpdpwssd for bf16/fp16 q over an int8 cache,
 * fp32 FMAs otherwise; see there for the numerics; the CPU features are checked at run time).
 * Other levels: the portable loop below (keys converted 16 at a time to fp32, GB query heads
 * sharing every converted K/V vector, horizontal sums four at a time).  fp32 accumulation.
 * Compute per (key, kv head), G = 4, D = 128, one Zen4 thread, L2-resident, bf16 q: 21 ns bf16
 * cache, 21 ns int8, 31 ns fp16 (fp32 FMAs), against 45-50 ns for the previous kernel.
 */
#include "splits.h"
#include "tessera_avx512.h"

enum { DA_I8 = 8, DA_F8 = 9, CH = 64 };
#define INL static inline __attribute__((always_inline))

typedef int8_t v16b __attribute__((vector_size(16)));
typedef uint8_t v16ub __attribute__((vector_size(16)));
typedef int32_t v16i __attribute__((vector_size(64)));

INL int cache_es(int cd) { return cd == DA_I8 || cd == DA_F8 ? 1 : tsr_elsize(cd); }

/* 16 cache elements -> fp32 (no scale) */
INL tsr_v16 ld16(const char *p, const int cd) {
    if (cd == DA_I8) {
#ifdef __AVX512F__
        return (tsr_v16)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#else
        v16b b;
        memcpy(&b, p, 16);
        return __builtin_convertvector(b, tsr_v16);
#endif
    }
    if (cd == DA_F8) { /* e4m3fn: magnitude bits moved to fp32's exponent/mantissa, times 2^120 */
        v16ub b;
        memcpy(&b, p, 16);
        const tsr_v16u u = __builtin_convertvector(b, tsr_v16u);
        tsr_v16 f = (tsr_v16)((u & 0x7fu) << 20) * 0x1p120f;
        tsr_v16u r = (tsr_v16u)f | ((u & 0x80u) << 24);
        const tsr_v16u nan = (tsr_v16u)((u & 0x7fu) == 0x7fu);
        return (tsr_v16)((r & ~nan) | (0x7fc00000u & nan));
    }
    return tsr_v16_load(p, cd);
}

INL float ld1(const char *p, const int cd) {
    if (cd == DA_I8) return (float)*(const int8_t *)p;
    if (cd == DA_F8) { uint8_t b[16] = {0}; b[0] = *(const uint8_t *)p; return ld16((const char *)b, DA_F8)[0]; }
    if (cd == TSR_F32) { float f; memcpy(&f, p, 4); return f; }
    uint16_t h; memcpy(&h, p, 2);
    return cd == TSR_F16 ? tsr_h2f(h) : tsr_bf2f(h);
}

INL float hsum(tsr_v16 v) {
#ifdef __AVX512F__
    return _mm512_reduce_add_ps((__m512)v);
#else
    return tsr_v16_sum(v);
#endif
}

/* out[u] = sum of the lanes of a[u], u < n; four vectors at a time share the shuffles */
INL void hsum_n(const tsr_v16 *a, float *out, const int n) {
#ifdef __AVX512F__
    if (n % 4 == 0) {
        for (int u = 0; u < n; u += 4) {
            const __m512 x0 = (__m512)a[u], x1 = (__m512)a[u + 1], x2 = (__m512)a[u + 2], x3 = (__m512)a[u + 3];
            /* 256-bit halves: [x0 lo+hi | x1 lo+hi], [x2 lo+hi | x3 lo+hi] */
            const __m512 y01 = _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x44), _mm512_shuffle_f32x4(x0, x1, 0xEE));
            const __m512 y23 = _mm512_add_ps(_mm512_shuffle_f32x4(x2, x3, 0x44), _mm512_shuffle_f32x4(x2, x3, 0xEE));
            /* 128-bit lane k holds 4 partial sums of vector u + k */
            __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(y01, y23, 0x88), _mm512_shuffle_f32x4(y01, y23, 0xDD));
            z = _mm512_add_ps(z, _mm512_permute_ps(z, 0x4E));
            z = _mm512_add_ps(z, _mm512_permute_ps(z, 0xB1));
            float f[16];
            _mm512_storeu_ps(f, z);
            out[u] = f[0]; out[u + 1] = f[4]; out[u + 2] = f[8]; out[u + 3] = f[12];
        }
        return;
    }
#endif
    for (int u = 0; u < n; u++) out[u] = hsum(a[u]);
}

INL tsr_v16 splat(float x) {
#ifdef __AVX512F__
    return (tsr_v16)_mm512_set1_ps(x);
#else
    return (tsr_v16){0} + x;
#endif
}

INL tsr_v16 ldf(const float *p) { tsr_v16 v; memcpy(&v, p, 64); return v; }
INL void stf(float *p, tsr_v16 v) { memcpy(p, &v, 64); }

typedef struct {
    const char *kc, *vc;            /* caches (NB, P, Hk, D) */
    const float *ks, *vs;           /* scales (NB, P, Hk) or NULL */
    const int32_t *bt;              /* (B, MB) */
    int64_t P, Hk, D, MB, G, DP;    /* DP: D rounded up to 32 (stride of q and acc rows) */
    float softcap;
} ctx_t;

/* cache rows of the chunk of keys starting at t0, with prefetches of their K/V lines (and scales) */
INL void rows_of(const ctx_t *c, const int32_t *btrow, int64_t h, int64_t t0, int64_t t1, int64_t *rows,
                 const int64_t es, const int pf) {
    const int64_t nc = t1 - t0 < CH ? t1 - t0 : CH, bytes = c->D * es;
    for (int64_t i = 0; i < nc; i++) {
        const int64_t t = t0 + i, row = (int64_t)btrow[t / c->P] * c->P + t % c->P;
        const int64_t off = (row * c->Hk + h) * bytes;
        rows[i] = row;
        if (!pf) continue;
        for (int64_t o = 0; o < bytes; o += 64) {
            __builtin_prefetch(c->kc + off + o, 0, 2);
            __builtin_prefetch(c->vc + off + o, 0, 2);
        }
        if (pf == 2) {
            __builtin_prefetch(c->ks + row * c->Hk + h, 0, 3);
            __builtin_prefetch(c->vs + row * c->Hk + h, 0, 3);
        }
    }
}

/* keys [t0, t1) (at most CH) of sequence b, kv head h, prefetching keys [nt0, nt1); q: G x D fp32
 * (pre-scaled); m, l: G; acc: G x D (the running state, updated) */
INL void attend(const ctx_t *c, int64_t b, int64_t h, int64_t t0, int64_t t1, int64_t nt0, int64_t nt1, const float *q, float *m,
                float *l, float *acc, float *s, const int cd, const int GB) {
    const int64_t D = c->D, G = c->G, nv = D / 16, es = cache_es(cd);
    const int quant = cd == DA_I8 || cd == DA_F8;
    const int32_t *btrow = c->bt + b * c->MB;
    const char *kr[CH], *vr[CH];
    float ksc[CH], vsc[CH];
    int64_t rows[CH], next[CH];
    /* this chunk's rows; the next chunk's rows of this head are prefetched now, so they arrive
     * while the Hk heads of this chunk compute */
    rows_of(c, btrow, h, t0, t1, rows, es, 0);
    if (nt0 < nt1) rows_of(c, btrow, h, nt0, nt1, next, es, quant ? 2 : 1);
    {
        const int64_t nc = t1 - t0;
        for (int64_t i = 0; i < nc; i++) {
            const int64_t off = (rows[i] * c->Hk + h) * D * es;
            kr[i] = c->kc + off; vr[i] = c->vc + off;
            ksc[i] = quant ? c->ks[rows[i] * c->Hk + h] : 1.0f;
            vsc[i] = quant ? c->vs[rows[i] * c->Hk + h] : 1.0f;
        }
        /* scores */
        for (int64_t i = 0; i < nc; i++) {
            for (int64_t g0 = 0; g0 < G; g0 += GB) {
                tsr_v16 a[GB];
                for (int u = 0; u < GB; u++) a[u] = (tsr_v16){0};
                for (int64_t j = 0; j < nv; j++) {
                    const tsr_v16 kv = ld16(kr[i] + j * 16 * es, cd);
                    for (int u = 0; u < GB; u++) a[u] = tsr_v16_fma(ldf(q + (g0 + u) * c->DP + j * 16), kv, a[u]);
                }
                float hs[GB];
                hsum_n(a, hs, GB);
                for (int u = 0; u < GB; u++) {
                    float d = hs[u];
                    for (int64_t e = nv * 16; e < D; e++) d += q[(g0 + u) * c->DP + e] * ld1(kr[i] + e * es, cd);
                    s[(g0 + u) * CH + i] = d * ksc[i];
                }
            }
        }
        /* online softmax per head */
        for (int64_t g = 0; g < G; g++) {
            float *sg = s + g * CH;
            if (c->softcap > 0.0f)
                for (int64_t i = 0; i < nc; i++) sg[i] = c->softcap * tanhf(sg[i] / c->softcap);
            float mx = m[g];
#pragma omp simd reduction(max : mx)
            for (int64_t i = 0; i < nc; i++) mx = sg[i] > mx ? sg[i] : mx;
            const float alpha = tsr_expf(m[g] - mx);
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t i = 0; i < nc; i++) {
                const float p = tsr_expf(sg[i] - mx);
                sum += p;
                sg[i] = p * vsc[i];
            }
            l[g] = l[g] * alpha + sum;
            m[g] = mx;
            if (alpha != 1.0f)
#pragma omp simd
                for (int64_t d = 0; d < D; d++) acc[g * c->DP + d] *= alpha;
        }
        /* acc += p v */
        for (int64_t j = 0; j < nv; j++) {
            for (int64_t g0 = 0; g0 < G; g0 += GB) {
                tsr_v16 a[GB];
                for (int u = 0; u < GB; u++) a[u] = ldf(acc + (g0 + u) * c->DP + j * 16);
                for (int64_t i = 0; i < nc; i++) {
                    const tsr_v16 vv = ld16(vr[i] + j * 16 * es, cd);
                    for (int u = 0; u < GB; u++) a[u] = tsr_v16_fma(splat(s[(g0 + u) * CH + i]), vv, a[u]);
                }
                for (int u = 0; u < GB; u++) stf(acc + (g0 + u) * c->DP + j * 16, a[u]);
            }
        }
        for (int64_t e = nv * 16; e < D; e++)
            for (int64_t i = 0; i < nc; i++) {
                const float x = ld1(vr[i] + e * es, cd);
                for (int64_t g = 0; g < G; g++) acc[g * c->DP + e] += s[g * CH + i] * x;
            }
    }
}

#define GB_DISPATCH(cdv)                                                                             \
    do {                                                                                             \
        if (G % 8 == 0) attend(c, b, h, t0, t1, nt0, nt1, q, m, l, acc, s, cdv, 8);                             \
        else if (G % 4 == 0) attend(c, b, h, t0, t1, nt0, nt1, q, m, l, acc, s, cdv, 4);                        \
        else if (G % 2 == 0) attend(c, b, h, t0, t1, nt0, nt1, q, m, l, acc, s, cdv, 2);                        \
        else attend(c, b, h, t0, t1, nt0, nt1, q, m, l, acc, s, cdv, 1);                                        \
    } while (0)

static void attend_any(const ctx_t *c, int64_t b, int64_t h, int64_t t0, int64_t t1, int64_t nt0, int64_t nt1,
                       const float *q, float *m,
                       float *l, float *acc, float *s, int cd) {
    const int64_t G = c->G;
    switch (cd) {
    case TSR_F32: GB_DISPATCH(TSR_F32); break;
    case TSR_F16: GB_DISPATCH(TSR_F16); break;
    case TSR_BF16: GB_DISPATCH(TSR_BF16); break;
    case DA_I8: GB_DISPATCH(DA_I8); break;
    default: GB_DISPATCH(DA_F8); break;
    }
}

/* inner-loop kind for (q dtype, cache dtype): TSR_BF16 / DA_I8 / TSR_F32 (decode_fast.h), -1: portable */
static int pick_kind(int qd, int cd, int64_t D) {
#ifdef TSR_AVX512
    if (qd == TSR_BF16 && cd == TSR_BF16 && __builtin_cpu_supports("avx512bf16")) return TSR_BF16;
    if ((qd == TSR_BF16 || qd == TSR_F16) && cd == DA_I8 && D <= 256 && __builtin_cpu_supports("avx512vnni"))
        return DA_I8;
    return TSR_F32;
#else
    (void)qd; (void)cd; (void)D;
    return -1;
#endif
}

/* q of one sequence (Hq x D of q_dtype) -> Hq rows of DP (zero padded): fp32 * scale (TSR_F32 and
 * portable), the bf16 words (TSR_BF16), or int16 with per-head scales qsc (DA_I8: round(q / qsc),
 * qsc = max|q| / 32767). */
static void prep_q(const char *qb, int64_t Hq, int64_t D, int64_t DP, int q_dtype, float scale, int kind, void *dst,
                   float *qsc, float *tmp) {
    for (int64_t j = 0; j < Hq; j++) {
        if (kind == TSR_BF16) {
            uint16_t *d = (uint16_t *)dst + j * DP;
            memcpy(d, qb + j * D * 2, (size_t)D * 2);
            memset(d + D, 0, (size_t)(DP - D) * 2);
            continue;
        }
        tsr_load_f32(tmp, qb + j * D * tsr_elsize(q_dtype), D, q_dtype);
        if (kind == DA_I8) {
            float mx = 0.0f;
#pragma omp simd reduction(max : mx)
            for (int64_t e = 0; e < D; e++) { /* not fmaxf: without -ffast-math that is a libm call per element */
                const float a = fabsf(tmp[e]);
                mx = a > mx ? a : mx;
            }
            const float inv = mx > 0.0f ? 32767.0f / mx : 0.0f;
            int16_t *d = (int16_t *)dst + j * DP;
            qsc[j] = mx / 32767.0f;
            int64_t e = 0;
            for (; e < D; e++) d[e] = (int16_t)(int32_t)rintf(tmp[e] * inv); /* vectorises; lrintf did not */
            for (; e < DP; e++) d[e] = 0;
        } else {
            float *d = (float *)dst + j * DP;
            for (int64_t e = 0; e < DP; e++) d[e] = e < D ? tmp[e] * scale : 0.0f;
        }
    }
}

#ifdef TSR_AVX512
#include "decode_fast.h"
#endif

/* The index checks of the hot path, done here so a call pays no host-side numpy pass: every
 * seq_lens value in [0, MB * P] and every block_table entry of a page a sequence attends to in
 * [0, NB).  Returns 0 and the most keys any sequence attends to, or -1 (the launcher then runs
 * the Python check, which names the bad entry). */
static int64_t da_check(const int32_t *bt, const int32_t *seq_lens, int64_t B, int64_t MB, int64_t P, int64_t NB,
                        int64_t window) {
    int64_t most = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t n = seq_lens[b], lo = da_first_key(n, window);
        if (n < 0 || n > MB * P) return -1;
        for (int64_t j = lo / P; j < (n + P - 1) / P; j++)
            if (bt[b * MB + j] < 0 || bt[b * MB + j] >= NB) return -1;
        most = n - lo > most ? n - lo : most;
    }
    return most;
}

/* q (B, Hq, D) contiguous of q_dtype; out likewise; seq_lens (B,); NB pages in each cache.
 * Splits: each sequence's keys are cut into S splits (a task = one split of one sequence, all kv
 * heads) so that there are at least ~4 tasks per thread, but no split shorter than ~256 keys;
 * one thread below min_par (B Hq D max_keys / 4, the launcher's parallel threshold).
 * Returns TSR_OK, TSR_ENOMEM, or TSR_EINVAL for an index out of range (nothing written). */
int tsr_decode_attention(const void *q, const void *kc, const void *vc, const float *ks, const float *vs,
                         const int32_t *bt, const int32_t *seq_lens, void *out,
                         int64_t B, int64_t Hq, int64_t Hk, int64_t D, int64_t P, int64_t MB, int64_t NB,
                         float scale, float softcap, int64_t window, int q_dtype, int c_dtype, int nthreads,
                         int64_t min_par) {
    if (B <= 0) return TSR_OK;
    const int64_t max_keys = da_check(bt, seq_lens, B, MB, P, NB, window);
    if (max_keys < 0) return TSR_EINVAL;
    if (B * Hq * D * (max_keys > 1 ? max_keys : 1) / 4 < min_par) nthreads = 1;
    const int64_t S = da_splits(B, nthreads, max_keys);
    float *part = malloc((size_t)(B * Hk * S * (Hq / Hk) * (D + 2)) * sizeof(float));
    if (!part) return TSR_ENOMEM;
    const int64_t G = Hq / Hk, DP = (D + 31) / 32 * 32;
    const ctx_t cx = {(const char *)kc, (const char *)vc, ks, vs, bt, P, Hk, D, MB, G, DP, softcap};
    const ctx_t *c = &cx;
    const int64_t qes = tsr_elsize(q_dtype), PS = G * (D + 2), tasks = B * S;
    const int kind = pick_kind(q_dtype, c_dtype, D);
#ifdef TSR_AVX512
    const int64_t ch = kind < 0 ? CH : df_chunk_keys(c_dtype); /* keys per chunk */
#else
    const int64_t ch = CH;
#endif
    int failed = 0;
#pragma omp parallel num_threads(tsr_threads(nthreads)) reduction(| : failed)
    {
        float *qs = tsr_scratch(Hq * DP), *qsc = tsr_scratch(Hq), *s = tsr_scratch(G * CH), *o = tsr_scratch(DP);
        float *w = tsr_scratch(G * CH / 2 + 16), *tg = tsr_scratch(2 * G), *zero = tsr_scratch(Hk * DP);
        float *st = tsr_scratch(Hk * G * (DP + 2));
        int64_t *rows = malloc(2 * CH * sizeof(int64_t));
        if (!qs || !qsc || !s || !o || !w || !tg || !zero || !st || !rows) failed = 1;
        else memset(zero, 0, (size_t)(Hk * DP) * 4);
#ifdef TSR_AVX512
        rows_t R;
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            if (failed) continue;
            const int64_t sp = task % S, b = task / S;
            int64_t t0, t1;
            da_split_keys(seq_lens[b], window, S, sp, &t0, &t1);
            float *sm = st + Hk * G * DP; /* m, l of head h: sm + 2 G h, + G */
            for (int64_t h = 0; h < Hk; h++)
                for (int64_t g = 0; g < G; g++) { sm[2 * G * h + g] = -INFINITY; sm[2 * G * h + G + g] = 0.0f; }
            memset(st, 0, (size_t)(Hk * G * DP) * sizeof(float));
            if (t0 < t1) {
                prep_q((const char *)q + b * Hq * D * qes, Hq, D, DP, q_dtype, scale, kind, qs, qsc, o);
                /* chunks of keys in the outer loop, kv heads inside: a token's K (V) rows of all heads
                 * are contiguous, so the task streams whole pages through the cache */
                for (int64_t c0 = t0; c0 < t1; c0 += ch) {
                    const int64_t c1 = c0 + ch < t1 ? c0 + ch : t1, n1 = c1 + ch < t1 ? c1 + ch : t1;
                    if (kind < 0) {
                        for (int64_t h = 0; h < Hk; h++)
                            attend_any(c, b, h, c0, c1, c1, n1, qs + h * G * DP, sm + 2 * G * h, sm + 2 * G * h + G,
                                       st + h * G * DP, s, c_dtype);
                        continue;
                    }
#ifdef TSR_AVX512
                    chunk_rows(c, bt + b * MB, c0, c1, rows);
                    chunk_rows(c, bt + b * MB, c1, n1, rows + CH);
                    df_heads(&R, c, rows, (int)(c1 - c0), rows + CH, (int)(n1 - c1), c0 == t0, (const char *)zero, qs, qsc,
                             scale, st, sm, s, (int16_t *)w, tg, kind, c_dtype);
#endif
                }
            }
            for (int64_t h = 0; h < Hk; h++) {
                float *pm = part + ((b * Hk + h) * S + sp) * PS, *acc = st + h * G * DP;
                memcpy(pm, sm + 2 * G * h, (size_t)(2 * G) * sizeof(float));
                for (int64_t g = 0; g < G; g++) {
#ifdef TSR_AVX512
                    if (kind == TSR_BF16 || kind == DA_I8) df_unpermute(acc + g * DP, DP);
#endif
                    memcpy(pm + 2 * G + g * D, acc + g * DP, (size_t)D * sizeof(float));
                }
            }
        }
        /* implicit barrier: every partial is written */
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * Hk; bh++) {
            if (failed) continue;
            for (int64_t g = 0; g < G; g++) {
                float M = -INFINITY, L = 0.0f;
                for (int64_t sp = 0; sp < S; sp++) {
                    const float mv = part[(bh * S + sp) * PS + g];
                    M = mv > M ? mv : M;
                }
                for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
                if (M != -INFINITY) {
                    for (int64_t sp = 0; sp < S; sp++) {
                        const float *pm = part + (bh * S + sp) * PS;
                        const float wt = tsr_expf(pm[g] - M);
                        L += wt * pm[G + g];
                        const float *pa = pm + 2 * G + g * D;
                        for (int64_t d = 0; d < D; d++) o[d] += wt * pa[d];
                    }
                    const float inv = 1.0f / L;
                    for (int64_t d = 0; d < D; d++) o[d] *= inv;
                }
                tsr_store_conv((char *)out + (bh * G + g) * D * qes, o, D, q_dtype);
            }
        }
        free(qs); free(qsc); free(s); free(o); free(w); free(tg); free(zero); free(st); free(rows);
    }
    free(part);
    return failed ? TSR_ENOMEM : TSR_OK;
}
