"""The one switch for torch's async-TP (distgemm.compat.async_tp) on Hopper GPUs under torchrun, at
TP = every visible GPU (DISTGEMM_TEST_TP sets another); tests/gpu/async_tp_worker.py does the
work:

- a sequence-parallel MLP compiled by inductor (fullgraph) with torch's micro-pipeline TP pass:
  with the switch on, distgemm serves both fused ops torch's pass put in the graph (one call
  each, no fallback, no graph break) and the output is within bf16 tolerance (1e-2 relative) of
  fp32; with the switch off the same compiled function runs torch's kernels (nothing routed),
  within the same tolerance of the switch-on output and of fp32;
- an eager fp32 call of the fused all-gather op with the switch on goes to torch's CUDA kernel,
  with distgemm's reason counted, and its result is right.

    DISTGEMM_TEST_TP=4 python3 -m pytest -q -rs tests/gpu/test_async_tp_switch.py

Decides by the worker's exit code and the checks it writes (JSON, kept under
DISTGEMM_TEST_RESULTS when set). Skips, with the reason, without a Hopper GPU or without the
CUDA runtime in the installed package; with one GPU the ranks share it over gloo and the checks
that run torch's own kernels are left out (each such test skips saying so).
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

LAUNCH = launch_here()
FUSED = ("fused_all_gather_matmul", "fused_matmul_reduce_scatter")
pytestmark = skip_unless_launchable(LAUNCH)


results = worker_results(LAUNCH, "async_tp_worker.py", "async_tp")


def test_every_check_passed_on_every_rank(results):
    assert_every_check_passed(results)


def test_switch_on_distgemm_serves_the_compiled_graph(results):
    c = rank0_check(results, "async_tp/switch_on", LAUNCH)
    assert c["graph_breaks"] == 0
    assert {name: c["routed"][name] for name in FUSED} == {name: [1, {}] for name in FUSED}
    assert c["rel_err_vs_fp32"] <= 1e-2


def test_switch_off_runs_torch_and_agrees(results):
    c = rank0_check(results, "async_tp/switch_off", LAUNCH)
    assert all(v == [0, {}] for v in c["routed"].values())
    assert c["rel_err_on_vs_off"] <= 1e-2 and c["rel_err_vs_fp32"] <= 1e-2


def test_unservable_eager_call_falls_back_to_torch(results):
    c = rank0_check(results, "async_tp/eager_fallback", LAUNCH)
    reason = "dtypes ['torch.float32']: distgemm takes one dtype, bf16 or fp16"
    assert c["routed"] == [0, {reason: 1}]
