"""Stream-K launches on one shared workspace, run by tests/gpu/test_kernel_gemm.py in a child
process (a split counter left behind would make a later launch wait forever inside CUTLASS: the
parent's timeout turns that into a failure, not a hung test run). Writes JSON to --out:
eager launches of alternating shapes, each against torch.mm, then replays of a CUDA graph that
captured three of them, with fresh inputs copied in before every replay."""

import argparse
import json
import math

import torch

from distgemm import _core

CONFIG = "128x256sk"
# Partial last waves of different sizes, partial tiles in M and N, one M tile.
SHAPES = [(1024, 5120, 2048), (1000, 1032, 520), (128 * 33, 1024, 256), (8, 4096, 1024)]


def rel_err(x, ref) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--eager", type=int, default=60, help="eager launches")
    parser.add_argument("--replays", type=int, default=50, help="graph replays")
    args = parser.parse_args()
    dev = torch.cuda.current_device()
    nbytes = max(
        _core.gemm_workspace_bytes(m, n, k, cuda_device=dev, config=CONFIG) for m, n, k in SHAPES
    )
    ws = torch.zeros(nbytes, device="cuda", dtype=torch.uint8)
    gen = torch.Generator(device="cuda").manual_seed(21)
    ops = []
    for m, n, k in SHAPES:
        a = torch.empty((m, k), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
        w = torch.empty((n, k), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
        ops.append(
            (m, n, k, a, w / math.sqrt(k), torch.empty((m, n), device="cuda", dtype=a.dtype))
        )

    def launch(op) -> int:
        m, n, k, a, w, d = op
        return _core.gemm(
            a.data_ptr(), w.data_ptr(), d.data_ptr(), m, n, k, cuda_device=dev,
            stream=torch.cuda.current_stream().cuda_stream, config=CONFIG,
            workspace=ws.data_ptr(), workspace_bytes=ws.numel(),
        )  # fmt: skip

    eager_errs = []
    for i in range(args.eager):
        op = ops[i % len(ops)]
        op[5].fill_(float("nan"))
        assert launch(op) == 256
        eager_errs.append(rel_err(op[5], torch.mm(op[3], op[4].t())))
    tail_nonzero = int(ws[-_core.STREAM_K_TAIL_BYTES :].count_nonzero())  # counters: all zero

    captured = ops[:3]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for op in captured:
            launch(op)
    replay_errs = []
    for _ in range(args.replays):
        for op in captured:
            op[3].uniform_(-1, 1, generator=gen)  # fresh inputs in the static buffers
            op[5].fill_(float("nan"))
        graph.replay()
        replay_errs.append(max(rel_err(op[5], torch.mm(op[3], op[4].t())) for op in captured))
    torch.cuda.synchronize()
    with open(args.out, "w") as f:
        json.dump(
            dict(
                workspace_bytes=nbytes,
                eager=len(eager_errs),
                eager_max_err=max(eager_errs),
                tail_nonzero_after=tail_nonzero,
                replays=len(replay_errs),
                replay_max_err=max(replay_errs),
            ),
            f,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
