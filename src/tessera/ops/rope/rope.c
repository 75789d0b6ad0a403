/* Rotary position embedding of q and k, forward and backward, in one pass over the data.
 *
 * For token t = (b, s) with position p = pos[b, s] (or s), angle row c = cos[p], s = sin[p]
 * (r/2 entries, negated sin for the backward: the transpose of a rotation), every head row
 * x of q and of k becomes
 *   half-split:  o[i] = x[i] c_i - x[i+h] s_i,   o[i+h] = x[i+h] c_i + x[i] s_i   (h = r/2)
 *   interleaved: o[2i] = x[2i] c_i - x[2i+1] s_i, o[2i+1] = x[2i+1] c_i + x[2i] s_i
 * and features r..D are copied unchanged (bytes, exact).
 *
 * Numerics: fp32 math, one rounding to the storage dtype.  For fp32 outputs each value
 * a*c + b*s' is evaluated as fma(a, c, p) + e with p = b*s' and e = fma(b, s', -p) its exact
 * rounding error (an error-free transformation): ~1 ulp of |out| even when the two terms
 * cancel, where the plain formula errs by eps * |x|.  Without FMA hardware (generic build)
 * the same value comes from float64 lanes.  The error term is NaN only for inf inputs; it is
 * then replaced by a finite value, so inf inputs give the plain formula's inf/NaN.  fp16/bf16 outputs use the plain fp32 formula:
 * its error is 2^-8 (bf16) / 2^-13 (fp16) of the storage dtype's own rounding of x.
 *
 * Memory: q, then k, in two passes over the tokens: each pass reads one tensor once (any
 * token/head strides, unit feature stride) and writes its contiguous (B, S, H, D) output
 * once -- one input and one output stream, like a copy.  The input rows of the token
 * PF_DIST ahead are prefetched into L2 while a token is rotated.  Rows go through 32-lane
 * blocks (tsr_blk).  The angle row is converted to fp32 once per token into a per-thread
 * scratch (interleaved: expanded to r lanes with the sign pattern -s, +s, so a pair
 * rotation is x*c + swap(x)*s').  With nt, outputs whose rows and rotated halves sit on
 * 64-byte lines are streamed straight from the registers; other layouts build a token's
 * rows in an L1 staging buffer and stream that out.  Threads take chunks of tokens
 * dynamically.  Offsets are int64.
 *
 * Position ids outside [0, P) (the host checks them first) make the call return
 * TSR_EINVAL; such a token is never read from the tables.
 */
#include "tessera_cpu.h"

#define RI static inline __attribute__((always_inline))
#ifndef PF_DIST
#define PF_DIST 2   /* tokens ahead whose input rows are prefetched into L2 */
#endif
#ifndef CH_MAX
#define CH_MAX 16   /* tokens per dynamically scheduled chunk, at most */
#endif

enum { POS_NONE = 0, POS_I32 = 1, POS_I64 = 2 };
/* the int64 argument block */
enum { A_B, A_S, A_HQ, A_HK, A_D, A_R, A_P, A_QB, A_QS, A_QH, A_KB, A_KS, A_KH, A_CS, A_SS, A_PB, A_PS, A_N };

typedef struct {
    const char *x[2];
    char *o[2];
    int64_t H[2], sb[2], ss[2], sh[2];
    const char *cos, *sin;
    int64_t scs, sss;
    int cs_dtype;
    const char *pos;
    int64_t spb, sps;
    int pos_kind;
    int64_t S, D, R, P;
    int conj;
} rope_args;

