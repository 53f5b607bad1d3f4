"""The fp8 (e4m3) ops under torchrun (tests/gpu/fp8_worker.py does the work): every schedule with
tensor- and row-wise scales on the overlapped path (and the collective path with NCCL), captured
replays with fresh inputs and scales, and the refusals.

    python3 -m pytest -q -rs tests/gpu/test_fp8_ops.py

TP = every visible GPU when there are 2 or more (DISTGEMM_TEST_TP sets another). With one GPU the
worker always runs 2 ranks on it through a gloo group (DISTGEMM_ALLOW_SHARED_GPU=1): the plans'
copies, flags and scale slots run, the collective path (NCCL) does not. Decides by the worker's exit
code and the results it writes (JSON). Skips, with the reason, without a Hopper GPU or without
distgemm's CUDA runtime.
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
_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
SHARED = _GPUS == 1  # the multi-rank paths are the point: 2 ranks share the one GPU
TP = 2 if SHARED else int(os.environ.get("DISTGEMM_TEST_TP", str(max(_GPUS, 2))))
_SKIP = skip_reason(1 if SHARED else TP, " (every visible GPU; DISTGEMM_TEST_TP)")
REPLAYS = 50

pytestmark = pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    # DISTGEMM_TEST_RESULTS: a folder that keeps the worker's JSON (benchmarks/run_on_gpus.sh)
    keep = os.environ.get("DISTGEMM_TEST_RESULTS")
    folder = pathlib.Path(keep) if keep else tmp_path_factory.mktemp("fp8")
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "fp8_ops.json"
    before = os.environ.get("DISTGEMM_ALLOW_SHARED_GPU")
    if SHARED:
        os.environ["DISTGEMM_ALLOW_SHARED_GPU"] = "1"
    try:
        return run_worker_json(HERE / "fp8_worker.py", TP, out, "--replays", str(REPLAYS))
    finally:
        if before is None:
            os.environ.pop("DISTGEMM_ALLOW_SHARED_GPU", None)
        else:
            os.environ["DISTGEMM_ALLOW_SHARED_GPU"] = before


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


def test_refusals_are_the_same_on_every_rank(results):
    _, _, data = results
    got = named(data, "errors/")
    assert len(got) == 5 * TP and all(e["ok"] for e in got)
