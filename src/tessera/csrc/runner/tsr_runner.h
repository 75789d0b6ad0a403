/* tsr_runner.h -- the kernel table the runner serves (generated: tsr_runner_table.c).
 *
 * Each entry names a C kernel entry point, the kinds of its arguments in order ('l' int64,
 * 'i' int32, 'f' float, 'r' input pointer, 'w' output pointer, 'u' in-out pointer) and a
 * trampoline that calls it with the decoded arguments.
 */
#ifndef TSR_RUNNER_H
#define TSR_RUNNER_H
#include <stdint.h>

typedef union { void *p; int64_t l; int32_t i; float f; } tsr_arg;
typedef struct {
    const char *name;
    const char *kinds;
    int (*call)(const tsr_arg *a);
} tsr_kernel;

extern const tsr_kernel tsr_kernels[];
extern const int tsr_nkernels;
#endif
