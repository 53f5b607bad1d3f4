"""Invariants of every schedule's plan over a grid of TP and S, and the simulate CLI."""

import json

import pytest
from ranks import CPU_TPS

import distgemm
from distgemm import build_plan, simulate, verify_plan

SCHEDULES = distgemm.schedule_names()
TPS = sorted({1, 5, *CPU_TPS})  # CPU_TPS, one rank, and a prime TP (5)
GRID = [(tp, tp * k) for tp in TPS for k in (1, 2, 4)]


def shape_for(tp, steps, l=1, scale=1):
    # Divisible by everything any schedule needs at this TP and S; every step along N gets one
    # whole 8-column unit (a tile below a unit exists only for extents of no whole units).
    return dict(m=steps * tp * 2 * scale, n=steps * tp * 8, k=tp * 8, l=l)


def test_all_five_schedules_registered():
    assert set(SCHEDULES) == {
        "ag_rotate_a",
        "ag_rotate_b",
        "rs_tile_a",
        "rs_tile_b",
        "ar_tile_a",
    }


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("tp,steps", GRID, ids=[f"tp{t}-S{s}" for t, s in GRID])
@pytest.mark.parametrize("l", [1, 2], ids=["L1", "L2"])
def test_invariants_hold(schedule, tp, steps, l):
    plan = build_plan(schedule, tp, steps, **shape_for(tp, steps, l))
    violations = verify_plan(plan)
    assert violations == [], "\n".join(map(str, violations))
    assert all(len(dev["gemms"]) == steps for dev in plan["devices"])


RING = ["rs_tile_a", "rs_tile_b", "ar_tile_a"]  # schedules with partials


@pytest.mark.parametrize("schedule", RING)
@pytest.mark.parametrize("tp,steps", GRID, ids=[f"tp{t}-S{s}" for t, s in GRID])
@pytest.mark.parametrize("l", [1, 2], ids=["L1", "L2"])
def test_invariants_hold_with_partials_by_copy_engine(schedule, tp, steps, l):
    plan = build_plan(schedule, tp, steps, partial_via="copy", **shape_for(tp, steps, l))
    assert plan["partial_via"] == "copy"
    violations = verify_plan(plan)
    assert violations == [], "\n".join(map(str, violations))


