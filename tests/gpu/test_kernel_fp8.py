"""The fp8 (e4m3) GEMM kernels through _core.gemm on one Hopper GPU: tensor-wise and row-wise
scales, accurate and fast accumulation, against an fp32 GEMM of the dequantized inputs and
against torch._scaled_mm in the same run; sub-GEMMs that start at a row offset (as plan steps
do); CUDA graph replays with fresh data; the refusals; and cuBLASLt's fp8 GEMM as the runtime
runs it (gemm(cublas_algo=0): tensor-wise scales, row-wise ones as its outer-vector scales where
its heuristic offers an algorithm for them).

    python3 -m pytest -q tests/gpu/test_kernel_fp8.py

Tolerance: relative Frobenius error against the fp32 GEMM of the dequantized inputs < 1e-2 (the
issue's bound); bf16 output rounding alone gives ~2e-3. Our error may also not exceed twice
torch._scaled_mm's (same inputs, same accumulation mode) plus 1e-4. Skips, with the reason,
without a Hopper GPU or without the CUDA runtime in the installed package.
"""

import math

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import skip_reason  # noqa: E402

from distgemm import _core  # noqa: E402
from distgemm.runtime.scales import dequantize, quantize, scaled_mm_scales  # noqa: E402

_SKIP = skip_reason(1)
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))
TOL = 1e-2
E4M3 = torch.float8_e4m3fn


def dequantized_mm(qa, sa, qb, sb):
    return dequantize(qa, sa) @ dequantize(qb, sb).t()


def rel_err(x, ref):
    return float((x.float() - ref).norm() / ref.norm())


def operands(m, n, k, row_a, row_b, seed=11):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.empty((m, k), device="cuda").uniform_(-1, 1, generator=gen)
    # rows of different magnitude, so that a row-wise scale matters
    a *= torch.empty((m, 1), device="cuda").uniform_(0.1, 4, generator=gen)
    w = torch.empty((n, k), device="cuda").uniform_(-1, 1, generator=gen) / math.sqrt(k)
    qa, sa = quantize(a, row_a)
    qb, sb = quantize(w, row_b)
    return qa, sa, qb, sb


def fp8_gemm(qa, sa, qb, sb, d, m, n, k, fast_accum=False, **kw):
    return _core.gemm(
        qa.data_ptr(), qb.data_ptr(), d.data_ptr(), m, n, k, "e4m3",
        cuda_device=torch.cuda.current_device(), stream=torch.cuda.current_stream().cuda_stream,
        scale_a=sa.data_ptr(), scale_a_rows=sa.numel() > 1, scale_b=sb.data_ptr(),
        scale_b_rows=sb.numel() > 1, fast_accum=fast_accum, **kw,
    )  # fmt: skip


def scaled_mm(qa, sa, qb, sb, fast_accum):
    """torch's scaled GEMM of the same inputs (row-wise scales as [m, 1] and [1, n])."""
    sa, sb = scaled_mm_scales(sa, sb, qa.shape[0], qb.shape[0])
    return torch._scaled_mm(
        qa, qb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum
    )


SHAPES = [(1000, 1040, 528), (8, 4096, 1024), (4096, 8192, 1024), (256, 1024, 8192)]
KINDS = [(False, False), (True, True), (False, True), (True, False)]


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize(
    "row_a,row_b", KINDS, ids=["tensor", "row", "tensorA-rowB", "rowA-tensorB"]
)
@pytest.mark.parametrize("fast_accum", [False, True], ids=["accurate", "fast"])
def test_fp8_gemm_matches_dequantized_fp32(m, n, k, row_a, row_b, fast_accum):
    qa, sa, qb, sb = operands(m, n, k, row_a, row_b)
    ref = dequantized_mm(qa, sa, qb, sb)
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ran = fp8_gemm(qa, sa, qb, sb, d, m, n, k, fast_accum=fast_accum)
    theirs = scaled_mm(qa, sa, qb, sb, fast_accum)
    torch.cuda.synchronize()
    kernel = "e4m3_128x256fa" if fast_accum else "e4m3_128x192"
    assert ran == _core.gemm_config_table()[kernel]["tile_n"]  # the kernel fast_accum names
    err, err_torch = rel_err(d, ref), rel_err(theirs, ref)
    assert err < TOL, (err, err_torch)
    assert err <= 2 * err_torch + 1e-4, (err, err_torch)


