"""The decode benchmark without a GPU: the best unfused variant and the ratios against it, issue
42's acceptance (median, minimum, distgemm over torch.mm alone) and its lines, suspect and wrong
variants, table, CSV, JSON round trip, merged replots and plot from synthetic records; the case
list with its non-Llama layers; refused arguments (exit 2, one line); and
``torchrun -m benchmarks.decode.decode_layers --cpu-smoke`` on 2 gloo ranks, judged by the
numbers each rank writes.

Tolerances: mm + the gloo all_reduce in bf16 against the fp32 product at the benchmark's ERR_TOL
(relative Frobenius error < 2e-2) and above 1e-4 (bf16 is not exact: 0 would mean nothing was
compared); distgemm's plans on the reference executor against float64 below 1e-9."""

import functools
import json
import math
import subprocess
import sys

import pytest
from test_serving_bench import _torchrun_smoke

from benchmarks.common import best_unfused as bu
from benchmarks.common import report as out
from benchmarks.decode import cases
from benchmarks.decode import report as rep

META = {"torch": "2.11.0+cu128", "device": "NVIDIA H200", "installed_by": "README install"}
TP = 2
SCOPE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _case(model="70B", layer="O", tokens=8, **us):
    """A measured case in µs per call: mm 18.9, the unfused baselines NCCL 29.8, one-shot
    27.9, two-shot 26.0 (the best) and NCCL symmetric 28.5, distgemm 20.0; ``us`` overrides
    (None: unavailable)."""
    times = dict(mm=18.9, nccl=29.8, one_shot=27.9, two_shot=26.0, nccl_symm=28.5, distgemm=20.0)
    times.update(us)
    unavailable = {
        v: "ValueError: M=1 is not divisible by S=2" for v, t in times.items() if t is None
    }
    times = {v: t for v, t in times.items() if t is not None}
    errs = {v: (0.0 if v in ("mm", "nccl") else 3e-3) for v in times}
    return dict(
        model=model,
        layer=layer,
        tokens=tokens,
        m=tokens,
        n=8192,
        k=8192,
        tp=TP,
        us=times,
        rel_err=errs,
        unavailable=unavailable,
    )


def _scope(**us_by_model):
    """Every in-scope case (Llama 8B/70B/405B, O and FC2, 1..256 tokens): distgemm's time per
    model from ``us_by_model`` (default 20.0)."""
    return [
        _case(model=m, layer=la, tokens=t, distgemm=us_by_model.get(f"m{m}", 20.0))
        for m in ("8B", "70B", "405B")
        for la in ("O", "FC2")
        for t in SCOPE_TOKENS
    ]


def test_best_unfused_and_the_ratios_against_it():
    d = rep.derived(_case())
    assert d == {
        "best_unfused": "two_shot",
        "best_us": 26.0,
        "vs_best": pytest.approx(26.0 / 20.0),
        "fused_vs_best": None,  # distgemm_fused not timed
        "fused_two_shot_vs_best": None,  # distgemm_fused_two_shot not timed
        "over_mm": pytest.approx(20.0 / 18.9),
    }
    assert rep.derived(_case(distgemm_fused=13.0))["fused_vs_best"] == pytest.approx(2.0)
    two = rep.derived(_case(distgemm_fused=13.0, distgemm_fused_two_shot=10.4))
    assert two["fused_two_shot_vs_best"] == pytest.approx(2.5)
    assert rep.best(_case(two_shot=None)) == ("one_shot", 27.9)
    rec = _case()
    rec["rel_err"]["two_shot"] = math.nan  # a wrong baseline is never the best
    assert rep.best(rec) == ("one_shot", 27.9)
    # below mm alone (18.9 * 0.99 = 18.711): suspect, not the best
    assert rep.best(_case(nccl_symm=18.0)) == ("two_shot", 26.0)
    none = _case(nccl=None, one_shot=None, two_shot=None, nccl_symm=None)
    assert rep.best(none) == (None, None) and rep.derived(none)["vs_best"] is None


def test_forced_all_reduce_variants_are_every_algorithm_of_ours():
    """--own-all-reduce times each of our all-reduce algorithms once, and each has its column."""
    from distgemm import _core

    assert sorted(rep.OWN_ALL_REDUCE.values()) == sorted(_core.ALLREDUCE_ALGORITHMS)
    for variant, algorithm in rep.OWN_ALL_REDUCE.items():
        assert variant == f"dg_{algorithm}"
        assert variant in rep.VARIANTS and variant in rep.HEADERS and variant in rep.DESCRIPTION


