"""Llama-3 sweep reporting: derived ratios, suspect times, acceptance targets, CSV, JSON, the
stdout table, the plot, and --replot of stored sweeps. Pure (no torch, no GPU): records in,
text and files out."""

from __future__ import annotations

import csv
import datetime
import io
import json
import os
from collections.abc import Sequence
from typing import Any

from benchmarks.common.report import load_pyplot, number_cell

VARIANTS = ("floor", "floor_dg", "baseline", "symm_mem", "dg_default", "dg_best", "dg_auto")
FLOORS = ("floor", "floor_dg")
DG = ("dg_default", "dg_best", "dg_auto")
# The acceptance targets, checked per case by ``targets``: for 70B/405B at M >= 4096, distgemm's
# best >= 1.3x torch async-TP and at least TARGET_EFF_OWN of its own kernel's floor (per TP: the
# TP=2 sweep's 0.97, the TP issue's 0.93 at TP 4 and 8, where each GPU's GEMM is smaller; none
# at another TP); everywhere, the public op (dg_auto) at most 2% slower than the plain baseline.
TARGET_MODELS, TARGET_MIN_TOKENS = ("70B", "405B"), 4096
TARGET_VS_SYMM, TARGET_AUTO_SLACK = 1.3, 1.02
TARGET_EFF_OWN = {2: 0.97, 4: 0.93, 8: 0.93}
# A variant timed more than 1% below the case's compute floor is a measurement error: marked
# suspect in the table, the CSV and the plot, and it fails every target it takes part in.
SUSPECT_SLACK = 0.01


def tflops(m: int, n: int, k: int, ms: float | None) -> float | None:
    if not ms or ms <= 0:
        return None
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def derived(rec: dict[str, Any]) -> dict[str, Any]:
    """Speedups over the plain baseline, overlap efficiencies against the torch.mm floor
    (``eff_*``) and against distgemm's own kernel (``eff_own_*``) of a result record
    ({"ms": {variant: ms or None}, ...}); None where a time is missing."""
    ms = rec.get("ms", {})
    floor, own, base = ms.get("floor"), ms.get("floor_dg"), ms.get("baseline")
    out: dict[str, Any] = {}
    for v in VARIANTS:
        t = ms.get(v)
        if v not in FLOORS:
            out[f"speedup_{v}"] = (base / t) if (t and base) else None
        out[f"eff_{v}"] = (floor / t) if (t and floor) else None
        if v in DG:
            out[f"eff_own_{v}"] = (own / t) if (t and own) else None
    sym, best = ms.get("symm_mem"), ms.get("dg_best")
    out["dg_best_vs_symm_mem"] = (sym / best) if (sym and best) else None
    # The most any overlap could gain over symm_mem: hiding all communication leaves the faster
    # of the two compute floors (below TARGET_VS_SYMM that target is out of reach at this TP).
    floors = [f for f in (floor, own) if f]
    out["bound_vs_symm_mem"] = (sym / min(floors)) if (sym and floors) else None
    return out


def suspect(rec: dict[str, Any]) -> list[str]:
    """The variants timed faster than the case's compute floor (the faster of torch.mm and
    distgemm's own kernel on the per-rank GEMM) by more than SUSPECT_SLACK: every variant does
    at least that GEMM, so such a time is a measurement error, not a result."""
    ms = rec.get("ms", {})
    floors = [ms[f] for f in FLOORS if ms.get(f)]
    if not floors:
        return []
    bound = min(floors) * (1.0 - SUSPECT_SLACK)
    return [v for v in VARIANTS if v not in FLOORS and ms.get(v) and ms[v] < bound]


