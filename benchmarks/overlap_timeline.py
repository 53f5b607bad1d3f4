"""Per-stream overlap timeline of one Llama-3 tensor-parallel case (issue 5, item 3): what each
GPU's compute units and copy engines do over a few consecutive calls of distgemm, of the plain
NCCL + torch.mm baseline and of torch's symmetric-memory fused ops (async-TP).

    torchrun --nproc-per-node 2 benchmarks/overlap_timeline.py [--model 70B] [--layer FC1,O]
        [--tokens 8192] [--steps S] [--calls 3] --out DIR
    python3 benchmarks/overlap_timeline.py --replot FILE.json --out DIR     (no GPU, no torch)

Per layer (shapes and variants as in benchmarks/llama_sweep.py, whose helpers this reuses), every
variant is first warmed up by time and timed without the profiler (llama_sweep's CUDA-event
median, "unprofiled"). Then, inside ONE torch.profiler session (CPU + CUDA activities), each
variant is warmed up again, the ranks meet at a gloo barrier and ``--calls`` consecutive calls run
inside a ``record_function`` marker. The GPU events (kernels, memcpys, memsets; CUDA graph nodes
are reported one by one by CUPTI) are taken from the exported chrome trace within that marker,
gathered to rank 0 over the gloo group and aligned on the host clock (or on the markers, when the
host clocks of the ranks' traces disagree). Should the profiler report no GPU events for a
variant, or no GEMM kernel for distgemm (its graph nodes not reported individually), that variant
falls back to the CUDA events recorded around each call (call spans only) and its panel says so.

Event classes: GEMM compute (CUTLASS / cuBLAS / other gemm kernels), NCCL kernel, copy engine
(memcpy), signal/flag (memcpy of <= 64 bytes, memset), other kernels (barriers, waits, ...).
Output under --out: ``<date>-overlap-timeline-<model>-<layer>.png`` per layer, and
``<date>-overlap-timeline-<model>-<layers>.{json,txt}`` (every layer's events, compact, for
re-plotting; the per-GPU busy / overlap summary as text).

The pure parts (trace parsing, classification, lanes, alignment, busy and overlap times, summary,
JSON encoding, plotting) are module-level functions without torch.distributed or CUDA, tested by
tests/test_overlap_timeline.py on the CPU.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_sweep as sweep  # noqa: E402  (cases, shapes, skip logic, warm-up/timing helpers)

# ---------------------------------------------------------------------------------------------
# Pure part: parsing, classification, lanes, alignment, overlap, summary, JSON, plot.

CLASSES = ("gemm", "nccl", "copy", "signal", "other", "call")
CLASS_LABEL = {
    "gemm": "GEMM compute",
    "nccl": "NCCL kernel",
    "copy": "copy engine (memcpy)",
    "signal": "signal/flag (memcpy <= 64 B, memset)",
    "other": "other kernel",
    "call": "whole call (CUDA events)",
}
CLASS_COLOR = {
    "gemm": "tab:blue",
    "nccl": "tab:red",
    "copy": "tab:orange",
    "signal": "black",
    "other": "tab:gray",
    "call": "tab:purple",
}
OVERLAP_COLOR = "tab:green"
SIGNAL_MAX_BYTES = 64
# chrome-trace categories of the GPU activities -> event kind
GPU_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
KINDS = ("kernel", "memcpy", "memset", "call")
MARKER_PREFIX = "overlap_timeline:"
_GEMM_RE = re.compile(r"gemm|gemv|cutlass|cublas|nvjet|xmma|wgmma|matmul", re.I)
_NCCL_RE = re.compile(r"nccl", re.I)
VARIANTS = ("baseline", "symm_mem", "distgemm")
VARIANT_LABEL = {
    "baseline": "NCCL + torch.mm",
    "symm_mem": "torch symm_mem (async-TP)",
    "distgemm": "distgemm",
}
SOURCE_PROFILER = "torch.profiler (CUPTI) GPU events"
SOURCE_CUDA_EVENTS = "CUDA events around each call (call spans only)"
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


def engine(e: GpuEvent) -> str:
    """Lane group of an event: kernels run on the SMs, memcpy/memset nodes on the copy engines."""
    return {"memcpy": "memcpy", "memset": "memcpy", "call": "calls"}.get(e.kind, "kernels")


def gpu_label(rank: int, device: int) -> str:
    return f"GPU{device}" + ("" if rank == device else f" (rank {rank})")


def assign_lanes(events: Sequence[GpuEvent]) -> tuple[list[str], list[int]]:
    """(lane labels top to bottom, lane index of each event). One lane per (GPU, engine, stream):
    CUPTI may report all nodes of a CUDA graph on the stream it was launched on, so kernels and
    copies get separate lanes; events that still overlap within a lane go to extra rows."""
    order = {"calls": 0, "kernels": 1, "memcpy": 2}
    groups: dict[tuple[int, int, int, int], list[int]] = {}
    for i, e in enumerate(events):
        groups.setdefault((e.rank, e.device, order[engine(e)], e.stream), []).append(i)
    labels: list[str] = []
    lane_of = [0] * len(events)
    names = {v: k for k, v in order.items()}
    for key in sorted(groups):
        rank, dev, eng, stream = key
        rows_end: list[float] = []
        first = len(labels)
        for i in sorted(groups[key], key=lambda j: (events[j].start, events[j].end)):
            e = events[i]
            row = next((k for k, end in enumerate(rows_end) if end <= e.start + 1e-6), None)
            if row is None:
                row = len(rows_end)
                rows_end.append(e.end)
            rows_end[row] = e.end
            lane_of[i] = first + row
        base = f"{gpu_label(rank, dev)} " + (f"s{stream} " if stream >= 0 else "") + names[eng]
        labels.extend(base + ("" if k == 0 else f" #{k + 1}") for k in range(len(rows_end)))
    return labels, lane_of


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


def _pct(x: float, of: float) -> str:
    return f"{100.0 * x / of:.0f}%" if of > 0 else "-"


def summary_lines(layer: dict[str, Any]) -> list[str]:
    """Text summary of one layer record: one line per variant and GPU."""
    lines = [
        f"{layer['model']}/{layer['layer']}/M{layer['tokens']}/TP{layer['tp']} "
        f"({layer['m']}x{layer['n']}x{layer['k']}, {layer['schedule']} S={layer['steps']})"
    ]
    for v, rec in layer["variants"].items():
        head = f"  {v:9s}"
        if rec.get("status") != "ok":
            lines.append(f"{head} {rec.get('status')}: {rec.get('reason')}")
            continue
        lines.append(
            f"{head} {_ms(rec.get('ms_per_call_window'))} ms/call in the window "
            f"({rec['calls']} calls; unprofiled {_ms(rec.get('ms_per_call_ref'))}), "
            f"source: {rec['source']}" + (f" [{rec['note']}]" if rec.get("note") else "")
        )
        for g, s in rec["summary"].items():
            w = s["window_ms"]
            if rec["source"] != "profiler":
                lines.append(f"    {g}: window {w:.3f} ms, calls busy {s['calls_ms']:.3f} ms")
                continue
            counts = ", ".join(f"{c} {n}" for c, n in sorted(s["counts"].items()))
            lines.append(
                f"    {g}: window {w:.3f} ms | GEMM {s['compute_ms']:.3f} ({_pct(s['compute_ms'], w)})"
                f" | copy {s['copy_ms']:.3f} ({_pct(s['copy_ms'], w)}) | NCCL {s['nccl_ms']:.3f}"
                f" | copy||GEMM overlap {s['overlap_ms']:.3f} ({_pct(s['overlap_ms'], s['copy_ms'])}"
                f" of copy) | exposed comm {s['exposed_comm_ms']:.3f} | events: {counts}"
            )
    return lines


def _ms(x: float | None) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) else "-"


def encode_events(events: Sequence[GpuEvent], names: dict[str, int]) -> list[list]:
    """Compact rows [rank, device, stream, start_us, dur_us, kind, name index, bytes, class];
    `names` (name -> index) is extended with new names."""
    rows = []
    for e in events:
        idx = names.setdefault(e.name, len(names))
        rows.append(
            [
                e.rank,
                e.device,
                e.stream,
                round(e.start, 3),
                round(e.dur, 3),
                KINDS.index(e.kind),
                idx,
                e.nbytes,
                e.cls,
            ]
        )
    return rows


def decode_events(rows: Sequence[Sequence[Any]], names: Sequence[str]) -> list[GpuEvent]:
    return [
        GpuEvent(
            int(r[0]),
            int(r[1]),
            int(r[2]),
            float(r[3]),
            float(r[4]),
            names[int(r[6])],
            KINDS[int(r[5])],
            int(r[7]),
        )
        for r in rows
    ]


def encode_run(meta: dict[str, Any], layers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The JSON document: meta, a shared table of event names (CUTLASS names are long), layers
    with each variant's events as compact rows."""
    names: dict[str, int] = {}
    out_layers = []
    for layer in layers:
        variants = {}
        for v, rec in layer["variants"].items():
            rec = dict(rec)
            rec["events"] = encode_events(rec.get("events", []), names)
            variants[v] = rec
        out_layers.append(dict(layer, variants=variants))
    return dict(
        meta=meta,
        event_fields=[
            "rank",
            "device",
            "stream",
            "start_us",
            "dur_us",
            "kind (index into kinds)",
            "name (index into names)",
            "bytes",
            "class",
        ],
        kinds=list(KINDS),
        names=sorted(names, key=names.get),
        layers=out_layers,
    )


