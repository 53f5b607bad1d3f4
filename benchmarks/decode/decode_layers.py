"""Decode benchmark: row-parallel layers (O, FC2) at decode token counts with their output
all-reduced, TP = world size: torch.mm alone (the floor), the unfused baselines (torch.mm, then
NCCL all_reduce, torch's one_shot_all_reduce or two_shot_all_reduce_, or NCCL's symmetric-memory
all_reduce: benchmarks/common/allreduce_baselines.py) and distgemm.gemm_all_reduce (auto, and
forced onto each fused path: path="fused", the one-shot tail, and path="fused_two_shot", the
CUTLASS kernel's two-shot tail, above the decode kernel's tokens), each captured in a CUDA
graph of 20 calls, in one torchrun run.

    torchrun --nproc-per-node N -m benchmarks.decode.decode_layers [--models 8B,70B,405B]
        [--layers O,FC2] [--extra Qwen2-72B/FC2,Mixtral-8x22B/O|none] [--tokens 1,8] [--out DIR]
        [--own-all-reduce]
    torchrun --nproc-per-node 2 -m benchmarks.decode.decode_layers --cpu-smoke --out DIR  # no time
    python3 -m benchmarks.decode.decode_layers --replot RUN.json[,RUN2.json] --out DIR    # no GPU

(from the repository root). The layers: benchmarks/decode/cases.py (default: the Llama-3 models
of distgemm.llama3, plus a Qwen2-72B FC2 and a Mixtral-8x22B O); --replot of several runs at one
TP merges them into one report.

Per rank: ``a`` ``[M, K/TP]``, ``w`` ``[N, K/TP]`` (this rank's columns of the full weight, one
seed on every rank), ``out`` ``[M, N]`` = the all-reduced ``a @ w.T``, bf16 (two_shot and
nccl_symm reduce in place: their ``out`` is their symmetric buffer). Per case, every variant is
first called eagerly, then captured (a variant that raises, eagerly or under capture, or whose
buffers could not be set up, is recorded with the reason and the run goes on); the outputs are
checked against mm + NCCL once (poisoned with NaN first), then the graphs are timed back to back
with the steady-state windows of benchmarks/common/timing.py, mm alone first with the long
warm-up. benchmarks/decode/report.py takes the best unfused variant per case, the ratios against
it and issue 42's acceptance. Output: ``<date>-decode-tp<N>`` .json/.csv/.txt/.png under --out,
each naming torch, the device and INSTALLED_BY; while it runs, ``<date>-decode-tp<N>.partial.json``
holds the layers finished so far (``--replot`` reads it), removed once the outputs are written.
"""

from __future__ import annotations

import faulthandler
import json
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
from benchmarks.common.models import MODELS
from benchmarks.common.timing import REWARM_S, WARMUP_S, RankContext, enable_symm_mem
from benchmarks.decode import cases, report
from benchmarks.serving import runtime
from benchmarks.serving.stack import cols_of, max_rel_err
from distgemm import cli
from distgemm.calibrate import l2_bytes, weight_copies

# A run longer than this is hung (a case takes ~10 s): dump every thread's stack and exit.
HANG_BASE_S, HANG_PER_CASE_S = 60, 14
SMOKE_DIMS = {"O": (64, 128), "FC2": (64, 256)}  # (N, K) of --cpu-smoke's layers
SMOKE_TOKENS = (1, 2, 3, 8)
PLAN_TOL = 1e-9  # the reference executor against float64: rounding of float64 sums only
SEED = 4321
PARTIAL_SUFFIX = ".partial.json"  # the finished layers of a run still going (write_partial)


@dataclass
class Baselines:
    """The buffers of the symmetric-memory baselines, shared by every case and sized for the
    largest (flat, ``numel`` elements): one_shot's input, two_shot's and nccl_symm's input and
    result; ``unavailable``: the variants that cannot run, with the reason."""

    one_shot: Any = None
    two_shot: Any = None
    window: Any = None  # allreduce_baselines.NcclWindow
    unavailable: dict[str, str] = field(default_factory=dict)


