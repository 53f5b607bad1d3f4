"""Kernel-vs-cuBLAS reporting: per-shape ratios, the kernel configuration the model chose against
the fastest one, times below the compute floor, the acceptance line, the table, CSV, JSON and
plot, and --replot of stored runs. Pure (no torch, no GPU): records in, text and files out;
benchmarks/kernel/kernel_vs_cublas.py is the GPU part.

A record is one shape: {"m", "n", "k", "local", "sources": [{model, layer, tokens, tp,
steps}], "status": "ok" | "failed", "reason", "model_config": the configuration gemm() ran with
config 'auto' on the device, "configs": [the configurations timed], "ms": {"torch", one per
configuration}, "torch_windows": [ms, ms] (A B A: torch.mm timed before and after the kernel),
"err": {one per configuration}}. Runs stored before configurations existed ("model_tile" 128 or
256, "ms" keys "n128"/"n256") are read through ``normalize``."""

from __future__ import annotations

import csv
import datetime
import io
import json
import os
import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.common.report import load_pyplot, number_cell
from benchmarks.common.timing import PEAK_TFLOPS as PEAK_TFLOPS_BY_DTYPE
from distgemm import _core

# Every bf16 configuration of the kernel, the default first (the CSV has a column for each).
CONFIGS = tuple(_core.gemm_config_names("bf16", stream_k=True))
# cuBLASLt's algorithms, timed as variants "cublaslt:<rank>" (kernel_vs_cublas --cublas-algos):
# at most this many ranks (columns of the CSV and the table).
MAX_CUBLAS_ALGOS = 4
CUBLAS_VARIANTS = tuple(f"cublaslt:{i}" for i in range(MAX_CUBLAS_ALGOS))
# Every variant with a column: the configurations, then cuBLASLt's ranks.
VARIANTS = CONFIGS + CUBLAS_VARIANTS
# The names of the two tile widths of runs stored before configurations existed.
LEGACY_TILES = {"n256": "128x256", "n128": "128x128", 256: "128x256", 128: "128x128"}
# The kernel issue's acceptance: distgemm's chosen kernel at most ACCEPT_RATIO x torch.mm's time
# on every local GEMM shape of the sweep, and at most ACCEPT_MEDIAN x at the median.
ACCEPT_RATIO = 1.02
ACCEPT_MEDIAN = 1.00
# A time under 2mnk / PEAK_TFLOPS (the dense bf16 peak) is a measurement bug (flagged, and it
# fails the acceptance).
PEAK_TFLOPS = PEAK_TFLOPS_BY_DTYPE["bf16"]
ERR_TOL = 1e-2  # relative Frobenius error of each tile against torch.mm, checked before timing


def floor_ms(m: int, n: int, k: int, peak_tflops: float = PEAK_TFLOPS) -> float:
    """The compute floor: 2mnk flops at the dense bf16 peak, in ms."""
    return 2.0 * m * n * k / (peak_tflops * 1e12) * 1e3


def cublas_name(rank: int) -> str:
    """The variant name of cuBLASLt's algorithm of rank ``rank``."""
    return f"cublaslt:{rank}"


def cublas_rank(variant: str) -> int | None:
    """The rank of a cuBLASLt variant ("cublaslt:2" -> 2); None for a configuration."""
    head, _, rank = variant.partition(":")
    return int(rank) if head == "cublaslt" and rank.isdigit() else None


