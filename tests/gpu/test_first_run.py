"""What a new user runs first, each in a fresh interpreter, on the package the README installs:

    bash scripts/install.sh "[test]" && python3 -m pytest -q tests/gpu/test_first_run.py

- ``python3 -m distgemm`` (the main job): exit 0 and a RESULT line with verify=PASS;
- ``import distgemm._core`` before and after ``import torch``, each followed by CUDA work of both;
- ``torchrun --nproc-per-node TP -m benchmarks.sweep.llama_sweep --quick``: exit 0, every case
  measured, right, and no time below its compute floor;
- ``torchrun --nproc-per-node TP examples/tp_mlp.py``: exit 0.

TP = every visible GPU (DISTGEMM_TEST_TP sets another). Decides by exit codes and parsed output
(the RESULT line, the sweep's JSON). Skips, with the reason, without TP (at least 2) Hopper GPUs
or without the CUDA runtime in the installed package.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import ENV, skip_reason, tp_one_gpu_per_rank  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
TP = tp_one_gpu_per_rank()
_SKIP = skip_reason(TP, " (DISTGEMM_TEST_TP or every visible GPU)")

pytestmark = pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))


def run(args, timeout_s, cwd=ROOT):
    """A fresh interpreter (or torchrun) from a neutral directory unless told otherwise, so that
    the installed package is what runs, not the source tree."""
    proc = subprocess.run(
        args, cwd=cwd, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=timeout_s
    )
    log = os.environ.get("DISTGEMM_TEST_LOG")
    if log:
        with open(log, "a") as f:
            f.write(
                f"$ {' '.join(map(str, args))}\nrc={proc.returncode}\n{proc.stdout}\n"
                f"{proc.stderr}\n"
            )
    return proc


def explain(proc) -> str:
    return f"rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def test_main_job_verifies(tmp_path):
    proc = run([sys.executable, "-m", "distgemm"], 300, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    results = [
        dict(kv.split("=", 1) for kv in line.split()[1:])
        for line in proc.stdout.splitlines()
        if line.startswith("RESULT ")
    ]
    assert len(results) == 1, explain(proc)
    assert results[0]["verify"] == "PASS", explain(proc)
    assert float(results[0]["rel_err"]) < 1e-2


# Each order loads both runtimes, then runs a torch GEMM and a distgemm query that touches the
# device (the runtime's view of the GPUs), then a torch GEMM again.
_IMPORT_ORDERS = {
    "core_first": "import distgemm._core as c; import torch",
    "torch_first": "import torch; import distgemm._core as c",
    "package_first": "import distgemm; from distgemm import _core as c; import torch",
}
_USE_BOTH = (
    "; x = torch.randn(512, 512, device='cuda'); y = (x @ x).sum().item()"
    "; n = c.cuda_device_count(); z = (x @ x.t()).sum().item()"
    "; print('ok', n, torch.cuda.device_count(), torch.__version__)"
)


@pytest.mark.parametrize("order", sorted(_IMPORT_ORDERS))
def test_import_order(order, tmp_path):
    proc = run(
        [sys.executable, "-X", "faulthandler", "-c", _IMPORT_ORDERS[order] + _USE_BOTH],
        120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    words = proc.stdout.split()
    assert words[0] == "ok" and int(words[1]) == int(words[2]) >= TP, explain(proc)


def test_quick_sweep(tmp_path):
    proc = run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(TP),
            "-m",
            "benchmarks.sweep.llama_sweep",
            "--quick",
            "--out",
            str(tmp_path),
        ],
        900,
    )
    assert proc.returncode == 0, explain(proc)
    [path] = list(tmp_path.glob("*-llama-sweep-quick.json"))
    records = json.loads(path.read_text())["records"]
    assert records and all(r["status"] == "ok" for r in records), [
        (r["case"], r["status"], r.get("reason")) for r in records if r["status"] != "ok"
    ]
    from benchmarks.sweep.report import suspect

    below = {r["case"]: suspect(r) for r in records if suspect(r)}
    assert not below, f"times below their compute floor: {below}"


def test_tp_mlp_example():
    proc = run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(TP),
            str(ROOT / "examples" / "tp_mlp.py"),
        ],
        300,
    )
    assert proc.returncode == 0, explain(proc)
    m = re.search(r"relative error vs one GPU \(fp32\) per rank: (.*)", proc.stdout)
    assert m, explain(proc)
    errs = [float(x) for x in m.group(1).split(",")]
    assert len(errs) == TP and max(errs) < 1e-2, errs
