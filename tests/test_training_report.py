"""The training-step benchmark without a GPU: benchmarks/training/report.py's derived ratios and
floor_step bounds, suspect and wrong variants, targets, table, CSV and JSON round trips (also of
a floors-only --local-only record) and the plot's clean skip without matplotlib; and
benchmarks/training/training_step.py's variants on 2 gloo ranks (--cpu-smoke's math) against one
process's fp32 block, floor_step's check failing by name, and --local-only's argument errors.

Tolerances: the variants' output and gradients against megatron's, megatron's against the fp32
block computed from the same bf16 operands, and the sum of floor_step's per-rank partial sums
against that fp32 block, all at the benchmark's bf16 tolerance (relative Frobenius error < 2e-2,
a few times bf16's rounding of 2^-8 = 3.9e-3)."""

import json
import math
import sys

import pytest

from benchmarks.common import report as out
from benchmarks.training import report as rep

META = {"torch": "2.11.0+cu128", "device": "NVIDIA H200", "installed_by": "README install"}


def _record(tp=2, **ms):
    """A measured run at ``tp`` with megatron re-timed (first 29, last 31 ms) and clean
    numerics."""
    times = dict(floor=22.0, floor_step=24.0, megatron=30.0, async_tp=28.0, distgemm_keep=25.0)
    times.update(distgemm_regather=26.0)
    times.update(ms)
    errs = {q: 4e-3 for q in rep.QUANTITIES}
    return dict(
        tokens=8192,
        hidden=8192,
        ffn=28672,
        tp=tp,
        ms=times,
        retimed=dict(variant="megatron", first=29.0, last=31.0),
        rel_err={v: dict(errs) for v in rep.VARIANTS if v != "floor"},
        unavailable={},
        status="ok",
    )


def test_derived_ratios():
    d = rep.derived(_record())
    assert d["distgemm_best"] == "distgemm_keep"
    assert d["distgemm_vs_megatron"] == pytest.approx(30.0 / 25.0)
    assert d["distgemm_vs_async_tp"] == pytest.approx(28.0 / 25.0)
    assert d["speedup_vs_megatron_distgemm_regather"] == pytest.approx(30.0 / 26.0)
    assert d["eff_megatron"] == pytest.approx(22.0 / 30.0)
    assert d["drift"] == pytest.approx(31.0 / 29.0)
    flops = 3 * (2 * 8192 * 8192 * 28672 + 2 * 8192 * 14336 * 8192)
    assert rep.step_flops_per_rank(8192, 8192, 28672, 2) == flops
    assert d["tflops_per_gpu_floor"] == pytest.approx(flops / 22e-3 / 1e12)
    # regather the faster: it becomes the choice
    assert rep.derived(_record(distgemm_regather=24.0))["distgemm_best"] == "distgemm_regather"


def test_targets_met_missed_and_missing():
    # TP=2: 1.02x async_tp only; 28/27.4 = 1.022 >= 1.02, 28/27.5 = 1.018 < 1.02
    assert rep.targets(_record()) == {"vs_async_tp": True}
    for keep, met in ((27.4, True), (27.5, False)):
        assert rep.targets(_record(distgemm_keep=keep, distgemm_regather=27.6)) == {
            "vs_async_tp": met
        }
    # TP=4: 1.05x async_tp and 1.12x megatron; 28/26.5 = 1.057 and 30/26.5 = 1.132 both met,
    # 28/27 = 1.037 < 1.05 and 30/27 = 1.111 < 1.12 both missed
    assert rep.targets(_record(tp=4, distgemm_keep=26.5)) == {
        "vs_async_tp": True, "vs_megatron": True
    }  # fmt: skip
    tg = rep.targets(_record(tp=4, distgemm_keep=27.0, distgemm_regather=27.5))
    assert tg == {"vs_async_tp": False, "vs_megatron": False}
    assert rep.targets(_record(tp=8)) == {}  # no target named at TP=8
    assert "no speed target at tp=8" in rep.format_table(_record(tp=8), META)
    rec = _record(async_tp=None)
    rec["unavailable"]["async_tp"] = "RuntimeError: no symmetric memory"
    assert rep.targets(rec)["vs_async_tp"] is None
    assert rep.variant_status(rec, "async_tp") == "unavailable"


