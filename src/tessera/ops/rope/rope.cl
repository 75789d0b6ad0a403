/* Rotary position embedding for the opencl backend (OpenCL C 1.2), forward and backward.
 *
 * For token t = (b, s) with position p = pos[b, s] (or s), angle row c = cos[p], sn = sign * sin[p]
 * (r/2 entries; sign = -1 for the backward: the transpose of a rotation), every head row x of the
 * tensor becomes
 *   half-split:  o[i] = x[i] c_i - x[i+h] sn_i,   o[i+h] = x[i+h] c_i + x[i] sn_i   (h = r/2)
 *   interleaved: o[2i] = x[2i] c_i - x[2i+1] sn_i, o[2i+1] = x[2i+1] c_i + x[2i] sn_i
 * and features r..D are copied unchanged (as bits: exact, NaN payloads included).
 *
 * Numerics (as rope.c): fp32 math, one rounding to the storage dtype.  fp32 outputs evaluate
 * each a*c + b*s' as fma(a, c, q) + e with q = b*s' and e = fma(b, s', -q) its exact rounding
 * error (an error-free transformation): ~1 ulp of |out| even when the two terms cancel, where
 * the plain formula errs by eps * |x|.  fma is exact in OpenCL C on every device (in hardware or
 * not).  e is NaN only when q is +-inf (an inf input); it is then dropped, so inf inputs give the
 * plain formula's inf/NaN.  fp16/bf16 outputs use the plain fp32 formula (its error is far below
 * their own rounding).
 *
 * Work layout: a work-group walks tokens; its work-items split the token's (head, chunk) units,
 * a chunk being 8 pairs (half-split: x1 and x2 as two float8) or 4 pairs (interleaved: one
 * float8 of x, .even/.odd); a partial last chunk goes pair by pair.  On a CPU runtime the
 * launcher picks one work-item per group (its chunk loop is float8 SIMD code), on a GPU enough
 * to cover the units.  Any head/token strides (in elements), unit feature stride; the output is
 * contiguous (B, S, H, D).  Offsets are int64.
 *
 * Position ids outside [0, P) (the host checks them first) are never used to read the tables:
 * such a token sets *err = 1 and is skipped, and the launcher raises.
 *
 * Build options: TSR_DTYPE (q/k storage), ROPE_CS_F32 (1: cos/sin are fp32, 0: q's dtype),
 * ROPE_POS (0: no ids, 1: int32 ids, 2: int64 ids), ROPE_F64 (fp32 rotation in float64 lanes).
 */
#include "tessera_cl.h"

/* angle-table access: cs_ld (one entry), cs_ld4 / cs_ld8 (4 / 8 consecutive entries) */
#if ROPE_CS_F32 || TSR_DTYPE == 0
#define CS_T float
#define cs_ld(p, i) ((p)[(i)])
#define cs_ld8(p, i) tsr_ld8f((p), (i))
#define cs_ld4(p, i) ((float4)((p)[(i)], (p)[(i) + 1], (p)[(i) + 2], (p)[(i) + 3]))
#else
#define CS_T TSR_T
#define cs_ld(p, i) tsr_ld((p), (i))
#define cs_ld8(p, i) tsr_ld8((p), (i))
inline float4 cs_ld4(__global const TSR_T *p, long i) {
    __global const ushort *q = (__global const ushort *)p;
    const ushort4 u = (ushort4)(q[i], q[i + 1], q[i + 2], q[i + 3]);
#if TSR_DTYPE == 1
    return tsr_half8_to_f32((ushort8)(u, u)).lo;
#else
    return as_float4(convert_uint4(u) << 16);
#endif
}
#endif

#if ROPE_POS == 1
#define POS_T int
#else
#define POS_T long
#endif

#if TSR_DTYPE == 0
#define BITS_T uint
#define BITS8_T uint8
#else
#define BITS_T ushort
#define BITS8_T ushort8
#endif

/* a*c + b*s: compensated for fp32 outputs (see the header), plain otherwise.  ROPE_F64 (the
 * launcher's choice on a CPU device with cl_khr_fp64, outside TESSERA_OPENCL_PORTABLE): the same
 * value from float64 lanes instead -- the products are exact in float64 and the sum is rounded
 * twice (float64, then float32), within ~0.5 ulp of |out|; PoCL compiles fma() as an out-of-line
 * call, float64 arithmetic inline. */
