"""distgemm's own one-shot and two-shot all-reduce of a bf16/fp16 tensor over symmetric buffers,
each signalled by a flag or as LL lines (``one_shot_ll``, ``two_shot_ll``).

``run_all_reduce(comm, tensor, algorithm, capturing, out=None)`` sums ``tensor`` over the ranks
of ``comm`` on the current stream with distgemm's kernel (kernel/allreduce.hpp: the protocol, the
parity argument, the grid), in place or into ``out``: every rank gets the same bits, summed in
float32 over ranks 0..tp-1 in that order. Capturable: one kernel node per call in a caller's CUDA
graph, its launch generation advanced on the device, so replays need no host work.

Its memory (``AllReduceResources``, an attachment of the communicator):
- a control region of ``_core.ALLREDUCE_CONTROL_BYTES`` (launch generations and flags),
  allocated zeroed at the first call, which every rank makes at the same point: collective;
- a receive region (``_core.allreduce_receive_bytes``: both parities), a ``WorkspacePool`` of its
  own grown collectively to the largest call (plus the pool's headroom); the parities are its two
  halves (``parity_bytes``), so calls of every size share it. The flag algorithms share one pool
  and the LL ones (``_core.ALLREDUCE_LINE_ALGORITHMS``) another: a line has arrived when it
  carries the launch's generation, so nothing but lines (or the allocation's zeros) may ever be
  in an LL region (kernel/allreduce.hpp's parity argument). The pull algorithms
  (``_core.ALLREDUCE_PULL_ALGORITHMS``) have a third: their region holds the rank's input, with
  no parity (kernel/allreduce.hpp says why that is safe among them, and not beside a push
  algorithm's halves). A caller writes its input there (``all_reduce_input``, e.g. as its GEMM's
  output); ``run_all_reduce`` copies any other tensor there first.
Neither is shared with the fused path or the workspace. Both are kept until ``close()``; a
region a captured graph uses is pinned (kept past a growth until ``close()``).

Shared outputs: a captured pull call exchanges its output's CUDA IPC handle with the peers
(``shared_output``, collective, once per captured call) and each rank then stores its chunk's sum
straight into every rank's output, so no rank copies the peers' sums out of its region. Eager
calls copy: an exchange per call would cost more host time than the copy does device time. The
peers' mapped allocations are kept until ``close()`` (a captured graph may replay any time).

Grid: ``_core.allreduce_ctas`` on the smallest resident CTA count of the ranks (agreed once, at
the first call), so that every rank launches the same grid for the same size.

Launch: plain by default (``CHAINED``). A chained launch (programmatic dependent launch) is
scheduled while the kernel before it on the stream (the collective path's torch.mm) ends, and its
first instruction waits until that kernel is complete and its writes are visible, so it reads
nothing earlier and the results are the same bits. After torch.mm it runs slower than the plain
launch, not faster (docs/tuning.md, "Chaining the all-reduce to torch.mm"), so it is off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .. import _core
from .capture import setup_during_capture, stream_ptr
from .kernel_resources import KernelResources
from .validate import DTYPES
from .workspace import Workspace, WorkspacePool, device_view

if TYPE_CHECKING:
    from .communicator import Communicator

__all__ = [
    "AllReduceResources",
    "run_all_reduce",
    "launch_all_reduce",
    "all_reduce_input",
    "mm_then_all_reduce",
    "allreduce_layout",
]

# The name of the all-reduce's per-communicator state (Communicator.attach).
ATTACHMENT = "allreduce"
_VECTOR_BYTES = 16
# Views of the pull region kept for reuse (one per shape and dtype): a server's token counts and
# layer widths fit, and the dict stays bounded whatever the shapes (a view holds no memory).
MAX_INPUT_VIEWS = 256
# Whether launches chain to the kernel before them (programmatic dependent launch): the default
# of launch_all_reduce's ``chained``. Off: after torch.mm the chained pair is the slower one.
CHAINED = False


def allreduce_layout(algorithm: str, numel: int, itemsize: int, tp: int) -> dict[str, int]:
    """The receive region a call needs (``WorkspacePool.place``'s layout, no control region)."""
    need = int(_core.allreduce_receive_bytes(algorithm, numel, itemsize, tp))
    align = int(_core.WORKSPACE_SLOT_ALIGN)
    slots = -(-need // align) * align
    return {"slots_offset": 0, "slots_bytes": slots, "total_bytes": slots}


class AllReduceResources(KernelResources):
    """The all-reduce's per-communicator state (a ``Communicator`` attachment): the control
    region, the receive regions' pools (flag and LL algorithms apart), the agreed resident CTA
    count and this rank's launcher (``KernelResources``)."""

    ATTACHMENT = ATTACHMENT
    CONTROL_BYTES = "ALLREDUCE_CONTROL_BYTES"
    LAUNCHER = "AllReduceLauncher"

    def __init__(self, comm: Communicator):
        super().__init__(comm)
        self._resident: int | None = None
        # The receive pools by the algorithm's family (_family). Nothing to re-point at a
        # growth: every call places its layout afresh.
        self.receive_pools: dict[str, WorkspacePool] = {
            family: comm.new_pool(lambda ws: None, control=0) for family in _FAMILIES
        }
        # Views of the pull region as callers' inputs, by (base, shape, dtype): made once.
        self._inputs: dict[tuple, torch.Tensor] = {}
        self._mappings = None  # _core.PeerMappings of the peers' shared outputs, made at first use
        # Captured pull calls that stored into the ranks' outputs / copied, and the last reason
        # for copying (shared_output).
        self.outputs_shared, self.outputs_copied, self.copy_reason = 0, 0, ""

    @property
    def resident_ctas(self) -> int:
        """The smallest count of the ranks' resident all-reduce CTAs (agreed at the first call:
        collective), the bound of every rank's grid."""
        if self._resident is None:
            mine = int(_core.allreduce_resident_ctas(self.comm.device.index))
            self._resident = min(self.comm.all_gather(mine, "all-reduce resident CTAs"))
        return self._resident

    def receive_for(self, algorithm: str, numel: int, itemsize: int) -> tuple[Workspace, int]:
        """The receive region for a call (its algorithm's pool's, grown first when it does not
        fit: collective) and the bytes between its two parities (half the region, a multiple of
        16)."""
        pool = self.receive_pools[_family(algorithm)]
        ws, _ = pool.place(allreduce_layout(algorithm, numel, itemsize, self.comm.tp))
        return ws, ws.slot_capacity // 2 // _VECTOR_BYTES * _VECTOR_BYTES

    def input_view(self, ws: Workspace, like: torch.Tensor) -> torch.Tensor:
        """This rank's input in the pull region ``ws``: a tensor of ``like``'s shape and dtype at
        its start (made once per region, shape and dtype; views of a replaced region go, and
        past ``MAX_INPUT_VIEWS`` shapes the oldest view goes)."""
        base = ws.bases[self.comm.rank]
        key = (base, tuple(like.shape), like.dtype)
        view = self._inputs.get(key)
        if view is None:
            self._inputs = {k: v for k, v in self._inputs.items() if k[0] == base}
            while len(self._inputs) >= MAX_INPUT_VIEWS:
                del self._inputs[next(iter(self._inputs))]
            flat = device_view(base, like.numel(), like.dtype, self.comm.device)
            view = self._inputs[key] = flat.view(like.shape)
        return view

    def shared_output(self, out: torch.Tensor, region: Workspace) -> list[int] | None:
        """Every rank's ``out`` as addressable from this device (``out`` at this rank's index),
        exchanged through CUDA IPC, or None where any rank cannot share its output (then every
        rank copies; the reason is kept in ``copy_reason``). Collective: every rank calls it at
        the same captured call."""
        comm, rank = self.comm, self.comm.rank
        try:
            if out.data_ptr() == region.bases[rank]:
                raise ValueError("the output is the all-reduce's own region")
            handle, offset = _core.export_allocation(comm.device.index, out.data_ptr())
            mine: tuple[bytes, int, str] = (handle, offset, "")
        except Exception as e:  # noqa: BLE001 - the reason goes to every rank
            mine = (b"", 0, f"rank {rank}: {e}")
        reports = comm.all_gather(mine, "all-reduce output IPC handles")
        bases, problem = None, next((r[2] for r in reports if r[2]), "")
        if not problem:
            try:
                if self._mappings is None:
                    self._mappings = _core.PeerMappings(comm.device.index)
                bases = [
                    out.data_ptr() if q == rank else self._mappings.open(h) + off
                    for q, (h, off, _) in enumerate(reports)
                ]
            except Exception as e:  # noqa: BLE001
                problem = f"rank {rank}: {e}"
        # The same verdict on every rank: the first problem any rank had, or none.
        problem = next((p for p in comm.all_gather(problem, "all-reduce output mappings") if p), "")
        if problem:
            self.outputs_copied += 1
            self.copy_reason = problem
            return None
        self.outputs_shared += 1
        return bases

    # -- Attachment ------------------------------------------------------------------------
    def workspace_grown(self, ws: Workspace, capturing: bool) -> None:
        """Nothing of these lives in the communicator's workspace."""

    def memory_stats(self) -> dict[str, int]:
        return {
            "allreduce_control_bytes": self._control.nbytes if self._control is not None else 0,
            "allreduce_receive_bytes": sum(
                w.nbytes for pool in self.receive_pools.values() for w in pool.live
            ),
        }

    def close(self) -> list[Workspace]:
        self._inputs.clear()
        if self._mappings is not None:
            self._mappings.close()
            self._mappings = None
        held = [w for pool in self.receive_pools.values() for w in pool.close()]
        if self._control is not None:
            held.append(self._control)
        self._control, self._launcher = None, None
        return held


_FAMILIES = ("flag", "lines", "pull")


def _family(algorithm: str) -> str:
    """Which receive pool ``algorithm`` uses: "lines" (LL), "pull" or "flag"."""
    if algorithm in _core.ALLREDUCE_LINE_ALGORITHMS:
        return "lines"
    return "pull" if algorithm in _core.ALLREDUCE_PULL_ALGORITHMS else "flag"


def _receive(
    comm: Communicator, res: AllReduceResources, algorithm: str, numel, itemsize, capturing
):
    """(region, parity bytes, control bases, resident CTAs) of a call: the region placed
    (grown where the call needs more: collective), pinned inside a capture (callers' graphs keep
    using it: never freed before close())."""
    if capturing:
        with setup_during_capture():  # a first call or a growth: allocation, IPC exchange
            ws, parity_bytes = res.receive_for(algorithm, numel, itemsize)
            control, resident = res.control_bases(), res.resident_ctas
        ws.pinned = True
    else:
        ws, parity_bytes = res.receive_for(algorithm, numel, itemsize)
        control, resident = res.control_bases(), res.resident_ctas
    return ws, parity_bytes, control, resident


def all_reduce_input(
    comm: Communicator, algorithm: str, like: torch.Tensor, capturing: bool
) -> torch.Tensor:
    """Where a caller writes the input of an all-reduce by ``algorithm`` of a tensor like
    ``like`` (shape, dtype): for a pull algorithm (``_core.ALLREDUCE_PULL_ALGORITHMS``) this
    rank's input region, which the peers read in place (e.g. ``torch.mm(..., out=it)``, then
    ``run_all_reduce(comm, it, algorithm, capturing, out=...)``: no copy); else ``like``
    itself. Collective where the region grows."""
    if algorithm not in _core.ALLREDUCE_PULL_ALGORITHMS:
        return like
    res = AllReduceResources.of(comm)
    ws, *_ = _receive(comm, res, algorithm, like.numel(), like.element_size(), capturing)
    return res.input_view(ws, like)


def mm_then_all_reduce(
    comm: Communicator,
    a: torch.Tensor,
    wt: torch.Tensor,
    out: torch.Tensor,
    algorithm: str,
    capturing: bool,
    chained: bool = CHAINED,
) -> torch.Tensor:
    """``out`` = the sum over ranks of ``a @ wt`` as the collective path of ``gemm_all_reduce``
    runs it: torch.mm into the all-reduce's input (``all_reduce_input``: a pull algorithm's
    region, where the peers read it; else ``out``), then ``launch_all_reduce``, ``chained`` to
    torch.mm's kernel (no argument checks: the caller made them once, as the path's entry does
    when it picks ``algorithm``)."""
    x = all_reduce_input(comm, algorithm, out, capturing)
    torch.mm(a, wt, out=x)
    return launch_all_reduce(comm, x, out, algorithm, capturing, chained)


def _check_tensor(name: str, t: torch.Tensor, comm: Communicator) -> None:
    """ValueError naming the constraint and the values unless ``t`` is a contiguous bf16/fp16
    tensor on the communicator's device, 16-byte aligned."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != comm.device:
        raise ValueError(f"{name} is on {t.device}, the communicator's device is {comm.device}")
    if t.dtype not in DTYPES:
        raise ValueError(f"{name} has dtype {t.dtype}; the all-reduce takes bf16 or fp16")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (shape {tuple(t.shape)}, {t.stride()})")
    if t.data_ptr() % _VECTOR_BYTES:
        raise ValueError(f"{name}'s address {t.data_ptr():#x} is not 16-byte aligned")


def run_all_reduce(
    comm: Communicator,
    tensor: torch.Tensor,
    algorithm: str,
    capturing: bool,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out = sum over ranks of tensor`` (in place when ``out`` is None or ``tensor``) with
    distgemm's ``algorithm`` (``_core.ALLREDUCE_ALGORITHMS``: "one_shot", "two_shot",
    "one_shot_ll", "two_shot_ll"), on the
    current stream (recorded into its capture when ``capturing``); returns the result.

    tensor: contiguous bf16/fp16 on the communicator's device, numel a multiple of 8, 16-byte
        aligned; the same shape, dtype and algorithm on every rank, every rank calling in the
        same order.
    out: None, ``tensor``, or a tensor of the same shape and dtype apart from it.

    ValueError for bad arguments (before any collective); RuntimeError where a previous launch
    timed out (a peer did not arrive), as the other paths raise it."""
    if algorithm not in _core.ALLREDUCE_ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r} is not one of {_core.ALLREDUCE_ALGORITHMS}")
    _check_tensor("tensor", tensor, comm)
    if out is None:
        out = tensor
    elif out is not tensor:
        _check_tensor("out", out, comm)
        if out.shape != tensor.shape or out.dtype != tensor.dtype:
            raise ValueError(
                f"out {tuple(out.shape)} {out.dtype} must match tensor "
                f"{tuple(tensor.shape)} {tensor.dtype}"
            )
    problem = _core.allreduce_problem(algorithm, tensor.numel(), tensor.element_size(), comm.tp)
    if problem:
        raise ValueError(f"all-reduce of tensor {tuple(tensor.shape)}: {problem}")
    return launch_all_reduce(comm, tensor, out, algorithm, capturing)


def launch_all_reduce(
    comm: Communicator,
    tensor: torch.Tensor,
    out: torch.Tensor,
    algorithm: str,
    capturing: bool,
    chained: bool = CHAINED,
) -> torch.Tensor:
    """``run_all_reduce`` without its argument checks, for callers that made them once (the
    collective path: its output is checked per call by the op, the size when its entry chose
    the algorithm): the receive region placed (grown where the call needs more: collective),
    then one launch, ``chained`` to the kernel before it (``CHAINED``); returns ``out``."""
    numel, itemsize = tensor.numel(), tensor.element_size()
    comm.raise_if_broken()
    res = AllReduceResources.of(comm)
    ws, parity_bytes, control, resident = _receive(comm, res, algorithm, numel, itemsize, capturing)
    src, shared = tensor.data_ptr(), None
    if algorithm in _core.ALLREDUCE_PULL_ALGORITHMS:
        if src != ws.bases[comm.rank]:
            res.input_view(ws, tensor).copy_(tensor)  # the input where the peers read it
            src = ws.bases[comm.rank]
        if capturing:  # a graph replays the exchanged addresses: one exchange, no copy per replay
            shared = res.shared_output(out, ws)
    launcher = res.launcher
    if not capturing:
        err = launcher.error() or (comm.order.capture_error() if ws.pinned else "")
        if err:
            comm.mark_broken(err)
            comm.raise_if_broken()
    launcher.launch(
        stream_ptr(comm.device),
        DTYPES[tensor.dtype],
        algorithm,
        numel,
        src,
        out.data_ptr(),
        comm.rank,
        list(ws.bases),
        parity_bytes,
        control,
        chained,
        _core.allreduce_ctas(algorithm, numel, itemsize, comm.tp, resident),
        shared or [],
    )
    return out
