"""The machine constants (runtime.machine) and their fit (runtime.calibration_fit): a fit of runs
the model itself priced gives back the constants that priced them, the JSON form round-trips and
names what is wrong, the lookup takes the exact key, predicts another TP of the same GPU and
finds nothing for an unknown GPU, and without constants the model keeps the collective path."""

import json
from dataclasses import replace

import pytest

from distgemm import _core, calibrate
from distgemm.runtime import calibration_fit, cost_model, machine

KEY = machine.MachineKey("Test GPU 80GB", 2, "nvlink18")


def constants(
    tp: int = 2, gpu: str = KEY.gpu, nccl_latency: float = 0.02
) -> machine.MachineConstants:
    return machine.MachineConstants(
        key=machine.MachineKey(gpu, tp, "nvlink18"),
        slots=132,
        gemm_launch_ms=8e-3,
        gemm_ms_per_k={128: (3.0e-6, 3.9e-6), 256: (7.3e-6, 5.9e-6)},
        mm_launch_ms=5e-3,
        mm_flops_per_ms=6.7e11,
        copy_latency_ms=4e-3,
        copy_bytes_per_ms=tuple(3.6e8 * min(p, 2) for p in range(1, tp)),
        nccl={
            "all_gather": (nccl_latency, 2.9e-9, 2.9e-2),
            "reduce_scatter": (nccl_latency * 1.1, 3.4e-9, 2.5e-3),
        },
        overlap={
            "all_gather": (1.0e-3, 3.5e-2, 2.0e-10),
            "epilogue": (5.9e-3, 1.7e-2, 1.5e-9),
            "copy": (5.2e-3, 8.3e-3, 5.3e-10),
        },
        choice_error=0.0,
    )


def priced_runs(mc: machine.MachineConstants) -> list[dict]:
    """The runs of a calibration at mc's TP, each priced by the model under ``mc``."""
    tp, runs = mc.key.tp, []
    for m, n, k in calibrate.GEMMS:
        for tile in (128, 256):
            ms = cost_model.gemm_ms(mc, m, n, k, tile_n=tile)
            runs.append({"kind": "gemm", "m": m, "n": n, "k": k, "tile_n": tile, "ms": ms})
        runs.append({"kind": "mm", "m": m, "n": n, "k": k, "ms": cost_model.mm_ms(mc, m, n, k)})
    for peers in range(1, tp):
        for nbytes in calibrate.COPY_BYTES:
            ms = mc.copy_latency_ms + nbytes * peers / mc.link_bytes_per_ms(peers)
            runs.append({"kind": "copy", "peers": peers, "bytes": nbytes, "ms": ms})
    for m, n, k in calibrate.path_shapes(tp):
        for schedule in calibrate.SCHEDULES.values():
            for path, steps in (("collective", tp), ("overlap", tp), ("overlap", 2 * tp)):
                plan = _core.build_plan(schedule, tp, steps, m, n, k, 1)
                ms = cost_model.predict(mc, plan)[f"{path}_ms"]
                runs.append({"kind": "path", "path": path, "schedule": schedule, "tp": tp,
                             "steps": steps, "m": m, "n": n, "k": k, "ms": ms})  # fmt: skip
    return runs


