"""Every conv layer of int8-static ResNet-18 / MobileNetV2 at batch 1 (224x224, channels-last
codes, one thread), timed three ways interleaved in one process (tessera.bench.timing.time_interleaved,
an untimed call before each sample, median): tessera.conv2d_int8 with its C++ twin
(csrc/fastpath_conv2d_int8.h), the same call through the Python body (the twin switched off per
call), and eager fp32 F.conv2d (+ the layer's fused relu / relu6) on a float channels-last
input of the same shape (the issue's baseline: int8 conv >= 2x fp32 F.conv2d).  The layers'
inputs are recorded from one forward of the quantized model (random-init torchvision
architectures, tessera.testing.cnn_models; calibrated on 4 batches of 8 random 64x64 inputs).

    python layer_ab.py {mobilenet_v2,resnet18} > layer_ab_<model>.txt
"""
import statistics
import sys

import torch
import torch.nn.functional as F

import tessera
from tessera import _library
from tessera.bench.report import machine_info
from tessera.bench.timing import time_interleaved
from tessera.ops.conv2d_int8 import _impl
from tessera.quant.static import StaticQuantConv2d
from tessera.testing.cnn_models import mobilenet_v2, resnet18

ACT = {None: lambda y: y, "relu": F.relu_, "relu6": lambda y: y.clamp_(0, 6)}


def python_path(call):
    def run():
        twin = _library._FAST.pop(_impl, None)
        try:
            return call()
        finally:
            if twin is not None:
                _library._FAST[_impl] = twin
    return run


def main(name):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = {"mobilenet_v2": mobilenet_v2, "resnet18": resnet18}[name]().eval()
    g = torch.Generator().manual_seed(0)
    q = tessera.quantize(m, "int8-static", calibration=[torch.randn(8, 3, 64, 64, generator=g) for _ in range(4)])
    seen = []
    orig = StaticQuantConv2d.forward_codes
    StaticQuantConv2d.forward_codes = lambda self, x: (seen.append((self, x)), orig(self, x))[1]
    with torch.no_grad():
        q(torch.randn(1, 3, 224, 224))
    StaticQuantConv2d.forward_codes = orig
    print("cpu:", machine_info().get("cpu"), "| 1 thread | torch", torch.__version__)
    print(f"{'layer':34s} {'fp32 ms':>8s} {'x fp32 (twin)':>14s} {'x fp32 (python)':>16s} {'twin/python':>12s}")
    rows = []
    with torch.no_grad():
        for i, (layer, x) in enumerate(seen):
            w = layer.weight.float()
            xf = torch.randn(x.shape).contiguous(memory_format=torch.channels_last)
            kw = dict(stride=layer.stride, padding=layer.padding, dilation=layer.dilation, groups=layer.groups)
            act = ACT[layer.activation]
            call = lambda layer=layer, x=x: layer.forward_codes(x)   # noqa: E731
            runs = {"fp32": lambda: act(F.conv2d(xf, w, None, **kw)), "twin": call, "python": python_path(call)}
            t = time_interleaved(runs, 25, rewarm_below_s=1.0)
            e, tw, py = (t[k].median for k in ("fp32", "twin", "python"))
            O, C, kh, _ = layer.weight.shape
            tag = f"{i:02d} {x.shape[1]}x{x.shape[2]}->{O} k{kh} s{layer.stride[0]}"
            tag += " dw" if layer.groups > 1 else ""
            print(f"{tag:34s} {e * 1e3:8.3f} {e / tw:14.2f} {e / py:16.2f} {py / tw:12.2f}", flush=True)
            rows.append((e, tw, py))
    e, tw, py = (sum(r[j] for r in rows) for j in range(3))
    print(f"sum over {len(rows)} layers: fp32 {e * 1e3:.2f} ms | twin {tw * 1e3:.2f} ms ({e / tw:.2f}x) | "
          f"python {py * 1e3:.2f} ms ({e / py:.2f}x)")
    ratios = [r[0] / r[1] for r in rows]
    print(f"x fp32 with the twin: median {statistics.median(ratios):.2f}, min {min(ratios):.2f}, "
          f">= 2x on {sum(r >= 2 for r in ratios)} of {len(ratios)} layers")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mobilenet_v2")
