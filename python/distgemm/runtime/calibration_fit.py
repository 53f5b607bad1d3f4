"""Fits a machine's cost-model constants to a calibration's measured runs (least squares of the
relative error, stage by stage, each stage using the ones before it), and reports the model's
error on those runs.

A run is a dict with "kind" and "ms" (per call, the slowest rank's):

- ``{"kind": "gemm", "m", "n", "k", "tile_n"}``: our kernel alone, one GEMM;
- ``{"kind": "mm", "m", "n", "k"}``: torch.mm alone;
- ``{"kind": "copy", "peers", "bytes"}``: ``bytes`` from each of ``peers`` peers at once into
  one GPU by copy engine;
- ``{"kind": "path", "path", "schedule", "tp", "steps", "m", "n", "k"}``: an op on the
  collective path or the overlapped plan of ``steps`` steps (global m, n, k); an overlapped
  one may name the kernel that ran its steps, ``"step_kernel"`` (``cost_model.steps_gemm_ms``'s
  kernels; absent: distgemm's, as before the kernel table reached plans' steps);
- ``{"kind": "reduce_mm", "m", "n", "k"}``: torch.mm alone at decode token counts;
- ``{"kind": "all_reduce", "algorithm", "bytes"}``: an all-reduce of ``bytes`` per rank;
- ``{"kind": "fused", "tp", "m", "n", "k", "tail"}``: gemm_all_reduce on the fused path (this
  rank's m, n, k) with ``tail`` (``_core.FUSED_TAILS``; a run without one: "one_shot").

Pure arithmetic on the runs (numpy and host-only plans): ``distgemm.calibrate`` measures them on
GPUs, tests fit recorded ones.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from .. import _core
from . import cost_model, kernel_table, reduce_cost
from .machine import (
    COLLECTIVES,
    FUSED_PATHS,
    TRANSPORTS,
    MachineConstants,
    MachineKey,
    ReduceConstants,
    fused_constants_key,
)

__all__ = ["fit", "fit_reduce", "with_reduce", "path_errors"]

# The least share of the GEMM time the overlapped plan's GEMMs may cost beyond the kernel model's
# price (cost_model.predict: ``gemms * (1 + share)``). Every other fitted constant is a cost, at
# least 0. The share may go below 0 because the plan's GEMMs, chained by programmatic dependent
# launch, run under the one-GEMM model's price; the floor keeps a fit from pricing a plan far
# below its own GEMMs, as a free fit did (docs/tuning.md has the measurements).
OVERLAP_SHARE_FLOOR = -0.15


def _lstsq(rows, target, measured) -> tuple[np.ndarray, np.ndarray]:
    """x minimising the relative error of ``rows @ x + (measured - target)`` against
    ``measured``; returns x and those relative errors."""
    a, y, w = np.array(rows, float), np.array(target, float), 1.0 / np.array(measured, float)
    x, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    pred = a @ x + (np.array(measured) - y)
    return x, pred / np.array(measured) - 1.0


def _lstsq_nonneg(rows, target, measured) -> tuple[np.ndarray, np.ndarray]:
    """``_lstsq`` with every constant at least 0 (each term is a cost: a negative one is two
    collinear terms cancelling on the runs, which extrapolates to nonsense)."""
    return _lstsq_bounded(rows, target, measured, [0.0] * len(rows[0]))


def _lstsq_bounded(rows, target, measured, lower) -> tuple[np.ndarray, np.ndarray]:
    """``_lstsq`` with constant j at least ``lower[j]``: the constant furthest below its bound
    is fixed at it (its term moved into the target) and the rest fitted again, until none is
    below its bound."""
    a, y = np.array(rows, float), np.array(target, float)
    lo = np.array(lower, float)
    x = lo.copy()
    free = list(range(a.shape[1]))
    while True:
        fixed = [j for j in range(a.shape[1]) if j not in free]
        shifted = y - a[:, fixed] @ lo[fixed] if fixed else y
        if not free:
            errs = (a @ x + (np.array(measured) - y)) / np.array(measured) - 1.0
            return x, errs
        x_free, errs = _lstsq(a[:, free], shifted, measured)
        below = x_free - lo[free]
        if below.min() >= 0:
            x[free] = x_free
            return x, errs
        free.pop(int(np.argmin(below)))


def _of(runs, kind: str, **match) -> list[dict[str, Any]]:
    return [r for r in runs if r["kind"] == kind and all(r[k] == v for k, v in match.items())]


def _need(rows, count: int, what: str) -> None:
    if len(rows) < count:
        raise ValueError(f"calibration fit: {what} needs at least {count} runs, got {len(rows)}")


def _plan(r: dict[str, Any]):
    return _core.build_plan(r["schedule"], r["tp"], r["steps"], r["m"], r["n"], r["k"], 1)


def _step_kernel(r: dict[str, Any]) -> str:
    """The kernel that ran path run ``r``'s steps, as recorded (``installed_step_kernel``)."""
    return r.get("step_kernel", kernel_table.DISTGEMM)


