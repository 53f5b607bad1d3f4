"""GPU checks of the communicator's one workspace, one process per GPU:

    torchrun --nproc-per-node 2 tests/gpu/workspace_worker.py --out results.json
    DISTGEMM_ALLOW_SHARED_GPU=1 torchrun --nproc-per-node 2 tests/gpu/workspace_worker.py ...

Started by tests/gpu/test_workspace.py. Sections, run by every rank in the same order:

  grow_once  one growth at a time, each case on a fresh Communicator: an overlapped
           gemm_reduce_scatter at M = 2048, then at M = 8192 (its plan grows the workspace), then
           at M = 2048 again (a plan re-pointed at the grown workspace); first with nothing else
           held, then with a fused op, then with an overlapped op, captured in a caller's CUDA
           graph (which pins the old workspace). Each rank records its own outcome per call (a
           timeout is caught, and the ranks agree before any collective reference, so one
           failure never desynchronises them)
  growth   the serving loop: 96 token counts (64..6144), an all_gather_gemm (ag_rotate_a) and a
           gemm_reduce_scatter (rs_tile_a) each, K = 4096, N = 8192, path="overlap". What
           distgemm holds afterwards (memory_stats, and device memory in use after
           torch.cuda.empty_cache()) against the largest plan's layout; results checked along
           the way and again for the first shapes after the workspace grew past them (their
           plans were re-pointed and their graphs rebuilt)
  streams  the same communicator from two streams: ops alternating between the streams with no
           host synchronisation, of several shapes (one grows the workspace mid-way), a plan
           launched from both streams, return_gathered on the other stream; every result checked

With DISTGEMM_ALLOW_SHARED_GPU=1 (tests/gpu/test_workspace.py on a one-GPU machine) 2 ranks share
GPU 0 over a gloo group; the device-memory check is left out (the device's memory in use counts
both ranks' allocations), recorded as skipped with the reason.

Exit code 0 when every check passed on every rank. Rank 0 writes every result to --out (JSON).
"""

from __future__ import annotations

import traceback

import torch
import torch.distributed as dist
from torchrun_worker import (
    communicator,
    gather0,
    left_out_when_shared,
    record,
    reduce_scatter0,
    rel_err,
    same_on_all_ranks,
    worker_main,
)

import distgemm
from distgemm import _core, ops
from distgemm.runtime import entry_cache as entries
from distgemm.runtime.paths.overlapped import GRAPHS_PER_PLAN
from distgemm.runtime.workspace import GROWTH_HEADROOM

K, N = 4096, 8192
TOKENS = range(64, 6145, 64)
TOLERANCE = 1e-2  # relative Frobenius error of bf16 results against fp32
MIB = 2**20
# Device memory a graph may hold beyond the workspace (its nodes' parameters, the error word,
# two streams), and what the CUDA runtime may add while the loop runs (lazily loaded kernels).
GRAPH_ALLOWANCE = 2 * MIB
RUNTIME_SLACK = 256 * MIB

SHARED_MEMORY_WHY = (
    "the device's memory in use counts both ranks' allocations when they share one GPU"
)


def used_bytes(dev) -> int:
    free, total = torch.cuda.mem_get_info(dev)
    return total - free


