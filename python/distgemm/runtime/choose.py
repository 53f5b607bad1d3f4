"""The S and the path of an op entry, chosen once when the entry is created: pure functions of
its spec.

S (``choose_steps``): under ``path="auto"`` with ``steps=None`` and no tuning-table entry, the
S of TP or 2 TP whose overlapped plan the cost model prices lower by more than its error, where
the machine has constants; else the call's, the table's or the defaults' S.

The path: the requested path, or for ``path="auto"``: for ``gemm_all_reduce`` at the token
counts the machine's calibration measured, the fastest of mm + NCCL, mm + our one-shot or
two-shot all-reduce and the fused kernel with each tail its calibration priced, under its model
(``reduce_cost``); else the tuning table's path for the call's bucket (``tuning_table``), else
the cost model's under the machine's constants
(``cost_model``, ``machine``); the overlapped plan where the group cannot run the collective
path. Shapes, the table, the constants and the group's backend only, so every rank chooses the
same; nothing is measured on the user's call.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _core
from . import reduce_cost
from .cost_model import choose as model_choice
from .cost_model import margin_ms, predict_steps
from .machine import FUSED_PATHS, MachineConstants
from .paths.collective import own_all_reduce_offer
from .paths.fused import fused_problem, rank_problem_shape
from .spec import Spec, with_steps
from .tuning_table import candidate_name
from .validate import DTYPES

# The S the model chooses among, as multiples of TP, where S is left to the library.
MODEL_STEPS_PER_RANK = (1, 2)


def choose_steps(
    spec: Spec,
    requested_steps: int | None,
    dtype: torch.dtype,
    mc: MachineConstants | None,
    collective_problem: str | None = None,
) -> tuple[Spec, dict[str, Any], dict[str, float] | None]:
    """``spec`` at the S the model predicts fastest for the overlapped plan among
    MODEL_STEPS_PER_RANK times TP, where it beats the defaults' S (``spec``'s) by the model's
    margin (``cost_model.margin_ms``: its calibration's error), else at the defaults' S; with
    the predictions (``steps_ms``: ms by S) for ``path_choices()``, and the chosen plan's
    ``cost_model.predict`` (for ``choose_path``). ``spec`` unchanged (no report, no prediction)
    where the S is not the library's to choose or the model cannot price it: S given by the call
    or by the tuning table, no constants, TP 1, fp8 operands (the constants are bf16's), or a
    gemm_all_reduce the decode model decides (``collective_problem`` as ``choose_path`` takes
    it), which runs no overlapped plan. The other S is priced without building its plan
    (``_core.default_transport``), which is built only where it wins; where it cannot run the
    problem (``with_steps``), the defaults' S stays. Shapes and constants only, so every rank
    picks the same S."""
    if requested_steps is not None or spec.table is not None or mc is None or spec.tp < 2:
        return spec, {}, None
    if _decode_priced(spec, collective_problem, mc):
        return spec, {}, None
    if dtype not in (torch.bfloat16, torch.float16):
        return spec, {}, None
    plan, tp, problem = spec.plan, spec.tp, (spec.m, spec.n, spec.k)
    table_dtype = DTYPES[dtype]
    definition = plan.definition
    vias = {spec.steps: (plan.partial_via, plan.pdl_by_default)}  # the defaults' S: its plan's
    for per_rank in MODEL_STEPS_PER_RANK:
        steps = per_rank * tp
        if steps not in vias:
            vias[steps] = _core.default_transport(spec.schedule, tp, steps)
    priced = {
        steps: predict_steps(mc, definition, tp, steps, problem, via, spec.tile_n, table_dtype)
        for steps, via in vias.items()
    }
    best = min(priced, key=lambda steps: (priced[steps]["overlap_ms"], steps))
    default_ms = priced[spec.steps]["overlap_ms"]
    chosen = spec
    if default_ms - priced[best]["overlap_ms"] >= margin_ms(mc, default_ms):
        other = with_steps(spec, best)
        if other is None:
            del priced[best]  # that S cannot run this problem: not offered
        else:
            chosen = other
    report = {"steps_ms": {steps: p["overlap_ms"] for steps, p in sorted(priced.items())}}
    return chosen, report, priced[chosen.steps]


def choose_path(
    spec: Spec,
    requested: str,
    dtype: torch.dtype,
    collective_problem: str | None,
    mc: MachineConstants | None = None,
    prediction: dict[str, float] | None = None,
) -> tuple[str, dict[str, Any]]:
    """(path, what ``path_choices()`` reports about it) for an entry of ``spec`` (operands of
    ``dtype``) called with ``path=requested``; ``collective_problem``: why the group cannot run
    the collective path (None: it can); ``mc``: the machine's constants (``runtime.machine``;
    None: no calibration, the model keeps the collective path with NCCL). The report:
    ``source`` ("requested", "table", "model"), ``tile_n`` (0: per GEMM), ``all_reduce`` (the
    collective path's all-reduce of a gemm_all_reduce: "nccl" or one of ``OWN_ALL_REDUCES``),
    ``fused_tail`` (the fused path's tail, one of ``_core.FUSED_TAILS``: a requested
    "fused_two_shot" runs path "fused" with the two-shot tail) and, for "auto", the predictions
    in ms (``overlap_ms`` / ``collective_ms``: the table's
    measured ms or the model's; at decode token counts one ``<candidate>_ms`` each), ``why`` in
    words and, where the collective path was chosen but cannot run, ``collective_unavailable``.
    ``prediction``: ``cost_model.predict`` of ``spec``'s plan where the caller has it
    (``choose_steps`` gives it)."""
    info: dict[str, Any] = {"source": "requested", "tile_n": spec.tile_n}
    if requested in FUSED_PATHS:
        problem = fused_problem(spec, dtype, FUSED_PATHS[requested])
        if problem:
            raise ValueError(f"{spec.op}: path={requested!r} cannot run this call: {problem}")
    if spec.op == "gemm_all_reduce":
        info["all_reduce"] = "nccl"
    if requested in FUSED_PATHS:
        info["fused_tail"] = FUSED_PATHS[requested]
        return "fused", info
    if requested != "auto":
        return requested, info
    decode = _reduce_choice(spec, dtype, collective_problem, mc)
    if decode is not None:
        path, more = decode
        info.update(source="model", **more)
        return path, info
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
        table_dtype = DTYPES.get(dtype, "bf16")  # fp8 operands: priced as bf16's
        path, pred, why = model_choice(mc, spec.plan, spec.tile_n, prediction, table_dtype)
        info.update(source="model", **pred, why=f"model: {why}")
    if path == "collective" and collective_problem:
        path = "overlap"
        info["collective_unavailable"] = collective_problem
    return path, info


def _reduce_choice(
    spec: Spec, dtype: torch.dtype, collective_problem: str | None, mc: MachineConstants | None
) -> tuple[str, dict[str, Any]] | None:
    """(path, report) of a gemm_all_reduce entry at the token counts the machine's reduce
    constants cover (``reduce_cost.choose``), or None where they do not (no constants, more
    tokens, or a group that cannot run the collective path, the baseline)."""
    if not _decode_priced(spec, collective_problem, mc):
        return None
    rc = mc.reduce
    m, n, k = rank_problem_shape(spec)
    offered = {path: fused_problem(spec, dtype, tail) for path, tail in FUSED_PATHS.items()}
    offered.update(own_all_reduce_offer(m * n, dtype, spec.tp))
    pick, pred, why = reduce_cost.choose(rc, m, n, k, spec.tp, offered, mc.key.slug())
    report = {f"{c.replace('/', '_')}_ms": v for c, v in pred.items()}
    report.update(why=f"model: {why}", all_reduce="nccl")
    if pick in FUSED_PATHS:
        return "fused", dict(report, fused_tail=FUSED_PATHS[pick])
    report["all_reduce"] = pick.split("/", 1)[1]
    return "collective", report


def _decode_priced(spec: Spec, collective_problem: str | None, mc: MachineConstants | None) -> bool:
    """Whether the decode model decides this entry's path: a gemm_all_reduce at the token counts
    the machine's reduce constants cover, on a group that can run the collective path (its
    baseline)."""
    rc = mc.reduce if mc is not None else None
    if spec.op != "gemm_all_reduce" or rc is None or collective_problem:
        return False
    return rank_problem_shape(spec)[0] <= rc.max_tokens
