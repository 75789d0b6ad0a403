/* activations.cl -- SiLU, GELU (erf and tanh forms), SwiGLU and GeGLU, forward and fused
 * backward, for the opencl backend (OpenCL C 1.2; launchers: _elementwise/opencl.py).
 *
 *   unary:  y = act(x)                 dx = dy * act'(x)
 *   gated:  out = act(gate) * up       dgate = dy * up * act'(gate),  dup = dy * act(gate)
 *
 * act, in fp32 for every storage dtype -- the formulas and numerics of the cpu kernel
 * (activations.c, portable path), with the same error against float64 (fp32 forward on
 * [-40, 40]: max abs 1.3e-6 silu, 4.2e-7 gelu, 5.2e-7 gelu_tanh, on both backends):
 *   silu       x * s(x),     s = sigmoid,  act' = s (1 + x (1 - s))
 *   gelu       x * Phi(x),   Phi = normal CDF,  act' = Phi + x phi(x),  phi = exp(-x^2/2) / sqrt(2 pi)
 *   gelu_tanh  x * s(z),     z = 2u, u = sqrt(2/pi) (x + 0.044715 x^3)  (0.5 x (1 + tanh u)
 *                            = x s(2u): one exp, no tanh),  act' = s + x s (1 - s) z'
 *
 * Numerics:
 * - exp is tsr_exp (tessera_cl.h, < 1 ulp): PoCL's built-in exp/erfc/fmin/fmax are out-of-line
 *   calls that stop the work-item loop from vectorising (4x slower here).  No native_* or
 *   relaxed math either: those may lose the limits or drift per device.
 * - 1 - s without cancellation: e s for z >= 0 (e = exp(-z) <= 1), else 1 - s (s <= 1/2).
 * - GELU: Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), t P(t) exp(-a^2) = erfc(a) with
 *   a = |x| / sqrt2, so Phi = erfc(a)/2 for x < 0 and 1 - erfc(a)/2 otherwise: no 1 + erf
 *   cancellation for negative x, and exp(-a^2) = exp(-x^2/2) is phi's exponential too (one
 *   exp per element, forward and backward).
 * - Limits exact at +-inf (act(-inf) = 0, act(+inf) = +inf, act'(-inf) = 0, act'(+inf) = 1)
 *   and NaN propagates: the products that would be inf * 0 take x clamped to +-FLT_MAX by
 *   comparisons (false for NaN, so NaN is kept; see act_lo / act_hi).  gelu_tanh's act'
 *   clamps x to +-1e6 so x^2 stays finite (beyond it s (1 - s) is exactly 0 in fp32).
 *
 * Layout and parallelism.  Inputs are row views (unit inner stride, any row stride: 0 for a
 * broadcast row, 2n for a chunk of a fused projection; int64 offsets); outputs are
 * contiguous.  When every input's rows follow each other the launcher passes the problem as
 * one row of M*N elements.  The NDRange is 2-D: dimension 1 is the row, dimension 0 a span of
 * `per` 8-element chunks of it.  A chunk is float8 arithmetic (act_<kind>8: the scalar
 * functions lane by lane, bit-identical) loaded by tsr_ld8 and stored by tsr_st8_nt, so an
 * fp32 output of TSR_NT size is written by aligned 8-wide streaming stores (tessera_cl.h);
 * the row's last partial chunk goes element by element (the scalar functions).  On a CPU the
 * launcher gives each work-item a long span (work-groups of one: PoCL vectorises across
 * work-items only in loop-free regions, while a float8 loop is SIMD code as written, and one
 * TSR_NT_FENCE per span, not per chunk); on a GPU, one chunk per work-item.  Before
 * (issue #15) a work-item took one element and PoCL vectorised the work-item loop: the same
 * arithmetic, but scalar stores that its vectoriser could not make streaming ones.
 *
 * Storage: fp32 as is, bf16 by tessera_cl.h's integer RNE, fp16 by its integer conversions
 * (bit-exact with vload_half / vstore_half_rte, which PoCL compiles as out-of-line calls that
 * keep the work-item loop scalar: 6x slower).  No fp16 arithmetic even where cl_khr_fp16
 * exists: the contract is fp32 math for every dtype.
 */
#include "tessera_cl.h"

/* Element access: tsr_ld / tsr_st, except fp16 (see Storage above). */
#if TSR_DTYPE == 1
#define act_ld(p, i) tsr_half_to_f32(((__global const ushort *)(p))[(i)])
#define act_st(p, i, v) (((__global ushort *)(p))[(i)] = tsr_f32_to_half(v))
#else
#define act_ld(p, i) tsr_ld(p, i)
#define act_st(p, i, v) tsr_st(p, i, v)
#endif

