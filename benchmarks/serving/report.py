"""Serving benchmark reporting: the variants and phases, the best unfused variant per bucket and
the ratios against it, suspect (below the floor) and wrong times, issue 42's decode acceptance,
and the table, CSVs, JSON and plot of a run. Pure (no torch, no GPU): one run's records in, text
and files out; benchmarks/serving/serving_step.py is the torchrun part.

A record is one (phase, tokens) bucket: ``ms`` per variant (one step of the whole stack, median
over a steady-state window, max over ranks), ``rel_err`` per variant against the NCCL + torch.mm
variant of its layout (the floor: 0.0 when every output was written and finite, else NaN) and
``unavailable`` per variant with the reason. Every ratio is a speed-up against the best unfused
variant of the bucket in the variant's layout: ``best unfused time / variant time``, above 1 =
the variant is faster (benchmarks/common/best_unfused.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from benchmarks.common import best_unfused as bu
from benchmarks.common import models
from benchmarks.common import report as out

MODEL, STACK_DEPTH = "70B", 8  # Llama-3 70B, 8 transformer layers of QKV, O, FC1, FC2
MODELS = models.MODELS  # --model: the Llama-3 models of the sweeps and the others
DECODE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL_TOKENS = (2048, 4096, 8192)
PHASES = ("decode", "prefill")
CAPTURED = {"decode": True, "prefill": False}  # servers capture decode steps, run prefill eager
# The layout a vLLM/SGLang-style server runs per phase. Decode: replicated activations, QKV and
# FC1 local GEMMs, O and FC2 GEMM + all-reduce (a batch of 1 token cannot be split over ranks).
# Prefill: sequence parallelism (all-gather + GEMM, GEMM + reduce-scatter), the layout async-TP
# passes rewrite, where the collectives are large enough for overlap to pay.
SERVER_LAYOUT = {"decode": "ar", "prefill": "sp"}
LAYOUT_TEXT = {
    "ar": "all-reduce (QKV, FC1 local GEMMs; O, FC2 GEMM + all-reduce)",
    "sp": "sequence-parallel (QKV, FC1 all-gather + GEMM; O, FC2 GEMM + reduce-scatter)",
}
VARIANTS = (
    "floor",
    "nccl_mm",
    "symm_mem_one_shot",
    "symm_mem_two_shot",
    "nccl_symm_mm",
    "distgemm_ar",
    "nccl_mm_sp",
    "symm_mem_fused",
    "distgemm_sp",
)
LAYOUT = {
    "floor": "",
    "nccl_mm": "ar",
    "symm_mem_one_shot": "ar",
    "symm_mem_two_shot": "ar",
    "nccl_symm_mm": "ar",
    "distgemm_ar": "ar",
    "nccl_mm_sp": "sp",
    "symm_mem_fused": "sp",
    "distgemm_sp": "sp",
}
REFERENCE = {"ar": "nccl_mm", "sp": "nccl_mm_sp"}  # each layout's variants are checked against
DISTGEMM = {"ar": "distgemm_ar", "sp": "distgemm_sp"}
# The unfused variants of each layout: the best of them per bucket is what the layout's others
# are measured against.
UNFUSED = {
    "ar": ("nccl_mm", "symm_mem_one_shot", "symm_mem_two_shot", "nccl_symm_mm"),
    "sp": ("nccl_mm_sp",),
}
# Their O and FC2 outputs live in symmetric memory (torch's for two-shot, an NCCL window for
# NCCL's symmetric kernels), all-reduced in place, as a server that uses them allocates them.
SYMMETRIC_OUTPUTS = ("symm_mem_two_shot", "nccl_symm_mm")
# The all-reduce baselines on symmetric memory are decode-size ops (servers switch to NCCL above
# a few MiB; at prefill sizes their buffers would take GiBs), so prefill leaves them out.
# torch's fused async-TP ops are not captured at decode: their first captured run on 2x H200
# ended the process with an illegal memory access (benchmarks/results/2026-11-23-serving.md);
# servers turn async-TP off under CUDA graphs for the same reason. They run in prefill (eager).
PHASE_VARIANTS = {
    "decode": tuple(v for v in VARIANTS if v != "symm_mem_fused"),
    "prefill": tuple(v for v in VARIANTS if v not in ("symm_mem_one_shot", *SYMMETRIC_OUTPUTS)),
}
DESCRIPTION = {
    "floor": "the stack's GEMMs alone (per-rank shapes, no communication)",
    "nccl_mm": "torch.mm + NCCL all_reduce after O and FC2",
    "symm_mem_one_shot": "torch.mm into symmetric memory + torch.ops.symm_mem.one_shot_all_reduce",
    "symm_mem_two_shot": "torch.mm into symmetric memory + torch.ops.symm_mem.two_shot_all_reduce_",
    "nccl_symm_mm": "torch.mm into an NCCL symmetric window + NCCL all_reduce (its symmetric "
    "kernels)",
    "distgemm_ar": "torch.mm for QKV, FC1; distgemm.gemm_all_reduce for O, FC2",
    "nccl_mm_sp": "NCCL all_gather + torch.mm; torch.mm + NCCL reduce_scatter",
    "symm_mem_fused": "torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter",
    "distgemm_sp": "distgemm.all_gather_gemm / gemm_reduce_scatter",
}
ERR_TOL = 2e-2  # relative Frobenius error of every layer output against the reference, bf16
SUSPECT_SLACK = 0.01  # a time more than 1% below the floor is a measurement error


def wrong(rec: dict[str, Any]) -> list[str]:
    """The variants whose outputs are off their reference by ERR_TOL or more (NaN counts)."""
    return out.off_tolerance(rec.get("rel_err", {}), VARIANTS, ERR_TOL)


def suspect(rec: dict[str, Any]) -> list[str]:
    """The variants timed more than SUSPECT_SLACK below the floor: each runs at least the
    floor's GEMMs, so such a time is a measurement error, not a result."""
    return out.below_floor(rec.get("ms", {}), "floor", VARIANTS, SUSPECT_SLACK)


