"""Whole-model latency at batch 1, 224x224, one thread, interleaved in one process
(tessera.bench.timing.time_interleaved, an untimed call before each sample, median): int8-static
with conv2d_int8's C++ twin (csrc/fastpath_conv2d_int8.h) and with the twin switched off (the
Python body), tessera fp32 (fold_batchnorm, channels-last input, conv2d's twin), against eager
fp32 channels-last.  Random-init torchvision architectures (tessera.testing.cnn_models); int8 calibrated
on 4 batches of 8 random 64x64 inputs.  Usage: python model_ab.py {mobilenet_v2,resnet18}"""
import sys

import torch

import tessera
from tessera import _library
from tessera.bench.report import machine_info
from tessera.bench.timing import time_interleaved
from tessera.ops.conv2d_int8 import _impl
from tessera.testing.cnn_models import mobilenet_v2, resnet18

torch.set_num_threads(1)
torch.manual_seed(0)
name = sys.argv[1] if len(sys.argv) > 1 else "mobilenet_v2"
m = {"mobilenet_v2": mobilenet_v2, "resnet18": resnet18}[name]().eval()
g = torch.Generator().manual_seed(0)
q = tessera.quantize(m, "int8-static", calibration=[torch.randn(8, 3, 64, 64, generator=g) for _ in range(4)])
t = tessera.fold_batchnorm(m).to(memory_format=torch.channels_last)
mc = m.to(memory_format=torch.channels_last)
x = torch.randn(1, 3, 224, 224)
cl = lambda: x.to(memory_format=torch.channels_last)  # noqa: E731  (the conversion is timed too)


def python_path(f):
    def run():
        twin = _library._FAST.pop(_impl, None)
        try:
            return f()
        finally:
            if twin is not None:
                _library._FAST[_impl] = twin
    return run


with torch.no_grad():
    t(cl())  # loads the C++ fast path
    runs = {"int8-static": lambda: q(x), "int8-static (python path)": python_path(lambda: q(x)),
            "tessera fp32": lambda: t(cl()), "eager fp32 channels-last": lambda: mc(cl())}
    res = time_interleaved(runs, 15, rewarm_below_s=1.0)
e = res["eager fp32 channels-last"].median
print("cpu:", machine_info().get("cpu"), "| 1 thread | torch", torch.__version__)
print(name, "b1 ms (x eager):", " | ".join(f"{k} {v.median * 1e3:.2f} ({e / v.median:.2f})" for k, v in res.items()))
