"""The ops inside the caller's CUDA graph (torch.cuda.graph) under torchrun, at TP = every visible
GPU (DISTGEMM_TEST_TP sets another); tests/gpu/capture_worker.py does the work:

    python3 -m pytest -q -rs tests/gpu/test_capture.py

Decides by the worker's exit code and the results it writes (JSON), never by grepping output.
Skips, with the reason, without 2 Hopper GPUs or without distgemm's CUDA runtime.
"""

import os
import pathlib

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import (  # noqa: E402
    assert_every_check_passed,
    named,
    run_worker_json,
    skip_reason,
)

HERE = pathlib.Path(__file__).resolve().parent
SCHEDULES = ["ag_rotate_a", "ag_rotate_b", "rs_tile_a", "rs_tile_b", "gemm_allreduce"]
_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
TP = int(os.environ.get("DISTGEMM_TEST_TP", str(max(_GPUS, 2))))
_SKIP = skip_reason(TP, " (every visible GPU; DISTGEMM_TEST_TP)")
REPLAYS = 1000

pytestmark = pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("capture") / "capture.json"
    return run_worker_json(HERE / "capture_worker.py", TP, out, "--replays", str(REPLAYS))


def test_every_check_passed_on_every_rank(results):
    assert_every_check_passed(results)


def test_every_op_schedule_and_path_was_captured_and_replayed(results):
    _, _, data = results
    for sch in SCHEDULES:
        for variant in ("overlap/S{tp}/out1", "overlap/S{tp2}/out0", "collective/S{tp}/out0"):
            name = f"every_op/{sch}/" + variant.format(tp=TP, tp2=2 * TP)
            got = [e for e in named(data, name) if e["ok"]]
            assert len(got) == TP, f"{name}: {len(got)} passing ranks of {TP}"
            assert all(e["replays"] == 3 and e["worst_rel_err"] < 1e-2 for e in got)


def test_a_thousand_replays_with_fresh_data(results):
    _, _, data = results
    got = named(data, "many_replays/")
    kinds = {e["name"].split("/")[1] for e in got if e["ok"]}
    assert {"ag_rotate_a", "rs_tile_a", "gemm_allreduce", "rs_tile_b"} <= kinds
    assert all(e["replays"] == REPLAYS and e["ok"] for e in got)


@pytest.mark.parametrize(
    "name",
    [
        "interleaved/ag_rotate_a",
        "interleaved/rs_tile_a",
        "interleaved/layer_in_one_graph",
        "first_call/ag_rotate_a/overlap",
        "first_call/gemm_allreduce/overlap",
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
    got = [e for e in data["results"] if e["name"] == name]
    assert len(got) == TP and all(e["ok"] for e in got), got


def test_a_peer_that_never_replays_ends_in_the_timeout_error(results):
    _, _, data = results
    got = named(data, "timeout/peer_never_replays")
    assert len(got) == TP - 1 and all(e["ok"] for e in got), got  # every rank but the silent one
    for e in got:
        assert f"rank {e['rank']}: device {e['rank']}, entry barrier" in e["next_op_call"]
        assert e["aborted_replay_seconds"] < 0.5
