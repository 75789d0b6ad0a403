/* append_kv: write new K/V tokens into a paged cache, in place.
 *
 * One work item = one (sequence b, new token i, kv head h) vector of D values, written to
 * row ((page * P + slot) * Hk + h) of the cache, page = block_table[b, t / P], slot = t % P,
 * t = positions[b] + i.  The host has validated every index (positions, table entries).
 *
 * Float caches: convert (round to nearest even, as torch's .to()).  int8 / float8_e4m3fn
 * caches: the integer contract of ref.py, computed in fp32 exactly as specified so every
 * backend agrees bit for bit --
 *   amax = max |x| (NaN counts as 0), scale = max(amax, 1e-12f) / QMAX (IEEE division),
 *   q = x / scale (IEEE division: this file is built without -ffast-math/-freciprocal-math,
 *   so the compiler keeps the divides), NaN -> 0, clamp to +-QMAX, then
 *   int8: rintf (round half to even in the default rounding mode), e4m3fn: fp8_rne below.
 */
#include "tessera_cpu.h"

enum { AKV_I8 = 8, AKV_F8 = 9 };

/* fp32 (|q| <= 448, not NaN) -> OCP e4m3fn bits, round to nearest even, subnormals included. */
static inline uint8_t fp8_e4m3_rne(float q) {
    const float a = fabsf(q);
    const uint32_t u = tsr_bits(a), sign = (tsr_bits(q) >> 24) & 0x80u;
    uint32_t code;
    if (a < 0.015625f) {                      /* below 2^-6: multiples of 2^-9 (8 -> min normal) */
        code = (uint32_t)rintf(a * 512.0f);
    } else {
        const uint32_t r = u + 0x7ffffu + ((u >> 20) & 1u);   /* RNE to 3 mantissa bits */
        code = (((r >> 23) - 120u) << 3) | ((r >> 20) & 7u);
    }
    return (uint8_t)(code | sign);
}

static void quant_row(const float *x, int64_t D, int fmt, void *dst, float *scale_out) {
    float amax = 0.0f;
    for (int64_t d = 0; d < D; d++) {
        float a = fabsf(x[d]);
        a = a != a ? 0.0f : a;
        amax = a > amax ? a : amax;
    }
    const float qmax = fmt == AKV_I8 ? 127.0f : 448.0f;
    const float scale = fmaxf(amax, 1e-12f) / qmax;
    *scale_out = scale;
    if (fmt == AKV_I8) {
        int8_t *o = (int8_t *)dst;
#pragma omp simd
        for (int64_t d = 0; d < D; d++) {
            float q = x[d] / scale;
            q = q != q ? 0.0f : q;
            q = q < -127.0f ? -127.0f : (q > 127.0f ? 127.0f : q);
            o[d] = (int8_t)(int)rintf(q);
        }
    } else {
        uint8_t *o = (uint8_t *)dst;
        for (int64_t d = 0; d < D; d++) {
            float q = x[d] / scale;
            q = q != q ? 0.0f : q;
            q = q < -448.0f ? -448.0f : (q > 448.0f ? 448.0f : q);
            o[d] = fp8_e4m3_rne(q);
        }
    }
}

static int cache_elsize(int c) { return c == AKV_I8 || c == AKV_F8 ? 1 : tsr_elsize(c); }

/* x: (B, n, Hk, D) contiguous of x_dtype; cache (NB, P, Hk, D) of c_dtype; scale (NB, P, Hk) or NULL */
int tsr_append_kv(const void *x, void *cache, float *scale, const int32_t *bt, const int32_t *pos,
                  int64_t B, int64_t n, int64_t Hk, int64_t D, int64_t P, int64_t MB,
                  int x_dtype, int c_dtype, int nthreads) {
    const int xs = tsr_elsize(x_dtype), cs = cache_elsize(c_dtype);
    const int64_t rows = B * n * Hk;
    int failed = 0;
#pragma omp parallel num_threads(tsr_threads(nthreads)) reduction(| : failed)
    {
        float *buf = tsr_scratch(D);
        if (!buf) failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf) continue;
            const int64_t h = r % Hk, bi = r / Hk, b = bi / n, i = bi % n;
            const int64_t t = (int64_t)pos[b] + i;
            const int64_t crow = ((int64_t)bt[b * MB + t / P] * P + t % P) * Hk + h;
            tsr_load_f32(buf, (const char *)x + r * D * xs, D, x_dtype);
            char *dst = (char *)cache + crow * D * cs;
            if (c_dtype == AKV_I8 || c_dtype == AKV_F8) quant_row(buf, D, c_dtype, dst, scale + crow);
            else tsr_store_conv(dst, buf, D, c_dtype);
        }
        free(buf);
    }
    return failed ? TSR_ENOMEM : TSR_OK;
}
