"""Llama-3 tensor-parallel layer sweep: distgemm against the plain NCCL-collective-
then-torch.mm baseline and torch's symmetric-memory fused ops (async-TP).

    torchrun --nproc-per-node N -m benchmarks.sweep.llama_sweep [--quick] [--out DIR]
             [--models 70B,405B] [--tokens 4096,8192] [--layers FC1,FC2]

Cases: models Llama-3 8B / 70B / 405B x layers QKV, O, FC1 (gate+up), FC2 x tokens M in
{1024, ..., 16384}, TP = world size (``--quick``: 70B, M in {4096, 8192}). Per case, in this one
process group run, each variant is timed at steady state (the power-capped clocks of these GPUs
settle under sustained load): all ranks idle and aligned first (device sync + barrier), then at
least warmup_ms of the variant's own calls (the case's first variant) or rewarm_ms (the others),
then one window of at least timed_ms with CUDA events around every call; the per-call maximum
over ranks is taken and its median reported. A time more than 1% below the case's compute floor
is marked suspect and fails its targets (``suspect``). The variants:

  floor      torch.mm of the per-rank GEMM alone (the compute floor; no communication)
  floor_dg   distgemm's own kernel on the per-rank GEMM alone: the same op on a one-rank group
             (TP=1 plan, one GEMM, no communication) -- the floor of distgemm's overlap
  baseline   NCCL all_gather_into_tensor + torch.mm, resp. torch.mm + reduce_scatter_tensor
  symm_mem   torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter
  dg_S<s>    distgemm all_gather_gemm / gemm_reduce_scatter, path="overlap", S = TP and 2*TP;
             "dg_default" is the S of steps=None (ops.default_steps), "dg_best" the faster S
  dg_auto    the public op as a user calls it: steps=None, path="auto" (the tuning table or
             the cost model decides the path when the plan is created; the chosen path and the
             ms behind it are reported). It is timed between two baseline windows (A B A) and the
             baseline is their mean, so that a slow clock drift hits both alike

Every variant's output is checked once per case against the baseline's (relative Frobenius error
Every variant's output is checked once per case against the baseline's (relative Frobenius error
< 1e-2). Output: a table on stdout, ``<date>-llama-sweep[-quick].{csv,json,png}`` under --out,
and a progress bar on stderr where tqdm is installed.

    python3 -m benchmarks.sweep.llama_sweep --replot SWEEP.json [MORE.json] --out DIR [--stem NAME]

redraws the table, CSV, JSON and PNG of stored sweeps without a GPU. This file is the GPU part;
the cases are benchmarks/common/llama_cases.py, the timing benchmarks/common/timing.py, the reports
benchmarks/sweep/report.py.
"""

from __future__ import annotations

import datetime
import functools
import math
import os
import sys
import time
import traceback
from collections.abc import Iterable, Sequence
from typing import Any

from benchmarks.common.llama_cases import (
    COLLECTIVE,
    LAYERS,
    MODELS,
    QUICK_MODELS,
    QUICK_TOKENS,
    SCHEDULE,
    TOKENS,
    Case,
    global_gemm,
    make_cases,
    shapes,
    skip_reason,
    step_options,
)
from benchmarks.common.report import RESULTS_DIR
from benchmarks.common.timing import (
    ERR_TOL,
    MAX_ITERS,
    MIN_ITERS,
    REWARM_S,
    TIMED_S,
    WARMUP_S,
    LayerOperands,
    RankContext,
    baseline_call,
    enable_symm_mem,
    layer_operands,
    rel_err,
    symm_mem_call,
    time_around,
    time_variant,
    try_symm_mem,
)
from benchmarks.sweep.report import output_stem, replot, write_outputs
from distgemm import cli

# The sweep's cases and timing rules, which tests/test_bench_sweep.py holds against _core.
__all__ = [
    "COLLECTIVE",
    "LAYERS",
    "MAX_ITERS",
    "MIN_ITERS",
    "MODELS",
    "QUICK_MODELS",
    "QUICK_TOKENS",
    "REWARM_S",
    "SCHEDULE",
    "TIMED_S",
    "TOKENS",
    "WARMUP_S",
    "global_gemm",
    "main",
    "make_cases",
    "progress",
    "run_case",
]

