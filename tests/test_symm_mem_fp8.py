"""distgemm.compat.symm_mem_fp8 on 2 gloo ranks against torch: the cases of torch's own tests of
torch.ops.symm_mem.fused_all_gather_scaled_matmul / fused_scaled_matmul_reduce_scatter
(test/distributed/test_symmetric_memory.py: BATCH=8, M=64, N=16, K=32, float8_e4m3fn A and
B = rand(N, K).T, scales 0.1; gather dims 0 and 1 with tensor-wise, row-wise-sharded and
row-wise-replicated A scales and out_dtypes [None, bf16, fp32] resp. bf16; scatter dims 0 and 1,
row- and tensor-wise, "avg", out_dtype bf16), with their assertions: A allclose with the same
strides, each output allclose with the same strides and dtype (all-gather), outputs equal
within assertEqual's tolerance with the same strides (reduce-scatter). Beyond torch's: a
scatter of N, "sum", a 2-D A with a 3-D output_shape, biases and use_fast_accum, a plain
all_gather / all_reduce + torch._scaled_mm reference written here, the fallback reasons and
every refusal. A few of the cases, and a ValueError every rank raises, at every TP of
ranks.CPU_TPS.

gloo has no fp8 all-gather, so the workers run torch's reference with fp8 moved as bytes
(``_bytes_all_gather``); on CPU both sides then run the same torch._scaled_mm calls and must
agree bit for bit.
"""

import itertools
import types

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from ranks import CPU_TPS, run_ranks, value_error  # noqa: E402
from test_symm_mem import (  # noqa: E402
    EVERY_TP_SIZES,
    assert_reason,
    compiled_distgemm_ops,
    count_distgemm_calls,
    every_tp_failures,
)
from torch.distributed._symmetric_memory import (  # noqa: E402
    _fused_all_gather_scaled_matmul_fallback,
    _fused_scaled_matmul_reduce_scatter_fallback,
)

from distgemm.compat import symm_mem_fp8  # noqa: E402

E4M3 = torch.float8_e4m3fn
BATCH, M, N, K = 8, 64, 16, 32
SCALE = 0.1
SCALE_MODES = ["tensor-wise", "row-wise-sharded", "row-wise-replicated"]
# torch's cases, then ours: (gather_dim, scale mode, variant)
GATHER_CASES = [(d, mode, "torch") for d, mode in itertools.product([0, 1], SCALE_MODES)] + [
    (1, "row-wise-sharded", "bias+fast_accum"),
    (0, "tensor-wise", "bias+fast_accum"),
]
# (scatter_dim, row-wise, reduce_op, variant): torch's, then a scatter of N, "sum", a 2-D A with
# a 3-D output_shape (the reshape torch's compiler pass makes) and a bias.
SCATTER_CASES = [(d, rw, "avg", "torch") for d, rw in itertools.product([0, 1], [True, False])]
SCATTER_CASES += [(2, True, "avg", "torch"), (2, False, "sum", "torch"), (1, True, "sum", "torch")]
SCATTER_CASES += [(0, True, "avg", "2-D A"), (1, False, "sum", "2-D A"), (0, True, "sum", "bias")]
# torch's op has no autograd, nor has ours: opcheck's autograd registration check does not apply.
# Its test_schema cannot compare fp8 tensors on CPU ("mul_cpu_reduced_float" not implemented for
# Float8_e4m3fn): test_no_mutation_no_alias checks what it would.
OPCHECK_TESTS = ("test_faketensor", "test_aot_dispatch_dynamic")


def _bytes_all_gather():
    """Makes torch's functional all-gather (which its reference calls) move fp8 as bytes, which
    gloo can; returns a function that undoes it."""
    ns = torch.ops._c10d_functional
    real = ns.all_gather_into_tensor

    def gather(t, group_size, group_name):
        if t.dtype != E4M3:
            return real(t, group_size, group_name)
        return real(t.view(torch.uint8), group_size, group_name).view(E4M3)

    ns.all_gather_into_tensor = gather
    return lambda: setattr(ns, "all_gather_into_tensor", real)


