"""Issue 42's measure of a decode point: distgemm against the best unfused GEMM + all-reduce.

A point is one row-parallel layer at one token count at one TP. Its *best unfused* time is the
fastest of the unfused variants that ran, gave the right result and were not timed below the GEMM
alone (torch.mm, then NCCL's all-reduce, torch's one-shot or two-shot, or NCCL's symmetric-memory
all-reduce). Every ratio is a speed-up, ``best unfused time / variant time``: above 1 means the
variant is faster than the best unfused path (the convention of the benchmarks' other ``vs``
columns).

The acceptance per TP, over the points in scope:

- the median of distgemm's ratio is at least TARGET_MEDIAN;
- its minimum is at least TARGET_MIN;
- at 1..MM_TOKENS tokens on MM_MODELS, distgemm's time is at most MAX_OVER_MM x torch.mm alone.

A criterion is met only when every point it covers was measured; a point where distgemm's own
number cannot count (wrong, or below torch.mm alone) misses it. Pure: numbers in, numbers and
lines out.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.common.report import verdict

TARGET_MEDIAN, TARGET_MIN, MAX_OVER_MM = 1.1, 0.98, 1.2
MM_TOKENS, MM_MODELS = 8, ("70B", "405B")
NAMES_SHOWN = 6  # case names listed per missed criterion, then a count


def best_of(
    times: dict[str, float], candidates: Sequence[str], excluded: Iterable[str] = ()
) -> tuple[str | None, float | None]:
    """(variant, time) of the fastest of ``candidates`` that has a time and is not
    ``excluded``; (None, None) where none has."""
    skip = set(excluded)
    timed = [(times[v], v) for v in candidates if v not in skip and times.get(v)]
    if not timed:
        return None, None
    t, v = min(timed)
    return v, t


def speedup(base: float | None, t: float | None) -> float | None:
    """``base / t`` (above 1: ``t`` is faster), None where either is missing."""
    return base / t if (base and t) else None


@dataclass(frozen=True)
class Point:
    """One point of the acceptance: its case name, distgemm's speed-up over the best unfused
    path, distgemm's time over torch.mm alone where the over-mm criterion covers it (``mm_scope``)
    and ``bad``: why distgemm's number cannot count ('' when it can)."""

    name: str
    vs_best: float | None
    over_mm: float | None = None
    mm_scope: bool = False
    bad: str = ""


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def acceptance(points: Sequence[Point]) -> dict[str, Any]:
    """The three criteria over ``points``: the median and minimum of ``vs_best`` (with where the
    minimum is: the first such point) and the worst ``over_mm``, each with ``*_met`` (True,
    False or None: not every point measured), the measured and total counts, and the case names
    that miss or were not measured."""
    bad = [p.name for p in points if p.bad]
    ratios = [(p.vs_best, p.name) for p in points if p.vs_best is not None and not p.bad]
    unmeasured = [p.name for p in points if p.vs_best is None and not p.bad]
    median = statistics.median(r for r, _ in ratios) if ratios else None
    low, low_at = min(ratios, key=lambda x: x[0]) if ratios else (None, None)  # the first
    below = [n for r, n in ratios if r < TARGET_MIN]
    complete = bool(points) and not unmeasured
    if bad:
        median_met = False
    else:
        median_met = median >= TARGET_MEDIAN if (complete and median is not None) else None
    min_met = False if (bad or below) else (True if complete else None)
    mm_points = [p for p in points if p.mm_scope]
    mm_bad = [p.name for p in mm_points if p.bad]
    overs = [(p.over_mm, p.name) for p in mm_points if p.over_mm is not None and not p.bad]
    high, high_at = max(overs, key=lambda x: x[0]) if overs else (None, None)
    over = [n for r, n in overs if r > MAX_OVER_MM]
    if mm_bad or over:
        mm_met = False
    else:
        mm_met = True if (mm_points and len(overs) == len(mm_points)) else None
    return dict(
        points=len(points),
        measured=len(ratios),
        median=median,
        median_met=median_met,
        min=low,
        min_at=low_at,
        min_met=min_met,
        below_min=below,
        bad=bad,
        unmeasured=unmeasured,
        over_mm=high,
        over_mm_at=high_at,
        over_mm_met=mm_met,
        over_mm_measured=len(overs),
        over_mm_of=len(mm_points),
        over_mm_missed=mm_bad + over,
    )


def acceptance_lines(acc: dict[str, Any], tp, scope: str) -> list[str]:
    """The acceptance as text: a header naming the TP, the scope and the ratio's direction, then
    one line per criterion with its value, target and verdict."""

    def x(v):
        return "-" if v is None else f"{v:.3f}x"

    lines = [
        f"acceptance (issue 42, tp={tp}; {scope}; ratio = best unfused time / distgemm time, "
        "above 1 = distgemm faster):"
    ]
    tail = ""
    if acc["unmeasured"]:
        tail += f"; not measured: {_names(acc['unmeasured'])}"
    if acc["bad"]:
        tail += f"; distgemm's number does not count: {_names(acc['bad'])}"
    lines.append(
        f"  median of distgemm vs best unfused: {x(acc['median'])} over {acc['measured']} of "
        f"{acc['points']} points (target >= {TARGET_MEDIAN}): {verdict(acc['median_met'])}{tail}"
    )
    where = f" at {acc['min_at']}" if acc["min_at"] else ""
    below = f"; below it: {_names(acc['below_min'])}" if acc["below_min"] else ""
    lines.append(
        f"  minimum: {x(acc['min'])}{where} (target >= {TARGET_MIN}): "
        f"{verdict(acc['min_met'])}{below}"
    )
    where = f" at {acc['over_mm_at']}" if acc["over_mm_at"] else ""
    missed = f"; missed: {_names(acc['over_mm_missed'])}" if acc["over_mm_missed"] else ""
    lines.append(
        f"  distgemm / torch.mm alone at 1..{MM_TOKENS} tokens on {', '.join(MM_MODELS)}: worst "
        f"{x(acc['over_mm'])}{where} (target <= {MAX_OVER_MM}x): {verdict(acc['over_mm_met'])} "
        f"({acc['over_mm_measured']} of {acc['over_mm_of']} measured{missed})"
    )
    return lines