def make_baselines(ctx, numel: int, group_name: str, own_all_reduce=()) -> Baselines:
    """Each baseline's buffer, allocated and registered over the ranks (agreed attempts: a
    failure is that variant's reason in every case, never fatal); ``own_all_reduce``: the
    algorithms of our all-reduce to time forced after torch.mm too (the others are recorded as
    not asked for)."""
    from distgemm.runtime.paths.collective import own_all_reduce_problem

    b = Baselines()
    for v, algorithm in report.OWN_ALL_REDUCE.items():
        why = own_all_reduce_problem(algorithm, numel, torch.bfloat16, ctx.tp)
        if algorithm not in own_all_reduce:
            b.unavailable[v] = "not asked for (--own-all-reduce)"
        elif why:
            b.unavailable[v] = why
    setup = enable_symm_mem(group_name)
    for v in ("one_shot", "two_shot"):
        if setup:
            b.unavailable[v] = f"symmetric memory setup: {setup}"
            continue
        buf, why = runtime.attempt(
            ctx, lambda: ab.symm_buffer(torch, numel, torch.bfloat16, ctx.dev, group_name)
        )
        setattr(b, v, buf)
        if why:
            b.unavailable[v] = f"symmetric buffer: {why}"
    b.window, why = runtime.attempt(
        ctx, lambda: ab.nccl_window(torch, dist, numel, torch.bfloat16, ctx.dev)
    )
    if why:
        b.unavailable["nccl_symm"] = f"NCCL symmetric window: {why}"
    return b


@dataclass
class LayerOperands:
    """One rank's shard of a layer at up to ``max_tokens``: ``a`` ``[max_tokens, K/TP]``,
    ``weights``: copies of ``w`` ``[N, K/TP]`` (distgemm.calibrate.weight_copies of them: a
    graph's calls cycle through them, each reading its weight from HBM), one output buffer per
    variant (the in-place baselines': a view of their symmetric buffer)."""

    a: torch.Tensor
    weights: list[torch.Tensor]
    outs: dict[str, torch.Tensor]

    @property
    def w(self) -> torch.Tensor:
        return self.weights[0]


def full_layer(n: int, k: int, max_tokens: int, device, dtype=torch.bfloat16):
    """The full activations ``[max_tokens, K]`` and weight ``[N, K]`` (scaled by 1/sqrt(K)),
    the same on every rank."""
    gen = torch.Generator(device=device).manual_seed(SEED + n + 7 * k)
    a = torch.randn(max_tokens, k, device=device, dtype=dtype, generator=gen)
    w = torch.randn(n, k, device=device, dtype=dtype, generator=gen).mul_(1 / math.sqrt(k))
    return a, w


def layer_operands(n, k, tp, rank, max_tokens, device, base: Baselines | None = None):
    a, w = full_layer(n, k, max_tokens, device)
    w = cols_of(w, rank, tp)
    copies = weight_copies(w.numel() * w.element_size(), l2_bytes(device), report.CALLS_PER_GRAPH)
    weights = [w] + [w.clone() for _ in range(copies - 1)]
    outs = {v: a.new_empty(max_tokens, n) for v in report.VARIANTS}
    if base is not None:
        window = base.window.buf if base.window is not None else None
        for v, buf in (("two_shot", base.two_shot), ("nccl_symm", window)):
            if buf is not None:
                outs[v] = ab.rows_view(buf, max_tokens, n)
    return LayerOperands(cols_of(a, rank, tp), weights, outs)