def _close(got, ref, partials=2) -> bool:
    """Equal up to twice the rounding of one output in its dtype (the plain references sum or
    order the same products differently): fp8 e4m3 2^-3, bf16 2^-8, fp32 2^-23 relative, per two
    ``partials`` summed in that dtype (a reduce-scatter over TP ranks rounds at each of its TP - 1
    additions: about 1.2e-2 in bf16 at TP=8)."""
    rtol = {E4M3: 0.25, torch.bfloat16: 8e-3, torch.float32: 2.5e-7}[ref.dtype] * partials / 2
    return got.dtype == ref.dtype and torch.allclose(got.float(), ref.float(), rtol=rtol, atol=1e-6)


def _all_gather(t, group):
    like = t.view(torch.uint8) if t.dtype == E4M3 else t
    parts = [torch.empty_like(like) for _ in range(group.size())]
    dist.all_gather(parts, t.contiguous().view(parts[0].dtype), group=group)
    return [p.view(t.dtype) for p in parts]


def _gather_inputs(rank, tp, gather_dim, mode, variant, device, sizes=(BATCH, M)):
    """torch's test's operands for one case (seeded per rank, as torch's are), of A's leading
    ``sizes``."""
    leading = list(sizes)
    leading[gather_dim] //= tp
    torch.manual_seed(42 + rank)
    A_shard = torch.rand(*leading, K, device=device).to(E4M3)
    Bs = [torch.rand(N, K, device=device).to(E4M3).T for _ in range(3)]
    if mode == "tensor-wise":
        A_scale = torch.tensor(SCALE, device=device)
        B_scales = [torch.tensor(SCALE, device=device) for _ in range(3)]
        out_dtypes = [None, torch.bfloat16, torch.float32]
    else:
        full = leading if mode == "row-wise-sharded" else list(sizes)
        # one scale per row (torch's are all 0.1: these differ, so that a row meeting another
        # row's scale shows)
        A_scale = 0.05 + torch.rand(*full, 1, device=device) / 10
        B_scales = [0.05 + torch.rand(1, N, device=device) / 10 for _ in range(3)]
        if mode == "row-wise-replicated":  # the same full scale on every rank
            torch.manual_seed(7)
            A_scale = 0.05 + torch.rand(*full, 1, device=device) / 10
        out_dtypes = [torch.bfloat16] * 3
    kwargs = dict(
        biases=[None] * 3, result_scales=[None] * 3, out_dtypes=out_dtypes,
        use_fast_accum=[None] * 3,
    )  # fmt: skip
    if variant == "bias+fast_accum":
        kwargs["biases"] = [torch.rand(N, device=device).to(torch.bfloat16) for _ in range(3)]
        kwargs["biases"][1] = None
        kwargs["out_dtypes"] = [torch.bfloat16] * 3
        kwargs["use_fast_accum"] = [True] * 3
    return A_shard, Bs, A_scale, B_scales, kwargs


def _plain_all_gather_scaled_matmul(A_shard, Bs, A_scale, B_scales, gather_dim, mode, kw, group):
    """all_gather along gather_dim (and the row scales with their rows), then torch._scaled_mm
    on the flattened rows: the semantics, written out."""
    A = torch.cat(_all_gather(A_shard, group), dim=gather_dim)
    if mode == "row-wise-sharded":
        A_scale = torch.cat(_all_gather(A_scale, group), dim=gather_dim)
    scale = A_scale.reshape(-1, 1) if A_scale.numel() > 1 else A_scale
    outs = []
    for i, (B, B_scale) in enumerate(zip(Bs, B_scales)):
        out = torch.ops.aten._scaled_mm(
            A.reshape(-1, K), B, scale, B_scale, kw["biases"][i], None,
            out_dtype=kw["out_dtypes"][i], use_fast_accum=kw["use_fast_accum"][i],
        )  # fmt: skip
        outs.append(out.view(*A.shape[:-1], B.shape[1]))
    return A, outs


