"""The CPU reference executor runs every plan on simulated devices and matches the full GEMM."""

import random

import numpy as np
import pytest

import distgemm
from distgemm import build_plan, run_reference
from distgemm.reference import execute_plan, expected_outputs, reference_inputs

SCHEDULES = distgemm.schedule_names()
CASES = [(tp, tp * k, l) for tp in (1, 2, 3, 4, 5, 8) for k in (1, 2, 4) for l in (1, 3)]
TOL = 1e-9  # float64 end to end: only summation-order rounding


def random_shape(rng, tp, steps):
    return dict(
        m=steps * tp * rng.randint(1, 3), n=steps * tp * rng.randint(1, 3), k=tp * rng.randint(1, 5)
    )


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("tp,steps,l", CASES, ids=[f"tp{t}-S{s}-L{l}" for t, s, l in CASES])
def test_reference_matches_full_gemm(schedule, tp, steps, l):
    rng = random.Random(hash((schedule, tp, steps, l)) & 0xFFFF)
    plan = build_plan(schedule, tp, steps, l=l, **random_shape(rng, tp, steps))
    alpha = rng.choice([1.0, 0.5, -1.25])
    beta = rng.choice([0.0, 1.0, 0.75])
    err = run_reference(
        plan, alpha=alpha, beta=beta, use_bias=rng.random() < 0.5, seed=rng.randint(0, 10**6)
    )
    assert err < TOL, f"relative Frobenius error {err} (alpha={alpha}, beta={beta})"


RING = ["rs_tile_a", "rs_tile_b", "gemm_allreduce"]
RING_CASES = [
    (tp, tp * k, l) for tp in (2, 3, 4, 8) for k in (1, 2) for l in (1, 2)
]  # TP=1: no partials


@pytest.mark.parametrize("schedule", RING)
@pytest.mark.parametrize(
    "tp,steps,l", RING_CASES, ids=[f"tp{t}-S{s}-L{l}" for t, s, l in RING_CASES]
)
def test_reference_matches_with_partials_by_copy_engine(schedule, tp, steps, l):
    rng = random.Random(hash(("copy", schedule, tp, steps, l)) & 0xFFFF)
    plan = build_plan(schedule, tp, steps, l=l, partial_via="copy", **random_shape(rng, tp, steps))
    assert all(dev["copies"] for dev in plan["devices"])  # the partials do travel by copy
    alpha, beta = rng.choice([1.0, -1.25]), rng.choice([0.0, 0.75])
    err = run_reference(
        plan, alpha=alpha, beta=beta, use_bias=rng.random() < 0.5, seed=rng.randint(0, 10**6)
    )
    assert err < TOL, f"relative Frobenius error {err} (alpha={alpha}, beta={beta})"


def test_outputs_are_fully_written_and_nan_poisoned_otherwise():
    plan = build_plan("ag_rotate_b", 2, 4, m=16, n=32, k=8)
    inputs = reference_inputs(plan, seed=3)
    got = execute_plan(plan, inputs, alpha=1.0, beta=0.5, use_bias=True)
    want = expected_outputs(plan, inputs, 1.0, 0.5, True)
    for g, w in zip(got, want):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    # A plan with no GEMMs writes nothing: D stays NaN, the executor never fakes a result.
    empty = distgemm.clone_plan(plan)
    for dev in empty["devices"]:
        dev["gemms"].clear()
        dev["copies"].clear()
    assert all(np.isnan(d).all() for d in execute_plan(empty, inputs))


def test_fresh_inputs_differ_per_seed():
    plan = build_plan("rs_tile_a", 2, 2, m=8, n=8, k=8)
    a = reference_inputs(plan, seed=1)["A"]
    b = reference_inputs(plan, seed=2)["A"]
    assert not np.allclose(a, b) and np.count_nonzero(a) == a.size