def one_call(
    variant: str, ops: LayerOperands, tokens: int, base: Baselines | None, group_name, copy=0
):
    """One call of ``variant`` at ``tokens`` with weight copy ``copy`` into its output buffer (a
    callable)."""
    import distgemm

    if variant not in report.VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; one of {', '.join(report.VARIANTS)}")
    w = ops.weights[copy]
    a, o, wt = ops.a[:tokens], ops.outs[variant][:tokens], w.t()
    if variant == "mm":
        return lambda: torch.mm(a, wt, out=o)
    if variant == "nccl":
        return lambda: ab.mm_nccl(torch, dist, a, wt, o)
    if variant == "one_shot":
        return lambda: ab.mm_one_shot(torch, a, wt, base.one_shot, group_name, o)
    if variant == "two_shot":  # o: a view of its symmetric buffer, reduced in place
        return lambda: ab.mm_two_shot(torch, a, wt, o, group_name)
    if variant == "nccl_symm":  # o: a view of the NCCL window
        return lambda: ab.mm_nccl(torch, dist, a, wt, o)
    if variant in report.FUSED_PATH_VARIANTS:
        path = report.FUSED_PATH_VARIANTS[variant]
        return lambda: distgemm.gemm_all_reduce(a, w, out=o, path=path)
    if variant in report.OWN_ALL_REDUCE:
        from distgemm.runtime.allreduce import all_reduce_input, run_all_reduce
        from distgemm.runtime.communicator import get_communicator

        comm, algorithm = get_communicator(None), report.OWN_ALL_REDUCE[variant]

        def mm_own():  # as the collective path runs it: a pull algorithm's GEMM writes its region
            capturing = torch.cuda.is_current_stream_capturing()
            x = all_reduce_input(comm, algorithm, o, capturing)
            torch.mm(a, wt, out=x)
            run_all_reduce(comm, x, algorithm, capturing, out=o)

        return mm_own
    return lambda: distgemm.gemm_all_reduce(a, w, out=o)


def auto_choice(tokens: int, n: int, k: int) -> dict[str, Any]:
    """What ``path="auto"`` runs on the layer of global ``n`` x ``k`` at ``tokens``
    (``distgemm.path_choices``): the path, its all-reduce and the model's reason."""
    import distgemm

    for ch in distgemm.path_choices():
        if ch["op"] == "gemm_all_reduce" and ch["requested"] == "auto":
            if (ch["m"], ch["n"], ch["k"]) == (tokens, n, k):
                return {key: ch.get(key) for key in ("path", "all_reduce", "fused_tail", "why")}
    return {}


def build(ctx, ops, tokens, base: Baselines, group_name, rec) -> dict[str, Any]:
    """Every variant's graph of CALLS_PER_GRAPH calls cycling through the weight copies (after one
    eager call); failures go to ``rec["unavailable"]``."""
    from distgemm import _core
    from distgemm.runtime.machine import FUSED_PATHS

    graphs = {}
    for v in report.VARIANTS:
        if v in base.unavailable:
            rec["unavailable"][v] = base.unavailable[v]
            continue
        path = report.FUSED_PATH_VARIANTS.get(v)
        why = _core.fused_tail_problem(FUSED_PATHS[path], tokens) if path else ""
        if why:  # the two-shot tail at the decode kernel's token counts
            rec["unavailable"][v] = why
            continue
        calls = [one_call(v, ops, tokens, base, group_name, j) for j in range(len(ops.weights))]
        call = calls[0]
        res = None

        def body(calls=calls):
            for i in range(report.CALLS_PER_GRAPH):
                calls[i % len(calls)]()

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


def run_layer(ctx, layer: cases.Layer, tokens, base: Baselines, group_name) -> list[dict]:
    """Every token count of one layer: build, check, time; the records."""
    n, k = layer.n, layer.k
    head = dict(model=layer.model, layer=layer.layer, tp=ctx.tp, n=n, k=k)
    why = cases.split_reason(n, k, ctx.tp)
    if why:
        skip = dict.fromkeys(report.VARIANTS, why)
        return [dict(head, tokens=t, m=t, us={}, rel_err={}, unavailable=skip) for t in tokens]
    ops = layer_operands(n, k, ctx.tp, ctx.rank, max(tokens), ctx.dev, base)
    records = []
    for t in tokens:
        rec = dict(head, tokens=t, m=t, us={}, rel_err={}, unavailable={})
        rec["weight_copies"] = len(ops.weights)
        graphs = build(ctx, ops, t, base, group_name, rec)
        rec["auto"] = auto_choice(t, n, k)
        check(ctx, ops, t, graphs, rec)
        warm = WARMUP_S
        for v, g in graphs.items():
            ms, why = runtime.timed(ctx, g.replay, warm)
            if why:
                rec["unavailable"][v] = why
            else:
                rec["us"][v] = ms * 1e3 / report.CALLS_PER_GRAPH
            warm = REWARM_S
        if ctx.rank == 0:
            print(
                f"{report.case_name(rec)}: auto {report.auto_label(rec)}, us {rec['us']}",
                flush=True,
            )
        records.append(rec)
        del graphs
    del ops
    torch.cuda.empty_cache()
    return records