def best(rec: dict[str, Any], layout: str) -> tuple[str | None, float | None]:
    """The best unfused variant of ``layout`` in a bucket and its time: the fastest of
    UNFUSED[layout] that is neither wrong nor suspect."""
    bad = set(wrong(rec)) | set(suspect(rec))
    return bu.best_of(rec.get("ms", {}), UNFUSED[layout], excluded=bad)


def derived(rec: dict[str, Any]) -> dict[str, Any]:
    """Per layout ``best_<layout>`` (the best unfused variant) and ``best_ms_<layout>``; per
    variant ``vs_best_<v>`` (its layout's best unfused time / its time: > 1 is faster) and
    ``floor_frac_<v>`` (floor / its time); None where a time is missing."""
    ms = rec.get("ms", {})
    d: dict[str, Any] = {}
    for layout in UNFUSED:
        d[f"best_{layout}"], d[f"best_ms_{layout}"] = best(rec, layout)
    for v in VARIANTS:
        base = d[f"best_ms_{LAYOUT[v]}"] if LAYOUT[v] else None
        d[f"vs_best_{v}"] = bu.speedup(base, ms.get(v))
        d[f"floor_frac_{v}"] = bu.speedup(ms.get("floor"), ms.get(v))
    return d


def point(rec: dict[str, Any], model: str) -> bu.Point:
    """A decode bucket as a point of issue 42's acceptance: distgemm_ar's speed-up over the
    best unfused all-reduce variant; its time over the floor (the stack's GEMMs alone) at
    1..MM_TOKENS tokens on MM_MODELS; why its number cannot count (wrong or suspect)."""
    d = derived(rec)
    why = ["distgemm_ar wrong"] if "distgemm_ar" in wrong(rec) else []
    if "distgemm_ar" in suspect(rec):
        why.append("distgemm_ar below the floor")
    mm_scope = model in bu.MM_MODELS and rec["tokens"] <= bu.MM_TOKENS
    over = d["floor_frac_distgemm_ar"]
    return bu.Point(
        f"decode/M{rec['tokens']}/TP{rec['tp']}",
        d["vs_best_distgemm_ar"],
        (1 / over if over else None) if mm_scope else None,
        mm_scope,
        ", ".join(why),
    )


