"""gemm_all_reduce's decode constants fitted to a decode benchmark's CSV, and the decode model's
choice on every case of such a CSV against its measured times (CPU only, numpy).

    python3 -m benchmarks.decode.fit_reduce DECODE.csv --base FILE [--out FILE]
    python3 -m benchmarks.decode.fit_reduce DECODE.csv --constants FILE   # validation only

A case's columns become calibration runs (``distgemm.runtime.calibration_fit.fit_reduce``):
torch.mm alone, NCCL's all-reduce after torch.mm at the case's shape (mm + NCCL less mm), each
fused path where it ran forced (``path="fused"``, and ``path="fused_two_shot"``: the two-shot
tail), and our all-reduce where ``path="auto"`` ran the collective path with it (auto less mm)
or where ``--own-all-reduce`` timed it forced. Both of the decode benchmark's CSV forms are read:
``benchmarks/decode/decode_layers.py``'s (``us_mm``, ``us_nccl``, ``us_distgemm_fused``,
``us_distgemm_fused_two_shot``, ...) and the 2026-11-24 one (``case`` = model/layer/M/TP,
``mm_us``, ``mm_nccl_us``, ``distgemm_fused_us``). ``--base`` names the machine file the
constants are added to (its GPU and TP); ``--out`` writes the result. ``--constants`` reports
instead, per case, the candidate the model picks under another file's constants, its measured
time and the fastest measured candidate: the shapes a calibration did not run.
"""

from __future__ import annotations

import csv
import pathlib
from typing import Any

from benchmarks.common import models
from distgemm import cli
from distgemm.runtime import calibration_fit, machine, reduce_cost
from distgemm.runtime.machine import FUSED_PATHS
from distgemm.runtime.paths.collective import OWN_ALL_REDUCES


def _float(row: dict[str, str], *names: str) -> float | None:
    for name in names:
        v = row.get(name)
        if v not in (None, ""):
            return float(v)
    return None


