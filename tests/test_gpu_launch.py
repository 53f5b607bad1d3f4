"""The GPU tests' launch machinery on the CPU: how many ranks run and whether they share one GPU
(tests/gpu/gpu_requirements.py), the skip reasons, the left-out checks and how the tests read
them, and the workers' shared helper (tests/gpu/torchrun_worker.py: left_out_when_shared,
run_sections, finish's JSON, the gloo probe) on a one-rank gloo group; every worker's command
line.
"""

import functools
import json
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

GPU_TESTS = pathlib.Path(__file__).resolve().parent / "gpu"
sys.path.insert(0, str(GPU_TESTS))

import gpu_requirements as req  # noqa: E402
import results_summary  # noqa: E402
import torchrun_worker as tw  # noqa: E402

WORKERS = [
    "torchrun_worker",
    "fused_worker",
    "capture_worker",
    "workspace_worker",
    "training_worker",
    "fp8_worker",
    "collective_memory_worker",
]


# ---------------------------------------------------------------------------------------------
# How many ranks, shared or not


@pytest.mark.parametrize("setting", [None, "4", "1"])
def test_one_gpu_runs_two_ranks_sharing_it_whatever_the_tp_setting(setting):
    assert req.choose_ranks(1, setting, None) == (2, True)
    assert req.choose_ranks(1, setting, 2) == (2, True)


@pytest.mark.parametrize(
    "gpus, setting, default_tp, expected",
    [
        (2, None, None, 2),  # every visible GPU
        (8, None, None, 8),
        (8, None, 2, 2),  # the test's own default
        (8, "4", None, 4),  # DISTGEMM_TEST_TP
        (8, "4", 2, 4),
        (4, "1", None, 1),
    ],
)
def test_several_gpus_keep_one_rank_per_gpu(gpus, setting, default_tp, expected):
    assert req.choose_ranks(gpus, setting, default_tp) == (expected, False)


@pytest.mark.parametrize("setting", ["0", "9", "two", "-2"])
def test_a_bad_tp_setting_names_itself(setting):
    with pytest.raises(ValueError, match=f"DISTGEMM_TEST_TP='{setting}' is not a rank count"):
        req.choose_ranks(2, setting, None)


def test_no_gpu_ignores_the_tp_setting():
    """run_on_gpus.sh exports DISTGEMM_TEST_TP=0 where nvidia-smi finds nothing: a skip, not a
    collection error."""
    assert req.choose_ranks(0, "0", None) == (2, False)
    assert req.choose_ranks(0, None, 4) == (4, False)


def test_launch_here_reads_the_machine_and_the_setting(monkeypatch):
    monkeypatch.setattr(req, "skip_reason", lambda tp, what="", shared=False: None)
    monkeypatch.setenv("DISTGEMM_TEST_TP", "4")
    monkeypatch.setattr(req, "visible_gpus", lambda: 1)
    assert req.launch_here() == req.Launch(tp=2, shared=True, skip=None)
    monkeypatch.setattr(req, "visible_gpus", lambda: 8)
    assert req.launch_here() == req.Launch(tp=4, shared=False, skip=None)
    assert req.launch_here(default_tp=2, honour_tp_env=False).tp == 2


@pytest.mark.parametrize(
    "gpus, setting, expected",
    [(8, None, 8), (4, None, 4), (8, "2", 2), (1, None, 2), (1, "4", 4), (0, "0", 2)],
)
def test_a_test_that_never_shares_a_gpu_takes_every_gpu_or_the_setting(
    monkeypatch, gpus, setting, expected
):
    """One GPU or none: the TP whose skip says what is missing; never 2 ranks on one GPU."""
    monkeypatch.setattr(req, "visible_gpus", lambda: gpus)
    if setting is None:
        monkeypatch.delenv("DISTGEMM_TEST_TP", raising=False)
    else:
        monkeypatch.setenv("DISTGEMM_TEST_TP", setting)
    assert req.tp_one_gpu_per_rank() == expected


def test_mode_says_shared_gpu_or_gpus_per_rank():
    assert req.Launch(2, True, None).mode == "shared GPU (2 ranks on one device)"
    assert req.Launch(4, False, None).mode == "4 GPUs, one rank per GPU"
    assert req.Launch(1, False, None).mode == "1 GPU, one rank per GPU"


