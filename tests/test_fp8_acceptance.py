"""benchmarks.fp8.fp8_acceptance on the CPU: the parts of a run merged, the verdict's limits, the
written files and the exit status."""

import json

from benchmarks.fp8 import fp8_acceptance as acc


def _rec(m, ours, base, tp=2, status="ok", local=True):
    src = dict(model="70B", layer="O", tokens=m, tp=tp)
    ms = {"ours_fp8": ours, "scaled_mm": base} if status == "ok" else {}
    return dict(m=m, n=1024, k=512, status=status, reason=None, ms=ms, err={}, sources=[src],
                local=local)  # fmt: skip


def _part(tmp_path, name, records):
    meta = dict(title="fp8 test", args=f"--stem {name}", device="GPU", torch="t")
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(dict(meta=meta, records=records)))
    return str(p)


def test_verdict_limits():
    ok, text = acc.verdict([_rec(1, 1.0, 1.0), _rec(2, 1.019, 1.0), _rec(3, 0.9, 1.0)])
    assert ok and "PASS" in text and "median 1.0000" in text
    ok, text = acc.verdict([_rec(1, 1.021, 1.0), _rec(2, 0.9, 1.0), _rec(3, 0.9, 1.0)])
    assert not ok and "1 above 1.02" in text  # one shape past the limit fails, whatever the median
    ok, _ = acc.verdict([_rec(1, 1.01, 1.0), _rec(2, 1.01, 1.0), _rec(3, 0.9, 1.0)])
    assert not ok  # median above 1
    ok, text = acc.verdict([_rec(1, 1.0, 1.0), _rec(2, 0, 0, status="failed")])
    assert not ok and "1 of 2 shapes timed" in text  # an untimed shape fails the acceptance
    assert acc.verdict([]) == (False, "no shape timed (0 records): FAIL")


def test_shapes_only_of_plan_steps_are_reported_apart_from_the_verdict():
    local = [_rec(1024, 1.0, 1.0), _rec(2048, 0.99, 1.0)]
    steps = [_rec(256, 1.30, 1.0, local=False), _rec(512, 1.0, 1.0, local=False)]
    ok, text = acc.verdict(local + steps)
    first, second = text.split("\n")
    assert ok and first.startswith("2 of 2 shapes timed") and first.endswith("PASS")
    assert second.startswith("shapes only of plan steps (not in the verdict): 2 of 2 shapes")
    assert "worst 1.3000; 1 above 1.02" in second
    assert acc.verdict(local) == (True, acc.verdict(local + steps)[1].split("\n")[0])


def test_main_merges_parts_and_exits_by_the_verdict(tmp_path):
    a = _part(tmp_path, "p0", [_rec(1024, 0.99, 1.0, tp=2), _rec(2048, 1.0, 1.0, tp=4)])
    b = _part(tmp_path, "p1", [_rec(4096, 1.01, 1.0, tp=8)])
    assert acc.main([a, b, "--out", str(tmp_path), "--stem", "merged"]) == 0
    doc = json.loads((tmp_path / "merged.json").read_text())
    assert [r["m"] for r in doc["records"]] == [1024, 2048, 4096]
    assert doc["meta"]["parts"] == 2 and doc["meta"]["part_args"] == ["--stem p0", "--stem p1"]
    assert "PASS" in doc["meta"]["acceptance"]
    assert (tmp_path / "merged.csv").read_text().count("\n") == 4  # header and 3 shapes
    c = _part(tmp_path, "p2", [_rec(8192, 1.05, 1.0)])
    assert acc.main([a, c, "--out", str(tmp_path), "--stem", "bad"]) == 1
