/* decode_fast.h -- AVX-512 inner loops of decode_attention.c (one chunk of <= CH keys of one kv
 * head, for the G query heads sharing it).  Included only when the avx512 level is compiled.
 *
 * Why: a dot product per key, reduced horizontally, made the old kernel compute-bound at ~100 ns
 * per key and kv head.  Here
 *   - scores: 16 (head, key) dot products run at once in 16 accumulators (GB heads x 16/GB keys,
 *     each K vector loaded once for the GB heads) and one 16 -> 16 transpose-reduction
 *     (red16: 45 shuffles/adds for 16 dots instead of ~10 per dot);
 *   - softmax: exp 16 keys per vector (tsr_v_exp_nonpos);
 *   - three multiply kernels, picked per (q dtype, cache dtype) by decode_attention.c:
 *     F32   any cache: keys/values widened to fp32, fp32 FMAs (fp32 q is judged by fp32 rules);
 *     BF16  bf16 q and bf16 cache (AVX512_BF16): vdpbf16ps on the cache words as stored, 32 MACs
 *           per instruction.  q is bf16 already (exact); the probabilities p are rounded to bf16
 *           for P.V (as FlashAttention does on GPUs) and l sums the rounded p, so
 *           the output stays a convex combination of the values;
 *     I8    bf16/fp16 q and int8 cache (AVX512_VNNI): K and V widened to int16, vpdpwssd (exact
 *           int32 sums, 32 MACs per instruction).  q is quantised per head to int16 (|error| <=
 *           2^-16 max|q|, 100x below bf16's rounding), the weights p * v_scale per chunk to int16
 *           (|error| <= 2^-16 of the chunk's largest weight); k_scale multiplies the score.
 *   P.V pairs keys (t, t+1): vpunpck{l,h}wd interleaves their rows within 128-bit lanes, so the
 *   accumulators of BF16/I8 hold dims permuted (lane 4k+j of lo/hi = dim 8k+j / 8k+4+j of each
 *   32-dim block); df_unpermute puts them back in order at the end of a task.
 * Overflow (I8): |q16 k8| sums: 32767 * 128 * 256 dims < 2^31 per D <= 256; P.V: 2 * 32767 * 128 *
 * CH/2 pairs < 2^31.
 */
#define DF_TGT __attribute__((target("avx512bf16,avx512vnni,avx512f,avx512bw,avx512vl,avx512dq")))
#define DFI static inline __attribute__((always_inline, target("avx512bf16,avx512vnni,avx512f,avx512bw,avx512vl,avx512dq")))

typedef int32_t df_i32 __attribute__((may_alias));

typedef struct {
    const char *k[CH + 1], *v[CH + 1]; /* token rows (all kv heads); past nc: a zero block */
    float ksc[CH], vsc[CH];            /* int8/fp8 scales of this head (1 for float caches, 0 past nc) */
    const char *nk[CH], *nv[CH];       /* token rows of the next chunk */
    const char *const *pk, *const *pv; /* rows to prefetch into L2 while this head computes (this */
    int64_t hoff, phoff, phoff2, plen; /* head's, next chunk; byte offsets of the heads in a row) and */
    int nc, pn, pn2;                   /* in a task's first chunk also k/v at phoff2 (the next head) */
} rows_t;

/* keys per chunk: CH (64) for 1-byte caches, 32 for wider ones, so that one kv head's K and V
 * rows of a chunk stay within 16 KiB at D = 128.  Why: head h computes on its rows of this chunk
 * while its rows of the next chunk are prefetched, and the two together should fit Zen 4's
 * 32 KiB L1D.  Measured from DRAM (2-core VM, interleaved A/B, D = 128): a bf16 cache (32 KiB per
 * head step at 64 keys) 1.07-1.12x faster with 32 keys in 5 of 6 rows; an int8 cache (16 KiB at
 * 64 keys) the same with 32 or 64.  A compile-time constant wherever cd is one. */
