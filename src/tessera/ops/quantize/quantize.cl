/* quantize_blocks for the opencl backend (OpenCL C 1.2): codes, scales (and zero points) of
 * x [M, K] over scale blocks of br rows x bc columns, bit-identical to ref.py / quantize.c.
 *
 * Build options: TSR_DTYPE (x's storage type) and QKIND, the code kind (cpu.py's KIND):
 *   0 int8, 1 int16, 2 int4, 3 int4_zp, 4 q4_0, 5 fp8 e4m3fn, 6 fp8 e5m2, 7 fp8 e4m3fnuz.
 * Rules (tessera_quant_cl.h: correctly rounded divisions, NaN -> 0, saturate, RNE):
 *   symmetric  : amax over the block (NaN as 0), scale = max(amax, 1e-12) / QMAX,
 *                code = sat(rint(x / scale)) (+8, offset binary, for int4 / q4_0) or the fp8 code
 *   int4_zp    : lo, hi = min(x, 0), max(x, 0); scale = max(hi - lo, 1e-12) / 15,
 *                zero = sat(rint(-lo / scale), 0, 15), code = sat(rint(x / scale), -zero, 15 - zero) + zero
 *   q4_0       : m = the first (lowest k) entry of largest |x|, scale = copysign(max(|m|, 1e-12), m) / -8
 * 4-bit codes are packed two per byte along K (byte j = code[2j] | code[2j+1] << 4).
 *
 * Kernels (one work-group per row):
 *   quant_rows   block_rows == 1: statistics, scale (and zero) and codes of each block of row i,
 *                in one pass over a cache-resident row
 *   quant_stats  other blocks, pass 1: per (row, column block) statistics into a workspace
 *   quant_merge  one work-item per scale block: the statistics of its rows merged in row order
 *   quant_codes  pass 2: codes of a row with the scales of its block row
 * Blocks of <= 1024 columns (`seq`): one work-item per block, statistics and codes in sequential
 * loops over its columns (no barriers).  Larger blocks: the work-group takes one block at a
 * time, work-item `lid` columns lid, lid + L, ... (neighbouring work-items on neighbouring
 * elements), the statistic through local memory.  Statistics reduce integer order keys of the
 * values (exact: max / min and the first-index rule do not depend on the order), so both give
 * the same bits.  4-bit codes over odd blocks (a byte's two codes in two blocks) take a third,
 * per-byte path in quant_codes.
 * PoCL note (measured on this CPU): a loop vectorises when its scale is loop-invariant and its
 * accesses affine; a flat loop over the row that looks each element's block scale up (j / bc or
 * j >> lg), or a float compare-and-select reduction, ran 5-10x slower -- hence these shapes.  On
 * a GPU the per-block loops read with a stride of one block between work-items (uncoalesced);
 * a subgroup-reduction variant would suit GPUs better (PoCL has no subgroups to test it on).
 */
#pragma OPENCL FP_CONTRACT OFF
#include "tessera_cl.h"
#include "tessera_quant_cl.h"

#ifndef QKIND
#define QKIND 0
#endif
#define QK_I8 0
#define QK_I16 1
#define QK_I4 2
#define QK_I4ZP 3
#define QK_Q40 4
#define QK_E4M3 5
#define QK_E5M2 6
#define QK_FNUZ 7

#define PACKED (QKIND == QK_I4 || QKIND == QK_I4ZP || QKIND == QK_Q40)
#if QKIND == QK_I16
#define CODE_T short
#elif QKIND == QK_I8
#define CODE_T char
#else
#define CODE_T uchar
#endif
#if QKIND == QK_I8
#define QMAX 127.0f
#elif QKIND == QK_I16
#define QMAX 32767.0f
#elif QKIND == QK_E4M3
#define QMAX 448.0f
#elif QKIND == QK_E5M2
#define QMAX 57344.0f
#elif QKIND == QK_FNUZ
#define QMAX 240.0f
#else
#define QMAX 7.0f
#endif

