"""The kernel-vs-cuBLAS benchmark without a GPU: the shape list (distinct shapes, their sources,
local GEMMs first, counts for known filters), benchmarks/kernel/report.py's derived numbers,
acceptance verdicts, compute-floor flags, table, CSV, JSON and PNG from synthetic records and
their --replot round trip, --dry-run's listing, and _core.gemm's refusal of a GEMM the kernel
cannot run (a ValueError with the reason, raised before any device is touched); the one-GPU
context runs the sweep's steady-state timing (benchmarks/common/timing.py) on a fake event clock.

Shapes are Llama-3 8B O (global M=tokens, N=K=4096; TP=2 splits K: local K=2048) and 405B at
TP=8, checked against the hand-derived per-rank and per-step extents."""

import csv
import io
import json

import pytest

from benchmarks.common.timing import MAX_ITERS, TIMED_S, SingleGpuContext, time_around, time_variant
from benchmarks.kernel import kernel_vs_cublas as bench
from benchmarks.kernel import report as rep
from benchmarks.kernel.shapes import Source, kernel_shapes
from distgemm import _core


def _names(shape):
    return [s.name for s in shape.sources]


def test_shapes_deduplicated_with_sources_local_first():
    shapes, skipped = kernel_shapes(models=["8B"], tps=[2], tokens=[1024, 2048], layers=["O"])
    assert skipped == []
    assert [(s.m, s.n, s.k, s.local) for s in shapes] == [
        (1024, 4096, 2048, True),  # local at 1024 tokens, one S=2 step at 2048
        (2048, 4096, 2048, True),
        (512, 4096, 2048, False),  # S=2 at 1024, S=4 at 2048
        (256, 4096, 2048, False),  # S=4 at 1024
    ]
    assert _names(shapes[0]) == ["8B/O/M1024/TP2", "8B/O/M2048/TP2/S2"]
    assert _names(shapes[2]) == ["8B/O/M1024/TP2/S2", "8B/O/M2048/TP2/S4"]
    assert shapes[0].sources[1] == Source("8B", "O", 2048, 2, 2)
    # a plan's sub-GEMMs of one shape (every rank, every step) count as one source
    assert all(len(set(s.sources)) == len(s.sources) for s in shapes)


def test_shape_counts_for_known_filters():
    shapes, _ = kernel_shapes(models=["405B"], tps=[8], tokens=[1024])
    # 4 layers: the local GEMM, a step of S=8 (m=128) and of S=16 (m=64) each, all distinct
    assert len(shapes) == 12
    assert sum(s.local for s in shapes) == 4
    assert [(s.m, s.n, s.k) for s in shapes if s.local] == [
        (1024, 2304, 16384),  # QKV: N = (128 + 2*8) * 128 / 8
        (1024, 16384, 2048),  # O: K = 16384 / 8
        (1024, 13312, 16384),  # FC1: N = 2 * 53248 / 8
        (1024, 16384, 6656),  # FC2: K = 53248 / 8
    ]
    assert sorted({s.m for s in shapes if not s.local}) == [64, 128]
    local, _ = kernel_shapes(models=["405B"], tps=[8], tokens=[1024], local_only=True)
    assert [(s.m, s.n, s.k) for s in local] == [(s.m, s.n, s.k) for s in shapes if s.local]
    assert all(src.local for s in local for src in s.sources)
    # TP=1, S=1: the one step is the local GEMM itself
    one, _ = kernel_shapes(models=["8B"], tps=[1], tokens=[1024], layers=["QKV"])
    assert _names(one[0]) == ["8B/QKV/M1024/TP1", "8B/QKV/M1024/TP1/S1"]
    assert [(s.m, s.local) for s in one] == [(1024, True), (512, False)]


def test_shape_filters_refuse_unknown_values():
    with pytest.raises(ValueError, match="tp=3"):
        kernel_shapes(tps=[3])
    with pytest.raises(ValueError, match="unknown model"):
        kernel_shapes(models=["7B"], tps=[2])
    with pytest.raises(SystemExit):
        bench.parse_args(["--tp", "3"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--limit", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--configs", "64x64"])
    assert bench.parse_args(["--configs", "256x192"]).configs == ["256x192"]
    assert bench.parse_args([]).configs == list(rep.CONFIGS)


