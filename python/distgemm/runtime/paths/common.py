"""What every path shares: the interface of a path's per-entry state, the per-call pointer checks.

A path's state (``PathState``) is made once, when the op entry is created, and runs every call of
that entry (``run``). The entry cache calls the other methods when the communicator's workspace
grows, when it looks for launch errors, when it reports memory and when it drops the entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..precision import Precision
from ..spec import Spec
from ..validate import ALIGN, fmt_shape, validate_placement

if TYPE_CHECKING:
    from ..communicator import Communicator
    from ..workspace import Workspace


@dataclass(eq=False)
class PathState:
    """One op entry's state on its path; the subclasses add their own."""

    spec: Spec
    precision: Precision
    beta: float
    want_gathered: bool  # all_gather_gemm(..., return_gathered=True)
    out_shape: torch.Size
    # Eager calls that retargeted one of this state's graphs at new pointers, and eager calls
    # enqueued without a graph (pointers seen for the first time, or that no graph is kept
    # for): the overlapped path's state counts them, the others have none.
    graph_retargets = 0
    direct_launches = 0

    @staticmethod
    def call_fields(spec: Spec, precision: Precision, beta: float, want_gathered: bool) -> dict:
        """The fields every path's state takes from its entry's call (the output's shape read
        from the spec once, at entry creation)."""
        return dict(
            spec=spec,
            precision=precision,
            beta=beta,
            want_gathered=want_gathered,
            out_shape=torch.Size(spec.shapes["out"]),
        )

    def run(self, op: str, comm: Communicator, tensors, out, capturing: bool):
        """One call on the current stream (recorded into its capture when ``capturing``)."""
        raise NotImplementedError(f"internal: {type(self).__name__} has no run()")

    def workspace_grown(
        self, comm: Communicator, ws: Workspace, capturing: bool, retired: list, kept: list
    ) -> None:
        """The communicator's workspace is now ``ws``: re-point what this state placed in the
        old one. Graphs that may still run go to ``retired`` (dropped after the next device
        synchronisation) or ``kept`` (callers' graphs replay them: kept until close)."""

    def launch_error(self) -> str:
        """'' or the first timeout report of this state's launches."""
        return ""

    @property
    def eager_graphs(self) -> int:
        return 0

    @property
    def captured(self) -> bool:
        """Whether a caller's CUDA graph recorded this state's work (its memory then stays
        until the communicator closes)."""
        return False

    def release(self) -> None:
        """Drop what this state holds (the device is synchronised by the caller)."""


def gathered_shape(spec: Spec) -> tuple[int, int]:
    """The whole all-gathered operand's shape of an all-gather plan."""
    return (spec.m if spec.plan.definition["rotating"] == "A" else spec.n, spec.k)


def _ptr(op: str, name: str, t: torch.Tensor, device: torch.device) -> int:
    """The data pointer of a tensor that passes validate_placement (the fast path of it)."""
    p = t.data_ptr()
    if p & (ALIGN - 1) or t.device != device or not t.is_contiguous():
        validate_placement(op, device, {name: t})
    return p


def _scale_ptr(op: str, name: str, t: torch.Tensor | None, device: torch.device) -> int:
    """The data pointer of an fp8 scale (0: none), on this rank's device."""
    if t is None:
        return 0
    if t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device} but this rank's device is {device}")
    return t.data_ptr()


def user_ptrs(op: str, state: PathState, tensors: dict[str, Any], out, device: torch.device):
    """The per-call checks of every path (the fast path of validate_placement, the output's
    shape, no aliasing with an input) and the output, allocated when not given. Returns
    ((a, w, c, out, bias, scale_a, scale_b) data pointers, 0 where absent; out)."""
    a, w = tensors["a"], tensors["w"]
    c = tensors.get("c")  # only passed when beta != 0
    bias = tensors.get("bias")
    pa = _ptr(op, "a_shard" if op == "all_gather_gemm" else "a", a, device)
    pw = _ptr(op, "w", w, device)
    pc = 0 if c is None else _ptr(op, "c", c, device)
    pb = 0 if bias is None else _ptr(op, "bias", bias, device)
    psa = _scale_ptr(op, "scale_a", tensors.get("scale_a"), device)
    psb = _scale_ptr(op, "scale_b", tensors.get("scale_b"), device)
    if out is None:
        out = torch.empty(state.out_shape, dtype=state.precision.out_dtype, device=device)
        return (pa, pw, pc, out.data_ptr(), pb, psa, psb), out
    po = _ptr(op, "out", out, device)
    if po in (pa, pw, pc, pb):
        name = {pa: "a", pw: "w", pc: "c", pb: "bias"}[po]
        raise ValueError(f"{op}: out shares memory with {name}; pass a separate output")
    if out.shape != state.out_shape:
        raise ValueError(
            f"{op}: out has shape {fmt_shape(out.shape)}, expected {fmt_shape(state.out_shape)}"
        )
    return (pa, pw, pc, po, pb, psa, psb), out
