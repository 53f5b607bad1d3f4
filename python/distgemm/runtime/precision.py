"""The precision of an op call, checked at the boundary (``validate_precision``): the input dtype,
for fp8 the kind of each scale and the accumulation mode, and the output dtype.

bf16 and fp16 calls take every operand in one dtype. fp8 calls take ``a`` and ``w`` in
``torch.float8_e4m3fn`` with float32 ``scale_a`` / ``scale_b`` (``runtime.scales``), and
``bias``, ``c`` and ``out`` in bf16, the output dtype of fp8 GEMMs here (as of torch's scaled
GEMMs by default). The Precision is part of a plan's cache key: calls that differ in it get
their own plans and graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .scales import FP8_DTYPE, ScaleKind, validate_scales
from .validate import DTYPES, validate_types

__all__ = ["Precision", "validate_precision", "FP8_OUT_DTYPE"]

FP8_OUT_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Precision:
    """``dtype``: A's and B's; ``scales``: each operand's scale kind (``runtime.scales``:
    "none" for bf16/fp16, "tensor" or "row"); ``fast_accum``: the fp8 fast-accumulation
    kernel."""

    dtype: torch.dtype
    scales: ScaleKind = ScaleKind()
    fast_accum: bool = False

    @property
    def fp8(self) -> bool:
        return self.dtype == FP8_DTYPE

    @property
    def out_dtype(self) -> torch.dtype:
        return FP8_OUT_DTYPE if self.fp8 else self.dtype

    @property
    def name(self) -> str:
        """The C++ runtime's dtype name (kernel::parse_dtype)."""
        return "e4m3" if self.fp8 else DTYPES[self.dtype]

    @property
    def row_scale_a(self) -> bool:
        return self.scales.row_scale_a

    @property
    def row_scale_b(self) -> bool:
        return self.scales.row_scale_b

    def __str__(self) -> str:
        if not self.fp8:
            return str(self.dtype)
        accum = ", fast_accum" if self.fast_accum else ""
        return f"{self.dtype} (scale_a {self.scales.a}-wise, scale_b {self.scales.b}-wise{accum})"


def validate_precision(
    op: str,
    inputs: dict[str, torch.Tensor],
    outputs: dict[str, torch.Tensor | None],
    scale_a,
    scale_b,
    fast_accum,
) -> Precision:
    """The Precision of a call with ``inputs`` (a, w: their names as the op calls them) and
    ``outputs`` (bias, c, out; None where absent). bf16/fp16: every tensor in one dtype and no
    scales (``validate_types``); fp8: both inputs e4m3 with their scales (``validate_scales``), the
    outputs bf16. TypeError / ValueError naming the constraint and the values."""
    if not isinstance(fast_accum, bool):
        raise TypeError(f"{op}: fast_accum must be a bool, got {fast_accum!r}")
    (a_name, a), (w_name, w) = inputs.items()
    for name, t in inputs.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    rows = [t.shape[0] if t.dim() > 0 else 1 for t in (a, w)]
    kind = validate_scales(op, a, w, scale_a, scale_b, a_rows=rows[0], w_rows=rows[1])
    if not kind.fp8:
        if fast_accum:
            raise ValueError(f"{op}: fast_accum=True is for {FP8_DTYPE} inputs; a is {a.dtype}")
        return Precision(validate_types(op, dict(inputs, **outputs)))
    for name, t in (*inputs.items(), ("scale_a", scale_a), ("scale_b", scale_b)):
        if not t.is_cuda:
            raise ValueError(
                f"{op}: {name} is on {t.device}; distgemm ops need CUDA tensors on this rank's "
                "GPU (torch.cuda.current_device())"
            )
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not t.is_contiguous():
            raise ValueError(f"{op}: {name} is not contiguous (strides {list(t.stride())})")
    out_dtype = validate_types(op, outputs)
    if out_dtype not in (None, FP8_OUT_DTYPE):
        given = [n for n, t in outputs.items() if t is not None]
        raise TypeError(
            f"{op}: {', '.join(given)} {'is' if len(given) == 1 else 'are'} {out_dtype}; with "
            f"{FP8_DTYPE} inputs distgemm writes {FP8_OUT_DTYPE} (bias, c and out in "
            f"{FP8_OUT_DTYPE})"
        )
    return Precision(FP8_DTYPE, kind, fast_accum)
