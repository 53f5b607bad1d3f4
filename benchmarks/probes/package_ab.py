"""Same-machine A/B of two installed packages (run once per package, alternating): the fused
GEMM + all-reduce at TP=1 against torch.mm, fused_tp1's four layers at 1 and 32 tokens, graphs of
20 calls, steady state (gpu_timing.time_variant), 2 rounds, the median. Timing and error only."""

import json
import statistics
import sys

import torch

import distgemm
from benchmarks.common.timing import SingleGpuContext, graphed, time_variant
from benchmarks.decode.fused_tp1 import LAYERS, start_world_of_one, uniform

CALLS = 20
label, out = sys.argv[1], sys.argv[2]
print(label, distgemm.__file__, flush=True)
dev = start_world_of_one()
gen = torch.Generator().manual_seed(3)
ctx = SingleGpuContext.current()
rows = []
first = True
for tokens in (1, 32):
    for name, (n, k) in LAYERS.items():
        a = uniform((tokens, k), gen, torch.bfloat16, dev)
        w = uniform((n, k), gen, torch.bfloat16, dev, k**-0.5)
        o1 = torch.empty(tokens, n, dtype=torch.bfloat16, device=dev)
        o2 = torch.empty_like(o1)
        g_mm = graphed(torch, lambda: torch.mm(a, w.t(), out=o1), CALLS)
        g_fu = graphed(torch, lambda: distgemm.gemm_all_reduce(a, w, out=o2, path="fused"), CALLS)
        mm, fu = [], []
        for r in range(2):
            mm.append(time_variant(ctx, g_mm.replay, warm_s=1.0 if first else 0.25) * 1e3 / CALLS)
            first = False
            fu.append(time_variant(ctx, g_fu.replay, warm_s=0.25) * 1e3 / CALLS)
        err = ((o2.float() - o1.float()).norm() / o1.float().norm()).item()
        rec = dict(
            variant=label,
            layer=name,
            n=n,
            k=k,
            m=tokens,
            mm_us=statistics.median(mm),
            fused_us=statistics.median(fu),
            err=err,
            floor_us=n * k * 2 / 4.8e12 * 1e6,
        )
        rows.append(rec)
        print(
            f"{label:5s} {name:9s} m={tokens:3d} mm={rec['mm_us']:7.2f} fused={rec['fused_us']:7.2f} "
            f"over={rec['fused_us'] - rec['mm_us']:6.2f} ratio={rec['fused_us'] / rec['mm_us']:.3f} err={err:.1e}",
            flush=True,
        )
        del g_mm, g_fu
with open(out, "w") as f:
    json.dump(rows, f, indent=1)
