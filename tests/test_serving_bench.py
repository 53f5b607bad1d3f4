"""The serving benchmark without a GPU: benchmarks/serving/report.py's ratios, suspect and wrong
variants, the decode acceptance rule, table, CSVs, JSON round trip and plot from synthetic runs;
benchmarks/serving/stack.py's stack against a one-process fp32 stack; and
``torchrun -m benchmarks.serving.serving_step --cpu-smoke`` on 2 gloo ranks, judged by the
numbers each rank writes.

Tolerances: the bf16 stack against fp32 at the benchmark's ERR_TOL (relative Frobenius error
< 2e-2, a few times bf16's rounding of 2^-8); and at least 1e-4 (bf16 results are not exact, so
an error of 0 would mean the comparison compared nothing); distgemm's plans on the reference
executor against float64 below 1e-9."""

import json
import math
import os
import subprocess
import sys

import pytest

from benchmarks.common import report as out
from benchmarks.serving import report as rep

META = {"torch": "2.11.0+cu128", "device": "NVIDIA H200", "installed_by": "README install"}
TP = 2


def _bucket(phase, tokens, **ms):
    """A measured bucket: every variant of the phase timed (the floor 1.0 ms, NCCL + mm 2.0,
    others 1.5) and checked (rel. err 4e-3), ``ms`` overriding (None: unavailable)."""
    times = {v: 1.5 for v in rep.PHASE_VARIANTS[phase]}
    times.update(floor=1.0, nccl_mm=2.0, nccl_mm_sp=2.0)
    times.update(ms)
    unavailable = {v: "RuntimeError: not here" for v, t in times.items() if t is None}
    times = {v: t for v, t in times.items() if t is not None}
    errs = {v: (0.0 if v == "floor" else 4e-3) for v in times}
    return dict(phase=phase, tokens=tokens, tp=TP, ms=times, rel_err=errs, unavailable=unavailable)


def _run(records=None):
    records = records or [
        _bucket(
            "decode", 1, distgemm_ar=None, nccl_mm_sp=None, symm_mem_fused=None, distgemm_sp=None
        ),
        _bucket("decode", 8),
        _bucket("prefill", 2048, distgemm_sp=1.2),
    ]
    memory = {
        "decode": {
            v: dict(device=64.0, reserved=32.0, allocated=8.0, peak_allocated=16.0, distgemm="n/a")
            for v in rep.PHASE_VARIANTS["decode"]
        },
        "prefill": {
            "distgemm_sp": dict(
                device=512.0,
                reserved=0.0,
                allocated=0.0,
                peak_allocated=0.0,
                distgemm={"workspace_bytes": 1},
            )
        },
    }
    return dict(
        model="70B",
        layers=8,
        tp=TP,
        records=records,
        memory=memory,
        buffers_mib={"decode": {"ar": 40.0, "sp": 30.0}},
    )


def test_derived_ratios_against_the_layouts_reference():
    rec = _bucket("prefill", 2048, distgemm_sp=1.25, distgemm_ar=2.5)
    d = rep.derived(rec)
    assert d["vs_ref_distgemm_sp"] == pytest.approx(2.0 / 1.25)  # against nccl_mm_sp
    assert d["vs_ref_distgemm_ar"] == pytest.approx(2.0 / 2.5)  # against nccl_mm
    assert d["floor_frac_nccl_mm"] == pytest.approx(0.5)
    assert d["vs_ref_floor"] is None
    assert rep.derived(_bucket("prefill", 2048, nccl_mm_sp=None))["vs_ref_distgemm_sp"] is None


def test_decode_verdict_within_two_percent():
    assert rep.decode_verdict(_bucket("decode", 8, distgemm_ar=2.04)) is True  # 1.02x
    assert rep.decode_verdict(_bucket("decode", 8, distgemm_ar=2.05)) is False
    assert rep.decode_verdict(_bucket("decode", 8, distgemm_ar=None)) is None
    assert rep.decode_verdict(_bucket("prefill", 2048, distgemm_ar=1.0)) is None  # decode only


def test_suspect_below_floor_and_wrong_fail_the_verdict():
    # bound = 1.0 * 0.99: 0.985 is suspect, 0.995 is not
    assert rep.suspect(_bucket("decode", 8, distgemm_ar=0.995)) == []
    rec = _bucket("decode", 8, distgemm_ar=0.985)
    assert rep.suspect(rec) == ["distgemm_ar"]
    assert rep.decode_verdict(rec) is False
    rec = _bucket("decode", 8)
    rec["rel_err"]["distgemm_ar"] = 0.03
    rec["rel_err"]["symm_mem_fused"] = math.nan
    assert rep.wrong(rec) == ["distgemm_ar", "symm_mem_fused"]
    assert rep.decode_verdict(rec) is False
    assert rep.variant_status(rec, "distgemm_ar") == "wrong"
    assert rep.suspect(_bucket("decode", 8, floor=None)) == []


