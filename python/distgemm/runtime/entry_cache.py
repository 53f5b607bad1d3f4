"""The plan cache of a Communicator: one entry per (op, shapes, dtype, schedule, steps, path),
created once at an op's first call (signature exchange, the Plan, its workspace and graph setup)
and holding the CUDA graphs instantiated for it, one per set of user pointers, and the graph that
records it into callers' CUDA graph captures."""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from . import _core, tuning
from .precision import Precision
from .validation import Spec

if TYPE_CHECKING:
    from .comm import Communicator

# Cached plans per communicator; beyond it the least recently used plan and its graphs go (plans
# recorded into a caller's CUDA graph stay: see PlanCache).
MAX_PLANS = 64
# Instantiated graphs per plan, keyed by the user pointers. Activations from torch's caching
# allocator tend to come back at a few addresses, so a small set of graphs turns most calls into
# a plain replay; a miss retargets the least recently used graph (cudaGraphExecUpdate).
GRAPHS_PER_PLAN = 4


class _RawCuda:
    """A device buffer for torch.as_tensor via __cuda_array_interface__ (no ownership)."""

    def __init__(self, ptr: int, numel: int, itemsize: int = 2):
        self.__cuda_array_interface__ = {
            "shape": (numel,),
            "typestr": f"<i{itemsize}",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


@dataclass
class Entry:
    spec: Spec
    # The calls' dtype (A's and B's, the gathered operand's too), fp8 scales and accumulation.
    precision: Precision
    beta: float
    ws: Any
    bases: list[int]
    graphs: collections.OrderedDict[tuple[int, ...], Any]
    gather: list[tuple[str, int, int, int]] | None = None  # (src, offset, row0, rows)
    slots: torch.Tensor | None = None
    gather_shape: tuple[int, int] | None = None
    out_shape: tuple[int, ...] = ()
    path: str | None = None  # "overlap", "collective" or "fused", decided at creation (autopath)
    want_gathered: bool = False  # all_gather_gemm(..., return_gathered=True)
    scratch: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)  # (name, stream)
    tuning: dict[str, Any] | None = None  # why the path: table or model (autopath.decide_path)
    ws_bytes: int = 0  # bytes addressable from each base (the plan's layout total)
    setup: Any = None  # _core.GraphSetup of this rank's graphs (plans that launch)
    # The capture-only _core.DeviceGraph that records this plan into callers' CUDA graphs (see
    # capture_graph). Callers' graphs keep referencing its error sink and the workspace, so it
    # lives until Communicator.close(): the entry is never evicted once it has one.
    capturer: Any = None
    # The fused path's shapes, split-K factor, workspace layout and control region
    # (distgemm.fused.attach_fused); None for the other paths.
    fused: dict[str, Any] | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.precision.dtype

    @property
    def out_dtype(self) -> torch.dtype:
        return self.precision.out_dtype

    @property
    def has_bias(self) -> bool:
        return "bias" in self.spec.shapes

    @functools.cached_property
    def collective_kind(self) -> str:
        """The collective path's branch, read from the C++ definition once per plan (not per
        call): "gather_a" / "gather_w" (all-gather of the activations or of the weight),
        "all_reduce", "scatter_n" (D sharded on N: rs_tile_b), "scatter_m" (D sharded on M)."""
        d = self.spec.plan.definition
        if d["collective"] == "all_gather":
            return "gather_a" if d["rotating"] == "A" else "gather_w"
        if d["collective"] == "all_reduce":
            return "all_reduce"
        return "scatter_n" if d["partition"]["d"] == "N" else "scatter_m"

    @functools.cached_property
    def gathered_shape(self) -> tuple[int, int]:
        """The whole all-gathered operand's shape (all-gather plans)."""
        return _gathered_shape(self.spec)


