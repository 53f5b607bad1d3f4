"""Overlap timeline analysis: GPU events from torch.profiler chrome traces, their classes
(GEMM, NCCL, copy engine, signal), alignment of the ranks on one time axis, busy and overlap
times per GPU, and a layer's record from every rank's payload. Pure (no torch, no GPU; a
profiler's trace is read back through its own ``export_chrome_trace``)."""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.common.llama_cases import Case, shapes

CLASSES = ("gemm", "nccl", "copy", "signal", "other", "call")
SIGNAL_MAX_BYTES = 64
# chrome-trace categories of the GPU activities -> event kind
GPU_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
KINDS = ("kernel", "memcpy", "memset", "call")
MARKER_PREFIX = "overlap_timeline:"
_GEMM_RE = re.compile(r"gemm|gemv|cutlass|cublas|nvjet|xmma|wgmma|matmul", re.I)
_NCCL_RE = re.compile(r"nccl", re.I)
VARIANTS = ("baseline", "symm_mem", "distgemm")
ALIGN_TOL_US = 5000.0  # host-clock alignment is kept while the ranks' markers agree this well


@dataclass(frozen=True)
class GpuEvent:
    """One GPU activity (or, in the fallback, one call span). Times in microseconds."""

    rank: int
    device: int
    stream: int
    start: float
    dur: float
    name: str
    kind: str  # kernel | memcpy | memset | call
    nbytes: int = 0

    @property
    def end(self) -> float:
        return self.start + self.dur

    @functools.cached_property
    def cls(self) -> str:  # asked several times per event by summarize(): classify once
        return classify(self.name, self.kind, self.nbytes)


def kind_of(category: str | None, name: str) -> str:
    """Event kind from a chrome-trace category, or from the name where the category is missing."""
    k = GPU_CATEGORIES.get((category or "").lower())
    if k:
        return k
    if name.startswith("Memcpy"):
        return "memcpy"
    if name.startswith("Memset"):
        return "memset"
    return "kernel"


def classify(name: str, kind: str | None = None, nbytes: int = 0) -> str:
    """One of CLASSES. Memcpys of at most SIGNAL_MAX_BYTES (distgemm's 4-byte flag writes) and
    memsets are signals; other memcpys are copy-engine traffic; kernels are NCCL, GEMM or other
    by name (CUTLASS, cuBLAS incl. nvjet/xmma, anything called gemm)."""
    kind = kind or kind_of(None, name)
    if kind == "call":
        return "call"
    if kind == "memset":
        return "signal"
    if kind == "memcpy":
        return "signal" if 0 < nbytes <= SIGNAL_MAX_BYTES else "copy"
    if _NCCL_RE.search(name):
        return "nccl"
    if _GEMM_RE.search(name.replace("distgemm", "")):  # not our namespace: barrier/wait kernels
        return "gemm"
    return "other"


def _as_int(x: Any, default: int = -1) -> int:
    """Ints from trace fields that may be numbers or strings like 'stream 7'."""
    if isinstance(x, bool):
        return default
    if isinstance(x, (int, float)):
        return int(x)
    m = re.search(r"-?\d+", str(x)) if x is not None else None
    return int(m.group(0)) if m else default


@dataclass
class ParsedTrace:
    base_ns: int  # the trace's baseTimeNanoseconds (0 if absent)
    events: list[GpuEvent]  # GPU activities, start = trace ts (us)
    markers: dict[str, tuple[float, float]]  # marker name -> (start, end) in trace ts (us)


def exported_trace(prof) -> dict[str, Any]:
    """The chrome trace of a finished ``torch.profiler.profile`` (``prof.export_chrome_trace``
    into a temporary file, read back), tolerating control characters in kernel names."""
    with tempfile.TemporaryDirectory(prefix="timeline-trace-") as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, errors="replace") as f:
            return json.loads(f.read(), strict=False)


