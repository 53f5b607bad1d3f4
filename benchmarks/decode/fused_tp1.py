"""One-GPU benchmark of gemm_all_reduce's fused path at TP=1 (a world of one rank: the fused
kernel's GEMM, its flags and its reduction, no NVLink) against torch.mm, on the row-parallel
decode layers and any N x K, plus its correctness:

    python3 -m benchmarks.decode.fused_tp1 [--tokens 1,2,4,8] [--layers 70B-O,405B-FC2]
        [--shapes 4096x7168,6144x3072] [--weight-copies auto|N] [--out DIR]

Layers (this rank's GEMM at the TP of the issue's acceptance, TP=2): 70B O (K=4096, N=8192),
70B FC2 (K=14336, N=8192), 405B O (K=8192, N=16384), 405B FC2 (K=26624, N=16384); ``--shapes``
adds any N x K (named so); ``--layers ""`` leaves the layers out; tokens 1..256. Operands: the
same uniform random ``a [M, K]`` and ``w [N, K] / sqrt(K)`` (bf16) for both variants, the weight
in ``--weight-copies`` copies that each graph's calls cycle through (auto:
``calibrate.weight_copies``, enough to span the L2 cache as the decode benchmark and the
calibration do, so that no call reads a weight the one before left in L2; 1: one hot weight, as
the runs of 2026-11-23..25 timed). Each variant is a CUDA graph of GRAPH_CALLS calls
(``timing.graphed``), timed as the other benchmarks time (``timing.time_variant``: replays for a
warm-up, then one timed window with CUDA events around every replay, its median), ROUNDS rounds
of both variants in turn, the first torch.mm window after the long warm-up (WARMUP_S); per call
= the replay's time / GRAPH_CALLS; reported: the median over rounds. A time below the
weight-read floor (weight bytes / 4.8 TB/s, the H200's HBM peak) is a measurement bug and is
flagged. The weight bandwidth is weight bytes / time.

Correctness: relative Frobenius error against an fp32 torch reference, bf16 and fp16, with
``beta * c`` and ``bias``, at every token count on 70B O and a K that ends in a partial step;
passes below TOL. The collective path at TP=1 (torch.mm, then NCCL's all-reduce of one rank:
``paths.collective.mm_then_nccl_all_reduce``) must give torch.mm's bits on each of those shapes.
Output: a table on stdout and ``fused-tp1.json`` under --out; exit code 1 when a check failed or
a time is below its floor.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist

import distgemm
from benchmarks.common.timing import (
    HBM_BYTES_PER_S,
    REWARM_S,
    WARMUP_S,
    SingleGpuContext,
    graphed,
    rel_err,
    round_robin,
    time_variant,
)
from distgemm import _core, cli
from distgemm.calibrate import l2_bytes, weight_copies
from distgemm.runtime.communicator import get_communicator

LAYERS = {  # name: (N, K) of one rank's GEMM at TP=2
    "70B-O": (8192, 4096),
    "70B-FC2": (8192, 14336),
    "405B-O": (16384, 8192),
    "405B-FC2": (16384, 26624),
}
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
GRAPH_CALLS = 20
ROUNDS = 2
TOL = 1e-2
# + the decode kernel's split K with a partial last step and a partial last tile (n = 1000), at
# token widths 16 and 32, and the CUTLASS kernel's partial tiles at 40 tokens (64-token tile, split
# K), 80 (96-token tile, split K), 100 (128-token tile), 150 (192-token tile, split K), 200 tokens
# (256-token tile, a partial K block) and 300 tokens (five 64-token tiles, the last partial).
CHECK_SHAPES = [(m, 8192, 4096) for m in TOKENS] + [
    (3, 1024, 4104),
    (24, 1000, 200),
    (17, 2056, 4104),
    (40, 2056, 4096),
    (80, 2056, 4096),
    (100, 2048, 200),
    (150, 2056, 4096),
    (200, 2056, 4104),
    (300, 2056, 4096),
]


def start_world_of_one() -> torch.device:
    """A process group of one rank (or torchrun's), the current GPU bound."""
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29531")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    if dist.get_world_size() != 1:
        raise SystemExit("fused_tp1.py measures TP=1: run it as one process")
    return dev


def uniform(shape, gen, dtype, dev, scale=1.0):
    return ((torch.rand(shape, generator=gen) * 2 - 1) * scale).to(dtype).to(dev)


def check_correctness(dev) -> list[dict]:
    """The fused path against fp32 torch (and torch.mm in the op's dtype for scale)."""
    gen = torch.Generator().manual_seed(7)
    rows = []
    for i, (m, n, k) in enumerate(CHECK_SHAPES):
        for dtype in (torch.bfloat16, torch.float16):
            a = uniform((m, k), gen, dtype, dev)
            w = uniform((n, k), gen, dtype, dev, k**-0.5)
            bias = uniform((n,), gen, dtype, dev)
            c = uniform((m, n), gen, dtype, dev)
            beta = 0.5 if i % 2 == 0 else 0.0
            y = distgemm.gemm_all_reduce(
                a, w, bias=bias, c=c if beta else None, beta=beta, path="fused"
            )
            ref = a.float() @ w.float().t() + beta * c.float() + bias.float()
            mm = (a @ w.t() + beta * c + bias).float()
            collective = distgemm.gemm_all_reduce(a, w, path="collective")
            row = dict(
                m=m,
                n=n,
                k=k,
                dtype=str(dtype).split(".")[-1],
                beta=beta,
                kernel=_core.fused_kernel(m),
                rel_err=rel_err(torch, y, ref),
                torch_rel_err=rel_err(torch, mm, ref),
                collective_bits=bool(torch.equal(collective, a @ w.t())),
            )
            row["ok"] = row["rel_err"] < TOL and row["collective_bits"]
            rows.append(row)
    torch.cuda.synchronize()
    get_communicator().raise_launch_errors()
    return rows


def time_case(dev, name: str, n: int, k: int, m: int, gen, copies: str = "auto") -> dict:
    a = uniform((m, k), gen, torch.bfloat16, dev)
    w = uniform((n, k), gen, torch.bfloat16, dev, k**-0.5)
    count = (
        weight_copies(w.numel() * w.element_size(), l2_bytes(dev), GRAPH_CALLS)
        if copies == "auto"
        else int(copies)
    )
    ws = [w] + [w.clone() for _ in range(count - 1)]
    o_mm = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    o_fu = torch.empty_like(o_mm)
    mm_calls = [functools.partial(torch.mm, a, x.t(), out=o_mm) for x in ws]
    fused_calls = [
        functools.partial(distgemm.gemm_all_reduce, a, x, out=o_fu, path="fused") for x in ws
    ]
    g_mm = graphed(torch, round_robin(mm_calls), GRAPH_CALLS)
    g_fu = graphed(torch, round_robin(fused_calls), GRAPH_CALLS)
    choice = [p for p in distgemm.path_choices() if p.get("m") == m and p.get("path") == "fused"]
    ctx = SingleGpuContext.current()
    mm, fu = [], []
    for r in range(ROUNDS):  # ms per replay -> us per call
        warm_s = WARMUP_S if r == 0 else REWARM_S
        mm.append(time_variant(ctx, g_mm.replay, warm_s=warm_s) * 1e3 / GRAPH_CALLS)
        fu.append(time_variant(ctx, g_fu.replay) * 1e3 / GRAPH_CALLS)
    weight_bytes = n * k * 2
    floor_us = weight_bytes / HBM_BYTES_PER_S * 1e6
    rec = dict(
        layer=name,
        m=m,
        n=n,
        k=k,
        weight_copies=count,
        mm_us=statistics.median(mm),
        fused_us=statistics.median(fu),
        floor_us=floor_us,
        kernel=_core.fused_kernel(m),
        splits=choice[-1].get("fused_splits") if choice else None,
        ctas=choice[-1].get("fused_ctas") if choice else None,
        err_vs_mm=rel_err(torch, o_fu, o_mm),
    )
    rec["ratio"] = rec["fused_us"] / rec["mm_us"]
    rec["mm_tb_s"] = weight_bytes / rec["mm_us"] / 1e6
    rec["fused_tb_s"] = weight_bytes / rec["fused_us"] / 1e6
    rec["below_floor"] = [v for v in ("mm", "fused") if rec[f"{v}_us"] < floor_us]
    return rec


# (key, title, width, format) of the printed tables
CHECK_COLUMNS = [
    ("m", "m", 4, ""),
    ("n", "n", 6, ""),
    ("k", "k", 6, ""),
    ("dtype", "dtype", 9, ""),
    ("beta", "beta", 4, ""),
    ("kernel", "kernel", 8, ""),
    ("rel_err", "rel_err", 9, ".2e"),
    ("torch_rel_err", "torch", 9, ".2e"),
    ("collective_bits", "coll=mm", 7, ""),
    ("ok", "ok", 5, ""),
]
TIME_COLUMNS = [
    ("layer", "layer", 9, ""),
    ("m", "m", 4, ""),
    ("kernel", "kernel", 8, ""),
    ("splits", "splits", 6, ""),
    ("ctas", "ctas", 5, ""),
    ("mm_us", "mm us", 8, ".1f"),
    ("fused_us", "fused us", 9, ".1f"),
    ("ratio", "ratio", 6, ".2f"),
    ("mm_tb_s", "mm TB/s", 8, ".2f"),
    ("fused_tb_s", "fused TB/s", 10, ".2f"),
    ("floor_us", "floor us", 8, ".1f"),
]


def header(columns) -> str:
    return " ".join(f"{title:>{width}}" for _, title, width, _ in columns)


def row(columns, rec: dict) -> str:
    return " ".join(
        f"{rec[key]:>{width}{fmt}}" if fmt else f"{rec[key]!s:>{width}}"
        for key, _, width, fmt in columns
    )


def parse_shape(text: str) -> tuple[int, int] | None:
    """``"NxK"`` -> (N, K); None where ``text`` is not two positive integers joined by x."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def main(argv=None) -> int:
    ap = cli.ArgumentParser("python3 -m benchmarks.decode.fused_tp1", __doc__)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--shapes", default="", help="more N x K, e.g. 4096x7168,6144x3072")
    ap.add_argument("--weight-copies", default="auto", help="auto (span the L2 cache) or a count")
    ap.add_argument("--out", default=".")
    ap.add_argument("--skip-check", action="store_true", help="timing only")
    args = ap.parse_args(argv)
    unknown = [name for name in args.layers.split(",") if name and name not in LAYERS]
    if unknown:
        ap.error(f"--layers: {unknown[0]!r} is not one of {', '.join(LAYERS)}")
    cases = [(name, LAYERS[name]) for name in args.layers.split(",") if name]
    for text in (t for t in args.shapes.split(",") if t):
        shape = parse_shape(text)
        if shape is None:
            ap.error(f"--shapes: a shape is NxK with positive N and K, not {text!r}")
        cases.append((text, shape))
    if args.weight_copies != "auto" and not (
        args.weight_copies.isdigit() and int(args.weight_copies) >= 1
    ):
        ap.error(
            f"--weight-copies must be auto or a count of at least 1, not {args.weight_copies!r}"
        )
    dev = start_world_of_one()
    result = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__}
    failed = False
    if not args.skip_check:
        result["correctness"] = check_correctness(dev)
        print(header(CHECK_COLUMNS))
        for r in result["correctness"]:
            print(row(CHECK_COLUMNS, r), flush=True)
        failed |= not all(r["ok"] for r in result["correctness"])
    gen = torch.Generator().manual_seed(11)
    result["timing"] = []
    print("\n" + header(TIME_COLUMNS) + " flags")
    for name, (n, k) in cases:
        for m in (int(x) for x in args.tokens.split(",")):
            r = time_case(dev, name, n, k, m, gen, args.weight_copies)
            result["timing"].append(r)
            flags = ""
            if r["below_floor"]:
                flags = "BELOW FLOOR (measurement bug): " + ",".join(r["below_floor"])
            if r["err_vs_mm"] > TOL:
                flags += f" err_vs_mm={r['err_vs_mm']:.2e}"
            failed |= bool(r["below_floor"]) or r["err_vs_mm"] > TOL
            print(row(TIME_COLUMNS, r) + " " + flags, flush=True)
    get_communicator().raise_launch_errors()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fused-tp1.json"), "w") as f:
        json.dump(result, f, indent=1)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