N256, N128, C1, M256 = "128x256", "128x128", "128x128c1", "256x192"
SK, SK128 = "128x256sk", "128x128sk"


def _rec(m=4096, n=8192, k=8192, local=True, torch_ms=1.0, n128=1.2, n256=1.004, model=N256,
         c1=1.3, m256=1.1):  # fmt: skip
    """A measured shape: torch.mm's two windows 0.99 and 1.01 ms (mean torch_ms when 1.0), every
    configuration timed."""
    return dict(
        m=m, n=n, k=k, local=local,
        sources=[dict(model="70B", layer="O", tokens=m, tp=1, steps=None if local else 2)],
        status="ok", reason=None, model_config=model, configs=[N256, N128, C1, M256],
        ms={"torch": torch_ms, N128: n128, N256: n256, C1: c1, M256: m256},
        torch_windows=[torch_ms - 0.01, torch_ms + 0.01],
        err={N128: 3e-3, N256: 3e-3, C1: 3e-3, M256: 3e-3}, calls=1, timing="graph",
    )  # fmt: skip


def test_configs_are_the_bf16_kernels():
    # the benchmark offers _core.gemm a workspace, so the stream-K configurations are among them
    assert rep.CONFIGS == (N256, N128, C1, M256, SK, SK128)


def test_derived_and_acceptance():
    d = rep.derived(_rec())
    assert d["ours_ms"] == 1.004 and d["fastest_config"] == N256 and d["model_right"] is True
    assert d["ratio"] == pytest.approx(1.004)
    assert d["torch_drift"] == pytest.approx(0.02)
    assert d["tflops_torch"] == pytest.approx(2 * 4096 * 8192 * 8192 / 1e-3 / 1e12)
    assert rep.accepted(_rec()) is True  # 1.004 <= 1.02
    assert rep.accepted(_rec(n256=1.02)) is True  # the bound itself passes
    assert rep.accepted(_rec(n256=1.03)) is False
    assert rep.accepted(_rec(n256=1.03, local=False)) is None  # steps are not judged
    failed = dict(_rec(), status="failed", reason="tile 128 ran as 256", ms={})
    assert rep.accepted(failed) is False
    # the model picked 128x256 where 128x128 is faster: ours is the model's, not the fastest
    d = rep.derived(_rec(n128=0.9, n256=1.1))
    assert d["ours_ms"] == 1.1 and d["fastest_config"] == N128 and d["model_right"] is False
    assert d["model_loss"] == pytest.approx(1.1 / 0.9 - 1)
    assert d["ratio_fastest"] == pytest.approx(0.9)
    # a new configuration fastest, picked by the model
    d = rep.derived(_rec(c1=0.5, model=C1))
    assert d["ours_ms"] == 0.5 and d["fastest_config"] == C1 and d["model_right"] is True
    # a configuration not timed (a failed shape, --configs): no fastest, no verdict on the model
    partial = _rec()
    del partial["ms"][M256]
    d = rep.derived(partial)
    assert d["fastest_config"] is None and d["model_right"] is None and d["ours_ms"] == 1.004


def test_summary_pass_fail_and_worst():
    ok = [_rec(), _rec(m=1024, n256=0.99), _rec(local=False, n256=1.1)]
    text = rep.summary(ok)
    assert "PASS: 2 of 2 local shapes pass" in text
    assert "picked the fastest config on 3 of 3" in text
    assert "fastest config: 128x256 on 3" in text
    bad = ok + [_rec(m=2048, n256=1.05)]
    text = rep.summary(bad)
    assert "FAIL: 2 of 3 local shapes pass" in text
    assert text.splitlines()[1].startswith("  ours/torch 1.050")  # the worst local shape first
    assert "FAIL" in rep.summary([dict(_rec(), status="failed", reason="x", ms={})])
    assert "FAIL: 0 of 0" in rep.summary([_rec(local=False)])  # nothing to judge is no pass


