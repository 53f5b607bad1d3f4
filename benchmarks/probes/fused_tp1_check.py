# One-GPU check of the fused path at TP=1 (torchrun --nproc-per-node 1): correctness, capture, and
# captured timing against torch.mm on decode shapes (the kernel and its tail, without NVLink).
import datetime
import json
import os
import time

import torch
import torch.distributed as dist

import distgemm

dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
dist.init_process_group("nccl", device_id=dev, timeout=datetime.timedelta(seconds=120))
out = {"correct": [], "timing": []}


def rel(x, r):
    return float((x.float() - r).norm() / r.norm())


g = torch.Generator(device="cpu").manual_seed(1)


def mk(m, n, k, dt):
    a = (torch.rand(m, k, generator=g) * 2 - 1).to(dt).to(dev)
    w = ((torch.rand(n, k, generator=g) * 2 - 1) / k**0.5).to(dt).to(dev)
    return a, w


for i, (m, n, k) in enumerate(
    [
        (1, 1024, 4096),
        (3, 1024, 4096),
        (8, 8192, 4096),
        (64, 1024, 4096),
        (100, 1024, 192),
        (129, 1024, 4096),
        (256, 8192, 4096),
        (300, 2048, 1024),
        (5, 4096, 14336),
    ]
):
    for dt in (torch.bfloat16, torch.float16):
        a, w = mk(m, n, k, dt)
        b = (torch.rand(n, generator=g) * 2 - 1).to(dt).to(dev) if i % 2 else None
        c = (torch.rand(m, n, generator=g) * 2 - 1).to(dt).to(dev) if i % 3 == 2 else None
        beta = 0.5 if c is not None else 0.0
        try:
            y = distgemm.gemm_all_reduce(a, w, bias=b, c=c, beta=beta, path="fused")
            r = (
                a.float() @ w.float().t()
                + (beta * c.float() if c is not None else 0)
                + (b.float() if b is not None else 0)
            )
            e = rel(y, r)
            out["correct"].append(dict(m=m, n=n, k=k, dt=str(dt), err=e, ok=e < 1e-2))
        except Exception as ex:
            out["correct"].append(dict(m=m, n=n, k=k, dt=str(dt), error=repr(ex)[:300], ok=False))
        print(out["correct"][-1], flush=True)
print(
    "choices",
    [
        (p["m"], p["path"], p.get("fused_splits"), p.get("fused_token_tile"))
        for p in distgemm.path_choices()
    ][-6:],
    flush=True,
)
# capture + replays
a, w = mk(16, 8192, 4096, torch.bfloat16)
o = torch.empty(16, 8192, dtype=torch.bfloat16, device=dev)
distgemm.gemm_all_reduce(a, w, out=o, path="fused")
torch.cuda.synchronize()
gr = torch.cuda.CUDAGraph()
with torch.cuda.graph(gr):
    distgemm.gemm_all_reduce(a, w, out=o, path="fused")
worst = 0
for i in range(300):
    a.copy_((torch.rand(16, 4096, generator=g) * 2 - 1).to(torch.bfloat16))
    gr.replay()
    worst = max(worst, rel(o, a.float() @ w.float().t()))
print("capture 300 replays worst", worst, flush=True)
out["capture_worst"] = worst
distgemm.runtime.communicator.get_communicator().raise_launch_errors()


# timing: graphs of 20 calls, interleaved, 1 s warm-up
def graph_of(fn):
    fn()
    torch.cuda.synchronize()
    gg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gg):
        for _ in range(20):
            fn()
    return gg


def t_us(gg, reps=30):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        s.record()
        gg.replay()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1000 / 20)
    ts.sort()
    return ts[len(ts) // 2]


for model, layer, n, k in [
    ("70B", "O", 8192, 4096),
    ("70B", "FC2", 8192, 14336),
    ("405B", "O", 16384, 8192),
    ("405B", "FC2", 16384, 26624),
]:
    for m in (1, 8, 32, 128, 256):
        a, w = mk(m, n, k, torch.bfloat16)
        o1 = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
        o2 = torch.empty_like(o1)
        gm = graph_of(lambda: torch.mm(a, w.t(), out=o1))
        gf = graph_of(lambda: distgemm.gemm_all_reduce(a, w, out=o2, path="fused"))
        t0 = time.time()
        while time.time() - t0 < 0.5:
            gm.replay()
            gf.replay()
        mm, fu = [], []
        for _ in range(3):
            mm.append(t_us(gm))
            fu.append(t_us(gf))
        mm.sort()
        fu.sort()
        rec = dict(
            model=model,
            layer=layer,
            m=m,
            n=n,
            k=k,
            mm_us=mm[1],
            fused_us=fu[1],
            ratio=fu[1] / mm[1],
            err=rel(o2, o1.float()),
        )
        out["timing"].append(rec)
        print(rec, flush=True)
distgemm.runtime.communicator.get_communicator().raise_launch_errors()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "r", "fused1.json"), "w"), indent=1)
dist.destroy_process_group()
