"""GPU checks of distgemm's one-shot / two-shot all-reduce kernels, flag, LL and pull
(runtime/allreduce.py), one process per GPU:

    torchrun --nproc-per-node 4 tests/gpu/allreduce_kernel_worker.py --out results.json

Started by tests/gpu/test_allreduce_kernel.py. Sections, run by every rank in the same order
(inputs seeded uniform in [-1, 1), different per rank):

  correctness  every algorithm (one_shot, two_shot, one_shot_ll, two_shot_ll, two_shot_pull),
               bf16 and fp16, numel from 8 to 4M (multiples of tp * 8 and not: two_shot chunks
               that are short or empty on the last ranks), in place and out of place (and for
               two_shot_pull, the input written into its region, all_reduce_input, as the
               collective path's GEMM writes it): the output bitwise
               equal to torch's float32 sum over ranks 0..tp-1 in that order rounded to the
               dtype (what the kernel computes), within 1 ulp relative (finfo.eps * |ref| +
               1e-6) of the float64 sum, bitwise equal on every rank; an out-of-place call
               leaves its input as it was
  interleaved  calls of mixed sizes and all five algorithms back to back without synchronising
               (large, small, large: each launch's parity apart from the previous one's,
               whatever their sizes and algorithms; LL lines left by a larger call two launches
               earlier at the same parity must not pass for this launch's), every output checked
               afterwards
  capture      several calls captured in one CUDA graph (in place and out of place, all five
               algorithms, mixed sizes), replayed REPLAYS times with fresh inputs copied in
               before each replay and an eager call between replays (each algorithm in turn),
               every output checked; then captured two_shot_pull calls into outputs the graph
               allocates and one the caller made, each rank storing its sums into every rank's
               output (every call must share its output), checked over REPLAYS replays
  chained      torch.mm into the all-reduce's input, then the all-reduce (mm_then_all_reduce,
               the collective path's pair) chained by programmatic dependent launch and not,
               every algorithm, captured in one CUDA graph and replayed with fresh activations:
               each output bitwise the ordered float32 sum of the ranks' torch.mm outputs (a
               chained launch that read its input before the GEMM ended would miss it), both
               launches the same bits
  timeout      rank tp-1 skips a call: the other ranks' launch ends after wait_timeout_s with
               RuntimeError naming the all-reduce and rank tp-1, at the next call and at
               raise_launch_errors(); nobody hangs (each algorithm on a communicator of its own;
               at the size used every rank's chunk is long enough for every CTA to own some of
               it, so every CTA waits for rank tp-1's piece before any chunk sum)

Exit code 0 when every check passed on every rank. Rank 0 writes every result to --out (JSON).
"""

from __future__ import annotations

import hashlib
import time

import torch
import torch.distributed as dist
from torchrun_worker import (
    communicator,
    gather0,
    rank,
    record,
    runtime_errors,
    same_on_all_ranks,
    worker_main,
)

from distgemm.runtime import communicator as dcomm
from distgemm.runtime.allreduce import (
    AllReduceResources,
    all_reduce_input,
    mm_then_all_reduce,
    run_all_reduce,
)

ALGOS = ("one_shot", "two_shot", "one_shot_ll", "two_shot_ll", "two_shot_pull")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
M = 1024 * 1024
CHAIN_SHAPE = (64, 8192, 4096)  # the chained pair's GEMM: m, k, n (tens of microseconds)


def numels(tp: int) -> list[int]:
    """8 .. 4M elements: multiples of tp * 8 and sizes whose two_shot chunks are short or empty
    on the last ranks."""
    edge = [8, 24, 8 * tp, 8 * tp + 8, 8 * tp * 3 - 8, 1000, 4096, 8 * 1024 + 8]
    return sorted(set(edge + [65536 + 24, M, M + 24, 4 * M - 8 * tp - 8, 4 * M]))


def uniform(numel: int, dtype, dev, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=dev).manual_seed(seed * 16 + rank())
    return (torch.rand(numel, device=dev, generator=gen) * 2 - 1).to(dtype)


def references(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the float32 sum over ranks 0..tp-1 in order rounded to x's dtype, the float64 sum)."""
    parts = gather0(x.view(1, -1))
    acc = torch.zeros(x.numel(), dtype=torch.float32, device=x.device)
    for q in range(parts.shape[0]):
        acc += parts[q].float()
    return acc.to(x.dtype), parts.double().sum(0)


def digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.view(torch.int16).cpu().numpy().tobytes()).hexdigest()


