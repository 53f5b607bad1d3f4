"""Probe: is the fused op's ~1.4 us offset a property of the process (placement), not the build?
Times 3 shapes at one token, and prints where the fused buffers landed."""

import json
import sys

import torch

import distgemm
from benchmarks.common.timing import SingleGpuContext, graphed, time_variant
from benchmarks.decode.fused_tp1 import start_world_of_one, uniform
from distgemm.runtime.communicator import get_communicator

CALLS = 20
label, out = sys.argv[1], sys.argv[2]
dev = start_world_of_one()
gen = torch.Generator().manual_seed(3)
ctx = SingleGpuContext.current()
rows = []
for n, k in [(8192, 64), (8192, 4096), (16384, 64)]:
    a = uniform((1, k), gen, torch.bfloat16, dev)
    w = uniform((n, k), gen, torch.bfloat16, dev, k**-0.5)
    o1 = torch.empty(1, n, dtype=torch.bfloat16, device=dev)
    o2 = torch.empty_like(o1)
    g_mm = graphed(torch, lambda: torch.mm(a, w.t(), out=o1), CALLS)
    g_fu = graphed(torch, lambda: distgemm.gemm_all_reduce(a, w, out=o2, path="fused"), CALLS)
    mm = time_variant(ctx, g_mm.replay, warm_s=0.3) * 1e3 / CALLS
    fu = time_variant(ctx, g_fu.replay, warm_s=0.3) * 1e3 / CALLS
    c = get_communicator()
    recv = c._fused_receive.current.bases[0] if c._fused_receive else 0
    ctrl = c._fused_control.bases[0]
    rec = dict(
        variant=label,
        n=n,
        k=k,
        mm_us=mm,
        fused_us=fu,
        recv=recv,
        ctrl=ctrl,
        a=a.data_ptr(),
        w=w.data_ptr(),
        out=o2.data_ptr(),
    )
    rows.append(rec)
    print(
        f"{label:6s} n={n:6d} k={k:5d} mm={mm:6.2f} fused={fu:6.2f} diff={fu - mm:5.2f} "
        f"recv%2M={recv % (2 << 20):8d} ctrl%2M={ctrl % (2 << 20):8d} out%2M={o2.data_ptr() % (2 << 20)} "
        f"a%2M={a.data_ptr() % (2 << 20)}",
        flush=True,
    )
json.dump(rows, open(out, "w"), indent=1)
