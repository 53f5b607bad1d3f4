"""The C++ scheduler/plan tests, built with the host compiler alone (no CUDA) and run here."""

import shutil
import subprocess

import pytest


def test_cpp_scheduler_tests_pass(repo_root, tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "a host C++ compiler (g++) is required to build cpp/tests/test_scheduler.cpp"
    exe = tmp_path / "test_scheduler"
    build = subprocess.run(
        [
            cxx,
            "-std=c++17",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{repo_root / 'cpp/include'}",
            f"-I{repo_root / 'schedules'}",
            str(repo_root / "cpp/tests/test_scheduler.cpp"),
            "-o",
            str(exe),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    last = run.stdout.strip().splitlines()[-1]
    passed, failed = (int(w) for w in last.replace(",", "").split()[::2][:2])
    assert run.returncode == 0 and failed == 0, run.stdout[-4000:]
    assert passed > 1000, f"only {passed} C++ checks ran"


@pytest.mark.parametrize("header", ["partition.hpp", "scheduler.hpp", "plan.hpp"])
def test_schedule_headers_compile_alone(repo_root, tmp_path, header):
    """Each core header is self-contained and needs no CUDA."""
    cxx = shutil.which("g++") or shutil.which("c++")
    src = tmp_path / "one.cpp"
    src.write_text(f'#include "distgemm/schedule/{header}"\nint main() {{ return 0; }}\n')
    r = subprocess.run(
        [cxx, "-std=c++17", "-fsyntax-only", f"-I{repo_root / 'cpp/include'}", str(src)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def _nvcc():
    import os

    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if os.access("/usr/local/cuda/bin/nvcc", os.X_OK) else None
    )


@pytest.mark.skipif(
    _nvcc() is None, reason="nvcc not found: the device-code compile check needs the CUDA compiler"
)
def test_scheduler_is_usable_in_device_code(repo_root, tmp_path):
    """DistributedTileScheduler is host+device: a kernel can ask it for tiles (a compile check,
    no GPU)."""
    src = tmp_path / "dev.cu"
    src.write_text(
        '#include "distgemm/schedule/scheduler.hpp"\n#include "all.hpp"\n'
        "using namespace distgemm::schedule;\n"
        "__global__ void tiles(ScheduleDef def, int tp, int steps, int* out) {\n"
        "  DistributedTileScheduler s(def, tp, steps);\n"
        "  int d = threadIdx.x / steps, i = threadIdx.x % steps;\n"
        "  out[threadIdx.x] = s.tile(d, i) * 16 + s.source_device(d, i) +\n"
        "                     s.destination_device(d, i);\n"
        "}\n"
    )
    r = subprocess.run(
        [
            _nvcc(),
            "-std=c++17",
            "-gencode=arch=compute_90a,code=sm_90a",
            f"-I{repo_root / 'cpp/include'}",
            f"-I{repo_root / 'schedules'}",
            "-c",
            str(src),
            "-o",
            str(tmp_path / "dev.o"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