@pytest.mark.parametrize("k", [128, 384, 896, 1024, 1152, 4096])
def test_fp8_accurate_kernel_at_every_k_tile_count(k):
    """The accurate kernel's consumer loop takes k-tiles of 128 in unrolled runs of 8, then one
    at a time: 1, 3 and 7 k-tiles (no run), 8 (one run), 9 (a run and one more), 32 (runs only)."""
    m, n = 384, 1152
    qa, sa, qb, sb = operands(m, n, k, True, True, seed=k)
    ref = dequantized_mm(qa, sa, qb, sb)
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    fp8_gemm(qa, sa, qb, sb, d, m, n, k)
    theirs = scaled_mm(qa, sa, qb, sb, False)
    torch.cuda.synchronize()
    err, err_torch = rel_err(d, ref), rel_err(theirs, ref)
    assert err < TOL, (err, err_torch)
    assert err <= 2 * err_torch + 1e-4, (err, err_torch)


@pytest.mark.parametrize("swizzle,raster", [(1, 1), (8, 1), (8, 2), (4, 2)])
@pytest.mark.parametrize("fast_accum", [False, True], ids=["accurate", "fast"])
def test_fp8_tile_order_on_a_grid_no_swizzle_divides(swizzle, raster, fast_accum):
    """70B QKV's column count at TP=2 (27 tiles of 192, 20 of 256) over 17 row tiles of 128:
    the tile walk's narrower last group, several waves; a skipped tile would leave D's NaN."""
    m, n, k = 128 * 17, 5120, 512
    qa, sa, qb, sb = operands(m, n, k, True, True, seed=swizzle + raster)
    ref = dequantized_mm(qa, sa, qb, sb)
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    fp8_gemm(qa, sa, qb, sb, d, m, n, k, fast_accum=fast_accum, swizzle=swizzle, raster=raster)
    theirs = scaled_mm(qa, sa, qb, sb, fast_accum)
    torch.cuda.synchronize()
    err, err_torch = rel_err(d, ref), rel_err(theirs, ref)
    assert err < TOL, (err, err_torch)
    assert err <= 2 * err_torch + 1e-4, (err, err_torch)


@pytest.mark.parametrize("fast_accum", [False, True], ids=["accurate", "fast"])
def test_fp8_sub_gemm_at_a_row_offset(fast_accum):
    """A plan step's GEMM: rows m0.. of A with the scale pointer at row m0, columns n0.. of the
    output with B's rows n0.. and their scales (pointer arithmetic only, as the graph does)."""
    m, n, k, m0, n0, mm, nn = 1536, 2048, 1024, 520, 768, 700, 1024
    qa, sa, qb, sb = operands(m, n, k, True, True)
    ref = dequantized_mm(qa, sa, qb, sb)[m0 : m0 + mm, n0 : n0 + nn]
    d = torch.full((mm, nn), float("nan"), device="cuda", dtype=torch.bfloat16)
    _core.gemm(
        qa[m0:].data_ptr(), qb[n0:].data_ptr(), d.data_ptr(), mm, nn, k, "e4m3",
        cuda_device=torch.cuda.current_device(), stream=torch.cuda.current_stream().cuda_stream,
        scale_a=sa[m0:].data_ptr(), scale_a_rows=True, scale_b=sb[n0:].data_ptr(),
        scale_b_rows=True, fast_accum=fast_accum,
    )  # fmt: skip
    torch.cuda.synchronize()
    assert rel_err(d, ref) < TOL


def test_fp8_graph_replays_read_fresh_inputs_and_scales():
    m, n, k = 1024, 2048, 1024
    qa, sa, qb, sb = operands(m, n, k, True, True)
    d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    fp8_gemm(qa, sa, qb, sb, d, m, n, k)  # set-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp8_gemm(qa, sa, qb, sb, d, m, n, k)
    worst = 0.0
    for seed in range(20):
        fa, fsa, fb, fsb = operands(m, n, k, True, True, seed=100 + seed)
        qa.copy_(fa)
        sa.copy_(fsa)
        qb.copy_(fb)
        sb.copy_(fsb)
        d.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        worst = max(worst, rel_err(d, dequantized_mm(qa, sa, qb, sb)))
    assert worst < TOL