def test_own_all_reduce_option_takes_every_algorithm_or_the_ones_named(monkeypatch):
    """--own-all-reduce alone forces every algorithm of ours; with a list, those; an unknown name
    exits 2 with the valid ones."""
    from benchmarks.decode import decode_layers

    seen = {}
    monkeypatch.setattr(decode_layers, "run", lambda args: seen.update(own=args.own_all_reduce))
    decode_layers.main(["--own-all-reduce"])
    assert sorted(seen.pop("own")) == sorted(rep.OWN_ALL_REDUCE.values())
    decode_layers.main(["--own-all-reduce", "two_shot_pull,one_shot"])
    assert seen.pop("own") == ["two_shot_pull", "one_shot"]
    decode_layers.main([])
    assert seen.pop("own") == ()
    with pytest.raises(SystemExit) as e:
        decode_layers.main(["--own-all-reduce", "three_shot"])
    assert e.value.code == 2


def test_weight_copies_span_the_l2_cache():
    """A decode graph's calls (the benchmark's and the calibration's) cycle through enough copies
    of a weight to span COLD_L2_SPAN L2 caches (one per call at most; one where L2 is unknown)."""
    from distgemm import calibrate as cal

    l2 = 50 * 2**20
    assert cal.weight_copies(33 * 2**20, l2) == 4  # 70B O at TP=4: 4 x 33 MB >= 100 MB
    assert cal.weight_copies(200 * 2**20, l2) == 1
    assert cal.weight_copies(1 * 2**20, l2) == cal.GRAPH_CALLS
    assert cal.weight_copies(33 * 2**20, 0) == 1
    for size in (2**20, 7 * 2**20, 49 * 2**20, 99 * 2**20, 101 * 2**20):
        c = cal.weight_copies(size, l2)
        assert c == cal.GRAPH_CALLS == rep.CALLS_PER_GRAPH or c * size >= cal.COLD_L2_SPAN * l2
        assert c == 1 or (c - 1) * size < cal.COLD_L2_SPAN * l2


def test_forced_fused_variants_are_every_fused_path_and_auto_names_its_tail():
    """decode_layers times gemm_all_reduce forced onto each fused path, each with its column,
    and labels an auto choice of the two-shot tail by the path that forces it."""
    from distgemm.runtime import machine

    assert sorted(rep.FUSED_PATH_VARIANTS.values()) == sorted(machine.FUSED_PATHS)
    for variant, path in rep.FUSED_PATH_VARIANTS.items():
        assert variant == f"distgemm_{path}" and variant in rep.FUSED
        assert variant in rep.VARIANTS and variant in rep.HEADERS and variant in rep.DESCRIPTION
        assert f"us_{variant}" in rep.CSV_FIELDS
    rec = _case(tokens=128, distgemm_fused=24.0, distgemm_fused_two_shot=22.0)
    rec["auto"] = {"path": "fused", "fused_tail": "two_shot", "all_reduce": "nccl"}
    assert rep.auto_label(rec) == "fused_two_shot"
    rec["auto"]["fused_tail"] = "one_shot"
    assert rep.auto_label(rec) == "fused"
    row = rep.csv_rows([rec], META)[0]
    assert row["us_distgemm_fused_two_shot"] == "22.00" and row["fused_two_shot_vs_best"]
    assert "distgemm fused 2shot" in rep.format_table([rec], META)


def test_suspect_and_wrong():
    assert rep.suspect(_case(distgemm=18.8)) == []
    rec = _case(distgemm=18.7)
    assert rep.suspect(rec) == ["distgemm"]
    assert rep.point(rec).bad == "distgemm below mm alone"
    rec = _case()
    rec["rel_err"]["distgemm"] = 0.05
    assert rep.wrong(rec) == ["distgemm"] and rep.variant_status(rec, "distgemm") == "wrong"
    assert rep.point(rec).bad == "distgemm wrong"
    assert rep.suspect(_case(mm=None)) == []


