"""Drop-ins for torch's fp8 fused symm_mem ops, backed by distgemm's fp8 ops where the call maps.

``torch.ops.symm_mem.fused_all_gather_scaled_matmul`` and
``torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter``: the same signatures, results, dtypes,
shapes and strides, backed by distgemm's fp8 ops where the call maps to them.

Plain torch equivalents (``group`` the process group named ``group_name``, TP its size,
``mm(X, B, sa, sb, ...)`` is ``torch._scaled_mm(X.flatten(0, -2), B, sa, sb, ...)`` with X's
leading dims restored)::

    A = all_gather(A_shard, dim=gather_dim)                 # A_shard [..., K] float8_e4m3fn
    fused_all_gather_scaled_matmul(A_shard, Bs, A_scale, B_scales, gather_dim, ...)
        == (A, [mm(A, B_i, A_scale (gathered with A's rows), B_scales[i], biases[i],
                   result_scales[i], out_dtypes[i], use_fast_accum[i])])      # B_i [K, N_i]
    fused_scaled_matmul_reduce_scatter(A, B, A_scale, B_scale, op, dim, _, group_name,
                                       output_shape, bias, result_scale, out_dtype, fast)
        == reduce_scatter(mm(A, B, ...).view(output_shape), op, dim)           # A [..., K]

Scales are float32, as torch._scaled_mm takes them: tensor-wise (one value) for A and B, or
row-wise for both: ``B_scale [1, N]``; ``A_scale [*A.shape[:-1], 1]``, for the all-gather either
this rank's rows (``[*A_shard.shape[:-1], 1]``, gathered with them) or every rank's
(``[*A.shape[:-1], 1]``, the gathered A's). ``out_dtype=None`` means A's dtype (fp8 output), as
in torch._scaled_mm.

Where distgemm runs: CUDA tensors, float8_e4m3fn A and B, bf16 outputs, no result scale, K and N
multiples of 16, the dims as the bf16 drop-ins map them (``compat.symm_mem``: a gather or scatter
dim moved to the front, a scatter of N as ``rs_tile_b`` at S = TP), every ``use_fast_accum`` of
the all-gather alike, no reduce-scatter bias. Row scales become distgemm's ``[rows]`` /
``[N]`` (a rank's slice of replicated A scales; several Bs' scales concatenated, tensor-wise
ones expanded to rows), the weight distgemm's K-contiguous ``[N, K]`` (``B.t()``, copied unless
already contiguous). Everything else runs the plain collective + ``torch._scaled_mm`` (fp8
gathered as bytes, which every backend moves); ``fallback_reason`` says why. torch refuses a
gather of K here (its reference flattens the gathered dim into rows), so do these.
``all_gather_scaled_matmul_reason`` / ``scaled_matmul_reduce_scatter_reason`` give the reason
for one call, from the op's arguments (``compat.async_tp`` routes torch's ops by them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .. import ops
from .custom_ops import all_gather_into, group_of, group_size, reduce_scatter_into
from .fp8_arguments import (
    OUT_DTYPE,
    ROW_REPLICATED,
    ROW_SHARDED,
    TENSOR_WISE,
    as_dtypes,
    fp8_scale_b,
    fp8_weight,
    validate_all_gather,
    validate_reduce_scatter,
)
from .symm_mem import fallback_reason, row_major

__all__ = [
    "fused_all_gather_scaled_matmul",
    "fused_scaled_matmul_reduce_scatter",
    "all_gather_fallback_reason",
    "reduce_scatter_fallback_reason",
    "all_gather_scaled_matmul_reason",
    "scaled_matmul_reduce_scatter_reason",
]


def all_gather_fallback_reason(
    A_shard, Bs, tp, biases, result_scales, out_dtypes, use_fast_accum
) -> str | None:
    """Why distgemm cannot serve this fused_all_gather_scaled_matmul call (checked operands),
    None when it can."""
    n_total = sum(B.shape[1] for B in Bs)
    extents = {"K": A_shard.shape[-1], "sum of N": n_total}
    reason = fallback_reason([A_shard, *Bs], tp, extents, fp8=True)
    if reason is not None:
        return reason
    for i, (dtype, result_scale) in enumerate(zip(out_dtypes, result_scales)):
        if dtype != OUT_DTYPE:
            meaning = " (A's dtype, fp8)" if dtype is None else ""
            return f"out_dtypes[{i}]={dtype}{meaning}: distgemm's fp8 GEMMs write {OUT_DTYPE}"
        if result_scale is not None:
            return f"result_scales[{i}] is given: distgemm's fp8 GEMMs take no result scale"
    if len({bool(f) for f in use_fast_accum}) > 1:
        return f"use_fast_accum={list(use_fast_accum)} differs: distgemm runs the Bs as one GEMM"
    for i, (B, bias) in enumerate(zip(Bs, biases)):
        if bias is not None and (bias.dtype != OUT_DTYPE or list(bias.shape) != [B.shape[1]]):
            return (
                f"biases[{i}] is {bias.dtype} {list(bias.shape)}: distgemm adds a "
                f"{OUT_DTYPE} [N] bias"
            )
    return None


def all_gather_scaled_matmul_reason(
    A_shard, Bs, A_scale, B_scales, gather_dim, group_name, biases, result_scales, out_dtypes,
    use_fast_accum,
) -> str | None:  # fmt: skip
    """Why ``fused_all_gather_scaled_matmul`` with these arguments (its own signature) runs the
    plain collective + torch._scaled_mm instead of distgemm, None when distgemm serves it;
    TypeError / ValueError as the op raises them."""
    tp = group_size(group_name)
    out_dtypes = as_dtypes(out_dtypes)
    lists = dict(
        biases=biases, result_scales=result_scales, out_dtypes=out_dtypes,
        use_fast_accum=use_fast_accum,
    )  # fmt: skip
    validate_all_gather(A_shard, Bs, A_scale, B_scales, gather_dim, tp, lists)
    return all_gather_fallback_reason(
        A_shard, Bs, tp, biases, result_scales, out_dtypes, use_fast_accum
    )


_AG_SCHEMA = (
    "(Tensor A_shard, Tensor[] Bs, Tensor A_scale, Tensor[] B_scales, int gather_dim, "
    "str group_name, Tensor?[] biases, Tensor?[] result_scales, ScalarType?[] out_dtypes, "
    "bool[] use_fast_accum) -> (Tensor, Tensor[])"
)


def all_gather_scaled_matmul(
    A_shard: torch.Tensor,
    Bs: list[torch.Tensor],
    A_scale: torch.Tensor,
    B_scales: list[torch.Tensor],
    gather_dim: int,
    group_name: str,
    biases: list[torch.Tensor | None],
    result_scales: list[torch.Tensor | None],
    out_dtypes: list[torch.dtype | None],
    use_fast_accum: list[bool],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``A = all_gather(A_shard, gather_dim)`` and ``torch._scaled_mm(A, B_i, ...)`` for each
    ``B_i`` in ``Bs``.

    Per-rank shapes: ``A_shard``: ``[..., K]`` float8_e4m3fn, dim ``gather_dim`` (not the last)
    this rank's slice (rank r holds slice r); ``Bs``: ``[K, N_i]`` float8_e4m3fn (``B_i.t()``
    contiguous is read in place); ``A_scale``: float32, one value, ``[*A_shard.shape[:-1], 1]``
    or ``[*A.shape[:-1], 1]``; ``B_scales[i]``: one value or ``[1, N_i]`` (row-wise with a
    row-wise A_scale only); ``biases[i]``: ``[N_i]`` or None; ``result_scales[i]``: a float32
    scalar or None; ``out_dtypes[i]``: None (fp8) or a dtype; ``use_fast_accum[i]``: bool.
    Returns ``(A, [out_i])``, ``A`` the gathered float8_e4m3fn ``[..., K]``, ``out_i``
    ``[..., N_i]`` in ``out_dtypes[i]``, strides as torch's op returns them. No autograd, as
    torch's op; the torch.library op ``torch.ops.distgemm.fused_all_gather_scaled_matmul``
    (below, with a fake kernel) runs it.
    """
    group = group_of(group_name)
    tp = group.size()
    out_dtypes = as_dtypes(out_dtypes)
    lists = dict(
        biases=biases, result_scales=result_scales, out_dtypes=out_dtypes,
        use_fast_accum=use_fast_accum,
    )  # fmt: skip
    gather_dim, mode = validate_all_gather(A_shard, Bs, A_scale, B_scales, gather_dim, tp, lists)
    reason = all_gather_fallback_reason(
        A_shard, Bs, tp, biases, result_scales, out_dtypes, use_fast_accum
    )
    if reason is not None:
        return _all_gather_collective(
            A_shard, A_scale, mode, gather_dim, group, Bs, B_scales, lists
        )
    k = A_shard.shape[-1]
    # Rows of A_shard with the gathered dim first: rank r's rows follow rank r-1's.
    a_rows = A_shard.movedim(gather_dim, 0).contiguous()
    moved_shape = (tp * a_rows.shape[0], *a_rows.shape[1:-1])
    if mode == TENSOR_WISE:
        scale_a = A_scale.reshape(-1).contiguous()
    else:
        scale_a = A_scale.movedim(gather_dim, 0).reshape(-1)
        if mode == ROW_REPLICATED:  # this rank's rows: distgemm gathers them with A's
            scale_a = scale_a.chunk(tp)[group.rank()]
        scale_a = scale_a.contiguous()
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b if b is not None else B.new_zeros(B.shape[1], dtype=OUT_DTYPE)
                          for B, b in zip(Bs, biases)])  # fmt: skip
    out, a = ops.all_gather_gemm(
        a_rows.view(-1, k), fp8_weight(Bs), bias=bias, scale_a=scale_a,
        scale_b=fp8_scale_b(Bs, B_scales), fast_accum=bool(use_fast_accum[0]),
        return_gathered=True, group=group,
    )  # fmt: skip
    outs = out.split([B.shape[1] for B in Bs], dim=1) if len(Bs) > 1 else (out,)
    results = [o.contiguous().view(*moved_shape, o.shape[1]).movedim(0, gather_dim) for o in outs]
    return a.view(*moved_shape, k).movedim(0, gather_dim), results


