"""The plan property that makes a direct launch's enqueue safe when its host is held up mid-chain.

DeviceGraph::enqueue (cpp/src/runtime/graph.cu) puts each side-chain op (a GEMM's signals, a
copy with its signals) right after the GEMM it follows. A host held up while enqueueing GEMM k
(a lazy kernel load waits for its device to go idle) has then enqueued GEMMs 0..k-1 and the side
ops that follow them. Take the rank held up at the lowest k: its device's pending waits are those
of GEMMs 0..k, and if every flag that GEMM i waits for is signalled by a side op that follows a
GEMM j < i on its producer, every producer is enqueued on every rank, so those waits end, the
device goes idle and the load proceeds; by induction every rank does. This file checks that
property on every schedule's plans at TP 2, 3, 4 and 8, for S = TP and 2 TP and each partial
transport the schedule takes. Copies that wait for flags run after the last GEMM (side-chain
key S) and hold no GEMM back, so only GEMM waits are checked.
"""

import pytest

from distgemm import _core
from distgemm.plan.happens_before import flag_setters

SCHEDULES = [d["name"] for d in _core.schedules()]
TPS = (2, 3, 4, 8)


def side_key(copy: dict, steps: int) -> int:
    """schedule::side_chain_key: the GEMM a copy follows, or S for one that waits for flags."""
    return steps if copy["waits"] else copy["after_gemm"]


def producers(plan: dict) -> dict[tuple[int, int], int]:
    """(device, flag) -> the side-chain key of the op that signals it (a GEMM's signals follow
    that GEMM; a copy's, its key), from the plan's one setter of each flag."""
    steps = plan["steps"]
    return {
        flag: j if kind == "gemm" else side_key(plan["devices"][d]["copies"][j], steps)
        for flag, (kind, d, j) in flag_setters(plan).items()
    }


def plans(schedule: str, tp: int):
    """Every plan of ``schedule`` at ``tp`` for S = TP and 2 TP and each transport it takes."""
    m, n, k = 256 * tp * 2 * tp, 256 * tp, 128 * tp
    seen = set()
    for steps in (tp, 2 * tp):
        for via in ("copy", "epilogue"):
            try:
                plan = _core.build_plan(schedule, tp, steps, m, n, k, partial_via=via).to_dict()
            except ValueError:
                continue  # not a transport of this schedule (or S): the builder says so
            if (steps, plan["partial_via"]) not in seen:  # all-gathers have one transport
                seen.add((steps, plan["partial_via"]))
                yield plan


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_flag_a_gemm_waits_for_is_signalled_after_an_earlier_gemm(schedule, tp):
    built = 0
    for plan in plans(schedule, tp):
        built += 1
        made = producers(plan)
        for d, dev in enumerate(plan["devices"]):
            for i, g in enumerate(dev["gemms"]):
                for f in g["waits"]:
                    assert (d, f) in made, (schedule, tp, plan["steps"], d, i, f, "no producer")
                    assert made[(d, f)] < i, (
                        f"{schedule} TP={tp} S={plan['steps']} ({plan['partial_via']}): GEMM {i} "
                        f"of device {d} waits for flag {f}, signalled after GEMM {made[(d, f)]}"
                    )
    assert built >= 1, f"{schedule} at TP={tp}: no plan was built"


def test_a_plan_whose_gemm_waits_on_its_own_step_is_caught():
    """The check fails where a GEMM waits for a flag its producer signals after the same step."""
    plan = next(plans("rs_tile_a", 2))
    dev = plan["devices"][0]
    waiter = next(i for i, g in enumerate(dev["gemms"]) if g["waits"])
    made = producers(plan)
    flag = dev["gemms"][waiter]["waits"][0]
    assert made[(0, flag)] < waiter
    for other in plan["devices"]:
        for c in other["copies"]:
            if any((s["device"], s["flag"]) == (0, flag) for s in c["signals"]):
                c["after_gemm"] = waiter  # now it follows the waiting GEMM's own step
        for g in other["gemms"]:
            if any((s["device"], s["flag"]) == (0, flag) for s in g["signals"]):
                g["signals"] = []  # moved to a copy after that step
                other["copies"].append(
                    dict(after_gemm=waiter, waits=[], signals=[dict(device=0, flag=flag)])
                )
    assert producers(plan)[(0, flag)] >= waiter


def test_flag_setters_refuses_a_flag_set_twice():
    plan = next(plans("rs_tile_a", 2))
    setters = flag_setters(plan)
    (d, f), (kind, dev, j) = next(iter(setters.items()))
    ops = plan["devices"][dev]["gemms" if kind == "gemm" else "copies"]
    ops[j]["signals"].append(dict(device=d, flag=f))
    with pytest.raises(ValueError, match=f"sets flag {f} on device {d}, already set by"):
        flag_setters(plan)