#if TSR_DTYPE == 0 && ROPE_F64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
inline float rot1(float a, float c, float b, float s) { return (float)((double)a * c + (double)b * s); }
inline float4 rot4(float4 a, float4 c, float4 b, float4 s) {
    return convert_float4(convert_double4(a) * convert_double4(c) + convert_double4(b) * convert_double4(s));
}
inline float8 rot8(float8 a, float8 c, float8 b, float8 s) {  /* halves: LLVM 14 cannot select 8-lane f64->f32 */
    return (float8)(rot4(a.lo, c.lo, b.lo, s.lo), rot4(a.hi, c.hi, b.hi, s.hi));
}
#elif TSR_DTYPE == 0
inline float rot1(float a, float c, float b, float s) {
    const float q = b * s, e = fma(b, s, -q);
    return fma(a, c, q) + (e == e ? e : 0.0f);
}
inline float4 rot4(float4 a, float4 c, float4 b, float4 s) {
    const float4 q = b * s, e = fma(b, s, -q);
    return fma(a, c, q) + (e == e ? e : (float4)0.0f);
}
inline float8 rot8(float8 a, float8 c, float8 b, float8 s) {
    const float8 q = b * s, e = fma(b, s, -q);
    return fma(a, c, q) + (e == e ? e : (float8)0.0f);
}
#else
inline float rot1(float a, float c, float b, float s) { return a * c + b * s; }
inline float4 rot4(float4 a, float4 c, float4 b, float4 s) { return a * c + b * s; }
inline float8 rot8(float8 a, float8 c, float8 b, float8 s) { return a * c + b * s; }
#endif

__kernel void rope_run(__global const TSR_T *x, long sb, long ss, long sh, __global TSR_T *o,
                       __global const CS_T *cosp, __global const CS_T *sinp, long scs, long sss,
                       __global const POS_T *pos, long spb, long sps, long S, long T, long H, long D,
                       long R, long P, int interleaved, float sign, __global int *err) {
    const long h = R / 2;
    const long cw = interleaved ? 4 : 8;                 /* pairs per chunk */
    const long nck = (h + cw - 1) / cw;                  /* chunks per head row */
    const long npass = (D - R + 7) / 8;                  /* pass-through chunks per head row */
    const long lid = get_local_id(0), L = get_local_size(0);
    /* work-item lid takes units u = lid, lid + L, ... of (head, chunk) pairs; (hh, c) advance by
     * (L / nck, L % nck) with a carry, not by a division per unit (a 64-bit divide costs ~40
     * cycles, as much as the unit's arithmetic) */
    const long dh = L / nck, dc = L % nck, ph = npass ? L / npass : 0, pc = npass ? L % npass : 0;
    for (long t = get_group_id(0); t < T; t += get_num_groups(0)) {
        const long b = t / S, si = t % S;
#if ROPE_POS
        const long p = pos[b * spb + si * sps];
#else
        const long p = si;
#endif
        if (p < 0 || p >= P) {
            if (lid == 0) err[0] = 1;
            continue;
        }
        __global const CS_T *cr = cosp + p * scs, *sr = sinp + p * sss;
        __global const TSR_T *xt = x + b * sb + si * ss;
        __global TSR_T *ot = o + t * H * D;
        for (long hh = lid / nck, c = lid % nck; hh < H; hh += dh, c += dc) {
            if (c >= nck) {
                c -= nck;
                hh++;
                if (hh >= H) break;
            }
            const long i0 = c * cw;
            __global const TSR_T *xr = xt + hh * sh;
            __global TSR_T *orow = ot + hh * D;
            if (i0 + cw <= h && !interleaved) {
                const float8 x1 = tsr_ld8(xr, i0), x2 = tsr_ld8(xr, h + i0);
                const float8 c = cs_ld8(cr, i0), s = sign * cs_ld8(sr, i0);
                tsr_st8_nt(orow, i0, rot8(x1, c, x2, -s));
                tsr_st8_nt(orow, h + i0, rot8(x2, c, x1, s));
            } else if (i0 + cw <= h) {
                const float8 v = tsr_ld8(xr, 2 * i0);
                const float4 a = v.even, bb = v.odd, c = cs_ld4(cr, i0), s = sign * cs_ld4(sr, i0);
                const float4 e = rot4(a, c, bb, -s), f = rot4(bb, c, a, s);
                tsr_st8_nt(orow, 2 * i0, (float8)(e.x, f.x, e.y, f.y, e.z, f.z, e.w, f.w));
            } else {
                /* the partial last chunk of a head row, pair by pair */
                for (long i = i0; i < min(i0 + cw, h); i++) {
                    const float c = cs_ld(cr, i), s = sign * cs_ld(sr, i);
                    const long j1 = interleaved ? 2 * i : i, j2 = interleaved ? 2 * i + 1 : i + h;
                    const float a = tsr_ld(xr, j1), bb = tsr_ld(xr, j2);
                    tsr_st(orow, j1, rot1(a, c, bb, -s));
                    tsr_st(orow, j2, rot1(bb, c, a, s));
                }
            }
        }
        /* features R..D: copied as bits */
        for (long hh = npass ? lid / npass : H, c = npass ? lid % npass : 0; hh < H; hh += ph, c += pc) {
            if (c >= npass) {
                c -= npass;
                hh++;
                if (hh >= H) break;
            }
            const long j = R + c * 8;
            __global const BITS_T *xb = (__global const BITS_T *)(xt + hh * sh);
            __global BITS_T *ob = (__global BITS_T *)(ot + hh * D);
            if (j + 8 <= D) {
                const BITS8_T v = (BITS8_T)(TSR_G8(xb, j));
                TSR_ST8_NT(ob, j, BITS8_T, v);
            } else {
                for (long k = j; k < D; k++) ob[k] = xb[k];
            }
        }
    }
    TSR_NT_FENCE();  /* streamed stores of the output (tessera_cl.h) */
}
