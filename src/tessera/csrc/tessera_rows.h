/* tessera_rows.h -- shared scaffolding of the row-wise norm kernels (rms_norm.c, layer_norm.c).
 *
 * Row loops are instantiated per dtype and per optional input with constant arguments, so
 * the compiler specialises each (no per-element branches on dtype or on "has residual").
 */
#ifndef TESSERA_ROWS_H
#define TESSERA_ROWS_H

#include "tessera_cpu.h"

#define ROWS static inline __attribute__((always_inline)) void
/* fn(args..., flag, dtype) with flag and dtype as compile-time constants; bf16 uses the
 * AVX512_BF16 store conversion (TSR_BF16HW) where the CPU has it */
#define DISPATCH_DT(fn, dtype, flag, ...)                                         \
    do {                                                                          \
        if ((dtype) == TSR_F32) fn(__VA_ARGS__, flag, TSR_F32);                   \
        else if ((dtype) == TSR_F16) fn(__VA_ARGS__, flag, TSR_F16);              \
        else if (tsr_bf16_hw()) fn(__VA_ARGS__, flag, TSR_BF16HW);                \
        else fn(__VA_ARGS__, flag, TSR_BF16);                                     \
    } while (0)
#define DISPATCH(fn, dtype, flag, ...)                                            \
    do {                                                                          \
        if (flag) DISPATCH_DT(fn, dtype, 1, __VA_ARGS__);                         \
        else DISPATCH_DT(fn, dtype, 0, __VA_ARGS__);                              \
    } while (0)

/* Rows are handed out in chunks of contiguous rows, dynamically: a thread that loses its
 * core for a scheduler tick (2-core machines shared with other work) does not hold the
 * others back, and each chunk is still a contiguous stream. */
static inline int64_t chunk_rows(int64_t M, int T) {
    int64_t c = M / (8 * (int64_t)T);
    return c < 1 ? 1 : (c > 32 ? 32 : c);
}

#endif /* TESSERA_ROWS_H */
