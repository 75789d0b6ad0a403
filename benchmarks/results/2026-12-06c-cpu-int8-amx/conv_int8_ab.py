"""conv2d_int8 on ResNet-18 layer shapes (the bench's cases, x int8), AMX (TESSERA_QI8_VNNI=1) vs VNNI
(=2) vs eager fp32 F.conv2d + float requantization (the bench's baseline), interleaved in one
process: 7 rounds, each a median of 9 calls per contender; the figure is the median over rounds.
Usage: python conv_int8_ab.py THREADS"""
import os
import statistics
import sys
import time

import torch

import tessera  # noqa: F401  (registers the ops)
from tessera._registry import OPS
from tessera.bench.report import machine_info

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
SPEC = OPS["conv2d_int8"]


def med(f, n=9):
    f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


mi = machine_info()
print("cpu:", mi.get("cpu"), "| threads", torch.get_num_threads(), "| torch", torch.__version__)
for case in SPEC.bench_cases:
    kw = case.make(torch.int8, torch.device("cpu"), torch.Generator().manual_seed(0))
    r = {"amx": [], "vnni": [], "eager": []}
    with torch.no_grad():
        for _ in range(7):
            for name, flag in (("amx", "1"), ("vnni", "2")):
                os.environ["TESSERA_QI8_VNNI"] = flag
                r[name].append(med(lambda: SPEC.fn(**kw, backend="cpu")))
            r["eager"].append(med(lambda: SPEC.eager(**kw)))
    m = {k: statistics.median(v) * 1e3 for k, v in r.items()}
    print(f"{case.name:36s} amx {m['amx']:.3f} vnni {m['vnni']:.3f} eager {m['eager']:.3f} ms | "
          f"vnni/amx {m['vnni'] / m['amx']:.2f} | eager/amx {m['eager'] / m['amx']:.2f} "
          f"eager/vnni {m['eager'] / m['vnni']:.2f}", flush=True)
