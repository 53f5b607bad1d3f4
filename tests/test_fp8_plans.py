"""FP8 row-wise scales in plans: every schedule, TP 1..8, S = TP and 2*TP, even and uneven tiles,
row scales of A, B, both or neither, run by the reference executor (e4m3 values, float32 scales)
against the dequantized full GEMM under every policy and proved by the checker; mutants that lose,
misplace or misroute scales are caught; plans without row scales are today's; the scale slots
sit between the data slots and the shared control region."""

import random
import zlib

import numpy as np
import pytest
from ranks import CPU_TPS

import distgemm
from distgemm import ExecutionError, _core, build_plan, clone_plan, run_reference, verify_plan
from distgemm.plan.reference import POLICIES, execute_plan, expected_outputs, reference_inputs
from distgemm.runtime.workspace import WorkspacePool, control_bytes
from distgemm.simulate import step_table, tile_sizes

SCHEDULES = distgemm.schedule_names()
ALL_GATHER = ["ag_rotate_a", "ag_rotate_b"]
SCALINGS = {"none": (False, False), "A": (True, False), "B": (False, True), "AB": (True, True)}
TOL = 1e-12
SPLIT_UNIT_N = 8  # kSplitUnitN: tiles along N are whole multiples of 8 columns


def case_seed(*parts) -> int:
    return zlib.crc32("-".join(map(str, parts)).encode())


def shape(schedule, tp, steps, uneven):
    """A problem every schedule builds at TP and S: even tiles, or the split mode cut unevenly
    (a remainder of rows, or of columns below a unit)."""
    kc = steps // tp
    if distgemm.schedule_definition(schedule)["split"] == "M":
        m, n = tp * (3 * kc + 1 if uneven else 2 * kc), 8 * tp
    else:
        m, n = 4 * tp, tp * (SPLIT_UNIT_N * (2 * kc + 1) + 3 if uneven else SPLIT_UNIT_N * kc)
    return dict(m=m, n=n, k=8 * tp)


def cases():
    out = []
    for schedule in SCHEDULES:
        for tp in range(1, 9):
            for steps in (tp, 2 * tp):
                for uneven in (False, True):
                    sizes = tile_sizes(
                        build_plan(schedule, tp, steps, **shape(schedule, tp, steps, uneven))
                    )
                    if uneven and len(set(sizes)) == 1:
                        continue  # S = TP tiles a sharded mode by its shards: never uneven
                    out.append((schedule, tp, steps, uneven))
    return out


CASES = cases()


def case_id(c):
    schedule, tp, steps, uneven = c
    return f"{schedule}-tp{tp}-S{steps}-{'uneven' if uneven else 'even'}"


def test_the_grid_has_uneven_cases_of_every_schedule():
    for schedule in SCHEDULES:
        assert any(c[0] == schedule and c[3] for c in CASES), schedule


@pytest.mark.parametrize("scaling", list(SCALINGS))
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_fp8_plan_matches_the_dequantized_gemm(case, scaling):
    schedule, tp, steps, uneven = case
    sa, sb = SCALINGS[scaling]
    rng = random.Random(case_seed(*case, scaling))
    plan = build_plan(
        schedule, tp, steps, row_scale_a=sa, row_scale_b=sb, **shape(schedule, tp, steps, uneven)
    )
    if uneven:
        assert len(set(tile_sizes(plan))) > 1
    violations = verify_plan(plan)
    assert violations == [], "\n".join(map(str, violations))
    alpha, beta = rng.choice([1.0, -0.75]), rng.choice([0.0, 0.5])
    use_bias = rng.random() < 0.5
    err = run_reference(
        plan,
        alpha=alpha,
        beta=beta,
        use_bias=use_bias,
        seed=rng.randint(0, 10**6),
        fp8=True,
        policies=POLICIES,
    )
    assert err < TOL, f"relative Frobenius error {err}"


@pytest.mark.parametrize("schedule", ["rs_tile_a", "rs_tile_b", "ar_tile_a"])
@pytest.mark.parametrize("scaling", ["A", "B", "AB"])
def test_fp8_with_partials_by_copy_engine(schedule, scaling):
    sa, sb = SCALINGS[scaling]
    plan = build_plan(
        schedule,
        4,
        8,
        partial_via="copy",
        row_scale_a=sa,
        row_scale_b=sb,
        **shape(schedule, 4, 8, True),
    )
    assert verify_plan(plan) == []
    assert run_reference(plan, fp8=True, seed=5) < TOL