def _scatter_inputs(rank, row_wise, variant, device, sizes=(BATCH, M)):
    torch.manual_seed(42 + rank)
    A = torch.rand(*sizes, K, device=device).to(E4M3)
    B = torch.rand(N, K, device=device).to(E4M3).T
    if row_wise:
        A_scale = 0.05 + torch.rand(*sizes, 1, device=device) / 10
        B_scale = 0.05 + torch.rand(1, N, device=device) / 10
    else:
        A_scale = torch.tensor(SCALE, device=device)
        B_scale = torch.tensor(SCALE, device=device)
    if variant == "2-D A":
        A, A_scale = A.flatten(0, 1), (A_scale.flatten(0, 1) if row_wise else A_scale)
    bias = torch.rand(N, device=device).to(torch.bfloat16) if variant == "bias" else None
    return A, B, A_scale, B_scale, bias


def compat_fp8_worker(
    rank, tp, device="cpu", gather_cases=GATHER_CASES, scatter_cases=SCATTER_CASES, sizes=(BATCH, M)
):
    """Every ported case (or those given, of A's leading ``sizes`` [BATCH, M]): torch_compat_fp8's
    results against torch's reference and a plain all_gather/all_reduce, their dtypes, strides
    and shapes, and how many distgemm calls served it."""
    calls = count_distgemm_calls(device)
    group = dist.group.WORLD
    name = group.group_name
    restore = _bytes_all_gather()
    results = {}
    for gather_dim, mode, variant in gather_cases:
        A_shard, Bs, A_scale, B_scales, kw = _gather_inputs(
            rank, tp, gather_dim, mode, variant, device, sizes
        )
        ref_A, ref_mm = _fused_all_gather_scaled_matmul_fallback(
            A_shard, Bs, A_scale, B_scales, gather_dim=gather_dim, group_name=name, **kw
        )
        plain_A, plain_mm = _plain_all_gather_scaled_matmul(
            A_shard, Bs, A_scale, B_scales, gather_dim, mode, kw, group
        )
        before = calls["n"]
        A, mm = symm_mem_fp8.fused_all_gather_scaled_matmul(
            A_shard, Bs, A_scale, B_scales, gather_dim=gather_dim, group_name=name, **kw
        )
        results[("gather", gather_dim, mode, variant)] = {
            # torch's assertions: A allclose (here equal), each output allclose, same strides
            # and dtype
            "A": torch.equal(A.view(torch.uint8), ref_A.view(torch.uint8))
            and torch.equal(A.view(torch.uint8), plain_A.view(torch.uint8))
            and A.stride() == ref_A.stride(),
            "count": len(mm) == len(Bs),
            "values": all(_close(a, b) for a, b in zip(mm, ref_mm)),
            "exact": all(torch.equal(a.float(), b.float()) for a, b in zip(mm, ref_mm)),
            "plain": all(_close(a, b) for a, b in zip(mm, plain_mm)),
            "strides": all(a.stride() == b.stride() for a, b in zip(mm, ref_mm)),
            "dtypes": [str(a.dtype) for a in mm],
            "ref dtypes": [str(b.dtype) for b in ref_mm],
            "shapes": [list(a.shape) for a in mm],
            "distgemm calls": calls["n"] - before,
        }
    for scatter_dim, row_wise, reduce_op, variant in scatter_cases:
        A, B, A_scale, B_scale, bias = _scatter_inputs(rank, row_wise, variant, device, sizes)
        output_shape = [*sizes, N]
        args = (A, B, A_scale, B_scale, reduce_op, scatter_dim, 0 if A.dim() == 2 else scatter_dim)
        kw = dict(bias=bias, out_dtype=torch.bfloat16)
        ref = _fused_scaled_matmul_reduce_scatter_fallback(*args, name, list(output_shape), **kw)
        product = torch._scaled_mm(
            A.reshape(-1, K), B, A_scale.reshape(-1, 1) if row_wise else A_scale, B_scale,
            bias=bias, out_dtype=torch.bfloat16,
        )  # fmt: skip
        full = product.float().view(output_shape)
        dist.all_reduce(full, group=group)
        if reduce_op == "avg":
            full /= tp
        plain = full.chunk(tp, dim=scatter_dim)[rank].to(torch.bfloat16)
        before = calls["n"]
        out = symm_mem_fp8.fused_scaled_matmul_reduce_scatter(*args, name, list(output_shape), **kw)
        try:  # torch's assertion: self.assertEqual (dtype-dependent tolerances)
            torch.testing.assert_close(out, ref)
            values = True
        except AssertionError:
            values = False
        results[("scatter", scatter_dim, row_wise, reduce_op, variant)] = {
            "values": values,
            "exact": torch.equal(out, ref),
            "plain": _close(out, plain, max(2, tp)),
            "strides": out.stride() == ref.stride(),
            "dtypes": [str(out.dtype)],
            "ref dtypes": [str(ref.dtype)],
            "shapes": [list(out.shape)],
            "distgemm calls": calls["n"] - before,
        }
    restore()
    return results


