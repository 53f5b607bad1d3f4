"""GPU timing shared by the benchmarks: one rank's context under torchrun (or one GPU alone),
a CUDA graph of back-to-back calls, the steady-state timing of a variant, the plain NCCL +
torch.mm baseline and torch's symmetric-memory ops of one layer, and fresh random operands of a
case. torch is passed in, so
importing this needs no torch."""

from __future__ import annotations

import datetime
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.common.llama_cases import Case, shapes
from distgemm import llama3

_TIMING = llama3.sweep_timing()  # the C++ sweep times the same way
WARMUP_S = _TIMING["warmup_ms"] / 1e3  # sustained replay before a case's first timing (clocks)
REWARM_S = _TIMING["rewarm_ms"] / 1e3  # ... and before each further variant's window
TIMED_S = _TIMING["timed_ms"] / 1e3  # timed work per variant, one window ...
MIN_ITERS, MAX_ITERS = _TIMING["min_iterations"], _TIMING["max_iterations"]  # ... in these counts
ERR_TOL = 1e-2
# The dense tensor-core peaks of an H100/H200 SXM at the boost clock (TF/s) and the H200's HBM
# bandwidth: no GEMM runs faster, so a time under its floor is a measurement bug.
PEAK_TFLOPS = {"bf16": 989.0, "fp8": 1979.0}
HBM_BYTES_PER_S = 4.8e12


@dataclass
class RankContext:
    """This rank under torchrun: torch, torch.distributed, the gloo control group (agreements and
    barriers, bounded by its timeout and independent of the NCCL stream order), the device, the
    rank and the world size (TP)."""

    torch: Any
    dist: Any
    ctrl: Any
    dev: Any
    rank: int
    tp: int

    @classmethod
    def from_torchrun(cls, ctrl_timeout_s: float = 60.0) -> RankContext:
        """Bind LOCAL_RANK's GPU, start the NCCL process group and a gloo control group."""
        import torch
        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev, timeout=datetime.timedelta(seconds=60))
        timeout = datetime.timedelta(seconds=ctrl_timeout_s)
        ctrl = dist.new_group(backend="gloo", timeout=timeout)
        return cls(torch, dist, ctrl, dev, dist.get_rank(), dist.get_world_size())

    def close(self) -> None:
        """Every rank done: meet at the control group, close distgemm's communicators, end the
        process group."""
        from distgemm.runtime import communicator as dcomm

        self.dist.barrier(group=self.ctrl)
        dcomm.close_all()
        self.dist.destroy_process_group()

    def agree_max(self, values: Sequence[float]) -> list[float]:
        """Element-wise max over ranks through the control group."""
        t = self.torch.tensor(list(values), dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.ctrl)
        return t.tolist()


class _NoProcessGroup:
    """torch.distributed's barrier for a context of one GPU and no process group: nothing to
    wait for."""

    @staticmethod
    def barrier(group=None) -> None:
        return None


@dataclass
class SingleGpuContext:
    """One GPU without torch.distributed, shaped like RankContext so that settle and
    time_variant run unchanged: the agreement of one rank is its own values, the barrier is
    nothing."""

    torch: Any
    dev: Any
    rank: int = 0
    tp: int = 1
    ctrl: Any = None
    dist: Any = _NoProcessGroup

    @classmethod
    def current(cls) -> SingleGpuContext:
        """The current CUDA device of this process."""
        import torch

        return cls(torch, torch.device("cuda", torch.cuda.current_device()))

    def agree_max(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]


def enable_symm_mem(group_name: str) -> str | None:
    """Turn on torch's symmetric memory for the group; the reason when that failed (the fused
    ops are then reported unavailable per case), else None."""
    try:
        import warnings

        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated (a no-op need) in newer torch
            enable_symm_mem_for_group(group_name)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