# -- what the executor's inputs and GEMMs do ----------------------------------------------------


def test_fp8_inputs_are_e4m3_values_with_positive_float32_scales():
    torch = pytest.importorskip("torch")
    plan = build_plan("ag_rotate_a", 2, 4, m=16, n=8, k=32, row_scale_a=True)
    x = reference_inputs(plan, seed=3, fp8=True)
    for name in ("A", "B"):
        as_e4m3 = torch.from_numpy(x[name]).to(torch.float8_e4m3fn).to(torch.float64).numpy()
        np.testing.assert_array_equal(x[name], as_e4m3)
        assert np.count_nonzero(x[name]) > 0.9 * x[name].size
    assert x["scale_a"].shape == (16,) and x["scale_b"].shape == ()  # row-wise A, tensor-wise B
    for s in (x["scale_a"], x["scale_b"]):
        assert np.all(s > 0) and np.all(s.astype(np.float32).astype(np.float64) == s)
    assert len(np.unique(x["scale_a"])) == 16  # distinct rows: a misplaced scale shows
    # Seeded: the same seed gives the same inputs, another seed others.
    y = reference_inputs(plan, seed=3, fp8=True)
    assert all(np.array_equal(x[n], y[n]) for n in x)
    assert not np.array_equal(x["A"], reference_inputs(plan, seed=4, fp8=True)["A"])


def test_the_full_gemm_dequantizes_before_multiplying():
    plan = build_plan("rs_tile_a", 2, 2, m=4, n=6, k=8, row_scale_a=True, row_scale_b=True)
    x = reference_inputs(plan, seed=1, fp8=True)
    want = (x["scale_a"][:, None] * x["A"][0]) @ (x["scale_b"][:, None] * x["B"][0]).T
    got = expected_outputs(plan, x, 1.0, 0.0, False)
    np.testing.assert_allclose(np.concatenate([d[0] for d in got], axis=0), want, rtol=1e-15)
    # Ignoring the scales is far off: they matter.
    plain = x["A"][0] @ x["B"][0].T
    assert np.linalg.norm(plain - want) > 0.1 * np.linalg.norm(want)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_tensor_wise_fp8_needs_nothing_from_the_plan(schedule):
    plan = build_plan(schedule, 2, 4, **shape(schedule, 2, 4, False))
    assert plan["scale_slot_rows"] == 0
    assert run_reference(plan, fp8=True, seed=9) < TOL


def test_a_row_scaled_plan_refuses_inputs_without_row_scales():
    plan = build_plan("ag_rotate_b", 2, 2, m=8, n=16, k=8, row_scale_b=True)
    with pytest.raises(ExecutionError, match="row-scales B but the inputs carry no scale_b"):
        execute_plan(plan, reference_inputs(plan))
    tensor_wise = reference_inputs(build_plan("ag_rotate_b", 2, 2, m=8, n=16, k=8), fp8=True)
    with pytest.raises(ExecutionError, match="inputs carry a tensor-wise scale_b"):
        execute_plan(plan, tensor_wise)


# -- the contract's fields ----------------------------------------------------------------------


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("tp,steps", [(1, 2)] + [(tp, 2 * tp) for tp in CPU_TPS])
def test_plans_without_row_scales_are_todays(schedule, tp, steps):
    plan = _core.build_plan(schedule, tp, steps, 24 * steps, 48 * steps, 16 * tp, 2)
    d = plan.to_dict()
    assert (d["row_scale_a"], d["row_scale_b"], d["scale_slot_rows"]) == (False, False, 0)
    assert all(
        g["scale_a"] is None and g["scale_b"] is None for dev in d["devices"] for g in dev["gemms"]
    )
    assert all(
        c["scale_src"] is None and c["scale_dst"] is None
        for dev in d["devices"]
        for c in dev["copies"]
    )
    layout = plan.layout(2)
    assert (
        layout["scale_slots_offset"] == layout["slots_bytes"] and layout["scale_slots_bytes"] == 0
    )
    assert layout["total_bytes"] == layout["slots_bytes"] + control_bytes()
    assert "row_scale" not in repr(plan)


