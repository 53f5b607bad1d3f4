"""GPU checks of plans whose GEMMs the kernel table gives to cuBLASLt, one process per rank:

    torchrun --nproc-per-node 2 tests/gpu/cublaslt_plan_worker.py --out results.json

Started by tests/gpu/test_cublaslt_plans.py. Before any op, each rank writes a kernel table
(DISTGEMM_KERNEL_TABLE) whose rows give every sub-GEMM of the shapes below to cuBLASLt's first
algorithm, so that every step runs cuBLASLt behind its flag wait, except a step cuBLASLt does not
take: one with both the partial and beta * c, or with an operand in a peer's memory.
Sections (every rank runs them in the same order; inputs seeded, different per rank):

  plans    every schedule on the overlapped path, bf16, with bias (the reduce schedules also
           with beta * c): against the fp32 computation through torch collectives (relative
           Frobenius error < TOL, and at most twice the same computation's in bf16 + 1e-3), and
           cuBLASLt GEMMs launched (_core.cublaslt_launches grew) where a step must be its
  capture  rs_tile_a captured in torch.cuda.graph and replayed with fresh inputs copied in
           place, every replay checked

Exit code 0 when every check passed on every rank. Rank 0 writes every result to --out (JSON).
"""

from __future__ import annotations

import json
import os
import tempfile

import torch
from fp8_worker import OPS  # schedule -> the op that runs it
from torchrun_worker import rank, record, reference, rel_err, same_on_all_ranks, worker_main

import distgemm
from distgemm import _core
from distgemm.runtime import kernel_table

TOL = 1e-2
K_AG, K_RS = 512, 384
BETA = 0.5


def local_shapes(schedule, tp):
    """(a rows, w rows, k, out shape) per rank."""
    m, n = 256 * tp, 256 * tp
    if schedule == "ag_rotate_a":
        return m // tp, n // tp, K_AG, (m, n // tp)
    if schedule == "ag_rotate_b":
        return m // tp, n // tp, K_AG, (m // tp, n)
    if schedule == "rs_tile_a":
        return m, n, K_RS, (m // tp, n)
    if schedule == "rs_tile_b":
        return m, n, K_RS, (m, n // tp)
    return m, n, K_RS, (m, n)


def write_table(tp: int) -> str:
    """A kernel table giving every sub-GEMM of these shapes to cuBLASLt: rows for each N in steps
    of 64 up to the largest output width, K of either kind, M every power of 2 (each serves 2x
    either way)."""
    gpu = torch.cuda.get_device_properties(torch.cuda.current_device()).name
    rows = [
        dict(dtype="bf16", m=2**i, n=n, k=k, kernel="cublaslt", algo=0)
        for n in range(64, 256 * tp + 1, 64)
        for k in (K_AG, K_RS)
        for i in range(0, 16)
    ]
    table = dict(format=kernel_table.FORMAT, version=kernel_table.VERSION, gpu=gpu, rows=rows)
    fd, path = tempfile.mkstemp(suffix=".json", prefix=f"cublaslt-table-r{rank()}-")
    with os.fdopen(fd, "w") as f:
        json.dump(table, f)
    return path


def inputs(schedule, dev, seed, tp):
    rows_a, rows_w, k, out_shape = local_shapes(schedule, tp)
    g = torch.Generator(device="cpu").manual_seed(seed * 1000 + rank())
    a = (torch.rand(rows_a, k, generator=g) * 2 - 1).to(dev, torch.bfloat16)
    w = ((torch.rand(rows_w, k, generator=g) * 2 - 1) / k**0.5).to(dev, torch.bfloat16)
    gb = torch.Generator(device="cpu").manual_seed(seed)  # bias and c: the same on every rank
    bias = (torch.rand(out_shape[1], generator=gb) - 0.5).to(dev, torch.bfloat16)
    c = None
    if OPS[schedule] != "all_gather_gemm":
        c = (torch.rand(*out_shape, generator=gb) - 0.5).to(dev, torch.bfloat16)
    return a, w, bias, c


def call(schedule, a, w, bias, c, out=None):
    op = getattr(distgemm, OPS[schedule])
    kw = dict(bias=bias, path="overlap", out=out, schedule=schedule)
    if c is not None:
        kw.update(c=c, beta=BETA)
    return op(a, w, **kw)


def beta_of(c):
    return BETA if c is not None else 0.0


# Schedules with a step cuBLASLt must run: every all-gather step reads local slots; a
# reduce-scatter's last step adds a local partial (and the bias). The other steps of the reduce
# schedules may write into a peer's slot, which stays distgemm's kernel's (GemmDesc::
# peer_operands), and so may every step of ar_tile_a.
MUST_LAUNCH = ("ag_rotate_a", "ag_rotate_b", "rs_tile_a", "rs_tile_b")


def test_plans(dev, tp):
    for i, schedule in enumerate(OPS):
        a, w, bias, c = inputs(schedule, dev, i, tp)
        # Without C, so that the reduce schedules' last step (partial + bias) is cuBLASLt's; with
        # C (beta * c as well as the partial) it is distgemm's kernel's.
        for with_c in (False, True) if c is not None else (False,):
            name = f"plans/{schedule}" + ("/beta_c" if with_c else "")
            cc = c if with_c else None
            before = _core.cublaslt_launches()
            y = call(schedule, a, w, bias, cc)
            torch.cuda.synchronize()
            ref32, ref16 = reference(schedule, a, w, bias, cc, beta_of(cc), torch.bfloat16)
            err, err16 = rel_err(y, ref32), rel_err(ref16, ref32)
            launched = _core.cublaslt_launches() - before
            must = schedule in MUST_LAUNCH and not with_c
            record(
                name,
                err < TOL and err <= 2 * err16 + 1e-3 and (launched > 0 or not must),
                err=err,
                err_bf16=err16,
                cublaslt_launches=launched,
            )


def test_capture(dev, tp, replays):
    schedule = "rs_tile_a"
    a, w, bias, c = inputs(schedule, dev, 99, tp)
    out = torch.empty(local_shapes(schedule, tp)[3], device=dev, dtype=torch.bfloat16)
    call(schedule, a, w, bias, c, out=out)  # the plan exists before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(schedule, a, w, bias, c, out=out)
    worst = 0.0
    for r in range(replays):
        fa, fw, fbias, fc = inputs(schedule, dev, 100 + r, tp)
        a.copy_(fa)
        w.copy_(fw)
        graph.replay()
        torch.cuda.synchronize()
        ref32, _ = reference(schedule, a, w, bias, c, BETA, torch.bfloat16)
        worst = max(worst, rel_err(out, ref32))
    record("capture/rs_tile_a", worst < TOL, replays=replays, worst=worst)


def sections(dev, args):
    tp = torch.distributed.get_world_size()
    why = _core.cublaslt_problem()
    if why:
        raise RuntimeError(f"cuBLASLt unavailable: {why}")
    os.environ[kernel_table.TABLE_ENV] = write_table(tp)
    kernel_table.install(dev)  # before any plan is made (the communicator's install keeps it)
    installed = same_on_all_ranks(kernel_table.installed()["rows"])
    record("table/installed", len(set(installed)) == 1 and installed[0] > 0, rows=installed)
    return {
        "plans": lambda: test_plans(dev, tp),
        "capture": lambda: test_capture(dev, tp, args.replays),
    }


if __name__ == "__main__":
    worker_main("cublaslt_results.json", sections, replays=20)
