"""The CPU reference executor runs every plan on simulated devices and matches the full GEMM."""

import random
import zlib

import numpy as np
import pytest
import torch
from ranks import CPU_TPS

import distgemm
from distgemm import build_plan, run_reference
from distgemm.plan.reference import execute_plan, expected_outputs, reference_inputs, shard_outputs

SCHEDULES = distgemm.schedule_names()
TPS = sorted({1, 5, *CPU_TPS})  # CPU_TPS, one rank, and a prime TP (5)
CASES = [(tp, tp * k, l) for tp in TPS for k in (1, 2, 4) for l in (1, 3)]
TOL = 1e-9  # float64 end to end: only summation-order rounding


def case_seed(*parts) -> int:
    """The seed of one test case: CRC-32 of its parameters (Python's hash of a str changes from
    one process to the next)."""
    return zlib.crc32("-".join(map(str, parts)).encode())


def random_shape(rng, tp, steps):
    return dict(
        m=steps * tp * rng.randint(1, 3), n=steps * tp * rng.randint(1, 3), k=tp * rng.randint(1, 5)
    )


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("tp,steps,l", CASES, ids=[f"tp{t}-S{s}-L{l}" for t, s, l in CASES])
def test_reference_matches_full_gemm(schedule, tp, steps, l):
    rng = random.Random(case_seed(schedule, tp, steps, l))
    plan = build_plan(schedule, tp, steps, l=l, **random_shape(rng, tp, steps))
    alpha = rng.choice([1.0, 0.5, -1.25])
    beta = rng.choice([0.0, 1.0, 0.75])
    err = run_reference(
        plan, alpha=alpha, beta=beta, use_bias=rng.random() < 0.5, seed=rng.randint(0, 10**6)
    )
    assert err < TOL, f"relative Frobenius error {err} (alpha={alpha}, beta={beta})"


# Error bounds against a wider reference, per dtype the executor runs in: the relative one (at
# most twice the error of the same computation in torch, in the same dtype, on the same inputs)
# and an absolute one (a small multiple of the dtype's unit roundoff, 6e-8 and 1.1e-16).
ABS_TOL = {np.float32: 1e-6, np.float64: TOL}
MAX_ERROR_VS_TORCH = 2.0


def sizable_shape(rng, tp, steps):
    """A problem of at least 16 x 16 outputs summed over at least 32 products each, so that both
    errors compared average many roundings (a handful of them makes their ratio noise)."""
    unit = steps * tp

    def at_least(size):
        return unit * -(-size // unit) * rng.randint(1, 2)

    return dict(m=at_least(16), n=at_least(16), k=at_least(32))


def torch_outputs(plan, inputs, alpha, beta, use_bias):
    """Each device's D from the plain, undistributed torch computation in the inputs' dtype."""
    t = {name: torch.from_numpy(x) for name, x in inputs.items()}
    full = alpha * torch.matmul(t["A"], t["B"].transpose(1, 2))
    if beta != 0.0:
        full = full + beta * t["C"]
    if use_bias:
        full = full + t["bias"]
    return shard_outputs(plan, full.numpy())


def relative_error(got, want):
    """Relative Frobenius error of all devices' D together."""
    diff = sum(float(np.linalg.norm((g - w).astype(np.float64))) ** 2 for g, w in zip(got, want))
    norm = sum(float(np.linalg.norm(w.astype(np.float64))) ** 2 for w in want)
    return (diff / norm) ** 0.5


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("tp,steps,l", CASES, ids=[f"tp{t}-S{s}-L{l}" for t, s, l in CASES])
def test_error_within_twice_torch(schedule, tp, steps, l, dtype):
    """The executor in ``dtype`` (slots and D in ``dtype`` too, so partials are rounded where
    they land) against a wider reference on the same inputs: float64 for float32, long double
    for float64. Its error is at most MAX_ERROR_VS_TORCH times torch's in the same dtype."""
    wide = np.float64 if dtype == np.float32 else np.longdouble
    if np.finfo(wide).eps >= np.finfo(dtype).eps:
        pytest.skip(f"no wider float than {np.dtype(dtype).name} here (long double is double)")
    rng = random.Random(case_seed("vs-torch", schedule, tp, steps, l, np.dtype(dtype).name))
    plan = build_plan(schedule, tp, steps, l=l, **sizable_shape(rng, tp, steps))
    alpha, beta = rng.choice([1.0, 0.5, -1.25]), rng.choice([0.0, 1.0, 0.75])
    use_bias = rng.random() < 0.5
    inputs = reference_inputs(plan, seed=rng.randint(0, 10**6), dtype=dtype)
    exact = expected_outputs(
        plan, {n: x.astype(wide) for n, x in inputs.items()}, alpha, beta, use_bias
    )
    got = execute_plan(plan, inputs, alpha=alpha, beta=beta, use_bias=use_bias, dtype=dtype)
    err = relative_error(got, exact)
    torch_err = relative_error(torch_outputs(plan, inputs, alpha, beta, use_bias), exact)
    assert err < ABS_TOL[dtype], f"relative Frobenius error {err}"
    assert err <= MAX_ERROR_VS_TORCH * torch_err, (
        f"relative Frobenius error {err}, torch's {torch_err} (alpha={alpha}, beta={beta})"
    )


RING = ["rs_tile_a", "rs_tile_b", "ar_tile_a"]
RING_CASES = [
    (tp, tp * k, l) for tp in CPU_TPS for k in (1, 2) for l in (1, 2)
]  # TP=1: no partials


@pytest.mark.parametrize("schedule", RING)
@pytest.mark.parametrize(
    "tp,steps,l", RING_CASES, ids=[f"tp{t}-S{s}-L{l}" for t, s, l in RING_CASES]
)
def test_reference_matches_with_partials_by_copy_engine(schedule, tp, steps, l):
    rng = random.Random(case_seed("copy", schedule, tp, steps, l))
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