def test_partials_by_copy_engine_stage_locally_then_push_and_signal():
    tp, S = 4, 8
    shape = dict(m=64, n=16, k=32)
    by_epi = build_plan("rs_tile_a", tp, S, partial_via="epilogue", **shape)
    by_copy = build_plan("rs_tile_a", tp, S, partial_via="copy", **shape)
    k = S // tp
    slot = (64 // S) * 16  # one slot: a tile of D, [M/S][N]
    # Staging doubles the partial slots; the receive slots and flags stay where they were.
    assert by_copy["slot_elems"] == 2 * by_epi["slot_elems"] == 2 * (S - k) * slot
    assert by_copy["num_flags"] == by_epi["num_flags"] == S - k
    for d, (de, dc) in enumerate(zip(by_epi["devices"], by_copy["devices"])):
        assert de["copies"] == []
        assert len(dc["copies"]) == S - k
        for i, (ge, gc) in enumerate(zip(de["gemms"], dc["gemms"])):
            assert gc["partial"] == ge["partial"] and gc["waits"] == ge["waits"]
            if i >= S - k:  # final visits: unchanged
                assert gc == ge
                continue
            # The GEMM writes its own staging slot and signals nothing ...
            assert gc["d"] == {**ge["d"], "device": d, "offset": (S - k + i) * slot}
            assert gc["signals"] == []
            # ... and a copy after it pushes the slot to where the epilogue wrote, then signals.
            cp = dc["copies"][i]
            assert cp["after_gemm"] == i and cp["waits"] == []
            assert (
                cp["src"] == gc["d"]
                and cp["dst"] == ge["d"]
                and cp["dst"]["device"] == (d - 1) % tp
            )
            assert cp["signals"] == ge["signals"]
            assert (cp["rows"], cp["cols"]) == (64 // S, 16)
    assert distgemm.workspace_bytes(by_copy) > distgemm.workspace_bytes(by_epi)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("tp,steps", [(tp, tp * k) for tp in CPU_TPS for k in (1, 2)])
@pytest.mark.parametrize("via", ["epilogue", "copy"])
def test_copies_come_in_side_chain_order(schedule, tp, steps, via):
    """The graph runs each device's copies in one chain keyed by the GEMM each follows (-1 none,
    S for copies that wait for a flag; device/graph.hpp). The plan lists them in that order, so
    verify_plan, the simulator and the reference executor follow the order that runs."""
    plan = build_plan(schedule, tp, steps, partial_via=via, **shape_for(tp, steps))
    for dev in plan["devices"]:
        keys = [steps if c["waits"] else c["after_gemm"] for c in dev["copies"]]
        assert keys == sorted(keys)
    assert verify_plan(plan) == []


def test_partial_via_is_validated_and_ignored_by_all_gather():
    with pytest.raises(ValueError, match="partial_via='smem' is not one of 'epilogue', 'copy'"):
        build_plan("rs_tile_a", 2, 2, m=64, n=64, k=64, partial_via="smem")
    ag = build_plan("ag_rotate_a", 2, 2, m=64, n=64, k=64, partial_via="copy")
    assert ag["partial_via"] == "epilogue"
    assert ag == build_plan("ag_rotate_a", 2, 2, m=64, n=64, k=64)


def test_cli_partial_via_copy(capsys):
    rc, out, _ = run_cli(
        capsys,
        "--schedule",
        "rs_tile_a",
        "--tp",
        "2",
        "--steps",
        "4",
        "--partial-via",
        "copy",
        "--m",
        "64",
        "--n",
        "64",
        "--k",
        "64",
        "--timeline",
    )
    assert rc == 0, out
    assert "partials travel by the copy engine" in out and "all invariants hold" in out


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_invariants_at_llama_shape(schedule):
    """The checker works on region labels, not elements: a Llama-70B-sized plan checks quickly."""
    plan = build_plan(schedule, 8, 16, m=8192, n=57344, k=28672)
    assert verify_plan(plan) == []


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_tile_map_visits_every_tile_once(schedule):
    tm = distgemm.tile_map(schedule, 4, 8)
    for row in tm["tile"]:
        assert sorted(row) == list(range(8))
    for i in range(8):
        assert len({tm["tile"][d][i] for d in range(4)}) == 4


def test_ag_rotate_a_starts_on_own_rows_and_receives_pushes_from_owner():
    plan = build_plan("ag_rotate_a", 2, 2, m=64, n=64, k=32)
    d0, d1 = plan["devices"]
    assert d0["gemms"][0]["a"]["buffer"] == "A" and not d0["gemms"][0]["waits"]
    assert d0["gemms"][1]["a"]["buffer"] == "slots" and d0["gemms"][1]["waits"] == [0]
    # Device 1's copy engine pushes its rows into device 0's slot 0 and sets device 0's flag 0.
    (cp,) = d1["copies"]
    assert cp["src"]["buffer"] == "A" and cp["src"]["device"] == 1
    assert cp["dst"] == {
        "buffer": "slots",
        "device": 0,
        "offset": 0,
        "ld": 32,
        "batch_stride": 32 * 32,
    }
    assert cp["signals"] == [{"device": 0, "flag": 0}]


def test_rs_partial_goes_to_left_neighbour_and_final_lands_on_owner():
    plan = build_plan("rs_tile_a", 4, 4, m=64, n=16, k=32)
    for d, dev in enumerate(plan["devices"]):
        for g in dev["gemms"][:-1]:
            assert g["d"]["buffer"] == "slots" and g["d"]["device"] == (d - 1) % 4
        last = dev["gemms"][-1]
        assert last["d"]["buffer"] == "D" and last["d"]["device"] == d and last["tile"] == d
        assert last["user_c"] is not None and last["bias"] is not None


def test_workspace_bytes_reported():
    plan = build_plan("ag_rotate_a", 2, 2, m=8192, n=57344, k=8192)
    # One slot of half of A: 4096 x 8192 bf16 = 64 MiB, plus flags/barrier/epoch.
    assert 64 * 2**20 <= distgemm.workspace_bytes(plan, 2) < 64 * 2**20 + 4096


def run_cli(capsys, *argv):
    rc = simulate.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_ag_rotate_a_tp4_s8(capsys):
    rc, out, _ = run_cli(capsys, "--schedule", "ag_rotate_a", "--tp", "4", "--steps", "8")
    assert rc == 0
    assert "all invariants hold" in out
    rows = [ln for ln in out.splitlines() if "| GEMM" in ln or "| wait" in ln]
    assert len(rows) == 4 * 8  # one row per (step, device)
    assert "slot0@dev" in out  # pushes to peers are shown on the copy engine


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_cli_every_schedule_tp3_s6(capsys, schedule):
    rc, out, _ = run_cli(
        capsys,
        "--schedule",
        schedule,
        "--tp",
        "3",
        "--steps",
        "6",
        "--m",
        "6144",
        "--n",
        "6144",
        "--k",
        "6144",
    )
    assert rc == 0, out
    assert "all invariants hold" in out


def test_cli_json(capsys):
    rc, out, _ = run_cli(capsys, "--schedule", "rs_tile_b", "--tp", "2", "--steps", "4", "--json")
    data = json.loads(out)
    assert rc == 0 and data["ok"] and data["violations"] == []
    assert len(data["table"]) == 2 * 4
    assert data["plan"]["schedule"] == "rs_tile_b"


def test_cli_reports_violation_and_exits_1(capsys, monkeypatch):
    real = simulate.build_plan

    def broken(*a, **kw):
        plan = real(*a, **kw)
        plan["devices"][1]["copies"].pop(0)  # device 0 never receives device 1's rows
        return plan

    monkeypatch.setattr(simulate, "build_plan", broken)
    rc, out, _ = run_cli(
        capsys, "--schedule", "ag_rotate_a", "--tp", "2", "--m", "64", "--n", "64", "--k", "64"
    )
    assert rc == 1
    assert (
        "VIOLATION [progress] device 0, step 1: waits for flag 0 on device 0, which nothing sets"
        in out
    )


def test_cli_bad_input_exits_2(capsys):
    rc, _, err = run_cli(
        capsys, "--schedule", "ag_rotate_a", "--tp", "2", "--steps", "8", "--m", "8191"
    )
    assert rc == 2
    assert "M=8191 is not divisible by TP=2" in err


def test_timeline_prediction_bounds_and_finer_steps_shrink_the_allreduce_tail():
    from distgemm.plan.timeline import CostModel, predict

    cost = CostModel()
    times = {}
    for steps in (2, 4, 8):
        plan = build_plan("ar_tile_a", 2, steps, m=8192, n=8192, k=8192)
        pred = predict(plan, cost)
        assert pred["total_us"] >= pred["local_gemm_us"] > 0
        assert 0 < pred["overlap_efficiency"] <= 1
        # Every op starts after the entry barrier and after its stream predecessor ends.
        for (kind, d, j), s in pred["start"].items():
            assert s >= cost.barrier_us
            if j:
                assert s >= pred["end"][(kind, d, j - 1)]
        times[steps] = pred["total_us"]
    assert times[8] < times[4] < times[2]


def test_cli_timeline(capsys):
    rc, out, _ = run_cli(
        capsys, "--schedule", "ag_rotate_a", "--tp", "2", "--steps", "4", "--timeline"
    )
    assert rc == 0
    assert "dev1 CE |=" in out  # the copy engine starts pushing at once
    assert "overlap efficiency" in out


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_cli_default_shape_fits_tp3_s6(capsys, schedule):
    """Without shape arguments the Llama default is rounded so that TP=3, S=6 plans build."""
    rc, out, _ = run_cli(capsys, "--schedule", schedule, "--tp", "3", "--steps", "6")
    assert rc == 0, out
    assert "problem M=8190 N=57330 K=8190" in out and "all invariants hold" in out
    rc, out, _ = run_cli(capsys, "--schedule", schedule, "--tp", "4", "--steps", "8")
    assert rc == 0 and "problem M=8192 N=57344 K=8192" in out


def test_cli_marks_the_gemms_that_run_narrow_tiles(capsys):
    """The step table marks the sub-GEMMs the runtime's wave model gives 128x128 tiles: the
    512-row steps of 8B O at 1024 tokens (64 wide tiles for 132 SMs), none of 70B O's
    2048-row steps at 8192 tokens; fewer resident CTAs (--slots) change the verdict."""

    def marked(*argv):
        rc, out, _ = run_cli(capsys, "--schedule", "rs_tile_a", "--tp", "2", *argv)
        assert rc == 0, out
        rows = [ln for ln in out.splitlines() if "| GEMM" in ln or "| wait" in ln]
        return sum("[128x128]" in r for r in rows), len(rows)

    assert marked("--steps", "2", "--m", "1024", "--n", "4096", "--k", "4096") == (4, 4)
    assert marked("--steps", "4", "--m", "8192", "--n", "8192", "--k", "8192") == (0, 8)
    # 64 wide tiles fill 64 slots in one wave; 128 narrow ones then need two: no gain.
    assert marked("--steps", "2", "--m", "1024", "--n", "4096", "--k", "4096", "--slots", "64") == (
        0,
        4,
    )


def test_gemm_tile_follows_the_core_model():
    plan = distgemm.build_plan("ag_rotate_a", 2, 2, m=1024, n=6144, k=4096)
    for dev in plan["devices"]:
        for g in dev["gemms"]:
            want = distgemm._core.choose_tile_n(g["m"], g["n"], 1, 100, 100)["tile_n"]
            assert simulate.gemm_tile(g, 1, 100) == want


def test_cli_bad_slots_exits_2(capsys):
    rc, _, err = run_cli(capsys, "--schedule", "rs_tile_a", "--tp", "2", "--slots", "0")
    assert rc == 2 and "--slots=0 must be at least 1" in err