def test_acceptance_met_missed_and_unmeasured():
    met = [_bucket("decode", t) for t in (1, 8)]
    assert rep.acceptance(met) == dict(met=True, buckets=2, of=2, missed=[])
    one_off = [_bucket("decode", 1, distgemm_ar=None), _bucket("decode", 8)]
    assert rep.acceptance(one_off) == dict(met=None, buckets=1, of=2, missed=[])
    missed = [_bucket("decode", 1, distgemm_ar=None), _bucket("decode", 8, distgemm_ar=3.0)]
    assert rep.acceptance(missed) == dict(met=False, buckets=1, of=2, missed=[8])
    assert rep.acceptance([_bucket("prefill", 2048)])["met"] is None


def test_csv_rows_per_phase_variant_and_memory_rows():
    run = _run()
    rows = out.read_csv(out.csv_text(rep.CSV_FIELDS, rep.csv_rows(run["records"], META)))
    assert len(rows) == 2 * len(rep.PHASE_VARIANTS["decode"]) + len(rep.PHASE_VARIANTS["prefill"])
    assert {(r["torch"], r["device"], r["installed_by"]) for r in rows} == {tuple(META.values())}
    by = {(r["phase"], r["tokens"], r["variant"]): r for r in rows}
    dg1 = by[("decode", "1", "distgemm_ar")]
    assert (dg1["status"], dg1["ms"], dg1["note"]) == ("unavailable", "", "RuntimeError: not here")
    sp = by[("prefill", "2048", "distgemm_sp")]
    assert float(sp["ms"]) == 1.2 and float(sp["vs_reference"]) == pytest.approx(2.0 / 1.2, 1e-3)
    assert sp["captured"] == "no" and by[("decode", "8", "nccl_mm")]["captured"] == "yes"
    assert ("prefill", "2048", "symm_mem_one_shot") not in by  # a decode-size op
    mem = {(r["phase"], r["variant"]): r for r in rep.memory_rows(run, META)}
    assert float(mem[("prefill", "distgemm_sp")]["device_mib"]) == 512.0
    assert mem[("decode", "nccl_mm")]["distgemm_memory_stats"] == "n/a"
    assert mem[("prefill", "distgemm_sp")]["distgemm_memory_stats"] == "{'workspace_bytes': 1}"


def test_table_names_run_reasons_numerics_memory_and_acceptance():
    run = _run()
    run["records"][1]["ms"]["distgemm_sp"] = 0.5  # below the floor of 1.0
    table = rep.format_table(run, META)
    for text in (
        *META.values(),
        "decode (CUDA graph per batch bucket)",
        "prefill (eager)",
        "0.5000!",
        "decode distgemm_ar (tokens 1): RuntimeError: not here",
        "distgemm_ar vs nccl_mm",
        "1.333x",  # decode distgemm_ar at 8 tokens: 2.0 / 1.5
        "activation buffers per variant, not counted: decode ar: 40; decode sp: 30",
        "acceptance (decode: distgemm_ar <= 1.02x captured nccl_mm at every batch): n/a "
        "(1 of 2 buckets measured)",
    ):
        assert text in table, text