# A case that takes longer is hung: dump stacks and exit (torchrun ends the rest).
CASE_TIMEOUT_S = 90


def progress(cases: Sequence[Case], enabled: bool) -> Iterable[Case]:
    """The cases in order, shown on a tqdm bar on stderr (count, case, elapsed, estimate) where
    ``enabled`` and tqdm is installed; without tqdm the sweep runs without a bar."""
    if not enabled:
        return iter(cases)
    try:
        from tqdm import tqdm
    except ImportError:  # optional: the GPU machine's image has it, a bare install may not
        return iter(cases)

    def shown() -> Iterable[Case]:
        with tqdm(cases, file=sys.stderr, unit="case", dynamic_ncols=True) as bar:
            for case in bar:
                bar.set_postfix_str(case.name, refresh=True)
                yield case

    return shown()


def _time_floors(ctx: RankContext, case: Case, lo: LayerOperands, solo, ms, errs) -> None:
    """floor (torch.mm) and floor_dg (distgemm on the one-rank group ``solo``: a TP=1 plan, one
    GEMM) on the per-rank GEMM; floor_dg checked against torch.mm on the same operands. The
    case's first window, so it gets the long warm-up."""
    torch = ctx.torch
    from distgemm import ops

    s = shapes(case)
    if lo.ag:  # TP=1: a_shard is the whole gathered [M, K]
        floor_a = torch.randn(s["full_a"], device=ctx.dev, dtype=torch.bfloat16, generator=lo.gen)
        floor_out = torch.empty(s["out"], device=ctx.dev, dtype=torch.bfloat16)
        floor_dg = functools.partial(
            ops.all_gather_gemm, floor_a, lo.w, out=floor_out, group=solo, path="overlap"
        )
    else:  # TP=1: the reduce-scatter of one rank is the [M, N] product itself
        floor_a = lo.a
        floor_out = torch.empty(s["partial"], device=ctx.dev, dtype=torch.bfloat16)
        floor_dg = functools.partial(
            ops.gemm_reduce_scatter, floor_a, lo.w, out=floor_out, group=solo, path="overlap"
        )
    floor = functools.partial(torch.mm, floor_a, lo.wt, out=floor_out)
    ms["floor"] = time_variant(ctx, floor, warm_s=WARMUP_S)
    floor_ref = floor().clone()
    floor_dg()
    torch.cuda.synchronize()
    solo.raise_launch_errors()
    errs["floor_dg"] = rel_err(torch, floor_out, floor_ref)
    ms["floor_dg"] = time_variant(ctx, floor_dg)
    solo.raise_launch_errors()


def _time_symm_mem(ctx: RankContext, lo: LayerOperands, ref, group_name, ms, errs, unavailable):
    """torch async-TP (symmetric memory): checked, then timed where every rank has it."""
    symm = functools.partial(symm_mem_call, ctx.torch, lo.ag, lo.a, lo.wt, group_name)
    err, why = try_symm_mem(ctx, symm, ref)
    if why:
        unavailable["symm_mem"] = f"unavailable: {why}"
        ms["symm_mem"] = None
    else:
        errs["symm_mem"] = err
        ms["symm_mem"] = time_variant(ctx, symm)


