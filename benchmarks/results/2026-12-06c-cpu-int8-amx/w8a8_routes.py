"""linear_w8a8 at N = K = argv[1], M in argv[2] (comma-separated): tessera kernel vs its vendor route (quantize rows + torch._int_mm), 2 threads, best of 3 medians of 15."""
import torch, time, statistics, tessera
from tessera import dispatch
from tessera.quant import contract
torch.set_num_threads(2)
def med(f, n=15):
    for _ in range(3): f()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return statistics.median(ts)*1e3
g=torch.Generator().manual_seed(0)
import sys
N=K=int(sys.argv[1])
w=torch.randn(N,K,generator=g)*0.05; qw,sw=contract.quantize_rows(w,torch.int8)
for dt in (torch.float32, torch.bfloat16):
  for M in [int(v) for v in sys.argv[2].split(",")]:
    x=torch.randn(M,K,generator=g).to(dt)
    r={}
    for rep in range(3):
      for m in ("kernel","vendor"):
        with dispatch.forced(m):
            v=med(lambda: tessera.linear_w8a8(x,qw,sw))
        r[m]=min(r.get(m,9e9),v)
    print(str(dt)[6:], M, f"kernel {r['kernel']:.3f} vendor {r['vendor']:.3f} k/v {r['kernel']/r['vendor']:.2f}", flush=True)
