"""Training-step benchmark: one Llama-70B MLP block with sequence parallelism, forward +
backward + weight gradients (no optimizer), ms per step, distgemm against Megatron-style NCCL +
torch.mm and torch async-TP and two one-GPU floors, all in one torchrun run.

    torchrun --nproc-per-node N -m benchmarks.training.training_step [--tokens 8192] [--out DIR]
    torchrun --nproc-per-node 2 -m benchmarks.training.training_step --cpu-smoke  # gloo, no timing
    python3 -m benchmarks.training.training_step --replot RUN.json --out DIR      # no GPU
    torchrun --nproc-per-node N -m benchmarks.training.training_step --profile    # + timeline
    python3 -m benchmarks.training.training_step --local-only [--tp 2]            # one GPU: floors

The block, TP = world size, per rank: gate+up as one column-parallel linear ``[2F/TP, H]``
(this rank's gate rows, then its up rows), ``silu(gate) * up``, down as a row-parallel linear
``[H, F/TP]``; input and output ``[T/TP, H]``, bf16, no bias (benchmarks/training/block.py
builds it and its variants). The fp8 variants (megatron_fp8, async_tp_fp8, distgemm_fp8) run the
forward's two GEMMs in fp8 with row-wise dynamic scales, each through its side's ops, and share a
bf16 backward; they are checked against megatron_fp8, whose error against bf16 megatron is
reported. The variants (benchmarks/training/report.py describes them) are
each checked once against ``megatron`` (output and every gradient) and then timed with the
steady-state windows of benchmarks/common/timing.py:
the floor first with the long warm-up, then floor_step, megatron, async_tp, distgemm_keep,
distgemm_regather, distgemm_compiled, megatron again (its figure is the mean of both windows;
their ratio is the drift). The floor is the six GEMMs alone on one GPU; floor_step is the whole
step compiled on one GPU without communication (checked against the same block run eagerly),
the time a TP overlap reaches at best with torch's GEMMs and inductor's elementwise work. A
variant that fails (async-TP on a torch without symmetric memory, for instance) is recorded
with its reason and the run goes on; a failed floor_step makes the exit status 1. Output:
``<date>-training-step-tp<N>-t<T>`` .json/.csv/.txt/.png under --out, each naming torch, the
device and ``INSTALLED_BY``. --local-only times the two floors alone with rank 0's shapes at
TP = --tp on the one current GPU, without torchrun, into ``...-t<T>-local``.
"""

from __future__ import annotations

import datetime
import faulthandler
import math
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.common.report import RESULTS_DIR
from benchmarks.training import report
from benchmarks.training.block import (
    BlockOperands,
    Variant,
    check_floor,
    check_floor_step,
    full_block,
    make_variant,
    rel_errors,
    shard_block,
)
from distgemm import cli
from distgemm import ops as distgemm_ops

SMOKE_SIZES = (16, 32, 48)  # tokens, hidden, ffn of --cpu-smoke
LOCAL_TP = 2  # --local-only's TP when --tp is not given
RUN_TIMEOUT_S = 400  # a run that takes longer is hung (async-TP compiles ~1-2 min): dump stacks


