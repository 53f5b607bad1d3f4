"""How the torchrun GPU tests launch here: the ranks and whether they share one GPU (Launch), the
environment (NVLink multicast off; gloo and DISTGEMM_ALLOW_SHARED_GPU=1 for a shared GPU), the
reason to skip on this machine, the torchrun launch itself, and reading the worker's JSON.

One visible GPU: the multi-rank tests run as 2 ranks sharing it (a functional run of the
multi-rank paths: CUDA IPC between two processes on one device, whose kernels time-slice the GPU;
never a timing). Two or more: one rank per GPU, as before (DISTGEMM_TEST_TP sets the ranks).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import torch

from distgemm import _core
from distgemm.runtime.communicator import SHARED_GPU_ENV

ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
}
# What the results and the test output call the two launch modes.
SHARED_GPU_MODE = "shared GPU (2 ranks on one device)"
SHARED_RANKS = 2
TP_ENV = "DISTGEMM_TEST_TP"
RESULTS_ENV = "DISTGEMM_TEST_RESULTS"  # a folder that keeps the workers' JSON
TIMEOUT_ENV = "DISTGEMM_TORCHRUN_TIMEOUT"  # seconds: the bound of every worker run
# Time slicing makes every cross-rank wait slower on a shared GPU: bound a worker's run by this
# multiple of its one-GPU-per-rank bound.
SHARED_SLOWDOWN = 3


def visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def multi_gpu_mode(tp: int) -> str:
    return f"{tp} GPU{'s' if tp > 1 else ''}, one rank per GPU"


def choose_ranks(gpus: int, tp_setting: str | None, default_tp: int | None) -> tuple[int, bool]:
    """(ranks, shared) for a machine with `gpus` visible GPUs: one GPU gives 2 ranks sharing it
    (whatever DISTGEMM_TEST_TP says); two or more give `tp_setting` (DISTGEMM_TEST_TP, None:
    unset; ValueError unless 1..8), else `default_tp`, else every visible GPU."""
    if gpus == 1:
        return SHARED_RANKS, True
    if gpus == 0:  # nothing runs (skip_reason says why); the setting is not read
        return default_tp or SHARED_RANKS, False
    if tp_setting:
        if not tp_setting.isdigit() or not 1 <= int(tp_setting) <= 8:
            raise ValueError(f"{TP_ENV}={tp_setting!r} is not a rank count from 1 to 8")
        return int(tp_setting), False
    return (default_tp or gpus), False


def tp_one_gpu_per_rank() -> int:
    """The ranks of a test that never shares a GPU (it times, or runs what a user runs):
    DISTGEMM_TEST_TP, else every visible GPU; 2 with fewer than 2 visible, where skip_reason
    then says what is missing."""
    gpus = visible_gpus()
    if gpus == 0:  # nothing runs; the setting (run_on_gpus.sh's 0) is not read
        return 2
    return choose_ranks(max(gpus, 2), os.environ.get(TP_ENV), None)[0]


def skip_reason(tp: int, what: str = "", shared: bool = False) -> str | None:
    """Why tests needing `tp` Hopper GPUs (`shared`: one GPU for every rank) and the CUDA runtime
    cannot run here (None: they can). `what` names where tp came from, for the message."""
    if not getattr(_core, "cuda_runtime", False):
        return f"distgemm was built without the CUDA runtime ({_core.cuda_runtime_reason})"
    n = visible_gpus()
    if n == 0:
        return f"needs a CUDA GPU (with one, {SHARED_GPU_MODE}), this machine has none"
    gpus = 1 if shared else tp
    if n < gpus:
        return f"needs {gpus} CUDA GPUs{what}, this machine has {n}"
    caps = {torch.cuda.get_device_capability(i) for i in range(gpus)}
    if any(c[0] != 9 for c in caps):
        return f"needs Hopper GPUs (sm_90), found compute capability {sorted(caps)}"
    return None


@dataclasses.dataclass(frozen=True)
class Launch:
    """How a multi-rank GPU test runs on this machine: `tp` ranks, each on its own GPU or
    (`shared`) all on GPU 0; `skip`: why it cannot run here (None: it can)."""

    tp: int
    shared: bool
    skip: str | None

    @property
    def mode(self) -> str:
        return SHARED_GPU_MODE if self.shared else multi_gpu_mode(self.tp)

    def env(self) -> dict[str, str]:
        """The workers' environment: ENV, and DISTGEMM_ALLOW_SHARED_GPU=1 exactly when shared
        (the workers then join a gloo group; with one GPU per rank it is removed, so that the
        real mode runs NCCL whatever the caller's environment says)."""
        env = {k: v for k, v in os.environ.items() if k != SHARED_GPU_ENV}
        env.update(ENV)
        if self.shared:
            env[SHARED_GPU_ENV] = "1"
        return env

    def timeout_s(self, one_gpu_per_rank_s: float) -> float:
        return one_gpu_per_rank_s * (SHARED_SLOWDOWN if self.shared else 1)


def launch_here(default_tp: int | None = None, honour_tp_env: bool = True) -> Launch:
    """The Launch of this machine: see choose_ranks (`honour_tp_env`: DISTGEMM_TEST_TP may set
    the ranks)."""
    setting = os.environ.get(TP_ENV) if honour_tp_env else None
    tp, shared = choose_ranks(visible_gpus(), setting, default_tp)
    what = f" ({TP_ENV})" if setting else (" (every visible GPU)" if default_tp is None else "")
    return Launch(tp, shared, skip_reason(tp, what, shared))


# worker file name -> the mode it ran in, for the end of the pytest run (tests/gpu/conftest.py)
LAUNCHED: dict[str, str] = {}


def results_file(tmp_path_factory, name: str) -> pathlib.Path:
    """Where a worker writes its JSON: under DISTGEMM_TEST_RESULTS when set (kept), else in a
    pytest temporary folder."""
    keep = os.environ.get(RESULTS_ENV)
    folder = pathlib.Path(keep) if keep else tmp_path_factory.mktemp(name)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}.json"


