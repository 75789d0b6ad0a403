/* conv2d native CPU kernels (framework-free C11; launcher: cpu.py).
 *
 * Every kernel works on fp32 NHWC buffers made by tsr_conv2d_pack (which widens
 * fp32/fp16/bf16 inputs of any strides, zero-pads, and for the input gradient also
 * zero-inserts between rows/columns for strides), so the hot loops have no bounds or
 * dtype branches; the depthwise forward also reads a bf16 / fp16 NHWC x in place (its
 * loops are instantiated per x dtype, and it pads virtually):
 *
 *   tsr_conv2d_fwd     dense / grouped conv as an implicit GEMM: a tile of P output
 *                      pixels x 16*NV output channels is held in registers and
 *                      accumulated over (kh, kw, c_in) with one weight vector load
 *                      shared by P broadcasts (weights packed [g][kh][kw][c_in][c_out pad 16]).
 *   tsr_conv2d_fwd_dw  depthwise (one input and one output channel per group): direct,
 *                      vectorised along the channels of an NHWC row (weights [kh][kw][C]).
 *   tsr_conv2d_wgrad / tsr_conv2d_wgrad_dw / tsr_conv2d_bgrad   dweight, dbias.
 *
 * The forward epilogue adds the bias, applies the activation on the fp32 sum and rounds
 * once to the output dtype (any output strides: NCHW or channels-last).  The input
 * gradient is tsr_conv2d_fwd/_fwd_dw run on the packed dz with flipped, transposed
 * weights (see __init__.py).  All accumulation is fp32; offsets are int64.
 */
#include "tessera_cpu.h"

typedef float cv16 __attribute__((vector_size(64)));
typedef float cv16u __attribute__((vector_size(64), aligned(4)));  /* unaligned load/store */
typedef int32_t cv16i __attribute__((vector_size(64)));

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_RELU6 = 2, ACT_SILU = 3, ACT_GELU = 4 };

#if defined(__AVX512F__)
#define TILE_P 12  /* 12 pixels x 2 zmm = 24 of the 32 registers */
#elif defined(__AVX2__)
#define TILE_P 3   /* a cv16 is 2 ymm: 3 x 2 x 2 = 12 accumulators */
#else
#define TILE_P 2
#endif

static inline float act_f(float z, int act) {
    switch (act) {
    case ACT_RELU: return z > 0.f ? z : 0.f;
    case ACT_RELU6: return z > 0.f ? (z < 6.f ? z : 6.f) : 0.f;
    case ACT_SILU: return z * tsr_sigmoidf(z);
    case ACT_GELU: return 0.5f * z * (1.f + tsr_erff(z * 0.70710678118654752f));
    default: return z;
    }
}

/* d act / dz (0 at the relu/relu6 kinks, as PyTorch) */
static inline float act_grad(float z, int act) {
    switch (act) {
    case ACT_RELU: return z > 0.f ? 1.f : 0.f;
    case ACT_RELU6: return (z > 0.f && z < 6.f) ? 1.f : 0.f;
    case ACT_SILU: { float s = tsr_sigmoidf(z); return s * (1.f + z * (1.f - s)); }
    case ACT_GELU: return 0.5f * (1.f + tsr_erff(z * 0.70710678118654752f))
                          + z * tsr_expf(-0.5f * z * z) * 0.39894228040143268f;
    default: return 1.f;
    }
}

/* d[i] *= act'(z[i]) over n values.  relu / relu6 as a select-free product with a 0/1 mask
 * (vectorises; the branchy act_grad mispredicted on every other random sign: 10 ns an element);
 * the product, not a select, so a NaN/inf gradient propagates as in the reference's dy * act'(z) */
static inline void mul_act_grad(float *restrict d, const float *restrict z, int64_t n, int act) {
    if (act == ACT_RELU)
        for (int64_t i = 0; i < n; i++) d[i] *= (float)(z[i] > 0.f);
    else if (act == ACT_RELU6)
        for (int64_t i = 0; i < n; i++) d[i] *= (float)((z[i] > 0.f) & (z[i] < 6.f));
    else
        for (int64_t i = 0; i < n; i++) d[i] *= act_grad(z[i], act);
}

/* act over n fp32 values; one loop per activation so each vectorises (tsr_expf is branch-free) */
static inline void act_block(float *restrict v, int64_t n, int act) {
    switch (act) {
    case ACT_RELU:
#pragma omp simd
        for (int64_t j = 0; j < n; j++) v[j] = v[j] > 0.f ? v[j] : 0.f;
        break;
    case ACT_RELU6:
#pragma omp simd
        for (int64_t j = 0; j < n; j++) v[j] = v[j] > 0.f ? (v[j] < 6.f ? v[j] : 6.f) : 0.f;
        break;
    case ACT_SILU:
#pragma omp simd
        for (int64_t j = 0; j < n; j++) v[j] = v[j] * tsr_sigmoidf(v[j]);
        break;
    case ACT_GELU:
#pragma omp simd
        for (int64_t j = 0; j < n; j++) v[j] = 0.5f * v[j] * (1.f + tsr_erff(v[j] * 0.70710678118654752f));
        break;
    default:
        break;
    }
}

