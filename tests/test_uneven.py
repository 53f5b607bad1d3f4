"""Uneven and empty tiles: every token count a schedule accepts (any M for ar_tile_a and
rs_tile_b, M divisible by TP where M is sharded) builds a plan that the checker proves and the
reference executor computes as torch does in float64, with no op of zero extent and no wait for a
flag that nobody sets."""

import random
import zlib

import numpy as np
import pytest
import torch
from ranks import CPU_TPS

import distgemm
from distgemm import build_plan, verify_plan
from distgemm.plan.reference import execute_plan, reference_inputs, shard_outputs

SCHEDULES = distgemm.schedule_names()
GRID = [(tp, tp * k) for tp in CPU_TPS for k in (1, 2)]
TOL = 1e-12  # relative, float64 end to end: only summation-order rounding
POLICIES = ("compute_first_low", "random:1")


def seed_of(*parts) -> int:
    return zlib.crc32("-".join(map(str, parts)).encode())


def shards_m(schedule: str) -> bool:
    d = distgemm.schedule_definition(schedule)["partition"]
    return "M" in (d["a"], d["b"], d["d"])


def token_counts(tp: int, steps: int, sharded: bool, split_m: bool) -> list[int]:
    """Split along M: every count up to 2*S+1 (all remainders mod S, and fewer rows than
    tiles), a stride through the rest up to 3*TP*S (unsharded M only: sharded, these are the
    TP multiples up to 2*TP*S+TP), and larger odd ones. Split along N (M does not shape the
    tiles): up to 2*TP+1 and one larger odd count. Times TP where M is sharded."""
    if not split_m:
        base, odd = set(range(1, 2 * tp + 2)), {255}
    elif sharded:
        base, odd = set(range(1, 2 * steps + 2)), {255, 1001}
    else:
        top = 2 * steps + 1
        base = set(range(1, top + 1)) | set(range(top + 1, 3 * tp * steps + 1, 2 * tp + 1))
        odd = {255, 1001}
    return sorted((tp if sharded else 1) * j for j in base | odd)


def torch_outputs(plan, inputs, alpha, beta, use_bias):
    """Each device's D from the plain torch computation in float64."""
    t = {name: torch.from_numpy(x) for name, x in inputs.items()}
    full = alpha * torch.matmul(t["A"], t["B"].transpose(1, 2)) + beta * t["C"]
    if use_bias:
        full = full + t["bias"]
    return shard_outputs(plan, full.numpy())


def assert_plan_computes_the_gemm(plan, rng, what):
    violations = verify_plan(plan)
    assert violations == [], f"{what}: " + "; ".join(map(str, violations[:3]))
    for dev in plan["devices"]:
        assert all(min(g["m"], g["n"], g["k"]) > 0 for g in dev["gemms"]), what
        assert all(min(c["rows"], c["cols"]) > 0 for c in dev["copies"]), what
    alpha, beta = rng.choice([1.0, -1.25]), rng.choice([0.0, 0.75])
    use_bias = rng.random() < 0.5
    for policy in POLICIES:
        inputs = reference_inputs(plan, seed=rng.randint(0, 10**6))
        got = execute_plan(plan, inputs, alpha=alpha, beta=beta, use_bias=use_bias, policy=policy)
        want = torch_outputs(plan, inputs, alpha, beta, use_bias)
        for d, (g, w) in enumerate(zip(got, want)):
            assert np.all(np.isfinite(g)), f"{what}, {policy}: device {d}'s D is not all written"
            err = float(np.linalg.norm(g - w) / np.linalg.norm(w))
            assert err < TOL, f"{what}, {policy}: device {d} relative error {err}"


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("tp,steps", GRID, ids=[f"tp{t}-S{s}" for t, s in GRID])
def test_every_token_count(schedule, tp, steps):
    rng = random.Random(seed_of("tokens", schedule, tp, steps))
    sharded = shards_m(schedule)
    split_n = distgemm.schedule_definition(schedule)["split"] == "N"
    for m in token_counts(tp, steps, sharded, not split_n):
        n = tp * 8 * steps if split_n else tp * 8
        plan = build_plan(schedule, tp, steps, m=m, n=n, k=tp * 8, l=rng.choice([1, 2]))
        assert_plan_computes_the_gemm(plan, rng, f"{schedule} TP={tp} S={steps} M={m}")


RING = [s for s in SCHEDULES if distgemm.schedule_definition(s)["collective"] != "all_gather"]


