"""distgemm.compat.symm_mem on 2 gloo ranks against torch: the cases of torch's own tests of
torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter
(test/distributed/test_symmetric_memory.py: BATCH=8, M=64, N=16, K=32 resp. 1024, every gather and
scatter dim, three Bs, "avg"), with their assertions: values allclose to torch's reference
implementation and the same strides. Also against a plain all_gather + matmul written here, the
fallback reasons, and the ValueErrors; a few of the cases, and a ValueError every rank raises, at
every TP of ranks.CPU_TPS.
"""

import itertools
import re
import types

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from ranks import CPU_TPS, run_ranks, value_error  # noqa: E402
from torch.distributed._symmetric_memory import (  # noqa: E402
    _fused_all_gather_matmul_fallback,
    _fused_matmul_reduce_scatter_fallback,
)

from distgemm.compat import symm_mem  # noqa: E402

BATCH, M, N = 8, 64, 16
K_GATHER, K_SCATTER = 32, 1024
DTYPES = ["float32", "bfloat16", "float16"]
# torch's op has no autograd, nor has ours: opcheck's autograd registration check does not apply.
OPCHECK_TESTS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
GATHER_CASES = list(itertools.product([0, 1, 2], DTYPES, [True, False]))
SCATTER_CASES = list(itertools.product([0, 1, 2], DTYPES, ["avg", "sum"]))


def _close(a, b, dtype) -> bool:
    # torch's tests use allclose's defaults in fp32; rounding of a K-term sum in 16 bits needs more.
    tol = {
        "float32": {},
        "float16": {"rtol": 2e-3, "atol": 1e-2},
        "bfloat16": {"rtol": 1.6e-2, "atol": 5e-2},
    }
    return torch.allclose(a.float(), b.float(), **tol[dtype])


def _plain_all_gather_matmul(A_shard, Bs, gather_dim, group):
    """all_gather along gather_dim, then matmul: the semantics, written out."""
    parts = [torch.empty_like(A_shard) for _ in range(group.size())]
    dist.all_gather(parts, A_shard.contiguous(), group=group)
    A = torch.cat(parts, dim=gather_dim)
    return A, [A @ B for B in Bs]


def count_distgemm_calls(device) -> dict[str, int]:
    """``{"n": calls}``, counting the distgemm ops the drop-ins reach (``distgemm.ops``' names,
    looked up at call time) from here on; on CPU they reach none, and nothing is wrapped."""
    from distgemm import ops

    calls = {"n": 0}
    if device != "cpu":
        for name in ("all_gather_gemm", "gemm_reduce_scatter"):
            op = getattr(ops, name)

            def counted(*args, _op=op, **kwargs):
                calls["n"] += 1
                return _op(*args, **kwargs)

            setattr(ops, name, counted)
    return calls