INL int df_chunk_keys(const int cd) { return cache_es(cd) == 1 ? CH : 32; }

DFI __mmask16 m16(int n) { return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1u); }

/* 16 cache elements (dtype cd) -> fp32, the lanes off mask k read as 0 */
DFI __m512 ld16m(const char *p, const int cd, __mmask16 k) {
    if (cd == TSR_F32) return _mm512_maskz_loadu_ps(k, p);
    if (cd == TSR_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p));
    if (cd == TSR_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p)), 16));
    if (cd == DA_I8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, p)));
    char b[16];
    _mm_storeu_si128((__m128i *)b, _mm_maskz_loadu_epi8(k, p));
    return (__m512)ld16(b, DA_F8);
}

/* out lane j = sum of the lanes of a[j] (float adds, or int32 adds when isint) */
#define DF_ADD(x, y) (isint ? _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(x), _mm512_castps_si512(y))) \
                            : _mm512_add_ps(x, y))
DFI __m512 red4(__m512 v0, __m512 v1, __m512 v2, __m512 v3, const int isint) {
    const __m512 t01 = DF_ADD(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
    const __m512 t23 = DF_ADD(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
    return DF_ADD(_mm512_shuffle_ps(t01, t23, 0x44), _mm512_shuffle_ps(t01, t23, 0xEE));
}
DFI __m512 red16(const __m512 *a, const int isint) {
    const __m512 A = red4(a[0], a[1], a[2], a[3], isint), B = red4(a[4], a[5], a[6], a[7], isint);
    const __m512 C = red4(a[8], a[9], a[10], a[11], isint), E = red4(a[12], a[13], a[14], a[15], isint);
    const __m512 x = DF_ADD(_mm512_shuffle_f32x4(A, B, 0x44), _mm512_shuffle_f32x4(A, B, 0xEE));
    const __m512 y = DF_ADD(_mm512_shuffle_f32x4(C, E, 0x44), _mm512_shuffle_f32x4(C, E, 0xEE));
    return DF_ADD(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD));
}

/* scores of keys [0, nc) for query heads g0..g0+GB-1 into s[g * CH + i] (lanes: g * TB + t) */
DFI void df_scores(const rows_t *r, const void *qv, int64_t DP, int64_t D, int64_t g0, float *s, const int kind,
                   const int cd, const int GB) {
    enum { TB_MAX = 16 };
    const int TB = 16 / GB;
    const int64_t rowb = D * (cd == TSR_F32 ? 4 : cd >= DA_I8 ? 1 : 2);
    for (int i0 = 0; i0 < r->nc; i0 += TB) {
        /* the next (chunk, head)'s rows i0 .. i0 + TB -> L2, a few per step (a burst of prefetches
         * stalls on the miss buffers: measured 2x slower from DRAM); pn <= nc (only the last
         * chunk is short), so the steps cover them all */
        if (g0 == 0) {
            for (int j = i0; j < i0 + TB && j < r->pn; j++)
                for (int64_t x = 0; x < r->plen; x += 64) {
                    _mm_prefetch(r->pk[j] + r->phoff + x, _MM_HINT_T1);
                    _mm_prefetch(r->pv[j] + r->phoff + x, _MM_HINT_T1);
                }
            for (int t = 0; t < TB && i0 + t < r->pn2; t++)
                for (int64_t x = 0; x < rowb; x += 64) {
                    _mm_prefetch(r->k[i0 + t] + r->phoff2 + x, _MM_HINT_T1);
                    _mm_prefetch(r->v[i0 + t] + r->phoff2 + x, _MM_HINT_T1);
                }
        }
        __m512 a[16];
        for (int j = 0; j < 16; j++) a[j] = _mm512_setzero_ps();
        if (kind == TSR_F32) { /* q: fp32 (pre-scaled); 16 dims per step */
            const float *q = (const float *)qv + g0 * DP;
            for (int64_t c = 0; c < D; c += 16) {
                const __mmask16 mk = m16((int)(D - c));
                __m512 kx[TB_MAX];
                for (int t = 0; t < TB; t++) kx[t] = ld16m(r->k[i0 + t] + r->hoff + c * (cd == TSR_F32 ? 4 : cd >= DA_I8 ? 1 : 2), cd, mk);
                for (int g = 0; g < GB; g++) {
                    const __m512 qg = _mm512_load_ps(q + g * DP + c);
                    for (int t = 0; t < TB; t++) a[g * TB + t] = _mm512_fmadd_ps(kx[t], qg, a[g * TB + t]);
                }
            }
        } else { /* BF16 (q bf16 words) / I8 (q int16): 32 dims per step */
            const int16_t *q = (const int16_t *)qv + g0 * DP;
            for (int64_t c = 0; c < D; c += 32) {
                const __mmask32 mk = D - c >= 32 ? 0xffffffffu : (__mmask32)((1u << (D - c)) - 1u);
                __m512i kx[TB_MAX];
                for (int t = 0; t < TB; t++)
                    kx[t] = kind == TSR_BF16 ? _mm512_maskz_loadu_epi16(mk, r->k[i0 + t] + r->hoff + 2 * c)
                                             : _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mk, r->k[i0 + t] + r->hoff + c));
                for (int g = 0; g < GB; g++) {
                    const __m512i qg = _mm512_load_si512(q + g * DP + c);
                    for (int t = 0; t < TB; t++)
                        a[g * TB + t] = kind == TSR_BF16
                            ? _mm512_dpbf16_ps(a[g * TB + t], (__m512bh)kx[t], (__m512bh)qg)
                            : _mm512_castsi512_ps(_mm512_dpwssd_epi32(_mm512_castps_si512(a[g * TB + t]), kx[t], qg));
                }
            }
        }
        __m512 sum = red16(a, kind == DA_I8);
        if (kind == DA_I8) sum = _mm512_cvtepi32_ps(_mm512_castps_si512(sum));
        float tmp[16] __attribute__((aligned(64)));
        _mm512_store_ps(tmp, sum);
        for (int g = 0; g < GB; g++) memcpy(s + (g0 + g) * CH + i0, tmp + g * TB, (size_t)TB * 4);
    }
}

