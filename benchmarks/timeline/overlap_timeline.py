"""Per-stream overlap timeline of one Llama-3 tensor-parallel case: what each
GPU's compute units and copy engines do over a few consecutive calls of distgemm, of the plain
NCCL + torch.mm baseline and of torch's symmetric-memory fused ops (async-TP).

    torchrun --nproc-per-node 2 -m benchmarks.timeline.overlap_timeline [--model 70B]
        [--layer FC1,O] [--tokens 8192] [--steps S] [--calls 3] --out DIR
    python3 -m benchmarks.timeline.overlap_timeline --replot FILE.json --out DIR  # no GPU, no torch

Per layer (shapes and variants as in benchmarks/sweep/llama_sweep.py), every variant is first
warmed up by time and timed without the profiler (benchmarks/common/timing.py's CUDA-event median,
"unprofiled"). Then, inside ONE torch.profiler session (CPU + CUDA activities), each variant is
warmed up again, the ranks meet at a gloo barrier and ``--calls`` consecutive calls run inside a
``record_function`` marker. The GPU events (kernels, memcpys, memsets; CUDA graph nodes
are reported one by one by CUPTI) are taken from the exported chrome trace within that marker,
gathered to rank 0 over the gloo group and aligned on the host clock (or on the markers, when the
host clocks of the ranks' traces disagree). Should the profiler report no GPU events for a
variant, or no GEMM kernel for distgemm (its graph nodes not reported individually), that variant
falls back to the CUDA events recorded around each call (call spans only) and its panel says so.

Event classes: GEMM compute (CUTLASS / cuBLAS / other gemm kernels), NCCL kernel, copy engine
(memcpy), signal/flag (memcpy of <= 64 bytes, memset), other kernels (barriers, waits, ...).
Output under --out: ``<date>-overlap-timeline-<model>-<layer>.png`` per layer, and
``<date>-overlap-timeline-<model>-<layers>.{json,txt}`` (every layer's events, compact, for
re-plotting; the per-GPU busy / overlap summary as text).

This file is the GPU capture; the analysis (trace parsing, classification, alignment, busy and
overlap times) is benchmarks/timeline/events.py, the reports (text, JSON, pictures, --replot)
benchmarks/timeline/report.py, both tested by tests/test_overlap_timeline.py on the CPU.
"""

from __future__ import annotations

import datetime
import math
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from benchmarks.common.llama_cases import LAYERS, MODELS, Case, shapes, skip_reason
from benchmarks.common.report import RESULTS_DIR
from benchmarks.common.timing import (
    ERR_TOL,
    RankContext,
    baseline_call,
    enable_symm_mem,
    layer_operands,
    rel_err,
    symm_mem_call,
    time_variant,
    try_symm_mem,
)
from benchmarks.timeline.events import (
    MARKER_PREFIX,
    exported_trace,
    in_window,
    layer_record,
    parse_chrome_trace,
)
from benchmarks.timeline.report import replot, summary_lines, write_outputs
from distgemm import cli

FIRST_REWARM_S = 0.3  # sustained calls inside the profiler before the first window (clock ramp)
REWARM_S = 0.1  # ... before each later window (the GPUs were busy until just before)
LAYER_TIMEOUT_S = 45  # a layer that takes longer is hung: dump stacks and exit
CTRL_TIMEOUT_S = 40  # gloo control group: every barrier / agreement / gather


def _make_variants(
    ctx, case, steps, comm, group_name
) -> tuple[dict[str, Callable], dict[str, Any]]:
    """(variant name -> one call, {"dg_out": distgemm's output buffer}) for one layer on this
    rank: fresh random bf16 operands (timing.layer_operands, another seed than the sweep's)."""
    torch, dist, dev = ctx.torch, ctx.dist, ctx.dev
    from distgemm import ops

    x = layer_operands(torch, dev, case, 4321 + 7919 * ctx.rank + case.tokens)
    ag, a, w, wt, tmp, out = x.ag, x.a, x.w, x.wt, x.tmp, x.out
    dg_out = torch.empty_like(out)

    def baseline():
        return baseline_call(torch, dist, ag, a, wt, tmp, out)

    def symm_mem():
        return symm_mem_call(torch, ag, a, wt, group_name)

    def distgemm():  # the overlapped plan itself ("auto" could pick the collective path)
        op = ops.all_gather_gemm if ag else ops.gemm_reduce_scatter
        return op(a, w, steps=steps, out=dg_out, group=comm, path="overlap")

    fns = dict(baseline=baseline, symm_mem=symm_mem, distgemm=distgemm)
    return fns, dict(dg_out=dg_out)