def normalize(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` in the configuration format: a record with "model_tile" and "n128"/"n256" times
    gets "model_config", "configs" and times under the configuration names."""
    if "model_config" in rec or "model_tile" not in rec:
        return rec
    out = {k: v for k, v in rec.items() if k != "model_tile"}
    out["model_config"] = LEGACY_TILES.get(rec["model_tile"])
    out["ms"] = {LEGACY_TILES.get(k, k): v for k, v in rec.get("ms", {}).items()}
    out["err"] = {LEGACY_TILES.get(k, k): v for k, v in rec.get("err", {}).items()}
    out["configs"] = [LEGACY_TILES[t] for t in ("n256", "n128")]
    return out


def configs_of(rec: dict[str, Any]) -> list[str]:
    """The configurations a record times (every configuration for a record without the list)."""
    return list(rec.get("configs") or CONFIGS)


def below_floor(rec: dict[str, Any]) -> list[str]:
    """The timings of ``rec`` (torch, each configuration, each torch window) under the compute
    floor."""
    bound = floor_ms(rec["m"], rec["n"], rec["k"])
    ms = rec.get("ms", {})
    out = [v for v in ("torch", *configs_of(rec)) if ms.get(v) and ms[v] < bound]
    out += [f"torch_window{i}" for i, t in enumerate(rec.get("torch_windows") or []) if t < bound]
    return out


def derived(rec: dict[str, Any]) -> dict[str, Any]:
    """ours_ms (the model's configuration), the fastest configuration, ratios to torch.mm, the
    model's loss against the fastest, the torch.mm drift between its two windows, TF/s and the
    floor flags; None where a time is missing (the fastest needs every configuration timed)."""
    ms = rec.get("ms", {})
    torch_ms = ms.get("torch")
    configs = configs_of(rec)
    timed = {c: ms[c] for c in configs if ms.get(c)}
    model = rec.get("model_config")
    ours = ms.get(model) if model else None
    fastest = min(timed, key=timed.get) if timed and len(timed) == len(configs) else None
    best = timed[fastest] if fastest else None
    win = rec.get("torch_windows") or []
    return dict(
        ours_ms=ours,
        fastest_config=fastest,
        ratio=(ours / torch_ms) if (ours and torch_ms) else None,
        ratio_fastest=(best / torch_ms) if (best and torch_ms) else None,
        model_loss=(ours / best - 1.0) if (ours and best) else None,
        model_right=(model == fastest) if (model and fastest) else None,
        torch_drift=(abs(win[0] - win[1]) / (0.5 * (win[0] + win[1]))) if len(win) == 2 else None,
        tflops_torch=_tflops(rec, torch_ms),
        tflops_ours=_tflops(rec, ours),
        floor_ms=floor_ms(rec["m"], rec["n"], rec["k"]),
        below_floor=below_floor(rec),
    )


def _tflops(rec: dict[str, Any], ms: float | None) -> float | None:
    return 2.0 * rec["m"] * rec["n"] * rec["k"] / (ms * 1e-3) / 1e12 if ms else None


def accepted(rec: dict[str, Any]) -> bool | None:
    """The acceptance verdict of one shape: None for a shape that is not a local GEMM, False
    where it was not measured, a time is under the floor or the ratio exceeds ACCEPT_RATIO."""
    if not rec.get("local"):
        return None
    d = derived(rec)
    if rec.get("status") != "ok" or d["ratio"] is None or d["below_floor"]:
        return False
    return d["ratio"] <= ACCEPT_RATIO


def source_names(rec: dict[str, Any]) -> list[str]:
    """'70B/O/M4096/TP2' for a local GEMM, '.../S4' for a step of an S=4 plan."""
    out = []
    for s in rec.get("sources", []):
        name = f"{s['model']}/{s['layer']}/M{s['tokens']}/TP{s['tp']}"
        out.append(name if s.get("steps") is None else f"{name}/S{s['steps']}")
    return out


def flags(rec: dict[str, Any]) -> str:
    """What is wrong with a record, for the table and the CSV: '' when nothing."""
    if rec.get("status") != "ok":
        return f"{rec.get('status', 'missing').upper()}: {rec.get('reason') or ''}".strip()
    bad = derived(rec)["below_floor"]
    return f"BELOW FLOOR (measurement bug): {', '.join(bad)}" if bad else ""


CSV_FIELDS = (
    "m", "n", "k", "local", "status", "torch_ms", "ours_ms",
    *(f"ms_{c}" for c in VARIANTS),
    "ratio", "ratio_fastest", "model_config", "fastest_config", "model_loss", "torch_drift",
    "tflops_torch", "tflops_ours", "floor_ms",
    *(f"err_{c}" for c in VARIANTS),
    "accepted", "flags", "sources",
)  # fmt: skip


def csv_row(rec: dict[str, Any]) -> dict[str, str]:
    d = derived(rec)
    ms, err = rec.get("ms", {}), rec.get("err", {})
    ok = accepted(rec)
    return dict(
        m=str(rec["m"]),
        n=str(rec["n"]),
        k=str(rec["k"]),
        local="yes" if rec.get("local") else "no",
        status=rec.get("status", ""),
        torch_ms=number_cell(ms.get("torch")),
        ours_ms=number_cell(d["ours_ms"]),
        **{f"ms_{c}": number_cell(ms.get(c)) for c in VARIANTS},
        ratio=number_cell(d["ratio"]),
        ratio_fastest=number_cell(d["ratio_fastest"]),
        model_config=str(rec.get("model_config") or ""),
        fastest_config=str(d["fastest_config"] or ""),
        model_loss=number_cell(d["model_loss"]),
        torch_drift=number_cell(d["torch_drift"]),
        tflops_torch=number_cell(d["tflops_torch"], 1),
        tflops_ours=number_cell(d["tflops_ours"], 1),
        floor_ms=number_cell(d["floor_ms"]),
        **{f"err_{c}": number_cell(err.get(c), 6) for c in VARIANTS},
        accepted="" if ok is None else ("yes" if ok else "no"),
        flags=flags(rec),
        sources=";".join(source_names(rec)),
    )


def to_csv(records: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(csv_row(r) for r in records)
    return buf.getvalue()


def fmt_ms(x: float | None) -> str:
    return f"{x:.4f}" if x else "-"


def fmt_ratio(x: float | None) -> str:
    return f"{x:.3f}" if x else "-"


def format_table(records: Sequence[dict[str, Any]]) -> str:
    """One line per shape: extents, torch.mm and our times (the model's configuration, then
    each configuration), ratios, model and fastest configuration, acceptance mark (local
    shapes), flags and where the shape comes from."""
    head = (
        f"{'m':>6} {'n':>6} {'k':>6} {'local':>5} {'torch ms':>9} {'ours ms':>9} "
        + "".join(f"{c:>10} " for c in VARIANTS)
        + f"{'ours/t':>7} {'best/t':>7} {'model':>9} {'best':>9} {'acc':>4}  source"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        d, ms = derived(r), r.get("ms", {})
        ok = accepted(r)
        names = source_names(r)
        src = names[0] + (f" (+{len(names) - 1})" if len(names) > 1 else "") if names else ""
        line = (
            f"{r['m']:>6} {r['n']:>6} {r['k']:>6} {'yes' if r.get('local') else 'no':>5} "
            f"{fmt_ms(ms.get('torch')):>9} {fmt_ms(d['ours_ms']):>9} "
            + "".join(f"{fmt_ms(ms.get(c)):>10} " for c in VARIANTS)
            + f"{fmt_ratio(d['ratio']):>7} {fmt_ratio(d['ratio_fastest']):>7} "
            f"{r.get('model_config') or '-':>9} {d['fastest_config'] or '-':>9} "
            f"{'' if ok is None else ('ok' if ok else 'FAIL'):>4}  {src}"
        )
        why = flags(r)
        lines.append(line + (f"  [{why}]" if why else ""))
    return "\n".join(lines)


def summary(records: Sequence[dict[str, Any]]) -> str:
    """The acceptance line (ours <= ACCEPT_RATIO x torch.mm on every local GEMM shape and
    <= ACCEPT_MEDIAN x at the median of the local shapes), the worst local shapes, the model's
    record against the fastest configuration (and how often each configuration was fastest),
    and the flags."""
    local = [r for r in records if r.get("local")]
    verdicts = [accepted(r) for r in local]
    passed = sum(1 for v in verdicts if v)
    unmeasured = [r for r in local if r.get("status") != "ok"]
    flagged = [r for r in records if r.get("status") == "ok" and derived(r)["below_floor"]]
    ratios = [d["ratio"] for d in map(derived, local) if d["ratio"] is not None]
    median = statistics.median(ratios) if ratios else None
    ok_median = median is not None and median <= ACCEPT_MEDIAN
    verdict = "PASS" if local and passed == len(local) and ok_median else "FAIL"
    lines = [
        f"acceptance (ours <= {ACCEPT_RATIO}x torch.mm on every local GEMM shape, <= "
        f"{ACCEPT_MEDIAN}x at the median): {verdict}: {passed} of {len(local)} local shapes pass"
        + (f"; median {median:.3f}x" if median is not None else "")
        + (f", {len(unmeasured)} not measured" if unmeasured else "")
        + (f", {len(flagged)} with a time below the compute floor" if flagged else "")
    ]
    ranked = sorted((r for r in local if derived(r)["ratio"]), key=lambda r: -derived(r)["ratio"])
    for r in ranked[:5]:
        d = derived(r)
        lines.append(
            f"  ours/torch {d['ratio']:.3f} (fastest config {d['ratio_fastest']:.3f}) at "
            f"m={r['m']} n={r['n']} k={r['k']}: {source_names(r)[0]}"
        )
    judged = [derived(r) for r in records if derived(r)["model_right"] is not None]
    wrong = [d for d in judged if not d["model_right"]]
    if judged:
        worst = max((d["model_loss"] for d in wrong), default=0.0)
        lines.append(
            f"model picked the fastest config on {len(judged) - len(wrong)} of {len(judged)} "
            f"shapes; where not, the fastest is up to {worst * 100:.1f}% faster"
        )
        wins: dict[str, int] = {}
        for d in judged:
            wins[d["fastest_config"]] = wins.get(d["fastest_config"], 0) + 1
        lines.append(
            "fastest config: "
            + ", ".join(f"{c} on {wins[c]}" for c in sorted(wins, key=lambda c: -wins[c]))
        )
    for r in flagged:
        bad = ", ".join(derived(r)["below_floor"])
        lines.append(
            f"MEASUREMENT BUG m={r['m']} n={r['n']} k={r['k']}: {bad}"
            f" below the {PEAK_TFLOPS:g} TF/s floor {floor_ms(r['m'], r['n'], r['k']):.4f} ms"
        )
    return "\n".join(lines)


def output_stem(label: str = "", date: str | None = None) -> str:
    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return f"{date}-kernel-vs-cublas" + (f"-{label}" if label else "")


def _span(values: Sequence[float]) -> tuple[float, float]:
    """y limits around ratios near 1, always showing 1."""
    lo, hi = min(min(values), 1.0), max(max(values), 1.0)
    pad = 0.1 * (hi - lo) + 0.01
    return lo - pad, hi + pad


def plot(records: Sequence[dict[str, Any]], path: str, title: str = "") -> str | None:
    """Top: ours/torch.mm per shape (the model's configuration, and the fastest one), the
    acceptance line; bottom: each configuration's time / torch.mm's, the model's choice marked.
    PNG; returns None when written, else why not (matplotlib missing, nothing measured)."""
    plt, why = load_pyplot()
    if plt is None:
        return why
    ok = [r for r in records if r.get("status") == "ok" and derived(r)["ratio"]]
    if not ok:
        return "no measured shape"
    xs = list(range(len(ok)))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.18 * len(ok) + 3), 8), sharex=True)
    ds = [derived(r) for r in ok]
    colors = ["tab:blue" if r.get("local") else "tab:gray" for r in ok]
    from matplotlib.patches import Patch

    bars = axes[0].bar(xs, [d["ratio"] for d in ds], 0.8, color=colors)
    for bar, d in zip(bars, ds):
        if d["below_floor"]:  # a measurement bug, not a result
            bar.set(hatch="xx", edgecolor="k")
    (fastest,) = axes[0].plot(xs, [d["ratio_fastest"] for d in ds], "k_", ms=8)
    axes[0].axhline(1.0, color="k", lw=0.8)
    accept = axes[0].axhline(ACCEPT_RATIO, color="tab:red", lw=0.8, ls=":")
    handles = [
        Patch(color="tab:blue", label="local GEMM (model's config)"),
        Patch(color="tab:gray", label="step only (model's config)"),
        fastest,
        accept,
    ]
    labels = [h.get_label() for h in handles[:2]] + ["fastest config", f"{ACCEPT_RATIO}x"]
    axes[0].legend(handles, labels, fontsize=8)
    axes[0].set_ylabel("distgemm kernel / torch.mm (time)")
    axes[0].set_ylim(*_span([d["ratio"] for d in ds] + [d["ratio_fastest"] for d in ds]))
    markers = "osD^v<>"
    rel_all: list[float] = []
    for ci, c in enumerate(CONFIGS):
        pts = [(x, r["ms"][c] / r["ms"]["torch"]) for x, r in zip(xs, ok) if r["ms"].get(c)]
        if not pts:
            continue
        rel_all += [y for _, y in pts]
        axes[1].plot(*zip(*pts), markers[ci % len(markers)], ms=4, ls="", label=c)
    chosen = [(x, d["ratio"]) for x, d in zip(xs, ds)]
    axes[1].plot(*zip(*chosen), "k+", ms=9, ls="", label="model's choice")
    axes[1].legend(fontsize=7, ncol=len(CONFIGS) + 1)
    axes[1].axhline(1.0, color="k", lw=0.8)
    axes[1].set_ylim(*_span(rel_all or [1.0]))
    axes[1].set_ylabel("config time / torch.mm\n(< 1: faster than torch.mm)")
    axes[1].set_xticks(xs)
    axes[1].set_xticklabels(
        [f"{r['m']}x{r['n']}x{r['k']}" for r in ok], rotation=90, fontsize=6, family="monospace"
    )
    fig.suptitle(title or "distgemm GEMM kernel vs torch.mm, one GPU, bf16, steady state")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_outputs(
    records: Sequence[dict[str, Any]], stem: str, meta: dict[str, Any], final: bool
) -> str | None:
    """CSV and JSON every time (a cut-short run keeps what it measured); at the end also the
    table and summary (stdout and ``stem``.txt) and the PNG. Returns why the PNG was not drawn,
    or None."""
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    with open(stem + ".csv", "w") as f:
        f.write(to_csv(records))
    checked = [dict(r, derived=derived(r), accepted=accepted(r)) for r in records]
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta=dict(meta, complete=final), records=checked), f, indent=1)
    if not final:
        return None
    text = format_table(records) + "\n" + summary(records)
    with open(stem + ".txt", "w") as f:
        f.write(text + "\n")
    print(text, flush=True)
    try:
        why = plot(records, stem + ".png", meta.get("title", ""))
    except Exception as e:  # noqa: BLE001 - never lose the numbers over a plot
        why = f"plot failed: {type(e).__name__}: {e}"
    print(f"plot: {'skipped: ' + why if why else stem + '.png'}", flush=True)
    print(f"wrote {stem}.csv, {stem}.json, {stem}.txt", flush=True)
    return why


def stored_runs(paths: Sequence[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The runs stored in ``paths`` and their records in order, in the configuration format and
    without their derived numbers (recomputed by whoever reads them)."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    keep = ("derived", "accepted")
    records = [
        normalize({k: v for k, v in r.items() if k not in keep})
        for run in runs
        for r in run["records"]
    ]
    return runs, records


def replot(paths: Sequence[str], out_dir: str, stem: str | None = None) -> int:
    """Table, summary, CSV, JSON and PNG from one or more stored runs (parts of one list run in
    several calls, merged in the order given), without a GPU; derived numbers are recomputed."""
    runs, records = stored_runs(paths)
    meta = runs[0]["meta"] if len(runs) == 1 else dict(parts=[run["meta"] for run in runs])
    stem = os.path.join(out_dir, stem or os.path.basename(paths[0])[: -len(".json")])
    return 0 if write_outputs(records, stem, dict(meta), final=True) is None else 1