class Verdict:
    """One result's checks: bitwise to the ordered float32 reference, within 1 ulp of the float64
    sum, the same bits on every rank (compared when recorded)."""

    def __init__(self):
        self.bad, self.worst_ulps, self.digests, self.calls = [], 0.0, [], 0

    def check(self, what: str, out: torch.Tensor, want: torch.Tensor, exact: torch.Tensor):
        self.calls += 1
        eps = torch.finfo(out.dtype).eps
        diff = (out.double() - exact).abs()
        bound = eps * exact.abs() + 1e-6
        self.worst_ulps = max(self.worst_ulps, float((diff / (eps * exact.abs() + 1e-6)).max()))
        if not torch.equal(out.view(torch.int16), want.view(torch.int16)):
            mism = int((out.view(torch.int16) != want.view(torch.int16)).sum())
            self.bad.append(f"{what}: {mism} elements differ from the ordered float32 sum")
        if bool((diff > bound).any()):
            self.bad.append(f"{what}: beyond 1 ulp of the float64 sum")
        self.digests.append(digest(out))

    def record(self, name: str, **numbers):
        everyone = same_on_all_ranks(self.digests)
        same = all(d == everyone[0] for d in everyone)
        record(
            name,
            not self.bad and same and self.calls > 0,
            calls=self.calls,
            failures=self.bad[:10],
            bitwise_same_on_every_rank=same,
            worst_diff_in_ulps=self.worst_ulps,
            **numbers,
        )


def test_correctness(dev, comm):
    tp = dist.get_world_size()
    sizes = numels(tp)
    for algo in ALGOS:
        for dname, dtype in DTYPES.items():
            v = Verdict()
            for i, numel in enumerate(sizes):
                x = uniform(numel, dtype, dev, seed=i)
                want, exact = references(x)
                y = x.clone()
                run_all_reduce(comm, y, algo, False)
                out = torch.full_like(x, float("nan"))
                run_all_reduce(comm, x, algo, False, out=out)
                torch.cuda.synchronize()
                v.check(f"{numel} in place", y, want, exact)
                v.check(f"{numel} out of place", out, want, exact)
                if algo == "two_shot_pull":  # the input written where the peers read it
                    region = all_reduce_input(comm, algo, x, False)
                    region.copy_(x)
                    into = torch.full_like(x, float("nan"))
                    run_all_reduce(comm, region, algo, False, out=into)
                    torch.cuda.synchronize()
                    v.check(f"{numel} from its input region", into, want, exact)
                x_again = uniform(numel, dtype, dev, seed=i)
                if not torch.equal(x.view(torch.int16), x_again.view(torch.int16)):
                    v.bad.append(f"{numel}: out of place changed the input")
            comm.raise_launch_errors()
            v.record(f"correctness/{algo}/{dname}", numels=sizes)
    stats = comm.memory_stats()
    record(
        "correctness/memory_reported",
        stats["allreduce_control_bytes"] > 0 and stats["allreduce_receive_bytes"] > 0,
        **{k: v for k, v in stats.items() if k.startswith("allreduce")},
    )


def test_interleaved(dev, comm):
    plan = [
        ("one_shot", 4 * M),
        ("one_shot", 8),
        ("two_shot", 4 * M),
        ("two_shot", 24),
        ("one_shot", M + 24),
        ("two_shot", 8),
        ("two_shot", 4 * M - 8),
        ("one_shot", 4 * M),
        # LL: a large call, then smaller ones and the other LL algorithm over its lines
        ("one_shot_ll", 4 * M),
        ("one_shot_ll", 8),
        ("two_shot_ll", 4 * M),
        ("one_shot_ll", 24),
        ("two_shot_ll", M + 24),
        ("one_shot", 4096),
        ("two_shot_ll", 8),
        ("one_shot_ll", M),
        ("two_shot", 4096),
        ("two_shot_ll", 4 * M - 8),
        ("one_shot_ll", 4 * M),
        ("two_shot_ll", 24),
        # pull: its own region, the flags shared with two_shot's
        ("two_shot_pull", 4 * M),
        ("two_shot", 4 * M),
        ("two_shot_pull", 24),
        ("two_shot_pull", M + 24),
        ("one_shot_ll", 8),
        ("two_shot_pull", 8),
        ("two_shot_pull", 4 * M - 8),
    ]
    for dname, dtype in DTYPES.items():
        v = Verdict()
        calls = []
        for i, (algo, numel) in enumerate(plan):
            x = uniform(numel, dtype, dev, seed=100 + i)
            calls.append((algo, numel, x, references(x)))
        torch.cuda.synchronize()
        dist.barrier()
        outs = []
        for algo, _, x, _ in calls:  # back to back, no synchronisation
            y = x.clone()
            outs.append(run_all_reduce(comm, y, algo, False))
        torch.cuda.synchronize()
        for (algo, numel, _, (want, exact)), out in zip(calls, outs):
            v.check(f"{algo} {numel}", out, want, exact)
        comm.raise_launch_errors()
        v.record(f"interleaved/{dname}", plan=plan)