def targets(rec: dict[str, Any]) -> dict[str, bool | None]:
    """The acceptance targets of one measured record: ``vs_symm_mem`` (dg_best >= 1.3x symm_mem)
    and ``eff_own`` (dg_best >= TARGET_EFF_OWN[tp] of floor_dg) apply to 70B/405B at M >= 4096
    (None elsewhere, at a TP without an efficiency target, or when a time is missing);
    ``auto_vs_baseline`` (dg_auto <= 1.02 x baseline) applies to every case."""
    d, ms = derived(rec), rec.get("ms", {})
    big = rec.get("model") in TARGET_MODELS and rec.get("tokens", 0) >= TARGET_MIN_TOKENS
    bad = set(suspect(rec))
    vs, eff = d["dg_best_vs_symm_mem"], d["eff_own_dg_best"]
    auto, base = ms.get("dg_auto"), ms.get("baseline")
    goal = TARGET_EFF_OWN.get(rec.get("tp"))

    def verdict(applies: bool, ok: bool | None, uses: Sequence[str]) -> bool | None:
        if not applies or ok is None:
            return None
        return False if bad & set(uses) else ok  # a time below its floor fails its target

    return {
        "vs_symm_mem": verdict(big, vs and vs >= TARGET_VS_SYMM, ("dg_best", "symm_mem")),
        "eff_own": verdict(big and goal is not None, eff and goal and eff >= goal, ("dg_best",)),
        "auto_vs_baseline": verdict(
            True,
            (auto <= TARGET_AUTO_SLACK * base) if (auto and base) else None,
            ("dg_auto", "baseline"),
        ),
    }


CSV_FIELDS = (
    ["case", "model", "layer", "tokens", "tp", "m", "n", "k", "status", "reason"]
    + [f"ms_{v}" for v in VARIANTS]
    + [
        "suspect",
        "ms_dg_S_tp",
        "ms_dg_S_2tp",
        "dg_default_steps",
        "dg_best_steps",
        "dg_auto_path",
        "auto_overlap_ms",
        "auto_collective_ms",
    ]
    + [f"speedup_{v}" for v in VARIANTS if v not in FLOORS]
    + [f"eff_{v}" for v in VARIANTS]
    + [f"eff_own_{v}" for v in DG]
    + [
        "dg_best_vs_symm_mem",
        "bound_vs_symm_mem",
        "tflops_per_gpu_dg_best",
        "tflops_per_gpu_floor_dg",
        "target_vs_symm_mem",
        "target_eff_own",
        "target_auto_vs_baseline",
        "max_rel_err",
        "notes",
    ]
)


def _per_gpu(rec: dict[str, Any], variant: str = "dg_best") -> float | None:
    """TF/s per GPU of a variant's time (the whole layer's flops / TP)."""
    t = tflops(rec.get("m", 0), rec.get("n", 0), rec.get("k", 0), rec.get("ms", {}).get(variant))
    return t / rec["tp"] if t else None


def _flag(x: bool | None) -> str:
    return "" if x is None else ("yes" if x else "no")


def csv_row(rec: dict[str, Any]) -> dict[str, str]:
    """One CSV row (strings) from a result record."""
    d = derived(rec)
    ms = rec.get("ms", {})
    errs = [e for e in rec.get("rel_err", {}).values() if e is not None]
    notes = dict(rec.get("unavailable", {}))
    notes.update({f"S{s}": why for s, why in rec.get("rejected_steps", {}).items()})
    auto = rec.get("auto") or {}
    tg = targets(rec)
    row = {
        "case": rec["case"],
        "model": rec["model"],
        "layer": rec["layer"],
        "tokens": str(rec["tokens"]),
        "tp": str(rec["tp"]),
        "m": str(rec.get("m", "")),
        "n": str(rec.get("n", "")),
        "k": str(rec.get("k", "")),
        "status": rec["status"],
        "reason": rec.get("reason") or "",
        "dg_best_steps": number_cell(rec.get("dg_best_steps")),
        "dg_default_steps": number_cell(rec.get("dg_default_steps")),
        "dg_auto_path": auto.get("path") or "",
        "auto_overlap_ms": number_cell(auto.get("overlap_ms")),
        "auto_collective_ms": number_cell(auto.get("collective_ms")),
        "max_rel_err": number_cell(max(errs) if errs else None, 3),
        "tflops_per_gpu_dg_best": number_cell(_per_gpu(rec), 1),
        # the local GEMM does 1/TP of the layer's flops: the same per-GPU formula
        "tflops_per_gpu_floor_dg": number_cell(_per_gpu(rec, "floor_dg"), 1),
        "ms_dg_S_tp": number_cell(ms.get(f"dg_S{rec['tp']}")),
        "suspect": " ".join(suspect(rec)),
        "ms_dg_S_2tp": number_cell(ms.get(f"dg_S{2 * rec['tp']}")),
        "target_vs_symm_mem": _flag(tg["vs_symm_mem"]),
        "target_eff_own": _flag(tg["eff_own"]),
        "target_auto_vs_baseline": _flag(tg["auto_vs_baseline"]),
        "notes": "; ".join(f"{k}: {v}" for k, v in notes.items()),
    }
    for v in VARIANTS:
        row[f"ms_{v}"] = number_cell(ms.get(v))
    for key, val in d.items():
        row[key] = number_cell(val, 3)
    return row


