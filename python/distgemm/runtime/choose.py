"""The path of an op entry, chosen once when the entry is created: a pure function of its spec.

The requested path, or for ``path="auto"``: the fused kernel where its shape rule allows
(``paths.fused.fused_auto``), else the tuning table's path for the call's bucket
(``tuning_table``), else the cost model's under the machine's constants (``cost_model``,
``machine``); the overlapped plan where the group cannot run the collective path. Shapes, the
table, the constants and the group's backend only, so every rank chooses the same; nothing is
measured on the user's call.
"""

from __future__ import annotations

from typing import Any

import torch

from .cost_model import choose as model_choice
from .machine import MachineConstants
from .paths.fused import fused_auto, fused_problem
from .spec import Spec
from .tuning_table import candidate_name


def choose_path(
    spec: Spec,
    requested: str,
    dtype: torch.dtype,
    collective_problem: str | None,
    mc: MachineConstants | None = None,
) -> tuple[str, dict[str, Any]]:
    """(path, what ``path_choices()`` reports about it) for an entry of ``spec`` (operands of
    ``dtype``) called with ``path=requested``; ``collective_problem``: why the group cannot run
    the collective path (None: it can); ``mc``: the machine's constants (``runtime.machine``;
    None: no calibration, the model keeps the collective path). The report: ``source``
    ("requested", "table", "model"),
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
        path, pred, why = model_choice(mc, spec.plan, spec.tile_n)
        info.update(source="model", **pred, why=f"model: {why}")
    if path == "collective" and collective_problem:
        path = "overlap"
        info["collective_unavailable"] = collective_problem
    return path, info