/* Order keys (exact): abs_key(v) orders nan0(|v|) (tessera_quant_cl.h); the int order of
 * val_key(v) is the order of nan0(v) (-0 as +0).  Integer max / min reductions vectorise where
 * float compare-and-select ones do not (PoCL), and give the same values. */
#define abs_key tsr_q_abs_key
inline int val_key(float v) {
    int i = as_int(v);
    i = ((i & 0x7fffffff) > 0x7f800000 || i == (int)0x80000000) ? 0 : i;
    return i < 0 ? i ^ 0x7fffffff : i;
}
inline float key_val(int k) { return as_float(k < 0 ? k ^ 0x7fffffff : k); }

/* Block statistic (.x, .y): (amax, 0) | int4_zp (lo, hi) | q4_0 (amax, first x of that |x|). */

/* one work-item, x[j0 .. j0+n) in order (small blocks: one work-item per block) */
inline float2 stat_seq(__global const TSR_T *xr, long j0, long n) {
#if QKIND == QK_I4ZP
    int lo = 0, hi = 0;
    for (long j = j0; j < j0 + n; j++) {
        const int k = val_key(tsr_ld(xr, j));
        lo = k < lo ? k : lo;
        hi = k > hi ? k : hi;
    }
    return (float2)(key_val(lo), key_val(hi));
#else
    uint am = 0;
    for (long j = j0; j < j0 + n; j++) {
        const uint k = abs_key(tsr_ld(xr, j));
        am = k > am ? k : am;
    }
    float m = 0.0f;
#if QKIND == QK_Q40
    if (am)   /* the first entry of the largest magnitude */
        for (long j = j0; j < j0 + n; j++)
            if (abs_key(tsr_ld(xr, j)) == am) {
                m = tsr_ld(xr, j);
                break;
            }
#endif
    return (float2)(as_float(am), m);
#endif
}

/* work-item lid's contiguous chunk [*c0, *c1) of n columns (a multiple of 16, so that 4-bit code
 * pairs stay whole and the per-chunk loops vectorise) */
inline void chunk(long n, long *c0, long *c1) {
    const long C = ((n + get_local_size(0) - 1) / get_local_size(0) + 15) & ~15L;
    *c0 = min(n, (long)get_local_id(0) * C);
    *c1 = min(n, *c0 + C);
}

/* the whole work-group, x[j0 .. j0+n) (large blocks); every work-item gets the result */
inline float2 stat_wg(__global const TSR_T *xr, long j0, long n, __local float *scratch) {
    long c0, c1;
    chunk(n, &c0, &c1);
#if QKIND == QK_I4ZP
    int lo = 0, hi = 0;
    for (long j = c0; j < c1; j++) {
        const int k = val_key(tsr_ld(xr, j0 + j));
        lo = k < lo ? k : lo;
        hi = k > hi ? k : hi;
    }
    const float h = tsr_wg_max(key_val(hi), scratch);
    const float l = -tsr_wg_max(-key_val(lo), scratch);
    return (float2)(l, h);
#else
    uint am = 0;
    for (long j = c0; j < c1; j++) {
        const uint k = abs_key(tsr_ld(xr, j0 + j));
        am = k > am ? k : am;
    }
    const float a = tsr_wg_max(as_float(am), scratch);
    float m = 0.0f;
#if QKIND == QK_Q40
    if (a > 0.0f) {   /* uniform over the work-group: the barriers below are reached by all */
        int first = (int)n;
        for (long j = c0; j < c1; j++)
            if (abs_key(tsr_ld(xr, j0 + j)) == as_uint(a)) {
                first = (int)j;
                break;
            }
        first = tsr_wg_min_int(first, (__local int *)scratch);
        m = tsr_ld(xr, j0 + first);
    }
#endif
    return (float2)(a, m);
#endif
}

