"""The fused path of ``gemm_all_reduce``: one kernel per rank makes its partial and sums its tiles.

``path="fused"``, or ``"auto"`` where the machine's model predicts it the fastest
(``runtime.reduce_cost``): one kernel per rank computes its partial product and
sums the tiles it owns over every rank's partials (kernel/fused_allreduce.hpp). No collective
kernel, no copy engine, one kernel node inside a caller's CUDA graph. Two kernels:
- up to ``_core.FUSED_DECODE_MAX_TOKENS`` tokens the hand-written decode kernel (the weight
  streamed at memory bandwidth) pushes each partial, as generation-tagged lines, into every
  rank's receive buffer, and each rank sums what arrived in its own;
- above that CUTLASS's kernel writes its partials into its own rank's buffer, signals each
  finished tile to every rank, and the peers read them over NVLink. Its tail (``FUSED_PATHS``):
  ``path="fused"`` the one-shot (every rank sums every tile), ``path="fused_two_shot"`` the
  two-shot (each slice of a tile summed by one owner rank, which the others copy it from).

Where it runs: the shapes (``fused_problem``) and a K-contiguous weight (a transposed ``.t()``
view is not read by this kernel). Its buffers (``_core.fused_partial_bytes``), two by launch
parity, each in one half of its region (``FusedState.place``):
- the decode kernel's receive buffers: a region of their own per communicator
  (``FusedResources.receive_for``), grown like the workspace;
- the CUTLASS kernel's partial buffers, and the two-shot tail's sum buffers
  (``_core.fused_sum_bytes``) after them in each half: the communicator's one workspace, in its
  slots;
- one small control region per communicator (launch generation and per-tile flags), allocated
  at the first fused call.
All are kept until ``close()``.

Ordering: a fused launch is ordered on the device after this rank's previous launch (the
stream, or the communicator's LaunchOrder across streams).
- **Plans sharing the workspace:** a plan's launch writes the workspace only after its entry
  barrier, i.e. after every rank finished its previous launch (fused ones included). A CUTLASS
  fused launch writes only its own rank's partial buffer.
- **Parities:** a launch writes the parity its peers do not read, since a peer is at most one
  launch behind; a two-shot sum lies in its launch's half, where the next launch's partials,
  written before that launch waits for anything, never go. The decode kernel's pushes go to the
  receive region, which no plan writes."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ... import _core
from ..capture import stream_ptr
from ..kernel_resources import KernelResources
from ..machine import FUSED_PATHS
from ..spec import Spec
from ..validate import DTYPES
from ..workspace import Workspace, WorkspacePool
from .common import PathState, user_ptrs

if TYPE_CHECKING:
    from ..communicator import Communicator

__all__ = [
    "FUSED_PATHS",
    "fused_problem",
    "rank_problem_shape",
    "fused_layout",
    "FusedResources",
    "FusedState",
]

# The name of the fused path's per-communicator state (Communicator.attach).
ATTACHMENT = "fused"


def rank_problem_shape(spec: Spec) -> tuple[int, int, int]:
    """This rank's (m, n, k) of a gemm_all_reduce spec: a [m, k], w [n, k]."""
    m, k = spec.shapes["a"]
    return int(m), int(spec.shapes["w"][0]), int(k)


def fused_problem(spec: Spec, dtype: torch.dtype, tail: str = "one_shot") -> str:
    """'' when the fused kernel runs this gemm_all_reduce entry with ``tail`` (one of
    ``_core.FUSED_TAILS``), else the reason (shapes, dtype, weight layout and the build only:
    the same on every rank)."""
    if spec.op != "gemm_all_reduce":
        return f"the fused path is gemm_all_reduce's only, not {spec.op}'s"
    if not getattr(_core, "cuda_runtime", False):
        return f"distgemm was built without the CUDA runtime ({_core.cuda_runtime_reason})"
    if dtype not in DTYPES:
        return f"dtype {dtype} is not bf16 or fp16"
    if spec.b_n_major:
        return "the weight is a transposed view (N-contiguous); the fused kernel reads [N, K]"
    m, n, k = rank_problem_shape(spec)
    return _core.fused_shape_problem(m, n, k, 1, spec.tp) or _core.fused_tail_problem(tail, m)


