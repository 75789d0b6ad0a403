/* int8 matmuls for GPU devices (OpenCL C 1.2): int_mm, linear_w8a8, linear_a16w8 (formulas and
 * build options: qlinear_int8.h; the activations are quantised by qlinear_int8.cl's
 * qi8_quant_rows).  Extra build option W: the GEMM's W x W work-group.
 *
 * qi8_mm          GEMM: a (4W x 4W) output tile per W x W work-group, each work-item a 4 x 4
 *                 block (rows ty + W*r, columns tx + W*c, so neighbouring work-items write
 *                 neighbouring outputs); K in steps of TK through local-memory tiles of a and w
 *                 (zero padded past M, N, K).  16-bit a: each K step's products (<= 2^22 each,
 *                 TK of them) sum in int32, then into int64.
 * qi8_gemv        small M (decode, weight-read bound): a work-group of L work-items takes NR
 *                 weight rows; work-item lid reads 8-element chunks lid, lid + L, ... of each row
 *                 (vload8: neighbouring work-items on neighbouring bytes), multiplies them with
 *                 the same chunk of every x row (the NR rows stay in cache across the M rows) and
 *                 the L partial sums reduce through local memory.  16-bit a: the int32 lanes are
 *                 flushed into int64 every 16 chunks (<= 2^26 a lane, <= 2^29 their sum).
 * QI8_INT_DOT (qlinear_int8.h, 8-bit a): qi8_mm's tiles hold char4 runs of 4 k and each work-item
 *                 takes one tsr_dot4 per 4 k; qi8_gemv one per half chunk.  Same integers.
 * opencl.py runs these on GPU devices (and on any device when a test asks): they give the same
 * integers as qlinear_int8.cl's dot kernels (tests/test_qlinear_int8.py).
 */
#pragma OPENCL FP_CONTRACT OFF
#include "qlinear_int8.h"

#ifndef W
#define W 16
#endif
#if ABITS == 8
#define FLUSH 16384L  /* never: K <= 131071 is <= 16383 chunks, and the 8 lanes hold a K-term sum < 2^31 */
#else
#define FLUSH 16L     /* |lane| <= 16 * 2^22 = 2^26, |8-lane sum| <= 2^29 */
#endif
#define TM (4 * W)
#define TN (4 * W)
#define TK 16
#define NR 4

/* ------------------------------------------------------------------ GEMM */
__kernel __attribute__((reqd_work_group_size(W, W, 1)))
void qi8_mm(__global const A_T *a, long lda, __global const char *w, long M, long N, long K,
            __global const float *sx, __global const float *sw, __global const float *bias, int has_bias,
            int act, __global Y_T *y) {
    const int tx = get_local_id(0), ty = get_local_id(1), tid = ty * W + tx;
    const long n0 = (long)get_group_id(0) * TN, m0 = (long)get_group_id(1) * TM;
    ACC_T acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = 0;
#if QI8_INT_DOT
    /* tiles of char4 (4 consecutive k of one row, zero padded): one dot product per 4 k */
    __local char4 As4[TK / 4][TM];
    __local char4 Ws4[TK / 4][TN];
    for (long k0 = 0; k0 < K; k0 += TK) {
        for (int t = 0; t < TM * (TK / 4) / (W * W); t++) {
            const int e = tid + t * W * W, r = e / (TK / 4), kq = e % (TK / 4);
            const long k = k0 + 4 * kq, m = m0 + r, n = n0 + r;
            char4 av = (char4)(0), wv = (char4)(0);
            if (m < M) {
                __global const A_T *p = a + m * lda + k;
                av = (char4)((char)(k < K ? p[0] : 0), (char)(k + 1 < K ? p[1] : 0), (char)(k + 2 < K ? p[2] : 0),
                           (char)(k + 3 < K ? p[3] : 0));
            }
            if (n < N) {
                __global const char *p = w + n * K + k;
                wv = (char4)((char)(k < K ? p[0] : 0), (char)(k + 1 < K ? p[1] : 0), (char)(k + 2 < K ? p[2] : 0),
                           (char)(k + 3 < K ? p[3] : 0));
            }
            As4[kq][r] = av;
            Ws4[kq][r] = wv;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kq = 0; kq < TK / 4; kq++) {
            char4 av[4], wv[4];
            for (int r = 0; r < 4; r++) av[r] = As4[kq][ty + W * r];
            for (int c = 0; c < 4; c++) wv[c] = Ws4[kq][tx + W * c];
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < 4; c++) acc[r][c] += tsr_dot4(av[r], wv[c]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#else
    __local int As[TK][TM];
    __local int Ws[TK][TN];
    for (long k0 = 0; k0 < K; k0 += TK) {
        /* tiles: element e = tid + t * W*W is (row e / TK, k e % TK): TK neighbours read one row's K run */
        for (int t = 0; t < TM * TK / (W * W); t++) {
            const int e = tid + t * W * W, r = e / TK, kk = e % TK;
            const long k = k0 + kk, m = m0 + r, n = n0 + r;
            As[kk][r] = (m < M && k < K) ? (int)a[m * lda + k] : 0;
            Ws[kk][r] = (n < N && k < K) ? (int)w[n * K + k] : 0;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#if ABITS == 8
        for (int kk = 0; kk < TK; kk++) {
            int av[4], wv[4];
            for (int r = 0; r < 4; r++) av[r] = As[kk][ty + W * r];
            for (int c = 0; c < 4; c++) wv[c] = Ws[kk][tx + W * c];
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < 4; c++) acc[r][c] += av[r] * wv[c];
        }
#else
        int part[4][4];
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 4; c++) part[r][c] = 0;
        for (int kk = 0; kk < TK; kk++) {
            int av[4], wv[4];
            for (int r = 0; r < 4; r++) av[r] = As[kk][ty + W * r];
            for (int c = 0; c < 4; c++) wv[c] = Ws[kk][tx + W * c];
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < 4; c++) part[r][c] += av[r] * wv[c];
        }
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 4; c++) acc[r][c] += part[r][c];
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#endif
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) {
            const long m = m0 + ty + W * r, n = n0 + tx + W * c;
            if (m < M && n < N) put(y, m, n, N, acc[r][c], sx, sw, bias, has_bias, act);
        }
}

