"""tessera.linear_int8_requant with and without its C++ twin (csrc/fastpath_linear_int8.h), one
process, one thread, timed interleaved (tessera.bench.timing.time_interleaved: an untimed call
before each sample, median): "twin" is the plain call; "python" is the same call with the twin
unbound (its Python body, _impl, runs as before this change); "fp32" is F.linear on float copies
of x and w, the float layer it stands for.  Both int8 paths are checked bit-identical to the op's
plain-PyTorch formula (linear_int8_requant_eager, not timed: 10-500 ms a call).  Shapes: decode-time FC
layers (M = 1: MobileNetV2's / ResNet-18's classifiers, an LLM projection) and small batches.

    python fc_ab.py > fc_ab.txt
"""
import torch
import torch.nn.functional as F

import tessera
from tessera import _library
from tessera.bench.report import machine_info
from tessera.bench.timing import time_interleaved
from tessera.ops import linear_int8_requant as mod

SHAPES = ((1, 7, 5), (1, 512, 1000), (1, 1280, 1000), (1, 4096, 4096), (8, 1280, 1000), (64, 768, 768))


def main():
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    print("cpu:", machine_info().get("cpu"), "| 1 thread | torch", torch.__version__)
    print(f"{'M x K -> N':>18s} {'twin us':>9s} {'python us':>10s} {'fp32 us':>8s} "
          f"{'python / twin':>14s} {'fp32 / twin':>12s}")
    for M, K, N in SHAPES:
        x = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g)
        w = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
        b = torch.randint(-1000, 1000, (N,), dtype=torch.int32, generator=g)
        m = torch.randint(1 << 30, 1 << 31, (N,), generator=g).to(torch.int32)
        s = torch.full((N,), -12, dtype=torch.int32)
        xf, wf, bf = x.float(), w.float(), b.float()
        tessera.linear_int8_requant(x, 3, w, b, m, s, -2)   # the first cpu launch loads the C++ fast path
        twin = _library._FAST[mod._impl]

        def python():
            _library._FAST[mod._impl] = mod._impl
            try:
                return tessera.linear_int8_requant(x, 3, w, b, m, s, -2)
            finally:
                _library._FAST[mod._impl] = twin

        runs = {"twin": lambda: tessera.linear_int8_requant(x, 3, w, b, m, s, -2), "python": python,
                "fp32": lambda: F.linear(xf, wf, bf)}
        want = mod.linear_int8_requant_eager(x, 3, w, b, m, s, -2)
        assert torch.equal(runs["twin"](), want) and torch.equal(runs["python"](), want)
        t = {k: v.median * 1e6 for k, v in time_interleaved(runs, 41, rewarm_below_s=1.0).items()}
        print(f"{f'{M} x {K} -> {N}':>18s} {t['twin']:9.1f} {t['python']:10.1f} {t['fp32']:8.1f} "
              f"{t['python'] / t['twin']:14.2f} {t['fp32'] / t['twin']:12.2f}", flush=True)


if __name__ == "__main__":
    main()
