"""The checks can fail: corrupt a scheduler coefficient, drop a copy, swap a signal, misdirect a
partial — the invariant checker AND the reference executor must both reject each mutant."""

import pytest
from ranks import CPU_TPS

import distgemm
from distgemm import ExecutionError, build_plan, run_reference, verify_plan

SCHEDULES = distgemm.schedule_names()
CONFIGS = [(tp, 2 * tp if tp in (3, 4) else tp) for tp in CPU_TPS]  # S = 2 TP at 3 and 4


def shape(tp, steps):
    return dict(m=steps * tp * 4, n=steps * tp * 2, k=tp * 8, l=2)


def assert_both_fail(plan, what):
    violations = verify_plan(plan)
    assert violations, f"checker accepted a plan with {what}"
    try:
        err = run_reference(plan, alpha=1.0, beta=0.5, use_bias=True, seed=11)
    except ExecutionError:
        return
    assert not err < 1e-6, f"reference executor matched the full GEMM (error {err}) despite {what}"


def fresh(schedule, tp, steps):
    plan = build_plan(schedule, tp, steps, **shape(tp, steps))
    assert verify_plan(plan) == [] and run_reference(plan, beta=0.5, use_bias=True) < 1e-9
    return plan


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("tp,steps", CONFIGS, ids=[f"tp{t}-S{s}" for t, s in CONFIGS])
def test_corrupt_iteration_coefficient(schedule, tp, steps):
    # b = 0: every iteration computes the same tile (a device never sees the rest).
    definition = distgemm.schedule_definition(schedule)
    definition["tile"]["b"] = 0
    assert_both_fail(build_plan(definition, tp, steps, **shape(tp, steps)), "tile map b=0")


@pytest.mark.parametrize("schedule", ["rs_tile_a", "rs_tile_b", "ar_tile_a"])
@pytest.mark.parametrize("tp,steps", CONFIGS, ids=[f"tp{t}-S{s}" for t, s in CONFIGS])
def test_corrupt_constant_coefficient(schedule, tp, steps):
    # c + 1: the ring still closes but the last partial lands on the wrong device.
    definition = distgemm.schedule_definition(schedule)
    definition["tile"]["c"] += 1
    assert_both_fail(build_plan(definition, tp, steps, **shape(tp, steps)), "tile map c+1")


@pytest.mark.parametrize("schedule", ["ag_rotate_a", "ag_rotate_b", "ar_tile_a"])
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
    violations = verify_plan(plan)
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
    messages = [v.message for v in verify_plan(plan)]
    assert any("never pull" in m for m in messages), messages


# Plans with uneven and empty tiles (S does not divide the split mode; shards with fewer rows or
# 8-column units than chunks): the same mutations must be caught there, and so must an empty
# tile's GEMM left in the plan.
UNEVEN = [
    ("ar_tile_a", 2, 2, dict(m=1, n=16, k=16)),
    ("ar_tile_a", 4, 8, dict(m=5, n=16, k=32, l=2)),
    ("rs_tile_a", 4, 8, dict(m=4, n=16, k=32)),
    ("rs_tile_b", 2, 6, dict(m=3, n=16, k=16, l=2)),
    ("ag_rotate_a", 2, 4, dict(m=2, n=16, k=16)),
    ("ag_rotate_b", 4, 12, dict(m=4, n=64, k=16)),
    ("ag_rotate_b", 3, 6, dict(m=3, n=24, k=24)),
    ("rs_tile_a", 6, 12, dict(m=6, n=16, k=48)),
    ("ar_tile_a", 8, 16, dict(m=5, n=16, k=64, l=2)),
]
UNEVEN_IDS = [f"{s}-tp{t}-S{st}-{'x'.join(map(str, sh.values()))}" for s, t, st, sh in UNEVEN]


def fresh_uneven(schedule, tp, steps, shape):
    plan = build_plan(schedule, tp, steps, **shape)
    assert any(len(d["gemms"]) < steps for d in plan["devices"]), "no empty tile in this case"
    assert verify_plan(plan) == [] and run_reference(plan, beta=0.5, use_bias=True) < 1e-9
    return plan


def flags_set_on(plan, device):
    return {
        s["flag"]
        for dev in plan["devices"]
        for op in dev["gemms"] + dev["copies"]
        for s in op["signals"]
        if s["device"] == device
    }