def parse_chrome_trace(trace: dict[str, Any], rank: int = 0) -> ParsedTrace:
    """GPU activities and this script's record_function markers of a torch.profiler chrome
    trace (``prof.export_chrome_trace``). Kernel/memcpy/memset events carry device and stream in
    their args (peer memcpys: inDevice); pid/tid are the fallback."""
    events: list[GpuEvent] = []
    markers: dict[str, tuple[float, float]] = {}
    for e in trace.get("traceEvents", []):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        name = str(e.get("name", ""))
        ts, dur = float(e.get("ts", 0.0)), max(0.0, float(e.get("dur", 0.0)))
        if cat in GPU_CATEGORIES:
            args = e.get("args") or {}
            dev = args.get("device", args.get("inDevice", e.get("pid")))
            events.append(
                GpuEvent(
                    rank,
                    _as_int(dev),
                    _as_int(args.get("stream", e.get("tid"))),
                    ts,
                    dur,
                    name,
                    GPU_CATEGORIES[cat],
                    max(0, _as_int(args.get("bytes"), 0)),
                )
            )
        elif name.startswith(MARKER_PREFIX) and not cat.startswith("gpu"):
            markers.setdefault(name, (ts, ts + dur))  # the CPU-side range, not the GPU echo
    events.sort(key=lambda ev: (ev.start, ev.device, ev.stream))
    return ParsedTrace(_as_int(trace.get("baseTimeNanoseconds"), 0), events, markers)


def in_window(events: Sequence[GpuEvent], start: float, end: float) -> list[GpuEvent]:
    """The events that start inside [start, end] (the marker: GPU work before it was finished
    by a synchronize, the marker ends after a synchronize)."""
    return [e for e in events if start <= e.start <= end]


