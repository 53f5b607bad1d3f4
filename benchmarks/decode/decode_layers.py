"""Decode benchmark: the row-parallel layers of Llama-8B/70B/405B (O, FC2) at decode token
counts with their output all-reduced, TP = world size: torch.mm alone (the floor), mm + NCCL
all_reduce, mm + torch's symm_mem one_shot_all_reduce and distgemm.gemm_all_reduce, each captured
in a CUDA graph of 20 calls, in one torchrun run.

    torchrun --nproc-per-node N -m benchmarks.decode.decode_layers [--models 70B,405B]
        [--tokens 1,8] [--out DIR]
    torchrun --nproc-per-node 2 -m benchmarks.decode.decode_layers --cpu-smoke --out DIR  # no time
    python3 -m benchmarks.decode.decode_layers --replot RUN.json --out DIR                # no GPU

(from the repository root).

Per rank: ``a`` ``[M, K/TP]``, ``w`` ``[N, K/TP]`` (this rank's columns of the full weight, one
seed on every rank), ``out`` ``[M, N]`` = the all-reduced ``a @ w.T``, bf16. Per case, every
variant is first called eagerly, then captured (a variant that raises, eagerly or under capture,
is recorded with the reason and the run goes on); the outputs are checked against mm + NCCL once
(poisoned with NaN first), then the graphs are timed back to back with the steady-state windows
of benchmarks/common/timing.py, mm alone first with the long warm-up. benchmarks/decode/report.py
states the acceptance columns. Output: ``<date>-decode-tp<N>`` .json/.csv/.txt/.png under --out,
each naming torch, the device and INSTALLED_BY.
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.common import report as out
from benchmarks.common.llama_cases import global_gemm
from benchmarks.decode import report
from benchmarks.serving import runtime
from benchmarks.serving.stack import cols_of, max_rel_err
from distgemm import cli

# A run longer than this is hung (a case takes ~6 s): dump every thread's stack and exit.
HANG_BASE_S, HANG_PER_CASE_S = 60, 8
SMOKE_DIMS = {"O": (64, 128), "FC2": (64, 256)}  # (N, K) of --cpu-smoke's layers
SMOKE_TOKENS = (1, 2, 3, 8)
PLAN_TOL = 1e-9  # the reference executor against float64: rounding of float64 sums only
SEED = 4321


def split_reason(n: int, k: int, tp: int) -> str | None:
    """Why a layer's K cannot be split over tp ranks into 16-byte rows (None: it can)."""
    if k % tp or (k // tp) % 8:
        return f"K={k} does not split over tp={tp} into multiples of 8 elements"
    return None


@dataclass
class LayerOperands:
    """One rank's shard of a layer at up to ``max_tokens``: ``a`` ``[max_tokens, K/TP]``,
    ``w`` ``[N, K/TP]`` and ``wt`` its transposed view, one output buffer per variant."""

    a: torch.Tensor
    w: torch.Tensor
    wt: torch.Tensor
    outs: dict[str, torch.Tensor]


def full_layer(n: int, k: int, max_tokens: int, device, dtype=torch.bfloat16):
    """The full activations ``[max_tokens, K]`` and weight ``[N, K]`` (scaled by 1/sqrt(K)),
    the same on every rank."""
    gen = torch.Generator(device=device).manual_seed(SEED + n + 7 * k)
    a = torch.randn(max_tokens, k, device=device, dtype=dtype, generator=gen)
    w = torch.randn(n, k, device=device, dtype=dtype, generator=gen).mul_(1 / math.sqrt(k))
    return a, w


def layer_operands(n, k, tp, rank, max_tokens, device) -> LayerOperands:
    a, w = full_layer(n, k, max_tokens, device)
    w = cols_of(w, rank, tp)
    outs = {v: a.new_empty(max_tokens, n) for v in report.VARIANTS}
    return LayerOperands(cols_of(a, rank, tp), w, w.t(), outs)


def one_call(variant: str, ops: LayerOperands, tokens: int, symm_buf, group_name: str):
    """One call of ``variant`` at ``tokens`` into its output buffer (a callable)."""
    import distgemm

    if variant not in report.VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; one of {', '.join(report.VARIANTS)}")
    a, o = ops.a[:tokens], ops.outs[variant][:tokens]
    if variant == "mm":
        return lambda: torch.mm(a, ops.wt, out=o)
    if variant == "nccl":

        def call():
            torch.mm(a, ops.wt, out=o)
            dist.all_reduce(o)

        return call
    if variant == "one_shot":
        return lambda: runtime.mm_one_shot_all_reduce(torch, a, ops.wt, symm_buf, group_name, o)
    if variant == "distgemm_fused":
        return lambda: distgemm.gemm_all_reduce(a, ops.w, out=o, path="fused")
    return lambda: distgemm.gemm_all_reduce(a, ops.w, out=o)


def build(ctx, ops, tokens, symm_buf, symm_why, group_name, rec) -> dict[str, Any]:
    """Every variant's graph of CALLS_PER_GRAPH calls (after one eager call); failures go to
    ``rec["unavailable"]``."""
    graphs = {}
    for v in report.VARIANTS:
        if v == "one_shot" and symm_why:
            rec["unavailable"][v] = symm_why
            continue
        call = one_call(v, ops, tokens, symm_buf, group_name)
        res = None

        def body(call=call):
            for _ in range(report.CALLS_PER_GRAPH):
                call()

        _, why = runtime.attempt(ctx, call)
        if why is None:
            res, why = runtime.attempt(ctx, lambda body=body: runtime.capture(torch, body))
            why = f"under CUDA graph capture: {why}" if why else None
        if why:
            rec["unavailable"][v] = why
        else:
            graphs[v] = res[0]
    return graphs


def check(ctx, ops, tokens, graphs, rec) -> None:
    """One replay of every graph, its output poisoned with NaN first: mm + NCCL's is the
    reference, mm alone must be finite; the worst error over ranks into ``rec["rel_err"]``."""
    outs = {v: ops.outs[v][:tokens] for v in graphs}
    for v in graphs:
        outs[v].fill_(math.nan)
        graphs[v].replay()
    torch.cuda.synchronize()
    ref = outs.get(report.REFERENCE)
    for v in graphs:
        if v == "mm" or v == report.REFERENCE:
            err = 0.0 if bool(torch.isfinite(outs[v]).all()) else math.nan
        elif ref is None:
            err = math.nan
            rec["unavailable"].setdefault(v, f"not checked: {report.REFERENCE} did not run")
        else:
            err = max_rel_err([outs[v]], [ref])
        worst = ctx.agree_max([err if err == err else math.inf])[0]
        rec["rel_err"][v] = worst if worst != math.inf else math.nan


def run(args) -> int:
    """The GPU run: build, check, time every case, write (rank 0). Returns 1 when a variant is
    wrong."""
    from benchmarks.common.timing import REWARM_S, WARMUP_S, RankContext, enable_symm_mem

    ctx = RankContext.from_torchrun(ctrl_timeout_s=120.0)
    t_start = time.perf_counter()
    cases = len(args.models) * len(args.layers) * len(args.tokens)
    faulthandler.dump_traceback_later(HANG_BASE_S + HANG_PER_CASE_S * cases, exit=True)
    group_name = dist.group.WORLD.group_name
    symm_setup = enable_symm_mem(group_name)
    max_tokens = max(args.tokens)
    layers = [(m, la, *global_gemm(m, la, 1)[1:]) for m in args.models for la in args.layers]
    max_numel = max_tokens * max(n for _m, _la, n, _k in layers)
    symm_buf, symm_why = None, f"symmetric memory setup: {symm_setup}" if symm_setup else None
    if symm_why is None:
        symm_buf, why = runtime.attempt(
            ctx, lambda: runtime.symm_buffer(torch, max_numel, torch.bfloat16, ctx.dev, group_name)
        )
        symm_why = f"symmetric buffer: {why}" if why else None
    records = []
    for model, layer, n, k in layers:
        base = dict(model=model, layer=layer, tp=ctx.tp, n=n, k=k)
        why = split_reason(n, k, ctx.tp)
        if why:
            unavailable = dict.fromkeys(report.VARIANTS, why)
            records += [
                dict(base, tokens=t, m=t, us={}, rel_err={}, unavailable=unavailable)
                for t in args.tokens
            ]
            continue
        ops = layer_operands(n, k, ctx.tp, ctx.rank, max_tokens, ctx.dev)
        for t in args.tokens:
            rec = dict(base, tokens=t, m=t, us={}, rel_err={}, unavailable={})
            graphs = build(ctx, ops, t, symm_buf, symm_why, group_name, rec)
            check(ctx, ops, t, graphs, rec)
            warm = WARMUP_S
            for v, g in graphs.items():
                ms, why = runtime.timed(ctx, g.replay, warm)
                if why:
                    rec["unavailable"][v] = why
                else:
                    rec["us"][v] = ms * 1e3 / report.CALLS_PER_GRAPH
                warm = REWARM_S
            print(f"{report.case_name(rec)}: us {rec['us']}", flush=True)
            records.append(rec)
            del graphs
        del ops
        torch.cuda.empty_cache()
    faulthandler.cancel_dump_traceback_later()
    bad = [(report.case_name(r), report.wrong(r)) for r in records if report.wrong(r)]
    if ctx.rank == 0:
        meta = out.run_meta(
            torch,
            ctx.dev,
            ctx.tp,
            time.perf_counter() - t_start,
            symm_mem_setup_error=symm_setup,
            calls_per_graph=report.CALLS_PER_GRAPH,
            distgemm_paths=runtime.distgemm_paths(),
        )
        report.write_outputs(
            records, meta, os.path.join(args.out, out.output_stem("decode", ctx.tp))
        )
        if bad:
            print(f"WRONG results: {bad}", flush=True)
    ctx.close()
    return 1 if bad else 0


def cpu_smoke(rank: int, tp: int) -> dict[str, Any]:
    """The CPU-runnable variants on a gloo group, tiny shapes, no capture or timing: mm + the
    group's all_reduce against the one-process fp32 product, mm alone written and finite, and
    distgemm's ar_tile_a plan at each token count on the CPU reference executor (an
    error, or the reason the plan is rejected)."""
    res: dict[str, Any] = dict(rel_err={}, mm_finite={}, plans={})
    for layer, (n, k) in SMOKE_DIMS.items():
        ops = layer_operands(n, k, tp, rank, max(SMOKE_TOKENS), "cpu")
        a_full, w_full = (x.float() for x in full_layer(n, k, max(SMOKE_TOKENS), "cpu"))
        for t in SMOKE_TOKENS:
            one_call("nccl", ops, t, None, "")()
            got = ops.outs["nccl"][:t]
            res["rel_err"][f"{layer} M{t}"] = max_rel_err([got], [a_full[:t] @ w_full.t()])
            one_call("mm", ops, t, None, "")()
            res["mm_finite"][f"{layer} M{t}"] = bool(torch.isfinite(ops.outs["mm"][:t]).all())
            err, why = runtime.plan_reference_error("ar_tile_a", tp, t, n, k)
            res["plans"][f"{layer} M{t}"] = err if why is None else why
    return res


def smoke_failures(res: dict[str, Any]) -> list[str]:
    """What is off in a ``cpu_smoke`` result (a plan rejection is a finding, not a failure)."""
    bad = [f"{c}: {e}" for c, e in res["rel_err"].items() if not e < report.ERR_TOL]
    bad += [f"mm {c} not finite" for c, ok in res["mm_finite"].items() if not ok]
    bad += [
        f"plan {c}: {e}"
        for c, e in res["plans"].items()
        if isinstance(e, float) and not e < PLAN_TOL
    ]
    return bad


def _names(valid):
    def parse(text: str) -> list[str]:
        vals = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in vals if x not in valid]
        if bad or not vals:
            raise argparse.ArgumentTypeError(f"{text!r}: give some of {', '.join(valid)}")
        return vals

    return parse


def main(argv=None) -> int:
    ap = cli.ArgumentParser("python3 -m benchmarks.decode.decode_layers", __doc__)
    ap.add_argument("--models", type=_names(report.MODELS), default=list(report.MODELS))
    ap.add_argument("--layers", type=_names(report.LAYERS), default=list(report.LAYERS))
    ap.add_argument("--tokens", type=runtime.parse_tokens, default=list(report.TOKENS))
    runtime.add_output_options(ap)
    args = ap.parse_args(argv)
    if args.replot:
        return report.replot(args.replot, args.out)
    if args.cpu_smoke:
        return runtime.run_smoke("decode", cpu_smoke, smoke_failures, args.out)
    if not args.tokens:
        ap.error("--tokens: give at least one token count")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
