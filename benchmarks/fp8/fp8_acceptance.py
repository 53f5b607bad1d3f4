"""Issue 44's fp8 acceptance from the stored parts of an fp8_kernel_vs_scaled_mm run (one part per
GPU, each a --skip/--limit slice of one shape list): the parts merged into one JSON/CSV/MD, the
verdict (the kernel issue's: every shape within ACCEPT_RATIO of torch._scaled_mm, the median at
most ACCEPT_MEDIAN; benchmarks/kernel/report.py) over the local GEMMs, the same numbers for the
shapes only of plan steps where the run had them (--with-steps: not in the verdict, a table's
generalization), and a plot. No GPU.

    python3 -m benchmarks.fp8.fp8_acceptance PART.json [PART.json ...] --out DIR --stem NAME
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys

from benchmarks.common.report import draw, load_pyplot, save_figure
from benchmarks.fp8.fp8_kernel_vs_scaled_mm import write
from benchmarks.kernel.report import ACCEPT_MEDIAN, ACCEPT_RATIO
from distgemm import cli


def load(paths: list[str]) -> tuple[dict, list[dict]]:
    """(the first part's meta with the number of parts and their arguments, every record)."""
    docs = [json.loads(pathlib.Path(p).read_text()) for p in paths]
    meta = dict(docs[0]["meta"], parts=len(docs), part_args=[d["meta"]["args"] for d in docs])
    return meta, [r for d in docs for r in d["records"]]


def ratios(records: list[dict], ours: str = "ours_fp8", base: str = "scaled_mm") -> list[float]:
    """ours / base per record that passed its checks (status "ok": error bound, compute floor)
    and timed both (> 1: ours slower)."""
    return [
        r["ms"][ours] / r["ms"][base]
        for r in records
        if r["status"] == "ok" and r["ms"].get(ours) and r["ms"].get(base)
    ]


def summary(records: list[dict]) -> tuple[bool, str]:
    """(whether every record timed within ACCEPT_RATIO at a median of at most ACCEPT_MEDIAN, a
    line that says so)."""
    q = ratios(records)
    missing = len(records) - len(q)
    if not q:
        return False, f"no shape timed ({len(records)} records)"
    over = sum(x > ACCEPT_RATIO for x in q)
    med = statistics.median(q)
    ok = not missing and not over and med <= ACCEPT_MEDIAN
    text = (
        f"{len(q)} of {len(records)} shapes timed; ours / scaled_mm median {med:.4f}, worst "
        f"{max(q):.4f}; {over} above {ACCEPT_RATIO}"
    )
    return ok, text


def verdict(records: list[dict]) -> tuple[bool, str]:
    """(whether the acceptance holds on the local GEMMs, a summary line; a line for the shapes
    only of plan steps follows where there are any)."""
    local = [r for r in records if r.get("local", True)]
    ok, text = summary(local)
    text += f": {'PASS' if ok else 'FAIL'}"
    steps = [r for r in records if not r.get("local", True)]
    if steps:
        text += "\nshapes only of plan steps (not in the verdict): " + summary(steps)[1]
    return ok, text


def plot(records: list[dict], meta: dict, path: str) -> str | None:
    plt, why = load_pyplot()
    if plt is None:
        return why
    timed = [r for r in records if ratios([r])]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for tp, marker in ((2, "o"), (4, "s"), (8, "^")):
        for local in (True, False):
            pts = [r for r in timed
                   if r["sources"][0]["tp"] == tp and r.get("local", True) == local]  # fmt: skip
            if not pts:
                continue
            ax.scatter(
                [2 * r["m"] * r["n"] * r["k"] / 1e12 for r in pts],
                [r["ms"]["ours_fp8"] / r["ms"]["scaled_mm"] for r in pts],
                marker=marker, s=18, facecolors=None if local else "none",
                edgecolors=None if local else "gray",
                label=f"TP={tp} " + ("local GEMM" if local else "step only"),
            )  # fmt: skip
    ax.axhline(ACCEPT_RATIO, color="red", lw=0.8, ls="--", label=f"limit {ACCEPT_RATIO}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("TFLOP per GEMM")
    ax.set_ylabel("ours fp8 / torch._scaled_mm (ms; > 1: ours slower)")
    ax.legend(fontsize=8)
    save_figure(plt, fig, meta.get("title", "fp8 acceptance"), meta, path)
    return None


def main(argv=None) -> int:
    ap = cli.ArgumentParser("python3 -m benchmarks.fp8.fp8_acceptance", __doc__)
    ap.add_argument("parts", nargs="+", metavar="PART.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--stem", required=True)
    args = ap.parse_args(argv)
    meta, records = load(args.parts)
    ok, text = verdict(records)
    meta["acceptance"] = text
    stem = f"{args.out}/{args.stem}"
    write(records, stem, meta)
    draw(plot, records, meta, path=stem + ".png")
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
