"""distgemm's one-shot / two-shot all-reduce kernels (flag, LL, pull) on Hopper GPUs under torchrun,
at TP = every visible GPU (DISTGEMM_TEST_TP sets another; one GPU: 2 ranks sharing it, a
functional run); tests/gpu/allreduce_kernel_worker.py does the work:

- every algorithm (one_shot, two_shot, one_shot_ll, two_shot_ll, two_shot_pull), bf16 and fp16,
  numel 8 .. 4M (chunking edge cases), in place and out of place (two_shot_pull also from its
  input region): bitwise the float32 sum over ranks in rank order rounded to the dtype, within 1
  ulp relative of the float64 sum, bitwise the same on every rank;
- mixed sizes and algorithms back to back; a CUDA graph of several calls replayed with fresh
  inputs and eager calls between replays;
- torch.mm then the all-reduce (the collective path's pair), chained by programmatic dependent
  launch and not, captured and replayed with fresh activations: the ordered sum of the GEMMs;
- a rank that skips a call: the others' launch times out with an error naming it.

    DISTGEMM_TEST_TP=4 python3 -m pytest -q -rs tests/gpu/test_allreduce_kernel.py

Decides by the worker's exit code and the numbers it writes (JSON, kept under
DISTGEMM_TEST_RESULTS when set). Skips, with the reason, without a Hopper GPU or without the CUDA
runtime in the installed package.
"""

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import (  # noqa: E402
    assert_every_check_passed,
    launch_here,
    named,
    skip_unless_launchable,
    worker_results,
)

LAUNCH = launch_here()
pytestmark = skip_unless_launchable(LAUNCH)
REPLAYS = 20
ALGOS = ["one_shot", "two_shot", "one_shot_ll", "two_shot_ll", "two_shot_pull"]


results = worker_results(
    LAUNCH, "allreduce_kernel_worker.py", "allreduce_kernel", "--replays", str(REPLAYS)
)


def every_rank(results, name):
    got = named(results[2], name)
    assert len(got) == LAUNCH.tp, f"[{LAUNCH.mode}] {name}: {len(got)} ranks of {LAUNCH.tp}"
    return got


def test_every_check_passed_on_every_rank(results):
    assert_every_check_passed(results)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_sum_is_the_ordered_float32_sum_and_the_same_bits_everywhere(results, algo, dtype):
    for e in every_rank(results, f"correctness/{algo}/{dtype}"):
        assert e["ok"] and e["bitwise_same_on_every_rank"], e
        assert e["worst_diff_in_ulps"] <= 1.0, e
        assert min(e["numels"]) == 8 and max(e["numels"]) == 4 * 1024 * 1024
        # in place and out of place; pull also from its input region
        assert e["calls"] == (3 if algo == "two_shot_pull" else 2) * len(e["numels"])


def test_memory_is_reported(results):
    for e in every_rank(results, "correctness/memory_reported"):
        assert e["ok"], e


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_mixed_sizes_back_to_back(results, dtype):
    for e in every_rank(results, f"interleaved/{dtype}"):
        assert e["ok"] and e["calls"] == len(e["plan"]), e


def test_captured_graph_replays_with_fresh_inputs(results):
    for e in every_rank(results, "capture/replays"):
        assert e["ok"] and e["replays"] == REPLAYS, e
        assert e["calls"] == REPLAYS * (e["calls_per_graph"] + 1)


def test_chained_pair_reads_the_gemm_it_follows(results):
    for e in every_rank(results, "chained/mm_then_all_reduce"):
        assert e["ok"] and e["replays"] == REPLAYS, e
        assert e["calls_per_graph"] == 2 * len(ALGOS)
        assert e["calls"] == REPLAYS * e["calls_per_graph"]


@pytest.mark.parametrize("algo", ALGOS)
def test_a_rank_that_skips_a_call_ends_in_a_timeout_error(results, algo):
    got = named(results[2], f"timeout/{algo}/")
    assert len(got) == LAUNCH.tp - 1 and all(e["ok"] for e in got), got