@pytest.fixture(scope="module")
def compat_results(tmp_path_factory):
    return run_ranks(compat_fp8_worker, tmp_path_factory.mktemp("compat_fp8"))


def served(key, on_cuda: bool) -> bool:
    """Whether distgemm serves a case on CUDA: all but torch's tensor-wise gathers (their
    out_dtypes include None and fp32), the scatters of N (N/TP = 8 is not a multiple of 16)
    and the bias of a reduce-scatter."""
    if not on_cuda:
        return False
    if key[0] == "gather":
        return not (key[2] == "tensor-wise" and key[3] == "torch")
    return key[1] != 2 and key[4] != "bias"


def case_failures(results, key, on_cuda: bool, sizes=(BATCH, M)) -> list[str]:
    """What compat_fp8_worker got wrong on any rank for one case (``key``): values, dtypes,
    strides or shapes against torch, or distgemm serving a case it should not (or not serving
    one it should). Where torch's computation runs (the fallback), bit-equal to torch's."""
    kind, dim = key[:2]
    shape = [*sizes, N]
    if kind == "scatter":
        shape[dim] //= len(results)
    failures = []
    for rank, result in enumerate(results):
        r = result[key]
        checks = ["values", "plain", "strides"] + (["A", "count"] if kind == "gather" else [])
        checks += [] if served(key, on_cuda) else ["exact"]
        failures += [f"rank {rank} {key}: {c}" for c in checks if not r[c]]
        if r["dtypes"] != r["ref dtypes"]:
            failures.append(f"rank {rank} {key}: dtypes {r['dtypes']}, torch {r['ref dtypes']}")
        if r["shapes"] != [shape] * len(r["shapes"]):
            failures.append(f"rank {rank} {key}: shapes {r['shapes']}, expected {shape}")
        if r["distgemm calls"] != int(served(key, on_cuda)):
            failures.append(f"rank {rank} {key}: {r['distgemm calls']} distgemm calls")
    return failures


CASE_KEYS = [("gather", *case) for case in GATHER_CASES]
CASE_KEYS += [("scatter", *case) for case in SCATTER_CASES]


@pytest.mark.parametrize("key", CASE_KEYS, ids=lambda key: "-".join(map(str, key)))
def test_ported_case(compat_results, key):
    """One case of torch's tests (or ours beside them) on both ranks."""
    failures = case_failures(compat_results, key, on_cuda=False)
    assert not failures, failures


def test_ported_output_dtypes(compat_results):
    """torch's tensor-wise case asks for out_dtypes [None, bf16, fp32]: None is A's dtype."""
    got = compat_results[0][("gather", 0, "tensor-wise", "torch")]["dtypes"]
    assert got == ["torch.float8_e4m3fn", "torch.bfloat16", "torch.float32"]


# Every TP of CPU_TPS: a gather and a scatter along each leading dim, on leading sizes that split
# over each TP (test_symm_mem.EVERY_TP_SIZES); and the ValueError of an output_shape whose scatter
# dim does not.
EVERY_TP_GATHER = [(0, "tensor-wise", "torch"), (1, "row-wise-sharded", "torch")]
EVERY_TP_SCATTER = [(0, True, "avg", "torch"), (1, False, "sum", "2-D A")]


