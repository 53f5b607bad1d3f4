"""The communicator's one workspace on 2 Hopper GPUs under torchrun
(tests/gpu/workspace_worker.py does the work):

- after 96 token counts (64..6144) of an all_gather_gemm and a gemm_reduce_scatter (K = 4096),
  distgemm holds one workspace of at most the largest plan's layout + 10% (memory_stats), device
  memory in use grew by no more than that plus its graphs, graphs stay within their bounds, and
  results are right, also for plans re-pointed at a grown workspace;
- one communicator used from two streams, ops alternating between them without host
  synchronisation (a growth among them): every result right.

    python3 -m pytest -q tests/gpu/test_workspace.py          # DISTGEMM_TEST_TP=4: 4 GPUs

Decides by the worker's exit code and the checks it writes (JSON). Skips, with the reason,
without 2 Hopper GPUs or without the CUDA runtime in the installed package.
"""

import json
import os
import pathlib

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import run_torchrun, skip_reason  # noqa: E402

TP = int(os.environ.get("DISTGEMM_TEST_TP", "2"))
WORKER = pathlib.Path(__file__).resolve().parent / "workspace_worker.py"
_SKIP = skip_reason(TP, " (DISTGEMM_TEST_TP)")
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    out = tmp_path_factory.mktemp("workspace")
    proc = run_torchrun(WORKER, TP, "--out", str(out))
    ranks = [out / f"rank{r}.json" for r in range(TP)]
    assert all(p.exists() for p in ranks), (
        f"rc={proc.returncode}, a rank wrote no checks:\n{proc.stderr[-4000:]}"
    )
    data = [json.loads(p.read_text()) for p in ranks]
    keep = os.environ.get("DISTGEMM_KEEP_RESULTS")  # a folder: keep the checks there
    if keep:
        pathlib.Path(keep, "workspace.json").write_text(json.dumps(data, indent=1))
    bad = [c for d in data for c in d["checks"] if not c["ok"]]
    assert proc.returncode == 0 and not bad, (
        f"rc={proc.returncode}, failed:\n"
        + "\n".join(json.dumps(c) for c in bad)
        + f"\n{proc.stderr[-3000:]}"
    )
    return {c["name"]: c for c in data[0]["checks"]}  # rank 0's numbers (every rank passed)


def test_96_token_counts_hold_one_workspace_within_ten_percent_of_the_largest_plan(checks):
    c = checks["growth/workspace_within_headroom_of_largest_plan"]
    after = c["after"]
    assert after["workspace_bytes"] <= 1.1 * c["largest_layout_bytes"]
    assert after["largest_plan_bytes"] == c["largest_layout_bytes"]
    assert after["workspace_allocations"] > 1 and after["kept_bytes"] == 0
    d = checks["growth/device_memory"]
    assert d["device_used_delta_mib"] <= d["allowed_delta_mib"]


def test_graphs_per_plan_stay_bounded(checks):
    after = checks["growth/graphs_bounded"]["after"]
    assert after["plans"] <= after["max_plans"]
    assert after["eager_graphs"] <= after["plans"] * after["graphs_per_plan"]


def test_results_are_right_also_after_the_workspace_grew(checks):
    c = checks["growth/results"]
    assert c["worst_rel_err"] < 1e-2 and c["worst_rel_err_repointed"] < 1e-2
    assert c["repointed"]


def test_two_streams_alternating_ops_are_right(checks):
    c = checks["streams/results"]
    assert c["worst_rel_err"] < 1e-2 and c["gathered_equal"]
    assert c["stats"]["workspace_allocations"] >= 2 and c["launches"] == 3 * 21
