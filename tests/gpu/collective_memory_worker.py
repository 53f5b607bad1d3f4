"""GPU checks of the collective path's scratch (one buffer per communicator and stream), per GPU:

    torchrun --nproc-per-node 4 tests/gpu/collective_memory_worker.py --out results.json

Started by tests/gpu/test_collective_memory.py. Sections, run by every rank in the same order:

  loop     issue 41's serving loop with path="collective": 96 token counts (64..6144 in steps of
           64), an all_gather_gemm (ag_rotate_a) and a gemm_reduce_scatter (rs_tile_a) each,
           K = 4096, N = 3072 (global), bf16, every output freed. Afterwards torch's allocated
           memory grew by exactly the scratch distgemm reports (memory_stats' collective_bytes),
           which is at most the largest call's scratch + SCRATCH_HEADROOM, also at every call on
           the way; results right along the way and for smaller shapes after the growth
  regions  rs_tile_b (two regions in one call: the partial D^T and its reduced rows) at rising and
           falling sizes: results right
  streams  the loop's ops on a second stream: a buffer of its own (collective_buffers 2), results
           right on both streams

The collective path runs NCCL: where the ranks share one GPU (gloo) every section is left out,
recorded as skipped with the reason. Exit code 0 when every check passed on every rank; rank 0
writes every result to --out (JSON).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torchrun_worker import (
    NEEDS_NCCL,
    communicator,
    gather0,
    left_out_when_shared,
    record,
    reduce_scatter0,
    reference,
    rel_err,
    worker_main,
)

import distgemm
from distgemm.runtime.paths.collective import SCRATCH_HEADROOM

K, N = 4096, 3072  # global, as in issue 41
TOKENS = range(64, 6145, 64)
TOLERANCE = 1e-2  # relative Frobenius error of bf16 results against fp32
BF16 = torch.bfloat16


class Operands:
    """Seeded inputs of the largest token count, per rank; a call at m tokens reads their first
    rows (contiguous slices)."""

    def __init__(self, dev, seed: int):
        tp, r = dist.get_world_size(), dist.get_rank()
        gen = torch.Generator(device=dev).manual_seed(seed * 8 + r)
        m = TOKENS[-1]

        def randn(*shape, scale=1.0):
            return (torch.randn(shape, device=dev, generator=gen) * scale).to(BF16)

        self.a_ag, self.w_ag = randn(m // tp, K), randn(N // tp, K, scale=1 / 64)
        self.a_rs, self.w_rs = randn(m, K // tp), randn(N, K // tp, scale=1 / 64)

    def calls(self, m: int, group) -> list:
        """The loop's two ops at m tokens: [(op, output, its fp32 reference as a thunk)]."""
        tp = dist.get_world_size()
        a, w = self.a_ag[: m // tp], self.w_ag
        ag = distgemm.all_gather_gemm(a, w, path="collective", group=group)
        ag_want = lambda a=a, w=w: gather0(a.float()) @ w.float().t()  # noqa: E731
        a, w = self.a_rs[:m], self.w_rs
        rs = distgemm.gemm_reduce_scatter(a, w, path="collective", group=group)
        rs_want = lambda a=a, w=w: reduce_scatter0(a.float() @ w.float().t())  # noqa: E731
        return [("all_gather_gemm", ag, ag_want), ("gemm_reduce_scatter", rs, rs_want)]


def settled_allocated(dev, expected: int | None = None) -> int:
    """torch's allocated bytes on ``dev`` once the device is synchronised and, where the process
    group keeps a finished collective's tensors until its watchdog sees it complete (torch
    versions whose blocking collectives stash them), once those are released: polled up to 5 s
    until it is ``expected`` (None: until two reads 0.25 s apart agree), then the last value
    (a check on it fails with it)."""
    torch.cuda.synchronize(dev)
    deadline = time.monotonic() + 5.0
    got = torch.cuda.memory_allocated(dev)
    while time.monotonic() < deadline:
        if expected is not None and got == expected:
            break
        time.sleep(0.05 if expected is not None else 0.25)
        last, got = got, torch.cuda.memory_allocated(dev)
        if expected is None and got == last:
            break
    return got


def largest_scratch() -> int:
    """The scratch bytes of the loop's largest call: the gathered [M, K] of the all-gather or the
    partial [M, N] of the reduce-scatter, bf16 (multiples of the scratch's alignment)."""
    return TOKENS[-1] * max(K, N) * BF16.itemsize


def test_loop(dev) -> None:
    if left_out_when_shared("loop", NEEDS_NCCL):
        return
    ops = Operands(dev, 41)
    # Warm-up on a communicator closed afterwards: the process group's NCCL setup and torch's
    # cuBLAS workspace of this stream, which stay; its scratch goes with it.
    with communicator() as warm:
        warm_results = ops.calls(TOKENS[0], warm)
        del warm_results
    allocated0 = settled_allocated(dev)
    comm = communicator()
    largest = largest_scratch()
    worst_ratio, worst_err = 0.0, 0.0
    for i, m in enumerate(TOKENS):
        results = ops.calls(m, comm)
        if i % 12 == 0 or m == TOKENS[-1]:
            worst_err = max([worst_err] + [rel_err(y, want()) for _, y, want in results])
        del results  # the outputs
        held = distgemm.memory_stats(comm)["collective_bytes"]
        worst_ratio = max(worst_ratio, held / largest)
    # Smaller shapes after the growth: views at the start of the grown buffer.
    worst_again = 0.0
    for m in (64, 1024, 3008):
        results = ops.calls(m, comm)
        worst_again = max([worst_again] + [rel_err(y, want()) for _, y, want in results])
        del results
    stats = distgemm.memory_stats(comm)
    grown = settled_allocated(dev, allocated0 + stats["collective_bytes"]) - allocated0
    numbers = dict(
        stats=stats,
        largest_call_scratch_bytes=largest,
        torch_allocated_growth_bytes=grown,
        worst_held_over_largest=worst_ratio,
        worst_rel_err=worst_err,
        worst_rel_err_smaller_after_growth=worst_again,
    )
    bound = largest * (1 + SCRATCH_HEADROOM)
    record(
        "loop/scratch_within_headroom_of_largest_call",
        stats["collective_bytes"] <= bound
        and worst_ratio <= 1 + SCRATCH_HEADROOM
        and stats["collective_buffers"] == 1
        and 1 < stats["collective_allocations"] < len(TOKENS),
        **numbers,
    )
    # Nothing else stays: no per-plan buffer, no output (torch's allocated memory).
    record(
        "loop/torch_memory_is_the_scratch",
        grown == stats["collective_bytes"] and grown <= bound,
        **numbers,
    )
    record("loop/results", worst_err < TOLERANCE and worst_again < TOLERANCE, **numbers)
    comm.close()
    after_close = settled_allocated(dev, allocated0) - allocated0
    record("loop/close_frees_the_scratch", after_close == 0, after_close_bytes=after_close)


def test_regions(dev) -> None:
    """rs_tile_b: D^T's partial and this rank's reduced rows are two regions of one call."""
    if left_out_when_shared("regions", NEEDS_NCCL):
        return
    tp, r = dist.get_world_size(), dist.get_rank()
    gen = torch.Generator(device=dev).manual_seed(77 + r)
    worst = 0.0
    with communicator() as comm:
        for m in (96, 1000, 4096, 200, 2048):
            a = torch.randn(m, K // tp, device=dev, generator=gen).to(BF16)
            w = (torch.randn(N, K // tp, device=dev, generator=gen) / 64).to(BF16)
            y = distgemm.gemm_reduce_scatter(
                a, w, schedule="rs_tile_b", path="collective", group=comm
            )
            want, _ = reference("rs_tile_b", a, w, None, None, 0.0, BF16)
            worst = max(worst, rel_err(y, want))
        stats = distgemm.memory_stats(comm)
    record("regions/rs_tile_b", worst < TOLERANCE, worst_rel_err=worst, stats=stats)


def test_streams(dev) -> None:
    if left_out_when_shared("streams", NEEDS_NCCL):
        return
    ops = Operands(dev, 43)
    side = torch.cuda.Stream(dev)
    worst = 0.0
    with communicator() as comm:
        results = []
        for m in (512, 2048, 1024):
            results += ops.calls(m, comm)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                results += ops.calls(m, comm)
            torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        for _, y, want in results:
            worst = max(worst, rel_err(y, want()))
        stats = distgemm.memory_stats(comm)
    record(
        "streams/own_buffer_and_right",
        worst < TOLERANCE and stats["collective_buffers"] == 2,
        worst_rel_err=worst,
        stats=stats,
    )


def main() -> None:
    worker_main(
        "collective_memory_results.json",
        lambda dev, args: {
            "loop": lambda: test_loop(dev),
            "regions": lambda: test_regions(dev),
            "streams": lambda: test_streams(dev),
        },
        init_timeout_s=300.0,
        inference=True,
    )


if __name__ == "__main__":
    main()
