"""The overlapped path of one call: the per-call checks of the user tensors, this rank's graph
for their pointers, one graph launch on the current stream (inside a stream capture: the graph's
nodes recorded into the caller's graph)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from . import _core
from .entries import Entry, capture_graph, graph_for
from .validation import ALIGN, check_placement, fmt_shape

if TYPE_CHECKING:
    from .comm import Communicator

# torch's current raw stream as an int without building a Stream object (about 2 us less per
# call); the public API where this private binding is missing.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_ptr(device: torch.device) -> int:
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def _ptr(op: str, name: str, t: torch.Tensor, device: torch.device) -> int:
    """The data pointer of a tensor that passes check_placement (the fast path of it)."""
    p = t.data_ptr()
    if p & (ALIGN - 1) or t.device != device or not t.is_contiguous():
        check_placement(op, device, {name: t})
    return p


def _scale_ptr(op: str, name: str, t: torch.Tensor | None, device: torch.device) -> int:
    """The data pointer of an fp8 scale (0: none), on this rank's device."""
    if t is None:
        return 0
    if t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device} but this rank's device is {device}")
    return t.data_ptr()


def user_ptrs(op: str, entry: Entry, tensors, out, device):
    """The per-call checks of both paths (the fast path of check_placement, the output's shape,
    no aliasing with an input) and the output, allocated when not given. Returns
    ((a, w, c, out, bias, scale_a, scale_b) data pointers, 0 where absent; out)."""
    a, w = tensors["a"], tensors["w"]
    c = tensors.get("c")  # only passed when beta != 0 (_gemm_then_reduce)
    bias = tensors.get("bias")
    pa = _ptr(op, "a_shard" if op == "all_gather_gemm" else "a", a, device)
    pw = _ptr(op, "w", w, device)
    pc = 0 if c is None else _ptr(op, "c", c, device)
    pb = 0 if bias is None else _ptr(op, "bias", bias, device)
    psa = _scale_ptr(op, "scale_a", tensors.get("scale_a"), device)
    psb = _scale_ptr(op, "scale_b", tensors.get("scale_b"), device)
    if out is None:
        out = torch.empty(entry.out_shape, dtype=entry.out_dtype, device=device)
        return (pa, pw, pc, out.data_ptr(), pb, psa, psb), out
    po = _ptr(op, "out", out, device)
    if po in (pa, pw, pc, pb):
        name = {pa: "a", pw: "w", pc: "c", pb: "bias"}[po]
        raise ValueError(f"{op}: out shares memory with {name}; pass a separate output")
    if out.shape != entry.out_shape:
        raise ValueError(
            f"{op}: out has shape {fmt_shape(out.shape)}, expected {fmt_shape(entry.out_shape)}"
        )
    return (pa, pw, pc, po, pb, psa, psb), out


def setup_during_capture():
    """Context for setup work (a communicator, a plan's workspace and graphs) that happens while
    the current stream is being captured: the thread may allocate and exchange IPC handles
    (_core.RelaxedCaptureMode); device-wide synchronisation stays forbidden, and none is done."""
    relaxed = getattr(_core, "RelaxedCaptureMode", None)  # absent in builds without CUDA
    return relaxed() if relaxed is not None else contextlib.nullcontext()


def launch(op: str, comm: Communicator, entry: Entry, tensors, out, capturing: bool = False):
    """The overlapped path: replay this rank's CUDA graph of the plan; ``capturing``: the current
    stream is being captured, so record the plan's nodes into the caller's graph instead."""
    device = comm.device
    a, w = tensors["a"], tensors["w"]
    ptrs, out = user_ptrs(op, entry, tensors, out, device)
    stream = stream_ptr(device)
    if capturing:
        capture_graph(entry, ptrs).capture(stream, *ptrs)
    else:
        g = graph_for(entry, ptrs)
        err = g.error()
        if not err and entry.ws.pinned:  # a replay of a captured graph on this workspace failed
            err = entry.ws.order.capture_error()
        if err:
            comm.mark_broken(err)
            comm.raise_if_broken()
        g.launch(stream)
    if entry.gather is None:
        return out
    gathered = torch.empty(entry.gather_shape, dtype=entry.dtype, device=device)
    kdim = entry.gather_shape[1]
    for src, off, row0, rows in entry.gather:
        base = entry.slots if src == "slots" else (a if src == "a" else w).view(-1)
        gathered[row0 : row0 + rows].copy_(base[off : off + rows * kdim].view(rows, kdim))
    # The slots are rewritten by the peers after this rank's next entry barrier: a launch on
    # another stream must wait for these copies too, not only for the graph (inside a capture:
    # a launch on another stream of the same capture).
    entry.ws.order.record(stream)
    return out, gathered