def cpu_smoke(rank: int, tp: int, sizes=SMOKE_SIZES) -> dict[str, Any]:
    """Every variant's step once on CPU in bf16 (the layers' gloo path; async-TP eagerly, since
    the compiled fused ops need CUDA symmetric memory) and the floors'; no timing. Returns the
    errors against megatron (and of megatron itself after its poisoned steps; floor_step's
    against its eager block), megatron's and floor_step's values (for checks against a full
    reference)."""
    report.check_sizes(*sizes, tp)
    full = full_block(*sizes, "cpu", torch.bfloat16)
    ops = shard_block(full, rank, tp)
    group = dist.group.WORLD
    ref = make_variant("megatron", ops, group).values()
    errs = {}
    megatron = make_variant("megatron", ops, group)
    for name in ("async_tp_eager", *report.DISTGEMM):
        megatron.poisoned_step()
        errs[name] = rel_errors(make_variant(name, ops, group).values(), ref)
    errs["megatron_after_poison"] = rel_errors(megatron.values(), ref)  # input restored
    # fp8: distgemm's drop-ins (their gloo fallback here) against megatron_fp8; torch's fused
    # scaled ops need CUDA symmetric memory
    fp8 = make_variant("megatron_fp8", ops, group)
    fp8_ref = fp8.values()
    fp8.poisoned_step()
    errs["distgemm_fp8"] = rel_errors(make_variant("distgemm_fp8", ops, group).values(), fp8_ref)
    check_floor(ops, tp)
    whole, errs["floor_step"] = check_floor_step(shard_block(full, rank, tp, gathered=True))
    return dict(
        rel_err=errs,
        megatron=ref,
        floor_step=whole.values(),
        fp8_vs_bf16=rel_errors(fp8_ref, ref),
    )


def _agreed(ctx, why: str | None) -> bool:
    """Whether every rank succeeded (the control group's max of the failure flags)."""
    return ctx.agree_max([1.0 if why else 0.0])[0] == 0.0


def _values_and_fused_ops(variant: Variant):
    """The compiled variant's first step (it compiles forward and backward) and how often the
    code inductor generated names each of torch's fused symmetric-memory ops: zero means the
    micro-pipeline TP pass matched nothing, and async_tp ran as compiled NCCL + mm."""
    from torch._inductor.utils import run_and_get_code

    values, codes = run_and_get_code(variant.values)
    code = "\n".join(codes)
    return values, {op: code.count(f"symm_mem.{op}") for op in report.FUSED_OPS}


def _checked(ctx, name: str, rec, check) -> Variant | None:
    """``check()`` (-> the variant and its errors) on every rank: the errors (max over ranks,
    NaN as inf) under ``rel_err[name]``; on a failure on any rank, the reason under
    ``unavailable`` and None (never fatal: the other variants' figures still count)."""
    from benchmarks.common.timing import short_error

    variant, why = None, None
    try:
        variant, errs = check()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - e.g. async-TP without symmetric memory
        why = short_error(e)
    if not _agreed(ctx, why):
        rec["unavailable"][name] = why or "failed on another rank"
        return None
    keys = sorted(errs)
    worst = ctx.agree_max([errs[k] if errs[k] == errs[k] else math.inf for k in keys])
    rec["rel_err"][name] = dict(zip(keys, worst))
    return variant


def _try_check(ctx, name, ops, megatron, ref, rec) -> Variant | None:
    """One variant checked against megatron's ``ref`` (after a poisoned megatron step), through
    _checked."""

    def check():
        variant = make_variant(name, ops, ctx.dist.group.WORLD)
        megatron.poisoned_step()
        if name == "async_tp":
            values, rec["async_tp_fused"] = _values_and_fused_ops(variant)
        else:
            values = variant.values()
        return variant, rel_errors(values, ref)

    return _checked(ctx, name, rec, check)


def _fp8_reference(ctx, ops, megatron, ref, rec) -> tuple[Variant | None, dict | None]:
    """megatron_fp8 built and stepped once, after a poisoned megatron step, through _checked:
    (the variant, its values: the fp8 variants' reference), or (None, None) where it failed
    on any rank. Its errors against bf16 megatron go under ``fp8_vs_bf16``: what the fp8
    forward costs in accuracy, reported and not judged."""
    held = {}

    def check():
        variant = make_variant("megatron_fp8", ops, ctx.dist.group.WORLD)
        megatron.poisoned_step()
        held["values"] = variant.values()
        return variant, {q: 0.0 for q in held["values"]}

    variant = _checked(ctx, "megatron_fp8", rec, check)
    if variant is None:
        return None, None
    errs = rel_errors(held["values"], ref)
    keys = sorted(errs)
    rec["fp8_vs_bf16"] = dict(zip(keys, ctx.agree_max([errs[k] for k in keys])))
    return variant, held["values"]