def close(a, b, rel=1e-6, abs_=1e-12):
    return a == pytest.approx(b, rel=rel, abs=abs_)


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_a_fit_of_runs_the_model_priced_gives_back_its_constants(tp):
    want = constants(tp)
    got = calibration_fit.fit(priced_runs(want), want.key, want.slots)
    assert close(got.gemm_launch_ms, want.gemm_launch_ms)
    for tile in (128, 256):
        assert all(close(g, w) for g, w in zip(got.gemm_ms_per_k[tile], want.gemm_ms_per_k[tile]))
    assert close(got.mm_flops_per_ms, want.mm_flops_per_ms) and close(got.mm_launch_ms, 5e-3)
    assert close(got.copy_latency_ms, want.copy_latency_ms)
    assert all(close(g, w) for g, w in zip(got.copy_bytes_per_ms, want.copy_bytes_per_ms))
    for name in machine.COLLECTIVES:
        assert all(close(g, w, 1e-5) for g, w in zip(got.nccl[name], want.nccl[name])), name
    for t in machine.TRANSPORTS:
        assert all(close(g, w, 1e-4, 1e-9) for g, w in zip(got.overlap[t], want.overlap[t])), t
    assert got.choice_error < 1e-6
    assert set(got.meta["fit"]) >= {"gemm", "mm", "copy", "collective/all_gather", "overlap/copy"}


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_a_fit_of_runs_with_cublaslt_steps_prices_them_as_torch_and_says_so(tp, tmp_path):
    """Overlapped runs whose steps the kernel table gave to cuBLASLt record it ("step_kernel");
    the fit prices those steps at torch's GEMM rate, gives back the constants that priced them,
    and marks the constants steps_by_table (kept by the JSON form)."""
    want = constants(tp)
    runs = []
    for r in priced_runs(want):
        if r["kind"] == "path" and r["path"] == "overlap" and r["schedule"] == "ag_rotate_a":
            plan = _core.build_plan(r["schedule"], tp, r["steps"], r["m"], r["n"], r["k"], 1)
            r = dict(r, step_kernel="cublaslt")
            r["ms"] = cost_model.predict(want, plan, step_kernel="cublaslt")["overlap_ms"]
        runs.append(r)
    got = calibration_fit.fit(runs, want.key, want.slots)
    assert got.steps_by_table
    assert not calibration_fit.fit(priced_runs(want), want.key, want.slots).steps_by_table
    for t in machine.TRANSPORTS:
        assert all(close(g, w, 1e-4, 1e-9) for g, w in zip(got.overlap[t], want.overlap[t])), t
    assert got.choice_error < 1e-6
    got.save(tmp_path / "m.json")
    assert machine.load(tmp_path / "m.json").steps_by_table


def test_a_fit_without_copy_runs_takes_the_copy_default():
    want = constants(2)
    runs = [r for r in priced_runs(want) if r["kind"] != "copy"]
    with pytest.raises(ValueError, match="no copy-engine runs"):
        calibration_fit.fit(runs, want.key, want.slots)
    got = calibration_fit.fit(runs, want.key, want.slots, copy_default=(4e-3, (3.6e8,)))
    assert (got.copy_latency_ms, got.copy_bytes_per_ms) == (4e-3, (3.6e8,))
    for name in machine.COLLECTIVES:  # NCCL comes from the collective path's runs alone
        assert all(close(g, w, 1e-4, 1e-9) for g, w in zip(got.nccl[name], want.nccl[name])), name


def test_a_fit_with_too_few_runs_says_which_stage():
    runs = [r for r in priced_runs(constants(2)) if r["kind"] != "gemm"]
    with pytest.raises(ValueError, match="our GEMM kernel needs at least 5 runs, got 0"):
        calibration_fit.fit(runs, KEY, 132)


def test_noisy_runs_give_a_choice_error_of_their_noise():
    want = constants(2)
    runs = priced_runs(want)
    for i, r in enumerate(runs):
        r["ms"] *= 1.03 if i % 2 else 0.97
    got = calibration_fit.fit(runs, want.key, want.slots)
    assert 0.01 < got.choice_error < 0.06


def test_the_json_form_round_trips_and_names_what_is_wrong(tmp_path):
    mc = replace(constants(4), choice_error=0.02, meta={"command": "x"})
    path = tmp_path / (mc.key.slug() + ".json")
    mc.save(path)
    assert machine.load(path) == mc
    assert mc.key.slug() == "test-gpu-80gb-tp4-nvlink18"
    d = json.loads(path.read_text())
    del d["nccl"]["reduce_scatter"]
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=rf"{path}: missing or malformed field: KeyError"):
        machine.load(path)
    path.write_text(json.dumps({**mc.to_json(), "version": 9}))
    with pytest.raises(ValueError, match="not a distgemm-machine-constants file of version 1"):
        machine.load(path)
    path.write_text(json.dumps({**mc.to_json(), "choice_error": 2.0}))
    with pytest.raises(ValueError, match=r"choice_error 2.0 is not in \[0, 1\)"):
        machine.load(path)
    with pytest.raises(ValueError, match="cannot be read"):
        machine.load(tmp_path / "missing.json")