static inline float ld1(const void *p, int64_t i, int dtype) {
    if (dtype == TSR_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dtype == TSR_BF16 ? tsr_bf2f(h) : tsr_h2f(h);
}

static inline void st1(void *p, int64_t i, float v, int dtype) {
    if (dtype == TSR_F32) ((float *)p)[i] = v;
    else if (dtype == TSR_BF16) ((uint16_t *)p)[i] = tsr_f2bf(v);
    else ((uint16_t *)p)[i] = tsr_f2h(v);
}

/* ------------------------------------------------------------------ pack
 * dst[N][Hd][Wd][C] (fp32) = 0, except dst[n][oh + h*sh][ow + w*sw][c] = src(n, c, h, w)
 * (times act'(z[n][h][w][c]) when z is given; z is fp32 NHWC contiguous [N][H][W][C]).
 * Positions falling outside dst are dropped (a negative offset crops). */
int tsr_conv2d_pack(const void *src, int dtype, int64_t N, int64_t C, int64_t H, int64_t W,
                    int64_t sn, int64_t sc, int64_t sh_, int64_t sw_, const float *z, int act,
                    float *dst, int64_t Hd, int64_t Wd, int64_t off_h, int64_t off_w,
                    int64_t step_h, int64_t step_w, int threads) {
    const int chan_inner = (sc == 1);
#pragma omp parallel for collapse(2) schedule(static) num_threads(tsr_threads(threads))
    for (int64_t n = 0; n < N; n++) {
        for (int64_t hd = 0; hd < Hd; hd++) {
            float *row = dst + (n * Hd + hd) * Wd * C;
            memset(row, 0, (size_t)(Wd * C) * 4);
            int64_t hh = hd - off_h;
            if (hh < 0 || hh % step_h) continue;
            int64_t h = hh / step_h;
            if (h >= H) continue;
            /* source columns w whose destination off_w + w*step_w lies in [0, Wd) */
            int64_t w0 = off_w >= 0 ? 0 : (-off_w + step_w - 1) / step_w;
            int64_t w1 = Wd - off_w <= 0 ? 0 : (Wd - off_w + step_w - 1) / step_w;
            if (w1 > W) w1 = W;
            const float *zr = z ? z + (n * H + h) * W * C : NULL;
            if (chan_inner) {
                for (int64_t w = w0; w < w1; w++) {
                    float *d = row + (off_w + w * step_w) * C;
                    int64_t s0 = n * sn + h * sh_ + w * sw_;
                    tsr_load_f32(d, (const char *)src + s0 * tsr_elsize(dtype), C, dtype);
                    if (zr) mul_act_grad(d, zr + w * C, C, act);
                }
            } else {
                for (int64_t c = 0; c < C; c++) {
                    int64_t s0 = n * sn + c * sc + h * sh_;
                    for (int64_t w = w0; w < w1; w++) {
                        float v = ld1(src, s0 + w * sw_, dtype);
                        if (zr) v *= act_grad(zr[w * C + c], act);
                        row[(off_w + w * step_w) * C + c] = v;
                    }
                }
            }
        }
    }
    return TSR_OK;
}

/* ------------------------------------------------------------------ epilogue */
/* bias + activation on nvalid fp32 sums of one output pixel, stored at out + base with
 * channel stride oc (oc == 1: one contiguous row store). */
static inline void store_pixel(float *restrict v, int64_t nvalid, const float *bias, int act, void *out,
                               int64_t base, int64_t oc, int dtype) {
    if (bias)
        for (int64_t j = 0; j < nvalid; j++) v[j] += bias[j];
    act_block(v, nvalid, act);
    if (oc == 1) {
        tsr_store_conv((char *)out + base * tsr_elsize(dtype), v, nvalid, dtype);
    } else {
        for (int64_t j = 0; j < nvalid; j++) st1(out, base + j * oc, v[j], dtype);
    }
}

/* one finished vector of 16 sums (bias included): relu / relu6 in registers, and a direct
 * store when the output is fp32 channels-last; everything else through store_pixel */
static inline cv16 clamp_vec(cv16 v, int act) {  /* relu / relu6 in registers; other acts pass */
    if (act != ACT_RELU && act != ACT_RELU6) return v;
    v = (cv16)((cv16i)v & (v > 0.f));  /* NaN compares false: relu(NaN) = 0 */
    if (act == ACT_RELU6) {
        const cv16i m = v < 6.f;
        v = (cv16)(((cv16i)v & m) | ((cv16i)((cv16){0} + 6.f) & ~m));
    }
    return v;
}

static inline void store_vec(cv16 v, int act, void *out, int64_t base, int64_t oc, int dtype) {
    if (act == ACT_RELU || act == ACT_RELU6) {
        v = clamp_vec(v, act);
        act = ACT_NONE;
    }
    if (act == ACT_NONE && oc == 1 && dtype == TSR_F32) {
        *(cv16u *)((float *)out + base) = v;
        return;
    }
    float t[16];
    *(cv16u *)t = v;
    store_pixel(t, 16, NULL, act, out, base, oc, dtype);
}

/* ------------------------------------------------------------------ dense forward */
typedef struct {
    const float *xp; int64_t Hp, Wp, C;
    const float *wp; int64_t cop;
    const float *bias;
    void *out; int dtype; int64_t on, oc, oh_s, ow_s;
    int64_t OH, OW, G, cing, coutg, KH, KW, sh, sw, dh, dw;
    int act;
} fwd_args;

/* one tile: np output pixels of image n starting at flattened pixel q0 (= oh*OW + ow, so a tile
 * may span rows: a 7x7 output wastes no lanes) x channels co0 .. co0 + 16*NV of group g */
__attribute__((always_inline)) static inline void dense_tile(const fwd_args *a, int64_t n, int64_t q0, int np,
                                                             int64_t g, int64_t co0, const int NV) {
    cv16 acc[TILE_P][2];
    const float *xs[TILE_P];
    int64_t obase[TILE_P];
#pragma GCC unroll 16
    for (int p = 0; p < TILE_P; p++) {
        acc[p][0] = (cv16){0}; acc[p][1] = (cv16){0};
        int64_t q = q0 + (p < np ? p : 0);
        int64_t oh = q / a->OW, ow = q % a->OW;
        xs[p] = a->xp + ((n * a->Hp + oh * a->sh) * a->Wp + ow * a->sw) * a->C + g * a->cing;
        obase[p] = n * a->on + oh * a->oh_s + ow * a->ow_s;
    }
    const int64_t cing = a->cing, cop = a->cop;
    for (int64_t kh = 0; kh < a->KH; kh++) {
        for (int64_t kw = 0; kw < a->KW; kw++) {
            const int64_t xoff = (kh * a->dh * a->Wp + kw * a->dw) * a->C;
            const float *wk = a->wp + ((g * a->KH + kh) * a->KW + kw) * cing * cop + co0;
            for (int64_t ci = 0; ci < cing; ci++) {
                cv16 w0 = *(const cv16u *)(wk + ci * cop);
                cv16 w1 = NV == 2 ? *(const cv16u *)(wk + ci * cop + 16) : (cv16){0};
#pragma GCC unroll 16
                for (int p = 0; p < TILE_P; p++) {
                    float b = xs[p][xoff + ci];
                    acc[p][0] += b * w0;
                    if (NV == 2) acc[p][1] += b * w1;
                }
            }
        }
    }
    int64_t nvalid = a->coutg - co0;
    if (nvalid > 16 * NV) nvalid = 16 * NV;
    const int64_t cglob = g * a->coutg + co0;
    for (int p = 0; p < np; p++) {
        float v[32];
        *(cv16u *)v = acc[p][0];
        if (NV == 2) *(cv16u *)(v + 16) = acc[p][1];
        store_pixel(v, nvalid, a->bias ? a->bias + cglob : NULL, a->act, a->out, obase[p] + cglob * a->oc,
                    a->oc, a->dtype);
    }
}

/* Work items (group, 32-channel block, image, pixel tile), channel block outermost: a thread's
 * consecutive items reuse one block of packed weights (c_in*KH*KW*32 floats) from its L2. */
int tsr_conv2d_fwd(const float *xp, int64_t N, int64_t Hp, int64_t Wp, int64_t C, const float *wp, int64_t cop,
                   const float *bias, void *out, int dtype, int64_t on, int64_t oc, int64_t oh_s, int64_t ow_s,
                   int64_t OH, int64_t OW, int64_t G, int64_t cing, int64_t coutg, int64_t KH, int64_t KW,
                   int64_t sh, int64_t sw, int64_t dh, int64_t dw, int act, int threads) {
    fwd_args a = {xp, Hp, Wp, C, wp, cop, bias, out, dtype, on, oc, oh_s, ow_s,
                  OH, OW, G, cing, coutg, KH, KW, sh, sw, dh, dw, act};
    const int64_t ncb = (coutg + 31) / 32, ntile = (OH * OW + TILE_P - 1) / TILE_P;
#pragma omp parallel for collapse(4) schedule(static) num_threads(tsr_threads(threads))
    for (int64_t g = 0; g < G; g++) {
        for (int64_t cb = 0; cb < ncb; cb++) {
            for (int64_t n = 0; n < N; n++) {
                for (int64_t t = 0; t < ntile; t++) {
                    const int64_t co0 = cb * 32, q0 = t * TILE_P;
                    int np = OH * OW - q0 < TILE_P ? (int)(OH * OW - q0) : TILE_P;
                    if (coutg - co0 > 16) dense_tile(&a, n, q0, np, g, co0, 2);
                    else dense_tile(&a, n, q0, np, g, co0, 1);
                }
            }
        }
    }
    return TSR_OK;
}

/* ------------------------------------------------------------------ depthwise forward */
/* x: NHWC [N][H][W][C] in fp32, bf16 or fp16 (xdtype), unpadded; the zero padding (pt, pl;
 * bottom/right implied by OH/OW) is virtual.  A bf16 / fp16 x is widened in registers as it is
 * loaded (exact), so a half-precision channels-last x is read in place: no fp32 copy of it is
 * made (that packing pass cost 3x the kernel).  Sums are fp32, rounded once at the store.
 * Channels in blocks of 16 (one vector); a tile of 8 output pixels of a row stays in registers
 * and shares each tap's weight vector.  Tiles whose taps all lie inside x take the
 * branch-free path (3x3 stride 1: a sliding window, 10 input vectors serve 24 FMAs); the border
 * tiles (first and last of a row, any row whose window leaves x, and rows narrower than a tile)
 * read through a table of one pointer per (tap, pixel) built once per tile, where a tap outside
 * x points into a zero row (XNNPACK's indirection idea), so they run the same 8-wide FMAs as
 * the interior instead of one pixel at a time.  Work is split over (row, channel chunk) so that
 * small images with many channels (7x7x960) still occupy every thread.  Channel tails (C % 16)
 * take a scalar loop. */
#define DW_P 8
#define DW_MAXTAPS 64  /* the pointer table (taps x 8) lives on the stack up to 8x8 kernels */

/* what every tile of one output row (and channel chunk) shares */
typedef struct {
    const float *wk;     /* weights [KH][KW][C] from the row's first valid tap row kh0 */
    const float *bias;   /* or NULL */
    int64_t C, xrow;     /* channels (pixel stride of x), one tap row's input offset dh*W*C */
    int64_t nkh, KW;     /* tap rows inside x, taps per row */
    int64_t kstep, ps;   /* next tap column's input offset (dw*C), next output pixel's (sw*C) */
    int64_t c0, c1;      /* channels c0 .. c1 (multiples of 16) */
    void *out; int64_t ow_s, oc; int act, dtype;
    int st;              /* the fast stores' kind (dw_st): dtype, or TSR_BF16HW */
} dw_row;

/* stores of anything but channels-last none/relu/relu6, and of partial tiles (np < 8) */
static __attribute__((noinline)) void dw_store_any(const cv16 *a, int64_t np, const dw_row *r, int64_t base) {
    for (int64_t p = 0; p < np; p++) store_vec(a[p], r->act, r->out, base + p * r->ow_s, r->oc, r->dtype);
}

/* one finished vector of a channels-last output: fp32 as is, bf16 / fp16 rounded to nearest even.
 * st is the store kind: an fp dtype, or TSR_BF16HW (bf16 on a CPU with AVX512_BF16): one
 * VCVTNEPS2BF16 instead of the ~8 integer ops of the RNE sequence (1.5x on a bf16 layer); that
 * instruction flushes denormal inputs, so a vector holding one takes the integer path. */
static inline void dw_st(void *out, int64_t i, cv16 v, int st) {
    if (st == TSR_F32) {
        *(cv16u *)((float *)out + i) = v;
        return;
    }
#if TSR_HAVE_BF16HW
    if (st == TSR_BF16HW && __builtin_expect(!_mm512_fpclass_ps_mask((__m512)v, 0x20), 1)) {
        __m256i h;
        __asm__("vcvtneps2bf16 %1, %0" : "=v"(h) : "v"(v));
        memcpy((uint16_t *)out + i, &h, 32);
        return;
    }
#endif
    const tsr_v16h h = tsr_v16_to_half(v, st);
    memcpy((uint16_t *)out + i, &h, 32);
}

/* the 8 finished sums of a tile (channels c0 .. c0 + 15 at output offset base): channels-last
 * outputs with none / relu / relu6 are stored straight from registers */
#define DW_STORE8(fast, np, r, base, a0, a1, a2, a3, a4, a5, a6, a7) do {                          \
        if (fast) {                                                                            \
            const int64_t s_ = (r)->ow_s, b_ = (base); const int act_ = (r)->act, d_ = (r)->st;     \
            void *o_ = (r)->out;                                                               \
            dw_st(o_, b_, clamp_vec(a0, act_), d_); dw_st(o_, b_ + s_, clamp_vec(a1, act_), d_);  \
            dw_st(o_, b_ + 2 * s_, clamp_vec(a2, act_), d_); dw_st(o_, b_ + 3 * s_, clamp_vec(a3, act_), d_); \
            dw_st(o_, b_ + 4 * s_, clamp_vec(a4, act_), d_); dw_st(o_, b_ + 5 * s_, clamp_vec(a5, act_), d_); \
            dw_st(o_, b_ + 6 * s_, clamp_vec(a6, act_), d_); dw_st(o_, b_ + 7 * s_, clamp_vec(a7, act_), d_); \
        } else {                                                                               \
            const cv16 t_[DW_P] = {a0, a1, a2, a3, a4, a5, a6, a7};                            \
            dw_store_any(t_, np, r, base);                                                     \
        }                                                                                      \
    } while (0)
