"""Plans from Python: a thin layer over the C++ builder in ``distgemm._core``.

A plan here is a plain dict (``_core.Plan.to_dict()``; see
``cpp/include/distgemm/schedule/plan_types.hpp`` for the meaning of every field). Tests and tools
may copy and mutate it; the simulator and the reference executor take any such dict. The ops
keep the ``_core.Plan`` object itself (``distgemm.runtime.spec.make_spec``).
"""

from __future__ import annotations

import copy as _copy
from typing import Any

from .. import _core

PlanDict = dict[str, Any]

__all__ = [
    "PlanDict",
    "build_plan",
    "schedule_names",
    "schedule_definition",
    "workspace_bytes",
    "clone_plan",
    "tile_map",
]


def schedule_names() -> list[str]:
    """Names of the built-in schedules, in registry order."""
    return [d["name"] for d in _core.schedules()]


def schedule_definition(name: str) -> dict:
    """The definition (collective, rotating operand, split mode, partition, tile map) of a
    schedule."""
    return _core.schedule_definition(name)


def build_plan(
    schedule: str | dict,
    tp: int,
    steps: int | None = None,
    *,
    m: int,
    n: int,
    k: int,
    l: int = 1,
    partial_via: str | None = None,
    row_scale_a: bool = False,
    row_scale_b: bool = False,
) -> PlanDict:
    """Build the Plan of ``schedule`` (a name or a definition dict) for ``tp`` devices.

    ``steps`` defaults to ``tp`` (one tile per device shard). ``partial_via`` ("epilogue" or
    "copy"; None: the library default) says how a reduce-scatter partial reaches the next device:
    written into the peer's slot by the GEMM's epilogue, or staged locally and pushed by the copy
    engine (see ``PartialVia`` in plan.hpp). ``row_scale_a`` / ``row_scale_b``: FP8 row-wise
    scales of A / B (one float32 per row, moved with the rows; needs ``l == 1``; see
    plan_types.hpp). Raises ``ValueError`` naming the violated constraint and the values, e.g.
    ``M=30 is not divisible by TP=4``.
    """
    if steps is None:
        steps = tp
    # Every int crosses into C++ as int64 (the plan checks the bounds in words): larger ones are
    # refused here, before the binding's conversion would fail without naming them.
    for name, v in (("tp", tp), ("steps", steps), ("m", m), ("n", n), ("k", k), ("l", l)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"{name} must be an int, got {v!r}")
        if not -(2**63) <= v < 2**63:
            raise ValueError(
                f"{name}={v} is out of range: problem sizes are at most "
                f"{_core.MAX_EXTENT} (2**31-1), TP at most {_core.MAX_TP}"
            )
    for name, v in (("row_scale_a", row_scale_a), ("row_scale_b", row_scale_b)):
        if not isinstance(v, bool):
            raise ValueError(f"{name} must be a bool, got {v!r}")
    return _core.build_plan(
        schedule, tp, steps, m, n, k, l, partial_via, row_scale_a, row_scale_b
    ).to_dict()


def tile_map(schedule: str | dict, tp: int, steps: int | None = None) -> dict:
    """DistributedTileScheduler tables (device x iteration): tile, source and destination device."""
    return _core.tile_map(schedule, tp, tp if steps is None else steps)


def workspace_bytes(plan: PlanDict, slot_elem_bytes: int = 2) -> int:
    """Extra device memory per device (receive slots, scale slots, flags, barrier, epoch) of a
    plan."""
    p = plan["problem"]
    return _core.workspace_layout(
        plan["definition"],
        plan["tp"],
        plan["steps"],
        p["m"],
        p["n"],
        p["k"],
        p["l"],
        slot_elem_bytes,
        plan.get("partial_via"),
        plan.get("row_scale_a", False),
        plan.get("row_scale_b", False),
    )["total_bytes"]


def clone_plan(plan: PlanDict) -> PlanDict:
    """A deep copy, for tests that corrupt a plan on purpose."""
    return _copy.deepcopy(plan)
