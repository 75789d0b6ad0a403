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

Read-bound rows are DRAM rows: a GEMV's 8-16 MiB weight or a short KV cache fits in a 32 MiB
    L3 and would be read warm from cache on every call after the first.  ``rotation(nbytes)``
    is how many copies of a read-bound row's inputs the runner cycles through so that the
    copies together exceed twice the last-level cache (:func:`llc_bytes`), within a share of
    the available memory; the row's read ceiling cycles through as many buffers of the same
    bytes.  The ceiling's rate is the fast quartile (25th-percentile time) of its interleaved
    samples: single samples of a DRAM-sized copy ran up to ~2x the run's bandwidth probe on
    the shared VM, so the best alone moved the denominator by tens of %; its spread
    (p90 - p10) / median is reported beside it; a memory row whose bytes fit in the LLC is
    marked cache-resident.

Compute peaks (``compute_peaks`` in the header, best of several, and ``peak_callable``: the
    same probe timed again in each compute row's interleaved loop, its best sample the row's
    ceiling -- measured once at the start, a quiet-moment peak let a later row on this shared
    VM read 133% of it).  The ceiling of a compute-bound row is the peak of the dtype of its arithmetic
    (``OpSpec.compute_dtype``): ``fp32`` -- FMAs (``tsr_bench_fma_peak``); ``bf16`` --
    VDPBF16PS (AVX512_BF16), or AMX TDPBF16PS where present; ``int8`` -- VPDPBUSD
    (AVX512_VNNI / AVX-VNNI), or AMX TDPBUSD where present.  A dtype without its instruction
    here falls back to the fp32 FMA peak, saying so.  ``torch.matmul`` of n x n x n (2048 by
    default) in fp32 and bf16 stays in the header for comparison (torch's fp32 matmul reaches
    ~66% of the FMA peak on the 2-core VM).

