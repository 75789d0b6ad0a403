/* activations.c -- SiLU, GELU (erf and tanh forms) and the gated SwiGLU / GeGLU,
 * forward and fused backward, for the native CPU backend.
 *
 *   unary:  y = act(x)                 dx = dy * act'(x)
 *   gated:  out = act(gate) * up       dgate = dy * up * act'(gate),  dup = dy * act(gate)
 *
 * act (all math in fp32; inputs/outputs fp32, fp16 or bf16):
 *   silu       x * s(x),       s = sigmoid,  act' = s (1 + x (1 - s))
 *   gelu       x * Phi(x),     Phi = normal CDF = erfc(-x / sqrt2) / 2,
 *                              act' = Phi + x phi(x),  phi = exp(-x^2 / 2) / sqrt(2 pi)
 *   gelu_tanh  x * s(z),       z = 2u, u = sqrt(2/pi) (x + 0.044715 x^3)   (0.5 x (1 + tanh u)
 *                              = x s(2u): one exp, no tanh),  act' = s + x s (1 - s) z'
 *
 * Numerics:
 * - 1 - s is computed without cancellation (e s for z >= 0 with e = exp(-z) <= 1, else
 *   1 - s <= 1/2), which keeps act' accurate in the tails.
 * - GELU evaluates erfc: the Abramowitz & Stegun 7.1.26 form that tsr_erff uses (|error|
 *   <= 1.5e-7) is t P(t) exp(-a^2) = erfc(a), a = |x| / sqrt2, so Phi = erfc(a)/2 for x < 0
 *   and 1 - erfc(a)/2 otherwise: no 1 + erf cancellation for negative x, and exp(-a^2) is
 *   phi's exponential too, so forward and backward need a single exp per element.
 * - Limits are exact at +-inf (act(-inf) = 0, act(+inf) = +inf, act'(-inf) = 0,
 *   act'(+inf) = 1) and NaN propagates: the math runs on a clamped x (NaN kept), so x s
 *   never becomes inf * 0, and act(+inf) passes through as +inf.
 *
 * Parallelism is over ELEMENTS: the M x N problem is cut into chunks of contiguous
 * elements shared dynamically by the threads (a single long row uses every thread); a
 * chunk is walked in segments that never cross a row (one segment when all inputs are
 * contiguous).  Inputs have unit inner stride and any row stride (0 = broadcast, > N = a
 * chunk of a fused projection); outputs are contiguous.  Offsets are int64.
 *
 * Two implementations of the same formulas, both tested (TESSERA_CPU_ISA picks the build):
 * - AVX-512 (tessera_avx512.h): intrinsics, 32 elements per step in registers -- widen,
 *   compute, round to nearest even, store (non-temporal when nt != 0 and the output is
 *   fp32, after a masked head that aligns the output).  exp is polynomial + vscalefps and
 *   1/d is rcp14 + Newton: with exp and a divide per element the kernel was compute-bound
 *   at half the DRAM rate.
 * - portable C (AVX2, generic, other ISAs): the scalar functions below, tsr_expf inside,
 *   in `omp simd` loops over ACT_BLOCK-element blocks converted to fp32 in an L1 scratch
 *   (fp32 inputs are read in place), stored once with tsr_store_row.
 */
#include <float.h>

#include "tessera_avx512.h"

enum { ACT_SILU = 0, ACT_GELU = 1, ACT_GELU_TANH = 2 };

enum { OP_UNARY_FWD = 0, OP_UNARY_BWD = 1, OP_GLU_FWD = 2, OP_GLU_BWD = 3 };
static const int act_nin[4] = {1, 2, 2, 3}, act_nout[4] = {1, 1, 1, 2};

/* Portable path: 1024 fp32 = 4 KiB per buffer; a GLU backward holds 3 inputs + 2 outputs
 * + tmp in L1. */
#define ACT_BLOCK 1024
/* Work chunks: multiples of ACT_ALIGN elements (whole cache lines), at most ACT_CHUNK. */
#define ACT_ALIGN 256
#define ACT_CHUNK (1 << 16)

