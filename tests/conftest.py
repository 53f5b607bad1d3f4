"""Shared pytest fixtures: the repository root and a gloo group of one rank."""

import pathlib

import pytest

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