On a CUDA device (the triton backend on a GPU) the C probe does not apply: the
roofline there is the device's ``copy_`` rate.
"""
from __future__ import annotations

import functools
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
    out: dict = {"n": n, "repeats": repeats}  # (the FMA / bf16 / int8 peaks: compute_peaks)
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


@functools.lru_cache(maxsize=None)
def llc_bytes() -> int:
    """The last-level cache's size in bytes (sysfs; 32 MiB if unknown)."""
    best = 0
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (idx / "type").read_text().strip() == "Instruction":
                continue
            txt = (idx / "size").read_text().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(txt[-1:], 1)
            best = max(best, int(txt.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            continue
    return best or 32 << 20


def mem_available() -> int:
    """Bytes the kernel says can be allocated without swapping (MemAvailable; 8 GiB if unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return 8 << 30


# Every contender derives its own state from each copy (the dequant+matmul peer an fp32 weight,
# 8x an int4 one; ORT a session with its packed copy; the vendor route a cached dequantized
# weight), so the copies' raw bytes stay within this fraction of available memory.  A VM that
# reported its host's 480 MiB L3 asked for 44 copies of a 4096 x 11008 int4 GEMV: the peers'
# copies took 24 GiB and the OOM killer ended `tessera bench` (2026-12-05).
ROTATION_MEM_FRACTION = 1 / 64


def rotation(nbytes: int, cap: int = 64) -> int:
    """Copies of a read-bound row's inputs to cycle through so each call reads DRAM: together
    they exceed twice the LLC (one copy if the row's bytes already do), as far as
    ``ROTATION_MEM_FRACTION`` of available memory allows (the row's ``cache_resident`` flag
    says when the copies it got still fit the LLC)."""
    want = -(-2 * llc_bytes() // max(1, nbytes))
    fits = int(mem_available() * ROTATION_MEM_FRACTION) // max(1, nbytes)
    return max(1, min(cap, want, fits))


_PEAKS = {  # name -> (C function, dtype it is the ceiling of)
    "fp32_fma": ("tsr_bench_fma_peak", "fp32"), "bf16_dpbf16": ("tsr_bench_bf16_peak", "bf16"),
    "int8_vnni": ("tsr_bench_int8_peak", "int8"), "bf16_amx": ("tsr_bench_amx_peak", "bf16"),
    "int8_amx": ("tsr_bench_amx_peak", "int8")}


def compute_peaks(repeats: int = 5, iters: int = 2_000_000, threads: int | None = None) -> dict:
    """Register-only peaks (GFLOP/s, or int8 GOP/s) on every thread: best of ``repeats`` calls,
    with the spread (p90 - p10) / median; ``"not present"`` where this CPU lacks the instruction.
    ``by_dtype`` maps fp32 / bf16 / int8 to the best probe of that dtype (bf16: or the fp32 FMA
    peak, if higher; fp32 FMA where the CPU has no instruction for the dtype)."""
    from ..backends import cpu
    lib, threads = _lib(), threads or torch.get_num_threads()
    flags = cpu.cpu_flags()
    out: dict = {"threads": threads, "repeats": repeats, "how": "register-only loops, best of repeats"}
    for name, (fn, _) in _PEAKS.items():
        if name.endswith("_amx") and not {"amx_tile", "amx_" + name[:4]} <= flags:  # amx_bf16 / amx_int8
            out[name] = "not present"
            continue
        if name.endswith("_amx"):
            f = cpu.declare(lib, fn, "lii")
            per, call = f(0, 1, int(name.startswith("int8"))), (lambda f=f, n=name: f(iters // 512, threads,
                                                                                      int(n.startswith("int8"))))
            n_it = iters // 512
        else:
            f = cpu.declare(lib, fn, "li")
            per, call, n_it = f(0, 1), (lambda f=f: f(iters, threads)), iters
        if per < 0:
            out[name] = "not present"
            continue
        per = 2 * 12 * 16 if name == "fp32_fma" else per  # the FMA probe returns floats per chain
        t = time_interleaved({name: call}, repeats, warmup=1, inner=1)[name]
        if t.best is None:
            out[name] = f"failed: {t.error}"
            continue
        out[name] = {"gflops": round(per * n_it * threads / t.best / 1e9, 1),
                     "spread": None if t.spread90 is None else round(t.spread90, 3), "ops_per_step": per}
    out["by_dtype"] = {}
    for dt in ("fp32", "bf16", "int8"):
        # bf16 operands can always be widened to fp32 FMAs, so a bf16 row's ceiling is never
        # below the FMA peak (Sapphire Rapids: VDPBF16PS 238 GFLOP/s on 2 threads, FMA 468)
        kinds = ("bf16", "fp32") if dt == "bf16" else (dt,)
        cands = [(v["gflops"], k, v["spread"]) for k, v in out.items()
                 if k in _PEAKS and _PEAKS[k][1] in kinds and isinstance(v, dict)]
        rate, name, spread = max(cands) if cands else (out["fp32_fma"]["gflops"], "fp32_fma", out["fp32_fma"]["spread"])
        out["by_dtype"][dt] = {"gflops": rate, "probe": name, "spread": spread,
                               **({} if cands else {"note": f"no {dt} instruction here: the fp32 FMA peak"})}
    return out


def peak_callable(peaks: dict, dtype: str, iters: int = 1_000_000, threads: int | None = None):
    """(callable, ops per call, label) re-running the header's best ``dtype`` probe, so a compute
    row times its ceiling in its own interleaved loop (a shared VM's load drifts within minutes:
    a peak taken only at the start let a row read 133% of it later)."""
    from ..backends import cpu
    threads = threads or torch.get_num_threads()
    entry = peaks["by_dtype"].get(dtype) or peaks["by_dtype"]["fp32"]
    name = entry["probe"]
    fn, per = _PEAKS[name][0], peaks[name]["ops_per_step"]
    if name.endswith("_amx"):
        f, n, int8 = cpu.declare(_lib(), fn, "lii"), max(1, iters // 512), int(name.startswith("int8"))
        return (lambda: f(n, threads, int8)), per * n * threads, f"{dtype} peak GFLOP/s ({name})"
    f = cpu.declare(_lib(), fn, "li")
    return (lambda: f(iters, threads)), per * iters * threads, f"{dtype} peak GFLOP/s ({name})"


def ceiling_callable(kind: str, nbytes: int, device: torch.device, mm_n: int = 1024, rotate: int = 1):
    """(callable, units per call, kind) timing this machine's ceiling for one benchmark row.

    ``memory``: an NT-store copy of ``nbytes / 2`` bytes (so ``nbytes`` cross DRAM, read +
    written) between buffers allocated and touched here, once per row; units = bytes.
    ``read``: a read-only pass over ``nbytes`` bytes (CPU; elsewhere the copy); units = bytes;
    with ``rotate`` > 1 each call reads the next of ``rotate`` such buffers (DRAM, not cache).
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
        chunk = max(4096, (nbytes + 4095) // 4096 * 4096)
        buf = torch.ones(chunk * rotate, dtype=torch.uint8)
        rd = cpu.declare(_lib(), "tsr_bench_read", "plli")
        base, nt, turn = buf.data_ptr(), torch.get_num_threads(), [0]

        def read():
            turn[0] = (turn[0] + 1) % rotate
            return buf, rd(base + turn[0] * chunk, chunk, 1, nt)
        return read, chunk, "read GB/s"
    half = max(4096, (nbytes // 2 + 63) // 64 * 64)
    src = torch.ones(half, dtype=torch.uint8)
    dst = torch.zeros(half, dtype=torch.uint8)
    nt = cpu.declare(_lib(), "tsr_bench_copy_nt", "pplli")
    args = (cpu.ptr(dst), cpu.ptr(src), half, 1, torch.get_num_threads())
    return (lambda: (src, dst, nt(*args))), 2 * half, "NT copy GB/s"
