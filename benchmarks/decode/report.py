"""Decode benchmark reporting: the variants, the best unfused path and the ratios against it,
suspect (below the floor) and wrong times, issue 42's acceptance, and the table, CSV, JSON and
plot of a run. Pure (no torch, no GPU): records in, text and files out;
benchmarks/decode/decode_layers.py is the torchrun part.

A record is one (model, layer, tokens) case of a row-parallel layer with its output all-reduced:
``us`` per variant (per call: a CUDA graph of CALLS_PER_GRAPH calls, median replay over a
steady-state window, max over ranks, divided by the calls), ``rel_err`` against mm + NCCL
all_reduce (mm alone: 0.0 when its output was written and finite, else NaN),
``unavailable`` per variant with the reason and ``weight_copies`` (the weights the graph's calls
cycle through, so that each call reads its weight from HBM: decode_layers.weight_copies).
Every ratio is a speed-up against the best unfused variant of the case: ``best unfused time /
variant time``, above 1 = the variant is faster (benchmarks/common/best_unfused.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from benchmarks.common import best_unfused as bu
from benchmarks.common import models
from benchmarks.common import report as out
from benchmarks.decode import cases

CALLS_PER_GRAPH = 20
VARIANTS = (
    "mm", "nccl", "one_shot", "two_shot", "nccl_symm", "distgemm", "distgemm_fused",
    "distgemm_fused_two_shot", "dg_one_shot", "dg_two_shot", "dg_one_shot_ll", "dg_two_shot_ll",
    "dg_two_shot_pull",
)  # fmt: skip
# distgemm.gemm_all_reduce forced onto each fused path (distgemm.runtime.machine.FUSED_PATHS):
# the fused kernel with its one-shot tail, and with the CUTLASS kernel's two-shot tail (not run
# at the decode kernel's token counts).
FUSED_PATH_VARIANTS = {"distgemm_fused": "fused", "distgemm_fused_two_shot": "fused_two_shot"}
# torch.mm + our all-reduce forced (decode_layers --own-all-reduce): what the model chooses
# among, timed so that a run validates its choice (benchmarks/decode/fit_reduce.py).
OWN_ALL_REDUCE = {
    "dg_one_shot": "one_shot", "dg_two_shot": "two_shot",
    "dg_one_shot_ll": "one_shot_ll", "dg_two_shot_ll": "two_shot_ll",
    "dg_two_shot_pull": "two_shot_pull",
}  # fmt: skip
UNFUSED = ("nccl", "one_shot", "two_shot", "nccl_symm")  # best unfused: the fastest of these
FUSED = ("distgemm", *FUSED_PATH_VARIANTS)
REFERENCE = "nccl"
DESCRIPTION = {
    "mm": "torch.mm alone, this rank's partial product (the floor)",
    "nccl": "torch.mm + NCCL all_reduce",
    "one_shot": "torch.mm into symmetric memory + torch.ops.symm_mem.one_shot_all_reduce_out",
    "two_shot": "torch.mm into symmetric memory + torch.ops.symm_mem.two_shot_all_reduce_ "
    "(in place)",
    "nccl_symm": "torch.mm into an NCCL symmetric window + NCCL all_reduce (in place)",
    "distgemm": "distgemm.gemm_all_reduce",
    "distgemm_fused": 'distgemm.gemm_all_reduce(path="fused"): GEMM + all-reduce in one kernel',
    "distgemm_fused_two_shot": 'distgemm.gemm_all_reduce(path="fused_two_shot"): the fused '
    "kernel with its two-shot tail (each tile's slices summed by one owner rank, copied by the "
    "others)",
    "dg_one_shot": "torch.mm + distgemm's own one-shot all-reduce (runtime/allreduce.py), forced",
    "dg_two_shot": "torch.mm + distgemm's own two-shot all-reduce (runtime/allreduce.py), forced",
    "dg_one_shot_ll": "torch.mm + distgemm's own one-shot all-reduce with LL lines, forced",
    "dg_two_shot_ll": "torch.mm + distgemm's own two-shot all-reduce with LL lines, forced",
    "dg_two_shot_pull": "torch.mm into distgemm's input region + its own two-shot all-reduce "
    "that reads the peers' inputs in place, forced",
}
HEADERS = {
    "mm": "mm",
    "nccl": "mm+nccl",
    "one_shot": "mm+one_shot",
    "two_shot": "mm+two_shot",
    "nccl_symm": "mm+nccl_symm",
    "distgemm": "distgemm",
    "distgemm_fused": "distgemm fused",
    "distgemm_fused_two_shot": "distgemm fused 2shot",
    "dg_one_shot": "mm+dg one_shot",
    "dg_two_shot": "mm+dg two_shot",
    "dg_one_shot_ll": "mm+dg one_shot_ll",
    "dg_two_shot_ll": "mm+dg two_shot_ll",
    "dg_two_shot_pull": "mm+dg two_shot_pull",
}
ERR_TOL = 2e-2  # relative Frobenius error against mm + NCCL, bf16
SUSPECT_SLACK = 0.01  # a time more than 1% below mm alone is a measurement error
RATIOS = ("vs_best", "fused_vs_best", "fused_two_shot_vs_best", "over_mm")


def case_name(rec: dict[str, Any]) -> str:
    return f"{rec['model']}/{rec['layer']}/M{rec['tokens']}/TP{rec['tp']}"


def wrong(rec: dict[str, Any]) -> list[str]:
    """The variants whose output is off mm + NCCL's by ERR_TOL or more (NaN counts)."""
    return out.off_tolerance(rec.get("rel_err", {}), VARIANTS, ERR_TOL)