class Layer:
    """The inputs of one op at one token count, seeded per rank, and its fp32 reference."""

    def __init__(self, op: str, m: int, dev, seed: int, group=None):
        tp, r = dist.get_world_size(), dist.get_rank()
        gen = torch.Generator(device=dev).manual_seed(seed * 8 + r)
        self.op, self.group = op, group
        if op == "all_gather_gemm":
            a_shape, w_shape = (m // tp, K), (N // tp, K)
        else:
            a_shape, w_shape = (m, K // tp), (N, K // tp)
        self.a = torch.randn(a_shape, device=dev, generator=gen).to(torch.bfloat16)
        self.w = (torch.randn(w_shape, device=dev, generator=gen) / 64).to(torch.bfloat16)

    def reference(self) -> torch.Tensor:
        if self.op == "all_gather_gemm":
            return gather0(self.a.float()) @ self.w.float().t()
        return reduce_scatter0(self.a.float() @ self.w.float().t())

    def __call__(self, **kw):
        return getattr(ops, self.op)(self.a, self.w, path="overlap", group=self.group, **kw)


def plan_bytes(op: str, m: int, tp: int) -> int:
    """The layout total of the plan the op builds at m tokens (default steps), from C++."""
    schedule = "ag_rotate_a" if op == "all_gather_gemm" else "rs_tile_a"
    steps = _core.default_steps(schedule, tp, m, N, K)
    return _core.build_plan(schedule, tp, steps, m, N, K, 1).layout(2)["total_bytes"]


def test_growth(dev) -> None:
    tp = dist.get_world_size()
    opnames = ("all_gather_gemm", "gemm_reduce_scatter")
    for op in opnames:  # the communicator, the kernels, NCCL, cuBLAS, torch's allocations
        layer = Layer(op, TOKENS[0], dev, 0)
        rel_err(layer(), layer.reference())
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before, used0 = distgemm.memory_stats(), used_bytes(dev)
    worst, made_at = 0.0, {}
    for i, m in enumerate(TOKENS):
        for op in opnames:
            layer = Layer(op, m, dev, i)
            out = layer()
            made_at[(op, m)] = (i, distgemm.memory_stats()["workspace_allocations"])
            if i % 12 == 0:
                worst = max(worst, rel_err(out, layer.reference()))
            del out, layer
    torch.cuda.synchronize()
    after = distgemm.memory_stats()
    largest = max(plan_bytes(op, m, tp) for m in TOKENS for op in opnames)
    # Plans still cached (the last MAX_PLANS) that were made before the last growth: they were
    # re-pointed at the grown workspace and their graphs are rebuilt at this call.
    cached = list(made_at.items())[-entries.MAX_PLANS :]
    repointed = [k for k, (i, n) in cached if n < after["workspace_allocations"]][:6]
    worst_again = 0.0
    for op, m in repointed:
        layer = Layer(op, m, dev, made_at[(op, m)][0])
        worst_again = max(worst_again, rel_err(layer(), layer.reference()))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    used1, final = used_bytes(dev), distgemm.memory_stats()
    graphs = final["eager_graphs"] + final["captured_graphs"]
    allowed = final["workspace_bytes"] + graphs * GRAPH_ALLOWANCE + RUNTIME_SLACK
    numbers = dict(
        before=before,
        after=after,
        final=final,
        largest_layout_bytes=largest,
        device_used_delta_mib=(used1 - used0) / MIB,
        allowed_delta_mib=allowed / MIB,
        worst_rel_err=worst,
        repointed=repointed,
        worst_rel_err_repointed=worst_again,
    )
    record(
        "growth/results",
        worst < TOLERANCE and worst_again < TOLERANCE and len(repointed) > 0,
        **numbers,
    )
    record(
        "growth/workspace_within_headroom_of_largest_plan",
        after["largest_plan_bytes"] == largest
        and after["workspace_bytes"] <= largest * (1 + GROWTH_HEADROOM)
        and after["kept_bytes"] == 0,
        **numbers,
    )
    record(
        "growth/graphs_bounded",
        after["plans"] <= entries.MAX_PLANS
        and after["eager_graphs"] <= after["plans"] * GRAPHS_PER_PLAN,
        **numbers,
    )
    if not left_out_when_shared("growth/device_memory", SHARED_MEMORY_WHY):
        record("growth/device_memory", used1 - used0 <= allowed, **numbers)


def test_streams(dev) -> None:
    """On a fresh communicator, so that a bigger plan grows its workspace between launches
    issued on the two streams."""
    with communicator() as comm:
        run_two_streams(dev, comm)


def run_two_streams(dev, comm) -> None:
    tp = dist.get_world_size()
    side = [torch.cuda.Stream(dev), torch.cuda.Stream(dev)]
    # Shapes that share the workspace, then a bigger one that grows it mid-way (index 14).
    cases = [("all_gather_gemm", 256 * tp), ("gemm_reduce_scatter", 512 * tp)] * 7
    cases += [("all_gather_gemm", 8192), ("gemm_reduce_scatter", 1024 * tp)] * 3
    layers = [Layer(op, m, dev, 100 + i, comm) for i, (op, m) in enumerate(cases)]
    wants = [x.reference() for x in layers]
    gather_layer = Layer("all_gather_gemm", 384 * tp, dev, 99, comm)
    gather_want = gather0(gather_layer.a)
    torch.cuda.synchronize()
    for s in side:
        s.wait_stream(torch.cuda.current_stream())
    outs = []
    for rnd in range(3):  # no host synchronisation between ops
        for i, layer in enumerate(layers):
            with torch.cuda.stream(side[(i + rnd) % 2]):
                outs.append((i, layer()))
        with torch.cuda.stream(side[rnd % 2]):
            outs.append((-1, gather_layer(return_gathered=True)))
    for s in side:
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    worst, gathered_equal = 0.0, True
    for i, out in outs:
        if i < 0:
            gathered_equal &= bool(torch.equal(out[1], gather_want))
        else:
            worst = max(worst, rel_err(out, wants[i]))
    comm.raise_launch_errors()  # no launch timed out
    stats = distgemm.memory_stats(comm)
    record(
        "streams/results",
        worst < TOLERANCE and gathered_equal and stats["workspace_allocations"] >= 2,
        worst_rel_err=worst,
        gathered_equal=gathered_equal,
        launches=len(outs),
        stats=stats,
    )


GROW_ONCE_TOKENS = (2048, 8192, 2048)


def _captured(dev, comm, op: str):
    """A caller's CUDA graph holding one op of `op` ("fused" or "overlap") on `comm`: it pins
    the workspace the op ran on. A reduce-scatter layer's operands serve the fused all-reduce
    too (both take a [m, K/tp] and w [N, K/tp])."""
    layer = Layer("gemm_reduce_scatter", 256 if op == "overlap" else 16, dev, 99, group=comm)
    if op == "overlap":
        out = layer()
        call = lambda: layer(out=out)  # noqa: E731
    else:
        out = distgemm.gemm_all_reduce(layer.a, layer.w, path="fused", group=comm)
        call = lambda: distgemm.gemm_all_reduce(  # noqa: E731
            layer.a, layer.w, out=out, path="fused", group=comm
        )
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def test_grow_once(dev):
    for case in ("alone", "fused_captured", "overlap_captured"):
        comm = communicator(timeout_s=120.0, wait_timeout_s=30.0)
        graph = None if case == "alone" else _captured(dev, comm, case.split("_")[0])
        for i, m in enumerate(GROW_ONCE_TOKENS):
            layer = Layer("gemm_reduce_scatter", m, dev, i, group=comm)
            before = comm.memory_stats()["workspace_allocations"]
            error = None
            try:
                z = layer()
                torch.cuda.synchronize()
                comm.raise_launch_errors()
            except RuntimeError:
                error = traceback.format_exc()[-1500:]
            grew = comm.memory_stats()["workspace_allocations"] > before
            name = f"grow_once/{case}/{i}_m{m}"
            # The ranks agree first: the reference is a collective that a failed rank skips.
            if not all(same_on_all_ranks(error is None)):
                record(name, False, m=m, grew=grew, error=error or "a peer failed")
                break
            err = rel_err(z, layer.reference())
            record(name, err < TOLERANCE, m=m, grew=grew, rel_err=err)
        del graph
        comm.close()


def main() -> None:
    worker_main(
        "workspace_results.json",
        lambda dev, args: {
            "grow_once": lambda: test_grow_once(dev),
            "growth": lambda: test_growth(dev),
            "streams": lambda: test_streams(dev),
        },
        init_timeout_s=300.0,
        inference=True,
    )


if __name__ == "__main__":
    main()
