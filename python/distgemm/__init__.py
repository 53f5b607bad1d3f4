"""distgemm: tensor-parallel GEMMs for NVLink-connected Hopper GPUs.

One Plan per distributed GEMM, three consumers: the simulator (``distgemm.simulate``), the CPU
reference executor (``distgemm.reference``) and the CUDA graph runtime. The torch-facing ops
(``all_gather_gemm``, ``gemm_reduce_scatter``, ``gemm_all_reduce``), ``Communicator``, the
training layers (``distgemm.nn``) and the drop-ins for torch's fused ops (``distgemm.torch_compat``,
fp8: ``distgemm.torch_compat_fp8``) are imported on first use, so that the planning tools work
without importing torch.
"""

from .check import Violation, check_plan
from .plan import (
    Plan,
    build_plan,
    clone_plan,
    schedule_definition,
    schedule_names,
    tile_map,
    workspace_bytes,
)
from .reference import ExecutionError, run_reference

__all__ = [
    "Plan",
    "Violation",
    "ExecutionError",
    "build_plan",
    "check_plan",
    "clone_plan",
    "run_reference",
    "schedule_definition",
    "schedule_names",
    "tile_map",
    "workspace_bytes",
    # torch-facing, imported lazily:
    "all_gather_gemm",
    "gemm_reduce_scatter",
    "gemm_all_reduce",
    "default_steps",
    "path_choices",
    "load_tuning_table",
    "Communicator",
    "close_all",
    "memory_stats",
    "ColumnParallelLinear",
    "RowParallelLinear",
]
# The one home of the version: pyproject.toml reads it from here (scikit-build-core's regex).
__version__ = "0.1.0"

_LAZY = {
    "all_gather_gemm": "ops",
    "gemm_reduce_scatter": "ops",
    "gemm_all_reduce": "ops",
    "default_steps": "ops",
    "path_choices": "ops",
    "load_tuning_table": "tuning",
    "Communicator": "comm",
    "close_all": "comm",
    "memory_stats": "comm",
    "ColumnParallelLinear": "nn",
    "RowParallelLinear": "nn",
}
_SUBMODULES = (
    "nn",
    "custom_ops",
    "torch_compat",
    "torch_compat_fp8",
)  # torch-facing, imported on first use


def __getattr__(name):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'distgemm' has no attribute {name!r}")
