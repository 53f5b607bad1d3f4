"""The training layers, their compiled form and torch_compat on 2 Hopper GPUs under torchrun
(tests/gpu/training_worker.py does the work), judged by the CPU tests' checks:

- forward output and every gradient (input, weight, bias) of both layers, bf16 and fp16, against
  the full fp32 nn.Linear, and at most 3x the error of the full layer in the same dtype on one GPU;
- a column- then row-parallel MLP under torch.compile(fullgraph=True): aot_eager (zero graph
  breaks, each distgemm op one node of the forward and of the backward graph) and inductor, both
  equal to eager within bf16 rounding;
- torch_compat on torch's own test cases, with distgemm serving every bf16/fp16 case but a gather
  of K.

    python3 -m pytest -q tests/gpu/test_training.py

Decides by the worker's exit code and the numbers it saves. Skips, with the reason, without 2
Hopper GPUs or without the CUDA runtime in the installed package.
"""

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import run_torchrun, skip_reason  # noqa: E402

TP = 2

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: the CPU tests' checks
WORKER = HERE / "training_worker.py"
COMPILED_TOLERANCE = 1e-2  # bf16: compiled kernels may round an intermediate differently

_SKIP = skip_reason(TP)
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("training")
    proc = run_torchrun(WORKER, TP, "--out", str(out))
    explain = (
        f"rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    )
    assert proc.returncode == 0, explain
    return [torch.load(out / f"result{r}.pt") for r in range(TP)]


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_layers_match_fp32(results, dtype_name):
    from test_nn import TOLERANCE, layer_failures
    from training_worker import SIZES

    layers = [r["layers"] for r in results]
    failures = layer_failures(layers, dtype_name, TOLERANCE[dtype_name], SIZES, TP)
    assert not failures, failures


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_fullgraph_equal_to_eager(results, backend):
    from test_custom_ops import compile_failures

    compiled = [r[f"compile {backend}"] for r in results]
    failures = compile_failures(compiled, COMPILED_TOLERANCE, recorded=backend == "aot_eager")
    assert not failures, failures


def test_torch_compat_ported_cases(results):
    from test_torch_compat import case_failures

    compat = [r["compat"] for r in results]
    failures = [f for key in compat[0] for f in case_failures(compat, key, on_cuda=True)]
    assert not failures, failures
