"""The torchtitan client without a GPU or torchtitan: benchmarks/training/titan_async_tp.py's
arguments, its one-line exit 2 without torchtitan, its data and distgemm's routing record; and
benchmarks/training/titan_compare.py's loss comparison (bf16 tolerance), tokens/s ratio and
refusals."""

import json
import sys

import pytest

from benchmarks.training import titan_async_tp as client
from benchmarks.training import titan_compare as cmp


def test_defaults_are_the_issue_run():
    a = client.parse_args(["--switch", "on", "--out", "x.json"])
    assert (a.layers, a.steps, a.seq, a.batch, a.warmup) == (4, 50, 8192, 1, 5)
    assert (a.switch, a.dtype, a.seed, a.cpu_smoke) == ("on", "bf16", 0, False)


def test_cpu_smoke_defaults_and_overrides():
    a = client.parse_args(["--switch", "off", "--out", "x", "--cpu-smoke", "--layers", "3"])
    assert (a.layers, a.steps, a.seq, a.batch, a.warmup) == (3, 3, 64, 2, 1)


@pytest.mark.parametrize(
    "argv",
    [
        ["--out", "x"],  # --switch is required
        ["--switch", "maybe", "--out", "x"],
        ["--switch", "on"],  # --out is required
        ["--switch", "on", "--out", "x", "--layers", "0"],
        ["--switch", "on", "--out", "x", "--steps", "5", "--warmup", "5"],
        ["--switch", "on", "--out", "x", "--dtype", "fp16"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        client.parse_args(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_without_torchtitan_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torchtitan", None)  # import torchtitan -> ImportError
    monkeypatch.delenv("DISTGEMM_ASYNC_TP", raising=False)
    assert client.main(["--switch", "off", "--out", "never.json"]) == client.MISSING_EXIT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("titan_async_tp: torchtitan 0.2.2")
    assert "TITAN.md" in err[0]


def test_switch_off_refuses_the_env_switch(monkeypatch, capsys):
    monkeypatch.setenv("DISTGEMM_ASYNC_TP", "1")
    assert client.main(["--switch", "off", "--out", "never.json"]) == client.MISSING_EXIT
    assert "DISTGEMM_ASYNC_TP=1" in capsys.readouterr().err


def test_batches_cycle_the_pool_and_shift_labels():
    torch = pytest.importorskip("torch")
    a = client.parse_args(["--switch", "off", "--out", "x", "--seq", "8", "--pool", "3"])
    pool = client.token_pool(torch, a, 100, "cpu")
    assert pool.shape == (3, 9) and torch.equal(pool, client.token_pool(torch, a, 100, "cpu"))
    x, y = client.batch_at(pool, 2, 2)  # rows 4 % 3 and 5 % 3
    assert torch.equal(x, pool[[1, 2], :-1]) and torch.equal(y, pool[[1, 2], 1:])


def test_routing_record_is_json():
    pytest.importorskip("torch")
    rec = client.routing_record()
    json.dumps(rec)
    assert rec["installed"] in (True, False)
    assert set(rec["ops"]) >= {"fused_all_gather_matmul", "fused_matmul_reduce_scatter"}
    assert all(set(o) == {"served", "fallbacks"} for o in rec["ops"].values())


def _run(switch, losses, tps, **config):
    base = dict(tp=2, switch=switch, layers=4, steps=len(losses), seq=8192, batch=1, seed=0)
    base.update(config)
    return dict(config=base, losses=losses, tokens_per_s=tps, routing_stats=dict(served=7))


def test_losses_within_bf16_tolerance_agree_and_ratio():
    off = _run("off", [11.9, 9.0, 1.0, 0.01], 1000.0)
    on = _run("on", [11.95, 9.1, 1.015, 0.02], 1050.0)
    c = cmp.compare(off, on)
    assert c.agree and c.first_bad_step is None and c.speedup == pytest.approx(1.05)
    assert c.max_abs_diff == pytest.approx(0.1) and c.max_rel_diff == pytest.approx(1.0)
    assert "agree" in c.lines()[0] and "1.0500x" in c.lines()[1]


def test_median_step_ratio_leaves_out_warm_up_and_ignores_one_stall():
    off = _run("off", [1.0] * 6, 1000.0, warmup=2)
    on = _run("on", [1.0] * 6, 900.0, warmup=2)
    off["step_ms"] = [9000.0, 70.0, 60.0, 61.0, 59.0, 500.0]  # a stalled last step
    on["step_ms"] = [8000.0, 70.0, 55.0, 56.0, 54.0, 55.0]
    c = cmp.compare(off, on)
    assert c.median_step_ms_off == pytest.approx(60.5) and c.median_step_ms_on == 55.0
    assert "off/on 1.1000x" in c.lines()[2]
    del on["step_ms"]
    c = cmp.compare(off, on)
    assert c.median_step_ms_on is None and len(c.lines()) == 2


def test_a_step_beyond_tolerance_is_named():
    off = _run("off", [10.0, 8.0, 6.0], 1.0)
    on = _run("on", [10.0, 8.0 + 0.02 + 0.02 * 8.0 + 1e-3, 6.0], 1.0)
    c = cmp.compare(off, on)
    assert not c.agree and c.first_bad_step == 1 and "step 1" in c.lines()[0]
    assert cmp.compare(off, on, rtol=0.03).agree


def test_nan_never_agrees():
    c = cmp.compare(_run("off", [1.0, 2.0], 1.0), _run("on", [1.0, float("nan")], 1.0))
    assert c.first_bad_step == 1


@pytest.mark.parametrize(
    ("on_config", "losses", "message"),
    [
        (dict(tp=4), [1.0, 1.0], "tp (2 vs 4)"),
        (dict(seed=1), [1.0, 1.0], "seed"),
        ({}, [1.0], "loss counts differ"),
    ],
)
def test_incomparable_runs(on_config, losses, message):
    off = _run("off", [1.0, 1.0], 1.0)
    on = _run("on", losses, 1.0, **on_config)
    if message == "loss counts differ":
        on["config"]["steps"] = 2
    with pytest.raises(cmp.Incomparable, match=message.replace("(", r"\(").replace(")", r"\)")):
        cmp.compare(off, on)


def test_compare_cli_exit_codes(tmp_path, capsys):
    off, on, bad = tmp_path / "off.json", tmp_path / "on.json", tmp_path / "on_bad.json"
    off.write_text(json.dumps(_run("off", [5.0, 4.0], 100.0)))
    on.write_text(json.dumps(_run("on", [5.01, 4.02], 104.0)))
    bad.write_text(json.dumps(_run("on", [5.0, 3.0], 104.0)))
    assert cmp.main([str(off), str(on)]) == 0
    out = capsys.readouterr().out
    assert "on/off 1.0400x" in out and "served 7" in out
    assert cmp.main([str(off), str(bad)]) == 1
    assert cmp.main([str(off), str(tmp_path / "missing.json")]) == 2
    assert cmp.main([str(off), str(off)]) == 0  # the same run agrees with itself
    off.write_text("{}")
    assert cmp.main([str(off), str(on)]) == 2
    assert "not a titan_async_tp.py record" in capsys.readouterr().err
