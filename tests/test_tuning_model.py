"""The cost model under the shipped 2x H200 constants against the committed TP=2 Llama sweep
(benchmarks/results/2026-11-23-llama-sweep.csv, 60 cases, 2x H200): the model's path choice keeps
the public op within 2% of NCCL + torch.mm on every case, a wrong choice costs little, the
predictions are near the measured times, and the shipped constants are that sweep's fit."""

import math

import pytest
from ranks import CPU_TPS

from benchmarks.sweep import fit_path_model
from distgemm import _core
from distgemm.runtime import cost_model, machine

RULE = 1.02  # the public op within 2% of NCCL + torch.mm on every sweep case
H200 = machine.load(machine.SHIPPED_DIR / "nvidia-h200-tp2-nvlink18.json")
ROWS = fit_path_model.validation_rows(H200)


def test_the_sweep_has_every_case():
    assert len(ROWS) == 60
    models = {r["case"].split("/")[0] for r in ROWS}
    assert models == {"8B", "70B", "405B"}


def test_the_defaults_s_is_the_one_the_sweep_ran_and_the_model_leaves_it_only_for_a_gain():
    for r in ROWS:
        assert r["default_steps"] == r["sweep_steps"], r["case"]
        assert r["steps"] in (r["default_steps"], 2 * r["default_steps"], r["default_steps"] // 2)


@pytest.mark.parametrize("row", ROWS, ids=[r["case"] for r in ROWS])
def test_the_models_path_keeps_the_op_within_2_percent_of_nccl_plus_mm(row):
    assert row["vs_baseline"] <= RULE, (
        f"{row['case']}: the model picks {row['path']}, measured {row['overlap_ms']:.4f} ms "
        f"(overlap) vs {row['collective_ms']:.4f} ms (NCCL + torch.mm)"
    )


def test_a_wrong_choice_costs_little():
    assert max(r["cost"] for r in ROWS) <= 1.05
    # Where the overlapped plan is at least 5% faster, the model takes it.
    for r in ROWS:
        if r["overlap_ms"] < 0.95 * r["collective_ms"]:
            assert r["path"] == "overlap", r["case"]


def test_the_predictions_are_near_the_measured_times():
    ov = [r["predicted_overlap_ms"] / r["overlap_ms"] - 1 for r in ROWS]
    co = [r["predicted_collective_ms"] / r["collective_ms"] - 1 for r in ROWS]
    assert max(map(abs, ov)) < 0.08
    assert max(map(abs, co)) < 0.20  # small reduce-scatters: host-bound baselines
    assert math.sqrt(sum(e * e for e in ov) / len(ov)) < 0.03
    assert math.sqrt(sum(e * e for e in co) / len(co)) < 0.04


def test_the_shipped_constants_are_the_sweeps_fit():
    fitted = fit_path_model.fit()
    assert fitted.key == H200.key and fitted.slots == H200.slots
    assert fitted.choice_error == pytest.approx(H200.choice_error, rel=1e-9)
    for name in ("gemm_launch_ms", "mm_launch_ms", "mm_flops_per_ms", "copy_latency_ms"):
        assert getattr(fitted, name) == pytest.approx(getattr(H200, name), rel=1e-9), name
    for name in ("gemm_ms_per_k", "nccl", "overlap"):
        for part, values in getattr(fitted, name).items():
            assert values == pytest.approx(getattr(H200, name)[part], rel=1e-9), (name, part)


def test_the_model_covers_every_schedule_and_stays_positive():
    for schedule in ("ag_rotate_a", "ag_rotate_b", "rs_tile_a", "rs_tile_b", "ar_tile_a"):
        for tp, steps in [(tp, tp * k) for tp in CPU_TPS for k in (1, 2)]:
            plan = _core.build_plan(schedule, tp, steps, 6144, 6144, 6144)  # splits at each
            pred = cost_model.predict(H200.at_tp(tp), plan)
            assert 0 < pred["overlap_ms"] < 10 and 0 < pred["collective_ms"] < 10, schedule
    # More tokens cost more; a forced tile is priced with that tile.
    small = cost_model.predict(H200, _core.build_plan("ag_rotate_a", 2, 2, 4096, 8192, 8192))
    big = cost_model.predict(H200, _core.build_plan("ag_rotate_a", 2, 2, 8192, 8192, 8192))
    assert big["overlap_ms"] > small["overlap_ms"] and big["collective_ms"] > small["collective_ms"]
    plan = _core.build_plan("rs_tile_a", 2, 2, 1024, 4096, 14336)
    assert cost_model.predict(H200, plan, 128) != cost_model.predict(H200, plan, 256)


def test_an_exposed_transfer_is_charged_where_the_step_is_shorter_than_its_copy():
    # A tiny GEMM with a large gathered operand (K = 64 Ki): the copy outlasts the step.
    plan = _core.build_plan("ag_rotate_a", 2, 2, 8192, 256, 65536)
    rm, rn, rk = cost_model.rank_problem(plan.definition, 2, 8192, 256, 65536)
    step = cost_model.gemm_ms(H200, rm // 2, rn, rk)
    moved = cost_model.moved_bytes(plan.definition, 2, 8192, 256, 65536)
    chunk = cost_model.exposed_copy_ms(H200, moved, 2, 2)
    assert chunk > step
    gemms = cost_model.gemm_ms(H200, rm // 2, rn, rk, count=2, chained=True)
    per_step, share, per_byte = H200.overlap["all_gather"]
    want = gemms * (1 + share) + (chunk - step) + 2 * per_step + moved * per_byte
    assert cost_model.predict(H200, plan)["overlap_ms"] == pytest.approx(want)
