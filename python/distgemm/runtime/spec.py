"""The spec of an op entry, made at its first call (``make_spec``): the global problem, S and GEMM
tile (from the tuning table or the defaults), the Plan and every operand's expected shape."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .. import _core
from . import tuning_table
from .validate import DTYPES, fmt_shape, n_major_weight

# The built-in schedules' definitions (fixed at build time), by name.
_DEFINITIONS = {d["name"]: d for d in _core.schedules()}
_COLLECTIVE = {
    "all_gather_gemm": "all_gather",
    "gemm_reduce_scatter": "reduce_scatter",
    "gemm_all_reduce": "all_reduce",
}


@dataclass
class Spec:
    """What a plan needs from the tensors of one call (same on every rank)."""

    op: str
    schedule: str
    tp: int
    steps: int
    m: int
    n: int
    k: int
    shapes: dict[str, tuple[int, ...]]  # expected per-rank shape of every operand the plan uses
    plan: Any = field(repr=False, default=None)  # the _core.Plan, built once per op entry
    tile_n: int = 0  # GEMM output tile 128 x tile_n for every GEMM; 0: per GEMM (wave model)
    b_n_major: bool = False  # w is a transposed view (n_major_weight): read N-contiguous
    table: tuning_table.TableEntry | None = None  # the tuning-table entry behind steps and tile_n


def default_steps(schedule: str, tp: int, a: torch.Tensor, w: torch.Tensor) -> int:
    """S for ``steps=None`` where the tuning table has no entry for the call's bucket
    (``make_spec`` takes the table's S where it has one): TP for the all-gather schedules and
    ar_tile_a; for rs_tile_a / rs_tile_b, 2*TP from ``_core.RS_TWO_STEPS_MIN_TOKENS``
    tokens (M) on with at most ``_core.RS_TWO_STEPS_MAX_K_PER_RANK`` of K per rank, where the
    plan accepts it (partials then travel by copy engine with a step of slack), else TP. The rule
    is the C++ one (schedule/defaults.hpp). Shapes only, so every rank agrees; an operand that is
    not 2-D gets TP and the op's validation names the problem, as it does an unknown
    schedule."""
    defn = _DEFINITIONS.get(schedule) if isinstance(schedule, str) else None
    if tp < 2 or defn is None or a.dim() != 2 or w.dim() != 2:
        return tp
    m, n, k = _global_problem(defn["partition"], tp, a, w)
    return _core.default_steps(schedule, tp, m, n, k, 1)


def _global_problem(
    partition: dict, tp: int, a: torch.Tensor, w: torch.Tensor
) -> tuple[int, int, int]:
    """Global (M, N, K) from the per-rank A [rows, K_a] and W [N_w, K] and the Partition (read
    from the C++ definition): a sharded mode is TP times the local extent."""
    (ma, ka), nb = tuple(a.shape), int(w.shape[0])
    return (
        ma * tp if partition["a"] == "M" else ma,
        nb * tp if partition["b"] == "N" else nb,
        ka * tp if partition["a"] == "K" else ka,
    )


def make_spec(
    op: str,
    schedule: str,
    tp: int,
    rank: int,
    steps: int | None,
    a: torch.Tensor,
    w: torch.Tensor,
    *,
    bias=None,
    c=None,
    beta: float = 0.0,
    out=None,
    tile_n: int = 0,
    row_scale_a: bool = False,
    row_scale_b: bool = False,
) -> Spec:
    """Global problem, steps, GEMM tile and every operand's expected shape for ``op`` with
    ``schedule`` on ``tp`` ranks; ValueError naming the constraint and the values. Shapes only:
    no device, no communicator. ``steps=None``: the active tuning table's S and tile for the
    call's bucket where its entry fits, else the default S. ``tile_n`` (128 or 256) forces the
    GEMM tile (``python -m distgemm.tune`` measures each); 0: the table's, else per GEMM.
    ``row_scale_a`` / ``row_scale_b``: fp8 row-wise scales, which the plan moves with their rows
    (the tuning table, measured in bf16/fp16, is not consulted for fp8 operands)."""
    if not isinstance(schedule, str):
        raise TypeError(
            f"{op}: schedule must be a schedule name (str), got {type(schedule).__name__}"
        )
    defs = _DEFINITIONS
    want = _COLLECTIVE[op]
    if schedule not in defs or defs[schedule]["collective"] != want:
        fits = sorted(n for n, d in defs.items() if d["collective"] == want)
        raise ValueError(
            f"{op}: schedule '{schedule}' is not a {want} schedule; use one of {', '.join(fits)}"
        )
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool)):
        raise TypeError(f"{op}: steps must be an int or None, got {steps!r}")
    if tile_n not in tuning_table.TILES:
        raise ValueError(f"{op}: tile_n={tile_n!r} is not 0 (per GEMM), 128 or 256")
    for name, t in (("a" if op != "all_gather_gemm" else "a_shard", a), ("w", w)):
        if t.dim() != 2:
            raise ValueError(f"{op}: {name} must be 2-D, got shape {fmt_shape(t.shape)}")
    m, n, k = _global_problem(defs[schedule]["partition"], tp, a, w)
    ka = a.shape[1]
    if min(m, n, k) < 1:
        raise ValueError(f"{op}: empty operands: a {fmt_shape(a.shape)}, w {fmt_shape(w.shape)}")
    # steps=None: the tuning table's S and tile for this bucket where it has a fitting entry,
    # else the default S; either way the op entry's one plan build.
    entry = None
    if steps is None and a.dtype in DTYPES and w.dtype in DTYPES:
        entry = tuning_table.lookup(op, schedule, tp, DTYPES[a.dtype], n, k, m)
    plan = _table_plan(entry, schedule, tp, m, n, k) if entry is not None else None
    entry = entry if plan is not None else None
    scales = dict(row_scale_a=row_scale_a, row_scale_b=row_scale_b)
    try:
        if plan is None:
            plan = (
                _core.default_plan(schedule, tp, m, n, k, 1, **scales)
                if steps is None
                else _core.build_plan(schedule, tp, steps, m, n, k, 1, **scales)
            )
    except ValueError as e:
        raise ValueError(
            f"{op} ({schedule}, TP={tp}, S={tp if steps is None else steps}, global M={m} N={n} "
            f"K={k}): {e}"
        ) from None
    steps = plan.steps
    local = plan.local_shapes
    a_name = "a_shard" if op == "all_gather_gemm" else "a"
    if tuple(w.shape) != tuple(local["B"]):
        raise ValueError(
            f"{op}: w has shape {fmt_shape(w.shape)} but {a_name} {fmt_shape(a.shape)} with "
            f"{schedule} on TP={tp} needs w of shape {fmt_shape(local['B'])} "
            f"(nn.Linear layout [N, K], K={ka} per rank)"
        )
    why = plan.extent_problem(rank, a.element_size())  # every sub-GEMM of this rank
    if why:
        raise ValueError(
            f"{op}: {why} (a sub-GEMM of {schedule}; global M={m} N={n} K={k}, TP={tp}, S={steps})"
        )
    shapes: dict[str, tuple[int, ...]] = {
        "a": tuple(local["A"]),
        "w": tuple(local["B"]),
        "out": tuple(local["D"]),
    }
    if bias is not None:
        shapes["bias"] = (int(local["bias"]),)
    if beta != 0.0:
        if c is None:
            raise ValueError(
                f"{op}: beta={beta} but c is None: pass c (shape {fmt_shape(local['C'])}) or beta=0"
            )
        shapes["c"] = tuple(local["C"])
    for name, t in (("bias", bias), ("c", c if beta != 0.0 else None), ("out", out)):
        if t is not None and tuple(t.shape) != shapes[name]:
            raise ValueError(
                f"{op}: {name} has shape {fmt_shape(t.shape)}, expected "
                f"{fmt_shape(shapes[name])} (per rank; {schedule}, TP={tp}, global M={m} "
                f"N={n} K={k})"
            )
    b_n_major = n_major_weight(w)
    if b_n_major and w.element_size() == 1:
        raise ValueError(
            f"{op}: w is a transposed view (strides {list(w.stride())}); an fp8 weight must be "
            "K-contiguous ([N, K], nn.Linear's layout: wgmma reads fp8 operands K-major only): "
            "pass w.contiguous()"
        )
    if b_n_major and schedule == "ag_rotate_b":
        raise ValueError(
            f"{op}: w is a transposed view (strides {list(w.stride())}); ag_rotate_b moves the "
            "weight between ranks and needs it K-contiguous: pass w.contiguous()"
        )
    tile_n = tile_n or (entry.tile_n if entry else 0)
    if b_n_major and tile_n == 128:  # the N-contiguous kernel has the 128x256 tile only
        tile_n = 0
    return Spec(
        op, schedule, tp, steps, m, n, k, shapes, plan, tile_n, table=entry, b_n_major=b_n_major
    )


def with_steps(spec: Spec, steps: int) -> Spec | None:
    """``spec`` (16-bit operands) with the plan of ``steps`` steps and that S's default options,
    or None where that plan cannot run it: the schedule does not split the problem into
    ``steps`` steps, or a rank's sub-GEMM breaks the kernel's extent rule (checked for every
    rank, so that every rank gets the same answer). Shapes only."""
    if steps == spec.steps:
        return spec
    try:
        plan = _core.build_plan(spec.schedule, spec.tp, steps, spec.m, spec.n, spec.k, 1)
    except ValueError:
        return None
    if plan.extent_problem(-1):
        return None
    return replace(spec, steps=steps, plan=plan)


def _table_plan(entry: tuning_table.TableEntry, schedule: str, tp: int, m: int, n: int, k: int):
    """The plan of a tuning-table entry's S, or None (with a warning, once per entry) where that
    S does not fit this M; the defaults then decide."""
    try:
        plan = _core.build_plan(schedule, tp, entry.steps, m, n, k, 1)
    except ValueError as e:
        tuning_table.warn_unusable(entry, m, str(e))
        return None
    why = plan.extent_problem(-1)  # every rank's sub-GEMMs: the same verdict on every rank
    if why:
        tuning_table.warn_unusable(entry, m, why)
        return None
    return plan
