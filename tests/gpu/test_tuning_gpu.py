"""Tuning tables on 2 Hopper GPUs: ``python -m distgemm.tune`` under torchrun measures a few
Llama-8B buckets and writes a table; then tests/gpu/tuning_worker.py, with the table in
DISTGEMM_TUNING_TABLE, checks that the ops follow it (path, S, GEMM tile in the graph) and stay
correct, and that a hand-written table forces each tile. DISTGEMM_TEST_TP=4 (or 8) runs it on
that many GPUs.

    python3 -m pytest -q tests/gpu/test_tuning_gpu.py

Decides by exit codes, the table file and the worker's JSON. Skips, with the reason, without the
GPUs, without Hopper, or without distgemm's CUDA runtime.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import ENV, skip_reason  # noqa: E402

from distgemm import tuning  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
TP = int(os.environ.get("DISTGEMM_TEST_TP", "2"))
_SKIP = skip_reason(TP, " (DISTGEMM_TEST_TP)")
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))


def _torchrun(args, env, timeout=600):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(TP), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return proc


def test_tune_writes_a_table_the_ops_then_follow(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != tuning.TABLE_ENV} | ENV
    table_path = tmp_path / "table.json"
    _torchrun(
        [
            "-m",
            "distgemm.tune",
            "--model",
            "8B",
            "--tp",
            str(TP),
            "--tokens",
            "1024,4096",
            "--layers",
            "QKV,O",
            "--warmup-ms",
            "50",
            "--round-ms",
            "20",
            "--rounds",
            "3",
            "--no-progress",
            "--out",
            str(table_path),
        ],
        env,
    )
    table = tuning.TuningTable.load(table_path)
    assert len(table.entries) == 4
    for e in table.entries.values():
        assert set(e.ms) == {"collective"} | {
            f"overlap/S{s}/n{t}" for s in (TP, 2 * TP) for t in (128, 256)
        }
        best = min((v, k) for k, v in e.ms.items() if k != "collective")[1]
        assert best == tuning.candidate_name("overlap", e.steps, e.tile_n)
        assert e.path == ("overlap" if e.ms[best] <= e.ms["collective"] else "collective")
    out = tmp_path / "worker.json"
    _torchrun(
        [
            str(HERE / "tuning_worker.py"),
            "--forced",
            str(tmp_path / "forced.json"),
            "--out",
            str(out),
        ],
        env | {tuning.TABLE_ENV: str(table_path)},
    )
    data = json.loads(out.read_text())
    assert data["entries"] == [4, 2]
    assert len(data["results"]) == 12  # 6 entries x 2 token counts
    bad = [r for r in data["results"] if not r["ok"]]
    assert not bad, json.dumps(bad, indent=1)
