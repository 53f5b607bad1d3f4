"""The fp8 drop-ins' argument checks: dtypes, scale kinds and dims, named in torch's words.

``compat.symm_mem_fp8`` calls them before deciding whether distgemm serves a call; each raises
TypeError or ValueError naming the argument, the constraint and the values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..runtime.scales import FP8_DTYPE
from .symm_mem import REDUCE_OPS, normalise_dim

OUT_DTYPE = torch.bfloat16  # what distgemm's fp8 GEMMs write
TENSOR_WISE, ROW_SHARDED, ROW_REPLICATED = "tensor-wise", "row-wise-sharded", "row-wise-replicated"


def as_dtypes(dtypes) -> list[torch.dtype | None]:
    """``out_dtypes`` as torch.dtype (None kept): the dispatcher hands a ``ScalarType?[]`` to
    the op as ScalarType numbers (15 for bfloat16), which compare unequal to every dtype. An
    aten factory on the meta device maps a number to its dtype, as only the dispatcher can."""
    return [
        d if d is None or isinstance(d, torch.dtype)
        else torch.ops.aten.empty.memory_format([0], dtype=d, device="meta").dtype
        for d in dtypes
    ]  # fmt: skip


def validate_fp8(op: str, tensors: dict[str, torch.Tensor]) -> None:
    for name, t in tensors.items():
        if t.dtype != FP8_DTYPE:
            raise TypeError(
                f"{op}: {name} is {t.dtype}; this drop-in takes {FP8_DTYPE} A and B, the fp8 "
                "format distgemm multiplies (bf16/fp16: distgemm.compat.symm_mem's "
                "fused_all_gather_matmul / fused_matmul_reduce_scatter)"
            )


def validate_scale_dtype(op: str, name: str, scale) -> None:
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(scale).__name__}")
    if scale.dtype != torch.float32:
        raise TypeError(f"{op}: {name} has dtype {scale.dtype}; scales are torch.float32")


def b_scale_row_wise(op: str, name: str, scale: torch.Tensor, n: int) -> bool:
    """Whether B's scale is row-wise (``[1, N]``) rather than tensor-wise (one value)."""
    validate_scale_dtype(op, name, scale)
    if scale.numel() == 1:
        return False
    if tuple(scale.shape) == (1, n):
        return True
    raise ValueError(
        f"{op}: {name} has shape {list(scale.shape)}; accepted: one value (tensor-wise) or "
        f"[1, {n}] (row-wise, one per column of B)"
    )


def validate_both_row_wise(op: str, a_row: bool, b_row: bool, b_name: str) -> None:
    if a_row != b_row:
        raise ValueError(
            f"{op}: A_scale is {'row' if a_row else 'tensor'}-wise and {b_name} is "
            f"{'row' if b_row else 'tensor'}-wise; torch._scaled_mm takes row-wise scales for "
            "both A and B or for neither"
        )


def a_scale_mode(op: str, A_shard: torch.Tensor, A_scale, gather_dim: int, tp: int) -> str:
    """The kind of the all-gather's A_scale, decided in torch's order (a ``[..., 1]`` scale
    that fits both the shard and the gathered A is this rank's rows)."""
    validate_scale_dtype(op, "A_scale", A_scale)
    shard = list(A_shard.shape)
    full = shard[:gather_dim] + [shard[gather_dim] * tp] + shard[gather_dim + 1 :]
    shape = list(A_scale.shape)
    if shape[:-1] == shard[:-1] and shape[-1:] == [1]:
        return ROW_SHARDED
    if A_scale.numel() == 1:
        return TENSOR_WISE
    if shape[:-1] == full[:-1] and shape[-1:] == [1]:
        return ROW_REPLICATED
    raise ValueError(
        f"{op}: A_scale has shape {shape}; accepted: one value (tensor-wise), "
        f"{shard[:-1] + [1]} (row-wise, this rank's rows, gathered with them) or "
        f"{full[:-1] + [1]} (row-wise, the gathered A's rows)"
    )


def fp8_weight(Bs: Sequence[torch.Tensor]) -> torch.Tensor:
    """torch's ``B [K, N]`` (one or several, concatenated along N) as distgemm's K-contiguous
    fp8 weight ``[N, K]``: ``B.t()`` in place where it is contiguous, else a copy."""
    if len(Bs) > 1:
        return torch.cat([B.t() for B in Bs])
    w = Bs[0].t()
    return w if w.is_contiguous() else w.contiguous()


