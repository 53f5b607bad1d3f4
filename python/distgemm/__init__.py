"""distgemm: tensor-parallel GEMMs for NVLink-connected Hopper GPUs (the package's public names).

One Plan per distributed GEMM, three consumers: the simulator (``distgemm.simulate``), the CPU
reference executor (``distgemm.plan``) and the CUDA graph runtime (``distgemm.runtime``). The
layers, each importing only those below it (docs/architecture.md)::

    compat/   nn layers, torch.library ops, drop-ins for torch's symm_mem fused ops
    ops.py    all_gather_gemm, gemm_reduce_scatter, gemm_all_reduce
    runtime/  communicator, entry cache, path choice, paths
    plan/     plan view, invariants, reference executor, timeline (no torch)
    _core     C++: scheduler, plan builder, kernels, graphs

The plan layer's names are imported here; the torch-facing ones on first use, so that the
planning tools run without importing torch.
"""

import importlib

from . import plan
from .plan import *  # noqa: F403 - the plan layer's public names are the package's

# The one home of the version: pyproject.toml reads it from here (scikit-build-core's regex).
__version__ = "0.1.0"

# Public torch-facing names -> the module that defines them (imported at first access).
_ON_FIRST_USE = {
    "all_gather_gemm": "ops",
    "gemm_reduce_scatter": "ops",
    "gemm_all_reduce": "ops",
    "default_steps": "ops",
    "path_choices": "ops",
    "memory_stats": "ops",
    "load_tuning_table": "runtime.tuning_table",
    "Communicator": "runtime.communicator",
    "close_all": "runtime.communicator",
    "ColumnParallelLinear": "compat.nn",
    "RowParallelLinear": "compat.nn",
}

__all__ = [*plan.__all__, *_ON_FIRST_USE]


def __getattr__(name):
    if name in _ON_FIRST_USE:
        value = getattr(importlib.import_module(f".{_ON_FIRST_USE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'distgemm' has no attribute {name!r}")
