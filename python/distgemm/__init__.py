"""distgemm: tensor-parallel GEMMs for NVLink-connected Hopper GPUs.

One Plan per distributed GEMM, three consumers: the simulator (``distgemm.simulate``), the CPU
reference executor (``distgemm.reference``) and the CUDA graph runtime.
"""
from .check import Violation, check_plan
from .plan import Plan, build_plan, clone_plan, schedule_definition, schedule_names, tile_map, workspace_bytes
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
]
__version__ = "0.1.0"
