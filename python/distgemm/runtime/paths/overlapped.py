"""The overlapped path: the plan's CUDA graph per rank, the communication hidden behind the GEMMs.

An entry's state holds its place in the communicator's symmetric workspace, its graph setup and
the graphs instantiated for it, one per set of user pointers; a call checks the user tensors,
picks the graph for their pointers and launches it on the current stream (inside a stream
capture: the graph's nodes are recorded into the caller's graph).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import torch

from ... import _core
from ..capture import stream_ptr
from ..communicator import Communicator
from ..spec import Spec
from ..workspace import Workspace, device_view
from .common import PathState, gathered_shape, user_ptrs

# Instantiated graphs per plan, keyed by the user pointers. Activations from torch's caching
# allocator come back at the same addresses step after step, so a small set of graphs turns
# most calls into a plain replay. A call whose pointers have no graph (graph_for) is enqueued on
# the stream without a graph unless they came back: pointers seen before get a new graph while
# there is room, else the least recently used graph retargeted at them (re-capture and
# cudaGraphExecUpdate) if they came back since that graph's last use. So a pointer set seen once
# (a first call, a fresh output) costs no graph instantiation, and a model's layers of one shape,
# which cycle more pointer sets through a plan than it keeps graphs, keep GRAPHS_PER_PLAN of them
# replaying instead of re-capturing at every call, while a lasting change of addresses still
# gets the graphs within one cycle.
GRAPHS_PER_PLAN = 4
# Pointer sets remembered per plan after a miss without a graph (with the call they came at): a
# bound on host memory, above the calls of one shape that one step of a large model makes.
SEEN_PER_PLAN = 256


def gather_recipe(spec: Spec, rank: int) -> list[tuple[str, int, int, int]]:
    """How to assemble the gathered operand of an all-gather plan on ``rank`` after a launch:
    per sub-GEMM (source, offset, first row, rows), the rotating operand's rows from the user
    tensor (own chunks) or from a receive slot (the peers' chunks, still valid until this rank's
    next launch)."""
    plan = spec.plan.to_dict()
    rot = "a" if plan["definition"]["rotating"] == "A" else "b"
    recipe = []
    for g in plan["devices"][rank]["gemms"]:
        r = g[rot]
        row0, rows = (g["m0"], g["m"]) if rot == "a" else (g["n0"], g["n"])
        recipe.append(("slots" if r["buffer"] == "slots" else rot, r["offset"], row0, rows))
    return recipe


@dataclass(eq=False)
class OverlappedState(PathState):
    """An overlapped entry: its workspace bases, graph setup and graphs."""

    ws: Workspace | None = None
    bases: list[int] = field(default_factory=list)
    ws_bytes: int = 0  # bytes addressable from each base (the plan's layout total)
    setup: Any = None  # _core.GraphSetup of this rank's graphs
    graphs: collections.OrderedDict[tuple[int, ...], Any] = field(
        default_factory=collections.OrderedDict
    )
    # The capture-only _core.GraphLauncher that records this plan into callers' CUDA graphs (see
    # capture_graph). Callers' graphs keep referencing its error sink and the workspace, so it
    # lives until the communicator closes: the entry is never evicted once it has one.
    capturer: Any = None
    # The capture-only _core.GraphLauncher whose launch_direct enqueues the calls that get no
    # graph (see GRAPHS_PER_PLAN); made at the first such call, remade with the workspace.
    direct: Any = None
    gather: list[tuple[str, int, int, int]] | None = None  # gather_recipe, with return_gathered
    gathered_shape: tuple[int, int] = (0, 0)  # the gathered operand's, with return_gathered
    slots: torch.Tensor | None = None  # this rank's receive slots, viewed as the operand dtype
    clock: int = 0  # eager calls so far
    used_at: dict[tuple[int, ...], int] = field(default_factory=dict)  # each graph's last call
    seen_at: collections.OrderedDict[tuple[int, ...], int] = field(
        default_factory=collections.OrderedDict
    )  # pointers that missed without getting a graph, with their last call
    graph_retargets: int = 0  # graphs retargeted at new pointers
    direct_launches: int = 0  # calls enqueued without a graph

    @classmethod
    def create(cls, comm: Communicator, spec: Spec, precision, beta: float, gathered: bool):
        state = cls(**cls.call_fields(spec, precision, beta, gathered))
        state.place(comm)
        return state

    def place(self, comm: Communicator) -> None:
        """The entry's place in the communicator's workspace (grown first when too small;
        collective then), its graphs' setup and the recipe of its gathered operand. Also
        re-points the entry when the workspace grows: its eager graphs, built on the old bases,
        are dropped (the caller has synchronised the device) and rebuilt at its next call."""
        spec, dtype = self.spec, self.precision.dtype
        # The entry's own plan (its partial transport and scale slots included), slots of its
        # types.
        layout = spec.plan.layout(
            spec.plan.slot_elem_bytes(dtype.itemsize, self.precision.out_dtype.itemsize)
        )
        self.graphs.clear()
        self.used_at.clear()
        self.direct = None
        self.ws, self.bases = comm.workspace_for(layout)
        # workspace_for shifts each base so that exactly the layout's bytes follow it: the graph
        # checks its own plan's layout against this.
        self.ws_bytes = int(layout["total_bytes"])
        self.setup = _core.GraphSetup(
            rank=comm.rank,
            cuda_device=comm.device.index,
            dtype=self.precision.name,
            workspace_bases=self.bases,
            workspace_bytes=self.ws_bytes,
            timeout_s=comm.wait_timeout_s,
            alpha=1.0,
            beta=self.beta,
            bias="bias" in spec.shapes,
            tile_n=spec.tile_n,
            b_n_major=spec.b_n_major,
            fast_accum=self.precision.fast_accum,
        )
        if self.want_gathered:
            self.gather = gather_recipe(spec, comm.rank)
            self.gathered_shape = gathered_shape(spec)
            slot_elems = int(spec.plan.slot_elems)
            if slot_elems:
                # This rank's slots start at its shifted base (slots_offset is 0 in Plan::layout).
                self.slots = device_view(
                    self.bases[comm.rank] + int(layout["slots_offset"]), slot_elems, dtype,
                    comm.device,
                )  # fmt: skip

    def _new_graph(self, ptrs: tuple[int, ...], capture_only: bool = False):
        """A GraphLauncher of the plan for ``ptrs`` (a, w, c, out, bias, scale_a, scale_b)."""
        a, w, c, d, bias, scale_a, scale_b = ptrs
        return _core.GraphLauncher(
            self.spec.plan, self.setup, self.ws.order, a, w, c, d, bias,
            capture_only=capture_only, scale_a=scale_a, scale_b=scale_b,
        )  # fmt: skip

    def graph_for(self, ptrs: tuple[int, ...]) -> tuple[Any, bool]:
        """(launcher, direct) for a call with these user pointers (see GRAPHS_PER_PLAN): a
        cached graph, a new one, or the least recently used one retargeted, to launch (direct
        False); or the entry's capture-only launcher, whose ``launch_direct`` enqueues the call
        without a graph (True)."""
        self.clock += 1
        g = self.graphs.get(ptrs)
        if g is not None:
            self.graphs.move_to_end(ptrs)  # LRU order
            self.used_at[ptrs] = self.clock
            return g, False
        seen = self.seen_at.pop(ptrs, None)
        stale = next(iter(self.graphs)) if len(self.graphs) >= GRAPHS_PER_PLAN else None
        if seen is None or (stale is not None and seen < self.used_at.get(stale, 0)):
            self.seen_at[ptrs] = self.clock
            if len(self.seen_at) > SEEN_PER_PLAN:
                self.seen_at.popitem(last=False)
            self.direct_launches += 1
            if self.direct is None:
                self.direct = self._new_graph(ptrs, capture_only=True)
            return self.direct, True
        if stale is None:
            g = self._new_graph(ptrs)
        else:
            g = self.graphs.pop(stale)
            self.used_at.pop(stale, None)
            g.update(*ptrs)
            self.graph_retargets += 1
        self.graphs[ptrs] = g
        self.used_at[ptrs] = self.clock
        return g, False

    def capture_graph(self, ptrs: tuple[int, ...]):
        """The capture-only graph (made at the first capture, for these pointers' checks):
        ``capture(stream, *ptrs)`` records one launch into the caller's capture. One per entry,
        whatever the pointers (each capture records its own); kept, with the entry and its
        workspace, until the communicator closes."""
        if self.capturer is None:
            self.capturer = self._new_graph(ptrs, capture_only=True)
            self.ws.pinned = True  # the workspace may not be freed while callers' graphs use it
        return self.capturer

    def run(self, op: str, comm: Communicator, tensors, out, capturing: bool):
        """Replay this rank's CUDA graph of the plan; ``capturing``: the current stream is being
        captured, so record the plan's nodes into the caller's graph instead."""
        device = comm.device
        ptrs, out = user_ptrs(op, self, tensors, out, device)
        stream = stream_ptr(device)
        if capturing:
            self.capture_graph(ptrs).capture(stream, *ptrs)
        else:
            g, direct = self.graph_for(ptrs)
            err = g.error()
            if not err and self.ws.pinned:  # a replay of a captured graph on this workspace failed
                err = self.ws.order.capture_error()
            if err:
                comm.mark_broken(err)
                comm.raise_if_broken()
            if direct:
                g.launch_direct(stream, *ptrs)
            else:
                g.launch(stream)
        if self.gather is None:
            return out
        gathered = torch.empty(self.gathered_shape, dtype=self.precision.dtype, device=device)
        kdim = self.gathered_shape[1]
        a, w = tensors["a"], tensors["w"]
        for src, off, row0, rows in self.gather:
            base = self.slots if src == "slots" else (a if src == "a" else w).view(-1)
            gathered[row0 : row0 + rows].copy_(base[off : off + rows * kdim].view(rows, kdim))
        # The slots are rewritten by the peers after this rank's next entry barrier: a launch on
        # another stream must wait for these copies too, not only for the graph (inside a
        # capture: a launch on another stream of the same capture).
        self.ws.order.record(stream)
        return out, gathered

    # -- what the entry cache calls ------------------------------------------------------------
    def workspace_grown(self, comm, ws, capturing, retired, kept) -> None:
        if self.ws is ws:
            return
        if capturing:
            retired.extend(self.graphs.values())
            if self.direct is not None:
                retired.append(self.direct)
        if self.capturer is not None:
            kept.append(self.capturer)
            self.capturer = None
        self.place(comm)

    def launch_error(self) -> str:
        graphs = list(self.graphs.values())
        graphs += [g for g in (self.capturer, self.direct) if g is not None]
        return next((e for g in graphs if (e := g.error())), "")

    @property
    def eager_graphs(self) -> int:
        return len(self.graphs)

    @property
    def captured(self) -> bool:
        return self.capturer is not None

    def release(self) -> None:
        self.graphs.clear()
        self.used_at.clear()
        self.capturer = None
        self.direct = None
