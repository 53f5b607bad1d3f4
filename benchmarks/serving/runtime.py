"""Runtime pieces the serving and decode benchmarks share: a step captured into a CUDA graph the
way a server captures its forward (eager warm-up first, one memory pool per variant), an attempt
agreed over the ranks (a failure is a recorded reason, never fatal), memory snapshots and their
deltas, distgemm's plan of a layer on the CPU reference executor, the --cpu-smoke driver and the
token-list option. torch is passed in or imported where used, so importing this needs no
torch."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from benchmarks.common.report import MIB, RESULTS_DIR
from benchmarks.common.timing import short_error

WARMUP_CALLS = 2  # eager calls on a side stream before a capture (NCCL, plans, autotuning)


def attempt(ctx, fn) -> tuple[Any, str | None]:
    """``(fn(), None)`` when ``fn`` and the device work it queued succeeded on every rank, else
    ``(None, why)``: this rank's error, or "failed on another rank". Agreed over the control
    group, so that no rank goes on to a collective another rank skipped."""
    result, why = None, None
    try:
        result = fn()
        ctx.torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a variant that cannot run is a result
        why = short_error(e)
    if ctx.agree_max([1.0 if why else 0.0])[0]:
        return None, why or "failed on another rank"
    return result, None


def timed(ctx, fn, warm_s: float) -> tuple[float | None, str | None]:
    """``benchmarks.common.timing.time_variant`` of ``fn`` as an attempt: ``(ms, None)``, or
    ``(None, why)`` when it failed on a rank (a collective that never completes ends at the
    process group's timeout and is reported here)."""
    from benchmarks.common.timing import time_variant

    ms, why = attempt(ctx, lambda: time_variant(ctx, fn, warm_s=warm_s))
    return ms, (f"timing: {why}" if why else None)


def capture(torch, fn, pool=None):
    """``fn`` captured into a CUDA graph as servers capture their step: WARMUP_CALLS eager calls
    on a side stream first, then one call under ``torch.cuda.graph`` (``pool``: a memory pool
    shared with the variant's other graphs). Returns ``(graph, what fn returned under
    capture)``: after ``graph.replay()`` those tensors hold the step's outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outs = fn()
    return graph, outs


def memory_snapshot(torch) -> dict[str, int]:
    """The caching allocator's live and reserved bytes and the device's free bytes, with the
    allocator's cache emptied and its peak reset, so that a later ``memory_delta`` sees only
    what happened in between."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    free, _ = torch.cuda.mem_get_info()
    return dict(
        allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved(), free=free
    )


def distgemm_memory() -> Any:
    """``distgemm.memory_stats()`` as JSON data, or "n/a" where this distgemm has none."""
    import distgemm

    stats = getattr(distgemm, "memory_stats", None)
    if stats is None:
        return "n/a"
    try:
        return json.loads(json.dumps(stats(), default=str))
    except Exception as e:  # noqa: BLE001 - a statistics failure is not a benchmark failure
        return f"n/a ({short_error(e)})"


def distgemm_paths() -> list[dict[str, Any]]:
    """``distgemm.path_choices()`` as JSON data: which path each cached plan runs ("overlap"
    or "collective") and, for path="auto", the measurements behind the choice."""
    from distgemm import path_choices

    return json.loads(json.dumps(path_choices(), default=str))


def memory_delta(torch, before: dict[str, int]) -> dict[str, Any]:
    """MiB since ``before``: ``allocated`` (live tensors of the caching allocator),
    ``peak_allocated`` (its peak over ``before``'s live bytes), ``reserved`` (its segments,
    graph pools included), ``device`` (free device memory lost: the allocator, distgemm's
    workspaces, NCCL and symmetric-memory buffers alike), and ``distgemm``:
    ``distgemm.memory_stats()`` now (what the library holds in total, not a delta) or "n/a"."""
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info()
    return dict(
        allocated=(torch.cuda.memory_allocated() - before["allocated"]) / MIB,
        peak_allocated=(torch.cuda.max_memory_allocated() - before["allocated"]) / MIB,
        reserved=(torch.cuda.memory_reserved() - before["reserved"]) / MIB,
        device=(before["free"] - free) / MIB,
        distgemm=distgemm_memory(),
    )


def plan_reference_error(schedule: str, tp: int, m: int, n: int, k: int):
    """distgemm's plan of one layer (its default S) run by the CPU reference executor:
    ``(worst relative error against float64, None)``, or ``(None, why the plan is
    rejected)``."""
    import distgemm
    from distgemm import _core

    try:
        steps = _core.default_steps(schedule, tp, m, n, k, 1)
        plan = distgemm.build_plan(schedule, tp, steps, m=m, n=n, k=k)
        return distgemm.run_reference(plan), None
    except (ValueError, distgemm.ExecutionError) as e:
        return None, short_error(e)


def run_smoke(name: str, smoke, failures, out_dir: str) -> int:
    """--cpu-smoke under torchrun: a gloo group, ``smoke(rank, tp)``'s result written to
    ``<name>-cpu-smoke-rank<r>.json`` under ``out_dir``, ``failures(result)`` printed; 1 when
    something is off."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        res = smoke(rank, dist.get_world_size())
    finally:
        dist.destroy_process_group()
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}-cpu-smoke-rank{rank}.json"), "w") as f:
        json.dump(res, f, indent=1)
    bad = failures(res)
    print(f"rank {rank}: rel. err {res['rel_err']}; off: {bad or 'nothing'}", flush=True)
    return 1 if bad else 0


def add_output_options(ap: argparse.ArgumentParser) -> None:
    """--out (default benchmarks/results), --cpu-smoke and --replot, alike in both benchmarks."""
    ap.add_argument("--out", default=RESULTS_DIR, help="directory of the results files")
    ap.add_argument("--cpu-smoke", action="store_true", help="gloo, tiny shapes, no timing")
    ap.add_argument(
        "--replot",
        metavar="JSON",
        help="no GPU: table, CSV and PNG of a stored run (decode: comma-separated runs of one "
        "TP are merged)",
    )


def parse_tokens(text: str) -> list[int]:
    """A comma-separated list of positive token counts ('' is the empty list)."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = [0]
    if any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"token counts must be positive integers, got {text!r}")
    return vals