#define ACT_SQRT1_2 0.70710678118654752f
#define ACT_INV_SQRT_2PI 0.39894228040143268f
#define ACT_2_SQRT_2_PI 1.5957691216057308f /* 2 * sqrt(2/pi) */
#define ACT_TANH_K 0.044715f

#ifndef TSR_AVX512 /* ------------------------------------------- portable path */
/* +-inf -> +-FLT_MAX, NaN stays NaN (comparisons with NaN are false). */
static inline float act_finite(float x) {
    x = x > FLT_MAX ? FLT_MAX : x;
    return x < -FLT_MAX ? -FLT_MAX : x;
}

/* act(+inf) = +inf: the value computed from the clamped input is FLT_MAX * 1. */
static inline float act_pos_inf(float x, float y) { return x > FLT_MAX ? x : y; }

/* Each act_* returns act(x) and writes act'(x) to *d; forward loops drop *d after inlining. */
static inline float act_silu(float xin, float *d) {
    const float x = act_finite(xin);
    const float e = tsr_expf(-x); /* inf for x < -88.7: s = 0, exact in fp32 to 1e-38 */
    const float s = 1.0f / (1.0f + e);
    const float s1m = x >= 0.0f ? e * s : 1.0f - s;
    *d = s * (1.0f + x * s1m);
    return act_pos_inf(xin, x * s);
}

static inline float act_gelu(float xin, float *d) {
    const float x = act_finite(xin);
    const float a = fabsf(x) * ACT_SQRT1_2;
    const float e = tsr_expf(-a * a); /* = exp(-x^2/2); 0 once a^2 > 87.3 or overflows */
    const float t = 1.0f / (1.0f + 0.3275911f * a);
    const float p = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f +
                    t * (-1.453152027f + t * 1.061405429f))));
    const float h = 0.5f * p * e; /* erfc(a) / 2 = Phi(-|x|) */
    const float Phi = x >= 0.0f ? 1.0f - h : h;
    *d = Phi + x * (e * ACT_INV_SQRT_2PI);
    return act_pos_inf(xin, x * Phi);
}

static inline float act_gelu_tanh(float xin, float *d) {
    const float x = act_finite(xin);
    const float z = ACT_2_SQRT_2_PI * x * (1.0f + ACT_TANH_K * x * x);
    const float e = tsr_expf(-z);
    const float s = 1.0f / (1.0f + e);
    const float s1m = z >= 0.0f ? e * s : 1.0f - s;
    float xd = x > 1e6f ? 1e6f : x;
    xd = xd < -1e6f ? -1e6f : xd;
    const float dz = ACT_2_SQRT_2_PI * (1.0f + 3.0f * ACT_TANH_K * xd * xd);
    *d = s + xd * (s * s1m) * dz;
    return act_pos_inf(xin, x * s);
}

#if defined(TSR_NEON)
/* act_gelu's value on 4 lanes (intrinsics: gcc's own NEON of the scalar code is ~2.5x longer):
 * the same clamps, erfc form and polynomial; NaN stays NaN, gelu(+inf) = +inf */
static inline float32x4_t neon_gelu(float32x4_t xin) {
    const float32x4_t fmax = vdupq_n_f32(FLT_MAX), one = vdupq_n_f32(1.0f);
    const float32x4_t x = vmaxq_f32(vminq_f32(xin, fmax), vnegq_f32(fmax));
    const float32x4_t a = vmulq_n_f32(vabsq_f32(x), ACT_SQRT1_2);
    const float32x4_t e = tsr_neon_expf(vnegq_f32(vmulq_f32(a, a)));
    const float32x4_t t = vdivq_f32(one, vfmaq_n_f32(one, a, 0.3275911f));
    float32x4_t p = vfmaq_n_f32(vdupq_n_f32(-1.453152027f), t, 1.061405429f);
    p = vfmaq_f32(vdupq_n_f32(1.421413741f), t, p);
    p = vfmaq_f32(vdupq_n_f32(-0.284496736f), t, p);
    p = vfmaq_f32(vdupq_n_f32(0.254829592f), t, p);
    const float32x4_t h = vmulq_f32(vmulq_n_f32(vmulq_f32(t, p), 0.5f), e);
    const float32x4_t Phi = vbslq_f32(vcgeq_f32(x, vdupq_n_f32(0.0f)), vsubq_f32(one, h), h);
    return vbslq_f32(vcgtq_f32(xin, fmax), xin, vmulq_f32(x, Phi));
}
#endif