def test_fp8_refusals_name_the_constraint():
    m, n, k = 256, 256, 256
    qa, sa, qb, sb = operands(m, n, k, True, True)
    d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    dev, stream = torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream
    base = dict(cuda_device=dev, stream=stream)
    ptrs = (qa.data_ptr(), qb.data_ptr(), d.data_ptr(), m, n, k, "e4m3")
    with pytest.raises(ValueError, match="needs both scales"):
        _core.gemm(*ptrs, **base, scale_a=sa.data_ptr(), scale_a_rows=True)
    with pytest.raises(ValueError, match="are for fp8 \\(e4m3\\) inputs; this GEMM is bf16"):
        _core.gemm(*ptrs[:6], "bf16", **base, scale_a=sa.data_ptr(), scale_b=sb.data_ptr())
    with pytest.raises(ValueError, match="must be K-contiguous"):
        _core.gemm(*ptrs, b_n_major=True, **base, scale_a=sa.data_ptr(), scale_b=sb.data_ptr())
    with pytest.raises(ValueError, match="4-byte aligned"):
        _core.gemm(*ptrs, **base, scale_a=sa.data_ptr() + 2, scale_b=sb.data_ptr())
    with pytest.raises(ValueError, match="name different fp8 kernels"):
        _core.gemm(*ptrs, **base, scale_a=sa.data_ptr(), scale_b=sb.data_ptr(),
                   config="e4m3_128x256fa")  # fmt: skip
    with pytest.raises(ValueError, match="is an fp8 \\(e4m3\\) kernel; bf16"):
        _core.gemm(*ptrs[:6], "bf16", **base, config="e4m3_128x192")
    with pytest.raises(ValueError, match="K=520 of a sub-GEMM is not a multiple of 16"):
        _core.gemm(*ptrs[:5], 520, "e4m3", **base, scale_a=sa.data_ptr(), scale_b=sb.data_ptr())
    # the device stays usable after the refusals
    fp8_gemm(qa, sa, qb, sb, d, m, n, k)
    torch.cuda.synchronize()
    assert rel_err(d, dequantized_mm(qa, sa, qb, sb)) < TOL


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize(
    "row_a,row_b", KINDS, ids=["tensor", "row", "tensorA-rowB", "rowA-tensorB"]
)
@pytest.mark.parametrize("fast_accum", [False, True], ids=["accurate", "fast"])
def test_cublaslt_fp8_matches_dequantized_fp32(m, n, k, row_a, row_b, fast_accum):
    """cuBLASLt's fp8 GEMM (gemm(cublas_algo=0)): tensor-wise scales, and row-wise ones as its
    outer-vector scales where its heuristic offers an algorithm for them; the same bounds as
    distgemm's kernels. Where it offers none (on H200 with cuBLASLt 13.1, 2026-11-28: one
    operand row-wise and the other tensor-wise), the count is 0 and a launch is refused with the
    reason."""
    why = _core.cublaslt_problem()
    if why:
        pytest.skip(f"cuBLASLt unavailable: {why}")
    count = _core.cublaslt_algo_count(
        m, n, k, "e4m3", cuda_device=torch.cuda.current_device(), scale_a_rows=row_a,
        scale_b_rows=row_b, fast_accum=fast_accum,
    )  # fmt: skip
    qa, sa, qb, sb = operands(m, n, k, row_a, row_b)
    if count == 0:
        assert row_a or row_b, "cuBLASLt offers no algorithm for tensor-wise fp8 scales"
        d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="has 0 algorithm\\(s\\).*outer-vector scale mode"):
            fp8_gemm(qa, sa, qb, sb, d, m, n, k, fast_accum=fast_accum, cublas_algo=0)
        return
    ref = dequantized_mm(qa, sa, qb, sb)
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert fp8_gemm(qa, sa, qb, sb, d, m, n, k, fast_accum=fast_accum, cublas_algo=0) == 0
    theirs = scaled_mm(qa, sa, qb, sb, fast_accum)
    torch.cuda.synchronize()
    err, err_torch = rel_err(d, ref), rel_err(theirs, ref)
    assert err < TOL, (err, err_torch)
    assert err <= 2 * err_torch + 1e-4, (err, err_torch)


def test_cublaslt_refuses_an_unaligned_row_scale_and_distgemm_runs_it():
    """A row-wise scale that starts off a 16-byte boundary (a step's slice of the rows can) is
    refused for cuBLASLt with the reason, and distgemm's kernel (the default) runs the same GEMM
    right."""
    why = _core.cublaslt_problem()
    if why:
        pytest.skip(f"cuBLASLt unavailable: {why}")
    m, n, k = 1000, 1040, 528
    qa, sa, qb, sb = operands(m, n, k, True, True)
    shifted = torch.empty(sa.numel() + 1, device="cuda", dtype=sa.dtype)
    shifted[1:].copy_(sa.flatten())
    sa_off = shifted[1:].view_as(sa)  # 4 bytes past a 16-byte boundary
    assert sa_off.data_ptr() % 16 == 4
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="16-byte boundary.*starts 4 bytes past one"):
        fp8_gemm(qa, sa_off, qb, sb, d, m, n, k, cublas_algo=0)
    fp8_gemm(qa, sa_off, qb, sb, d, m, n, k)
    torch.cuda.synchronize()
    assert rel_err(d, dequantized_mm(qa, sa, qb, sb)) < TOL