def resident_and_partials(dtype: str, m: int, n: int, k: int, device: int) -> tuple[int, int]:
    """(CTAs of the fused kernel that runs m tokens resident at once on CUDA device ``device``,
    the partials per rank of a tile's sum on them: ``_core.fused_splits``): what an entry runs
    with, and what the calibration records of each fused run."""
    resident = _core.fused_resident_ctas(dtype, m, device)
    return resident, _core.fused_splits(m, n, k, resident)


def fused_layout(
    m: int,
    n: int,
    splits: int,
    itemsize: int,
    tp: int,
    workspace_control: int,
    tail: str = "one_shot",
) -> dict[str, int]:
    """The region a fused entry needs (``WorkspacePool.place``'s layout). The decode kernel's
    receive buffers are sized for its widest token count (``_core.FUSED_DECODE_MAX_TOKENS``; its
    grid and pieces do not depend on the tokens), so that a server's next batch size never grows
    them; they end in no control region. The CUTLASS kernel's partial buffers and its two-shot
    sum buffers (``fused_sum_offset``) go in the workspace's slots, before its control region of
    ``workspace_control`` bytes."""
    decode = _core.fused_kernel(m) == "decode"
    rows = int(_core.FUSED_DECODE_MAX_TOKENS) if decode else m
    part_bytes = int(_core.fused_partial_bytes(rows, n, splits, itemsize, tp))
    part_bytes += int(_core.fused_sum_bytes(rows, n, itemsize, tail))
    align = int(_core.WORKSPACE_SLOT_ALIGN)
    slots = -(-part_bytes // align) * align
    return {
        "slots_offset": 0,
        "slots_bytes": slots,
        "total_bytes": slots + (0 if decode else workspace_control),
    }


def fused_sum_offset(m: int, n: int, splits: int, itemsize: int, tp: int) -> int:
    """Bytes from a rank's partial buffer of a parity to its two-shot sum buffer of the same
    parity: past that parity's partials, so that each half of the region holds one parity's
    partials and sum (``fused_layout`` sizes the region for both)."""
    return int(_core.fused_partial_bytes(m, n, splits, itemsize, tp)) // 2


class FusedResources(KernelResources):
    """The fused path's per-communicator state (a ``Communicator`` attachment): the control
    region (launch generation and per-tile flags, allocated at the first fused entry, which
    every rank creates at the same call: the allocation is collective), the decode kernel's
    receive region (grown like the workspace) and this rank's launcher (``KernelResources``)."""

    ATTACHMENT = ATTACHMENT
    CONTROL_BYTES = "FUSED_CONTROL_BYTES"
    LAUNCHER = "FusedLauncher"

    def __init__(self, comm: Communicator):
        super().__init__(comm)
        # The decode kernel's receive buffers: a region of their own, which no plan writes.
        self.receive: WorkspacePool = comm.new_pool(self._receive_grown, control=0)
        self._receivers: weakref.WeakSet[FusedState] = weakref.WeakSet()

    def receive_for(self, state: FusedState) -> tuple[Workspace, list[int]]:
        """The receive region for a decode entry (grown first when it does not fit: collective,
        like the workspace's growth); the entry is re-pointed at every later growth."""
        self._receivers.add(state)
        return self.receive.place(state.layout)

    def _receive_grown(self, ws: Workspace) -> None:
        for state in list(self._receivers):
            if state.ws is not ws:
                state.place(self.comm)

    # -- Attachment ------------------------------------------------------------------------
    def workspace_grown(self, ws: Workspace, capturing: bool) -> None:
        """Nothing of these lives in the workspace (the entries' partial buffers are re-pointed
        by the entry cache)."""

    def memory_stats(self) -> dict[str, int]:
        return {
            "fused_control_bytes": self._control.nbytes if self._control is not None else 0,
            "fused_receive_bytes": sum(w.nbytes for w in self.receive.live),
        }

    def close(self) -> list[Workspace]:
        held = self.receive.close()
        if self._control is not None:
            held.append(self._control)
        self._control, self._launcher = None, None
        self._receivers = weakref.WeakSet()
        return held


@dataclass(eq=False)
class FusedState(PathState):
    """A fused entry: its problem, its division of work (the CUTLASS kernel's split-K factor,
    the decode kernel's grid), its tail (one of ``_core.FUSED_TAILS``) and its buffers."""

    m: int = 0
    n: int = 0
    k: int = 0
    dtype: str = ""
    itemsize: int = 2
    splits: int = 1
    ctas: int = 0
    tail: str = "one_shot"
    # The decode kernel's peers push into this rank's receive region; the CUTLASS kernel's
    # partials are read by the peers from the workspace's slots.
    receive: bool = False
    layout: dict[str, int] = field(default_factory=dict)
    control: list[int] = field(default_factory=list)
    parity_bytes: int = 0
    ws: Any = None
    bases: list[int] = field(default_factory=list)
    sums: list[int] = field(default_factory=list)  # the two-shot tail's; empty for one_shot
    resources: FusedResources | None = None

    @classmethod
    def create(
        cls, comm: Communicator, spec: Spec, precision, beta: float, report: dict[str, Any]
    ) -> FusedState:
        """The fused entry of ``spec`` with the tail ``report["fused_tail"]`` (choose_path's);
        adds its kernel, splits and grid to ``report``."""
        m, n, k = rank_problem_shape(spec)
        tail = report.get("fused_tail", "one_shot")
        dtype = DTYPES[precision.dtype]
        resident, splits = resident_and_partials(dtype, m, n, k, comm.device.index)
        ctas = _core.fused_ctas(m, n, k, resident)
        resources = FusedResources.of(comm)
        state = cls(
            **cls.call_fields(spec, precision, beta, False),
            m=m,
            n=n,
            k=k,
            dtype=dtype,
            itemsize=precision.dtype.itemsize,
            splits=splits,
            ctas=ctas,
            tail=tail,
            receive=_core.fused_kernel(m) == "decode",
            layout=fused_layout(
                m,
                n,
                splits,
                precision.dtype.itemsize,
                comm.tp,
                comm.workspace_control_bytes,
                tail,
            ),
            control=resources.control_bases(),
            resources=resources,
        )
        report.update(
            fused_kernel=_core.fused_kernel(m),
            fused_splits=splits,
            fused_ctas=ctas,
            fused_token_tile=_core.fused_token_tile(m),
            fused_tail=tail,
        )
        state.place(comm)
        return state

    def place(self, comm: Communicator) -> None:
        """The buffers in the current region (grown first when too small; collective then):
        every rank's base, and the bytes between the two launch parities, half the region's
        slots, so that the parities of entries of every size stay apart and a launch never
        writes where a peer still reads the previous launch's partials or sums; the two-shot
        sum buffers past the partials of their parity (``fused_sum_offset``)."""
        if self.receive:
            self.ws, _ = self.resources.receive_for(self)
        else:
            self.ws, _ = comm.workspace_for(self.layout)
        line = int(_core.FUSED_LINE_BYTES)
        self.bases = list(self.ws.bases)
        self.parity_bytes = self.ws.slot_capacity // 2 // line * line
        if self.tail == "two_shot":
            off = fused_sum_offset(self.m, self.n, self.splits, self.itemsize, comm.tp)
            self.sums = [b + off for b in self.bases]

    def workspace_grown(self, comm, ws, capturing, retired, kept) -> None:
        if not self.receive and self.ws is not ws:
            # ws is the pool's current workspace and holds every layout placed before.
            self.place(comm)

    def run(self, op: str, comm: Communicator, tensors, out, capturing: bool) -> torch.Tensor:
        """One fused launch on the current stream (recorded into its capture when one is in
        progress)."""
        (pa, pw, pc, po, pb, _, _), out = user_ptrs(op, self, tensors, out, comm.device)
        launcher = self.resources.launcher
        if capturing:
            self.ws.pinned = True  # callers' graphs keep reading it: never freed before close()
        else:
            err = launcher.error() or (self.ws.order.capture_error() if self.ws.pinned else "")
            if err:
                comm.mark_broken(err)
                comm.raise_if_broken()
        launcher.launch(
            stream_ptr(comm.device),
            self.dtype,
            self.m,
            self.n,
            self.k,
            pa,
            pw,
            po,
            pb,
            pc,
            1.0,
            self.beta if pc else 0.0,
            self.splits,
            self.ctas,
            self.tail,
            comm.rank,
            self.bases,
            self.sums,
            self.parity_bytes,
            self.control,
        )
        return out
