"""_core.gemm (one GEMM of distgemm's kernel on torch tensors) and the kernel-vs-cuBLAS benchmark
on one Hopper GPU:

- both tiles and the wave model's pick against torch.mm on shapes with partial tiles in m and n,
  the N-contiguous B variant, and replays of a CUDA graph that captured the call;
- a rejected GEMM is a ValueError and leaves the device usable;
- benchmarks/kernel_vs_cublas.py on one small Llama shape: the record is measured, checked and
  not below the compute floor.

    python3 -m pytest -q tests/gpu/test_kernel_gemm.py

Tolerance: relative Frobenius error against torch.mm in bf16 < 1e-2 (a few times bf16's
rounding of 2^-8 = 3.9e-3 on outputs of unit scale). Skips, with the reason, without a Hopper
GPU or without the CUDA runtime in the installed package.
"""

import json
import math

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import skip_reason  # noqa: E402

from distgemm import _core  # noqa: E402

_SKIP = skip_reason(1)
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))
TOL = 1e-2


def _operands(m, n, k, seed=7):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.empty((m, k), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
    w = torch.empty((n, k), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
    return a, w / math.sqrt(k)


def _rel_err(x, ref):
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def _gemm(a, b, d, m, n, k, **kw):
    return _core.gemm(
        a.data_ptr(), b.data_ptr(), d.data_ptr(), m, n, k,
        cuda_device=torch.cuda.current_device(),
        stream=torch.cuda.current_stream().cuda_stream, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("m,n,k", [(1000, 1032, 520), (256, 4096, 2048), (4096, 8192, 1024)])
@pytest.mark.parametrize("tile", [0, 128, 256])
def test_gemm_matches_torch_mm(m, n, k, tile):
    a, w = _operands(m, n, k)
    ref = torch.mm(a, w.t())
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ran = _gemm(a, w, d, m, n, k, tile_n=tile)
    torch.cuda.synchronize()
    model = _core.choose_tile_n(
        m, n, 1, _core.gemm_resident_ctas("bf16", 256, 0), _core.gemm_resident_ctas("bf16", 128, 0)
    )["tile_n"]
    assert ran == (tile or model)
    assert _rel_err(d, ref) < TOL


def test_gemm_n_major_b_and_graph_replay():
    m, n, k = 512, 2048, 1024
    a, w = _operands(m, n, k)
    ref = torch.mm(a, w.t())
    b_kn = w.t().contiguous()  # [k, n], N contiguous
    d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    assert _gemm(a, b_kn, d, m, n, k, b_n_major=True) == 256
    torch.cuda.synchronize()
    assert _rel_err(d, ref) < TOL
    d.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(3):
            _gemm(a, w, d, m, n, k, tile_n=128)
    d.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert _rel_err(d, ref) < TOL


def test_rejected_gemm_leaves_the_device_usable():
    a, w = _operands(256, 128, 64)
    d = torch.empty((256, 128), device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="K=60"):
        _gemm(a, w, d, 256, 128, 60)
    with pytest.raises(ValueError, match="16-byte aligned"):
        _core.gemm(a.data_ptr() + 2, w.data_ptr(), d.data_ptr(), 256, 128, 64, cuda_device=0,
                   stream=torch.cuda.current_stream().cuda_stream)  # fmt: skip
    _gemm(a, w, d, 256, 128, 64)
    torch.cuda.synchronize()
    assert _rel_err(d, torch.mm(a, w.t())) < TOL


def test_benchmark_measures_one_shape(tmp_path):
    from benchmarks import kernel_report as rep
    from benchmarks import kernel_vs_cublas as bench

    argv = ["--models", "8B", "--tp", "8", "--tokens", "1024", "--layers", "O", "--limit", "1"]
    assert bench.main(argv + ["--out", str(tmp_path), "--stem", "one"]) == 0
    doc = json.loads((tmp_path / "one.json").read_text())
    (rec,) = doc["records"]
    assert (rec["m"], rec["n"], rec["k"], rec["local"]) == (1024, 4096, 512, True)
    assert rec["status"] == "ok" and rec["model_tile"] in (128, 256)
    assert all(rec["err"][f"n{t}"] < TOL for t in rep.TILES)
    assert rec["derived"]["below_floor"] == []
    assert 0.5 < rec["derived"]["ratio"] < 2.0  # a sanity bound; the acceptance is the report's
    assert (tmp_path / "one.png").exists() and doc["meta"]["complete"] is True
