"""CPU checks of benchmarks/host/first_call.py's bookkeeping: the 96 token counts, the phase timer
(wraps and restores the library's functions, times only what it is told to, names what it could
not wrap), disjoint phases and the summary statistics."""

import time
import types

import pytest

from benchmarks.host import first_call


def test_the_token_counts_are_96_multiples_of_64_up_to_6144():
    assert len(first_call.TOKENS) == 96
    assert first_call.TOKENS[0] == 64 and first_call.TOKENS[-1] == 6144
    assert all(t % 64 == 0 for t in first_call.TOKENS)


def test_the_phase_timer_wraps_times_and_restores():
    calls = []

    def slow(x, what="plan signature"):
        calls.append((x, what))
        time.sleep(0.01)
        return x + 1

    owner = types.SimpleNamespace(slow=slow, fast=lambda: 3)
    timer = first_call.PhaseTimer()
    timer.wrap(owner, "slow", "exchange", when=lambda x, what="plan signature": "signature" in what)
    timer.wrap(owner, "absent", "graph")
    assert owner.slow is not slow and timer.missing == ["SimpleNamespace.absent"]
    assert owner.slow(1) == 2 and owner.slow(2, what="settle") == 3
    took = timer.take()
    assert set(took) == {"exchange"} and 8.0 < took["exchange"] < 200.0  # one 10 ms call
    assert timer.take() == {}
    timer.restore()
    assert owner.slow is slow and calls == [(1, "plan signature"), (2, "settle")]


def test_phases_are_made_disjoint_and_the_rest_is_other():
    raw = {"validate+plan": 0.1, "workspace+setup": 0.5, "workspace": 0.4, "graph": 0.3}
    out = first_call.phases_of(raw, 1.5)
    assert out == pytest.approx(
        {"validate+plan": 0.1, "workspace": 0.4, "graph setup": 0.1, "graph": 0.3, "other": 0.6}
    )
    assert sum(out.values()) == pytest.approx(1.5)
    grown = dict(raw, workspace=3.0, **{"workspace+setup": 3.1})
    grown.update({"workspace: allocate + IPC": 2.0, "workspace: re-point plans": 0.5})
    out = first_call.phases_of(grown, 4.0)
    assert out["workspace"] == pytest.approx(0.5) and out["graph setup"] == pytest.approx(0.1)
    assert sum(out.values()) == pytest.approx(4.0)
    # make_state holds OverlappedState.place; OverlappedState.run holds graph_for.
    made = dict(raw, **{"path state": 0.7, "overlap call": 0.45})
    out = first_call.phases_of(made, 2.0)
    assert out["path state"] == pytest.approx(0.2) and out["overlap call"] == pytest.approx(0.15)
    assert out["graph"] == pytest.approx(0.3) and out["graph setup"] == pytest.approx(0.1)
    assert sum(out.values()) == pytest.approx(2.0)
    coll = {"collective call": 0.9, "collective: scratch growth": 0.3}
    out = first_call.phases_of(coll, 1.0)
    assert out == pytest.approx(
        {"collective call": 0.6, "collective: scratch growth": 0.3, "other": 0.1}
    )
    coll["collective: torch GEMM"] = 0.2  # torch's GEMM inside the collective call
    out = first_call.phases_of(coll, 1.0)
    assert out["collective call"] == pytest.approx(0.4) and out["other"] == pytest.approx(0.1)


def test_a_gated_phase_counts_only_inside_its_gate():
    """torch's GEMM is timed only inside the collective call (wrap_library's gate), not where the
    benchmark itself calls it."""
    timer = first_call.PhaseTimer()

    def gemm():
        time.sleep(0.002)

    owner = types.SimpleNamespace(gemm=gemm, call=lambda: owner.gemm())
    timer.wrap(owner, "call", "collective call")
    timer.wrap(owner, "gemm", "collective: torch GEMM",
               when=lambda *a, **k: timer.inside("collective call"))  # fmt: skip
    owner.gemm()  # outside the collective call: not timed
    assert "collective: torch GEMM" not in timer.take()
    owner.call()
    took = timer.take()
    assert 1.5 < took["collective: torch GEMM"] <= took["collective call"] < 400.0
    assert not timer.inside("collective call")


def test_a_phase_entered_from_inside_itself_is_timed_once():
    timer = first_call.PhaseTimer()

    def outer(depth):
        time.sleep(0.005)
        return owner.outer(depth - 1) if depth else 0

    owner = types.SimpleNamespace(outer=outer)
    timer.wrap(owner, "outer", "workspace")
    owner.outer(3)  # 4 nested calls of ~5 ms: ~20 ms, counted once
    assert 15.0 < timer.take()["workspace"] < 400.0
    timer.restore()