def _predict(mc: MachineConstants, r: dict[str, Any]) -> dict[str, float]:
    """``cost_model.predict`` of path run ``r``'s plan, its steps priced as the kernel that ran
    them."""
    return cost_model.predict(mc, _plan(r), step_kernel=_step_kernel(r))


def installed_step_kernel(schedule: str, tp: int, steps: int, m: int, n: int, k: int) -> str:
    """The kernel the installed table gives the bf16 steps of that plan (what a calibration
    records as a path run's ``step_kernel``)."""
    d = _core.schedule_definition(schedule)
    return cost_model.step_kernel_of("bf16", *cost_model.step_shape(d, tp, steps, m, n, k))


def fit(
    runs: list[dict[str, Any]], key: MachineKey, slots: int, meta=None, copy_default=None
) -> MachineConstants:
    """The constants of ``key`` fitted to ``runs`` (``slots``: the GPU's resident CTAs of one
    GEMM), with each stage's relative errors in ``meta["fit"]``; ValueError where a stage has
    too few runs. ``copy_default``: (latency ms, (bytes per ms from 1, 2, ... peers)) where
    ``runs`` has no copy-engine runs."""
    errors: dict[str, list[float]] = {}
    # Our kernel: launch, then (full, wave) per tile width.
    gemm = _of(runs, "gemm")
    _need(gemm, 5, "our GEMM kernel")
    cols = {128: 1, 256: 3}
    rows = []
    for r in gemm:
        terms = cost_model.gemm_terms(slots, r["m"], r["n"], r["k"], r["tile_n"])
        tile, launches, work, waves = terms
        row = [float(launches), 0.0, 0.0, 0.0, 0.0]
        row[cols[tile]], row[cols[tile] + 1] = work, waves
        rows.append(row)
    x, errors["gemm"] = _lstsq(rows, [r["ms"] for r in gemm], [r["ms"] for r in gemm])
    gemm_ms_per_k = {128: (float(x[1]), float(x[2])), 256: (float(x[3]), float(x[4]))}
    # torch.mm: launch and rate.
    mm = _of(runs, "mm")
    _need(mm, 2, "torch.mm")
    ms = [r["ms"] for r in mm]
    y, errors["mm"] = _lstsq([[1.0, 2.0 * r["m"] * r["n"] * r["k"]] for r in mm], ms, ms)
    # The copy engine: one latency, a bandwidth per number of peers (``copy_default``
    # (latency, (bandwidth, ...)) where no copy was measured).
    copies = _of(runs, "copy")
    if copies:
        peers = sorted({r["peers"] for r in copies})
        ms = [r["ms"] for r in copies]
        rows = [
            [1.0] + [r["bytes"] * r["peers"] * (r["peers"] == p) for p in peers] for r in copies
        ]
        z, errors["copy"] = _lstsq(rows, ms, ms)
        copy_latency = max(0.0, float(z[0]))
        copy_bytes_per_ms = tuple(1.0 / max(float(v), 1e-15) for v in z[1:])
    elif copy_default is not None:
        copy_latency, copy_bytes_per_ms = copy_default[0], tuple(copy_default[1])
    else:
        raise ValueError("calibration fit: no copy-engine runs and no copy_default")
    mc = MachineConstants(
        key=key,
        slots=slots,
        gemm_launch_ms=float(x[0]),
        gemm_ms_per_k=gemm_ms_per_k,
        mm_launch_ms=float(y[0]),
        mm_flops_per_ms=1.0 / float(y[1]),
        copy_latency_ms=copy_latency,
        copy_bytes_per_ms=copy_bytes_per_ms,
        nccl={c: (0.0, 0.0, 0.0) for c in COLLECTIVES},
        overlap={t: (0.0, 0.0, 0.0) for t in TRANSPORTS},
        choice_error=0.0,
        meta=dict(meta or {}),
    )
    mc = _with(mc, nccl={c: _fit_nccl(mc, runs, c, errors) for c in COLLECTIVES})
    # The overlapped plan beyond its GEMMs, per transport.
    overlap = {}
    for t in TRANSPORTS:
        mine = [(r, _plan(r)) for r in _of(runs, "path", path="overlap")]
        mine = [(r, p) for r, p in mine if cost_model.transport(p) == t]
        if len(mine) < 3:
            overlap[t] = _fallback_overlap(t, overlap)
            continue
        rows, target = [], []
        for r, plan in mine:
            d, tp = plan.definition, plan.tp
            sm, sn, rk = cost_model.step_shape(d, tp, plan.steps, r["m"], r["n"], r["k"])
            steps, chained, kernel = plan.steps, plan.pdl_by_default, _step_kernel(r)
            gemms = cost_model.steps_gemm_ms(mc, sm, sn, rk, kernel, count=steps, chained=chained)
            moved = cost_model.moved_bytes(d, tp, r["m"], r["n"], r["k"])
            rows.append([float(steps), gemms, moved])
            target.append(r["ms"] - _predict(mc, r)["overlap_ms"])
        measured = [r["ms"] for r, _ in mine]
        lower = [0.0, OVERLAP_SHARE_FLOOR, 0.0]
        o, errors[f"overlap/{t}"] = _lstsq_bounded(rows, target, measured, lower)
        overlap[t] = (float(o[0]), float(o[1]), float(o[2]))
    mc = _with(mc, overlap=overlap)
    choice_error = over_prediction(*gain_errors(mc, runs))
    reduce = fit_reduce(runs, key.tp, errors, slots) if _of(runs, "reduce_mm") else None
    fit_meta = {k: _summary(v) for k, v in errors.items()}
    by_table = any(_step_kernel(r) == kernel_table.CUBLASLT for r in _of(runs, "path"))
    return _with(
        mc, choice_error=min(choice_error, 0.5), reduce=reduce, steps_by_table=by_table,
        meta={**mc.meta, "fit": fit_meta},
    )  # fmt: skip