def test_outputs_without_matplotlib_and_replot(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as when not installed
    stem = str(tmp_path / "run" / out.output_stem("serving", TP, date="2026-11-24"))
    assert stem.endswith("2026-11-24-serving-tp2")
    why = rep.write_outputs(_run(), META, stem)
    assert why.startswith("matplotlib unavailable")
    doc = json.loads(open(stem + ".json").read())
    assert doc["meta"] == META and doc["acceptance"]["buckets"] == 1
    assert rep.replot(stem + ".json", str(tmp_path / "again")) == 1  # still no matplotlib
    again = str(tmp_path / "again" / "2026-11-24-serving-tp2")
    for suffix in (".csv", "-memory.csv", ".txt"):
        assert open(again + suffix).read() == open(stem + suffix).read()


def test_plot_written_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.png"
    assert rep.plot(_run(), META, str(path)) is None
    assert path.stat().st_size > 1000
    empty = _run([dict(phase="decode", tokens=1, tp=TP, ms={}, rel_err={}, unavailable={})])
    assert rep.plot(empty, META, str(path)) == "no variant timed"


def test_stack_dims_and_layout_rules():
    stack = pytest.importorskip("benchmarks.serving.stack")
    dims = stack.model_dims("70B")
    assert dims == {
        "QKV": (10240, 8192),
        "O": (8192, 8192),
        "FC1": (57344, 8192),
        "FC2": (8192, 28672),
    }
    stack.check_dims(dims, 8)
    with pytest.raises(ValueError, match="QKV: N=10240 must split over tp=3"):
        stack.check_dims(dims, 3)
    assert stack.sp_reason(1, 2) == "M=1 is not divisible by TP=2 (sequence-parallel activations)"
    assert stack.sp_reason(4, 2) is None


def test_single_rank_stack_matches_fp32():
    """At TP=1 every layout is local: the floor's step is the stack itself, against the fp32
    stack from the same seed (layer outputs, in order)."""
    torch = pytest.importorskip("torch")
    from benchmarks.serving import serving_step, stack

    ops = stack.make_operands(serving_step.SMOKE_DIMS, 2, 1, 0, 16, "cpu")
    bufs = stack.make_buffers(ops, "ar", 16)
    calls = stack.layer_calls("floor", "", None)
    got = stack.make_step("floor", ops, bufs, 5, calls)()
    ref = stack.reference_outputs(ops, 5, "ar")
    assert [tuple(g.shape) for g in got] == [tuple(r.shape) for r in ref]
    assert tuple(got[0].shape) == (5, 96) and tuple(got[3].shape) == (5, 64)
    err = stack.max_rel_err(got, ref)
    assert 1e-4 < err < rep.ERR_TOL
    assert math.isnan(stack.max_rel_err([torch.full((2,), math.nan)], [torch.ones(2)]))
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        stack.layer_calls("nope", "", None)


def test_smoke_failures_flags_what_is_off():
    from benchmarks.serving.serving_step import smoke_failures

    res = dict(
        rel_err={"nccl_mm M2": 3e-3, "nccl_mm_sp M2": 0.05},
        floor_finite={"M2": True, "M6": False},
        unavailable={},
        plans={"1": {"ar O": "ValueError: M=1 ..."}, "2": {"ar O": 1e-16, "sp O": 1e-3}},
    )
    assert smoke_failures(res) == [
        "nccl_mm_sp M2: 0.05",
        "floor M6 not finite",
        "plan sp O M2: 0.001",
    ]


def _torchrun_smoke(repo_root, tmp_path, module, name):
    """``torchrun --nproc-per-node 2 -m <module> --cpu-smoke`` from the repository root, as
    benchmarks/README.md says to run it; each rank's JSON (``<name>-cpu-smoke-rank<r>.json``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={TP}", "-m", module]
    cmd += ["--cpu-smoke", "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    return [
        json.loads((tmp_path / f"{name}-cpu-smoke-rank{k}.json").read_text()) for k in range(TP)
    ]


def test_cpu_smoke_under_torchrun(repo_root, tmp_path):
    pytest.importorskip("torch")
    from benchmarks.serving import serving_step

    for res in _torchrun_smoke(repo_root, tmp_path, "benchmarks.serving.serving_step", "serving"):
        assert serving_step.smoke_failures(res) == []
        want = {f"nccl_mm M{t}" for t in serving_step.SMOKE_TOKENS}
        want |= {f"nccl_mm_sp M{t}" for t in serving_step.SMOKE_TOKENS if t % TP == 0}
        assert set(res["rel_err"]) == want
        assert all(1e-4 < e < rep.ERR_TOL for e in res["rel_err"].values())
        assert res["unavailable"] == {
            "nccl_mm_sp M1": "M=1 is not divisible by TP=2 (sequence-parallel activations)"
        }
        assert set(res["floor_finite"]) == {f"M{t}" for t in serving_step.SMOKE_TOKENS}
        assert all(res["floor_finite"].values())
        plans = res["plans"]
        assert set(plans) == {str(t) for t in serving_step.SMOKE_TOKENS}
        assert set(plans["16"]) == {"ar O", "ar FC2", "sp QKV", "sp O", "sp FC1", "sp FC2"}
        assert all(isinstance(e, float) and e < serving_step.PLAN_TOL for e in plans["16"].values())
        for e in plans["1"].values():  # a rejection names the constraint, or the plan is exact
            assert (isinstance(e, str) and "M=1" in e) or e < serving_step.PLAN_TOL


def test_replot_from_the_command_line(tmp_path, capsys):
    from benchmarks.serving import serving_step

    stem = str(tmp_path / "2026-11-24-serving-tp2")
    rep.write_outputs(_run(), META, stem)
    capsys.readouterr()
    rc = serving_step.main(["--replot", stem + ".json", "--out", str(tmp_path / "re")])
    assert rc in (0, 1)  # 1: no matplotlib for the PNG
    assert (tmp_path / "re" / "2026-11-24-serving-tp2.txt").read_text() == open(
        stem + ".txt"
    ).read()
    assert "acceptance (decode" in capsys.readouterr().out
