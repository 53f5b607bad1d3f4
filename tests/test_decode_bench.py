"""The decode benchmark without a GPU: benchmarks/decode/report.py's ratios, suspect and wrong
variants, issue 19's acceptance columns and summary, table, CSV, JSON round trip and plot from
synthetic records; and ``torchrun -m benchmarks.decode.decode_layers --cpu-smoke`` on 2 gloo
ranks, judged by the numbers each rank writes.

Tolerances: mm + the gloo all_reduce in bf16 against the fp32 product at the benchmark's ERR_TOL
(relative Frobenius error < 2e-2) and above 1e-4 (bf16 is not exact: 0 would mean nothing was
compared); distgemm's plans on the reference executor against float64 below 1e-9."""

import json
import math
import sys

import pytest
from test_serving_bench import _torchrun_smoke

from benchmarks.common import report as out
from benchmarks.decode import report as rep

META = {"torch": "2.11.0+cu128", "device": "NVIDIA H200", "installed_by": "README install"}
TP = 2


def _case(model="70B", layer="O", tokens=8, **us):
    """A measured case in µs per call: issue 19's numbers at 8 tokens (mm 18.9, NCCL 29.8,
    one_shot 27.9) and distgemm at 20.0; ``us`` overrides (None: unavailable)."""
    times = dict(mm=18.9, nccl=29.8, one_shot=27.9, distgemm=20.0)
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


def test_derived_and_verdicts():
    d = rep.derived(_case())
    assert d == {
        "vs_one_shot": pytest.approx(27.9 / 20.0),
        "vs_nccl": pytest.approx(29.8 / 20.0),
        "over_mm": pytest.approx(20.0 / 18.9),
    }
    assert rep.verdicts(_case()) == dict(vs_one_shot=True, vs_nccl=True, over_mm=True)
    # 27.9 / 25.5 = 1.094 < 1.1; 29.8 / 25.5 >= 1.0; 25.5 / 18.9 = 1.349 > 1.25
    assert rep.verdicts(_case(distgemm=25.5)) == dict(
        vs_one_shot=False, vs_nccl=True, over_mm=False
    )
    # over mm alone is judged at 1..32 tokens only
    assert rep.verdicts(_case(tokens=64, distgemm=25.5))["over_mm"] is None
    assert rep.verdicts(_case(distgemm=None)) == dict.fromkeys(rep.CRITERIA)
    assert rep.verdicts(_case(one_shot=None))["vs_one_shot"] is None


def test_suspect_and_wrong_fail_their_verdicts():
    # bound = 18.9 * 0.99 = 18.711: 18.7 is suspect, 18.8 is not
    assert rep.suspect(_case(distgemm=18.8)) == []
    rec = _case(distgemm=18.7)
    assert rep.suspect(rec) == ["distgemm"]
    assert rep.verdicts(rec) == dict.fromkeys(rep.CRITERIA, False)
    rec = _case()
    rec["rel_err"]["one_shot"] = math.nan
    assert rep.wrong(rec) == ["one_shot"]
    assert rep.verdicts(rec) == dict(vs_one_shot=False, vs_nccl=True, over_mm=True)
    assert rep.variant_status(rec, "one_shot") == "wrong"
    assert rep.suspect(_case(mm=None)) == []


def test_acceptance_scope_met_missed_and_unmeasured():
    records = [
        _case(model=m, layer=la, tokens=t)
        for m in ("70B", "405B")
        for la in rep.LAYERS
        for t in (1, 32, 256)
    ]
    out_of_scope = [_case(model="8B", distgemm=99.0), _case(tokens=512, distgemm=99.0)]
    acc = rep.acceptance(records + out_of_scope)
    assert acc["vs_one_shot"] == dict(met=True, measured=12, of=12, missed=[])
    assert acc["over_mm"] == dict(met=True, measured=8, of=8, missed=[])  # 1 and 32 tokens
    records[0] = _case(model="70B", layer="O", tokens=1, distgemm=None)
    assert rep.acceptance(records)["vs_nccl"] == dict(met=None, measured=11, of=12, missed=[])
    records[1] = _case(model="70B", layer="O", tokens=32, distgemm=30.0)
    acc = rep.acceptance(records)
    assert acc["vs_nccl"] == dict(met=False, measured=11, of=12, missed=["70B/O/M32/TP2"])
    assert acc["over_mm"]["missed"] == ["70B/O/M32/TP2"]


def test_csv_round_trip():
    records = [_case(tokens=1, distgemm=None), _case(model="8B", tokens=512)]
    rows = out.read_csv(out.csv_text(rep.CSV_FIELDS, rep.csv_rows(records, META)))
    assert [(r["model"], r["tokens"]) for r in rows] == [("70B", "1"), ("8B", "512")]
    first, second = rows
    assert first["status_distgemm"] == "unavailable" and first["us_distgemm"] == ""
    assert first["note"] == "distgemm: ValueError: M=1 is not divisible by S=2"
    assert first["verdict_vs_nccl"] == "" and first["in_scope"] == "yes"
    assert float(second["us_one_shot"]) == 27.9 and second["in_scope"] == ""
    assert float(second["vs_one_shot"]) == pytest.approx(1.395, abs=1e-3)
    assert second["verdict_vs_one_shot"] == "met" and second["verdict_over_mm"] == ""
    assert {(r["torch"], r["device"], r["installed_by"]) for r in rows} == {tuple(META.values())}


