import torch, time, statistics, tessera, sys
from tessera.ops.attention import cpu as ac
torch.set_num_threads(2)
def med(f, n=3):
    f(); ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return statistics.median(ts)*1e3
dt={"bf16":torch.bfloat16,"fp16":torch.float16,"fp32":torch.float32}[sys.argv[1]]
for causal in (True, False):
 for (B,L,Hq,Hk,D) in [(1,64,32,8,128),(1,128,32,8,128),(1,256,32,8,128),(1,512,32,8,128),(1,1024,32,8,128),(1,2048,32,8,128),(8,128,12,12,64),(2,512,12,12,64)]:
  q=torch.randn(B*L,Hq,D,dtype=dt); k=torch.randn(B*L,Hk,D,dtype=dt); v=torch.randn(B*L,Hk,D,dtype=dt)
  cu=torch.arange(0,B*L+1,L,dtype=torch.int32); sc=D**-0.5
  q4=q.view(B,L,Hq,D).transpose(1,2); k4=k.view(B,L,Hk,D).transpose(1,2); v4=v.view(B,L,Hk,D).transpose(1,2)
  wr = 0 if causal else -1
  tk=med(lambda: ac.forward(q,k,v,cu,cu,L,L,sc,-1,wr,0.0))
  tv=med(lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q4,k4,v4,0.0,causal,attn_mask=None,scale=sc))
  out,lse=ac.forward(q,k,v,cu,cu,L,L,sc,-1,wr,0.0)
  o2,l2=torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q4,k4,v4,0.0,causal,attn_mask=None,scale=sc)
  do=torch.randn_like(out); do4=do.view(B,L,Hq,D).transpose(1,2)
  tkb=med(lambda: ac.backward(do,q,k,v,out,lse,cu,cu,L,L,sc,-1,wr,0.0))
  tvb=med(lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(do4,q4,k4,v4,o2,l2,0.0,causal,attn_mask=None,scale=sc))
  print(sys.argv[1], "causal" if causal else "full", B,L,Hq,Hk,D, f"fwd k/v {tk:.2f}/{tv:.2f} ({tk/tv:.2f}) | bwd k/v {tkb:.2f}/{tvb:.2f} ({tkb/tvb:.2f})", flush=True)