def test_acceptance_met():
    acc = rep.acceptance(_scope() + [_case(model="Qwen2-72B", layer="FC2", distgemm=99.0)])
    assert acc["points"] == acc["measured"] == 54  # the Qwen layer is reported, not judged
    assert acc["median"] == pytest.approx(1.3) and acc["median_met"] is True
    assert acc["min"] == pytest.approx(1.3) and acc["min_met"] is True
    assert acc["over_mm"] == pytest.approx(20.0 / 18.9) and acc["over_mm_met"] is True
    assert (acc["over_mm_measured"], acc["over_mm_of"]) == (16, 16)  # 70B, 405B x 2 x 1..8


def test_acceptance_median_minimum_and_over_mm_missed():
    # 8B at 26/27 = 0.963, 70B at 26/25 = 1.04, 405B at 1.3: the median is 1.04
    acc = rep.acceptance(_scope(m8B=27.0, m70B=25.0))
    assert acc["median"] == pytest.approx(1.04) and acc["median_met"] is False
    assert acc["min"] == pytest.approx(26 / 27) and acc["min_met"] is False
    assert len(acc["below_min"]) == 18 and all(n.startswith("8B/") for n in acc["below_min"])
    # 70B at 1..8 tokens: 25 / 18.9 = 1.323 > 1.2; 405B: 1.058
    assert acc["over_mm"] == pytest.approx(25.0 / 18.9) and acc["over_mm_met"] is False
    assert sorted(acc["over_mm_missed"]) == sorted(
        f"70B/{la}/M{t}/TP2" for la in ("O", "FC2") for t in (1, 2, 4, 8)
    )
    # one point a little slow: the minimum misses, the median does not
    records = _scope()
    records[0] = _case(model="8B", layer="O", tokens=1, distgemm=26.6)  # 26 / 26.6 = 0.977
    acc = rep.acceptance(records)
    assert (acc["median_met"], acc["min_met"], acc["min_at"]) == (True, False, "8B/O/M1/TP2")


def test_acceptance_unmeasured_and_bad_points():
    records = _scope()
    records[5] = _case(model="8B", layer="O", tokens=32, distgemm=None)
    acc = rep.acceptance(records)
    assert (acc["measured"], acc["points"], acc["unmeasured"]) == (53, 54, ["8B/O/M32/TP2"])
    assert acc["median_met"] is None and acc["min_met"] is None  # not every point measured
    records[5] = _case(model="8B", layer="O", tokens=32, distgemm=18.0)  # below mm alone
    acc = rep.acceptance(records)
    assert acc["bad"] == ["8B/O/M32/TP2"] and acc["median_met"] is False
    assert acc["min_met"] is False
    assert rep.acceptance([])["median_met"] is None


def test_acceptance_counts_the_scope_a_run_did_not_reach():
    # a run over 70B and 405B only (the decode part's default models): 8B's 18 points are not
    # measured, so neither the median nor the minimum is judged on the other 36
    records = [r for r in _scope() if r["model"] != "8B"]
    acc = rep.acceptance(records)
    assert (acc["measured"], acc["points"]) == (36, 54)
    assert len(acc["unmeasured"]) == 18 and all(n.startswith("8B/") for n in acc["unmeasured"])
    assert acc["unmeasured"][0] == "8B/O/M1/TP2"
    assert acc["median"] == pytest.approx(1.3) and acc["median_met"] is None
    assert acc["min_met"] is None
    assert acc["over_mm_met"] is True  # 70B and 405B at 1..8 tokens: all there
    lines = bu.acceptance_lines(acc, TP, rep.SCOPE_TEXT)
    assert lines[1].startswith(
        "  median of distgemm vs best unfused: 1.300x over 36 of 54 points (target >= 1.1): n/a; "
        "not measured: 8B/O/M1/TP2, "
    )
    # a point below the minimum misses it whatever was not run
    records[0] = _case(model="70B", layer="O", tokens=1, distgemm=27.0)
    assert rep.acceptance(records)["min_met"] is False
    # 405B's 1..8 tokens not run: the over-mm criterion is not judged either
    records = [r for r in _scope() if not (r["model"] == "405B" and r["tokens"] <= 8)]
    acc = rep.acceptance(records)
    assert (acc["over_mm_measured"], acc["over_mm_of"], acc["over_mm_met"]) == (8, 16, None)