def test_table_shows_verdicts_reasons_and_summary():
    records = [
        _case(tokens=1, distgemm=None),
        _case(tokens=2),
        _case(tokens=4, distgemm=25.5),
        _case(tokens=8, distgemm=18.0),
    ]
    table = rep.format_table(records, META)
    for text in (
        *META.values(),
        "CUDA graph of 20 calls",
        "1.395x met",  # 27.9 / 20.0 at 2 tokens
        "1.094x MISSED",  # 27.9 / 25.5 at 4 tokens
        "18.00!",  # below mm alone (18.9)
        "70B/O distgemm (tokens 1): ValueError: M=1 is not divisible by S=2",
        "distgemm >= 1.1x mm + one_shot: MISSED (3 of 4 cases measured; missed: 70B/O/M4/TP2, "
        "70B/O/M8/TP2)",
    ):
        assert text in table, text


def test_outputs_without_matplotlib_and_replot(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    stem = str(tmp_path / "run" / out.output_stem("decode", TP, date="2026-11-24"))
    records = [_case(tokens=t) for t in (1, 2)]
    assert rep.write_outputs(records, META, stem).startswith("matplotlib unavailable")
    doc = json.loads(open(stem + ".json").read())
    assert doc["records"] == records and doc["acceptance"]["vs_nccl"]["met"] is True
    assert rep.replot(stem + ".json", str(tmp_path / "again")) == 1
    again = str(tmp_path / "again" / "2026-11-24-decode-tp2")
    for suffix in (".csv", ".txt"):
        assert open(again + suffix).read() == open(stem + suffix).read()


def test_plot_written_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.png"
    records = [
        _case(model=m, layer=la, tokens=t)
        for m in ("70B", "405B")
        for la in rep.LAYERS
        for t in (1, 8, 64)
    ]
    assert rep.plot(records, META, str(path)) is None
    assert path.stat().st_size > 1000
    assert (
        rep.plot([_case(mm=None, nccl=None, one_shot=None, distgemm=None)], META, str(path))
        == "no variant timed"
    )


def test_runner_pieces_on_cpu():
    torch = pytest.importorskip("torch")
    from benchmarks.decode import decode_layers

    assert decode_layers.split_reason(8192, 28672, 2) is None
    assert (
        decode_layers.split_reason(64, 40, 2)
        == "K=40 does not split over tp=2 into multiples of 8 elements"
    )
    a0, w0 = decode_layers.full_layer(64, 128, 4, "cpu")
    a1, w1 = decode_layers.full_layer(64, 128, 4, "cpu")
    assert torch.equal(a0, a1) and torch.equal(w0, w1)  # the same on every rank
    assert float(w0.float().std()) == pytest.approx(128**-0.5, rel=0.1)
    ops = decode_layers.layer_operands(64, 128, 2, 1, 4, "cpu")
    assert torch.equal(ops.w, w0[:, 64:]) and torch.equal(ops.a, a0[:, 64:])
    decode_layers.one_call("mm", ops, 3, None, "")()
    assert torch.equal(ops.outs["mm"][:3], torch.mm(a0[:3, 64:], w0[:, 64:].t()))
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        decode_layers.one_call("nope", ops, 3, None, "")
    with pytest.raises(SystemExit):
        decode_layers.main(["--tokens", "0,1"])
    with pytest.raises(SystemExit):
        decode_layers.main(["--models", "7B"])


def test_cpu_smoke_under_torchrun(repo_root, tmp_path):
    pytest.importorskip("torch")
    from benchmarks.decode import decode_layers

    cases = {f"{la} M{t}" for la in decode_layers.SMOKE_DIMS for t in decode_layers.SMOKE_TOKENS}
    for res in _torchrun_smoke(repo_root, tmp_path, "benchmarks.decode.decode_layers", "decode"):
        assert decode_layers.smoke_failures(res) == []
        assert set(res["rel_err"]) == set(res["mm_finite"]) == set(res["plans"]) == cases
        assert all(1e-4 < e < rep.ERR_TOL for e in res["rel_err"].values())
        assert all(res["mm_finite"].values())
        for case, e in res["plans"].items():  # exact, or rejected with the constraint named
            tokens = int(case.split("M")[1])
            assert (isinstance(e, str) and f"M={tokens}" in e) or e < decode_layers.PLAN_TOL, case
        assert all(isinstance(res["plans"][f"{la} M8"], float) for la in decode_layers.SMOKE_DIMS)