class PlanCache(collections.OrderedDict):
    """A communicator's op entries in least-recently-used order, at most MAX_PLANS that can be
    evicted: an entry recorded into a caller's CUDA graph (``capturer`` set) is never evicted,
    since the caller's graph references its memory; nothing is evicted while a capture is in
    progress (eviction synchronises the device, which a capture forbids): the cache then
    shrinks back at the next insertion outside a capture."""

    def insert(
        self, key, entry: Entry, synchronize: Callable[[], None], capturing: bool = False
    ) -> None:
        if not capturing:
            while len(self) >= MAX_PLANS:
                victim = self.evictable()
                if victim is None:
                    break
                self.drop(victim, synchronize)
        self[key] = entry

    def evictable(self):
        """The least recently used key whose entry was never captured, or None."""
        return next((k for k, e in self.items() if e.capturer is None), None)

    def drop(self, key, synchronize: Callable[[], None]) -> None:
        entry = self.get(key)
        if entry is None:
            return
        if entry.capturer is not None:
            raise RuntimeError(
                "this plan was recorded into a CUDA graph, whose replays use its memory: it is "
                "freed only by Communicator.close()"
            )
        del self[key]
        # The graphs may still run on the GPU; destroying an executable graph mid-flight is
        # not allowed, so wait for the device first (eviction is rare: MAX_PLANS).
        synchronize()
        entry.graphs.clear()

    def graph_error(self) -> str:
        """'' or the first timeout report of a graph of this cache, the capture-only graphs
        included (read after synchronising)."""
        for entry in list(self.values()):
            graphs = list(entry.graphs.values())
            if entry.capturer is not None:
                graphs.append(entry.capturer)
            for g in graphs:
                e = g.error()
                if e:
                    return e
        return ""

    def release(self) -> None:
        """Drop every entry and its graphs (the device is synchronised by the caller)."""
        for entry in self.values():
            entry.graphs.clear()
            entry.capturer = None
        self.clear()


def _gathered_shape(spec: Spec) -> tuple[int, int]:
    return (spec.m if spec.plan.definition["rotating"] == "A" else spec.n, spec.k)


def gather_recipe(spec: Spec, rank: int):
    """How to assemble the gathered operand of an all-gather plan on ``rank`` after a launch:
    per sub-GEMM, the rotating operand's rows come from the user tensor (own chunks) or from a
    receive slot (the peers' chunks, still valid until this rank's next launch)."""
    plan = spec.plan.to_dict()
    rot = "a" if plan["definition"]["rotating"] == "A" else "b"
    recipe = []
    for g in plan["devices"][rank]["gemms"]:
        r = g[rot]
        row0, rows = (g["m0"], g["m"]) if rot == "a" else (g["n0"], g["n"])
        recipe.append(("slots" if r["buffer"] == "slots" else rot, r["offset"], row0, rows))
    return recipe, _gathered_shape(spec)


def signature(key, error: str | None) -> dict[str, Any]:
    """What a rank exchanges at plan creation: the cache key in words, the digest of its tuning
    table (the table decides S, tile and path) and its own error."""
    op, schedule, steps, dtype, shapes, beta, gathered, path = key
    sig = {"op": op, "schedule": schedule, "steps": steps, "dtype": str(dtype), "path": path}
    for name, shape in shapes:
        sig[f"{name}.shape"] = None if shape is None else list(shape)
    sig.update(
        beta=beta, return_gathered=gathered, tuning_table=tuning.active_digest(), error=error
    )
    return sig


def signature_mismatch(sigs: Sequence[dict[str, Any]], what: str) -> str | None:
    """The first field in which a rank's plan signature differs from rank 0's, in words, or
    None. A rank's own validation error (``error`` key) is reported first. Pure, so that every
    rank computes the same verdict."""
    for r, s in enumerate(sigs):
        if s.get("error"):
            return f"{what}: rank {r} rejected its inputs: {s['error']}"
    ref = sigs[0]
    for r, s in enumerate(sigs[1:], start=1):
        for key in ref:
            if key == "error":
                continue
            if s.get(key) != ref[key]:
                fix = (
                    f"every rank must load the same tuning table ({tuning.TABLE_ENV} or "
                    "distgemm.load_tuning_table)"
                    if key == "tuning_table"
                    else "every rank must call the op with the same shapes, dtype, schedule, "
                    "steps and path"
                )
                return (
                    f"{what}: ranks disagree at plan creation: rank {r} has {key}={s.get(key)!r}"
                    f" where rank 0 has {key}={ref[key]!r}; {fix}"
                )
        extra = set(s) - set(ref)
        if extra:
            key = sorted(extra)[0]
            return (
                f"{what}: ranks disagree at plan creation: rank {r} has {key}={s[key]!r} "
                "which rank 0 does not have"
            )
    return None