def test_summary_fails_a_median_above_one_with_every_shape_within_the_bound():
    """Every local shape within ACCEPT_RATIO is not enough: the median must be at most
    ACCEPT_MEDIAN too."""
    within = [_rec(m=1024, n256=1.01), _rec(m=2048, n256=1.015), _rec(m=4096, n256=0.995)]
    text = rep.summary(within)
    assert "FAIL: 3 of 3 local shapes pass; median 1.010x" in text
    text = rep.summary(within[1:] + [_rec(m=8192, n256=0.98)])  # median (0.995 + 1.015) / 2
    assert "PASS: 3 of 3 local shapes pass; median 1.005x" not in text
    text = rep.summary([_rec(m=1024, n256=1.02), _rec(m=2048, n256=0.99), _rec(n256=0.98)])
    assert "PASS: 3 of 3 local shapes pass; median 0.990x" in text


def test_time_below_compute_floor_is_flagged():
    m = n = k = 8192  # floor 2 * 8192^3 / 989e12 s = 1.1118 ms
    assert rep.floor_ms(m, n, k) == pytest.approx(2 * 8192**3 / 989e12 * 1e3)
    rec = _rec(m=m, n=n, k=k, torch_ms=1.5, n128=1.6, n256=1.0, c1=1.6, m256=1.6)
    assert rep.derived(rec)["below_floor"] == [N256]
    assert rep.accepted(rec) is False  # even at ratio 0.67
    assert rep.flags(rec).startswith("BELOW FLOOR (measurement bug): 128x256")
    rec["torch_windows"] = [1.0, 2.0]
    assert rep.below_floor(rec) == [N256, "torch_window0"]
    assert "MEASUREMENT BUG m=8192" in rep.summary([rec])
    assert "BELOW FLOOR" in rep.format_table([rec])
    fine = _rec(m=m, n=n, k=k, torch_ms=1.5, n128=1.6, n256=1.2, c1=1.6, m256=1.2)
    assert rep.below_floor(fine) == []


def test_table_csv_json_png_and_replot(tmp_path, capsys):
    records = [_rec(), _rec(m=256, n128=0.9, n256=1.1, local=False, model=N128)]
    records.append(dict(_rec(m=64), status="failed", reason="RuntimeError: boom", ms={}))
    table = rep.format_table(records)
    assert "70B/O/M4096/TP1" in table
    assert "FAILED: RuntimeError: boom" in table
    rows = list(csv.DictReader(io.StringIO(rep.to_csv(records))))
    assert list(rows[0]) == list(rep.CSV_FIELDS)
    assert rows[0]["ratio"] == "1.0040" and rows[0]["accepted"] == "yes"
    assert rows[1]["model_config"] == N128 and rows[1]["fastest_config"] == N128
    assert rows[1]["ms_128x128"] == "0.9000" and rows[1]["ms_128x128c1"] == "1.3000"
    assert rows[1]["accepted"] == "" and rows[1]["sources"] == "70B/O/M256/TP1/S2"
    assert rows[2]["status"] == "failed" and rows[2]["accepted"] == "no"
    stem = str(tmp_path / "run" / rep.output_stem("tp2", date="2026-11-23"))
    assert stem.endswith("2026-11-23-kernel-vs-cublas-tp2")
    why = rep.write_outputs(records, stem, dict(args="--tp 2"), final=True)
    assert why is None
    out = capsys.readouterr().out
    assert (
        "acceptance (ours <= 1.02x torch.mm on every local GEMM shape, <= 1.0x at the median): "
        "FAIL" in out
    )
    for ext in ("csv", "json", "txt"):
        assert (tmp_path / "run" / f"2026-11-23-kernel-vs-cublas-tp2.{ext}").stat().st_size > 0
    png = tmp_path / "run" / "2026-11-23-kernel-vs-cublas-tp2.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((tmp_path / "run" / "2026-11-23-kernel-vs-cublas-tp2.json").read_text())
    assert doc["meta"]["complete"] is True and doc["records"][0]["accepted"] is True
    assert doc["records"][0]["derived"]["ratio"] == pytest.approx(1.004)
    # --replot: the same table and CSV without a GPU, derived numbers recomputed
    assert bench.main(["--replot", stem + ".json", "--out", str(tmp_path / "re")]) == 0
    again = tmp_path / "re" / "2026-11-23-kernel-vs-cublas-tp2.csv"
    assert (
        again.read_text() == (tmp_path / "run" / "2026-11-23-kernel-vs-cublas-tp2.csv").read_text()
    )
    assert (tmp_path / "re" / "2026-11-23-kernel-vs-cublas-tp2.png").exists()