@pytest.mark.parametrize("schedule", RING)
@pytest.mark.parametrize("tp,steps", [(tp, 2 * tp) for tp in CPU_TPS], ids=lambda v: str(v))
def test_partials_by_copy_engine_and_uneven_tiles(schedule, tp, steps):
    rng = random.Random(seed_of("copy", schedule, tp, steps))
    for m in (1, steps - 1, steps + 1, 2 * steps + 3):
        m = tp * m if shards_m(schedule) else m
        n = tp * 8 * steps if schedule == "rs_tile_b" else tp * 8
        plan = build_plan(schedule, tp, steps, m=m, n=n, k=tp * 8, l=2, partial_via="copy")
        assert_plan_computes_the_gemm(plan, rng, f"{schedule} TP={tp} S={steps} M={m} (copy)")


@pytest.mark.parametrize("schedule", ["ag_rotate_b", "rs_tile_b"])
@pytest.mark.parametrize(
    "tp,steps", [(tp, 2 * tp) for tp in CPU_TPS] + [(2, 6), (8, 24)], ids=lambda v: str(v)
)
def test_uneven_tiles_of_n_are_whole_16_byte_units(schedule, tp, steps):
    """Along N an uneven split (S does not divide N) cuts whole units of 8 columns, so every
    sub-GEMM keeps the kernel's extent rule (N a multiple of 8) when N/TP is one; the rest below
    a unit goes to a shard's last tile. An even split keeps its N/S columns where they are whole
    units; 12 + 12 becomes 16 + 8, and parts below a unit become whole units and empty steps
    (no GEMM): 4 + 4 + 4 + 4 becomes 8 + 8."""
    rng = random.Random(seed_of("n", schedule, tp, steps))
    for units in range(1, 2 * steps // tp + 3):
        n = tp * 8 * units
        plan = build_plan(schedule, tp, steps, m=tp * 3, n=n, k=tp * 8)
        widths = [g["n"] for dev in plan["devices"] for g in dev["gemms"]]
        if n % steps == 0 and (n // steps) % 8 == 0:
            assert set(widths) == {n // steps}, (n, widths)
        else:
            assert all(w % 8 == 0 for w in widths), (n, widths)
            assert max(widths) - min(widths) <= 8, (n, widths)
            core_plan = distgemm._core.build_plan(schedule, tp, steps, tp * 3, n, tp * 8, 1)
            assert core_plan.extent_problem(-1) == "", n
        assert_plan_computes_the_gemm(plan, rng, f"{schedule} TP={tp} S={steps} N={n}")
    plan = build_plan(schedule, tp, steps, m=tp * 3, n=tp * (8 * steps // tp + 3), k=tp * 8)
    assert_plan_computes_the_gemm(plan, rng, f"{schedule} TP={tp} S={steps} N with a remainder")


def test_one_token_on_two_devices_runs_one_gemm_each():
    """ar_tile_a at M=1, TP=2: tile 1 is empty. Each device runs one GEMM (tile 0); the
    ring passes one partial and the owner pushes one row back; nothing of tile 1 exists."""
    plan = build_plan("ar_tile_a", 2, 2, m=1, n=64, k=64)
    for dev in plan["devices"]:
        assert [(g["tile"], g["m0"], g["m"]) for g in dev["gemms"]] == [(0, 0, 1)]
    waits = [
        f for dev in plan["devices"] for op in dev["gemms"] + dev["copies"] for f in op["waits"]
    ]
    signals = [
        (s["device"], s["flag"])
        for dev in plan["devices"]
        for op in dev["gemms"] + dev["copies"]
        for s in op["signals"]
    ]
    assert len(waits) == len(signals) == 2  # the partial's flag and the finished row's flag
    assert_plan_computes_the_gemm(plan, random.Random(1), "ar_tile_a M=1 TP=2")


def test_even_splits_keep_one_tile_size():
    """Where S divides the split mode every tile has M/S rows (the plans of before)."""
    for schedule in SCHEDULES:
        plan = build_plan(schedule, 4, 8, m=4 * 8 * 3, n=4 * 8 * 8, k=32)
        key = "m" if plan["definition"]["split"] == "M" else "n"
        ext = plan["problem"][key] // 8
        for dev in plan["devices"]:
            assert len(dev["gemms"]) == 8
            assert [g["iteration"] for g in dev["gemms"]] == list(range(8))
            assert {g[key] for g in dev["gemms"]} == {ext}
