"""The Python API under torchrun at TP = every visible Hopper GPU (tests/gpu/torchrun_worker.py
does the work); DISTGEMM_TEST_TP sets another. With one GPU, 2 ranks share it (gloo,
DISTGEMM_ALLOW_SHARED_GPU=1: a functional run, said so in the results' "mode"; the collective
and auto paths and the wrong-device error are left out, their tests skip with the reason).

    python3 -m pytest -q -rs tests/gpu/test_torchrun_api.py        # correctness, errors, 10k calls
    # + FC1/FC2 against the C++ binary (2 GPUs or more):
    DISTGEMM_BENCH=1 python3 -m pytest -q tests/gpu/test_torchrun_api.py

Decides by the worker's exit code and the numbers it writes (JSON, kept under
DISTGEMM_TEST_RESULTS when set), never by grepping output. Skips, with the reason, without a
Hopper GPU, or when distgemm was built without its CUDA runtime.
"""

import os
import pathlib
import subprocess

import pytest

torch = pytest.importorskip("torch")
from gpu_requirements import (  # noqa: E402
    ENV,
    assert_every_check_passed,
    launch_here,
    named,
    ran_or_skip,
    run_worker_json,
    skip_unless_launchable,
    worker_results,
)

import distgemm  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "torchrun_worker.py"
SCHEDULES = ["ag_rotate_a", "ag_rotate_b", "rs_tile_a", "rs_tile_b", "ar_tile_a"]
# Ranks of the torchrun launch = TP: every visible GPU, or DISTGEMM_TEST_TP.
LAUNCH = launch_here()
TP = LAUNCH.tp
CALLS = int(os.environ.get("DISTGEMM_CALLS", "10000"))
ERROR_PATHS = [
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
]

pytestmark = skip_unless_launchable(LAUNCH)


api = worker_results(
    LAUNCH, "torchrun_worker.py", "torchrun_api", "--calls", str(CALLS), timeout_s=900
)


def test_every_check_passed_on_every_rank(api):
    assert_every_check_passed(api)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_every_variant_matches_torch_on_every_rank(api, schedule, dtype):
    _, _, data = api
    mine = named(data, f"correctness/{schedule}/{dtype}/")
    if schedule == "ag_rotate_b":  # 4 variants; a transposed weight is refused (errors/)
        refused = named(data, f"errors/transposed_weight_ag_rotate_b/{dtype}/")
        assert len(refused) == TP * 2 and all(e["ok"] for e in refused), refused
        assert len(mine) == TP * 4, f"{schedule} {dtype}: {len(mine)} results"
    else:  # 6 variants, 2 with the weight as a transposed view (wT1)
        assert len(mine) == TP * 6, f"{schedule} {dtype}: {len(mine)} results, 6 x {TP} ranks"
        assert sum("/wT1" in e["name"] for e in mine) == TP * 2
    assert all(e["rel_err"] < 1e-2 and e["rel_err_replay"] < 1e-2 for e in mine), mine


def test_return_gathered_equals_torch(api):
    _, _, data = api
    assert any("/g1" in e["name"] and e.get("gathered_equal") for e in named(data, "correctness/"))


@pytest.mark.parametrize("name", ERROR_PATHS)
def test_error_path_raised_what_it_should(api, name):
    _, _, data = api
    got = ran_or_skip(data, f"errors/{name}")
    assert got and all(e["ok"] for e in got), got
    if name.startswith("rank_"):  # the cross-rank ones identically on every rank
        assert all(e["same_on_every_rank"] and e["exception"] == "ValueError" for e in got)


@pytest.mark.parametrize("kind", ["collective", "auto"])
def test_paths_compute_what_the_plan_computes(api, kind):
    _, _, data = api
    got = ran_or_skip(data, f"paths/{kind}")
    assert got and all(e["ok"] for e in got), got


def test_ten_thousand_calls_correct_without_memory_growth(api):
    """Asserted by the worker, re-checked here from its numbers."""
    _, _, data = api
    got = named(data, "replays/")
    assert len(got) == 2 * TP, got
    for e in got:
        assert e["calls"] >= CALLS
        assert e["worst_rel_err"] < 1e-2
        assert e["device_used_mib"][1] - e["device_used_mib"][0] < 8


def test_host_overhead_per_call(api):
    _, _, data = api
    ov = named(data, "overhead/")
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
@pytest.mark.skipif(LAUNCH.shared, reason=f"{LAUNCH.mode}: a timing needs one GPU per rank")
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
        rc, log, data = run_worker_json(
            WORKER, LAUNCH, tmp_path / f"bench{rnd}.json", "--sections", "", "--bench"
        )
        assert rc == 0, log[-3000:]
        for e in named(data, "bench/"):
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