def test_shared_launch_env_allows_the_shared_gpu_and_the_real_mode_never_does(monkeypatch):
    monkeypatch.setenv("DISTGEMM_ALLOW_SHARED_GPU", "1")  # left over in the caller's shell
    real = req.Launch(2, False, None).env()
    assert "DISTGEMM_ALLOW_SHARED_GPU" not in real
    assert real["NCCL_NVLS_ENABLE"] == "0" and real["PYTHONUNBUFFERED"] == "1"
    monkeypatch.delenv("DISTGEMM_ALLOW_SHARED_GPU")
    shared = req.Launch(2, True, None).env()
    assert shared["DISTGEMM_ALLOW_SHARED_GPU"] == "1" and shared["NCCL_NVLS_ENABLE"] == "0"


def test_shared_launch_gets_longer_to_finish():
    assert req.Launch(2, True, None).timeout_s(100) == 100 * req.SHARED_SLOWDOWN
    assert req.Launch(2, False, None).timeout_s(100) == 100


# ---------------------------------------------------------------------------------------------
# Skip reasons

NONE = "this machine has none"


def test_skip_without_the_cuda_runtime(monkeypatch):
    monkeypatch.setattr(req._core, "cuda_runtime", False, raising=False)
    assert "built without the CUDA runtime" in req.skip_reason(2, shared=True)


@pytest.mark.parametrize(
    "gpus, tp, shared, capability, reason",
    [
        (0, 2, False, (9, 0), f"needs a CUDA GPU (with one, {req.SHARED_GPU_MODE}), {NONE}"),
        (1, 2, False, (9, 0), "needs 2 CUDA GPUs (DISTGEMM_TEST_TP), this machine has 1"),
        (4, 8, False, (9, 0), "needs 8 CUDA GPUs (DISTGEMM_TEST_TP), this machine has 4"),
        (1, 2, True, (8, 0), "needs Hopper GPUs (sm_90), found compute capability [(8, 0)]"),
        (1, 2, True, (9, 0), None),
        (2, 2, False, (9, 0), None),
    ],
)
def test_skip_reason_names_what_is_missing(monkeypatch, gpus, tp, shared, capability, reason):
    monkeypatch.setattr(req._core, "cuda_runtime", True, raising=False)
    monkeypatch.setattr(req, "visible_gpus", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: capability)
    assert req.skip_reason(tp, " (DISTGEMM_TEST_TP)", shared) == reason


# ---------------------------------------------------------------------------------------------
# Left-out checks as the tests read them

DATA = {
    "mode": req.SHARED_GPU_MODE,
    "failed": 0,
    "results": [
        {"name": "every_op/rs_tile_a/overlap/S2/out1", "ok": True, "rank": 0},
        {"name": "many_replays/ag_rotate_a/overlap/S2", "ok": True, "rank": 0},
    ],
    "skipped": [
        {"name": "every_op/rs_tile_a/collective/S2/out0", "reason": "needs NCCL", "rank": 0},
        {"name": "compat", "reason": "gloo cannot", "rank": 0},
    ],
}


@pytest.mark.parametrize(
    "outer, inner, expected",
    [
        ("a/b", "a/b", True),
        ("a/b", "a/b/c", True),
        ("a/b/", "a/b/c", True),
        ("a/b", "a/bc", False),
        ("compat", "compat_fp8/x", False),
        ("a/b/c", "a/b", False),
    ],
)
def test_check_names_are_paths(outer, inner, expected):
    assert req.covers(outer, inner) is expected


def test_a_left_out_check_skips_with_its_reason_and_the_mode():
    with pytest.raises(pytest.skip.Exception) as skipped:
        req.ran_or_skip(DATA, "every_op/rs_tile_a/collective/S2/out0")
    assert "shared GPU (2 ranks on one device)" in str(skipped.value)
    assert "needs NCCL" in str(skipped.value)
    with pytest.raises(pytest.skip.Exception, match="gloo cannot"):
        req.ran_or_skip(DATA, "compat")  # the whole section
    with pytest.raises(pytest.skip.Exception, match="gloo cannot"):
        req.ran_or_skip(DATA, "compat/gather-0-bfloat16-True")  # a check under it