/* a*c + b*s with the b*s product's rounding error added back (see the header) */
RI tsr_v16 rot_exact(tsr_v16 a, tsr_v16 c, tsr_v16 b, tsr_v16 s) {
#if defined(__AVX512F__)
    const __m512 p = _mm512_mul_ps((__m512)b, (__m512)s);
    /* e is NaN only when p is +-inf (inf input): min() then returns FLT_MAX, which leaves the
     * infinite sum unchanged (MINPS returns its second operand when the first is NaN) */
    const __m512 e = _mm512_min_ps(_mm512_fmsub_ps((__m512)b, (__m512)s, p), _mm512_set1_ps(3.4028235e38f));
    return (tsr_v16)_mm512_add_ps(_mm512_fmadd_ps((__m512)a, (__m512)c, p), e);
#elif defined(__FMA__) && defined(__AVX__)
    tsr_v16 r;
    for (int half = 0; half < 2; half++) {
        __m256 av, cv, bv, sv;
        memcpy(&av, (const char *)&a + 32 * half, 32); memcpy(&cv, (const char *)&c + 32 * half, 32);
        memcpy(&bv, (const char *)&b + 32 * half, 32); memcpy(&sv, (const char *)&s + 32 * half, 32);
        const __m256 p = _mm256_mul_ps(bv, sv);
        const __m256 e = _mm256_min_ps(_mm256_fmsub_ps(bv, sv, p), _mm256_set1_ps(3.4028235e38f));
        const __m256 o = _mm256_add_ps(_mm256_fmadd_ps(av, cv, p), e);
        memcpy((char *)&r + 32 * half, &o, 32);
    }
    return r;
#elif defined(TSR_NEON)
    /* the same transformation on 4-lane quarters: FMLA is fused, FMINNM returns FLT_MAX for a NaN e */
    tsr_v16 r;
    for (int q = 0; q < 4; q++) {
        float32x4_t av, cv, bv, sv;
        memcpy(&av, (const char *)&a + 16 * q, 16); memcpy(&cv, (const char *)&c + 16 * q, 16);
        memcpy(&bv, (const char *)&b + 16 * q, 16); memcpy(&sv, (const char *)&s + 16 * q, 16);
        const float32x4_t p = vmulq_f32(bv, sv);
        const float32x4_t e = vminnmq_f32(vfmaq_f32(vnegq_f32(p), bv, sv), vdupq_n_f32(3.4028235e38f));
        const float32x4_t o = vaddq_f32(vfmaq_f32(p, av, cv), e);
        memcpy((char *)&r + 16 * q, &o, 16);
    }
    return r;
#elif defined(TSR_RVV) && defined(__has_builtin) && __has_builtin(__builtin_elementwise_fma) && \
    __has_builtin(__builtin_elementwise_min)
    /* RVV (clang): vfmul, vfmsub-style fused ops and vfmin (minNum: FLT_MAX for a NaN e) on 16 lanes */
    const tsr_v16 p = b * s;
    const tsr_v16 e = __builtin_elementwise_min(__builtin_elementwise_fma(b, s, -p), (tsr_v16){} + 3.4028235e38f);
    return __builtin_elementwise_fma(a, c, p) + e;
#else
    tsr_v16 r;
    for (int l = 0; l < 16; l++) r[l] = (float)((double)a[l] * (double)c[l] + (double)b[l] * (double)s[l]);
    return r;
#endif
}

/* fp16/bf16 outputs: the plain fp32 formula (its eps32 * |x| error is far below the output's
 * half-precision rounding except under extreme cancellation, and 2^-8 x smaller than the
 * error of the same formula in the storage dtype); fp32 outputs: the compensated one */
RI tsr_v16 rot(tsr_v16 a, tsr_v16 c, tsr_v16 b, tsr_v16 s, const int dtype) {
    if (dtype == TSR_F32) return rot_exact(a, c, b, s);
    return tsr_v16_fma(a, c, b * s);
}

/* lanes (2i, 2i+1) -> (2i+1, 2i) */
RI tsr_v16 swap_pairs(tsr_v16 x) {
#if defined(__AVX512F__)
    return (tsr_v16)_mm512_permute_ps((__m512)x, 0xB1);
#else
    tsr_v16 r;
    for (int l = 0; l < 16; l++) r[l] = x[l ^ 1];
    return r;
#endif
}

#if defined(TSR_NEON)
/* rot_exact on one 4-lane register (FMINNM: FLT_MAX for a NaN e) and on one lane (fminf: the same) */
RI float32x4_t rot4(float32x4_t a, float32x4_t c, float32x4_t b, float32x4_t s) {
    const float32x4_t p = vmulq_f32(b, s);
    const float32x4_t e = vminnmq_f32(vfmaq_f32(vnegq_f32(p), b, s), vdupq_n_f32(3.4028235e38f));
    return vaddq_f32(vfmaq_f32(p, a, c), e);
}
RI float rot1(float a, float c, float b, float s) {
    const float p = b * s;
    return fmaf(a, c, p) + fminf(fmaf(b, s, -p), 3.4028235e38f);
}
#endif