/* Expand BODY(F) once per activation so every loop is a straight vectorisable simd loop. */
#define ACT_DISPATCH(kind, BODY)                                   \
    switch (kind) {                                                \
    case ACT_SILU: BODY(act_silu); break;                          \
    case ACT_GELU: BODY(act_gelu); break;                          \
    default: BODY(act_gelu_tanh); break;                           \
    }

/* fp32 block kernels over n elements (inputs and outputs never alias). */
static inline void blk_fp32(int op, int kind, int64_t n, const float *const *in, float *const *out) {
    const float *restrict a = in[0], *restrict b = in[1], *restrict c = in[2];
    float *restrict o0 = out[0], *restrict o1 = out[1];
    switch (op) {
    case OP_UNARY_FWD: /* a = x */
#if defined(TSR_NEON)
        if (kind == ACT_SILU) {   /* intrinsics: the compiler's own NEON of act_silu is ~3x longer */
            int64_t i = 0;
            for (; i + 4 <= n; i += 4) vst1q_f32(o0 + i, tsr_neon_silu(vld1q_f32(a + i)));
            for (; i < n; i++) { float d; o0[i] = act_silu(a[i], &d); }
            break;
        }
        if (kind == ACT_GELU) {
            int64_t i = 0;
            for (; i + 4 <= n; i += 4) vst1q_f32(o0 + i, neon_gelu(vld1q_f32(a + i)));
            for (; i < n; i++) { float d; o0[i] = act_gelu(a[i], &d); }
            break;
        }
#endif
#define BODY(F) _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { float d; o0[i] = F(a[i], &d); }
        ACT_DISPATCH(kind, BODY)
#undef BODY
        break;
    case OP_UNARY_BWD: /* a = dy, b = x */
#define BODY(F) _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { float d; (void)F(b[i], &d); o0[i] = a[i] * d; }
        ACT_DISPATCH(kind, BODY)
#undef BODY
        break;
    case OP_GLU_FWD: /* a = gate, b = up */
#if defined(TSR_NEON)
        if (kind == ACT_SILU) {
            int64_t i = 0;
            for (; i + 4 <= n; i += 4) vst1q_f32(o0 + i, vmulq_f32(tsr_neon_silu(vld1q_f32(a + i)), vld1q_f32(b + i)));
            for (; i < n; i++) { float d; o0[i] = act_silu(a[i], &d) * b[i]; }
            break;
        }
        if (kind == ACT_GELU) {
            int64_t i = 0;
            for (; i + 4 <= n; i += 4) vst1q_f32(o0 + i, vmulq_f32(neon_gelu(vld1q_f32(a + i)), vld1q_f32(b + i)));
            for (; i < n; i++) { float d; o0[i] = act_gelu(a[i], &d) * b[i]; }
            break;
        }
#endif
#define BODY(F) _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { float d; o0[i] = F(a[i], &d) * b[i]; }
        ACT_DISPATCH(kind, BODY)
#undef BODY
        break;
    default: /* a = dy, b = gate, c = up */
#define BODY(F) _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { \
            float d; const float y = F(b[i], &d); o0[i] = a[i] * c[i] * d; o1[i] = a[i] * y; }
        ACT_DISPATCH(kind, BODY)
#undef BODY
        break;
    }
}

