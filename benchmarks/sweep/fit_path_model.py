"""Refit the constants of distgemm.runtime.cost_model from a torchrun Llama sweep CSV.

Prints them with the model's relative error per stage, then the model's path choice on every case
of the sweep against the measured times (CPU only, numpy).

    python3 -m benchmarks.sweep.fit_path_model [benchmarks/results/2026-11-23-llama-sweep.csv]

Stages, each a least-squares fit of the relative error, each using the ones before it: our
kernel alone (``ms_floor_dg``: launch and ms per K of a full wave and of a started wave, per
tile width), torch.mm alone (``ms_floor``: launch and rate), NCCL (``ms_baseline`` minus the
torch.mm model: latency, ms per byte, share of the GEMM, per collective) and the overlapped plan
beyond its GEMMs (``ms_dg_S_tp`` / ``ms_dg_S_2tp``: ms per step, share of the GEMM time, ms per
byte, per transport). Paste the printed values into python/distgemm/runtime/cost_model.py.

The validation (``validation_rows``, also run by tests/test_tuning_model.py) takes the collective
path's time to be the sweep's NCCL + torch.mm baseline, which is what that path runs.
"""

from __future__ import annotations

import csv
import pathlib

import numpy as np

from benchmarks.common.report import RESULTS_DIR
from distgemm import _core, cli, llama3
from distgemm.runtime import cost_model

DEFAULT_CSV = pathlib.Path(RESULTS_DIR) / "2026-11-23-llama-sweep.csv"
SCHEDULE = {"all_gather": "ag_rotate_a", "reduce_scatter": "rs_tile_a"}


def _fit(rows: list[list[float]], target: list[float], measured: list[float]):
    """Least squares of (features @ x - target) / measured; returns x and the relative errors
    of features @ x + (measured - target) against measured."""
    a, y, w = np.array(rows), np.array(target), 1.0 / np.array(measured)
    x, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    pred = a @ x + (np.array(measured) - y)
    return x, pred / np.array(measured) - 1.0


CONSTANTS = (
    "GEMM_LAUNCH_MS",
    "GEMM_MS_PER_K",
    "MM_LAUNCH_MS",
    "MM_FLOPS_PER_MS",
    "NCCL",
    "OVERLAP",
)


def _cases(path: pathlib.Path):
    """(CSV row, collective, {S: plan} for S = TP and 2TP) of every ok case."""
    layers = llama3.layers()
    out = []
    for r in csv.DictReader(path.open()):
        if r["status"] != "ok":
            continue
        coll = layers[r["layer"]]["collective"]
        tp, m, n, k = (int(r[c]) for c in ("tp", "m", "n", "k"))
        out.append(
            (r, coll, {s: _core.build_plan(SCHEDULE[coll], tp, s, m, n, k) for s in (tp, 2 * tp)})
        )
    return out