def fit_reduce(runs: list[dict[str, Any]], tp: int, errors=None, slots: int = 0) -> ReduceConstants:
    """gemm_all_reduce's decode constants fitted to ``runs`` (``reduce_mm``, ``all_reduce`` and
    ``fused`` runs, module docstring), each stage's relative errors added to ``errors``;
    ValueError where torch.mm or NCCL has too few runs. An own algorithm or a fused kernel and
    tail (``machine.fused_constants_key``) with fewer runs than constants is left out (the model
    then never offers it). Every constant is at least 0 (``_lstsq_nonneg``). A fused run's
    partials and its kernel's resident CTAs are the run's own (``resident_ctas``); a run of an
    earlier calibration, which recorded none, takes ``slots`` (the machine's SMs: each fused
    kernel keeps one CTA per SM; 0: unknown, one partial per tile)."""
    errors = {} if errors is None else errors
    mm_runs = _of(runs, "reduce_mm")
    _need(mm_runs, 3, "torch.mm at decode token counts")
    ms = [r["ms"] for r in mm_runs]
    rows = [reduce_cost.mm_terms(r["m"], r["n"], r["k"]) for r in mm_runs]
    x, errors["reduce/mm"] = _lstsq_nonneg(rows, ms, ms)
    mm = (float(x[0]), float(x[1]), float(x[2]))
    all_reduce = {}
    for algorithm in sorted({r["algorithm"] for r in _of(runs, "all_reduce")}):
        mine = _of(runs, "all_reduce", algorithm=algorithm)
        if len(mine) < 2:
            continue
        ms = [r["ms"] for r in mine]
        rows = [[1.0, r["bytes"]] for r in mine]
        y, errors[f"reduce/{algorithm}"] = _lstsq_nonneg(rows, ms, ms)
        all_reduce[algorithm] = (float(y[0]), float(y[1]))
    if "nccl" not in all_reduce:
        raise ValueError("calibration fit: NCCL's all-reduce needs at least 2 runs")
    # The fused kernels' overhead over torch.mm measured at the same shape, per kernel and tail.
    mm_at = {(r["m"], r["n"], r["k"]): r["ms"] for r in mm_runs}
    fused = {}
    by_kernel: dict[str, list[dict[str, Any]]] = {}
    resident: dict[str, int] = {}
    for r in _of(runs, "fused"):
        ctas = int(r.get("resident_ctas", slots))
        if ctas > 0:
            resident[_core.fused_kernel(r["m"])] = ctas
        if (r["m"], r["n"], r["k"]) in mm_at:
            key = fused_constants_key(r["m"], _tail(r))
            by_kernel.setdefault(key, []).append(r)
    for kernel, mine in sorted(by_kernel.items()):
        if len(mine) < 4:
            continue
        ms = [r["ms"] for r in mine]
        over = [r["ms"] - mm_at[(r["m"], r["n"], r["k"])] for r in mine]
        rows = [reduce_cost.fused_terms(r["m"], r["n"], r["k"], tp, _partials(r, slots))
                for r in mine]  # fmt: skip
        z, errors[f"reduce/fused/{kernel}"] = _lstsq_nonneg(rows, over, ms)
        fused[kernel] = tuple(float(v) for v in z)
    shapes = _of(runs, "reduce_mm") + _of(runs, "fused")
    rc = ReduceConstants(
        mm=mm,
        all_reduce=all_reduce,
        fused=fused,
        max_tokens=max(r["m"] for r in shapes),
        max_bytes=int(max(r["bytes"] for r in _of(runs, "all_reduce"))),
        choice_error=0.0,
        fused_resident_ctas=resident,
    )
    by_candidate = candidate_gain_errors(rc, runs, tp)
    error = over_prediction([e for errs in by_candidate.values() for e in errs])
    each = {c: min(over_prediction(errs), 0.5) for c, errs in sorted(by_candidate.items())}
    return replace(rc, choice_error=min(error, 0.5), candidate_errors=each)


