"""Probe: the decode kernel's fixed cost and streaming rate at TP=1, against torch.mm, over a
grid of (N, K) at one token (timing only)."""

import json
import statistics
import sys

import torch

import distgemm
from benchmarks.common.timing import SingleGpuContext, graphed, time_variant
from benchmarks.decode.fused_tp1 import start_world_of_one, uniform

CALLS = 20
label = sys.argv[1]
out = sys.argv[2]
tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 1
dev = start_world_of_one()
gen = torch.Generator().manual_seed(3)
SHAPES = [
    (8192, 64),
    (8192, 1024),
    (8192, 4096),
    (8192, 14336),
    (8448, 4096),
    (16384, 64),
    (16384, 4096),
    (16384, 8192),
    (16896, 8192),
    (16384, 26624),
]
ctx = SingleGpuContext.current()
rows = []
for n, k in SHAPES:
    a = uniform((tokens, k), gen, torch.bfloat16, dev)
    w = uniform((n, k), gen, torch.bfloat16, dev, k**-0.5)
    o1 = torch.empty(tokens, n, dtype=torch.bfloat16, device=dev)
    o2 = torch.empty_like(o1)
    g_mm = graphed(torch, lambda: torch.mm(a, w.t(), out=o1), CALLS)
    g_fu = graphed(torch, lambda: distgemm.gemm_all_reduce(a, w, out=o2, path="fused"), CALLS)
    mm, fu = [], []
    for r in range(2):
        mm.append(time_variant(ctx, g_mm.replay, warm_s=0.5 if r == 0 else 0.25) * 1e3 / CALLS)
        fu.append(time_variant(ctx, g_fu.replay, warm_s=0.25) * 1e3 / CALLS)
    err = ((o2.float() - o1.float()).norm() / o1.float().norm()).item()
    rec = dict(
        variant=label,
        n=n,
        k=k,
        m=tokens,
        mm_us=statistics.median(mm),
        fused_us=statistics.median(fu),
        err=err,
        mb=n * k * 2 / 1e6,
    )
    rows.append(rec)
    print(
        f"{label:10s} n={n:6d} k={k:6d} MB={rec['mb']:7.1f} mm={rec['mm_us']:7.2f} "
        f"fused={rec['fused_us']:7.2f} diff={rec['fused_us'] - rec['mm_us']:6.2f} err={err:.1e}",
        flush=True,
    )
    del g_mm, g_fu
with open(out, "w") as f:
    json.dump(rows, f, indent=1)
