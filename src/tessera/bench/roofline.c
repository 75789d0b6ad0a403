/* roofline.c -- memory-bandwidth probe for `tessera bench` (framework-free C).
 *
 * The roofline of a memory-bound op is the rate at which this machine can move
 * bytes between DRAM and the cores.  We measure it the way the fused kernels
 * move data: each thread copies one contiguous slice of src to dst, loading
 * normally and storing with non-temporal (streaming) stores, so the
 * destination lines are never read first (an ordinary store costs a
 * read-for-ownership: 3 bytes of traffic per 2 bytes copied).  The caller
 * counts bytes read + bytes written, the same convention as OpSpec.bytes_*.
 *
 * A plain-store copy is provided too, so the report can show what NT stores buy.
 */
#include "tessera_cpu.h"

/* Slices are cut at 4 KiB so two threads never share a page or a cache line. */
static void tsr_bench_slice(int64_t bytes, int nthreads, int tid, int64_t *start, int64_t *len) {
    int64_t pages = (bytes + 4095) / 4096;
    int64_t per = (pages + nthreads - 1) / nthreads;
    int64_t s = (int64_t)tid * per * 4096;
    int64_t e = s + per * 4096;
    if (s > bytes) s = bytes;
    if (e > bytes) e = bytes;
    *start = s;
    *len = e - s;
}

/* Each thread copies its slice `reps` times with `copy`; the join drains the stores. */
typedef void (*tsr_copy_fn)(char *, const char *, int64_t);

static int tsr_bench_run(tsr_copy_fn copy, void *dst, const void *src, int64_t bytes, int64_t reps,
                         int threads) {
    if (bytes < 0 || reps < 0) return TSR_EINVAL;
    int nt = tsr_threads(threads);
    for (int64_t r = 0; r < reps; r++) {
#pragma omp parallel num_threads(nt)
        {
            int tid = 0, n = 1;
#ifdef _OPENMP
            tid = omp_get_thread_num();
            n = omp_get_num_threads();
#endif
            int64_t s, len;
            tsr_bench_slice(bytes, n, tid, &s, &len);
            if (len > 0) copy((char *)dst + s, (const char *)src + s, len);
        }
    }
    return TSR_OK;
}

/* streaming stores are weakly ordered: drain them before the join */
static void tsr_bench_nt(char *d, const char *s, int64_t n) {
    tsr_stream_copy(d, s, n);
    tsr_sfence();
}

/* Copy `bytes` from src to dst `reps` times with streaming stores; returns TSR_OK. */
int tsr_bench_copy_nt(void *dst, const void *src, int64_t bytes, int64_t reps, int threads) {
    return tsr_bench_run(tsr_bench_nt, dst, src, bytes, reps, threads);
}

/* Ordinary (write-allocate) stores.  Not memcpy: glibc switches to streaming stores
 * above a cache-sized threshold, which would hide the difference we want to show. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
static void tsr_bench_plain(char *restrict d, const char *restrict s, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 64 <= n; i += 64) _mm512_storeu_si512((void *)(d + i), _mm512_loadu_si512((const void *)(s + i)));
#elif defined(__AVX2__)
    for (; i + 32 <= n; i += 32)
        _mm256_storeu_si256((__m256i *)(d + i), _mm256_loadu_si256((const __m256i *)(s + i)));
#else
    for (; i + 8 <= n; i += 8) { uint64_t v; memcpy(&v, s + i, 8); memcpy(d + i, &v, 8); }
#endif
    for (; i < n; i++) d[i] = s[i];
}

/* Same slicing, ordinary stores: the rate a kernel without NT stores sees. */
int tsr_bench_copy_plain(void *dst, const void *src, int64_t bytes, int64_t reps, int threads) {
    return tsr_bench_run(tsr_bench_plain, dst, src, bytes, reps, threads);
}

/* Read-only probe: each thread reads its slice as four interleaved streams (more misses in
 * flight than one stream: measured ~5% faster here) and folds it into a xor that is stored, so
 * no load is dead.  The ceiling of ops whose traffic is all reads (a KV cache or a weight
 * matrix streamed once): on this VM reads alone peak lower than an NT copy's read + write. */
static uint64_t tsr_bench_sink;