def test_a_check_that_ran_is_returned_and_one_never_run_is_not_skipped():
    got = req.ran_or_skip(DATA, "every_op/rs_tile_a/overlap/S2/out1")
    assert [e["name"] for e in got] == ["every_op/rs_tile_a/overlap/S2/out1"]
    assert req.ran_or_skip(DATA, "compat_fp8") == []  # neither ran nor left out: the test fails
    assert req.left_out_reason(DATA, "many_replays/ag_rotate_a/overlap/S2") is None


def test_every_check_passed_reports_the_mode_and_the_failures():
    bad = dict(DATA, failed=1, results=[{"name": "x", "ok": False, "rank": 1, "error": "E: y"}])
    with pytest.raises(AssertionError, match=r"\[shared GPU \(2 ranks on one device\)\] rc=0"):
        req.assert_every_check_passed((0, "log tail", bad))
    req.assert_every_check_passed((0, "", DATA))


# ---------------------------------------------------------------------------------------------
# The workers' shared helper, on a one-rank gloo group


@pytest.fixture
def worker_state(monkeypatch):
    """torchrun_worker's result lists emptied, a one-rank gloo group."""
    for name in ("RESULTS", "FAILED", "SKIPPED"):
        monkeypatch.setattr(tw, name, [])
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield tw
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("shared", [True, False])
def test_left_out_when_shared_records_the_skip_only_when_shared(worker_state, monkeypatch, shared):
    monkeypatch.setattr(tw, "SHARED_GPU", shared)
    assert tw.left_out_when_shared("paths/collective", tw.NEEDS_NCCL) is shared
    expected = [{"name": "paths/collective", "reason": tw.NEEDS_NCCL, "rank": 0}]
    assert tw.SKIPPED == (expected if shared else [])
    assert tw.mode() == (req.SHARED_GPU_MODE if shared else "1 GPU, one rank per GPU")


def test_communicator_timeouts_are_the_shared_ones_only_when_shared(worker_state, monkeypatch):
    made = []
    monkeypatch.setattr(tw.dcomm, "Communicator", lambda **kw: made.append(kw))
    monkeypatch.setattr(tw, "SHARED_GPU", True)
    tw.communicator()
    tw.communicator(wait_timeout_s=1.0)
    monkeypatch.setattr(tw, "SHARED_GPU", False)
    tw.communicator()
    shared = {"timeout_s": tw.SHARED_CONTROL_TIMEOUT_S, "wait_timeout_s": tw.SHARED_WAIT_TIMEOUT_S}
    assert made == [shared, {**shared, "wait_timeout_s": 1.0}, {}]


def test_run_sections_records_unknown_sections_and_crashes_with_tracebacks(worker_state):
    ran = []

    def crash():
        raise KeyError("no such plan")

    tw.run_sections("first,crash,nope,", {"first": lambda: ran.append(1), "crash": crash})
    assert ran == [1]
    crashed, unknown = tw.RESULTS
    assert crashed["name"] == "crash/crashed" and not crashed["ok"]
    assert crashed["error"] == "KeyError: 'no such plan'"
    assert "in crash" in crashed["traceback"] and "KeyError" in crashed["traceback"]
    assert unknown == {
        "name": "unknown_section/nope",
        "ok": False,
        "rank": 0,
        "known": ["crash", "first"],
    }


def test_finish_writes_mode_checks_and_left_out_and_exits_by_the_failures(
    worker_state, monkeypatch, tmp_path, capsys
):
    monkeypatch.setattr(tw, "SHARED_GPU", True)
    tw.record("a/ok", True, rel_err=1e-3)
    tw.left_out_when_shared("a/collective", tw.NEEDS_NCCL)
    tw.record("a/bad", False, error="ValueError: x")
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as exited:
        tw.finish(out)
    assert exited.value.code == 1
    data = json.loads(out.read_text())
    assert data["mode"] == req.SHARED_GPU_MODE and data["tp"] == 1 and data["failed"] == 1
    assert [e["name"] for e in data["results"]] == ["a/ok", "a/bad"]
    assert data["skipped"] == [{"name": "a/collective", "reason": tw.NEEDS_NCCL, "rank": 0}]
    printed = capsys.readouterr().out
    assert "SUMMARY [shared GPU (2 ranks on one device)] checks=2 failed=1 left_out=1" in printed
    assert 'LEFT OUT {"name": "a/collective"' in printed
    assert "a/collective: " + tw.NEEDS_NCCL in "\n".join(results_summary.summary(out))
    assert "FAILED rank 0 a/bad: ValueError: x" in "\n".join(results_summary.summary(out))


