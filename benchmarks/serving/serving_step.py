"""Serving benchmark: a tensor-parallel layer stack (QKV, O, FC1, FC2 per layer; Llama-70B by
default) at decode batch sizes, each captured in a CUDA graph per batch bucket, and at prefill
chunk sizes, eager; distgemm against the unfused baselines (torch.mm, then NCCL all_reduce,
torch's one-shot or two-shot all-reduce, or NCCL's symmetric-memory all_reduce at decode; NCCL
collectives + torch.mm and torch's fused symmetric-memory ops at prefill), ms per step and
memory per variant, in one torchrun run.

    torchrun --nproc-per-node N -m benchmarks.serving.serving_step [--out DIR]
        [--model 70B|405B|Qwen2-72B|...] [--decode-tokens 1,8,64]
    torchrun --nproc-per-node 2 -m benchmarks.serving.serving_step --cpu-smoke --out DIR  # no time
    python3 -m benchmarks.serving.serving_step --replot RUN.json --out DIR                # no GPU

(from the repository root).

TP = world size. benchmarks/serving/stack.py builds the stack and its two layouts,
benchmarks/serving/report.py names the variants, the layout a server uses per phase and the
acceptance rule. Per phase, each variant gets its output buffers, then (memory measured from
here) its first eager step and, at decode, its graphs, largest batch first in one memory pool,
as servers capture. A variant that raises (an op refused under capture, a token count a layout
cannot split, symmetric memory missing) is recorded with its reason and the run goes on. Per
token count, every variant's outputs (all layers) are checked against its layout's NCCL + mm
once, then the variants are timed back to back with benchmarks/common/timing.py's steady-state
windows (the floor first, with the long warm-up). Output: ``<date>-serving-tp<N>``
.json/.csv/-memory.csv/.txt/.png under --out, each naming torch, the device and INSTALLED_BY.
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.common import allreduce_baselines as ab
from benchmarks.common import report as out
from benchmarks.serving import report, runtime, stack
from distgemm import cli

RUN_TIMEOUT_S = 400  # a run that takes longer is hung (~3 min expected): dump stacks, exit
SMOKE_DIMS = {"QKV": (96, 64), "O": (64, 64), "FC1": (256, 64), "FC2": (64, 128)}
SMOKE_DEPTH, SMOKE_TOKENS = 2, (1, 2, 6, 16)
PLAN_TOL = 1e-9  # the reference executor against float64: rounding of float64 sums only


@dataclass
class Built:
    """A variant at one token count: ``time`` (what is timed: the graph's replay or the eager
    step), ``outputs()`` (one step, returning every layer output), the tensors to poison
    before a check and ``keep``: what the step's graph reads without holding a reference (the
    symmetric buffer of one_shot_all_reduce or of the in-place variants' outputs, the NCCL
    window: freed with its last Python reference while a captured graph would still read it)."""

    time: Any
    outputs: Any
    poison: list
    keep: Any = None


def _poison(tensors) -> None:
    for t in tensors:
        t.fill_(math.nan)


@dataclass
class Shared:
    """What every variant's setup shares: the group's name, why torch's symmetric memory could
    not be enabled (None: it was) and the NCCL windows made (released at the end of the run)."""

    group_name: str
    symm_setup: str | None
    windows: list = field(default_factory=list)


def _setup(ctx, variant, shared: Shared, ops, max_tokens):
    """(what the variant's step reads beyond its own buffers: the one-shot's symmetric input,
    or the flat symmetric buffer of the in-place variants' outputs, or None; why the variant
    cannot run at all, or None)."""
    if variant.startswith("symm_mem") and shared.symm_setup:
        return None, f"symmetric memory setup: {shared.symm_setup}"
    dtype, dev = ops.x0.dtype, ctx.dev
    if variant == "symm_mem_one_shot":
        numel = max_tokens * ops.dims["O"][0]
    elif variant in report.SYMMETRIC_OUTPUTS:
        numel = stack.symmetric_numel(ops, max_tokens)
    else:
        return None, None
    if variant == "nccl_symm_mm":
        win, why = runtime.attempt(ctx, lambda: ab.nccl_window(torch, dist, numel, dtype, dev))
        if win is not None:
            shared.windows.append(win)
        return win, (f"NCCL symmetric window: {why}" if why else None)
    buf, why = runtime.attempt(
        ctx, lambda: ab.symm_buffer(torch, numel, dtype, dev, shared.group_name)
    )
    return buf, (f"symmetric buffer: {why}" if why else None)


def build_variant(ctx, variant, phase, ops, bufs, tokens, shared: Shared, recs):
    """The variant's step at every token count, first called eagerly and at decode captured;
    ``{tokens: Built}``. Failures go to ``recs[tokens]["unavailable"]``."""
    captured = report.CAPTURED[phase]
    keep, why = _setup(ctx, variant, shared, ops, max(tokens))
    built: dict[int, Built] = {}
    if why:
        for t in tokens:
            recs[t]["unavailable"][variant] = why
        return built
    if variant in report.SYMMETRIC_OUTPUTS:
        stack.place_outputs(bufs, keep.buf if variant == "nccl_symm_mm" else keep, max(tokens))
    symm_buf = keep if variant == "symm_mem_one_shot" else None
    flat = [x for ts in bufs.values() for x in ts]
    scratch = bufs.get("scratch", [None])[0]
    calls = stack.layer_calls(variant, shared.group_name, scratch, symm_buf)
    pool = torch.cuda.graph_pool_handle() if captured else None
    for t in sorted(tokens, reverse=True):  # largest first: later graphs reuse the pool
        res = None
        why = stack.sp_reason(t, ctx.tp) if report.LAYOUT[variant] == "sp" else None
        step = stack.make_step(variant, ops, bufs, t, calls)
        if why is None:
            _, why = runtime.attempt(ctx, step)
        if why is None and captured:
            res, why = runtime.attempt(ctx, lambda step=step: runtime.capture(torch, step, pool))
            why = f"under CUDA graph capture: {why}" if why else None
        if why:
            recs[t]["unavailable"][variant] = why
            continue
        if captured:
            graph, outs = res

            def replayed(graph=graph, outs=outs):
                graph.replay()
                return outs

            built[t] = Built(graph.replay, replayed, flat + list(outs), keep=keep)
        else:
            built[t] = Built(step, step, flat, keep=keep)
    return built


def check_bucket(ctx, phase, t, built, rec) -> None:
    """Every variant's outputs at ``t`` against its layout's NCCL + mm (the floor: every output
    written and finite), poisoned with NaN first; the worst error over ranks into
    ``rec["rel_err"]``. A variant without its reference is dropped with the reason."""
    refs = {}
    references = [r for r in report.REFERENCE.values() if r in built]
    others = [v for v in report.PHASE_VARIANTS[phase] if v not in references]
    for v in references + others:  # the references first
        b = built[v].get(t)
        if b is None:
            continue
        layout = report.LAYOUT[v] or "ar"
        if v != "floor" and v not in references and layout not in refs:
            rec["unavailable"][v] = f"not checked: {report.REFERENCE[layout]} did not run"
            del built[v][t]
            continue
        _poison(b.poison)
        got, why = runtime.attempt(ctx, b.outputs)  # every variant has its own outputs
        if why:
            rec["unavailable"][v] = f"check: {why}"
            del built[v][t]
            continue
        if v in references:
            refs[layout] = got
        if v == "floor" or v in references:
            err = 0.0 if all(bool(torch.isfinite(o).all()) for o in got) else math.nan
        else:
            err = stack.max_rel_err(got, refs[layout])
        worst = ctx.agree_max([err if err == err else math.inf])[0]
        rec["rel_err"][v] = worst if worst != math.inf else math.nan


def run_phase(ctx, phase, tokens, ops, shared: Shared) -> dict[str, Any]:
    """Build, check and time every variant of ``phase`` at every token count: the records,
    the memory each variant added and the activation buffers of each layout (MiB)."""
    from benchmarks.common.timing import REWARM_S, WARMUP_S

    recs = {
        t: dict(phase=phase, tokens=t, tp=ctx.tp, ms={}, rel_err={}, unavailable={}) for t in tokens
    }
    built, memory, buffers = {}, {}, {}
    for v in report.PHASE_VARIANTS[phase]:
        layout = report.LAYOUT[v] or "ar"
        bufs = stack.make_buffers(ops, layout, max(tokens))
        buffers[layout] = stack.buffers_bytes(bufs) / out.MIB
        before = runtime.memory_snapshot(torch)
        built[v] = build_variant(ctx, v, phase, ops, bufs, tokens, shared, recs)
        memory[v] = runtime.memory_delta(torch, before)  # synchronises: a fault shows here
        print(f"[{phase}] {v}: built for tokens {sorted(built[v])}", flush=True)
    for t in tokens:
        check_bucket(ctx, phase, t, built, recs[t])
        warm = WARMUP_S
        for v in report.PHASE_VARIANTS[phase]:
            if t in built[v]:
                ms, why = runtime.timed(ctx, built[v][t].time, warm)
                if why:
                    recs[t]["unavailable"][v] = why
                else:
                    recs[t]["ms"][v] = ms
                warm = REWARM_S
        print(f"[{phase}] tokens {t}: {recs[t]['ms']}", flush=True)
    return dict(records=list(recs.values()), memory=memory, buffers_mib=buffers)


def run(args) -> int:
    """The GPU run: check, time, write (rank 0). Returns 1 when a variant is wrong."""
    from benchmarks.common.timing import RankContext, enable_symm_mem

    ctx = RankContext.from_torchrun(ctrl_timeout_s=120.0)
    t_start = time.perf_counter()
    faulthandler.dump_traceback_later(RUN_TIMEOUT_S, exit=True)
    group_name = dist.group.WORLD.group_name
    shared = Shared(group_name, enable_symm_mem(group_name))
    dims = stack.model_dims(args.model)
    phases = {"decode": args.decode_tokens, "prefill": args.prefill_tokens}
    max_tokens = max(t for ts in phases.values() for t in ts)
    ops = stack.make_operands(dims, args.layers, ctx.tp, ctx.rank, max_tokens, ctx.dev)
    result: dict[str, Any] = dict(
        model=args.model, layers=args.layers, tp=ctx.tp, records=[], memory={}, buffers_mib={}
    )
    for phase, tokens in phases.items():
        if tokens:
            res = run_phase(ctx, phase, tokens, ops, shared)
            result["records"] += res["records"]
            result["memory"][phase] = res["memory"]
            result["buffers_mib"][phase] = res["buffers_mib"]
    faulthandler.cancel_dump_traceback_later()
    result["distgemm_paths"] = runtime.distgemm_paths()
    bad = [(r["phase"], r["tokens"], report.wrong(r)) for r in result["records"]]
    bad = [b for b in bad if b[2]]
    if ctx.rank == 0:
        meta = out.run_meta(
            torch,
            ctx.dev,
            ctx.tp,
            time.perf_counter() - t_start,
            symm_mem_setup_error=shared.symm_setup,
            nccl=".".join(map(str, ab.nccl_version(torch) or ())) or None,
        )
        stem = os.path.join(args.out, out.output_stem("serving", ctx.tp))
        report.write_outputs(result, meta, stem)
        if bad:
            print(f"WRONG results: {bad}", flush=True)
    torch.cuda.synchronize()
    for win in shared.windows:  # the graphs that read them are gone with their phase
        try:
            win.release()
        except Exception as e:  # noqa: BLE001 - the results are written; say it, end cleanly
            print(f"NCCL window release: {type(e).__name__}: {e}", flush=True)
    ctx.close()
    return 1 if bad else 0


def cpu_smoke(rank: int, tp: int) -> dict[str, Any]:
    """The stack's CPU-runnable variants on a gloo group, tiny shapes, no capture or timing:
    NCCL-like collectives + torch.mm in both layouts against a one-process fp32 stack, the
    floor's outputs written and finite, and distgemm's plans of every layer on the CPU
    reference executor (an error, or the reason the plan is rejected)."""
    ops = stack.make_operands(SMOKE_DIMS, SMOKE_DEPTH, tp, rank, max(SMOKE_TOKENS), "cpu")
    group_name = dist.group.WORLD.group_name
    res: dict[str, Any] = dict(rel_err={}, floor_finite={}, unavailable={}, plans={})
    for variant in ("nccl_mm", "nccl_mm_sp", "floor"):
        layout = report.LAYOUT[variant] or "ar"
        bufs = stack.make_buffers(ops, layout, max(SMOKE_TOKENS))
        calls = stack.layer_calls(variant, group_name, bufs.get("scratch", [None])[0])
        for t in SMOKE_TOKENS:
            why = stack.sp_reason(t, tp) if layout == "sp" else None
            if why:
                res["unavailable"][f"{variant} M{t}"] = why
                continue
            got = stack.make_step(variant, ops, bufs, t, calls)()
            if variant == "floor":
                res["floor_finite"][f"M{t}"] = all(bool(torch.isfinite(o).all()) for o in got)
            else:
                ref = stack.reference_outputs(ops, t, layout)
                res["rel_err"][f"{variant} M{t}"] = stack.max_rel_err(got, ref)
    res["plans"] = {t: stack.plan_errors(SMOKE_DIMS, tp, t) for t in SMOKE_TOKENS}
    return res


def smoke_failures(res: dict[str, Any]) -> list[str]:
    """What is off in a ``cpu_smoke`` result: errors at or over the tolerance, a floor that
    left NaN, a distgemm plan whose reference error is over PLAN_TOL (a rejection is not a
    failure: it says which token counts distgemm refuses)."""
    bad = [f"{k}: {e}" for k, e in res["rel_err"].items() if not e < report.ERR_TOL]
    bad += [f"floor {k} not finite" for k, ok in res["floor_finite"].items() if not ok]
    for t, plans in res["plans"].items():
        bad += [
            f"plan {k} M{t}: {e}"
            for k, e in plans.items()
            if isinstance(e, float) and not e < PLAN_TOL
        ]
    return bad


def cli_model(text: str) -> str:
    """An argparse type: a model of report.MODELS."""
    if text not in report.MODELS:
        raise argparse.ArgumentTypeError(f"{text!r}: give one of {', '.join(report.MODELS)}")
    return text


def main(argv=None) -> int:
    ap = cli.ArgumentParser("python3 -m benchmarks.serving.serving_step", __doc__)
    ap.add_argument(
        "--model",
        type=cli_model,
        default=report.MODEL,
        help=f"the stack's model: one of {', '.join(report.MODELS)}",
    )
    ap.add_argument("--layers", type=int, default=report.STACK_DEPTH, help="stack depth")
    ap.add_argument(
        "--decode-tokens",
        type=runtime.parse_tokens,
        default=list(report.DECODE_TOKENS),
        help="comma-separated batch buckets ('' for none)",
    )
    ap.add_argument(
        "--prefill-tokens",
        type=runtime.parse_tokens,
        default=list(report.PREFILL_TOKENS),
        help="comma-separated chunk sizes ('' for none)",
    )
    runtime.add_output_options(ap)
    args = ap.parse_args(argv)
    if args.replot:
        return report.replot(args.replot, args.out)
    if args.cpu_smoke:
        return runtime.run_smoke("serving", cpu_smoke, smoke_failures, args.out)
    if not (args.decode_tokens or args.prefill_tokens):
        ap.error("no token counts: give --decode-tokens or --prefill-tokens")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