def test_suspect_below_floor_fails_its_targets():
    # bound = 22 * 0.99 = 21.78: 21.7 is suspect, 21.8 is not
    assert rep.suspect(_record(distgemm_keep=21.8)) == []
    rec = _record(distgemm_keep=21.7)
    assert rep.suspect(rec) == ["distgemm_keep"]
    assert rep.targets(rec) == {"vs_async_tp": False}
    assert rep.targets(_record(tp=4, distgemm_keep=21.7)) == {
        "vs_async_tp": False, "vs_megatron": False
    }  # fmt: skip
    assert rep.suspect(_record(floor=None)) == []


def test_wrong_numerics_fail_the_targets():
    rec = _record()
    rec["rel_err"]["distgemm_keep"]["grad_w_down"] = 0.03
    rec["rel_err"]["async_tp"]["out"] = math.nan
    assert rep.wrong(rec) == ["async_tp", "distgemm_keep"]
    assert rep.targets(rec) == {"vs_async_tp": False}
    assert rep.variant_status(rec, "distgemm_keep") == "wrong"


def test_check_sizes_names_the_values():
    rep.check_sizes(8192, 8192, 28672, 2)
    with pytest.raises(ValueError, match="tokens=8191 must be a positive multiple of tp=2"):
        rep.check_sizes(8191, 8192, 28672, 2)
    with pytest.raises(ValueError, match="ffn=28672 must be a positive multiple of tp=3"):
        rep.check_sizes(8190, 8192, 28672, 3)


def test_csv_and_table_round_trip():
    rec = _record(distgemm_regather=21.0)
    rec["unavailable"]["async_tp"] = "why"
    rows = out.read_csv(rep.to_csv(rec, META))
    assert [r["variant"] for r in rows] == list(rep.VARIANTS)
    by = {r["variant"]: r for r in rows}
    assert float(by["distgemm_keep"]["ms"]) == 25.0
    assert float(by["distgemm_keep"]["speedup_vs_megatron"]) == pytest.approx(1.2)
    assert by["distgemm_regather"]["suspect"] == "yes"
    assert by["async_tp"]["status"] == "unavailable" and by["async_tp"]["note"] == "why"
    assert "first 29.0000 and last 31.0000" in by["megatron"]["note"]
    assert {(r["torch"], r["device"], r["installed_by"]) for r in rows} == {tuple(META.values())}
    table = rep.format_table(rec, META)
    for text in (*META.values(), "21.0000!", "SUSPECT", "UNAVAILABLE", "drift of megatron"):
        assert text in table
    assert "target distgemm vs_async_tp >= 1.02x: 1.333x MISSED" in table  # suspect: fails
    table4 = rep.format_table(dict(rec, tp=4), META)
    assert "target distgemm vs_megatron >= 1.12x: 1.429x MISSED" in table4


