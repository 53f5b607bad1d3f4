"""GPU checks of plans whose GEMMs the kernel table gives to cuBLASLt, one process per rank:

    torchrun --nproc-per-node 2 tests/gpu/cublaslt_plan_worker.py --out results.json

Started by tests/gpu/test_cublaslt_plans.py. Before any op, each rank writes a kernel table
(DISTGEMM_KERNEL_TABLE) whose rows give every sub-GEMM of the shapes below to cuBLASLt's first
algorithm. By default plans of several ranks keep distgemm's kernels all the same
(GemmDesc::kernel_table: a cuBLASLt step there once left the plan's GEMMs waiting for their
flags); one-rank plans take the table's cuBLASLt. Sections (every rank runs them in the same
order; inputs seeded, different per rank):

  all_plans  first in the process, so that no kernel of the runtime has loaded yet (the lazy
           loading that cublaslt_preload and gemm_prepare answer): the table for every plan
           (set_kernel_table's all_plans), each schedule's first call eager, as in plans below,
           cuBLASLt launched (bias, no beta * c); its own K, so that its plans are its own
  plans    every schedule on the overlapped path, bf16, with bias (and beta * c for the reduce
           schedules): against the fp32 computation through torch collectives (relative
           Frobenius error < TOL, and at most twice the same computation's in bf16 + 1e-3), and
           no cuBLASLt GEMM launched (the default scope)
  solo     all_gather_gemm and gemm_reduce_scatter on a one-rank group (a TP=1 plan), with bias,
           the latter also with beta * c: cuBLASLt launched, and right against fp32
  capture  rs_tile_a captured in torch.cuda.graph and replayed with fresh inputs copied in
           place, every replay checked
  fp8_plans  the fp8 ops with the table for every plan: every schedule x scale kinds (row-wise
           scales are cuBLASLt's outer-vector mode, each step reading its slice of the rows) x
           accumulation, without beta * c: cuBLASLt launched, and right against the fp32
           computation of the dequantized inputs (fp8_worker's shapes, inputs and reference)

Exit code 0 when every check passed on every rank. Rank 0 writes every result to --out (JSON).
"""

from __future__ import annotations

import json
import os
import tempfile

import fp8_worker
import torch
from fp8_worker import OPS  # schedule -> the op that runs it
from torchrun_worker import rank, record, reference, rel_err, same_on_all_ranks, worker_main

import distgemm
from distgemm import _core
from distgemm.runtime import kernel_table

TOL = 1e-2
KS = (512, 384)  # K of the all-gather and the reduce schedules' plans
KS_ALL_PLANS = (640, 448)  # ... in the all_plans section, whose plans are its own
BETA = 0.5