def compat_worker(
    rank, tp, device="cpu", gather_cases=GATHER_CASES, scatter_cases=SCATTER_CASES, sizes=(BATCH, M)
):
    """Every ported case (or those given, of A's leading ``sizes`` [BATCH, M]): torch_compat's
    results against torch's reference and a plain all_gather/all_reduce, their strides and
    shapes, and how many distgemm calls served it."""
    calls = count_distgemm_calls(device)
    group = dist.group.WORLD
    name = group.group_name
    results = {}
    for gather_dim, dtype_name, return_A in gather_cases:
        dtype = getattr(torch, dtype_name)
        torch.manual_seed(42 + rank)
        shape = [*sizes, K_GATHER]
        shape[gather_dim] //= tp
        A_shard = torch.rand(shape, dtype=dtype, device=device)
        Bs = [torch.rand(K_GATHER, N, dtype=dtype, device=device) for _ in range(3)]
        ref_A, ref_mm = _fused_all_gather_matmul_fallback(
            A_shard, Bs, gather_dim=gather_dim, group_name=name, return_A=return_A
        )
        plain_A, plain_mm = _plain_all_gather_matmul(A_shard, Bs, gather_dim, group)
        before = calls["n"]
        A, mm = symm_mem.fused_all_gather_matmul(
            A_shard, Bs, gather_dim=gather_dim, group_name=name, return_A=return_A
        )
        results[("gather", gather_dim, dtype_name, return_A)] = {
            "A": (A is None)
            if not return_A
            else (
                torch.equal(A, ref_A) and torch.equal(A, plain_A) and A.stride() == ref_A.stride()
            ),
            "count": len(mm) == len(Bs),
            "values": all(_close(a, b, dtype_name) for a, b in zip(mm, ref_mm)),
            "plain": all(_close(a, b, dtype_name) for a, b in zip(mm, plain_mm)),
            "strides": [a.stride() == b.stride() for a, b in zip(mm, ref_mm)] == [True] * 3,
            "shapes": [list(a.shape) for a in mm],
            "distgemm calls": calls["n"] - before,
        }
    for scatter_dim, dtype_name, reduce_op in scatter_cases:
        dtype = getattr(torch, dtype_name)
        torch.manual_seed(42 + rank)
        A = torch.rand(*sizes, K_SCATTER, dtype=dtype, device=device)
        B = torch.rand(K_SCATTER, N, dtype=dtype, device=device)
        ref = _fused_matmul_reduce_scatter_fallback(
            A, B, reduce_op, scatter_dim=scatter_dim, group_name=name
        )
        full = (A @ B).float()
        dist.all_reduce(full, group=group)
        if reduce_op == "avg":
            full /= tp
        plain = full.chunk(tp, dim=scatter_dim)[rank]
        before = calls["n"]
        out = symm_mem.fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, name)
        results[("scatter", scatter_dim, dtype_name, reduce_op)] = {
            "values": _close(out, ref, dtype_name),
            "plain": _close(out, plain, dtype_name),
            "strides": out.stride() == ref.stride(),
            "shape": list(out.shape),
            "distgemm calls": calls["n"] - before,
        }
    return results


@pytest.fixture(scope="module")
def compat_results(tmp_path_factory):
    return run_ranks(compat_worker, tmp_path_factory.mktemp("compat"))


def case_failures(results, key, on_cuda: bool, sizes=(BATCH, M)) -> list[str]:
    """What compat_worker got wrong on any rank for one case (``key``): values, strides or
    shapes against torch, or distgemm serving a case it should not (or not serving one it
    should: on CUDA every bf16/fp16 case but a gather of K)."""
    kind, dim, dtype_name = key[:3]
    shape = [*sizes, N]
    if kind == "scatter":
        shape[dim] //= len(results)
    served = on_cuda and dtype_name != "float32" and not (kind == "gather" and dim == 2)
    failures = []
    for rank, result in enumerate(results):
        r = result[key]
        checks = ["values", "plain", "strides"] + (["A", "count"] if kind == "gather" else [])
        failures += [f"rank {rank} {key}: {c}" for c in checks if not r[c]]
        shapes = r["shapes"] if kind == "gather" else [r["shape"]]
        if shapes != [shape] * len(shapes):
            failures.append(f"rank {rank} {key}: shapes {shapes}, expected {shape}")
        if r["distgemm calls"] != int(served):
            failures.append(f"rank {rank} {key}: {r['distgemm calls']} distgemm calls")
    return failures


@pytest.mark.parametrize("gather_dim, dtype_name, return_A", GATHER_CASES)
def test_fused_all_gather_matmul(compat_results, gather_dim, dtype_name, return_A):
    key = ("gather", gather_dim, dtype_name, return_A)
    failures = case_failures(compat_results, key, on_cuda=False)
    assert not failures, failures


@pytest.mark.parametrize("scatter_dim, dtype_name, reduce_op", SCATTER_CASES)
def test_fused_matmul_reduce_scatter(compat_results, scatter_dim, dtype_name, reduce_op):
    key = ("scatter", scatter_dim, dtype_name, reduce_op)
    failures = case_failures(compat_results, key, on_cuda=False)
    assert not failures, failures


# A batch of one split along dim 1 (sequence parallelism's [1, seq, dim], torchtitan's layout):
# the results keep the strides of torch's Meta kernels, the size-1 batch dim's included, which
# inductor takes the real outputs to have.
BATCH1_SIZES = (1, 48)  # BATCH, M
BATCH1_GATHER = [(1, "bfloat16", True)]
BATCH1_SCATTER = [(1, "bfloat16", "sum"), (1, "float32", "avg")]


def batch1_worker(rank, tp):
    return compat_worker(rank, tp, "cpu", BATCH1_GATHER, BATCH1_SCATTER, BATCH1_SIZES)


