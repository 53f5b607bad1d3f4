"""CPU tests of the pure parts of the Llama sweep: cases, shapes, skip logic
(benchmarks/common/llama_cases.py), derived numbers, targets, CSV, table, plot, replot
(benchmarks/sweep/report.py) and the progress bar of benchmarks/sweep/llama_sweep.py. The
torch.distributed / CUDA part (run_case, main) is not called here."""

import csv
import importlib
import io
import json
import subprocess
import sys

import pytest

from benchmarks.common import llama_cases as cases_mod
from benchmarks.sweep import llama_sweep, report


def test_full_case_list():
    cases = cases_mod.make_cases(2)
    assert len(cases) == 3 * 4 * 5
    assert len(set(cases)) == len(cases)
    assert {c.model for c in cases} == {"8B", "70B", "405B"}
    assert {c.layer for c in cases} == {"QKV", "O", "FC1", "FC2"}
    assert {c.tokens for c in cases} == {1024, 2048, 4096, 8192, 16384}
    assert all(c.tp == 2 for c in cases)
    assert cases[0].name == "8B/QKV/M1024/TP2"


def test_case_filters_narrow_the_list_and_name_bad_values():
    cases = cases_mod.make_cases(2, models=["405B"], tokens=[4096], layers=["FC1", "FC2"])
    assert [c.name for c in cases] == ["405B/FC1/M4096/TP2", "405B/FC2/M4096/TP2"]
    assert len(cases_mod.make_cases(2, quick=True, layers=["O"])) == 2
    with pytest.raises(ValueError, match="unknown model '7B'; one of 8B, 70B, 405B"):
        cases_mod.make_cases(2, models=["7B"])
    with pytest.raises(ValueError, match="unknown layer 'MLP'; one of QKV, O, FC1, FC2"):
        cases_mod.make_cases(2, layers=["MLP"])
    with pytest.raises(ValueError, match="tokens must be positive integers, got 0"):
        cases_mod.make_cases(2, tokens=[0])


def test_quick_case_list():
    cases = cases_mod.make_cases(4, quick=True)
    assert [(c.model, c.layer, c.tokens) for c in cases] == [
        ("70B", la, m) for m in (4096, 8192) for la in ("QKV", "O", "FC1", "FC2")
    ]
    assert all(c.tp == 4 for c in cases)


@pytest.mark.parametrize(
    "model,layer,mnk",
    [
        ("8B", "QKV", (2048, 6144, 4096)),  # (32 + 2*8) * 128
        ("8B", "O", (2048, 4096, 4096)),
        ("8B", "FC1", (2048, 28672, 4096)),
        ("8B", "FC2", (2048, 4096, 14336)),
        ("70B", "QKV", (2048, 10240, 8192)),  # (64 + 16) * 128
        ("70B", "O", (2048, 8192, 8192)),
        ("70B", "FC1", (2048, 57344, 8192)),
        ("70B", "FC2", (2048, 8192, 28672)),
        ("405B", "QKV", (2048, 18432, 16384)),  # (128 + 16) * 128
        ("405B", "O", (2048, 16384, 16384)),
        ("405B", "FC1", (2048, 106496, 16384)),
        ("405B", "FC2", (2048, 16384, 53248)),
    ],
)
def test_global_gemm(model, layer, mnk):
    assert cases_mod.global_gemm(model, layer, 2048) == mnk


def test_global_gemm_unknown_layer():
    with pytest.raises(
        ValueError, match="unknown Llama layer 'MLP'; valid layers: QKV, O, FC1, FC2"
    ):
        cases_mod.global_gemm("8B", "MLP", 1024)


def test_per_rank_shapes_all_gather():
    s = cases_mod.shapes(cases_mod.Case("70B", "FC1", 8192, 2))
    assert s["collective"] == "all_gather" and s["schedule"] == "ag_rotate_a"
    assert s["a"] == (4096, 8192)
    assert s["w"] == (28672, 8192)
    assert s["out"] == (8192, 28672)
    assert s["full_a"] == (8192, 8192)
    assert s["floor"] == (8192, 28672, 8192)  # the per-rank GEMM after the gather


