"""distgemm.runtime.cost_model against the committed TP=2 Llama sweep
(benchmarks/results/2026-11-23-llama-sweep.csv, 60 cases, 2x H200): the model's path choice keeps
the public op within 2% of NCCL + torch.mm on every case, a wrong choice costs at most 3%, the
predictions are near the measured times, its constants are those the sweep fits, and decode
sizes take the collective path."""

import math

import pytest
from ranks import CPU_TPS

from benchmarks.sweep import fit_path_model
from distgemm import _core, llama3
from distgemm.runtime import cost_model

RULE = 1.02  # the public op within 2% of NCCL + torch.mm on every sweep case
ROWS = fit_path_model.validation_rows()


def test_the_sweep_has_every_case():
    assert len(ROWS) == 60
    models = {r["case"].split("/")[0] for r in ROWS}
    assert models == {"8B", "70B", "405B"}


def test_the_model_sees_the_plans_the_sweep_ran_at_the_default_s():
    for r in ROWS:
        assert r["steps"] == r["sweep_steps"], r["case"]


@pytest.mark.parametrize("row", ROWS, ids=[r["case"] for r in ROWS])
def test_the_models_path_keeps_the_op_within_2_percent_of_nccl_plus_mm(row):
    assert row["vs_baseline"] <= RULE, (
        f"{row['case']}: the model picks {row['path']}, measured {row['overlap_ms']:.4f} ms "
        f"(overlap) vs {row['collective_ms']:.4f} ms (NCCL + torch.mm)"
    )


def test_a_wrong_choice_costs_little_and_is_rare():
    wrong = [r for r in ROWS if r["path"] != r["faster"]]
    assert max(r["cost"] for r in ROWS) <= 1.03
    assert len(wrong) <= 5, [r["case"] for r in wrong]
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


def test_the_constants_are_the_sweeps_fit_rounded_to_three_digits():
    fitted, _ = fit_path_model.fit()
    for name, value in fitted.items():
        mine = getattr(cost_model, name)
        if isinstance(value, dict):
            assert set(mine) == set(value), name
            for key, numbers in value.items():
                for got, want in zip(mine[key], numbers, strict=True):
                    assert got == pytest.approx(want, rel=6e-3, abs=1e-12), (name, key)
        else:
            assert mine == pytest.approx(value, rel=6e-3), name
    assert cost_model.GEMM_LAUNCH_MS == 7.91e-3  # fit() leaves the module's constants alone


@pytest.mark.parametrize("tp", [2, 4, 8])  # the TPs that split Llama's 8 KV heads
def test_decode_sizes_take_the_collective_path(tp):
    schedules = {"all_gather": "ag_rotate_a", "reduce_scatter": "rs_tile_a"}
    seen = 0
    for model in llama3.models():
        for layer, d in llama3.layers().items():
            for tokens in (tp, 8, 16, 64, 128, 256, 512):
                if tokens % tp or llama3.tp_split_reason(model, layer, tokens, tp):
                    continue
                m, n, k = llama3.gemm(model, layer, tokens)
                plan = _core.default_plan(schedules[d["collective"]], tp, m, n, k)
                assert cost_model.choose(plan)[0] == "collective", (model, layer, tokens)
                seen += 1
    assert seen >= 60


def test_the_model_covers_every_schedule_and_stays_positive():
    for schedule in ("ag_rotate_a", "ag_rotate_b", "rs_tile_a", "rs_tile_b", "ar_tile_a"):
        for tp, steps in [(tp, tp * k) for tp in CPU_TPS for k in (1, 2)]:
            plan = _core.build_plan(schedule, tp, steps, 6144, 6144, 6144)  # splits at each
            pred = cost_model.predict(plan)
            assert 0 < pred["overlap_ms"] < 10 and 0 < pred["collective_ms"] < 10, schedule
    # More tokens cost more; a forced tile is priced with that tile.
    small = cost_model.predict(_core.build_plan("ag_rotate_a", 2, 2, 4096, 8192, 8192))
    big = cost_model.predict(_core.build_plan("ag_rotate_a", 2, 2, 8192, 8192, 8192))
    assert big["overlap_ms"] > small["overlap_ms"] and big["collective_ms"] > small["collective_ms"]
    plan = _core.build_plan("rs_tile_a", 2, 2, 1024, 4096, 14336)
    assert cost_model.predict(plan, 128) != cost_model.predict(plan, 256)


def test_an_exposed_transfer_is_charged_where_the_step_is_shorter_than_its_copy():
    # A tiny GEMM with a large gathered operand (K = 64 Ki): the copy outlasts the step.
    plan = _core.build_plan("ag_rotate_a", 2, 2, 8192, 256, 65536)
    rm, rn, rk = cost_model.rank_problem(plan.definition, 2, 8192, 256, 65536)
    step = cost_model.gemm_ms(rm // 2, rn, rk)
    chunk = 8192 * 65536 * 2 / 2 / cost_model.LINK_BYTES_PER_MS
    assert chunk > step
    gemms = cost_model.gemm_ms(rm // 2, rn, rk, count=2, chained=True)
    per_step, share, per_byte = cost_model.OVERLAP["all_gather"]
    moved = cost_model.moved_bytes(plan.definition, 2, 8192, 256, 65536)
    want = gemms * (1 + share) + (chunk - step) + 2 * per_step + moved * per_byte
    assert cost_model.predict(plan)["overlap_ms"] == pytest.approx(want)
