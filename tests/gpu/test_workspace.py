"""The communicator's one workspace under torchrun at TP = every visible Hopper GPU
(DISTGEMM_TEST_TP sets another; with one GPU, 2 ranks share it: gloo, DISTGEMM_ALLOW_SHARED_GPU=1,
a functional run said so in the results' "mode"); tests/gpu/workspace_worker.py does the work:

- after 96 token counts (64..6144) of an all_gather_gemm and a gemm_reduce_scatter (K = 4096),
  distgemm holds one workspace of at most the largest plan's layout + 10% (memory_stats), device
  memory in use grew by no more than that plus its graphs (left out on a shared GPU, where the
  device's memory counts both ranks), graphs stay within their bounds, and results are right,
  also for plans re-pointed at a grown workspace;
- a single growth (an overlapped reduce-scatter at M = 2048, 8192, 2048 on a fresh communicator),
  alone and with a captured fused or overlapped op pinning the old workspace: the grown plan and
  the re-pointed one right on every rank;
- one communicator used from two streams, ops alternating between them without host
  synchronisation (a growth among them): every result right.

    python3 -m pytest -q -rs tests/gpu/test_workspace.py

Decides by the worker's exit code and the checks it writes (JSON, kept under
DISTGEMM_TEST_RESULTS when set). Skips, with the reason, without a Hopper GPU or without the
CUDA runtime in the installed package.
"""

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import (  # noqa: E402
    assert_every_check_passed,
    launch_here,
    rank0_check,
    skip_unless_launchable,
    worker_results,
)

LAUNCH = launch_here()  # every visible GPU, or DISTGEMM_TEST_TP
pytestmark = skip_unless_launchable(LAUNCH)


results = worker_results(LAUNCH, "workspace_worker.py", "workspace")


def rank0(results, name):
    return rank0_check(results, name, LAUNCH)


def test_every_check_passed_on_every_rank(results):
    assert_every_check_passed(results)


@pytest.mark.parametrize("case", ["alone", "fused_captured", "overlap_captured"])
def test_a_growth_then_the_grown_and_the_repointed_plan_are_right_on_every_rank(results, case):
    """grow_once: M = 2048, then 8192 (grows the workspace), then 2048 again (re-pointed), with
    nothing else held or with a captured op pinning the old workspace."""
    got = [e for e in results[2]["results"] if e["name"].startswith(f"grow_once/{case}/")]
    assert len(got) == 3 * LAUNCH.tp, f"[{LAUNCH.mode}] {case}: {got}"
    assert all(e["ok"] for e in got), f"[{LAUNCH.mode}] {case}: {got}"
    grew = [e["grew"] for e in got if e["rank"] == 0]
    assert grew[1] and not grew[2], grew  # M = 8192 grew the workspace, the re-pointed plan fit


def test_96_token_counts_hold_one_workspace_within_ten_percent_of_the_largest_plan(results):
    c = rank0(results, "growth/workspace_within_headroom_of_largest_plan")
    after = c["after"]
    assert after["workspace_bytes"] <= 1.1 * c["largest_layout_bytes"]
    assert after["largest_plan_bytes"] == c["largest_layout_bytes"]
    assert after["workspace_allocations"] > 1 and after["kept_bytes"] == 0


def test_device_memory_grew_by_the_workspace_and_graphs_only(results):
    d = rank0(results, "growth/device_memory")
    assert d["device_used_delta_mib"] <= d["allowed_delta_mib"]


def test_graphs_per_plan_stay_bounded(results):
    after = rank0(results, "growth/graphs_bounded")["after"]
    assert after["plans"] <= after["max_plans"]
    assert after["eager_graphs"] <= after["plans"] * after["graphs_per_plan"]


def test_results_are_right_also_after_the_workspace_grew(results):
    c = rank0(results, "growth/results")
    assert c["worst_rel_err"] < 1e-2 and c["worst_rel_err_repointed"] < 1e-2
    assert c["repointed"]


def test_two_streams_alternating_ops_are_right(results):
    c = rank0(results, "streams/results")
    assert c["worst_rel_err"] < 1e-2 and c["gathered_equal"]
    assert c["stats"]["workspace_allocations"] >= 2 and c["launches"] == 3 * 21
