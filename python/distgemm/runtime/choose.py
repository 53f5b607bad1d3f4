"""The path of an op entry, decided when the entry is created: the requested one, or for
``path="auto"`` the tuning table's (``distgemm.tuning``), else the cost model's
(``distgemm.pathmodel``); the overlapped plan where the group cannot run the collective path.
gemm_all_reduce runs fused (``distgemm.fused``) where ``_core.fused_auto_problem`` allows (up to
``_core.FUSED_MAX_AUTO_TOKENS`` tokens at TP 2, by the measured rule).
Shapes, the table and the group's backend only, so every rank decides the same; nothing is
measured on the user's call."""

from __future__ import annotations

from typing import Any

from .collective import collective_unavailable
from .fused import fused_auto, fused_problem
from .pathmodel import choose
from .tuning import candidate_name
from .validation import Spec


def decide_path(spec: Spec, requested: str, comm, dtype=None) -> tuple[str, dict[str, Any]]:
    """(path, what ``path_choices()`` reports about it) for an entry of ``spec`` (operands of
    ``dtype``) called with ``path=requested`` on ``comm`` (whose ``group`` is read only where
    "auto" picks the collective path). The report: ``source`` ("requested", "table", "model"),
    ``tile_n`` (0: per GEMM) and, for "auto", ``overlap_ms`` / ``collective_ms`` (the table's
    measured ms or the model's prediction), ``why`` in words and, where the collective path was
    chosen but cannot run, ``collective_unavailable``."""
    info: dict[str, Any] = {"source": "requested", "tile_n": spec.tile_n}
    if requested == "fused":
        problem = fused_problem(spec, dtype)
        if problem:
            raise ValueError(f"{spec.op}: path='fused' cannot run this call: {problem}")
    if requested != "auto":
        return requested, info
    fused, why_fused = fused_auto(spec, dtype)
    if fused:
        info.update(source="model", why=why_fused)
        return "fused", info
    entry = spec.table
    if entry is not None:
        path = entry.path
        info.update(
            source="table",
            overlap_ms=entry.ms.get(candidate_name("overlap", entry.steps, entry.tile_n)),
            collective_ms=entry.ms.get("collective"),
            why=f"tuning table bucket of {entry.tokens}..{2 * entry.tokens - 1} tokens",
        )
    else:
        path, pred, why = choose(spec.plan, spec.tile_n)
        info.update(source="model", **pred, why=f"model: {why}")
    if path == "collective":
        why_not = collective_unavailable(comm.group)  # the group only: every rank agrees
        if why_not:
            path = "overlap"
            info["collective_unavailable"] = why_not
    return path, info