def test_summary_statistics():
    s = first_call.summarize([float(x) for x in range(1, 11)])
    assert s == {"median": 5.5, "p90": 10.0, "max": 10.0, "total": 55.0}


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_the_torch_baseline_gathers_then_multiplies_and_multiplies_then_scatters(tp):
    """unfused_ops on a stand-in for torch.distributed where every rank holds the same shard:
    the gather repeats it TP times, the reduce-scatter sums TP copies of this rank's rows."""
    import torch

    def all_gather_into_tensor(out, part):
        out.copy_(part.repeat(tp, 1))

    def reduce_scatter_tensor(out, partial):
        out.copy_(partial[: out.shape[0]] * tp)

    dist = types.SimpleNamespace(
        all_gather_into_tensor=all_gather_into_tensor, reduce_scatter_tensor=reduce_scatter_tensor
    )
    gen = torch.Generator().manual_seed(3)
    m, k, n = 8 * tp, 16, 12
    a_ag, w_ag = torch.randn(m // tp, k, generator=gen), torch.randn(n, k, generator=gen)
    a_rs, w_rs = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    ops = first_call.unfused_ops(torch, dist, a_ag, w_ag, a_rs, w_rs, tp)
    assert set(ops) == {"all_gather_gemm", "gemm_reduce_scatter"}
    torch.testing.assert_close(ops["all_gather_gemm"](), a_ag.repeat(tp, 1) @ w_ag.t())
    got = ops["gemm_reduce_scatter"]()
    assert got.shape == (m // tp, n)
    torch.testing.assert_close(got, (a_rs @ w_rs.t())[: m // tp] * tp)


def test_plot_draws_each_run_and_needs_an_output(tmp_path):
    pytest.importorskip("matplotlib")
    import json

    runs = []
    for impl, control, base in (("distgemm", "SharedMemoryExchange", 0.9), ("torch", None, 0.5)):
        calls = [
            {"op": op, "m": m, "ms": base + m / 1e4, "host_ms": base, "phases": {}, "path": "x"}
            for op in ("all_gather_gemm", "gemm_reduce_scatter")
            for m in (64, 128, 192)
        ]
        meta = {"tp": 4, "impl": impl, "control": control, "device": "GPU"}
        path = tmp_path / f"{impl}.json"
        path.write_text(json.dumps({"meta": meta, "calls": calls}))
        runs.append(str(path))
    png = tmp_path / "first-calls.png"
    first_call.main(["--plot", ",".join(runs), "--out", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit) as e:
        first_call.main(["--plot", ",".join(runs)])
    assert e.value.code == 2


def test_report_sums_cublaslt_host_time_per_kind(tmp_path, capsys):
    """The cuBLASLt host ms of each call (``--phases``) are summarized per kind, printed after the
    phases they sit inside, and written to the JSON."""
    import json

    calls = [
        dict(op="all_gather_gemm", m=m, ms=1.0, host_ms=0.9, phases={"graph": 0.3}, path="overlap",
             source="model", cublaslt_ms={"heuristic": h, "check": 0.02, "preload": 0.0,
                                          "enqueue": 0.05})
        for m, h in ((64, 0.16), (128, 0.0), (192, 0.0))
    ]  # fmt: skip
    steady = [dict(op="all_gather_gemm", m=64, ms=0.1)]
    held = dict(workspace_bytes=0, workspace_allocations=0, largest_plan_bytes=0,
                collective_bytes=0, collective_buffers=0, collective_allocations=0)  # fmt: skip
    meta = dict(tp=2, k=4096, n=3072, impl="distgemm", path="default")
    out = tmp_path / "fc.json"
    first_call.report(calls, steady, [], meta, dict(torch_grown=0, distgemm=held), str(out))
    text = capsys.readouterr().out
    assert "cuBLASLt host ms per first call, inside the phases above" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("heuristic"))
    assert line.split()[1:] == ["0.000", "0.160", "0.2"]  # median, max, total
    doc = json.loads(out.read_text())
    assert doc["cublaslt_ms"]["enqueue"] == pytest.approx(
        {"median": 0.05, "p90": 0.05, "max": 0.05, "total": 0.15}
    )
    assert doc["calls"][0]["cublaslt_ms"]["heuristic"] == 0.16


def test_cublaslt_host_ms_names_each_kind_of_work():
    from distgemm import _core

    got = _core.cublaslt_host_ms()
    assert set(got) == {"heuristic", "check", "preload", "enqueue"}
    assert all(v >= 0.0 for v in got.values())
