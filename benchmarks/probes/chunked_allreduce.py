"""Probe of a decode GEMM + all-reduce pipelined in column chunks: how much of the all-reduce a
second stream hides under the GEMM's remaining columns, against the collective path as it runs
today, in one run (issue 42: the median target needs the GEMM and the all-reduce to overlap).

    torchrun --nproc-per-node N -m benchmarks.probes.chunked_allreduce [--tokens 32,128,256]
             [--layers 70B/O,70B/FC2,405B/O,405B/FC2] [--chunks 2,4] [--out FILE.json]

Per layer (Llama-3 row-parallel O or FC2 at TP = world size: this rank's weight [N, K/TP]) and
token count M, each variant a CUDA graph of CALLS calls cycling through weight copies that span
twice the L2 (``calibrate.weight_copies``), timed as the other decode benchmarks time
(``time_variant``: warm-up, then a window of at least 1 s; the slowest rank's median), in the
order base, chunked..., base (A B A: the base's two windows are both reported):

  base      torch.mm into two_shot_pull's input region, then two_shot_pull into the output: the
            collective path of ``gemm_all_reduce`` where the decode model picks two_shot_pull
  chunks=c  the weight's rows (output columns) cut into c blocks; block i's torch.mm writes its
            [M, N/c] partial into the pull region of communicator i (one per block, so each
            block's input lies at its region's start, as two_shot_pull reads it) on the
            current stream, and a second stream runs block i's two_shot_pull once that GEMM is
            done, while the current stream computes block i+1

What this leaves out, so the chunked times are a bound of what a real path would get:
- each block's sums land in an [M, N/c] output of their own;
- a real path stores them into the [M, N] output's columns, which needs a kernel with a row
  stride (the probe's blocks are contiguous).

Each variant's output is checked once against torch.mm + NCCL all_reduce of the whole
partial (relative Frobenius error < ERR_TOL) before timing.
"""

from __future__ import annotations

import argparse
import json

from benchmarks.common.llama_cases import MODELS
from benchmarks.common.timing import ERR_TOL, WARMUP_S, RankContext, rel_err, time_variant

CALLS = 20
ALGORITHM = "two_shot_pull"