#define DW_FAST(r) ((r)->oc == 1 && (r)->act <= ACT_RELU6)

/* The tile loops below are kept out of line on purpose, and each runs a whole row's tiles:
 * inlined into the OpenMP loop (about 30 live loop variables) gcc 12 spilled the window's
 * input vectors and the tap offsets to the stack (0.6x F.conv2d), and one call per tile cost
 * as much as its FMAs; as leaf functions each gets the whole register file. */
#define DW_LD(p) (*(const cv16u *)(p))
/* x is addressed in bytes (const char *) so one body serves every x dtype XD (a compile-time
 * constant in each instantiation): XE is its element size, DW_X(p, i) element i's address */
#define DW_X(p, i) ((p) + (i) * XE)
#define DW_XLD(p) ((cv16)tsr_v16_load((p), XD))
/* a load kept in a register: the empty asm stops gcc from folding it into each of the three
 * FMAs that use it (it did, loading every input vector 3 times: 27 loads per 24 FMAs) */
#if defined(__AVX512F__)
#define DW_LDR(p) ({ cv16 v_ = DW_XLD(p); __asm__("" : "+v"(v_)); v_; })
#else  /* a cv16 spans 2 ymm (AVX2) or 4 xmm: no single register to pin it in */
#define DW_LDR(p) DW_XLD(p)
#endif
#define DW_ACC_INIT(a, c) cv16 a##0, a##1, a##2, a##3, a##4, a##5, a##6, a##7;                     \
    a##0 = bias ? DW_LD(bias + (c)) : (cv16){0};                                               \
    a##1 = a##0; a##2 = a##0; a##3 = a##0; a##4 = a##0; a##5 = a##0; a##6 = a##0; a##7 = a##0

