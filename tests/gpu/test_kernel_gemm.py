"""_core.gemm (one GEMM of distgemm's kernel on torch tensors) and the kernel-vs-cuBLAS benchmark
on one Hopper GPU:

- both tiles and the model's pick against torch.mm on shapes with partial tiles in m and n,
  the N-contiguous B variant, and replays of a CUDA graph that captured the call;
- every kernel configuration (bf16: 128x256, 128x128, 128x128c1, 256x192; fp16: the first two)
  against torch.mm, decode (M=8) and odd M tile counts included, and the auto choice on the
  device equal to _core.choose_config with the device's resident CTAs;
- the stream-K configurations (128x256sk, 128x128sk) with their workspace, in every
  decomposition (CUTLASS's heuristic, data-parallel, split-K, stream-K): against torch.mm, the
  model's choice when a workspace is offered, the refusals without one or with a decomposition
  they do not take, and launches of several shapes and graph replays sharing one workspace (each
  launch leaves its split counters zeroed);
- a rejected GEMM is a ValueError and leaves the device usable;
- cuBLASLt as the runtime runs it (cublas_algo): its first ranks against torch.mm, an
  N-contiguous B, a graph replay, the refusals, and the kernel table routing 'auto' to a row's
  kernel;
- benchmarks/kernel/kernel_vs_cublas.py on one small Llama shape: the record is measured, checked
  and not below the compute floor.

    python3 -m pytest -q tests/gpu/test_kernel_gemm.py

Tolerance: relative Frobenius error against torch.mm in bf16 < 1e-2 (a few times bf16's
rounding of 2^-8 = 3.9e-3 on outputs of unit scale). Skips, with the reason, without a Hopper
GPU or without the CUDA runtime in the installed package.
"""

import json
import math
import pathlib

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


def _device_choice(m, n, dtype="bf16"):
    """The configuration the model picks for m x n with this device's resident CTAs."""
    names = _core.gemm_config_names(dtype)
    slots = {c: _core.gemm_resident_ctas(dtype, cuda_device=0, config=c) for c in names}
    return _core.choose_config(m, n, 1, dtype, slots=slots)["config"]


def _gemm(a, b, d, m, n, k, **kw):
    return _core.gemm(
        a.data_ptr(), b.data_ptr(), d.data_ptr(), m, n, k,
        cuda_device=torch.cuda.current_device(),
        stream=torch.cuda.current_stream().cuda_stream, **kw,
    )  # fmt: skip


def _run_checked(m, n, k, **kw):
    """(the tile width gemm() ran with, its relative error against torch.mm) on fresh operands;
    D starts as NaN, so that a tile the kernel skips shows."""
    a, w = _operands(m, n, k)
    ref = torch.mm(a, w.t())
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ran = _gemm(a, w, d, m, n, k, **kw)
    torch.cuda.synchronize()
    return ran, _rel_err(d, ref)


@pytest.mark.parametrize("m,n,k", [(1000, 1032, 520), (256, 4096, 2048), (4096, 8192, 1024)])
@pytest.mark.parametrize("tile", [0, 128, 256])
def test_gemm_matches_torch_mm(m, n, k, tile):
    ran, err = _run_checked(m, n, k, tile_n=tile)
    model = _core.gemm_config_table()[_device_choice(m, n)]["tile_n"]
    assert ran == (tile or model)
    assert err < TOL


# (m, n, k): partial tiles in m and n; decode (M=8: one M tile, padded to two by a 2x1
# cluster); 3 and 33 M tiles of 128 rows (odd counts); 405B O at decode (N=16384, K=8192).
CONFIG_SHAPES = [
    (1000, 1032, 520),
    (8, 4096, 1024),
    (8, 16384, 8192),
    (384, 2048, 512),
    (128 * 33, 1024, 256),
    (4096, 8192, 1024),
]


@pytest.mark.parametrize("m,n,k", CONFIG_SHAPES)
@pytest.mark.parametrize("config", _core.gemm_config_names("bf16"))
def test_every_config_matches_torch_mm(m, n, k, config):
    ran, err = _run_checked(m, n, k, config=config)
    assert ran == _core.gemm_config_table()[config]["tile_n"]
    assert err < TOL, config


