/* splits.h -- which keys decode_attention reads and how it cuts them into splits (tasks =
 * sequence x split), shared by the kernel (decode_attention.c) and the bench's layout read (paged_read.c),
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
/* the first key sequence n attends to: with a window, only its last `window` keys */
static inline int64_t da_first_key(int64_t n, int64_t window) { return window > 0 && n > window ? n - window : 0; }

/* keys [*t0, *t1) of split sp of S of a sequence of n keys (empty past the last key) */
static inline void da_split_keys(int64_t n, int64_t window, int64_t S, int64_t sp, int64_t *t0, int64_t *t1) {
    const int64_t lo = da_first_key(n, window), per = (n - lo + S - 1) / S;
    *t0 = lo + sp * per;
    *t1 = *t0 + per < n ? *t0 + per : n;
}
#endif
