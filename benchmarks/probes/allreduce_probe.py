"""Probe of distgemm's own all-reduce against NCCL at decode sizes: per size (16 KB .. 8 MB of bf16)
the steady-state time per call of one_shot, two_shot, one_shot_ll, two_shot_ll (LL lines: no fence,
no flag, twice the bytes) and NCCL all_reduce, each from a CUDA graph
of CALLS back-to-back calls (benchmarks/common/timing.py: >= 1 s warm-up, then a >= 1 s window,
the median over calls of the slowest rank), and a table plus JSON.

    torchrun --nproc-per-node 8 -m benchmarks.probes.allreduce_probe --out allreduce_probe.json

Ours runs out of place (src fixed, out apart), NCCL in place; each size's result of ours is
checked against NCCL's once before timing (relative Frobenius error, bf16).
"""

from __future__ import annotations

import argparse
import json

from benchmarks.common.timing import WARMUP_S, RankContext, graphed, rel_err, time_variant

CALLS = 20
OURS = ("one_shot", "two_shot", "one_shot_ll", "two_shot_ll")
SIZES_KB = [16 << i for i in range(10)]  # 16 KB .. 8 MB


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="allreduce_probe.json")
    args = ap.parse_args()
    ctx = RankContext.from_torchrun()
    torch, dist = ctx.torch, ctx.dist

    from distgemm.runtime.allreduce import run_all_reduce
    from distgemm.runtime.communicator import Communicator

    comm = Communicator()
    device = torch.cuda.get_device_name(ctx.dev)
    rows = []
    for kb in SIZES_KB:
        numel = kb * 1024 // 2
        gen = torch.Generator(device=ctx.dev).manual_seed(kb * 8 + ctx.rank)
        src = (torch.rand(numel, device=ctx.dev, generator=gen) * 2 - 1).to(torch.bfloat16)
        out = torch.empty_like(src)
        ref = src.clone()
        dist.all_reduce(ref)
        errs = {}
        for algo in OURS:
            run_all_reduce(comm, src, algo, False, out=out)
            torch.cuda.synchronize()
            errs[algo] = rel_err(torch, out, ref)
        comm.raise_launch_errors()
        nccl_buf = src.clone()

        def ours(algo):
            def call():
                capturing = torch.cuda.is_current_stream_capturing()
                run_all_reduce(comm, src, algo, capturing, out=out)

            return call

        variants = {algo: ours(algo) for algo in OURS}
        variants["nccl"] = lambda: dist.all_reduce(nccl_buf)
        row = {"kb": kb, "numel": numel, "tp": ctx.tp, "rel_err_vs_nccl": errs}
        for name, fn in variants.items():
            g = graphed(torch, fn, CALLS)
            ms = time_variant(ctx, g.replay, warm_s=WARMUP_S)
            row[f"{name}_us"] = ms * 1e3 / CALLS
            del g
        comm.raise_launch_errors()
        best = min(OURS, key=lambda a: row[f"{a}_us"])
        row["best_ours"] = best
        row["speedup_vs_nccl"] = row["nccl_us"] / row[f"{best}_us"]
        rows.append(row)
        if ctx.rank == 0:  # written after every size: a run stopped by its time limit keeps them
            with open(args.out, "w") as f:
                json.dump(
                    {"tp": ctx.tp, "device": device, "calls_per_graph": CALLS, "rows": rows}, f
                )
            times = "  ".join(f"{a} {row[f'{a}_us']:8.2f} us" for a in (*OURS, "nccl"))
            print(
                f"{kb:>6} KB  {times}  best {best} x{row['speedup_vs_nccl']:.2f}  err {errs}",
                flush=True,
            )
    if ctx.rank == 0:
        print(f"\nTP={ctx.tp} on {device}, us per call, graph of {CALLS} calls, median")
        names = (*OURS, "nccl")
        print(f"{'size':>8} " + " ".join(f"{a:>11}" for a in names) + f" {'best/nccl':>10}")
        for r in rows:
            times = " ".join(f"{r[f'{a}_us']:>11.2f}" for a in names)
            print(f"{r['kb']:>5} KB {times} {r['speedup_vs_nccl']:>9.2f}x")
    comm.close()
    ctx.close()


if __name__ == "__main__":
    main()
