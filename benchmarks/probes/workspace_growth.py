"""Which workspace growths break an overlapped plan (2 ranks sharing one GPU). Each rank writes
its own JSON; failures never desynchronise the ranks' collectives (agreement first)."""

import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
from torchrun_worker import init_rank, rank, reference, rel_err

import distgemm
from distgemm.runtime import communicator as dcomm

dev = init_rank()
out = []
path = sys.argv[1].replace(".json", f"-r{rank()}.json")


def flush():
    json.dump(out, open(path, "w"), indent=1)


def agree(ok):
    t = torch.tensor([1 if ok else 0])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def inputs(m, n, k, seed):
    g = torch.Generator().manual_seed(seed * 1000 + rank())
    a = (torch.rand(m, k, generator=g) * 2 - 1).bfloat16().to(dev)
    w = ((torch.rand(n, k, generator=g) * 2 - 1) / k**0.5).bfloat16().to(dev)
    return a, w


def rs(c, m, seed, tag):
    a, w = inputs(m, 4096, 2048, seed)
    held, allocs = c.workspace_bytes, c.memory_stats().get("workspace_allocations")
    rec = dict(case=tag, m=m)
    try:
        z = distgemm.gemm_reduce_scatter(a, w, path="overlap", group=c)
        torch.cuda.synchronize()
        c.raise_launch_errors()
        ok = True
    except Exception:
        ok, rec["exc"] = False, traceback.format_exc()[-1500:]
    rec["allocs_before"], rec["allocs_after"] = (
        allocs,
        c.memory_stats().get("workspace_allocations"),
    )
    both = agree(ok)
    if both:
        rec["err"] = rel_err(z, reference("rs_tile_a", a, w, None, None, 0.0, torch.bfloat16)[0])
    rec["ok_here"], rec["ok_both"] = ok, both
    out.append(rec)
    flush()
    return both


def case(name, prep, seq):
    c = dcomm.Communicator(timeout_s=60.0, wait_timeout_s=15.0)
    try:
        prep(c)
        torch.cuda.synchronize()
        out.append(dict(case=name + "/prep", ok_here=True))
    except Exception:
        out.append(dict(case=name + "/prep", ok_here=False, exc=traceback.format_exc()[-1500:]))
    flush()
    for i, m in enumerate(seq):
        if not rs(c, m, 10 + i, f"{name}/{i}-m{m}"):
            break
    try:
        c.close()
    except Exception:
        out.append(dict(case=name + "/close", exc=traceback.format_exc()[-800:]))
    flush()


def nothing(c):
    pass


keep = []


def fused_captured(c):
    a, w = inputs(16, 8192, 4096, 9)
    o = torch.empty(16, 8192, dtype=torch.bfloat16, device=dev)
    distgemm.gemm_all_reduce(a, w, out=o, path="fused", group=c)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        distgemm.gemm_all_reduce(a, w, out=o, path="fused", group=c)
    g.replay()
    keep.append(g)


def overlap_captured(c):
    a, w = inputs(256, 4096, 2048, 9)
    o = torch.empty(128, 4096, dtype=torch.bfloat16, device=dev)
    distgemm.gemm_reduce_scatter(a, w, out=o, path="overlap", group=c)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        distgemm.gemm_reduce_scatter(a, w, out=o, path="overlap", group=c)
    g.replay()
    keep.append(g)


SEQ = [2048, 8192, 8192, 2048, 2048, 16384, 2048]
for name, prep in [
    ("plain", nothing),
    ("fused_captured", fused_captured),
    ("overlap_captured", overlap_captured),
]:
    case(name, prep, SEQ)
    dist.barrier()
    if rank() == 0:
        print(name, "done", flush=True)
dist.barrier()
os._exit(0)
