import torch, tessera, time, statistics, torch.nn.functional as F, sys
from tessera import dispatch
from tessera.ops.conv2d import cpu as cc
def best(fn,n=7):
    fn(); ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    return min(ts)*1e3
dt={"fp32":torch.float32,"bf16":torch.bfloat16,"fp16":torch.float16}[sys.argv[1]]
shapes=[(1,32,112,32,3,1,32),(1,96,112,96,3,2,96),(1,144,56,144,3,1,144),(1,384,14,384,3,1,384),(1,960,7,960,3,1,960),(8,144,56,144,3,1,144),(8,384,14,384,3,1,384),(8,960,7,960,3,1,960),(4,144,28,144,3,1,144),(1,144,28,144,3,1,144)]
for (b,C,H,Co,k,s,g) in shapes:
    x=torch.randn(b,C,H,H).to(dt).contiguous(memory_format=torch.channels_last)
    w=(torch.randn(Co,C//g,k,k)*0.05).to(dt); bias=torch.randn(Co).to(dt)
    OH=(H+2*(k//2)-k)//s+1
    dy=torch.randn(b,Co,OH,OH).to(dt).contiguous(memory_format=torch.channels_last)
    fwd=lambda: tessera.conv2d(x,w,bias,stride=s,padding=k//2,groups=g,activation="relu")
    bwd=lambda: cc.backward(dy,x,w,bias,(s,s),(k//2,)*4,(1,1),g,None,True)
    r={}
    for rep in range(2):
        for m in ("kernel","vendor"):
            with dispatch.forced(m):
                r["f"+m]=min(r.get("f"+m,9e9),best(fwd)); r["b"+m]=min(r.get("b"+m,9e9),best(bwd,3))
    M=b*OH*OH
    print(f"{sys.argv[1]} b{b} {C}->{Co} {H}x{H} k{k} s{s} g{g} M={M}: fwd k/v {r['fkernel']:.3f}/{r['fvendor']:.3f} ({r['fkernel']/r['fvendor']:.2f})  bwd k/v {r['bkernel']:.3f}/{r['bvendor']:.3f} ({r['bkernel']/r['bvendor']:.2f})", flush=True)