def test_the_lookup_takes_the_exact_key_then_predicts_other_tps_of_that_gpu():
    tp2, tp4 = constants(2, nccl_latency=0.020), constants(4, nccl_latency=0.026)
    pool = [tp2, tp4, constants(2, gpu="Other GPU")]
    assert machine.find(tp4.key, pool) is tp4
    tp8 = machine.find(replace(tp4.key, tp=8), pool)
    # Latency on the line through (1 hop, 0.020) and (3 hops, 0.026): 7 hops, 0.038.
    assert tp8.nccl["all_gather"][0] == pytest.approx(0.038)
    assert tp8.nccl["reduce_scatter"][0] == pytest.approx(0.038 * 1.1)
    assert tp8.key.tp == 8 and tp8.meta["predicted_from_tp"] == [2, 4]
    assert tp8.link_bytes_per_ms(7) == tp4.link_bytes_per_ms(3)  # the most peers measured
    tp3 = machine.find(replace(tp4.key, tp=3), pool)  # nearest TP, the larger on a tie: 4
    assert tp3.overlap == tp4.overlap and tp3.key.tp == 3
    assert machine.find(machine.MachineKey("Unknown GPU", 2, "nvlink18"), pool) is None
    assert machine.find(replace(tp2.key, topology="pcie"), pool) is None


def test_one_calibration_alone_keeps_its_latency_at_another_tp():
    tp2 = constants(2, nccl_latency=0.02)
    tp8 = machine.find(replace(tp2.key, tp=8), [tp2])
    assert tp8.nccl == tp2.nccl and tp8.key.tp == 8


def test_the_calibration_file_in_the_environment_comes_first(tmp_path, monkeypatch):
    mc = constants(2)
    mc.save(tmp_path / "mine.json")
    monkeypatch.setenv(machine.CALIBRATION_ENV, str(tmp_path))
    assert machine.find(mc.key) == mc
    monkeypatch.setenv(machine.CALIBRATION_ENV, str(tmp_path / "mine.json"))
    assert machine.find(mc.key) == mc
    (tmp_path / "bad.json").write_text("{")
    monkeypatch.setenv(machine.CALIBRATION_ENV, str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="bad.json: cannot be read"):
        machine.find(mc.key)


def test_without_constants_the_model_keeps_the_collective_path():
    plan = _core.build_plan("ag_rotate_a", 2, 2, 16384, 28672, 8192, 1)
    path, pred, why = cost_model.choose(None, plan)
    assert path == "collective" and pred == {} and "--calibrate" in why
    path, pred, why = cost_model.choose(constants(2), plan)
    assert path == "overlap", why
    assert pred["overlap_ms"] < pred["collective_ms"]


def test_the_choice_takes_a_gain_only_beyond_the_calibrations_error():
    plan = _core.build_plan("ag_rotate_a", 2, 2, 16384, 28672, 8192, 1)
    pred = cost_model.predict(constants(2), plan)
    share = 1 - pred["overlap_ms"] / pred["collective_ms"]
    assert share > 0.01
    tolerated = cost_model.TOLERATED_LOSS
    below, above = (replace(constants(2), choice_error=share * f + tolerated) for f in (0.9, 1.1))
    assert cost_model.choose(below, plan)[0] == "overlap"
    assert cost_model.choose(above, plan)[0] == "collective"


def test_without_the_environment_the_users_calibration_directory_is_read(tmp_path, monkeypatch):
    mc = constants(4, gpu="User GPU")
    monkeypatch.delenv(machine.CALIBRATION_ENV, raising=False)
    monkeypatch.setattr(machine, "USER_DIR", tmp_path)
    assert machine.calibration_dir() == tmp_path
    assert machine.find(mc.key) is None
    mc.save(tmp_path / (mc.key.slug() + ".json"))
    assert machine.find(mc.key) == mc


def test_the_choice_error_counts_only_over_predicted_gains():
    assert calibration_fit.over_prediction([]) == 0.0
    assert calibration_fit.over_prediction([-0.2, -0.1]) == 0.0  # gains left untaken only
    assert calibration_fit.over_prediction([0.03, -0.5, 0.04, 0.0]) == pytest.approx(0.025)