/* s[0, nc) of one head: s *= mul (* k_scale), softcap, online-softmax update of *m; s becomes
 * p = e^(s - m') (0 for nc <= i < ch); returns alpha = e^(m - m') and *psum = sum p */
DFI float df_softmax(float *s, const rows_t *r, float mul, float softcap, int quant, float *m, float *psum,
                     const int ch) {
    const int nc = r->nc;
    for (int i = 0; i < nc; i += 16) {
        __m512 x = _mm512_mul_ps(_mm512_loadu_ps(s + i), _mm512_set1_ps(mul));
        if (quant) x = _mm512_mul_ps(x, _mm512_loadu_ps(r->ksc + i));
        _mm512_storeu_ps(s + i, x);
    }
    if (softcap > 0.0f)
        for (int i = 0; i < nc; i++) s[i] = softcap * tanhf(s[i] / softcap);
    __m512 mx = _mm512_set1_ps(*m);
    for (int i = 0; i < nc; i += 16) mx = _mm512_mask_max_ps(mx, m16(nc - i), mx, _mm512_loadu_ps(s + i));
    const float mnew = _mm512_reduce_max_ps(mx), alpha = tsr_expf(*m - mnew);
    __m512 sum = _mm512_setzero_ps();
    for (int i = 0; i < ch; i += 16) {
        const __m512 x = _mm512_max_ps(_mm512_sub_ps(_mm512_loadu_ps(s + i), _mm512_set1_ps(mnew)), _mm512_set1_ps(-104.0f));
        const __m512 p = _mm512_maskz_mov_ps(m16(nc - i), tsr_v_exp_nonpos(x));
        sum = _mm512_add_ps(sum, p);
        _mm512_storeu_ps(s + i, p);
    }
    *m = mnew;
    *psum = _mm512_reduce_add_ps(sum);
    return alpha;
}