def suspect(rec: dict[str, Any]) -> list[str]:
    """The variants timed more than SUSPECT_SLACK below mm alone: each runs that GEMM, so such
    a time is a measurement error, not a result."""
    return out.below_floor(rec.get("us", {}), "mm", VARIANTS, SUSPECT_SLACK)


def best(rec: dict[str, Any]) -> tuple[str | None, float | None]:
    """The best unfused variant of a case and its time: the fastest of UNFUSED that is neither
    wrong nor suspect."""
    bad = set(wrong(rec)) | set(suspect(rec))
    return bu.best_of(rec.get("us", {}), UNFUSED, excluded=bad)


def derived(rec: dict[str, Any]) -> dict[str, Any]:
    """``best_unfused`` (its variant) and ``best_us``; ``vs_best``, ``fused_vs_best`` and
    ``fused_two_shot_vs_best`` (best unfused time / distgemm's, resp. its fused path's with the
    one-shot and the two-shot tail: > 1 is faster) and ``over_mm`` (distgemm's time / mm
    alone); None where a time is missing."""
    us = rec.get("us", {})
    name, t = best(rec)
    dg = us.get("distgemm")
    return {
        "best_unfused": name,
        "best_us": t,
        "vs_best": bu.speedup(t, dg),
        "fused_vs_best": bu.speedup(t, us.get("distgemm_fused")),
        "fused_two_shot_vs_best": bu.speedup(t, us.get("distgemm_fused_two_shot")),
        "over_mm": bu.speedup(dg, us.get("mm")),
    }


def in_scope(rec: dict[str, Any]) -> bool:
    """Whether the case counts for issue 42's acceptance (cases.in_scope)."""
    return cases.in_scope(rec["model"], rec["layer"], rec["tokens"])


def point(rec: dict[str, Any]) -> bu.Point:
    """The case as a point of the acceptance: distgemm's speed-up over the best unfused path,
    its time over mm alone at 1..MM_TOKENS tokens on MM_MODELS, and why its number cannot
    count (wrong or suspect)."""
    d = derived(rec)
    why = []
    if "distgemm" in wrong(rec):
        why.append("distgemm wrong")
    if "distgemm" in suspect(rec):
        why.append("distgemm below mm alone")
    mm_scope = _over_mm_covers(rec["model"], rec["tokens"])
    return bu.Point(
        case_name(rec), d["vs_best"], d["over_mm"] if mm_scope else None, mm_scope, ", ".join(why)
    )