@pytest.mark.parametrize("tp", (2, 4))
def test_batch_of_one_along_dim_1_keeps_torchs_strides(tmp_path, tp):
    results = run_ranks(batch1_worker, tmp_path, tp=tp)
    keys = [("gather", *c) for c in BATCH1_GATHER] + [("scatter", *c) for c in BATCH1_SCATTER]
    failures = [] if len(results) == tp else [f"{len(results)} ranks, not {tp}"]
    failures += [f for key in keys for f in case_failures(results, key, False, BATCH1_SIZES)]
    assert not failures, failures


def test_row_major_strides():
    t = torch.arange(6.0).view(3, 1, 2).movedim(0, 1)  # [1, 3, 2], contiguous, strides (2, 2, 1)
    assert t.is_contiguous() and t.stride() == (2, 2, 1)
    r = symm_mem.row_major(t)
    assert r.stride() == (6, 2, 1) and torch.equal(r, t) and r.data_ptr() == t.data_ptr()
    u = torch.arange(6.0).view(2, 3).t()  # not contiguous: copied
    assert symm_mem.row_major(u).stride() == (2, 1) and torch.equal(symm_mem.row_major(u), u)
    e = torch.empty(0, 1, 4)
    assert symm_mem.row_major(e).shape == (0, 1, 4)


# Every TP of CPU_TPS: a gather and a scatter along each leading dim (fp32, bf16), on leading
# sizes that split over each TP; and the ValueError of a scatter dim that does not.
EVERY_TP_SIZES = (24, 48)  # BATCH, M
EVERY_TP_GATHER = [(0, "float32", True), (1, "bfloat16", False)]
EVERY_TP_SCATTER = [(0, "bfloat16", "sum"), (1, "float32", "avg")]


def every_tp_worker(rank, tp):
    """compat_worker's results for the EVERY_TP cases, and the ValueError of a reduce-scatter
    whose scatter dim does not split over ``tp``, raised before any collective."""
    results = compat_worker(rank, tp, "cpu", EVERY_TP_GATHER, EVERY_TP_SCATTER, EVERY_TP_SIZES)
    A, B = torch.rand(2 * tp + 1, 4, 32), torch.rand(32, 16)  # dim 0 of A @ B: 2 * tp + 1
    name = dist.group.WORLD.group_name
    return results, value_error(lambda: symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, name))


def every_tp_failures(results, tp, cases, failures_of, error) -> list[str]:
    """What an every_tp_worker's results on each rank get wrong: fewer than ``tp`` ranks, a case
    of ``cases`` (gather cases, scatter cases) by ``failures_of`` (a case_failures), an error
    other than ``error``."""
    compat = [r for r, _ in results]
    keys = [("gather", *c) for c in cases[0]] + [("scatter", *c) for c in cases[1]]
    failures = [] if len(results) == tp else [f"{len(results)} ranks, not {tp}"]
    failures += [f for key in keys for f in failures_of(compat, key, False, EVERY_TP_SIZES)]
    return failures + [f"rank {r}: {e!r}" for r, (_, e) in enumerate(results) if e != error]


@pytest.mark.parametrize("tp", CPU_TPS)
def test_every_tp_matches_torch_and_every_rank_raises_on_an_indivisible_scatter(tmp_path, tp):
    results = run_ranks(every_tp_worker, tmp_path, tp=tp)
    error = (
        f"fused_matmul_reduce_scatter: dim 0 of A @ B ({2 * tp + 1}) is not divisible by tp={tp}"
    )
    cases = (EVERY_TP_GATHER, EVERY_TP_SCATTER)
    failures = every_tp_failures(results, tp, cases, case_failures, error)
    assert not failures, failures


def _fake(shape, dtype=torch.bfloat16, is_cuda=True):
    return types.SimpleNamespace(shape=shape, dtype=dtype, is_cuda=is_cuda)