/* 3-wide taps, dilation 1: a sliding window over the input columns of a tap row (10 for
 * stride 1, 17 for stride 2); each is loaded once (L(j): column j) and feeds every accumulator
 * whose taps cover it (stride 1: 24 FMAs per 10 loads).  Every accumulator sums its taps in
 * (kh, kw) order. */
#define DW_WIN_S1(L, w0, w1, w2, a) do {                                                        \
        cv16 v = L(0); a##0 += v * w0;                                                          \
        v = L(1); a##0 += v * w1; a##1 += v * w0;                                               \
        v = L(2); a##0 += v * w2; a##1 += v * w1; a##2 += v * w0;                               \
        v = L(3); a##1 += v * w2; a##2 += v * w1; a##3 += v * w0;                               \
        v = L(4); a##2 += v * w2; a##3 += v * w1; a##4 += v * w0;                               \
        v = L(5); a##3 += v * w2; a##4 += v * w1; a##5 += v * w0;                               \
        v = L(6); a##4 += v * w2; a##5 += v * w1; a##6 += v * w0;                               \
        v = L(7); a##5 += v * w2; a##6 += v * w1; a##7 += v * w0;                               \
        v = L(8); a##6 += v * w2; a##7 += v * w1;                                               \
        v = L(9); a##7 += v * w2;                                                               \
    } while (0)
#define DW_WIN_S2(L, w0, w1, w2, a) do {  /* output p reads columns 2p, 2p + 1, 2p + 2 */      \
        cv16 v = L(0); a##0 += v * w0;                                                          \
        v = L(1); a##0 += v * w1;                                                               \
        v = L(2); a##0 += v * w2; a##1 += v * w0;                                               \
        v = L(3); a##1 += v * w1;                                                               \
        v = L(4); a##1 += v * w2; a##2 += v * w0;                                               \
        v = L(5); a##2 += v * w1;                                                               \
        v = L(6); a##2 += v * w2; a##3 += v * w0;                                               \
        v = L(7); a##3 += v * w1;                                                               \
        v = L(8); a##3 += v * w2; a##4 += v * w0;                                               \
        v = L(9); a##4 += v * w1;                                                               \
        v = L(10); a##4 += v * w2; a##5 += v * w0;                                              \
        v = L(11); a##5 += v * w1;                                                              \
        v = L(12); a##5 += v * w2; a##6 += v * w0;                                              \
        v = L(13); a##6 += v * w1;                                                              \
        v = L(14); a##6 += v * w2; a##7 += v * w0;                                              \
        v = L(15); a##7 += v * w1;                                                              \
        v = L(16); a##7 += v * w2;                                                              \
    } while (0)
#define DW_WIN(S, L, w0, w1, w2, a) do {                                                        \
        if ((S) == 1) DW_WIN_S1(L, w0, w1, w2, a); else DW_WIN_S2(L, w0, w1, w2, a);            \
    } while (0)

/* ntiles interior 8-pixel tiles of a 3-wide, stride-S (1 or 2) row: x is the first tile's
 * first tap (row ih0 + kh0, column iw0), base its output offset.  Channel blocks go in
 * pairs: 16 accumulators keep twice the independent FMA chains in flight (with 8, the chains
 * of 9 dependent 4-cycle FMAs left the two FMA ports idle half the time). */
__attribute__((always_inline)) static inline void dw_run_k3(const char *x, int64_t base, int64_t ntiles,
                                                            const dw_row *r, const int S, const int XD) {
    const int64_t XE = tsr_elsize(XD);
    const int64_t C = r->C, xrow = r->xrow, nkh = r->nkh, c1 = r->c1, ow_s = r->ow_s, oc = r->oc;
    const float *bias = r->bias, *wk = r->wk;
    const int fast = DW_FAST(r);
    for (int64_t t = 0; t < ntiles; t++, x += DW_P * S * C * XE, base += DW_P * ow_s) {
        int64_t c0 = r->c0;
        for (; c0 + 32 <= c1; c0 += 32) {
            DW_ACC_INIT(a, c0);
            DW_ACC_INIT(b, c0 + 16);
            const char *xr = DW_X(x, c0);
            const float *wr = wk + c0;
            for (int64_t kh = 0; kh < nkh; kh++, xr += xrow * XE, wr += 3 * C) {
                const cv16 w0 = DW_LD(wr), w1 = DW_LD(wr + C), w2 = DW_LD(wr + 2 * C);
                const cv16 u0 = DW_LD(wr + 16), u1 = DW_LD(wr + C + 16), u2 = DW_LD(wr + 2 * C + 16);
#define DW_LA(j) DW_LDR(DW_X(xr, (j) * C))
#define DW_LB(j) DW_LDR(DW_X(xr, (j) * C + 16))
                DW_WIN(S, DW_LA, w0, w1, w2, a);
                DW_WIN(S, DW_LB, u0, u1, u2, b);
            }
            DW_STORE8(fast, DW_P, r, base + c0 * oc, a0, a1, a2, a3, a4, a5, a6, a7);
            DW_STORE8(fast, DW_P, r, base + (c0 + 16) * oc, b0, b1, b2, b3, b4, b5, b6, b7);
        }
        if (c0 < c1) {
            DW_ACC_INIT(a, c0);
            const char *xr = DW_X(x, c0);
            const float *wr = wk + c0;
            for (int64_t kh = 0; kh < nkh; kh++, xr += xrow * XE, wr += 3 * C) {
                const cv16 w0 = DW_LD(wr), w1 = DW_LD(wr + C), w2 = DW_LD(wr + 2 * C);
                DW_WIN(S, DW_LA, w0, w1, w2, a);
            }
            DW_STORE8(fast, DW_P, r, base + c0 * oc, a0, a1, a2, a3, a4, a5, a6, a7);
        }
    }
}

