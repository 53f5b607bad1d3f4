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
  many tiles, so its time follows the flops closely.
- NCCL: ``latency + bytes moved per rank / bandwidth``, plus a share of the GEMM time (the
  collective path's GEMM shares the GPU with NCCL's kernels).
- the overlapped plan: its steps' GEMMs, the exposed part of one step's transfer
  (``max(0, transfer - step GEMM)``, the first gather or the last partial), and per transport a
  cost per step, a share of the GEMM time and a cost per byte moved (copy engine and epilogue
  traffic slowing the GEMM).

Calibration: the constants are fitted to a TP=2 Llama sweep by
``benchmarks/sweep/fit_path_model.py``; docs/tuning.md has their values' sources and the
validation table, ``tests/test_tuning_model.py`` checks the choice on that sweep. Outside what the
fit covers the model keeps the collective path: below ``MIN_TOKENS`` tokens and at a TP other
than ``CALIBRATED_TP``; a tuning table measured there decides instead.
"""

from __future__ import annotations

import math
from typing import Any

from .. import _core
from ..plan.timeline import CostModel

# Resident CTAs of one GEMM kernel on the calibration GPU (an H200): the slots of the wave model,
# as in _core.choose_tile_n's default.
SLOTS = _core.H200_RESIDENT_CTAS
# Bytes per element of the operands (bf16 and fp16 alike).
ELEM_BYTES = 2
# One-way copy-engine peer bandwidth (bytes per ms): the simulator's timeline default.
LINK_BYTES_PER_MS = CostModel.link_gbs * 1e6

# Our kernel, ms (fit over the sweep's `ms_floor_dg`, the kernel alone on one GPU).
GEMM_LAUNCH_MS = 7.91e-3
# ms per K element: (per full wave of throughput, per wave started), by tile width.
GEMM_MS_PER_K = {256: (7.26e-6, 5.85e-6), 128: (3.02e-6, 3.88e-6)}

# torch.mm (fit over the sweep's `ms_floor`): launch ms and flops per ms.
MM_LAUNCH_MS = 5.0e-3
MM_FLOPS_PER_MS = 6.71e11

# NCCL after/before torch.mm (fit over `ms_baseline` minus the torch.mm model): latency ms,
# ms per byte moved per rank, share of the GEMM time added.
NCCL = {
    "all_gather": (2.09e-2, 2.92e-9, 2.88e-2),
    "reduce_scatter": (2.37e-2, 3.40e-9, 2.53e-3),
}

# The overlapped plan beyond its GEMMs, per transport (fit over `ms_dg_S_tp` / `ms_dg_S_2tp`):
# ms per step, share of the steps' GEMM time, ms per byte moved per rank.
OVERLAP = {
    "all_gather": (1.02e-3, 3.46e-2, 2.02e-10),  # the rotating operand by copy engine
    "epilogue": (5.89e-3, -1.69e-2, 1.51e-9),  # partials written by the GEMM epilogue (S = TP)
    "copy": (5.15e-3, 8.25e-3, 5.29e-10),  # partials staged and pushed by copy engine (S >= 2TP)
}

# Below this many tokens (M) the model keeps the collective path: the sweep's smallest token
# count; nothing smaller was ever measured on the overlapped path.
MIN_TOKENS = 1024
# The TP the constants were fitted at (the sweep's); at any other TP the collective path.
CALIBRATED_TP = (2,)
# The overlapped path only where the model predicts it faster by at least this many ms: the
# largest error of a predicted gain over the sweep's small calls (docs/tuning.md).
MIN_GAIN_MS = 5e-3


def gemm_ms(m: int, n: int, k: int, *, tile_n: int = 0, count: int = 1, chained: bool = False):
    """Predicted ms of ``count`` equal sub-GEMMs m x n x k of our kernel, one after the other
    (``chained``: by programmatic dependent launch, which fills each one's last wave with the
    next one's tiles). ``tile_n`` 0: the tile choose_tile_n picks."""
    est = _core.choose_tile_n(m, n)
    tile = tile_n or est["tile_n"]
    tiles = est[f"n{tile}"]["tiles"] * count
    waves = math.ceil(tiles / SLOTS) if chained else est[f"n{tile}"]["waves"] * count
    full, wave = GEMM_MS_PER_K[tile]
    return (1 if chained else count) * GEMM_LAUNCH_MS + k * (full * tiles / SLOTS + wave * waves)


def mm_ms(m: int, n: int, k: int) -> float:
    """Predicted ms of torch's GEMM m x n x k."""
    return MM_LAUNCH_MS + 2.0 * m * n * k / MM_FLOPS_PER_MS


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


def predict(plan: Any, tile_n: int = 0) -> dict[str, float]:
    """Predicted ms of ``plan`` (a ``_core.Plan``) on its overlapped path and of the collective
    path on the same problem: {"overlap_ms", "collective_ms"}."""
    d, tp, steps = plan.definition, plan.tp, plan.steps
    p = plan.problem
    m, n, k = p["m"], p["n"], p["k"]
    rm, rn, rk = rank_problem(d, tp, m, n, k)
    moved = moved_bytes(d, tp, m, n, k)
    coll = d["collective"]
    nccl = NCCL["all_gather" if coll == "all_gather" else "reduce_scatter"]
    times = 2 if coll == "all_reduce" else 1  # ring all-reduce: a reduce-scatter + an all-gather
    mm = mm_ms(rm, rn, rk)
    collective = mm * (1.0 + nccl[2]) + times * nccl[0] + moved * nccl[1]
    if tp < 2:
        return {"overlap_ms": gemm_ms(rm, rn, rk, tile_n=tile_n), "collective_ms": mm}
    # The longest step (uneven steps: ceil); at least one row, so that a plan with empty tiles
    # (fewer tokens than steps) still has a step to price.
    sm, sn = (max(1, -(-rm // steps)), rn) if d["split"] == "M" else (rm, max(1, -(-rn // steps)))
    step = gemm_ms(sm, sn, rk, tile_n=tile_n)
    gemms = gemm_ms(sm, sn, rk, tile_n=tile_n, count=steps, chained=plan.pdl_by_default)
    exposed = max(0.0, moved / (steps * (tp - 1) / tp) / LINK_BYTES_PER_MS - step)
    per_step, share, per_byte = OVERLAP["all_gather" if coll == "all_gather" else plan.partial_via]
    overlap = gemms * (1.0 + share) + exposed + steps * per_step + moved * per_byte
    return {"overlap_ms": overlap, "collective_ms": collective}


def choose(plan: Any, tile_n: int = 0) -> tuple[str, dict[str, float], str]:
    """The model's path for ``plan`` ("overlap" or "collective"), its prediction and why in
    words: the collective path below MIN_TOKENS tokens and at a TP outside CALIBRATED_TP, else
    the overlapped one where it is predicted faster by at least MIN_GAIN_MS. Shapes only, so
    every rank picks the same."""
    pred = predict(plan, tile_n)
    if plan.problem["m"] < MIN_TOKENS:
        return "collective", pred, f"below {MIN_TOKENS} tokens: no overlap measurement"
    if plan.tp not in CALIBRATED_TP:
        return "collective", pred, f"TP={plan.tp}: the model is calibrated at TP={CALIBRATED_TP}"
    gain = pred["collective_ms"] - pred["overlap_ms"]
    why = (
        f"predicted overlap {pred['overlap_ms']:.4g} ms, collective {pred['collective_ms']:.4g} ms"
    )
    return ("overlap" if gain >= MIN_GAIN_MS else "collective"), pred, why
