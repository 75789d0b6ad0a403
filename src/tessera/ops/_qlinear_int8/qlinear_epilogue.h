/* qlinear_epilogue.h -- the float epilogue every tessera quantised linear shares (C, portable).
 *
 *   y[j] = act(fp32(acc[j]) * (sx * sw[j]) + bias[j])      (this order, in fp32)
 *
 * acc: the exact integer accumulator (int32 or int64) of output j, sx the activation row's
 * scale, sw[j] the weight channel's scale (callers expand a per-tensor scale to [N]), bias
 * optional (NULL).  Kernels whose accumulator is already a float (W4A16, fp8) call
 * tsr_qepi_f32 with v = their fp32 value (scales applied) and get the same bias + activation.
 *
 * Activations (codes shared with the Python side, ref.ACT_CODE):
 *   0 none, 1 relu (NaN stays NaN), 2 gelu (erf), 3 gelu_tanh, 4 silu.
 * gelu uses Phi(v) = erfc(|v|/sqrt2)/2 for v < 0 and 1 - erfc(|v|/sqrt2)/2 otherwise with the
 * Abramowitz & Stegun 7.1.26 form t P(t) exp(-a^2) (|error| <= 1.5e-7, as tessera_cpu.h's
 * tsr_erff), so there is no 1 + erf(v) cancellation for negative v; gelu_tanh is
 * v * sigmoid(2u), u = sqrt(2/pi) (v + 0.044715 v^3) (exactly 0.5 v (1 + tanh u), no
 * cancellation); silu is v * sigmoid(v).  The loops are plain C that compilers vectorise.
 *
 * Include after tessera_cpu.h (or tessera_quant.h).
 */
#ifndef TESSERA_QLINEAR_EPILOGUE_H
#define TESSERA_QLINEAR_EPILOGUE_H

enum { TSR_ACT_NONE = 0, TSR_ACT_RELU = 1, TSR_ACT_GELU = 2, TSR_ACT_GELU_TANH = 3, TSR_ACT_SILU = 4 };

static inline float tsr_qact(float v, const int act) {
    if (act == TSR_ACT_RELU) return v < 0.0f ? 0.0f : v;
    if (act == TSR_ACT_GELU) {
        const float a = fabsf(v) * 0.70710678118654752f;
        const float t = 1.0f / (1.0f + 0.3275911f * a);
        const float p = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f +
                        t * (-1.453152027f + t * 1.061405429f))));
        const float h = 0.5f * p * tsr_expf(-a * a);   /* Phi(-|v|) */
        return v * (v < 0.0f ? h : 1.0f - h);
    }
    if (act == TSR_ACT_GELU_TANH) {
        const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
        return v / (1.0f + tsr_expf(-2.0f * u));
    }
    if (act == TSR_ACT_SILU) return v / (1.0f + tsr_expf(-v));
    return v;
}

/* out[j] = act(v[j] + bias[j]) for j < n (in place allowed: out == v); bias may be NULL.  act is a compile-time constant
 * in callers that instantiate per activation (tsr_qepi_* switch on it once per row). */
static inline __attribute__((always_inline)) void tsr_qepi_f32_act(const float *v, int64_t n,
        const float *restrict bias, float *out, const int act) {
    if (bias) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) out[j] = tsr_qact(v[j] + bias[j], act);
    } else {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) out[j] = tsr_qact(v[j], act);
    }
}

static inline void tsr_qepi_f32(const float *v, int64_t n, const float *restrict bias, float *out, int act) {
    switch (act) {
    case TSR_ACT_RELU: tsr_qepi_f32_act(v, n, bias, out, TSR_ACT_RELU); break;
    case TSR_ACT_GELU: tsr_qepi_f32_act(v, n, bias, out, TSR_ACT_GELU); break;
    case TSR_ACT_GELU_TANH: tsr_qepi_f32_act(v, n, bias, out, TSR_ACT_GELU_TANH); break;
    case TSR_ACT_SILU: tsr_qepi_f32_act(v, n, bias, out, TSR_ACT_SILU); break;
    default: tsr_qepi_f32_act(v, n, bias, out, TSR_ACT_NONE); break;
    }
}

/* out[j] = act(fp32(acc[j]) * (sx * sw[j]) + bias[j]) from int32 accumulators */
static inline void tsr_qepi_i32(const int32_t *restrict acc, int64_t n, float sx, const float *restrict sw,
                                const float *restrict bias, int act, float *restrict out) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) out[j] = (float)acc[j] * (sx * sw[j]);
    tsr_qepi_f32(out, n, bias, out, act);
}

/* the same from int64 accumulators (A16W8) */
static inline void tsr_qepi_i64(const int64_t *restrict acc, int64_t n, float sx, const float *restrict sw,
                                const float *restrict bias, int act, float *restrict out) {
    for (int64_t j = 0; j < n; j++) out[j] = (float)acc[j] * (sx * sw[j]);
    tsr_qepi_f32(out, n, bias, out, act);
}

#endif