def decode_run(doc: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    names = doc["names"]
    layers = []
    for layer in doc["layers"]:
        variants = {
            v: dict(rec, events=decode_events(rec.get("events", []), names))
            for v, rec in layer["variants"].items()
        }
        layers.append(dict(layer, variants=variants))
    return doc.get("meta", {}), layers


def output_stem(model: str, layers: Sequence[str], date: str | None = None) -> str:
    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return f"{date}-overlap-timeline-{model}-" + "-".join(layers)


def layer_title(layer: dict[str, Any]) -> str:
    sh = layer.get("shapes", {})
    return (
        f"Llama-3 {layer['model']} {layer['layer']}, {layer['tokens']} tokens, TP={layer['tp']}: "
        f"{layer['collective'].replace('_', '-')} + GEMM {layer['m']}x{layer['n']}x{layer['k']} "
        f"(per rank A {sh.get('a')} W {sh.get('w')} -> {sh.get('out')}), bf16; "
        f"distgemm {layer['schedule']} S={layer['steps']}"
    )


def plot_layer(layer: dict[str, Any], path: str) -> str | None:
    """One panel per variant (same time scale), one lane per (GPU, engine, stream), plus one lane
    per GPU marking when a copy and a GEMM run at once. Returns None when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except Exception as e:  # noqa: BLE001 - the JSON is written anyway; --replot renders later
        return f"matplotlib unavailable ({type(e).__name__}: {e})"
    shown = [
        (v, r) for v, r in layer["variants"].items() if r.get("status") == "ok" and r.get("events")
    ]
    if not shown:
        return "no variant with events"
    panels = []
    for v, rec in shown:
        labels, lane_of = assign_lanes(rec["events"])
        ovl = {g: overlap_intervals(evs) for g, evs in per_gpu(rec["events"]).items()}
        ovl = {g: iv for g, iv in ovl.items() if iv}
        panels.append((v, rec, labels, lane_of, ovl))
    xmax = max(max(e.end for e in rec["events"]) for _, rec in shown) / 1e3
    min_w = 0.002 * xmax  # drawing only: a 4-byte signal would be invisible at this scale
    heights = [len(p[2]) + len(p[4]) + 1.5 for p in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(15, 1.2 + 0.32 * sum(heights)),
        sharex=True,
        gridspec_kw=dict(height_ratios=heights),
        squeeze=False,
    )
    used = set()
    for ax, (v, rec, labels, lane_of, ovl) in zip(axes[:, 0], panels):
        bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for e, lane in zip(rec["events"], lane_of):
            bars.setdefault((lane, e.cls), []).append((e.start / 1e3, max(e.dur / 1e3, min_w)))
        draw_order = ("call", "gemm", "nccl", "copy", "other", "signal")  # small ones on top
        for (lane, c), xr in sorted(bars.items(), key=lambda kv: draw_order.index(kv[0][1])):
            ax.broken_barh(
                xr,
                (lane - 0.4, 0.8),
                facecolors=CLASS_COLOR[c],
                edgecolors="white",
                linewidth=0.8 if c == "call" else 0,
            )
            used.add(c)
        ylabels = list(labels)
        for (rank, dev), iv in ovl.items():
            ylabels.append(f"{gpu_label(rank, dev)} copy || GEMM")
            ax.broken_barh(
                [(s / 1e3, max((e - s) / 1e3, min_w)) for s, e in iv],
                (len(ylabels) - 1 - 0.3, 0.6),
                facecolors=OVERLAP_COLOR,
                linewidth=0,
            )
        ax.set_yticks(range(len(ylabels)))
        ax.set_yticklabels(ylabels, fontsize=7)
        ax.set_ylim(len(ylabels) - 0.4, -0.6)
        ax.grid(axis="x", lw=0.3, alpha=0.5)
        label = VARIANT_LABEL.get(v, v) + (f" (S={layer['steps']})" if v == "distgemm" else "")
        src = "" if rec["source"] == "profiler" else f"  [fallback: {SOURCE_CUDA_EVENTS}]"
        ax.set_title(
            f"{label}: {_ms(rec.get('ms_per_call_window'))} ms/call over {rec['calls']} "
            f"profiled calls (unprofiled {_ms(rec.get('ms_per_call_ref'))} ms){src}",
            fontsize=9,
            loc="left",
        )
        if rec["source"] == "profiler":
            txt = "\n".join(
                f"{g}: GEMM {_pct(s['compute_ms'], s['window_ms'])}, copy "
                f"{_pct(s['copy_ms'], s['window_ms'])}, overlap {s['overlap_ms']:.2f} ms, "
                f"exposed comm {s['exposed_comm_ms']:.2f} ms"
                for g, s in rec["summary"].items()
            )
            ax.text(1.0, 1.0, txt, transform=ax.transAxes, ha="right", va="bottom", fontsize=7)
    axes[-1, 0].set_xlim(0, xmax * 1.01)
    axes[-1, 0].set_xlabel("time in the profiled window (ms; 0 = first GPU event of the variant)")
    handles = [Patch(color=CLASS_COLOR[c], label=CLASS_LABEL[c]) for c in CLASSES if c in used]
    handles.append(Patch(color=OVERLAP_COLOR, label="copy and GEMM at the same time"))
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=len(handles),
        fontsize=8,
        bbox_to_anchor=(0.5, 0.0),
    )
    fallback = [v for v, r in shown if r["source"] != "profiler"]
    src = SOURCE_PROFILER + (
        f"; fallback for {', '.join(fallback)}: {SOURCE_CUDA_EVENTS}" if fallback else ""
    )
    missing = "; ".join(
        f"{v} {r.get('status')}: {str(r.get('reason'))[:100]}"
        for v, r in layer["variants"].items()
        if (v, r) not in shown
    )
    fig.suptitle(
        f"{layer_title(layer)}\nsource: {src}; events narrower than {min_w:.3f} ms drawn "
        f"at that width" + (f"\nnot shown: {missing}" if missing else ""),
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_outputs(
    meta: dict[str, Any],
    layers: Sequence[dict[str, Any]],
    out: str,
    from_json: str | None = None,
) -> list[str]:
    """Under `out`: the JSON and the text summary (unless re-plotting `from_json`), and one PNG
    per layer where matplotlib is there. Returns one line per thing written or skipped."""
    os.makedirs(out, exist_ok=True)
    date = meta.get("date", "")[:10] or None
    stem = os.path.join(out, output_stem(meta["model"], [la["layer"] for la in layers], date))
    said = []
    if from_json is None:
        with open(stem + ".json", "w") as f:
            json.dump(encode_run(meta, layers), f, separators=(",", ":"))
        with open(stem + ".txt", "w") as f:
            f.write("\n".join(ln for la in layers for ln in summary_lines(la)) + "\n")
        said.append(f"wrote {stem}.json, {stem}.txt")
    for la in layers:
        png = os.path.join(out, output_stem(meta["model"], [la["layer"]], date) + ".png")
        try:
            why = plot_layer(la, png)
        except Exception as e:  # noqa: BLE001 - never lose the JSON over a picture
            why = f"plot failed: {type(e).__name__}: {e}"
        said.append(
            f"plot {la['layer']}: {png}"
            if not why
            else f"plot {la['layer']}: skipped: {why}; render it elsewhere with: python3 "
            f"benchmarks/overlap_timeline.py --replot {from_json or stem + '.json'} --out DIR"
        )
    return said


def replot(json_path: str, out: str) -> int:
    """Render the PNGs of a JSON written by a GPU run (no torch, no GPU needed)."""
    with open(json_path) as f:
        meta, layers = decode_run(json.load(f))
    said = write_outputs(meta, layers, out, from_json=json_path)
    print("\n".join(said), flush=True)
    return 0 if all("skipped" not in s for s in said) else 1


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


# ---------------------------------------------------------------------------------------------
# GPU part (torchrun; not called by the CPU tests).

FIRST_REWARM_S = 0.3  # sustained calls inside the profiler before the first window (clock ramp)
REWARM_S = 0.1  # ... before each later window (the GPUs were busy until just before)
LAYER_TIMEOUT_S = 45  # a layer that takes longer is hung: dump stacks and exit
CTRL_TIMEOUT_S = 40  # gloo control group: every barrier / agreement / gather


def _make_variants(
    ctx, case, steps, comm, group_name
) -> tuple[dict[str, Callable], dict[str, Any]]:
    """(variant name -> one call, {"dg_out": distgemm's output buffer}) for one layer on this
    rank: fresh random bf16 operands as in llama_sweep (its layer_operands, another seed)."""
    torch, dist, dev = ctx.torch, ctx.dist, ctx.dev
    from distgemm import ops

    x = sweep.layer_operands(torch, dev, case, 4321 + 7919 * ctx.rank + case.tokens)
    ag, a, w, wt, tmp, out = x.ag, x.a, x.w, x.wt, x.tmp, x.out
    dg_out = torch.empty_like(out)

    def baseline():
        return sweep.baseline_call(torch, dist, ag, a, wt, tmp, out)

    def symm_mem():
        return sweep.symm_mem_call(torch, ag, a, wt, group_name)

    def distgemm():  # the overlapped plan itself ("auto" could pick the collective path)
        op = ops.all_gather_gemm if ag else ops.gemm_reduce_scatter
        return op(a, w, steps=steps, out=dg_out, group=comm, path="overlap")

    fns = dict(baseline=baseline, symm_mem=symm_mem, distgemm=distgemm)
    return fns, dict(dg_out=dg_out)


def _profile(ctx, fns: dict[str, Callable], ref_ms: dict[str, float], tag: str, calls: int):
    """One profiler session over every variant: re-warm, barrier, `calls` calls in a marker.
    Returns (this rank's chrome trace as a dict, {variant: [(start, end) ms of each call]})."""
    torch = ctx.torch
    from torch.profiler import ProfilerActivity, profile, record_function

    spans: dict[str, list[tuple[float, float]]] = {}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i, (v, fn) in enumerate(fns.items()):
            # ref_ms is the max over ranks: every rank makes the same number of calls.
            n = max(
                2, math.ceil((FIRST_REWARM_S if i == 0 else REWARM_S) * 1e3 / max(ref_ms[v], 1e-3))
            )
            for _ in range(min(n, 5000)):
                fn()
            torch.cuda.synchronize()
            ctx.dist.barrier(group=ctx.ctrl)
            ev = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(calls)
            ]
            with record_function(f"{MARKER_PREFIX}{tag}:{v}"):
                for s_, e_ in ev:
                    s_.record()
                    fn()
                    e_.record()
                torch.cuda.synchronize()
            spans[v] = [(ev[0][0].elapsed_time(s_), ev[0][0].elapsed_time(e_)) for s_, e_ in ev]
    with tempfile.TemporaryDirectory(prefix="overlap-timeline-") as d:
        path = os.path.join(d, f"trace-rank{ctx.rank}.json")
        prof.export_chrome_trace(path)
        with open(path, errors="replace") as f:
            trace = json.loads(f.read(), strict=False)  # tolerate control characters in names
    return trace, spans


def run_layer(ctx, case, steps: int | None, calls: int, group_name: str) -> dict[str, Any]:
    """This rank's part of one layer: warm-up and unprofiled timing per variant (llama_sweep's
    helper), output checks, the profiled windows, and this rank's payload per variant."""
    torch = ctx.torch
    from distgemm import comm as dcomm

    res: dict[str, Any] = dict(ref_ms={}, rel_err={}, unavailable={}, payloads={})
    with dcomm.Communicator(timeout_s=30.0, wait_timeout_s=5.0) as comm:
        fns, bufs = _make_variants(ctx, case, steps, comm, group_name)
        ref = fns["baseline"]().clone()
        torch.cuda.synchronize()
        why = None
        try:  # torch async-TP: unavailable is recorded, never fatal; the verdict is agreed
            res["rel_err"]["symm_mem"] = sweep._rel_err(torch, fns["symm_mem"](), ref)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        if ctx.agree_max([1.0 if why else 0.0])[0]:
            res["unavailable"]["symm_mem"] = why or "failed on another rank"
            res["rel_err"].pop("symm_mem", None)
            del fns["symm_mem"]
        bufs["dg_out"].fill_(float("nan"))  # a call that writes nothing cannot pass the check
        res["rel_err"]["distgemm"] = sweep._rel_err(torch, fns["distgemm"](), ref)
        torch.cuda.synchronize()
        comm.check()
        for v, fn in fns.items():
            res["ref_ms"][v] = sweep._time_variant(ctx, fn)
        comm.check()
        trace, spans = _profile(ctx, fns, res["ref_ms"], case.layer, calls)
        torch.cuda.synchronize()
        comm.check()
    parsed = parse_chrome_trace(trace, ctx.rank)
    for v in fns:
        marker = parsed.markers.get(f"{MARKER_PREFIX}{case.layer}:{v}")
        events = in_window(parsed.events, *marker) if marker else []
        res["payloads"][v] = dict(
            base_ns=parsed.base_ns,
            marker=marker or (0.0, 0.0),
            events=events,
            spans_ms=spans[v],
            device=ctx.dev.index,
            marker_found=marker is not None,
            trace_gpu_events=len(parsed.events),
        )
    keys = sorted(res["rel_err"])
    worst = ctx.agree_max([x if x == x else math.inf for x in (res["rel_err"][k] for k in keys)])
    res["rel_err"] = dict(zip(keys, worst))
    return res


def layer_record(case, tp: int, steps: int, per_rank: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Rank 0: the layer's record from every rank's run_layer result."""
    s = sweep.shapes(case)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="70B", choices=sorted(sweep.MODELS))
    ap.add_argument(
        "--layer", default="FC1,O", help="comma-separated, of " + ", ".join(sweep.LAYERS)
    )
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=None, help="distgemm S (default: its own, TP)")
    ap.add_argument("--calls", type=int, default=3, help="profiled consecutive calls per variant")
    ap.add_argument("--replot", metavar="FILE.json", help="only render the PNGs of a JSON")
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    )
    args = ap.parse_args(argv)
    if args.replot:
        return replot(args.replot, args.out)
    layers = [x.strip() for x in args.layer.split(",") if x.strip()]
    bad = [x for x in layers if x not in sweep.LAYERS]
    if bad or not layers or not 1 <= args.calls <= 20:
        ap.error(f"--layer takes {', '.join(sweep.LAYERS)} (got {args.layer!r}); --calls 1..20")

    import faulthandler

    import torch
    import torch.distributed as dist

    t_start = time.perf_counter()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev, timeout=datetime.timedelta(seconds=60))
    rank, tp = dist.get_rank(), dist.get_world_size()
    ctrl = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=CTRL_TIMEOUT_S))
    ctx = sweep._Ctx(torch, dist, ctrl, dev, rank, tp)
    group_name = dist.group.WORLD.group_name
    symm_setup = sweep.enable_symm_mem(group_name)
    from distgemm import ops as dops

    records: list[dict[str, Any]] = []
    status, measured = 0, 0
    for layer in layers:
        case = sweep.Case(args.model, layer, args.tokens, tp)
        reason, rejected = sweep.skip_reason(case)
        s = sweep.shapes(case)
        meta_t = [torch.empty(s[x], device="meta", dtype=torch.bfloat16) for x in ("a", "w")]
        steps = args.steps or dops.default_steps(s["schedule"], tp, *meta_t)
        if not reason and steps in rejected:
            reason = f"distgemm rejects S={steps}: {rejected[steps]}"
        if reason:
            if rank == 0:
                print(f"SKIPPED {case.name}: {reason}", flush=True)
            status = 1
            continue
        if rank == 0:
            print(
                f"[{time.perf_counter() - t_start:5.1f} s] {case.name}: warm-up, timing, profiling",
                file=sys.stderr,
                flush=True,
            )
        faulthandler.dump_traceback_later(LAYER_TIMEOUT_S, exit=True)
        err, res = None, None
        try:
            res = run_layer(ctx, case, steps, args.calls, group_name)
        except Exception as e:  # noqa: BLE001 - agreed below, the other layers still run
            err = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        failed = ctx.agree_max([1.0 if err else 0.0])[0]
        if failed:
            faulthandler.cancel_dump_traceback_later()
            if rank == 0:
                print(f"FAILED {case.name}: {err or 'failed on another rank'}", flush=True)
            status = 1
            continue
        gathered = [None] * tp if rank == 0 else None
        dist.gather_object(res, gathered, dst=0, group=ctrl)
        measured += 1
        faulthandler.cancel_dump_traceback_later()
        if rank == 0:
            rec = layer_record(case, tp, steps, dict(enumerate(gathered)))
            if symm_setup and rec["variants"]["symm_mem"]["status"] != "ok":
                rec["variants"]["symm_mem"]["reason"] += f" (setup: {symm_setup})"
            records.append(rec)
            for v, vr in rec["variants"].items():
                if vr["status"] == "ok":
                    print(
                        f"  {v}: source {vr['source']}; GPU events per rank and class "
                        f"{vr['counts']}" + (f"; NOTE {vr['note']}" if vr["note"] else ""),
                        flush=True,
                    )
                    if vr["source"] != "profiler":
                        print(
                            f"WARNING {case.name} {v}: the profiler did not show this variant's "
                            f"kernels ({vr['note']}); its panel shows CUDA-event call spans only",
                            flush=True,
                        )
            bad_err = {k: x for k, x in rec["rel_err"].items() if not x < sweep.ERR_TOL}
            if bad_err:
                print(f"WRONG {case.name}: rel. err vs baseline {bad_err}", flush=True)
                status = 1
        torch.cuda.empty_cache()

    if rank == 0 and records:
        meta = dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            model=args.model,
            tokens=args.tokens,
            tp=tp,
            calls=args.calls,
            torch=torch.__version__,
            cuda=torch.version.cuda,
            device=torch.cuda.get_device_name(dev),
            symm_mem_setup_error=symm_setup,
            first_rewarm_s=FIRST_REWARM_S,
            rewarm_s=REWARM_S,
            argv=sys.argv,
            seconds=round(time.perf_counter() - t_start, 1),
        )
        print("\n".join(ln for r in records for ln in summary_lines(r)), flush=True)
        for line in write_outputs(meta, records, args.out):
            print(line, flush=True)
        print(f"done in {time.perf_counter() - t_start:.1f} s", flush=True)
    dist.barrier(group=ctrl)
    from distgemm import comm as dcomm

    dcomm.close_all()
    dist.destroy_process_group()
    # records are only kept on rank 0: every rank decides by the layers it measured
    return status if measured else 1


if __name__ == "__main__":
    sys.exit(main())