/* One row segment, portable path: ACT_BLOCK-element blocks through the fp32 scratch. */
static inline void seg_portable(int op, int kind, int dtype, int nt, int64_t n, const char *const *in,
                                char *const *out, float *scratch) {
    const int es = tsr_elsize(dtype), nin = act_nin[op], nout = act_nout[op];
    const int direct = dtype == TSR_F32 && !nt; /* fp32, ordinary stores: compute in place */
    uint16_t *tmp = (uint16_t *)(scratch + 5 * ACT_BLOCK);
    for (int64_t j = 0; j < n; j += ACT_BLOCK) {
        const int64_t b = n - j < ACT_BLOCK ? n - j : ACT_BLOCK;
        const float *ip[3] = {NULL, NULL, NULL};
        float *op_[2] = {NULL, NULL};
        for (int k = 0; k < nin; k++) {
            const char *src = in[k] + j * es;
            if (dtype == TSR_F32) {
                ip[k] = (const float *)src;
            } else {
                tsr_load_f32(scratch + k * ACT_BLOCK, src, b, dtype);
                ip[k] = scratch + k * ACT_BLOCK;
            }
        }
        for (int k = 0; k < nout; k++) op_[k] = direct ? (float *)(out[k] + j * 4) : scratch + (3 + k) * ACT_BLOCK;
        blk_fp32(op, kind, b, ip, op_);
        if (!direct)
            for (int k = 0; k < nout; k++) tsr_store_row(out[k] + j * es, op_[k], b, dtype, nt, tmp);
    }
}

#endif /* !TSR_AVX512 */

#ifdef TSR_AVX512 /* -------------------------------------------- AVX-512 path */
/* The math runs on x clamped to [-C, C] (NaN kept: max/min return their NaN second
 * operand), C chosen where act and act' already equal their limits in fp32; the value
 * act(x) = x * g(xc) uses xl = max(x, -FLT_MAX) so +inf and large x pass through exactly. */
#define V_CLAMP(x, C, xl, xc)                                                    \
    const __m512 xl = _mm512_max_ps(tsr_v1(-FLT_MAX), x);                            \
    const __m512 xc = _mm512_max_ps(tsr_v1(-(C)), _mm512_min_ps(tsr_v1(C), x))

static inline __m512 v_silu(__m512 x, __m512 *d) {
    V_CLAMP(x, 110.0f, xl, xc); /* exp(-110) = 2e-48: s is 0 / 1 beyond */
    __m512 s1m;
    const __m512 s = tsr_v_sigmoid(xc, &s1m);
    *d = _mm512_mul_ps(s, _mm512_fmadd_ps(xc, s1m, tsr_v1(1.0f)));
    return _mm512_mul_ps(xl, s);
}

static inline __m512 v_gelu(__m512 x, __m512 *d) {
    V_CLAMP(x, 15.0f, xl, xc); /* Phi(-15) = 4e-51, phi(15) = 6e-50: 0 in fp32 */
    const __m512 a = _mm512_mul_ps(_mm512_abs_ps(xc), tsr_v1(ACT_SQRT1_2));
    const __m512 e = tsr_v_exp_nonpos(_mm512_fnmadd_ps(a, a, _mm512_setzero_ps()));
    const __m512 t = tsr_v_rcp(_mm512_fmadd_ps(tsr_v1(0.3275911f), a, tsr_v1(1.0f)));
    /* A&S 7.1.26 coefficients halved: h = t P(t) e / 2 = Phi(-|x|) */
    __m512 p = tsr_v1(0.5f * 1.061405429f);
    p = _mm512_fmadd_ps(p, t, tsr_v1(0.5f * -1.453152027f));
    p = _mm512_fmadd_ps(p, t, tsr_v1(0.5f * 1.421413741f));
    p = _mm512_fmadd_ps(p, t, tsr_v1(0.5f * -0.284496736f));
    p = _mm512_fmadd_ps(p, t, tsr_v1(0.5f * 0.254829592f));
    const __m512 h = _mm512_mul_ps(_mm512_mul_ps(p, t), e);
    const __mmask16 neg = _mm512_movepi32_mask(_mm512_castps_si512(xc));
    const __m512 Phi = _mm512_mask_sub_ps(h, (__mmask16)~neg, tsr_v1(1.0f), h);
    *d = _mm512_fmadd_ps(xc, _mm512_mul_ps(e, tsr_v1(ACT_INV_SQRT_2PI)), Phi);
    return _mm512_mul_ps(xl, Phi);
}