def every_tp_worker(rank, tp):
    """compat_fp8_worker's results for the EVERY_TP cases, and the ValueError of a reduce-scatter
    whose scatter dim does not split over ``tp``, raised before any collective."""
    results = compat_fp8_worker(rank, tp, "cpu", EVERY_TP_GATHER, EVERY_TP_SCATTER, EVERY_TP_SIZES)
    rows, scale = 2 * tp + 1, torch.tensor(SCALE)
    A, B = torch.rand(rows, 4, K).to(E4M3), torch.rand(N, K).to(E4M3).T
    args = (A, B, scale, scale, "sum", 0, 0, dist.group.WORLD.group_name, [rows, 4, N])
    return results, value_error(
        lambda: symm_mem_fp8.fused_scaled_matmul_reduce_scatter(*args, out_dtype=torch.bfloat16)
    )


@pytest.mark.parametrize("tp", CPU_TPS)
def test_every_tp_matches_torch_and_every_rank_raises_on_an_indivisible_scatter(tmp_path, tp):
    results = run_ranks(every_tp_worker, tmp_path, tp=tp)
    error = (
        f"fused_scaled_matmul_reduce_scatter: output_shape[0]={2 * tp + 1} is not divisible by "
        f"tp={tp}"
    )
    cases = (EVERY_TP_GATHER, EVERY_TP_SCATTER)
    failures = every_tp_failures(results, tp, cases, case_failures, error)
    assert not failures, failures


# ---------------------------------------------------------------------------------------------
# Where distgemm serves a call, and why not


def _fake(shape, dtype=E4M3, is_cuda=True):
    return types.SimpleNamespace(shape=torch.Size(shape), dtype=dtype, is_cuda=is_cuda)


def _ag_reason(A_shape=(32, 64, 32), Ns=(16, 16, 16), tp=2, is_cuda=True, **lists):
    Bs = [_fake([A_shape[-1], n], is_cuda=is_cuda) for n in Ns]
    kw = dict(
        biases=[None] * len(Ns), result_scales=[None] * len(Ns),
        out_dtypes=[torch.bfloat16] * len(Ns), use_fast_accum=[False] * len(Ns),
    )  # fmt: skip
    kw.update(lists)
    return symm_mem_fp8.all_gather_fallback_reason(_fake(A_shape, is_cuda=is_cuda), Bs, tp, **kw)


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({}, None),
        ({"biases": [None, _fake([16], torch.bfloat16), None]}, None),
        ({"is_cuda": False}, "CPU tensors"),
        ({"tp": 1}, "tp=1"),
        ({"A_shape": (32, 64, 24)}, "K=24 is not a multiple of 16"),
        ({"Ns": (16, 8)}, "sum of N=24 is not a multiple of 16"),
        ({"out_dtypes": [None] * 3}, r"out_dtypes\[0\]=None \(A's dtype, fp8\)"),
        ({"out_dtypes": [torch.bfloat16, torch.float32, None]}, r"out_dtypes\[1\]=torch.float32"),
        ({"result_scales": [None, _fake([])] + [None]}, r"result_scales\[1\] is given"),
        ({"use_fast_accum": [True, False, True]}, "use_fast_accum=.* differs"),
        ({"biases": [_fake([16], torch.float32), None, None]}, r"biases\[0\] is torch.float32"),
    ],
)
def test_all_gather_fallback_reason(kwargs, reason):
    assert_reason(_ag_reason(**kwargs), reason)


@pytest.mark.parametrize(
    "A_shape, N, dim, shape, extra, reason",
    [
        ((8, 64, 32), 16, 0, [8, 64, 16], {}, None),
        ((512, 32), 16, 1, [8, 64, 16], {}, None),
        ((8, 64, 32), 64, 2, [8, 64, 64], {}, None),
        ((8, 64, 32), 16, 2, [8, 64, 16], {}, "N/tp=8 is not a multiple of 16"),
        ((6, 32), 16, 0, [6, 16], {}, "M=6 is not divisible by 4"),
        ((8, 64, 32), 16, 0, [8, 64, 16], {"out_dtype": None}, r"out_dtype=None \(A's dtype"),
        ((8, 64, 32), 16, 0, [8, 64, 16], {"result_scale": _fake([])}, "result_scale is given"),
        ((8, 64, 32), 16, 0, [8, 64, 16], {"bias": _fake([16])}, "to every rank's partial"),
    ],
)
def test_reduce_scatter_fallback_reason(A_shape, N, dim, shape, extra, reason):
    kw = dict(bias=None, result_scale=None, out_dtype=torch.bfloat16)
    kw.update(extra)
    A, B = _fake(A_shape), _fake([A_shape[-1], N])
    assert_reason(symm_mem_fp8.reduce_scatter_fallback_reason(A, B, 2, dim, shape, **kw), reason)