/* F32 kind, P.V: acc[g] = acc[g] alpha + sum_i s[g][i] v_i for heads g0.. (+GB), natural order */
DFI void df_pv_f32(const rows_t *r, const float *s, const float *alpha, int64_t DP, int64_t D, int64_t g0, float *acc,
                   const int cd, const int GB) {
    const int es = cd == TSR_F32 ? 4 : cd >= DA_I8 ? 1 : 2;
    for (int64_t c = 0; c < D; c += 16) {
        const __mmask16 mk = m16((int)(D - c));
        __m512 a[8];
        for (int g = 0; g < GB; g++) a[g] = _mm512_mul_ps(_mm512_loadu_ps(acc + (g0 + g) * DP + c), _mm512_set1_ps(alpha[g0 + g]));
        for (int i = 0; i < r->nc; i++) {
            const __m512 vx = ld16m(r->v[i] + r->hoff + c * es, cd, mk);
            for (int g = 0; g < GB; g++) a[g] = _mm512_fmadd_ps(_mm512_set1_ps(s[(g0 + g) * CH + i]), vx, a[g]);
        }
        for (int g = 0; g < GB; g++) _mm512_storeu_ps(acc + (g0 + g) * DP + c, a[g]);
    }
}

/* acc + pairwise int16 dot products of a, b (vpdpwssd) in place.  Why asm: through the intrinsic,
 * GCC 12 gives each loop-carried accumulator of the P.V loop a second register and copies it
 * there and back every iteration (16 extra moves per 8 dot instructions); the tied "+v" operand
 * keeps each accumulator in one register. */
DFI __m512i df_dpwssd(__m512i acc, __m512i a, __m512i b) {
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

/* rows i, i + 1 of V at dims [c, c + 32), interleaved within 128-bit lanes (dims permuted, see top) */
DFI void df_v_pair(const rows_t *r, int i, int64_t c, __mmask32 mk, const int kind, __m512i *ul, __m512i *uh) {
    __m512i va, vb;
    if (kind == TSR_BF16) {
        va = _mm512_maskz_loadu_epi16(mk, r->v[i] + r->hoff + 2 * c);
        vb = _mm512_maskz_loadu_epi16(mk, r->v[i + 1] + r->hoff + 2 * c);
    } else {
        va = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mk, r->v[i] + r->hoff + c));
        vb = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mk, r->v[i + 1] + r->hoff + c));
    }
    *ul = _mm512_unpacklo_epi16(va, vb);
    *uh = _mm512_unpackhi_epi16(va, vb);
}

/* I8 P.V of dims [c, c + 32 NB) (NB = 1 or 2 blocks of 32, masked past D; c + 32 NB <= DP) for heads
 * g0.. (+GB): int32 sums of the int16 weights times the V pairs, then acc = acc alpha + sums *
 * weight scale.  With NB = 2 each weight broadcast serves 4 dot instructions instead of 2 (3-5%
 * less compute per key at D = 128) */
