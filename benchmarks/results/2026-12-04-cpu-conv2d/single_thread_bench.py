import torch, time, tessera, torch.nn.functional as F, os
torch.set_num_threads(int(os.environ.get("NT","1")))
from tessera.ops.conv2d.ref import conv2d_eager
def t(f, n=20):
    f(); f(); ts=[]
    for _ in range(n):
        t0=time.perf_counter(); f(); ts.append(time.perf_counter()-t0)
    ts.sort(); return ts[len(ts)//4]
shapes = [("r18-conv1-7x7s2",3,224,64,7,2,1,"relu"),("r18-l1-3x3-64",64,56,64,3,1,1,"relu"),("r18-l2-3x3-128",128,28,128,3,1,1,"relu"),
          ("r18-l3-3x3-256",256,14,256,3,1,1,"relu"),("r18-l4-3x3-512",512,7,512,3,1,1,"relu"),("r18-ds-1x1s2",64,56,128,1,2,1,None),
          ("mv2-dw-32x112",32,112,32,3,1,32,"relu6"),("mv2-dw-s2-96x112",96,112,96,3,2,96,"relu6"),("mv2-dw-144x56",144,56,144,3,1,144,"relu6"),
          ("mv2-dw-384x14",384,14,384,3,1,384,"relu6"),("mv2-dw-960x7",960,7,960,3,1,960,"relu6"),
          ("mv2-pw-144to24x56",144,56,24,1,1,1,None),("mv2-pw-64to384x14",64,14,384,1,1,1,"relu6"),("mv2-pw-960to160x7",960,7,160,1,1,1,None)]
print("| layer | batch | eager ms | tessera cpu ms | x eager (best of 3 interleaved rounds) |")
print("|---|---|---|---|---|")
for b in (1, 8):
  for name,ci,h,co,k,s,g,act in shapes:
    x = torch.randn(b,ci,h,h).contiguous(memory_format=torch.channels_last)
    w = torch.randn(co,ci//g,k,k); bias=torch.randn(co)
    kw = dict(x=x, weight=w, bias=bias, stride=s, padding=k//2, groups=g, activation=act)
    with torch.no_grad():
        r=[]
        for _ in range(3):
            ta = t(lambda: conv2d_eager(**kw)); tb = t(lambda: tessera.conv2d(**kw))
            r.append((ta/tb, ta, tb))
    best = max(r)
    print(f"| {name} | {b} | {best[1]*1e3:.3f} | {best[2]*1e3:.3f} | {best[0]:.2f} |")