/* One head row: 32-element blocks (tsr_blk: two 16-lane fp32 vectors, see tessera_cpu.h);
 * each block store is one 64-byte line for fp16/bf16 (two for fp32), streamed when nt.
 * The angle tables are padded to whole blocks. */
RI void rot_row_half(const char *x, char *o, const float *c, const float *s, const float *sn, int64_t h,
                     const int nt, const int dtype) {
#if defined(TSR_NEON)
    if (dtype == TSR_F32) {   /* 4-lane registers straight from the rows: no 16-lane block shuffling */
        const float *x1 = (const float *)x, *x2 = x1 + h;
        float *o1 = (float *)o, *o2 = o1 + h;
        int64_t i = 0;
        for (; i + 4 <= h; i += 4) {
            const float32x4_t a = vld1q_f32(x1 + i), b = vld1q_f32(x2 + i), cv = vld1q_f32(c + i);
            vst1q_f32(o1 + i, rot4(a, cv, b, vld1q_f32(sn + i)));
            vst1q_f32(o2 + i, rot4(b, cv, a, vld1q_f32(s + i)));
        }
        for (; i < h; i++) {
            const float a = x1[i], b = x2[i];
            o1[i] = rot1(a, c[i], b, sn[i]);
            o2[i] = rot1(b, c[i], a, s[i]);
        }
        (void)nt;
        return;
    }
#endif
    const int64_t off = h * tsr_elsize(TSR_IO(dtype));
    TSR_FOR_BLOCKS(j, h, {
        tsr_blk x1 = tsr_blk_load(x, j, h, dtype, 0.0f, tail), x2 = tsr_blk_load(x + off, j, h, dtype, 0.0f, tail);
        tsr_blk cv = tsr_blk_load(c, j, h, TSR_F32, 0.0f, 0), sv = tsr_blk_load(s, j, h, TSR_F32, 0.0f, 0), o1, o2;
        tsr_blk nv = tsr_blk_load(sn, j, h, TSR_F32, 0.0f, 0);
        o1.lo = rot(x1.lo, cv.lo, x2.lo, nv.lo, dtype); o1.hi = rot(x1.hi, cv.hi, x2.hi, nv.hi, dtype);
        o2.lo = rot(x2.lo, cv.lo, x1.lo, sv.lo, dtype); o2.hi = rot(x2.hi, cv.hi, x1.hi, sv.hi, dtype);
        tsr_blk_store(o, j, h, o1, dtype, nt, tail);
        tsr_blk_store(o + off, j, h, o2, dtype, nt, tail);
    });
}

RI void rot_row_pairs(const char *x, char *o, const float *c, const float *s, int64_t r, const int nt,
                      const int dtype) {
    TSR_FOR_BLOCKS(j, r, {                                 /* r even: a pair never straddles blocks */
        tsr_blk v = tsr_blk_load(x, j, r, dtype, 0.0f, tail), cv = tsr_blk_load(c, j, r, TSR_F32, 0.0f, 0);
        tsr_blk sv = tsr_blk_load(s, j, r, TSR_F32, 0.0f, 0), ov;
        ov.lo = rot(v.lo, cv.lo, swap_pairs(v.lo), sv.lo, dtype);
        ov.hi = rot(v.hi, cv.hi, swap_pairs(v.hi), sv.hi, dtype);
        tsr_blk_store(o, j, r, ov, dtype, nt, tail);
    });
}

/* angle row of position p -> fp32 c, s (half: r/2 lanes, and -s at s + Rp; interleaved: r lanes,
 * s' = -s, +s) */