@pytest.mark.parametrize("swizzle,raster", [(1, 1), (2, 2), (4, 0), (8, 1), (8, 2)])
@pytest.mark.parametrize("config", ["128x256", "256x192", "128x128c1"])
@pytest.mark.parametrize(
    "m,n",
    [(128 * 33, 1280), (128 * 43, 256 * 27)],
    ids=["33x5-tiles", "43x27-tiles-several-waves"],
)
def test_tile_order_matches_torch_mm(m, n, config, swizzle, raster):
    """The data-parallel tile walk (kernel/tile_walk.hpp) on grids no swizzle above 1 divides
    (33 x 5 tiles of 128x256, 17 x 7 of 256x192; 43 x 27 of 128x256, over 8 waves): its last group
    is narrower, no tile is padded, and a tile it skipped would leave D's NaN."""
    ran, err = _run_checked(m, n, 512, config=config, swizzle=swizzle, raster=raster)
    assert ran == _core.gemm_config_table()[config]["tile_n"]
    assert err < TOL


@pytest.mark.parametrize("config", ["auto", *_core.gemm_config_names("fp16")])
def test_fp16_configs_match_torch_mm(config):
    m, n, k = 8, 4096, 1024
    gen = torch.Generator(device="cuda").manual_seed(11)
    a = torch.empty((m, k), device="cuda", dtype=torch.float16).uniform_(-1, 1, generator=gen)
    w = torch.empty((n, k), device="cuda", dtype=torch.float16).uniform_(-1, 1, generator=gen)
    w /= math.sqrt(k)
    d = torch.empty((m, n), device="cuda", dtype=torch.float16)
    _gemm(a, w, d, m, n, k, dtype="fp16", config=config)
    torch.cuda.synchronize()
    assert _rel_err(d, torch.mm(a, w.t())) < TOL
    resolved = _core.gemm_resolve_config(m, n, "fp16", config=config, cuda_device=0)
    assert resolved in _core.gemm_config_names("fp16")


@pytest.mark.parametrize("m,n,k", CONFIG_SHAPES)
def test_auto_runs_the_models_choice(m, n, k):
    want = _device_choice(m, n)
    assert _core.gemm_resolve_config(m, n, cuda_device=0) == want
    assert _core.gemm_resolve_config(m, n, tile_n=128, cuda_device=0) == "128x128"
    ran, err = _run_checked(m, n, k)
    assert ran == _core.gemm_config_table()[want]["tile_n"] and err < TOL


def test_decode_avoids_the_cluster_padding():
    """One 128-row M tile: with every configuration's resident CTAs >= 128 (an H100 or H200),
    405B O at decode runs 128 tiles of 128x128 with cluster 1x1 in one wave."""
    slots = [_core.gemm_resident_ctas("bf16", cuda_device=0, config=c) for c in ("128x128c1",)]
    if slots[0] < 128:
        pytest.skip(f"{slots[0]} resident CTAs: the decode GEMM needs more than one wave anyway")
    assert _core.gemm_resolve_config(8, 16384, cuda_device=0) == "128x128c1"
    fp16 = _core.gemm_resolve_config(8, 16384, "fp16", cuda_device=0)
    assert fp16 == _device_choice(8, 16384, "fp16") and fp16 in _core.gemm_config_names("fp16")


def test_new_configs_replay_in_a_cuda_graph():
    m, n, k = 8, 4096, 1024
    a, w = _operands(m, n, k)
    ref = torch.mm(a, w.t())
    outs = {
        c: torch.zeros((m, n), device="cuda", dtype=torch.bfloat16)
        for c in ("128x128c1", "256x192")
    }
    for c in outs:  # per-device kernel setup (shared-memory limit) before the capture
        _core.gemm_resident_ctas("bf16", cuda_device=torch.cuda.current_device(), config=c)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c, d in outs.items():
            _gemm(a, w, d, m, n, k, config=c)
    for d in outs.values():
        d.zero_()
    graph.replay()
    torch.cuda.synchronize()
    for c, d in outs.items():
        assert _rel_err(d, ref) < TOL, c


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
    with pytest.raises(ValueError, match="config=256x192 is instantiated for bf16 only"):
        _gemm(a, w, d, 256, 128, 64, dtype="fp16", config="256x192")
    with pytest.raises(ValueError, match="config=128x128c1 has no kernel for an N-contiguous B"):
        _gemm(a, w, d, 256, 128, 64, b_n_major=True, config="128x128c1")
    _gemm(a, w, d, 256, 128, 64)
    torch.cuda.synchronize()
    assert _rel_err(d, torch.mm(a, w.t())) < TOL


def _sk_workspace(m, n, k, config="128x256sk", **split):
    nbytes = _core.gemm_workspace_bytes(m, n, k, cuda_device=0, config=config, **split)
    return torch.zeros(nbytes, device="cuda", dtype=torch.uint8)