def test_replot_reads_runs_stored_with_two_tiles(tmp_path, capsys):
    """A run stored before configurations existed (model_tile, n128/n256 times) replots with
    the times under the configuration names and its two tiles as the timed list."""
    old = dict(_rec(n128=0.9, n256=1.1), model_tile=256, ms=dict(torch=1.0, n128=0.9, n256=1.1))
    old["err"] = dict(n128=3e-3, n256=3e-3)
    for key in ("model_config", "configs"):
        del old[key]
    path = tmp_path / "2026-11-22-kernel-vs-cublas-old.json"
    path.write_text(json.dumps(dict(meta=dict(args="--tp 2"), records=[old])))
    assert bench.main(["--replot", str(path), "--out", str(tmp_path / "re")]) == 0
    assert "picked the fastest config on 0 of 1" in capsys.readouterr().out
    rows = list(csv.DictReader((tmp_path / "re" / "2026-11-22-kernel-vs-cublas-old.csv").open()))
    assert (rows[0]["model_config"], rows[0]["fastest_config"]) == (N256, N128)
    assert (rows[0]["ms_128x256"], rows[0]["ms_128x128"], rows[0]["ms_256x192"]) == (
        "1.1000", "0.9000", "")  # fmt: skip
    assert rows[0]["ratio"] == "1.1000" and rows[0]["err_128x128"] == "0.003"


def test_plot_skips_without_measured_shapes(tmp_path):
    failed = dict(_rec(), status="failed", reason="x", ms={})
    assert rep.plot([failed], str(tmp_path / "p.png")) == "no measured shape"