def cases(path: pathlib.Path) -> list[dict[str, Any]]:
    """Every case of a decode CSV: tp, this rank's m, n, k and the measured us per variant
    ("mm", "nccl", each fused path of FUSED_PATHS, and "collective/<algorithm>" where auto ran
    our all-reduce)."""
    out = []
    for row in csv.DictReader(path.open()):
        if "case" in row:  # model/layer/M<tokens>/TP<tp>
            model, layer, mtok, tptxt = row["case"].split("/")
            m, tp = int(mtok[1:]), int(tptxt[2:])
            n, k = models.layer_nk(model, layer)
        else:
            m, tp, n, k = (int(row[c]) for c in ("m", "tp", "n", "k"))
        us = {
            "mm": _float(row, "us_mm", "mm_us"),
            "nccl": _float(row, "us_nccl", "mm_nccl_us"),
            "fused": _float(row, "us_distgemm_fused", "distgemm_fused_us"),
            "fused_two_shot": _float(row, "us_distgemm_fused_two_shot"),
        }
        auto = row.get("auto_runs", "")
        if auto.startswith("collective/") and auto != "collective/nccl":
            us[auto] = _float(row, "us_distgemm")
        for algorithm in OWN_ALL_REDUCES:  # --own-all-reduce's forced variants
            forced = _float(row, f"us_dg_{algorithm}")
            if forced is not None:
                us[f"collective/{algorithm}"] = forced
        out.append({"tp": tp, "m": m, "n": n, "k": k // tp, "us": us})
    return out


def decode_runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calibration runs of the cases (``cases``) that have torch.mm and mm + NCCL."""
    runs = []
    for c in rows:
        us, shape = c["us"], {"m": c["m"], "n": c["n"], "k": c["k"]}
        if us["mm"] is None or us["nccl"] is None:
            continue
        nbytes = c["m"] * c["n"] * 2
        runs.append({"kind": "reduce_mm", **shape, "ms": us["mm"] / 1e3})
        runs.append(_after_mm("nccl", nbytes, shape, us["nccl"], us["mm"]))
        for path, tail in FUSED_PATHS.items():
            if us.get(path) is not None:
                runs.append({"kind": "fused", "tp": c["tp"], **shape, "tail": tail,
                             "ms": us[path] / 1e3})  # fmt: skip
        for name, v in us.items():
            if name.startswith("collective/") and v is not None:
                runs.append(_after_mm(name.split("/")[1], nbytes, shape, v, us["mm"]))
    return runs


def _after_mm(algorithm: str, nbytes: int, shape: dict, pair_us: float, mm_us: float) -> dict:
    """An all-reduce run as the calibration stores one timed right after its torch.mm: the
    shape, the pair's ms and the all-reduce's part (the pair less torch.mm alone)."""
    return {"kind": "all_reduce", "algorithm": algorithm, "bytes": nbytes, **shape,
            "after_mm_ms": pair_us / 1e3, "ms": (pair_us - mm_us) / 1e3}  # fmt: skip


def validate(rows: list[dict[str, Any]], mc: machine.MachineConstants) -> list[str]:
    """Per case: the model's pick under ``mc``, its measured us (where measured) against mm +
    NCCL, and the fastest measured candidate."""
    rc = mc.reduce
    lines = [f"{'m':>4} {'n':>6} {'k':>6}  pick{'':21s} pick us  mm+nccl us  fastest measured"]
    for c in rows:
        us = c["us"]
        if us["mm"] is None or us["nccl"] is None:
            continue
        measured = {reduce_cost.BASELINE: us["nccl"]}
        measured.update({p: us[p] for p in FUSED_PATHS if us.get(p) is not None})
        measured.update({k: v for k, v in us.items() if k.startswith("collective/") and v})
        offered = {p: "" if p in measured else "not measured" for p in FUSED_PATHS}
        offered.update(dict.fromkeys(OWN_ALL_REDUCES, ""))
        pick, _, _ = reduce_cost.choose(rc, c["m"], c["n"], c["k"], c["tp"], offered)
        fastest = min(measured, key=measured.get)
        got = measured.get(pick)
        lines.append(
            f"{c['m']:4d} {c['n']:6d} {c['k']:6d}  {pick:25s} "
            f"{'' if got is None else f'{got:7.2f}':>7s}  {us['nccl']:10.2f}  "
            f"{fastest} {measured[fastest]:.2f}"
        )
    return lines


def main(argv=None) -> int:
    ap = cli.ArgumentParser("python3 -m benchmarks.decode.fit_reduce", __doc__)
    ap.add_argument("csv", help="a decode benchmark's CSV")
    ap.add_argument("--base", help="the machine file the fitted constants are added to")
    ap.add_argument("--out", help="write the base with the fitted constants here")
    ap.add_argument("--constants", help="validate this machine file's decode choice instead")
    args = ap.parse_args(argv)
    path = pathlib.Path(args.csv)
    if not path.is_file():
        ap.error(f"{path}: no such file")
    rows = cases(path)
    if args.constants:
        mc = machine.load(args.constants)
        if mc.reduce is None:
            ap.error(f"{args.constants} has no decode constants (reduce)")
        print("\n".join(validate(rows, mc)))
        return 0
    if not args.base:
        ap.error("--base FILE (the machine file the constants are added to) or --constants FILE")
    base = machine.load(args.base)
    tps = {c["tp"] for c in rows}
    if tps != {base.key.tp}:
        ap.error(f"{path} is at TP {sorted(tps)}, {args.base} at TP {base.key.tp}")
    mc = calibration_fit.with_reduce(base, decode_runs(rows), {"source": str(path)})
    for stage, e in mc.meta["fit"].items():
        if stage.startswith("reduce/"):
            print(f"  {stage:24s} runs {e['runs']:3d}  rel. err. rms {e['rms']:.3f}")
    print(f"decode choice error {mc.reduce.choice_error:.3f}")
    if args.out:
        mc.save(args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
