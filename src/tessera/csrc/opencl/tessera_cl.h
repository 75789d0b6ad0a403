/* tessera OpenCL C helpers (OpenCL C 1.2; framework-free).
 *
 * Activation storage dtype is a build option: -DTSR_DTYPE=0 (fp32), 1 (fp16), 2 (bf16), the
 * codes of the cpu backend.  Kernels compute in fp32 and use
 *   TSR_T                    the storage type (float, half, ushort)
 *   tsr_ld(p, i)             element i as float
 *   tsr_st(p, i, v)          store float v rounded to the storage type (round to nearest even)
 * fp16 is storage only on devices without cl_khr_fp16 (vload_half / vstore_half_rte: PoCL);
 * bf16 is a ushort with the top 16 bits of the fp32 pattern, rounded to nearest even by integer
 * arithmetic (NaN stays NaN: its payload is forced quiet before the rounding add).
 * Row offsets are `long` (int64): a (rows x cols) activation can exceed 2^31 elements.
 */
#ifndef TESSERA_CL_H
#define TESSERA_CL_H

#ifndef TSR_DTYPE
#define TSR_DTYPE 0
#endif

/* ---- optional extensions (opencl.py's build options; see the module docstring there) ----
 * TSR_HAS_SUBGROUPS  sub-group reductions in tsr_wg_sum / tsr_wg_max / tsr_wg_min_int
 * TSR_HAS_INT_DOT    cl_khr_integer_dot_product's dot() in tsr_dot4 / tsr_dot4_su and the int8 GEMMs
 * Both 0 on the portable path.  TSR_EMULATE_SUBGROUPS / TSR_EMULATE_INT_DOT (tests only:
 * TESSERA_OPENCL_EMULATE) supply the built-ins in plain OpenCL C 1.2 (tessera_cl_emulate.h), so
 * the extension paths run, and are checked, on a device that has neither.  A device that lists
 * an extension whose built-ins its compiler does not declare at the chosen -cl-std gets the
 * portable path (the feature macros are the compiler's word). */
#ifndef TSR_HAS_SUBGROUPS
#define TSR_HAS_SUBGROUPS 0
#endif
#ifndef TSR_HAS_INT_DOT
#define TSR_HAS_INT_DOT 0
#endif
#ifndef TSR_EMULATE_SUBGROUPS
#define TSR_EMULATE_SUBGROUPS 0
#endif
#ifndef TSR_EMULATE_INT_DOT
#define TSR_EMULATE_INT_DOT 0
#endif
#if TSR_EMULATE_SUBGROUPS || TSR_EMULATE_INT_DOT
#include "tessera_cl_emulate.h"
#endif
#if TSR_HAS_SUBGROUPS && !TSR_EMULATE_SUBGROUPS
#if defined(cl_khr_subgroups)
#pragma OPENCL EXTENSION cl_khr_subgroups : enable
#elif defined(cl_intel_subgroups)
#pragma OPENCL EXTENSION cl_intel_subgroups : enable
#elif !defined(__opencl_c_subgroups)
#undef TSR_HAS_SUBGROUPS
#define TSR_HAS_SUBGROUPS 0
#endif
#endif
#if TSR_HAS_INT_DOT && !TSR_EMULATE_INT_DOT
#if defined(__opencl_c_integer_dot_product_input_4x8bit)
#ifdef cl_khr_integer_dot_product
#pragma OPENCL EXTENSION cl_khr_integer_dot_product : enable
#endif
#else
#undef TSR_HAS_INT_DOT
#define TSR_HAS_INT_DOT 0
#endif
#endif

inline float tsr_bf16_to_f32(ushort u) { return as_float(((uint)u) << 16); }

inline ushort tsr_f32_to_bf16(float f) {
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                            /* RNE */
    return (ushort)(u >> 16);
}

#if TSR_DTYPE == 0
#define TSR_T float
#define tsr_ld(p, i) ((p)[(i)])
#define tsr_st(p, i, v) ((p)[(i)] = (v))
#elif TSR_DTYPE == 1
#define TSR_T half
#define tsr_ld(p, i) vload_half((i), (p))
#define tsr_st(p, i, v) vstore_half_rte((v), (i), (p))
#elif TSR_DTYPE == 2
#define TSR_T ushort
#define tsr_ld(p, i) tsr_bf16_to_f32((p)[(i)])
#define tsr_st(p, i, v) ((p)[(i)] = tsr_f32_to_bf16(v))
#else
#error "TSR_DTYPE must be 0 (fp32), 1 (fp16) or 2 (bf16)"
#endif

