/* splits.h -- how decode_attention cuts each sequence's keys into splits (tasks = sequence x
 * split), shared by the kernel (decode_attention.c) and the bench's layout read (paged_read.c),
 * which must read in the same tasks to be a like-for-like reference. */
#ifndef TESSERA_DECODE_SPLITS_H
#define TESSERA_DECODE_SPLITS_H
#include <stdint.h>

/* at least ~4 tasks per thread over the B sequences, but no split shorter than ~256 keys
 * (most_keys: the most keys any sequence attends to) */
static inline int64_t da_splits(int64_t B, int nthreads, int64_t most_keys) {
    const int64_t want = (4 * (int64_t)nthreads + B - 1) / B, cap = most_keys / 256 > 1 ? most_keys / 256 : 1;
    return want < cap ? want : cap;
}
#endif
