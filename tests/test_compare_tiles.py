"""benchmarks/kernel/compare_tiles.py: the per-shape summary of the two GEMM tiles, on synthetic
timings (the GPU part, running distgemm_bench, is run_on_gpus.sh's cpp-tiles)."""

import random

import pytest

from benchmarks.kernel import compare_tiles as ct
from distgemm import _core


def test_summary_medians_ratio_and_implied_cost():
    rng = random.Random(1234)
    shapes = [(512, 4096, 2048, "small"), (8192, 8192, 8192, "large")]
    t = {}
    for m, n, k, _ in shapes:
        base = rng.uniform(0.05, 2.0)
        t[(m, n, k, 256)] = [base * f for f in (1.0, 1.02, 0.99)]
        t[(m, n, k, 128)] = [base * f for f in (0.6, 0.61, 0.59)]
    rows = ct.summarise(t, shapes, _core.choose_tile_n, 132)
    assert [r["m"] for r in rows] == [512, 8192]
    small, large = rows
    assert small["ms_n256"] == pytest.approx(t[(512, 4096, 2048, 256)][0])  # the median
    assert small["ratio"] == pytest.approx(0.6)
    assert small["faster_tile"] == 128 and small["model_tile"] == 128
    # 8192x8192: 2048 wide tiles = 16 waves, 4096 narrow = 32 waves on 132 slots.
    assert (large["waves_n256"], large["waves_n128"]) == (16, 32)
    assert large["implied_cost"] == pytest.approx(0.6 * 16 / 32)
    assert large["model_tile"] == 256 and large["faster_tile"] == 128
    assert all(r["rounds"] == 3 for r in rows)


def test_shapes_missing_a_tile_are_left_out():
    shapes = [(512, 4096, 2048, "small")]
    assert ct.summarise({(512, 4096, 2048, 256): [1.0]}, shapes, _core.choose_tile_n, 132) == []


def test_bench_command_is_one_gemm_with_the_tile_forced():
    args = ct.bench_args("bench", 512, 4096, 2048, 128)
    i = args.index
    assert args[i("--tp") + 1] == "1" and args[i("--steps") + 1] == "1"
    assert args[i("--tile-n") + 1] == "128"
    assert (args[i("--m") + 1], args[i("--n") + 1], args[i("--k") + 1]) == ("512", "4096", "2048")
    assert ct.parse_result("x\nRESULT ms=0.5 verify=PASS\n") == {"ms": "0.5", "verify": "PASS"}
    assert ct.parse_result("no result") == {}


def test_default_shapes_are_the_sweeps_per_rank_gemms():
    shapes = {what: (m, n, k) for m, n, k, what in ct.SHAPES}
    assert len(shapes) == len(ct.TILE_CASES) == 12
    assert shapes["70B O floor, 8192 tokens, TP=1"] == (8192, 8192, 8192)
    assert shapes["70B FC1 floor, 4096 tokens, TP=2"] == (4096, 57344 // 2, 8192)
    # a step of S=2: half the rows; reduce-scatter layers split K over the ranks
    assert shapes["8B O step, 1024 tokens, TP=2 S=2"] == (512, 4096, 4096 // 2)
    assert shapes["70B O step, 2048 tokens, TP=2 S=2"] == (1024, 8192, 8192 // 2)
    # all-gather layers split N over the ranks
    assert shapes["405B QKV step, 2048 tokens, TP=2 S=2"] == (1024, 18432 // 2, 16384)
