"""The library's defaults (cpp/include/distgemm/schedule/defaults.hpp) through distgemm._core:
default_steps against its rule in words on seeded random shapes, the partial-transport default a
plan gets, and every header of the schedule layer compiling alone on the host."""

import random
import shutil
import subprocess

import pytest
from ranks import CPU_TPS

from distgemm import _core

SCHEDULES = [d["name"] for d in _core.schedules()]


def rule_in_words(schedule, tp, m, n, k):
    """default_steps as the docs state it: TP, but 2*TP for a reduce-scatter plan from
    RS_TWO_STEPS_MIN_TOKENS tokens with at most RS_TWO_STEPS_MAX_K_PER_RANK of K per rank, where
    that S cuts the split mode into equal tiles (whole 8-column units along N) and the plan and
    the kernel's extent rule accept it."""
    d = _core.schedule_definition(schedule)
    if d["collective"] != "reduce_scatter" or tp < 2:
        return tp
    s = 2 * tp
    if m < _core.RS_TWO_STEPS_MIN_TOKENS or k // tp > _core.RS_TWO_STEPS_MAX_K_PER_RANK:
        return tp
    if (m if d["split"] == "M" else n) % s:
        return tp
    if d["split"] == "N" and (n // s) % 8:
        return tp
    if _core.validate(schedule, tp, s, m, n, k):
        return tp
    plan = _core.build_plan(schedule, tp, s, m, n, k).to_dict()
    for dev in plan["devices"]:
        for g in dev["gemms"]:
            if _core.gemm_extent_problem(g["m"], g["n"], g["k"], 1, 2):
                return tp
    return s


def test_the_constants_are_the_documented_ones():
    assert _core.RS_TWO_STEPS_MIN_TOKENS == 4096
    assert _core.RS_TWO_STEPS_MAX_K_PER_RANK == 8192


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_default_steps_follows_its_rule_on_random_shapes(schedule):
    rng = random.Random(sum(map(ord, schedule)))  # not hash(): PYTHONHASHSEED
    doubled = set()
    for _ in range(60):
        tp = rng.choice([1, *CPU_TPS])
        m = rng.choice([2048, 4094, 4096, 4100, 8192, 12288]) * rng.choice([1, 2])
        n = 8 * rng.randint(1, 64)
        k = tp * rng.choice([8, 16, 8184, 8192, 8200])
        got = _core.default_steps(schedule, tp, m, n, k)
        assert got == rule_in_words(schedule, tp, m, n, k), (schedule, tp, m, n, k)
        assert got in (tp, 2 * tp)
        doubled.add(got == 2 * tp and tp > 1)
    reduce_scatter = _core.schedule_definition(schedule)["collective"] == "reduce_scatter"
    assert doubled == ({True, False} if reduce_scatter else {False})  # both branches were hit


def test_a_definition_dict_gets_the_same_default_as_its_name():
    defn = _core.schedule_definition("rs_tile_a")
    assert _core.default_steps(defn, 2, 8192, 64, 128) == 4
    assert _core.default_steps("rs_tile_a", 2, 8192, 64, 128) == 4


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("tp", [1, *CPU_TPS])
def test_partials_travel_by_copy_engine_from_two_steps_per_rank(schedule, tp):
    for steps in (tp, 2 * tp):
        plan = _core.build_plan(schedule, tp, steps, 64 * tp * 2, 64 * tp * 2, 64 * tp)
        copy = _core.schedule_definition(schedule)["collective"] != "all_gather" and steps >= 2 * tp
        assert plan.partial_via == ("copy" if copy else "epilogue")
        assert _core.build_plan(
            schedule, tp, steps, 64 * tp * 2, 64 * tp * 2, 64 * tp, partial_via="epilogue"
        ).partial_via == ("epilogue")


@pytest.mark.parametrize("header", ["plan_types.hpp", "plan_builder.hpp", "defaults.hpp"])
def test_schedule_header_compiles_alone(tmp_path, repo_root, header):
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "a host C++ compiler (g++) is required"
    src = tmp_path / "one.cpp"
    src.write_text(f'#include "distgemm/schedule/{header}"\nint main() {{ return 0; }}\n')
    subprocess.run(
        [cxx, "-std=c++17", "-fsyntax-only", "-Wall", f"-I{repo_root / 'cpp/include'}", str(src)],
        check=True,
    )


@pytest.mark.parametrize("schedule", ["rs_tile_a", "rs_tile_b", "ar_tile_a"])
@pytest.mark.parametrize("tp,steps", [(tp, tp * k) for tp in CPU_TPS for k in (1, 2)])
def test_a_plans_layout_is_the_default_layout_for_its_options(schedule, tp, steps):
    """The op entry allocates Plan.layout() of the plan it built; the tools' workspace_layout
    resolves the same default options, and the slots hold the plan's slot elements."""
    m, n, k = 64 * steps, 16 * steps, 16 * tp
    plan = _core.build_plan(schedule, tp, steps, m, n, k)
    assert plan.partial_via == ("copy" if steps >= 2 * tp else "epilogue")
    args = (schedule, tp, steps, m, n, k, 1, 2)
    assert plan.layout(2) == _core.workspace_layout(*args)
    assert plan.layout(2) == _core.workspace_layout(*args, plan.partial_via)
    assert plan.layout(2)["slots_bytes"] >= plan.slot_elems * 2
