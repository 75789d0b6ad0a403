"""int_mm (int8 x int8 -> exact int32), tessera cpu with TESSERA_QI8_VNNI=1 (AMX where the broadcast GEMM runs) vs =2 (VNNI), and torch._int_mm, 2 threads, medians of 15."""
import torch, tessera, os, time, statistics
torch.set_num_threads(2)
def med(f, n=15):
    for _ in range(3): f()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return statistics.median(ts)*1e3
g=torch.Generator().manual_seed(0)
for (M,K,N) in [(3136,64,128),(3136,128,128),(3136,288,64),(12544,144,32),(784,256,256),(3136,576,64),(784,1152,128),(196,2304,256),(49,4608,512),(49,2304,512),(17,4096,4096),(32,4096,4096),(64,4096,4096),(128,4096,4096),(512,4096,4096)]:
    a=torch.randint(-128,128,(M,K),generator=g,dtype=torch.int8); b=torch.randint(-128,128,(N,K),generator=g,dtype=torch.int8)
    r={}
    for f in ("1","2"):
        os.environ["TESSERA_QI8_VNNI"]=f
        r[f]=med(lambda: tessera.int_mm(a,b,backend="cpu"))
    im=med(lambda: torch._int_mm(a,b.t())) if M>16 and K%8==0 else float('nan')
    print(f"M{M} K{K} N{N}: amx {r['1']:.3f} vnni {r['2']:.3f} ms  ({r['2']/r['1']:.2f}x)  torch._int_mm {im:.3f}  GOP/s amx {2*M*N*K/r['1']/1e6:.0f}", flush=True)
