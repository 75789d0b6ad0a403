/* dequantize_blocks: out = dtype(fp32((q - zero) * scale)), bit-identical to ref.py.
 *
 * q: M rows of codes (row stride ldq elements of the code type): int8, int16, packed 4-bit
 * (byte j = c[2j] | c[2j+1] << 4, offset binary, zero 8 unless a uint8 zero is given) or fp8
 * bits (e4m3fn / e5m2 / e4m3fnuz, decoded exactly; NaN/inf codes decode to NaN/inf).  scale / zero are
 * [Mb, Kb] row-major over blocks of br rows x bc columns.  Each thread builds an fp32 row in
 * a scratch buffer (one multiply per value: (q - z) is exact, the product is rounded once)
 * and stores it converted to the output dtype (RNE), non-temporally for large outputs.
 */
#include "tessera_quant.h"

enum { DQ_I8 = 0, DQ_I16 = 1, DQ_I4 = 2, DQ_E4M3 = 3, DQ_E5M2 = 4, DQ_FNUZ = 5 };

/* AMD float8_e4m3fnuz bits -> fp32, exact (bias 8: the magnitude bits under fp32's exponent
 * field times 2^-119); 0x80 is the NaN. */
static inline float e4m3fnuz_to_f32(uint8_t b) {
    if (b == 0x80u) return NAN;
    const float m = tsr_float(((uint32_t)(b & 0x7fu)) << 20) * 0x1p119f;
    return (b & 0x80u) ? -m : m;
}

static void dequant_span(const void *restrict q, int64_t j0, int64_t n, int kind, float s, float z,
                         float *restrict out) {
    switch (kind) {
    case DQ_I8: {
        const int8_t *c = (const int8_t *)q + j0;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) out[i] = ((float)c[i] - z) * s;
        break;
    }
    case DQ_I16: {
        const int16_t *c = (const int16_t *)q + j0;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) out[i] = ((float)c[i] - z) * s;
        break;
    }
    case DQ_I4: {
        const uint8_t *c = (const uint8_t *)q;
        int64_t i = 0;
        if (j0 & 1) { out[0] = ((float)(c[j0 >> 1] >> 4) - z) * s; i = 1; }
        /* whole bytes: two values each (vectorises; the odd-position gather above does not) */
        const uint8_t *cb = c + ((j0 + i) >> 1);
        const int64_t nb = (n - i) >> 1;
        float *o = out + i;
#pragma omp simd
        for (int64_t b = 0; b < nb; b++) {
            o[2 * b] = ((float)(cb[b] & 15) - z) * s;
            o[2 * b + 1] = ((float)(cb[b] >> 4) - z) * s;
        }
        i += 2 * nb;
        if (i < n) out[i] = ((float)(c[(j0 + i) >> 1] & 15) - z) * s;
        break;
    }
    case DQ_E4M3: {
        const uint8_t *c = (const uint8_t *)q + j0;
        for (int64_t i = 0; i < n; i++) out[i] = tsr_e4m3_to_f32(c[i]) * s;
        break;
    }
    case DQ_E5M2: {
        const uint8_t *c = (const uint8_t *)q + j0;
        for (int64_t i = 0; i < n; i++) out[i] = tsr_e5m2_to_f32(c[i]) * s;
        break;
    }
    default: {
        const uint8_t *c = (const uint8_t *)q + j0;
        for (int64_t i = 0; i < n; i++) out[i] = e4m3fnuz_to_f32(c[i]) * s;
        break;
    }
    }
}

int tsr_dequantize_blocks(const void *q, int64_t ldq, int64_t M, int64_t K, int kind, const float *scale,
                          const uint8_t *zero, int64_t br, int64_t bc, int64_t Kb, void *out, int dtype,
                          int nt, int nthreads) {
    const int cs = kind == DQ_I16 ? 2 : 1;
    const int os = tsr_elsize(dtype);
    const float zdef = kind == DQ_I4 ? 8.0f : 0.0f;
    int err = 0;
    TSR_TEAM(tsr_threads(nthreads), reduction(| : err), {
        float *row = tsr_scratch(K + K / 2 + 16);   /* fp32 row + K halves for streaming stores */
_Pragma("omp for schedule(static)")
        for (int64_t i = 0; i < M; i++) {
            if (!row) { err = 1; continue; }
            const char *qr = (const char *)q + i * ldq * cs;
            const float *sc = scale + (i / br) * Kb;
            const uint8_t *zr = zero ? zero + (i / br) * Kb : NULL;
            /* fp32 with cached stores: straight into the output row; else via the scratch row */
            float *dst = (dtype == TSR_F32 && !nt) ? (float *)((char *)out + i * K * os) : row;
            for (int64_t kb = 0; kb < Kb; kb++) {
                const int64_t j0 = kb * bc, n = j0 + bc <= K ? bc : K - j0;
                const float z = zr ? (float)zr[kb] : zdef;
                dequant_span(qr, j0, n, kind, sc[kb], z, dst + j0);
            }
            if (dst == row) tsr_store_row((char *)out + i * K * os, row, K, dtype, nt, (uint16_t *)(row + K));
        }
        free(row);
    });
    if (nt) tsr_sfence();
    return err ? TSR_ENOMEM : TSR_OK;
}
