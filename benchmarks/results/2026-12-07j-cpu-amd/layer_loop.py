"""Median ms of one conv layer of int8-static MobileNetV2 / ResNet-18 as the quantized model calls it
(its own forward_codes on the codes recorded from one 224x224 forward; random-init torchvision
architecture calibrated on 4 batches of 8 random 64x64 inputs; one thread; 20 untimed calls, then
`reps` timed).  The tessera timed is whatever `import tessera` finds: stem_ab.txt alternates
processes of three checkouts (PYTHONPATH=<checkout>/src).

    python layer_loop.py {mobilenet_v2,resnet18} {1,8} <layer index> <reps>
"""
import statistics, sys, time, torch, tessera
from tessera.quant.static import StaticQuantConv2d
from tessera.testing.cnn_models import mobilenet_v2, resnet18
name, batch, idx, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1); torch.manual_seed(0)
m = {"mobilenet_v2": mobilenet_v2, "resnet18": resnet18}[name]().eval()
g = torch.Generator().manual_seed(0)
q = tessera.quantize(m, "int8-static", calibration=[torch.randn(8, 3, 64, 64, generator=g) for _ in range(4)])
seen, orig = [], StaticQuantConv2d.forward_codes
StaticQuantConv2d.forward_codes = lambda self, x: (seen.append((self, x)), orig(self, x))[1]
with torch.no_grad():
    q(torch.randn(batch, 3, 224, 224))
    StaticQuantConv2d.forward_codes = orig
    layer, x = seen[idx]
    for _ in range(20): layer.forward_codes(x)
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); layer.forward_codes(x); ts.append(time.perf_counter() - t)
print(f"{name} b{batch} layer {idx} {tuple(x.shape)}: median {statistics.median(ts) * 1e3:.3f} ms")