SK_CONFIGS = ["128x256sk", "128x128sk"]
# Every decomposition of the stream-K kernels; split_k with 2 and 3 K ranges per tile.
DECOMPOSITIONS = [("auto", 1), ("heuristic", 1), ("data_parallel", 1), ("split_k", 2),
                  ("split_k", 3), ("stream_k", 1)]  # fmt: skip


@pytest.mark.parametrize("config", SK_CONFIGS)
@pytest.mark.parametrize("decomposition,splits", DECOMPOSITIONS)
@pytest.mark.parametrize(
    "m,n,k", [(1024, 5120, 2048), (1000, 1032, 520), (8, 4096, 1024), (1024, 768, 4096)]
)
def test_stream_k_matches_torch_mm(m, n, k, config, decomposition, splits):
    """Each stream-K kernel in each decomposition: whole waves, a partial last wave, less than
    one wave (1024 x 768: 24 or 48 tiles), partial tiles and a K of 9 blocks."""
    split = {"decomposition": decomposition, "splits": splits}
    ws = _sk_workspace(m, n, k, config, **split)
    tail = _core.STREAM_K_TAIL_BYTES
    assert ws.numel() > tail  # CUTLASS's partials, then its split counters and the arrivals
    ran, err = _run_checked(
        m, n, k, config=config, workspace=ws.data_ptr(), workspace_bytes=ws.numel(), **split
    )
    assert ran == _core.gemm_config_table()[config]["tile_n"] and err < TOL
    assert int(ws[-tail:].count_nonzero()) == 0  # the last consumer warpgroup zeroed them


def test_decomposition_outside_stream_k_is_refused():
    m, n, k = 1024, 768, 4096
    a, w = _operands(m, n, k)
    d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="is for the stream-K configurations; config 128x128 "):
        _gemm(a, w, d, m, n, k, config="128x128", decomposition="stream_k")
    ws = _sk_workspace(m, n, k, "128x128sk")
    with pytest.raises(ValueError, match="splits=1 with decomposition split_k"):
        _gemm(a, w, d, m, n, k, config="128x128sk", workspace=ws.data_ptr(),
              workspace_bytes=ws.numel(), decomposition="split_k")  # fmt: skip
    with pytest.raises(ValueError, match="decomposition 'streamk' is not one of"):
        _gemm(a, w, d, m, n, k, config="128x128sk", decomposition="streamk")


def test_auto_with_a_workspace_runs_stream_k_on_a_partial_wave():
    m, n, k = 1024, 5120, 2048  # 160 tiles of 128x256 for 132 SMs
    names = _core.gemm_config_names("bf16", stream_k=True)
    slots = {c: _core.gemm_resident_ctas("bf16", cuda_device=0, config=c) for c in names}
    want = _core.choose_config(m, n, 1, "bf16", slots=slots, stream_k=True)["config"]
    assert _core.gemm_resolve_config(m, n, cuda_device=0, stream_k=True) == want
    assert _core.gemm_resolve_config(m, n, cuda_device=0) != "128x256sk"  # no workspace
    nbytes = _core.gemm_workspace_bytes(m, n, k, cuda_device=0)
    assert (nbytes > 0) == (want == "128x256sk")
    ws = torch.zeros(max(nbytes, 16), device="cuda", dtype=torch.uint8)
    ran, err = _run_checked(m, n, k, workspace=ws.data_ptr(), workspace_bytes=ws.numel())
    assert ran == _core.gemm_config_table()[want]["tile_n"] and err < TOL


def test_stream_k_without_its_workspace_is_refused():
    m, n, k = 1024, 5120, 2048
    a, w = _operands(m, n, k)
    d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="stream-K configuration needs a workspace"):
        _gemm(a, w, d, m, n, k, config="128x256sk")
    small = torch.zeros(64, device="cuda", dtype=torch.uint8)
    with pytest.raises(ValueError, match="stream-K workspace of 64 bytes is below the"):
        _gemm(a, w, d, m, n, k, config="128x256sk", workspace=small.data_ptr(), workspace_bytes=64)
    with pytest.raises(ValueError, match="give workspace and workspace_bytes together"):
        _gemm(a, w, d, m, n, k, workspace=small.data_ptr())
    _gemm(a, w, d, m, n, k)  # the device stays usable
    torch.cuda.synchronize()
    assert _rel_err(d, torch.mm(a, w.t())) < TOL