static void load_angles(const rope_args *A, int64_t p, float *c, float *s, int64_t Rp, int interleaved) {
    const int64_t h = A->R / 2;
    const int ces = tsr_elsize(A->cs_dtype);
    tsr_load_f32(c, A->cos + p * A->scs * ces, h, A->cs_dtype);
    tsr_load_f32(s, A->sin + p * A->sss * ces, h, A->cs_dtype);
    if (A->conj)
        for (int64_t i = 0; i < h; i++) s[i] = -s[i];
    if (!interleaved)
        for (int64_t i = 0; i < h; i++) s[Rp + i] = -s[i];   /* the -s row of out1 = x1 c - x2 s */
    else                                                     /* in place, from the top */
        for (int64_t i = h - 1; i >= 0; i--) {
            const float ci = c[i], si = s[i];
            c[2 * i] = c[2 * i + 1] = ci;
            s[2 * i] = -si; s[2 * i + 1] = si;
        }
}

/* Output modes: plain stores; NT via an L1 staging buffer streamed out per token (any
 * layout); NT stores straight from the registers (rows and rotated halves 64-byte aligned). */
enum { OUT_PLAIN = 0, OUT_STAGE = 1, OUT_DIRECT = 2 };

/* tokens [t0, t1) of tensor w (0 = q, 1 = k) */
RI int do_tokens(const rope_args *A, int w, int64_t t0, int64_t t1, int64_t T, float *c, float *s, char *stage,
                 const int mode, const int interleaved, const int dtype) {
    const int es = tsr_elsize(TSR_IO(dtype));
    const int64_t S = A->S, D = A->D, R = A->R, H = A->H[w];
    const int nts = mode == OUT_DIRECT;
    const int64_t Rp = (R + 31) & ~(int64_t)31;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t b = t / S, si = t % S;
        const int64_t tn = t + PF_DIST < T ? t + PF_DIST : T - 1, bn = tn / S, sn = tn % S;   /* prefetched */
        int64_t p = si;
        if (A->pos_kind == POS_I32) p = ((const int32_t *)A->pos)[b * A->spb + si * A->sps];
        else if (A->pos_kind == POS_I64) p = ((const int64_t *)A->pos)[b * A->spb + si * A->sps];
        if (p < 0 || p >= A->P) return TSR_EINVAL;
        load_angles(A, p, c, s, Rp, interleaved);
        char *dst = A->o[w] + t * H * D * es;
        char *out = mode == OUT_STAGE ? stage : dst;
        const char *src = A->x[w] + (b * A->sb[w] + si * A->ss[w]) * es;
        const char *nxt = A->x[w] + (bn * A->sb[w] + sn * A->ss[w]) * es;
        for (int64_t hh = 0; hh < H; hh++) {
            const char *xr = src + hh * A->sh[w] * es;
            tsr_prefetch_l2(nxt + hh * A->sh[w] * es, D * es);   /* DRAM reads overlap this token's work */
            char *orow = out + hh * D * es;
            if (interleaved) rot_row_pairs(xr, orow, c, s, R, nts, dtype);
            else rot_row_half(xr, orow, c, s, s + Rp, R / 2, nts, dtype);
            if (R < D) {
                if (nts) tsr_stream_copy(orow + R * es, xr + R * es, (D - R) * es);
                else memcpy(orow + R * es, xr + R * es, (size_t)(D - R) * (size_t)es);
            }
        }
        if (mode == OUT_STAGE) tsr_stream_copy(dst, stage, H * D * es);
    }
    return TSR_OK;
}

#define DISPATCH_MODE(rc, ...)                                                                  \
    do {                                                                                        \
        if (mode == OUT_DIRECT) rc = do_tokens(__VA_ARGS__, OUT_DIRECT, interleaved, dtype);    \
        else if (mode == OUT_STAGE) rc = do_tokens(__VA_ARGS__, OUT_STAGE, interleaved, dtype); \
        else rc = do_tokens(__VA_ARGS__, OUT_PLAIN, interleaved, dtype);                        \
    } while (0)

RI int chunk(const rope_args *A, int w, int64_t t0, int64_t t1, int64_t T, float *c, float *s, char *stage,
                 int mode, const int interleaved, const int dtype) {
    int rc;
    DISPATCH_MODE(rc, A, w, t0, t1, T, c, s, stage);
    return rc;
}

