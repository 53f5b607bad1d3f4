"""Bad input is rejected naming the constraint and the values: build_plan and run_reference with
ValueError, the command-line tools and the example with exit code 2 and one line on stderr (no
traceback), before anything is planned or allocated."""

import os
import re
import subprocess
import sys

import pytest

import distgemm
from distgemm import build_plan


@pytest.mark.parametrize(
    "schedule,tp,steps,shape,message",
    [
        ("ag_rotate_a", 2, 8, dict(m=8191, n=64, k=64), "M=8191 is not divisible by TP=2"),
        ("ag_rotate_a", 2, 2, dict(m=64, n=63, k=64), "N=63 is not divisible by TP=2"),
        ("ag_rotate_b", 2, 4, dict(m=64, n=67, k=64), "N=67 is not divisible by TP=2"),
        ("ag_rotate_b", 3, 3, dict(m=64, n=63, k=64), "M=64 is not divisible by TP=3"),
        ("rs_tile_a", 4, 4, dict(m=64, n=64, k=66), "K=66 is not divisible by TP=4"),
        ("rs_tile_a", 2, 4, dict(m=67, n=64, k=64), "M=67 is not divisible by TP=2"),
        ("rs_tile_a", 4, 4, dict(m=9, n=64, k=64), "M=9 is not divisible by TP=4"),
        ("rs_tile_b", 2, 4, dict(m=64, n=67, k=64), "N=67 is not divisible by TP=2"),
    ],
    ids=lambda v: v if isinstance(v, str) and " " not in v else None,
)
def test_shapes_the_partition_cannot_split(schedule, tp, steps, shape, message):
    with pytest.raises(ValueError, match=message):
        build_plan(schedule, tp, steps, **shape)


@pytest.mark.parametrize(
    "schedule,tp,message",
    [
        ("ag_rotate_a", 4, "M=6 is not divisible by TP=4: ag_rotate_a shards A on M"),
        ("rs_tile_a", 4, "M=6 is not divisible by TP=4: rs_tile_a shards C/D on M"),
    ],
)
def test_rows_not_divisible_by_tp_name_the_constraint(schedule, tp, message):
    """All-gather and reduce-scatter over M need every rank to hold M/TP rows (as torch's
    collectives do); the message says so with the values."""
    with pytest.raises(ValueError, match=message + r" \(every device holds M/TP of it\)"):
        build_plan(schedule, tp, 2 * tp, m=6, n=64, k=64)


@pytest.mark.parametrize(
    "schedule,tp,steps,shape",
    [
        ("ag_rotate_a", 2, 8, dict(m=8190, n=64, k=64)),
        ("ag_rotate_b", 2, 4, dict(m=64, n=66, k=64)),
        ("rs_tile_a", 2, 4, dict(m=66, n=64, k=64)),
        ("rs_tile_b", 2, 4, dict(m=64, n=66, k=64)),
        ("ar_tile_a", 2, 2, dict(m=63, n=64, k=64)),
        ("ar_tile_a", 8, 8, dict(m=1, n=64, k=64)),
    ],
)
def test_splits_that_s_does_not_divide_build_uneven_tiles(schedule, tp, steps, shape):
    """S need not divide the split mode: the tiles are uneven (even empty) and the plan still
    proves its invariants and computes the GEMM."""
    plan = build_plan(schedule, tp, steps, **shape)
    assert distgemm.verify_plan(plan) == []
    assert distgemm.run_reference(plan, beta=0.5, use_bias=True) < 1e-9


def test_unknown_schedule_lists_known_ones():
    with pytest.raises(
        ValueError, match=r"unknown schedule 'ag_rotate_c'; known schedules: ag_rotate_a, "
    ):
        build_plan("ag_rotate_c", 2, m=64, n=64, k=64)


@pytest.mark.parametrize("tp", [0, -1, 9, 16])
def test_tp_out_of_range(tp):
    with pytest.raises(
        ValueError, match=rf"TP={tp} is out of range: distgemm supports 1 <= TP <= 8"
    ):
        build_plan("rs_tile_a", tp, max(tp, 1) * 2 if tp > 0 else 2, m=64, n=64, k=64)


