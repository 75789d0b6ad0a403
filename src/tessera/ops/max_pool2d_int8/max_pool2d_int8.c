/* max_pool2d_int8.c -- tessera.max_pool2d_int8's native CPU kernel (framework-free C11).
 *
 * y[n, c, oy, ox] = max of x over the window's taps inside x (padding never wins).  x and y are
 * addressed by element strides, so any layout works:
 *   channels-last x and y (unit channel stride): per output pixel, the max over the taps of whole
 *     rows of C codes (the inner loop over c vectorises: VPMAXSB / VPMAXSW, 64 / 32 a step);
 *   anything else: tap by tap per output element.
 * Every window holds at least one tap inside x (the op checks padding <= kernel / 2 and applies
 * PyTorch's ceil_mode rule), so starting from the dtype's minimum is exact.
 * Work is split over (n, oy) rows of the output.
 */
#include "tessera_cpu.h"

typedef struct {
    int64_t N, C, H, W, sn, sc, sh, sw, Ho, Wo, yn, yc, yh, yw;
    int kh, kw, st_h, st_w, pd_h, pd_w, dl_h, dl_w;
} pool_t;

/* the taps' range [k0, k1) along one axis for output position o */
static inline void taps(int64_t o, int st, int pd, int dl, int k, int64_t n, int *k0, int *k1) {
    const int64_t i0 = o * st - pd;
    int a = 0, b = k;
    while (a < k && i0 + (int64_t)a * dl < 0) a++;
    while (b > a && i0 + (int64_t)(b - 1) * dl >= n) b--;
    *k0 = a, *k1 = b;
}

/* o[c] = max over the taps (ky, kx) in [y0, y1) x [x0, x1) of base[ky dy + kx dx + c], c < C.  Sizes
 * in locals and restrict pointers: through the struct, every int8 store could alias its fields
 * (char types alias anything), which kept gcc from vectorising the loop over c (10x slower: ResNet-18's stem pool 956 -> 95 us). */
#define MAX_ROWS(T, TMIN)                                                                               \
    static inline void max_rows_##T(const T *restrict base, int64_t dy, int64_t dx, int y0, int y1, int x0,  \
                                    int x1, int64_t C, T *restrict o) {                                 \
        for (int64_t c = 0; c < C; c++) o[c] = TMIN;                                                    \
        for (int ky = y0; ky < y1; ky++)                                                                \
            for (int kx = x0; kx < x1; kx++) {                                                          \
                const T *restrict row = base + ky * dy + kx * dx;                                       \
                for (int64_t c = 0; c < C; c++) o[c] = row[c] > o[c] ? row[c] : o[c];                   \
            }                                                                                           \
    }
MAX_ROWS(int8_t, INT8_MIN)
MAX_ROWS(int16_t, INT16_MIN)

#define POOL_ROWS(T, TMIN, NAME)                                                                        \
    static void NAME(const T *x, T *y, const pool_t *P, int64_t r) {                                    \
        const int64_t n = r / P->Ho, oy = r % P->Ho;                                                    \
        int y0, y1;                                                                                     \
        taps(oy, P->st_h, P->pd_h, P->dl_h, P->kh, P->H, &y0, &y1);                                     \
        const int64_t iy0 = oy * P->st_h - P->pd_h;                                                     \
        for (int64_t ox = 0; ox < P->Wo; ox++) {                                                        \
            int x0, x1;                                                                                 \
            taps(ox, P->st_w, P->pd_w, P->dl_w, P->kw, P->W, &x0, &x1);                                 \
            const int64_t ix0 = ox * P->st_w - P->pd_w;                                                 \
            T *o = y + n * P->yn + oy * P->yh + ox * P->yw;                                             \
            if (P->sc == 1 && P->yc == 1) { /* channels-last: rows of C codes */                        \
                max_rows_##T(x + n * P->sn + iy0 * P->sh + ix0 * P->sw, P->sh * P->dl_h, P->sw * P->dl_w,     \
                             y0, y1, x0, x1, P->C, o);                                                  \
                continue;                                                                               \
            }                                                                                           \
            for (int64_t c = 0; c < P->C; c++) {                                                        \
                const T *xc = x + n * P->sn + c * P->sc;                                                \
                T m = TMIN;                                                                             \
                for (int ky = y0; ky < y1; ky++)                                                        \
                    for (int kx = x0; kx < x1; kx++) {                                                  \
                        const T v = xc[(iy0 + (int64_t)ky * P->dl_h) * P->sh + (ix0 + (int64_t)kx * P->dl_w) * P->sw]; \
                        m = v > m ? v : m;                                                              \
                    }                                                                                   \
                o[c * P->yc] = m;                                                                       \
            }                                                                                           \
        }                                                                                               \
    }

POOL_ROWS(int8_t, INT8_MIN, rows_i8)
POOL_ROWS(int16_t, INT16_MIN, rows_i16)

/* x: N x C x H x W codes (element strides sn, sc, sh, sw), es = element size (1 or 2); y: N x C x
 * Ho x Wo (strides yn, yc, yh, yw) */
int tsr_max_pool2d_int8(const void *x, int es, int64_t N, int64_t C, int64_t H, int64_t W, int64_t sn, int64_t sc,
                        int64_t sh, int64_t sw, int kh, int kw, int st_h, int st_w, int pd_h, int pd_w, int dl_h,
                        int dl_w, int64_t Ho, int64_t Wo, void *y, int64_t yn, int64_t yc, int64_t yh, int64_t yw,
                        int nthreads) {
    const pool_t P = {N, C, H, W, sn, sc, sh, sw, Ho, Wo, yn, yc, yh, yw, kh, kw, st_h, st_w, pd_h, pd_w, dl_h, dl_w};
    const int64_t rows = N * Ho;
    TSR_TEAM(tsr_threads(nthreads), , {
_Pragma("omp for schedule(static)")
        for (int64_t r = 0; r < rows; r++) {
            if (es == 2) rows_i16((const int16_t *)x, (int16_t *)y, &P, r);
            else rows_i8((const int8_t *)x, (int8_t *)y, &P, r);
        }
    });
    return TSR_OK;
}