def _floors(ctx, ops: BlockOperands, gathered: BlockOperands, tp: int, rec) -> dict[str, Any]:
    """The two floors checked (floor_step through _checked) and timed, floor with the long
    warm-up: their times under ``rec["ms"]``; returns their steps by name (for --profile)."""
    from benchmarks.common.timing import WARMUP_S, time_variant

    steps = {"floor": check_floor(ops, tp)}
    whole = _checked(ctx, "floor_step", rec, lambda: check_floor_step(gathered))
    if whole is not None:
        steps["floor_step"] = whole.step
    rec["ms"]["floor"] = time_variant(ctx, steps["floor"], warm_s=WARMUP_S)
    if whole is not None:
        rec["ms"]["floor_step"] = time_variant(ctx, whole.step)
    return steps


def _failed(rec) -> bool:
    """A variant off its reference, or floor_step failed (its build, compile or check)."""
    return bool(report.wrong(rec)) or "floor_step" in rec["unavailable"]


def _inductor_counters() -> dict[str, Any]:
    from torch._dynamo.utils import counters

    return {k: v for k, v in counters["inductor"].items() if v}


def _meta(ctx, args, tp, t_start, counters, **extra) -> dict[str, Any]:
    from benchmarks.common.timing import REWARM_S, TIMED_S, WARMUP_S

    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        tp=tp,
        torch=torch.__version__,
        device=torch.cuda.get_device_name(ctx.dev),
        cuda=torch.version.cuda,
        installed_by=os.environ.get("INSTALLED_BY"),
        warmup_s=WARMUP_S,
        rewarm_s=REWARM_S,
        timed_s=TIMED_S,
        inductor_counters=counters,
        argv=sys.argv,
        seconds=round(time.perf_counter() - t_start, 1),
        **extra,
    )


PROFILED_STEPS = 3  # steps per variant under torch.profiler (--profile), after the timing


def profile_variants(ctx, steps: dict[str, Any], out_dir: str) -> None:
    """Every variant's PROFILED_STEPS steps under torch.profiler on every rank (the ranks'
    collectives must pair up). Rank 0 writes ``profile-<variant>.txt``: the CUDA kernels and
    copies by total device time, per step, so that a variant's lost milliseconds can be placed
    (a slower GEMM, an exposed collective, a copy); and ``timeline.json`` / ``timeline.txt``:
    per variant and rank, where the step's time goes on the GPU's streams
    (``timeline.events.step_breakdown``: GEMMs busy, and while no GEMM runs, communication,
    other kernels or nothing)."""
    import json

    from torch.profiler import ProfilerActivity, profile

    from benchmarks.timeline import events as timeline_events

    os.makedirs(out_dir, exist_ok=True)
    breakdowns: dict[str, list[dict[str, float]]] = {}
    for name, step in steps.items():
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(PROFILED_STEPS):
                step()
            torch.cuda.synchronize()
        parsed = timeline_events.parse_chrome_trace(timeline_events.exported_trace(prof), ctx.rank)
        mine = [e for e in parsed.events if e.device in (ctx.dev.index, -1)]
        mine = mine or parsed.events
        local = timeline_events.step_breakdown(mine, PROFILED_STEPS)
        gathered: list[Any] = [None] * ctx.tp
        ctx.dist.all_gather_object(gathered, local, group=ctx.ctrl)
        breakdowns[name] = gathered
        if ctx.rank == 0:
            table = prof.key_averages().table(sort_by="device_time_total", row_limit=25)
            path = os.path.join(out_dir, f"profile-{name}.txt")
            with open(path, "w") as f:
                f.write(f"{name}: {PROFILED_STEPS} steps, rank 0, device time totals\n{table}\n")
            print(f"wrote {path}", flush=True)
    if ctx.rank == 0:
        with open(os.path.join(out_dir, "timeline.json"), "w") as f:
            json.dump({"steps": PROFILED_STEPS, "variants": breakdowns}, f)
        text = report.timeline_table(breakdowns)
        with open(os.path.join(out_dir, "timeline.txt"), "w") as f:
            f.write(text + "\n")
        print(text, flush=True)