static inline __m512 v_gelu_tanh(__m512 x, __m512 *d) {
    V_CLAMP(x, 20.0f, xl, xc); /* |z(20)| = 603: s is 0 / 1 and s (1 - s) = 0 beyond */
    const __m512 x2 = _mm512_mul_ps(xc, xc);
    const __m512 z = _mm512_mul_ps(xc, _mm512_fmadd_ps(tsr_v1(ACT_2_SQRT_2_PI * ACT_TANH_K), x2, tsr_v1(ACT_2_SQRT_2_PI)));
    __m512 s1m;
    const __m512 s = tsr_v_sigmoid(z, &s1m);
    const __m512 dz = _mm512_fmadd_ps(tsr_v1(3.0f * ACT_TANH_K * ACT_2_SQRT_2_PI), x2, tsr_v1(ACT_2_SQRT_2_PI));
    *d = _mm512_fmadd_ps(_mm512_mul_ps(xc, _mm512_mul_ps(s, s1m)), dz, s);
    return _mm512_mul_ps(xl, s);
}

static inline __attribute__((always_inline)) __m512 v_act(int kind, __m512 x, __m512 *d) {
    if (kind == ACT_SILU) return v_silu(x, d);
    if (kind == ACT_GELU) return v_gelu(x, d);
    return v_gelu_tanh(x, d);
}

/* One 32-element step of an op at byte offset o. */
static inline __attribute__((always_inline)) void v_step(const int op, const int kind, const int dt, int nt,
                                                         const char *const *in, char *const *out, int64_t o,
                                                         __mmask32 m, const int full) {
    tsr_v2f y, d;
    if (op == OP_UNARY_FWD) {
        const tsr_v2f x = tsr_v2_load(in[0] + o, dt, m, full);
        y.a = v_act(kind, x.a, &d.a);
        y.b = v_act(kind, x.b, &d.b);
        tsr_v2_store(out[0] + o, y, dt, m, full, nt);
    } else if (op == OP_UNARY_BWD) {
        const tsr_v2f x = tsr_v2_load(in[1] + o, dt, m, full), dy = tsr_v2_load(in[0] + o, dt, m, full);
        (void)v_act(kind, x.a, &d.a);
        (void)v_act(kind, x.b, &d.b);
        tsr_v2_store(out[0] + o, (tsr_v2f){_mm512_mul_ps(dy.a, d.a), _mm512_mul_ps(dy.b, d.b)}, dt, m, full, nt);
    } else if (op == OP_GLU_FWD) {
        const tsr_v2f g = tsr_v2_load(in[0] + o, dt, m, full), u = tsr_v2_load(in[1] + o, dt, m, full);
        y.a = _mm512_mul_ps(v_act(kind, g.a, &d.a), u.a);
        y.b = _mm512_mul_ps(v_act(kind, g.b, &d.b), u.b);
        tsr_v2_store(out[0] + o, y, dt, m, full, nt);
    } else {
        const tsr_v2f dy = tsr_v2_load(in[0] + o, dt, m, full), g = tsr_v2_load(in[1] + o, dt, m, full),
                  u = tsr_v2_load(in[2] + o, dt, m, full);
        y.a = v_act(kind, g.a, &d.a);
        y.b = v_act(kind, g.b, &d.b);
        tsr_v2_store(out[0] + o, (tsr_v2f){_mm512_mul_ps(_mm512_mul_ps(dy.a, u.a), d.a),
                                   _mm512_mul_ps(_mm512_mul_ps(dy.b, u.b), d.b)}, dt, m, full, nt);
        tsr_v2_store(out[1] + o, (tsr_v2f){_mm512_mul_ps(dy.a, y.a), _mm512_mul_ps(dy.b, y.b)}, dt, m, full, nt);
    }
}

/* One row segment of n elements, specialised per (op, kind, dtype) by inlining: a masked
 * head that aligns out[0] to 64 bytes (when streaming), full 32-element steps, a masked tail. */