@pytest.mark.parametrize("tp,steps", [(2, 3), (4, 6), (2, 1), (3, 0)])
def test_steps_not_a_multiple_of_tp(tp, steps):
    with pytest.raises(ValueError, match=rf"S={steps} is not a positive multiple of TP={tp}"):
        build_plan("ag_rotate_a", tp, steps, m=96, n=96, k=96)


@pytest.mark.parametrize("dim", ["m", "n", "k", "l"])
def test_non_positive_sizes(dim):
    shape = dict(m=64, n=64, k=64, l=1)
    shape[dim] = 0
    with pytest.raises(ValueError, match="problem sizes must be positive"):
        build_plan("rs_tile_b", 2, **shape)


def test_non_integer_arguments():
    with pytest.raises(ValueError, match=r"m must be an int, got 64.0"):
        build_plan("rs_tile_b", 2, m=64.0, n=64, k=64)
    with pytest.raises(ValueError, match=r"steps must be an int"):
        build_plan("rs_tile_b", 2, "4", m=64, n=64, k=64)


def test_valid_input_builds():
    plan = build_plan("ar_tile_a", 2, 4, m=64, n=64, k=64)
    assert plan["steps"] == 4 and plan["chunks_per_shard"] == 2


def test_torch_ops_are_exported_lazily():
    import subprocess
    import sys

    # The planning tools do not import torch; the ops do, on first use.
    code = (
        "import sys, distgemm; assert 'torch' not in sys.modules; "
        "f = distgemm.all_gather_gemm; assert 'torch' in sys.modules; "
        "assert f is __import__('distgemm.ops', fromlist=['x']).all_gather_gemm; "
        "assert distgemm.Communicator.__name__ == 'Communicator'"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = distgemm.nope


def test_run_reference_refuses_sizes_that_take_minutes():
    """The README's old example (15 min, 12.7 GB on a 2-core CPU) is refused at once."""
    plan = build_plan("rs_tile_a", tp=4, steps=8, m=8192, n=8192, k=28672)
    with pytest.raises(
        ValueError,
        match=r"M=8192 N=8192 K=28672 L=1 \(1924145348608 multiply-adds, .* is above the CPU "
        r"reference executor's 2\*\*34 multiply-adds or 2\*\*27 elements",
    ):
        distgemm.run_reference(plan)


# ---------------------------------------------------------------------------------------------
# The command-line tools: exit code 2, one line on stderr, nothing on stdout.


def run(*argv, env=None):
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, **(env or {})),
    )


def assert_refused(proc, *parts):
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    assert proc.stdout == ""


EXTENT = "is not in 1..2147483647 (2**31-1: distgemm's GEMMs take int32 extents)"
OVERFLOW = "above 2**60: its byte count overflows 64 bits"