def test_acceptance_lines():
    lines = bu.acceptance_lines(rep.acceptance(_scope(m8B=27.0)), TP, rep.SCOPE_TEXT)
    assert lines[0] == (
        "acceptance (issue 42, tp=2; 8B, 70B, 405B O and FC2, tokens 1..256; ratio = best "
        "unfused time / distgemm time, above 1 = distgemm faster):"
    )
    assert lines[1] == (
        "  median of distgemm vs best unfused: 1.300x over 54 of 54 points (target >= 1.1): met"
    )
    assert lines[2].startswith(
        "  minimum: 0.963x at 8B/O/M1/TP2 (target >= 0.98): MISSED; below it: 8B/O/M1/TP2, "
    ) and lines[2].endswith(" and 12 more")
    assert lines[3] == (
        "  distgemm / torch.mm alone at 1..8 tokens on 70B, 405B: worst 1.058x at "
        "70B/O/M1/TP2 (target <= 1.2x): met (16 of 16 measured)"
    )


def test_csv_round_trip():
    records = [_case(tokens=1, distgemm=None), _case(model="Qwen2-72B", layer="FC2", tokens=64)]
    rows = out.read_csv(out.csv_text(rep.CSV_FIELDS, rep.csv_rows(records, META)))
    assert [(r["model"], r["tokens"]) for r in rows] == [("70B", "1"), ("Qwen2-72B", "64")]
    first, second = rows
    assert first["status_distgemm"] == "unavailable" and first["us_distgemm"] == ""
    assert first["note"] == "distgemm: ValueError: M=1 is not divisible by S=2"
    assert first["vs_best"] == "" and first["in_scope"] == "yes"
    assert (second["best_unfused"], float(second["us_best_unfused"])) == ("two_shot", 26.0)
    assert float(second["vs_best"]) == pytest.approx(1.3) and second["in_scope"] == ""
    assert float(second["us_two_shot"]) == 26.0 and second["status_nccl_symm"] == "ok"
    assert {(r["torch"], r["device"], r["installed_by"]) for r in rows} == {tuple(META.values())}


def test_table_shows_best_unfused_ratios_reasons_and_acceptance():
    why = "NCCL symmetric window: NCCL 2.26.2 has no symmetric-memory kernels"
    records = [_case(tokens=1, distgemm=None), _case(tokens=2), _case(tokens=8, distgemm=18.0)]
    for r in records:
        del r["us"]["nccl_symm"]
        r["unavailable"]["nccl_symm"] = why
    table = rep.format_table(records, META)
    for text in (
        *META.values(),
        "CUDA graph of 20 calls",
        "ratios = best unfused time / variant time (above 1 = faster than the best unfused path)",
        "mm+two_shot",
        "1.300x",  # 26.0 / 20.0 at 2 tokens
        "18.00!",  # below mm alone (18.9)
        "70B/O distgemm (tokens 1): ValueError: M=1 is not divisible by S=2",
        f"70B/O nccl_symm (tokens 1, 2, 8): {why}",
        "acceptance (issue 42, tp=2;",
        "median of distgemm vs best unfused: 1.300x over 1 of 54 points",
    ):
        assert text in table, text