/* exp(x) in fp32 from arithmetic only (< 1 ulp over the normal range; subnormal results by
 * gradual underflow; exp(+-inf) = inf / 0; NaN stays NaN).
 * Why not the built-in: PoCL 3.0 compiles exp() -- and fmin/fmax and most math built-ins -- as
 * out-of-line calls, and a call in the kernel body stops the work-item loop from vectorising:
 * an elementwise SiLU ran at 2.3 GB/s with exp() and 10.6 GB/s with this (8192x4096 fp32).
 * x = k ln2 + r (Cody-Waite: ln2 in two parts, the first exact in 9 bits, so k * part is
 * exact), |r| <= ln2/2, exp(r) = 1 + r + r^2 q(r) with q of degree 4 fitted for the least
 * largest relative error on that interval (5e-9 with the fp32 coefficients, by a linear
 * program: one multiply-add fewer than Taylor to r^7, as accurate), and 2^k applied as two
 * normal powers of two, so k in [-150, 128] neither overflows the exponent field nor flushes
 * a subnormal result (measured: < 0.9 ulp, 99.5% correctly rounded, on every 29th float).
 * Clamping to [-104, 88.75] keeps k in that range; the clamped ends round to 0 and overflow
 * to inf by themselves.  Comparisons, not fmin/fmax (calls on PoCL): NaN fails both and flows
 * through the polynomial. */
inline float tsr_exp(float x) {
    float xc = x < -104.0f ? -104.0f : x;
    xc = xc > 88.75f ? 88.75f : xc;
    const float kf = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* rint, 1.5 * 2^23 */
    const float r = (xc - kf * 0.693359375f) + kf * 2.12194440e-4f;
    float p = 0.001387505210004747f;
    p = p * r + 0.008372829295694828f;
    p = p * r + 0.041667692363262177f;
    p = p * r + 0.16666479408740997f;
    p = p * r + 0.4999999403953552f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int k = (int)kf, k1 = k >> 1, k2 = k - k1;
    return p * as_float((k1 + 127) << 23) * as_float((k2 + 127) << 23);
}

/* ---- work-group reductions: tsr_wg_sum / tsr_wg_max / tsr_wg_min_int ----
 * One value per work-item in, the work-group's result out to every work-item.  Every work-item
 * of the (1-D) work-group must make the call (the helpers hold barriers), and `scratch` holds at
 * least one 4-byte element per work-item; it may be reused right after the call.  Callers never
 * pass NaN to tsr_wg_max (their per-work-item maxima skip NaN, or are integer order keys), so
 * both implementations return the same maximum; sums are within rounding of each other.
 *
 * With sub-groups (TSR_HAS_SUBGROUPS: cl_khr_subgroups or cl_intel_subgroups, set by opencl.py
 * unless TESSERA_OPENCL_PORTABLE=1): the warp-shuffle reduction of CUDA / HIP.  Each sub-group
 * reduces its values with sub_group_reduce_add / _max / _min (in registers, no local memory),
 * its first work-item writes the partial to scratch[sub-group id], and after one barrier every
 * work-item combines the get_num_sub_groups() partials in sub-group order: every work-item
 * gets the same value (the same partials in the same order, also when the last sub-group is
 * partial), and a work-group of L work-items passes 2 barriers instead of log2(L) + 2.
 * Portable: a fixed tree through local memory (the local size a power of two).  Either way the
 * rounding order is fixed for a device and local size, so results do not depend on scheduling. */
#if TSR_HAS_SUBGROUPS
inline float tsr_wg_sum(float v, __local float *scratch) {
    const float part = sub_group_reduce_add(v);
    const uint ns = get_num_sub_groups();
    if (get_sub_group_local_id() == 0) scratch[get_sub_group_id()] = part;
    barrier(CLK_LOCAL_MEM_FENCE);
    float total = scratch[0];
    for (uint k = 1; k < ns; k++) total += scratch[k];
    barrier(CLK_LOCAL_MEM_FENCE);  /* scratch may be reused right after */
    return total;
}

