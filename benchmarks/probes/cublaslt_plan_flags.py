"""Probe of reduce-scatter plans whose steps may run cuBLASLt: does each first call, and 20 more,
finish within the flags' timeout, and is it right? TP = world size, one line per rank and call.

    DISTGEMM_KERNEL_TABLE_PLANS=all torchrun --nproc-per-node 4 -m benchmarks.probes.cublaslt_plan_flags

Per (M, N, global K) of CASES (405B O at 4096 and 8192 tokens, 70B O at 4096, 405B O at 2048) and
S = TP, then 2 TP: gemm_reduce_scatter(path="overlap") on a fresh communicator (5 s flag
timeout), seeded uniform operands, against torch.mm + reduce_scatter_tensor (relative Frobenius
error). Each line names the step's shape, the kernel the installed table gives it
(kernel_table.plan_kernel) and the cuBLASLt GEMMs enqueued. On 4x H200 (2026-11-28) under `all`,
405B O at 4096 tokens and S = 8 timed out on its flags at its first call, with row buckets on and
off; under `one-rank` every call passed (benchmarks/results/2026-11-28-h200-tp4-first-calls-buckets.md).
With the preload per shape and the side ops enqueued after their GEMMs, all 8 passed under `all`
(benchmarks/results/2026-11-28-h200-tp4-copy-bound.md).
"""

import time

import torch
import torch.distributed as dist

import distgemm
from distgemm import _core
from distgemm.runtime import communicator as dcomm
from distgemm.runtime import kernel_table

CASES = [(4096, 16384, 16384), (8192, 16384, 16384), (4096, 8192, 8192), (2048, 16384, 16384)]
REPLAYS = 20


def one_call(a, w, ref, steps: int) -> str:
    """The first call and REPLAYS more on a fresh communicator: 'ok err=..' or 'FAIL reason'."""
    try:
        with dcomm.Communicator(timeout_s=30.0, wait_timeout_s=5.0) as comm:
            for _ in range(1 + REPLAYS):
                y = distgemm.gemm_reduce_scatter(a, w, steps=steps, group=comm, path="overlap")
                torch.cuda.synchronize()
                comm.raise_launch_errors()
            err = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
            return f"ok err={err:.2e}"
    except RuntimeError as e:
        return "FAIL " + str(e)[:200]


def main() -> None:
    dist.init_process_group("nccl")
    rank, tp = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    info = kernel_table.install(dev)
    if rank == 0:
        print(f"table {info.get('source')} plans={info.get('plans')} "
              f"row_buckets={info.get('row_buckets')}", flush=True)  # fmt: skip
    for m, n, k_global in CASES:
        k = k_global // tp
        g = torch.Generator(device="cpu").manual_seed(7 + rank)
        a = (torch.rand(m, k, generator=g) * 2 - 1).to(dev, torch.bfloat16)
        w = ((torch.rand(n, k, generator=g) * 2 - 1) / k_global**0.5).to(dev, torch.bfloat16)
        ref = torch.empty(m // tp, n, device=dev, dtype=torch.bfloat16)
        dist.reduce_scatter_tensor(ref, a @ w.t())
        for steps in (tp, 2 * tp):
            step = f"{m // steps}x{n}x{k}"
            kernel = kernel_table.plan_kernel("bf16", m // steps, n, k)
            before, t0 = _core.cublaslt_launches(), time.perf_counter()
            res = one_call(a, w, ref, steps)
            print(f"rank {rank} m={m} n={n} k={k} S={steps} step {step} kernel={kernel} "
                  f"cublaslt={_core.cublaslt_launches() - before} "
                  f"{time.perf_counter() - t0:.1f}s {res}", flush=True)  # fmt: skip
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