def _rank_operands(args, dev, rank: int, tp: int) -> tuple[BlockOperands, BlockOperands]:
    """This rank's shards of the block at the run's sizes, and the same with the gathered
    ``[T, H]`` input and output gradient (floor_step's); the full weights freed."""
    full = full_block(args.tokens, args.hidden, args.ffn, dev, torch.bfloat16)
    ops = shard_block(full, rank, tp)
    gathered = shard_block(full, rank, tp, gathered=True)
    del full
    torch.cuda.empty_cache()  # the full weights are gone; keep only this rank's shards
    return ops, gathered


def _new_record(args, tp: int) -> dict[str, Any]:
    return dict(
        tokens=args.tokens, hidden=args.hidden, ffn=args.ffn, tp=tp,
        ms={}, rel_err={}, unavailable={},
    )  # fmt: skip


def run(args) -> int:
    """The GPU run: check, time, write (rank 0). Returns 1 when a variant is wrong or
    floor_step failed."""
    from benchmarks.common.timing import RankContext, enable_symm_mem, time_variant

    ctx = RankContext.from_torchrun(ctrl_timeout_s=120.0)
    report.check_sizes(args.tokens, args.hidden, args.ffn, ctx.tp)
    t_start = time.perf_counter()
    faulthandler.dump_traceback_later(RUN_TIMEOUT_S, exit=True)
    group_name = ctx.dist.group.WORLD.group_name
    symm_setup = enable_symm_mem(group_name)
    import torch._inductor.config as inductor_config

    inductor_config._micro_pipeline_tp = True
    ops, gathered = _rank_operands(args, ctx.dev, ctx.rank, ctx.tp)
    rec = _new_record(args, ctx.tp)
    megatron = make_variant("megatron", ops, ctx.dist.group.WORLD)
    ref = megatron.values()
    rec["rel_err"]["megatron"] = {q: 0.0 for q in ref}
    variants = {"megatron": megatron}
    fp8, fp8_ref = None, None
    for name in report.TIMED_ORDER[1:]:
        if symm_setup and name in ("async_tp", "async_tp_fp8"):
            rec["unavailable"][name] = f"symmetric memory setup: {symm_setup}"
            continue
        if name == "megatron_fp8":
            fp8, fp8_ref = _fp8_reference(ctx, ops, megatron, ref, rec)
            variant = fp8
        elif name in report.FP8_VARIANTS:
            if fp8 is None:
                rec["unavailable"][name] = "megatron_fp8, its reference, did not run"
                continue
            variant = _try_check(ctx, name, ops, fp8, fp8_ref, rec)
        else:
            variant = _try_check(ctx, name, ops, megatron, ref, rec)
        if variant is not None:
            variants[name] = variant
    del ref, fp8_ref
    floors = _floors(ctx, ops, gathered, ctx.tp, rec)
    for name in report.TIMED_ORDER:
        if name in variants:
            rec["ms"][name] = time_variant(ctx, variants[name].step)
    last = time_variant(ctx, megatron.step)
    first = rec["ms"][report.RETIMED]
    rec["retimed"] = dict(variant=report.RETIMED, first=first, last=last)
    rec["ms"][report.RETIMED] = (first + last) / 2
    if args.profile:
        steps = {**floors, **{n: v.step for n, v in variants.items()}}
        profile_variants(ctx, steps, args.out)
    faulthandler.cancel_dump_traceback_later()
    rec["status"] = "wrong" if report.wrong(rec) else "ok"
    if ctx.rank == 0:
        stem = os.path.join(args.out, report.output_stem(ctx.tp, args.tokens))
        counters = _inductor_counters()
        meta = _meta(ctx, args, ctx.tp, t_start, counters, symm_mem_setup_error=symm_setup)
        meta["path_choices"] = distgemm_ops.path_choices()  # the S and path of every GEMM
        report.write_outputs(rec, meta, stem)
    ctx.close()
    return 1 if _failed(rec) else 0