/* one instantiation per (layout, dtype) with constant arguments */
static int run_chunk(const rope_args *A, int w, int64_t t0, int64_t t1, int64_t T, float *c, float *s,
                     char *stage, int mode, int interleaved, int dtype) {
#define CASE(IL, DT) if (interleaved == IL && dtype == DT) return chunk(A, w, t0, t1, T, c, s, stage, mode, IL, DT)
    CASE(0, TSR_F32); CASE(1, TSR_F32); CASE(0, TSR_F16); CASE(1, TSR_F16);
    CASE(0, TSR_BF16); CASE(1, TSR_BF16); CASE(0, TSR_BF16HW); CASE(1, TSR_BF16HW);
#undef CASE
    return TSR_EINVAL;
}

int tsr_rope(const void *q, const void *k, const void *cosp, const void *sinp, const void *pos,
             void *qo, void *ko, const int64_t *a, int dtype, int cs_dtype, int pos_kind,
             int interleaved, int conj, int nt, int nthreads) {
    rope_args A = {
        .x = {(const char *)q, (const char *)k}, .o = {(char *)qo, (char *)ko},
        .H = {a[A_HQ], a[A_HK]}, .sb = {a[A_QB], a[A_KB]}, .ss = {a[A_QS], a[A_KS]}, .sh = {a[A_QH], a[A_KH]},
        .cos = (const char *)cosp, .sin = (const char *)sinp, .scs = a[A_CS], .sss = a[A_SS], .cs_dtype = cs_dtype,
        .pos = (const char *)pos, .spb = a[A_PB], .sps = a[A_PS], .pos_kind = pos_kind,
        .S = a[A_S], .D = a[A_D], .R = a[A_R], .P = a[A_P], .conj = conj,
    };
    const int64_t T = a[A_B] * a[A_S];
    if (T == 0) return TSR_OK;
    const int nthr = tsr_threads(nthreads);
    const int es = tsr_elsize(dtype);
    const int64_t Rp = (A.R + 31) & ~(int64_t)31;            /* angle lanes, padded to whole blocks */
    const int64_t Hmax = A.H[0] > A.H[1] ? A.H[0] : A.H[1];
    /* direct streaming needs every whole block's store on aligned 64-byte lines */
    const int64_t rot_bytes = (interleaved ? A.R : A.R / 2) * es;
    int mode = nt ? OUT_STAGE : OUT_PLAIN;
#if defined(__AVX2__) || defined(__AVX512F__)
    if (nt && (A.D * es) % 64 == 0 && (A.R * es) % 64 == 0 && rot_bytes % 64 == 0 &&
        tsr_aligned64(qo) && tsr_aligned64(ko))
        mode = OUT_DIRECT;
#endif
    const int64_t stage_floats = mode == OUT_STAGE ? (Hmax * A.D * es + 3) / 4 : 0;
    int64_t CH = T / (8 * (int64_t)nthr);
    CH = CH < 1 ? 1 : (CH > CH_MAX ? CH_MAX : CH);
    const int kdt = dtype == TSR_BF16 && tsr_bf16_hw() ? TSR_BF16HW : dtype;
    int failed = 0, bad = 0;
    TSR_TEAM(nthr, reduction(| : failed, bad), {
        float *c = tsr_scratch(3 * Rp);
        float *stage = mode == OUT_STAGE ? tsr_scratch(stage_floats) : NULL;
        if (!c || (mode == OUT_STAGE && !stage)) failed = 1;
        else memset(c, 0, (size_t)(3 * Rp) * 4);
        /* q's chunks, then k's: each pass is one input and one output stream, like a copy; one
         * dynamic loop over both, so no barrier between the passes */
        const int64_t nch = (T + CH - 1) / CH;
_Pragma("omp for schedule(dynamic, 1)")
        for (int64_t item = 0; item < 2 * nch; item++) {
            if (failed || bad) continue;
            const int w = item >= nch;
            const int64_t t0 = (item - w * nch) * CH, t1 = t0 + CH < T ? t0 + CH : T;
            if (run_chunk(&A, w, t0, t1, T, c, c + Rp, (char *)stage, mode, interleaved, kdt) != TSR_OK) bad = 1;
        }
        tsr_sfence();
        free(c);
        free(stage);
    });
    if (failed) return TSR_ENOMEM;
    return bad ? TSR_EINVAL : TSR_OK;
}
