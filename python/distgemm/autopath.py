"""The "auto" path choice: at a plan's first call, time the overlapped and the collective path on
the call's tensors and keep the faster, the same choice on every rank."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .collective import collective_unavailable, run_collective
from .entries import Entry
from .launch import launch

if TYPE_CHECKING:
    from .comm import Communicator

# "auto": how the first call measures both paths. Alternating rounds (overlap, collective,
# collective, overlap, ...) so that clock ramp-up and other ranks' noise hit both alike.
TUNE_ROUNDS = 6
TUNE_ROUNDS_LONG, TUNE_LONG_MS = 3, 5.0  # calls of >= 5 ms: 3 rounds
TUNE_ROUND_MS = 2.0  # timed calls per round: enough for ~2 ms of work ...
TUNE_MAX_CALLS = 16  # ... at most this many (plus one untimed call that fills the queue)


def pick_path(everyone: Sequence[dict[str, Sequence[float]]]) -> tuple[str, dict[str, float]]:
    """The "auto" verdict from every rank's per-round ms of both paths (``everyone[r][path][i]``):
    per round the maximum over ranks, then the median over rounds; "overlap" unless the
    collective path is strictly faster. Pure, so that every rank computes the same verdict."""
    rounds = min(len(t[p]) for t in everyone for p in ("overlap", "collective"))
    if rounds < 1:
        raise ValueError("pick_path needs at least one timed round of each path")
    med = {
        p: statistics.median(max(t[p][i] for t in everyone) for i in range(rounds))
        for p in ("overlap", "collective")
    }
    return ("overlap" if med["overlap"] <= med["collective"] else "collective"), med


def choose_path(op: str, comm: Communicator, entry: Entry, tensors, out):
    """``path="auto"``, first call of a plan: time the overlapped and the collective path on
    these very tensors, take every round's maximum over the ranks (the slowest rank sets a
    collective's pace) and keep the path with the lower median. Every rank gets the same numbers
    through the control group, hence the same choice. Costs 2 x TUNE_ROUNDS rounds of calls (each
    ~2 ms of work, 3 rounds for calls of 5 ms or more) and as many host synchronisations, once
    per plan; the result of the last call of the chosen path is returned (both paths compute the
    same thing)."""
    runs = {
        "overlap": lambda: launch(op, comm, entry, tensors, out),
        "collective": lambda: run_collective(op, comm, entry, tensors, out),
    }
    why_not = collective_unavailable(comm.group)
    if why_not:  # the same verdict on every rank: it depends on the group only
        entry.path, entry.tuning = "overlap", dict(collective_unavailable=why_not)
        return runs["overlap"]()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(path: str, calls: int) -> float:
        # An untimed call first keeps the GPU busy while the host enqueues the timed ones: the
        # steady state of a model, where launch latency hides behind queued work; without it
        # the collective path, whose host side is longer, would be charged its launch latency.
        runs[path]()
        start.record()
        for _ in range(calls):
            runs[path]()
        stop.record()
        wait_event(stop, comm.timeout_s, f"{op} path choice ({path} path)", comm)
        return start.elapsed_time(stop) / calls

    # One untimed call each (graph upload, NCCL's lazy communicator set-up), then one timed call
    # to size the rounds; the count must be the same on every rank (collectives). An error here
    # propagates: it is a real failure, not a reason to pick the other path on this rank only.
    probe = {p: (runs[p](), timed(p, 1))[1] for p in runs}
    comm.check()
    probe = comm.all_gather(probe, f"{op} path choice (probe)")
    slowest = max(max(pr.values()) for pr in probe)
    calls = max(1, min(TUNE_MAX_CALLS, int(TUNE_ROUND_MS / max(slowest, 1e-3))))
    # Long calls: fewer rounds (their choice is rarely close, and each round costs 2 calls).
    rounds = TUNE_ROUNDS if slowest < TUNE_LONG_MS else TUNE_ROUNDS_LONG
    times: dict[str, list[float]] = {p: [] for p in runs}
    for r in range(rounds):
        order = ("overlap", "collective") if r % 2 == 0 else ("collective", "overlap")
        for p in order:
            times[p].append(timed(p, calls))
    comm.check()
    everyone = comm.all_gather(times, f"{op} path choice (timings)")
    entry.path, med = pick_path(everyone)
    entry.tuning = dict(
        overlap_ms=med["overlap"],
        collective_ms=med["collective"],
        rounds=rounds,
        calls_per_round=calls,
    )
    if entry.path == "collective":
        entry.graphs.clear()  # synchronised above: nothing of them is in flight
    return runs[entry.path]()


def wait_event(event, timeout_s: float, what: str, comm: Communicator | None = None) -> None:
    """Wait for a CUDA event with a bound (``torch.cuda.Event.synchronize`` has none): a
    collective that a rank never joined would otherwise hold this rank until NCCL's watchdog.
    RuntimeError after ``timeout_s``; the communicator is then marked broken."""
    deadline = time.monotonic() + timeout_s
    while not event.query():
        if time.monotonic() > deadline:
            msg = (
                f"{what}: the GPU work did not finish within {timeout_s:g} s (a rank did not "
                "join a collective, or a kernel hangs)"
            )
            if comm is None:
                raise RuntimeError(msg)
            comm.mark_broken(msg)
            comm.raise_if_broken()  # the message with this rank and what to do next
        time.sleep(2e-5)
