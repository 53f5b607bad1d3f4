"""FP8 scale arguments of an op call, checked at the boundary (``validate_scales``): their kinds.

An FP8 GEMM computes ``D = bf16(sa[m] * sb[n] * sum_k A[m, k] B[n, k] + ...)`` with A and B in
``torch.float8_e4m3fn``. Each scale is float32 on the inputs' device, and either tensor-wise (one
value: shape ``[]``, ``[1]`` or ``[1, 1]``) or row-wise (one value per local row of its operand:
``[rows]`` or ``[rows, 1]``). Row-wise scales become the plan's ``row_scale_a`` / ``row_scale_b``
(``distgemm.build_plan``); tensor-wise ones need nothing from the plan. bf16 and fp16 calls take
no scales.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .validate import fmt_shape

__all__ = [
    "FP8_DTYPE",
    "E4M3_MAX",
    "ScaleKind",
    "validate_scales",
    "quantize",
    "dequantize",
    "scaled_mm_scales",
]

# The one FP8 format distgemm multiplies.
FP8_DTYPE = torch.float8_e4m3fn
# Every torch FP8 dtype, so that the others are refused by name rather than as unknown.
_FP8_DTYPES = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
)
_TENSOR_WISE_SHAPES = ((), (1,), (1, 1))

NONE, TENSOR, ROW = "none", "tensor", "row"


@dataclass(frozen=True)
class ScaleKind:
    """How each operand is scaled: ``"none"`` (bf16/fp16), ``"tensor"`` or ``"row"``."""

    a: str = NONE
    b: str = NONE

    @property
    def fp8(self) -> bool:
        return self.a != NONE

    @property
    def row_scale_a(self) -> bool:
        return self.a == ROW

    @property
    def row_scale_b(self) -> bool:
        return self.b == ROW


def _supported() -> str:
    return (
        f"distgemm multiplies {FP8_DTYPE} A and B with float32 scale_a and scale_b, or bf16/fp16 "
        "A and B without scales"
    )


def _kind(op: str, name: str, scale, operand: torch.Tensor, rows: int, what: str) -> str:
    """The kind of one scale argument, after checking its type, dtype, device and shape."""
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(scale).__name__}")
    if scale.dtype != torch.float32:
        raise TypeError(f"{op}: {name} has dtype {scale.dtype}; scales are torch.float32")
    if scale.device != operand.device:
        raise ValueError(
            f"{op}: {name} is on {scale.device} but {what} is on {operand.device}; "
            "put the scales on the inputs' device"
        )
    shape = tuple(scale.shape)
    if shape in _TENSOR_WISE_SHAPES:
        return TENSOR
    if shape in ((rows,), (rows, 1)):
        return ROW
    raise ValueError(
        f"{op}: {name} has shape {fmt_shape(shape)}; accepted: tensor-wise [], [1] or [1, 1], "
        f"or row-wise [{rows}] or [{rows}, 1] (one float per row of {what}, {rows} rows here)"
    )


def validate_scales(
    op: str,
    a: torch.Tensor,
    w: torch.Tensor,
    scale_a: torch.Tensor | None,
    scale_b: torch.Tensor | None,
    *,
    a_rows: int,
    w_rows: int,
) -> ScaleKind:
    """The scale kinds of an op call with inputs ``a`` (``a_rows`` local rows) and weight ``w``
    (``w_rows`` local rows). FP8 calls need both inputs in ``torch.float8_e4m3fn`` and both
    scales; bf16/fp16 calls take none. TypeError for unsupported dtypes (named, with what is
    supported), ValueError for a missing or extra scale, a scale on another device or of a shape
    that is neither tensor-wise nor row-wise (the shape seen and the shapes accepted)."""
    fp8 = [t.dtype in _FP8_DTYPES for t in (a, w)]
    if any(fp8) and (a.dtype != FP8_DTYPE or w.dtype != FP8_DTYPE):
        raise TypeError(f"{op}: a is {a.dtype} and w is {w.dtype}; {_supported()}")
    given = [n for n, s in (("scale_a", scale_a), ("scale_b", scale_b)) if s is not None]
    if not any(fp8):
        if given:
            raise ValueError(
                f"{op}: {' and '.join(given)} given for {a.dtype} inputs; scales apply to "
                f"{FP8_DTYPE} inputs only ({_supported()})"
            )
        return ScaleKind()
    missing = [n for n in ("scale_a", "scale_b") if n not in given]
    if missing:
        raise ValueError(
            f"{op}: {FP8_DTYPE} inputs need scale_a and scale_b, {' and '.join(missing)} "
            "missing (float32: tensor-wise [] or [1], or row-wise, one per row)"
        )
    return ScaleKind(
        a=_kind(op, "scale_a", scale_a, a, a_rows, "a"),
        b=_kind(op, "scale_b", scale_b, w, w_rows, "w"),
    )


# The largest finite e4m3 value: quantize maps each row's (the tensor's) largest magnitude there.
E4M3_MAX = 448.0


def quantize(x: torch.Tensor, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values, float32 scales) with ``x ~ q * scale``: one scale per row (``[rows]``) or
    one for the tensor (``[1]``), each putting the largest magnitude at E4M3_MAX."""
    x = x.float()
    amax = x.abs().amax(dim=1) if rowwise else x.abs().amax().reshape(1)
    scale = (amax / E4M3_MAX).clamp_min(1e-12)
    return (x / (scale[:, None] if rowwise else scale)).to(FP8_DTYPE), scale.contiguous()


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 ``scale * q`` for a tensor-wise ([1]) or row-wise ([rows]) scale."""
    return q.float() * (scale[:, None] if scale.numel() > 1 else scale)


def scaled_mm_scales(x_scale, y_scale, x_rows: int, y_rows: int):
    """torch._scaled_mm's forms of two distgemm scales: ([x_rows, 1], [1, y_rows]) where either
    is row-wise (torch takes row-wise scales for both operands or for neither, so a tensor-wise
    one is broadcast to every row), else two 0-d scalars."""
    if x_scale.numel() > 1 or y_scale.numel() > 1:
        return (
            x_scale.reshape(-1, 1).expand(x_rows, 1).contiguous(),
            y_scale.reshape(1, -1).expand(1, y_rows).contiguous(),
        )
    return x_scale.reshape(()), y_scale.reshape(())