def _strip_scales(plan):
    out = clone_plan(plan)
    for key in ("row_scale_a", "row_scale_b", "scale_slot_rows"):
        out.pop(key)
    for dev in out["devices"]:
        for g in dev["gemms"]:
            g.pop("scale_a"), g.pop("scale_b")
        for c in dev["copies"]:
            c.pop("scale_src"), c.pop("scale_dst")
    return out


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("scaling", ["A", "B", "AB"])
def test_row_scales_add_references_and_scale_slots_only(schedule, scaling):
    sa, sb = SCALINGS[scaling]
    kw = shape(schedule, 3, 6, True)
    plain = build_plan(schedule, 3, 6, **kw)
    scaled = build_plan(schedule, 3, 6, row_scale_a=sa, row_scale_b=sb, **kw)
    assert _strip_scales(scaled) == _strip_scales(plain)
    rotating = distgemm.schedule_definition(schedule)["rotating"]
    rot_scaled = schedule in ALL_GATHER and (sa if rotating == "A" else sb)
    tiles = max(tile_sizes(plain))
    assert scaled["scale_slot_rows"] == (4 * tiles if rot_scaled else 0)  # S - S/TP slots
    for dev in scaled["devices"]:
        for c in dev["copies"]:
            assert (c["scale_src"] is not None) == (c["scale_dst"] is not None) == rot_scaled
        for g in dev["gemms"]:
            for key, on in (("scale_a", sa), ("scale_b", sb)):
                ref = g[key]
                assert (ref is not None) == on
                if on:
                    assert ref["ld"] == 1 and ref["batch_stride"] == 0
                    assert ref["buffer"] in (
                        "scale_slots",
                        "scale_a" if key == "scale_a" else "scale_b",
                    )