def acceptance(records: Sequence[dict[str, Any]], model: str = MODEL) -> dict[str, Any]:
    """Issue 42's acceptance over the decode buckets (benchmarks/common/best_unfused.py)."""
    return bu.acceptance([point(r, model) for r in records if r.get("phase") == "decode"])


def variant_status(rec: dict[str, Any], v: str) -> str:
    """ok, unavailable (the reason in the note), wrong (numerics) or missing."""
    return out.status(rec, v, "ms", wrong(rec))


CSV_FIELDS = (
    "phase",
    "tokens",
    "variant",
    "layout",
    "captured",
    "status",
    "ms",
    "best_unfused",
    "vs_best_unfused",
    "floor_frac",
    "max_rel_err",
    "suspect",
    "note",
    "model",
    "layers",
    "tp",
    "torch",
    "device",
    "installed_by",
)
MEMORY_FIELDS = (
    "phase",
    "variant",
    "device_mib",
    "reserved_mib",
    "allocated_mib",
    "peak_allocated_mib",
    "distgemm_memory_stats",
    "note",
    "tp",
    "torch",
    "device",
    "installed_by",
)


def _meta_cells(meta: dict[str, Any]) -> dict[str, str]:
    return {
        "torch": str(meta.get("torch", "")),
        "device": str(meta.get("device", "")),
        "installed_by": str(meta.get("installed_by") or ""),
    }


def csv_rows(records: Sequence[dict[str, Any]], meta: dict[str, Any]) -> list[dict[str, str]]:
    """One row per (phase, tokens, variant) of the phase, each naming torch, the device and
    INSTALLED_BY."""
    rows = []
    for rec in records:
        d, bad = derived(rec), suspect(rec)
        for v in PHASE_VARIANTS[rec["phase"]]:
            err = rec.get("rel_err", {}).get(v)
            rows.append(
                {
                    "phase": rec["phase"],
                    "tokens": str(rec["tokens"]),
                    "variant": v,
                    "layout": LAYOUT[v],
                    "captured": "yes" if CAPTURED[rec["phase"]] else "no",
                    "status": variant_status(rec, v),
                    "ms": out.number_cell(rec.get("ms", {}).get(v)),
                    "best_unfused": (d[f"best_{LAYOUT[v]}"] or "") if LAYOUT[v] else "",
                    "vs_best_unfused": out.number_cell(d[f"vs_best_{v}"], 3),
                    "floor_frac": out.number_cell(d[f"floor_frac_{v}"], 3),
                    "max_rel_err": out.number_cell(err, 3) if err is not None else "",
                    "suspect": "yes" if v in bad else "",
                    "note": rec.get("unavailable", {}).get(v, ""),
                    "model": str(rec.get("model", MODEL)),
                    "layers": str(rec.get("layers", STACK_DEPTH)),
                    "tp": str(rec["tp"]),
                    **_meta_cells(meta),
                }
            )
    return rows


def memory_rows(run: dict[str, Any], meta: dict[str, Any]) -> list[dict[str, str]]:
    """One row per (phase, variant) of ``run["memory"]``: MiB the variant added (its graphs,
    workspaces and buffers beyond the activations every variant of a layout has)."""
    rows = []
    for phase, per_variant in run.get("memory", {}).items():
        for v, m in per_variant.items():
            stats = m.get("distgemm", "n/a")
            rows.append(
                {
                    "phase": phase,
                    "variant": v,
                    "device_mib": out.number_cell(m.get("device"), 1),
                    "reserved_mib": out.number_cell(m.get("reserved"), 1),
                    "allocated_mib": out.number_cell(m.get("allocated"), 1),
                    "peak_allocated_mib": out.number_cell(m.get("peak_allocated"), 1),
                    "distgemm_memory_stats": stats if isinstance(stats, str) else repr(stats),
                    "note": m.get("error", ""),
                    "tp": str(run.get("tp", meta.get("tp", ""))),
                    **_meta_cells(meta),
                }
            )
    return rows


