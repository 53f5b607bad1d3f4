"""Probe of what splitting a per-GPU GEMM into a plan's S row steps costs, with no communication:
the whole GEMM against S GEMMs of M/S rows each, back to back on one stream, one GPU.

    CUDA_VISIBLE_DEVICES=0 python3 -m benchmarks.probes.step_split_cost [--tp 4] [--out FILE.json]

Per Llama case of issue 41's efficiency target that missed 0.93 (70B/405B, 4096 and 8192
tokens, TP given): its per-rank GEMM (llama_cases.shapes' floor), split at S = TP and 2 TP as
the plans split it (rows of A; ag_rotate_a's and rs_tile_a's steps), run by torch.mm and by
distgemm's kernel as the installed table picks it per step (_core.gemm, everything unset).
Each variant is a CUDA graph of REPS calls (benchmarks.common.timing.graphed); warmed up 1 s,
then ROUNDS interleaved windows of WINDOW_S each, median ms per call. Operands are uniform random (seeded). The ratio split/whole
bounds a plan's own-kernel efficiency from above before any communication contends.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks.common.llama_cases import Case, shapes
from benchmarks.common.timing import graphed
from distgemm import _core
from distgemm.runtime import kernel_table

CASES = [
    ("70B", "QKV", 4096), ("70B", "O", 4096), ("70B", "FC2", 4096), ("70B", "O", 8192),
    ("70B", "FC2", 8192), ("405B", "QKV", 4096), ("405B", "O", 4096), ("70B", "FC1", 8192),
]  # fmt: skip
REPS = 10
ROUNDS = 3
WINDOW_S = 0.3


def window_ms(g: torch.cuda.CUDAGraph, seconds: float) -> float:
    """Replays for about `seconds`; ms per call over the window (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n, t0 = 0, time.perf_counter()
    start.record()
    while time.perf_counter() - t0 < seconds:
        g.replay()
        n += 1
        if n % 8 == 0:
            torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (n * REPS)


def variants(m: int, n: int, k: int, tp: int, dev: int) -> dict[str, torch.cuda.CUDAGraph]:
    g = torch.Generator(device="cpu").manual_seed(m * 7 + n * 3 + k)
    a = (torch.rand(m, k, generator=g) * 2 - 1).to(torch.bfloat16).cuda()
    w = (torch.rand(n, k, generator=g) * 2 - 1).to(torch.bfloat16).cuda()
    d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    wt = w.t()

    def mm(rows: int):
        def call():
            for r in range(0, m, rows):
                torch.mm(a[r : r + rows], wt, out=d[r : r + rows])

        return call

    def ours(rows: int):
        def call():
            s = torch.cuda.current_stream().cuda_stream
            for r in range(0, m, rows):
                _core.gemm(
                    a[r].data_ptr(), w.data_ptr(), d[r].data_ptr(), rows, n, k, dtype="bf16",
                    cuda_device=dev, stream=s,
                )  # fmt: skip

        return call

    out = {}
    for steps in (1, tp, 2 * tp):
        if m % steps:
            continue
        out[f"mm S={steps}"] = graphed(torch, mm(m // steps), REPS)
        out[f"dg S={steps}"] = graphed(torch, ours(m // steps), REPS)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.cuda.current_device()
    kernel_table.install(torch.device("cuda", dev))
    rows = []
    for model, layer, tokens in CASES:
        m, n, k = shapes(Case(model, layer, tokens, args.tp))["floor"]
        graphs = variants(m, n, k, args.tp, dev)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 1.0:
            for g in graphs.values():
                g.replay()
            torch.cuda.synchronize()
        times: dict[str, list[float]] = {name: [] for name in graphs}
        for r in range(ROUNDS):
            names = list(graphs) if r % 2 == 0 else list(reversed(graphs))
            for name in names:
                times[name].append(window_ms(graphs[name], WINDOW_S))
        med = {name: statistics.median(v) for name, v in times.items()}
        row = dict(case=f"{model}/{layer}/M{tokens}/TP{args.tp}", m=m, n=n, k=k, ms=med)
        rows.append(row)
        line = "  ".join(
            f"{name} {ms:.4f} ({ms / med[name.split()[0] + ' S=1']:.3f})"
            for name, ms in med.items()
        )
        print(f"{row['case']:<20} {m}x{n}x{k}  {line}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, tp=args.tp,
                     reps=REPS, rounds=ROUNDS, window_s=WINDOW_S, rows=rows), f, indent=1,
            )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
