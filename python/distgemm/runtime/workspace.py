"""The symmetric workspace of a Communicator and the policy that sizes, grows and releases it.

One per communicator, shared by every plan it builds (``WorkspacePool``), free of CUDA so that
the CPU tests run it with an injected allocator.

Layout. A workspace is receive slots (data, then the scale slots of FP8 row scales) followed by
one control region: ``_core.MAX_FLAGS`` flags, ``_core.MAX_TP`` entry-barrier slots and the epoch
word (``_core.workspace_control_layout()``, ``control_layout()`` in plan_types.hpp), the same for
every plan, because S is bounded (``_core.MAX_STEPS``) and so is the number of flags of a plan.
Every plan places that region right after its own slots and scale slots (``Plan::layout``); a
plan with fewer of those bytes than the workspace gets bases shifted by the difference, so its
control region lands on the same addresses as every other plan's. The epoch word and the barrier
slots therefore carry the launch generation from one plan's launch to the next, whatever the
plans' shapes, and a flag of one plan never sits inside another plan's slots or scale slots. A
flag keeps the generation of the launch that last set it; a later launch waits for its own,
newer generation, so a stale flag never satisfies a wait. Slots are reused the
same way: each launch's entry barrier waits until every peer has finished its previous launch, so
no launch writes a slot that a previous one still reads.

Growth. The workspace grows only when a plan needs more slot bytes than it has. The new one is
sized for that plan plus headroom of at most ``GROWTH_HEADROOM`` of the plan's whole layout, so
the workspace never exceeds the largest plan placed in it by more than that. Growing allocates
the new workspace and exchanges its CUDA IPC handles (a collective: growth happens at plan
creation, which is collective already), re-points every cached plan at it (their graphs are
dropped and rebuilt at their next call), then releases the old one: every rank synchronises its
device and unmaps its peers' old workspaces, the ranks meet at a barrier, and only then does each
rank free its own. A workspace that graphs captured into a caller's CUDA graph still reference
(``pinned``) is kept instead, until ``Communicator.close()``.

Launch generations across a growth. Every rank grows at the same call: plan creation is
collective, the shapes (hence the layouts) are the same on every rank, and the pool's state
depends only on the sequence of plans created and pinned, which the SPMD contract makes the same
on every rank. The new workspace is zeroed on every rank before its handle is exchanged, so its
epoch word and barrier slots start at generation 0 everywhere, and the first launch on it, which
every rank makes at the same call, is generation 1 on every rank. No graph on the new workspace
compares against the old one's generations: every graph is rebuilt on the new bases.

Streams. The graphs of one communicator share the workspace's epoch, flags and slots, so its
launches on one device must never overlap: each launch's entry barrier assumes the previous
launch on this device is complete. Launches on one stream are ordered by the stream; a launch on
another stream than the previous launch's first waits for that launch (``_core.LaunchOrder``, one
per communicator, kept across growth: an event wait, issued only on a switch). Ops issued on two
streams therefore run one after the other in issue order, not concurrently, and their results are
correct. distgemm orders nothing else on those streams: as for any torch op, the caller orders
the consumers of an output made on another stream (``wait_stream``, ``record_stream``). Ops of
one communicator are issued from one host thread, in the same order on every rank (issue order is
the launch order, and the launch generations must pair up across ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import _core

__all__ = [
    "GROWTH_HEADROOM",
    "Workspace",
    "WorkspacePool",
    "grown_slot_capacity",
    "control_bytes",
    "device_view",
]

# Headroom of a new workspace over the plan that makes it grow, as a fraction of that plan's
# layout: fewer regrowths for slowly rising token counts, at most this much over the bound.
GROWTH_HEADROOM = 0.10


@dataclass
class Workspace:
    core: Any  # _core.IpcWorkspace (or a test's stand-in)
    slot_capacity: int  # bytes before the control region
    control_bytes: int  # the control region's bytes (the same for every plan)
    bases: list[int] = field(default_factory=list)  # every rank's base, as seen from this device
    order: Any = None  # the communicator's _core.LaunchOrder, shared by every graph
    # Captured graphs (a caller's CUDA graph) reference this workspace: kept until close(), not
    # freed when the pool grows.
    pinned: bool = False

    @property
    def nbytes(self) -> int:
        return self.slot_capacity + self.control_bytes


class _DeviceMemory:
    """Device memory for torch.as_tensor via __cuda_array_interface__ (no ownership)."""

    def __init__(self, ptr: int, numel: int, itemsize: int):
        self.__cuda_array_interface__ = {
            "shape": (numel,),
            "typestr": f"<i{itemsize}",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


def device_view(ptr: int, numel: int, dtype, device):
    """A 1-D torch tensor of ``numel`` elements of ``dtype`` over device memory at ``ptr`` that
    distgemm owns (a symmetric region: the tensor does not own it, and must not outlive it)."""
    import torch

    raw = _DeviceMemory(ptr, numel, dtype.itemsize)
    return torch.as_tensor(raw, device=device).view(dtype)


def control_bytes() -> int:
    """Bytes of the control region every plan places after its slots (from C++)."""
    return int(_core.workspace_control_layout()["total_bytes"])


def grown_slot_capacity(slots_bytes: int, control: int, align: int) -> int:
    """Slot bytes of a workspace grown for a plan with ``slots_bytes`` of slots: the plan's own
    plus ``GROWTH_HEADROOM`` of its whole layout (slots + ``control``), rounded down to ``align``
    so that the workspace stays within that fraction of the plan's layout."""
    headroom = int((slots_bytes + control) * GROWTH_HEADROOM) // align * align
    return slots_bytes + headroom