@pytest.mark.parametrize("schedule,tp,steps,shape", UNEVEN, ids=UNEVEN_IDS)
def test_uneven_empty_gemm_waiting_for_a_flag_nobody_sets(schedule, tp, steps, shape):
    """An empty tile's GEMM left in, waiting as it would for a full tile: its flag is never set
    (nobody sends an empty tile), so the device would time out."""
    plan = fresh_uneven(schedule, tp, steps, shape)
    dev = next(d for d in plan["devices"] if len(d["gemms"]) < steps)
    d = plan["devices"].index(dev)
    missing = min(set(range(steps)) - {g["iteration"] for g in dev["gemms"]})
    unset = sorted(set(range(plan["num_flags"])) - flags_set_on(plan, d))
    assert unset, "every flag of the device is set"
    key = "m" if plan["definition"]["split"] == "M" else "n"
    empty = dict(dev["gemms"][0], iteration=missing, waits=[unset[0]], signals=[], **{key: 0})
    at = sum(g["iteration"] < missing for g in dev["gemms"])
    dev["gemms"].insert(at, empty)
    for cp in dev["copies"]:  # copies keep following the same GEMMs
        if cp["after_gemm"] >= at:
            cp["after_gemm"] += 1
    invariants = {v.invariant for v in verify_plan(plan)}
    assert {"progress", "extents"} <= invariants, invariants
    with pytest.raises(ExecutionError, match="deadlock"):
        run_reference(plan, beta=0.5, use_bias=True)


@pytest.mark.parametrize("schedule,tp,steps,shape", UNEVEN, ids=UNEVEN_IDS)
def test_uneven_empty_gemm_without_waits_is_an_extent_violation(schedule, tp, steps, shape):
    """An empty GEMM that waits for nothing computes nothing, but the kernel refuses a GEMM of
    zero extent: the checker names it."""
    plan = fresh_uneven(schedule, tp, steps, shape)
    dev = next(d for d in plan["devices"] if len(d["gemms"]) < steps)
    key = "m" if plan["definition"]["split"] == "M" else "n"
    dev["gemms"].append(dict(dev["gemms"][-1], waits=[], signals=[], **{key: 0}))
    violations = verify_plan(plan)
    assert [v.invariant for v in violations] == ["extents"], violations


@pytest.mark.parametrize("schedule,tp,steps,shape", UNEVEN, ids=UNEVEN_IDS)
def test_uneven_drop_one_wait(schedule, tp, steps, shape):
    plan = fresh_uneven(schedule, tp, steps, shape)
    op = next(op for dev in plan["devices"] for op in dev["gemms"] + dev["copies"] if op["waits"])
    op["waits"].clear()
    assert_both_fail(plan, "a dropped wait in an uneven plan")


@pytest.mark.parametrize("schedule,tp,steps,shape", UNEVEN, ids=UNEVEN_IDS)
def test_uneven_drop_one_signal(schedule, tp, steps, shape):
    plan = fresh_uneven(schedule, tp, steps, shape)
    op = next(op for dev in plan["devices"] for op in dev["gemms"] + dev["copies"] if op["signals"])
    op["signals"].pop(0)
    assert_both_fail(plan, "a dropped signal in an uneven plan")


@pytest.mark.parametrize("schedule,tp,steps,shape", UNEVEN, ids=UNEVEN_IDS)
def test_uneven_swap_signals_of_two_devices(schedule, tp, steps, shape):
    plan = fresh_uneven(schedule, tp, steps, shape)
    signalling = [
        next(op for op in dev["gemms"] + dev["copies"] if op["signals"])
        for dev in plan["devices"]
        if any(op["signals"] for op in dev["gemms"] + dev["copies"])
    ]
    a, b = signalling[0], signalling[1]
    assert a["signals"][0] != b["signals"][0]
    a["signals"][0], b["signals"][0] = b["signals"][0], a["signals"][0]
    assert_both_fail(plan, "swapped signals in an uneven plan")


@pytest.mark.parametrize("schedule,tp,steps,shape", UNEVEN, ids=UNEVEN_IDS)
def test_uneven_drop_one_copy(schedule, tp, steps, shape):
    plan = fresh_uneven(schedule, tp, steps, shape)
    dev = next(d for d in plan["devices"] if d["copies"])
    dev["copies"].pop(0)
    assert_both_fail(plan, "a dropped copy in an uneven plan")
