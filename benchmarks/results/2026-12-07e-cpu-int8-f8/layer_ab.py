"""Every conv layer of int8-static ResNet-18 / MobileNetV2 (224x224 inputs, channels-last codes, one
thread) at batch 1 or 8, timed interleaved in one process (tessera.bench.timing.time_interleaved, an
untimed call before each sample, median): eager fp32 F.conv2d (+ the layer's fused relu / relu6) on
a float channels-last input of the same shape -- the issue's baseline, int8 conv >= 2x fp32
F.conv2d -- against tessera.conv2d_int8 as the quantized model calls it (the layer's own
forward_codes).  Inputs are recorded from one forward of the quantized model (random-init
torchvision architectures, calibrated on 4 batches of 8 random 64x64 inputs).  The tessera code
timed is whatever `import tessera` finds: run it under PYTHONPATH=<an older checkout>/src for that
version's column.

    python layer_ab.py {mobilenet_v2,resnet18} {1,8} > layer_ab_<model>_b<batch>.txt
"""
import statistics
import sys

import torch
import torch.nn.functional as F

import tessera
from tessera.bench.report import machine_info
from tessera.bench.timing import time_interleaved
from tessera.quant.static import StaticQuantConv2d
from tessera.testing.cnn_models import mobilenet_v2, resnet18

ACT = {None: lambda y: y, "relu": F.relu_, "relu6": lambda y: y.clamp_(0, 6)}


def main(name, batch):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = {"mobilenet_v2": mobilenet_v2, "resnet18": resnet18}[name]().eval()
    g = torch.Generator().manual_seed(0)
    q = tessera.quantize(m, "int8-static", calibration=[torch.randn(8, 3, 64, 64, generator=g) for _ in range(4)])
    seen = []
    orig = StaticQuantConv2d.forward_codes
    StaticQuantConv2d.forward_codes = lambda self, x: (seen.append((self, x)), orig(self, x))[1]
    with torch.no_grad():
        q(torch.randn(batch, 3, 224, 224))
    StaticQuantConv2d.forward_codes = orig
    print("cpu:", machine_info().get("cpu"), "| 1 thread | torch", torch.__version__, "| tessera from",
          tessera.__file__, "| batch", batch)
    print(f"{'layer':30s} {'fp32 ms':>8s} {'int8 ms':>8s} {'int8 x fp32':>12s}")
    rows = []
    with torch.no_grad():
        for i, (layer, x) in enumerate(seen):
            w = layer.weight.float()
            xf = torch.randn(x.shape).contiguous(memory_format=torch.channels_last)
            kw = dict(stride=layer.stride, padding=layer.padding, dilation=layer.dilation, groups=layer.groups)
            act = ACT[layer.activation]
            runs = {"fp32": lambda: act(F.conv2d(xf, w, None, **kw)), "int8": lambda: layer.forward_codes(x)}
            t = time_interleaved(runs, 25 if batch == 1 else 11, rewarm_below_s=1.0)
            e, n = t["fp32"].median, t["int8"].median
            O, C, kh, _ = layer.weight.shape
            tag = f"{i:02d} {x.shape[1]}x{x.shape[2]}->{O} k{kh} s{layer.stride[0]}"
            tag += " dw" if layer.groups > 1 else ""
            print(f"{tag:30s} {e * 1e3:8.3f} {n * 1e3:8.3f} {e / n:12.2f}", flush=True)
            rows.append((e, n, layer.groups > 1))
    e, n = (sum(r[j] for r in rows) for j in range(2))
    print(f"sum over {len(rows)} layers: fp32 {e * 1e3:.2f} ms | int8 {n * 1e3:.2f} ms ({e / n:.2f}x)")
    for label, sel in (("all", rows), ("depthwise", [r for r in rows if r[2]]), ("dense", [r for r in rows if not r[2]])):
        if sel:
            rn = [r[0] / r[1] for r in sel]
            print(f"{label:9s} x fp32: int8 median {statistics.median(rn):.2f} (min {min(rn):.2f}, >= 2x on "
                  f"{sum(v >= 2 for v in rn)} of {len(rn)})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mobilenet_v2", int(sys.argv[2]) if len(sys.argv) > 2 else 1)
