"""Forward query rows per cpu work item, interleaved with SDPA (causal, 32q/8kv x 128).

    python bm_ab.py 1x4096 float32 64,128 5     # batch x seq, dtype, block rows, samples
Each contender sets ops.attention.cpu.FWD_BLOCK_M (read at call time) before its call; the timing is the
bench's time_interleaved (rotating order, medians); (N.NNx) = SDPA time / its time.
"""
import statistics
import sys

import torch

import tessera
from tessera.bench.timing import time_interleaved
from tessera.ops.attention import cpu as acpu

B, S = map(int, sys.argv[1].split("x"))
dt, bms = getattr(torch, sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(B, S, h, 128, generator=g).to(dt) for h in (32, 8, 8))


def with_rows(bm):
    def f():
        acpu.FWD_BLOCK_M = bm
        return tessera.attention(q, k, v, causal=True)
    return f


fns = {f"bm{bm}": with_rows(bm) for bm in bms}
qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
fns["sdpa"] = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
with torch.no_grad():
    med = {n: statistics.median(t.samples) for n, t in time_interleaved(fns, int(sys.argv[4])).items()}
print(sys.argv[1], sys.argv[2], "  ".join(f"{n}: {m * 1e3:.0f} ms ({med['sdpa'] / m:.2f}x)" for n, m in med.items()),
      flush=True)