def test_outputs_without_matplotlib_replot_and_merge(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    stems = [
        str(tmp_path / f"run{i}" / out.output_stem("decode", TP, date="2026-11-27")) for i in (0, 1)
    ]
    first = [_case(tokens=t) for t in (1, 2)]
    second = [_case(tokens=2, distgemm=13.0), _case(model="405B", tokens=1)]
    for stem, records in zip(stems, (first, second)):
        meta = dict(META, tp=TP, argv=[stem])
        assert rep.write_outputs(records, meta, stem).startswith("matplotlib unavailable")
    doc = json.loads(open(stems[0] + ".json").read())
    assert doc["records"] == first and doc["acceptance"]["median"] == pytest.approx(1.3)
    assert rep.replot([stems[0] + ".json"], str(tmp_path / "again")) == 1
    again = str(tmp_path / "again" / "2026-11-27-decode-tp2")
    for suffix in (".csv", ".txt"):
        assert open(again + suffix).read() == open(stems[0] + suffix).read()
    # two runs of one TP: one report, the later run's case replacing the earlier one's
    rep.replot([s + ".json" for s in stems], str(tmp_path / "merged"))
    merged = json.loads((tmp_path / "merged" / "2026-11-27-decode-tp2.json").read_text())
    assert [(r["model"], r["tokens"], r["us"]["distgemm"]) for r in merged["records"]] == [
        ("70B", 1, 20.0),
        ("70B", 2, 13.0),
        ("405B", 1, 20.0),
    ]
    assert [r["argv"] for r in merged["meta"]["merged_runs"]] == [[s] for s in stems]
    with pytest.raises(ValueError, match=r"the runs are at different TPs \(2, 4\)"):
        rep.merge([dict(meta=dict(tp=2), records=[]), dict(meta=dict(tp=4), records=[])])


def test_a_run_cut_short_leaves_its_finished_layers_for_replot(tmp_path, monkeypatch):
    from benchmarks.decode import decode_layers

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    stem = str(tmp_path / "run" / out.output_stem("decode", TP, date="2026-11-28"))
    first = [_case(tokens=t) for t in (1, 2)]
    decode_layers.write_partial(stem, first, dict(META, tp=TP))
    both = first + [_case(model="405B", tokens=1)]
    decode_layers.write_partial(stem, both, dict(META, tp=TP))  # the next layer: rewritten
    partial = stem + decode_layers.PARTIAL_SUFFIX
    doc = json.loads(open(partial).read())
    assert doc["records"] == both and doc["meta"]["partial"] is True
    assert rep.replot([partial], str(tmp_path / "again")) == 1  # no matplotlib: no PNG
    table = (tmp_path / "again" / "2026-11-28-decode-tp2.partial.txt").read_text()
    assert "\n405B  | O " in table and "acceptance (issue 42, tp=2;" in table


def test_plot_written_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.png"
    records = [
        _case(model=m, layer=la, tokens=t)
        for m in ("70B", "405B", "Qwen2-72B")
        for la in cases.LAYERS
        for t in (1, 8, 64)
    ]
    assert rep.plot(records, META, str(path)) is None
    assert path.stat().st_size > 1000
    empty = _case(mm=None, nccl=None, one_shot=None, two_shot=None, nccl_symm=None, distgemm=None)
    assert rep.plot([empty], META, str(path)) == "no variant timed"


def test_case_list_with_non_llama_layers():
    layers = cases.layer_list()
    assert [(la.model, la.layer, la.n, la.k) for la in layers] == [
        ("8B", "O", 4096, 4096),
        ("8B", "FC2", 4096, 14336),
        ("70B", "O", 8192, 8192),
        ("70B", "FC2", 8192, 28672),
        ("405B", "O", 16384, 16384),
        ("405B", "FC2", 16384, 53248),
        ("Qwen2-72B", "FC2", 8192, 29568),
        ("Mixtral-8x22B", "O", 6144, 6144),
    ]
    llama = {(la.n, la.k) for la in layers[:6]}
    assert all((la.n, la.k) not in llama for la in layers[6:])  # shapes Llama does not have
    for la in layers:
        assert all(cases.split_reason(la.n, la.k, tp) is None for tp in (2, 4, 8)), la
    assert (
        cases.split_reason(64, 40, 2)
        == "K=40 does not split over tp=2 into multiples of 8 elements"
    )
    assert cases.TOKENS == SCOPE_TOKENS
    # an extra layer already in the grid is not run twice; --extra none
    grid = cases.layer_list(["Mistral-Nemo-12B"], ["O"], ["Mistral-Nemo-12B/O", "Qwen2-72B/O"])
    assert [(la.model, la.layer, la.n, la.k) for la in grid] == [
        ("Mistral-Nemo-12B", "O", 5120, 4096),
        ("Qwen2-72B", "O", 8192, 8192),
    ]
    assert len(cases.layer_list(extra=[])) == 6
    with pytest.raises(ValueError, match=r"unknown 'QKV': models 8B, 70B, 405B, Qwen2-72B"):
        cases.layer_list(layers=["QKV"])
    assert cases.in_scope("405B", "FC2", 256) and not cases.in_scope("405B", "FC2", 512)
    assert not cases.in_scope("Qwen2-72B", "FC2", 8)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--models", "7B"], "argument --models: '7B': give some of 8B, 70B, 405B, Qwen2-72B"),
        (["--layers", "QKV"], "argument --layers: 'QKV': give some of O, FC2"),
        (["--extra", "Qwen2-72B/QKV"], "argument --extra: 'Qwen2-72B/QKV': give some of "),
        (["--tokens", "0,1"], "argument --tokens: token counts must be positive integers"),
        (["--tokens", ""], "--tokens: give at least one token count"),
    ],
)
def test_refused_arguments_exit_2_with_one_line(repo_root, argv, message):
    cmd = [sys.executable, "-m", "benchmarks.decode.decode_layers", *argv]
    r = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("python3 -m benchmarks.decode.decode_layers: error: "), line
    assert message in line and line.endswith("(see --help)") and r.stdout == ""


