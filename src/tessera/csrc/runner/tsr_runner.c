/* tsr_runner.c -- the remote kernel runner of the edge-CPU backends (cpu:aarch64, cpu:riscv64).
 *
 * Python cannot load an aarch64 or riscv64 library in-process, so the kernels are linked into
 * this small static program for the target, which serves kernel calls over a byte stream:
 * stdin/stdout (under qemu-user on a workstation) or one TCP connection at a time
 * (`tsr_runner --listen PORT` on a board; the host sets TESSERA_REMOTE=host:port).  One process
 * serves many calls.  Framework-free C11 + POSIX; the kernel table (names, argument kinds,
 * trampolines) is generated at build time into tsr_runner_table.c (backends/cross.py).
 *
 * Protocol (little-endian, every field fixed-size; both targets and x86-64 are little-endian):
 *   request  u32 op: 1 = hello, 2 = call, 3 = quit
 *   hello    reply: u16 n, n bytes of "key=value" text (arch, vector length, kernel count)
 *   call     u16 n, n bytes kernel name; u16 nargs; per argument u8 kind then its payload:
 *              'l' i64 | 'i' i32 | 'f' f32 | 'n' (null pointer)
 *              'r' u64 len + len bytes (input buffer)  'w' u64 len (output buffer)
 *              'u' u64 len + len bytes (input and output)
 *            reply: i32 status, i32 kernel rc, u16 n + n bytes message,
 *                   then (status 0 only) the bytes of every 'w'/'u' buffer in argument order.
 *   status   0 ok; TSR_RUN_* below for protocol errors (the kernel was not run, or its output is
 *            not trustworthy: a write past a buffer's end is caught by a 64-byte guard zone).
 * Buffers are 64-byte aligned copies; output buffers start poisoned (0xCD) so an element a
 * kernel never writes is visible to the host's checks.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#if defined(__riscv_vector)
#include <riscv_vector.h>
#endif

#include "tessera_cpu.h"
#include "tsr_runner.h"

/* A kernel of the runner itself: n values converted between the storage dtypes (TSR_F32/F16/BF16)
 * through the row helpers of tessera_cpu.h, which the kernels use for every load and store (per-ISA
 * paths: tessera_neon.h, tessera_rvv.h).  The tests compare it bit for bit with torch. */
int tsr_runner_convert(const void *src, void *dst, int64_t n, int from, int to) {
    float *f = tsr_scratch(n);
    if (!f) return TSR_ENOMEM;
    tsr_load_f32(f, src, n, from);
    tsr_store_conv(dst, f, n, to);
    free(f);
    return TSR_OK;
}

enum { TSR_RUN_OK = 0, TSR_RUN_UNKNOWN = -100, TSR_RUN_ARGS = -101, TSR_RUN_NOMEM = -102,
       TSR_RUN_OVERRUN = -103, TSR_RUN_PROTO = -104 };
#define GUARD 64
#define MAX_ARGS 32

static int in_fd = 0, out_fd = 1;

