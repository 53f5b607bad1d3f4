"""Plans under a kernel table that gives every GEMM to cuBLASLt, under torchrun
(tests/gpu/cublaslt_plan_worker.py does the work): with the table for every plan, plans of several
ranks run cuBLASLt from a fresh process's first eager call on and are right; by default they keep
distgemm's kernels and stay right; one-rank plans run cuBLASLt and are right; a captured
reduce-scatter replays with fresh inputs; and fp8 plans run cuBLASLt steps with tensor-wise and
row-wise scales and are right.

    python3 -m pytest -q -rs tests/gpu/test_cublaslt_plans.py

TP = every visible GPU when there are 2 or more (DISTGEMM_TEST_TP sets another); with one GPU the
2 ranks share it (a functional run, said so in the results' "mode"). Decides by the worker's exit
code and the results it writes (JSON). Skips, with the reason, without a Hopper GPU or without
distgemm's CUDA runtime.
"""

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import (  # noqa: E402
    assert_every_check_passed,
    launch_here,
    named,
    skip_unless_launchable,
    worker_results,
)

LAUNCH = launch_here()
pytestmark = skip_unless_launchable(LAUNCH)

results = worker_results(LAUNCH, "cublaslt_plan_worker.py", "cublaslt_plans", "--replays", "20")


def test_every_check_passed_on_every_rank(results):
    assert_every_check_passed(results)


def test_multi_rank_plans_run_cublaslt_with_the_table_for_every_plan(results):
    _, _, data = results
    for schedule in ("ag_rotate_a", "ag_rotate_b", "rs_tile_a", "rs_tile_b", "ar_tile_a"):
        got = named(data, f"all_plans/{schedule}")
        assert got and all(e["ok"] and e["cublaslt_launches"] > 0 for e in got), schedule
    assert named(data, "all_plans/rs_tile_a/S"), "the S = 2 TP plan with copy-lane waits ran"


def test_multi_rank_plans_keep_distgemms_kernels(results):
    _, _, data = results
    for schedule in ("ag_rotate_a", "ag_rotate_b", "rs_tile_a", "rs_tile_b", "ar_tile_a"):
        got = named(data, f"plans/{schedule}")
        assert got and all(e["ok"] and e["cublaslt_launches"] == 0 for e in got), schedule


def test_one_rank_plans_run_cublaslt(results):
    _, _, data = results
    for name in ("solo/ag_rotate_a", "solo/rs_tile_a", "solo/rs_tile_a/beta_c"):
        got = named(data, name)
        assert got and all(e["ok"] and e["cublaslt_launches"] > 0 for e in got), name
    assert named(data, "capture/rs_tile_a")


def test_fp8_plans_run_cublaslt_with_each_offered_scale_kind(results):
    _, _, data = results
    for schedule in ("ag_rotate_a", "ag_rotate_b", "rs_tile_a", "rs_tile_b", "ar_tile_a"):
        for kinds in ("row-row", "tensor-tensor"):
            got = named(data, f"fp8_plans/{schedule}/{kinds}/accurate")
            assert got and all(e["ok"] and e["cublaslt_launches"] > 0 for e in got), (
                schedule,
                kinds,
            )
        for kinds in ("row-tensor", "tensor-row"):  # cuBLASLt where it offers them, else ours
            got = named(data, f"fp8_plans/{schedule}/{kinds}/accurate")
            assert got and all(e["ok"] for e in got), (schedule, kinds)
        assert named(data, f"fp8_plans/{schedule}/row-row/fast"), schedule
