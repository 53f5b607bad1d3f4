"""``python -m distgemm``: the main job, a distributed GEMM on the GPUs present or on the CPU.

With CUDA GPUs and the CUDA runtime built, it runs a distributed GEMM on all visible GPUs
through the C++ example binary (one process drives every GPU; verification against a
single-GPU reference, timings, overlap efficiency). Without a GPU it builds the same plan, proves
its invariants and executes it on the CPU reference executor (simulated devices, float64), at a
Llama-3-8B shape small enough for a laptop CPU; a shape that needs more memory than the machine
has available is refused before anything is allocated.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import time

from . import _core, cli
from .plan.invariants import verify_plan
from .plan.reference import execute_plan, expected_outputs, reference_inputs
from .plan.view import build_plan, schedule_names
from .simulate import describe, format_table, step_table

# Llama-3-8B gate+up projection (FC1, column parallel): N = 2 x 14336, K = 4096.
CPU_DEFAULT = dict(m=1024, n=28672, k=4096)
# Llama-3-70B FC1 at 8192 tokens on the GPUs.
GPU_DEFAULT = dict(m=8192, n=57344, k=8192)


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # torch missing or broken: no GPU path
        return 0


def _bench_binary() -> pathlib.Path | None:
    here = pathlib.Path(__file__).resolve().parent
    for cand in (here / "bin" / "distgemm_bench", shutil.which("distgemm_bench")):
        if cand and os.access(str(cand), os.X_OK):
            return pathlib.Path(cand)
    return None


def reference_bytes(plan: dict) -> int:
    """About the most memory the CPU reference executor holds at once for ``plan`` (float64):
    the global A, B, C and the devices' shards of them, every device's D and slots, and the full
    GEMM of the comparison with its temporaries."""
    p = plan["problem"]
    m, n, k, l = p["m"], p["n"], p["k"], p["l"]
    return 8 * (l * (2 * m * k + 2 * n * k + 6 * m * n) + plan["tp"] * plan["slot_elems"])


def available_bytes() -> int | None:
    """Memory available to a new allocation: MemAvailable of /proc/meminfo (Linux), else the
    physical memory; None where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def format_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if b < 1024 or unit == "PiB":
            return f"{b:.1f} {unit}"
        b /= 1024
    raise AssertionError("unreachable")


def run_cpu(args) -> int:
    shape = {d: getattr(args, d) or CPU_DEFAULT[d] for d in ("m", "n", "k")}
    too_big = cli.operand_size_problem(shape["m"], shape["n"], shape["k"])
    if too_big:
        raise ValueError(too_big)
    steps = args.steps or _core.default_steps(
        args.schedule, args.tp, shape["m"], shape["n"], shape["k"], 1
    )
    plan = build_plan(args.schedule, args.tp, steps, l=1, **shape)
    need, have = reference_bytes(plan), available_bytes()
    if have is not None and need > have:
        raise ValueError(
            f"M={shape['m']} N={shape['n']} K={shape['k']} needs about {format_bytes(need)} on "
            f"the CPU reference executor (float64), above the {format_bytes(have)} this machine "
            "has available: pick smaller --m/--n/--k"
        )
    print(
        "no CUDA GPU found: running the plan on the CPU reference executor "
        "(simulated devices, float64)\n"
    )
    print(describe(plan))
    print()
    print(format_table(plan, step_table(plan)))
    violations = verify_plan(plan)
    for v in violations:
        print(f"VIOLATION {v}")
    if violations:
        return 1
    print("\ninvariants: all hold")
    print(f"random inputs from seed {args.seed} (--seed)")
    t0 = time.perf_counter()
    inputs = reference_inputs(plan, seed=args.seed)
    got = execute_plan(plan, inputs, alpha=1.0, beta=0.0, use_bias=True)
    elapsed = time.perf_counter() - t0
    want = expected_outputs(plan, inputs, 1.0, 0.0, True)
    import numpy as np

    errs = [float(np.linalg.norm(g - w) / np.linalg.norm(w)) for g, w in zip(got, want)]
    flops = 2.0 * shape["m"] * shape["n"] * shape["k"]
    print(
        f"executed {args.tp} simulated devices x {plan['steps']} steps in {elapsed:.2f} s "
        f"({flops / elapsed / 1e9:.1f} GFLOP/s on this CPU)"
    )
    ok = all(e < 1e-9 for e in errs)
    print(
        "relative Frobenius error per device vs the full GEMM: "
        + ", ".join(f"{e:.2e}" for e in errs)
        + (" (< 1e-9: OK)" if ok else " FAILED")
    )
    return 0 if ok else 1


