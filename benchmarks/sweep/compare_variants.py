"""Summarise run_on_gpus.sh's cpp-variants part: the quick C++ sweep under every (reduce-scatter
partial transport, PDL) pair, in interleaved rounds, per TP.

    python3 -m benchmarks.sweep.compare_variants DIR [--md OUT.md]

DIR holds tp{T}-{epilogue|copy}-{pdl|no-pdl}-r{round}.csv (distgemm_bench --sweep --csv). Per
(case, S) it prints each variant's median over rounds (ms and overlap efficiency against the
kernel's local floor measured in the same run) and the spread between rounds, then per layer kind
which variant is fastest how often. All-gather plans have no partials: for them the transport
columns repeat the same plan and show run-to-run noise.
"""

from __future__ import annotations

import collections
import csv
import pathlib
import re
import statistics
import sys

from distgemm import _core, cli

NAME = re.compile(r"tp(\d+)-(epilogue|copy)-(pdl|no-pdl)-r(\d+)\.csv$")
VARIANTS = [("epilogue", "no-pdl"), ("epilogue", "pdl"), ("copy", "no-pdl"), ("copy", "pdl")]


def has_partials(schedule: str) -> bool:
    """Whether a schedule passes partial results between devices (its rotating operand is C),
    which the partial transport applies to."""
    return _core.schedule_definition(schedule)["rotating"] == "C"


def load(folder: pathlib.Path):
    """{(tp, case, steps): {(via, pdl): [(ms, eff), ...]}} and the layer of every case."""
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    layer = {}
    for f in sorted(folder.glob("tp*-*.csv")):
        m = NAME.search(f.name)
        if not m:
            continue
        tp, via, pdl = int(m.group(1)), m.group(2), m.group(3)
        with open(f, newline="") as fh:
            for row in csv.DictReader(fh):
                if row["status"] != "ok":
                    continue
                key = (tp, row["case"], int(row["steps"]))
                runs[key][(via, pdl)].append((float(row["ms"]), float(row["overlap_eff"])))
                layer[row["case"]] = (row["layer"], row["schedule"])
    return runs, layer


def summarise(folder: pathlib.Path) -> str:
    runs, layer = load(folder)
    if not runs:
        raise SystemExit(f"no tp*-{{epilogue,copy}}-{{pdl,no-pdl}}-r*.csv in {folder}")
    head = (
        "| TP | case | S | "
        + " | ".join(f"{v}/{p} ms (eff)" for v, p in VARIANTS)
        + " | best | spread |"
    )
    lines = [head, "|" + " --- |" * (len(VARIANTS) + 5)]
    wins = collections.Counter()
    for tp, case, steps in sorted(runs, key=lambda k: (k[0], k[1], k[2])):
        per = runs[(tp, case, steps)]
        cells, med = [], {}
        spread = 0.0
        for v in VARIANTS:
            xs = per.get(v, [])
            if not xs:
                cells.append("-")
                continue
            ms = statistics.median(x[0] for x in xs)
            eff = statistics.median(x[1] for x in xs)
            med[v] = ms
            spread = max(spread, (max(x[0] for x in xs) - min(x[0] for x in xs)) / ms)
            cells.append(f"{ms:.3f} ({eff:.3f})")
        best = min(med, key=med.get)
        lyr, sched = layer[case]
        wins[(tp, has_partials(sched), best)] += 1
        lines.append(
            f"| {tp} | {case} | {steps} | "
            + " | ".join(cells)
            + f" | {best[0]}/{best[1]} | {spread * 100:.1f}% |"
        )
    lines.append("")
    for (tp, rs, best), n in sorted(wins.items()):
        kind = "reduce-scatter" if rs else "all-gather"
        lines.append(f"TP={tp} {kind}: fastest {best[0]}/{best[1]} in {n} (case, S) pair(s)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = cli.ArgumentParser("python3 -m benchmarks.sweep.compare_variants", __doc__)
    ap.add_argument("folder", type=pathlib.Path)
    ap.add_argument("--md", type=pathlib.Path, help="also write the table here")
    args = ap.parse_args(argv)
    text = summarise(args.folder)
    print(text)
    if args.md:
        args.md.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
