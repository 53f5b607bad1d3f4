"""Overlap timeline reports: the text summary, the compact JSON (encode / decode), one picture
per layer (a lane per GPU, engine and stream), the output files and --replot. Pure (no torch,
no GPU); matplotlib only where a picture is drawn."""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence
from typing import Any

from benchmarks.common.report import load_pyplot
from benchmarks.timeline.events import (
    CLASSES,
    KINDS,
    GpuEvent,
    gpu_label,
    overlap_intervals,
    per_gpu,
)

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
VARIANT_LABEL = {
    "baseline": "NCCL + torch.mm",
    "symm_mem": "torch symm_mem (async-TP)",
    "distgemm": "distgemm",
}
SOURCE_PROFILER = "torch.profiler (CUPTI) GPU events"
SOURCE_CUDA_EVENTS = "CUDA events around each call (call spans only)"


def engine(e: GpuEvent) -> str:
    """Lane group of an event: kernels run on the SMs, memcpy/memset nodes on the copy engines."""
    return {"memcpy": "memcpy", "memset": "memcpy", "call": "calls"}.get(e.kind, "kernels")


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
            gemm, copy, ovl = s["compute_ms"], s["copy_ms"], s["overlap_ms"]
            lines.append(
                f"    {g}: window {w:.3f} ms | GEMM {gemm:.3f} ({_pct(gemm, w)})"
                f" | copy {copy:.3f} ({_pct(copy, w)}) | NCCL {s['nccl_ms']:.3f}"
                f" | copy||GEMM overlap {ovl:.3f} ({_pct(ovl, copy)}"
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
    plt, why = load_pyplot()
    if plt is None:
        return why
    from matplotlib.patches import Patch

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
            else f"plot {la['layer']}: skipped: {why}; render it elsewhere with: python3 -m "
            f"benchmarks.timeline.overlap_timeline --replot {from_json or stem + '.json'} --out DIR"
        )
    return said


def replot(json_path: str, out: str) -> int:
    """Render the PNGs of a JSON written by a GPU run (no torch, no GPU needed)."""
    with open(json_path) as f:
        meta, layers = decode_run(json.load(f))
    said = write_outputs(meta, layers, out, from_json=json_path)
    print("\n".join(said), flush=True)
    return 0 if all("skipped" not in s for s in said) else 1