def local_shapes(schedule, tp, ks=KS):
    """(a rows, w rows, k, out shape) per rank."""
    m, n = 256 * tp, 256 * tp
    k_ag, k_rs = ks
    if schedule == "ag_rotate_a":
        return m // tp, n // tp, k_ag, (m, n // tp)
    if schedule == "ag_rotate_b":
        return m // tp, n // tp, k_ag, (m // tp, n)
    if schedule == "rs_tile_a":
        return m, n, k_rs, (m // tp, n)
    if schedule == "rs_tile_b":
        return m, n, k_rs, (m, n // tp)
    return m, n, k_rs, (m, n)


def write_table(tp: int) -> str:
    """A kernel table giving every sub-GEMM of these shapes to cuBLASLt: rows for each N in steps
    of 64 up to the largest output width, K of either kind, M every power of 2 (each serves 2x
    either way)."""
    gpu = torch.cuda.get_device_properties(torch.cuda.current_device()).name
    rows = [
        dict(dtype="bf16", m=2**i, n=n, k=k, kernel="cublaslt", algo=0)
        for n in range(64, 256 * tp + 1, 64)
        for k in KS + KS_ALL_PLANS
        for i in range(0, 16)
    ]
    rows += [  # fp8: fp8_worker's K (those of KS), every scale kind and accumulation
        dict(dtype="e4m3", m=2**i, n=n, k=k, kernel="cublaslt", algo=0, scale_a_rows=ra,
             scale_b_rows=rb, fast_accum=fast)
        for n in range(64, 256 * tp + 1, 64)
        for k in KS
        for i in range(0, 16)
        for ra in (False, True)
        for rb in (False, True)
        for fast in (False, True)
    ]  # fmt: skip
    table = dict(format=kernel_table.FORMAT, version=kernel_table.VERSION, gpu=gpu, rows=rows)
    fd, path = tempfile.mkstemp(suffix=".json", prefix=f"cublaslt-table-r{rank()}-")
    with os.fdopen(fd, "w") as f:
        json.dump(table, f)
    return path


def inputs(schedule, dev, seed, tp, ks=KS):
    rows_a, rows_w, k, out_shape = local_shapes(schedule, tp, ks)
    g = torch.Generator(device="cpu").manual_seed(seed * 1000 + rank())
    a = (torch.rand(rows_a, k, generator=g) * 2 - 1).to(dev, torch.bfloat16)
    w = ((torch.rand(rows_w, k, generator=g) * 2 - 1) / k**0.5).to(dev, torch.bfloat16)
    gb = torch.Generator(device="cpu").manual_seed(seed)  # bias and c: the same on every rank
    bias = (torch.rand(out_shape[1], generator=gb) - 0.5).to(dev, torch.bfloat16)
    c = None
    if OPS[schedule] != "all_gather_gemm":
        c = (torch.rand(*out_shape, generator=gb) - 0.5).to(dev, torch.bfloat16)
    return a, w, bias, c


def call(schedule, a, w, bias, c, out=None, steps=None):
    op = getattr(distgemm, OPS[schedule])
    kw = dict(bias=bias, path="overlap", out=out, steps=steps)
    if OPS[schedule] != "gemm_all_reduce":  # its one schedule needs no name
        kw["schedule"] = schedule
    if c is not None:
        kw.update(c=c, beta=BETA)
    return op(a, w, **kw)


def beta_of(c):
    return BETA if c is not None else 0.0


def test_plans(dev, tp, rows, all_plans=False):
    """Plans of every rank: the table names cuBLASLt for each sub-GEMM. By default they keep
    distgemm's kernels (GemmDesc::kernel_table); with `all_plans` cuBLASLt runs their steps
    without beta * c (a step with both a partial and c stays distgemm's: cuBLASLt has one C, and
    with c every step of the reduce schedules has both), at least one per call. Either way they
    are right."""
    _core.set_kernel_table(rows, all_plans=all_plans)
    prefix, ks = ("all_plans", KS_ALL_PLANS) if all_plans else ("plans", KS)
    cases = [(schedule, None) for schedule in OPS]
    if all_plans:  # first: S = 2 TP, partials by copy engine behind copy-lane waits (70B O's plan
        cases.insert(0, ("rs_tile_a", 2 * tp))  # at 4096 tokens, the one that timed out)
    for i, (schedule, steps) in enumerate(cases):
        a, w, bias, c = inputs(schedule, dev, i, tp, ks)
        c = None if all_plans else c
        before = _core.cublaslt_launches()
        y = call(schedule, a, w, bias, c, steps=steps)
        torch.cuda.synchronize()
        ref32, ref16 = reference(schedule, a, w, bias, c, beta_of(c), torch.bfloat16)
        err, err16 = rel_err(y, ref32), rel_err(ref16, ref32)
        launched = _core.cublaslt_launches() - before
        record(
            f"{prefix}/{schedule}" + (f"/S{steps}" if steps else ""),
            err < TOL and err <= 2 * err16 + 1e-3 and (launched > 0) == all_plans,
            err=err,
            err_bf16=err16,
            cublaslt_launches=launched,
        )


def test_solo(dev, solo):
    """One-rank plans (the own floor of a layer): the table's cuBLASLt runs their GEMM, with the
    bias, with and without beta * c, against the same computation in fp32."""
    for i, schedule in enumerate(("ag_rotate_a", "rs_tile_a")):
        a, w, bias, c = inputs(schedule, dev, 50 + i, 1)
        for cc in (None, c) if c is not None else (None,):
            name = f"solo/{schedule}" + ("/beta_c" if cc is not None else "")
            before = _core.cublaslt_launches()
            y = getattr(distgemm, OPS[schedule])(
                a, w, bias=bias, path="overlap", group=solo,
                **(dict(c=cc, beta=BETA) if cc is not None else {}),
            )  # fmt: skip
            torch.cuda.synchronize()
            ref = a.float() @ w.float().t() + bias.float()
            if cc is not None:
                ref = ref + BETA * cc.float()
            launched = _core.cublaslt_launches() - before
            err, err16 = rel_err(y, ref), rel_err(ref.to(torch.bfloat16), ref)
            record(name, err < TOL and launched > 0, err=err, err_bf16=err16,
                   cublaslt_launches=launched)  # fmt: skip


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


def test_fp8_plans(dev, tp, rows):
    """fp8 plans of every rank under the table for every plan: cuBLASLt runs their steps, with
    tensor-wise and row-wise scales, and they are right. Mixed kinds (one operand row-wise, the
    other tensor-wise) run cuBLASLt only where its heuristic offers an algorithm for them
    (``offered``, asked about the plan's local GEMM), else distgemm's kernel, and are right
    either way."""
    _core.set_kernel_table(rows, all_plans=True)
    for i, schedule in enumerate(OPS):
        for j, kinds in enumerate(fp8_worker.KINDS):
            for fast in (False, True) if kinds == ("row", "row") else (False,):
                qa, sa, qw, sw, bias, _ = fp8_worker.inputs(
                    schedule, kinds, dev, 700 + 10 * i + j, tp
                )
                before = _core.cublaslt_launches()
                y = fp8_worker.call(schedule, qa, sa, qw, sw, bias, None, 0.0, "overlap", fast)
                torch.cuda.synchronize()
                launched = _core.cublaslt_launches() - before
                err = rel_err(y, fp8_worker.want(schedule, qa, sa, qw, sw, bias, None, 0.0))
                offered = _core.cublaslt_algo_count(
                    qa.shape[0], qw.shape[0], qa.shape[1], "e4m3",
                    cuda_device=torch.cuda.current_device(), scale_a_rows=kinds[0] == "row",
                    scale_b_rows=kinds[1] == "row", fast_accum=fast,
                )  # fmt: skip
                name = f"fp8_plans/{schedule}/{kinds[0]}-{kinds[1]}/"
                name += "fast" if fast else "accurate"
                record(name, err < TOL and (launched > 0) == (offered > 0), err=err,
                       cublaslt_launches=launched, offered=offered)  # fmt: skip


def sections(dev, args):
    tp = torch.distributed.get_world_size()
    why = _core.cublaslt_problem()
    if why:
        raise RuntimeError(f"cuBLASLt unavailable: {why}")
    os.environ[kernel_table.TABLE_ENV] = write_table(tp)
    rows = kernel_table.load(os.environ[kernel_table.TABLE_ENV])["rows"]
    kernel_table.install(dev)  # before any plan is made (the communicator's install keeps it)
    installed = same_on_all_ranks(kernel_table.installed()["rows"])
    record("table/installed", len(set(installed)) == 1 and installed[0] > 0, rows=installed)
    solo_pg, _ = torch.distributed.new_subgroups(group_size=1)
    solo = distgemm.Communicator(solo_pg)
    return {
        "all_plans": lambda: test_plans(dev, tp, rows, all_plans=True),
        "plans": lambda: test_plans(dev, tp, rows),
        "solo": lambda: test_solo(dev, solo),
        "capture": lambda: test_capture(dev, tp, args.replays),
        "fp8_plans": lambda: test_fp8_plans(dev, tp, rows),
    }


if __name__ == "__main__":
    worker_main("cublaslt_results.json", sections, replays=20)