def test_capture(dev, comm, replays: int):
    dtype = torch.bfloat16
    # (algorithm, numel, in place)
    calls = [
        ("one_shot", 4096, True),
        ("two_shot", M + 24, False),
        ("one_shot_ll", 4096, False),
        ("one_shot", M, False),
        ("two_shot_ll", M + 24, True),
        ("two_shot", 24, True),
        ("one_shot_ll", M, True),
        ("two_shot", 4 * M, True),
        ("two_shot_ll", 24, False),
        ("two_shot_pull", M + 24, False),
        ("two_shot_pull", 4096, True),
    ]
    srcs = [torch.empty(n, device=dev, dtype=dtype) for _, n, _ in calls]
    outs = [s if inplace else torch.empty_like(s) for s, (_, _, inplace) in zip(srcs, calls)]
    for s, (algo, _, _), o in zip(srcs, calls, outs):  # eager first: the buffers exist
        s.uniform_(-1, 1)
        run_all_reduce(comm, s, algo, False, out=o)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for s, (algo, _, _), o in zip(srcs, calls, outs):
            run_all_reduce(comm, s, algo, True, out=o)
    v = Verdict()
    eager = uniform(8 * 1024, dtype, dev, seed=999)
    eager_want, eager_exact = references(eager)
    for r in range(replays):
        fresh = [
            uniform(n, dtype, dev, seed=1000 + 10 * r + j) for j, (_, n, _) in enumerate(calls)
        ]
        refs = [references(x) for x in fresh]
        for s, x in zip(srcs, fresh):
            s.copy_(x)
        g.replay()
        y = eager.clone()
        run_all_reduce(comm, y, ALGOS[r % len(ALGOS)], False)
        torch.cuda.synchronize()
        for j, (o, (want, exact)) in enumerate(zip(outs, refs)):
            v.check(f"replay {r} call {j}", o, want, exact)
        v.check(f"eager after replay {r}", y, eager_want, eager_exact)
    torch.cuda.synchronize()
    comm.raise_launch_errors()
    v.record("capture/replays", replays=replays, calls_per_graph=len(calls))
    test_shared_outputs(dev, comm, replays)


def test_shared_outputs(dev, comm, replays: int):
    """Captured two_shot_pull calls whose outputs the graph allocates (a server's pattern: the
    graph's private pool) or the caller made: every rank stores its chunk's sum into every
    rank's output (AllReduceResources.shared_output), checked over replays."""
    dtype, res = torch.bfloat16, AllReduceResources.of(comm)
    sizes = (M + 24, 8, 4 * M - 8)
    srcs = [torch.empty(n, device=dev, dtype=dtype) for n in sizes]
    made = torch.empty(sizes[0], device=dev, dtype=dtype)
    before = res.outputs_shared
    for s in srcs:
        s.uniform_(-1, 1)
        run_all_reduce(comm, s, "two_shot_pull", False, out=torch.empty_like(s))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [
            run_all_reduce(comm, s, "two_shot_pull", True, out=torch.empty_like(s)) for s in srcs
        ]
        x = all_reduce_input(comm, "two_shot_pull", srcs[0], True)  # the input in the region
        x.copy_(srcs[0])
        outs.append(run_all_reduce(comm, x, "two_shot_pull", True, out=made))
    shared = res.outputs_shared - before
    v = Verdict()
    for r in range(replays):
        fresh = [uniform(n, dtype, dev, seed=5000 + 10 * r + j) for j, n in enumerate(sizes)]
        refs = [references(f) for f in fresh] + [references(fresh[0])]
        for s, f in zip(srcs, fresh):
            s.copy_(f)
        g.replay()
        torch.cuda.synchronize()
        for j, (o, (want, exact)) in enumerate(zip(outs, refs)):
            v.check(f"replay {r} call {j}", o, want, exact)
    comm.raise_launch_errors()
    if shared != len(outs):
        v.bad.append(
            f"{shared} of {len(outs)} captured calls shared their outputs: {res.copy_reason}"
        )
    v.record("capture/shared_outputs", replays=replays, shared=shared, captured=len(outs))


