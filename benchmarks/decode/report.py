"""Decode benchmark reporting: the variants, derived ratios, suspect (below the floor) and wrong
times, issue 19's acceptance columns (met/MISSED), and the table, CSV, JSON and plot of a run.
Pure (no torch, no GPU): records in, text and files out; benchmarks/decode/decode_layers.py is
the torchrun part.

A record is one (model, layer, tokens) case of a row-parallel layer with its output all-reduced:
``us`` per variant (per call: a CUDA graph of CALLS_PER_GRAPH calls, median replay over a
steady-state window, max over ranks, divided by the calls), ``rel_err`` against mm + NCCL
all_reduce (mm alone: 0.0 when its output was written and finite, else NaN) and
``unavailable`` per variant with the reason."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from benchmarks.common import report as out

MODELS = ("8B", "70B", "405B")
LAYERS = ("O", "FC2")  # the row-parallel layers, all-reduced at decode
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CALLS_PER_GRAPH = 20
VARIANTS = ("mm", "nccl", "one_shot", "distgemm", "distgemm_fused")
REFERENCE = "nccl"
DESCRIPTION = {
    "mm": "torch.mm alone, this rank's partial product (the floor)",
    "nccl": "torch.mm + NCCL all_reduce",
    "one_shot": "torch.mm into symmetric memory + torch.ops.symm_mem.one_shot_all_reduce_out",
    "distgemm": "distgemm.gemm_all_reduce",
    "distgemm_fused": 'distgemm.gemm_all_reduce(path="fused"): GEMM + all-reduce in one kernel',
}
ERR_TOL = 2e-2  # relative Frobenius error against mm + NCCL, bf16
SUSPECT_SLACK = 0.01  # a time more than 1% below mm alone is a measurement error
# Issue 19's acceptance: distgemm >= 1.1x mm + one_shot and >= 1.0x mm + NCCL at 1..256 tokens
# on 70B and 405B O and FC2, and at most 1.25x mm alone at 1..32 tokens.
TARGET_VS_ONE_SHOT, TARGET_VS_NCCL, MAX_OVER_MM = 1.1, 1.0, 1.25
OVER_MM_TOKENS = 32
SCOPE_MODELS, SCOPE_TOKENS = ("70B", "405B"), 256
CRITERIA = {
    "vs_one_shot": f"distgemm >= {TARGET_VS_ONE_SHOT}x mm + one_shot",
    "vs_nccl": f"distgemm >= {TARGET_VS_NCCL}x mm + NCCL",
    "over_mm": f"distgemm <= {MAX_OVER_MM}x mm alone (tokens <= {OVER_MM_TOKENS})",
}


def case_name(rec: dict[str, Any]) -> str:
    return f"{rec['model']}/{rec['layer']}/M{rec['tokens']}/TP{rec['tp']}"


def wrong(rec: dict[str, Any]) -> list[str]:
    """The variants whose output is off mm + NCCL's by ERR_TOL or more (NaN counts)."""
    return out.off_tolerance(rec.get("rel_err", {}), VARIANTS, ERR_TOL)


def suspect(rec: dict[str, Any]) -> list[str]:
    """The variants timed more than SUSPECT_SLACK below mm alone: each runs that GEMM, so such
    a time is a measurement error, not a result."""
    return out.below_floor(rec.get("us", {}), "mm", VARIANTS, SUSPECT_SLACK)


def derived(rec: dict[str, Any]) -> dict[str, float | None]:
    """``vs_one_shot`` and ``vs_nccl`` (their time / distgemm's: > 1 is faster) and
    ``over_mm`` (distgemm's time / mm alone); None where a time is missing."""
    us = rec.get("us", {})
    dg = us.get("distgemm")

    def ratio(a, b):
        return a / b if (a and b) else None

    return {
        "vs_one_shot": ratio(us.get("one_shot"), dg),
        "vs_nccl": ratio(us.get("nccl"), dg),
        "over_mm": ratio(dg, us.get("mm")),
    }


def in_scope(rec: dict[str, Any]) -> bool:
    """Whether the case counts for the acceptance (70B and 405B, 1..256 tokens)."""
    return rec["model"] in SCOPE_MODELS and rec["tokens"] <= SCOPE_TOKENS


def verdicts(rec: dict[str, Any]) -> dict[str, bool | None]:
    """Per criterion: True/False, None where a time is missing or (over_mm) the token count is
    above OVER_MM_TOKENS; False where a variant it uses is suspect or wrong."""
    d = derived(rec)
    bad = set(suspect(rec)) | set(wrong(rec))

    def judge(value, ok, uses):
        if value is None:
            return None
        return False if bad & set(uses) else ok(value)

    return {
        "vs_one_shot": judge(
            d["vs_one_shot"], lambda x: x >= TARGET_VS_ONE_SHOT, ("distgemm", "one_shot")
        ),
        "vs_nccl": judge(d["vs_nccl"], lambda x: x >= TARGET_VS_NCCL, ("distgemm", "nccl")),
        "over_mm": None
        if rec["tokens"] > OVER_MM_TOKENS
        else judge(d["over_mm"], lambda x: x <= MAX_OVER_MM, ("distgemm", "mm")),
    }