DFI void df_pv_i8(const rows_t *r, const int16_t *w, const float *alpha, const float *wsc, int64_t DP, int64_t D,
                  int64_t c, int64_t g0, float *acc, const int GB, const int NB) {
    __m512i a[2][2][8], u[2][2];
    __mmask32 mk[2];
    for (int k = 0; k < NB; k++) {
        const int64_t left = D - c - 32 * k;
        mk[k] = left >= 32 ? 0xffffffffu : (__mmask32)((1u << left) - 1u);
        for (int g = 0; g < GB; g++) a[k][0][g] = a[k][1][g] = _mm512_setzero_si512();
    }
    for (int i = 0; i < r->nc; i += 2) {
        for (int k = 0; k < NB; k++) df_v_pair(r, i, c + 32 * k, mk[k], DA_I8, &u[k][0], &u[k][1]);
        for (int g = 0; g < GB; g++) {
            const __m512i wp = _mm512_set1_epi32(*(const df_i32 *)(w + (g0 + g) * CH + i));
            for (int k = 0; k < NB; k++) {
                a[k][0][g] = df_dpwssd(a[k][0][g], u[k][0], wp);
                a[k][1][g] = df_dpwssd(a[k][1][g], u[k][1], wp);
            }
        }
    }
    for (int g = 0; g < GB; g++) {
        const __m512 al = _mm512_set1_ps(alpha[g0 + g]), ws = _mm512_set1_ps(wsc[g0 + g]);
        for (int k = 0; k < NB; k++)
            for (int h = 0; h < 2; h++) {
                float *ag = acc + (g0 + g) * DP + c + 32 * k + 16 * h;
                _mm512_storeu_ps(ag, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[k][h][g]), ws, _mm512_mul_ps(_mm512_loadu_ps(ag), al)));
            }
    }
}

/* BF16 / I8 kinds, P.V over key pairs; w: per head CH words (bf16 p, or int16 weights) with
 * w[nc] = 0; wsc: I8 weight scales.  acc in the permuted order (see the top).  Each kind keeps
 * its accumulators in its own vector type (BF16 float here, I8 int32 in df_pv_i8). */
DFI void df_pv_pairs(const rows_t *r, const int16_t *w, const float *alpha, const float *wsc, int64_t DP, int64_t D,
                     int64_t g0, float *acc, const int kind, const int GB) {
    if (kind != TSR_BF16) { /* I8: 64 dims a pass (the second block masked or absent near D) */
        for (int64_t c = 0; c < D; c += 64) {
            if (D - c > 32) df_pv_i8(r, w, alpha, wsc, DP, D, c, g0, acc, GB, 2);
            else df_pv_i8(r, w, alpha, wsc, DP, D, c, g0, acc, GB, 1);
        }
        return;
    }
    for (int64_t c = 0; c < D; c += 32) {
        const __mmask32 mk = D - c >= 32 ? 0xffffffffu : (__mmask32)((1u << (D - c)) - 1u);
        __m512 lo[8], hi[8];
        __m512i ul, uh;
        for (int g = 0; g < GB; g++) {
            const __m512 al = _mm512_set1_ps(alpha[g0 + g]);
            lo[g] = _mm512_mul_ps(_mm512_loadu_ps(acc + (g0 + g) * DP + c), al);
            hi[g] = _mm512_mul_ps(_mm512_loadu_ps(acc + (g0 + g) * DP + c + 16), al);
        }
        for (int i = 0; i < r->nc; i += 2) {
            df_v_pair(r, i, c, mk, kind, &ul, &uh);
            for (int g = 0; g < GB; g++) {
                const __m512bh wp = (__m512bh)_mm512_set1_epi32(*(const df_i32 *)(w + (g0 + g) * CH + i));
                lo[g] = _mm512_dpbf16_ps(lo[g], (__m512bh)ul, wp);
                hi[g] = _mm512_dpbf16_ps(hi[g], (__m512bh)uh, wp);
            }
        }
        for (int g = 0; g < GB; g++) {
            _mm512_storeu_ps(acc + (g0 + g) * DP + c, lo[g]);
            _mm512_storeu_ps(acc + (g0 + g) * DP + c + 16, hi[g]);
        }
    }
}

/* one chunk of keys of one kv head for its G query heads: scores, online softmax, P.V.
 * q: G x DP (fp32 pre-scaled / bf16 words / int16), qsc: I8 per-head q scales; m, l: G;
 * acc: G x DP; s: G x CH floats, w: G x CH words, tg: 2G floats of scratch */
