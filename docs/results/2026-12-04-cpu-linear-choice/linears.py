import torch, time, torch.nn.functional as F
torch.manual_seed(0)
# SmolLM2-135M shapes, 30 layers, fused qkv [960,576], o [576,576], gate_up [3072,576], down [576,1536], head [49152,576]
Ws=[]
for _ in range(30):
    Ws += [torch.randn(960,576), torch.randn(576,576), torch.randn(3072,576), torch.randn(576,1536)]
Ws.append(torch.randn(49152,576))
def run(f, rows):
    xs={k:torch.randn(rows,k) for k in (576,1536)}
    def go():
        for W in Ws: f(xs[W.shape[1]], W)
    for _ in range(3): go()
    t=time.perf_counter(); n=10
    for _ in range(n): go()
    return (time.perf_counter()-t)/n*1e3
def pad(x,W):
    if x.shape[0]==1: x=torch.cat([x,x])
    return (W@x.T).T
for rows in (1,2,4):
    print(rows, f"F.linear {run(lambda x,W: F.linear(x,W), rows):.1f} ms   W@x.T(pad) {run(pad, rows):.1f} ms  W@x.T nopad {run(lambda x,W:(W@x.T).T, rows):.1f} ms  mv {run(lambda x,W: torch.mv(W,x[0]), rows):.1f}")
tot=sum(W.numel() for W in Ws)*4/1e6; print("MB", tot)
Wts=[W.t().contiguous() for W in Ws]
def run2(rows):
    xs={k:torch.randn(rows,k) for k in (576,1536)}
    def go():
        for W in Wts: xs[W.shape[0]] @ W
    for _ in range(3): go()
    t=time.perf_counter(); n=10
    for _ in range(n): go()
    return (time.perf_counter()-t)/n*1e3
for rows in (1,2,4,8):
    print(rows, "x @ Wt(contig [K,N])", round(run2(rows),1), "F.linear", round(run(lambda x,W: F.linear(x,W), rows),1))