def acceptance(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Issue 42's acceptance over the in-scope cases (benchmarks/common/best_unfused.py), every
    case of the scope at the records' TP counted: one the run did not reach (another model, a
    token count left out, a run cut short) is a point not measured, so no criterion is met on
    part of the scope."""
    scoped = [r for r in records if in_scope(r)]
    points = [point(r) for r in scoped]
    tps = {r["tp"] for r in records}
    if len(tps) == 1:
        tp, ran = tps.pop(), {case_name(r) for r in scoped}
        for model, layer, tokens in cases.scope_cases():
            name = case_name(dict(model=model, layer=layer, tokens=tokens, tp=tp))
            if name not in ran:
                points.append(bu.Point(name, None, None, _over_mm_covers(model, tokens)))
    return bu.acceptance(points)


def _over_mm_covers(model: str, tokens: int) -> bool:
    """Whether the over-torch.mm criterion covers a point (MM_MODELS at 1..MM_TOKENS tokens)."""
    return model in bu.MM_MODELS and tokens <= bu.MM_TOKENS


SCOPE_TEXT = (
    f"{', '.join(cases.SCOPE_MODELS)} {' and '.join(cases.SCOPE_LAYERS)}, "
    f"tokens 1..{cases.SCOPE_TOKENS}"
)


def variant_status(rec: dict[str, Any], v: str) -> str:
    """ok, unavailable (the reason in the notes), wrong (numerics) or missing."""
    return out.status(rec, v, "us", wrong(rec))


CSV_FIELDS = (
    "model",
    "layer",
    "tokens",
    "m",
    "n",
    "k",
    "tp",
    "weight_copies",
    *(f"us_{v}" for v in VARIANTS),
    *(f"status_{v}" for v in VARIANTS),
    *(f"rel_err_{v}" for v in VARIANTS),
    "suspect",
    "best_unfused",
    "us_best_unfused",
    *RATIOS,
    "auto_runs",
    "in_scope",
    "note",
    "torch",
    "device",
    "installed_by",
)


def csv_rows(records: Sequence[dict[str, Any]], meta: dict[str, Any]) -> list[dict[str, str]]:
    """One row per case, each naming torch, the device and INSTALLED_BY."""
    rows = []
    for rec in records:
        d, errs = derived(rec), rec.get("rel_err", {})
        head = ("model", "layer", "tokens", "m", "n", "k", "tp", "weight_copies")
        row = {f: str(rec.get(f, "")) for f in head}
        for v in VARIANTS:
            row[f"us_{v}"] = out.number_cell(rec.get("us", {}).get(v), 2)
            row[f"status_{v}"] = variant_status(rec, v)
            row[f"rel_err_{v}"] = out.number_cell(errs[v], 3) if v in errs else ""
        row["suspect"] = " ".join(suspect(rec))
        row["best_unfused"] = d["best_unfused"] or ""
        row["us_best_unfused"] = out.number_cell(d["best_us"], 2)
        for c in RATIOS:
            row[c] = out.number_cell(d[c], 3)
        row["auto_runs"] = auto_label(rec)
        row["in_scope"] = "yes" if in_scope(rec) else ""
        row["note"] = "; ".join(f"{v}: {w}" for v, w in rec.get("unavailable", {}).items())
        row.update(
            torch=str(meta.get("torch", "")),
            device=str(meta.get("device", "")),
            installed_by=str(meta.get("installed_by") or ""),
        )
        rows.append(row)
    return rows


def _cell(rec, v, bad, off) -> str:
    t = rec.get("us", {}).get(v)
    return (
        out.number_cell(t, 2) + ("!" if v in bad else "") + ("x" if v in off else "") if t else ""
    )


def auto_label(rec: dict[str, Any]) -> str:
    """What path="auto" ran at this case: the fused path that forces it ("fused",
    "fused_two_shot"), or "collective/<all-reduce>" ('' unknown)."""
    auto = rec.get("auto") or {}
    if auto.get("path") == "collective":
        return f"collective/{auto.get('all_reduce') or 'nccl'}"
    tail = auto.get("fused_tail")
    if auto.get("path") == "fused" and tail not in (None, "one_shot"):
        return f"fused_{tail}"
    return auto.get("path") or ""


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}x"


def format_table(records: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The run as text: header (with the ratios' direction), one line per case (us per call per
    variant, the best unfused variant, the ratios), the legend, what did not run and why, and
    issue 42's acceptance."""
    tp = records[0]["tp"] if records else meta.get("tp")
    lines = out.header_lines(
        f"Decode row-parallel layers (GEMM + all-reduce), tp={tp}, bf16: us per call "
        f"(CUDA graph of {CALLS_PER_GRAPH} calls, median, max over ranks); ratios = best "
        "unfused time / variant time (above 1 = faster than the best unfused path)",
        meta,
    )
    header = [
        "model",
        "layer",
        "tokens",
        *(HEADERS[v] for v in VARIANTS),
        "best unfused",
        "distgemm vs best",
        "fused vs best",
        "fused 2shot vs best",
        "distgemm / mm",
        "auto runs",
    ]
    rows = []
    for rec in records:
        bad, off = set(suspect(rec)), set(wrong(rec))
        d = derived(rec)
        rows.append(
            [
                rec["model"],
                rec["layer"],
                str(rec["tokens"]),
                *(_cell(rec, v, bad, off) for v in VARIANTS),
                d["best_unfused"] or "",
                *(_ratio(d[c]) for c in RATIOS),
                auto_label(rec),
            ]
        )
    lines += ["", *out.text_table(header, rows), ""]
    lines.append(
        f"best unfused: the fastest of {', '.join(HEADERS[v] for v in UNFUSED)} that ran right; "
        f"'!': below mm alone (a measurement bug); 'x': wrong (rel. err >= {ERR_TOL} vs "
        "mm + NCCL); '-': did not run"
    )
    lines += out.did_not_run(records, lambda r: f"{r['model']}/{r['layer']}")
    lines += bu.acceptance_lines(acceptance(records), tp, SCOPE_TEXT)
    return "\n".join(lines)