@pytest.mark.parametrize(
    "argv,parts",
    [
        (["--tp", "0"], ["argument --tp: 0 is not in 1..8"]),
        (["--tp", "-1"], ["argument --tp: -1 is not in 1..8"]),
        (["--tp", "9"], ["argument --tp: 9 is not in 1..8"]),
        (["--steps", "0"], ["argument --steps: 0 is not in 1..128"]),
        (["--tp", "2", "--steps", "3"], ["S=3 is not a positive multiple of TP=2"]),
        (["--m", "0"], ["argument --m: 0 " + EXTENT]),
        (["--n", "-5"], ["argument --n: -5 " + EXTENT]),
        (["--k", "abc"], ["argument --k: 'abc' is not an integer"]),
        (["--seed", "-1"], ["argument --seed: -1 is below 0"]),
        (["--m", "1000000000000"], ["argument --m: 1000000000000 " + EXTENT]),
        (
            ["--m", "2147483646", "--n", "2147483646", "--k", "64"],
            ["D holds M*N*L = 4611686009837453316 elements", OVERFLOW],
        ),
        (
            # Within every limit but memory: ~1 PiB of float64 on the CPU reference executor.
            ["--m", "2147483646", "--n", "57344", "--k", "8192"],
            ["M=2147483646 N=57344 K=8192 needs about", "this machine has available"],
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) and v[0].startswith("--") else None,
)
def test_main_refuses(argv, parts):
    assert_refused(run("-m", "distgemm", "--cpu", *argv), "python -m distgemm: error: ", *parts)


SIM = ["-m", "distgemm.simulate", "--schedule", "ag_rotate_a", "--tp", "2"]


@pytest.mark.parametrize(
    "argv,parts",
    [
        (["--m", "1000000000000"], ["argument --m: 1000000000000 " + EXTENT]),
        (["--m", str(2**52)], [f"argument --m: {2**52} " + EXTENT]),
        (["--n", str(2**62)], [f"argument --n: {2**62} " + EXTENT]),
        (["--k", str(10**22)], [f"argument --k: {10**22} " + EXTENT]),
        (["--l", "0"], ["argument --l: 0 " + EXTENT]),
        (
            ["--m", "2147483646", "--n", "2147483646", "--k", "64"],
            ["D holds M*N*L = 4611686009837453316 elements", OVERFLOW],
        ),
        (
            ["--m", "2147483646", "--n", "64", "--k", "2147483647", "--l", "2147483647"],
            ["A holds M*K*L = ", OVERFLOW],
        ),
        (["--steps", str(10**22)], [f"argument --steps: {10**22} is not in 1..128"]),
        (["--tp", "0"], ["argument --tp: 0 is not in 1..8"]),
        (["--timeline", "--tflops", "0"], ["argument --tflops: 0 is not a finite number above 0"]),
        (["--slots", str(10**22)], [f"--slots={10**22} is above 2**31-1"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) and v[0].startswith("--") else None,
)
def test_simulate_refuses(argv, parts):
    assert_refused(run(*SIM, *argv), "python -m distgemm.simulate: error: ", *parts)


def test_simulate_ends_quietly_when_its_reader_goes():
    """`... | head -1`: the reader closes the pipe; the tool ends with exit code 1, no
    traceback (the table is ~150 KB, above a pipe's buffer, so the write hits the closed pipe)."""
    argv = ["-m", "distgemm.simulate", "--schedule", "rs_tile_a", "--tp", "8", "--steps", "128"]
    proc = subprocess.Popen(
        [sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().startswith("schedule rs_tile_a:")
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1
    assert err == ""


@pytest.mark.parametrize(
    "tool",
    [
        "distgemm",
        "distgemm.simulate",
        "distgemm.tune",
    ],
)
def test_help_has_the_whole_description_and_every_option(tool, monkeypatch):
    """--help shows the module docstring to its end and a help text for every option."""
    import importlib

    from distgemm import cli

    module = importlib.import_module("distgemm.__main__" if tool == "distgemm" else tool)
    parsers = []

    def capture(self, args=None, namespace=None):
        parsers.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(cli.ArgumentParser, "parse_args", capture)
    with pytest.raises(SystemExit):
        (module.parse_args if tool == "distgemm.tune" else module.main)([])
    (parser,) = parsers
    assert parser.description == module.__doc__.replace("``", "`")
    assert [a.option_strings for a in parser._actions if not a.help] == []
    proc = run("-m", tool, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: "), proc.stderr
    last_line = module.__doc__.strip().splitlines()[-1].replace("``", "`").strip()
    assert last_line in proc.stdout


def test_tune_refuses_with_one_line():
    proc = run("-m", "distgemm.tune", "--model", "70B", "--tp", "9", "--dry-run")
    assert_refused(proc, "python -m distgemm.tune: error: --tp 9 is not in 1..8")
    proc = run("-m", "distgemm.tune", "--model", "70B", "--tp", "2", "--tiles", "x")
    assert_refused(proc, "argument --tiles: 'x' is not comma-separated integers")
    proc = run("-m", "distgemm.tune", "--model", "70B", "--tp", "2", "--tokens", str(2**70))
    assert_refused(proc, f"--tokens: {2**70} is not a power of two up to 2**30")


# ---------------------------------------------------------------------------------------------
# The example without torchrun or without GPUs


def test_example_without_torchrun(repo_root):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    proc = subprocess.run(
        [sys.executable, str(repo_root / "examples" / "tp_mlp.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert_refused(
        proc, "tp_mlp.py: runs one process per GPU under torchrun: torchrun --nproc-per-node 2"
    )


def test_example_under_torchrun_without_gpus(repo_root):
    """As torchrun starts it (RANK, LOCAL_RANK, WORLD_SIZE set) on a machine whose torch sees no
    GPU."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": ""}
    proc = run(str(repo_root / "examples" / "tp_mlp.py"), env=env)
    assert_refused(proc, "tp_mlp.py: needs CUDA GPUs, one per rank; torch sees none")


# ---------------------------------------------------------------------------------------------
# distgemm_bench (where the CUDA runtime is built; no GPU is made visible to it)


def bench(exe, *args):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60, env=env)


BENCH_OPTIONS = """--schedule --tp --steps --m --n --k --l --dtype --scales --fast-accum
    --iterations --warmup --warmup-ms --alpha --beta --bias --timeout-s --replays
    --simulate-missing-device --check-update --no-verify --no-local --seed --swizzle --raster --pdl
    --no-pdl --partial-via --tile-n --verify-rows --graph-json --sweep --models --tokens --layers
    --csv --dry-run""".split()


def test_bench_help_describes_every_option(bench_binary):
    proc = bench(bench_binary, "--help")
    assert proc.returncode == 0, proc.stderr
    described = proc.stdout.split("single case:", 1)[1]  # below the usage lines
    for option in BENCH_OPTIONS:
        assert re.search(rf"(^|\s){re.escape(option)}(\s|$)", described, re.M), option


@pytest.mark.parametrize(
    "args,message",
    [
        (("--tp", "0"), "--tp 0 is not in 1..8"),
        (("--steps", "0"), "--steps 0 is not in 1..128"),
        (("--m", "0"), "--m 0 is not in 1..2147483647"),
        (("--m", str(10**22)), f"--m {10**22} is not in 1..2147483647"),
        (("--k", "12abc"), "--k takes an integer, got '12abc'"),
        (("--m", "2147483647", "--n", "2147483647"), "D (M*N*L) of M=2147483647 N=2147483647"),
        (("--timeout-s", "0"), "--timeout-s 0 is not above 0"),
        (("--bogus",), "unknown argument --bogus"),
    ],
)
def test_bench_refuses_with_one_line(bench_binary, args, message):
    proc = bench(bench_binary, *args)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: {message}") and line.endswith("(see distgemm_bench --help)")


def test_bench_without_a_gpu_says_so(bench_binary):
    """Not the first CUDA call's error (cudaErrorInsufficientDriver without a driver)."""
    shape = ("--m", "256", "--n", "256", "--k", "256")
    proc = bench(bench_binary, "--schedule", "ag_rotate_a", "--tp", "2", *shape)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: no CUDA GPU visible (cudaGetDeviceCount: "), line


@pytest.mark.parametrize(
    "sizes,needle",
    [
        (dict(m=10**22), f"m={10**22} is out of range: problem sizes are at most 2147483647"),
        (dict(k=-(2**70)), f"k={-(2**70)} is out of range"),
        (dict(m=2**31), "problem sizes must be at most 2**31-1 (the GEMMs take int32 extents)"),
        (dict(m=2**31 - 2, n=2**31 - 2), "D (M*N*L) of M=2147483646 N=2147483646 K=64 L=1"),
        (dict(m=2**31 - 2, k=2**31 - 2), "A (M*K*L) of M=2147483646 N=64 K=2147483646"),
    ],
)
def test_build_plan_refuses_sizes_past_the_bounds_in_words(sizes, needle):
    """The library's boundary, not only the CLIs': every size is checked in C++ (int32 extents,
    operands of at most 2**60 elements) and ints past int64 before the binding sees them."""
    import distgemm

    shape = dict(m=64, n=64, k=64) | sizes
    with pytest.raises(ValueError) as e:
        distgemm.build_plan("ag_rotate_a", 2, 2, **shape)
    assert needle in str(e.value)
    if "(M*" in needle:
        assert "is above 2**60 elements: its byte count overflows 64 bits" in str(e.value)
