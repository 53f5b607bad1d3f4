"""The cost model's machine constants fitted to a torchrun Llama sweep CSV, and the model's path
choice on every case of a sweep against its measured times (CPU only, numpy).

    python3 -m benchmarks.sweep.fit_path_model [SWEEP.csv] [--gpu NAME --topology T --out FILE]
    python3 -m benchmarks.sweep.fit_path_model SWEEP.csv --constants FILE   # validation only
        [--kernel-table TABLE.json]   # the sweep's plans ran that table's kernels in their steps

The sweep's columns become calibration runs (``distgemm.runtime.calibration_fit``): our kernel
alone (``ms_floor_dg``, one rank's GEMM at the tile the wave model picks), torch.mm alone
(``ms_floor``), the collective path (``ms_baseline``: NCCL + torch.mm, what that path runs) and
the overlapped plan at S = TP and 2 TP (``ms_dg_S_tp`` / ``ms_dg_S_2tp``). A sweep has no
copy-engine or NCCL-alone runs: the copy engine takes the simulator's default bandwidth, NCCL's
three terms come from the baseline. ``--out`` writes the constants as a machine file
(``distgemm/data/machines``). ``--constants`` validates another machine file's choice on the
sweep instead: the shapes a calibration did not run. ``--kernel-table`` prices the plans' steps
as that kernel table runs them (a sweep run under ``DISTGEMM_KERNEL_TABLE_PLANS=all``), the way
``path="auto"`` prices them on the machine (``kernel_table.priced_as``).
"""

from __future__ import annotations

import csv
import pathlib
import statistics

from benchmarks.common.report import RESULTS_DIR
from distgemm import _core, cli, llama3
from distgemm.plan.timeline import CostModel
from distgemm.runtime import calibration_fit, cost_model, kernel_table, machine
from distgemm.runtime.choose import choose_steps

DEFAULT_CSV = pathlib.Path(RESULTS_DIR) / "2026-11-23-llama-sweep.csv"
SCHEDULE = {"all_gather": "ag_rotate_a", "reduce_scatter": "rs_tile_a"}
# The copy engine of a sweep-fitted machine (a sweep has no copy runs): no latency, the
# simulator's one-way peer bandwidth (bytes per ms) for every peer count.
COPY_DEFAULT = (0.0, (CostModel.link_gbs * 1e6,))
SLOTS = _core.H200_RESIDENT_CTAS  # 132 SMs, H100 SXM and H200 alike


def _cases(path: pathlib.Path):
    """(CSV row, schedule) of every ok case."""
    layers = llama3.layers()
    return [
        (r, SCHEDULE[layers[r["layer"]]["collective"]])
        for r in csv.DictReader(path.open())
        if r["status"] == "ok"
    ]


def sweep_runs(path: pathlib.Path = DEFAULT_CSV) -> list[dict]:
    """The calibration runs a sweep's columns amount to (the overlapped ones name the kernel of
    their steps under the table ``kernel_table.priced_as`` gives, if any)."""
    runs = []
    for r, schedule in _cases(path):
        tp, m, n, k = (int(r[c]) for c in ("tp", "m", "n", "k"))
        plan = _core.build_plan(schedule, tp, tp, m, n, k)
        rm, rn, rk = cost_model.rank_problem(plan.definition, tp, m, n, k)
        tile = _core.choose_tile_n(rm, rn)["tile_n"]
        shape = {"m": rm, "n": rn, "k": rk}
        runs.append({"kind": "gemm", **shape, "tile_n": tile, "ms": float(r["ms_floor_dg"])})
        runs.append({"kind": "mm", **shape, "ms": float(r["ms_floor"])})
        where = {"schedule": schedule, "tp": tp, "m": m, "n": n, "k": k}
        runs.append({"kind": "path", "path": "collective", **where, "steps": tp,
                     "ms": float(r["ms_baseline"])})  # fmt: skip
        for steps, column in ((tp, "ms_dg_S_tp"), (2 * tp, "ms_dg_S_2tp")):
            if r[column]:
                kernel = calibration_fit.installed_step_kernel(schedule, tp, steps, m, n, k)
                runs.append({"kind": "path", "path": "overlap", **where, "steps": steps,
                             "ms": float(r[column]), "step_kernel": kernel})  # fmt: skip
    return runs


def fit(path: pathlib.Path = DEFAULT_CSV, gpu: str = "NVIDIA H200", topology: str = "nvlink18"):
    """The machine constants of ``gpu`` / ``topology`` at the sweep's TP fitted to the sweep."""
    runs = sweep_runs(path)
    tp = next(r["tp"] for r in runs if r["kind"] == "path")
    meta = {"source": f"fit of the Llama sweep {path.name} (benchmarks.sweep.fit_path_model)"}
    key = machine.MachineKey(gpu, tp, topology)
    return calibration_fit.fit(runs, key, SLOTS, meta, copy_default=COPY_DEFAULT)


