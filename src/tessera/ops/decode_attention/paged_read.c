/* The paged read: a plain read of exactly the bytes decode_attention must read, and nothing
 * else -- the K and V rows (all kv heads) of every attended token, and their int8/fp8 scales --
 * in the order the NHD page layout allows, with no compute.  `tessera bench` times it in each
 * decode row's loop (OpSpec.layout_read) beside the read pass over one linear buffer.
 *
 * Why: pages scattered by the block table read slower than one linear buffer -- on the 2-core
 * Zen4 VM a read through a shuffled table of 16-token (32 KiB) pages reached ~25 GB/s where the
 * same bytes in page order (or one buffer) gave ~42, as each page restarts the hardware
 * prefetcher's stream.  This pass states what the memory system gives for the op's layout, so
 * a decode row can be judged against both.
 *
 * Order: token-major through the block table, each token's whole K row then V row (Hk * D
 * contiguous elements), 64 bytes per load, with the rows of the token one page ahead (at least
 * 16 tokens) prefetched -- the fastest plain read measured for NHD pages (2 threads, B = 1 x
 * 16384 tokens, 8 x 128 heads: bf16 ~equal with or without the prefetch, int8 (16 KiB pages)
 * 22 -> 30-35 GB/s with it; head-major and page-interleaved orders were slower).  Tasks are
 * (sequence, split) with the kernel's split rule (splits.h), dynamic over threads.
 * Returns the xor of all 8-byte words read (a row's tail padded with zero bytes), so a test
 * can check from the host that exactly the attended rows were read. */
#include <stdint.h>
#include <string.h>

#include "splits.h"
#include "tessera_cpu.h"

typedef uint64_t rd_v8u __attribute__((vector_size(64)));

static uint64_t rd_row(const char *p, int64_t n) {
    rd_v8u a = {0}, b = {0};
    int64_t i = 0;
    for (; i + 128 <= n; i += 128) { /* two independent chains */
        rd_v8u x, y;
        memcpy(&x, p + i, 64);
        memcpy(&y, p + i + 64, 64);
        a ^= x;
        b ^= y;
    }
    a ^= b;
    uint64_t r = 0;
    for (int k = 0; k < 8; k++) r ^= a[k];
    for (; i < n; i += 8) {
        uint64_t w = 0;
        memcpy(&w, p + i, n - i < 8 ? (size_t)(n - i) : 8);
        r ^= w;
    }
    return r;
}

/* kc, vc: (NB, P, Hk, D) of es-byte elements; ks, vs: (NB, P, Hk) float32 or NULL; bt (B, MB);
 * indices are assumed checked (the bench calls it on inputs the op accepted). */
uint64_t tsr_decode_paged_read(const char *kc, const char *vc, const char *ks, const char *vs, const int32_t *bt,
                               const int32_t *seq_lens, int64_t B, int64_t Hk, int64_t D, int64_t P, int64_t MB,
                               int64_t es, int64_t window, int nthreads) {
    int64_t most = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t k = seq_lens[b] - da_first_key(seq_lens[b], window);
        most = k > most ? k : most;
    }
    const int64_t S = da_splits(B, nthreads, most), rb = Hk * D * es;
    const int64_t ahead = P >= 16 ? P : 16; /* prefetch distance in tokens */
    uint64_t x = 0;
#pragma omp parallel for num_threads(tsr_threads(nthreads)) schedule(dynamic, 1) reduction(^ : x)
    for (int64_t task = 0; task < B * S; task++) {
        const int64_t b = task / S;
        int64_t t0, t1;
        da_split_keys(seq_lens[b], window, S, task % S, &t0, &t1);
        for (int64_t t = t0; t < t1; t++) {
            const int64_t row = (int64_t)bt[b * MB + t / P] * P + t % P;
            if (t + ahead < t1) {
                const int64_t nr = (int64_t)bt[b * MB + (t + ahead) / P] * P + (t + ahead) % P;
                for (int64_t o = 0; o < rb; o += 64) {
                    __builtin_prefetch(kc + nr * rb + o, 0, 2);
                    __builtin_prefetch(vc + nr * rb + o, 0, 2);
                }
            }
            x ^= rd_row(kc + row * rb, rb) ^ rd_row(vc + row * rb, rb);
            if (ks) x ^= rd_row(ks + row * Hk * 4, Hk * 4) ^ rd_row(vs + row * Hk * 4, Hk * 4);
        }
    }
    return x;
}
