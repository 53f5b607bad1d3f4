"""GPU tests of the C++ runtime through the distgemm_bench binary (cpp/examples/).

Each test runs the binary in a subprocess and decides by its exit code and the numbers of its
`RESULT key=value ...` line. Skipped, with the reason, where there is no CUDA GPU, fewer than
two, no Hopper GPU, or no built binary (the installed package's, DISTGEMM_BENCH, or build-gpu/).
"""

import csv
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest
from graph_checks import check_graphs

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _bench_path():
    """DISTGEMM_BENCH, else the binary of the installed package (what the README's install
    builds), else a development build in build-gpu/ or build/."""
    env = os.environ.get("DISTGEMM_BENCH")
    if env:
        return pathlib.Path(env)
    try:
        import distgemm

        installed = [pathlib.Path(distgemm.__file__).resolve().parent / "bin" / "distgemm_bench"]
    except ImportError:
        installed = []
    for cand in (
        *installed,
        ROOT / "build-gpu" / "distgemm_bench",
        ROOT / "build" / "distgemm_bench",
    ):
        if cand.exists():
            return cand
    return None


def _gpus():
    """(count, compute capabilities) from nvidia-smi; (0, []) when there is no usable GPU."""
    if shutil.which("nvidia-smi") is None:
        return 0, []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return 0, []
    caps = [line.strip() for line in out.splitlines() if line.strip()]
    return len(caps), caps


BENCH = _bench_path()
NGPU, CAPS = _gpus()
# TP of these tests: every visible GPU (2 with fewer: the skip below says so); DISTGEMM_TEST_TP
# sets another.
TP = int(os.environ.get("DISTGEMM_TEST_TP") or max(NGPU, 2))

pytestmark = [
    pytest.mark.skipif(NGPU == 0, reason="no CUDA GPU (nvidia-smi finds none)"),
    pytest.mark.skipif(0 < NGPU < TP, reason=f"needs {TP} GPUs (DISTGEMM_TEST_TP), found {NGPU}"),
    pytest.mark.skipif(
        NGPU >= TP and not all(c.startswith("9.") for c in CAPS[:TP]),
        reason=f"needs Hopper (sm_90a) GPUs, found compute capability {CAPS[:TP]}",
    ),
    pytest.mark.skipif(
        BENCH is None or not BENCH.exists(),
        reason="distgemm_bench is not built: bash scripts/install.sh installs it with the "
        "package (or set DISTGEMM_BENCH)",
    ),
]

SMALL = [
    "--m",
    "2048",
    "--n",
    "1024",
    "--k",
    "1024",
    "--iterations",
    "3",
    "--warmup",
    "1",
    "--warmup-ms",
    "0",
    "--no-local",
]

# L=2 batches with beta, bias and a graph-exec update to new buffers, in a few short replays.
BATCHED_WITH_UPDATE = (
    *("--m", "1024", "--n", "1024", "--k", "512", "--l", "2", "--beta", "0.5", "--bias"),
    *("--check-update", "--iterations", "3", "--warmup", "1", "--no-local"),
)


