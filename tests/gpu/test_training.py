"""The training layers, their compiled form and the torch drop-ins (bf16 and fp8) on 2 Hopper
GPUs under torchrun, or on DISTGEMM_TEST_TP of them (the drop-ins' ported cases are TP=2's and
are left out at other TPs); with one GPU, 2 ranks share it (gloo, DISTGEMM_ALLOW_SHARED_GPU=1, a
functional run said so in the results' "mode"). tests/gpu/training_worker.py does the work and
judges it with the CPU tests' checks:

- forward output and every gradient (input, weight, bias) of both layers, bf16 and fp16, against
  the full fp32 nn.Linear, and at most 3x the error of the full layer in the same dtype on one
  process;
- a column- then row-parallel MLP under torch.compile(fullgraph=True): aot_eager (zero graph
  breaks, each distgemm op one node of the forward and of the backward graph) and inductor, both
  equal to eager within bf16 rounding;
- torch_compat on torch's own test cases, with distgemm serving every bf16/fp16 case but a gather
  of K; torch_compat_fp8 on torch's fp8 cases, distgemm serving what
  tests/test_symm_mem_fp8.served says (on a shared GPU these need gloo to run torch's
  reference collectives on CUDA tensors; where it cannot, they skip with gloo's error).

    python3 -m pytest -q -rs tests/gpu/test_training.py

Decides by the worker's exit code and the checks it writes (JSON, kept under
DISTGEMM_TEST_RESULTS when set). Skips, with the reason, without a Hopper GPU or without the
CUDA runtime in the installed package.
"""

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import (  # noqa: E402
    assert_every_check_passed,
    launch_here,
    ran_or_skip,
    skip_unless_launchable,
    worker_results,
)

# 2 ranks by default, DISTGEMM_TEST_TP for others: the layers and the compiled MLP run at any TP;
# the ported torch cases (N = 16) and which of them distgemm serves (test_symm_mem*.case_failures)
# are TP = 2's, so the worker leaves them out at other TPs, with that reason.
LAUNCH = launch_here(default_tp=2)
pytestmark = skip_unless_launchable(LAUNCH)


results = worker_results(LAUNCH, "training_worker.py", "training")


def judged(results, name) -> list:
    """Every rank's verdict of `name`, or a skip with the reason where the worker left it out."""
    got = ran_or_skip(results[2], name)
    assert got, f"[{LAUNCH.mode}] no check {name}"
    return got


def test_every_check_passed_on_every_rank(results):
    assert_every_check_passed(results)


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_layers_match_fp32(results, dtype_name):
    got = judged(results, f"layers/{dtype_name}")
    assert len(got) == LAUNCH.tp and all(e["ok"] for e in got), got


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_fullgraph_equal_to_eager(results, backend):
    got = judged(results, f"compile/{backend}")
    assert len(got) == LAUNCH.tp and all(e["ok"] for e in got), got


@pytest.mark.parametrize("section", ["compat", "compat_fp8"])
def test_torch_compat_ported_cases(results, section):
    got = judged(results, section)
    bad = [e for e in got if not e["ok"]]
    assert not bad, bad[:10]
    assert len({e["name"] for e in got}) > 10  # every ported case, each its own check
