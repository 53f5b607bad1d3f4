"""Probe of what chaining our all-reduce to torch.mm by programmatic dependent launch gains: the
collective path's pair (runtime/allreduce.mm_then_all_reduce: torch.mm into the all-reduce's
input, then our all-reduce) with ``chained`` on and off, per decode layer, token count and
algorithm (of --algorithms, where the size offers it), at TP = the world size.

    torchrun --nproc-per-node 4 -m benchmarks.probes.allreduce_chain --out chain.json \\
        [--models 8B,70B] [--layers O,FC2] [--tokens 1,16,128] [--algorithms one_shot,two_shot_pull]

Each pair runs as servers replay it: a CUDA graph of CALLS calls, every call's torch.mm on the
next of the weight copies (calibrate.weight_copies: cold weights, as in decode). Per point the
variants are timed A B A (chained, unchained, chained; benchmarks/common/timing.time_around:
>= 1 s warm-up, then a >= 1 s window each, the per-call maximum over ranks, median), and the
chained result is checked bitwise against the unchained one first. Rank 0 writes the JSON after
every point and a table at the end: us per call and unchained / chained (above 1: the chain
gains).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics

from benchmarks.common import models
from benchmarks.common.timing import RankContext, graphed, round_robin, time_around
from benchmarks.decode.cases import LAYERS, layer_list

CALLS = 20
TOKENS = (1, 16, 128)
MODELS = ("8B", "70B")
ALGORITHMS = ("one_shot", "two_shot_pull")  # what the decode choice picks at TP 2 and 4


def _csv(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="allreduce_chain.json")
    ap.add_argument("--models", type=_csv, default=list(MODELS))
    ap.add_argument("--layers", type=_csv, default=list(LAYERS))
    ap.add_argument("--tokens", type=lambda s: [int(x) for x in _csv(s)], default=list(TOKENS))
    ap.add_argument("--algorithms", type=_csv, default=list(ALGORITHMS))
    args = ap.parse_args()
    unknown = [m for m in args.models if m not in models.MODELS]
    if unknown:
        raise SystemExit(f"allreduce_chain: unknown model {unknown[0]!r}")
    ctx = RankContext.from_torchrun()
    torch = ctx.torch

    from distgemm.calibrate import l2_bytes, weight_copies
    from distgemm.runtime.allreduce import mm_then_all_reduce
    from distgemm.runtime.communicator import Communicator
    from distgemm.runtime.paths.collective import own_all_reduce_offer

    comm = Communicator()
    device = torch.cuda.get_device_name(ctx.dev)
    rows = []
    for layer in layer_list(args.models, args.layers, extra=()):
        k = layer.k // ctx.tp
        gen = torch.Generator(device=ctx.dev).manual_seed(layer.n * 31 + k + ctx.rank)
        w = ((torch.rand(layer.n, k, device=ctx.dev, generator=gen) * 2 - 1) / k**0.5).to(
            torch.bfloat16
        )
        copies = weight_copies(w.numel() * w.element_size(), l2_bytes(ctx.dev), CALLS)
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        for m in args.tokens:
            a = (torch.rand(m, k, device=ctx.dev, generator=gen) * 2 - 1).to(torch.bfloat16)
            out = torch.empty(m, layer.n, device=ctx.dev, dtype=torch.bfloat16)
            offer = own_all_reduce_offer(m * layer.n, out.dtype, ctx.tp)
            offered = [x for x, problem in offer.items() if not problem]
            for algorithm in [x for x in args.algorithms if x in offered]:

                def pairs(chained, algorithm=algorithm, a=a, out=out, ws=ws):
                    def pair(x):
                        capturing = torch.cuda.is_current_stream_capturing()
                        mm_then_all_reduce(comm, a, x.t(), out, algorithm, capturing, chained)

                    return round_robin([functools.partial(pair, x) for x in ws])

                results = {}
                for chained in (False, True):
                    mm_then_all_reduce(comm, a, ws[0].t(), out, algorithm, False, chained)
                    torch.cuda.synchronize()
                    results[chained] = out.clone()
                comm.raise_launch_errors()
                same = bool(torch.equal(results[True], results[False]))
                on = graphed(torch, pairs(True), CALLS)
                off = graphed(torch, pairs(False), CALLS)
                first, middle, last = time_around(ctx, on.replay, off.replay)
                comm.raise_launch_errors()
                chained_us = statistics.mean((first, last)) * 1e3 / CALLS
                row = {
                    "model": layer.model, "layer": layer.layer, "tokens": m, "n": layer.n,
                    "k": k, "tp": ctx.tp, "algorithm": algorithm, "weight_copies": copies,
                    "chained_us": chained_us, "unchained_us": middle * 1e3 / CALLS,
                    "chained_windows_us": [first * 1e3 / CALLS, last * 1e3 / CALLS],
                    "gain": middle * 1e3 / CALLS / chained_us, "bitwise_same": same,
                }  # fmt: skip
                rows.append(row)
                del on, off
                if ctx.rank == 0:
                    with open(args.out, "w") as f:
                        json.dump({"tp": ctx.tp, "device": device, "calls_per_graph": CALLS,
                                   "torch": torch.__version__, "rows": rows}, f)  # fmt: skip
                    print(
                        f"{layer.model:>5} {layer.layer:>4} {m:>4} {algorithm:>14} "
                        f"chained {chained_us:7.2f} us unchained {row['unchained_us']:7.2f} "
                        f"gain {row['gain']:.3f} same {same}",
                        flush=True,
                    )
        del w, ws
    if ctx.rank == 0 and rows:
        gains = [r["gain"] for r in rows]
        print(
            f"\nTP={ctx.tp} on {device}: unchained / chained over {len(rows)} points: median "
            f"{statistics.median(gains):.3f}, min {min(gains):.3f}, max {max(gains):.3f}; "
            f"bitwise the same at {sum(r['bitwise_same'] for r in rows)} of {len(rows)}"
        )
    comm.close()
    ctx.close()


if __name__ == "__main__":
    main()
