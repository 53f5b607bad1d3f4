"""The Python API on 2 Hopper GPUs under torchrun (tests/gpu/torchrun_worker.py does the work);
DISTGEMM_TEST_TP=4 (or 8) runs it on that many.

    python3 -m pytest -q tests/gpu/test_torchrun_api.py            # correctness, errors, 10k calls
    # + FC1/FC2 against the C++ binary:
    DISTGEMM_BENCH=1 python3 -m pytest -q tests/gpu/test_torchrun_api.py

Decides by the worker's exit code and the numbers it writes (JSON), never by grepping output.
Skips, with the reason, without 2 CUDA GPUs, without Hopper, or when distgemm was built without
its CUDA runtime.
"""

import json
import os
import pathlib
import subprocess

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import ENV, skip_reason, torchrun_cmd  # noqa: E402

import distgemm  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "torchrun_worker.py"
SCHEDULES = ["ag_rotate_a", "ag_rotate_b", "rs_tile_a", "rs_tile_b", "gemm_allreduce"]
# Ranks of the torchrun launch = TP (default 2; DISTGEMM_TEST_TP=4 or 8 with that many GPUs).
TP = int(os.environ.get("DISTGEMM_TEST_TP", "2"))
_SKIP = skip_reason(TP, " (DISTGEMM_TEST_TP)")

pytestmark = pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))