def test_chained(dev, comm, replays: int):
    """The collective path's pair, chained and not, captured: a GEMM long enough (m x k x n =
    CHAIN_SHAPE) that an all-reduce reading its input before the GEMM ended would see last
    replay's values."""
    m, k, n = CHAIN_SHAPE
    dtype = torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(77 + rank())
    w = (torch.rand(n, k, device=dev, generator=gen) * 2 - 1).to(dtype) / k**0.5
    a = torch.empty(m, k, device=dev, dtype=dtype)
    calls = [(algo, chained) for algo in ALGOS for chained in (True, False)]
    outs = [torch.empty(m, n, device=dev, dtype=dtype) for _ in calls]
    a.uniform_(-1, 1)
    for (algo, chained), o in zip(calls, outs):  # eager first: the buffers exist
        mm_then_all_reduce(comm, a, w.t(), o, algo, False, chained=chained)
    torch.cuda.synchronize()
    product = torch.empty(m, n, device=dev, dtype=dtype)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.mm(a, w.t(), out=product)  # the pairs' GEMM, the same call: the same bits
        for (algo, chained), o in zip(calls, outs):
            mm_then_all_reduce(comm, a, w.t(), o, algo, True, chained=chained)
    v = Verdict()
    for r in range(replays):
        a.copy_(uniform(m * k, dtype, dev, seed=7000 + r).view(m, k))
        g.replay()
        torch.cuda.synchronize()
        want, exact = references(product.view(-1))
        for (algo, chained), o in zip(calls, outs):
            v.check(f"replay {r} {algo} chained={chained}", o.view(-1), want, exact)
    comm.raise_launch_errors()
    v.record("chained/mm_then_all_reduce", replays=replays, calls_per_graph=len(calls))


def test_timeout(dev):
    tp, r = dist.get_world_size(), rank()
    wait_s = 1.0
    for algo in ALGOS:
        c = dcomm.Communicator(wait_timeout_s=wait_s, timeout_s=60.0)
        x = uniform(64 * 1024, torch.bfloat16, dev, seed=7)
        run_all_reduce(c, x.clone(), algo, False)  # every rank: the buffers exist
        c.raise_launch_errors()
        dist.barrier()
        if r != tp - 1:
            t0 = time.perf_counter()
            run_all_reduce(c, x.clone(), algo, False)
            torch.cuda.synchronize()
            waited = time.perf_counter() - t0
            msgs = runtime_errors(
                (
                    ("next_call", lambda c=c, x=x, a=algo: run_all_reduce(c, x.clone(), a, False)),
                    ("raise_launch_errors", c.raise_launch_errors),
                )
            )
            text = msgs["raise_launch_errors"] or ""
            ok = (
                "all-reduce, CTA slot" in text
                and f"rank {tp - 1}" in text
                and msgs["next_call"] is not None
                and waited < 4 * wait_s + 2
            )
            record(f"timeout/{algo}/peer_skips_a_call", ok, seconds=waited, **msgs)
        dist.barrier()
        c.close()


def main():
    def sections(dev, args):
        comm = communicator()
        AllReduceResources.of(comm)
        return {
            "correctness": lambda: test_correctness(dev, comm),
            "interleaved": lambda: test_interleaved(dev, comm),
            "capture": lambda: test_capture(dev, comm, args.replays),
            "chained": lambda: test_chained(dev, comm, args.replays),
            "timeout": lambda: test_timeout(dev),
        }

    worker_main("allreduce_kernel_results.json", sections, replays=20)


if __name__ == "__main__":
    main()