/* statistics of a followed (in row order) by b */
inline float2 stat_merge(float2 a, float2 b) {
#if QKIND == QK_I4ZP
    return (float2)(b.x < a.x ? b.x : a.x, b.y > a.y ? b.y : a.y);
#elif QKIND == QK_Q40
    return b.x > a.x ? b : a;
#else
    return (float2)(b.x > a.x ? b.x : a.x, 0.0f);
#endif
}

inline float block_scale(float2 st, uchar *zero) {
#if QKIND == QK_I4ZP
    const float d = st.y - st.x;
    const float sc = tsr_div_rn(d > TSR_QEPS ? d : TSR_QEPS, 15.0f);
    *zero = (uchar)tsr_q_int(tsr_div_rn(-st.x, sc), 0.0f, 15.0f);
    return sc;
#elif QKIND == QK_Q40
    *zero = 0;
    const float ma = st.x > TSR_QEPS ? st.x : TSR_QEPS;
    return tsr_div_rn(st.y < 0.0f ? -ma : ma, -8.0f);
#else
    *zero = 0;
    return tsr_q_scale(st.x, QMAX);
#endif
}

/* the code of x with scale s and zero point z */
inline int code_of(float x, float s, int z) {
    const float q = tsr_div_rn(x, s);
#if QKIND == QK_I8
    return tsr_q_int(q, -127.0f, 127.0f);
#elif QKIND == QK_I16
    return tsr_q_int(q, -32767.0f, 32767.0f);
#elif QKIND == QK_I4ZP
    return tsr_q_int(q, (float)-z, (float)(15 - z)) + z;
#elif PACKED
    return tsr_q_int(q, -8.0f, 7.0f) + 8;
#elif QKIND == QK_E4M3
    return (int)tsr_q_e4m3(q);
#elif QKIND == QK_E5M2
    return (int)tsr_q_e5m2(q);
#else
    return (int)tsr_q_e4m3fnuz(q);
#endif
}

inline long codes_per_row(long K) { return PACKED ? K / 2 : K; }

/* codes of columns [j0, j0 + n) with one scale s and zero z (j0, n even for 4-bit codes) */
inline void block_codes_seq(__global const TSR_T *xr, long j0, long n, float s, int z, __global CODE_T *out) {
#if PACKED
    for (long p = j0 / 2; p < (j0 + n) / 2; p++)
        out[p] = (uchar)(code_of(tsr_ld(xr, 2 * p), s, z) | (code_of(tsr_ld(xr, 2 * p + 1), s, z) << 4));
#else
    for (long j = j0; j < j0 + n; j++) out[j] = (CODE_T)code_of(tsr_ld(xr, j), s, z);
#endif
}

inline void block_codes_wg(__global const TSR_T *xr, long j0, long n, float s, int z, __global CODE_T *out) {
    long c0, c1;
    chunk(n, &c0, &c1);
    block_codes_seq(xr, j0 + c0, c1 - c0, s, z, out);
}

#define ZERO(zr, kb) (QKIND == QK_I4ZP ? (int)(zr)[kb] : 0)

/* block_rows == 1: statistics, scale (and zero) and codes of every block of row i */
__kernel void quant_rows(__global const TSR_T *x, long ldx, long K, long bc, long Kb, int seq,
                         __global CODE_T *codes, __global float *scale, __global uchar *zero,
                         __local float *scratch) {
    const long i = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    __global const TSR_T *xr = x + i * ldx;
    __global float *sc = scale + i * Kb;
    __global uchar *zr = zero + i * Kb;
    __global CODE_T *out = codes + i * codes_per_row(K);
    uchar z;
    if (seq) {
        for (long kb = lid; kb < Kb; kb += L) {
            const long j0 = kb * bc, n = min(bc, K - j0);
            const float s = block_scale(stat_seq(xr, j0, n), &z);
            sc[kb] = s;
            if (QKIND == QK_I4ZP) zr[kb] = z;
            block_codes_seq(xr, j0, n, s, z, out);
        }
    } else {
        for (long kb = 0; kb < Kb; kb++) {
            const long j0 = kb * bc, n = min(bc, K - j0);
            const float s = block_scale(stat_wg(xr, j0, n, scratch), &z);
            if (lid == 0) {
                sc[kb] = s;
                if (QKIND == QK_I4ZP) zr[kb] = z;
            }
            block_codes_wg(xr, j0, n, s, z, out);
        }
    }
}