def _cell(rec: dict[str, Any], v: str, bad: set[str], off: set[str]) -> str:
    t = rec.get("ms", {}).get(v)
    if not t:
        return ""
    return out.number_cell(t) + ("!" if v in bad else "") + ("x" if v in off else "")


def phase_table(records: Sequence[dict[str, Any]], phase: str) -> list[str]:
    """One phase: a line per token count, ms per step per variant ('!' below the floor, 'x'
    wrong), the best unfused variant in the server's layout and distgemm's speed-up over it."""
    recs = sorted((r for r in records if r["phase"] == phase), key=lambda r: r["tokens"])
    if not recs:
        return []
    layout = SERVER_LAYOUT[phase]
    dg = DISTGEMM[layout]
    variants = PHASE_VARIANTS[phase]
    header = ["tokens", *variants, "best unfused", f"{dg} vs best"]
    rows = []
    for rec in recs:
        bad, off = set(suspect(rec)), set(wrong(rec))
        d = derived(rec)
        speed = d[f"vs_best_{dg}"]
        row = [str(rec["tokens"]), *(_cell(rec, v, bad, off) for v in variants)]
        row += [d[f"best_{layout}"] or "", f"{speed:.3f}x" if speed else ""]
        rows.append(row)
    how = "CUDA graph per batch bucket" if CAPTURED[phase] else "eager"
    return [
        f"{phase} ({how}); a server's layout here: {LAYOUT_TEXT[layout]}; best unfused: the "
        f"fastest of {', '.join(UNFUSED[layout])} that ran right",
        *out.text_table(header, rows),
        "",
    ]


def numerics_lines(records: Sequence[dict[str, Any]]) -> list[str]:
    """Worst relative error per phase and variant against its layout's NCCL + mm."""
    lines = []
    for phase in PHASES:
        worst: dict[str, float] = {}
        for rec in records:
            if rec["phase"] != phase:
                continue
            for v, e in rec.get("rel_err", {}).items():
                e = e if e == e else math.inf
                worst[v] = max(worst.get(v, 0.0), e)
        if worst:
            cells = ", ".join(f"{v} {worst[v]:.2e}" for v in VARIANTS if v in worst)
            lines.append(f"  {phase}: {cells}")
    return lines


def memory_lines(run: dict[str, Any]) -> list[str]:
    rows = [
        [
            r["phase"],
            r["variant"],
            r["device_mib"],
            r["reserved_mib"],
            r["peak_allocated_mib"],
            r["distgemm_memory_stats"],
            r["note"],
        ]
        for r in memory_rows(run, {})
    ]
    if not rows:
        return []
    header = ("phase", "variant", "device", "reserved", "peak alloc", "distgemm stats", "note")
    buffers = run.get("buffers_mib", {})
    shared = "; ".join(
        f"{p} {lay}: {mib:.0f}" for p, per in buffers.items() for lay, mib in per.items()
    )
    return [
        "memory (MiB each variant added: graphs, workspaces, symmetric buffers; "
        f"activation buffers per variant, not counted: {shared or 'n/a'})",
        *out.text_table(header, rows),
        "",
    ]