def _rank_gemm(plan, steps: int = 1):
    """One rank's GEMM (m, n, k) of ``plan``, split into ``steps`` along the schedule's mode."""
    p = plan.problem
    rm, rn, rk = cost_model.rank_problem(plan.definition, plan.tp, p["m"], p["n"], p["k"])
    return ((rm // steps, rn) if plan.definition["split"] == "M" else (rm, rn // steps)) + (rk,)


def _moved(plan) -> float:
    p = plan.problem
    return cost_model.moved_bytes(plan.definition, plan.tp, p["m"], p["n"], p["k"])


def fit(path: pathlib.Path = DEFAULT_CSV) -> tuple[dict, dict]:
    """({constant name: fitted value}, {stage: relative errors}); cost_model's own constants are
    left as they were."""
    saved = {c: getattr(cost_model, c) for c in CONSTANTS}
    try:
        return _fit_stages(_cases(path))
    finally:
        for c, v in saved.items():
            setattr(cost_model, c, v)


def _fit_stages(cases) -> tuple[dict, dict]:
    errors = {}
    # Our kernel alone: one rank's whole GEMM.
    feats, meas = [], []
    for r, _, plans in cases:
        rm, rn, rk = _rank_gemm(plans[int(r["tp"])])
        est = _core.choose_tile_n(rm, rn)
        e = est[f"n{est['tile_n']}"]
        f = [1.0, 0.0, 0.0, 0.0, 0.0]
        col = 1 if est["tile_n"] == 256 else 3
        f[col], f[col + 1] = rk * e["tiles"] / cost_model.SLOTS, rk * e["waves"]
        feats.append(f)
        meas.append(float(r["ms_floor_dg"]))
    x, errors["our kernel alone"] = _fit(feats, meas, meas)
    cost_model.GEMM_LAUNCH_MS = x[0]
    cost_model.GEMM_MS_PER_K = {256: (x[1], x[2]), 128: (x[3], x[4])}

    # torch.mm alone.
    feats = [[1.0, 2.0 * float(np.prod(_rank_gemm(plans[int(r["tp"])])))] for r, _, plans in cases]
    meas = [float(r["ms_floor"]) for r, _, _ in cases]
    y, errors["torch.mm alone"] = _fit(feats, meas, meas)
    cost_model.MM_LAUNCH_MS, cost_model.MM_FLOPS_PER_MS = y[0], 1.0 / y[1]

    # NCCL, per collective.
    nccl = {}
    for coll in SCHEDULE:
        feats, target, meas = [], [], []
        for r, c, plans in cases:
            if c == coll:
                p = plans[int(r["tp"])]
                mm = cost_model.mm_ms(*_rank_gemm(p))
                feats.append([1.0, _moved(p), mm])
                target.append(float(r["ms_baseline"]) - mm)
                meas.append(float(r["ms_baseline"]))
        x, errors[f"NCCL + torch.mm, {coll}"] = _fit(feats, target, meas)
        nccl[coll] = tuple(float(v) for v in x)
    cost_model.NCCL = nccl

    # The overlapped plan beyond its GEMMs and exposed transfer, per transport.
    overlap = {}
    cost_model.OVERLAP = {t: (0.0, 0.0, 0.0) for t in ("all_gather", "epilogue", "copy")}
    for transport in tuple(cost_model.OVERLAP):
        feats, target, meas = [], [], []
        for r, coll, plans in cases:
            for s, column in ((int(r["tp"]), "ms_dg_S_tp"), (2 * int(r["tp"]), "ms_dg_S_2tp")):
                p = plans[s]
                if (coll if coll == "all_gather" else p.partial_via) == transport:
                    gemms = cost_model.gemm_ms(*_rank_gemm(p, s), count=s, chained=p.pdl_by_default)
                    feats.append([s, gemms, _moved(p)])
                    target.append(float(r[column]) - cost_model.predict(p)["overlap_ms"])
                    meas.append(float(r[column]))
        x, errors[f"overlapped plan, {transport}"] = _fit(feats, target, meas)
        overlap[transport] = tuple(float(v) for v in x)
    cost_model.OVERLAP = overlap
    return {c: getattr(cost_model, c) for c in CONSTANTS}, errors


def validation_rows(path: pathlib.Path = DEFAULT_CSV) -> list[dict]:
    """Per case of the sweep: S (the default plan's), the model's path and prediction, the
    measured overlapped and collective (NCCL + torch.mm baseline) ms, the measured faster path,
    the chosen path's ms over the baseline and over the faster one (the cost of a wrong
    choice)."""
    rows = []
    for r, coll, _ in _cases(path):
        tp, m, n, k = (int(r[c]) for c in ("tp", "m", "n", "k"))
        plan = _core.default_plan(SCHEDULE[coll], tp, m, n, k)
        path_, pred, _ = cost_model.choose(plan)
        overlap = float(r["ms_dg_S_tp" if plan.steps == tp else "ms_dg_S_2tp"])
        base = float(r["ms_baseline"])
        chosen = overlap if path_ == "overlap" else base
        rows.append(
            dict(
                case=r["case"],
                steps=plan.steps,
                sweep_steps=int(r["dg_default_steps"]),
                path=path_,
                faster="overlap" if overlap < base else "collective",
                overlap_ms=overlap,
                collective_ms=base,
                predicted_overlap_ms=pred["overlap_ms"],
                predicted_collective_ms=pred["collective_ms"],
                vs_baseline=chosen / base,
                cost=chosen / min(overlap, base),
            )
        )
    return rows


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def main(argv=None) -> None:
    ap = cli.ArgumentParser("python3 -m benchmarks.sweep.fit_path_model", __doc__)
    ap.add_argument("csv", nargs="?", type=pathlib.Path, default=DEFAULT_CSV)
    args = ap.parse_args(argv)
    constants, errors = fit(args.csv)
    for stage, err in errors.items():
        rms = float(np.sqrt((err**2).mean()))
        print(f"# {stage}: relative error {err.min():+.3f} .. {err.max():+.3f}, rms {rms:.3f}")
    for name, v in constants.items():
        if isinstance(v, dict):
            items = ", ".join(f"{k!r}: ({', '.join(map(_fmt, t))})" for k, t in v.items())
            print(f"{name} = {{{items}}}")
        else:
            print(f"{name} = {_fmt(v)}")
    print("\n| case | S | model | faster | overlap ms | NCCL+mm ms | chosen / NCCL+mm | cost |")
    print("|---|---|---|---|---|---|---|---|")
    for row in validation_rows(args.csv):
        print(
            f"| {row['case']} | {row['steps']} | {row['path']} | {row['faster']} | "
            f"{row['overlap_ms']:.4f} | {row['collective_ms']:.4f} | {row['vs_baseline']:.3f} | "
            f"{row['cost']:.3f} |"
        )


if __name__ == "__main__":
    main()