# all_gather_scaled_matmul as the torch.library op torch.ops.distgemm.fused_all_gather_scaled_matmul
# (one node under torch.compile); compat.async_tp's router calls the function itself.
fused_all_gather_scaled_matmul = torch.library.custom_op(
    "distgemm::fused_all_gather_scaled_matmul", mutates_args=(), schema=_AG_SCHEMA
)(all_gather_scaled_matmul)


@fused_all_gather_scaled_matmul.register_fake
def _(A_shard, Bs, A_scale, B_scales, gather_dim, group_name, biases, result_scales,
      out_dtypes, use_fast_accum):  # fmt: skip
    tp = group_of(group_name).size()
    lists = dict(
        biases=biases, result_scales=result_scales, out_dtypes=as_dtypes(out_dtypes),
        use_fast_accum=use_fast_accum,
    )  # fmt: skip
    gather_dim, mode = validate_all_gather(A_shard, Bs, A_scale, B_scales, gather_dim, tp, lists)
    gathered = A_shard.new_empty((tp * A_shard.shape[0], *A_shard.shape[1:]))
    if mode == ROW_SHARDED:
        A_scale = A_scale.new_empty((tp * A_scale.shape[0], *A_scale.shape[1:]))
    return _torch_layout(
        gathered, A_scale, mode, A_shard.shape, gather_dim, tp, Bs, B_scales, lists
    )