def layer_shape(name: str, tp: int) -> tuple[int, int]:
    """(N, K per rank) of a row-parallel layer "MODEL/O" or "MODEL/FC2" at ``tp``."""
    model, layer = name.split("/")
    m = MODELS[model]
    hidden = m["hidden"]
    k = hidden if layer == "O" else m["ffn"]
    if layer not in ("O", "FC2") or k % tp:
        raise SystemExit(f"--layers: {name} is not a row-parallel O or FC2 layer at TP={tp}")
    return hidden, k // tp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="32,128,256")
    ap.add_argument("--layers", default="70B/O,70B/FC2,405B/O,405B/FC2")
    ap.add_argument("--chunks", default="2,4")
    ap.add_argument("--out", default="chunked_allreduce.json")
    args = ap.parse_args()
    ctx = RankContext.from_torchrun()
    torch = ctx.torch

    from distgemm.calibrate import l2_bytes, weight_copies
    from distgemm.runtime.allreduce import AllReduceResources, all_reduce_input, run_all_reduce
    from distgemm.runtime.communicator import Communicator

    chunk_counts = [int(c) for c in args.chunks.split(",")]
    comms = [Communicator() for _ in range(max(chunk_counts))]
    side = torch.cuda.Stream(ctx.dev)
    device = torch.cuda.get_device_name(ctx.dev)
    rows = []
    for name in args.layers.split(","):
        n, k = layer_shape(name, ctx.tp)
        gen = torch.Generator(device=ctx.dev).manual_seed(7 + ctx.rank)
        w = (torch.rand(n, k, device=ctx.dev, generator=gen) - 0.5).to(torch.bfloat16) / k**0.5
        ws = [w] + [w.clone() for _ in range(weight_copies(w.numel() * 2, l2_bytes(ctx.dev)) - 1)]
        for m in (int(t) for t in args.tokens.split(",")):
            a = (torch.rand(m, k, device=ctx.dev, generator=gen) - 0.5).to(torch.bfloat16)
            ref = torch.mm(a, w.t())
            ctx.dist.all_reduce(ref)
            base_out = torch.empty(m, n, device=ctx.dev, dtype=torch.bfloat16)
            turn = [0]

            def base():
                capturing = torch.cuda.is_current_stream_capturing()
                x = all_reduce_input(comms[0], ALGORITHM, base_out, capturing)
                torch.mm(a, ws[turn[0] % len(ws)].t(), out=x)
                turn[0] += 1
                run_all_reduce(comms[0], x, ALGORITHM, capturing, out=base_out)

            def chunked(c: int):
                if n % (c * 8):
                    return None, None
                outs = [
                    torch.empty(m, n // c, device=ctx.dev, dtype=torch.bfloat16) for _ in range(c)
                ]

                def call():
                    capturing = torch.cuda.is_current_stream_capturing()
                    main = torch.cuda.current_stream(ctx.dev)
                    wt = ws[turn[0] % len(ws)]
                    turn[0] += 1
                    side.wait_stream(main)  # the side stream's work follows the caller's
                    for i in range(c):
                        x = all_reduce_input(comms[i], ALGORITHM, outs[i], capturing)
                        torch.mm(a, wt[i * (n // c) : (i + 1) * (n // c)].t(), out=x)
                        done = torch.cuda.Event()
                        done.record(main)
                        with torch.cuda.stream(side):
                            side.wait_event(done)
                            run_all_reduce(comms[i], x, ALGORITHM, capturing, out=outs[i])
                    main.wait_stream(side)

                return call, outs

            variants = {"base": (base, [base_out])}
            for c in chunk_counts:
                fn, outs = chunked(c)
                if fn is not None:
                    variants[f"chunks{c}"] = (fn, outs)
            row = {"layer": name, "m": m, "n": n, "k": k, "tp": ctx.tp, "weight_copies": len(ws)}
            for vname, (fn, outs) in variants.items():  # checked once, eagerly
                fn()
                torch.cuda.synchronize()
                row[f"rel_err_{vname}"] = rel_err(torch, torch.cat(outs, dim=1), ref)
            for comm in comms:
                comm.raise_launch_errors()
            order = ["base", *[v for v in variants if v != "base"], "base"]
            graphs = {}
            for vname in variants:
                graphs[vname] = _graphed(torch, variants[vname][0])
            shared = sum(AllReduceResources.of(c).outputs_shared for c in comms)
            times: dict[str, list[float]] = {}
            for i, vname in enumerate(order):
                warm = WARMUP_S if i == 0 else None
                ms = time_variant(ctx, graphs[vname].replay, **({"warm_s": warm} if warm else {}))
                times.setdefault(vname, []).append(ms * 1e3 / CALLS)
            for vname, us in times.items():
                row[f"{vname}_us"] = us if len(us) > 1 else us[0]
            base_us = sum(times["base"]) / len(times["base"])
            for vname in variants:
                if vname != "base":
                    row[f"base_over_{vname}"] = base_us / row[f"{vname}_us"]
            row["captured_calls_sharing_outputs"] = shared
            row["ok"] = all(row[f"rel_err_{v}"] < ERR_TOL for v in variants)
            rows.append(row)
            del graphs
            if ctx.rank == 0:
                with open(args.out, "w") as f:
                    json.dump({"device": device, "tp": ctx.tp, "calls_per_graph": CALLS,
                               "algorithm": ALGORITHM, "rows": rows}, f)  # fmt: skip
                ratios = "  ".join(
                    f"{v} {row[f'{v}_us']:7.2f} us x{row[f'base_over_{v}']:.3f}"
                    for v in variants
                    if v != "base"
                )
                print(f"{name:9} M={m:<4} base {times['base'][0]:7.2f}/{times['base'][1]:7.2f} us"
                      f"  {ratios}  ok={row['ok']}", flush=True)  # fmt: skip
    for comm in comms:
        comm.close()
    ctx.close()


def _graphed(torch, fn):
    """CALLS back-to-back calls of ``fn`` captured in a CUDA graph (after one eager call)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    return graph


if __name__ == "__main__":
    main()
