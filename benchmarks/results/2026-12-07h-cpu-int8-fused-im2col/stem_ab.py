"""The 3-channel stems with and without the fused im2col rows, one process, one thread, timed
interleaved (tessera.bench.timing.time_interleaved, median ms): "fused" is the layer as
conv2d_int8 runs it now (MobileNetV2's 27-byte rows built whole in a register, ResNet-18's
147-byte rows copied a 21-byte tap row at a time, inside the GEMM: qi8_im2col.h); "im2col" is a
deep copy of the same layer (its own weight tensor, so its own route in the C++ twin) that
learned its route with the fused rows turned off (_requant/cpu.py FUSED_MIN_RUN / FUSED_ROW_MAX):
tsr_im2col's matrix, then the GEMM.  "fp32" is F.conv2d + relu6 on a float channels-last input.
Both int8 runs are checked equal.  Warm: one layer repeated on one input.

    python stem_ab.py mobilenet_v2 resnet18 > stem_ab.txt
"""
import copy
import sys

import torch
import torch.nn.functional as F

import tessera
from tessera.bench.timing import time_interleaved
from tessera.ops._requant import cpu as rc
from tessera.quant.static import StaticQuantConv2d
from tessera.testing.cnn_models import mobilenet_v2, resnet18


def main(names):
    torch.set_num_threads(1)
    for name in names:
        for batch in (1, 8):
            torch.manual_seed(0)
            m = {"mobilenet_v2": mobilenet_v2, "resnet18": resnet18}[name]().eval()
            g = torch.Generator().manual_seed(0)
            q = tessera.quantize(m, "int8-static",
                                 calibration=[torch.randn(8, 3, 64, 64, generator=g) for _ in range(4)])
            seen = []
            orig = StaticQuantConv2d.forward_codes
            StaticQuantConv2d.forward_codes = lambda self, x: (seen.append((self, x)), orig(self, x))[1]
            with torch.no_grad():
                q(torch.randn(batch, 3, 224, 224))
            StaticQuantConv2d.forward_codes = orig
            layer, x = seen[0]
            other = copy.deepcopy(layer)   # its own weight tensor: its own learned route in the twin
            with torch.no_grad():
                rc.FUSED_MIN_RUN, rc.FUSED_ROW_MAX = 10**9, 0
                other.forward_codes(x)     # learned: the gathered matrix
                rc.FUSED_MIN_RUN, rc.FUSED_ROW_MAX = 16, 64
                layer.forward_codes(x)     # learned: the fused rows
                w = layer.weight.float()
                xf = torch.randn(x.shape).contiguous(memory_format=torch.channels_last)
                kw = dict(stride=layer.stride, padding=layer.padding, dilation=layer.dilation, groups=layer.groups)
                runs = {"fp32": lambda: F.conv2d(xf, w, None, **kw).clamp_(0, 6),
                        "im2col": lambda: other.forward_codes(x), "fused": lambda: layer.forward_codes(x)}
                assert torch.equal(runs["im2col"](), runs["fused"]())
                t = {k: v.median * 1e3
                     for k, v in time_interleaved(runs, 41 if batch == 1 else 21, rewarm_below_s=1.0).items()}
            print(name, batch, {k: round(v, 3) for k, v in t.items()}, "fused/im2col speedup",
                  round(t["im2col"] / t["fused"], 2), "x fp32: im2col", round(t["fp32"] / t["im2col"], 2), "fused",
                  round(t["fp32"] / t["fused"], 2), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
