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
 *   int8: rintf (round half to even in the default rounding mode), e4m3fn: RNE encode
 *   (both in csrc/tessera_quant.h, shared with the quantisation kernels).
 */
#include "tessera_quant.h"

enum { AKV_I8 = 8, AKV_F8 = 9 };

static void quant_row(const float *x, int64_t D, int fmt, void *dst, float *scale_out) {
    const float qmax = fmt == AKV_I8 ? 127.0f : 448.0f;
    const float scale = tsr_scale_for(tsr_absmax(x, D), qmax);
    *scale_out = scale;
    if (fmt == AKV_I8) {
        int8_t *o = (int8_t *)dst;
        int64_t d = 0;   /* NEON / RVV codes: the same integers (tessera_neon.h, tessera_rvv.h) */
#if defined(TSR_NEON)
        d = tsr_neon_quant_ints(x, D, scale, -127.0f, 127.0f, 0, 0, o);
#elif defined(TSR_RVV)
        d = tsr_rvv_quant_ints(x, D, scale, -127.0f, 127.0f, 0, 0, o);
#endif
        for (; d < D; d++) o[d] = (int8_t)tsr_quant_int(x[d] / scale, -127.0f, 127.0f);
    } else {
        uint8_t *o = (uint8_t *)dst;
        for (int64_t d = 0; d < D; d++) o[d] = tsr_f32_to_e4m3(x[d] / scale);
    }
}

static int cache_elsize(int c) { return c == AKV_I8 || c == AKV_F8 ? 1 : tsr_elsize(c); }

/* x: (B, n, Hk, D) contiguous of x_dtype; cache (NB, P, Hk, D) of c_dtype; scale (NB, P, Hk) or NULL;
 * TSR_EINVAL (nothing written) when an index is out of range */
/* Every position and block-table entry this call writes through, checked before anything is
 * written (the launcher then runs the host check, which names the bad value): positions[b] in
 * [0, MB * P - n], the table entries of pages [pos / P, (pos + n - 1) / P] in [0, NB). */
static int indices_ok(const int32_t *bt, const int32_t *pos, int64_t B, int64_t n, int64_t P, int64_t MB,
                      int64_t NB) {
    for (int64_t b = 0; b < B; b++) {
        const int64_t p = pos[b];
        if (p < 0 || p + n > MB * P) return 0;
        for (int64_t j = p / P; n > 0 && j <= (p + n - 1) / P; j++)
            if (bt[b * MB + j] < 0 || bt[b * MB + j] >= NB) return 0;
    }
    return 1;
}

int tsr_append_kv(const void *x, void *cache, float *scale, const int32_t *bt, const int32_t *pos,
                  int64_t B, int64_t n, int64_t Hk, int64_t D, int64_t P, int64_t MB, int64_t NB,
                  int x_dtype, int c_dtype, int nthreads) {
    if (!indices_ok(bt, pos, B, n, P, MB, NB)) return TSR_EINVAL;
    const int xs = tsr_elsize(x_dtype), cs = cache_elsize(c_dtype);
    const int64_t rows = B * n * Hk;
    int failed = 0;
    TSR_TEAM(tsr_threads(nthreads), reduction(| : failed), {
        float *buf = tsr_scratch(D);
        if (!buf) failed = 1;
_Pragma("omp for schedule(static)")
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
    });
    return failed ? TSR_ENOMEM : TSR_OK;
}
