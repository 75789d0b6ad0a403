"""``tessera bench``: every registered op against PyTorch eager and torch.compile, on a roofline.

One run, in this order (everything in one process, so all numbers share the
machine's state):

1. roofline probes (:mod:`.roofline`): non-temporal C copy (the roofline),
   plain-store copy, ``torch.copy_``, a read pass, the register-only compute peaks per dtype
   (fp32 FMA, bf16 VDPBF16PS, int8 VPDPBUSD, AMX where present: the ceilings of compute-bound
   rows, best of several) and the fp32/bf16 ``torch.matmul`` rate for comparison;
2. per-call overhead on each op's tiniest test input: tessera vs eager vs a
   no-op ``custom_op`` (the dispatcher's floor), in microseconds;
3. the matrix (:mod:`.runner`): ``bench_cases`` x dtype x fwd/bwd, tessera /
   eager / compile / peers and the row's own bandwidth ceiling interleaved (contenders: medians;
   the ceiling: the fast quartile of its samples for bandwidth, the best for a compute peak,
   and its spread), read-bound rows rotating through copies of
   their inputs larger than the LLC;
4. the NT copy again, so drift of the bandwidth during the run is visible;
5. the report (:mod:`.report`): table on stdout, ``bench.json``, ``bench.png``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736",
              "MALLOC_TOP_PAD_": "1073741824"}


def malloc_tuned() -> bool:
    """Is glibc told to keep freed big blocks (no fresh page faults per output allocation)?"""
    return all(os.environ.get(k) for k in MALLOC_ENV)


def release_freed_memory() -> None:
    """Return the heap's free pages to the OS between cases (glibc ``malloc_trim``; elsewhere a no-op).

    With :data:`MALLOC_ENV` freed blocks stay in the heap, so a row's timed calls reuse warm pages
    instead of page-faulting every output.  Across ~240 rows of different sizes the holes they
    leave do not fit the next case's tensors and the resident set only grows: 10 GiB by row 168
    of a full run on the 24 GiB VM.  ``malloc_trim(0)`` releases every free page (live blocks
    stay); the next row's warm-up calls fault its pages back in before anything is timed.
    """
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def run(*, ops: list[str] | None, dtypes, backends, out_dir: str, repeats: int, quick: bool = False,
        shape_scale: float = 1.0, tiny: bool = False, extended: bool = False, command: list[str] | None = None,
        with_compile: bool = True,
        log: Callable[[str], None] = print) -> dict:
    """Run the benchmark and write ``bench.json`` + ``bench.png`` into ``out_dir``; returns the report."""
    import torch

    from .. import OPS
    from . import report as rep
    from . import roofline, runner

    unknown = [o for o in (ops or []) if o not in OPS]
    if unknown:
        raise ValueError(f"tessera bench: unknown op(s) {unknown}; registered: {sorted(OPS)}")
    device = torch.device("cpu")
    if "triton" in backends:
        if not torch.cuda.is_available():
            raise ValueError("tessera bench: the triton backend is benchmarked on a GPU only (the interpreter "
                             "is a correctness tool, its timings mean nothing); use --backend cpu here")
        if len(set(backends)) > 1:
            raise ValueError("tessera bench: benchmark the triton backend (GPU) and CPU backends in separate runs")
        device = torch.device("cuda")
    specs = [OPS[n] for n in (ops or sorted(OPS))]
    todo, notes = runner.plans(specs, dtypes, backends, device, extended=extended)
    t_start = time.time()
    probe_mib = 16 if tiny else 256
    probe_reps = 3 if tiny else (8 if quick else 15)
    log(f"roofline probe: copy {probe_mib} MiB x {probe_reps}, {torch.get_num_threads()} threads ...")
    roof = roofline.memory_bandwidth(probe_mib, probe_reps, device=device)
    log("matmul peak ...")
    mm = roofline.matmul_peak(256 if tiny else 2048, 2 if tiny else (3 if quick else 5), device=device)
    peaks = None
    if device.type == "cpu":
        log("compute peaks (register-only: fp32 FMA, bf16, int8, AMX) ...")
        peaks = roofline.compute_peaks(repeats=5 if quick or tiny else 7,
                                       iters=1_000_000 if tiny else 2_000_000)
    overhead = []
    for spec in specs:
        o = runner.overhead(spec, backends, device, calls=20 if tiny else 200, repeats=5 if tiny else 15)
        if o is not None:
            overhead.append(o)
    report = {
        "command": command or sys.argv, "process_argv": list(getattr(sys, "orig_argv", sys.argv)), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t_start)),
        "device": str(device), "machine": rep.machine_info(), "versions": rep.versions(),
        "mode": {"malloc_tuning": malloc_tuned(), "malloc_env": {k: os.environ.get(k) for k in MALLOC_ENV},
                 "quick": quick, "tiny": tiny, "shape_scale": shape_scale, "repeats": repeats,
                 "threads": torch.get_num_threads(), "backends": list(backends),
                 "dtypes": [runner.dtype_name(d) for d in dtypes],
                 "timing": "contenders: median of interleaved samples after warm-up; compile/JIT excluded; "
                           "bandwidth ceilings: fast quartile (p25 time) of interleaved samples, spread (p90-p10)/median; compute "
                           "ceilings: the register-only peak probe of the row's compute_dtype, likewise; read rows "
                           "rotate through copies of their inputs > 2x LLC",
                 "compile": ("torch.compile(spec.eager, fullgraph=True, dynamic=False)" if with_compile
                             else "not timed (--no-compile)")},
        "roofline": roof, "matmul": mm, "peaks": peaks, "overhead": overhead, "notes": notes, "rows": [],
    }
    log(rep.header(report))
    for note in notes:
        log(f"note: {note}")
    inputs: dict = {}  # one case's inputs, shared by its fwd and bwd rows (plans keep them adjacent)
    for i, p in enumerate(todo, 1):
        key = (p.spec.name, p.case.name, p.dtype)
        if key not in inputs:
            inputs.clear()
            release_freed_memory()
            inputs[key] = runner.make_inputs(p.spec, p.case, p.dtype, device, shape_scale)
        row = rep.finish_row(runner.measure(p, repeats, device, inputs[key], peaks=peaks, with_compile=with_compile), roof["gbps"])
        report["rows"].append(row)
        log(rep.progress_line(i, len(todo), row))
        for k, e in row["errors"].items():
            log(f"    {k} failed: {e}")
    after = roofline.memory_bandwidth(probe_mib, max(3, probe_reps // 3), device=device)
    report["roofline"]["after_gbps"] = after["gbps"]
    report["elapsed_s"] = round(time.time() - t_start, 1)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench.json", "w") as f:
        json.dump(report, f, indent=1, default=str)
    rep.plot(report, str(out / "bench.png"))
    log("")
    log(rep.table(report["rows"]))
    for line in rep.findings(report["rows"]):
        log(line)
    log(f"\nstart-of-run {roof['roofline']} {roof['gbps']:.2f} GB/s (after the run: {after['gbps']:.2f}); "
        f"roof = the row's ceiling (memory rows: fast quartile of interleaved samples of an NT copy of its bytes, "
        f"read rows: of a read pass over them, rotated past the LLC; compute rows: the register-only peak "
        f"of the row's arithmetic dtype, likewise), +-spread = (p90-p10)/median of the ceiling samples; "
        f"%roof = rate / roof; x eager / x compile = their time / tessera's (> 1: tessera faster)")
    log(f"wrote {out / 'bench.json'} and {out / 'bench.png'} in {report['elapsed_s']} s")
    return report
