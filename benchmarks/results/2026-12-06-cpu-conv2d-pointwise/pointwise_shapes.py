import torch, time, statistics, torch.nn.functional as F, tessera
from tessera import dispatch
torch.set_num_threads(2)
def med(f, n=15):
    for _ in range(3): f()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return statistics.median(ts)*1e3
for (b,C,H,Co,k,s,act) in [(1,3,224,64,7,2,"relu"),(8,3,224,64,7,2,"relu"),(1,64,56,128,1,2,None),(8,64,56,128,1,2,None),(1,16,112,96,1,1,"relu6"),(1,24,56,144,1,1,"relu6"),(1,144,56,24,1,1,None),(1,960,7,160,1,1,None),(1,64,14,384,1,1,"relu6"),(8,960,7,160,1,1,None)]:
    x=torch.randn(b,C,H,H).contiguous(memory_format=torch.channels_last); w=torch.randn(Co,C,k,k)*0.1; bb=torch.randn(Co)
    r={}
    for rep in range(2):
        for m in ("kernel","vendor","auto"):
            with dispatch.forced(m):
                v=med(lambda: tessera.conv2d(x,w,bb,stride=s,padding=k//2,activation=act))
                r[m]=min(r.get(m,9e9),v)
    print(f"b{b} {C}->{Co} {H} k{k} s{s} NK={Co*C*k*k}: kernel {r['kernel']:.3f} vendor {r['vendor']:.3f} auto {r['auto']:.3f}  k/v {r['kernel']/r['vendor']:.2f}", flush=True)