# ---------------------------------------------------------------------------------------------
# Refusals, opcheck and torch.compile on a group of one rank


def _ag_args(A_shard=None, Bs=None, A_scale=None, B_scales=None, gather_dim=0, **lists):
    g = torch.Generator().manual_seed(3)
    A_shard = torch.rand(4, 8, 32, generator=g).to(E4M3) if A_shard is None else A_shard
    Bs = [torch.rand(16, 32, generator=g).to(E4M3).T] if Bs is None else Bs
    A_scale = torch.tensor(SCALE) if A_scale is None else A_scale
    B_scales = [torch.tensor(SCALE)] * len(Bs) if B_scales is None else B_scales
    kw = dict(
        biases=[None] * len(Bs), result_scales=[None] * len(Bs),
        out_dtypes=[torch.bfloat16] * len(Bs), use_fast_accum=[False] * len(Bs),
    )  # fmt: skip
    kw.update(lists)
    return (A_shard, Bs, A_scale, B_scales, gather_dim), kw


_E5M2_A = torch.zeros(4, 8, 32).to(torch.float8_e5m2)
_BF16_B = torch.zeros(32, 16, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    "args, error, message",
    [
        (_ag_args(A_shard=_E5M2_A), TypeError, "A_shard is torch.float8_e5m2; this drop-in"),
        (_ag_args(Bs=[_BF16_B]), TypeError, r"Bs\[0\] is torch.bfloat16"),
        (_ag_args(A_scale=torch.tensor(0.1).half()), TypeError, "A_scale has dtype torch.float16"),
        (_ag_args(B_scales=[torch.tensor(1)]), TypeError, r"B_scales\[0\] has dtype torch.int64"),
        (
            _ag_args(A_scale=torch.ones(4, 8, 2)),
            ValueError,
            r"A_scale has shape \[4, 8, 2\]; accepted: one value \(tensor-wise\), \[4, 8, 1\] "
            r"\(row-wise, this rank's rows, gathered with them\) or \[4, 8, 1\]",
        ),
        (
            _ag_args(A_scale=torch.ones(4, 8, 1), B_scales=[torch.ones(16)]),
            ValueError,
            r"B_scales\[0\] has shape \[16\]; accepted: one value \(tensor-wise\) or \[1, 16\]",
        ),
        (
            _ag_args(A_scale=torch.ones(4, 8, 1)),
            ValueError,
            r"A_scale is row-wise and B_scales\[0\] is tensor-wise; torch._scaled_mm takes",
        ),
        (_ag_args(biases=[]), ValueError, r"len\(biases\)=0 must equal len\(Bs\)=1"),
        (_ag_args(B_scales=[]), ValueError, r"len\(B_scales\)=0 must equal len\(Bs\)=1"),
        (_ag_args(gather_dim=2), ValueError, "gather_dim=2 is A_shard's last dim"),
        (_ag_args(gather_dim=-4), ValueError, "gather_dim=-4 is out of range for a 3-D A"),
        (
            _ag_args(Bs=[torch.zeros(16, 16).to(E4M3)]),
            ValueError,
            r"Bs\[0\] has shape \[16, 16\]; it must be \[K, N\] with K=32",
        ),
    ],
)
def test_all_gather_refusals(group_name, args, error, message):
    (A_shard, Bs, A_scale, B_scales, gather_dim), kw = args
    with pytest.raises(error, match=message):
        symm_mem_fp8.fused_all_gather_scaled_matmul(
            A_shard, Bs, A_scale, B_scales, gather_dim, group_name, **kw
        )


