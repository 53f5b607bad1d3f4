"""Session 15 probe (not shipped): 405B O at 4096 tokens, TP = world, gemm_reduce_scatter overlap at
S = TP and 2 TP, several shapes around it; prints per call ok/fail, error, cuBLASLt launches and the
step kernel the table gives."""
import os, sys, time, traceback
import torch, torch.distributed as dist
import distgemm
from distgemm import _core
from distgemm.runtime import communicator as dcomm, kernel_table

dist.init_process_group("nccl")
r, tp = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(r)
dev = torch.device("cuda", r)
cases = [(4096, 16384, 16384), (8192, 16384, 16384), (4096, 8192, 8192), (2048, 16384, 16384)]
info = kernel_table.install(dev)
if r == 0:
    print("table", info.get("source"), info.get("plans"), info.get("row_buckets"), flush=True)
for m, n, kg in cases:
    k = kg // tp
    g = torch.Generator(device="cpu").manual_seed(7 + r)
    a = (torch.rand(m, k, generator=g) * 2 - 1).to(dev, torch.bfloat16)
    w = ((torch.rand(n, k, generator=g) * 2 - 1) / kg**0.5).to(dev, torch.bfloat16)
    p = a @ w.t()
    ref = torch.empty(m // tp, n, device=dev, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(ref, p)
    for steps in (tp, 2 * tp):
        sm = m // steps
        kern = kernel_table.plan_kernel("bf16", sm, n, k)
        before = _core.cublaslt_launches()
        t0 = time.perf_counter()
        try:
            with dcomm.Communicator(timeout_s=30.0, wait_timeout_s=5.0) as comm:
                y = distgemm.gemm_reduce_scatter(a, w, steps=steps, group=comm, path="overlap")
                torch.cuda.synchronize()
                comm.raise_launch_errors()
                for _ in range(20):
                    y = distgemm.gemm_reduce_scatter(a, w, steps=steps, group=comm, path="overlap")
                torch.cuda.synchronize()
                comm.raise_launch_errors()
                err = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
                res = f"ok err={err:.2e}"
        except Exception as e:
            res = "FAIL " + str(e)[:160]
        dt = time.perf_counter() - t0
        print(f"rank {r} m={m} n={n} k={k} S={steps} step {sm}x{n}x{k} kernel={kern} "
              f"cublaslt={_core.cublaslt_launches() - before} {dt:.1f}s {res}", flush=True)
        dist.barrier()
dist.destroy_process_group()
