"""Whole int8-static models with the float input quantized in one native pass (quant/static.py
_quantize_input -> _requant.cpu.quantize_channels_last, tsr_quantize_cl) against the torch ops it
replaces (QParams.quantize, then the channels-last copy the model makes), one process, one thread,
the two forwards interleaved (tessera.bench.timing.time_interleaved, median ms), checked equal.

    python input_quant_ab.py > input_quant_ab.txt
"""
import torch

import tessera
from tessera.bench.timing import time_interleaved
from tessera.quant import static
from tessera.testing.cnn_models import mobilenet_v2, resnet18
torch.set_num_threads(1)
native = static._quantize_input
torch_path = lambda layer, x: layer.in_q.quantize(x)
for name in ("resnet18", "mobilenet_v2"):
    for batch in (1, 8):
        torch.manual_seed(0)
        m = {"mobilenet_v2": mobilenet_v2, "resnet18": resnet18}[name]().eval()
        g = torch.Generator().manual_seed(0)
        q = tessera.quantize(m, "int8-static", calibration=[torch.randn(8, 3, 64, 64, generator=g) for _ in range(4)])
        x = torch.randn(batch, 3, 224, 224)
        def run(fn):
            def f():
                static._quantize_input = fn
                return q(x)
            return f
        runs = {"torch": run(torch_path), "native": run(native)}
        with torch.no_grad():
            assert torch.equal(runs["torch"](), runs["native"]())
            t = {k: v.median * 1e3 for k, v in time_interleaved(runs, 41 if batch == 1 else 15, rewarm_below_s=1.0).items()}
        print(name, batch, {k: round(v, 2) for k, v in t.items()}, "speedup", round(t["torch"] / t["native"], 3), flush=True)
static._quantize_input = native