/* ------------------------------------------------------------------ GEMV (small M) */
inline int hsum8(int8 v) {
    const int4 b = v.lo + v.hi;
    const int2 c = b.lo + b.hi;
    return c.x + c.y;
}

__kernel void qi8_gemv(__global const A_T *a, long lda, __global const char *w, long M, long N, long K,
                       __global const float *sx, __global const float *sw, __global const float *bias, int has_bias,
                       int act, __global Y_T *y, __local ACC_T *part) {
    const int lid = get_local_id(0), L = get_local_size(0);
    const long n0 = (long)get_group_id(0) * NR;
    const long K8 = K / 8;
    __global const char *wr[NR];
    for (int r = 0; r < NR; r++) wr[r] = w + min(n0 + r, N - 1) * K;   /* rows past N repeat N-1 (not stored) */
    for (long m = 0; m < M; m++) {
        __global const A_T *am = a + m * lda;
        ACC_T s[NR];
        for (int r = 0; r < NR; r++) s[r] = 0;
        for (long c0 = lid; c0 < K8; c0 += FLUSH * L) {   /* int32 lanes into ACC_T every FLUSH chunks */
            int8 v[NR];
            for (int r = 0; r < NR; r++) v[r] = (int8)(0);
            for (long c = c0; c < min(K8, c0 + FLUSH * L); c += L) {
#if QI8_INT_DOT   /* two char4 dot products per chunk, summed into lane 0 (hsum8 adds the zeros) */
                const char8 x = vload8(c, am);
                for (int r = 0; r < NR; r++) {
                    const char8 wc = vload8(c, wr[r]);
                    v[r].s0 += tsr_dot4(x.lo, wc.lo) + tsr_dot4(x.hi, wc.hi);
                }
#else
                const int8 x = convert_int8(vload8(c, am));
                for (int r = 0; r < NR; r++) v[r] += x * convert_int8(vload8(c, wr[r]));
#endif
            }
            for (int r = 0; r < NR; r++) s[r] += hsum8(v[r]);
        }
        for (long k = K8 * 8 + lid; k < K; k += L)   /* the K % 8 tail */
            for (int r = 0; r < NR; r++) s[r] += (ACC_T)((int)am[k] * (int)wr[r][k]);
        for (int r = 0; r < NR; r++) part[r * L + lid] = s[r];
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < NR && n0 + lid < N) {
            ACC_T t = 0;
            for (int l = 0; l < L; l++) t += part[lid * L + l];
            put(y, m, n0 + lid, N, t, sx, sw, bias, has_bias, act);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