def run(args) -> int:
    """The GPU run: build, check, time every case, write (rank 0). Returns 1 when a variant is
    wrong."""
    ctx = RankContext.from_torchrun(ctrl_timeout_s=120.0)
    t_start = time.perf_counter()
    layers = cases.layer_list(args.models, args.layers, args.extra)
    faulthandler.dump_traceback_later(
        HANG_BASE_S + HANG_PER_CASE_S * len(layers) * len(args.tokens), exit=True
    )
    group_name = dist.group.WORLD.group_name
    numel = max(args.tokens) * max(la.n for la in layers)
    base = make_baselines(ctx, numel, group_name, args.own_all_reduce)
    stem = os.path.join(args.out, out.output_stem("decode", ctx.tp))

    def meta() -> dict[str, Any]:
        return out.run_meta(
            torch,
            ctx.dev,
            ctx.tp,
            time.perf_counter() - t_start,
            nccl=".".join(map(str, ab.nccl_version(torch) or ())) or None,
            baselines_unavailable=base.unavailable,
            calls_per_graph=report.CALLS_PER_GRAPH,
            distgemm_paths=runtime.distgemm_paths(),
        )

    records = []
    for layer in layers:
        records += run_layer(ctx, layer, args.tokens, base, group_name)
        if ctx.rank == 0:  # the layers so far, kept should a time limit end the run
            write_partial(stem, records, meta())
    faulthandler.cancel_dump_traceback_later()
    bad = [(report.case_name(r), report.wrong(r)) for r in records if report.wrong(r)]
    if ctx.rank == 0:
        report.write_outputs(records, meta(), stem)
        os.remove(stem + PARTIAL_SUFFIX)
        if bad:
            print(f"WRONG results: {bad}", flush=True)
    if base.window is not None:
        torch.cuda.synchronize()
        try:
            base.window.release()
        except Exception as e:  # noqa: BLE001 - the results are written; say it, end cleanly
            print(f"NCCL window release: {type(e).__name__}: {e}", flush=True)
    ctx.close()
    return 1 if bad else 0


def write_partial(stem: str, records: list[dict], meta: dict[str, Any]) -> None:
    """``stem`` + PARTIAL_SUFFIX: the records so far and the run's meta, in the JSON form that
    ``--replot`` reads (a run cut short by its time limit leaves its finished layers there)."""
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    with open(stem + PARTIAL_SUFFIX, "w") as f:
        json.dump(dict(meta=dict(meta, partial=True), records=records), f, indent=1)


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


def main(argv=None) -> int:
    ap = cli.ArgumentParser("python3 -m benchmarks.decode.decode_layers", __doc__)
    ap.add_argument(
        "--models",
        type=cases.names(MODELS),
        default=list(cases.SCOPE_MODELS),
        help="comma-separated models of the grid (with --layers)",
    )
    ap.add_argument(
        "--layers",
        type=cases.names(cases.LAYERS),
        default=list(cases.LAYERS),
        help="comma-separated row-parallel layers of the grid",
    )
    ap.add_argument(
        "--extra",
        type=cases.names(cases.EXTRA, none_ok=True),
        default=list(cases.EXTRA_DEFAULT),
        help="comma-separated single layers of other models (model/layer), or none",
    )
    ap.add_argument(
        "--tokens",
        type=runtime.parse_tokens,
        default=list(cases.TOKENS),
        help="comma-separated token counts",
    )
    ap.add_argument(
        "--own-all-reduce",
        nargs="?",
        const=",".join(report.OWN_ALL_REDUCE.values()),
        default=(),
        type=cases.names(tuple(report.OWN_ALL_REDUCE.values())),
        help="also time torch.mm + distgemm's own all-reduce, forced: the comma-separated "
        "algorithms given, or every one",
    )
    runtime.add_output_options(ap)
    args = ap.parse_args(argv)
    if args.replot:
        return report.replot(args.replot.split(","), args.out)
    if args.cpu_smoke:
        return runtime.run_smoke("decode", cpu_smoke, smoke_failures, args.out)
    if not args.tokens:
        ap.error("--tokens: give at least one token count")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