def class_counts(events: Sequence[GpuEvent]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in events:
        out[e.cls] = out.get(e.cls, 0) + 1
    return out


def choose_source(variant: str, per_rank: dict[int, Sequence[GpuEvent]]) -> tuple[str, str]:
    """("profiler" or "cuda-events", note). The profiler's events are used unless a rank has none
    in the window, or distgemm shows no GEMM kernel (graph nodes not reported one by one)."""
    notes = []
    for r in sorted(per_rank):
        cnt = class_counts(per_rank[r])
        if not per_rank[r]:
            return "cuda-events", f"rank {r}: the profiler reported no GPU event in the window"
        if not cnt.get("gemm"):
            if variant == "distgemm":
                return "cuda-events", (
                    f"rank {r}: no GEMM kernel among the {len(per_rank[r])} GPU "
                    f"events of the window ({cnt}); CUDA graph nodes were not "
                    f"reported individually"
                )
            notes.append(f"rank {r}: no kernel recognised as a GEMM")
    return "profiler", "; ".join(notes)


def spans_to_events(
    spans_ms: Sequence[tuple[float, float]], rank: int, device: int
) -> list[GpuEvent]:
    """Fallback events: one 'call' event per (start, end) CUDA-event span (ms, relative)."""
    return [
        GpuEvent(rank, device, -1, s * 1e3, (e - s) * 1e3, f"call {i}", "call")
        for i, (s, e) in enumerate(spans_ms)
    ]


def align(per_rank: dict[int, dict[str, Any]]) -> tuple[list[GpuEvent], dict[str, Any]]:
    """Merge the ranks' window events onto one time axis, 0 = the first event of any rank.
    per_rank[r] = {"base_ns": int, "marker": (start, end), "events": [GpuEvent]} in that rank's
    trace time. Traces of one host share the clock once each rank's base time is added back; if
    the ranks' markers (which follow a common barrier) then disagree by more than ALIGN_TOL_US,
    each rank is aligned on its own marker instead."""
    if not per_rank:
        return [], {"alignment": "none", "marker_skew_us": None}
    base0 = min(int(p.get("base_ns", 0)) for p in per_rank.values())
    shift = {r: (int(p.get("base_ns", 0)) - base0) / 1e3 for r, p in per_rank.items()}
    starts = {r: p["marker"][0] + shift[r] for r, p in per_rank.items()}
    skew = max(starts.values()) - min(starts.values())
    mode = "host clock"
    if skew > ALIGN_TOL_US:
        mode = "window markers"
        shift = {r: -p["marker"][0] for r, p in per_rank.items()}
    merged = [
        replace(e, start=e.start + shift[r]) for r, p in per_rank.items() for e in p["events"]
    ]
    t0 = min((e.start for e in merged), default=0.0)
    merged = sorted(
        (replace(e, start=e.start - t0) for e in merged), key=lambda e: (e.start, e.rank, e.stream)
    )
    return merged, {"alignment": mode, "marker_skew_us": round(skew, 3)}


def gpu_label(rank: int, device: int) -> str:
    return f"GPU{device}" + ("" if rank == device else f" (rank {rank})")


def merge(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted disjoint union of [start, end) intervals."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


Intervals = Sequence[tuple[float, float]]


def intersect(a: Intervals, b: Intervals) -> list[tuple[float, float]]:
    """Intersection of two unions of intervals (each merged first)."""
    a, b = merge(a), merge(b)
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(e - s for s, e in merge(intervals))


def _spans(events: Sequence[GpuEvent], classes: Sequence[str]) -> list[tuple[float, float]]:
    return [(e.start, e.end) for e in events if e.cls in classes]


def overlap_intervals(events: Sequence[GpuEvent]) -> list[tuple[float, float]]:
    """When a copy-engine memcpy and a GEMM kernel run at the same time (events of one GPU)."""
    return intersect(_spans(events, ("gemm",)), _spans(events, ("copy",)))


def per_gpu(events: Sequence[GpuEvent]) -> dict[tuple[int, int], list[GpuEvent]]:
    out: dict[tuple[int, int], list[GpuEvent]] = {}
    for e in events:
        out.setdefault((e.rank, e.device), []).append(e)
    return dict(sorted(out.items()))


def summarize(events: Sequence[GpuEvent]) -> dict[str, dict[str, Any]]:
    """Per GPU (label -> numbers, ms): window (first to last event of any GPU), span of this GPU,
    busy time of GEMM compute, copy engine, NCCL kernels (unions over streams), overlap of copy and
    GEMM, communication (copy + NCCL) and the part of it not under a GEMM, event counts."""
    window = (max(e.end for e in events) - min(e.start for e in events)) if events else 0.0
    out: dict[str, dict[str, Any]] = {}
    for (rank, dev), evs in per_gpu(events).items():
        gemm, copy = _spans(evs, ("gemm",)), _spans(evs, ("copy",))
        comm = _spans(evs, ("copy", "nccl"))
        hidden = length(intersect(gemm, comm))
        out[gpu_label(rank, dev)] = dict(
            rank=rank,
            device=dev,
            window_ms=window / 1e3,
            span_ms=(max(e.end for e in evs) - min(e.start for e in evs)) / 1e3,
            compute_ms=length(gemm) / 1e3,
            copy_ms=length(copy) / 1e3,
            nccl_ms=length(_spans(evs, ("nccl",))) / 1e3,
            overlap_ms=length(intersect(gemm, copy)) / 1e3,
            comm_ms=length(comm) / 1e3,
            exposed_comm_ms=(length(comm) - hidden) / 1e3,
            calls_ms=length(_spans(evs, ("call",))) / 1e3,
            counts=class_counts(evs),
        )
    return out


# Kernels outside NCCL that move or wait for peers' data (symmetric-memory barriers, our
# all-reduce, stream memory operations): communication, not compute, in a step's breakdown.
_COMM_KERNEL_RE = re.compile(
    r"barrier|allreduce|all_reduce|all_gather|reduce_scatter|symm|one_shot|two_shot|wait_value|"
    r"write_value|stream_mem",
    re.I,
)


def step_breakdown(events: Sequence[GpuEvent], steps: int) -> dict[str, float]:
    """Where one GPU's time goes over ``steps`` back-to-back steps (ms per step): the window
    (first event to last), GEMM kernels busy (union over streams), and the rest of the window
    split by what runs while no GEMM does: communication (NCCL, copies, signals, kernels that
    move or wait for peers' data), other kernels (elementwise, norms), nothing (idle). The
    four parts add up to the window. ``comm_ms`` is all communication, ``comm_hidden_ms`` its
    part under a GEMM."""
    if steps < 1:
        raise ValueError(f"steps={steps} must be at least 1")
    if not events:
        return dict(window_ms=0.0, gemm_ms=0.0, comm_exposed_ms=0.0, other_exposed_ms=0.0,
                    idle_ms=0.0, comm_ms=0.0, comm_hidden_ms=0.0, gemm_kernels=0.0)  # fmt: skip

    def is_comm(e: GpuEvent) -> bool:
        return e.cls in ("nccl", "copy", "signal") or (
            e.cls == "other" and bool(_COMM_KERNEL_RE.search(e.name))
        )

    gemm = [(e.start, e.end) for e in events if e.cls == "gemm"]
    comm = [(e.start, e.end) for e in events if is_comm(e)]
    other = [(e.start, e.end) for e in events if e.cls == "other" and not is_comm(e)]
    window = max(e.end for e in events) - min(e.start for e in events)
    gemm_ms, comm_ms = length(gemm), length(comm)
    comm_exposed = comm_ms - length(intersect(comm, gemm))
    other_exposed = length(other) - length(intersect(other, [*gemm, *comm]))
    busy = length([*gemm, *comm, *other])
    per = 1e3 * steps  # us -> ms per step
    return dict(
        window_ms=window / per,
        gemm_ms=gemm_ms / per,
        comm_exposed_ms=comm_exposed / per,
        other_exposed_ms=other_exposed / per,
        idle_ms=(window - busy) / per,
        comm_ms=comm_ms / per,
        comm_hidden_ms=(comm_ms - comm_exposed) / per,
        gemm_kernels=sum(e.cls == "gemm" for e in events) / steps,
    )


def build_variant(
    variant: str, payloads: dict[int, dict[str, Any]], calls: int, ref_ms: float | None
) -> dict[str, Any]:
    """A variant's record from every rank's payload {"base_ns", "marker", "events", "spans_ms",
    "device"}: source choice, alignment, per-call times, summary."""
    per_rank = {r: p["events"] for r, p in payloads.items()}
    source, note = choose_source(variant, per_rank)
    if source == "profiler":
        events, al = align(payloads)
    else:
        events, al = align(
            {
                r: dict(
                    base_ns=0,
                    marker=(0.0, 0.0),
                    events=spans_to_events(p["spans_ms"], r, p["device"]),
                )
                for r, p in payloads.items()
            }
        )
        al["alignment"] = "ranks' first calls (after a common gloo barrier)"
    window = (max(e.end for e in events) - min(e.start for e in events)) / 1e3 if events else None
    per_call = [p["spans_ms"][-1][1] / calls for p in payloads.values() if p.get("spans_ms")]
    return dict(
        status="ok",
        reason=None,
        source=source,
        note=note,
        calls=calls,
        ms_per_call_window=max(per_call) if per_call else None,
        ms_per_call_trace=(window / calls) if window else None,
        ms_per_call_ref=ref_ms,
        counts={str(r): class_counts(evs) for r, evs in per_rank.items()},
        events=events,
        summary=summarize(events),
        **al,
    )


def layer_record(
    case: Case, tp: int, steps: int, per_rank: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    """Rank 0: the layer's record from every rank's run_layer result."""
    s = shapes(case)
    r0 = per_rank[min(per_rank)]
    rec = dict(
        model=case.model,
        layer=case.layer,
        tokens=case.tokens,
        tp=tp,
        m=s["m"],
        n=s["n"],
        k=s["k"],
        collective=s["collective"],
        schedule=s["schedule"],
        steps=steps,
        shapes={x: list(s[x]) for x in ("a", "w", "out")},
        rel_err=r0["rel_err"],
        variants={},
    )
    for v in VARIANTS:
        if v in r0["unavailable"]:
            rec["variants"][v] = dict(status="unavailable", reason=r0["unavailable"][v], events=[])
            continue
        payloads = {r: res["payloads"][v] for r, res in per_rank.items()}
        vr = build_variant(v, payloads, len(r0["payloads"][v]["spans_ms"]), r0["ref_ms"].get(v))
        vr["markers_found"] = all(p["marker_found"] for p in payloads.values())
        vr["trace_gpu_events"] = {str(r): p["trace_gpu_events"] for r, p in payloads.items()}
        rec["variants"][v] = vr
    return rec