def short_error(e: BaseException) -> str:
    """The exception's type and the first line of its message (at most 200 characters)."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def try_symm_mem(ctx: RankContext, symm, ref) -> tuple[float | None, str | None]:
    """One call of torch async-TP (``symm``) checked against ``ref``: (its relative error, None),
    or (None, why) where it failed on any rank. A failure is recorded, never fatal; the verdict
    is agreed so that no rank times a collective another skipped."""
    torch = ctx.torch
    err, why = None, None
    try:
        y = symm()
        torch.cuda.synchronize()
        err = rel_err(torch, y, ref)
        del y
    except Exception as e:  # noqa: BLE001 - symmetric memory may be unavailable here
        why = short_error(e)
    if ctx.agree_max([1.0 if why else 0.0])[0]:
        return None, why or "failed on another rank"
    return err, None


def baseline_call(torch, dist, ag: bool, a, wt, tmp, out):
    """The plain baseline of one layer: NCCL all-gather of the activations into ``tmp`` then
    the GEMM, or the GEMM into ``tmp`` then NCCL reduce-scatter of the partial sums."""
    if ag:
        dist.all_gather_into_tensor(tmp, a)
        return torch.mm(tmp, wt, out=out)
    torch.mm(a, wt, out=tmp)
    dist.reduce_scatter_tensor(out, tmp)
    return out


def symm_mem_call(torch, ag: bool, a, wt, group_name: str):
    """torch async-TP of one layer (symmetric-memory fused ops)."""
    if ag:
        return torch.ops.symm_mem.fused_all_gather_matmul(a, [wt], 0, group_name, return_A=False)[
            1
        ][0]
    return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, wt, "sum", 0, group_name)


def settle(ctx: RankContext) -> None:
    """Nothing of an earlier variant is in flight on any rank: a device synchronisation, then a
    barrier of the control group. Each timed window starts from here, so no variant's work (or
    a peer's skew) falls into another variant's window."""
    ctx.torch.cuda.synchronize()
    ctx.dist.barrier(group=ctx.ctrl)


def round_robin(calls: Sequence[Any]):
    """A callable whose i-th call runs ``calls[i % len(calls)]``: each of ``calls`` in turn (a
    graph of decode calls cycling through weight copies, so that no call reads a weight the one
    before it left in L2)."""
    state = {"i": 0}

    def call():
        calls[state["i"] % len(calls)]()
        state["i"] += 1

    return call


def graphed(torch, fn, calls: int):
    """A replay of ``calls`` back-to-back calls of ``fn`` captured in a CUDA graph (fn reads the
    current stream when called, so it lands on the capture stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # first call off the capture: library handles and workspaces exist before it
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def time_variant(ctx: RankContext, fn, warm_s: float = REWARM_S) -> float:
    """Steady-state time of one variant (ms): settle, replay ``fn`` for at least ``warm_s``
    (power-capped clocks settle to this variant's load), then one timed window of at least
    TIMED_S with CUDA events around every call; the per-call maximum over ranks, median.
    Every rank makes the same number of calls (agreed via the control group), since most
    variants are collectives."""
    torch = ctx.torch
    settle(ctx)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(3):
        fn()
    e.record()
    torch.cuda.synchronize()
    per_call_ms = max(ctx.agree_max([s.elapsed_time(e) / 3])[0], 1e-3)
    # Warm-up by time: chunks of ~0.1 s until every rank has replayed >= warm_s (the count per
    # chunk is the same on every rank; the stop decision is agreed after each chunk).
    chunk = min(2000, max(2, math.ceil(100.0 / per_call_ms)))
    warmed_ms = 0.0
    for _ in range(max(1, math.ceil(warm_s * 20))):  # bounded: chunks of >= 2 calls, ~0.1 s each
        s.record()
        for _ in range(chunk):
            fn()
        e.record()
        torch.cuda.synchronize()
        warmed_ms += s.elapsed_time(e)
        if ctx.agree_max([0.0 if warmed_ms >= warm_s * 1e3 else 1.0])[0] == 0.0:
            break
    per_call_ms = max(ctx.agree_max([s.elapsed_time(e) / chunk])[0], 1e-3)
    iters = min(MAX_ITERS, max(MIN_ITERS, math.ceil(TIMED_S * 1e3 / per_call_ms)))
    ev = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(iters)
    ]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    per_iter = ctx.agree_max([a.elapsed_time(b) for a, b in ev])
    return statistics.median(per_iter)


def time_around(ctx: RankContext, outer, inner) -> tuple[float, float, float]:
    """``outer``, ``inner``, then ``outer`` again, each by time_variant (A B A): (outer's first
    window, inner, outer's second window), in ms. A ratio of the two uses the mean of outer's
    windows, so that a linear clock drift under the power cap hits both sides alike."""
    before = time_variant(ctx, outer)
    middle = time_variant(ctx, inner)
    return before, middle, time_variant(ctx, outer)


def rel_err(torch, x, ref) -> float:
    x, ref = x.float(), ref.float()
    if not bool(torch.isfinite(x).all()):
        return float("nan")
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


@dataclass
class LayerOperands:
    """One rank's operands of a case: fresh random bf16 (never zeros: zeros run faster on these
    GPUs), the weight scaled by 1/sqrt(K); `gen` continues the same stream for further inputs."""

    ag: bool  # all-gather layer (else reduce-scatter)
    a: Any
    w: Any
    wt: Any  # [K_rank, N_rank] view of w for the torch ops (B of A @ B)
    tmp: Any  # the baseline's gathered A or partial D
    out: Any  # the baseline's output
    gen: Any


def layer_operands(torch, dev, case: Case, seed: int) -> LayerOperands:
    s = shapes(case)
    bf = torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(seed)
    a = torch.randn(s["a"], device=dev, dtype=bf, generator=gen)
    w = torch.randn(s["w"], device=dev, dtype=bf, generator=gen) / math.sqrt(s["w"][1])
    ag = s["collective"] == "all_gather"
    tmp = torch.empty(s["full_a"] if ag else s["partial"], device=dev, dtype=bf)
    out = torch.empty(s["out"], device=dev, dtype=bf)
    return LayerOperands(ag, a, w, w.t(), tmp, out, gen)
