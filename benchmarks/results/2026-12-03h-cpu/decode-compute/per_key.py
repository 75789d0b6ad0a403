"""ns per (key, kv head) per thread of tessera.decode_attention (cpu backend), bf16 q, 32q/8kv x
128, page 16, B=1: ctx 2048 keeps the cache in L3 (8 / 4 MiB), ctx 16384 reads it from DRAM.

    NT=1 python per_key.py 2048,16384      # NT threads; per thread = median time x NT / keys / 8
"""
import os
import statistics
import sys
import time

import torch

import tessera
import importlib

dc = importlib.import_module("tessera.ops.decode_attention.cases")  # the package exports a cases() function

NT = int(os.environ.get("NT", "1"))
torch.set_num_threads(NT)
g = torch.Generator().manual_seed(0)
for variant in ("same", torch.int8):
    for ctx in map(int, sys.argv[1].split(",")):
        kw = dc.build("x", 1, 32, 8, 128, 16, [ctx], variant=variant).make(torch.bfloat16, "cpu", g)
        ts = []
        for _ in range(31):
            t = time.perf_counter()
            tessera.decode_attention(**kw, backend="cpu")
            ts.append(time.perf_counter() - t)
        print("bf16" if variant == "same" else "int8", f"ctx {ctx}, {NT} thread(s):",
              f"{statistics.median(ts) * 1e9 * NT / (ctx * 8):.1f} ns per (key, kv head) per thread", flush=True)
