"""GPU checks of the fp8 (e4m3) ops, one process per rank:

    torchrun --nproc-per-node 2 tests/gpu/fp8_worker.py --out results.json
    DISTGEMM_ALLOW_SHARED_GPU=1 torchrun --nproc-per-node 2 tests/gpu/fp8_worker.py ...  # 1 GPU

Started by tests/gpu/test_fp8_ops.py. Sections (every rank runs all of them in the same order;
inputs seeded, different per rank):

  correctness  every schedule x scale kinds (row/row, tensor/tensor, row/tensor, tensor/row) x
               accumulation (accurate; fast for row/row), with bias (and beta * c for the
               reduce schedules), on the overlapped path and, with NCCL, the collective path:
               against the fp32 computation of the dequantized inputs through torch collectives
               (relative Frobenius error < TOL); the overlapped path's error at most twice the
               collective path's + 1e-3 where both ran
  gathered     all_gather_gemm(return_gathered=True): the gathered fp8 activations bit for bit
  capture      ag_rotate_a and rs_tile_a with row scales captured in torch.cuda.graph and
               replayed REPLAYS times with fresh fp8 inputs and scales copied in place, every
               replay checked
  errors       refusals at the boundary (an e5m2 input, a missing scale, a scale of the wrong
               rows, bf16 scales, fp16 out): the same exception on every rank, no hang

With DISTGEMM_ALLOW_SHARED_GPU=1 every rank runs on one GPU through a gloo group (the plans'
copies, flags and scale slots are exercised; the collective path needs NCCL and is skipped).
Exit code 0 when every check passed on every rank. Rank 0 writes every result to --out (JSON).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torchrun_worker import (
    NEEDS_NCCL,
    gather0,
    left_out_when_shared,
    rank,
    record,
    reference,
    rel_err,
    same_on_all_ranks,
    worker_main,
)

import distgemm
from distgemm.runtime.scales import dequantize, quantize

TOL = 1e-2
E4M3 = torch.float8_e4m3fn
KINDS = [("row", "row"), ("tensor", "tensor"), ("row", "tensor"), ("tensor", "row")]
OPS = {
    "ag_rotate_a": "all_gather_gemm",
    "ag_rotate_b": "all_gather_gemm",
    "rs_tile_a": "gemm_reduce_scatter",
    "rs_tile_b": "gemm_reduce_scatter",
    "ar_tile_a": "gemm_all_reduce",
}


def local_shapes(schedule, tp):
    """(a rows, w rows, k, out shape) per rank: M=256*tp rows of 512 (all-gather) or K=384/rank."""
    m, n, k = 256 * tp, 256 * tp, 512
    if schedule == "ag_rotate_a":
        return m // tp, n // tp, k, (m, n // tp)
    if schedule == "ag_rotate_b":
        return m // tp, n // tp, k, (m // tp, n)
    k = 384
    if schedule == "rs_tile_a":
        return m, n, k, (m // tp, n)
    if schedule == "rs_tile_b":
        return m, n, k, (m, n // tp)
    return m, n, k, (m, n)


def inputs(schedule, kinds, dev, seed, tp):
    rows_a, rows_w, k, out_shape = local_shapes(schedule, tp)
    g = torch.Generator(device="cpu").manual_seed(seed * 1000 + rank())
    a = (torch.rand(rows_a, k, generator=g) * 2 - 1) * (torch.rand(rows_a, 1, generator=g) * 4)
    w = (torch.rand(rows_w, k, generator=g) * 2 - 1) / k**0.5
    qa, sa = quantize(a.to(dev), kinds[0] == "row")
    qw, sw = quantize(w.to(dev), kinds[1] == "row")
    gb = torch.Generator(device="cpu").manual_seed(seed)  # bias and c: the same on every rank
    bias = ((torch.rand(out_shape[1], generator=gb) * 2 - 1) / 4).to(torch.bfloat16).to(dev)
    c = None
    if not schedule.startswith("ag"):
        c = (torch.rand(out_shape, generator=gb) * 2 - 1).bfloat16().to(dev)
    return qa, sa, qw, sw, bias, c


def call(schedule, qa, sa, qw, sw, bias, c, beta, path, fast):
    op = getattr(distgemm, OPS[schedule])
    kw = dict(bias=bias, path=path, scale_a=sa, scale_b=sw, fast_accum=fast)
    if schedule.startswith("ag"):
        return op(qa, qw, schedule=schedule, **kw)
    if schedule.startswith("rs"):
        return op(qa, qw, schedule=schedule, c=c, beta=beta, **kw)
    return op(qa, qw, c=c, beta=beta, **kw)


def want(schedule, qa, sa, qw, sw, bias, c, beta):
    a, w = dequantize(qa, sa), dequantize(qw, sw)
    return reference(schedule, a, w, bias, c, beta, torch.float32)[0]


def test_correctness(dev):
    tp = dist.get_world_size()
    paths = ["overlap"]
    if not left_out_when_shared("correctness/collective", NEEDS_NCCL):
        paths.append("collective")
    for i, schedule in enumerate(OPS):
        for kinds in KINDS:
            for fast in (False, True) if kinds == ("row", "row") else (False,):
                seed = 100 * i + 7 * KINDS.index(kinds) + int(fast)
                qa, sa, qw, sw, bias, c = inputs(schedule, kinds, dev, seed, tp)
                beta = 0.0 if c is None else 0.5
                ref = want(schedule, qa, sa, qw, sw, bias, c, beta)
                errs = {}
                for path in paths:
                    y = call(schedule, qa, sa, qw, sw, bias, c, beta, path, fast)
                    torch.cuda.synchronize()
                    errs[path] = rel_err(y, ref)
                    name = f"correctness/{schedule}/{kinds[0]}-{kinds[1]}/"
                    name += f"{'fast' if fast else 'accurate'}/{path}"
                    record(name, errs[path] < TOL and y.dtype == torch.bfloat16, rel_err=errs[path])
                if "collective" in errs:
                    record(
                        f"correctness/{schedule}/{kinds[0]}-{kinds[1]}/"
                        f"{'fast' if fast else 'accurate'}/vs_collective",
                        errs["overlap"] <= 2 * errs["collective"] + 1e-3,
                        **{f"rel_err_{p}": e for p, e in errs.items()},
                    )


def test_gathered(dev):
    """return_gathered on fp8: the gathered activations, bit for bit (moved as bytes)."""
    tp = dist.get_world_size()
    qa, sa, qw, sw, bias, _ = inputs("ag_rotate_a", ("row", "row"), dev, 4000, tp)
    y, gathered = distgemm.all_gather_gemm(
        qa, qw, bias=bias, scale_a=sa, scale_b=sw, path="overlap", return_gathered=True
    )
    torch.cuda.synchronize()
    full = gather0(qa.view(torch.uint8))
    ok = gathered.dtype == E4M3 and torch.equal(gathered.view(torch.uint8), full)
    err = rel_err(y, want("ag_rotate_a", qa, sa, qw, sw, bias, None, 0.0))
    record("gathered/ag_rotate_a", ok and err < TOL, rel_err=err)


def test_capture(dev, replays):
    tp = dist.get_world_size()
    for schedule in ("ag_rotate_a", "rs_tile_a"):
        qa, sa, qw, sw, bias, c = inputs(schedule, ("row", "row"), dev, 5000, tp)
        beta = 0.0 if c is None else 0.5
        call(schedule, qa, sa, qw, sw, bias, c, beta, "overlap", False)  # plan outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = call(schedule, qa, sa, qw, sw, bias, c, beta, "overlap", False)
        worst = 0.0
        for r in range(replays):
            fa, fsa, fw, fsw, _, _ = inputs(schedule, ("row", "row"), dev, 6000 + r, tp)
            qa.copy_(fa)
            sa.copy_(fsa)
            if r % 10 == 0:
                qw.copy_(fw)
                sw.copy_(fsw)
            graph.replay()
            torch.cuda.synchronize()
            worst = max(worst, rel_err(y, want(schedule, qa, sa, qw, sw, bias, c, beta)))
        record(f"capture/{schedule}", worst < TOL, rel_err_worst=worst, replays=replays)


def expect(name, exc_type, fn, pattern):
    try:
        fn()
    except exc_type as e:
        msgs = same_on_all_ranks(str(e))
        record(name, pattern in str(e) and len(set(msgs)) == 1, message=str(e)[:300])
        return
    except Exception as e:  # noqa: BLE001
        record(name, False, error=f"{type(e).__name__}: {e}"[:300])
        return
    record(name, False, error="no exception")


def test_errors(dev):
    tp = dist.get_world_size()
    qa, sa, qw, sw, _, _ = inputs("ag_rotate_a", ("row", "row"), dev, 9000, tp)
    ag = distgemm.all_gather_gemm
    e5 = qa.float().to(torch.float8_e5m2)
    expect("errors/e5m2", TypeError, lambda: ag(e5, qw, scale_a=sa, scale_b=sw), "float8_e5m2")
    expect("errors/missing_scale", ValueError, lambda: ag(qa, qw, scale_a=sa), "scale_b missing")
    expect(
        "errors/scale_rows",
        ValueError,
        lambda: ag(qa, qw, scale_a=sa[:-1], scale_b=sw),
        "scale_a has shape",
    )
    expect(
        "errors/bf16_scale",
        TypeError,
        lambda: ag(qa, qw, scale_a=sa.bfloat16(), scale_b=sw),
        "scales are torch.float32",
    )
    out16 = torch.empty(local_shapes("ag_rotate_a", tp)[3], device=dev, dtype=torch.float16)
    expect(
        "errors/fp16_out",
        TypeError,
        lambda: ag(qa, qw, scale_a=sa, scale_b=sw, out=out16),
        "distgemm writes torch.bfloat16",
    )


def main():
    worker_main(
        "fp8_results.json",
        lambda dev, args: {
            "correctness": lambda: test_correctness(dev),
            "gathered": lambda: test_gathered(dev),
            "capture": lambda: test_capture(dev, args.replays),
            "errors": lambda: test_errors(dev),
        },
        replays=50,
    )


if __name__ == "__main__":
    main()
