"""Probe: cuBLASLt's heuristic rank 0 with and without a workspace against torch.mm (which gives
cuBLAS one) on given GEMM shapes, one GPU, CUDA graphs, A B C A (timing only).

    python3 -m benchmarks.probes.cublaslt_workspace [--shapes 8192x7168x8192,...] [--ws-mib 32]

Each shape: uniform random bf16 A [M, K] in [-1, 1), B [N, K] / sqrt(K); torch.mm, then
``_core.gemm`` with ``cublas_algo=0`` and no workspace (as a plan's GEMMs run it), then the same
with a workspace of --ws-mib MiB (cuBLASLt's heuristic asked with that much), then torch.mm
again; each a graph of ``kernel_vs_cublas.calls_per_replay`` calls (``timing.graphed``), timed by
``timing.time_variant``; ms per GEMM. (Calls 6 and 7 of the write-up ran its first form, whose
graphs held max(1, 0.1 ms / the GEMM at 700 TFLOP/s) calls.)
"""

from __future__ import annotations

import json
import sys

import torch

from benchmarks.common.timing import WARMUP_S, SingleGpuContext, graphed, time_variant
from benchmarks.kernel.kernel_vs_cublas import calls_per_replay
from distgemm import _core, cli

SHAPES = "8192x7168x8192,4096x7168x8192,2048x2304x16384,1024x2304x16384,2048x3584x4096"


def main(argv=None) -> int:
    ap = cli.ArgumentParser("python3 -m benchmarks.probes.cublaslt_workspace", __doc__)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--ws-mib", type=int, default=32)
    args = ap.parse_args(argv)
    ctx = SingleGpuContext.current()
    dev = torch.cuda.current_device()
    gen = torch.Generator(device="cuda").manual_seed(5)
    ws = torch.zeros(args.ws_mib << 20, dtype=torch.uint8, device="cuda")
    rows = []
    for text in args.shapes.split(","):
        m, n, k = (int(x) for x in text.split("x"))
        a = torch.rand(m, k, device="cuda", generator=gen).mul_(2).sub_(1).bfloat16()
        b = (torch.rand(n, k, device="cuda", generator=gen).mul_(2).sub_(1) / k**0.5).bfloat16()
        d_torch = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        d_lt = torch.empty_like(d_torch)

        def lt(workspace: bool):
            kw = dict(workspace=ws.data_ptr(), workspace_bytes=ws.numel()) if workspace else {}
            return lambda: _core.gemm(
                a.data_ptr(), b.data_ptr(), d_lt.data_ptr(), m, n, k, dtype="bf16",
                cuda_device=dev, stream=torch.cuda.current_stream().cuda_stream, cublas_algo=0,
                **kw,
            )  # fmt: skip

        calls = calls_per_replay(m, n, k)
        graphs = {
            "torch": graphed(torch, lambda: torch.mm(a, b.t(), out=d_torch), calls),
            "lt_no_ws": graphed(torch, lt(False), calls),
            "lt_ws": graphed(torch, lt(True), calls),
        }
        ms = {}
        for i, name in enumerate(("torch", "lt_no_ws", "lt_ws", "torch")):
            t = time_variant(ctx, graphs[name].replay, warm_s=WARMUP_S if i == 0 else 0.25)
            ms.setdefault(name, []).append(t / calls)
        torch_ms = sum(ms["torch"]) / 2
        row = dict(m=m, n=n, k=k, torch_ms=torch_ms, torch_drift=abs(ms["torch"][0] / ms["torch"][1] - 1),
                   lt_no_ws=ms["lt_no_ws"][0] / torch_ms, lt_ws=ms["lt_ws"][0] / torch_ms)  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