@pytest.mark.parametrize("schedule", ALL_GATHER)
def test_scale_slots_sit_between_the_slots_and_the_control_region(schedule):
    kw = dict(m=48, n=96, k=64)
    rot_a = schedule == "ag_rotate_a"
    plan = _core.build_plan(schedule, 4, 8, kw["m"], kw["n"], kw["k"], 1, None, rot_a, not rot_a)
    assert (plan.row_scale_a, plan.row_scale_b) == (rot_a, not rot_a)
    rows = plan.scale_slot_rows
    assert rows == 6 * max(tile_sizes(plan.to_dict()))  # S - S/TP slots of the longest tile
    layout = plan.layout(1)
    align = _core.WORKSPACE_SLOT_ALIGN
    assert layout["scale_slots_offset"] == layout["slots_bytes"]
    assert layout["scale_slots_bytes"] == -(-rows * 4 // align) * align
    assert layout["flags_offset"] == layout["scale_slots_offset"] + layout["scale_slots_bytes"]
    assert layout["total_bytes"] == layout["flags_offset"] + control_bytes()
    via_core = _core.workspace_layout(
        schedule, 4, 8, kw["m"], kw["n"], kw["k"], 1, 1, None, rot_a, not rot_a
    )
    assert via_core == layout
    assert distgemm.workspace_bytes(plan.to_dict(), 1) == layout["total_bytes"]


def test_row_scaled_plans_share_one_workspace_with_the_others():
    """The pool places slots + scale slots before the one control region: every plan's control
    region lands on the workspace's, and its scale slots stay inside the workspace's slot bytes."""
    bases0 = [1 << 32, 1 << 33]
    pool = WorkspacePool(
        lambda nbytes: (object(), list(bases0)),
        lambda ws: None,
        lambda workspaces: None,
        control=control_bytes(),
        align=_core.WORKSPACE_SLOT_ALIGN,
    )
    layouts = []
    for schedule in SCHEDULES:
        for sa, sb in SCALINGS.values():
            for m in (64, 256):
                plan = _core.build_plan(schedule, 2, 4, m, 128, 64, 1, None, sa, sb)
                layouts.append(plan.layout(1))
    assert any(lay["scale_slots_bytes"] for lay in layouts)
    for layout in sorted(layouts, key=lambda x: x["flags_offset"]) + layouts:
        ws, bases = pool.place(layout)
        for base, ws_base in zip(bases, ws.bases):
            assert base + layout["flags_offset"] == ws_base + ws.slot_capacity
            assert ws_base <= base + layout["scale_slots_offset"]
            end = base + layout["scale_slots_offset"] + layout["scale_slots_bytes"]
            assert end == ws_base + ws.slot_capacity


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_row_scales_need_one_batch(schedule):
    with pytest.raises(ValueError, match="row-wise scales \\(of A and B\\) need L=1, got L=3"):
        build_plan(schedule, 2, 2, m=8, n=16, k=8, l=3, row_scale_a=True, row_scale_b=True)
    assert "need L=1, got L=2" in _core.validate(schedule, 2, 2, 8, 16, 8, 2, False, True)
    assert _core.validate(schedule, 2, 2, 8, 16, 8, 2) == ""


def test_the_step_table_shows_scales_with_their_rows():
    plan = build_plan("ag_rotate_a", 2, 2, m=16, n=16, k=16, row_scale_a=True, row_scale_b=True)
    rows = step_table(plan)
    copies = [r["copy"] for r in rows if r["copy"]]
    assert copies and all(c.endswith("+ row scales, set f0@" + c[-1]) for c in copies)
    first = next(r["compute"] for r in rows if r["step"] == 1 and r["device"] == 0)
    assert "A=slot0 sA=scale_slots[0:8] sB=scale_b[0:8]" in first
    plain = step_table(build_plan("ag_rotate_a", 2, 2, m=16, n=16, k=16))
    assert not any("scale" in r["compute"] + r["copy"] for r in plain)


# -- mutants ------------------------------------------------------------------------------------


def assert_caught(plan, what):
    violations = verify_plan(plan)
    assert violations, f"checker accepted a plan with {what}"
    try:
        err = run_reference(plan, fp8=True, seed=13)
    except ExecutionError:
        return violations
    assert not err < 1e-6, f"reference matched the dequantized GEMM (error {err}) despite {what}"
    return violations


MUTANT_TPS = [(tp, 2 * tp if tp in (3, 4) else tp) for tp in CPU_TPS]  # S = 2 TP at 3 and 4
MUTANT_CASES = [(s, tp, steps) for s in SCHEDULES for tp, steps in MUTANT_TPS]


def scaled_plan(schedule, tp, steps):
    plan = build_plan(
        schedule, tp, steps, row_scale_a=True, row_scale_b=True, **shape(schedule, tp, steps, True)
    )
    assert verify_plan(plan) == [] and run_reference(plan, fp8=True) < TOL
    return plan


def scale_copies(plan):
    return [c for dev in plan["devices"] for c in dev["copies"] if c["scale_src"] is not None]


@pytest.mark.parametrize("schedule", ALL_GATHER)
@pytest.mark.parametrize("tp,steps", MUTANT_TPS)
@pytest.mark.parametrize("which", [0, -1], ids=["first", "last"])
def test_a_dropped_scale_copy_is_caught(schedule, tp, steps, which):
    plan = scaled_plan(schedule, tp, steps)
    cp = scale_copies(plan)[which]
    cp["scale_src"] = cp["scale_dst"] = None
    violations = assert_caught(plan, "a dropped scale copy")
    assert any("without their scales" in v.message for v in violations)
    inputs = reference_inputs(plan, seed=2, fp8=True)
    assert any(np.isnan(d).any() for d in execute_plan(plan, inputs))  # the scale slot stays NaN


@pytest.mark.parametrize("schedule", ALL_GATHER)
def test_a_scale_copy_of_other_rows_is_caught(schedule):
    plan = scaled_plan(schedule, 4, 8)
    cp = scale_copies(plan)[1]
    cp["scale_src"]["offset"] += 1 if cp["scale_src"]["offset"] == 0 else -1
    violations = assert_caught(plan, "scales of other rows copied")
    assert any("with the scales of" in v.message for v in violations)


@pytest.mark.parametrize("schedule", ALL_GATHER)
def test_a_scale_copy_into_another_slot_is_caught(schedule):
    """Two copies into one scale slot: the second overwrites scales a GEMM still needs, and
    the other slot's GEMM reads nothing."""
    plan = scaled_plan(schedule, 3, 6)
    dev = next(d for d in plan["devices"] if len(d["copies"]) >= 2)
    a, b = dev["copies"][0], dev["copies"][1]
    b["scale_dst"] = dict(a["scale_dst"])
    assert_caught(plan, "two scale copies into one slot")


@pytest.mark.parametrize("operand", ["a", "b"])
@pytest.mark.parametrize(
    "schedule,tp,steps", MUTANT_CASES, ids=[f"{s}-tp{t}-S{n}" for s, t, n in MUTANT_CASES]
)
def test_a_gemm_reading_another_rows_scales_is_caught(schedule, tp, steps, operand):
    plan = scaled_plan(schedule, tp, steps)
    dev = plan["devices"][tp - 1]
    g = dev["gemms"][len(dev["gemms"]) // 2]
    ref = g["scale_" + operand]
    ref["offset"] += 1 if ref["offset"] == 0 else -1
    violations = assert_caught(plan, f"a GEMM reading other rows' scale_{operand}")
    assert any(
        "GEMM needs the scales of" in v.message
        or "out of bounds" in v.message
        or "not one written region" in v.message
        or "nothing has written" in v.message
        for v in violations
    ), "\n".join(map(str, violations))


@pytest.mark.parametrize("operand", ["a", "b"])
@pytest.mark.parametrize(
    "schedule,tp,steps", MUTANT_CASES, ids=[f"{s}-tp{t}-S{n}" for s, t, n in MUTANT_CASES]
)
def test_a_gemm_that_forgets_its_scales_is_caught(schedule, tp, steps, operand):
    plan = scaled_plan(schedule, tp, steps)
    plan["devices"][0]["gemms"][-1]["scale_" + operand] = None
    violations = assert_caught(plan, f"a GEMM without scale_{operand}")
    assert any(f"reads no row scales (scale_{operand} is None)" in v.message for v in violations)


@pytest.mark.parametrize("schedule", ALL_GATHER)
def test_a_gemm_reading_its_scale_slot_before_the_copy_is_caught(schedule):
    """Without its wait the GEMM may read the scale slot before the copy arrives: the checker
    says so, and the executor, running GEMMs first, reads NaN."""
    plan = scaled_plan(schedule, 2, 4)
    g = next(g for g in plan["devices"][0]["gemms"] if g["waits"])
    g["waits"] = []
    violations = verify_plan(plan)
    assert any("without waiting for its signal" in v.message for v in violations)
    inputs = reference_inputs(plan, seed=4, fp8=True)
    got = execute_plan(plan, inputs, policy="compute_first_low")
    assert np.isnan(got[0]).any()


def test_a_scale_ref_on_an_unscaled_operand_is_caught():
    plan = build_plan("rs_tile_a", 2, 2, m=8, n=16, k=8, row_scale_a=True)
    g = plan["devices"][1]["gemms"][0]
    g["scale_b"] = {**g["scale_a"], "buffer": "scale_b", "offset": 0}
    violations = verify_plan(plan)
    assert any("the plan does not row-scale B" in v.message for v in violations)


def test_a_scale_ref_to_a_peers_user_scales_is_caught():
    plan = build_plan("rs_tile_b", 2, 2, m=8, n=16, k=8, row_scale_b=True)
    plan["devices"][0]["gemms"][0]["scale_b"]["device"] = 1
    violations = verify_plan(plan)
    assert any("user's scale_b on device 1" in v.message for v in violations)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_cli_shows_and_checks_row_scales(capsys, schedule):
    from distgemm import simulate

    argv = ["--schedule", schedule, "--tp", "2", "--steps", "4", "--m", "64", "--n", "64"]
    rc = simulate.main([*argv, "--k", "64", "--row-scale-a", "--row-scale-b"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "FP8 row-wise scales of A and B (float32 per row)" in out
    assert "row scales (each GEMM reads its rows' scales, copies move them)" in out
    assert "sA=scale_" in out and "sB=scale_" in out
    assert ("+ row scales" in out) == (schedule in ALL_GATHER)
    rc = simulate.main([*argv, "--k", "64", "--l", "2", "--row-scale-b"])
    assert rc == 2
    assert "row-wise scales (of B) need L=1, got L=2" in capsys.readouterr().err