/* one border tile of a 3-wide stride-S row: the same window, where column j (input column
 * iw0 + j) is read only for jlo <= j < jhi and is zero outside x (no pointer table: its 72
 * entries cost more than the FMAs when C is one or two blocks).  x is the tile's (row
 * ih0 + kh0, column iw0) address, possibly outside x; np <= 8 pixels are stored. */
#define DW_COL(j) ((j) >= jlo && (j) < jhi ? DW_XLD(DW_X(xr, (j) * C)) : (cv16){0})
__attribute__((always_inline)) static inline void dw_edge_k3(const char *x, int64_t jlo, int64_t jhi,
                                                             int64_t base, int64_t np, const dw_row *r,
                                                             const int S, const int XD) {
    const int64_t XE = tsr_elsize(XD);
    const int64_t C = r->C, xrow = r->xrow, nkh = r->nkh, c1 = r->c1, oc = r->oc;
    const float *bias = r->bias, *wk = r->wk;
    const int fast = np == DW_P && DW_FAST(r);
    for (int64_t c0 = r->c0; c0 < c1; c0 += 16) {
        DW_ACC_INIT(a, c0);
        const char *xr = DW_X(x, c0);
        const float *wr = wk + c0;
        for (int64_t kh = 0; kh < nkh; kh++, xr += xrow * XE, wr += 3 * C) {
            const cv16 w0 = DW_LD(wr), w1 = DW_LD(wr + C), w2 = DW_LD(wr + 2 * C);
            DW_WIN(S, DW_COL, w0, w1, w2, a);
        }
        DW_STORE8(fast, np, r, base + c0 * oc, a0, a1, a2, a3, a4, a5, a6, a7);
    }
}

/* ntiles interior tiles of any kernel width / stride / dilation */
__attribute__((always_inline)) static inline void dw_run_any(const char *x, int64_t base, int64_t ntiles,
                                                             const dw_row *r, const int XD) {
    const int64_t XE = tsr_elsize(XD);
    const int64_t C = r->C, xrow = r->xrow, nkh = r->nkh, KW = r->KW, kstep = r->kstep, ps = r->ps;
    const int64_t c1 = r->c1, ow_s = r->ow_s, oc = r->oc;
    const float *bias = r->bias, *wk = r->wk;
    const int fast = DW_FAST(r);
    for (int64_t t = 0; t < ntiles; t++, x += DW_P * ps * XE, base += DW_P * ow_s) {
        for (int64_t c0 = r->c0; c0 < c1; c0 += 16) {
            DW_ACC_INIT(a, c0);
            const char *xr = DW_X(x, c0);
            const float *wr = wk + c0;
            for (int64_t kh = 0; kh < nkh; kh++, xr += xrow * XE, wr += KW * C) {
                const char *q = xr;
                for (int64_t kw = 0; kw < KW; kw++, q += kstep * XE) {
                    const cv16 wv = DW_LD(wr + kw * C);
                    a0 += DW_XLD(q) * wv;
                    a1 += DW_XLD(DW_X(q, ps)) * wv;
                    a2 += DW_XLD(DW_X(q, 2 * ps)) * wv;
                    a3 += DW_XLD(DW_X(q, 3 * ps)) * wv;
                    a4 += DW_XLD(DW_X(q, 4 * ps)) * wv;
                    a5 += DW_XLD(DW_X(q, 5 * ps)) * wv;
                    a6 += DW_XLD(DW_X(q, 6 * ps)) * wv;
                    a7 += DW_XLD(DW_X(q, 7 * ps)) * wv;
                }
            }
            DW_STORE8(fast, DW_P, r, base + c0 * oc, a0, a1, a2, a3, a4, a5, a6, a7);
        }
    }
}

/* one border tile: tp[t][p] is pixel p's input for tap t (the zero row where the tap lies
 * outside x); r->wk must point at tap (0, 0); np <= 8 pixels are stored */
__attribute__((always_inline)) static inline void dw_tile_table(const char *const (*tp)[DW_P], int64_t taps,
                                                                int64_t base, int64_t np, const dw_row *r,
                                                                const int XD) {
    const int64_t XE = tsr_elsize(XD);
    const int64_t C = r->C, c1 = r->c1, oc = r->oc;
    const float *bias = r->bias, *wp = r->wk;
    const int fast = np == DW_P && DW_FAST(r);
    for (int64_t c0 = r->c0; c0 < c1; c0 += 16) {
        DW_ACC_INIT(a, c0);
        for (int64_t t = 0; t < taps; t++) {
            const cv16 wv = DW_LD(wp + t * C + c0);
            a0 += DW_XLD(DW_X(tp[t][0], c0)) * wv;
            a1 += DW_XLD(DW_X(tp[t][1], c0)) * wv;
            a2 += DW_XLD(DW_X(tp[t][2], c0)) * wv;
            a3 += DW_XLD(DW_X(tp[t][3], c0)) * wv;
            a4 += DW_XLD(DW_X(tp[t][4], c0)) * wv;
            a5 += DW_XLD(DW_X(tp[t][5], c0)) * wv;
            a6 += DW_XLD(DW_X(tp[t][6], c0)) * wv;
            a7 += DW_XLD(DW_X(tp[t][7], c0)) * wv;
        }
        DW_STORE8(fast, np, r, base + c0 * oc, a0, a1, a2, a3, a4, a5, a6, a7);
    }
}