@pytest.mark.parametrize(
    "argv, ran", [([], ["a", "b"]), (["--sections", "b"], ["b"]), (["--replays", "7"], ["a", "b"])]
)
def test_worker_main_runs_every_section_by_default_and_writes_the_results(
    worker_state, monkeypatch, tmp_path, argv, ran
):
    monkeypatch.setattr(tw, "init_rank", lambda timeout_s: torch.device("cpu"))
    monkeypatch.setattr(tw.torch.cuda, "synchronize", lambda: None)
    out = tmp_path / "w.json"
    monkeypatch.setattr(sys, "argv", ["worker.py", "--out", str(out), *argv])
    order, replays = [], []

    def sections(dev, args):
        replays.append(args.replays)
        return {n: functools.partial(order.append, n) for n in ("a", "b")}

    with pytest.raises(SystemExit) as exited:
        tw.worker_main("unused.json", sections, replays=3)
    assert exited.value.code == 0 and order == ran
    assert replays == [7 if "--replays" in argv else 3]
    assert json.loads(out.read_text())["failed"] == 0


def test_gloo_probe_passes_where_gloo_runs_the_collectives(worker_state):
    assert tw.gloo_cuda_problem(torch.device("cpu")) is None


def test_gloo_probe_names_the_collective_gloo_cannot_run(worker_state, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("no support for _allgather_base on device cuda")

    from distgemm.compat import custom_ops

    monkeypatch.setattr(custom_ops, "all_gather_into", refuse)
    problem = tw.gloo_cuda_problem(torch.device("cpu"))
    assert problem.startswith(f"gloo (torch {torch.__version__}) cannot run all_gather_into_tensor")
    assert "RuntimeError: no support for _allgather_base on device cuda" in problem


def _crashing_probe_child(rank, world, store_path, dev_index, out_dir):
    """A probe rank that dies as gloo on CUDA tensors did (SIGSEGV) before writing anything."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGSEGV)


def test_gloo_probe_in_child_processes_runs_the_collectives():
    assert tw.probe_in_children(tw._gloo_probe_child, 2, -1, timeout_s=120) is None


def test_gloo_probe_in_child_processes_reports_a_crash_instead_of_dying():
    problem = tw.probe_in_children(_crashing_probe_child, 2, -1, timeout_s=120)
    assert problem == (
        f"gloo (torch {torch.__version__}) crashed a probe process (killed by SIGSEGV) "
        "running collectives on CPU tensors"
    )


def test_gloo_probe_on_cuda_asks_the_children_once(worker_state, monkeypatch):
    """On CUDA tensors the probe runs in child processes (rank 0's), once per device."""
    calls = []

    def probed(target, world, dev_index, timeout_s):
        calls.append((target, world, dev_index))
        return "gloo crashed"

    monkeypatch.setattr(tw, "_GLOO_PROBED", {})
    monkeypatch.setattr(tw, "probe_in_children", probed)
    dev = torch.device("cuda", 0)
    assert tw.gloo_cuda_problem(dev) == tw.gloo_cuda_problem(dev) == "gloo crashed"
    assert calls == [(tw._gloo_probe_child, 1, 0)]


# ---------------------------------------------------------------------------------------------
# Every worker's command line


@pytest.mark.parametrize("worker", WORKERS)
def test_every_worker_takes_out_and_sections(worker):
    """The launch (run_worker_json) passes --out; run_on_gpus.sh and the docs pass --sections."""
    proc = subprocess.run(
        [sys.executable, str(GPU_TESTS / f"{worker}.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--out OUT" in proc.stdout and "--sections SECTIONS" in proc.stdout