def _rs_call(group_name, A=None, B=None, A_scale=None, B_scale=None, reduce_op="sum", dim=0,
             dim_in_A=0, output_shape=(4, 8, 16), **kw):  # fmt: skip
    A = torch.rand(4, 8, 32).to(E4M3) if A is None else A
    B = torch.rand(16, 32).to(E4M3).T if B is None else B
    A_scale = torch.tensor(SCALE) if A_scale is None else A_scale
    B_scale = torch.tensor(SCALE) if B_scale is None else B_scale
    shape = None if output_shape is None else list(output_shape)
    return symm_mem_fp8.fused_scaled_matmul_reduce_scatter(
        A, B, A_scale, B_scale, reduce_op, dim, dim_in_A, group_name, shape, **kw
    )


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"reduce_op": "max"}, ValueError, r"reduce_op='max' is not one of \('sum', 'avg'\)"),
        ({"A": torch.zeros(32).to(E4M3)}, ValueError, r"A must have at least 2 dims, got \[32\]"),
        ({"B": torch.zeros(31, 16).to(E4M3)}, ValueError, r"B has shape \[31, 16\]; it must"),
        ({"dim_in_A": 3}, ValueError, "scatter_dim_after_maybe_reshape=3 is out of range"),
        ({"dim": 3}, ValueError, "orig_scatter_dim=3 is out of range"),
        ({"output_shape": None}, ValueError, "output_shape is required"),
        ({"output_shape": (4, 4, 16)}, ValueError, r"output_shape=\[4, 4, 16\] must be"),
        ({"output_shape": (4, 8, 8)}, ValueError, r"must be \[\.\.\., N=16\] with 32 rows"),
        ({"A": torch.zeros(4, 8, 32).to(torch.float8_e5m2)}, TypeError, "A is torch.float8_e5m2"),
        ({"B": torch.zeros(32, 16).to(torch.float8_e5m2)}, TypeError, "B is torch.float8_e5m2"),
        ({"A_scale": torch.tensor(1.0).double()}, TypeError, "A_scale has dtype torch.float64"),
        (
            {"A_scale": torch.ones(4, 8)},
            ValueError,
            r"A_scale has shape \[4, 8\]; accepted: one value \(tensor-wise\) or \[4, 8, 1\]",
        ),
        ({"B_scale": torch.ones(1, 8)}, ValueError, r"B_scale has shape \[1, 8\]; accepted"),
        (
            {"B_scale": torch.ones(1, 16)},
            ValueError,
            "A_scale is tensor-wise and B_scale is row-wise",
        ),
    ],
)
def test_reduce_scatter_refusals(group_name, kwargs, error, message):
    with pytest.raises(error, match=message):
        _rs_call(group_name, **kwargs)


def _opcheck_cases(group_name, dim):
    g = torch.Generator().manual_seed(5)
    A = torch.rand(4, 8, 32, generator=g).to(E4M3)
    Bs = [torch.rand(n, 32, generator=g).to(E4M3).T for n in (16, 32)]
    row_A, row_Bs = torch.rand(4, 8, 1, generator=g), [torch.rand(1, n) for n in (16, 32)]
    mixed = dict(
        biases=[None, None], result_scales=[None, None],
        out_dtypes=[None, torch.float32], use_fast_accum=[False, True],
    )  # fmt: skip
    bf16 = dict(mixed, out_dtypes=[torch.bfloat16] * 2)
    one = torch.tensor(SCALE)
    cases = [
        (symm_mem_fp8.fused_scaled_matmul_reduce_scatter,
         (A, Bs[0], row_A, row_Bs[0], "avg", dim, dim, group_name, [4, 8, 16]),
         {"out_dtype": torch.bfloat16}),
        (symm_mem_fp8.fused_scaled_matmul_reduce_scatter,
         (A, Bs[1], one, one, "sum", dim, dim, group_name, [4, 8, 32]),
         {"out_dtype": torch.float32, "use_fast_accum": True}),
    ]  # fmt: skip
    if dim < 2:
        cases += [
            (symm_mem_fp8.fused_all_gather_scaled_matmul,
             (A, Bs, one, [one, one], dim, group_name), mixed),
            (symm_mem_fp8.fused_all_gather_scaled_matmul,
             (A, Bs, row_A, row_Bs, dim, group_name), bf16),
        ]  # fmt: skip
    return cases


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_opcheck_and_fake_strides(group_name, dim):
    for op, args, kwargs in _opcheck_cases(group_name, dim):
        result = torch.library.opcheck(op, args, kwargs, test_utils=OPCHECK_TESTS)
        assert set(result.values()) == {"SUCCESS"}, result