#define ACT_SQRT1_2 0.70710678118654752f
#define ACT_INV_SQRT_2PI 0.39894228040143268f
#define ACT_2_SQRT_2_PI 1.5957691216057308f /* 2 sqrt(2/pi) */
#define ACT_TANH_K 0.044715f

/* -inf -> -FLT_MAX and +inf -> FLT_MAX; NaN stays NaN (comparisons with NaN are false). */
inline float act_lo(float x) { return x < -FLT_MAX ? -FLT_MAX : x; }
inline float act_hi(float x) { return x > FLT_MAX ? FLT_MAX : x; }

/* Each act_<kind> returns act(x) and writes act'(x) to *d; forward kernels drop *d, and the
 * compiler drops its arithmetic with it.  The +-inf limits: exp, the sigmoid and erfc's
 * pieces take +-inf as they are (exp clamps its argument), so only the final products need
 * care.  act(x) = x g(x) multiplies by act_lo(x): g(-inf) = 0 would make -inf * 0 = NaN, and
 * -FLT_MAX * 0 = 0 is the limit, while +inf * g(+inf) = +inf * 1 passes through.  act'(x)
 * multiplies x by terms that vanish at either end, so it takes x clamped on both sides.
 * (Clamping x once on both sides for everything, as the cpu kernel does, cost the forward
 * kernels three more vector operations per element: ~10% of silu on PoCL.) */
inline float act_silu(float x, float *d) {
    const float e = tsr_exp(-x); /* inf for x < -88.7: s = 0 */
    const float s = 1.0f / (1.0f + e);
    const float s1m = x >= 0.0f ? e * s : 1.0f - s;
    *d = s * (1.0f + act_hi(act_lo(x)) * s1m);
    return act_lo(x) * s;
}

inline float act_gelu(float x, float *d) {
    const float a = as_float(as_uint(x) & 0x7fffffffu) * ACT_SQRT1_2; /* |x| / sqrt2: one AND */
    const float e = tsr_exp(-a * a); /* exp(-x^2/2); 0 once a^2 > 104 (or overflows) */
    const float t = 1.0f / (1.0f + 0.3275911f * a);
    /* A&S 7.1.26 coefficients halved (exact: a power of two), so t P(t) e / 2 needs no multiply */
    const float p = t * (0.5f * 0.254829592f + t * (0.5f * -0.284496736f + t * (0.5f * 1.421413741f +
                    t * (0.5f * -1.453152027f + t * (0.5f * 1.061405429f)))));
    const float h = p * e; /* erfc(a) / 2 = Phi(-|x|); 0 at +-inf (t = 0) */
    const float Phi = x >= 0.0f ? 1.0f - h : h;
    *d = Phi + act_hi(act_lo(x)) * (e * ACT_INV_SQRT_2PI);
    return act_lo(x) * Phi;
}

inline float act_gelu_tanh(float x, float *d) {
    const float z = ACT_2_SQRT_2_PI * x * (1.0f + ACT_TANH_K * x * x); /* +-inf beyond ~1e19 */
    const float e = tsr_exp(-z);
    const float s = 1.0f / (1.0f + e);
    const float s1m = z >= 0.0f ? e * s : 1.0f - s;
    /* beyond |x| = 1e6, s (1 - s) is exactly 0: this clamp only keeps x^2 finite */
    float xd = x > 1e6f ? 1e6f : x;
    xd = xd < -1e6f ? -1e6f : xd;
    const float dz = ACT_2_SQRT_2_PI * (1.0f + 3.0f * ACT_TANH_K * xd * xd);
    *d = s + xd * (s * s1m) * dz;
    return act_lo(x) * s;
}

/* The same functions on an 8-element chunk (float8), with the scalar versions' operations in the
 * same order, so results are bit-identical to them (NaN payloads aside).  The vector ?: selects
 * per lane (OpenCL C); no select() or convert_*: PoCL may compile those as calls.
 * act_exp8 is tsr_exp (tessera_cl.h) per lane, k taken from the rounding constant's bits
 * (1.5 * 2^23 + k, |k| <= 150: equal to (int)kf) instead of a conversion. */
