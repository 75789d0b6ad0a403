"""int8 KV against bf16 KV decode, the two calls alternating in one loop (the bench's
tessera.bench.timing.time_interleaved; bf16 q, 32 q / 8 kv heads x 128, page 16, shuffled block
tables, caches from the bench's cases: huge pages).  Prints medians
and the median of the paired time ratios bf16 / int8 over ROUNDS rounds, plus each cache's rate
against a plain read of its own pages (the bench's layout read), timed in the same loop.

    python int8_vs_bf16.py
"""
import importlib
import statistics

import torch

import tessera
from tessera.bench.timing import time_interleaved

cases = importlib.import_module("tessera.ops.decode_attention.cases")
cpu = importlib.import_module("tessera.ops.decode_attention.cpu")
ROUNDS = 21


def call(kw):
    return lambda: tessera.decode_attention(kw["q"], kw["k_cache"], kw["v_cache"], kw["block_table"], kw["seq_lens"],
                                            k_scale=kw["k_scale"], v_scale=kw["v_scale"])


def main():
    print(f"torch threads {torch.get_num_threads()}")
    for B, ctx in ((1, 16384), (16, 1024), (4, 4096), (16, 4096)):
        kws = {v: cases.build("x", B, 32, 8, 128, 16, [ctx] * B, variant=v).make(torch.bfloat16, "cpu",
                                                                                 torch.Generator().manual_seed(0))
               for v in ("same", torch.int8)}
        fns = {"bf16": call(kws["same"]), "int8": call(kws[torch.int8]),
               "bf16 read": cpu.paged_read(kws["same"]), "int8 read": cpu.paged_read(kws[torch.int8])}
        res = {k: t.samples for k, t in time_interleaved(fns, ROUNDS, warmup=1, inner=1).items()}
        med = {k: statistics.median(v) for k, v in res.items()}
        ratio = statistics.median(a / b for a, b in zip(res["bf16"], res["int8"]))
        print(f"B{B} ctx{ctx}: bf16 KV {med['bf16'] * 1e3:.2f} ms ({med['bf16 read'] / med['bf16'] * 100:.0f}% of its "
              f"layout read), int8 KV {med['int8'] * 1e3:.2f} ms ({med['int8 read'] / med['int8'] * 100:.0f}%) | "
              f"int8 speed-up {ratio:.2f}x (layout reads: {statistics.median(a / b for a, b in zip(res['bf16 read'], res['int8 read'])):.2f}x)",
              flush=True)


if __name__ == "__main__":
    main()
