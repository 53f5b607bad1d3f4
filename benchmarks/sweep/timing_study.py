"""Which timing of the public op against NCCL + torch.mm is true: one case, three methods, one run.

    torchrun --nproc-per-node 2 -m benchmarks.sweep.timing_study [--cases 70B/QKV/4096,70B/O/4096]

  short-alt     25 ms chunks, baseline and public op alternating, 6 rounds
  short-settled the same chunks with a device sync and a barrier before each chunk (no work of
                one variant can fall into the other's window)
  steady        1 s windows after a re-warm, A B A B (the sweep's timing: common/timing.py)

plus torch.mm alone in a steady window (the compute floor). After each window the SM clock of
this rank's GPU is read (NVML), so a method whose chunks run at a higher clock shows it. Rank 0
prints a table and writes JSON to --out.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics

from benchmarks.common.llama_cases import Case
from benchmarks.common.timing import (
    WARMUP_S,
    RankContext,
    baseline_call,
    layer_operands,
    settle,
    time_variant,
)
from distgemm import cli


def _clock_mhz(torch, dev) -> float:
    try:
        return float(torch.cuda.clock_rate(dev))
    except Exception:  # noqa: BLE001 - NVML missing: the times still count
        return float("nan")


def short_chunks(ctx, fns, settled: bool, rounds: int = 6, chunk_ms: float = 25.0):
    """Alternating chunks of ~chunk_ms of each function (one untimed call before each chunk);
    per chunk the maximum over ranks; median per function, and the median SM clock after its
    chunks."""
    torch = ctx.torch
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def chunk(fn, n):
        if settled:
            settle(ctx)
        fn()
        s.record()
        for _ in range(n):
            fn()
        e.record()
        e.synchronize()
        return s.elapsed_time(e) / n, _clock_mhz(torch, ctx.dev)

    names = list(fns)
    per = ctx.agree_max([chunk(fns[k], 2)[0] for k in names])
    n = min(50, max(2, math.ceil(chunk_ms / max(max(per), 1e-3))))
    times = {k: [] for k in names}
    clocks = {k: [] for k in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        got = [chunk(fns[k], n) for k in order]
        worst = ctx.agree_max([g[0] for g in got])
        for k, t, g in zip(order, worst, got):
            times[k].append(t)
            clocks[k].append(g[1])
    return {
        k: dict(ms=statistics.median(times[k]), mhz=statistics.median(clocks[k])) for k in names
    }


def steady(ctx, fns, rounds: int = 2):
    """A B A B ... of steady-state windows (timing.time_variant); median per function."""
    times = {k: [] for k in fns}
    clocks = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(time_variant(ctx, fn))
            clocks[k].append(_clock_mhz(ctx.torch, ctx.dev))
    return {k: dict(ms=statistics.median(times[k]), mhz=statistics.median(clocks[k])) for k in fns}


def study_case(ctx: RankContext, case: Case) -> dict:
    """The floor, the three methods for NCCL + torch.mm and the public op (path="auto", its
    choice made before any timing) of one case on this rank."""
    torch = ctx.torch
    from distgemm import ops
    from distgemm.runtime import communicator as dcomm

    lo = layer_operands(torch, ctx.dev, case, 1234 + 7919 * ctx.rank)
    floor_out = torch.empty_like(lo.tmp) if not lo.ag else torch.empty_like(lo.out)
    floor_a = lo.tmp.normal_(generator=lo.gen) if lo.ag else lo.a
    floor = functools.partial(torch.mm, floor_a, lo.wt, out=floor_out)
    baseline = functools.partial(baseline_call, torch, ctx.dist, lo.ag, lo.a, lo.wt, lo.tmp, lo.out)
    with dcomm.Communicator(timeout_s=60.0, wait_timeout_s=5.0) as comm:
        op = ops.all_gather_gemm if lo.ag else ops.gemm_reduce_scatter
        public = functools.partial(
            op, lo.a, lo.w, out=torch.empty_like(lo.out), group=comm, path="auto"
        )
        public()  # the auto path's choice happens here, before any timing
        settle(ctx)
        fns = {"baseline": baseline, "public": public}
        rec = dict(
            case=case.name,
            floor=dict(
                ms=time_variant(ctx, floor, warm_s=WARMUP_S),
                mhz=_clock_mhz(torch, ctx.dev),
            ),
            short_alt=short_chunks(ctx, fns, settled=False),
            short_settled=short_chunks(ctx, fns, settled=True),
            steady=steady(ctx, fns),
            path=(ops.path_choices(comm) or [{}])[0].get("path"),
        )
        comm.raise_launch_errors()
    return rec


def print_table(results) -> None:
    print(
        f"{'case':22} {'method':14} {'public ms':>10} {'MHz':>6} {'NCCL+mm ms':>11} "
        f"{'MHz':>6} {'base/public':>11}   floor ms (MHz)"
    )
    for r in results:
        for m in ("short_alt", "short_settled", "steady"):
            p, b = r[m]["public"], r[m]["baseline"]
            below = "  BELOW FLOOR" if p["ms"] < r["floor"]["ms"] * 0.99 else ""
            print(
                f"{r['case']:22} {m:14} {p['ms']:10.4f} {p['mhz']:6.0f} {b['ms']:11.4f} "
                f"{b['mhz']:6.0f} {b['ms'] / p['ms']:10.3f}x   {r['floor']['ms']:.4f} "
                f"({r['floor']['mhz']:.0f}){below}"
            )


def main(argv=None) -> int:
    ap = cli.ArgumentParser("python3 -m benchmarks.sweep.timing_study", __doc__)
    ap.add_argument("--cases", default="70B/QKV/4096,70B/O/4096")
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)

    ctx = RankContext.from_torchrun(ctrl_timeout_s=60.0)
    results = []
    for spec in args.cases.split(","):
        model, layer, tokens = spec.split("/")
        results.append(study_case(ctx, Case(model, layer, int(tokens), ctx.tp)))
    if ctx.rank == 0:
        print_table(results)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "timing-study.json"), "w") as f:
            json.dump(dict(tp=ctx.tp, torch=ctx.torch.__version__, results=results), f, indent=1)
    ctx.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