def _time_distgemm(
    ctx: RankContext, case: Case, lo: LayerOperands, ref, baseline, rejected, ms, errs
) -> dict[str, Any]:
    """dg_S<s> for every accepted S, dg_best, dg_default and dg_auto, on a communicator of this
    case (its workspaces are freed with it). Returns the auto path's choice, the best and the
    default S."""
    torch = ctx.torch
    from distgemm import ops
    from distgemm.runtime import communicator as dcomm

    op = ops.all_gather_gemm if lo.ag else ops.gemm_reduce_scatter
    with dcomm.Communicator(timeout_s=60.0, wait_timeout_s=5.0) as comm:
        dg_out = torch.empty(shapes(case)["out"], device=ctx.dev, dtype=torch.bfloat16)

        def dg(steps, path):
            return functools.partial(op, lo.a, lo.w, steps=steps, out=dg_out, group=comm, path=path)

        runs = [(f"dg_S{x}", x, "overlap") for x in step_options(ctx.tp) if x not in rejected]
        runs.append(("dg_auto", None, "auto"))
        per_s: dict[int, float] = {}
        for key, steps, path in runs:
            f = dg(steps, path)
            # Poisoned output: a call that wrote nothing cannot pass the check by leaving an
            # earlier variant's (identical) result in recycled memory.
            dg_out.fill_(float("nan"))
            y = f()  # with path="auto" this first call decides the path (table or model)
            torch.cuda.synchronize()
            comm.raise_launch_errors()
            errs[key] = rel_err(torch, y, ref)
            if steps is not None:
                ms[key] = per_s[steps] = time_variant(ctx, f)
                comm.raise_launch_errors()
        auto = next((c_ for c_ in ops.path_choices(comm) if c_["requested"] == "auto"), {})
        # The 2% rule compares the public op with the baseline: the op's window between two
        # baseline windows (A B A), so that a linear clock drift hits both alike.
        before, ms["dg_auto"], after = time_around(ctx, baseline, dg(None, "auto"))
        comm.raise_launch_errors()
        ms["baseline"] = (before + after) / 2
        best = min(per_s, key=per_s.get) if per_s else None
        ms["dg_best"] = per_s.get(best) if best else None
        default_s = ops.default_steps(shapes(case)["schedule"], ctx.tp, lo.a, lo.w)
        ms["dg_default"] = per_s.get(default_s)
    return dict(dg_best_steps=best, dg_default_steps=default_s, auto=auto)


def run_case(
    ctx: RankContext, case: Case, rejected: dict[int, str], group_name: str, solo
) -> dict[str, Any]:
    """Measure every variant of one case on this rank. Returns this rank's record; raises on
    a failure that makes the case meaningless (the caller agrees with the other ranks)."""
    torch = ctx.torch
    lo = layer_operands(torch, ctx.dev, case, 1234 + 7919 * ctx.rank + case.tokens)
    ms: dict[str, float | None] = {}
    errs: dict[str, float | None] = {}
    unavailable: dict[str, str] = {}
    _time_floors(ctx, case, lo, solo, ms, errs)
    baseline = functools.partial(baseline_call, torch, ctx.dist, lo.ag, lo.a, lo.wt, lo.tmp, lo.out)
    ref = baseline().clone()
    torch.cuda.synchronize()
    errs["baseline"] = 0.0
    _time_symm_mem(ctx, lo, ref, group_name, ms, errs, unavailable)
    chosen = _time_distgemm(ctx, case, lo, ref, baseline, rejected, ms, errs)
    # The check counts on every rank: the worst error over ranks (NaN as inf), same keys
    # everywhere (the variants run were agreed above).
    keys = sorted(errs)
    worst = ctx.agree_max([errs[k] if errs[k] == errs[k] else math.inf for k in keys])
    errs = dict(zip(keys, worst))
    bad_err = {k: v for k, v in errs.items() if not v < ERR_TOL}
    return dict(ms=ms, rel_err=errs, unavailable=unavailable, **chosen, wrong=bad_err)


def _meta(ctx: RankContext, args, symm_setup, t_start) -> dict[str, Any]:
    torch = ctx.torch
    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        tp=ctx.tp,
        quick=args.quick,
        torch=torch.__version__,
        device=torch.cuda.get_device_name(ctx.dev),
        cuda=torch.version.cuda,
        warmup_s=WARMUP_S,
        rewarm_s=REWARM_S,
        timed_s=TIMED_S,
        iters=[MIN_ITERS, MAX_ITERS],
        installed_by=os.environ.get("INSTALLED_BY"),
        symm_mem_setup_error=symm_setup,
        argv=sys.argv,
        seconds=round(time.perf_counter() - t_start, 1),
    )