def _profile(ctx, fns: dict[str, Callable], ref_ms: dict[str, float], tag: str, calls: int):
    """One profiler session over every variant: re-warm, barrier, `calls` calls in a marker.
    Returns (this rank's chrome trace as a dict, {variant: [(start, end) ms of each call]})."""
    torch = ctx.torch
    from torch.profiler import ProfilerActivity, profile, record_function

    spans: dict[str, list[tuple[float, float]]] = {}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i, (v, fn) in enumerate(fns.items()):
            # ref_ms is the max over ranks: every rank makes the same number of calls.
            n = max(
                2, math.ceil((FIRST_REWARM_S if i == 0 else REWARM_S) * 1e3 / max(ref_ms[v], 1e-3))
            )
            for _ in range(min(n, 5000)):
                fn()
            torch.cuda.synchronize()
            ctx.dist.barrier(group=ctx.ctrl)
            ev = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(calls)
            ]
            with record_function(f"{MARKER_PREFIX}{tag}:{v}"):
                for s_, e_ in ev:
                    s_.record()
                    fn()
                    e_.record()
                torch.cuda.synchronize()
            spans[v] = [(ev[0][0].elapsed_time(s_), ev[0][0].elapsed_time(e_)) for s_, e_ in ev]
    return exported_trace(prof), spans


def run_layer(ctx, case, steps: int | None, calls: int, group_name: str) -> dict[str, Any]:
    """This rank's part of one layer: warm-up and unprofiled timing per variant
    (timing.time_variant), output checks, the profiled windows, and this rank's payload per
    variant."""
    torch = ctx.torch
    from distgemm.runtime import communicator as dcomm

    res: dict[str, Any] = dict(ref_ms={}, rel_err={}, unavailable={}, payloads={})
    with dcomm.Communicator(timeout_s=30.0, wait_timeout_s=5.0) as comm:
        fns, bufs = _make_variants(ctx, case, steps, comm, group_name)
        ref = fns["baseline"]().clone()
        torch.cuda.synchronize()
        err, why = try_symm_mem(ctx, fns["symm_mem"], ref)
        if why:
            res["unavailable"]["symm_mem"] = why
            del fns["symm_mem"]
        else:
            res["rel_err"]["symm_mem"] = err
        bufs["dg_out"].fill_(float("nan"))  # a call that writes nothing cannot pass the check
        res["rel_err"]["distgemm"] = rel_err(torch, fns["distgemm"](), ref)
        torch.cuda.synchronize()
        comm.raise_launch_errors()
        for v, fn in fns.items():
            res["ref_ms"][v] = time_variant(ctx, fn)
        comm.raise_launch_errors()
        trace, spans = _profile(ctx, fns, res["ref_ms"], case.layer, calls)
        torch.cuda.synchronize()
        comm.raise_launch_errors()
    parsed = parse_chrome_trace(trace, ctx.rank)
    for v in fns:
        marker = parsed.markers.get(f"{MARKER_PREFIX}{case.layer}:{v}")
        events = in_window(parsed.events, *marker) if marker else []
        res["payloads"][v] = dict(
            base_ns=parsed.base_ns,
            marker=marker or (0.0, 0.0),
            events=events,
            spans_ms=spans[v],
            device=ctx.dev.index,
            marker_found=marker is not None,
            trace_gpu_events=len(parsed.events),
        )
    keys = sorted(res["rel_err"])
    worst = ctx.agree_max([x if x == x else math.inf for x in (res["rel_err"][k] for k in keys)])
    res["rel_err"] = dict(zip(keys, worst))
    return res