/* the tile loops instantiated per stride and x dtype (see above: out of line on purpose) */
typedef void (*dw_run_fn)(const char *, int64_t, int64_t, const dw_row *);
typedef void (*dw_edge_fn)(const char *, int64_t, int64_t, int64_t, int64_t, const dw_row *);
typedef void (*dw_table_fn)(const char *const (*)[DW_P], int64_t, int64_t, int64_t, const dw_row *);
typedef struct { dw_run_fn k3s1, k3s2, any; dw_edge_fn e3s1, e3s2; dw_table_fn table; } dw_fns;
#define DW_NOINLINE static __attribute__((noinline))
#define DW_INSTANTIATE(sfx, XD)                                                                          \
    DW_NOINLINE void dw_k3s1_##sfx(const char *x, int64_t b, int64_t nt, const dw_row *r) {              \
        dw_run_k3(x, b, nt, r, 1, XD);                                                                   \
    }                                                                                                    \
    DW_NOINLINE void dw_k3s2_##sfx(const char *x, int64_t b, int64_t nt, const dw_row *r) {              \
        dw_run_k3(x, b, nt, r, 2, XD);                                                                   \
    }                                                                                                    \
    DW_NOINLINE void dw_any_##sfx(const char *x, int64_t b, int64_t nt, const dw_row *r) {               \
        dw_run_any(x, b, nt, r, XD);                                                                     \
    }                                                                                                    \
    DW_NOINLINE void dw_e3s1_##sfx(const char *x, int64_t lo, int64_t hi, int64_t b, int64_t np,         \
                                   const dw_row *r) {                                                    \
        dw_edge_k3(x, lo, hi, b, np, r, 1, XD);                                                          \
    }                                                                                                    \
    DW_NOINLINE void dw_e3s2_##sfx(const char *x, int64_t lo, int64_t hi, int64_t b, int64_t np,         \
                                   const dw_row *r) {                                                    \
        dw_edge_k3(x, lo, hi, b, np, r, 2, XD);                                                          \
    }                                                                                                    \
    DW_NOINLINE void dw_table_##sfx(const char *const (*tp)[DW_P], int64_t taps, int64_t b, int64_t np,  \
                                    const dw_row *r) {                                                   \
        dw_tile_table(tp, taps, b, np, r, XD);                                                           \
    }
DW_INSTANTIATE(f32, TSR_F32)
DW_INSTANTIATE(bf16, TSR_BF16)
DW_INSTANTIATE(f16, TSR_F16)
#define DW_FNS(sfx) {dw_k3s1_##sfx, dw_k3s2_##sfx, dw_any_##sfx, dw_e3s1_##sfx, dw_e3s2_##sfx, dw_table_##sfx}
static const dw_fns DW_BY_DTYPE[3] = {[TSR_F32] = DW_FNS(f32), [TSR_F16] = DW_FNS(f16), [TSR_BF16] = DW_FNS(bf16)};

