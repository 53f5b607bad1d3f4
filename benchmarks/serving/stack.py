"""The serving benchmark's layer stack on one rank: per-rank shards of L Llama layers (QKV, O,
FC1, FC2) and their inputs, the output buffers of a layout, and one step of the stack per variant
(which GEMM, collective or fused op each layer runs).

Data flow of one step, layer l (the residual path is chained, attention and the MLP activation
are outside the benchmark: their outputs are fixed random inputs ``attn[l]`` and ``act[l]``)::

    all-reduce layout (replicated x)          sequence-parallel layout (x sharded by rows)
    qkv = x @ Wqkv_r.T          [M, Nqkv/TP]  qkv = all_gather(x_r) @ Wqkv_r.T     [M, Nqkv/TP]
    o   = all_reduce(attn_r @ Wo_r.T) [M, H]  o_r = reduce_scatter(attn_r @ Wo_r.T) [M/TP, H]
    f1  = o @ W1_r.T            [M, 2F/TP]    f1  = all_gather(o_r) @ W1_r.T        [M, 2F/TP]
    x'  = all_reduce(act_r @ W2_r.T)  [M, H]  x'_r = reduce_scatter(act_r @ W2_r.T) [M/TP, H]

Column-parallel weights (QKV, FC1) are this rank's rows ``[N/TP, K]``, row-parallel ones (O, FC2)
its columns ``[N, K/TP]``, cut from the full matrices every rank draws from one seed, so that a
one-process fp32 stack is the reference of every layout."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.common import allreduce_baselines as ab
from benchmarks.common import models
from benchmarks.serving import runtime
from benchmarks.serving.report import LAYOUT
from distgemm.compat import custom_ops

STACK_LAYERS = ("QKV", "O", "FC1", "FC2")
COLUMN = ("QKV", "FC1")  # column-parallel: the input is gathered (sp) or replicated (ar)
SCHEDULE = {"QKV": "ag_rotate_a", "FC1": "ag_rotate_a", "O": "rs_tile_a", "FC2": "rs_tile_a"}
AR_SCHEDULE = "ar_tile_a"
SEED = 1234


def model_dims(model: str) -> dict[str, tuple[int, int]]:
    """Global (N, K) of each stack layer of a model (benchmarks/common/models.py: the Llama-3
    models of the project's table and the others)."""
    return {la: models.layer_nk(model, la) for la in STACK_LAYERS}


def check_dims(dims: dict[str, tuple[int, int]], tp: int) -> None:
    """ValueError naming the layer and values where the stack does not chain or split."""
    hidden = dims["O"][0]
    for la, (n, k) in dims.items():
        part = n if la in COLUMN else k
        if part % tp or (part // tp) % 8:
            raise ValueError(
                f"{la}: {'N' if la in COLUMN else 'K'}={part} must split over tp={tp} into "
                f"multiples of 8"
            )
    if not dims["QKV"][1] == dims["FC1"][1] == dims["FC2"][0] == hidden:
        raise ValueError(f"the stack does not chain: hidden {hidden}, dims {dims}")


def sp_reason(tokens: int, tp: int) -> str | None:
    """Why the sequence-parallel layout cannot run ``tokens`` (None: it can)."""
    if tokens % tp:
        return f"M={tokens} is not divisible by TP={tp} (sequence-parallel activations)"
    return None


def rows_of(t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """Rank's rows of ``t`` (a view)."""
    m = t.shape[0] // tp
    return t[rank * m : (rank + 1) * m]


def cols_of(t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """Rank's columns of ``t`` (a copy, contiguous)."""
    n = t.shape[1] // tp
    return t[:, rank * n : (rank + 1) * n].contiguous()


def full_layer(dims, layer_index: int, max_tokens: int, device, dtype) -> dict[str, torch.Tensor]:
    """Layer ``layer_index``'s full tensors, the same on every rank: the weights ``[N, K]``
    scaled by 1/sqrt(K), ``attn`` ``[max_tokens, H]`` and ``act`` ``[max_tokens, F]``."""
    gen = torch.Generator(device=device).manual_seed(SEED + 97 * layer_index)

    def randn(*shape, scale=1.0):
        return torch.randn(shape, device=device, dtype=dtype, generator=gen).mul_(scale)

    t = {la: randn(n, k, scale=1 / math.sqrt(k)) for la, (n, k) in dims.items()}
    t["attn"] = randn(max_tokens, dims["O"][1])
    t["act"] = randn(max_tokens, dims["FC2"][1])
    return t


def full_input(dims, max_tokens: int, device, dtype) -> torch.Tensor:
    """The first layer's input ``[max_tokens, H]``, the same on every rank."""
    gen = torch.Generator(device=device).manual_seed(SEED - 1)
    return torch.randn(max_tokens, dims["QKV"][1], device=device, dtype=dtype, generator=gen)


@dataclass
class StackOperands:
    """One rank's shards: ``w[layer][l]`` (nn.Linear layout) and ``wt`` its transposed views,
    the first input ``x0`` ``[max_tokens, H]`` and per layer ``attn`` ``[max_tokens, H/TP]``
    and ``act`` ``[max_tokens, F/TP]``."""

    dims: dict[str, tuple[int, int]]
    depth: int
    tp: int
    rank: int
    max_tokens: int
    x0: torch.Tensor
    w: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    wt: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    attn: list[torch.Tensor] = field(default_factory=list)
    act: list[torch.Tensor] = field(default_factory=list)


def make_operands(dims, depth, tp, rank, max_tokens, device, dtype=torch.bfloat16):
    """The stack's shards for this rank, one full layer on the device at a time."""
    check_dims(dims, tp)
    ops = StackOperands(
        dims, depth, tp, rank, max_tokens, full_input(dims, max_tokens, device, dtype)
    )
    for la in STACK_LAYERS:
        ops.w[la], ops.wt[la] = [], []
    for i in range(depth):
        full = full_layer(dims, i, max_tokens, device, dtype)
        for la in STACK_LAYERS:
            shard = (
                rows_of(full[la], rank, tp).clone() if la in COLUMN else cols_of(full[la], rank, tp)
            )
            ops.w[la].append(shard)
            ops.wt[la].append(shard.t())
        ops.attn.append(cols_of(full["attn"], rank, tp))
        ops.act.append(cols_of(full["act"], rank, tp))
        del full
    return ops


def make_buffers(ops: StackOperands, layout: str, max_tokens: int) -> dict[str, list]:
    """A variant's outputs at ``max_tokens`` (a step at M tokens uses their first rows): per
    layer ``qkv``, ``o``, ``fc1``, ``fc2`` and, in the sequence-parallel layout, ``scratch``
    ``[max_tokens, H]`` (NCCL + mm's gathered input or partial sum, one layer at a time)."""
    m, tp = max_tokens, ops.tp
    rows = m if layout == "ar" else m // tp
    like = ops.x0
    shapes = {
        "qkv": (m, ops.dims["QKV"][0] // tp),
        "o": (rows, ops.dims["O"][0]),
        "fc1": (m, ops.dims["FC1"][0] // tp),
        "fc2": (rows, ops.dims["FC2"][0]),
    }
    bufs = {k: [like.new_empty(s) for _ in range(ops.depth)] for k, s in shapes.items()}
    if layout == "sp":
        bufs["scratch"] = [like.new_empty(m, ops.dims["O"][0])]
    return bufs


def symmetric_numel(ops: StackOperands, max_tokens: int) -> int:
    """Elements of the flat symmetric buffer that holds every O and FC2 output of the
    all-reduce layout (``place_outputs``)."""
    return 2 * ops.depth * max_tokens * ops.dims["O"][0]


def place_outputs(bufs: dict[str, list], flat: torch.Tensor, max_tokens: int) -> None:
    """Point the all-reduce layout's O and FC2 outputs at consecutive ``[max_tokens, H]`` views
    of ``flat`` (a symmetric buffer of ``symmetric_numel`` elements), for the variants that
    all-reduce in place in symmetric memory."""
    hidden = bufs["o"][0].shape[1]
    size = max_tokens * hidden
    views = [
        flat[i * size : (i + 1) * size].view(max_tokens, hidden)
        for i in range(flat.numel() // size)
    ]
    depth = len(bufs["o"])
    bufs["o"], bufs["fc2"] = views[:depth], views[depth : 2 * depth]


def buffers_bytes(bufs: dict[str, list[torch.Tensor]]) -> int:
    return sum(t.numel() * t.element_size() for ts in bufs.values() for t in ts)


@dataclass
class LayerCalls:
    """How a variant runs the two kinds of layer: ``column(x, w, wt, out) -> out`` and
    ``row(a, w, wt, out) -> out`` (``out`` a buffer view; a variant without ``out=`` returns
    a new tensor)."""

    column: Callable[..., Any]
    row: Callable[..., Any]


def layer_calls(variant: str, group_name: str, scratch, symm_buf=None) -> LayerCalls:
    """The calls of ``variant`` (names in benchmarks/serving/report.py): ``scratch`` is the
    gathered input / partial sum of NCCL + mm in the sequence-parallel layout, ``symm_buf``
    the symmetric buffer of the one-shot all-reduce (the in-place ones reduce their outputs,
    which ``place_outputs`` put in symmetric memory)."""
    import distgemm

    def mm(x, w, wt, o):
        return torch.mm(x, wt, out=o)

    if variant == "floor":
        return LayerCalls(mm, mm)
    if variant in ("nccl_mm", "nccl_symm_mm"):  # the latter's o: in an NCCL window
        return LayerCalls(mm, lambda a, w, wt, o: ab.mm_nccl(torch, dist, a, wt, o))
    if variant == "symm_mem_one_shot":
        return LayerCalls(
            mm, lambda a, w, wt, o: ab.mm_one_shot(torch, a, wt, symm_buf, group_name, o)
        )
    if variant == "symm_mem_two_shot":  # o: in torch symmetric memory
        return LayerCalls(mm, lambda a, w, wt, o: ab.mm_two_shot(torch, a, wt, o, group_name))
    if variant == "distgemm_ar":
        return LayerCalls(mm, lambda a, w, wt, o: distgemm.gemm_all_reduce(a, w, out=o))
    if variant == "nccl_mm_sp":

        def column(x, w, wt, o):
            full = scratch[: x.shape[0] * dist.get_world_size()]
            custom_ops.all_gather_into(full, x)
            return torch.mm(full, wt, out=o)

        def row_sp(a, w, wt, o):
            partial = scratch[: a.shape[0]]
            torch.mm(a, wt, out=partial)
            custom_ops.reduce_scatter_into(o, partial)
            return o

        return LayerCalls(column, row_sp)
    if variant == "symm_mem_fused":
        from benchmarks.common.timing import symm_mem_call

        return LayerCalls(
            lambda x, w, wt, o: symm_mem_call(torch, True, x, wt, group_name),
            lambda a, w, wt, o: symm_mem_call(torch, False, a, wt, group_name),
        )
    if variant == "distgemm_sp":
        return LayerCalls(
            lambda x, w, wt, o: distgemm.all_gather_gemm(x, w, out=o),
            lambda a, w, wt, o: distgemm.gemm_reduce_scatter(a, w, out=o),
        )
    raise ValueError(f"unknown variant {variant!r}")


def make_step(variant: str, ops: StackOperands, bufs, tokens: int, calls: LayerCalls):
    """One step of the stack at ``tokens`` tokens: a callable returning the outputs of every
    layer, in the order (qkv, o, fc1, fc2) per layer."""
    layout = LAYOUT[variant] or "ar"
    m, rows = tokens, tokens if layout == "ar" else tokens // ops.tp
    x0 = ops.x0[:m] if layout == "ar" else rows_of(ops.x0[:m], ops.rank, ops.tp)

    def step() -> list[torch.Tensor]:
        outs = []
        x = x0
        for i in range(ops.depth):
            qkv = calls.column(x, ops.w["QKV"][i], ops.wt["QKV"][i], bufs["qkv"][i][:m])
            o = calls.row(ops.attn[i][:m], ops.w["O"][i], ops.wt["O"][i], bufs["o"][i][:rows])
            f1 = calls.column(o, ops.w["FC1"][i], ops.wt["FC1"][i], bufs["fc1"][i][:m])
            x = calls.row(ops.act[i][:m], ops.w["FC2"][i], ops.wt["FC2"][i], bufs["fc2"][i][:rows])
            outs += [qkv, o, f1, x]
        return outs

    return step


def reference_outputs(ops: StackOperands, tokens: int, layout: str) -> list[torch.Tensor]:
    """The stack in fp32 on one process from the full tensors (the same seed), cut to what
    this rank's step returns in ``layout``: the reference of the CPU smoke test."""
    dims, tp, rank = ops.dims, ops.tp, ops.rank
    x = full_input(dims, ops.max_tokens, "cpu", ops.x0.dtype)[:tokens].float()
    outs = []
    for i in range(ops.depth):
        full = {
            k: v.float()
            for k, v in full_layer(dims, i, ops.max_tokens, "cpu", ops.x0.dtype).items()
        }
        qkv = x @ full["QKV"].t()
        o = full["attn"][:tokens] @ full["O"].t()
        f1 = o @ full["FC1"].t()
        x = full["act"][:tokens] @ full["FC2"].t()
        keep = (lambda t: t) if layout == "ar" else (lambda t: rows_of(t, rank, tp))
        outs += [cols_of(qkv, rank, tp), keep(o), cols_of(f1, rank, tp), keep(x)]
    return outs


def max_rel_err(got, ref) -> float:
    """The worst relative Frobenius error over paired tensors (NaN where one is not finite)."""
    worst = 0.0
    for g, r in zip(got, ref, strict=True):
        g, r = g.float(), r.float()
        if not bool(torch.isfinite(g).all()):
            return math.nan
        worst = max(worst, float((g - r).norm() / r.norm().clamp_min(1e-30)))
    return worst


def plan_errors(dims, tp: int, tokens: int) -> dict[str, Any]:
    """distgemm's plan of each stack layer in both layouts at ``tokens`` on the CPU reference
    executor: ``{"<layout> <layer>": error or the rejection reason}`` (column layers of the
    all-reduce layout are local GEMMs, without a plan)."""
    res: dict[str, Any] = {}
    for la in STACK_LAYERS:
        n, k = dims[la]
        for layout in ("ar", "sp"):
            if layout == "ar" and la in COLUMN:
                continue
            schedule = AR_SCHEDULE if layout == "ar" else SCHEDULE[la]
            err, why = runtime.plan_reference_error(schedule, tp, tokens, n, k)
            res[f"{layout} {la}"] = err if why is None else why
    return res