static inline __attribute__((always_inline)) void seg_avx512(const int op, const int kind, const int dt, int nt,
                                                             int64_t n, const char *const *in, char *const *out) {
    const int es = dt == TSR_F32 ? 4 : 2;
    int64_t i = nt ? (int64_t)(((uintptr_t)0 - (uintptr_t)out[0]) & 63) / es : 0;
    if (i > n) i = n;
    if (i) v_step(op, kind, dt, nt, in, out, 0, tsr_v_mask32(i), 0);
    for (; i + 32 <= n; i += 32) v_step(op, kind, dt, nt, in, out, i * es, 0xffffffffu, 1);
    if (i < n) v_step(op, kind, dt, nt, in, out, i * es, tsr_v_mask32(n - i), 0);
}

static void seg_avx512_any(int op, int kind, int dt, int nt, int64_t n, const char *const *in, char *const *out) {
#define VCASE(OP, K, DT) case ((OP) * 3 + (K)) * 4 + (DT): seg_avx512(OP, K, DT, nt, n, in, out); return;
#define VK(OP, K) VCASE(OP, K, TSR_F32) VCASE(OP, K, TSR_F16) VCASE(OP, K, TSR_BF16) VCASE(OP, K, TSR_BF16_HW)
#define VOP(OP) VK(OP, ACT_SILU) VK(OP, ACT_GELU) VK(OP, ACT_GELU_TANH)
    switch ((op * 3 + kind) * 4 + dt) { VOP(OP_UNARY_FWD) VOP(OP_UNARY_BWD) VOP(OP_GLU_FWD) VOP(OP_GLU_BWD) }
#undef VOP
#undef VK
#undef VCASE
}
#endif /* TSR_AVX512 */

/* ------------------------------------------------------------------ driver */
/* act_nin[op] row-view inputs (row stride sin[k] elements) -> act_nout[op] contiguous outputs.
 *
 * The E = M * N elements are cut into chunks of at most ACT_CHUNK elements (multiples of
 * ACT_ALIGN, so every chunk's output starts on a cache line) handed out dynamically: on a
 * shared machine a thread that loses its core for a time slice no longer holds up the
 * call with a fixed half of the work.  Small problems get one chunk per thread. */
/* Elements [lo, hi) of the flattened M x N problem, in segments that never cross a row end
 * (rowlen: N, or M * N when every input is one long row). */
static void act_range(int op, int kind, const void *const *in, const int64_t *sin, void *const *out, int64_t lo,
                      int64_t hi, int64_t rowlen, int es, int nin, int nout, int dtype, int nt, float *scratch) {
#ifdef TSR_AVX512
    const int dtk = tsr_v_dtype(dtype); /* bf16 -> hardware-converted bf16 where available */
    (void)scratch;
#endif
    for (int64_t f = lo; f < hi;) {
        const int64_t r = f / rowlen, c = f - r * rowlen;
        const int64_t n = rowlen - c < hi - f ? rowlen - c : hi - f;
        const char *ip[3] = {NULL, NULL, NULL};
        char *op_[2] = {NULL, NULL};
        for (int k = 0; k < nin; k++) ip[k] = (const char *)in[k] + (r * sin[k] + c) * es;
        for (int k = 0; k < nout; k++) op_[k] = (char *)out[k] + f * es;
#ifdef TSR_AVX512
        seg_avx512_any(op, kind, dtk, nt, n, ip, op_);
#else
        seg_portable(op, kind, dtype, nt, n, ip, op_, scratch);
#endif
        f += n;
    }
}

/* The portable path's staging buffers (3 in, 2 out, conversion tmp); none on AVX-512. */
static float *act_scratch(int *failed) {
#ifdef TSR_AVX512
    (void)failed;
    return NULL;
#else
    float *s = tsr_scratch(6 * ACT_BLOCK);
    if (!s) *failed = 1;
    return s;
#endif
}