def test_runner_pieces_on_cpu():
    torch = pytest.importorskip("torch")
    from benchmarks.decode import decode_layers

    a0, w0 = decode_layers.full_layer(64, 128, 4, "cpu")
    a1, w1 = decode_layers.full_layer(64, 128, 4, "cpu")
    assert torch.equal(a0, a1) and torch.equal(w0, w1)  # the same on every rank
    assert float(w0.float().std()) == pytest.approx(128**-0.5, rel=0.1)
    ops = decode_layers.layer_operands(64, 128, 2, 1, 4, "cpu")
    assert torch.equal(ops.w, w0[:, 64:]) and torch.equal(ops.a, a0[:, 64:])
    decode_layers.one_call("mm", ops, 3, None, "")()
    assert torch.equal(ops.outs["mm"][:3], torch.mm(a0[:3, 64:], w0[:, 64:].t()))
    # the in-place baselines' outputs are views of their symmetric buffers
    flat = torch.zeros(4 * 64 + 8, dtype=torch.bfloat16)
    base = decode_layers.Baselines(two_shot=flat)
    ops = decode_layers.layer_operands(64, 128, 2, 1, 4, "cpu", base)
    assert ops.outs["two_shot"].data_ptr() == flat.data_ptr()
    assert ops.outs["two_shot"].shape == (4, 64) and ops.outs["two_shot"].is_contiguous()
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        decode_layers.one_call("nope", ops, 3, None, "")


def test_weight_copies_are_distinct_tensors_of_one_value(monkeypatch):
    torch = pytest.importorskip("torch")
    from benchmarks.decode import decode_layers

    monkeypatch.setattr(decode_layers, "l2_bytes", lambda device: 64 * 64 * 2)  # one shard
    ops = decode_layers.layer_operands(64, 128, 2, 1, 4, "cpu")
    from distgemm.calibrate import COLD_L2_SPAN

    assert len(ops.weights) == COLD_L2_SPAN
    assert len({w.data_ptr() for w in ops.weights}) == len(ops.weights)
    assert all(torch.equal(w, ops.w) for w in ops.weights)
    decode_layers.one_call("mm", ops, 3, None, "", copy=1)()
    assert torch.equal(ops.outs["mm"][:3], torch.mm(ops.a[:3], ops.weights[1].t()))


def test_cpu_smoke_under_torchrun(repo_root, tmp_path):
    pytest.importorskip("torch")
    from benchmarks.decode import decode_layers

    smoke = {f"{la} M{t}" for la in decode_layers.SMOKE_DIMS for t in decode_layers.SMOKE_TOKENS}
    for res in _torchrun_smoke(repo_root, tmp_path, "benchmarks.decode.decode_layers", "decode"):
        assert decode_layers.smoke_failures(res) == []
        assert set(res["rel_err"]) == set(res["mm_finite"]) == set(res["plans"]) == smoke
        assert all(1e-4 < e < rep.ERR_TOL for e in res["rel_err"].values())
        assert all(res["mm_finite"].values())
        for case, e in res["plans"].items():  # exact, or rejected with the constraint named
            tokens = int(case.split("M")[1])
            assert (isinstance(e, str) and f"M={tokens}" in e) or e < decode_layers.PLAN_TOL, case
        assert all(isinstance(res["plans"][f"{la} M8"], float) for la in decode_layers.SMOKE_DIMS)