def _all_gather_collective(A_shard, A_scale, mode, gather_dim, group, Bs, B_scales, lists):
    """The plain all-gather along dim 0 (fp8 as bytes; row scales of this rank's rows
    gathered with them) + torch._scaled_mm, laid out as torch's op lays it out."""
    tp = group.size()
    gathered = A_shard.new_empty((tp * A_shard.shape[0], *A_shard.shape[1:]))
    all_gather_into(gathered.view(torch.uint8), A_shard.contiguous().view(torch.uint8), group=group)
    if mode == ROW_SHARDED:
        scale = A_scale.new_empty((tp * A_scale.shape[0], *A_scale.shape[1:]))
        all_gather_into(scale, A_scale.contiguous(), group=group)
        A_scale = scale
    return _torch_layout(
        gathered, A_scale, mode, A_shard.shape, gather_dim, tp, Bs, B_scales, lists
    )


def _torch_layout(gathered, A_scale, mode, shard_shape, gather_dim, tp, Bs, B_scales, lists):
    """torch's reference steps from the ranks' stacked shards (and stacked row scales) to
    ``(A, [out_i])``: the same values, shapes and strides on real tensors (the collective path)
    and fake ones (the fake kernel)."""
    A = gathered.view(tp, *shard_shape).movedim(gather_dim + 1, 1).flatten(0, 1)
    if mode == ROW_SHARDED:
        A_scale = A_scale.view(tp, *shard_shape[:-1], 1).movedim(gather_dim + 1, 1)
        A_scale = A_scale.flatten(0, -2)
    elif mode == ROW_REPLICATED:
        A_scale = A_scale.movedim(gather_dim, 0).flatten(0, -2)
    rows = A.flatten(0, -2)
    results = [
        torch.ops.aten._scaled_mm(
            rows, B, A_scale, B_scale, bias, result_scale, out_dtype=dtype, use_fast_accum=fast
        )
        .unflatten(0, A.shape[:-1])
        .movedim(0, gather_dim)
        for B, B_scale, bias, result_scale, dtype, fast in zip(
            Bs,
            B_scales,
            *(lists[n] for n in ("biases", "result_scales", "out_dtypes", "use_fast_accum")),
        )
    ]
    return A.movedim(0, gather_dim), results