def torchrun_cmd(worker, tp: int, out, *args: str) -> list[str]:
    """The command that runs `worker` under torchrun on `tp` local ranks, writing JSON to `out`."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(tp),
        str(worker),
        "--out",
        str(out),
        *args,
    ]


def run_torchrun(worker, nproc: int, *args: str) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node nproc worker *args`` with ENV, output captured, bounded by
    DISTGEMM_TORCHRUN_TIMEOUT (default 900 s); appended to the file DISTGEMM_TEST_LOG names."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
        + [str(worker), *args],
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=float(os.environ.get(TIMEOUT_ENV, "900")),
    )
    log = os.environ.get("DISTGEMM_TEST_LOG")
    if log:
        with open(log, "a") as f:
            f.write(
                f"$ {' '.join(proc.args)}\nrc={proc.returncode}\n{proc.stdout}\n{proc.stderr}\n"
            )
    return proc


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def run_worker_json(worker, launch: Launch, out, *args: str, timeout_s: float = 600):
    """Run `worker` under torchrun as `launch` says and read the JSON it writes to `out`:
    (exit code, stdout + stderr, data). `timeout_s` bounds a run with one GPU per rank
    (Launch.timeout_s scales it; DISTGEMM_TORCHRUN_TIMEOUT, in seconds, replaces both); a hang is
    a failure with the log (rc -9), not a stuck run; no JSON fails the calling test with the log.
    The command and its output are appended to the file DISTGEMM_TEST_LOG names."""
    cmd = torchrun_cmd(worker, launch.tp, out, *args)
    limit = float(os.environ.get(TIMEOUT_ENV) or launch.timeout_s(timeout_s))
    LAUNCHED[pathlib.Path(worker).name] = launch.mode
    pathlib.Path(out).unlink(missing_ok=True)
    try:
        proc = subprocess.run(cmd, env=launch.env(), capture_output=True, text=True, timeout=limit)
        rc, log = proc.returncode, f"{proc.stdout}\n{proc.stderr}"
    except subprocess.TimeoutExpired as e:
        rc = -9
        log = f"{_text(e.stdout)}\n{_text(e.stderr)}\ntorchrun killed after {limit:g} s"
    if os.environ.get("DISTGEMM_TEST_LOG"):
        with open(os.environ["DISTGEMM_TEST_LOG"], "a") as f:
            f.write(f"$ [{launch.mode}] {' '.join(cmd)}\nrc={rc}\n{log}\n")
    data = json.loads(pathlib.Path(out).read_text()) if pathlib.Path(out).exists() else None
    assert data is not None, f"[{launch.mode}] worker wrote no results (rc={rc}):\n{log[-4000:]}"
    # torchrun_worker.finish's format says how the ranks ran: as launched, or the test is wrong
    assert "results" not in data or data.get("mode") == launch.mode, (
        f"the worker ran as {data.get('mode')!r}, the test launched it as {launch.mode!r}"
    )
    return rc, log, data


def skip_unless_launchable(launch: Launch):
    """A test module's ``pytestmark``: skip, with the reason, where `launch` cannot run."""
    import pytest

    return pytest.mark.skipif(launch.skip is not None, reason=str(launch.skip))