def _flat(result) -> list:
    return [result] if isinstance(result, torch.Tensor) else [result[0], *result[1]]


def _tensors(args, kwargs) -> list:
    flat = [*args, *kwargs.values()]
    flat = [x for a in flat for x in (a if isinstance(a, list) else [a])]
    return [t for t in flat if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_no_mutation_no_alias(group_name, dim):
    """What opcheck's test_schema checks for an op with mutates_args=(): no input changes (byte
    for byte) and no output shares an input's storage."""
    for op, args, kwargs in _opcheck_cases(group_name, dim):
        inputs = _tensors(args, kwargs)
        before = [t.view(torch.uint8).clone() if t.dtype == E4M3 else t.clone() for t in inputs]
        outputs = _flat(op(*args, **kwargs))
        for t, b in zip(inputs, before):
            assert torch.equal(t.view(torch.uint8) if t.dtype == E4M3 else t, b), op
        storages = {t.untyped_storage().data_ptr() for t in inputs}
        assert not storages & {o.untyped_storage().data_ptr() for o in outputs}, op


def test_fake_kernel_matches_real(group_name):
    """The fake kernels' shapes, strides and dtypes are the real results' (opcheck checks the
    dtype and shape; strides here, torch's op being needs_fixed_stride_order)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for dim in (0, 1, 2):
        for op, args, kwargs in _opcheck_cases(group_name, dim):
            real = op(*args, **kwargs)
            with FakeTensorMode(allow_non_fake_inputs=True):
                fake = op(*args, **kwargs)
            for r, f in zip(_flat(real), _flat(fake), strict=True):
                assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype), op


def test_compiled_call_is_one_node(group_name):
    one = torch.tensor(SCALE)
    lists = dict(
        biases=[None], result_scales=[None], out_dtypes=[torch.bfloat16], use_fast_accum=[False]
    )

    def f(A, B):
        A_full, (y,) = symm_mem_fp8.fused_all_gather_scaled_matmul(
            A, [B], one, [one], 1, group_name, **lists
        )
        z = symm_mem_fp8.fused_scaled_matmul_reduce_scatter(
            A_full, B, one, one, "sum", 0, 0, group_name, [4, 8, 16], out_dtype=torch.bfloat16
        )
        return z + y

    g = torch.Generator().manual_seed(6)
    args = (torch.rand(4, 8, 32, generator=g).to(E4M3), torch.rand(16, 32).to(E4M3).T)
    assert compiled_distgemm_ops(f, args) == [
        "distgemm.fused_all_gather_scaled_matmul.default",
        "distgemm.fused_scaled_matmul_reduce_scatter.default",
    ]


@pytest.mark.parametrize(
    "out_dtypes", [[torch.bfloat16] * 2, [None, torch.float32]], ids=["bf16", "fp8-fp32"]
)
def test_op_reads_out_dtypes_as_dtypes(group_name, monkeypatch, out_dtypes):
    """Through the dispatcher the op's ``ScalarType?[] out_dtypes`` arrive as ScalarType numbers;
    the reason it decides by sees the dtypes the caller passed (numbers would refuse every
    call, bf16 included, as "out_dtypes[0]=15")."""
    seen = []
    real = symm_mem_fp8.all_gather_fallback_reason

    def recording(*args):
        seen.append(args[5])
        return real(*args)

    monkeypatch.setattr(symm_mem_fp8, "all_gather_fallback_reason", recording)
    g = torch.Generator().manual_seed(8)
    A = torch.rand(4, K, generator=g).to(E4M3)
    Bs = [torch.rand(N, K, generator=g).to(E4M3).T for _ in out_dtypes]
    one = torch.tensor(SCALE)
    _, outs = symm_mem_fp8.fused_all_gather_scaled_matmul(
        A, Bs, one, [one] * len(Bs), 0, group_name, biases=[None] * len(Bs),
        result_scales=[None] * len(Bs), out_dtypes=out_dtypes, use_fast_accum=[False] * len(Bs),
    )  # fmt: skip
    assert seen == [out_dtypes]
    assert [o.dtype for o in outs] == [d or E4M3 for d in out_dtypes]
