"""Tuning tables at TP = every visible Hopper GPU (DISTGEMM_TEST_TP sets another; never 2 ranks
on one GPU): ``python -m distgemm.tune`` under torchrun measures a few Llama-8B buckets and writes
a table; then tests/gpu/tuning_worker.py, with the table in DISTGEMM_TUNING_TABLE, checks that
the ops follow it (path, S, GEMM tile in the graph) and stay correct, and that a hand-written
table forces each tile.

    python3 -m pytest -q tests/gpu/test_tuning_gpu.py

Decides by exit codes, the table file and the worker's JSON. Skips, with the reason, without the
GPUs, without Hopper, or without distgemm's CUDA runtime.
"""

import json
import pathlib

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import run_torchrun, skip_reason, tp_one_gpu_per_rank  # noqa: E402

from distgemm.runtime import tuning_table  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
TP = tp_one_gpu_per_rank()
_SKIP = skip_reason(TP, " (DISTGEMM_TEST_TP or every visible GPU)")
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))


def _torchrun(*args):
    proc = run_torchrun(*args)
    assert proc.returncode == 0, f"{proc.args}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"


def test_tune_writes_a_table_the_ops_then_follow(tmp_path, monkeypatch):
    monkeypatch.delenv(tuning_table.TABLE_ENV, raising=False)  # tune measures without a table
    table_path = tmp_path / "table.json"
    tune_args = ["distgemm.tune", "--model", "8B", "--tp", str(TP), "--tokens", "1024,4096"]
    tune_args += ["--layers", "QKV,O", "--warmup-ms", "50", "--round-ms", "20", "--rounds", "3"]
    _torchrun("-m", TP, *tune_args, "--no-progress", "--out", str(table_path))
    table = tuning_table.TuningTable.load(table_path)
    assert len(table.entries) == 4
    for e in table.entries.values():
        assert set(e.ms) == {"collective"} | {
            f"overlap/S{s}/n{t}" for s in (TP, 2 * TP) for t in (128, 256)
        }
        best = min((v, k) for k, v in e.ms.items() if k != "collective")[1]
        assert best == tuning_table.candidate_name("overlap", e.steps, e.tile_n)
        assert e.path == ("overlap" if e.ms[best] <= e.ms["collective"] else "collective")
    out = tmp_path / "worker.json"
    monkeypatch.setenv(tuning_table.TABLE_ENV, str(table_path))  # as a deployment ships it
    forced = tmp_path / "forced.json"
    _torchrun(HERE / "tuning_worker.py", TP, "--forced", str(forced), "--out", str(out))
    data = json.loads(out.read_text())
    assert data["entries"] == [4, 2]
    assert len(data["results"]) == 12  # 6 entries x 2 token counts
    bad = [r for r in data["results"] if not r["ok"]]
    assert not bad, json.dumps(bad, indent=1)