def worker_results(launch: Launch, worker: str, name: str, *args: str, timeout_s: float = 600):
    """A module-scoped fixture: `worker` (a file of tests/gpu) run once under torchrun as
    `launch` says, with `args`, its JSON under ``results_file(..., name)``; the fixture's value
    is run_worker_json's (exit code, log, data)."""
    import pytest

    path = pathlib.Path(__file__).resolve().parent / worker

    @pytest.fixture(scope="module")
    def results(tmp_path_factory):
        out = results_file(tmp_path_factory, name)
        return run_worker_json(path, launch, out, *args, timeout_s=timeout_s)

    return results


def named(data, prefix: str) -> list:
    """The worker results whose check name starts with ``prefix``."""
    return [e for e in data["results"] if e["name"].startswith(prefix)]


def covers(outer: str, inner: str) -> bool:
    """Whether the check name `outer` is `inner` or one of its parents ("a/b" covers "a/b/c",
    not "a/bc"); names are paths, "/"-separated."""
    outer = outer.rstrip("/")
    return inner.rstrip("/") == outer or inner.startswith(outer + "/")


def checks_under(data, name: str) -> list:
    """The worker results named `name` or under it (see covers)."""
    return [e for e in data["results"] if covers(name, e["name"])]


def left_out_reason(data, name: str) -> str | None:
    """Why the worker left out the check `name` or checks under it (a recorded skip covering it
    or covered by it), None when it did not."""
    for s in data.get("skipped", []):
        if covers(s["name"], name) or covers(name, s["name"]):
            return s["reason"]
    return None


def ran_or_skip(data, name: str) -> list:
    """checks_under(data, name), or pytest.skip with the worker's reason when it left those
    checks out (a skipped check never counts as passed)."""
    import pytest

    got = checks_under(data, name)
    reason = left_out_reason(data, name)
    if not got and reason is not None:
        pytest.skip(f"{data['mode']}: {name} left out: {reason}")
    return got


def rank0_check(results, name: str, launch: Launch) -> dict:
    """Rank 0's numbers of check `name` in a run_worker_json result, once every rank of `launch`
    ran it (each rank's verdict: assert_every_check_passed), or pytest.skip with the worker's
    reason where it left the check out."""
    got = ran_or_skip(results[2], name)
    assert len(got) == launch.tp, f"[{launch.mode}] {name}: {len(got)} ranks of {launch.tp}"
    return next(e for e in got if e["rank"] == 0)


def assert_every_check_passed(results) -> None:
    """A run_worker_json result: exit code 0 and no failed check on any rank (the first 20
    failures, with their errors and tracebacks, and the log's tail in the message)."""
    rc, log, data = results
    bad = [e for e in data["results"] if not e["ok"]]
    assert rc == 0 and data["failed"] == 0 and not bad, (
        f"[{data['mode']}] rc={rc}, failed checks:\n"
        + "\n".join(json.dumps(e) for e in bad[:20])
        + log[-3000:]
    )
