"""The installed binaries load no shared CUDA runtime and export none of its symbols.

A shared ``libcudart.so.13`` from the toolkit has the soname of the one torch loads from its own
wheel; whichever a process loads first then serves both, and ``import distgemm._core`` before
``import torch`` crashed inside torch. The runtime is linked statically with its symbols hidden
(cpp/cuda.cmake); these checks read the ELF files of the installed package, so they run on any
machine that built the CUDA runtime, GPU or not (tests/gpu/test_first_run.py runs both import
orders on the GPUs).
"""

import pathlib
import shutil
import subprocess
import sys

import pytest

import distgemm
from distgemm import _core

PKG = pathlib.Path(distgemm.__file__).resolve().parent


def _binaries():
    files = sorted(PKG.glob("*.so")) + sorted((PKG / "bin").glob("*"))
    return [f for f in files if f.is_file()]


needs_runtime = pytest.mark.skipif(
    not getattr(_core, "cuda_runtime", False),
    reason=f"distgemm was built without the CUDA runtime ({_core.cuda_runtime_reason}): "
    "nothing to check",
)
needs_binutils = pytest.mark.skipif(
    not (shutil.which("readelf") and shutil.which("nm")), reason="readelf/nm (binutils) not on PATH"
)


def _needed(path):
    out = subprocess.run(
        ["readelf", "-d", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


@needs_runtime
@needs_binutils
def test_the_runtime_library_and_bench_are_installed():
    names = {f.name for f in _binaries()}
    assert any(n.startswith("libdistgemm_runtime") for n in names), names
    assert "distgemm_bench" in names, names


@needs_runtime
@needs_binutils
@pytest.mark.parametrize("path", _binaries(), ids=lambda p: p.name)
def test_no_shared_cuda_runtime(path):
    needed = _needed(path)
    assert not [n for n in needed if n.startswith("libcudart")], (path.name, needed)


@needs_runtime
@needs_binutils
@pytest.mark.parametrize(
    "path", [p for p in _binaries() if p.suffix == ".so"], ids=lambda p: p.name
)
def test_no_exported_cuda_runtime_symbols(path):
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True
    ).stdout
    exported = [line.split()[-1] for line in out.splitlines() if line.strip()]
    leaked = [s for s in exported if s.startswith(("cuda", "__cuda"))]
    assert not leaked, (path.name, leaked[:10])


@needs_runtime
@pytest.mark.parametrize("first", ["distgemm._core", "torch"])
def test_either_import_order_loads(first):
    pytest.importorskip("torch")
    second = "torch" if first == "distgemm._core" else "distgemm._core"
    code = (
        f"import {first}; import {second}; import distgemm._core as c; print(c.cuda_device_count())"
    )
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) >= 0