def plot(records: Sequence[dict[str, Any]], meta: dict[str, Any], path: str) -> str | None:
    """µs per call against tokens, one panel per (model, layer), one line per variant
    (suspect points crossed); PNG. None when written, else why not."""
    plt, why = out.load_pyplot()
    if plt is None:
        return why
    order = {m: i for i, m in enumerate(models.MODELS)}
    panels = sorted(
        {(r["model"], r["layer"]) for r in records if r.get("us")},
        key=lambda p: (order.get(p[0], 99), p[1]),
    )
    if not panels:
        return "no variant timed"
    cols = min(len(panels), 2)
    rows_n = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(6.5 * cols, 4 * rows_n), squeeze=False)
    for ax, (model, layer) in zip(axes.flat, panels):
        recs = sorted(
            (r for r in records if (r["model"], r["layer"]) == (model, layer)),
            key=lambda r: r["tokens"],
        )
        for v in VARIANTS:
            pts = [(r["tokens"], r["us"][v]) for r in recs if r.get("us", {}).get(v)]
            if pts:
                style = dict(marker="o", ms=3)
                if v == "mm":
                    style.update(color="k", ls="--")
                elif v in UNFUSED:
                    style.update(ls=":")
                ax.plot(*zip(*pts), label=DESCRIPTION[v].split(",")[0][:40], **style)
            bad = [(r["tokens"], r["us"][v]) for r in recs if v in suspect(r)]
            if bad:
                ax.plot(*zip(*bad), "x", color="red", ms=9)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens")
        ax.set_ylabel("us per call")
        ax.set_title(f"{models.label(model)} {layer}", fontsize=9)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    tp = records[0]["tp"] if records else meta.get("tp")
    title = f"decode GEMM + all-reduce, TP={tp} bf16, CUDA graphs of {CALLS_PER_GRAPH} calls"
    out.save_figure(plt, fig, title, meta, path)
    return None


def write_outputs(records: Sequence[dict[str, Any]], meta: dict[str, Any], stem: str):
    """``stem``.json (meta, records, acceptance), .csv, .txt (the table) and .png; prints the
    table. Returns why the PNG was not drawn, or None."""
    doc = dict(meta=meta, records=list(records), acceptance=acceptance(records))
    csvs = {"": out.csv_text(CSV_FIELDS, csv_rows(records, meta))}
    out.write_files(stem, doc, csvs, format_table(records, meta))
    return out.draw(plot, records, meta, path=stem + ".png")


def merge(docs: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records of several runs at one TP as one run (a later run's case replaces an
    earlier one's), with the first run's meta and ``merged_runs``: each run's date and argv;
    ValueError where the runs' TPs differ."""
    tps = sorted({d["meta"].get("tp") for d in docs}, key=str)
    if len(tps) > 1:
        raise ValueError(f"the runs are at different TPs ({', '.join(map(str, tps))})")
    merged: dict[tuple, dict[str, Any]] = {}
    for d in docs:
        for r in d["records"]:
            merged[(r["model"], r["layer"], r["tokens"])] = r
    meta = dict(docs[0]["meta"])
    if len(docs) > 1:
        meta["merged_runs"] = [
            dict(date=d["meta"].get("date"), argv=d["meta"].get("argv")) for d in docs
        ]
    return list(merged.values()), meta


def replot(paths: Sequence[str], out_dir: str) -> int:
    """Table, CSV and PNG again from stored JSONs of one TP (several: merged into one run, named
    after the first), without a GPU; 1 when the PNG failed."""
    loaded = [out.load_doc(p, out_dir) for p in paths]
    records, meta = merge([doc for doc, _ in loaded])
    return 0 if write_outputs(records, meta, loaded[0][1]) is None else 1