def run_gpu(args, gpus: int, exe: pathlib.Path) -> int:
    shape = {d: getattr(args, d) or GPU_DEFAULT[d] for d in ("m", "n", "k")}
    tp = args.tp or min(gpus, _core.MAX_TP)
    if tp > gpus:
        raise ValueError(f"--tp {tp} needs {tp} GPUs; this machine has {gpus}")
    cmd = [
        str(exe),
        "--schedule",
        args.schedule,
        "--tp",
        str(tp),
        "--steps",
        str(args.steps) if args.steps else "auto",  # auto: the library's default S
        "--m",
        str(shape["m"]),
        "--n",
        str(shape["n"]),
        "--k",
        str(shape["k"]),
        "--dtype",
        "bf16",
        # steady state on power-capped GPUs: 1 s timed windows after 1 s of warm load, for the
        # distributed GEMM and for the local GEMM it is compared with
        "--iterations",
        "auto",
    ]
    print("running:", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.ArgumentParser("python -m distgemm", __doc__)
    ap.add_argument(
        "--schedule",
        default="ag_rotate_a",
        choices=schedule_names(),
        help="the schedule (default ag_rotate_a; python -m distgemm.simulate shows any)",
    )
    ap.add_argument(
        "--tp",
        type=cli.int_in(1, _core.MAX_TP),
        default=None,
        help=f"devices, 1..{_core.MAX_TP} (default: every GPU present, or 2 simulated devices "
        "on the CPU)",
    )
    ap.add_argument(
        "--steps",
        type=cli.int_in(1, _core.MAX_STEPS),
        default=None,
        help="S, the schedule's steps: a multiple of TP (default: the library's rule, as "
        "steps=None)",
    )
    for d, what in (("m", "rows of A and D (tokens)"), ("n", "columns of D"), ("k", "reduction")):
        ap.add_argument(
            f"--{d}",
            type=cli.extent,
            default=None,
            help=f"{d.upper()}, the {what}: 1..2**31-1 (default {CPU_DEFAULT[d]} on the CPU, "
            f"Llama-3-8B FC1 at 1024 tokens; {GPU_DEFAULT[d]} on GPUs, Llama-3-70B FC1 at 8192 "
            "tokens)",
        )
    ap.add_argument(
        "--cpu", action="store_true", help="use the CPU reference executor even with GPUs"
    )
    ap.add_argument(
        "--seed",
        type=cli.int_in(0),
        default=0,
        help="seed of the CPU reference executor's random inputs (default 0)",
    )
    return ap.parse_args(argv)


@cli.quiet_on_broken_pipe
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gpus = 0 if args.cpu else _gpu_count()
    exe = _bench_binary() if gpus else None
    try:
        if gpus and exe is not None:
            return run_gpu(args, gpus, exe)
        if gpus:
            print(
                f"{gpus} GPU(s) present but distgemm was built without the CUDA runtime "
                f"({_core.cuda_runtime_reason}): falling back to the CPU reference executor",
                file=sys.stderr,
            )
        args.tp = args.tp or 2
        return run_cpu(args)
    except ValueError as e:
        print(f"python -m distgemm: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