def torchrun(tmp_path, *args, name="api"):
    out = tmp_path / f"{name}.json"
    cmd = torchrun_cmd(WORKER, TP, out, *args)
    timeout = float(os.environ.get("DISTGEMM_TORCHRUN_TIMEOUT", "900"))
    try:
        proc = subprocess.run(
            cmd, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:

        def text(b):
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")

        proc = subprocess.CompletedProcess(
            cmd, -9, text(e.stdout), text(e.stderr) + f"\ntorchrun killed after {timeout:g} s"
        )
    log = os.environ.get("DISTGEMM_TEST_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}\n")
    data = json.loads(out.read_text()) if out.exists() else None
    keep = os.environ.get("DISTGEMM_KEEP_RESULTS")  # a folder: keep the worker's JSON there
    if keep and data is not None:
        pathlib.Path(keep, f"torchrun_{name}.json").write_text(json.dumps(data, indent=1))
    return proc, data


def by_prefix(data, prefix):
    return [e for e in data["results"] if e["name"].startswith(prefix)]


def test_api_under_torchrun(tmp_path):
    proc, data = torchrun(tmp_path, "--calls", os.environ.get("DISTGEMM_CALLS", "10000"))
    assert data is not None, (
        f"worker wrote no results (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
    )
    bad = [e for e in data["results"] if not e["ok"]]
    assert proc.returncode == 0 and data["failed"] == 0 and not bad, (
        f"rc={proc.returncode}, failed checks:\n"
        + "\n".join(json.dumps(e) for e in bad[:20])
        + f"\n{proc.stderr[-3000:]}"
    )
    # Correctness: every schedule, both dtypes, every variant, checked on every rank.
    corr = by_prefix(data, "correctness/")
    for sch in SCHEDULES:
        for dt in ("bfloat16", "float16"):
            mine = [e for e in corr if e["name"].startswith(f"correctness/{sch}/{dt}/")]
            if sch == "ag_rotate_b":  # 4 variants; a transposed weight is refused (errors/)
                refused = by_prefix(data, f"errors/transposed_weight_ag_rotate_b/{dt}/")
                assert len(refused) == TP * 2 and all(e["ok"] for e in refused), refused
                assert len(mine) == TP * 4, f"{sch} {dt}: {len(mine)} results"
            else:  # 6 variants, 2 with the weight as a transposed view (wT1)
                assert len(mine) == TP * 6, (
                    f"{sch} {dt}: {len(mine)} results, expected 6 variants x {TP} ranks"
                )
                assert sum("/wT1" in e["name"] for e in mine) == TP * 2
            assert all(e["rel_err"] < 1e-2 and e["rel_err_replay"] < 1e-2 for e in mine)
    assert any("/g1" in e["name"] and e.get("gathered_equal") for e in corr)
    # Every error path ran and raised what it should, the cross-rank ones identically.
    names = {e["name"] for e in by_prefix(data, "errors/")}
    for n in [
        "cpu_tensor",
        "float32",
        "mixed_dtypes",
        "wrong_device",
        "non_contiguous",
        "misaligned",
        "m_not_divisible",
        "odd_k",
        "rank_shape_mismatch",
        "rank_dtype_mismatch",
        "rank_steps_mismatch",
        "cuda_graph_capture",
        "works_after_capture",
        "missing_rank_timeout",
        "missing_rank_named",
        "broken_communicator_refuses_launch",
        "workspace_too_small",
        "closed_communicator",
    ]:
        assert f"errors/{n}" in names, f"error path {n} did not run"
    for e in by_prefix(data, "errors/rank_"):
        assert e["same_on_every_rank"] and e["exception"] == "ValueError"
    # 10,000 calls with changing inputs: correct and no memory growth (asserted by the worker,
    # re-checked here from its numbers).
    for e in by_prefix(data, "replays/"):
        assert e["calls"] >= int(os.environ.get("DISTGEMM_CALLS", "10000"))
        assert e["worst_rel_err"] < 1e-2
        assert e["device_used_mib"][1] - e["device_used_mib"][0] < 8
    ov = by_prefix(data, "overhead/")
    assert ov and all(e["us_per_call_same_pointers"] < 100 for e in ov)


def _cpp_ms(binary, schedule, m, n, k, steps):
    cmd = [
        str(binary),
        "--schedule",
        schedule,
        "--tp",
        str(TP),
        "--steps",
        str(steps),
        "--m",
        str(m),
        "--n",
        str(n),
        "--k",
        str(k),
        "--iterations",
        "50",
        "--warmup",
        "10",
        "--no-verify",
        "--no-local",
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **ENV}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    fields = dict(kv.split("=", 1) for kv in line[len("RESULT ") :].split())
    return float(fields["ms"]), " ".join(cmd)


@pytest.mark.skipif(
    os.environ.get("DISTGEMM_BENCH") != "1",
    reason="set DISTGEMM_BENCH=1 to run "
    "the FC1/FC2 comparison with the C++ binary (about a minute)",
)
def test_python_path_within_2_percent_of_cpp(tmp_path):
    """FC1/FC2 of Llama-70B: the Python path against the single-process C++ binary. The two
    alternate twice (C++, Python, C++, Python) so that clock and thermal drift hit both; each
    side's time is the best of its rounds' medians."""
    binary = pathlib.Path(distgemm.__file__).parent / "bin" / "distgemm_bench"
    assert binary.exists(), f"{binary} is missing: the CUDA build installs it"
    shapes = {"fc1": ("ag_rotate_a", 8192, 57344, 8192), "fc2": ("rs_tile_a", 8192, 8192, 28672)}
    cpp, py, cmds = {}, {}, {}
    for rnd in range(2):
        for name, (sch, m, n, k) in shapes.items():
            for steps in (TP, 2 * TP):
                ms, cmds[(name, steps)] = _cpp_ms(binary, sch, m, n, k, steps)
                cpp.setdefault((name, steps), []).append(ms)
        proc, data = torchrun(tmp_path, "--sections", "", "--bench", name=f"bench{rnd}")
        assert proc.returncode == 0 and data is not None, proc.stderr[-3000:]
        for e in by_prefix(data, "bench/"):
            if e["rank"] == 0:
                py.setdefault((e["name"].split("/")[1], e["steps"]), []).append(e["ms"])
    rows = []
    for key in sorted(cpp):
        c, p = min(cpp[key]), min(py[key])
        rows.append((key[0], key[1], p, c, p / c - 1.0, py[key], cpp[key], cmds[key]))
    report = os.environ.get("DISTGEMM_BENCH_OUT")
    if report:
        with open(report, "w") as f:
            for r in rows:
                python_rounds = [round(x, 4) for x in r[5]]
                cpp_rounds = [round(x, 4) for x in r[6]]
                f.write(
                    f"{r[0]} S={r[1]} python_ms={r[2]:.4f} cpp_ms={r[3]:.4f} "
                    f"diff={100 * r[4]:+.2f}% python_rounds={python_rounds} "
                    f"cpp_rounds={cpp_rounds} cpp_cmd={r[7]}\n"
                )
    assert len(rows) == 4
    for name, steps, p, c, diff, *_ in rows:
        assert diff < 0.02, (
            f"{name} S={steps}: Python {p:.4f} ms vs C++ {c:.4f} ms ({100 * diff:+.2f}%)"
        )
