"""The fp8 (e4m3) ops under torchrun (tests/gpu/fp8_worker.py does the work): every schedule with
tensor- and row-wise scales on the overlapped path (and the collective path with NCCL), captured
replays with fresh inputs and scales, and the refusals.

    python3 -m pytest -q -rs tests/gpu/test_fp8_ops.py

TP = every visible GPU when there are 2 or more (DISTGEMM_TEST_TP sets another). With one GPU the
worker runs 2 ranks on it through a gloo group (DISTGEMM_ALLOW_SHARED_GPU=1, a functional run said
so in the results' "mode"): the plans' copies, flags and scale slots run, the collective path
(NCCL) is left out and its test skips with the reason. The JSON is kept under
DISTGEMM_TEST_RESULTS when set. Decides by the worker's exit
code and the results it writes (JSON). Skips, with the reason, without a Hopper GPU or without
distgemm's CUDA runtime.
"""

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import (  # noqa: E402
    assert_every_check_passed,
    launch_here,
    named,
    ran_or_skip,
    skip_unless_launchable,
    worker_results,
)

LAUNCH = launch_here()  # one GPU: 2 ranks share it (the multi-rank paths are the point)
TP = LAUNCH.tp
REPLAYS = 50

pytestmark = skip_unless_launchable(LAUNCH)


results = worker_results(LAUNCH, "fp8_worker.py", "fp8_ops", "--replays", str(REPLAYS))


def test_every_check_passed_on_every_rank(results):
    assert_every_check_passed(results)


def test_every_schedule_and_scale_kind_ran_on_every_rank(results):
    _, _, data = results
    got = [e for e in named(data, "correctness/") if e["ok"] and e["name"].endswith("/overlap")]
    # 5 schedules x (4 scale kinds + fast accumulation) per rank
    assert len(got) == 5 * 5 * TP, f"{len(got)} passing overlapped checks of {5 * 5 * TP}"
    assert max(e["rel_err"] for e in got) < 1e-2


def test_captured_replays_read_fresh_inputs(results):
    _, _, data = results
    got = named(data, "capture/")
    assert len(got) == 2 * TP and all(e["ok"] and e["replays"] == REPLAYS for e in got)


def test_gathered_fp8_activations_bit_for_bit(results):
    _, _, data = results
    got = named(data, "gathered/")
    assert len(got) == TP and all(e["ok"] for e in got)


def test_collective_path_matches_the_overlapped_one(results):
    _, _, data = results
    ran_or_skip(data, "correctness/collective")  # skips where the worker left the path out
    got = [e for e in named(data, "correctness/") if e["name"].endswith("/vs_collective")]
    assert len(got) == 5 * 5 * TP and all(e["ok"] for e in got), got


def test_refusals_are_the_same_on_every_rank(results):
    _, _, data = results
    got = named(data, "errors/")
    assert len(got) == 5 * TP and all(e["ok"] for e in got)