def main(argv=None) -> int:
    ap = cli.ArgumentParser("python3 -m benchmarks.timeline.overlap_timeline", __doc__)
    ap.add_argument("--model", default="70B", choices=sorted(MODELS))
    ap.add_argument("--layer", default="FC1,O", help="comma-separated, of " + ", ".join(LAYERS))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=None, help="distgemm S (default: its own, TP)")
    ap.add_argument("--calls", type=int, default=3, help="profiled consecutive calls per variant")
    ap.add_argument("--replot", metavar="FILE.json", help="only render the PNGs of a JSON")
    ap.add_argument("--out", default=RESULTS_DIR)
    args = ap.parse_args(argv)
    if args.replot:
        return replot(args.replot, args.out)
    layers = [x.strip() for x in args.layer.split(",") if x.strip()]
    bad = [x for x in layers if x not in LAYERS]
    if bad or not layers or not 1 <= args.calls <= 20:
        ap.error(f"--layer takes {', '.join(LAYERS)} (got {args.layer!r}); --calls 1..20")

    import faulthandler

    import torch
    import torch.distributed as dist

    t_start = time.perf_counter()
    ctx = RankContext.from_torchrun(ctrl_timeout_s=CTRL_TIMEOUT_S)
    dev, rank, tp, ctrl = ctx.dev, ctx.rank, ctx.tp, ctx.ctrl
    group_name = dist.group.WORLD.group_name
    symm_setup = enable_symm_mem(group_name)
    from distgemm import ops as dops

    records: list[dict[str, Any]] = []
    status, measured = 0, 0
    for layer in layers:
        case = Case(args.model, layer, args.tokens, tp)
        reason, rejected = skip_reason(case)
        s = shapes(case)
        meta_t = [torch.empty(s[x], device="meta", dtype=torch.bfloat16) for x in ("a", "w")]
        steps = args.steps or dops.default_steps(s["schedule"], tp, *meta_t)
        if not reason and steps in rejected:
            reason = f"distgemm rejects S={steps}: {rejected[steps]}"
        if reason:
            if rank == 0:
                print(f"SKIPPED {case.name}: {reason}", flush=True)
            status = 1
            continue
        if rank == 0:
            print(
                f"[{time.perf_counter() - t_start:5.1f} s] {case.name}: warm-up, timing, profiling",
                file=sys.stderr,
                flush=True,
            )
        faulthandler.dump_traceback_later(LAYER_TIMEOUT_S, exit=True)
        err, res = None, None
        try:
            res = run_layer(ctx, case, steps, args.calls, group_name)
        except Exception as e:  # noqa: BLE001 - agreed below, the other layers still run
            err = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        failed = ctx.agree_max([1.0 if err else 0.0])[0]
        if failed:
            faulthandler.cancel_dump_traceback_later()
            if rank == 0:
                print(f"FAILED {case.name}: {err or 'failed on another rank'}", flush=True)
            status = 1
            continue
        gathered = [None] * tp if rank == 0 else None
        dist.gather_object(res, gathered, dst=0, group=ctrl)
        measured += 1
        faulthandler.cancel_dump_traceback_later()
        if rank == 0:
            rec = layer_record(case, tp, steps, dict(enumerate(gathered)))
            if symm_setup and rec["variants"]["symm_mem"]["status"] != "ok":
                rec["variants"]["symm_mem"]["reason"] += f" (setup: {symm_setup})"
            records.append(rec)
            for v, vr in rec["variants"].items():
                if vr["status"] == "ok":
                    print(
                        f"  {v}: source {vr['source']}; GPU events per rank and class "
                        f"{vr['counts']}" + (f"; NOTE {vr['note']}" if vr["note"] else ""),
                        flush=True,
                    )
                    if vr["source"] != "profiler":
                        print(
                            f"WARNING {case.name} {v}: the profiler did not show this variant's "
                            f"kernels ({vr['note']}); its panel shows CUDA-event call spans only",
                            flush=True,
                        )
            bad_err = {k: x for k, x in rec["rel_err"].items() if not x < ERR_TOL}
            if bad_err:
                print(f"WRONG {case.name}: rel. err vs baseline {bad_err}", flush=True)
                status = 1
        torch.cuda.empty_cache()

    if rank == 0 and records:
        meta = dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            model=args.model,
            tokens=args.tokens,
            tp=tp,
            calls=args.calls,
            torch=torch.__version__,
            cuda=torch.version.cuda,
            device=torch.cuda.get_device_name(dev),
            symm_mem_setup_error=symm_setup,
            first_rewarm_s=FIRST_REWARM_S,
            rewarm_s=REWARM_S,
            argv=sys.argv,
            seconds=round(time.perf_counter() - t_start, 1),
        )
        print("\n".join(ln for r in records for ln in summary_lines(r)), flush=True)
        for line in write_outputs(meta, records, args.out):
            print(line, flush=True)
        print(f"done in {time.perf_counter() - t_start:.1f} s", flush=True)
    ctx.close()
    # records are only kept on rank 0: every rank decides by the layers it measured
    return status if measured else 1


if __name__ == "__main__":
    sys.exit(main())