def test_stream_k_launches_share_one_workspace(tmp_path):
    """60 eager launches of four shapes on one workspace, then 50 replays of a graph of three,
    fresh inputs each time (tests/gpu/stream_k_worker.py, in a child process with a timeout: a
    counter left behind would hang a later launch inside CUTLASS)."""
    from gpu_requirements import Launch, run_worker_json

    worker = pathlib.Path(__file__).with_name("stream_k_worker.py")
    one_rank = Launch(tp=1, shared=False, skip=None)
    rc, err, data = run_worker_json(worker, one_rank, tmp_path / "sk.json", timeout_s=120)
    assert rc == 0, err[-4000:]
    assert data["eager"] == 60 and data["eager_max_err"] < TOL, data
    assert data["tail_nonzero_after"] == 0, data
    assert data["replays"] == 50 and data["replay_max_err"] < TOL, data


def _cublas_or_skip():
    why = _core.cublaslt_problem()
    if why:
        pytest.skip(f"cuBLASLt unavailable: {why}")


@pytest.mark.parametrize("m,n,k", CONFIG_SHAPES)
def test_cublaslt_ranks_match_torch_mm(m, n, k):
    _cublas_or_skip()
    count = _core.cublaslt_algo_count(m, n, k, cuda_device=0)
    assert 1 <= count <= 8
    before = _core.cublaslt_launches()
    for rank in range(min(count, 3)):
        ran, err = _run_checked(m, n, k, cublas_algo=rank)
        assert ran == 0 and err < TOL, rank
    assert _core.cublaslt_launches() == before + min(count, 3)


@pytest.mark.parametrize("m", [1, 7, 100, 520, 1000, 3000])
@pytest.mark.parametrize("buckets", [False, True], ids=["own-rows", "row-buckets"])
def test_cublaslt_rows_of_a_bucket_match_torch_mm(m, buckets):
    """With row buckets on, row counts inside a bucket run the algorithm the heuristic gives for
    the bucket's edge, where cuBLASLt accepts it (gemm_cublaslt.cpp); off (the default), their
    own: the results stay torch.mm's, eager and in a graph, for ranks 0 and 1. n differs per
    setting, since a shape's algorithm, once chosen, is kept."""
    _cublas_or_skip()
    _core.set_cublaslt_row_buckets(buckets)
    try:
        _rows_match_torch_mm(m, 3072 + 64 * buckets, 1024)
    finally:
        _core.set_cublaslt_row_buckets(False)


def _rows_match_torch_mm(m, n, k):
    a, w = _operands(m, n, k)
    ref = torch.mm(a, w.t())
    d = torch.zeros((m, n), device="cuda", dtype=torch.bfloat16)
    for rank in range(min(2, _core.cublaslt_algo_count(m, n, k, cuda_device=0))):
        d.zero_()
        assert _gemm(a, w, d, m, n, k, cublas_algo=rank) == 0
        torch.cuda.synchronize()
        assert _rel_err(d, ref) < TOL, rank
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _gemm(a, w, d, m, n, k, cublas_algo=rank)
        d.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert _rel_err(d, ref) < TOL, rank


def test_cublaslt_n_major_b_and_graph_replay():
    _cublas_or_skip()
    m, n, k = 512, 2048, 1024
    a, w = _operands(m, n, k)
    ref = torch.mm(a, w.t())
    d = torch.zeros((m, n), device="cuda", dtype=torch.bfloat16)
    assert _gemm(a, w.t().contiguous(), d, m, n, k, b_n_major=True, cublas_algo=0) == 0
    torch.cuda.synchronize()
    assert _rel_err(d, ref) < TOL
    _gemm(a, w, d, m, n, k, cublas_algo=0)  # the heuristic's list is cached before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _gemm(a, w, d, m, n, k, cublas_algo=0)
    d.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert _rel_err(d, ref) < TOL


def test_cublaslt_refusals():
    _cublas_or_skip()
    a, w = _operands(256, 1024, 512)
    d = torch.empty((256, 1024), device="cuda", dtype=torch.bfloat16)
    count = _core.cublaslt_algo_count(256, 1024, 512, cuda_device=0)
    with pytest.raises(ValueError, match=f"cuBLASLt's heuristic has {count} algorithm"):
        _gemm(a, w, d, 256, 1024, 512, cublas_algo=count)
    with pytest.raises(ValueError, match="cuBLASLt has no distgemm configuration"):
        _gemm(a, w, d, 256, 1024, 512, cublas_algo=0, config="128x128")
    with pytest.raises(ValueError, match="not -1"):
        _gemm(a, w, d, 256, 1024, 512, cublas_algo=-2)
    assert _gemm(a, w, d, 256, 1024, 512) > 0  # the device is still usable