def _partials(run: dict[str, Any], slots: int) -> int:
    """A fused run's partials per rank of a tile's sum: its own record (``splits``), else
    ``reduce_cost.partials_on`` ``slots`` resident CTAs."""
    if "splits" in run:
        return int(run["splits"])
    return reduce_cost.partials_on(run["m"], run["n"], run["k"], slots)


def with_reduce(
    base: MachineConstants, runs: list[dict[str, Any]], meta: dict[str, Any]
) -> MachineConstants:
    """``base`` with reduce constants fitted to ``runs`` (a ``--reduce-only`` calibration:
    ``meta`` its command, date and versions, kept under ``meta["reduce"]`` with the runs); runs
    of an earlier calibration take ``base.slots`` as their fused kernels' resident CTAs."""
    errors: dict[str, list[float]] = {}
    reduce = fit_reduce(runs, base.key.tp, errors, base.slots)
    fit_meta = {**base.meta.get("fit", {}), **{k: _summary(v) for k, v in errors.items()}}
    return replace(
        base, reduce=reduce, meta={**base.meta, "fit": fit_meta, "reduce": {**meta, "runs": runs}}
    )


def _tail(run: dict[str, Any]) -> str:
    """A fused run's tail (runs of calibrations before the two-shot tail have none: one-shot)."""
    return run.get("tail", "one_shot")


