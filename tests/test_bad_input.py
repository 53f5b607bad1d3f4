"""Bad input is rejected with ValueError naming the constraint and the values."""

import pytest

import distgemm
from distgemm import build_plan


@pytest.mark.parametrize(
    "schedule,tp,steps,shape,message",
    [
        ("ag_rotate_a", 2, 8, dict(m=8191, n=64, k=64), "M=8191 is not divisible by TP=2"),
        ("ag_rotate_a", 2, 2, dict(m=64, n=63, k=64), "N=63 is not divisible by TP=2"),
        ("ag_rotate_b", 2, 4, dict(m=64, n=67, k=64), "N=67 is not divisible by TP=2"),
        ("ag_rotate_b", 3, 3, dict(m=64, n=63, k=64), "M=64 is not divisible by TP=3"),
        ("rs_tile_a", 4, 4, dict(m=64, n=64, k=66), "K=66 is not divisible by TP=4"),
        ("rs_tile_a", 2, 4, dict(m=67, n=64, k=64), "M=67 is not divisible by TP=2"),
        ("rs_tile_a", 4, 4, dict(m=9, n=64, k=64), "M=9 is not divisible by TP=4"),
        ("rs_tile_b", 2, 4, dict(m=64, n=67, k=64), "N=67 is not divisible by TP=2"),
    ],
    ids=lambda v: v if isinstance(v, str) and " " not in v else None,
)
def test_shapes_the_partition_cannot_split(schedule, tp, steps, shape, message):
    with pytest.raises(ValueError, match=message):
        build_plan(schedule, tp, steps, **shape)


@pytest.mark.parametrize(
    "schedule,tp,message",
    [
        ("ag_rotate_a", 4, "M=6 is not divisible by TP=4: ag_rotate_a shards A on M"),
        ("rs_tile_a", 4, "M=6 is not divisible by TP=4: rs_tile_a shards C/D on M"),
    ],
)
def test_rows_not_divisible_by_tp_name_the_constraint(schedule, tp, message):
    """All-gather and reduce-scatter over M need every rank to hold M/TP rows (as torch's
    collectives do); the message says so with the values."""
    with pytest.raises(ValueError, match=message + r" \(every device holds M/TP of it\)"):
        build_plan(schedule, tp, 2 * tp, m=6, n=64, k=64)


@pytest.mark.parametrize(
    "schedule,tp,steps,shape",
    [
        ("ag_rotate_a", 2, 8, dict(m=8190, n=64, k=64)),
        ("ag_rotate_b", 2, 4, dict(m=64, n=66, k=64)),
        ("rs_tile_a", 2, 4, dict(m=66, n=64, k=64)),
        ("rs_tile_b", 2, 4, dict(m=64, n=66, k=64)),
        ("gemm_allreduce", 2, 2, dict(m=63, n=64, k=64)),
        ("gemm_allreduce", 8, 8, dict(m=1, n=64, k=64)),
    ],
)
def test_splits_that_s_does_not_divide_build_uneven_tiles(schedule, tp, steps, shape):
    """S need not divide the split mode: the tiles are uneven (even empty) and the plan still
    proves its invariants and computes the GEMM."""
    plan = build_plan(schedule, tp, steps, **shape)
    assert distgemm.verify_plan(plan) == []
    assert distgemm.run_reference(plan, beta=0.5, use_bias=True) < 1e-9


def test_unknown_schedule_lists_known_ones():
    with pytest.raises(
        ValueError, match=r"unknown schedule 'ag_rotate_c'; known schedules: ag_rotate_a, "
    ):
        build_plan("ag_rotate_c", 2, m=64, n=64, k=64)


@pytest.mark.parametrize("tp", [0, -1, 9, 16])
def test_tp_out_of_range(tp):
    with pytest.raises(
        ValueError, match=rf"TP={tp} is out of range: distgemm supports 1 <= TP <= 8"
    ):
        build_plan("rs_tile_a", tp, max(tp, 1) * 2 if tp > 0 else 2, m=64, n=64, k=64)


@pytest.mark.parametrize("tp,steps", [(2, 3), (4, 6), (2, 1), (3, 0)])
def test_steps_not_a_multiple_of_tp(tp, steps):
    with pytest.raises(ValueError, match=rf"S={steps} is not a positive multiple of TP={tp}"):
        build_plan("ag_rotate_a", tp, steps, m=96, n=96, k=96)


@pytest.mark.parametrize("dim", ["m", "n", "k", "l"])
def test_non_positive_sizes(dim):
    shape = dict(m=64, n=64, k=64, l=1)
    shape[dim] = 0
    with pytest.raises(ValueError, match="problem sizes must be positive"):
        build_plan("rs_tile_b", 2, **shape)


def test_non_integer_arguments():
    with pytest.raises(ValueError, match=r"m must be an int, got 64.0"):
        build_plan("rs_tile_b", 2, m=64.0, n=64, k=64)
    with pytest.raises(ValueError, match=r"steps must be an int"):
        build_plan("rs_tile_b", 2, "4", m=64, n=64, k=64)


def test_valid_input_builds():
    plan = build_plan("gemm_allreduce", 2, 4, m=64, n=64, k=64)
    assert plan["steps"] == 4 and plan["chunks_per_shard"] == 2


def test_torch_ops_are_exported_lazily():
    import subprocess
    import sys

    # The planning tools do not import torch; the ops do, on first use.
    code = (
        "import sys, distgemm; assert 'torch' not in sys.modules; "
        "f = distgemm.all_gather_gemm; assert 'torch' in sys.modules; "
        "assert f is __import__('distgemm.ops', fromlist=['x']).all_gather_gemm; "
        "assert distgemm.Communicator.__name__ == 'Communicator'"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = distgemm.nope
