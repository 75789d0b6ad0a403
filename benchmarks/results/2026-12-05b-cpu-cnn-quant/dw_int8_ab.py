import torch, tessera, time, torch.nn.functional as F, sys
from tessera.ops._requant import cpu as rq
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
def best(fn, n=15):
    fn(); ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts)//2] * 1e3
g = torch.Generator().manual_seed(0)
for (b, C, H, s) in [(1,32,112,1),(1,96,112,2),(1,144,56,1),(1,144,56,2),(1,192,28,1),(1,384,14,1),(1,576,14,1),(1,960,7,1),(8,144,56,1)]:
    x = torch.randint(-128, 128, (b, C, H, H), generator=g, dtype=torch.int8).contiguous(memory_format=torch.channels_last)
    w = torch.randint(-127, 128, (C, 1, 3, 3), generator=g, dtype=torch.int8)
    bias = torch.randint(-5000, 5000, (C,), generator=g, dtype=torch.int32)
    m = torch.randint(2**30, 2**31 - 1, (C,), generator=g, dtype=torch.int64).to(torch.int32)
    sh = torch.full((C,), -8, dtype=torch.int32)
    xf = torch.randn(b, C, H, H).contiguous(memory_format=torch.channels_last); wf = torch.randn(C, 1, 3, 3)
    f = lambda: tessera.conv2d_int8(x, 3, w, bias, m, sh, s, 1, 1, 1, C, backend="cpu")
    r = {}
    for rep in range(2):
        for mode in (512, 0):
            rq._k3_available = (lambda: True) if mode else (lambda: False)
            r[mode] = min(r.get(mode, 9e9), best(f))
        r["fp32"] = min(r.get("fp32", 9e9), best(lambda: F.conv2d(xf, wf, None, s, 1, 1, C)))
    rq._k3_available = lambda: True
    y1 = f(); rq._k3_available = lambda: False; y0 = f()
    assert torch.equal(y0, y1)
    print(f"b{b} {C}@{H} s{s}: int old {r[0]:.3f}  new {r[512]:.3f} ms ({r[0]/r[512]:.2f}x)  fp32 F.conv2d {r['fp32']:.3f} -> new is {r['fp32']/r[512]:.2f}x fp32", flush=True)
