"""The ceilings every benchmark row is divided by, measured in the same run.

Memory bandwidth (the roofline of memory-bound ops)
    A framework-free C copy (``roofline.c``) over ``mib`` MiB (>= 256 by default,
    far beyond any cache) with the thread count the kernels use.  Bytes counted
    are read + written, the convention of ``OpSpec.bytes_fwd/bytes_bwd``.  Three
    rates are reported:

    * ``nt_copy``    -- streaming (non-temporal) stores: no read-for-ownership of
      the destination, so it is the most bytes/s a single-pass kernel can reach.
      **This is the roofline** (``gbps``): % of roofline = op GB/s / this.
    * ``plain_copy`` -- ordinary stores (what a kernel without NT stores sees);
    * ``torch_copy`` -- ``Tensor.copy_`` (PyTorch's own ceiling for eager code);
    * ``read``       -- a read-only pass (``tsr_bench_read``), bytes read: the ceiling of
      ops whose traffic is all reads (``OpSpec.bound == "read"``: decode attention over a
      KV cache, a GEMV streaming its weight).  On this VM reads alone peak below an NT
      copy's read + write, so judging such an op against the copy would understate it.

    Bandwidth drifts between runs on a shared VM; that is why it is measured
    in the same process, right before the rows it normalises.

Compute peak
    ``torch.matmul`` of n x n x n (2048 by default) in fp32 (and bf16, which uses
    AMX/AVX512-BF16 through oneDNN where present), GFLOP/s = 2 n^3 / t.  Recorded
    for compute-bound ops (attention, GEMM) to be judged against.  Beside it the
    fp32 FMA peak (``tsr_bench_fma_peak``: register-only multiply-adds on every
    thread), the ceiling nothing passes: on the 2-core VM torch's matmul reaches
    ~66% of it, so a kernel can beat "100% of matmul".

On a CUDA device (the triton backend on a GPU) the C probe does not apply: the
roofline there is the device's ``copy_`` rate.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .timing import time_interleaved

_SRC = Path(__file__).with_name("roofline.c")


def _lib():
    from ..backends import cpu  # built like every native kernel: same flags, same ISA level, same cache
    return cpu.library("bench_roofline", _SRC)


def memory_bandwidth(mib: int = 256, repeats: int = 10, threads: int | None = None,
                     device: torch.device = torch.device("cpu")) -> dict:
    """Copy rates in GB/s (1e9 bytes/s, read + written) and which one is the roofline."""
    threads = threads or torch.get_num_threads()
    nbytes = int(mib) << 20
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    src.fill_(1)   # touch every page before timing: first-touch faults are not bandwidth
    dst.fill_(0)
    fns = {"torch_copy": lambda: dst.copy_(src)}
    kind = "torch_copy"
    if device.type == "cpu":
        from ..backends import cpu
        lib = _lib()
        nt = cpu.declare(lib, "tsr_bench_copy_nt", "pplli")
        plain = cpu.declare(lib, "tsr_bench_copy_plain", "pplli")
        args = (cpu.ptr(dst), cpu.ptr(src), nbytes, 1, threads)
        read = cpu.declare(lib, "tsr_bench_read", "plli")
        fns = {"nt_copy": lambda: nt(*args), "plain_copy": lambda: plain(*args), **fns,
               "read": lambda: read(cpu.ptr(src), nbytes, 1, threads)}
        kind = "nt_copy"
    res = time_interleaved(fns, repeats, warmup=1, device=device)
    out = {"buffer_mib": int(mib), "threads": threads, "bytes": "read + written",
           "roofline": kind, "repeats": repeats}
    for name, t in res.items():
        if t.median is None:
            raise RuntimeError(f"bandwidth probe {name} failed: {t.error}")
        out[f"{name}_gbps"] = round((1 if name == "read" else 2) * nbytes / t.median / 1e9, 3)
        out[f"{name}_spread"] = None if t.spread is None else round(t.spread, 3)
    out["gbps"] = out[f"{kind}_gbps"]
    del src, dst
    return out


def matmul_peak(n: int = 2048, repeats: int = 5, dtypes=(torch.float32, torch.bfloat16),
                device: torch.device = torch.device("cpu")) -> dict:
    """GFLOP/s of an n^3 ``torch.matmul`` per dtype (median of ``repeats``)."""
    out: dict = {"n": n, "repeats": repeats}
    if device.type == "cpu":
        from ..backends import cpu
        fma, iters, threads = cpu.declare(_lib(), "tsr_bench_fma_peak", "li"), 4_000_000, torch.get_num_threads()
        t = time_interleaved({"fma": lambda: fma(iters, threads)}, repeats, warmup=1, device=device)["fma"]
        out["fma_peak_gflops"] = None if t.median is None else round(2 * 12 * 16 * iters * threads / t.median / 1e9, 1)
    gen = torch.Generator(device="cpu").manual_seed(0)
    for dt in dtypes:
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=dt)
        b = torch.randn(n, n, generator=gen).to(device=device, dtype=dt)
        t = time_interleaved({"mm": lambda: torch.matmul(a, b)}, repeats, warmup=1, device=device)["mm"]
        name = str(dt).replace("torch.", "")
        out[f"{name}_gflops"] = None if t.median is None else round(2 * n**3 / t.median / 1e9, 1)
        if t.error:
            out[f"{name}_error"] = t.error
    return out


def ceiling_callable(kind: str, nbytes: int, device: torch.device, mm_n: int = 1024):
    """(callable, units per call, kind) timing this machine's ceiling for one benchmark row.

    ``memory``: an NT-store copy of ``nbytes / 2`` bytes (so ``nbytes`` cross DRAM, read +
    written) between buffers allocated and touched here, once per row; units = bytes.
    ``read``: a read-only pass over ``nbytes`` bytes (CPU; elsewhere the copy); units = bytes.
    ``compute``: an fp32 ``mm_n``^3 matmul; units = FLOPs.  None on devices without a probe.
    """
    if kind == "compute":
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(mm_n, mm_n, generator=gen).to(device)
        b = torch.randn(mm_n, mm_n, generator=gen).to(device)
        return (lambda: torch.matmul(a, b)), 2 * mm_n ** 3, "fp32 matmul GFLOP/s"
    if device.type != "cpu":
        half = max(1, nbytes // 2)
        src = torch.ones(half, dtype=torch.uint8, device=device)
        dst = torch.zeros_like(src)
        return (lambda: dst.copy_(src)), 2 * half, "torch copy_ GB/s"
    from ..backends import cpu
    if kind == "read":
        buf = torch.ones(max(4096, (nbytes + 63) // 64 * 64), dtype=torch.uint8)
        rd = cpu.declare(_lib(), "tsr_bench_read", "plli")
        args = (cpu.ptr(buf), buf.numel(), 1, torch.get_num_threads())
        return (lambda: (buf, rd(*args))), buf.numel(), "read GB/s"
    half = max(4096, (nbytes // 2 + 63) // 64 * 64)
    src = torch.ones(half, dtype=torch.uint8)
    dst = torch.zeros(half, dtype=torch.uint8)
    nt = cpu.declare(_lib(), "tsr_bench_copy_nt", "pplli")
    args = (cpu.ptr(dst), cpu.ptr(src), half, 1, torch.get_num_threads())
    return (lambda: (src, dst, nt(*args))), 2 * half, "NT copy GB/s"