def test_fit_reduce_reads_both_fused_paths_from_a_decode_csv(tmp_path):
    """benchmarks/decode/fit_reduce.py on a decode CSV priced by the model: the forced two-shot
    column becomes two-shot runs, and the fit prices the two-shot tail again."""
    from test_reduce_cost import RESIDENT_CTAS, reduce_constants

    from benchmarks.decode import fit_reduce
    from distgemm.runtime import calibration_fit, machine, reduce_cost

    rc = reduce_constants()
    records = []
    for n, k in ((8192, 8192), (16384, 26624), (5120, 13824), (8192, 28672)):  # global k
        for t in (1, 8, 32, 64, 128, 256):
            kr = k // TP
            mm = reduce_cost.mm_ms(rc, t, n, kr)
            nccl = mm + reduce_cost.all_reduce_ms(rc, "nccl", t * n * 2)
            us = {"mm": mm * 1e3, "nccl": nccl * 1e3}
            for variant, path in rep.FUSED_PATH_VARIANTS.items():
                tail = machine.FUSED_PATHS[path]
                if machine.fused_constants_key(t, tail) in rc.fused:
                    us[variant] = reduce_cost.fused_ms(rc, t, n, kr, TP, tail) * 1e3
            records.append(dict(model="70B", layer="O", tokens=t, m=t, n=n, k=k, tp=TP, us=us,
                                rel_err={}, unavailable={}))  # fmt: skip
    path = tmp_path / "decode.csv"
    path.write_text(out.csv_text(rep.CSV_FIELDS, rep.csv_rows(records, META)))
    runs = fit_reduce.decode_runs(fit_reduce.cases(path))
    tails = [r["tail"] for r in runs if r["kind"] == "fused"]
    assert tails.count("two_shot") == 4 * 3 and tails.count("one_shot") == 4 * 6
    # NCCL's runs are timed after torch.mm at the case's shape, as the calibration stores them
    nccl = [r for r in runs if r["kind"] == "all_reduce"]
    assert len(nccl) == 4 * 6 and all(r["algorithm"] == "nccl" for r in nccl)
    for r in nccl:
        mm = reduce_cost.mm_ms(rc, r["m"], r["n"], r["k"])
        assert r["after_mm_ms"] == pytest.approx(mm + r["ms"], rel=1e-2)
        assert r["ms"] == pytest.approx(reduce_cost.all_reduce_ms(rc, "nccl", r["bytes"]), rel=1e-2)
    # a decode CSV records no partials: the machine's slots stand for the kernels' resident CTAs
    got = calibration_fit.fit_reduce(runs, TP, slots=RESIDENT_CTAS)
    assert set(got.fused) == set(machine.FUSED_KERNELS)
    # the CSV keeps 2 decimals of a us: the fit gives the times back to that
    for t in (64, 256):
        want = reduce_cost.fused_ms(rc, t, 8192, 4096, TP, "two_shot")
        assert reduce_cost.fused_ms(got, t, 8192, 4096, TP, "two_shot") == pytest.approx(
            want, rel=2e-2
        )


def test_fused_tp1_shapes_and_weight_copies():
    """fused_tp1's ``--shapes`` parse NxK; its graphs' calls cycle through the weight copies
    (``timing.round_robin``)."""
    from benchmarks.common.timing import round_robin
    from benchmarks.decode import fused_tp1

    assert fused_tp1.parse_shape("4096x7168") == (4096, 7168)
    assert fused_tp1.parse_shape("4096X64") == (4096, 64)
    for bad in ("4096", "4096x", "0x64", "ax3", "1x2x3", "-4x8"):
        assert fused_tp1.parse_shape(bad) is None, bad
    seen = []
    call = round_robin([functools.partial(seen.append, i) for i in range(3)])
    for _ in range(7):
        call()
    assert seen == [0, 1, 2, 0, 1, 2, 0]


@pytest.mark.parametrize(
    "args,message",
    [
        (("--shapes", "4096x"), "--shapes: a shape is NxK with positive N and K, not '4096x'"),
        (("--layers", "70B-QKV"), "--layers: '70B-QKV' is not one of 70B-O, 70B-FC2"),
        (("--weight-copies", "many"), "--weight-copies must be auto or a count of at least 1"),
        (("--weight-copies", "0"), "a count of at least 1, not '0'"),
    ],
)
def test_fused_tp1_refuses_with_one_line(args, message):
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.decode.fused_tp1", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert message in line, line
