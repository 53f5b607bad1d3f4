"""Checks of an op call's arguments at the boundary, before anything reaches the extension.

Operand types, empty operands (a token count of 0), placement (device, contiguity, TMA
alignment), the path argument and grad mode; each raises on the violated constraint with the
values. The extent and placement checks of an entry's first call run inside its creation, whose
signature exchange gives every rank the same error (``entry_cache.EntryCache.create``).
"""

from __future__ import annotations

import os

import torch

from .machine import FUSED_PATHS

DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
ALIGN = 16  # bytes: TMA needs 16-byte aligned bases and row strides


def fmt_shape(s) -> str:
    return "[" + ", ".join(str(x) for x in s) + "]"


def validate_types(op: str, tensors: dict[str, torch.Tensor | None]) -> torch.dtype:
    """Every given operand is a tensor, bf16 or fp16, all in one dtype, on a CUDA device.
    Returns the dtype. (Runs on every call: attribute reads only.)"""
    dtype = None
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        dt = t.dtype
        if dt is dtype:
            continue
        if dt not in DTYPES:
            raise TypeError(
                f"{op}: {name} has dtype {dt}; distgemm supports torch.bfloat16 and torch.float16"
            )
        if dtype is not None:
            raise TypeError(
                f"{op}: mixed dtypes: {first} is {dtype} but {name} is {dt}; "
                "pass every operand in one dtype"
            )
        dtype, first = dt, name
    for name, t in tensors.items():
        if t is not None and not t.is_cuda:
            raise ValueError(
                f"{op}: {name} is on {t.device}; distgemm ops need CUDA tensors on "
                "this rank's GPU (torch.cuda.current_device())"
            )
    return dtype


def validate_extents(op: str, a_name: str, a: torch.Tensor, w: torch.Tensor) -> None:
    """Neither GEMM operand is empty: ``a`` has at least one row (token, M) and one column (K),
    ``w`` at least one row (N) and one column (K). A batch of 0 tokens is an error, the same on
    every rank, rather than an empty result: skip the call on every rank instead. (Operands that
    are not 2-D are left to ``spec.make_spec``.)"""
    for name, t, dims in ((a_name, a, ("M", "K")), ("w", w, ("N", "K"))):
        if t.dim() != 2 or min(t.shape) > 0:
            continue
        i = 0 if t.shape[0] == 0 else 1
        tokens = " tokens" if (name == a_name and i == 0) else ""
        raise ValueError(
            f"{op}: {name} {fmt_shape(t.shape)} has 0 {('rows', 'columns')[i]} "
            f"({dims[i]}=0{tokens}); every rank must call it with M, N and K of at least 1: "
            "skip the call on every rank when the batch is empty"
        )


def n_major_weight(w: torch.Tensor) -> bool:
    """Whether the weight ``w`` ``[N, K]`` is the transposed view of a contiguous ``[K, N]``
    tensor (``x.t()``): the GEMM then reads it N-contiguous, without a copy."""
    return (
        w.dim() == 2
        and min(w.shape) > 1
        and not w.is_contiguous()
        and w.stride() == (1, w.shape[0])
    )


def validate_placement(
    op: str, device: torch.device, tensors: dict[str, torch.Tensor | None]
) -> None:
    """Every given operand lives on ``device``, is contiguous (the weight ``w`` may also be a
    transposed view, see ``n_major_weight``) and 16-byte aligned."""
    for name, t in tensors.items():
        if t is None:
            continue
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device} but this rank's device is {device}")
        if not t.is_contiguous() and not (name == "w" and n_major_weight(t)):
            raise ValueError(
                f"{op}: {name} is not contiguous (shape {list(t.shape)}, strides "
                f"{list(t.stride())}); distgemm takes dense row-major tensors (and a weight "
                f"that is the .t() view of one): pass {name}.contiguous()"
            )
        ptr = t.data_ptr()
        if ptr % ALIGN:
            raise ValueError(
                f"{op}: {name}'s data pointer {ptr:#x} is not {ALIGN}-byte aligned "
                f"(offset {ptr % ALIGN} bytes; TMA requires it): a view that starts "
                "at an odd element offset is the usual cause; pass a fresh tensor "
                "(.clone())"
            )


# The fused paths (FUSED_PATHS: "fused", "fused_two_shot") name the fused kernel's tail.
PATHS = ("auto", "overlap", "collective", *FUSED_PATHS)
# The path of calls that pass none: DISTGEMM_PATH at import, else "auto".
PATH_ENV = "DISTGEMM_PATH"
DEFAULT_PATH = os.environ.get(PATH_ENV, "auto")
# The ops that have a fused path (GEMM + all-reduce in one kernel, paths/fused.py).
FUSED_OPS = ("gemm_all_reduce",)


def validate_path(op: str, path) -> str:
    """``path`` (None: DEFAULT_PATH) names one of PATHS (ValueError otherwise); returns it.
    The fused paths only for FUSED_OPS: passed to another op they are a ValueError, set by
    DISTGEMM_PATH they mean "auto" there."""
    name = f"{PATH_ENV}=" if path is None else "path="
    from_env = path is None
    path = DEFAULT_PATH if path is None else path
    if path not in PATHS:
        raise ValueError(f"{op}: {name}{path!r} is not one of {', '.join(map(repr, PATHS))}")
    if path in FUSED_PATHS and op not in FUSED_OPS:
        if from_env:
            return "auto"
        raise ValueError(
            f"{op}: path={path!r} is only for {', '.join(FUSED_OPS)} (GEMM + all-reduce in one "
            "kernel); use 'auto', 'overlap' or 'collective'"
        )
    return path


def validate_no_grad(op: str, tensors: dict[str, torch.Tensor | None]) -> None:
    """The ops have no backward: refuse inputs that require grad while grad mode is on, rather
    than return a result autograd cannot see (a training step would silently get no weight
    gradient)."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise RuntimeError(
                f"{op}: {name} requires grad, but distgemm ops have no backward (autograd) yet: "
                "call them under torch.no_grad() or torch.inference_mode(), or pass "
                f"{name}.detach() and compute the gradient yourself"
            )
