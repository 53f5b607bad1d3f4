"""The checks can fail: corrupt a scheduler coefficient, drop a copy, swap a signal, misdirect a
partial — the invariant checker AND the reference executor must both reject each mutant."""

import pytest

import distgemm
from distgemm import ExecutionError, build_plan, check_plan, run_reference

SCHEDULES = distgemm.schedule_names()
CONFIGS = [(2, 2), (3, 6), (4, 8)]


def shape(tp, steps):
    return dict(m=steps * tp * 4, n=steps * tp * 2, k=tp * 8, l=2)


def assert_both_fail(plan, what):
    violations = check_plan(plan)
    assert violations, f"checker accepted a plan with {what}"
    try:
        err = run_reference(plan, alpha=1.0, beta=0.5, use_bias=True, seed=11)
    except ExecutionError:
        return
    assert not err < 1e-6, f"reference executor matched the full GEMM (error {err}) despite {what}"


def fresh(schedule, tp, steps):
    plan = build_plan(schedule, tp, steps, **shape(tp, steps))
    assert check_plan(plan) == [] and run_reference(plan, beta=0.5, use_bias=True) < 1e-9
    return plan


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("tp,steps", CONFIGS, ids=[f"tp{t}-S{s}" for t, s in CONFIGS])
def test_corrupt_iteration_coefficient(schedule, tp, steps):
    # b = 0: every iteration computes the same tile (a device never sees the rest).
    definition = distgemm.schedule_definition(schedule)
    definition["tile"]["b"] = 0
    assert_both_fail(build_plan(definition, tp, steps, **shape(tp, steps)), "tile map b=0")


@pytest.mark.parametrize("schedule", ["rs_tile_a", "rs_tile_b", "gemm_allreduce"])
@pytest.mark.parametrize("tp,steps", CONFIGS, ids=[f"tp{t}-S{s}" for t, s in CONFIGS])
def test_corrupt_constant_coefficient(schedule, tp, steps):
    # c + 1: the ring still closes but the last partial lands on the wrong device.
    definition = distgemm.schedule_definition(schedule)
    definition["tile"]["c"] += 1
    assert_both_fail(build_plan(definition, tp, steps, **shape(tp, steps)), "tile map c+1")


@pytest.mark.parametrize("schedule", ["ag_rotate_a", "ag_rotate_b", "gemm_allreduce"])
@pytest.mark.parametrize("tp,steps", CONFIGS, ids=[f"tp{t}-S{s}" for t, s in CONFIGS])
@pytest.mark.parametrize("which", [0, -1], ids=["first", "last"])
def test_drop_one_copy(schedule, tp, steps, which):
    plan = fresh(schedule, tp, steps)
    dev = next(d for d in plan["devices"] if d["copies"])
    dev["copies"].pop(which)
    assert_both_fail(plan, "a dropped copy")


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("tp,steps", CONFIGS, ids=[f"tp{t}-S{s}" for t, s in CONFIGS])
def test_swap_one_signal(schedule, tp, steps):
    # Device 0's first signalling op and device 1's swap targets: each now releases a consumer
    # whose data the other one produces.
    plan = fresh(schedule, tp, steps)

    def first_signalling(d):
        dev = plan["devices"][d]
        return next(op for op in dev["gemms"] + dev["copies"] if op["signals"])

    a, b = first_signalling(0), first_signalling(1)
    assert a["signals"][0] != b["signals"][0]
    a["signals"][0], b["signals"][0] = b["signals"][0], a["signals"][0]
    assert_both_fail(plan, "swapped signals")


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_drop_one_wait(schedule):
    plan = fresh(schedule, 2, 4)
    op = next(g for g in plan["devices"][0]["gemms"] + plan["devices"][0]["copies"] if g["waits"])
    op["waits"].clear()
    assert_both_fail(plan, "a dropped wait")


@pytest.mark.parametrize("schedule", ["rs_tile_a", "rs_tile_b"])
def test_misdirected_partial(schedule):
    plan = fresh(schedule, 3, 3)
    g = plan["devices"][0]["gemms"][0]
    g["d"] = dict(g["d"], device=1)  # the partial goes to the wrong neighbour's slot
    assert_both_fail(plan, "a misdirected partial")


def test_cyclic_wait_is_reported():
    plan = fresh("rs_tile_a", 2, 2)
    # Device 1's first GEMM now waits for a flag that device 0's second GEMM sets, and that GEMM
    # waits for the flag device 1's first GEMM sets: a cycle across devices.
    plan["devices"][1]["gemms"][0]["waits"] = [0]
    plan["devices"][0]["gemms"][0]["signals"] = []
    plan["devices"][0]["gemms"][1]["signals"] = [{"device": 1, "flag": 0}]
    violations = check_plan(plan)
    assert any(v.invariant == "progress" and "cyclic wait" in v.message for v in violations), (
        violations
    )
    with pytest.raises(ExecutionError, match="deadlock"):
        run_reference(plan)


def test_pull_copy_is_rejected():
    """A copy that reads a peer's memory (a pull) is refused: a peer read may run on the peer's
    copy engine, coupling the two devices' copy queues so that a wait can time out; plans push."""
    plan = fresh("ag_rotate_a", 2, 2)
    cp = plan["devices"][1]["copies"][0]  # device 1 pushes its rows into device 0's slot 0
    plan["devices"][1]["copies"].clear()
    # The same transfer issued by device 0 as a pull: it reads device 1's memory.
    pull = dict(cp, dst=dict(cp["dst"], device=0), signals=[])
    plan["devices"][0]["copies"].append(pull)
    plan["devices"][0]["gemms"][1]["waits"] = []
    messages = [v.message for v in check_plan(plan)]
    assert any("never pull" in m for m in messages), messages