def reduce_gain_errors(rc: ReduceConstants, runs: list[dict[str, Any]], tp: int) -> list[float]:
    """``candidate_gain_errors`` of every candidate, in one list."""
    return [e for errs in candidate_gain_errors(rc, runs, tp).values() for e in errs]


def candidate_gain_errors(
    rc: ReduceConstants, runs: list[dict[str, Any]], tp: int
) -> dict[str, list[float]]:
    """Per candidate's own error (``reduce_cost.error_key``: each fused kernel and tail apart),
    the model's error on its gain over mm + NCCL, as a share of mm + NCCL's measured time, at
    every decode shape of ``runs`` with torch.mm measured: the fused kernel with each tail where
    it ran, mm + an own all-reduce where one ran after torch.mm at that shape (``all_reduce_after``)
    or, in a calibration that timed the all-reduces alone, at the shape's bytes."""
    ar = all_reduce_after(runs)
    fused = {(r["m"], r["n"], r["k"], _tail(r)): r["ms"] for r in _of(runs, "fused")}
    out: dict[str, list[float]] = {}
    for r in _of(runs, "reduce_mm"):
        m, n, k = r["m"], r["n"], r["k"]
        nbytes = m * n * cost_model.ELEM_BYTES

        def after_mm(algorithm, m=m, n=n, k=k, nbytes=nbytes):
            return ar.get((algorithm, m, n, k), ar.get((algorithm, nbytes)))

        if after_mm("nccl") is None:
            continue
        base = r["ms"] + after_mm("nccl")
        offered, measured = {}, {}
        for path, tail in FUSED_PATHS.items():
            measured[path] = fused.get((m, n, k, tail))
            offered[path] = "" if measured[path] is not None else "not measured"
        for algorithm in rc.all_reduce:
            t = after_mm(algorithm)
            offered[algorithm] = "" if t is not None else "not measured"
            measured[f"collective/{algorithm}"] = None if t is None else r["ms"] + t
        pred = reduce_cost.predict(rc, m, n, k, tp, offered)
        for cand, p in pred.items():
            t = measured.get(cand)
            if cand != reduce_cost.BASELINE and t is not None:
                out.setdefault(reduce_cost.error_key(cand, m), []).append(
                    ((pred[reduce_cost.BASELINE] - p) - (base - t)) / base
                )
    return out


def all_reduce_after(runs: list[dict[str, Any]]) -> dict[tuple, float]:
    """The all-reduce runs' ms by (algorithm, m, n, k) where a run was timed right after torch.mm
    of that shape (``ms``: the pair's time less torch.mm's), else by (algorithm, bytes): an
    earlier calibration's, timed alone."""
    out: dict[tuple, float] = {}
    for r in _of(runs, "all_reduce"):
        shape = tuple(r[c] for c in ("m", "n", "k")) if "m" in r else (int(r["bytes"]),)
        out[(r["algorithm"], *shape)] = r["ms"]
    return out