@pytest.mark.parametrize(
    "tensors, tp, extents, divisible, reason",
    [
        ([_fake([8, 32]), _fake([32, 16])], 2, {"K": 32}, {"M": (8, 4)}, None),
        ([_fake([8, 32])], 1, {"K": 32}, {}, "tp=1: one rank has nothing"),
        ([_fake([8, 32], is_cuda=False)], 2, {"K": 32}, {}, "CPU tensors"),
        ([_fake([8, 32], torch.float32)], 2, {"K": 32}, {}, "dtypes \\['torch.float32'\\]"),
        ([_fake([8, 32]), _fake([32, 16], torch.float16)], 2, {}, {}, "one dtype"),
        ([_fake([8, 32])], 2, {"K": 32, "N": 12}, {}, "N=12 is not a multiple of 8"),
        ([_fake([6, 32])], 2, {"K": 32}, {"M": (6, 4)}, "M=6 is not divisible by 4"),
    ],
)
def test_fallback_reason(tensors, tp, extents, divisible, reason):
    assert_reason(symm_mem.fallback_reason(tensors, tp, extents, divisible), reason)


def assert_reason(got: str | None, reason: str | None) -> None:
    """``got`` is None where ``reason`` is, else a fallback reason matching ``reason``."""
    if reason is None:
        assert got is None
    else:
        assert got is not None and re.search(reason, got), got


def test_errors_name_the_values(group_name):
    A, B = torch.rand(4, 8, 32), torch.rand(32, 16)
    with pytest.raises(ValueError, match=r"reduce_op='max' is not one of \('sum', 'avg'\)"):
        symm_mem.fused_matmul_reduce_scatter(A, B, "max", 0, group_name)
    with pytest.raises(ValueError, match=r"scatter_dim=3 is out of range for a 3-D A"):
        symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 3, group_name)
    with pytest.raises(ValueError, match=r"B.shape\[0\]=31 must equal K=A.shape\[-1\]=32"):
        symm_mem.fused_matmul_reduce_scatter(A, torch.rand(31, 16), "sum", 0, group_name)
    with pytest.raises(ValueError, match=r"gather_dim=-4 is out of range for a 3-D A"):
        symm_mem.fused_all_gather_matmul(A, [B], -4, group_name)
    with pytest.raises(ValueError, match=r"Bs\[1\].shape\[0\]=16 must equal K=32"):
        symm_mem.fused_all_gather_matmul(A, [B, torch.rand(16, 16)], 0, group_name)
    with pytest.raises(ValueError, match=r"Bs\[0\] must be 2-D \[K, N\], got shape \[32\]"):
        symm_mem.fused_all_gather_matmul(A, [torch.rand(32)], 0, group_name)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_opcheck_and_fake_strides(group_name, dim):
    g = torch.Generator().manual_seed(5)
    A = torch.rand(4, 8, 16, generator=g)
    Bs = [torch.rand(16, 8, generator=g), torch.rand(16, 24, generator=g)]
    cases = [
        (symm_mem.fused_all_gather_matmul, (A, Bs, dim, group_name), {"return_A": True}),
        (symm_mem.fused_all_gather_matmul, (A, Bs, dim, group_name), {"return_A": False}),
        (symm_mem.fused_matmul_reduce_scatter, (A, Bs[1], "avg", dim, group_name), {}),
    ]
    for op, args, kwargs in cases:
        result = torch.library.opcheck(op, args, kwargs, test_utils=OPCHECK_TESTS)
        assert set(result.values()) == {"SUCCESS"}, result


def compiled_distgemm_ops(f, args) -> list[str]:
    """The distgemm ops in the one graph ``torch.compile(f, fullgraph=True)`` makes of ``f``,
    after checking that it computes what ``f`` computes."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def record(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=aot_autograd(fw_compiler=record))
    torch.testing.assert_close(compiled(*args), f(*args), rtol=0, atol=0)
    assert len(graphs) == 1
    return [t for t in graphs[0] if t.startswith("distgemm.")]


def test_compiled_call_is_one_node(group_name):
    def f(A, B0, B1):
        A_full, (y0, y1) = symm_mem.fused_all_gather_matmul(A, [B0, B1], 1, group_name)
        return symm_mem.fused_matmul_reduce_scatter(A_full, B0, "sum", 0, group_name) + y0

    g = torch.Generator().manual_seed(6)
    args = (torch.rand(4, 8, 16, generator=g), torch.rand(16, 8, generator=g))
    args = (*args, torch.rand(16, 24, generator=g))
    assert compiled_distgemm_ops(f, args) == [
        "distgemm.fused_all_gather_matmul.default",
        "distgemm.fused_matmul_reduce_scatter.default",
    ]