def test_per_rank_shapes_reduce_scatter_tp4():
    s = cases_mod.shapes(cases_mod.Case("405B", "FC2", 4096, 4))
    assert s["collective"] == "reduce_scatter" and s["schedule"] == "rs_tile_a"
    assert s["a"] == (4096, 53248 // 4)
    assert s["w"] == (16384, 13312)
    assert s["out"] == (1024, 16384)
    assert s["partial"] == (4096, 16384)
    assert s["floor"] == (4096, 16384, 13312)


def test_o_layer_scatters_and_k_is_q_heads():
    s = cases_mod.shapes(cases_mod.Case("8B", "O", 1024, 8))
    assert s["collective"] == "reduce_scatter"
    assert (s["m"], s["n"], s["k"]) == (1024, 4096, 32 * 128)
    assert s["a"] == (1024, 512) and s["w"] == (4096, 512) and s["out"] == (128, 4096)


def test_no_skip_for_real_llama_shapes_tp2():
    # distgemm's own plan check (make_spec on meta tensors) accepts all quick cases at S=2, 4.
    for case in cases_mod.make_cases(2, quick=True):
        reason, rejected = cases_mod.skip_reason(case)
        assert reason is None, (case, reason)
        assert rejected == {}


def test_skip_tp_not_dividing_m():
    reason, _ = cases_mod.skip_reason(cases_mod.Case("8B", "QKV", 1024, 3))
    assert reason is not None and "M=1024 is not divisible by TP=3" in reason


def test_skip_tp_not_dividing_k_or_n():
    # K of 8B FC2 = 14336 = 2^11 * 7 and N of 8B QKV = 6144 = 2^11 * 3: TP=4096 divides M=16384
    # but not them.
    reason, _ = cases_mod.skip_reason(
        cases_mod.Case("8B", "FC2", 16384, 4096), plan_check=lambda *a: None
    )
    assert reason == "K=14336 is not divisible by TP=4096 (row-parallel weight)"
    reason, _ = cases_mod.skip_reason(
        cases_mod.Case("8B", "QKV", 16384, 4096), plan_check=lambda *a: None
    )
    assert reason == "N=6144 is not divisible by TP=4096 (column-parallel weight)"


def test_skip_unaligned_rows():
    # 8B FC2 at TP=512: 14336 / 512 = 28 elements of K per rank, not a 16-byte row.
    case = cases_mod.Case("8B", "FC2", 16384, 512)
    reason, _ = cases_mod.skip_reason(case, plan_check=lambda *a: None)
    assert reason is not None and "28 columns is not a multiple of 8" in reason


def test_skip_when_plan_rejects_default_steps():
    calls = []

    def check(op, schedule, tp, steps, a, w):
        calls.append((op, schedule, tp, steps, a, w))
        return "M=8190 is not divisible by S=2" if steps == 2 else None

    reason, rejected = cases_mod.skip_reason(
        cases_mod.Case("70B", "QKV", 4096, 2), plan_check=check
    )
    assert reason is not None and reason.startswith("distgemm rejects the default S=2")
    assert set(rejected) == {2}
    assert calls[0] == ("all_gather_gemm", "ag_rotate_a", 2, 2, (2048, 8192), (5120, 8192))
    assert [c[3] for c in calls] == [2, 4]


def test_2tp_rejection_only_narrows_the_search():
    reason, rejected = cases_mod.skip_reason(
        cases_mod.Case("70B", "FC2", 4096, 2),
        plan_check=lambda op, sch, tp, steps, a, w: "no" if steps == 4 else None,
    )
    assert reason is None and rejected == {4: "no"}


def test_real_plan_rejects_rows_not_divisible_by_tp():
    # distgemm's own check (make_spec on meta tensors): M = 14 rows cannot be reduce-scattered
    # over TP=4; 14 gathered rows split into S=4 uneven tiles are accepted, and so is Llama-70B
    # QKV at M=4096.
    why = cases_mod.plan_rejects("gemm_reduce_scatter", "rs_tile_a", 4, 4, (14, 64), (8, 16))
    assert why is not None and "M=14 is not divisible by TP=4" in why
    assert cases_mod.plan_rejects("all_gather_gemm", "ag_rotate_a", 2, 4, (7, 64), (8, 64)) is None
    assert (
        cases_mod.plan_rejects("all_gather_gemm", "ag_rotate_a", 2, 2, (1024, 8192), (5120, 8192))
        is None
    )


def _record(**over):
    rec = dict(
        case="70B/FC1/M8192/TP2",
        model="70B",
        layer="FC1",
        tokens=8192,
        tp=2,
        m=8192,
        n=57344,
        k=8192,
        status="ok",
        reason=None,
        ms={
            "floor": 5.0,
            "floor_dg": 5.1,
            "baseline": 8.0,
            "symm_mem": 6.4,
            "dg_default": 5.2,
            "dg_S2": 5.2,
            "dg_S4": 5.5,
            "dg_best": 5.2,
            "dg_auto": 5.3,
        },
        rel_err={
            "baseline": 0.0,
            "floor_dg": 1e-3,
            "symm_mem": 2e-3,
            "dg_S2": 3e-3,
            "dg_S4": 4e-3,
            "dg_auto": 3e-3,
        },
        unavailable={},
        dg_best_steps=2,
        dg_default_steps=2,
        rejected_steps={},
        auto={"requested": "auto", "path": "overlap", "overlap_ms": 5.25, "collective_ms": 8.1},
    )
    rec.update(over)
    return rec


def test_derived_numbers():
    d = report.derived(_record())
    assert d["speedup_baseline"] == pytest.approx(1.0)
    assert d["speedup_symm_mem"] == pytest.approx(8.0 / 6.4)
    assert d["speedup_dg_best"] == pytest.approx(8.0 / 5.2)
    assert d["eff_dg_best"] == pytest.approx(5.0 / 5.2)
    assert d["eff_floor"] == pytest.approx(1.0)
    assert d["dg_best_vs_symm_mem"] == pytest.approx(6.4 / 5.2)
    assert d["eff_own_dg_best"] == pytest.approx(5.1 / 5.2)
    assert d["eff_own_dg_auto"] == pytest.approx(5.1 / 5.3)
    assert d["speedup_dg_auto"] == pytest.approx(8.0 / 5.3)
    assert "speedup_floor_dg" not in d and "eff_own_symm_mem" not in d
    assert d["bound_vs_symm_mem"] == pytest.approx(6.4 / 5.0)  # the faster floor counts


def test_targets_apply_to_big_models_at_large_m_only():
    t = report.targets(_record())  # 70B, M=8192: 6.4/5.2 = 1.23x < 1.3x; 5.1/5.2 = 0.98 >= 0.97
    assert t == {"vs_symm_mem": False, "eff_own": True, "auto_vs_baseline": True}
    fast = _record(ms=dict(_record()["ms"], dg_best=4.9, floor_dg=4.8))  # 6.4/4.9 = 1.31x
    assert report.targets(fast)["vs_symm_mem"] is True
    small = report.targets(_record(model="8B"))
    assert small["vs_symm_mem"] is None and small["eff_own"] is None
    assert small["auto_vs_baseline"] is True
    assert report.targets(_record(tokens=2048))["eff_own"] is None


def test_the_efficiency_target_follows_the_tp():
    # 5.1/5.4 = 0.944: short of TP=2's 0.97, above TP=4's and TP=8's 0.93; no target at TP=3
    ms = dict(_record()["ms"], dg_best=5.4)
    got = {tp: report.targets(_record(tp=tp, ms=ms))["eff_own"] for tp in (2, 3, 4, 8)}
    assert got == {2: False, 3: None, 4: True, 8: True}
    summary = report.target_summary([_record(tp=4, ms=ms)])
    assert "0.97 at TP=2, 0.93 at TP=4, 0.93 at TP=8" in summary


def test_auto_target_allows_two_percent_over_the_baseline():
    at = lambda auto: report.targets(_record(ms=dict(_record()["ms"], dg_auto=auto)))  # noqa: E731
    assert at(8.16)["auto_vs_baseline"] is True  # exactly 1.02x
    assert at(8.17)["auto_vs_baseline"] is False
    assert at(None)["auto_vs_baseline"] is None


def test_a_time_below_the_floor_is_suspect():
    # floors 5.0 (torch.mm) and 5.1 (own kernel): 1% below the faster one is 4.95
    assert report.suspect(_record()) == []
    assert report.suspect(_record(ms=dict(_record()["ms"], dg_auto=4.96))) == []
    rec = _record(ms=dict(_record()["ms"], dg_auto=4.9, baseline=4.0))
    assert report.suspect(rec) == ["baseline", "dg_auto"]
    assert report.suspect(_record(ms={"dg_auto": 1.0})) == []  # no floor measured: nothing to say


def test_a_suspect_time_fails_its_targets_and_is_marked():
    rec = _record(model="405B", ms=dict(_record()["ms"], dg_auto=4.5, dg_best=4.6))
    tg = report.targets(rec)
    # 4.5 ms would meet the 2% rule and 4.6 the efficiency target, but both are below the floor
    assert tg == {"vs_symm_mem": False, "eff_own": False, "auto_vs_baseline": False}
    row = report.table_row(rec)
    assert row[7].startswith("4.500!") and row[6].startswith("4.600!")
    assert report.csv_row(rec)["suspect"] == "dg_best dg_auto"
    assert "SUSPECT (below floor: dg_best, dg_auto)" in report.format_table([rec])
    assert "missed: 70B/FC1/M8192/TP2" in report.target_summary([rec])


def test_suspect_bars_are_hatched(tmp_path):
    pytest.importorskip("matplotlib")
    rec = _record(ms=dict(_record()["ms"], dg_auto=4.5))
    assert report.plot([rec, _record(case="70B/O/M8192/TP2")], str(tmp_path / "p.png")) is None
    assert (tmp_path / "p.png").stat().st_size > 0


def test_target_summary_counts_and_names_misses():
    recs = [
        _record(),
        _record(
            case="8B/O/M1024/TP2", model="8B", tokens=1024, ms=dict(_record()["ms"], dg_auto=9.0)
        ),
        _record(case="70B/O/M8192/TP2", status="skipped", ms={}),
    ]
    lines = report.target_summary(recs).splitlines()
    assert lines[0].startswith("target dg best >= 1.3x torch symm_mem") and lines[0].endswith(
        "0/1 met; missed: 70B/FC1/M8192/TP2"
    )
    assert lines[1] == (
        "  of these, 1 cannot reach it with any overlap: symm_mem / min(compute floors) < 1.3"
    )
    assert lines[2].endswith("1/1 met")
    assert lines[3].endswith("1/2 met; missed: 8B/O/M1024/TP2")


def test_derived_with_missing_variant():
    rec = _record()
    rec["ms"]["symm_mem"] = None
    d = report.derived(rec)
    assert d["speedup_symm_mem"] is None and d["dg_best_vs_symm_mem"] is None
    assert d["speedup_dg_best"] == pytest.approx(8.0 / 5.2)


def test_csv_from_record():
    rec = _record()
    skipped = _record(
        case="8B/QKV/M1024/TP3",
        status="skipped",
        reason="M=1024 is not divisible by TP=3",
        ms={},
        rel_err={},
    )
    rows = list(csv.DictReader(io.StringIO(report.to_csv([rec, skipped]))))
    assert list(rows[0].keys()) == report.CSV_FIELDS
    r = rows[0]
    assert r["case"] == "70B/FC1/M8192/TP2" and r["status"] == "ok"
    assert float(r["ms_baseline"]) == 8.0 and float(r["ms_dg_best"]) == 5.2
    assert float(r["ms_dg_S_tp"]) == 5.2 and float(r["ms_dg_S_2tp"]) == 5.5
    assert r["dg_best_steps"] == "2"
    assert float(r["speedup_dg_best"]) == pytest.approx(1.538, abs=1e-3)
    assert float(r["eff_dg_best"]) == pytest.approx(0.962, abs=1e-3)
    assert float(r["max_rel_err"]) == pytest.approx(4e-3)
    # 2*M*N*K / TP / time
    assert float(r["tflops_per_gpu_dg_best"]) == pytest.approx(
        2 * 8192 * 57344 * 8192 / 2 / 5.2e-3 / 1e12, abs=0.1
    )
    s = rows[1]
    assert s["status"] == "skipped" and "not divisible" in s["reason"]
    assert s["ms_floor"] == "" and s["speedup_dg_best"] == ""


def test_csv_notes_name_unavailable_and_rejected():
    rec = _record(
        unavailable={"symm_mem": "unavailable: RuntimeError: boom"},
        rejected_steps={"4": "N=12 is not divisible by S=4"},
    )
    rec["ms"]["symm_mem"] = None
    row = report.csv_row(rec)
    assert "symm_mem: unavailable: RuntimeError: boom" in row["notes"]
    assert "S4: N=12 is not divisible by S=4" in row["notes"]
    assert row["ms_symm_mem"] == "" and row["speedup_symm_mem"] == ""


def test_table_formatting():
    recs = [
        _record(),
        _record(
            case="70B/O/M8192/TP2", status="failed", reason="RuntimeError: x", ms={}, rel_err={}
        ),
    ]
    text = report.format_table(recs)
    lines = text.splitlines()
    assert lines[0].startswith("case")
    assert set(lines[1]) <= {"-", "+"}
    cells = [c.strip() for c in lines[2].split("|")]
    assert cells[:8] == [
        "70B/FC1/M8192/TP2",
        "5.000",
        "5.100",
        "8.000",
        "6.400",
        "5.200",
        "5.200 (2)",
        "5.300 (over)",
    ]
    assert cells[8:13] == ["1.25x", "1.54x", "1.23x", "1.51x", "0.981"]
    assert cells[13] == "4.0e-03"
    assert "70B/O/M8192/TP2" in lines[3] and "failed: RuntimeError: x" in lines[3]
    # columns line up: every measured line has its separators where the header has them
    assert [i for i, ch in enumerate(lines[0]) if ch == "|"] == [
        i for i, ch in enumerate(lines[2]) if ch == "|"
    ]


def test_table_marks_missing_variant_and_wrong():
    rec = _record(status="wrong", reason="rel. err >= 1e-2 vs baseline: symm_mem=5.00e-01")
    rec["ms"]["symm_mem"] = None
    line = report.format_table([rec]).splitlines()[2]
    cells = [c.strip() for c in line.split("|")]
    assert cells[4] == "-" and cells[8] == "-" and cells[10] == "-"
    assert line.endswith("WRONG")


def test_output_stem():
    assert report.output_stem(True, "2026-11-22") == "2026-11-22-llama-sweep-quick"
    assert report.output_stem(False, "2026-11-22") == "2026-11-22-llama-sweep"


def test_progress_bar_shows_every_case(capsys):
    pytest.importorskip("tqdm")
    cases = cases_mod.make_cases(2, quick=True)
    assert list(llama_sweep.progress(cases, enabled=True)) == cases
    err = capsys.readouterr().err
    assert f"{len(cases)}/{len(cases)}" in err and cases[-1].name in err


@pytest.mark.parametrize("tqdm_importable", [True, False])
def test_progress_without_bar_yields_the_cases_silently(capsys, monkeypatch, tqdm_importable):
    if not tqdm_importable:
        monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    cases = cases_mod.make_cases(2, quick=True)
    enabled = not tqdm_importable  # no tqdm: no bar even where asked for one
    assert list(llama_sweep.progress(cases, enabled=enabled)) == cases
    assert capsys.readouterr().err == ""


def test_outputs_and_replot_round_trip(tmp_path, capsys):
    recs = [
        _record(),
        _record(
            case="8B/O/M1024/TP2",
            model="8B",
            layer="O",
            tokens=1024,
            status="skipped",
            reason="why not",
            ms={},
            rel_err={},
        ),
    ]
    stem = str(tmp_path / "2026-11-22-llama-sweep")
    report.write_outputs(recs, stem, {"seconds": 1.0}, final=False)
    assert capsys.readouterr().out == ""  # partial write: files only
    with open(stem + ".json") as f:
        data = json.load(f)
    assert data["meta"]["complete"] is False
    assert data["records"][0]["targets"]["eff_own"] is True
    assert data["records"][0]["derived"]["eff_own_dg_best"] == pytest.approx(5.1 / 5.2)
    rows = list(csv.DictReader(open(stem + ".csv")))
    assert rows[0]["dg_auto_path"] == "overlap" and rows[0]["target_vs_symm_mem"] == "no"
    assert float(rows[0]["auto_collective_ms"]) == 8.1
    assert rows[1]["status"] == "skipped" and rows[1]["target_auto_vs_baseline"] == ""
    rc = report.replot([stem + ".json"], str(tmp_path / "re"))
    assert open(tmp_path / "re" / "2026-11-22-llama-sweep.csv").read() == report.to_csv(recs)
    out = capsys.readouterr().out
    assert "70B/FC1/M8192/TP2" in out and "SKIPPED" not in out and "target dg best" in out
    if rc == 0:
        with open(tmp_path / "re" / "2026-11-22-llama-sweep.png", "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    else:
        assert "matplotlib unavailable" in out


def test_plot_written_or_reason(tmp_path):
    path = str(tmp_path / "p.png")
    why = report.plot([_record(), _record(case="70B/O/M8192/TP2", status="skipped", ms={})], path)
    if why is None:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    else:
        assert "matplotlib unavailable" in why
    empty = report.plot([], path)
    assert empty == "no measured case" or "matplotlib unavailable" in empty


def test_replot_joins_split_runs(tmp_path, capsys):
    first, second = (
        [_record()],
        [_record(case="405B/O/M4096/TP2", model="405B", layer="O", tokens=4096)],
    )
    report.write_outputs(first, str(tmp_path / "a"), {"seconds": 1.0, "argv": ["a"]}, final=False)
    report.write_outputs(second, str(tmp_path / "b"), {"seconds": 2.0, "argv": ["b"]}, final=False)
    report.replot(
        [str(tmp_path / "a.json"), str(tmp_path / "b.json")], str(tmp_path / "re"), stem="joined"
    )
    data = json.loads((tmp_path / "re" / "joined.json").read_text())
    assert [r["case"] for r in data["records"]] == ["70B/FC1/M8192/TP2", "405B/O/M4096/TP2"]
    assert [m["argv"] for m in data["meta"]["parts"]] == [["a"], ["b"]]
    assert (tmp_path / "re" / "joined.csv").read_text() == report.to_csv(first + second)
    assert "405B/O/M4096/TP2" in capsys.readouterr().out


def test_replot_as_a_module(tmp_path, repo_root):
    """``python3 -m benchmarks.sweep.llama_sweep --replot`` from the repository root, as
    benchmarks/README.md runs it, finds its modules and redraws a stored sweep."""
    stem = str(tmp_path / "2026-11-22-llama-sweep")
    report.write_outputs([_record()], stem, {"seconds": 1.0}, final=False)
    cmd = [sys.executable, "-m", "benchmarks.sweep.llama_sweep"]
    args = ["--replot", stem + ".json", "--out", str(tmp_path / "re")]
    r = subprocess.run(cmd + args, cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1), r.stderr  # 1: no matplotlib for the PNG
    assert (tmp_path / "re" / "2026-11-22-llama-sweep.csv").read_text() == report.to_csv(
        [_record()]
    )
    assert "70B/FC1/M8192/TP2" in r.stdout


# Every entry point of benchmarks/README.md, run as there: a module from the repository root.
ENTRY_POINTS = (
    "sweep.llama_sweep",
    "sweep.timing_study",
    "sweep.fit_path_model",
    "sweep.compare_variants",
    "timeline.overlap_timeline",
    "kernel.kernel_vs_cublas",
    "kernel.compare_tiles",
    "fp8.fp8_sweep",
    "fp8.fp8_kernel_vs_scaled_mm",
    "serving.serving_step",
    "decode.decode_layers",
    "decode.fused_tp1",
    "training.training_step",
    "host.first_call",
)


def run_entry_point(repo_root, module: str, *args: str) -> subprocess.CompletedProcess:
    """``python3 -m benchmarks.<module> args...`` from the repository root, as its README says."""
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_entry_points_run_as_modules(repo_root, module):
    r = run_entry_point(repo_root, module, "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage:"), r.stderr


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_entry_points_refuse_bad_arguments_in_one_line(repo_root, module):
    """Bad arguments to a benchmark end as for distgemm's own tools (distgemm.cli): exit code 2
    and one line naming the tool and the problem, nothing on stdout; --help has the docstring."""
    r = run_entry_point(repo_root, module, "--no-such-option")
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"python3 -m benchmarks.{module}: error: ") and "--help" in line
    doc = run_entry_point(repo_root, module, "--help").stdout
    first_line = importlib.import_module(f"benchmarks.{module}").__doc__.splitlines()[0]
    assert first_line.replace("``", "`") in doc
