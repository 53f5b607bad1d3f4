"""Report pieces shared by the benchmarks' reports: where results go, the number format of table
and CSV cells, the run's meta (torch, device, INSTALLED_BY, timing settings), aligned text
tables, CSV text, met/MISSED verdicts, reasons grouped by token counts, the JSON, CSV and text
files of a run, matplotlib's import and the file stem. Pure (no torch, no GPU)."""

from __future__ import annotations

import csv
import datetime
import io
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from benchmarks.common.timing import REWARM_S, TIMED_S, WARMUP_S

MIB = 2**20
# benchmarks/results: where a run's files go unless --out says otherwise.
RESULTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


def number_cell(x, nd: int = 4) -> str:
    """A number as a table or CSV cell: ``nd`` decimals, or ``nd`` significant digits below
    0.01; empty for None."""
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:.{nd}g}" if abs(x) < 1e-2 else f"{x:.{nd}f}"
    return str(x)


def run_meta(torch, device, tp: int, seconds: float, **extra: Any) -> dict[str, Any]:
    """What a results file names besides its numbers: date, TP, torch, the device, CUDA,
    INSTALLED_BY (env), the steady-state timing settings, argv and the run's seconds."""
    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        tp=tp,
        torch=torch.__version__,
        device=torch.cuda.get_device_name(device) if torch.cuda.is_available() else "cpu",
        cuda=torch.version.cuda,
        installed_by=os.environ.get("INSTALLED_BY"),
        warmup_s=WARMUP_S,
        rewarm_s=REWARM_S,
        timed_s=TIMED_S,
        argv=sys.argv,
        seconds=round(seconds, 1),
        **extra,
    )


def header_lines(title: str, meta: dict[str, Any]) -> list[str]:
    """The title, then torch, the device and INSTALLED_BY on one line."""
    return [
        title,
        f"torch {meta.get('torch')} | device {meta.get('device')} | "
        f"INSTALLED_BY {meta.get('installed_by') or '(unset)'}",
    ]


def off_tolerance(errs: dict[str, float], variants: Sequence[str], tol: float) -> list[str]:
    """The variants (in ``variants`` order) whose error is ``tol`` or more; NaN counts."""
    return [v for v in variants if v in errs and not (errs[v] == errs[v] and errs[v] < tol)]


def below_floor(
    times: dict[str, float], floor: str, variants: Sequence[str], slack: float
) -> list[str]:
    """The variants timed more than ``slack`` (a fraction) below ``times[floor]``: each does
    at least the floor's work, so such a time is a measurement error, not a result."""
    if not times.get(floor):
        return []
    bound = times[floor] * (1.0 - slack)
    return [v for v in variants if v != floor and times.get(v) and times[v] < bound]


def status(rec: dict[str, Any], v: str, times: str, wrong: Sequence[str]) -> str:
    """ok, unavailable (its reason is in the record), wrong (numerics) or missing, of variant
    ``v`` in a record whose times are under the key ``times``."""
    if v in rec.get("unavailable", {}):
        return "unavailable"
    if v in wrong:
        return "wrong"
    return "ok" if rec.get(times, {}).get(v) else "missing"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "MISSED")


def text_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Aligned columns joined by ' | ', a rule under the header; empty cells shown as '-'."""
    body = [[c if c else "-" for c in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)
    ]
    lines = [" | ".join(h.ljust(widths[i]) for i, h in enumerate(header)).rstrip()]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in body]
    return lines


def csv_text(fields: Sequence[str], rows: Iterable[dict[str, str]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(fields), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def read_csv(text: str) -> list[dict[str, str]]:
    """The rows of a CSV written by ``csv_text``."""
    return list(csv.DictReader(io.StringIO(text)))


def grouped_reasons(items: Iterable[tuple[str, int, str]]) -> list[str]:
    """``(what, tokens, reason)`` triples as one line per (what, reason), its token counts
    listed in the order seen: ``what (tokens 1, 2): reason``."""
    groups: dict[tuple[str, str], list[int]] = {}
    for what, tokens, reason in items:
        groups.setdefault((what, reason), []).append(tokens)
    return [
        f"{what} (tokens {', '.join(str(t) for t in toks)}): {reason}"
        for (what, reason), toks in groups.items()
    ]


def did_not_run(records: Iterable[dict[str, Any]], label) -> list[str]:
    """'did not run:' and a line per (``label(record)`` + variant, reason), its token counts
    listed; nothing when every variant ran."""
    reasons = grouped_reasons(
        (f"{label(r)} {v}", r["tokens"], why)
        for r in records
        for v, why in r.get("unavailable", {}).items()
    )
    return ["did not run:", *(f"  {x}" for x in reasons)] if reasons else []


def load_pyplot():
    """(matplotlib.pyplot with the Agg backend, None), or (None, why it is unavailable)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001 - the numbers matter more than the picture
        return None, f"matplotlib unavailable ({type(e).__name__}: {e})"
    return plt, None


def save_figure(plt, fig, title: str, meta: dict[str, Any], path: str) -> None:
    """The figure's title (with torch, the device and INSTALLED_BY) and the PNG at ``path``."""
    fig.suptitle(
        f"{title} | torch {meta.get('torch')} | {meta.get('device')} | "
        f"INSTALLED_BY {meta.get('installed_by') or '(unset)'}",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def output_stem(name: str, tp: int, date: str | None = None) -> str:
    """``<date>-<name>-tp<N>``, the file name (without extension) of a run's outputs."""
    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return f"{date}-{name}-tp{tp}"


def write_files(stem: str, doc: dict[str, Any], csvs: dict[str, str], table: str) -> None:
    """``stem``.json (``doc``), one CSV per ``csvs`` entry (``stem`` + key + .csv) and
    ``stem``.txt (the table, also printed)."""
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    for suffix, text in csvs.items():
        with open(stem + suffix + ".csv", "w") as f:
            f.write(text)
    with open(stem + ".txt", "w") as f:
        f.write(table + "\n")
    print(table, flush=True)
    names = ", ".join(f"{stem}{s}.csv" for s in csvs)
    print(f"wrote {stem}.json, {names}, {stem}.txt", flush=True)


def draw(plot_fn, *args, path: str) -> str | None:
    """``plot_fn(*args, path)`` guarded: None when the PNG was written, else why not; prints
    which."""
    try:
        why = plot_fn(*args, path)
    except Exception as e:  # noqa: BLE001 - never lose the numbers over a plot
        why = f"plot failed: {type(e).__name__}: {e}"
    print(f"plot: {'skipped: ' + why if why else path}", flush=True)
    return why


def load_doc(path: str, out_dir: str) -> tuple[dict[str, Any], str]:
    """A stored run's JSON document and the stem its outputs get again under ``out_dir``."""
    with open(path) as f:
        doc = json.load(f)
    name = os.path.basename(path)
    return doc, os.path.join(out_dir, name[: -len(".json")] if name.endswith(".json") else name)