def test_kernel_table_routes_auto():
    """A table row near the shape decides 'auto' (cuBLASLt's rank, or a configuration); shapes
    without a near row keep the model's choice; the empty table restores the model."""
    _cublas_or_skip()
    m, n, k = 1000, 1032, 520
    model = _core.gemm_resolve_config(m, n, cuda_device=0)
    rows = [
        dict(dtype="bf16", m=1024, n=n, k=k, kernel="cublaslt", algo=1),
        dict(dtype="bf16", m=8, n=4096, k=1024, kernel="128x128"),
    ]
    try:
        _core.set_kernel_table(rows)
        assert _core.kernel_table_size() == 2
        assert _core.gemm_resolve_config(m, n, cuda_device=0, k=k) == "cublaslt:1"
        assert _core.gemm_resolve_config(m, n, cuda_device=0, k=k + 8) == model
        assert _core.gemm_resolve_config(8, 4096, cuda_device=0, k=1024) == "128x128"
        before = _core.cublaslt_launches()
        ran, err = _run_checked(m, n, k)
        assert ran == 0 and err < TOL and _core.cublaslt_launches() == before + 1
        assert _run_checked(8, 4096, 1024) == (128, pytest.approx(0, abs=TOL))
    finally:
        _core.set_kernel_table([])
    assert _core.kernel_table_size() == 0
    assert _core.gemm_resolve_config(m, n, cuda_device=0, k=k) == model


def test_kernel_table_default_routes_shapes_without_a_row():
    """A table's default (a row of any shape) decides 'auto' where no row is near: cuBLASLt's
    first algorithm runs, right; a row near the shape still wins; fp16 has no default here."""
    _cublas_or_skip()
    m, n, k = 1000, 1032, 520
    model = _core.gemm_resolve_config(m, n, cuda_device=0)
    rows = [
        dict(dtype="bf16", m=8, n=4096, k=1024, kernel="128x128"),
        dict(dtype="bf16", any_shape=True, kernel="cublaslt", algo=0),
    ]
    try:
        _core.set_kernel_table(rows)
        assert _core.gemm_resolve_config(m, n, cuda_device=0, k=k) == "cublaslt:0"
        assert _core.gemm_resolve_config(8, 4096, cuda_device=0, k=1024) == "128x128"
        assert _core.gemm_resolve_config(m, n, "fp16", cuda_device=0, k=k) != "cublaslt:0"
        before = _core.cublaslt_launches()
        ran, err = _run_checked(m, n, k)
        assert ran == 0 and err < TOL and _core.cublaslt_launches() == before + 1
    finally:
        _core.set_kernel_table([])
    assert _core.gemm_resolve_config(m, n, cuda_device=0, k=k) == model


def test_benchmark_times_cublaslt_and_writes_a_table(tmp_path):
    _cublas_or_skip()
    from benchmarks.kernel import kernel_vs_cublas as bench
    from distgemm.runtime import kernel_table as kt

    argv = ["--models", "8B", "--tp", "8", "--tokens", "1024", "--layers", "O", "--limit", "1"]
    argv += ["--configs", "128x256", "--cublas-algos", "2", "--kernel-table", "off"]
    table = tmp_path / "table.json"
    assert bench.main(argv + ["--out", str(tmp_path), "--stem", "lt", "--table", str(table)]) == 0
    (rec,) = json.loads((tmp_path / "lt.json").read_text())["records"]
    assert {"cublaslt:0", "cublaslt:1"} <= set(rec["configs"])
    assert all(rec["err"][c] < TOL and rec["ms"][c] > 0 for c in rec["configs"])
    (row,) = kt.load(table)["rows"]
    assert (row["m"], row["n"], row["k"]) == (1024, 4096, 512)


def test_benchmark_measures_one_shape(tmp_path):
    from benchmarks.kernel import kernel_vs_cublas as bench
    from benchmarks.kernel import report as rep

    argv = ["--models", "8B", "--tp", "8", "--tokens", "1024", "--layers", "O", "--limit", "1"]
    argv += ["--kernel-table", "off"]
    assert bench.main(argv + ["--out", str(tmp_path), "--stem", "one"]) == 0
    doc = json.loads((tmp_path / "one.json").read_text())
    (rec,) = doc["records"]
    assert (rec["m"], rec["n"], rec["k"], rec["local"]) == (1024, 4096, 512, True)
    assert rec["status"] == "ok" and rec["model_config"] in rep.CONFIGS
    assert rec["configs"] == list(rep.CONFIGS)
    assert all(rec["err"][c] < TOL and rec["ms"][c] > 0 for c in rep.CONFIGS)
    assert rec["derived"]["fastest_config"] in rep.CONFIGS
    assert rec["derived"]["below_floor"] == []
    assert 0.5 < rec["derived"]["ratio"] < 2.0  # a sanity bound; the acceptance is the report's
    assert (tmp_path / "one.png").exists() and doc["meta"]["complete"] is True
