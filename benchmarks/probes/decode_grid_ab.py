"""A/B probe: the decode kernel's balanced grid (the rule's ctas) against the grid that
reproduces the previous decomposition (tiles in rounds, or tiles x whole splits), same kernel,
same process, interleaved; torch.mm beside. TP=1, one GPU. Timing and error only."""

import json
import statistics
import sys

import torch
import torch.distributed as dist

import distgemm
from benchmarks.common.timing import SingleGpuContext, graphed, time_variant
from benchmarks.decode.fused_tp1 import start_world_of_one, uniform
from distgemm import _core

CALLS = 20
out = sys.argv[1]
TOKENS = [int(t) for t in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 16, 32]
dev = start_world_of_one()
gen = torch.Generator().manual_seed(3)
SHAPES = [(8192, 4096), (8192, 14336), (4096, 2048)]
ctx = SingleGpuContext.current()
old_group = dist.new_group([0])
real_ctas, real_splits = _core.fused_ctas, _core.fused_splits


def old_ctas(m, n, k, resident):
    """Every resident CTA with the K steps cut into equal shares (possible where the tiles are
    fewer than the CTAs): the variant of call 1, now with the division in 32-bit arithmetic."""
    return resident


def patched(fn):
    _core.fused_ctas = lambda m, n, k, r: old_ctas(m, n, k, r)
    _core.fused_splits = lambda m, n, k, r: max(
        p for _, p in _core.fused_decode_pieces(m, n, k, old_ctas(m, n, k, r))
    )
    try:
        return fn()
    finally:
        _core.fused_ctas, _core.fused_splits = real_ctas, real_splits


rows = []
for tokens in TOKENS:
    for n, k in SHAPES:
        a = uniform((tokens, k), gen, torch.bfloat16, dev)
        w = uniform((n, k), gen, torch.bfloat16, dev, k**-0.5)
        o = {
            v: torch.empty(tokens, n, dtype=torch.bfloat16, device=dev)
            for v in ("mm", "old", "new")
        }
        g = {
            "mm": graphed(torch, lambda: torch.mm(a, w.t(), out=o["mm"]), CALLS),
            "old": patched(
                lambda: graphed(
                    torch,
                    lambda: distgemm.gemm_all_reduce(
                        a, w, out=o["old"], path="fused", group=old_group
                    ),
                    CALLS,
                )
            ),
            "new": graphed(
                torch, lambda: distgemm.gemm_all_reduce(a, w, out=o["new"], path="fused"), CALLS
            ),
        }
        t = {v: [] for v in g}
        for r in range(3):
            for v in ("mm", "old", "new"):
                t[v].append(
                    time_variant(ctx, g[v].replay, warm_s=0.5 if r == 0 and v == "mm" else 0.25)
                    * 1e3
                    / CALLS
                )
        ref = a.float() @ w.float().t()
        err = {v: ((o[v].float() - ref).norm() / ref.norm()).item() for v in ("old", "new")}
        rec = dict(
            m=tokens,
            n=n,
            k=k,
            mb=n * k * 2 / 1e6,
            err=err,
            old_ctas=old_ctas(tokens, n, k, 132),
            new_ctas=real_ctas(tokens, n, k, 132),
            **{f"{v}_us": statistics.median(t[v]) for v in t},
            all=t,
        )
        rec["floor_us"] = n * k * 2 / 4.8e12 * 1e6
        rows.append(rec)
        print(
            f"m={tokens:3d} n={n:6d} k={k:6d} mm={rec['mm_us']:7.2f} k132={rec['old_us']:7.2f} "
            f"new={rec['new_us']:7.2f} new/k132={rec['new_us'] / rec['old_us']:.3f} "
            f"new/mm={rec['new_us'] / rec['mm_us']:.3f} floor={rec['floor_us']:.1f} "
            f"err k132={err['old']:.1e} new={err['new']:.1e} ctas {rec['old_ctas']}->{rec['new_ctas']}",
            flush=True,
        )
        del g
with open(out, "w") as f:
    json.dump(rows, f, indent=1)
