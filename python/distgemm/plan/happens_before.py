"""Happens-before order of a Plan's events, with the progress checks that building it makes.

Edges come from stream order (each device's GEMMs in order, its copies in order), from a copy's
``after_gemm`` and from flags (a signal happens before every wait on that flag). Building the
order proves progress: every waited flag is set exactly once and no wait is cyclic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "Event",
    "Fail",
    "HappensBefore",
    "Violation",
    "build_happens_before",
    "event_name",
    "flag_setters",
    "event_step",
]

Event = tuple[str, int, int]  # ("gemm" | "copy", device, index)


@dataclass
class Violation:
    """One broken invariant: which, where (device and step, None where it is not tied to one)
    and what, in words."""

    invariant: str
    device: int | None
    step: int | None
    message: str

    def __str__(self) -> str:  # pragma: no cover - formatting only
        where = []
        if self.device is not None:
            where.append(f"device {self.device}")
        if self.step is not None:
            where.append(f"step {self.step}")
        return (
            f"[{self.invariant}] {', '.join(where)}: {self.message}"
            if where
            else f"[{self.invariant}] {self.message}"
        )


# fail(invariant, event or None, message): records one violation.
Fail = Callable[[str, Event | None, str], None]


def event_name(plan: dict, ev: Event) -> str:
    kind, d, j = ev
    return (
        f"GEMM dev{d} step{event_step(plan, ev)}"
        if kind == "gemm"
        else f"copy dev{d} #{j} (step{event_step(plan, ev)})"
    )


def event_step(plan: dict, ev: Event) -> int:
    """The iteration of a GEMM (a device skips the GEMMs of empty tiles, so it may differ from
    the GEMM's position), the display step of a copy."""
    kind, d, j = ev
    op = plan["devices"][d]["gemms" if kind == "gemm" else "copies"][j]
    return op["iteration"] if kind == "gemm" else op["step"]


class HappensBefore:
    """A topological order of a plan's events and, per event, its ancestors as a bitmask over
    that order, so that ``hb(a, b)`` is one shift."""

    def __init__(self, order: list[Event], preds: dict[Event, set]):
        self.order = order
        self.index = {ev: i for i, ev in enumerate(order)}
        self.anc: dict[Event, int] = {}
        for ev in order:
            m = 0
            for p in preds[ev]:
                m |= self.anc[p] | (1 << self.index[p])
            self.anc[ev] = m

    def hb(self, a: Event, b: Event) -> bool:
        """a happens before b."""
        return bool(self.anc[b] >> self.index[a] & 1)


def _events(plan: dict) -> list[Event]:
    events: list[Event] = []
    for d, dev in enumerate(plan["devices"]):
        for i in range(len(dev["gemms"])):
            events.append(("gemm", d, i))
        for j in range(len(dev["copies"])):
            events.append(("copy", d, j))
    return events


def _stream_and_signal_edges(
    plan: dict, preds: dict[Event, set], fail: Fail
) -> dict[tuple[int, int], Event]:
    """Adds stream-order and ``after_gemm`` edges; returns the one setter of each flag."""
    tp, nflags = plan["tp"], plan["num_flags"]
    setters: dict[tuple[int, int], Event] = {}
    for d, dev in enumerate(plan["devices"]):
        for kind, ops in (("gemm", dev["gemms"]), ("copy", dev["copies"])):
            for j, op in enumerate(ops):
                ev = (kind, d, j)
                if j > 0:
                    preds[ev].add((kind, d, j - 1))
                if kind == "copy" and op["after_gemm"] >= 0:
                    if op["after_gemm"] >= len(dev["gemms"]):
                        fail(
                            "progress",
                            ev,
                            f"depends on GEMM {op['after_gemm']}, which device {d} does not have",
                        )
                    else:
                        preds[ev].add(("gemm", d, op["after_gemm"]))
                for s in op["signals"]:
                    key = (s["device"], s["flag"])
                    if not (0 <= s["device"] < tp and 0 <= s["flag"] < nflags):
                        fail(
                            "progress",
                            ev,
                            f"signals flag {s['flag']} on device {s['device']}, "
                            f"outside the plan's {nflags} flags x {tp} devices",
                        )
                        continue
                    if key in setters:
                        fail(
                            "progress",
                            ev,
                            f"sets flag {s['flag']} on device {s['device']}, already set by "
                            f"{event_name(plan, setters[key])}: a generation flag must be set "
                            "once per launch, or a wait cannot tell the two apart",
                        )
                    else:
                        setters[key] = ev
    return setters


def flag_setters(plan: dict) -> dict[tuple[int, int], Event]:
    """(device, flag) -> the one event that sets it, for a plan whose flags each have one setter
    (ValueError naming the first problem otherwise)."""

    def fail(invariant: str, ev: Event | None, message: str) -> None:
        raise ValueError(f"[{invariant}] {event_name(plan, ev) if ev else ''}: {message}")

    return _stream_and_signal_edges(plan, {ev: set() for ev in _events(plan)}, fail)


def _wait_edges(
    plan: dict, preds: dict[Event, set], setters: dict[tuple[int, int], Event], fail: Fail
) -> None:
    """Adds an edge from each waited flag's setter to the waiting event."""
    for d, dev in enumerate(plan["devices"]):
        for kind, ops in (("gemm", dev["gemms"]), ("copy", dev["copies"])):
            for j, op in enumerate(ops):
                ev = (kind, d, j)
                for f in op["waits"]:
                    if (d, f) not in setters:
                        fail(
                            "progress",
                            ev,
                            f"waits for flag {f} on device {d}, which nothing sets: "
                            "it would time out",
                        )
                    else:
                        preds[ev].add(setters[(d, f)])


def build_happens_before(plan: dict, fail: Fail) -> HappensBefore | None:
    """The plan's happens-before order, or None (after reporting it) on a cyclic wait."""
    events = _events(plan)
    preds: dict[Event, set] = {ev: set() for ev in events}
    setters = _stream_and_signal_edges(plan, preds, fail)
    _wait_edges(plan, preds, setters, fail)
    # Kahn's algorithm; leftover events are on (or behind) a cyclic wait.
    succ: dict[Event, list[Event]] = {ev: [] for ev in events}
    indeg = {ev: len(preds[ev]) for ev in events}
    for ev in events:
        for p in preds[ev]:
            succ[p].append(ev)
    order: list[Event] = []
    ready = [ev for ev in events if indeg[ev] == 0]
    while ready:
        ev = ready.pop(0)
        order.append(ev)
        for s in succ[ev]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if len(order) != len(events):
        stuck = [ev for ev in events if indeg[ev] > 0]
        names = "; ".join(
            f"{event_name(plan, ev)} waits for "
            + ", ".join(event_name(plan, p) for p in sorted(preds[ev]) if indeg.get(p, 0) > 0)
            for ev in stuck[:4]
        )
        fail("progress", stuck[0], f"cyclic wait across devices: {names}")
        return None
    return HappensBefore(order, preds)