static int act_run(int op, int kind, const void *const *in, const int64_t *sin, void *const *out,
                   int64_t M, int64_t N, int dtype, int nt, int nthreads) {
    if (kind < ACT_SILU || kind > ACT_GELU_TANH) return TSR_EINVAL;
    if (dtype != TSR_F32 && dtype != TSR_F16 && dtype != TSR_BF16) return TSR_EINVAL;
    const int es = tsr_elsize(dtype), nin = act_nin[op], nout = act_nout[op];
    const int64_t E = M * N;
    if (E <= 0) return TSR_OK;
    /* Streaming stores only for fp32 outputs.  With fp16/bf16 outputs (one 64-byte store per
     * 32 elements of math) they made these kernels 1.4-2.4x slower than plain stores on the
     * Sapphire Rapids VM, 8192 x 4096, one thread (silu fwd bf16 34 vs 16 ms, swiglu bwd 35 vs
     * 25), while fp32 outputs gain a little from them (silu fwd 22 vs 25 ms, swiglu bwd 38 vs
     * 48); the 2-byte rows on the AMD VM sat at 36-59 % of the copy roof, fp32 at 75-97 %. */
    if (dtype != TSR_F32) nt = 0;
    /* When every input's rows follow each other (stride N, or one row) the whole problem
     * is one long row: segments need not stop at row ends. */
    int contiguous = 1;
    for (int k = 0; k < nin; k++)
        if (M > 1 && sin[k] != N) contiguous = 0;
    const int64_t rowlen = contiguous ? E : N;
    const int T = tsr_threads(nthreads);
    int64_t chunk = (E + T - 1) / T;
    chunk = chunk > ACT_CHUNK ? ACT_CHUNK : (chunk + ACT_ALIGN - 1) / ACT_ALIGN * ACT_ALIGN;
    const int64_t nchunks = (E + chunk - 1) / chunk;
    int failed = 0;
    TSR_TEAM(T, reduction(| : failed), {
        float *scratch = act_scratch(&failed);
_Pragma("omp for schedule(dynamic, 1)")
        for (int64_t ci = 0; ci < nchunks; ci++) {
            const int64_t hi = (ci + 1) * chunk < E ? (ci + 1) * chunk : E;
            if (!failed) act_range(op, kind, in, sin, out, ci * chunk, hi, rowlen, es, nin, nout, dtype, nt, scratch);
        }
        tsr_sfence();
        free(scratch);
    });
    return failed ? TSR_ENOMEM : TSR_OK;
}

/* Entry points (ctypes): pointers, row strides in elements, M x N, kind, dtype code, nt, threads. */
int tsr_act_fwd(const void *x, int64_t sx, void *y, int64_t M, int64_t N, int kind, int dtype, int nt,
                int nthreads) {
    return act_run(OP_UNARY_FWD, kind, (const void *[]){x}, (const int64_t[]){sx}, (void *[]){y}, M, N, dtype,
                   nt, nthreads);
}

int tsr_act_bwd(const void *dy, int64_t sdy, const void *x, int64_t sx, void *dx, int64_t M, int64_t N,
                int kind, int dtype, int nt, int nthreads) {
    return act_run(OP_UNARY_BWD, kind, (const void *[]){dy, x}, (const int64_t[]){sdy, sx}, (void *[]){dx}, M, N,
                   dtype, nt, nthreads);
}

int tsr_glu_fwd(const void *gate, int64_t sg, const void *up, int64_t su, void *out, int64_t M, int64_t N,
                int kind, int dtype, int nt, int nthreads) {
    return act_run(OP_GLU_FWD, kind, (const void *[]){gate, up}, (const int64_t[]){sg, su}, (void *[]){out}, M, N,
                   dtype, nt, nthreads);
}

int tsr_glu_bwd(const void *dy, int64_t sdy, const void *gate, int64_t sg, const void *up, int64_t su,
                void *dgate, void *dup, int64_t M, int64_t N, int kind, int dtype, int nt, int nthreads) {
    return act_run(OP_GLU_BWD, kind, (const void *[]){dy, gate, up}, (const int64_t[]){sdy, sg, su},
                   (void *[]){dgate, dup}, M, N, dtype, nt, nthreads);
}