static uint64_t tsr_bench_read_slice(const char *s, int64_t n) {
    typedef uint64_t v8u __attribute__((vector_size(64)));
    v8u a = {0}, b = {0}, c = {0}, d = {0};
    const int64_t q = n / 256 * 64; /* four streams of q bytes, 64-byte steps */
    for (int64_t i = 0; i < q; i += 64) {
        v8u x, y, z, w;
        memcpy(&x, s + i, 64);
        memcpy(&y, s + q + i, 64);
        memcpy(&z, s + 2 * q + i, 64);
        memcpy(&w, s + 3 * q + i, 64);
        a ^= x; b ^= y; c ^= z; d ^= w;
    }
    a ^= b ^ c ^ d;
    uint64_t r = 0;
    for (int k = 0; k < 8; k++) r ^= a[k];
    for (int64_t i = 4 * q; i < n; i++) r ^= (uint8_t)s[i];
    return r;
}

/* one thread's slice of the read pass (dst unused); the xor lands in the sink */
static void tsr_bench_rd(char *d, const char *s, int64_t n) {
    (void)d;
    __atomic_fetch_xor(&tsr_bench_sink, tsr_bench_read_slice(s, n), __ATOMIC_RELAXED);
}

/* Read `bytes` of src `reps` times on `threads` threads (same slicing as the copies); TSR_OK. */
int tsr_bench_read(const void *src, int64_t bytes, int64_t reps, int threads) {
    return tsr_bench_run(tsr_bench_rd, (void *)src, src, bytes, reps, threads);
}

/* The fp32 FMA peak: `iters` steps of 12 independent register-resident multiply-adds of the
 * widest vector the ISA level has (12 chains cover 2 pipes x 4-cycle latency with room), on
 * every thread.  No memory traffic, nothing but FMAs: the ceiling no kernel can pass, against
 * which a compute-bound op's (and torch.matmul's) fraction is stated.  Returns the floats per
 * chain (16: tsr_v16); FLOPs = 2 * 12 * 16 * iters * threads. */
int tsr_bench_fma_peak(int64_t iters, int threads) {
    const int nt = tsr_threads(threads);
    float x = 0.0f;
#pragma omp parallel num_threads(nt) reduction(+ : x)
    {
        const tsr_v16 m = (tsr_v16){0} + 0.999999f, c = (tsr_v16){0} + 1e-7f;
        tsr_v16 a0 = m, a1 = m + 1, a2 = m + 2, a3 = m + 3, a4 = m + 4, a5 = m + 5;
        tsr_v16 a6 = m + 6, a7 = m + 7, a8 = m + 8, a9 = m + 9, a10 = m + 10, a11 = m + 11;
        for (int64_t i = 0; i < iters; i++) {
            a0 = a0 * m + c; a1 = a1 * m + c; a2 = a2 * m + c; a3 = a3 * m + c; a4 = a4 * m + c; a5 = a5 * m + c;
            a6 = a6 * m + c; a7 = a7 * m + c; a8 = a8 * m + c; a9 = a9 * m + c; a10 = a10 * m + c; a11 = a11 * m + c;
        }
        const tsr_v16 s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)) + ((a8 + a9) + (a10 + a11));
        for (int k = 0; k < 16; k++) x += s[k];
    }
    tsr_bench_sink = (uint64_t)x;
    return 16;
}

/* ------------------------------------------------------------------ bf16 / int8 / AMX peaks
 * The ceilings of compute-bound rows whose arithmetic is not fp32 FMAs, measured the same way:
 * register-only loops of the one instruction such a kernel's inner loop is built on, 12
 * independent accumulators (latency 5-6 cycles x up to 2 ports), on every thread.
 *   tsr_bench_bf16_peak: VDPBF16PS zmm (AVX512_BF16): 16 lanes x 2 bf16 products + 2 adds
 *                        = 64 FLOPs per instruction;
 *   tsr_bench_int8_peak: VPDPBUSD zmm (AVX512_VNNI, 128 ops: 16 lanes x 4 u8*s8 products + 4
 *                        adds) or, where only AVX-VNNI exists, {vex} VPDPBUSD ymm (64 ops);
 *   tsr_bench_amx_peak:  TDPBF16PS / TDPBUSD on 4 accumulator tiles (16 x 16 fp32/int32 from
 *                        16 x 32 bf16 / 16 x 64 int8 tiles: 16384 / 32768 ops per instruction),
 *                        after asking the kernel for the tile state (ARCH_REQ_XCOMP_PERM).
 * Inline asm, like the kernels' own VDPBF16PS (tessera_cpu.h): the library is built for the
 * ISA level, not for these extensions, and each probe runs only where the CPU reports the
 * feature (the Python side checks /proc/cpuinfo as well, and says "not present").  Each returns
 * the ops per loop step per thread (ops = return * iters * threads), or TSR_ENOTSUP.
 * The accumulators grow by at most 4 per step: no overflow for iters < 2^28. */
