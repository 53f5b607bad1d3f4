"""The ops inside the caller's CUDA graph (torch.cuda.graph) under torchrun, at TP = every visible
GPU (DISTGEMM_TEST_TP sets another); with one GPU, 2 ranks share it (gloo,
DISTGEMM_ALLOW_SHARED_GPU=1: a functional run, said so in the results' "mode"; the collective
path, NCCL captured in the graph, is left out and its checks skip with the reason).
tests/gpu/capture_worker.py does the work:

    python3 -m pytest -q -rs tests/gpu/test_capture.py

Decides by the worker's exit code and the results it writes (JSON, kept under
DISTGEMM_TEST_RESULTS when set), never by grepping output. Skips, with the reason, without a
Hopper GPU or without distgemm's CUDA runtime.
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

SCHEDULES = ["ag_rotate_a", "ag_rotate_b", "rs_tile_a", "rs_tile_b", "ar_tile_a"]
LAUNCH = launch_here()
TP = LAUNCH.tp
REPLAYS = 1000

pytestmark = skip_unless_launchable(LAUNCH)


results = worker_results(LAUNCH, "capture_worker.py", "capture", "--replays", str(REPLAYS))


def test_every_check_passed_on_every_rank(results):
    assert_every_check_passed(results)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("variant", ["overlap/S{tp}/out1", "overlap/S{tp2}/out0"])
def test_every_op_schedule_and_step_count_captured_and_replayed(results, schedule, variant):
    _, _, data = results
    name = f"every_op/{schedule}/" + variant.format(tp=TP, tp2=2 * TP)
    got = [e for e in named(data, name) if e["ok"]]
    assert len(got) == TP, f"[{LAUNCH.mode}] {name}: {len(got)} passing ranks of {TP}"
    assert all(e["replays"] == 3 and e["worst_rel_err"] < 1e-2 for e in got)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_op_on_the_collective_path_captured_and_replayed(results, schedule):
    _, _, data = results
    name = f"every_op/{schedule}/collective/S{TP}/out0"
    got = [e for e in ran_or_skip(data, name) if e["ok"]]
    assert len(got) == TP, f"[{LAUNCH.mode}] {name}: {len(got)} passing ranks of {TP}"
    assert all(e["replays"] == 3 and e["worst_rel_err"] < 1e-2 for e in got)


@pytest.mark.parametrize(
    "case",
    [
        "ag_rotate_a/overlap/S{tp}",
        "rs_tile_a/overlap/S{tp2}",
        "ar_tile_a/overlap/S{tp}",
        "rs_tile_b/collective/S{tp}",
    ],
)
def test_a_thousand_replays_with_fresh_data(results, case):
    _, _, data = results
    got = ran_or_skip(data, "many_replays/" + case.format(tp=TP, tp2=2 * TP))
    assert len(got) == TP, got
    assert all(e["replays"] == REPLAYS and e["ok"] for e in got), got


@pytest.mark.parametrize(
    "name",
    [
        "interleaved/ag_rotate_a",
        "interleaved/rs_tile_a",
        "interleaved/layer_in_one_graph",
        "first_call/ag_rotate_a/overlap",
        "first_call/ar_tile_a/overlap",
        "first_call/rs_tile_b/collective",
        "first_call/workspace_allocated_in_capture",
        "first_call/auto_inside_capture",
        "first_call/check_inside_capture_refused",
        "gathered/ag_rotate_a/overlap",
        "gathered/ag_rotate_a/collective",
        "gathered/ag_rotate_b/overlap",
        "gathered/ag_rotate_b/collective",
    ],
)
def test_section_check_passed_on_every_rank(results, name):
    _, _, data = results
    got = ran_or_skip(data, name)
    assert len(got) == TP and all(e["ok"] for e in got), got


def test_a_peer_that_never_replays_ends_in_the_timeout_error(results):
    _, _, data = results
    got = named(data, "timeout/peer_never_replays")
    assert len(got) == TP - 1 and all(e["ok"] for e in got), got  # every rank but the silent one
    for e in got:
        assert f"rank {e['rank']}: device {e['rank']}, entry barrier" in e["next_op_call"]
        assert e["aborted_replay_seconds"] < 0.5