inline float8 act_exp8(float8 x) {
    float8 xc = x < -104.0f ? (float8)(-104.0f) : x;
    xc = xc > 88.75f ? (float8)88.75f : xc;
    const float8 kr = xc * 1.44269504088896341f + 12582912.0f;
    const float8 kf = kr - 12582912.0f;
    const float8 r = (xc - kf * 0.693359375f) + kf * 2.12194440e-4f;
    float8 p = 0.001387505210004747f;
    p = p * r + 0.008372829295694828f;
    p = p * r + 0.041667692363262177f;
    p = p * r + 0.16666479408740997f;
    p = p * r + 0.4999999403953552f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int8 k = as_int8(kr) - 0x4b400000, k1 = k >> 1, k2 = k - k1;
    return p * as_float8((k1 + 127) << 23) * as_float8((k2 + 127) << 23);
}

inline float8 act_lo8(float8 x) { return x < -FLT_MAX ? (float8)(-FLT_MAX) : x; }
inline float8 act_hi8(float8 x) { return x > FLT_MAX ? (float8)FLT_MAX : x; }

inline float8 act_silu8(float8 x, float8 *d) {
    const float8 e = act_exp8(-x);
    const float8 s = 1.0f / (1.0f + e);
    const float8 s1m = x >= 0.0f ? e * s : 1.0f - s;
    *d = s * (1.0f + act_hi8(act_lo8(x)) * s1m);
    return act_lo8(x) * s;
}

inline float8 act_gelu8(float8 x, float8 *d) {
    const float8 a = as_float8(as_uint8(x) & 0x7fffffffu) * ACT_SQRT1_2;
    const float8 e = act_exp8(-a * a);
    const float8 t = 1.0f / (1.0f + 0.3275911f * a);
    const float8 p = t * (0.5f * 0.254829592f + t * (0.5f * -0.284496736f + t * (0.5f * 1.421413741f +
                   t * (0.5f * -1.453152027f + t * (0.5f * 1.061405429f)))));
    const float8 h = p * e;
    const float8 Phi = x >= 0.0f ? 1.0f - h : h;
    *d = Phi + act_hi8(act_lo8(x)) * (e * ACT_INV_SQRT_2PI);
    return act_lo8(x) * Phi;
}

inline float8 act_gelu_tanh8(float8 x, float8 *d) {
    const float8 z = ACT_2_SQRT_2_PI * x * (1.0f + ACT_TANH_K * x * x);
    const float8 e = act_exp8(-z);
    const float8 s = 1.0f / (1.0f + e);
    const float8 s1m = z >= 0.0f ? e * s : 1.0f - s;
    float8 xd = x > 1e6f ? (float8)1e6f : x;
    xd = xd < -1e6f ? (float8)(-1e6f) : xd;
    const float8 dz = ACT_2_SQRT_2_PI * (1.0f + 3.0f * ACT_TANH_K * xd * xd);
    *d = s + xd * (s * s1m) * dz;
    return act_lo8(x) * s;
}

/* The span of this work-item: row i = dimension 1; columns [j, j1) = chunks
 * per * id0 .. per * (id0 + 1) - 1 of 8 elements, cut at N, so only the row's last span has a
 * partial chunk (its elements go one by one) and spans past the row are empty.  Whole chunks:
 * float8 arithmetic and tsr_ld8 / tsr_st8_nt (streamed when aligned and TSR_NT, tessera_cl.h);
 * the kernel ends with TSR_NT_FENCE.  `per` is the launcher's (see Layout above). */
#define ACT_SPAN                                                                          \
    const long i = get_global_id(1), jb = 8 * per * (long)get_global_id(0);               \
    const long j1 = jb + 8 * per < N ? jb + 8 * per : N;                                  \
    long j = jb;

/* Parameters and bodies of the four ops: inputs with their row strides s<name> (elements),
 * then the contiguous outputs of row length N, then the chunks per work-item. */
#define ACT_FWD_PARAMS __global const TSR_T *x, long sx, __global TSR_T *y, long N, long per
#define ACT_BWD_PARAMS __global const TSR_T *dy, long sdy, __global const TSR_T *x, long sx, \
                       __global TSR_T *dx, long N, long per
#define GLU_FWD_PARAMS __global const TSR_T *gate, long sg, __global const TSR_T *up, long su, \
                       __global TSR_T *out, long N, long per
#define GLU_BWD_PARAMS __global const TSR_T *dy, long sdy, __global const TSR_T *gate, long sg, \
                       __global const TSR_T *up, long su, __global TSR_T *dgate, __global TSR_T *dup, \
                       long N, long per