class WorkspacePool:
    """The one workspace of a communicator (``current``) and the replaced ones kept for captured
    graphs (``kept``). The collective and CUDA parts are injected:

    allocate(nbytes) -> (core, bases): allocate and exchange a workspace (collective); raises
        and leaves the pool as it was on failure.
    repoint(ws): point every cached plan at the new workspace ``ws`` (after synchronising the
        device; their graphs are dropped).
    release(workspaces): free replaced or closed workspaces collective-safely (peers unmap,
        barrier, free); called on every rank at every growth, with an empty list when the old
        workspace is pinned, so that the ranks' exchanges stay in step.
    keep_replaced() -> bool: keep the replaced workspace (pinned) instead of freeing it, asked at
        each growth (every rank grows at the same call, so every rank gets the same answer).
    """

    def __init__(
        self,
        allocate: Callable[[int], tuple[Any, list[int]]],
        repoint: Callable[[Workspace], None],
        release: Callable[[list[Workspace]], None],
        *,
        control: int,
        align: int,
        order: Any = None,
        keep_replaced: Callable[[], bool] = lambda: False,
    ):
        self._allocate, self._repoint, self._release = allocate, repoint, release
        self._keep_replaced = keep_replaced
        self.control, self.align, self.order = control, align, order
        self.current: Workspace | None = None
        self.kept: list[Workspace] = []
        self.largest_plan_bytes = 0  # the largest plan layout (total bytes) placed so far
        self.allocations = 0

    def place(self, layout: dict[str, int]) -> tuple[Workspace, list[int]]:
        """The workspace for a plan with this ``_core.workspace_layout`` (grown first when its
        slots do not fit) and the plan's bases, one per rank, shifted so that the plan's control
        region is the workspace's."""
        # Everything before the control region: the data slots, then the scale slots (a layout
        # without scale slots, as the fused path's, has none).
        slots = int(layout["slots_bytes"]) + int(layout.get("scale_slots_bytes", 0))
        total = int(layout["total_bytes"])
        if total - slots != self.control or slots % self.align or int(layout["slots_offset"]):
            raise RuntimeError(
                f"internal: a plan layout {layout} does not end in the workspace's control region "
                f"of {self.control} bytes after {self.align}-byte aligned slots"
            )
        ws = self.current
        if ws is None or ws.slot_capacity < slots:
            ws = self._grow(slots)
        self.largest_plan_bytes = max(self.largest_plan_bytes, total)
        shift = ws.slot_capacity - slots
        return ws, [b + shift for b in ws.bases]

    def _grow(self, slots: int) -> Workspace:
        capacity = grown_slot_capacity(slots, self.control, self.align)
        core, bases = self._allocate(capacity + self.control)
        new = Workspace(core, capacity, self.control, list(bases), self.order)
        old, self.current = self.current, new
        self.allocations += 1
        if old is not None:
            self._repoint(new)
            if self._keep_replaced():  # e.g. a capture in progress: no free, no device sync
                old.pinned = True
            if old.pinned:
                self.kept.append(old)
            self._release([] if old.pinned else [old])
        return new

    @property
    def live(self) -> list[Workspace]:
        """Every workspace held: the current one, then the kept ones."""
        return ([self.current] if self.current is not None else []) + self.kept

    def close(self) -> list[Workspace]:
        """Forget every workspace and return them for the caller to release (pinned ones
        included)."""
        held = self.live
        self.current, self.kept = None, []
        return held

    def memory_stats(self) -> dict[str, int]:
        """The pool's part of ``distgemm.memory_stats``: the current workspace, the kept ones,
        the largest plan placed and the allocations so far."""
        current = self.current
        return {
            "workspace_bytes": current.nbytes if current is not None else 0,
            "kept_bytes": sum(w.nbytes for w in self.kept),
            "largest_plan_bytes": self.largest_plan_bytes,
            "workspace_allocations": self.allocations,
        }