static int read_all(void *p, size_t n) {
    char *c = p;
    while (n) {
        ssize_t k = read(in_fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        c += k; n -= (size_t)k;
    }
    return 0;
}

static int write_all(const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t k = write(out_fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        c += k; n -= (size_t)k;
    }
    return 0;
}

static int reply_status(int32_t status, int32_t rc, const char *msg) {
    uint16_t n = (uint16_t)strlen(msg);
    return write_all(&status, 4) || write_all(&rc, 4) || write_all(&n, 2) || write_all(msg, n);
}

static int hello(void) {
    char text[256];
    long vlen = 0;
#if defined(__riscv_vector)
    vlen = (long)__riscv_vsetvlmax_e8m1() * 8;   /* VLEN in bits */
#elif defined(__aarch64__)
    vlen = 128;                                    /* NEON */
#endif
#if defined(__aarch64__)
    const char *arch = "aarch64";
#elif defined(__riscv)
    const char *arch = "riscv64";
#elif defined(__x86_64__)
    const char *arch = "x86_64";
#else
    const char *arch = "unknown";
#endif
    int n = snprintf(text, sizeof text, "arch=%s vlen=%ld kernels=%d", arch, vlen, tsr_nkernels);
    uint16_t len = (uint16_t)n;
    return write_all(&len, 2) || write_all(text, len);
}

/* read one call, run it, reply; -1 only when the stream is broken (the loop ends) */
static int serve_call(void) {
    char name[256];
    uint16_t nlen, nargs;
    if (read_all(&nlen, 2) || nlen >= sizeof name || read_all(name, nlen) || read_all(&nargs, 2)) return -1;
    name[nlen] = 0;
    if (nargs > MAX_ARGS) return -1;
    tsr_arg a[MAX_ARGS];
    char kinds[MAX_ARGS + 1];
    uint64_t lens[MAX_ARGS];
    int status = TSR_RUN_OK;
    memset(a, 0, sizeof a);
    for (int k = 0; k < nargs; k++) {
        uint8_t kind;
        if (read_all(&kind, 1)) return -1;
        kinds[k] = (char)kind;
        lens[k] = 0;
        if (kind == 'l') { if (read_all(&a[k].l, 8)) return -1; }
        else if (kind == 'i') { if (read_all(&a[k].i, 4)) return -1; }
        else if (kind == 'f') { if (read_all(&a[k].f, 4)) return -1; }
        else if (kind == 'n') { a[k].p = NULL; }
        else if (kind == 'r' || kind == 'w' || kind == 'u') {
            if (read_all(&lens[k], 8)) return -1;
            /* the payload must be consumed even when the allocation fails, to stay in sync */
            char *buf = aligned_alloc(64, ((lens[k] + GUARD + 63) / 64) * 64);
            if (!buf) status = TSR_RUN_NOMEM;
            if (kind == 'w') { if (buf) memset(buf, 0xCD, lens[k]); }
            else {
                for (uint64_t off = 0; off < lens[k];) {
                    char sink[4096];
                    uint64_t chunk = lens[k] - off < sizeof sink ? lens[k] - off : sizeof sink;
                    if (read_all(buf ? buf + off : sink, chunk)) return -1;
                    off += chunk;
                }
            }
            if (buf) memset(buf + lens[k], 0xA5, GUARD);
            a[k].p = buf;
        } else return -1;
    }
    kinds[nargs] = 0;
    const tsr_kernel *kern = NULL;
    for (int k = 0; k < tsr_nkernels; k++)
        if (strcmp(tsr_kernels[k].name, name) == 0) kern = &tsr_kernels[k];
    char msg[320] = "";
    int32_t rc = 0;
    if (status == TSR_RUN_OK && !kern) {
        status = TSR_RUN_UNKNOWN;
        snprintf(msg, sizeof msg, "no kernel named %s in this runner", name);
    } else if (status == TSR_RUN_OK) {
        /* a null pointer may stand for any pointer kind; everything else must match the table */
        int ok = (int)strlen(kern->kinds) == nargs;
        for (int k = 0; ok && k < nargs; k++)
            ok = kinds[k] == kern->kinds[k] || (kinds[k] == 'n' && strchr("rwu", kern->kinds[k]));
        if (!ok) {
            status = TSR_RUN_ARGS;
            snprintf(msg, sizeof msg, "%s takes arguments '%s', got '%s'", name, kern->kinds, kinds);
        }
    } else snprintf(msg, sizeof msg, "out of memory for the buffers of %s", name);
    if (status == TSR_RUN_OK) {
        rc = kern->call(a);
        for (int k = 0; k < nargs; k++) {
            if (!strchr("rwu", kinds[k])) continue;
            const unsigned char *g = (const unsigned char *)a[k].p + lens[k];
            for (int b = 0; b < GUARD; b++)
                if (g[b] != 0xA5) {
                    status = TSR_RUN_OVERRUN;
                    snprintf(msg, sizeof msg, "%s wrote past the end of argument %d (%llu bytes)", name, k,
                             (unsigned long long)lens[k]);
                    break;
                }
        }
    }
    int broken = reply_status(status, rc, msg);
    for (int k = 0; !broken && status == TSR_RUN_OK && k < nargs; k++)
        if (kinds[k] == 'w' || kinds[k] == 'u') broken = write_all(a[k].p, lens[k]);
    for (int k = 0; k < nargs; k++)
        if (strchr("rwu", kinds[k])) free(a[k].p);
    return broken ? -1 : 0;
}

static void serve(void) {
    for (;;) {
        uint32_t op;
        if (read_all(&op, 4)) return;
        if (op == 1) { if (hello()) return; }
        else if (op == 2) { if (serve_call()) return; }
        else return;   /* quit, or a stream this runner does not understand */
    }
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc == 3 && strcmp(argv[1], "--listen") == 0) {
        int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        struct sockaddr_in addr;
        memset(&addr, 0, sizeof addr);
        addr.sin_family = AF_INET;
        addr.sin_port = htons((uint16_t)atoi(argv[2]));
        addr.sin_addr.s_addr = htonl(INADDR_ANY);
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (s < 0 || bind(s, (struct sockaddr *)&addr, sizeof addr) || listen(s, 1)) {
            perror("tsr_runner: listen");
            return 1;
        }
        socklen_t al = sizeof addr;
        getsockname(s, (struct sockaddr *)&addr, &al);
        printf("tsr_runner listening on port %d\n", ntohs(addr.sin_port));
        fflush(stdout);
        for (;;) {   /* one client at a time; a dropped client frees the runner for the next */
            int c = accept(s, NULL, NULL);
            if (c < 0) continue;
            in_fd = out_fd = c;
            serve();
            close(c);
        }
    }
    serve();
    return 0;
}