def to_csv(records: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for rec in records:
        w.writerow(csv_row(rec))
    return buf.getvalue()


TABLE_HEADER = (
    "case",
    "floor ms",
    "own floor",
    "NCCL+mm ms",
    "symm_mem ms",
    "dg S=def ms",
    "dg best ms (S)",
    "dg auto ms (path)",
    "symm/base",
    "dg/base",
    "dg/symm",
    "auto/base",
    "eff own",
    "err",
)


def table_row(rec: dict[str, Any]) -> list[str]:
    """The stdout table's cells for one measured record ('-' where a variant has no time)."""
    ms, d = rec["ms"], derived(rec)
    bad = suspect(rec)

    def t(v):  # a time below the case's compute floor carries a '!'
        return (f"{ms[v]:.3f}" + ("!" if v in bad else "")) if ms.get(v) else "-"

    def x(v):
        return f"{v:.2f}x" if v else "-"

    best = t("dg_best") + (f" ({rec['dg_best_steps']})" if rec.get("dg_best_steps") else "")
    path = (rec.get("auto") or {}).get("path")
    auto = t("dg_auto") + (f" ({path[:4]})" if path else "")
    errs = [e for e in rec.get("rel_err", {}).values() if e is not None]
    return [
        rec["case"],
        t("floor"),
        t("floor_dg"),
        t("baseline"),
        t("symm_mem"),
        t("dg_default"),
        best,
        auto,
        x(d["speedup_symm_mem"]),
        x(d["speedup_dg_best"]),
        x(d["dg_best_vs_symm_mem"]),
        x(d["speedup_dg_auto"]),
        f"{d['eff_own_dg_best']:.3f}" if d["eff_own_dg_best"] else "-",
        f"{max(errs):.1e}" if errs else "-",
    ]


def format_table(records: Sequence[dict[str, Any]]) -> str:
    """Aligned text table; cases that were not measured get one line with their status and
    reason. (own floor: distgemm's kernel alone on one GPU; dg/base: speedup of distgemm's best S
    over NCCL + torch.mm; auto: the public op with path="auto" and its chosen path; eff own:
    own floor / distgemm's best time; auto/base: baseline / public op; err: the worst relative
    error of any variant vs the baseline; '!': a time below the case's compute floor.)"""
    measured = [table_row(r) for r in records if r["status"] in ("ok", "wrong")]
    widths = [max([len(h)] + [len(r[i]) for r in measured]) for i, h in enumerate(TABLE_HEADER)]
    lines = [
        " | ".join(h.ljust(widths[i]) for i, h in enumerate(TABLE_HEADER)).rstrip(),
        "-+-".join("-" * w_ for w_ in widths),
    ]
    for rec in records:
        if rec["status"] in ("ok", "wrong"):
            cells = table_row(rec)
            line = " | ".join(c.ljust(widths[i]) for i, c in enumerate(cells)).rstrip()
            bad = suspect(rec)
            lines.append(
                line
                + ("  WRONG" if rec["status"] == "wrong" else "")
                + (f"  SUSPECT (below floor: {', '.join(bad)})" if bad else "")
            )
        else:
            lines.append(f"{rec['case'].ljust(widths[0])} | {rec['status']}: {rec.get('reason')}")
    return "\n".join(lines)


def target_summary(records: Sequence[dict[str, Any]]) -> str:
    """One line per acceptance target: how many measured cases it applies to and meets, and
    the cases that miss it."""
    lines = []
    big = f"{'/'.join(TARGET_MODELS)}, M >= {TARGET_MIN_TOKENS}"
    effs = ", ".join(f"{v} at TP={tp}" for tp, v in TARGET_EFF_OWN.items())
    names = {
        "vs_symm_mem": f"dg best >= {TARGET_VS_SYMM}x torch symm_mem ({big})",
        "eff_own": f"dg best >= {effs} of its own kernel floor ({big})",
        "auto_vs_baseline": f"public op (auto) <= {TARGET_AUTO_SLACK}x NCCL + torch.mm "
        "(every case)",
    }
    ok = [r for r in records if r["status"] == "ok"]
    for key, text in names.items():
        verdicts = [(r["case"], targets(r)[key]) for r in ok]
        applies = [(c, v) for c, v in verdicts if v is not None]
        miss = [c for c, v in applies if not v]
        lines.append(
            f"target {text}: {len(applies) - len(miss)}/{len(applies)} met"
            + (f"; missed: {', '.join(miss)}" if miss else "")
        )
        if key == "vs_symm_mem" and applies:
            out_of_reach = [
                r["case"]
                for r in ok
                if targets(r)[key] is not None
                and (derived(r)["bound_vs_symm_mem"] or 0.0) < TARGET_VS_SYMM
            ]
            lines.append(
                f"  of these, {len(out_of_reach)} cannot reach it with any overlap: "
                f"symm_mem / min(compute floors) < {TARGET_VS_SYMM}"
            )
    return "\n".join(lines)


def output_stem(quick: bool, date: str | None = None) -> str:
    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return f"{date}-llama-sweep" + ("-quick" if quick else "")


def plot(records: Sequence[dict[str, Any]], path: str) -> str | None:
    """Speedup over the plain baseline and overlap efficiency per case, PNG. Returns None when
    written, else the reason it was not (matplotlib missing, nothing measured)."""
    plt, why = load_pyplot()
    if plt is None:
        return why
    ok = [r for r in records if r["status"] == "ok"]
    if not ok:
        return "no measured case"
    names = [r["case"].rsplit("/TP", 1)[0] for r in ok]
    colors = {
        "baseline": "tab:gray",
        "symm_mem": "tab:blue",
        "dg_default": "tab:orange",
        "dg_best": "tab:green",
        "dg_auto": "tab:red",
    }
    series = (
        ("symm_mem", "torch symm_mem"),
        ("dg_best", "distgemm best S"),
        ("dg_auto", "distgemm public op (auto path)"),
    )
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.35 * len(ok) + 3), 8), sharex=True)
    xs = list(range(len(ok)))
    wbar = 0.8 / len(series)
    for j, (v, label) in enumerate(series):
        ys = [derived(r)[f"speedup_{v}"] or 0.0 for r in ok]  # 0: variant not measured
        bars = axes[0].bar([x + (j - 1) * wbar for x in xs], ys, wbar, label=label, color=colors[v])
        for bar, r in zip(bars, ok):  # below its compute floor: a measurement error, marked
            if v in suspect(r):
                bar.set(hatch="xx", edgecolor="k")
                axes[0].annotate(
                    "suspect", (bar.get_x(), bar.get_height()), fontsize=6, rotation=90, va="bottom"
                )
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].axhline(1.0 / TARGET_AUTO_SLACK, color="k", lw=0.6, ls=":")
    axes[0].set_ylabel("speedup over NCCL + torch.mm")
    axes[0].legend(fontsize=8)
    effs = (
        ("baseline", "eff", "NCCL + torch.mm / torch.mm floor"),
        ("symm_mem", "eff", "torch symm_mem / torch.mm floor"),
        ("dg_best", "eff_own", "distgemm best S / own kernel floor"),
    )
    wbar = 0.8 / len(effs)
    for j, (v, kind, label) in enumerate(effs):
        ys = [derived(r)[f"{kind}_{v}"] or 0.0 for r in ok]
        axes[1].bar([x + (j - 1) * wbar for x in xs], ys, wbar, label=label, color=colors[v])
    axes[1].axhline(1.0, color="k", lw=0.8)
    goals = {TARGET_EFF_OWN.get(r.get("tp")) for r in ok} - {None}
    for goal in goals:
        axes[1].axhline(goal, color="k", lw=0.6, ls=":")
    axes[1].set_ylabel("overlap efficiency\n(compute floor / time)")
    axes[1].set_ylim(0.0, 1.15)
    axes[1].legend(fontsize=8)
    axes[1].set_xticks(xs)
    axes[1].set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    tp = ok[0]["tp"]
    fig.suptitle(f"Llama-3 TP layers, TP={tp}, bf16 (median of CUDA-event timings, max over ranks)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_json(path: str, meta: dict[str, Any], records: Sequence[dict[str, Any]]) -> None:
    """The sweep's JSON: meta, and every record with its derived numbers and target verdicts."""
    doc = dict(
        meta=meta, records=[dict(r, derived=derived(r), targets=targets(r)) for r in records]
    )
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def write_outputs(
    records: Sequence[dict[str, Any]], stem: str, meta: dict[str, Any], final: bool
) -> None:
    """CSV and JSON (every time: a cut-short sweep keeps what it measured); at the end also the
    table, the notes, the acceptance summary and the PNG."""
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    with open(stem + ".csv", "w") as f:
        f.write(to_csv(records))
    write_json(stem + ".json", dict(meta, complete=final), records)
    if final:
        report(records, stem, statuses=True)
        print(f"wrote {stem}.csv, {stem}.json in {meta['seconds']} s", flush=True)


def report(records: Sequence[dict[str, Any]], stem: str, statuses: bool) -> str | None:
    """The stdout table (with a line per case that was not measured and per unavailable
    variant when ``statuses``), the acceptance summary and ``stem``.png. Returns why the PNG was
    not drawn, or None."""
    print(format_table(records), flush=True)
    for r in records if statuses else ():
        if r["status"] != "ok":
            print(f"{r['status'].upper()} {r['case']}: {r['reason']}", flush=True)
        for k_, v in r.get("unavailable", {}).items():
            print(f"NOTE {r['case']} {k_}: {v}", flush=True)
    print(target_summary(records), flush=True)
    try:
        why = plot(records, stem + ".png")
    except Exception as e:  # noqa: BLE001 - never lose the numbers or hang rank 1 over a plot
        why = f"plot failed: {type(e).__name__}: {e}"
    print(f"plot: {'skipped: ' + why if why else stem + '.png'}", flush=True)
    return why


def replot(paths: Sequence[str], out_dir: str, stem: str | None = None) -> int:
    """Table, acceptance summary, CSV, JSON and PNG from one or more sweep JSONs (the records of
    runs split over several calls, in the order given), without a GPU; derived numbers are
    recomputed from the stored times."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    records = [r for run in runs for r in run["records"]]
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, stem or os.path.basename(paths[0])[: -len(".json")])
    meta = runs[0]["meta"] if len(runs) == 1 else dict(parts=[run["meta"] for run in runs])
    if len(runs) > 1 or not os.path.exists(stem + ".json"):
        write_json(stem + ".json", meta, records)
    with open(stem + ".csv", "w") as f:
        f.write(to_csv(records))
    return 0 if report(records, stem, statuses=False) is None else 1