def fp8_scale_b(Bs, B_scales) -> torch.Tensor:
    """distgemm's scale_b: ``[1]`` or ``[N]``; several Bs' scales concatenated along N, a
    tensor-wise one repeated over its B's columns."""
    if len(Bs) == 1:
        return B_scales[0].reshape(-1).contiguous()
    return torch.cat([s.reshape(-1).expand(B.shape[1]) for B, s in zip(Bs, B_scales)])


# ---------------------------------------------------------------------------------------------
# fused_all_gather_scaled_matmul


def validate_all_gather(A_shard, Bs, A_scale, B_scales, gather_dim, tp, lists) -> tuple[int, str]:
    """TypeError / ValueError naming the values for operands torch's op refuses; the gather
    dim >= 0 and A_scale's kind."""
    op = "fused_all_gather_scaled_matmul"
    if A_shard.dim() < 2:
        raise ValueError(f"{op}: A_shard must have at least 2 dims, got {list(A_shard.shape)}")
    for name, values in dict(B_scales=B_scales, **lists).items():
        if len(values) != len(Bs):
            raise ValueError(f"{op}: len({name})={len(values)} must equal len(Bs)={len(Bs)}")
    gather_dim = normalise_dim(gather_dim, A_shard.dim(), "gather_dim")
    if gather_dim == A_shard.dim() - 1:
        raise ValueError(
            f"{op}: gather_dim={gather_dim} is A_shard's last dim (K); torch's op gathers a "
            "leading dim (its reference flattens the gathered dim into rows)"
        )
    validate_fp8(op, {"A_shard": A_shard, **{f"Bs[{i}]": B for i, B in enumerate(Bs)}})
    mode = a_scale_mode(op, A_shard, A_scale, gather_dim, tp)
    for i, (B, s) in enumerate(zip(Bs, B_scales)):
        if B.dim() != 2 or B.shape[0] != A_shard.shape[-1]:
            raise ValueError(
                f"{op}: Bs[{i}] has shape {list(B.shape)}; it must be [K, N] with "
                f"K={A_shard.shape[-1]}"
            )
        row_b = b_scale_row_wise(op, f"B_scales[{i}]", s, B.shape[1])
        validate_both_row_wise(op, mode != TENSOR_WISE, row_b, f"B_scales[{i}]")
    return gather_dim, mode


def validate_reduce_scatter(
    A, B, A_scale, B_scale, reduce_op, orig_scatter_dim, scatter_dim_after_maybe_reshape,
    output_shape, tp,
) -> tuple[int, list[int]]:  # fmt: skip
    """TypeError / ValueError naming the values for operands torch's op refuses; the scatter
    dim of the output >= 0 and the output shape before the scatter."""
    op = "fused_scaled_matmul_reduce_scatter"
    if reduce_op not in REDUCE_OPS:
        raise ValueError(f"{op}: reduce_op={reduce_op!r} is not one of {REDUCE_OPS}")
    if A.dim() < 2:
        raise ValueError(f"{op}: A must have at least 2 dims, got {list(A.shape)}")
    if B.dim() != 2 or B.shape[0] != A.shape[-1]:
        raise ValueError(
            f"{op}: B has shape {list(B.shape)}; it must be [K, N] with K=A.shape[-1]={A.shape[-1]}"
        )
    normalise_dim(scatter_dim_after_maybe_reshape, A.dim(), "scatter_dim_after_maybe_reshape")
    if output_shape is None:
        raise ValueError(f"{op}: output_shape is required (the shape of A @ B before the scatter)")
    shape = [int(s) for s in output_shape]
    rows = math.prod(A.shape[:-1])
    if len(shape) < 2 or shape[-1] != B.shape[1] or math.prod(shape[:-1]) != rows:
        raise ValueError(
            f"{op}: output_shape={shape} must be [..., N={B.shape[1]}] with "
            f"{rows} rows (A's leading dims {list(A.shape[:-1])})"
        )
    dim = normalise_dim(orig_scatter_dim, len(shape), "orig_scatter_dim")
    if shape[dim] % tp:
        raise ValueError(f"{op}: output_shape[{dim}]={shape[dim]} is not divisible by tp={tp}")
    validate_fp8(op, {"A": A, "B": B})
    validate_scale_dtype(op, "A_scale", A_scale)
    if A_scale.numel() == 1:
        row_a = False
    elif list(A_scale.shape) == [*A.shape[:-1], 1]:
        row_a = True
    else:
        raise ValueError(
            f"{op}: A_scale has shape {list(A_scale.shape)}; accepted: one value (tensor-wise) "
            f"or {[*A.shape[:-1], 1]} (row-wise, one per row of A)"
        )
    validate_both_row_wise(
        op, row_a, b_scale_row_wise(op, "B_scale", B_scale, B.shape[1]), "B_scale"
    )
    return dim, shape