DFI void df_chunk(const rows_t *r, const void *q, const float *qsc, float scale, float softcap, int64_t G,
                  int64_t DP, int64_t D, float *m, float *l, float *acc, float *s, int16_t *w, float *tg,
                  const int kind, const int cd, const int GB) {
    const int quant = cd == DA_I8 || cd == DA_F8, ch = df_chunk_keys(cd);
    float *alpha = tg, *wsc = tg + G;
    for (int64_t g0 = 0; g0 < G; g0 += GB) df_scores(r, q, DP, D, g0, s, kind, cd, GB);
    for (int64_t g = 0; g < G; g++) {
        float *sg = s + g * CH, psum;
        const float mul = kind == DA_I8 ? scale * qsc[g] : kind == TSR_BF16 ? scale : 1.0f;
        alpha[g] = df_softmax(sg, r, mul, softcap, quant, m + g, &psum, ch);
        if (kind == TSR_BF16) { /* p -> bf16 (round to nearest even); l sums the rounded p */
            __m512 rs = _mm512_setzero_ps();
            for (int i = 0; i < ch; i += 32) {
                const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(sg + i + 16), _mm512_loadu_ps(sg + i));
                _mm512_storeu_si512(w + g * CH + i, h);
                rs = _mm512_add_ps(rs, _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), h)));
                rs = _mm512_add_ps(rs, _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), h)));
            }
            psum = _mm512_reduce_add_ps(rs);
        } else if (quant) { /* weights p * v_scale (I8: to int16 against the chunk's largest) */
            __m512 wm = _mm512_setzero_ps();
            for (int i = 0; i < ch; i += 16) {
                const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(sg + i), _mm512_loadu_ps(r->vsc + i));
                wm = _mm512_max_ps(wm, _mm512_abs_ps(x));
                _mm512_storeu_ps(sg + i, x);
            }
            if (kind == DA_I8) {
                const float mx = _mm512_reduce_max_ps(wm), inv = mx > 0.0f ? 32767.0f / mx : 0.0f;
                wsc[g] = mx / 32767.0f;
                for (int i = 0; i < ch; i += 16)
                    _mm256_storeu_si256((__m256i *)(w + g * CH + i),
                                        _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(sg + i), _mm512_set1_ps(inv)))));
            }
        }
        l[g] = l[g] * alpha[g] + psum;
    }
    for (int64_t g0 = 0; g0 < G; g0 += GB) {
        if (kind == TSR_F32) df_pv_f32(r, s, alpha, DP, D, g0, acc, cd, GB);
        else df_pv_pairs(r, w, alpha, wsc, DP, D, g0, acc, kind, GB);
    }
}

#define DF_GB(kind, cd)                                                                               \
    do {                                                                                              \
        if (G % 4 == 0) df_chunk(r, q, qsc, scale, softcap, G, DP, D, m, l, acc, s, w, tg, kind, cd, 4);   \
        else if (G % 2 == 0) df_chunk(r, q, qsc, scale, softcap, G, DP, D, m, l, acc, s, w, tg, kind, cd, 2); \
        else df_chunk(r, q, qsc, scale, softcap, G, DP, D, m, l, acc, s, w, tg, kind, cd, 1);            \
    } while (0)

DF_TGT static void df_chunk_any(const rows_t *r, const void *q, const float *qsc, float scale, float softcap, int64_t G,
                                int64_t DP, int64_t D, float *m, float *l, float *acc, float *s, int16_t *w, float *tg,
                                int kind, int cd) {
    if (kind == TSR_BF16) { DF_GB(TSR_BF16, TSR_BF16); return; }
    if (kind == DA_I8) { DF_GB(DA_I8, DA_I8); return; }
    switch (cd) {
    case TSR_F32: DF_GB(TSR_F32, TSR_F32); break;
    case TSR_F16: DF_GB(TSR_F32, TSR_F16); break;
    case TSR_BF16: DF_GB(TSR_F32, TSR_BF16); break;
    case DA_I8: DF_GB(TSR_F32, DA_I8); break;
    default: DF_GB(TSR_F32, DA_F8); break;
    }
}

