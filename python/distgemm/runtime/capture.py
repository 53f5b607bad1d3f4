"""Whether torch's current stream is being captured, what setup may do during a capture, and
the current stream's handle.

The ops may be called inside a caller's ``torch.cuda.graph(...)``: setup then allocates and
exchanges without synchronising, and what must synchronise refuses with a clear error.
"""

from __future__ import annotations

import contextlib

import torch

from .. import _core

# torch's current raw stream as an int, without building a Stream object per call; the public
# API where this private binding is missing.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_ptr(device: torch.device) -> int:
    """The current CUDA stream of ``device`` as an int (a launch's stream argument)."""
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def stream_capturing() -> bool:
    """Whether torch's current CUDA stream is being captured (False where torch has no CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def refuse_during_capture(what: str) -> None:
    """RuntimeError naming `what` when the current CUDA stream is being captured; raised before
    any CUDA call, so the caller's capture stays valid."""
    if stream_capturing():
        raise RuntimeError(
            f"{what}: not allowed inside a CUDA graph capture; call it outside "
            "torch.cuda.graph(...)"
        )


def setup_during_capture():
    """Context for setup work (a communicator, a plan's workspace and graphs) that happens while
    the current stream is being captured: the thread may allocate and exchange IPC handles
    (_core.RelaxedCaptureMode); device-wide synchronisation stays forbidden, and none is done."""
    relaxed = getattr(_core, "RelaxedCaptureMode", None)  # absent in builds without CUDA
    return relaxed() if relaxed is not None else contextlib.nullcontext()
