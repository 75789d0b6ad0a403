"""Standalone timing of paged decode attention on the CPU (not part of the test suite).

    python -m tessera.ops.decode_attention._bench [--repeats 9] [--cases b1-ctx16384,...]

For each bench case of the spec (bf16 q; bf16 or int8 cache): medians of interleaved runs of
tessera (cpu backend), the eager baseline (gather pages + dequantise + SDPA) and an NT-store
copy moving the same number of bytes (the memory roofline).  GB/s = spec bytes_fwd (KV bytes
read + scales + q/out) / median time.
"""
from __future__ import annotations

import argparse

import torch

import tessera
from tessera.bench.roofline import ceiling_callable
from tessera.bench.timing import time_interleaved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--cases", default="")
    ap.add_argument("--no-eager", action="store_true")
    args = ap.parse_args()
    spec = tessera.OPS["decode_attention"]
    dev = torch.device("cpu")
    print(f"threads {torch.get_num_threads()}")
    for case in spec.bench_cases:
        if args.cases and not any(c in case.name for c in args.cases.split(",")):
            continue
        kw = case.make(torch.bfloat16, dev, torch.Generator().manual_seed(0))
        nbytes = spec.bytes_fwd(kw)
        copy, copy_units, _ = ceiling_callable("memory", nbytes, dev)
        fns = {"tessera": lambda: spec.fn(**kw, backend="cpu"), "copy": copy}
        if not args.no_eager:
            fns["eager"] = lambda: spec.eager(**kw)
        res = time_interleaved(fns, args.repeats, warmup=2, device=dev)
        t = {k: v.median for k, v in res.items()}
        gbps = nbytes / t["tessera"] / 1e9
        copy_gbps = copy_units / t["copy"] / 1e9
        eager = f"eager {t['eager'] * 1e3:8.2f} ms ({t['eager'] / t['tessera']:5.1f}x)" if "eager" in t else ""
        print(f"{case.name:45s} {nbytes / 2**20:8.1f} MiB  tessera {t['tessera'] * 1e3:8.2f} ms {gbps:6.1f} GB/s "
              f"= {100 * gbps / copy_gbps:5.1f}% of NT copy ({copy_gbps:5.1f} GB/s)  {eager}", flush=True)
        del kw


if __name__ == "__main__":
    main()
