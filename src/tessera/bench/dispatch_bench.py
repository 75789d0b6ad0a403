"""Kernel / vendor / auto timings of the quantized linears' cpu dispatch (``tessera.dispatch``).

    .venv/bin/python -m tessera.bench.dispatch_bench [--n 2048] [--k 2048] [--rounds 11] [--threads T]
                                                     [--out DIR] [--name table.md]

For W4A16 (fp32, bf16), W8A8 and W4A8 (fp32, bf16) at M in 1, 16, 128, 512 (N = K = 2048,
group 128, symmetric int4 / per-channel int8 weights), each round times one call of every route
in turn, each after one untimed call of the same route: ``TESSERA_DISPATCH=kernel``, ``vendor``,
``auto``, and the bench's ``dequant+matmul`` baseline (the weight dequantized once outside the
timing, then ``F.linear``; for the integer recipes that is not their exact contract).  The
rounds interleave the routes so that other processes' load falls on all of them alike.  The
table holds each route's median over the rounds and, after a slash, its fast-quartile time (the
25th percentile: on a shared machine the median carries other processes' scheduling stalls, the
fast quartile much less); ``auto / best`` = auto's time over the better of kernel's and vendor's,
for both statistics (1.00 = auto chose the faster route).  The header gives the 1-minute load
average before and after the run.
Writes ``table.md`` under ``--out`` (default ``benchmarks/results/2026-12-04-cpu-dispatch``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

ROWS = [("linear_w4a16", torch.float32), ("linear_w4a16", torch.bfloat16),
        ("linear_w8a8", torch.float32), ("linear_w8a8", torch.bfloat16),
        ("linear_w4a8", torch.float32), ("linear_w4a8", torch.bfloat16)]
MS = (1, 16, 128, 512)
ROUTES = ("kernel", "vendor", "auto")


def _args(op, dtype, M, N, K, gen):
    from ..ops._qlinear_int4 import quantize_weight
    from ..quant import contract
    x = torch.randn(M, K, generator=gen).to(dtype)
    w = torch.randn(N, K, generator=gen)
    if op in ("linear_w4a16", "linear_w4a8"):
        q, s, _ = quantize_weight(w, 128, False)
        return {"x": x, "weight": q, "weight_scale": s, "weight_zero": None, "group_size": 128}
    q, s = contract.quantize_rows(w * 0.05, torch.int8)
    return {"x": x, "weight": q, "weight_scale": s}


def _baseline(op, kw):
    from ..quant import peers
    fn = peers.dequant_matmul_int8 if op == "linear_w8a8" else peers.dequant_matmul_int4
    return fn(dict(kw, bias=None, activation=None))


def _once(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench(n=2048, k=2048, rounds=7, ms=MS, rows=ROWS, log=print):
    """[(op, dtype, M, {route: median s}, auto's route)] for every row."""
    import tessera
    from .. import dispatch
    gen = torch.Generator().manual_seed(0)
    out = []
    for op, dtype in rows:
        for M in ms:
            kw = _args(op, dtype, M, n, k, gen)
            fn = getattr(tessera, op)
            call = lambda: fn(**kw)  # noqa: E731
            base = _baseline(op, kw)
            samples = {r: [] for r in (*ROUTES, "dequant+matmul")}
            for r in ROUTES:  # warm-up: builds, the vendor route's cached weight
                with dispatch.forced(r):
                    call()
            base()
            for _ in range(rounds):
                for r in ROUTES:
                    with dispatch.forced(r):
                        call()  # untimed: absorbs the other route's thread pool still spinning
                        samples[r].append(_once(call))
                base()
                samples["dequant+matmul"].append(_once(base))
            med = {r: (statistics.median(v), statistics.quantiles(v, n=4, method="inclusive")[0])
                   for r, v in samples.items()}
            with dispatch.forced("auto"):
                chosen = dispatch.route(op, dtype, M, n, k)
            out.append((op, dtype, M, med, chosen))
            if log:
                log(f"{op:13s} {str(dtype)[6:]:9s} M={M:4d}  " +
                    "  ".join(f"{r} {v[0] * 1e3:8.3f}/{v[1] * 1e3:.3f} ms" for r, v in med.items()) +
                    f"  auto -> {chosen}")
    return out


def _load() -> str:
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def table(results, n, k, rounds, loads=("?", "?")) -> str:
    from .. import dispatch
    src = "calibration file " + dispatch.calibration_path().name if dispatch.calibration_path().exists() \
        else "built-in " + ("DEFAULTS_INTEL" if dispatch.defaults() is dispatch.DEFAULTS_INTEL else "DEFAULTS")
    lines = [f"N = K = {n}, group 128; {rounds} interleaved rounds; each cell: median / fast-quartile ms; "
             f"{torch.get_num_threads()} threads; load average {loads[0]} before, {loads[1]} after; "
             f"auto rule: {src}.", "",
             "| op | dtype | M | kernel ms | vendor ms | auto ms | auto route | auto / best | "
             "dequant+matmul ms |", "|---|---|---|---|---|---|---|---|---|"]

    def cell(v):
        return f"{v[0] * 1e3:.3f} / {v[1] * 1e3:.3f}"
    for op, dtype, M, med, chosen in results:
        ratio = " / ".join(f"{med['auto'][i] / min(med['kernel'][i], med['vendor'][i]):.2f}" for i in (0, 1))
        lines.append(f"| {op} | {str(dtype)[6:]} | {M} | {cell(med['kernel'])} | {cell(med['vendor'])} | "
                     f"{cell(med['auto'])} | {chosen} | {ratio} | {cell(med['dequant+matmul'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tessera.bench.dispatch_bench", description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (tessera's kernels follow it); "
                   "0: leave the default. 1 gives stable figures on a loaded shared machine, where a "
                   "2-thread parallel region waits for a descheduled thread")
    p.add_argument("--name", default="table.md", help="file name of the table under --out")
    p.add_argument("--out", default=os.path.join("benchmarks", "results", "2026-12-04-cpu-dispatch"))
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    before = _load()
    res = bench(a.n, a.k, a.rounds)
    text = table(res, a.n, a.k, a.rounds, (before, _load()))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / a.name).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
