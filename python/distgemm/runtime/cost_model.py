"""The cost model behind ``path="auto"`` without a tuning table: predicted ms of a plan's
overlapped launch and of the collective path (NCCL + torch GEMM) for the same problem, from the
shapes alone, and the path it picks.

What it models (one rank; every constant below says where it comes from):

- our GEMM kernel, one sub-GEMM m x n x k with the tile ``_core.choose_tile_n`` picks (or a
  forced one): ``launch + k * (full * tiles / slots + wave * waves)``. ``full`` prices the work,
  ``wave`` the wave quantisation: a half-empty last wave costs less than a full one (fewer CTAs
  share HBM), but not nothing. Steps chained by programmatic dependent launch
  (``Plan.pdl_by_default``) fill each other's last wave: their tiles are counted as one GEMM's.
- torch's GEMM (cuBLAS, the collective path): ``launch + flops / rate``; cuBLAS picks among
  many tiles, so its time follows the flops closely. A plan's step that the machine's kernel
  table gives to cuBLASLt (``kernel_table.plan_kernel``) is priced so too, one launch per step,
  under constants calibrated with such steps (``MachineConstants.steps_by_table``); under
  others, as our kernel, the kernel their overlap terms were fitted with.
- NCCL: ``latency + bytes moved per rank / bandwidth``, plus a share of the GEMM time (the
  collective path's GEMM shares the GPU with NCCL's kernels).
- the overlapped plan: its steps' GEMMs, the exposed part of one step's transfer
  (``max(0, transfer - step GEMM)``, the first gather or the last partial), and per transport a
  cost per step, a share of the GEMM time and a cost per byte moved (copy engine and epilogue
  traffic slowing the GEMM).

The constants are a machine's (``runtime.machine.MachineConstants``): measured by
``python -m distgemm.tune --calibrate`` on the deployment's GPUs (``distgemm.calibrate``) or
shipped for the machines the package was measured on. docs/tuning.md has their sources and the
validation on shapes the calibration did not run. Without constants for the machine the model
keeps the collective path: it is the baseline, so the choice is never slower than it.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from .. import _core
from . import kernel_table
from .machine import MachineConstants

# Bytes per element of the operands (bf16 and fp16 alike).
ELEM_BYTES = 2
# The overlapped path only where the model predicts it faster by at least this many ms (a gain
# the size of the timer's jitter on the smallest calls is no gain), and by the calibration's
# error on the gain less TOLERATED_LOSS, as shares of the collective time: a wrong choice then
# costs more than TOLERATED_LOSS only where the model errs by more than its typical error.
MIN_GAIN_MS = 5e-3
TOLERATED_LOSS = 0.02  # of the collective path's time


def gemm_ms(
    mc: MachineConstants,
    m: int,
    n: int,
    k: int,
    *,
    tile_n: int = 0,
    count: int = 1,
    chained: bool = False,
) -> float:
    """Predicted ms of ``count`` equal sub-GEMMs m x n x k of our kernel, one after the other
    (``chained``: by programmatic dependent launch, which fills each one's last wave with the
    next one's tiles). ``tile_n`` 0: the tile choose_tile_n picks."""
    tile, launches, work, waves = gemm_terms(mc.slots, m, n, k, tile_n, count, chained)
    full, wave = mc.gemm_ms_per_k[tile]
    return launches * mc.gemm_launch_ms + work * full + waves * wave


def steps_gemm_ms(
    mc: MachineConstants,
    m: int,
    n: int,
    k: int,
    kernel: str,
    *,
    tile_n: int = 0,
    count: int = 1,
    chained: bool = False,
) -> float:
    """Predicted ms of ``count`` equal sub-GEMMs m x n x k of a plan run by ``kernel``
    (``kernel_table.plan_kernel``'s answer): distgemm's, ``gemm_ms``; cuBLASLt's, torch's GEMM
    (``mm_ms``: torch.mm runs cuBLASLt) once per step, which no dependent launch chains."""
    if kernel == kernel_table.CUBLASLT:
        return count * mm_ms(mc, m, n, k)
    return gemm_ms(mc, m, n, k, tile_n=tile_n, count=count, chained=chained)


def step_kernel_of(dtype: str, m: int, n: int, k: int, tile_n: int = 0) -> str:
    """The kernel a plan's step GEMM m x n x k runs: distgemm's where the plan forces a tile
    (the table then has no say), else the installed table's (``kernel_table.plan_kernel``)."""
    return kernel_table.DISTGEMM if tile_n else kernel_table.plan_kernel(dtype, m, n, k)


def gemm_terms(
    slots: int, m: int, n: int, k: int, tile_n: int = 0, count: int = 1, chained: bool = False
) -> tuple[int, int, float, int]:
    """gemm_ms's terms before the constants: (tile width, launches, k * tiles / slots,
    k * waves); a calibration fits the constants to them (``runtime.calibration_fit``)."""
    est = _tile_estimate(m, n)
    tile = tile_n or est["tile_n"]
    tiles = est[f"n{tile}"]["tiles"] * count
    waves = math.ceil(tiles / slots) if chained else math.ceil(tiles / count / slots) * count
    return tile, (1 if chained else count), k * tiles / slots, k * waves


# _core.choose_tile_n, a pure function of (m, n) that every prediction asks twice per step GEMM
# (one step, then the chained steps): read-only results, kept for the recent shapes.
_tile_estimate = functools.lru_cache(maxsize=256)(_core.choose_tile_n)


def mm_ms(mc: MachineConstants, m: int, n: int, k: int) -> float:
    """Predicted ms of torch's GEMM m x n x k."""
    return mc.mm_launch_ms + 2.0 * m * n * k / mc.mm_flops_per_ms


def rank_problem(definition: dict, tp: int, m: int, n: int, k: int) -> tuple[int, int, int]:
    """The GEMM one rank computes over a whole launch (m, n, k): the gathered operand whole,
    the sharded K, the shard of the operand that neither rotates nor is gathered."""
    part, rot = definition["partition"], definition["rotating"]
    return (
        m // tp if part["a"] == "M" and rot != "A" else m,
        n // tp if part["b"] == "N" and rot != "B" else n,
        k // tp if part["a"] == "K" else k,
    )


def moved_bytes(definition: dict, tp: int, m: int, n: int, k: int) -> float:
    """Bytes each rank sends (or receives) in the collective: (TP-1)/TP of the gathered
    operand, of the partial result, or twice that for an all-reduce."""
    coll = definition["collective"]
    if coll == "all_gather":
        total = (m if definition["rotating"] == "A" else n) * k
    else:
        rm, rn, _ = rank_problem(definition, tp, m, n, k)
        total = rm * rn * (2 if coll == "all_reduce" else 1)
    return total * ELEM_BYTES * (tp - 1) / tp


def predict(
    mc: MachineConstants,
    plan: Any,
    tile_n: int = 0,
    dtype: str = "bf16",
    step_kernel: str | None = None,
) -> dict[str, float]:
    """Predicted ms of ``plan`` (a ``_core.Plan``) on its overlapped path and of the collective
    path on the same problem, under the constants ``mc``: {"overlap_ms", "collective_ms"}.
    ``dtype`` ("bf16", "fp16") and ``step_kernel`` as ``predict_steps`` takes them."""
    p = plan.problem
    return predict_steps(
        mc, plan.definition, plan.tp, plan.steps, (p["m"], p["n"], p["k"]),
        (plan.partial_via, plan.pdl_by_default), tile_n, dtype, step_kernel,
    )  # fmt: skip


def predict_steps(
    mc: MachineConstants,
    d: dict,
    tp: int,
    steps: int,
    problem: tuple[int, int, int],
    via: tuple[str, bool],
    tile_n: int = 0,
    dtype: str = "bf16",
    step_kernel: str | None = None,
) -> dict[str, float]:
    """``predict`` of the plan of schedule definition ``d`` on ``tp`` ranks at S = ``steps`` for
    the global ``problem`` (m, n, k), without building it: ``via`` is its (partial_via,
    pdl_by_default), which ``_core.default_transport`` gives for the default options. Its steps
    are priced as the kernel that runs them (``step_kernel``: a calibration run's record; None:
    ``step_kernel_of`` for ``dtype`` under the installed table where ``mc.steps_by_table``,
    else distgemm's)."""
    m, n, k = problem
    rm, rn, rk = rank_problem(d, tp, m, n, k)
    moved = moved_bytes(d, tp, m, n, k)
    coll = d["collective"]
    latency, per_byte, share = mc.nccl[nccl_kind(d)]
    times = 2 if coll == "all_reduce" else 1  # ring all-reduce: a reduce-scatter + an all-gather
    mm = mm_ms(mc, rm, rn, rk)
    collective = mm * (1.0 + share) + times * latency + moved * per_byte
    if tp < 2:
        return {"overlap_ms": gemm_ms(mc, rm, rn, rk, tile_n=tile_n), "collective_ms": mm}
    sm, sn = step_gemm(d, steps, rm, rn)
    kernel = step_kernel or (
        step_kernel_of(dtype, sm, sn, rk, tile_n) if mc.steps_by_table else kernel_table.DISTGEMM
    )
    step = steps_gemm_ms(mc, sm, sn, rk, kernel, tile_n=tile_n)
    gemms = steps_gemm_ms(mc, sm, sn, rk, kernel, tile_n=tile_n, count=steps, chained=via[1])
    exposed = max(0.0, exposed_copy_ms(mc, moved, steps, tp) - step)
    per_step, o_share, o_per_byte = mc.overlap[transport_of(coll, via[0])]
    overlap = gemms * (1.0 + o_share) + exposed + steps * per_step + moved * o_per_byte
    return {"overlap_ms": overlap, "collective_ms": collective}


def step_shape(
    definition: dict, tp: int, steps: int, m: int, n: int, k: int
) -> tuple[int, int, int]:
    """The longest step's GEMM (m, n, k) of the plan of ``definition`` on ``tp`` ranks at S =
    ``steps`` for the global problem m x n x k (``rank_problem``, then ``step_gemm``)."""
    rm, rn, rk = rank_problem(definition, tp, m, n, k)
    return (*step_gemm(definition, steps, rm, rn), rk)


def step_gemm(definition: dict, steps: int, rm: int, rn: int) -> tuple[int, int]:
    """The longest step's GEMM (uneven steps: ceil); at least one row, so that a plan with empty
    tiles (fewer tokens than steps) still has a step to price."""
    if definition["split"] == "M":
        return max(1, -(-rm // steps)), rn
    return rm, max(1, -(-rn // steps))


def exposed_copy_ms(mc: MachineConstants, moved: float, steps: int, tp: int) -> float:
    """ms of one step's transfer (the first gather or the last partial): its share of the bytes
    moved, from one peer, on the copy engine."""
    return mc.copy_latency_ms + moved / (steps * (tp - 1) / tp) / mc.link_bytes_per_ms(1)


def nccl_kind(definition: dict) -> str:
    """The NCCL constants' collective of a schedule's collective path: "all_gather", or
    "reduce_scatter" (an all-reduce is priced as a reduce-scatter and an all-gather of that
    size, both at the reduce-scatter's constants)."""
    return "all_gather" if definition["collective"] == "all_gather" else "reduce_scatter"


def transport(plan: Any) -> str:
    """The overlap constants' transport of ``plan``: "all_gather" (the rotating operand by copy
    engine), "epilogue" or "copy" (how reduce partials travel)."""
    return transport_of(plan.definition["collective"], plan.partial_via)


def transport_of(collective: str, partial_via: str) -> str:
    """``transport`` of a plan of ``collective`` whose partials travel by ``partial_via``."""
    return "all_gather" if collective == "all_gather" else partial_via


def margin_ms(mc: MachineConstants, baseline_ms: float) -> float:
    """The least predicted gain over a baseline of ``baseline_ms`` that the model acts on
    (``error_margin_ms`` of the constants' ``choice_error``)."""
    return error_margin_ms(mc.choice_error, baseline_ms)


def error_margin_ms(error: float, baseline_ms: float, least_ms: float = MIN_GAIN_MS) -> float:
    """The one rule of every model's margin: a predicted gain over a baseline of ``baseline_ms``
    is taken where it is at least ``least_ms`` and at least a model error of ``error`` less
    TOLERATED_LOSS, as a share of the baseline."""
    return max(least_ms, (error - TOLERATED_LOSS) * baseline_ms)


def choose(
    mc: MachineConstants | None,
    plan: Any,
    tile_n: int = 0,
    pred: dict[str, float] | None = None,
    dtype: str = "bf16",
) -> tuple[str, dict[str, float], str]:
    """The model's path for ``plan`` ("overlap" or "collective"), its prediction and why in
    words: the overlapped one where it is predicted faster by at least MIN_GAIN_MS and by the
    constants' ``choice_error`` less TOLERATED_LOSS, shares of the collective time, else the
    collective one; the collective one without constants (``mc`` None). ``pred``: the plan's
    ``predict`` where the caller has it (else it is priced for ``dtype``). Shapes, constants
    and the node's kernel table only, so every rank picks the same."""
    if mc is None:
        why = "no calibration of this machine (python -m distgemm.tune --calibrate)"
        return "collective", {}, why
    pred = pred or predict(mc, plan, tile_n, dtype)
    gain = pred["collective_ms"] - pred["overlap_ms"]
    margin = margin_ms(mc, pred["collective_ms"])
    why = (
        f"predicted overlap {pred['overlap_ms']:.4g} ms, collective {pred['collective_ms']:.4g} "
        f"ms, margin {margin:.3g} ms ({mc.key.slug()})"
    )
    return ("overlap" if gain >= margin else "collective"), pred, why