/* pass 1 of multi-row blocks: st[(i * Kb + kb) * 2 + {0, 1}] = statistic of row i, block kb */
__kernel void quant_stats(__global const TSR_T *x, long ldx, long K, long bc, long Kb, int seq,
                          __global float *st, __local float *scratch) {
    const long i = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    __global const TSR_T *xr = x + i * ldx;
    __global float *sr = st + i * Kb * 2;
    if (seq) {
        for (long kb = lid; kb < Kb; kb += L) {
            const float2 s = stat_seq(xr, kb * bc, min(bc, K - kb * bc));
            sr[2 * kb] = s.x;
            sr[2 * kb + 1] = s.y;
        }
    } else {
        for (long kb = 0; kb < Kb; kb++) {
            const float2 s = stat_wg(xr, kb * bc, min(bc, K - kb * bc), scratch);
            if (lid == 0) {
                sr[2 * kb] = s.x;
                sr[2 * kb + 1] = s.y;
            }
        }
    }
}

/* one work-item per scale block (bi, kb): merge the statistics of rows [bi*br, bi*br + br) in
 * row order, then the scale (and zero).  A block with no rows (per-tensor scale of an empty x)
 * has the statistic 0: scale = 1e-12 / QMAX. */
__kernel void quant_merge(__global const float *st, long M, long br, long Mb, long Kb,
                          __global float *scale, __global uchar *zero) {
    const long t = get_global_id(0);
    if (t >= Mb * Kb) return;
    const long bi = t / Kb, kb = t % Kb;
    float2 s = (float2)(0.0f, 0.0f);
    for (long r = bi * br; r < min(M, bi * br + br); r++)
        s = stat_merge(s, (float2)(st[(r * Kb + kb) * 2], st[(r * Kb + kb) * 2 + 1]));
    uchar z;
    scale[t] = block_scale(s, &z);
    if (QKIND == QK_I4ZP) zero[t] = z;
}

/* pass 2: codes of row i with the scales of block row i / br.  mode 0: one work-item per block,
 * 1: the work-group per block, 2: per byte (4-bit codes over odd blocks: each nibble's block) */
__kernel void quant_codes(__global const TSR_T *x, long ldx, long K, long bc, long Kb, long br, int mode,
                          __global CODE_T *codes, __global const float *scale, __global const uchar *zero) {
    const long i = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    __global const TSR_T *xr = x + i * ldx;
    __global const float *sc = scale + (i / br) * Kb;
    __global const uchar *zr = zero + (i / br) * Kb;
    __global CODE_T *out = codes + i * codes_per_row(K);
    if (mode == 0) {
        for (long kb = lid; kb < Kb; kb += L)
            block_codes_seq(xr, kb * bc, min(bc, K - kb * bc), sc[kb], ZERO(zr, kb), out);
    } else if (mode == 1) {
        for (long kb = 0; kb < Kb; kb++)
            block_codes_wg(xr, kb * bc, min(bc, K - kb * bc), sc[kb], ZERO(zr, kb), out);
    } else {
#if PACKED
        for (long p = lid; p < K / 2; p += L) {
            const long k0 = (2 * p) / bc, k1 = (2 * p + 1) / bc;
            out[p] = (uchar)(code_of(tsr_ld(xr, 2 * p), sc[k0], ZERO(zr, k0)) |
                             (code_of(tsr_ld(xr, 2 * p + 1), sc[k1], ZERO(zr, k1)) << 4));
        }
#endif
    }
}