def measure(ctx: RankContext, case: Case, group_name: str, solo, symm_setup) -> dict[str, Any]:
    """One case's record on this rank: skipped (why), failed (agreed over ranks, with the
    error), wrong (an output off the baseline) or ok, with the times."""
    import faulthandler

    m, n, k = global_gemm(case.model, case.layer, case.tokens)
    rec: dict[str, Any] = dict(
        case=case.name,
        model=case.model,
        layer=case.layer,
        tokens=case.tokens,
        tp=ctx.tp,
        m=m,
        n=n,
        k=k,
        ms={},
        rel_err={},
    )
    reason, rejected = skip_reason(case)
    rec["rejected_steps"] = {str(s_): w for s_, w in rejected.items()}
    if reason:
        rec.update(status="skipped", reason=reason)
        return rec
    faulthandler.dump_traceback_later(CASE_TIMEOUT_S, exit=True)
    err = None
    try:
        res = run_case(ctx, case, rejected, group_name, solo)
    except Exception as e:  # noqa: BLE001 - one case's failure must not end the sweep
        err = f"{type(e).__name__}: {e}"
        traceback.print_exc()
        res = None
    failed = ctx.agree_max([1.0 if err else 0.0])[0]
    faulthandler.cancel_dump_traceback_later()
    if failed:
        rec.update(status="failed", reason=err or "failed on another rank")
        return rec
    wrong = res.pop("wrong")
    rec.update(status="ok", reason=None, **res)
    if symm_setup and "symm_mem" in rec["unavailable"]:
        rec["unavailable"]["symm_mem"] += f" (setup: {symm_setup})"
    if wrong:
        rec.update(
            status="wrong",
            reason="rel. err >= 1e-2 vs baseline: "
            + ", ".join(f"{k_}={v:.2e}" for k_, v in wrong.items()),
        )
    return rec


def main(argv=None) -> int:
    ap = cli.ArgumentParser("python3 -m benchmarks.sweep.llama_sweep", __doc__)
    ap.add_argument("--quick", action="store_true", help="70B only, M in {4096, 8192}")
    ap.add_argument("--out", default=RESULTS_DIR)
    ap.add_argument("--models", help="comma-separated subset of " + ",".join(MODELS))
    ap.add_argument("--tokens", help="comma-separated token counts (M) instead of the list")
    ap.add_argument("--layers", help="comma-separated subset of " + ",".join(LAYERS))
    ap.add_argument(
        "--replot",
        metavar="JSON",
        nargs="+",
        help="no GPU: rewrite the CSV, redraw the PNG and reprint the table from "
        "sweep JSONs (several: their records joined, written as --stem)",
    )
    ap.add_argument("--stem", help="with --replot: the output files' name (no extension)")
    args = ap.parse_args(argv)
    if args.replot:
        return replot(args.replot, args.out, args.stem)

    def split(v, f=str):
        return None if v is None else [f(x) for x in v.split(",") if x]

    models, tokens, layers = split(args.models), split(args.tokens, int), split(args.layers)
    make_cases(1, args.quick, models, tokens, layers)  # unknown names: fail before torchrun work

    ctx = RankContext.from_torchrun(ctrl_timeout_s=60.0)
    torch, dist = ctx.torch, ctx.dist
    group_name = dist.group.WORLD.group_name
    symm_setup = enable_symm_mem(group_name)

    # distgemm's own kernel floor runs the op on a one-rank group (a TP=1 plan: one GEMM).
    from distgemm.runtime import communicator as dcomm

    solo_pg, _ = dist.new_subgroups(group_size=1)
    solo = dcomm.Communicator(solo_pg, timeout_s=60.0, wait_timeout_s=5.0)

    cases = make_cases(ctx.tp, args.quick, models, tokens, layers)
    partial = bool(models or tokens or layers)
    stem = os.path.join(args.out, output_stem(args.quick) + ("-subset" if partial else ""))
    records: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for case in progress(cases, enabled=ctx.rank == 0):
        records.append(measure(ctx, case, group_name, solo, symm_setup))
        if records[-1]["status"] == "skipped":
            continue
        torch.cuda.empty_cache()
        if ctx.rank == 0:  # after every case: a sweep cut short still leaves its numbers
            write_outputs(records, stem, _meta(ctx, args, symm_setup, t_start), False)
    if ctx.rank == 0:
        write_outputs(records, stem, _meta(ctx, args, symm_setup, t_start), True)
    ctx.close()
    return 1 if any(r["status"] in ("failed", "wrong") for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
