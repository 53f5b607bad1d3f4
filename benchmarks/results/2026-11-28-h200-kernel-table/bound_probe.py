"""Refits stored calibrations with a copy-engine bound added to the overlapped plan's price.

The bound charges the plan at least its whole transfer at one peer's or TP-1 peers' copy-engine
bandwidth. The script prints each fit's errors. It is a probe, not shipped, and runs on the CPU:

    PYTHONPATH=python:. python3 benchmarks/results/2026-11-28-h200-kernel-table/bound_probe.py \\
        python/distgemm/data/machines/nvidia-h{100-80gb-hbm3,200}-tp4-nvlink18.json
"""

import math
import sys

import numpy as np

from distgemm.runtime import calibration_fit as cf
from distgemm.runtime import cost_model as cm
from distgemm.runtime import machine

ORIGINAL = cm.predict_steps
MODES = (None, "1", "tp-1")  # no bound; one peer's bandwidth; TP-1 peers' at once


def bounded(mode):
    def predict_steps(mc, d, tp, steps, problem, via, tile_n=0, dtype="bf16", step_kernel=None):
        out = ORIGINAL(mc, d, tp, steps, problem, via, tile_n, dtype, step_kernel)
        transport = cm.transport_of(d["collective"], via[0])
        if mode is None or tp < 2 or transport == "epilogue":
            return out
        m, n, k = problem
        rm, rn, rk = cm.rank_problem(d, tp, m, n, k)
        sm, sn = cm.step_gemm(d, steps, rm, rn)
        kernel = step_kernel or "distgemm"
        gemms = cm.steps_gemm_ms(mc, sm, sn, rk, kernel, tile_n=tile_n, count=steps, chained=via[1])
        core = gemms * (1 + mc.overlap[transport][1])
        peers = 1 if mode == "1" else tp - 1
        transfer = cm.moved_bytes(d, tp, m, n, k) / mc.link_bytes_per_ms(peers)
        if transfer > core:
            out = dict(out, overlap_ms=out["overlap_ms"] - core + transfer)
        return out

    return predict_steps


for path in sys.argv[1:]:
    shipped = machine.load(path)
    runs = shipped.meta["runs"]
    overlapped = [r for r in runs if r["kind"] == "path" and r["path"] == "overlap"]
    for mode in MODES:
        cm.predict_steps = bounded(mode)
        mc = cf.fit(runs, shipped.key, shipped.slots)
        e = np.array(cf.path_errors(mc, overlapped))
        terms = {k: round(v["rms"], 3) for k, v in mc.meta["fit"].items() if "overlap" in k}
        rms = math.sqrt((e * e).mean())
        print(
            f"{path.split('/')[-1]} bound={mode}: overlapped runs rms {rms:.3f} "
            f"max {abs(e).max():.3f}, choice error {mc.choice_error:.3f}, {terms}"
        )
    cm.predict_steps = ORIGINAL
