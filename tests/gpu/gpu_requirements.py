"""What the torchrun GPU tests need and how they launch: the environment (NVLink multicast off),
the reason to skip on this machine (None: the tests can run) and the torchrun launch itself."""

import json
import os
import pathlib
import subprocess
import sys

import torch

from distgemm import _core

ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
}


def skip_reason(tp: int, what: str = "") -> str | None:
    """Why tests needing `tp` Hopper GPUs and the CUDA runtime cannot run here (None: they can).
    `what` names where tp came from, for the message."""
    if not getattr(_core, "cuda_runtime", False):
        return "distgemm was built without the CUDA runtime (no nvcc at build time)"
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < tp:
        return f"needs {tp} CUDA GPUs{what}, this machine has {n}"
    caps = {torch.cuda.get_device_capability(i) for i in range(tp)}
    if any(c[0] != 9 for c in caps):
        return f"needs Hopper GPUs (sm_90), found compute capability {sorted(caps)}"
    return None


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
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(nproc),
            str(worker),
            *args,
        ],
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=float(os.environ.get("DISTGEMM_TORCHRUN_TIMEOUT", "900")),
    )
    log = os.environ.get("DISTGEMM_TEST_LOG")
    if log:
        with open(log, "a") as f:
            f.write(
                f"$ {' '.join(proc.args)}\nrc={proc.returncode}\n{proc.stdout}\n{proc.stderr}\n"
            )
    return proc


def run_worker_json(worker, tp: int, out, *args: str, timeout_s: float = 600):
    """Run `worker` under torchrun on `tp` ranks (torchrun_cmd, ENV) and read the JSON it writes
    to `out`: (exit code, stderr, data). A hang is a failure with the log (rc -9), not a stuck
    run; no JSON fails the calling test with the log."""
    cmd = torchrun_cmd(worker, tp, out, *args)
    try:
        proc = subprocess.run(
            cmd, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=timeout_s
        )
        rc, err = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = -9, f"{e.stderr!r}\ntorchrun killed after {timeout_s:g} s"
    data = json.loads(pathlib.Path(out).read_text()) if pathlib.Path(out).exists() else None
    assert data is not None, f"worker wrote no results (rc={rc}):\n{err[-4000:]}"
    return rc, err, data


def named(data, prefix: str) -> list:
    """The worker results whose check name starts with ``prefix``."""
    return [e for e in data["results"] if e["name"].startswith(prefix)]


def assert_every_check_passed(results) -> None:
    """A run_worker_json result: exit code 0 and no failed check on any rank (the first 20
    failures and the log's tail in the message)."""
    rc, err, data = results
    bad = [e for e in data["results"] if not e["ok"]]
    assert rc == 0 and data["failed"] == 0 and not bad, (
        f"rc={rc}, failed checks:\n" + "\n".join(json.dumps(e) for e in bad[:20]) + err[-3000:]
    )