def _fit_nccl(mc: MachineConstants, runs, name: str, errors) -> tuple[float, float, float]:
    """NCCL's (latency, ms per byte, share of the GEMM) for collective ``name``, every one at
    least 0, fitted to the collective path's runs (NCCL + torch.mm: what the model predicts).
    NCCL timed alone ran slower per byte than on the collective path (docs/tuning.md), so it
    is not what prices that path."""
    coll = [
        r
        for r in _of(runs, "path", path="collective")
        if cost_model.nccl_kind(_core.schedule_definition(r["schedule"])) == name
    ]
    _need(coll, 3, f"the collective path with NCCL {name}")
    rows, target, measured = [], [], []
    for r in coll:
        plan = _plan(r)
        rm, rn, rk = cost_model.rank_problem(plan.definition, r["tp"], r["m"], r["n"], r["k"])
        mm = cost_model.mm_ms(mc, rm, rn, rk)
        times = 2 if plan.definition["collective"] == "all_reduce" else 1
        moved = cost_model.moved_bytes(plan.definition, r["tp"], r["m"], r["n"], r["k"])
        rows.append([float(times), moved, mm])
        target.append(r["ms"] - mm)
        measured.append(r["ms"])
    v, errors[f"collective/{name}"] = _lstsq_nonneg(rows, target, measured)
    return float(v[0]), float(v[1]), float(v[2])


def _fallback_overlap(t: str, fitted: dict) -> tuple[float, float, float]:
    """A transport without enough runs takes another transport's constants (the partial
    transports share their costs' form): "copy" takes "epilogue"'s and the other way round."""
    other = {"copy": "epilogue", "epilogue": "copy"}.get(t)
    if other in fitted:
        return fitted[other]
    raise ValueError(f"calibration fit: the overlapped plan's {t} transport needs at least 3 runs")


def _with(mc: MachineConstants, **changes) -> MachineConstants:
    return replace(mc, **changes)


def _summary(errs) -> dict[str, float]:
    e = np.abs(np.asarray(errs, float))
    return {"runs": int(e.size), "max": float(e.max()), "rms": float(np.sqrt((e * e).mean()))}


def over_prediction(gain_errs: list[float], weights: list[float] | None = None) -> float:
    """The root mean square of the over-predicted gains among ``gain_errs`` (an under-predicted
    gain counts as 0), each weighted by ``weights`` (default 1): the error a choice must guard
    against, since over-predicting the overlapped plan's gain is what makes the public op slower
    than the collective path, while under-predicting it only leaves a gain untaken."""
    if not gain_errs:
        return 0.0
    w = [1.0] * len(gain_errs) if weights is None else weights
    total = sum(max(0.0, e) ** 2 * wi for e, wi in zip(gain_errs, w, strict=True))
    return math.sqrt(total / sum(w))


def gain_errors(
    mc: MachineConstants, runs: list[dict[str, Any]]
) -> tuple[list[float], list[float]]:
    """The model's error on the gain of the overlapped plan over the collective path, as a share
    of the collective time: (predicted gain - measured gain) / measured collective ms, for every
    overlapped run with a collective run of the same schedule and shape; and each one's measured
    collective ms (``over_prediction``'s weights: an error costs in proportion to the time at
    stake, and the shortest runs, bound by the host, err the most)."""
    coll = {
        (r["schedule"], r["tp"], r["m"], r["n"], r["k"]): r["ms"]
        for r in _of(runs, "path", path="collective")
    }
    errs, weights = [], []
    for r in _of(runs, "path", path="overlap"):
        c = coll.get((r["schedule"], r["tp"], r["m"], r["n"], r["k"]))
        if c is None:
            continue
        pred = _predict(mc, r)
        errs.append(((pred["collective_ms"] - pred["overlap_ms"]) - (c - r["ms"])) / c)
        weights.append(c)
    return errs, weights


def path_errors(mc: MachineConstants, runs: list[dict[str, Any]]) -> list[float]:
    """The model's relative error (predicted / measured - 1) on every path run of ``runs``."""
    out = []
    for r in _of(runs, "path"):
        pred = _predict(mc, r)[f"{r['path']}_ms"]
        out.append(pred / r["ms"] - 1.0)
    return out