enum { TSR_ENOTSUP = -3 };

#define TSR_Z12(op, a, b)                                                                          \
    op " " a ", " b ", %%zmm0\n\t" op " " a ", " b ", %%zmm1\n\t" op " " a ", " b ", %%zmm2\n\t"        \
    op " " a ", " b ", %%zmm3\n\t" op " " a ", " b ", %%zmm4\n\t" op " " a ", " b ", %%zmm5\n\t"        \
    op " " a ", " b ", %%zmm6\n\t" op " " a ", " b ", %%zmm7\n\t" op " " a ", " b ", %%zmm8\n\t"        \
    op " " a ", " b ", %%zmm9\n\t" op " " a ", " b ", %%zmm10\n\t" op " " a ", " b ", %%zmm11\n\t"
#define TSR_Y12(op, a, b)                                                                          \
    op " " a ", " b ", %%ymm0\n\t" op " " a ", " b ", %%ymm1\n\t" op " " a ", " b ", %%ymm2\n\t"        \
    op " " a ", " b ", %%ymm3\n\t" op " " a ", " b ", %%ymm4\n\t" op " " a ", " b ", %%ymm5\n\t"        \
    op " " a ", " b ", %%ymm6\n\t" op " " a ", " b ", %%ymm7\n\t" op " " a ", " b ", %%ymm8\n\t"        \
    op " " a ", " b ", %%ymm9\n\t" op " " a ", " b ", %%ymm10\n\t" op " " a ", " b ", %%ymm11\n\t"
#define TSR_CLOB12(r) r "0", r "1", r "2", r "3", r "4", r "5", r "6", r "7", r "8", r "9", r "10", r "11"

#if defined(__x86_64__) && defined(__GNUC__)
/* one thread's loop: zmm12/13 hold the operands (bf16 1.0 pairs / bytes of 1), zmm0-11 the sums */
static void tsr_bench_zmm_loop(int64_t iters, int bf16) {
    int64_t n = iters;
    uint32_t one = bf16 ? 0x3f803f80u : 0x01010101u;
    if (n <= 0) return;
    if (bf16)
        __asm__ volatile("vpbroadcastd %k1, %%zmm12\n\tvpbroadcastd %k1, %%zmm13\n\t"
                         "vpxord %%zmm0, %%zmm0, %%zmm0\n\tvmovaps %%zmm0, %%zmm1\n\t"
                         "1:\n\t" TSR_Z12("vdpbf16ps", "%%zmm13", "%%zmm12") "dec %0\n\tjnz 1b\n\t"
                         : "+r"(n) : "r"(one) : TSR_CLOB12("xmm"), "xmm12", "xmm13", "cc");
    else
        __asm__ volatile("vpbroadcastd %k1, %%zmm12\n\tvpbroadcastd %k1, %%zmm13\n\t"
                         "1:\n\t" TSR_Z12("vpdpbusd", "%%zmm13", "%%zmm12") "dec %0\n\tjnz 1b\n\t"
                         : "+r"(n) : "r"(one) : TSR_CLOB12("xmm"), "xmm12", "xmm13", "cc");
}

static void tsr_bench_ymm_vnni_loop(int64_t iters) {
    int64_t n = iters;
    if (n <= 0) return;
    __asm__ volatile("vmovd %k1, %%xmm12\n\tvpbroadcastd %%xmm12, %%ymm12\n\tvmovdqa %%ymm12, %%ymm13\n\t"
                     "1:\n\t" TSR_Y12("%{vex%} vpdpbusd", "%%ymm13", "%%ymm12") "dec %0\n\tjnz 1b\n\t"
                     : "+r"(n) : "r"(0x01010101u) : TSR_CLOB12("xmm"), "xmm12", "xmm13", "cc");
}
#endif