/* the BF16 / I8 accumulators back in memory order: 32-dim blocks of (lo, hi) -> dims */
DF_TGT static void df_unpermute(float *acc, int64_t DP) {
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int64_t c = 0; c < DP; c += 32) {
        const __m512 lo = _mm512_loadu_ps(acc + c), hi = _mm512_loadu_ps(acc + c + 16);
        _mm512_storeu_ps(acc + c, _mm512_permutex2var_ps(lo, i0, hi));
        _mm512_storeu_ps(acc + c + 16, _mm512_permutex2var_ps(lo, i1, hi));
    }
}

/* cache rows of keys [t0, t1) (at most CH), walking the page table without divisions */
static void chunk_rows(const ctx_t *c, const int32_t *btrow, int64_t t0, int64_t t1, int64_t *rows) {
    int64_t pg = t0 / c->P, slot = t0 % c->P;
    for (int64_t t = t0; t < t1; t++) {
        rows[t - t0] = (int64_t)btrow[pg] * c->P + slot;
        if (++slot == c->P) { slot = 0; pg++; }
    }
}

/* keys [c0, c0 + nc) of a task for every kv head: cur / next = cache rows of this chunk / of the
 * next one (pn rows), first: the task's first chunk.  q, qsc, st (acc of head h at h G DP; m, l
 * at Hk G DP + 2 G h) as in tsr_decode_attention.
 * Prefetch (into L2, spread over the score loop): while head h computes, head h's rows of the
 * next chunk (one chunk = all Hk heads of lead time; measured on the 2-core VM from DRAM: 1.9x
 * faster than no prefetch or than a burst per (chunk, head), and better than 2 or 3 chunks
 * ahead, than the next head of the same chunk, or than whole token rows in memory order spread
 * over the heads), and in a task's first chunk also head h + 1's rows of this chunk. */
static void df_heads(rows_t *R, const ctx_t *c, const int64_t *cur, int nc, const int64_t *next, int pn, int first,
                     const char *zero, const float *qs, const float *qsc, float scale, float *st, float *sm, float *s,
                     int16_t *w, float *tg, int kind, int cd) {
    const int64_t Hk = c->Hk, D = c->D, G = c->G, DP = c->DP, es = cache_es(cd), rb = Hk * D * es;
    const int quant = cd == DA_I8 || cd == DA_F8;
    R->nc = nc;
    for (int i = 0; i < CH; i++) {
        R->k[i] = i < nc ? c->kc + cur[i] * rb : zero;
        R->v[i] = i < nc ? c->vc + cur[i] * rb : zero;
        R->ksc[i] = R->vsc[i] = i < nc ? 1.0f : 0.0f;
    }
    R->k[CH] = R->v[CH] = zero;
    for (int i = 0; i < pn; i++) {
        R->nk[i] = c->kc + next[i] * rb;
        R->nv[i] = c->vc + next[i] * rb;
        if (quant) { /* the next chunk's scales */
            _mm_prefetch((const char *)(c->ks + next[i] * Hk), _MM_HINT_T1);
            _mm_prefetch((const char *)(c->vs + next[i] * Hk), _MM_HINT_T1);
        }
    }
    for (int64_t h = 0; h < Hk; h++) {
        if (quant)
            for (int i = 0; i < nc; i++) {
                R->ksc[i] = c->ks[cur[i] * Hk + h];
                R->vsc[i] = c->vs[cur[i] * Hk + h];
            }
        R->hoff = h * D * es;
        R->pk = R->nk;
        R->pv = R->nv;
        R->pn = pn;
        R->phoff = R->hoff;
        R->plen = D * es;
        R->phoff2 = R->hoff + D * es;
        R->pn2 = first && h + 1 < Hk ? nc : 0;
        const float *qh = kind == TSR_F32 ? qs + h * G * DP : qs + h * G * DP / 2; /* fp32 or 16-bit rows */
        df_chunk_any(R, qh, qsc + h * G, scale, c->softcap, G, DP, D, sm + 2 * G * h, sm + 2 * G * h + G,
                     st + h * G * DP, s, w, tg, kind, cd);
    }
}