def acceptance(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per criterion over the in-scope cases it applies to: ``met`` (True only when every one
    was measured and met; False when one missed; None otherwise), ``measured``, ``of`` and the
    ``missed`` case names."""
    res = {}
    for key in CRITERIA:
        applies = [
            r
            for r in records
            if in_scope(r) and (key != "over_mm" or r["tokens"] <= OVER_MM_TOKENS)
        ]
        got = [(r, verdicts(r)[key]) for r in applies]
        missed = [case_name(r) for r, ok in got if ok is False]
        measured = sum(ok is not None for _, ok in got)
        met = False if missed else (True if applies and measured == len(applies) else None)
        res[key] = dict(met=met, measured=measured, of=len(applies), missed=missed)
    return res


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
    *(f"us_{v}" for v in VARIANTS),
    *(f"status_{v}" for v in VARIANTS),
    *(f"rel_err_{v}" for v in VARIANTS),
    "suspect",
    *CRITERIA,
    *(f"verdict_{c}" for c in CRITERIA),
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
        d, vd, errs = derived(rec), verdicts(rec), rec.get("rel_err", {})
        row = {f: str(rec.get(f, "")) for f in ("model", "layer", "tokens", "m", "n", "k", "tp")}
        for v in VARIANTS:
            row[f"us_{v}"] = out.number_cell(rec.get("us", {}).get(v), 2)
            row[f"status_{v}"] = variant_status(rec, v)
            row[f"rel_err_{v}"] = out.number_cell(errs[v], 3) if v in errs else ""
        row["suspect"] = " ".join(suspect(rec))
        for c in CRITERIA:
            row[c] = out.number_cell(d[c], 3)
            row[f"verdict_{c}"] = "" if vd[c] is None else out.verdict(vd[c])
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


def _judged(value: float | None, ok: bool | None) -> str:
    if value is None:
        return ""
    return f"{value:.3f}x" + ("" if ok is None else f" {out.verdict(ok)}")


def format_table(records: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The run as text: header, one line per case (µs per call per variant, the three ratios
    with their verdicts), the legend, what did not run and why, the acceptance summary."""
    tp = records[0]["tp"] if records else meta.get("tp")
    lines = out.header_lines(
        f"Decode row-parallel layers (GEMM + all-reduce), tp={tp}, bf16: us per call "
        f"(CUDA graph of {CALLS_PER_GRAPH} calls, median, max over ranks)",
        meta,
    )
    header = [
        "model",
        "layer",
        "tokens",
        "mm",
        "mm+nccl",
        "mm+one_shot",
        "distgemm",
        "distgemm fused",
        f"vs one_shot (>={TARGET_VS_ONE_SHOT}x)",
        f"vs nccl (>={TARGET_VS_NCCL}x)",
        f"/ mm (<={MAX_OVER_MM}x, <={OVER_MM_TOKENS} tok)",
    ]
    rows = []
    for rec in records:
        bad, off = set(suspect(rec)), set(wrong(rec))
        d, vd = derived(rec), verdicts(rec)
        rows.append(
            [
                rec["model"],
                rec["layer"],
                str(rec["tokens"]),
                *(_cell(rec, v, bad, off) for v in VARIANTS),
                *(_judged(d[c], vd[c]) for c in CRITERIA),
            ]
        )
    lines += ["", *out.text_table(header, rows), ""]
    lines.append(
        f"'!': below mm alone (a measurement bug); 'x': wrong (rel. err >= {ERR_TOL} vs "
        "mm + NCCL); '-': did not run"
    )
    lines += out.did_not_run(records, lambda r: f"{r['model']}/{r['layer']}")
    lines.append(
        f"acceptance (issue 19: {', '.join(SCOPE_MODELS)} O and FC2, tokens 1..{SCOPE_TOKENS}):"
    )
    for key, acc in acceptance(records).items():
        tail = f"; missed: {', '.join(acc['missed'])}" if acc["missed"] else ""
        lines.append(
            f"  {CRITERIA[key]}: {out.verdict(acc['met'])} "
            f"({acc['measured']} of {acc['of']} cases measured{tail})"
        )
    return "\n".join(lines)


def plot(records: Sequence[dict[str, Any]], meta: dict[str, Any], path: str) -> str | None:
    """µs per call against tokens, one panel per (model, layer), one line per variant
    (suspect points crossed); PNG. None when written, else why not."""
    plt, why = out.load_pyplot()
    if plt is None:
        return why
    panels = sorted(
        {(r["model"], r["layer"]) for r in records if r.get("us")},
        key=lambda p: (MODELS.index(p[0]) if p[0] in MODELS else 99, p[1]),
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
                ax.plot(*zip(*pts), label=DESCRIPTION[v].split(",")[0][:40], **style)
            bad = [(r["tokens"], r["us"][v]) for r in recs if v in suspect(r)]
            if bad:
                ax.plot(*zip(*bad), "x", color="red", ms=9)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens")
        ax.set_ylabel("us per call")
        ax.set_title(f"Llama-{model} {layer}", fontsize=9)
        ax.legend(fontsize=7)
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


def replot(path: str, out_dir: str) -> int:
    """Table, CSV and PNG again from a stored JSON, without a GPU (1 when the PNG failed)."""
    doc, stem = out.load_doc(path, out_dir)
    return 0 if write_outputs(doc["records"], doc["meta"], stem) is None else 1
