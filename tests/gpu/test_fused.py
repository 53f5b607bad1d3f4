"""gemm_all_reduce's fused path (GEMM + all-reduce in one kernel) on the GPUs under torchrun, at
TP = every visible GPU (DISTGEMM_TEST_TP sets another); with one GPU, 2 ranks share it (gloo,
DISTGEMM_ALLOW_SHARED_GPU=1: a functional run, said so in the results' "mode"). The work is
tests/gpu/fused_worker.py's:

    python3 -m pytest -q -rs tests/gpu/test_fused.py

Decides by the worker's exit code and the results it writes (JSON, kept under
DISTGEMM_TEST_RESULTS when set), never by grepping output. Skips, with the reason, without a
Hopper GPU or without distgemm's CUDA runtime.
"""

import re

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
TP = LAUNCH.tp
REPLAYS = 1000

pytestmark = skip_unless_launchable(LAUNCH)


results = worker_results(LAUNCH, "fused_worker.py", "fused", "--replays", str(REPLAYS))


def test_every_check_passed_on_every_rank(results):
    print(f"\n[{LAUNCH.mode}]")
    assert_every_check_passed(results)


def test_every_token_count_and_dtype_matched_torch_on_every_rank(results):
    _, _, data = results
    got = [e for e in named(data, "correctness/m") if e["ok"]]
    # fused_worker.test_correctness: 15 token counts + 7 more shapes, 2 dtypes, on every rank
    assert len(got) == 2 * 22 * TP, f"[{LAUNCH.mode}] {len(got)} passing checks of {2 * 22 * TP}"
    assert all(e["identical_on_ranks"] for e in got)
    # both kernels ran: the decode kernel up to FUSED_DECODE_MAX_TOKENS, CUTLASS's above
    assert {e["kernel"] for e in got} == {"decode", "cutlass"}


def test_auto_runs_what_the_decode_model_picks(results):
    """The worker checks each auto entry against runtime.reduce_cost's choice under the
    machine's constants (the path model's beyond them)."""
    _, _, data = results
    for m in (8, 256, 512):
        got = named(data, f"correctness/auto_m{m}")
        assert len(got) == TP and all(e["ok"] for e in got), got


def test_a_thousand_replays_and_interleaving(results):
    _, _, data = results
    replays = named(data, "capture/replays")
    assert len(replays) == TP and all(e["ok"] and e["replays"] == REPLAYS for e in replays)
    inter = named(data, "capture/interleaved_with_growth")
    assert len(inter) == TP and all(e["ok"] for e in inter)


def test_back_to_back_launches_of_mixed_sizes_stay_correct(results):
    """fused_worker.test_mixed_sizes: one captured graph of fused ops of four sizes, both
    kernels, every output of every replay within TOL."""
    _, _, data = results
    got = named(data, "capture/mixed_sizes")
    assert len(got) == TP and all(e["ok"] and e["replays"] == REPLAYS // 5 for e in got), got
    assert all({"decode", "cutlass"} == set(e["kernels"]) for e in got)
    assert all(e["fused_receive_bytes"] > 0 for e in got)


def test_missing_peer_ends_in_timeout_error(results):
    _, _, data = results
    got = named(data, "timeout/")
    assert len(got) == TP - 1 and all(e["ok"] for e in got), got


def test_two_shot_tail_is_bitwise_the_one_shot_on_every_rank(results):
    """fused_worker.test_two_shot: path="fused_two_shot" at 15 shapes above the decode
    kernel's tokens, 2 dtypes, every rank: the one-shot tail's bits, the same on every rank,
    within TOL of torch in fp32; its entries run the fused path with the two-shot tail."""
    _, _, data = results
    shapes = [e for e in named(data, "two_shot/m") if re.match(r"two_shot/m\d", e["name"])]
    got = [e for e in shapes if e["ok"]]
    assert len(got) == 2 * 15 * TP, f"[{LAUNCH.mode}] {len(got)} passing checks of {2 * 15 * TP}"
    assert all(e["same_as_one_shot"] and e["identical_on_ranks"] for e in got)
    assert {e["token_tile"] for e in got} == {64, 96, 128, 192, 256}  # every CUTLASS tile
    entries = named(data, "two_shot/entries_run_the_two_shot_tail")
    assert len(entries) == TP and all(e["ok"] for e in entries), entries


def test_two_shot_tail_in_captured_replays_and_mixed_graphs(results):
    """fused_worker.test_two_shot_capture and test_two_shot_mixed: replays of the two-shot op
    bitwise equal to the one-shot op's; both tails and both kernels back to back in one graph,
    every output of every replay within TOL."""
    _, _, data = results
    got = named(data, "two_shot/capture_replays")
    assert len(got) == TP and all(e["ok"] and e["replays"] == REPLAYS // 5 for e in got), got
    assert all(e["replays_off_one_shot"] == 0 for e in got)
    mixed = named(data, "two_shot/mixed_sizes")
    assert len(mixed) == TP and all(e["ok"] and e["replays"] == REPLAYS // 5 for e in mixed)
    assert all({"fused", "fused_two_shot"} == set(e["paths"]) for e in mixed)
    assert all({"decode", "cutlass"} == set(e["kernels"]) for e in mixed)


def test_two_shot_tail_times_out_naming_the_missing_rank(results):
    """fused_worker.test_two_shot_timeout: a rank that never replays is named by its partials;
    a rank that never sums its slices (it runs the one-shot tail) is named by the sums the
    others wait for; it finishes itself."""
    _, _, data = results
    never = named(data, "two_shot/timeout/peer_never_replays")
    assert len(never) == TP - 1 and all(e["ok"] for e in never), never
    sums = named(data, "two_shot/timeout/owner_never_sums")
    assert len(sums) == TP and all(e["ok"] for e in sums), sums