def test_dry_run_lists_shapes_without_gpu(capsys):
    argv = ["--models", "8B", "--tp", "2", "--tokens", "1024,2048", "--layers", "O", "--dry-run"]
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:6] == ["0", "1024", "4096", "2048", "yes",
        _core.choose_config(1024, 4096, 1, "bf16", slots=132, stream_k=True)["config"]]  # fmt: skip
    assert "8B/O/M1024/TP2, 8B/O/M2048/TP2/S2" in lines[1]
    assert lines[-1].startswith("4 shapes (2 local GEMMs, 2 steps only); about ")
    # every configuration, and the model's pick counted once more (it may be none of them)
    n = len(rep.CONFIGS) + 1
    assert f"{bench.estimated_seconds(4, n):.0f} s" in lines[-1] and f"{n} configs" in lines[-1]
    # --configs shortens the estimate: two configurations, four fewer windows per shape
    assert bench.main(argv + ["--configs", "128x256,128x128c1"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert f"{bench.estimated_seconds(4, 3):.0f} s" in last and "3 configs" in last
    assert bench.shape_seconds(2) == pytest.approx(bench.SHAPE_S - 4 * (0.25 + 1.0))
    assert bench.main(argv + ["--skip", "1", "--limit", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[1:3]] == ["2048", "512"]
    assert lines[-1].startswith("2 shapes (1 local GEMMs, 1 steps only)")


def test_calls_per_replay_and_estimate():
    assert bench.calls_per_replay(8192, 8192, 8192) == 1  # 1.1 ms at the floor
    assert bench.calls_per_replay(64, 128, 128) == bench.MAX_CALLS
    small = bench.calls_per_replay(256, 4096, 2048)  # floor 4.3 us: ~23 calls for 0.1 ms
    assert small * rep.floor_ms(256, 4096, 2048) >= bench.REPLAY_TARGET_MS
    assert bench.estimated_seconds(10) == pytest.approx(10 * bench.SHAPE_S)
    # torch.mm's long warm-up and window, then (configs + 1) short-warm windows, and setup
    assert bench.SHAPE_S == pytest.approx(1.0 + 1.0 + 7 * (0.25 + 1.0) + bench.SETUP_S)


needs_runtime = pytest.mark.skipif(
    not getattr(_core, "cuda_runtime", False),
    reason=f"_core built without the CUDA runtime ({_core.cuda_runtime_reason}): no _core.gemm",
)


@needs_runtime
def test_gemm_binding_refuses_bad_shapes_before_the_device():
    # 16-byte aligned fake addresses: only the shape or the tile is wrong, and the check runs
    # on the host, so none of these touch a device (none is needed).
    base = 1 << 20
    why = _core.gemm_problem(base, base, base, 256, 100, 64)
    assert "N=100" in why and "multiple of 8" in why
    with pytest.raises(ValueError, match="N=100"):
        _core.gemm(base, base, base, 256, 100, 64, cuda_device=0, stream=0)
    with pytest.raises(ValueError, match="K=60"):
        _core.gemm(base, base, base, 256, 128, 60, cuda_device=0, stream=0)
    with pytest.raises(ValueError, match="tile_n=64"):
        _core.gemm(base, base, base, 256, 128, 64, tile_n=64, cuda_device=0, stream=0)
    with pytest.raises(ValueError, match="16-byte aligned"):
        _core.gemm(base + 2, base, base, 256, 128, 64, cuda_device=0, stream=0)
    with pytest.raises(ValueError, match="device addresses"):
        _core.gemm(0, base, base, 256, 128, 64, cuda_device=0, stream=0)
    with pytest.raises(ValueError, match="dtype"):
        _core.gemm(base, base, base, 256, 128, 64, dtype="fp32", cuda_device=0, stream=0)
    with pytest.raises(ValueError, match="tile_n=128 has no kernel for an N-contiguous B"):
        _core.gemm(base, base, base, 256, 128, 64, tile_n=128, b_n_major=True, cuda_device=0,
                   stream=0)  # fmt: skip
    with pytest.raises(ValueError, match="swizzle=3 is not one of 1, 2, 4, 8"):
        _core.gemm(base, base, base, 256, 128, 64, cuda_device=0, stream=0, swizzle=3)
    with pytest.raises(ValueError, match=r"raster=3 is not 0 \(heuristic\), 1 \(M\) or 2 \(N\)"):
        _core.gemm(base, base, base, 256, 128, 64, cuda_device=0, stream=0, raster=3)
    assert _core.gemm_problem(base, base, base, 256, 128, 64) == ""
    for config in _core.gemm_config_names("bf16"):
        assert _core.gemm_problem(base, base, base, 256, 128, 64, config=config) == ""


@needs_runtime
@pytest.mark.parametrize("config", ["128x128c1", "256x192"])
def test_gemm_binding_refuses_bf16_only_configs_for_fp16_and_n_major_b(config):
    base = 1 << 20
    why = _core.gemm_problem(base, base, base, 256, 128, 64, "fp16", config=config)
    assert why == f"config={config} is instantiated for bf16 only; fp16 has 128x256 and 128x128"
    with pytest.raises(ValueError, match=f"config={config} is instantiated for bf16 only"):
        _core.gemm(base, base, base, 256, 128, 64, "fp16", cuda_device=0, stream=0, config=config)
    why = _core.gemm_problem(base, base, base, 256, 128, 64, b_n_major=True, config=config)
    assert why.startswith(f"config={config} has no kernel for an N-contiguous B")
    assert _core.gemm_problem(base, base, base, 256, 128, 64, b_n_major=True, config=N256) == ""
    with pytest.raises(ValueError, match=f"config={config} has no kernel for an N-contiguous B"):
        _core.gemm_resolve_config(256, 128, b_n_major=True, config=config, cuda_device=0)


@needs_runtime
def test_gemm_binding_refuses_unknown_and_conflicting_configs():
    base = 1 << 20
    with pytest.raises(ValueError, match="config '64x64' is not one of auto, 128x256, 128x128"):
        _core.gemm(base, base, base, 256, 128, 64, cuda_device=0, stream=0, config="64x64")
    why = _core.gemm_problem(base, base, base, 256, 128, 64, tile_n=256, config=C1)
    assert why.startswith("tile_n=256 and config=128x128c1 name different kernels")
    # a tile width and the configuration it names agree
    assert _core.gemm_problem(base, base, base, 256, 128, 64, tile_n=128, config=N128) == ""
    with pytest.raises(ValueError, match="exactly one"):
        _core.gemm_resident_ctas("bf16", 256, 0, config=N256)
    with pytest.raises(ValueError, match="exactly one"):
        _core.gemm_resident_ctas("bf16")
    with pytest.raises(ValueError, match="bf16 only"):
        _core.gemm_resident_ctas("fp16", config=M256)


class _FakeClock:
    """A stand-in for torch's CUDA events: every call of the timed function advances a clock by
    ``ms``; an event records the clock."""

    def __init__(self, ms: float):
        self.now, self.ms, self.calls = 0.0, ms, 0

    def step(self) -> None:
        self.now += self.ms
        self.calls += 1

    def torch(self):
        clock = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = clock.now

            def elapsed_time(self, end):
                return end.t - self.t

        cuda = type("cuda", (), dict(Event=Event, synchronize=staticmethod(lambda: None)))
        return type("torch", (), dict(cuda=cuda, float64="float64"))


def test_single_gpu_context_runs_the_sweep_timing():
    clock = _FakeClock(0.5)
    ctx = SingleGpuContext(clock.torch(), dev="cuda:0")
    assert ctx.agree_max([1, 2.5]) == [1.0, 2.5]
    assert time_variant(ctx, clock.step, warm_s=1.0) == pytest.approx(0.5)
    # warm-up of >= 1 s (chunks of 200 calls of 0.5 ms), then a window of >= TIMED_S
    timed = min(MAX_ITERS, TIMED_S * 1e3 / 0.5)
    assert clock.calls >= 3 + 1000 / 0.5 + timed


def test_time_around_times_outer_inner_outer():
    """A B A: the outer variant's two windows come before and after the inner one's, each the
    variant's own per-call time."""
    clock = _FakeClock(0.0)
    ctx = SingleGpuContext(clock.torch(), dev="cuda:0")
    runs: list[str] = []

    def call(name: str, ms: float):
        def fn():
            clock.now += ms
            if not runs or runs[-1] != name:
                runs.append(name)

        return fn

    before, inner, after = time_around(ctx, call("outer", 0.5), call("inner", 0.25))
    assert (before, inner, after) == (pytest.approx(0.5), pytest.approx(0.25), pytest.approx(0.5))
    assert runs == ["outer", "inner", "outer"]


def test_timing_without_a_gpu_says_why(capsys, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: tests/gpu/test_kernel_gemm.py runs the timing")
    argv = ["--models", "8B", "--tp", "8", "--tokens", "1024", "--layers", "O", "--limit", "1"]
    assert bench.main(argv + ["--out", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "no _core.gemm" in out or "no CUDA device visible" in out
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_shipped_h200_table_has_a_row_for_every_local_shape_of_each_kind():
    """Issue 44's coverage: every per-GPU GEMM of the sweep (8B, 70B, 405B x 4 layers x 1024..16384
    tokens at TP 2, 4, 8) has a measured bf16 row, and an fp8 row for tensor-wise and for row-wise
    scales (accurate accumulation) in the shipped H200 table."""
    from distgemm.runtime import kernel_table as kt

    shapes, _ = kernel_shapes(
        models=["8B", "70B", "405B"], tps=[2, 4, 8], tokens=[1024, 2048, 4096, 8192, 16384],
        local_only=True,
    )  # fmt: skip
    assert len(shapes) == 180
    rows = kt.load(kt.shipped_path("NVIDIA H200"))["rows"]

    def kind(r):
        if r["dtype"] != "e4m3":
            return r["dtype"]
        return "e4m3 " + ("row" if r["scale_a_rows"] else "tensor")

    have = {(kind(r), r["m"], r["n"], r["k"]) for r in rows if not r.get("fast_accum")}
    for k in ("bf16", "e4m3 tensor", "e4m3 row"):
        missing = [(s.m, s.n, s.k) for s in shapes if (k, s.m, s.n, s.k) not in have]
        assert missing == [], (k, missing[:5], len(missing))


def test_the_fp8_bench_lists_step_only_shapes_after_the_local_ones_with_steps():
    from benchmarks.fp8 import fp8_kernel_vs_scaled_mm as fp8

    base = ["--models", "8B", "--tp", "4", "--tokens", "4096"]
    local = fp8.select(fp8.parse_args(base))
    both = fp8.select(fp8.parse_args([*base, "--with-steps"]))
    assert [s.local for s in local] == [True] * 4  # QKV, O, FC1, FC2
    assert both[:4] == local and both[4:] and not any(s.local for s in both[4:])
    assert (1024, 4096, 1024) in {(s.m, s.n, s.k) for s in both[4:]}  # 8B O at S=4
