"""1x1 fp32 convs (channels-last, with bias): kernel time over vendor time (TESSERA_DISPATCH forced
per call), interleaved; two sweeps: channel pairs at M = 196-784, then MobileNetV2-like layers
at batch 1 and 4.  python pointwise_routes.py"""
import os

import torch

import tessera
from tessera.bench.timing import time_interleaved

SWEEPS = [  # (cin, cout, [(batch, H), ...])
    *[(ci, co, [(1, 14), (2, 14), (8, 7), (3, 14), (1, 28)])
      for ci, co in [(960, 160), (64, 384), (144, 24), (320, 1280), (576, 96)]],
    *[(ci, co, [(1, h), (4, h)]) for ci, co, h in [(144, 24, 56), (96, 24, 56), (192, 32, 28), (384, 64, 14),
                                                  (24, 144, 56), (32, 192, 28), (144, 32, 56), (240, 40, 28)]],
]


def mk(mode, x, w, b):
    def f():
        os.environ["TESSERA_DISPATCH"] = mode
        return tessera.conv2d(x, w, b)
    return f


torch.manual_seed(0)
with torch.no_grad():
    for cin, cout, sizes in SWEEPS:
        row = []
        for n, h in sizes:
            x = torch.randn(n, cin, h, h).contiguous(memory_format=torch.channels_last)
            w = torch.randn(cout, cin, 1, 1) * cin ** -0.5
            b = torch.randn(cout)
            t = time_interleaved({"k": mk("kernel", x, w, b), "v": mk("vendor", x, w, b)}, 25, rewarm_below_s=1.0)
            row.append(f"M={n * h * h}: k/v {t['k'].median / t['v'].median:.2f}")
        print(f"{cin}->{cout}", " | ".join(row), flush=True)