int tsr_conv2d_fwd_dw(const void *x, int xdtype, int64_t N, int64_t H, int64_t W, int64_t C, const float *wp,
                      const float *bias, void *out, int dtype, int64_t on, int64_t oc, int64_t oh_s, int64_t ow_s,
                      int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t dh,
                      int64_t dw, int64_t pt, int64_t pl, int act, int threads) {
    if (xdtype != TSR_F32 && xdtype != TSR_F16 && xdtype != TSR_BF16) return TSR_EINVAL;
    const dw_fns *fn = &DW_BY_DTYPE[xdtype];
    const int64_t xe = tsr_elsize(xdtype);
    const int st = dtype == TSR_BF16 && tsr_bf16_hw() ? TSR_BF16HW : dtype;
    const int64_t cfull = C / 16 * 16, nblk = C / 16, taps = KH * KW;
    const int64_t ps = sw * C;  /* next output pixel's input offset */
    const int k3 = KW == 3 && dw == 1 && (sw == 1 || sw == 2);  /* the sliding-window paths */
    /* output columns whose taps all lie inside x: ow*sw - pl >= 0 and ow*sw - pl + (KW-1)*dw < W */
    const int64_t ow_lo = (pl + sw - 1) / sw;
    int64_t ow_hi = W - 1 - (KW - 1) * dw + pl < 0 ? 0 : (W - 1 - (KW - 1) * dw + pl) / sw + 1;
    if (ow_hi > OW) ow_hi = OW;
    float *zeros = NULL;  /* what a tap outside x reads: C (+ a vector of slack) zeros, any dtype */
    if (taps <= DW_MAXTAPS && nblk) {
        zeros = calloc((size_t)(C + 16), sizeof(float));
        if (!zeros) return TSR_ENOMEM;
    }
    /* tasks: rows x channel chunks; chunk the channels only when the rows alone are too few to
     * balance the threads (a chunk keeps >= 4 blocks so the per-tile pointer table amortises).
     * Row-major over all channels reads x as contiguous rows (the prefetchers' best case):
     * channel bands outer, to keep a band's rows in L1, measured slower (1.3x at 144 x 56 x 56,
     * 2.2x at stride 2). */
    const int nth = tsr_threads(threads);
    const int64_t rows = N * OH;
    int64_t nch = 1;
    if (rows < 8 * (int64_t)nth) {
        nch = (8 * (int64_t)nth + rows - 1) / rows;
        if (nch > nblk / 4) nch = nblk / 4;
        if (nch < 1) nch = 1;
    }
#pragma omp parallel for collapse(2) schedule(static) num_threads(nth)
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t ch = 0; ch < nch; ch++) {
            const int64_t n = r / OH, oh = r % OH;
            const int64_t ih0 = oh * sh - pt;
            int64_t kh0 = 0, kh1 = KH;  /* taps whose row lies inside x */
            while (kh0 < KH && ih0 + kh0 * dh < 0) kh0++;
            while (kh1 > kh0 && ih0 + (kh1 - 1) * dh >= H) kh1--;
            const char *ximg = (const char *)x + n * H * W * C * xe;
            const int64_t cb0 = nblk * ch / nch * 16, cb1 = nblk * (ch + 1) / nch * 16;
            dw_row rw = {wp + kh0 * KW * C, bias, C, dh * W * C, kh1 - kh0, KW, dw * C, ps, cb0, cb1,
                         out, ow_s, oc, act, dtype, st};
            /* the channel tail (C % 16) as one more block, overlapping the last full one: the tiles'
             * unaligned loads and stores take any c0, and the overlapped channels get their same values
             * again (each lane's sum is formed alone, in the same order); the channels of a C < 16
             * take the pixel loop below.  (Channel by channel, scalar, the tail had run a 24-channel
             * 112x112 layer at 1/8 of eager's speed.) */
            const int tail = ch == nch - 1 && cfull < C && C >= 16;
            for (int pass = 0; pass <= tail; pass++) {
                if (pass) rw.c0 = C - 16, rw.c1 = C;
                int64_t ow0 = 0;
                while (ow0 < OW && rw.c1 > rw.c0) {
                    const int64_t iw0 = ow0 * sw - pl;
                    int64_t np = OW - ow0 < DW_P ? OW - ow0 : DW_P;
                    const int64_t base0 = n * on + oh * oh_s + ow0 * ow_s;
                    if (ow0 >= ow_lo && ow0 + DW_P <= ow_hi) {  /* interior: a run of tiles inside x */
                        const int64_t nt = (ow_hi - ow0) / DW_P;
                        const char *xt = ximg + ((ih0 + kh0 * dh) * W + iw0) * C * xe;
                        (k3 ? (sw == 1 ? fn->k3s1 : fn->k3s2) : fn->any)(xt, base0, nt, &rw);
                        np = nt * DW_P;
                    } else if (k3) {  /* border tile, 3-wide stride 1 or 2: window columns outside x read 0 */
                        const int64_t jlo = iw0 < 0 ? -iw0 : 0, jhi = W - iw0;
                        /* the address is formed only for columns jlo .. jhi - 1, inside x */
                        (sw == 1 ? fn->e3s1 : fn->e3s2)(ximg + ((ih0 + kh0 * dh) * W + iw0) * C * xe, jlo, jhi,
                                                        base0, np, &rw);
                    } else if (zeros) {  /* border tile: one pointer per (tap, pixel), zeros outside x */
                        const char *tp[DW_MAXTAPS][DW_P];
                        for (int64_t kh = 0; kh < KH; kh++) {
                            const int64_t ih = ih0 + kh * dh;
                            for (int64_t kw = 0; kw < KW; kw++)
                                for (int64_t p = 0; p < DW_P; p++) {
                                    const int64_t iw = iw0 + p * sw + kw * dw;
                                    tp[kh * KW + kw][p] = (p < np && ih >= 0 && ih < H && iw >= 0 && iw < W)
                                                          ? ximg + (ih * W + iw) * C * xe : (const char *)zeros;
                                }
                        }
                        dw_row rt = rw;
                        rt.wk = wp;  /* the table covers every tap */
                        fn->table((const char *const (*)[DW_P])tp, taps, base0, np, &rt);
                    } else {  /* kernels beyond 8x8: one pixel at a time, checking each tap's column */
                        for (int64_t p = 0; p < np; p++)
                            for (int64_t c0 = rw.c0; c0 < rw.c1; c0 += 16) {
                                cv16 a0 = (cv16){0};
                                if (bias) a0 = *(const cv16u *)(bias + c0);
                                for (int64_t kh = kh0; kh < kh1; kh++)
                                    for (int64_t kw = 0; kw < KW; kw++) {
                                        const int64_t c = iw0 + p * sw + kw * dw;
                                        if (c < 0 || c >= W) continue;
                                        a0 += (cv16)tsr_v16_load(ximg + (((ih0 + kh * dh) * W + c) * C + c0) * xe,
                                                                 xdtype) * *(const cv16u *)(wp + (kh * KW + kw) * C + c0);
                                    }
                                store_vec(a0, act, out, base0 + p * ow_s + c0 * oc, oc, dtype);
                            }
                    }
                    ow0 += np;
                }
            }
            if (ch == nch - 1 && cfull < C && C < 16) {  /* fewer than 16 channels: pixel by pixel, the
                                                          * channels innermost */
                const int64_t nt = C - cfull;
                for (int64_t ow = 0; ow < OW; ow++) {
                    float a[16];
                    for (int64_t j = 0; j < nt; j++) a[j] = bias ? bias[cfull + j] : 0.f;
                    for (int64_t kh = kh0; kh < kh1; kh++)
                        for (int64_t kw = 0; kw < KW; kw++) {
                            const int64_t iw = ow * sw - pl + kw * dw;
                            if (iw < 0 || iw >= W) continue;
                            const int64_t xi = ((ih0 + kh * dh) * W + iw) * C + cfull;
                            const float *wk = wp + (kh * KW + kw) * C + cfull;
                            for (int64_t j = 0; j < nt; j++) a[j] += ld1(ximg, xi + j, xdtype) * wk[j];
                        }
                    for (int64_t j = 0; j < nt; j++)
                        st1(out, n * on + (cfull + j) * oc + oh * oh_s + ow * ow_s, act_f(a[j], act), dtype);
                }
            }
        }
    }
    free(zeros);
    return TSR_OK;
}

/* ------------------------------------------------------------------ weight gradient (dense) */
/* dW[(g*coutg + co)][ci][kh][kw] = sum over pixels of dz[pix][g*coutg + co] * xp[tap(pix, kh, kw)][g*cing + ci].
 * Tiles of R input channels x 32 output channels stay in registers over all pixels; tiles are
 * shared out among threads (no reduction needed). */
#define WG_R 6
int tsr_conv2d_wgrad(const float *xp, int64_t N, int64_t Hp, int64_t Wp, int64_t C, const float *dz,
                     int64_t OH, int64_t OW, int64_t Cout, int64_t G, int64_t cing, int64_t coutg,
                     int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t dh, int64_t dw, float *dW,
                     int threads) {
    const int64_t nrb = (cing + WG_R - 1) / WG_R, ncb = (coutg + 31) / 32;
    const int64_t ntiles = G * KH * KW * nrb * ncb;
#pragma omp parallel for schedule(dynamic, 1) num_threads(tsr_threads(threads))
    for (int64_t t = 0; t < ntiles; t++) {
        int64_t cb = t % ncb, r = t / ncb;
        int64_t rb = r % nrb; r /= nrb;
        int64_t kw = r % KW; r /= KW;
        int64_t kh = r % KH; int64_t g = r / KH;
        int64_t ci0 = rb * WG_R, co0 = cb * 32;
        int rv = (int)(cing - ci0 < WG_R ? cing - ci0 : WG_R);
        int64_t cv = coutg - co0 < 32 ? coutg - co0 : 32;
        cv16 acc[WG_R][2];
        for (int i = 0; i < WG_R; i++) { acc[i][0] = (cv16){0}; acc[i][1] = (cv16){0}; }
        for (int64_t n = 0; n < N; n++) {
            for (int64_t oh = 0; oh < OH; oh++) {
                const float *xr = xp + ((n * Hp + oh * sh + kh * dh) * Wp + kw * dw) * C + g * cing + ci0;
                const float *dr = dz + (n * OH + oh) * OW * Cout + g * coutg + co0;
                for (int64_t ow = 0; ow < OW; ow++) {
                    const float *xv = xr + ow * sw * C;
                    const float *dv = dr + ow * Cout;
                    cv16 d0, d1;
                    if (cv == 32) {
                        d0 = *(const cv16u *)dv; d1 = *(const cv16u *)(dv + 16);
                    } else {
                        float tmp[32] = {0};
                        for (int64_t j = 0; j < cv; j++) tmp[j] = dv[j];
                        d0 = *(const cv16u *)tmp; d1 = *(const cv16u *)(tmp + 16);
                    }
                    if (rv == WG_R) {
                        for (int i = 0; i < WG_R; i++) { acc[i][0] += xv[i] * d0; acc[i][1] += xv[i] * d1; }
                    } else {
                        for (int i = 0; i < rv; i++) { acc[i][0] += xv[i] * d0; acc[i][1] += xv[i] * d1; }
                    }
                }
            }
        }
        for (int i = 0; i < rv; i++) {
            float v[32];
            *(cv16u *)v = acc[i][0]; *(cv16u *)(v + 16) = acc[i][1];
            for (int64_t j = 0; j < cv; j++)
                dW[(((g * coutg + co0 + j) * cing + ci0 + i) * KH + kh) * KW + kw] = v[j];
        }
    }
    return TSR_OK;
}