def format_table(run: dict[str, Any], meta: dict[str, Any]) -> str:
    """The run as text: the header, a table per phase, the legend, what did not run and why,
    the numerics, memory and issue 42's acceptance."""
    records = run["records"]
    tp = run.get("tp", meta.get("tp"))
    name, depth = models.label(run.get("model", MODEL)), run.get("layers", STACK_DEPTH)
    lines = out.header_lines(
        f"{name} TP layer stack: {depth} layers "
        f"x (QKV, O, FC1, FC2), tp={tp}, bf16; ms per step (median, max over ranks); ratios = "
        "best unfused time / variant time (above 1 = faster than the best unfused path)",
        meta,
    )
    lines.append("")
    for phase in PHASES:
        lines += phase_table(records, phase)
    lines.append(
        f"'!': below the floor (a measurement bug); 'x': wrong (rel. err >= {ERR_TOL}); "
        "'-': did not run"
    )
    lines += out.did_not_run(records, lambda r: r["phase"])
    lines += ["rel. err vs the layout's NCCL + torch.mm (worst over buckets and layer outputs):"]
    lines += numerics_lines(records)
    lines.append("")
    lines += memory_lines(run)
    model = run.get("model", MODEL)
    scope = f"{models.label(model)} stack, distgemm_ar at every decode batch"
    lines += bu.acceptance_lines(acceptance(records, model), tp, scope)
    return "\n".join(lines)


def plot(run: dict[str, Any], meta: dict[str, Any], path: str) -> str | None:
    """ms per step against tokens per phase (one line per variant, the floor dashed, suspect
    points crossed) and the memory each variant added; PNG. None when written, else why not."""
    plt, why = out.load_pyplot()
    if plt is None:
        return why
    records = run["records"]
    if not any(r.get("ms") for r in records):
        return "no variant timed"
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    for ax, phase in zip(axes, PHASES):
        recs = sorted((r for r in records if r["phase"] == phase), key=lambda r: r["tokens"])
        for v in PHASE_VARIANTS[phase]:
            pts = [(r["tokens"], r["ms"][v]) for r in recs if r.get("ms", {}).get(v)]
            if not pts:
                continue
            style = dict(marker="o", ms=3, ls=":" if LAYOUT[v] == "sp" else "-")
            if v == "floor":
                style.update(color="k", ls="--")
            ax.plot(*zip(*pts), label=v, **style)
            bad = [(r["tokens"], r["ms"][v]) for r in recs if v in suspect(r)]
            if bad:
                ax.plot(*zip(*bad), "x", color="red", ms=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per step")
        ax.set_ylabel("ms per step (median, max over ranks)")
        how = "CUDA graphs" if CAPTURED[phase] else "eager"
        ax.set_title(f"{phase} ({how}), server layout {SERVER_LAYOUT[phase]}", fontsize=9)
        ax.legend(fontsize=7)
    mem = memory_rows(run, meta)
    ax = axes[2]
    if mem:
        labels = [f"{r['phase']}\n{r['variant']}" for r in mem]
        ax.bar(range(len(mem)), [float(r["device_mib"] or 0.0) for r in mem], color="tab:blue")
        ax.set_xticks(range(len(mem)), labels, rotation=90, fontsize=6)
        ax.set_ylabel("device MiB added (graphs, workspaces)")
    ax.set_title("memory per variant", fontsize=9)
    title = (
        f"{models.label(run.get('model', MODEL))} x{run.get('layers', STACK_DEPTH)} layers, "
        f"TP={run.get('tp', meta.get('tp'))} bf16"
    )
    out.save_figure(plt, fig, title, meta, path)
    return None


def write_outputs(run: dict[str, Any], meta: dict[str, Any], stem: str) -> str | None:
    """``stem``.json (meta, run, acceptance), .csv (times), -memory.csv, .txt (the table) and
    .png; prints the table. Returns why the PNG was not drawn, or None."""
    doc = dict(meta=meta, run=run, acceptance=acceptance(run["records"], run.get("model", MODEL)))
    csvs = {
        "": out.csv_text(CSV_FIELDS, csv_rows(run["records"], meta)),
        "-memory": out.csv_text(MEMORY_FIELDS, memory_rows(run, meta)),
    }
    out.write_files(stem, doc, csvs, format_table(run, meta))
    return out.draw(plot, run, meta, path=stem + ".png")


def replot(path: str, out_dir: str) -> int:
    """Table, CSVs and PNG again from a stored JSON, without a GPU (1 when the PNG failed)."""
    doc, stem = out.load_doc(path, out_dir)
    return 0 if write_outputs(doc["run"], doc["meta"], stem) is None else 1
