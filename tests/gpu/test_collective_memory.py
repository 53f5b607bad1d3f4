"""The collective path's scratch on Hopper GPUs under torchrun, at TP = every visible GPU
(DISTGEMM_TEST_TP sets another); tests/gpu/collective_memory_worker.py does the work:

- issue 41's serving loop with path="collective" (96 token counts 64..6144, an all_gather_gemm
  and a gemm_reduce_scatter each, K = 4096, N = 3072, bf16): torch's allocated memory grows by
  exactly memory_stats' collective_bytes, at most the largest call's scratch + 10%, with one
  buffer, and close() gives it back; results right, also for smaller shapes after the growth;
- rs_tile_b, whose call takes two regions of the buffer: results right;
- calls on a second stream: a buffer of its own, results right on both streams.

    DISTGEMM_TEST_TP=4 python3 -m pytest -q -rs tests/gpu/test_collective_memory.py

Decides by the worker's exit code and the numbers it writes (JSON, kept under
DISTGEMM_TEST_RESULTS when set). Skips, with the reason, without a Hopper GPU or without the
CUDA runtime in the installed package; with one GPU the ranks share it over gloo, which cannot
run the collective path: the worker leaves its checks out and each test skips saying so.
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

from distgemm.runtime.paths.collective import SCRATCH_HEADROOM  # noqa: E402

LAUNCH = launch_here()
pytestmark = skip_unless_launchable(LAUNCH)


results = worker_results(LAUNCH, "collective_memory_worker.py", "collective_memory")


def rank0(results, name):
    return rank0_check(results, name, LAUNCH)


def test_every_check_passed_on_every_rank(results):
    assert_every_check_passed(results)


def test_96_token_counts_hold_one_buffer_within_ten_percent_of_the_largest_call(results):
    c = rank0(results, "loop/scratch_within_headroom_of_largest_call")
    stats, largest = c["stats"], c["largest_call_scratch_bytes"]
    assert largest == 6144 * 4096 * 2  # the gathered [M, K] of the largest all-gather
    assert stats["collective_bytes"] <= largest * (1 + SCRATCH_HEADROOM)
    assert c["worst_held_over_largest"] <= 1 + SCRATCH_HEADROOM
    assert stats["collective_buffers"] == 1
    assert 1 < stats["collective_allocations"] < 96  # the headroom spares most growths


def test_torch_memory_grew_by_the_reported_scratch_only(results):
    c = rank0(results, "loop/torch_memory_is_the_scratch")
    grown, stats = c["torch_allocated_growth_bytes"], c["stats"]
    assert grown == stats["collective_bytes"]
    assert grown <= c["largest_call_scratch_bytes"] * (1 + SCRATCH_HEADROOM)


def test_close_gives_the_scratch_back(results):
    assert rank0(results, "loop/close_frees_the_scratch")["after_close_bytes"] == 0


def test_results_are_right_also_for_smaller_shapes_after_the_growth(results):
    c = rank0(results, "loop/results")
    assert c["worst_rel_err"] < 1e-2 and c["worst_rel_err_smaller_after_growth"] < 1e-2


def test_two_regions_of_one_call_rs_tile_b_are_right(results):
    assert rank0(results, "regions/rs_tile_b")["worst_rel_err"] < 1e-2


def test_a_second_stream_gets_its_own_buffer_and_both_are_right(results):
    c = rank0(results, "streams/own_buffer_and_right")
    assert c["worst_rel_err"] < 1e-2 and c["stats"]["collective_buffers"] == 2