def run_bench(*args, timeout=180):
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    proc = subprocess.run(
        [str(BENCH), *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    result = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = dict(tok.split("=", 1) for tok in line.split()[1:])
    return proc, result


SCHEDULES = ["ag_rotate_a", "ag_rotate_b", "rs_tile_a", "rs_tile_b", "ar_tile_a"]
CASES = [
    (s, steps, dt, beta, bias)
    for s in SCHEDULES
    for steps in (TP, 2 * TP, 4 * TP)
    for dt in ("bf16", "fp16")
    for beta in ("0", "0.5")
    for bias in (False, True)
]


def _case_param(s, st, dt, b, bi):
    return pytest.param(s, st, dt, b, bi, id=f"{s}-S{st}-{dt}-beta{b}-{'bias' if bi else 'nobias'}")


@pytest.mark.parametrize("schedule,steps,dtype,beta,bias", [_case_param(*c) for c in CASES])
def test_verifies(schedule, steps, dtype, beta, bias):
    args = [
        "--schedule",
        schedule,
        "--tp",
        str(TP),
        "--steps",
        str(steps),
        "--dtype",
        dtype,
        "--beta",
        beta,
        *SMALL,
    ] + (["--bias"] if bias else [])
    proc, res = run_bench(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert res.get("verify") == "PASS"
    assert float(res["rel_err"]) < 1e-2


RING = ["rs_tile_a", "rs_tile_b", "ar_tile_a"]  # the schedules with partials
TRANSPORT = [
    (s, steps, via, pdl)
    for s in RING
    for steps in (TP, 2 * TP)
    for via in ("epilogue", "copy")
    for pdl in ("--pdl", "--no-pdl")
]


@pytest.mark.parametrize(
    "schedule,steps,via,pdl",
    TRANSPORT,
    ids=[f"{s}-S{st}-{v}{p.replace('--', '-')}" for s, st, v, p in TRANSPORT],
)
def test_partial_transport_and_pdl_verify(schedule, steps, via, pdl):
    """Partials by the epilogue (peer writes) or by the copy engine (staged, pushed), each with
    and without programmatic launch between the steps: beta, bias and batches on, every element
    checked; the run reports what it used."""
    proc, res = run_bench(
        "--schedule",
        schedule,
        "--tp",
        str(TP),
        "--steps",
        str(steps),
        "--partial-via",
        via,
        pdl,
        *BATCHED_WITH_UPDATE,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert res["verify"] == "PASS" and float(res["rel_err"]) < 1e-2
    assert 0 <= float(res["rel_err_update"]) < 1e-2
    # One step is one GEMM: no launch to overlap, so the graph reports no PDL (TP=1, S=1).
    want_pdl = "1" if pdl == "--pdl" and steps > 1 else "0"
    assert res["partial_via"] == via and res["pdl"] == want_pdl


def test_defaults_reported():
    """Without --pdl/--partial-via the library defaults apply (device::pdl_by_default,
    schedule::default_plan_options) and the RESULT line says which."""
    want = {
        ("ag_rotate_a", TP): ("1", "epilogue"),
        ("ag_rotate_a", 2 * TP): ("1", "epilogue"),
        ("rs_tile_a", TP): ("0", "epilogue"),
        ("rs_tile_a", 2 * TP): ("1", "copy"),
    }
    for (schedule, steps), (pdl, via) in want.items():
        pdl = pdl if steps > 1 else "0"  # one GEMM: nothing for PDL to overlap (TP=1, S=1)
        proc, res = run_bench(
            "--schedule", schedule, "--tp", str(TP), "--steps", str(steps), *SMALL
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (res["pdl"], res["partial_via"]) == (pdl, via), (schedule, steps)


TILES = [(s, t, dt) for s in SCHEDULES for t in ("128", "256") for dt in ("bf16", "fp16")]


@pytest.mark.parametrize("schedule,tile,dtype", TILES, ids=[f"{s}-n{t}-{dt}" for s, t, dt in TILES])
def test_each_tile_kernel_verifies(schedule, tile, dtype):
    """Both GEMM kernels (output tile 128x128 and 128x256) forced on every GEMM of the plan:
    beta, bias, batches and a pointer update on, every element checked."""
    proc, res = run_bench(
        "--schedule",
        schedule,
        "--tp",
        str(TP),
        "--steps",
        str(2 * TP),
        "--tile-n",
        tile,
        "--dtype",
        dtype,
        *BATCHED_WITH_UPDATE,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert res["verify"] == "PASS" and float(res["rel_err"]) < 1e-2
    assert 0 <= float(res["rel_err_update"]) < 1e-2
    assert res["tile_n"] == tile
    assert res["gemm_n128"] == (str(2 * TP) if tile == "128" else "0")


def test_tile_choice_follows_the_wave_model():
    """Without --tile-n each GEMM's tile comes from kernel::choose_tile_n: steps of 512 rows x
    4096 (the 1024-token O projection at TP=2) underfill the GPU with 128x256 tiles and get
    128x128; 8192-row steps of an 8192-wide output fill it and keep 128x256. The RESULT line
    reports it. Rows scale with TP, so every TP runs the same step shapes."""
    proc, res = run_bench(
        "--schedule",
        "rs_tile_a",
        "--tp",
        str(TP),
        "--steps",
        str(TP),
        "--m",
        str(512 * TP),
        "--n",
        "4096",
        "--k",
        str(2048 * TP),
        *SMALL[6:],
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert res["verify"] == "PASS" and res["tile_n"] == "auto"
    assert res["gemm_n128"] == str(TP)
    proc, res = run_bench(
        "--schedule",
        "rs_tile_a",
        "--tp",
        str(TP),
        "--steps",
        str(TP),
        "--m",
        str(8192 * TP),
        "--n",
        "8192",
        "--k",
        str(256 * TP),
        *SMALL[6:],
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert res["verify"] == "PASS" and res["gemm_n128"] == "0"


GRAPHS = [(s, steps) for s in SCHEDULES for steps in (TP, 2 * TP)]


@pytest.mark.parametrize("schedule,steps", GRAPHS, ids=[f"{s}-S{st}" for s, st in GRAPHS])
def test_captured_graph_matches_the_plan(schedule, steps, tmp_path):
    """The graphs the runtime captured (--graph-json, every device): node counts as the stats
    say, the GEMMs a chain, each signal after what it publishes and before the wait kernels, and
    each slot write leading to its reader through edges or the flag it waits for
    (tests/gpu/graph_checks.py)."""
    out = tmp_path / "graph.json"
    plan = dict(schedule=schedule, tp=TP, steps=steps, graph_json=out)
    proc, res = run_bench(
        *[x for k, v in plan.items() for x in (f"--{k.replace('_', '-')}", str(v))], *SMALL
    )
    assert proc.returncode == 0 and res["verify"] == "PASS", proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert (doc["schedule"], doc["tp"], doc["steps"]) == (schedule, TP, steps)
    assert doc["partial_via"] == res["partial_via"]
    assert check_graphs(doc) == []
    line = re.search(
        r"graph dev0: (\d+) GEMM, (\d+) copy, (\d+) signal nodes, (\d+) wait kernels", proc.stdout
    )
    st = doc["devices"][0]["stats"]
    assert line and [int(x) for x in line.groups()] == [
        st["gemm_nodes"],
        st["copy_nodes"],
        st["signal_nodes"],
        st["wait_kernels"],
    ]
    assert st["gemm_nodes"] == steps and st["pdl"] == (res["pdl"] == "1")


def test_bad_tile_n_rejected():
    proc, _ = run_bench(
        "--schedule", "rs_tile_a", "--tp", str(TP), "--steps", str(TP), "--tile-n", "64", *SMALL
    )
    assert proc.returncode == 2
    assert "--tile-n takes auto, 128 or 256, got 64" in proc.stderr


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_batched_and_graph_update(schedule):
    proc, res = run_bench(
        "--schedule",
        schedule,
        "--tp",
        str(TP),
        "--steps",
        str(2 * TP),
        "--m",
        "1024",
        "--n",
        "1024",
        "--k",
        "512",
        "--l",
        "3",
        "--beta",
        "0.5",
        "--bias",
        "--alpha",
        "0.75",
        "--check-update",
        "--iterations",
        "3",
        "--warmup",
        "1",
        "--no-local",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(res["rel_err"]) < 1e-2
    assert 0 <= float(res["rel_err_update"]) < 1e-2  # new buffers via graph-exec update
    assert float(res["update_ms"]) >= 0 and float(res["rebuild_ms"]) >= 0


@pytest.mark.skipif(TP < 2, reason=f"a peer must go missing: needs TP >= 2, DISTGEMM_TEST_TP={TP}")
@pytest.mark.parametrize(
    "schedule,missing,via",
    [
        ("ag_rotate_a", 1, "epilogue"),
        ("rs_tile_a", 0, "epilogue"),
        ("rs_tile_a", 0, "copy"),
        ("ar_tile_a", 1, "copy"),
    ],
)
def test_missing_device_reports_timeout(schedule, missing, via):
    proc, res = run_bench(
        "--schedule",
        schedule,
        "--tp",
        str(TP),
        "--steps",
        str(TP),
        *SMALL,
        "--timeout-s",
        "2",
        "--simulate-missing-device",
        str(missing),
        "--partial-via",
        via,
        timeout=60,
    )
    assert proc.returncode == 1
    assert res.get("timeout_reported") == "1"
    assert "did not reach generation" in proc.stderr
    assert float(res["seconds"]) < 10  # one timeout, not one per step


def test_misaligned_shape_rejected_before_launch():
    proc, _ = run_bench(
        "--schedule",
        "ag_rotate_a",
        "--tp",
        str(TP),
        "--steps",
        str(TP),
        "--m",
        "512",
        "--n",
        "512",
        "--k",
        "516",
    )
    assert proc.returncode == 2
    assert "rejected before launch" in proc.stderr and "K=516" in proc.stderr


def test_replays_do_not_leak_and_still_verify():
    proc, res = run_bench(
        "--schedule",
        "rs_tile_a",
        "--tp",
        str(TP),
        "--steps",
        str(TP),
        "--m",
        "4096",
        "--n",
        "4096",
        "--k",
        "4096",
        "--replays",
        "2000",
        "--iterations",
        "5",
        "--warmup",
        "2",
        "--no-local",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(res["rel_err_replays"]) < 1e-2


def test_local_floor_timed_around_the_plan():
    """The single case's floor (the local GEMM alone) is timed before and after the plan, and
    local_ms is their mean, so that the clock's drift over the run weighs on both sides."""
    proc, res = run_bench(
        *("--schedule", "ag_rotate_a", "--tp", str(TP), "--steps", str(TP)),
        *("--m", "4096", "--n", "4096", "--k", "4096", "--iterations", "20", "--warmup", "2"),
        *("--warmup-ms", "100"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, after = float(res["local_before_ms"]), float(res["local_after_ms"])
    local_ms, ms = float(res["local_ms"]), float(res["ms"])
    assert before > 0 and after > 0 and ms > 0
    assert local_ms == pytest.approx((before + after) / 2, rel=1e-3)
    assert float(res["overlap_eff"]) == pytest.approx(local_ms / ms, rel=1e-2)


def test_llama_sweep_subset(tmp_path):
    """`--sweep` on two 70B layers at 4096 tokens: every (case, S) verified and timed beside the
    local kernel; decided by the exit code and the CSV's numbers, the table read for its rows."""
    out = tmp_path / "sweep.csv"
    proc, _ = run_bench(
        "--sweep",
        "quick",
        "--tp",
        str(TP),
        "--models",
        "70B",
        "--tokens",
        "4096",
        "--layers",
        "QKV,O",
        "--csv",
        str(out),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    # (M, N, K): QKV N = (64 + 2*8) * 128, K = 8192; O N = 8192, K = 64 * 128.
    want = {f"70B/QKV/M4096/TP{TP}": (4096, 10240, 8192), f"70B/O/M4096/TP{TP}": (4096, 8192, 8192)}
    assert [(r["case"], r["steps"]) for r in rows] == [
        (c, str(s)) for c in want for s in (TP, 2 * TP)
    ]
    for r in rows:
        assert (int(r["m"]), int(r["n"]), int(r["k"])) == want[r["case"]]
        assert r["status"] == "ok", r
        assert float(r["rel_err"]) < 1e-2
        assert int(r["rows_checked"]) == 256
        ms, local_ms = float(r["ms"]), float(r["local_ms"])
        assert ms > 0 and local_ms > 0
        assert float(r["overlap_eff"]) == pytest.approx(local_ms / ms, rel=1e-2)
        # the floor is timed before and after the case's plans, and the mean is reported
        before, after = float(r["local_before_ms"]), float(r["local_after_ms"])
        assert before > 0 and after > 0
        assert local_ms == pytest.approx((before + after) / 2, rel=1e-3)
        flops = 2.0 * want[r["case"]][0] * want[r["case"]][1] * want[r["case"]][2]
        assert float(r["tflops_per_gpu"]) == pytest.approx(
            flops / TP / (ms * 1e-3) / 1e12, rel=1e-2
        )
    for case in want:
        times = {r["steps"]: float(r["ms"]) for r in rows if r["case"] == case}
        assert {r["best_steps"] for r in rows if r["case"] == case} == {min(times, key=times.get)}
    table = [line for line in proc.stdout.splitlines() if line.startswith("70B/")]
    assert len(table) == 4 and all(line.rstrip().endswith("PASS") for line in table), proc.stdout
    progress = [line for line in proc.stderr.splitlines() if line.startswith("[")]
    assert [p.split()[0] for p in progress] == ["[1/2]", "[2/2]"], proc.stderr


# fp8 (e4m3): A and B quantized with one scale per tensor or one per row (--scales row), bf16 out.
# The bound is the issue's: relative Frobenius error below 1e-2 against the fp32 GEMM of the
# dequantized inputs (the kernels measure 1.7e-3 accurate, 2e-3 - 4.3e-3 with fast accumulation,
# benchmarks/results/2026-11-24-fp8-kernel.md); an error of exactly 0 would mean the reference
# saw the kernel's own output.
FP8_BOUND = 1e-2
FP8 = [(s, scales) for s in SCHEDULES for scales in ("tensor", "row")]


def _gemm_nodes(proc):
    """The GEMM nodes of device 0's graph, from the plan line."""
    found = re.search(r"graph dev0: (\d+) GEMM", proc.stdout)
    assert found, proc.stdout
    return int(found.group(1))


def _assert_fp8(proc, res, scales, fast_accum):
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (res["dtype"], res["scales"], res["fast_accum"]) == ("fp8", scales, fast_accum)
    assert res["verify"] == "PASS" and 0 < float(res["rel_err"]) < FP8_BOUND, res
    # The accurate kernel has 128x192 tiles, the fast-accumulation one 128x256: no 128x128 node.
    kernel = "e4m3_128x256fa" if fast_accum == "1" else "e4m3_128x192"
    assert f"fp8 kernel {kernel}" in proc.stdout and f"scales {scales}" in proc.stdout
    assert res["gemm_n128"] == "0" and _gemm_nodes(proc) > 0


@pytest.mark.parametrize("schedule,scales", FP8, ids=[f"{s}-{sc}" for s, sc in FP8])
def test_fp8_verifies(schedule, scales):
    """Every schedule at fp8 with tensor-wise and row-wise scales (row scales travel with their
    rows in the all-gather plans; the ring plans move bf16 partials), S = 2*TP, every element of
    D checked against the dequantized fp32 reference."""
    proc, res = run_bench(
        *("--schedule", schedule, "--tp", str(TP), "--steps", str(2 * TP)),
        *("--dtype", "fp8", "--scales", scales, *SMALL),
    )
    _assert_fp8(proc, res, scales, "0")


@pytest.mark.parametrize("schedule", ["ag_rotate_a", "rs_tile_a"])
def test_fp8_fast_accum_verifies(schedule):
    """--fast-accum runs the fast-accumulation kernel on every GEMM, within the same bound."""
    proc, res = run_bench(
        *("--schedule", schedule, "--tp", str(TP), "--steps", str(TP), "--dtype", "fp8"),
        *("--scales", "row", "--fast-accum", "--k", "4096", *SMALL[:4], *SMALL[6:]),
    )
    _assert_fp8(proc, res, "row", "1")
    assert res["k"] == "4096"


@pytest.mark.parametrize("schedule", ["ag_rotate_b", "rs_tile_a", "ar_tile_a"])
def test_fp8_batched_with_c_bias_and_update(schedule):
    """Tensor-wise scales with L=2 batches, bf16 C (beta) and bias, partials by the copy engine
    and a graph-exec update to new buffers: each added in the fp8 epilogue after the scales."""
    proc, res = run_bench(
        *("--schedule", schedule, "--tp", str(TP), "--steps", str(2 * TP), "--dtype", "fp8"),
        *("--partial-via", "copy", *BATCHED_WITH_UPDATE),
    )
    _assert_fp8(proc, res, "tensor", "0")
    assert (res["l"], res["beta"], res["bias"]) == ("2", "0.5", "1")
    assert 0 < float(res["rel_err_update"]) < FP8_BOUND


def test_fp8_llama_sweep_subset(tmp_path):
    """`--sweep --dtype fp8 --scales row` on a 70B all-gather and a reduce-scatter layer: each
    (case, S) verified within the bound and timed; the CSV carries dtype, scales and fast_accum,
    and TF/s counts 2*M*N*K as at bf16."""
    out = tmp_path / "sweep-fp8.csv"
    proc, _ = run_bench(
        *("--sweep", "quick", "--tp", str(TP), "--models", "70B", "--tokens", "4096"),
        *("--layers", "QKV,O", "--dtype", "fp8", "--scales", "row", "--csv", str(out)),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fp8 (row scales)" in proc.stdout
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["case"], r["steps"]) for r in rows] == [
        (c, str(s)) for c in (f"70B/QKV/M4096/TP{TP}", f"70B/O/M4096/TP{TP}") for s in (TP, 2 * TP)
    ]
    for r in rows:
        assert (r["dtype"], r["scales"], r["fast_accum"], r["status"]) == ("fp8", "row", "0", "ok")
        assert 0 < float(r["rel_err"]) < FP8_BOUND, r
        ms = float(r["ms"])
        flops = 2.0 * int(r["m"]) * int(r["n"]) * int(r["k"])
        assert float(r["tflops_per_gpu"]) == pytest.approx(
            flops / TP / (ms * 1e-3) / 1e12, rel=1e-2
        )


# Uneven steps (S does not divide the split mode: tiles differ by a row, or along N by 8
# columns) and decode-size token counts with empty tiles (fewer rows than steps, skipped on every
# device): (schedule, S, M, N). Every row is checked (--verify-rows 0), beta and bias on, so each
# tile's C rows and bias slice are read at its own offset and the TMA stores of a tile of m rows
# (m not a multiple of 128, the next tile's rows right behind it) must stay inside the tile.
UNEVEN = [
    *[("ar_tile_a", TP, m, 1024) for m in (1, 3, TP + 1, 127, 255)],
    *[("ar_tile_a", 2 * TP, m, 1024) for m in (1, 2 * TP + 1, 129)],
    ("rs_tile_a", 2 * TP, 3 * TP, 1024),  # shards of 3 rows in 2 steps: 2 + 1
    ("rs_tile_a", 4 * TP, 2 * TP, 1024),  # shards of 2 rows in 4 steps: 2 empty
    ("rs_tile_a", 2 * TP, 1001 * TP, 1024),
    ("ag_rotate_a", 2 * TP, 3 * TP, 1024),
    ("ag_rotate_a", 4 * TP, 2 * TP, 1024),
    ("ag_rotate_b", 2 * TP, 2 * TP, 24 * TP),  # N shards of 24 columns in 2 steps: 16 + 8
    ("ag_rotate_b", 4 * TP, 2 * TP, 24 * TP),  # ... in 4 steps: 8 + 8 + 8 + empty
    ("rs_tile_b", 2 * TP, 5, 24 * TP),
    ("rs_tile_b", 4 * TP, 5, 24 * TP),
]


def _uneven_args(schedule, steps, m, n, *extra):
    return (
        *("--schedule", schedule, "--tp", str(TP), "--steps", str(steps)),
        *("--m", str(m), "--n", str(n), "--k", "1024", "--beta", "0.5", "--bias"),
        *("--verify-rows", "0", "--iterations", "3", "--warmup", "1", "--warmup-ms", "0"),
        *("--no-local", *extra),
    )


@pytest.mark.parametrize(
    "schedule,steps,m,n", UNEVEN, ids=[f"{s}-S{st}-M{m}-N{n}" for s, st, m, n in UNEVEN]
)
def test_uneven_steps_verify(schedule, steps, m, n):
    proc, res = run_bench(*_uneven_args(schedule, steps, m, n))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert res.get("verify") == "PASS" and float(res["rel_err"]) < 1e-2


UNEVEN_RING = [(s, via) for s in ("rs_tile_a", "ar_tile_a") for via in ("epilogue", "copy")]


@pytest.mark.parametrize("schedule,via", UNEVEN_RING, ids=[f"{s}-{v}" for s, v in UNEVEN_RING])
def test_uneven_partials_batched_with_update(schedule, via):
    """Empty tiles (shards of 2 rows in 4 steps) with partials by the epilogue and by the copy
    engine, L=2 (a slot longer than its tile: per-batch copies) and a graph-exec update to new
    buffers."""
    proc, res = run_bench(
        *_uneven_args(schedule, 4 * TP, 2 * TP, 1024),
        *("--l", "2", "--partial-via", via, "--check-update"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert res["verify"] == "PASS" and float(res["rel_err"]) < 1e-2
    assert 0 <= float(res["rel_err_update"]) < 1e-2


@pytest.mark.parametrize(
    "schedule,steps,m", [("ar_tile_a", max(TP, 2), 1), ("rs_tile_a", 4 * TP, 2 * TP)]
)
def test_uneven_graph_skips_empty_tiles(schedule, steps, m, tmp_path):
    """The captured graphs of plans with empty tiles: fewer GEMM nodes than S, and every signal,
    wait and slot transfer as the plan says (tests/gpu/graph_checks.py)."""
    out = tmp_path / "graph.json"
    proc, res = run_bench(*_uneven_args(schedule, steps, m, 1024, "--graph-json", str(out)))
    assert proc.returncode == 0 and res["verify"] == "PASS", proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert check_graphs(doc) == []
    gemm_nodes = [d["stats"]["gemm_nodes"] for d in doc["devices"]]
    assert all(0 < g < steps for g in gemm_nodes), gemm_nodes
