"""Times the GEMM kernel's two output tiles (128x256, 128x128) on one GPU, shape by shape, beside
the wave model that picks between them (kernel/tile_choice.hpp, _core.choose_tile_n).

    python3 -m benchmarks.kernel.compare_tiles --bench build-gpu/distgemm_bench --csv tiles.csv

Each run is distgemm_bench on a TP=1, S=1 plan (one GEMM, the "own kernel floor" of the sweeps)
with --tile-n 256 or 128, in interleaved rounds (256, 128, 128, 256, ...) so that clock drift
under the power cap hits both alike; the median over rounds is reported. The default shapes are
per-GPU GEMMs and sub-GEMM steps of the Llama sweep at TP=2 where the choice matters, and large
ones where both tiles run at full occupancy (the model's relative tile cost is fitted there);
their (M, N, K) come from distgemm._core's Llama tables (benchmarks/common/llama_cases.py)."""

import csv
import statistics
import subprocess
import sys
from collections.abc import Sequence

from benchmarks.common.llama_cases import SCHEDULE, Case, shapes
from distgemm import cli
from distgemm.simulate import H200_RESIDENT_CTAS

# (model, layer, tokens, TP, S): S=None for a rank's whole GEMM (the sweep's floor), else one
# step of an S-step plan (1/S of its rows).
TILE_CASES: list[tuple[str, str, int, int, int | None]] = [
    ("70B", "O", 8192, 1, None),  # full occupancy
    ("70B", "FC1", 4096, 2, None),  # full occupancy
    ("8B", "O", 1024, 2, 2),
    ("8B", "FC2", 1024, 2, 2),
    ("8B", "QKV", 1024, 2, 2),
    ("8B", "QKV", 1024, 2, None),
    ("70B", "QKV", 1024, 2, None),
    ("70B", "QKV", 4096, 2, 2),
    ("70B", "O", 2048, 2, 2),
    ("70B", "FC1", 1024, 2, 2),
    ("405B", "QKV", 2048, 2, 2),
    ("8B", "O", 4096, 1, None),
]


def tile_shape(model: str, layer: str, tokens: int, tp: int, steps: int | None):
    """(m, n, k, what) of one GEMM that a rank runs: its whole per-rank GEMM, or one step of the
    layer's schedule (both schedules of the sweep split the rows of the output into S steps)."""
    m, n, k = shapes(Case(model, layer, tokens, tp))["floor"]
    what = f"{model} {layer} {'step' if steps else 'floor'}, {tokens} tokens, TP={tp}"
    if steps:
        return m // steps, n, k, what + f" S={steps}"
    return m, n, k, what


# (m, n, k, what): per-GPU GEMM shapes.
SHAPES: list[tuple[int, int, int, str]] = [tile_shape(*c) for c in TILE_CASES]


def bench_args(bench: str, m: int, n: int, k: int, tile: int) -> list[str]:
    return [
        bench,
        "--schedule",
        SCHEDULE["all_gather"],  # at TP=1, S=1 every schedule is the one GEMM
        "--tp",
        "1",
        "--steps",
        "1",
        "--m",
        str(m),
        "--n",
        str(n),
        "--k",
        str(k),
        "--tile-n",
        str(tile),
        "--verify-rows",
        "64",
        "--no-local",
        "--warmup-ms",
        "300",
        "--iterations",
        "auto",
    ]


def parse_result(stdout: str) -> dict[str, str]:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(tok.split("=", 1) for tok in line.split()[1:])
    return {}


def run_one(bench: str, m: int, n: int, k: int, tile: int) -> tuple[float | None, str]:
    """(ms, '') for a verified run, else (None, why)."""
    p = subprocess.run(
        bench_args(bench, m, n, k, tile), capture_output=True, text=True, timeout=120
    )
    res = parse_result(p.stdout)
    if p.returncode != 0 or res.get("verify") != "PASS":
        return None, f"rc={p.returncode} verify={res.get('verify')} {p.stderr.strip()[-300:]}"
    return float(res["ms"]), ""


def summarise(
    times: dict[tuple[int, int, int, int], list[float]], shapes: Sequence, choose, slots: int
) -> list[dict[str, object]]:
    """One row per shape: median ms per tile, the measured ratio 128/256, the model's choice and
    whether it picked the faster tile; the relative cost of one 128x128 tile implied by the
    timings (ratio x waves256 / waves128)."""
    rows = []
    for m, n, k, what in shapes:
        t256, t128 = times.get((m, n, k, 256)), times.get((m, n, k, 128))
        if not t256 or not t128:
            continue
        ms256, ms128 = statistics.median(t256), statistics.median(t128)
        model = choose(m, n, 1, slots, slots)
        ratio = ms128 / ms256
        rows.append(
            dict(
                m=m,
                n=n,
                k=k,
                what=what,
                ms_n256=ms256,
                ms_n128=ms128,
                ratio=ratio,
                waves_n256=model["n256"]["waves"],
                waves_n128=model["n128"]["waves"],
                implied_cost=ratio * model["n256"]["waves"] / model["n128"]["waves"],
                model_tile=model["tile_n"],
                faster_tile=128 if ms128 < ms256 else 256,
                rounds=min(len(t256), len(t128)),
            )
        )
    return rows


def main(argv=None) -> int:
    ap = cli.ArgumentParser("python3 -m benchmarks.kernel.compare_tiles", __doc__)
    ap.add_argument("--bench", default="build-gpu/distgemm_bench")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--slots",
        type=int,
        default=H200_RESIDENT_CTAS,
        help=f"resident CTAs for the model (H200: {H200_RESIDENT_CTAS})",
    )
    ap.add_argument("--csv", default=None)
    args = ap.parse_args(argv)
    from distgemm import _core

    times: dict[tuple[int, int, int, int], list[float]] = {}
    failed = []
    for r in range(args.rounds):
        for m, n, k, _what in SHAPES:
            for tile in (256, 128) if r % 2 == 0 else (128, 256):
                ms, why = run_one(args.bench, m, n, k, tile)
                if ms is None:
                    failed.append(f"{m}x{n}x{k} tile {tile}: {why}")
                    continue
                times.setdefault((m, n, k, tile), []).append(ms)
    rows = summarise(times, SHAPES, _core.choose_tile_n, args.slots)
    print(
        f"{'m x n x k':>20} {'ms 128x256':>11} {'ms 128x128':>11} {'128/256':>8} "
        f"{'waves':>7} {'cost':>6} model faster  what"
    )
    for r in rows:
        print(
            f"{r['m']:>6}x{r['n']:>6}x{r['k']:>6} {r['ms_n256']:11.4f} {r['ms_n128']:11.4f} "
            f"{r['ratio']:8.3f} {r['waves_n256']:>3}/{r['waves_n128']:<3} "
            f"{r['implied_cost']:6.3f} {r['model_tile']:>5} {r['faster_tile']:>6}  {r['what']}"
        )
    agree = sum(r["model_tile"] == r["faster_tile"] for r in rows)
    print(
        f"model picks the faster tile on {agree}/{len(rows)} shapes; relative cost in the model "
        f"{_core.TILE128_RELATIVE_COST}"
    )
    if args.csv and rows:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    for f_ in failed:
        print("FAILED", f_, file=sys.stderr)
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
