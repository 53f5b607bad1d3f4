"""The cost model with plans' steps on the machine's kernel table: it prices a step cuBLASLt runs
at torch's GEMM rate only under constants calibrated with such steps (steps_by_table), and
under H200's shipped TP=4 constants and kernel table it chooses, on the committed TP=4 sweeps of
2026-11-28 (benchmarks/results/2026-11-28-h200-kernel-table/, shapes the calibration did not
run), the fastest measured path and S where the steps ran the table's kernels, and stays within
2% of NCCL + torch.mm where they did not."""

import pathlib
from dataclasses import replace

import pytest
from test_machine import constants

from benchmarks.common.report import RESULTS_DIR
from benchmarks.sweep import fit_path_model
from distgemm import _core
from distgemm.runtime import cost_model, kernel_table, machine

RESULTS = pathlib.Path(RESULTS_DIR) / "2026-11-28-h200-kernel-table"
H200_TP4 = machine.load(machine.SHIPPED_DIR / "nvidia-h200-tp4-nvlink18.json")
H200_TABLE = kernel_table.load(kernel_table.SHIPPED_DIR / "nvidia-h200.json")
RULE = 1.02  # within 2% (of the fastest measured; of NCCL + torch.mm)


def _rows(label: str, table) -> list[dict]:
    with kernel_table.priced_as(table):
        return fit_path_model.validation_rows(H200_TP4, RESULTS / f"sweep-tp4-call5-{label}.csv")


@pytest.mark.parametrize("label", ["A1", "A2"])
def test_with_the_table_in_every_plan_the_choice_is_the_fastest_measured(label):
    rows = _rows(label, H200_TABLE)
    assert len(rows) == 8
    for r in rows:
        assert r["cost_vs_fastest"] <= RULE, r
        assert r["vs_baseline"] <= 1.0, r


def test_with_one_rank_plans_the_choice_stays_within_2_percent_of_nccl_plus_mm():
    for r in _rows("B", None):
        assert r["vs_baseline"] <= RULE, r


def test_the_shipped_constants_price_steps_as_the_kernel_they_were_fitted_with():
    assert not H200_TP4.steps_by_table  # calibrated before the table reached plans' steps
    plan = _core.build_plan("ag_rotate_a", 4, 4, 4096, 10240, 8192, 1)
    bare = cost_model.predict(H200_TP4, plan)
    with kernel_table.priced_as(H200_TABLE):
        assert cost_model.predict(H200_TP4, plan) == bare


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_under_constants_fitted_with_table_steps_a_cublaslt_step_is_priced_as_torchs(tp):
    mc = replace(constants(tp), steps_by_table=True)
    m, n, k = 1024 * tp, 2560 * tp, 8192
    plan = _core.build_plan("ag_rotate_a", tp, tp, m, n, k, 1)
    rm, rn, rk = cost_model.rank_problem(plan.definition, tp, m, n, k)
    sm, sn = cost_model.step_gemm(plan.definition, tp, rm, rn)
    table = {"rows": [dict(dtype="bf16", m=sm, n=sn, k=rk, kernel="cublaslt", algo=0)]}
    ours = cost_model.predict(mc, plan)
    with kernel_table.priced_as(table):
        lt = cost_model.predict(mc, plan)
        forced_tile = cost_model.predict(mc, plan, tile_n=256)  # a forced tile: distgemm's
        fp16 = cost_model.predict(mc, plan, dtype="fp16")  # no fp16 row
    assert lt == cost_model.predict(mc, plan, step_kernel="cublaslt")
    assert fp16 == ours and forced_tile == cost_model.predict(mc, plan, tile_n=256)
    assert lt["collective_ms"] == ours["collective_ms"]
    share = mc.overlap["all_gather"][1]
    gemms = cost_model.steps_gemm_ms(mc, sm, sn, rk, "cublaslt", count=tp)
    assert gemms == pytest.approx(tp * cost_model.mm_ms(mc, sm, sn, rk))
    step_lt = cost_model.steps_gemm_ms(mc, sm, sn, rk, "cublaslt")
    step_ours = cost_model.gemm_ms(mc, sm, sn, rk)
    gemms_ours = cost_model.gemm_ms(mc, sm, sn, rk, count=tp, chained=plan.pdl_by_default)
    moved = cost_model.moved_bytes(plan.definition, tp, m, n, k)
    exposed = cost_model.exposed_copy_ms(mc, moved, tp, tp)
    diff = (gemms - gemms_ours) * (1 + share) + (
        max(0.0, exposed - step_lt) - max(0.0, exposed - step_ours)
    )
    assert lt["overlap_ms"] - ours["overlap_ms"] == pytest.approx(diff, rel=1e-9, abs=1e-12)
