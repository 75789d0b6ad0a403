"""Whole-model latency at batch 1, 224x224, one thread, interleaved in one process (11 rounds, one
warm-up call each, median): tessera int8-static with the AMX tiles (TESSERA_QI8_VNNI=1) and with
VNNI (=2), tessera fp32 (fold_batchnorm, channels-last input) and eager fp32 channels-last.
Random-init torchvision architectures (tessera.testing.cnn_models), calibrated on 4 batches of
8 random 64x64 inputs.  Usage: python model_ab.py {mobilenet_v2,resnet18}"""
import os
import sys
import time

import torch

import tessera
from tessera.bench.report import machine_info
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
runs = {"int8 amx": ("1", lambda: q(x)), "int8 vnni": ("2", lambda: q(x)),
        "tessera fp32": (None, lambda: t(cl())), "eager fp32 channels-last": (None, lambda: mc(cl()))}
res = {k: [] for k in runs}
with torch.no_grad():
    for _ in range(11):
        for k, (flag, f) in runs.items():
            if flag:
                os.environ["TESSERA_QI8_VNNI"] = flag
            f()
            s = time.perf_counter()
            f()
            res[k].append(time.perf_counter() - s)
med = lambda v: sorted(v)[len(v) // 2] * 1e3  # noqa: E731
print("cpu:", machine_info().get("cpu"), "| 1 thread | torch", torch.__version__)
print(name, "b1 ms:", " | ".join(f"{k} {med(v):.2f}" for k, v in res.items()))
