import os, torch
import tessera
from tessera.bench.timing import time_interleaved
torch.manual_seed(0)
def mk(mode, x, w, b):
    def f():
        os.environ["TESSERA_DISPATCH"] = mode
        return tessera.conv2d(x, w, b)
    return f
with torch.no_grad():
    for cin, cout in [(960, 160), (64, 384), (144, 24), (320, 1280), (576, 96)]:
        row = []
        for n, h in [(1, 14), (2, 14), (8, 7), (3, 14), (1, 28)]:
            x = torch.randn(n, cin, h, h).contiguous(memory_format=torch.channels_last)
            w = torch.randn(cout, cin, 1, 1) * cin ** -0.5; b = torch.randn(cout)
            t = time_interleaved({"k": mk("kernel", x, w, b), "v": mk("vendor", x, w, b)}, 25, rewarm_below_s=1.0)
            row.append(f"M={n*h*h}: k/v {t['k'].median / t['v'].median:.2f}")
        print(f"{cin}->{cout}", " | ".join(row), flush=True)