/* depthwise: dW[c][0][kh][kw] = sum over pixels of dz[pix][c] * x[tap(pix, kh, kw)][c], and
 * (db != NULL) db[c] = sum over pixels of dz[pix][c].  x is the unpadded fp32 NHWC input
 * [N][H][W][C]; taps falling in the (pt, pl) zero padding are skipped, so x is read in place.
 * Threads split the output rows (n, oh); per row, tap and channel block, the sum over the row's
 * pixels runs in registers (4 chains over ow, hiding the FMA latency) and is added to the
 * thread's partial [tap][C]; the row's dz and its KH input rows stay in L1 across the taps.
 * (One task per tap, the earlier scheme, streamed x and dz from memory KH*KW times with its
 * accumulators in memory: 13-19 ms against oneDNN's 8 at 8x144x56x56.)  The partials are summed
 * in thread order after the loop: deterministic for a given thread count. */
static inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

static inline void dw_dot_row(const float *xq, int64_t xs, const float *dq, int64_t C, int64_t n, float *a) {
    int64_t c0 = 0;  /* a[c] += sum over p < n of xq[p*xs + c] * dq[p*C + c] */
    for (; c0 + 16 <= C; c0 += 16) {
        cv16 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        const float *x = xq + c0, *d = dq + c0;
        int64_t p = 0;
        for (; p + 4 <= n; p += 4, x += 4 * xs, d += 4 * C) {
            s0 += *(const cv16u *)x * *(const cv16u *)d;
            s1 += *(const cv16u *)(x + xs) * *(const cv16u *)(d + C);
            s2 += *(const cv16u *)(x + 2 * xs) * *(const cv16u *)(d + 2 * C);
            s3 += *(const cv16u *)(x + 3 * xs) * *(const cv16u *)(d + 3 * C);
        }
        for (; p < n; p++, x += xs, d += C) s0 += *(const cv16u *)x * *(const cv16u *)d;
        *(cv16u *)(a + c0) += (s0 + s1) + (s2 + s3);
    }
    for (; c0 < C; c0++) {  /* channel tail */
        float t = 0.f;
        for (int64_t p = 0; p < n; p++) t += xq[p * xs + c0] * dq[p * C + c0];
        a[c0] += t;
    }
}

int tsr_conv2d_wgrad_dw(const float *x, int64_t N, int64_t H, int64_t W, int64_t C, const float *dz,
                        int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t dh,
                        int64_t dw, int64_t pt, int64_t pl, float *dW, float *db, int threads) {
    const int T = tsr_threads(threads);
    const int64_t taps = KH * KW, rows = N * OH, xs = sw * C, stride = (taps + 1) * C;
    float *part = (float *)calloc((size_t)T * (size_t)stride, sizeof(float));  /* [thread][tap | bias][C] */
    float *ones = (float *)malloc((size_t)C * sizeof(float));
    if (!part || !ones) { free(part); free(ones); return TSR_ENOMEM; }
    for (int64_t c = 0; c < C; c++) ones[c] = 1.f;
#pragma omp parallel num_threads(T)
    {
#ifdef _OPENMP
        float *acc = part + (size_t)omp_get_thread_num() * (size_t)stride;
#else
        float *acc = part;
#endif
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t n = r / OH, oh = r % OH;
            const float *dr = dz + r * OW * C;
            for (int64_t kh = 0; kh < KH; kh++) {
                const int64_t ih = oh * sh + kh * dh - pt;
                if (ih < 0 || ih >= H) continue;
                for (int64_t kw = 0; kw < KW; kw++) {
                    /* output columns whose tap column ow*sw + kw*dw - pl lies in [0, W) */
                    const int64_t off = kw * dw - pl;
                    int64_t o0 = off >= 0 ? 0 : floor_div(-off + sw - 1, sw);
                    int64_t o1 = floor_div(W - 1 - off, sw) + 1;
                    if (o1 > OW) o1 = OW;
                    if (o0 >= o1) continue;
                    dw_dot_row(x + ((n * H + ih) * W + o0 * sw + off) * C, xs, dr + o0 * C, C, o1 - o0,
                               acc + (kh * KW + kw) * C);
                }
            }
            if (db) dw_dot_row(ones, 0, dr, C, OW, acc + taps * C);  /* bias: dz times 1 */
        }
    }
    for (int64_t t = 0; t < (db ? taps + 1 : taps); t++) {  /* row taps: the bias partials */
        for (int64_t c = 0; c < C; c++) {
            float v = 0.f;
            for (int th = 0; th < T; th++) v += part[(size_t)th * (size_t)stride + t * C + c];
            if (t < taps) dW[c * taps + t] = v;
            else db[c] = v;
        }
    }
    free(part); free(ones);
    return TSR_OK;
}

/* dbias[c] = sum over pixels of dz[pix][c] (dz: fp32 [P][C]) */
int tsr_conv2d_bgrad(const float *dz, int64_t P, int64_t C, float *db) {
    memset(db, 0, (size_t)C * 4);
    for (int64_t p = 0; p < P; p++) {
        const float *restrict r = dz + p * C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++) db[c] += r[c];
    }
    return TSR_OK;
}
