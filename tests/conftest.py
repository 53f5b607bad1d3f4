"""Shared pytest fixtures: the repository root, a gloo group of one rank, and distgemm_bench."""

import os
import pathlib

import pytest

import distgemm
from distgemm import _core

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return ROOT


@pytest.fixture
def group_name() -> str:
    """The name of a one-rank gloo world group, destroyed after the test (the torch_compat
    tests' ops look groups up by name)."""
    dist = pytest.importorskip("torch.distributed")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield dist.group.WORLD.group_name
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def bench_binary() -> pathlib.Path:
    """distgemm_bench: $DISTGEMM_BENCH, else the one installed with the package; the test is
    skipped, with the real cause, where there is none."""
    if os.environ.get("DISTGEMM_BENCH"):
        return pathlib.Path(os.environ["DISTGEMM_BENCH"])
    exe = pathlib.Path(distgemm.__file__).resolve().parent / "bin" / "distgemm_bench"
    if os.access(exe, os.X_OK):
        return exe
    if not _core.cuda_runtime:
        pytest.skip(
            f"no distgemm_bench: distgemm was built without the CUDA runtime "
            f"({_core.cuda_runtime_reason}); set DISTGEMM_BENCH to a built binary"
        )
    pytest.skip(f"{exe} is missing: set DISTGEMM_BENCH to a built binary")