def test_outputs_without_matplotlib_and_replot(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as when not installed
    stem = str(tmp_path / "run" / rep.output_stem(2, 8192, date="2026-11-24"))
    why = rep.write_outputs(_record(), META, stem)
    assert why.startswith("matplotlib unavailable")
    assert stem.endswith("2026-11-24-training-step-tp2-t8192")
    doc = json.loads(open(stem + ".json").read())
    assert doc["meta"] == META and doc["targets"] == {"vs_async_tp": True}
    assert not (tmp_path / "run" / (stem + ".png")).exists()
    assert rep.replot(stem + ".json", str(tmp_path / "again")) == 1  # still no matplotlib
    again = tmp_path / "again" / "2026-11-24-training-step-tp2-t8192"
    assert open(str(again) + ".csv").read() == open(stem + ".csv").read()
    assert open(str(again) + ".txt").read() == open(stem + ".txt").read()


def test_plot_written_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.png"
    assert rep.plot(_record(), META, str(path)) is None
    assert path.stat().st_size > 1000
    assert rep.plot(_floors_only(), META, str(path)) is None  # the floors as bars and lines
    untimed = dict.fromkeys(("megatron", "async_tp", "distgemm_keep", "distgemm_regather"))
    untimed.update(dict.fromkeys(rep.FLOORS))
    assert rep.plot(_record(**untimed), META, str(path)) == "no variant timed"


def _fp32_block(sizes):
    """The full block in fp32 from the benchmark's bf16 operands: output and gradients."""
    import torch
    import torch.nn.functional as F

    from benchmarks.training import block

    x, grad_out, gate, up, down = (
        t.float().requires_grad_() for t in block.full_block(*sizes, "cpu", torch.bfloat16)
    )
    y = (F.silu(x @ gate.t()) * (x @ up.t())) @ down.t()
    y.backward(grad_out.detach())
    return y.detach(), x.grad, gate.grad, up.grad, down.grad


def test_cpu_smoke_variants_against_megatron_and_fp32(tmp_path):
    torch = pytest.importorskip("torch")
    from ranks import run_ranks

    from benchmarks.training import training_step as ts

    tp = 2
    results = run_ranks(ts.cpu_smoke, tmp_path, tp=tp)
    for res in results:
        assert set(res["rel_err"]) == {
            "async_tp_eager",
            "distgemm_keep",
            "distgemm_regather",
            "distgemm_compiled",
            "megatron_after_poison",
            "floor_step",
            "distgemm_fp8",
        }
        assert set(res["rel_err"].pop("megatron_after_poison").values()) == {0.0}
        # the fp8 forward against bf16: off by fp8's rounding (3 mantissa bits), reported only
        assert 1e-3 < max(res["fp8_vs_bf16"].values()) < 0.2
        for errs in res["rel_err"].values():
            assert set(errs) == set(rep.QUANTITIES)
            assert max(errs.values()) < rep.ERR_TOL
    y, gx, ggate, gup, gdown = _fp32_block(ts.SMOKE_SIZES)
    tokens, ffn = ts.SMOKE_SIZES[0], ts.SMOKE_SIZES[2]

    def check(got, ref, where):
        for q, r in ref.items():
            assert got[q].shape == r.shape, (where, q)
            err = ((got[q].float() - r).norm() / r.norm()).item()
            assert err < rep.ERR_TOL, (where, q, err)

    for rank, res in enumerate(results):
        rows = slice(rank * tokens // tp, (rank + 1) * tokens // tp)
        cols = slice(rank * ffn // tp, (rank + 1) * ffn // tp)
        weights = {
            "grad_w_gate_up": torch.cat([ggate[cols], gup[cols]]),
            "grad_w_down": gdown[:, cols],
        }
        check(res["megatron"], {"out": y[rows], "grad_input": gx[rows], **weights}, rank)
        # floor_step on one rank's weights: its own weights' gradients, and partial sums of the
        # output and input gradient whose sum over ranks is the full block's
        check(res["floor_step"], weights, ("floor_step", rank))
    partials = {
        q: sum(res["floor_step"][q].float() for res in results) for q in ("out", "grad_input")
    }
    check(partials, {"out": y, "grad_input": gx}, "floor_step summed over ranks")


def test_rel_errors_flags_nan():
    torch = pytest.importorskip("torch")
    from benchmarks.training import block

    ref = {"out": torch.ones(4)}
    assert block.rel_errors({"out": torch.ones(4)}, ref) == {"out": 0.0}
    assert math.isnan(block.rel_errors({"out": torch.full((4,), math.nan)}, ref)["out"])


def test_async_tp_fused_ops_note():
    rec = _record()
    rec["async_tp_fused"] = {"fused_all_gather_matmul": 2, "fused_matmul_reduce_scatter": 2}
    note = {r["variant"]: r["note"] for r in rep.csv_rows(rec, META)}["async_tp"]
    assert note == (
        "fused ops named in compiled code: fused_all_gather_matmul=2, fused_matmul_reduce_scatter=2"
    )
    rec["async_tp_fused"] = dict.fromkeys(rep.FUSED_OPS, 0)
    table = rep.format_table(rec, META)
    assert "micro-pipeline TP matched nothing: compiled NCCL + mm" in table


def _floors_only():
    """A --local-only record: the two floors timed at TP=2's shapes, nothing distributed."""
    return dict(
        tokens=8192,
        hidden=8192,
        ffn=28672,
        tp=2,
        ms=dict(floor=22.0, floor_step=24.0),
        rel_err={"floor_step": {q: 3e-3 for q in rep.QUANTITIES}},
        unavailable={},
        status="ok",
    )


def test_variant_order_and_retimed():
    assert rep.FLOORS == ("floor", "floor_step") == rep.VARIANTS[: len(rep.FLOORS)]
    assert rep.TIMED_ORDER == (
        "megatron",
        "async_tp",
        "distgemm_keep",
        "distgemm_regather",
        "distgemm_compiled",
        "megatron_fp8",
        "async_tp_fp8",
        "distgemm_fp8",
    )
    assert rep.RETIMED == "megatron"
    assert rep.FP8_VARIANTS[0] == "megatron_fp8"  # the fp8 reference, checked before the others
    assert not set(rep.FP8_VARIANTS) & set(rep.DISTGEMM)  # the bf16 targets take bf16 variants
    assert set(rep.DESCRIPTION) == set(rep.VARIANTS)
    assert not set(rep.FLOORS) & set(rep.DISTGEMM)


def test_fp8_variants_ratios_and_their_own_floor():
    rec = _record(megatron_fp8=24.0, async_tp_fp8=22.0, distgemm_fp8=20.0)
    d = rep.derived(rec)
    assert d["distgemm_fp8_vs_async_tp_fp8"] == pytest.approx(1.1)
    assert d["distgemm_fp8_vs_megatron_fp8"] == pytest.approx(1.2)
    assert d["distgemm_best"] == "distgemm_keep"  # fp8 variants never count for bf16 targets
    table = rep.format_table(rec, META)
    assert "fp8 forward: distgemm_fp8 runs at 1.100x async_tp_fp8, 1.200x megatron_fp8" in table
    # below the bf16 GEMMs' floor (22) but above 5/6 of it (18.15): not suspect; below: suspect
    assert rep.suspect(rec) == []
    assert rep.suspect(_record(distgemm_fp8=18.0)) == ["distgemm_fp8"]
    assert rep.derived(_record())["distgemm_fp8_vs_async_tp_fp8"] is None  # not measured


def test_floor_step_bounds():
    d = rep.derived(_record())
    assert d["bound_vs_async_tp"] == pytest.approx(28.0 / 24.0)
    assert d["bound_vs_megatron"] == pytest.approx(30.0 / 24.0)
    assert d["eff_floor_step"] == pytest.approx(22.0 / 24.0)
    table = rep.format_table(_record(), META)
    assert "at best (floor_step, all communication hidden): 1.167x async_tp, 1.250x megatron" in (
        table
    )
    # missing floor_step or async_tp: that bound is None, the line shows what is there
    d = rep.derived(_record(floor_step=None))
    assert d["bound_vs_async_tp"] is None and d["bound_vs_megatron"] is None
    assert "at best" not in rep.format_table(_record(floor_step=None), META)
    assert rep.derived(_record(async_tp=None))["bound_vs_async_tp"] is None
    table = rep.format_table(_record(async_tp=None), META)
    assert "at best (floor_step, all communication hidden): 1.250x megatron" in table


def test_suspect_ignores_floor_step():
    # floor_step far below the GEMM floor (22 ms): not suspect, not a distgemm variant
    rec = _record(floor_step=10.0)
    assert rep.suspect(rec) == []
    assert rep.derived(rec)["distgemm_best"] == "distgemm_keep"
    assert rep.targets(rec) == {"vs_async_tp": True}
    by = {r["variant"]: r for r in rep.csv_rows(rec, META)}
    assert by["floor_step"]["suspect"] == "" and by["floor_step"]["status"] == "ok"
    assert by["floor_step"]["note"] == "err vs its own eager block"
    # floor_step's error against its eager block counts as wrong like any other
    rec["rel_err"]["floor_step"]["grad_input"] = 0.05
    assert rep.wrong(rec) == ["floor_step"]


def test_floors_only_record(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rec, meta = _floors_only(), {**META, "local_only": True}
    assert rep.targets(rec) == {"vs_async_tp": None}
    d = rep.derived(rec)
    assert d["distgemm_best"] is None and d["drift"] is None
    assert d["bound_vs_async_tp"] is None and d["bound_vs_megatron"] is None
    rows = {r["variant"]: r for r in out.read_csv(rep.to_csv(rec, meta))}
    assert list(rows) == list(rep.VARIANTS)
    assert float(rows["floor_step"]["ms"]) == 24.0
    assert float(rows["floor_step"]["eff_vs_floor"]) == pytest.approx(22.0 / 24.0, abs=1e-3)
    assert {rows[v]["status"] for v in rep.TIMED_ORDER} == {"missing"}
    table = rep.format_table(rec, meta)
    assert "local only: one GPU" in table and "at best" not in table
    assert "target distgemm vs_async_tp >= 1.02x: - n/a" in table
    stem = str(tmp_path / (rep.output_stem(2, 8192, date="2026-11-25") + "-local"))
    assert rep.write_outputs(rec, meta, stem).startswith("matplotlib unavailable")
    doc = json.loads(open(stem + ".json").read())
    assert doc["meta"]["local_only"] is True and doc["record"]["tp"] == 2
    assert doc["targets"] == {"vs_async_tp": None}


def _tiny_gathered():
    import torch

    from benchmarks.training import block
    from benchmarks.training import training_step as ts

    full = block.full_block(*ts.SMOKE_SIZES, "cpu", torch.bfloat16)
    return block.shard_block(full, 0, 2, gathered=True)


def test_check_floor_step_names_what_is_off(monkeypatch):
    pytest.importorskip("torch")
    from benchmarks.training import block
    from benchmarks.training import training_step as ts

    gathered = _tiny_gathered()
    assert gathered.x.shape == (ts.SMOKE_SIZES[0], ts.SMOKE_SIZES[1])  # all T tokens
    eager = block.make_floor_step

    def scaled(ops, compiled=True):  # the "compiled" step 10% off: every quantity about 0.1 off
        variant = eager(ops, compiled=False)
        if compiled:
            forward = variant.forward
            variant.forward = lambda t: forward(t) * 1.1
        return variant

    monkeypatch.setattr(block, "make_floor_step", scaled)
    with pytest.raises(RuntimeError, match=r"floor_step: out rel\. err 0\.\d+ against the eager"):
        block.check_floor_step(gathered)

    def no_down_grad(ops, compiled=True):
        variant = eager(ops, compiled=False)
        if compiled:
            w1, w2 = variant.weights
            variant.forward = lambda t: block.local_block(t, w1, w2.detach())
        return variant

    monkeypatch.setattr(block, "make_floor_step", no_down_grad)
    with pytest.raises(RuntimeError, match="floor_step: grad_w_down is None"):
        block.check_floor_step(gathered)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--local-only"], "--local-only needs a CUDA GPU"),
        (["--local-only", "--tp", "3"], "tokens=8192 must be a positive multiple of tp=3"),
        (["--local-only", "--tp", "0"], "--tp 0: must be at least 1"),
        (["--tp", "4"], "--tp applies to --local-only only"),
    ],
)
def test_local_only_arguments(argv, message, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    from benchmarks.training import training_step as ts

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        ts.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_timeline_table_lists_every_variant_and_the_most_exposed_rank():
    part = dict(window_ms=14.0, gemm_ms=12.5, comm_exposed_ms=0.9, other_exposed_ms=0.4,
                idle_ms=0.2, comm_ms=3.1, comm_hidden_ms=2.2, gemm_kernels=16.0)  # fmt: skip
    other_rank = {**part, "comm_exposed_ms": 1.25}
    text = rep.timeline_table({"async_tp": [part, other_rank], "floor_step": [part, part]})
    lines = text.splitlines()
    assert lines[0].startswith("where each step's time goes")
    header = [c.strip() for c in lines[1].split("|")]
    assert header[0] == "variant" and header[-1] == "comm, no GEMM (max rank)"
    rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")] for line in lines[3:]}
    assert set(rows) == {"async_tp", "floor_step"}
    assert rows["async_tp"][1:4] == ["14.000", "12.500", "0.900"]
    assert rows["async_tp"][-1] == "1.250" and rows["floor_step"][-1] == "0.900"