/* VDPBF16PS peak; 64 FLOPs x 12 per step per thread */
int tsr_bench_bf16_peak(int64_t iters, int threads) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (!__builtin_cpu_supports("avx512bf16")) return TSR_ENOTSUP;
#pragma omp parallel num_threads(tsr_threads(threads))
    tsr_bench_zmm_loop(iters, 1);
    return 64 * 12;
#else
    (void)iters; (void)threads;
    return TSR_ENOTSUP;
#endif
}

/* VPDPBUSD peak (zmm with AVX512_VNNI, else ymm with AVX-VNNI); int8 ops x 12 per step */
int tsr_bench_int8_peak(int64_t iters, int threads) {
#if defined(__x86_64__) && defined(__GNUC__)
    const int zmm = __builtin_cpu_supports("avx512vnni") != 0;
    if (!zmm && !__builtin_cpu_supports("avxvnni")) return TSR_ENOTSUP;
#pragma omp parallel num_threads(tsr_threads(threads))
    {
        if (zmm) tsr_bench_zmm_loop(iters, 0);
        else tsr_bench_ymm_vnni_loop(iters);
    }
    return (zmm ? 128 : 64) * 12;
#else
    (void)iters; (void)threads;
    return TSR_ENOTSUP;
#endif
}

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#include <sys/syscall.h>
long syscall(long number, ...); /* unistd.h hides it under -std=c11 */
/* one thread: tiles 0-3 accumulate tile4 x tile5 (operands loaded once: bytes of 1, i.e. int8 1
 * or the normal bf16 0x0101, never zeros a unit could skip) */
static void tsr_bench_amx_loop(int64_t iters, int int8) {
    uint8_t ones[1024] __attribute__((aligned(64)));
    uint8_t cfg[64] __attribute__((aligned(64))) = {0};
    memset(ones, 1, sizeof ones);
    cfg[0] = 1; /* palette 1: 8 tiles of up to 16 rows x 64 bytes */
    for (int t = 0; t < 6; t++) { cfg[16 + 2 * t] = 64; cfg[48 + t] = 16; }
    int64_t n = iters, stride = 64;
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm4\n\ttileloadd (%0,%1,1), %%tmm5\n\t"
                     "tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3"
                     : : "r"(ones), "r"(stride), "m"(ones) : "memory");
    if (n > 0 && int8)
        __asm__ volatile("1:\n\ttdpbusd %%tmm5, %%tmm4, %%tmm0\n\ttdpbusd %%tmm5, %%tmm4, %%tmm1\n\t"
                         "tdpbusd %%tmm5, %%tmm4, %%tmm2\n\ttdpbusd %%tmm5, %%tmm4, %%tmm3\n\tdec %0\n\tjnz 1b"
                         : "+r"(n) : : "cc");
    else if (n > 0)
        __asm__ volatile("1:\n\ttdpbf16ps %%tmm5, %%tmm4, %%tmm0\n\ttdpbf16ps %%tmm5, %%tmm4, %%tmm1\n\t"
                         "tdpbf16ps %%tmm5, %%tmm4, %%tmm2\n\ttdpbf16ps %%tmm5, %%tmm4, %%tmm3\n\tdec %0\n\tjnz 1b"
                         : "+r"(n) : : "cc");
    __asm__ volatile("tilerelease");
}
#endif

/* AMX peak (int8: TDPBUSD, else TDPBF16PS), 4 tile products per step; TSR_ENOTSUP without AMX
 * or when the kernel refuses the tile state. */
int tsr_bench_amx_peak(int64_t iters, int threads, int int8) {
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) return TSR_ENOTSUP;
#pragma omp parallel num_threads(tsr_threads(threads))
    tsr_bench_amx_loop(iters, int8);
    return 4 * (int8 ? 32768 : 16384);
#else
    (void)iters; (void)threads; (void)int8;
    return TSR_ENOTSUP;
#endif
}