# ---------------------------------------------------------------------------------------------
# fused_scaled_matmul_reduce_scatter


def reduce_scatter_fallback_reason(
    A, B, tp, dim, shape, bias, result_scale, out_dtype
) -> str | None:
    """Why distgemm cannot serve this fused_scaled_matmul_reduce_scatter call (checked operands;
    ``dim``: the output's scatter dim, ``shape``: output_shape), None when it can."""
    k, n = A.shape[-1], B.shape[1]
    if dim == len(shape) - 1:  # rs_tile_b at S = TP: each step's N/TP columns are one GEMM
        reason = fallback_reason([A, B], tp, {"K": k, "N/tp": n // tp}, fp8=True)
    else:  # rs_tile_a: S is TP or 2*TP (default_steps), and M must split into S steps
        rows = math.prod(shape[:-1])
        reason = fallback_reason([A, B], tp, {"K": k, "N": n}, {"M": (rows, 2 * tp)}, fp8=True)
    if reason is not None:
        return reason
    if out_dtype != OUT_DTYPE:
        meaning = " (A's dtype, fp8)" if out_dtype is None else ""
        return f"out_dtype={out_dtype}{meaning}: distgemm's fp8 GEMMs write {OUT_DTYPE}"
    if result_scale is not None:
        return "result_scale is given: distgemm's fp8 GEMMs take no result scale"
    if bias is not None:
        return (
            "bias is given: torch's op adds it to every rank's partial before the reduction, "
            "distgemm once after it"
        )
    return None


def scaled_matmul_reduce_scatter_reason(
    A, B, A_scale, B_scale, reduce_op, orig_scatter_dim, scatter_dim_after_maybe_reshape,
    group_name, output_shape, bias=None, result_scale=None, out_dtype=None, use_fast_accum=False,
) -> str | None:  # fmt: skip
    """Why ``fused_scaled_matmul_reduce_scatter`` with these arguments (its own signature) runs
    torch._scaled_mm + the plain reduce-scatter instead of distgemm, None when distgemm serves
    it; TypeError / ValueError as the op raises them."""
    tp = group_size(group_name)
    dim, shape = validate_reduce_scatter(
        A, B, A_scale, B_scale, reduce_op, orig_scatter_dim, scatter_dim_after_maybe_reshape,
        output_shape, tp,
    )  # fmt: skip
    return reduce_scatter_fallback_reason(A, B, tp, dim, shape, bias, result_scale, out_dtype)


_RS_SCHEMA = (
    "(Tensor A, Tensor B, Tensor A_scale, Tensor B_scale, str reduce_op, int orig_scatter_dim, "
    "int scatter_dim_after_maybe_reshape, str group_name, SymInt[]? output_shape, "
    "Tensor? bias=None, Tensor? result_scale=None, ScalarType? out_dtype=None, "
    "bool use_fast_accum=False) -> Tensor"
)


def scaled_matmul_reduce_scatter(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    reduce_op: str,
    orig_scatter_dim: int,
    scatter_dim_after_maybe_reshape: int,
    group_name: str,
    output_shape: Sequence[int] | None,
    bias: torch.Tensor | None = None,
    result_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """``reduce_scatter(torch._scaled_mm(A, B, ...).view(output_shape), reduce_op,
    orig_scatter_dim)``.

    Per-rank shapes: ``A``: ``[..., K]`` float8_e4m3fn (this rank's partial operand); ``B``:
    ``[K, N]`` float8_e4m3fn; ``A_scale``: float32, one value or ``[*A.shape[:-1], 1]``;
    ``B_scale``: one value or ``[1, N]`` (row-wise with a row-wise A_scale only);
    ``output_shape``: the shape of ``A @ B`` before the scatter, ``[..., N]`` with A's rows
    (e.g. ``[BATCH, M, N]`` for a 2-D ``A [BATCH*M, K]``); ``orig_scatter_dim``: the dim of
    ``output_shape`` to scatter; ``scatter_dim_after_maybe_reshape``: the same dim in A's
    layout (checked, as torch's op does; the result does not depend on it). Returns the product
    reduced over the ranks (``"sum"`` or ``"avg"``) and split along ``orig_scatter_dim`` (rank r
    gets slice r), contiguous, in ``out_dtype`` (None: fp8). ``bias [N]`` is added to every
    rank's partial (as torch's op adds it). No autograd; the torch.library op
    ``torch.ops.distgemm.fused_scaled_matmul_reduce_scatter`` (below) runs it.
    """
    group = group_of(group_name)
    tp = group.size()
    dim, shape = validate_reduce_scatter(
        A, B, A_scale, B_scale, reduce_op, orig_scatter_dim, scatter_dim_after_maybe_reshape,
        output_shape, tp,
    )  # fmt: skip
    reason = reduce_scatter_fallback_reason(A, B, tp, dim, shape, bias, result_scale, out_dtype)
    if reason is not None:
        return _reduce_scatter_collective(
            A, B, A_scale, B_scale, reduce_op, dim, shape, group, bias, result_scale, out_dtype,
            use_fast_accum,
        )  # fmt: skip
    k, n = A.shape[-1], B.shape[1]
    lead = shape[:-1]
    fp8 = dict(scale_b=B_scale.reshape(-1).contiguous(), fast_accum=bool(use_fast_accum))
    if dim == len(shape) - 1:
        out = ops.gemm_reduce_scatter(
            A.reshape(-1, k).contiguous(), fp8_weight([B]),
            scale_a=A_scale.reshape(-1).contiguous(), schedule="rs_tile_b", steps=tp,
            group=group, **fp8,
        )  # fmt: skip
        out = out.view(*lead, n // tp)
    else:
        a_rows = A.reshape(*lead, k).movedim(dim, 0).contiguous()
        if A_scale.numel() > 1:
            scale_a = A_scale.reshape(*lead, 1).movedim(dim, 0).reshape(-1).contiguous()
        else:
            scale_a = A_scale.reshape(-1).contiguous()
        out = ops.gemm_reduce_scatter(
            a_rows.view(-1, k), fp8_weight([B]), scale_a=scale_a, group=group, **fp8
        )
        out = out.view(a_rows.shape[0] // tp, *a_rows.shape[1:-1], n)
        out = row_major(out.movedim(0, dim))
    return out.div_(tp) if reduce_op == "avg" else out


# scaled_matmul_reduce_scatter as the torch.library op
# torch.ops.distgemm.fused_scaled_matmul_reduce_scatter (one node under torch.compile);
# compat.async_tp's router calls the function itself.
fused_scaled_matmul_reduce_scatter = torch.library.custom_op(
    "distgemm::fused_scaled_matmul_reduce_scatter", mutates_args=(), schema=_RS_SCHEMA
)(scaled_matmul_reduce_scatter)


@fused_scaled_matmul_reduce_scatter.register_fake
def _(A, B, A_scale, B_scale, reduce_op, orig_scatter_dim, scatter_dim_after_maybe_reshape,
      group_name, output_shape, bias=None, result_scale=None, out_dtype=None,
      use_fast_accum=False):  # fmt: skip
    tp = group_of(group_name).size()
    dim, shape = validate_reduce_scatter(
        A, B, A_scale, B_scale, reduce_op, orig_scatter_dim, scatter_dim_after_maybe_reshape,
        output_shape, tp,
    )  # fmt: skip
    shape[dim] //= tp
    return A.new_empty(shape, dtype=out_dtype or A.dtype)


def _reduce_scatter_collective(
    A, B, A_scale, B_scale, reduce_op, dim, shape, group, bias, result_scale, out_dtype, fast
):
    """torch._scaled_mm + the plain reduce-scatter along ``dim`` of ``output_shape``, as
    torch's reference computes it; contiguous result."""
    tp = group.size()
    rows = A.reshape(-1, A.shape[-1]).contiguous()
    scale_a = A_scale.reshape(-1, 1).contiguous() if A_scale.numel() > 1 else A_scale
    product = torch.ops.aten._scaled_mm(
        rows, B, scale_a, B_scale, bias, result_scale, out_dtype=out_dtype, use_fast_accum=fast
    )
    partial = product.view(*shape[:-1], B.shape[1]).movedim(dim, 0).contiguous()
    out = partial.new_empty((partial.shape[0] // tp, *partial.shape[1:]))
    reduce_scatter_into(out, partial, group=group)
    out = row_major(out.movedim(0, dim))
    return out.div_(tp) if reduce_op == "avg" else out
