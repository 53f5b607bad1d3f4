"""Refit the constants of distgemm.pathmodel from a torchrun Llama sweep CSV and print them, with
the model's relative error per stage (CPU only, numpy).

    python3 benchmarks/fit_path_model.py [benchmarks/results/2026-11-23-llama-sweep.csv]

Stages, each a least-squares fit of the relative error, each using the ones before it: our
kernel alone (``ms_floor_dg``: launch and ms per K of a full wave and of a started wave, per
tile width), torch.mm alone (``ms_floor``: launch and rate), NCCL (``ms_baseline`` minus the
torch.mm model: latency, ms per byte, share of the GEMM, per collective) and the overlapped plan
beyond its GEMMs (``ms_dg_S_tp`` / ``ms_dg_S_2tp``: ms per step, share of the GEMM time, ms per
byte, per transport). Paste the printed values into python/distgemm/pathmodel.py.
"""

from __future__ import annotations

import argparse
import csv
import pathlib

import numpy as np

from distgemm import _core, pathmodel

DEFAULT_CSV = pathlib.Path(__file__).parent / "results" / "2026-11-23-llama-sweep.csv"
SCHEDULE = {"all_gather": "ag_rotate_a", "reduce_scatter": "rs_tile_a"}


def _fit(rows: list[list[float]], target: list[float], measured: list[float]):
    """Least squares of (features @ x - target) / measured; returns x and the relative errors
    of features @ x + (measured - target) against measured."""
    a, y, w = np.array(rows), np.array(target), 1.0 / np.array(measured)
    x, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    pred = a @ x + (np.array(measured) - y)
    return x, pred / np.array(measured) - 1.0


def _report(name: str, err) -> None:
    rms = float(np.sqrt((err**2).mean()))
    print(f"# {name}: relative error {err.min():+.3f} .. {err.max():+.3f}, rms {rms:.3f}")


def fit(path: pathlib.Path) -> None:
    layers = _core.llama_layers()
    cases = []
    for r in csv.DictReader(path.open()):
        if r["status"] != "ok":
            continue
        coll = layers[r["layer"]]["collective"]
        tp, m, n, k = (int(r[c]) for c in ("tp", "m", "n", "k"))
        plans = {s: _core.build_plan(SCHEDULE[coll], tp, s, m, n, k) for s in (tp, 2 * tp)}
        cases.append((r, coll, plans))

    # Our kernel alone: one rank's whole GEMM.
    feats, meas = [], []
    for r, _, plans in cases:
        p = plans[int(r["tp"])]
        rm, rn, rk = pathmodel.rank_problem(
            p.definition, p.tp, m=p.problem["m"], n=p.problem["n"], k=p.problem["k"]
        )
        est = _core.choose_tile_n(rm, rn)
        e = est[f"n{est['tile_n']}"]
        f = [1.0, 0.0, 0.0, 0.0, 0.0]
        col = 1 if est["tile_n"] == 256 else 3
        f[col], f[col + 1] = rk * e["tiles"] / pathmodel.SLOTS, rk * e["waves"]
        feats.append(f)
        meas.append(float(r["ms_floor_dg"]))
    x, err = _fit(feats, meas, meas)
    pathmodel.GEMM_LAUNCH_MS = x[0]
    pathmodel.GEMM_MS_PER_K = {256: (x[1], x[2]), 128: (x[3], x[4])}
    _report("our kernel alone", err)

    # torch.mm alone.
    feats, meas = [], []
    for r, _, plans in cases:
        p = plans[int(r["tp"])]
        rm, rn, rk = pathmodel.rank_problem(
            p.definition, p.tp, p.problem["m"], p.problem["n"], p.problem["k"]
        )
        feats.append([1.0, 2.0 * rm * rn * rk])
        meas.append(float(r["ms_floor"]))
    y, err = _fit(feats, meas, meas)
    pathmodel.MM_LAUNCH_MS, pathmodel.MM_FLOPS_PER_MS = y[0], 1.0 / y[1]
    _report("torch.mm alone", err)

    # NCCL, per collective.
    nccl = {}
    for coll in SCHEDULE:
        feats, target, meas = [], [], []
        for r, c, plans in cases:
            if c != coll:
                continue
            p = plans[int(r["tp"])]
            dims = (p.problem["m"], p.problem["n"], p.problem["k"])
            mm = pathmodel.mm_ms(*pathmodel.rank_problem(p.definition, p.tp, *dims))
            feats.append([1.0, pathmodel.moved_bytes(p.definition, p.tp, *dims), mm])
            target.append(float(r["ms_baseline"]) - mm)
            meas.append(float(r["ms_baseline"]))
        nccl[coll], err = _fit(feats, target, meas)
        _report(f"NCCL + torch.mm, {coll}", err)
    pathmodel.NCCL = {c: tuple(v) for c, v in nccl.items()}

    # The overlapped plan beyond its GEMMs, per transport.
    overlap = {}
    for transport in ("all_gather", "epilogue", "copy"):
        feats, target, meas = [], [], []
        for r, coll, plans in cases:
            for s, column in ((int(r["tp"]), "ms_dg_S_tp"), (2 * int(r["tp"]), "ms_dg_S_2tp")):
                p = plans[s]
                if (coll if coll == "all_gather" else p.partial_via) != transport:
                    continue
                saved = pathmodel.OVERLAP
                pathmodel.OVERLAP = {t: (0.0, 0.0, 0.0) for t in ("all_gather", "epilogue", "copy")}
                base = pathmodel.predict(p)["overlap_ms"]  # GEMMs + exposed transfer only
                pathmodel.OVERLAP = saved
                dims = (p.problem["m"], p.problem["n"], p.problem["k"])
                rm, rn, rk = pathmodel.rank_problem(p.definition, p.tp, *dims)
                sm, sn = (rm // s, rn) if p.definition["split"] == "M" else (rm, rn // s)
                gemms = pathmodel.gemm_ms(sm, sn, rk, count=s, chained=p.pdl_by_default)
                feats.append([s, gemms, pathmodel.moved_bytes(p.definition, p.tp, *dims)])
                target.append(float(r[column]) - base)
                meas.append(float(r[column]))
        overlap[transport], err = _fit(feats, target, meas)
        _report(f"overlapped plan, {transport}", err)

    print(f"GEMM_LAUNCH_MS = {pathmodel.GEMM_LAUNCH_MS:.3g}")
    g = pathmodel.GEMM_MS_PER_K
    print(
        "GEMM_MS_PER_K = {" + ", ".join(f"{t}: ({a:.3g}, {b:.3g})" for t, (a, b) in g.items()) + "}"
    )
    print(f"MM_LAUNCH_MS = {pathmodel.MM_LAUNCH_MS:.3g}")
    print(f"MM_FLOPS_PER_MS = {pathmodel.MM_FLOPS_PER_MS:.3g}")
    print(
        "NCCL = {"
        + ", ".join(f'"{c}": ({a:.3g}, {b:.3g}, {s:.3g})' for c, (a, b, s) in nccl.items())
        + "}"
    )
    print(
        "OVERLAP = {"
        + ", ".join(f'"{t}": ({a:.3g}, {b:.3g}, {c:.3g})' for t, (a, b, c) in overlap.items())
        + "}"
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", type=pathlib.Path, default=DEFAULT_CSV)
    fit(ap.parse_args(argv).csv)


if __name__ == "__main__":
    main()