def validation_rows(mc: machine.MachineConstants, path: pathlib.Path = DEFAULT_CSV) -> list[dict]:
    """Per case of the sweep, what ``path="auto"`` does under ``mc`` (``choose.choose_steps``,
    then ``cost_model.choose``, as an op entry is made): the defaults' S and the S it takes, the
    path and its prediction; the measured overlapped ms at that S, the collective (NCCL +
    torch.mm baseline) ms, the measured faster path, the chosen path's ms over the baseline, over
    the faster path at the chosen S (``cost``: the cost of a wrong path) and over the fastest
    measured at either S (``cost_vs_fastest``: a wrong S too)."""
    import torch

    rows = []
    for r, schedule in _cases(path):
        tp, m, n, k = (int(r[c]) for c in ("tp", "m", "n", "k"))
        spec = _meta_spec(schedule, tp, m, n, k)
        at_tp = mc.at_tp(tp)
        chosen, _, pred = choose_steps(spec, None, torch.bfloat16, at_tp)
        path_, pred, _ = cost_model.choose(at_tp, chosen.plan, pred=pred)
        measured = {tp: float(r["ms_dg_S_tp"])}
        if r["ms_dg_S_2tp"]:
            measured[2 * tp] = float(r["ms_dg_S_2tp"])
        overlap = measured[chosen.steps]
        base = float(r["ms_baseline"])
        chosen_ms = overlap if path_ == "overlap" else base
        rows.append(
            dict(
                case=r["case"],
                default_steps=spec.steps,
                steps=chosen.steps,
                sweep_steps=int(r["dg_default_steps"]),
                path=path_,
                faster="overlap" if overlap < base else "collective",
                overlap_ms=overlap,
                collective_ms=base,
                predicted_overlap_ms=pred["overlap_ms"],
                predicted_collective_ms=pred["collective_ms"],
                vs_baseline=chosen_ms / base,
                cost=chosen_ms / min(overlap, base),
                cost_vs_fastest=chosen_ms / min(*measured.values(), base),
            )
        )
    return rows


def _meta_spec(schedule: str, tp: int, m: int, n: int, k: int):
    """The op entry's spec of global m x n x k on ``tp`` ranks (meta tensors: shapes only)."""
    import torch

    from distgemm import ops

    def meta(*shape):
        return torch.empty(shape, device="meta", dtype=torch.bfloat16)

    if schedule == "ag_rotate_a":
        return ops.make_spec("all_gather_gemm", schedule, tp, 0, None, meta(m // tp, k),
                             meta(n // tp, k))  # fmt: skip
    return ops.make_spec("gemm_reduce_scatter", schedule, tp, 0, None, meta(m, k // tp),
                         meta(n, k // tp))  # fmt: skip


@cli.quiet_on_broken_pipe
def main(argv=None) -> None:
    ap = cli.ArgumentParser("python3 -m benchmarks.sweep.fit_path_model", __doc__)
    ap.add_argument("csv", nargs="?", type=pathlib.Path, default=DEFAULT_CSV)
    ap.add_argument("--gpu", default="NVIDIA H200", help="the sweep's GPU model (torch's name)")
    ap.add_argument("--topology", default="nvlink18", help="its NVLink topology (runtime.machine)")
    ap.add_argument("--out", type=pathlib.Path, help="write the fitted constants here")
    ap.add_argument("--constants", type=pathlib.Path, help="validate this machine file instead")
    ap.add_argument("--kernel-table", type=pathlib.Path, help="the table the sweep's steps ran")
    args = ap.parse_args(argv)
    table = None
    try:
        if args.constants:
            mc = machine.load(args.constants)
        if args.kernel_table:
            table = kernel_table.load(args.kernel_table)
    except ValueError as e:
        ap.error(str(e))
    if not args.constants:
        with kernel_table.priced_as(table):
            mc = fit(args.csv, args.gpu, args.topology)
        for stage, e in mc.meta["fit"].items():
            rms, worst = e["rms"], e["max"]
            print(f"# {stage}: {e['runs']} runs, relative error rms {rms:.3f}, max {worst:.3f}")
        print(f"# choice error {mc.choice_error:.4f}")
        if args.out:
            mc.save(args.out)
            print(f"# wrote {args.out}")
    head = "case | S (default) | model | faster at S | overlap ms | NCCL+mm ms | chosen / NCCL+mm"
    print(f"\n| {head} | over the fastest |")
    print("|---|---|---|---|---|---|---|---|")
    with kernel_table.priced_as(table):
        rows = validation_rows(mc, args.csv)
    for row in rows:
        print(
            f"| {row['case']} | {row['steps']} ({row['default_steps']}) | {row['path']} | "
            f"{row['faster']} | {row['overlap_ms']:.4f} | {row['collective_ms']:.4f} | "
            f"{row['vs_baseline']:.3f} | {row['cost_vs_fastest']:.3f} |"
        )
    speedups = [1.0 / r["vs_baseline"] for r in rows]
    costs = [r["cost_vs_fastest"] for r in rows]
    print(
        f"\n{len(rows)} cases: chosen vs NCCL + torch.mm median "
        f"{statistics.median(speedups):.3f}x, min {min(speedups):.3f}x; chosen over the fastest "
        f"measured: median {statistics.median(costs):.3f}, max {max(costs):.3f}; a wrong path "
        f"costs at most {max(r['cost'] for r in rows):.3f}"
    )


if __name__ == "__main__":
    main()