def create_entry(comm: Communicator, key, make: Callable[[], Spec]) -> Entry:
    """The entry of a first call: ``make()`` validates and builds the Plan (once; S and tile from
    the tuning table or the defaults), the ranks exchange their signatures (the same error on
    every rank), the path is decided (``autopath.decide_path``: the same on every rank), then a
    plan that launches gets its workspace and graph setup. Cached in ``comm.plans``."""
    # autopath and fused import collective and launch, which import this module
    from .autopath import decide_path
    from .fused import attach_fused

    op, _, _, precision, _, beta, gathered, path = key
    spec, error, exc = None, None, None
    try:
        spec = make()
    except (ValueError, TypeError) as e:
        error, exc = f"{type(e).__name__}: {e}", e
    sigs = comm.all_gather(signature(key, error), f"{op} plan signature")
    if exc is not None and all(s["error"] == error for s in sigs):
        raise exc  # every rank rejected the same inputs the same way: the plain error
    problem = signature_mismatch(sigs, op)
    if problem:
        raise ValueError(problem)
    chosen, why = decide_path(spec, path, comm, precision.dtype)
    entry = Entry(
        spec=spec,
        precision=precision,
        beta=beta,
        ws=None,
        bases=[],
        graphs=collections.OrderedDict(),
        out_shape=torch.Size(spec.shapes["out"]),
        path=chosen,
        want_gathered=gathered,
        tuning=why,
    )
    if entry.path == "overlap":  # the collective path launches no plan: no workspace
        attach_workspace(comm, entry, gathered)
    elif entry.path == "fused":
        attach_fused(comm, entry)
    comm.plans.insert(
        key,
        entry,
        lambda: torch.cuda.synchronize(comm.device),
        stream_capturing(),
    )
    return entry


def stream_capturing() -> bool:
    """Whether torch's current CUDA stream is being captured (False where torch has no CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def attach_workspace(comm: Communicator, entry: Entry, gathered: bool) -> None:
    """The symmetric workspace of a plan that launches, its graphs' setup and the recipe of its
    gathered operand. Also re-points an entry when the communicator's workspace grows: its eager
    graphs, built on the old bases, are dropped (the caller has synchronised the device) and
    rebuilt at its next call."""
    spec = entry.spec
    # The entry's own plan (its partial transport and scale slots included), slots of its types.
    layout = spec.plan.layout(
        spec.plan.slot_elem_bytes(entry.dtype.itemsize, entry.out_dtype.itemsize)
    )
    entry.graphs.clear()
    entry.ws, entry.bases = comm.workspace_for(layout)
    # workspace_for shifts each base so that exactly the layout's bytes follow it: the graph
    # checks its own plan's layout against this.
    entry.ws_bytes = int(layout["total_bytes"])
    entry.setup = _core.GraphSetup(
        rank=comm.rank,
        cuda_device=comm.device.index,
        dtype=entry.precision.name,
        workspace_bases=entry.bases,
        workspace_bytes=entry.ws_bytes,
        timeout_s=comm.wait_timeout_s,
        alpha=1.0,
        beta=entry.beta,
        bias=entry.has_bias,
        tile_n=spec.tile_n,
        b_n_major=spec.b_n_major,
        fast_accum=entry.precision.fast_accum,
    )
    if gathered:
        entry.gather, entry.gather_shape = gather_recipe(spec, comm.rank)
        slot_elems = int(spec.plan.slot_elems)
        if slot_elems:
            # This rank's slots start at its shifted base (slots_offset is 0 in Plan::layout).
            raw = _RawCuda(
                entry.bases[comm.rank] + int(layout["slots_offset"]),
                slot_elems,
                entry.dtype.itemsize,
            )
            entry.slots = torch.as_tensor(raw, device=comm.device).view(entry.dtype)


def _new_graph(entry: Entry, ptrs: tuple[int, ...], capture_only: bool = False):
    """A DeviceGraph of the entry's plan for ``ptrs`` (a, w, c, out, bias, scale_a, scale_b)."""
    a, w, c, d, bias, scale_a, scale_b = ptrs
    return _core.DeviceGraph(
        entry.spec.plan, entry.setup, entry.ws.order, a, w, c, d, bias,
        capture_only=capture_only, scale_a=scale_a, scale_b=scale_b,
    )  # fmt: skip


def graph_for(entry: Entry, ptrs: tuple[int, ...]):
    """This rank's graph of the entry's plan for these user pointers (a, w, c, out, bias,
    scale_a, scale_b): a cached one, a new one (up to GRAPHS_PER_PLAN), or the least recently
    used one retargeted."""
    g = entry.graphs.get(ptrs)
    if g is not None:
        entry.graphs.move_to_end(ptrs)  # LRU order
        return g
    if len(entry.graphs) < GRAPHS_PER_PLAN:
        g = _new_graph(entry, ptrs)
    else:
        _, g = entry.graphs.popitem(last=False)
        g.update(*ptrs)
    entry.graphs[ptrs] = g
    return g


def capture_graph(entry: Entry, ptrs: tuple[int, ...]):
    """The entry's capture-only graph (made at its first capture, for these pointers' checks):
    ``capture(stream, *ptrs)`` records one launch into the caller's capture. One per entry,
    whatever the pointers (each capture records its own); kept, with the entry and its
    workspace, until Communicator.close()."""
    if entry.capturer is None:
        entry.capturer = _new_graph(entry, ptrs, capture_only=True)
        entry.ws.pinned = True  # the workspace may not be freed while callers' graphs use it
    return entry.capturer
