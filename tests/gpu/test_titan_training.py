"""torchtitan's Llama-3 (8B layer shapes, 2 layers) trained with torch's async-TP, distgemm's switch
off and on, at TP = every visible GPU (DISTGEMM_TEST_TP sets another; never a shared GPU):
benchmarks/training/titan_async_tp.py runs twice under torchrun from the same seed, and
benchmarks/training/titan_compare.py decides: every step's loss within bf16 tolerance, torch's
pass fused in both runs, distgemm served calls with the switch on and none with it off.

    DISTGEMM_TEST_TP=4 python3 -m pytest -q -rs tests/gpu/test_titan_training.py

Skips, with the reason, without torchtitan (benchmarks/training/TITAN.md says which wheels to
carry), without Hopper GPUs, one per rank, or without the CUDA runtime in the installed package.
Each run is bounded by DISTGEMM_TORCHRUN_TIMEOUT (default 900 s); its command and output are
appended to the file DISTGEMM_TEST_LOG names.
"""

import importlib.util
import json
import os
import pathlib
import sys

import pytest

pytest.importorskip("torch")
from gpu_requirements import run_torchrun, skip_reason, tp_one_gpu_per_rank  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.training import titan_compare  # noqa: E402

TP = tp_one_gpu_per_rank()
ARGS = ("--layers", "2", "--steps", "50", "--seq", "4096", "--batch", "1")


def _skip() -> str | None:
    if importlib.util.find_spec("torchtitan") is None:
        return "needs torchtitan 0.2.2 and its wheels (benchmarks/training/TITAN.md)"
    return skip_reason(TP, " (DISTGEMM_TEST_TP or every visible GPU)")


SKIP = _skip()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=str(SKIP))


def _train(switch: str, out: pathlib.Path) -> dict:
    # torchrun -m from the repository root (the client is a module of benchmarks/).
    os.chdir(ROOT)
    args = ("benchmarks.training.titan_async_tp", "--switch", switch, "--out", str(out), *ARGS)
    proc = run_torchrun("-m", TP, *args)
    assert proc.returncode == 0, f"{switch}: rc={proc.returncode}\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("titan")
    return _train("off", folder / "off.json"), _train("on", folder / "on.json")


def test_losses_agree_within_bf16_tolerance(runs):
    c = titan_compare.compare(*runs)
    assert c.agree, "\n".join(c.lines())
    print("\n".join(c.lines()))


def test_async_tp_fused_in_both_runs(runs):
    for rec in runs:
        assert rec["config"]["symm_mem_enabled_for_tp_group"]
        assert all(n and n > 0 for n in rec["fusions_inserted"].values()), rec["fusions_inserted"]


def test_distgemm_serves_only_with_the_switch(runs):
    off, on = runs
    assert not off["routing_stats"]["installed"] and off["routing_stats"]["served"] == 0
    assert on["routing_stats"]["installed"] and on["routing_stats"]["served"] > 0, on[
        "routing_stats"
    ]
