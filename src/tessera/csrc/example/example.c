/* example.c -- calling the tessera C library (written by `tessera build`) from plain C.
 *
 *   CC example.c libtessera.a -lm -o example && ./example
 *
 * RMSNorm of a 3 x 37 fp32 matrix against a plain C loop (fp32 statistics, tolerance 1e-5
 * relative), then an int8 per-row quantize -> dequantize round trip: every code must be the
 * round-half-to-even of x / scale with scale = max|row| / 127, and dequantize must give code * scale
 * exactly; then linear_w8a8 (tsr_qi8_mm: fp32 activations quantized per row to int8, int8 weights
 * with per-channel scales, int32 sums) on rows whose max |x| is 127, so the activation scale is
 * exactly 1 and the result must be the integer dot product times the weight scale.  Exit status 0
 * and "tessera example: ok" when everything matches.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tessera.h"

enum { M = 3, N = 37 };

static int fail(const char *what, int i, double got, double want) {
    printf("tessera example: %s mismatch at %d: got %.9g, want %.9g\n", what, i, got, want);
    return 1;
}

int main(void) {
    float x[M * N], w[N], y[M * N], rstd[M], scale[M], back[M * N];
    int8_t codes[M * N];
    for (int i = 0; i < M * N; i++) x[i] = (float)sin(0.37 * i) * (1.0f + (float)(i % 5));
    for (int j = 0; j < N; j++) w[j] = 0.5f + 0.01f * (float)j;

    int rc = tsr_rms_norm_fwd(x, N, NULL, 0, w, y, NULL, rstd, M, N, 1e-6f, TSR_F32, 0, 1);
    if (rc != TSR_OK) { printf("tessera example: rms_norm returned %d\n", rc); return 1; }
    for (int i = 0; i < M; i++) {
        double ss = 0.0;
        for (int j = 0; j < N; j++) ss += (double)x[i * N + j] * x[i * N + j];
        double r = 1.0 / sqrt(ss / N + 1e-6);
        for (int j = 0; j < N; j++) {
            double want = x[i * N + j] * r * w[j];
            if (fabs(y[i * N + j] - want) > 1e-5 * (fabs(want) + 1e-3)) return fail("rms_norm", i * N + j, y[i * N + j], want);
        }
    }

    /* int8, one scale per row (block_rows 1, whole-row blocks: bc = N), no zero points */
    rc = tsr_quantize_blocks(x, N, M, N, TSR_F32, TSR_Q_INT8, 1, N, M, 1, codes, scale, NULL, 1);
    if (rc != TSR_OK) { printf("tessera example: quantize returned %d\n", rc); return 1; }
    for (int i = 0; i < M; i++) {
        float amax = 0.0f;
        for (int j = 0; j < N; j++) amax = fmaxf(amax, fabsf(x[i * N + j]));
        if (fabsf(scale[i] - amax / 127.0f) > 1e-6f * amax) return fail("scale", i, scale[i], amax / 127.0f);
        for (int j = 0; j < N; j++) {
            float want = nearbyintf(x[i * N + j] / scale[i]);   /* default rounding: half to even */
            if (codes[i * N + j] != (int8_t)want) return fail("int8 code", i * N + j, codes[i * N + j], want);
        }
    }
    rc = tsr_dequantize_blocks(codes, N, M, N, TSR_DQ_INT8, scale, NULL, 1, N, 1, back, TSR_F32, 0, 1);
    if (rc != TSR_OK) { printf("tessera example: dequantize returned %d\n", rc); return 1; }
    for (int i = 0; i < M * N; i++)
        if (back[i] != (float)codes[i] * scale[i / N]) return fail("dequantize", i, back[i], codes[i] * scale[i / N]);

    /* linear_w8a8: y[i, n] = (sum_k q(x)[i, k] * wq[n, k]) * sx[i] * ws[n], q(x) = x here (sx = 1) */
    enum { NO = 5 };
    float xa[M * N], ws[NO], ya[M * NO];
    int8_t wq[NO * N];
    for (int i = 0; i < M * N; i++) xa[i] = (float)((i * 37 + 11) % 255 - 127);
    for (int i = 0; i < M; i++) xa[i * N + i] = (i % 2) ? -127.0f : 127.0f;   /* max |row| = 127 */
    for (int i = 0; i < NO * N; i++) wq[i] = (int8_t)((i * 53 + 7) % 255 - 127);
    for (int n = 0; n < NO; n++) ws[n] = 0.01f * (float)(n + 1);
    /* vnni_ok = 1: the CPU's own dot-product instructions where it has them (x86 AVX512-VNNI,
     * Arm SDOT/SMMLA, chosen at run time), the portable loops elsewhere; 0 forces the portable loops */
    rc = tsr_qi8_mm(xa, N, TSR_F32, 8, M, N, wq, NO, ws, NULL, 0, ya, TSR_F32, 1, 1);
    if (rc != TSR_OK) { printf("tessera example: linear_w8a8 returned %d\n", rc); return 1; }
    for (int i = 0; i < M; i++)
        for (int n = 0; n < NO; n++) {
            /* volatile keeps this check loop scalar: qemu 7.2's RVV translator aborts
             * (decode_save_opc assertion) on clang 19's vectorised form of it */
            volatile long acc = 0;
            for (int k = 0; k < N; k++) acc += (long)xa[i * N + k] * wq[n * N + k];
            float want = (float)acc * ws[n];
            if (fabsf(ya[i * NO + n] - want) > 1e-6f * fabsf(want)) return fail("linear_w8a8", i * NO + n, ya[i * NO + n], want);
        }
    printf("tessera example: ok\n");
    return 0;
}
