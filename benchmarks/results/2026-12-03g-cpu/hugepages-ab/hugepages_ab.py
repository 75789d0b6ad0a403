"""Decode attention and the plain read of its pages, with the KV cache in 4 KiB pages (torch
allocation) against the same bytes in huge pages (tessera.memory.zeros), same process,
alternating call by call (tessera.bench.timing.time_interleaved, the bench's own loop: the first
contender rotates each round); medians of 21 rounds after one warm-up call each.

    python hugepages_ab.py            (the bench's decode shapes: 32 q / 8 kv heads x 128, page 16)
"""
import statistics

import torch

import tessera
from tessera import memory
from tessera.bench.timing import time_interleaved
import importlib

cases = importlib.import_module("tessera.ops.decode_attention.cases")  # the package re-exports a cases() function
cpu = importlib.import_module("tessera.ops.decode_attention.cpu")

ROUNDS = 21


def main():
    print(f"torch threads {torch.get_num_threads()}, THP mode {memory.huge_pages_mode()}")
    g = torch.Generator().manual_seed(0)
    for variant in ("same", torch.int8):
        for B, ctx in ((1, 16384), (16, 1024), (4, 4096)):
            huge = cases.build("x", B, 32, 8, 128, 16, [ctx] * B, variant=variant).make(torch.bfloat16, "cpu", g)
            small = dict(huge)
            for n in ("k_cache", "v_cache", "k_scale", "v_scale"):
                if huge[n] is not None:
                    big = huge[n].numel() * huge[n].element_size() >= memory.HUGE_PAGE
                    assert not big or huge[n].data_ptr() % memory.HUGE_PAGE == 0  # cases allocate huge pages
                    small[n] = huge[n].clone()                        # torch's allocator: 4 KiB pages
            kvb = B * ctx * 8 * 128 * 2 * huge["k_cache"].element_size()

            def dec(kw):
                return lambda: tessera.decode_attention(kw["q"], kw["k_cache"], kw["v_cache"], kw["block_table"],
                                                        kw["seq_lens"], k_scale=kw["k_scale"], v_scale=kw["v_scale"])
            fns = {"decode 4k": dec(small), "decode huge": dec(huge),
                   "read 4k": cpu.paged_read(small), "read huge": cpu.paged_read(huge)}
            assert torch.equal(fns["decode 4k"](), fns["decode huge"]())
            res = {k: t.samples for k, t in time_interleaved(fns, ROUNDS, warmup=1, inner=1).items()}
            med = {k: statistics.median(v) for k, v in res.items()}
            ratio = {w: statistics.median(a / b for a, b in zip(res[f"{w} 4k"], res[f"{w} huge"])) for w in ("decode", "read")}
            kind = "bf16" if variant == "same" else "int8"
            print(f"{kind} KV B{B} ctx{ctx}: " + "  ".join(f"{k} {med[k] * 1e3:.2f} ms ({kvb / med[k] / 1e9:.1f} GB/s)"
                                                             for k in fns)
                  + f"  | huge-page speed-up: decode {ratio['decode']:.2f}x, read {ratio['read']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
