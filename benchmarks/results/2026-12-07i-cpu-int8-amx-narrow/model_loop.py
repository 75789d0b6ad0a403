"""Median ms of an int8-static model's forward (random-init torchvision ResNet-18 / MobileNetV2,
calibrated on 4 batches of 8 random 64x64 inputs, 224x224 input, one thread, 3 untimed forwards,
then `reps` timed).  The tessera timed is whatever `import tessera` finds: the A/B in model_ab.txt
alternates processes of the current code and of the previous commit (PYTHONPATH=<checkout>/src).

    python model_loop.py {resnet18,mobilenet_v2} {1,8} <reps>
"""
import sys, time, torch, tessera
from tessera.testing.cnn_models import mobilenet_v2, resnet18
torch.set_num_threads(1); torch.manual_seed(0)
name, batch, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = {"mobilenet_v2": mobilenet_v2, "resnet18": resnet18}[name]().eval()
g = torch.Generator().manual_seed(0)
q = tessera.quantize(m, "int8-static", calibration=[torch.randn(8, 3, 64, 64, generator=g) for _ in range(4)])
x = torch.randn(batch, 3, 224, 224)
with torch.no_grad():
    for _ in range(3): q(x)
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); q(x); ts.append(time.perf_counter() - t)
ts.sort(); print(f"{name} b{batch}: median {ts[len(ts)//2]*1e3:.2f} ms")
