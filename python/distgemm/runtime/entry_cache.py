"""The op entries of a Communicator: one per call signature (``EntryKey``), made at its first call.

An entry is made once, collectively: the ranks exchange their call signatures (the same error on
every rank), the path is chosen (``choose.choose_path``: the same on every rank) and the path's
state is made (``paths``): the workspace and graph setup of the overlapped plan, the buffers of
the fused kernel, or nothing for the collective path (its scratch is the communicator's,
``CollectiveScratch``). Later calls find the entry with one dict lookup and run its state.

The cache hangs on the communicator as an attachment (``Communicator.attach``): the communicator
calls it back when its workspace grows (every entry is re-pointed), when it looks for launch
errors, when it reports memory and when it closes.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import kernel_table, machine, tuning_table
from .capture import stream_capturing
from .choose import choose_path, choose_steps
from .communicator import Communicator
from .paths.collective import CollectiveState, collective_unavailable
from .paths.common import PathState
from .paths.fused import FusedState
from .paths.overlapped import GRAPHS_PER_PLAN, OverlappedState
from .precision import Precision
from .spec import Spec

__all__ = ["EntryKey", "Entry", "EntryCache", "MAX_PLANS", "entry_cache"]

# Cached entries per communicator; beyond it the least recently used entry and its graphs go
# (entries recorded into a caller's CUDA graph stay: see EntryCache).
MAX_PLANS = 64
# The name of the cache on its communicator (Communicator.attach).
ATTACHMENT = "entries"


class EntryKey(NamedTuple):
    """What makes two calls share an entry: the op and everything its plan depends on. Read by
    name only (a NamedTuple for its construction cost on the per-call path)."""

    op: str
    schedule: str
    steps: int | None
    precision: Precision
    shapes: tuple[tuple[str, tuple[int, ...] | None], ...]  # (operand name, shape)
    beta: float
    return_gathered: bool
    path: str  # the requested path (validate.PATHS: "auto", "overlap", "collective", "fused", ...)


@dataclass(eq=False)
class Entry:
    """One cached call signature's spec, the path it runs, why, and that path's state (the
    cache maps its EntryKey to it)."""

    spec: Spec
    path: str  # the path it runs: "overlap", "collective" or "fused" (choose_path)
    choice: dict[str, Any]  # why that path (path_choices reports it)
    state: PathState


def signature(key: EntryKey, error: str | None) -> dict[str, Any]:
    """What a rank exchanges at entry creation: the key in words, the digest of its tuning table
    (the table decides S, tile and path) and its own error."""
    sig = {
        "op": key.op,
        "schedule": key.schedule,
        "steps": key.steps,
        "dtype": str(key.precision),
        "path": key.path,
    }
    for name, shape in key.shapes:
        sig[f"{name}.shape"] = None if shape is None else list(shape)
    sig.update(
        beta=key.beta,
        return_gathered=key.return_gathered,
        tuning_table=tuning_table.active_digest(),
        error=error,
    )
    return sig


def signature_mismatch(sigs: Sequence[dict[str, Any]], what: str) -> str | None:
    """The first field in which a rank's signature differs from rank 0's, in words, or None. A
    rank's own validation error (``error`` key) is reported first. Pure, so that every rank
    computes the same verdict."""
    ref = sigs[0]
    if not ref.get("error") and all(s == ref for s in sigs[1:]):  # the usual case, compared in C
        return None
    for r, s in enumerate(sigs):
        if s.get("error"):
            return f"{what}: rank {r} rejected its inputs: {s['error']}"
    for r, s in enumerate(sigs[1:], start=1):
        for key in ref:
            if key == "error":
                continue
            if s.get(key) != ref[key]:
                fix = (
                    f"every rank must load the same tuning table ({tuning_table.TABLE_ENV} or "
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


def make_state(
    comm: Communicator, spec: Spec, key: EntryKey, path: str, choice: dict[str, Any]
) -> PathState:
    """The state of ``path`` for an entry (collective where the path needs setup)."""
    if path == "overlap":
        return OverlappedState.create(comm, spec, key.precision, key.beta, key.return_gathered)
    if path == "fused":
        return FusedState.create(comm, spec, key.precision, key.beta, choice)
    return CollectiveState.create(
        spec, key.precision, key.beta, key.return_gathered, choice.get("all_reduce", "nccl")
    )


class EntryCache(collections.OrderedDict):
    """A communicator's entries in least-recently-used order, at most MAX_PLANS that can be
    evicted: an entry recorded into a caller's CUDA graph (its state ``captured``) is never
    evicted, since the caller's graph references its memory; nothing is evicted while a capture
    is in progress (eviction synchronises the device, which a capture forbids): the cache then
    shrinks back at the next insertion outside a capture."""

    def __init__(self, comm: Communicator):
        super().__init__()
        self.comm = comm
        # Capture-only graphs of entries re-pointed by a growth (callers' graphs replay them:
        # kept until close) and eager graphs dropped by a growth inside a capture (destroyed
        # after the next synchronisation).
        self.kept_capturers: list[Any] = []
        self.retired_graphs: list[Any] = []

    def create(self, key: EntryKey, make, capturing: bool | None = None) -> Entry:
        """The entry of a first call: ``make()`` validates and builds the Spec (its Plan built
        once: S and tile from the tuning table or the defaults), the ranks exchange their
        signatures (the same error on every rank), the path is chosen and its state made.
        ``capturing``: whether the call is being captured (None: asked of torch here); a
        captured entry evicts nothing (``insert``).
        Where the others do not come to the exchange within the communicator's timeout (they
        called shapes whose entries they hold already), a rank whose own inputs were refused
        raises its own error, naming the exchange that failed; else the exchange's RuntimeError
        (the communicator is then broken)."""
        comm = self.comm
        spec, error, exc = None, None, None
        try:
            spec = make()
        except (ValueError, TypeError) as e:
            error, exc = f"{type(e).__name__}: {e}", e
        try:
            sigs = comm.all_gather(signature(key, error), f"{key.op} plan signature")
        except RuntimeError as lost:  # the others did not come (they may hold this entry)
            if exc is None:
                raise
            # This rank's own inputs were refused: that is the error to see, with the reason
            # no rank could be told.
            raise type(exc)(f"{exc} (and the ranks could not compare: {lost})") from lost
        if exc is not None and all(s["error"] == error for s in sigs):
            raise exc  # every rank rejected the same inputs the same way: the plain error
        problem = signature_mismatch(sigs, key.op)
        if problem:
            raise ValueError(problem)
        if key.path in ("auto", "overlap"):
            # Which kernel runs each GEMM shape on this GPU model: the same table on every rank
            # of a node, handed to the runtime once per process before its first plan is made
            # or priced (the cost model prices the kernel the table gives a plan's steps).
            kernel_table.install(comm.device)
        mc = machine.constants_for(comm.device, spec.tp) if key.path == "auto" else None
        unavailable = collective_unavailable(comm.group)
        spec, steps_report, pred = choose_steps(
            spec, key.steps, key.precision.dtype, mc, unavailable
        )
        path, choice = choose_path(spec, key.path, key.precision.dtype, unavailable, mc, pred)
        choice.update(steps_report)
        entry = Entry(spec, path, choice, make_state(comm, spec, key, path, choice))
        self.insert(key, entry, stream_capturing() if capturing is None else capturing)
        return entry

    def insert(self, key: EntryKey, entry: Entry, capturing: bool = False) -> None:
        if not capturing:
            while len(self) >= MAX_PLANS:
                victim = self.evictable()
                if victim is None:
                    break
                self.drop(victim)
        self[key] = entry

    def evictable(self) -> EntryKey | None:
        """The least recently used key whose entry was never captured, or None."""
        return next((k for k, e in self.items() if not e.state.captured), None)

    def drop(self, key: EntryKey) -> None:
        entry = self.get(key)
        if entry is None:
            return
        if entry.state.captured:
            raise RuntimeError(
                "this plan was recorded into a CUDA graph, whose replays use its memory: it is "
                "freed only by Communicator.close()"
            )
        del self[key]
        # Instantiated graphs may still run on the GPU, and a graph's own error sink is freed
        # with it: wait for the device first. A state without one (the collective path's, or an
        # overlapped entry whose calls were all enqueued directly: its launcher records into
        # the launch order's shared sink and holds streams and events only, which CUDA frees
        # once their work is done) is dropped without waiting, so that a stream of new shapes
        # beyond MAX_PLANS costs no synchronisation per call.
        if entry.state.eager_graphs:
            self.comm.synchronize()
        entry.state.release()

    # -- Attachment ------------------------------------------------------------------------
    def workspace_grown(self, ws, capturing: bool) -> None:
        if not capturing:
            self.retired_graphs.clear()  # the device was synchronised
        for entry in list(self.values()):
            entry.state.workspace_grown(
                self.comm, ws, capturing, self.retired_graphs, self.kept_capturers
            )

    def launch_error(self) -> str:
        """'' or the first timeout report of an entry's graphs, the capture-only graphs (kept
        ones included) too (read after synchronising)."""
        for entry in list(self.values()):
            e = entry.state.launch_error()
            if e:
                return e
        return next((e for g in self.kept_capturers if (e := g.error())), "")

    def memory_stats(self) -> dict[str, int]:
        states = [e.state for e in self.values()]
        return {
            "plans": len(states),
            "eager_graphs": sum(s.eager_graphs for s in states),
            "captured_graphs": len(self.kept_capturers) + sum(s.captured for s in states),
            "graph_retargets": sum(s.graph_retargets for s in states),
            "direct_launches": sum(s.direct_launches for s in states),
            "max_plans": MAX_PLANS,
            "graphs_per_plan": GRAPHS_PER_PLAN,
        }

    def close(self) -> list:
        """Drop every entry and its graphs (the device is synchronised by the communicator)."""
        for entry in self.values():
            entry.state.release()
        self.clear()
        self.kept_capturers.clear()
        self.retired_graphs.clear()
        return []


def entry_cache(comm: Communicator) -> EntryCache:
    """The communicator's entry cache, made at its first use."""
    cache = comm.attachment(ATTACHMENT)
    if cache is None:
        cache = comm.attach(ATTACHMENT, EntryCache(comm))
    return cache
