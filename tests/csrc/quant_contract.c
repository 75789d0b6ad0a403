/* Test shim: csrc/tessera_quant.h's scalar rules applied element-wise, so
 * tests/test_quant_contract.py can compare them with tessera.quant.contract (torch). */
#include "tessera_quant.h"

int tsr_test_quant(const float *x, const float *scale, int64_t n, int kind, void *out) {
    for (int64_t i = 0; i < n; i++) {
        const float q = x[i] / scale[i];
        switch (kind) {
        case 0: ((int8_t *)out)[i] = (int8_t)tsr_quant_int(q, -127.0f, 127.0f); break;
        case 1: ((int16_t *)out)[i] = (int16_t)tsr_quant_int(q, -32767.0f, 32767.0f); break;
        case 2: ((uint8_t *)out)[i] = tsr_f32_to_e4m3(q); break;
        case 3: ((uint8_t *)out)[i] = tsr_f32_to_e5m2(q); break;
        default: return 1;
        }
    }
    return 0;
}

int tsr_test_fp8_decode(const uint8_t *b, int64_t n, int e5m2, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = e5m2 ? tsr_e5m2_to_f32(b[i]) : tsr_e4m3_to_f32(b[i]);
    return 0;
}

int tsr_test_absmax(const float *x, int64_t n, float *out) {
    *out = tsr_absmax(x, n);
    return 0;
}