@pytest.mark.parametrize("tp", [2, 4])
def test_refit_fits_a_files_stored_runs_again_without_a_gpu(tmp_path, tp, capsys):
    from distgemm import calibrate

    want = constants(tp)
    runs = priced_runs(want)
    stored = replace(want, choice_error=0.3, meta={"command": "x", "runs": runs})
    src, dst = tmp_path / "m.json", tmp_path / "again.json"
    stored.save(src)
    assert calibrate.main(["--calibrate", "--refit", str(src), "--out", str(dst)]) == 0
    got = machine.load(dst)
    assert got.key == want.key and got.choice_error < 1e-6  # refitted, not copied
    assert close(got.gemm_launch_ms, want.gemm_launch_ms) and got.meta["runs"] == runs
    assert got.meta["refit"].startswith("python -m distgemm.tune --calibrate --refit")
    assert "wrote" in capsys.readouterr().out
    assert machine.load(src).choice_error == 0.3  # --out given: the source stays


@pytest.mark.parametrize(
    "argv,line",
    [
        ([], "it measures this machine's GPUs, and torch sees none"),
        (["--window-ms", "0"], "--window-ms 0.0 is not in 1..10000"),
        (["--refit", "/nonexistent/m.json"], "No such file"),
        (["--refit", "NORUNS"], "stores no calibration runs: it was fitted elsewhere"),
        (["--refit", "x.json", "--reduce-only"], "--refit fits a whole calibration's runs"),
    ],
)
def test_the_calibration_cli_refuses_in_one_line(argv, line, tmp_path):
    import subprocess
    import sys

    if "NORUNS" in argv:  # a machine file fitted elsewhere (no runs stored)
        constants(2).save(tmp_path / "noruns.json")
        argv = [str(tmp_path / "noruns.json") if a == "NORUNS" else a for a in argv]
    res = subprocess.run(
        [sys.executable, "-m", "distgemm.tune", "--calibrate", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if line.startswith("it measures") and "torch sees none" not in res.stderr:
        pytest.skip("torch sees a GPU here: the calibration would run")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m distgemm.tune --calibrate: error: ")
    assert line in lines[0] and lines[0].endswith("(see --help)")


@pytest.mark.parametrize("tp", [2, 4])
def test_no_fitted_cost_is_negative_and_no_plan_is_priced_far_below_its_gemms(tp):
    """Runs whose overlapped and collective times grow slower than the GEMM's work (the largest
    ones 25% under the model's price) pull a free least squares to a large negative share of the
    GEMM (a free fit of 4 H100s gave -0.66), which prices the largest layers far below their own
    GEMMs. Every fitted cost is at least 0 but the overlapped plan's share of its GEMMs, which is
    at least OVERLAP_SHARE_FLOOR: no plan is priced below (1 + floor) times its GEMMs, and the
    collective path never below its torch.mm."""
    base = constants(tp)
    base = replace(base, overlap={t: (c[0], 0.0, c[2]) for t, c in base.overlap.items()},
                   nccl={c: (v[0], v[1], 0.0) for c, v in base.nccl.items()})  # fmt: skip
    runs = priced_runs(base)
    paths = [r for r in runs if r["kind"] == "path"]
    biggest = max(r["m"] * r["n"] * r["k"] for r in paths)
    for r in paths:  # down to 25% cheaper, in proportion to the work
        r["ms"] *= 1.0 - 0.25 * r["m"] * r["n"] * r["k"] / biggest
    got = calibration_fit.fit(runs, base.key, base.slots)
    floor = calibration_fit.OVERLAP_SHARE_FLOOR
    for name, (lat, per_byte, share) in got.nccl.items():
        assert min(lat, per_byte, share) >= 0.0, name
    for name, (per_step, share, per_byte) in got.overlap.items():
        assert min(per_step, per_byte) >= 0.0 and share >= floor - 1e-12, name
    assert min(share for _, share, _ in got.overlap.values()) == pytest.approx(floor)  # it binds
    for m, n, k in [(8192, 57344, 8192), (8192, 8192, 57344), (16384, 106496, 16384)]:
        for schedule in calibrate.SCHEDULES.values():
            plan = _core.build_plan(schedule, tp, tp, m, n, k, 1)
            rm, rn, rk = cost_model.rank_problem(plan.definition, tp, m, n, k)
            pred = cost_model.predict(got, plan)
            sm, sn = cost_model.step_gemm(plan.definition, tp, rm, rn)
            gemms = cost_model.gemm_ms(got, sm, sn, rk, count=tp, chained=plan.pdl_by_default)
            assert pred["overlap_ms"] >= (1 + floor) * gemms, schedule
            assert pred["collective_ms"] >= cost_model.mm_ms(got, rm, rn, rk), schedule
