"""The Plan layer (no torch): the plan as a dict, its invariants, reference executor, timeline.

Everything here reads a plan built by ``distgemm._core`` and nothing above this layer.
"""

from .invariants import Violation, verify_plan
from .reference import ExecutionError, run_reference
from .view import (
    PlanDict,
    build_plan,
    clone_plan,
    schedule_definition,
    schedule_names,
    tile_map,
    workspace_bytes,
)

__all__ = [
    "PlanDict",
    "Violation",
    "ExecutionError",
    "build_plan",
    "verify_plan",
    "clone_plan",
    "run_reference",
    "schedule_definition",
    "schedule_names",
    "tile_map",
    "workspace_bytes",
]
