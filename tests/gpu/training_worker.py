"""GPU checks of the training layers, their compiled form and the torch drop-ins, one process per
GPU: the CPU tests' workers (tests/test_nn.py, test_custom_ops.py, test_symm_mem.py,
test_symm_mem_fp8.py) with CUDA tensors and distgemm, judged by the CPU tests' checks:

    torchrun --nproc-per-node 2 tests/gpu/training_worker.py --out results.json
    DISTGEMM_ALLOW_SHARED_GPU=1 torchrun --nproc-per-node 2 tests/gpu/training_worker.py ...

Started by tests/gpu/test_training.py. Sections (every rank runs all of them in the same order;
each rank's results are gathered, then judged on every rank; one check per judged item):

  layers       forward output and every gradient (input, weight, bias) of both layers, bf16 and
               fp16, against the full fp32 nn.Linear, and at most 3x the error of the full layer
               in the same dtype on one process (layers/<dtype>)
  compile      a column- then row-parallel MLP under torch.compile(fullgraph=True): aot_eager
               (zero graph breaks, each distgemm op one node of the forward and of the backward
               graph) and inductor, both equal to eager within COMPILED_TOLERANCE
               (compile/<backend>)
  compat       distgemm.compat.symm_mem on torch's own test cases, distgemm serving every bf16/fp16
               case but a gather of K (compat/<case>); at TP = 2 only (COMPAT_TP)
  compat_fp8   distgemm.compat.symm_mem_fp8 on torch's fp8 test cases, distgemm serving what
               test_symm_mem_fp8.served says (compat_fp8/<case>); at TP = 2 only

With DISTGEMM_ALLOW_SHARED_GPU=1 (tests/gpu/test_training.py on a one-GPU machine) 2 ranks share
GPU 0 over a gloo group. The layers' collectives, torch's reference implementations of the
drop-ins and the drop-ins' fallbacks then run through gloo on CUDA tensors: where this torch's
gloo cannot (torchrun_worker.gloo_cuda_problem, which also catches a probe that crashes), the
layers and compat sections are left out with its reason.

Exit code 0 when every check passed on every rank. Rank 0 writes every result to --out (JSON).
"""

import pathlib
import sys
import traceback

import torch.distributed as dist
from torchrun_worker import (
    gloo_cuda_problem,
    left_out_when_shared,
    rank,
    record,
    same_on_all_ranks,
    skip,
    worker_main,
)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/: the workers

# Tokens, hidden, ffn: every GEMM extent a multiple of 8 at TP = 2, 4 or 8, large enough for
# distgemm's pipelines (M/S rows per step).
SIZES = (1024, 1024, 2816)
COMPILED_TOLERANCE = 1e-2  # bf16: compiled kernels may round an intermediate differently


def every_rank(fn):
    """fn() on this rank, then every rank's outcome, in rank order: {"value": ...} or
    {"error", "traceback"}. Every rank reaches the gather, also when fn raised on some."""
    try:
        mine = {"value": fn()}
    except Exception as ex:  # noqa: BLE001 - judged below, with the traceback
        text = "".join(traceback.format_exception(type(ex), ex, ex.__traceback__))
        print(text, file=sys.stderr, flush=True)
        mine = {"error": f"{type(ex).__name__}: {ex}", "traceback": text}
    return same_on_all_ranks(mine)


def judge(name: str, outcomes, failures_of) -> None:
    """Record `name`: failed with every rank's error where a rank raised, else with
    failures_of([value per rank]) (a list of what is wrong; empty: passed)."""
    errors = {r: o for r, o in enumerate(outcomes) if "error" in o}
    if errors:
        record(
            name,
            False,
            error="; ".join(f"rank {r}: {o['error']}" for r, o in errors.items()),
            traceback="\n".join(f"rank {r}:\n{o['traceback']}" for r, o in errors.items()),
        )
        return
    failures = failures_of([o["value"] for o in outcomes])
    record(name, not failures, failures=failures[:20])


def test_layers(tp, dev):
    from test_nn import TOLERANCE, layer_failures, layers_worker

    problem = gloo_cuda_problem(dev)  # the layers' bias and weight collectives run on gloo
    if problem and left_out_when_shared("layers", problem):
        return

    dtypes = ["bfloat16", "float16"]
    outcomes = every_rank(lambda: layers_worker(rank(), tp, dtypes, "cuda", SIZES))
    for dtype in dtypes:
        judge(
            f"layers/{dtype}",
            outcomes,
            lambda values, d=dtype: layer_failures(values, d, TOLERANCE[d], SIZES, tp),
        )


def test_compile(tp):
    from test_custom_ops import compile_failures, compile_worker

    for backend in ("aot_eager", "inductor"):
        # compile_worker's None is aot_eager with its graphs recorded
        outcomes = every_rank(
            lambda b=backend: compile_worker(
                rank(), tp, "cuda", "bfloat16", SIZES, None if b == "aot_eager" else b
            )
        )
        judge(
            f"compile/{backend}",
            outcomes,
            lambda values, b=backend: compile_failures(
                values, COMPILED_TOLERANCE, recorded=b == "aot_eager"
            ),
        )


# The TP of torch's ported test cases: their N = 16 gives N/TP = 8 columns per rank, the kernels'
# unit, at TP = 2 only; which cases distgemm serves (test_symm_mem.case_failures) is TP = 2's.
COMPAT_TP = 2


def test_compat(tp, dev, fp8: bool):
    section = "compat_fp8" if fp8 else "compat"
    if tp != COMPAT_TP:
        skip(
            section, f"torch's ported cases (N = 16) are TP = {COMPAT_TP}'s; this run has TP = {tp}"
        )
        return
    problem = gloo_cuda_problem(dev)
    if problem and left_out_when_shared(section, problem):
        return
    if fp8:
        from test_symm_mem_fp8 import CASE_KEYS, case_failures, compat_fp8_worker

        outcomes = every_rank(lambda: compat_fp8_worker(rank(), tp, "cuda"))
    else:
        from test_symm_mem import GATHER_CASES, SCATTER_CASES, case_failures, compat_worker

        CASE_KEYS = [("gather", *c) for c in GATHER_CASES]
        CASE_KEYS += [("scatter", *c) for c in SCATTER_CASES]
        outcomes = every_rank(lambda: compat_worker(rank(), tp, "cuda"))
    if any("error" in o for o in outcomes):  # one check with every rank's error
        judge(section, outcomes, lambda values: [])
        return
    for key in CASE_KEYS:
        judge(
            f"{section}/{'-'.join(map(str, key))}",
            outcomes,
            lambda values, k=key: case_failures(values, k, on_cuda=True),
        )


def sections(dev, args) -> dict:
    tp = dist.get_world_size()
    return {
        "layers": lambda: test_layers(tp, dev),
        "compile": lambda: test_compile(tp),
        "compat": lambda: test_compat(tp, dev, fp8=False),
        "compat_fp8": lambda: test_compat(tp, dev, fp8=True),
    }


def main() -> None:
    worker_main("training_results.json", sections, init_timeout_s=300.0)


if __name__ == "__main__":
    main()