def local_run(args) -> int:
    """--local-only: the two floors on the current GPU, no torchrun and no process group, with
    rank 0's shards at TP = ``args.tp``: check, time (floor with the long warm-up, then
    floor_step), write. Returns 1 when floor_step failed or is off its eager block."""
    from benchmarks.common.timing import SingleGpuContext

    ctx = SingleGpuContext.current()
    t_start = time.perf_counter()
    faulthandler.dump_traceback_later(RUN_TIMEOUT_S, exit=True)
    ops, gathered = _rank_operands(args, ctx.dev, 0, args.tp)
    rec = _new_record(args, args.tp)
    floors = _floors(ctx, ops, gathered, args.tp, rec)
    if args.profile:
        profile_variants(ctx, floors, args.out)
    faulthandler.cancel_dump_traceback_later()
    rec["status"] = "wrong" if report.wrong(rec) else "ok"
    stem = os.path.join(args.out, report.output_stem(args.tp, args.tokens) + "-local")
    meta = _meta(ctx, args, args.tp, t_start, _inductor_counters(), local_only=True)
    report.write_outputs(rec, meta, stem)
    return 1 if _failed(rec) else 0


def smoke_main() -> int:
    """--cpu-smoke under torchrun: gloo, the tiny sizes, errors printed; 1 when one is off."""
    dist.init_process_group("gloo")
    try:
        res = cpu_smoke(dist.get_rank(), dist.get_world_size())
    finally:
        dist.destroy_process_group()
    worst = {v: max(e.values()) for v, e in res["rel_err"].items()}
    print(
        f"rank {os.environ.get('RANK')}: rel. err vs megatron (floor_step: vs its eager block) "
        f"{worst}",
        flush=True,
    )
    return 0 if all(e < report.ERR_TOL for e in worst.values()) else 1


def main(argv=None) -> int:
    ap = cli.ArgumentParser("python3 -m benchmarks.training.training_step", __doc__)
    ap.add_argument("--tokens", type=int, default=report.TOKENS)
    ap.add_argument("--hidden", type=int, default=report.HIDDEN)
    ap.add_argument("--ffn", type=int, default=report.FFN)
    ap.add_argument("--out", default=RESULTS_DIR)
    ap.add_argument("--cpu-smoke", action="store_true", help="gloo, tiny shapes, no timing")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="after the timing: per-kernel tables and the step timeline (timeline.txt) per variant",
    )
    ap.add_argument("--replot", metavar="JSON", help="no GPU: table, CSV and PNG of a stored run")
    ap.add_argument(
        "--local-only",
        action="store_true",
        help="no torchrun: the floors alone on the current GPU, rank 0's shapes at TP = --tp",
    )
    ap.add_argument(
        "--tp", type=int, help=f"the TP whose per-rank shapes --local-only times ({LOCAL_TP})"
    )
    args = ap.parse_args(argv)
    if args.replot:
        return report.replot(args.replot, args.out)
    if args.cpu_smoke:
        return smoke_main()
    if not args.local_only:
        if args.tp is not None:
            ap.error("--tp applies to --local-only only (under torchrun TP is the world size)")
        return run(args)
    args.tp = LOCAL_TP if args.tp is None else args.tp
    if args.tp < 1:
        ap.error(f"--tp {args.tp}: must be at least 1")
    try:
        report.check_sizes(args.tokens, args.hidden, args.ffn, args.tp)
    except ValueError as e:
        ap.error(f"--local-only: {e}")
    if not torch.cuda.is_available():
        ap.error("--local-only needs a CUDA GPU (torch.cuda.is_available() is False)")
    return local_run(args)


if __name__ == "__main__":
    sys.exit(main())
