"""benchmarks/sweep/compare_variants.py: the (partial transport, PDL) summary of run_on_gpus.sh's
cpp-variants part, on synthetic CSVs and on the committed 4x H200 run."""

import csv
import pathlib

import pytest

from benchmarks.sweep import compare_variants as cv

ROOT = pathlib.Path(__file__).resolve().parents[1]

FIELDS = [
    "case",
    "model",
    "layer",
    "tokens",
    "tp",
    "schedule",
    "steps",
    "status",
    "ms",
    "overlap_eff",
]


def write(folder, name, rows):
    with open(folder / name, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow(r)


def row(ms, eff, status="ok", steps=4):
    return dict(
        case="70B/O/M8192/TP4",
        model="70B",
        layer="O",
        tokens=8192,
        tp=4,
        schedule="rs_tile_a",
        steps=steps,
        status=status,
        ms=ms,
        overlap_eff=eff,
    )


def test_medians_best_and_spread(tmp_path):
    # Two rounds per variant; copy/pdl is fastest; one failed row is ignored.
    times = {
        ("epilogue", "no-pdl"): (0.61, 0.63),
        ("epilogue", "pdl"): (0.60, 0.62),
        ("copy", "no-pdl"): (0.72, 0.72),
        ("copy", "pdl"): (0.50, 0.52),
    }
    for (via, pdl), (r1, r2) in times.items():
        write(
            tmp_path,
            f"tp4-{via}-{pdl}-r1.csv",
            [row(r1, 0.8), row(9.9, 0.1, status="fail", steps=8)],
        )
        write(tmp_path, f"tp4-{via}-{pdl}-r2.csv", [row(r2, 0.9)])
    text = cv.summarise(tmp_path)
    (line,) = [x for x in text.splitlines() if x.startswith("| 4 | 70B/O/M8192/TP4 | 4 |")]
    assert "0.510 (0.850)" in line and "0.620 (0.850)" in line  # medians of 2 rounds
    assert "| copy/pdl |" in line
    assert line.rstrip().endswith("| 3.9% |")  # (0.52 - 0.50) / 0.51
    assert "| 8 |" not in text  # the failed row left out
    assert "TP=4 reduce-scatter: fastest copy/pdl in 1 (case, S) pair(s)" in text


def test_empty_folder_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no tp"):
        cv.summarise(tmp_path)


def test_committed_run_has_every_pair():
    folder = ROOT / "benchmarks" / "results" / "2026-11-22-variants"
    text = cv.summarise(folder)
    rows = [x for x in text.splitlines() if x.startswith("| 2 |") or x.startswith("| 4 |")]
    assert len(rows) == 32  # 2 TP x 8 cases x 2 S
    assert all(x.count("(") == 4 for x in rows)  # every variant present in every row


def test_partials_are_the_schedules_that_rotate_c():
    from distgemm.plan.view import schedule_names

    names = schedule_names()
    assert {s for s in names if cv.has_partials(s)} == {"rs_tile_a", "rs_tile_b", "ar_tile_a"}
    assert not cv.has_partials("ag_rotate_a") and not cv.has_partials("ag_rotate_b")
