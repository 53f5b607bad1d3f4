"""scripts/install.sh's progress filter: the build's steps are shown as they happen, one short line
each, and nothing else of pip's log (the function is run as the script defines it)."""

import pathlib
import selectors
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUN_FILTER = "source <(sed -n '/^show_progress()/,/^}/p' scripts/install.sh) && show_progress"


def start_filter() -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", "-c", RUN_FILTER],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


def read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    assert sel.select(timeout_s), f"no line from the filter within {timeout_s} s"
    return proc.stdout.readline()


def test_a_step_is_printed_before_the_build_goes_on():
    """The filter must not wait for more input (mawk reads its input in blocks and printed the
    steps of a 20-minute build only at its end)."""
    proc = start_filter()
    try:
        proc.stdin.write(
            "  [7/46 386.227s] Building CUDA object CMakeFiles/distgemm_runtime.dir/cpp/src/"
            "runtime/gemm_bf16_n128_c11.cu.o\n"
        )
        proc.stdin.flush()
        assert read_line(proc, 10.0) == "  [7/46 386s] gemm_bf16_n128_c11.cu\n"
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


def test_only_the_progress_lines_pass():
    log = "\n".join(
        [
            "  Running command Building wheel for distgemm (pyproject.toml)",
            "  *** Configuring CMake...",
            "  -- The CXX compiler identification is GNU 12.2.0",
            "  Downloading numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl (16.8 MB)",
            "  [44/46 75.3s] Linking CXX shared library libdistgemm_runtime.so",
            "  [46/46 75s] Linking CXX executable distgemm_bench",
            "  Successfully installed distgemm-0.1.0",
            "",
        ]
    )
    proc = start_filter()
    out, _ = proc.communicate(log, timeout=30)
    assert proc.returncode == 0
    assert out.splitlines() == [
        "  *** Configuring CMake...",
        "  Downloading numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl (16.8 MB)",
        "  [44/46 75s] libdistgemm_runtime.so",
        "  [46/46 75s] distgemm_bench",
        "  Successfully installed distgemm-0.1.0",
    ]