inline float tsr_wg_max(float v, __local float *scratch) {
    const float part = sub_group_reduce_max(v);
    const uint ns = get_num_sub_groups();
    if (get_sub_group_local_id() == 0) scratch[get_sub_group_id()] = part;
    barrier(CLK_LOCAL_MEM_FENCE);
    float total = scratch[0];
    for (uint k = 1; k < ns; k++) total = fmax(total, scratch[k]);
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}

inline int tsr_wg_min_int(int v, __local int *scratch) {
    const int part = sub_group_reduce_min(v);
    const uint ns = get_num_sub_groups();
    if (get_sub_group_local_id() == 0) scratch[get_sub_group_id()] = part;
    barrier(CLK_LOCAL_MEM_FENCE);
    int total = scratch[0];
    for (uint k = 1; k < ns; k++) total = min(total, scratch[k]);
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}
#else
inline float tsr_wg_sum(float v, __local float *scratch) {
    const int lid = get_local_id(0), n = get_local_size(0);
    scratch[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n >> 1; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] += scratch[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float total = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);  /* scratch may be reused right after */
    return total;
}

inline float tsr_wg_max(float v, __local float *scratch) {
    const int lid = get_local_id(0), n = get_local_size(0);
    scratch[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n >> 1; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] = fmax(scratch[lid], scratch[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float total = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}

inline int tsr_wg_min_int(int v, __local int *scratch) {
    const int lid = get_local_id(0), n = get_local_size(0);
    scratch[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n >> 1; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] = min(scratch[lid], scratch[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const int total = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}
#endif

/* ---- 4 x 8-bit integer dot products: tsr_dot4 / tsr_dot4_su ----
 * sum of a.i * b.i over the 4 lanes, each product widened to int (exact: |sum| <= 4 * 2^14).
 * With TSR_HAS_INT_DOT (cl_khr_integer_dot_product, set by opencl.py unless
 * TESSERA_OPENCL_PORTABLE=1) the extension's non-saturating dot(char4, char4) /
 * dot(char4, uchar4), one instruction on devices that accelerate it; the caller adds the result
 * to an int accumulator with plain (wrapping) addition -- never dot_acc_sat, which saturates
 * and would break the wrapping int32 contract of the other backends.  Portable: the widened
 * sum.  Integer kernels use these only under `#if TSR_HAS_INT_DOT` (their portable loops keep
 * the scalar form a CPU compiler vectorises best). */
#if TSR_HAS_INT_DOT
inline int tsr_dot4(char4 a, char4 b) { return dot(a, b); }
inline int tsr_dot4_su(char4 a, uchar4 b) { return dot(a, b); }
#else
inline int tsr_dot4(char4 a, char4 b) {
    return ((int)a.x * (int)b.x + (int)a.y * (int)b.y) + ((int)a.z * (int)b.z + (int)a.w * (int)b.w);
}
inline int tsr_dot4_su(char4 a, uchar4 b) {
    return ((int)a.x * (int)b.x + (int)a.y * (int)b.y) + ((int)a.z * (int)b.z + (int)a.w * (int)b.w);
}
#endif

/* ---- 8-wide row access: tsr_ld8 / tsr_st8 / tsr_ld8f (memory-bound row kernels) ----
 * tsr_ld8(p, o) is p[o .. o+7] as a float8, tsr_st8(p, o, v) stores v there rounded to the storage
 * dtype (round to nearest even, as tsr_st), tsr_ld8f reads an fp32 parameter row.  They need only
 * element alignment (a row view of any stride).  Written as eight scalar accesses that the
 * compiler merges into one vector access: PoCL 3.0 compiles vload8/vstore8/vload_half8 (and the
 * math built-ins) as out-of-line calls, which cost more than the memory traffic; a row kernel
 * whose work-item walks float8 chunks is plain SIMD code there (PoCL vectorises across work-items
 * only in loop-free regions).  fp16 is converted by integer arithmetic, bit-exact with
 * vload_half / vstore_half_rte (NaN stays NaN, quieted; subnormals built as m * 2^-24, so a
 * device that flushes fp32 subnormals still reads fp16 subnormals right). */
#define TSR_G8(p, o) (p)[(o)], (p)[(o) + 1], (p)[(o) + 2], (p)[(o) + 3], (p)[(o) + 4], (p)[(o) + 5], (p)[(o) + 6], (p)[(o) + 7]
#define TSR_S8(p, o, v) do { (p)[(o)] = (v).s0; (p)[(o) + 1] = (v).s1; (p)[(o) + 2] = (v).s2; (p)[(o) + 3] = (v).s3; \
    (p)[(o) + 4] = (v).s4; (p)[(o) + 5] = (v).s5; (p)[(o) + 6] = (v).s6; (p)[(o) + 7] = (v).s7; } while (0)

/* Both work in int8 lanes (the sign bit is masked off first, so signed compares are right and
 * cheaper than unsigned ones on SIMD units without them). */
inline float8 tsr_half8_to_f32(ushort8 h) {
    const int8 u = convert_int8(h);
    const int8 a = (u & 0x7fff) << 13;                                     /* exponent, mantissa */
    /* rebias the exponent 15 -> 127, or 31 -> 255 for inf / NaN (payload kept) */
    int8 r = a + (a >= 0x0f800000 ? (int8)0x70000000 : (int8)0x38000000);
    /* 0 and subnormals: 2^-14 * (1 + m/1024) - 2^-14 = m * 2^-24, exact */
    r = a < 0x00800000 ? as_int8(as_float8(a + 0x38800000) - 0x1p-14f) : r;
    return as_float8(r | ((u & 0x8000) << 16));
}

inline ushort8 tsr_f32_to_half8(float8 f) {
    const int8 u = as_int8(f), a = u & 0x7fffffff;
    /* normal half: round the 13 dropped mantissa bits to nearest even; a carry moves the exponent */
    int8 r = (a - 0x38000000 + 0x0fff + ((a >> 13) & 1)) >> 13;
    /* |f| < 2^-14: 0.5 + |f| puts the half subnormal's unit 2^-24 at the last mantissa bit, and
     * the addition rounds to nearest even */
    r = a < 0x38800000 ? as_int8(as_float8(a) + 0.5f) - 0x3f000000 : r;
    /* >= 65536 (overflow, inf): 0x7c00; NaN: quiet, the top of the payload kept */
    r = a >= 0x47800000 ? (a > 0x7f800000 ? (0x7e00 | ((a >> 13) & 0x3ff)) : (int8)0x7c00) : r;
    return convert_ushort8(as_uint8(r | ((u >> 16) & 0x8000)));
}

/* Scalar twins of the two conversions above, same arithmetic and bit-exactness, for kernels
 * whose work-item handles one element (PoCL vectorises those across work-items; its
 * vload_half / vstore_half_rte are out-of-line calls that keep the loop scalar: an fp16
 * SiLU ran 10x slower through them). */
inline float tsr_half_to_f32(ushort h) {
    const uint u = h, a = (u & 0x7fffu) << 13;
    uint r = a + 0x38000000u;
    r = a >= 0x0f800000u ? (a | 0x7f800000u) : r;
    r = a < 0x00800000u ? as_uint((float)(int)(u & 0x3ffu) * 0x1p-24f) : r;
    return as_float(r | ((u & 0x8000u) << 16));
}

inline ushort tsr_f32_to_half(float f) {
    const uint u = as_uint(f), a = u & 0x7fffffffu;
    uint r = (a - 0x38000000u + 0x0fffu + ((a >> 13) & 1u)) >> 13;
    r = a < 0x38800000u ? as_uint(as_float(a) + 0.5f) - 0x3f000000u : r;
    r = a >= 0x47800000u ? 0x7c00u : r;
    r = a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x3ffu)) : r;
    return (ushort)(r | ((u >> 16) & 0x8000u));
}

inline ushort8 tsr_f32_to_bf16_8(float8 f) {
    const uint8 u = as_uint8(f);
    const uint8 r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return convert_ushort8((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : r);
}

inline float8 tsr_ld8f(__global const float *p, long o) { return (float8)(TSR_G8(p, o)); }

#if TSR_DTYPE == 0
inline float8 tsr_ld8(__global const float *p, long o) { return (float8)(TSR_G8(p, o)); }
inline void tsr_st8(__global float *p, long o, float8 v) { TSR_S8(p, o, v); }
#elif TSR_DTYPE == 1
inline float8 tsr_ld8(__global const half *p, long o) {
    __global const ushort *q = (__global const ushort *)p;
    return tsr_half8_to_f32((ushort8)(TSR_G8(q, o)));
}
inline void tsr_st8(__global half *p, long o, float8 v) {
    __global ushort *q = (__global ushort *)p;
    const ushort8 h = tsr_f32_to_half8(v);
    TSR_S8(q, o, h);
}
#else
inline float8 tsr_ld8(__global const ushort *p, long o) {
    return as_float8(convert_uint8((ushort8)(TSR_G8(p, o))) << 16);
}
inline void tsr_st8(__global ushort *p, long o, float8 v) {
    const ushort8 h = tsr_f32_to_bf16_8(v);
    TSR_S8(p, o, h);
}
#endif

/* ---- streaming (non-temporal) stores: tsr_st8_nt / TSR_NT_FENCE ----
 * An output written once and not read again by the kernel, and larger than the last-level cache,
 * is better stored around the caches: a plain store first reads the line it writes (read for
 * ownership: 3 bytes of traffic per byte copied instead of 2) and evicts the inputs.  OpenCL C
 * has no way to ask for that; clang's __builtin_nontemporal_store does (PoCL compiles with
 * clang: a float8 store becomes vmovntps on x86, and a 64 MiB fp32 copy kernel ran ~1.5x
 * faster with it; a scalar one becomes movntss and stops PoCL's vectoriser: 8-wide chunks only).
 * The launcher sets -DTSR_NT=1 only for outputs of at least cpu.NT_MIN_BYTES (smaller ones stay
 * in cache for their consumer, as on the cpu backend).
 * A vector non-temporal store needs its natural alignment (x86 faults otherwise), so
 * tsr_st8_nt streams only 8-element chunks whose address is a multiple of the chunk size and
 * stores the others plainly: rows whose length is not a multiple of 8 lose the speed-up, never
 * correctness.  Values are those of tsr_st8, bit for bit.  Streaming stores are weakly ordered:
 * a kernel that issued them ends with TSR_NT_FENCE() (sfence on x86), so the results are visible
 * to whoever sees the kernel complete.  Other compilers, or -DTSR_NT=0: plain stores.
 * fp32 storage only: bf16 / fp16 row kernels are bound by their conversions under PoCL, and
 * streaming their 16-byte chunks measured 0-10% slower there (fp32 rows: 1.2-1.4x faster). */
#ifndef TSR_NT
#define TSR_NT 0
#endif
#define TSR_HAVE_NT 0
#if TSR_NT && TSR_DTYPE == 0 && defined(__clang__) && defined(__has_builtin)
#if __has_builtin(__builtin_nontemporal_store)
#undef TSR_HAVE_NT
#define TSR_HAVE_NT 1
#endif
#endif

#if TSR_HAVE_NT
#define TSR_STORE_NT(v, p) __builtin_nontemporal_store((v), (p))
#else
#define TSR_STORE_NT(v, p) (*(p) = (v))
#endif

#if TSR_HAVE_NT && (defined(__x86_64__) || defined(__i386__))
#if __has_builtin(__builtin_ia32_sfence)  /* TSR_HAVE_NT: __has_builtin exists */
#define TSR_NT_FENCE() __builtin_ia32_sfence()
#endif
#endif
#ifndef TSR_NT_FENCE
#if TSR_HAVE_NT
#define TSR_NT_FENCE() mem_fence(CLK_GLOBAL_MEM_FENCE)
#else
#define TSR_NT_FENCE() ((void)0)
#endif
#endif

/* v (an 8-vector of type VT) to p[o .. o+7]: streamed when p + o is VT-aligned, else TSR_S8 */
#define TSR_ST8_NT(p, o, VT, v) do {                                                           \
    if (TSR_HAVE_NT && ((ulong)((p) + (o)) & (sizeof(VT) - 1)) == 0)                           \
        TSR_STORE_NT((v), (__global VT *)((p) + (o)));                                         \
    else                                                                                        \
        TSR_S8(p, o, v);                                                                        \
} while (0)

#if TSR_DTYPE == 0
inline void tsr_st8_nt(__global float *p, long o, float8 v) { TSR_ST8_NT(p, o, float8, v); }
#else
#define tsr_st8_nt tsr_st8  /* 16-bit storage: plain stores (see above) */
#endif

/* sum of a float8's lanes in a fixed order */
inline float tsr_hsum8(float8 v) {
    const float4 a = v.lo + v.hi;
    return (a.x + a.z) + (a.y + a.w);
}

#endif