#define ACT_FWD(F) ACT_SPAN {                                                               \
    __global const TSR_T *xr = x + i * sx;                                                 \
    __global TSR_T *yr = y + i * N;                                                        \
    for (; j + 8 <= j1; j += 8) {                                                          \
        float8 d;                                                                          \
        tsr_st8_nt(yr, j, F##8(tsr_ld8(xr, j), &d));                                       \
    }                                                                                      \
    for (; j < j1; j++) {                                                                  \
        float d;                                                                           \
        act_st(yr, j, F(act_ld(xr, j), &d));                                               \
    }                                                                                      \
    TSR_NT_FENCE(); }
#define ACT_BWD(F) ACT_SPAN {                                                               \
    __global const TSR_T *xr = x + i * sx, *dyr = dy + i * sdy;                            \
    __global TSR_T *dxr = dx + i * N;                                                      \
    for (; j + 8 <= j1; j += 8) {                                                          \
        float8 d;                                                                          \
        (void)F##8(tsr_ld8(xr, j), &d);                                                    \
        tsr_st8_nt(dxr, j, tsr_ld8(dyr, j) * d);                                           \
    }                                                                                      \
    for (; j < j1; j++) {                                                                  \
        float d;                                                                           \
        (void)F(act_ld(xr, j), &d);                                                        \
        act_st(dxr, j, act_ld(dyr, j) * d);                                                \
    }                                                                                      \
    TSR_NT_FENCE(); }
#define GLU_FWD(F) ACT_SPAN {                                                               \
    __global const TSR_T *gr = gate + i * sg, *ur = up + i * su;                           \
    __global TSR_T *outr = out + i * N;                                                    \
    for (; j + 8 <= j1; j += 8) {                                                          \
        float8 d;                                                                          \
        const float8 a = F##8(tsr_ld8(gr, j), &d);                                         \
        tsr_st8_nt(outr, j, a * tsr_ld8(ur, j));                                           \
    }                                                                                      \
    for (; j < j1; j++) {                                                                  \
        float d;                                                                           \
        const float a = F(act_ld(gr, j), &d);                                              \
        act_st(outr, j, a * act_ld(ur, j));                                                \
    }                                                                                      \
    TSR_NT_FENCE(); }
#define GLU_BWD(F) ACT_SPAN {                                                               \
    __global const TSR_T *gr = gate + i * sg, *ur = up + i * su, *dyr = dy + i * sdy;      \
    __global TSR_T *dgr = dgate + i * N, *dur = dup + i * N;                               \
    for (; j + 8 <= j1; j += 8) {                                                          \
        float8 d;                                                                          \
        const float8 a = F##8(tsr_ld8(gr, j), &d);                                         \
        const float8 g = tsr_ld8(dyr, j);                                                  \
        tsr_st8_nt(dgr, j, g * tsr_ld8(ur, j) * d);                                        \
        tsr_st8_nt(dur, j, g * a);                                                         \
    }                                                                                      \
    for (; j < j1; j++) {                                                                  \
        float d;                                                                           \
        const float a = F(act_ld(gr, j), &d);                                              \
        const float g = act_ld(dyr, j);                                                    \
        act_st(dgr, j, g * act_ld(ur, j) * d);                                             \
        act_st(dur, j, g * a);                                                             \
    }                                                                                      \
    TSR_NT_FENCE(); }

__kernel void act_fwd_silu(ACT_FWD_PARAMS) { ACT_FWD(act_silu) }
__kernel void act_fwd_gelu(ACT_FWD_PARAMS) { ACT_FWD(act_gelu) }
__kernel void act_fwd_gelu_tanh(ACT_FWD_PARAMS) { ACT_FWD(act_gelu_tanh) }

__kernel void act_bwd_silu(ACT_BWD_PARAMS) { ACT_BWD(act_silu) }
__kernel void act_bwd_gelu(ACT_BWD_PARAMS) { ACT_BWD(act_gelu) }
__kernel void act_bwd_gelu_tanh(ACT_BWD_PARAMS) { ACT_BWD(act_gelu_tanh) }

__kernel void glu_fwd_silu(GLU_FWD_PARAMS) { GLU_FWD(act_silu) }
__kernel void glu_fwd_gelu(GLU_FWD_PARAMS) { GLU_FWD(act_gelu) }
__kernel void glu_fwd_gelu_tanh(GLU_FWD_PARAMS) { GLU_FWD(act_gelu_tanh) }

__kernel void glu_bwd_silu(GLU_BWD_PARAMS) { GLU_BWD(act_silu) }
__kernel void glu_bwd_gelu(GLU_BWD_PARAMS) { GLU_BWD(act_gelu) }
__kernel void glu_bwd_gelu_tanh(GLU_BWD_PARAMS) { GLU_BWD(act_gelu_tanh) }
