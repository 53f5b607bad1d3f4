"""The collective path: the group's NCCL collective and one torch GEMM, the baseline to beat.

On the current stream, capturable (no synchronisation, and inside a capture its buffers come from
the caller's graph pool).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    ReduceScatterOptions,
)

from ..communicator import Communicator
from ..scales import scaled_mm_scales
from ..spec import Spec
from .common import PathState, gathered_shape, stream_ptr, user_ptrs


def collective_kind(spec: Spec) -> str:
    """The collective path's branch, read from the C++ definition once per entry:
    "gather_a" / "gather_w" (all-gather of the activations or of the weight), "all_reduce",
    "scatter_n" (D sharded on N: rs_tile_b), "scatter_m" (D sharded on M)."""
    d = spec.plan.definition
    if d["collective"] == "all_gather":
        return "gather_a" if d["rotating"] == "A" else "gather_w"
    if d["collective"] == "all_reduce":
        return "all_reduce"
    return "scatter_n" if d["partition"]["d"] == "N" else "scatter_m"


@dataclass(eq=False)
class CollectiveState(PathState):
    """A collective state: its branch, the gathered operand's shape and its scratch buffers."""

    kind: str = ""
    gathered_shape: tuple[int, int] = (0, 0)
    scratch: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)  # (name, stream)

    @classmethod
    def create(cls, spec: Spec, precision, beta: float, gathered: bool) -> CollectiveState:
        kind = collective_kind(spec)
        return cls(
            **cls.call_fields(spec, precision, beta, gathered),
            kind=kind,
            gathered_shape=gathered_shape(spec) if kind.startswith("gather") else (0, 0),
        )

    def run(self, op: str, comm: Communicator, tensors, out, capturing: bool):
        return run_collective(op, comm, self, tensors, out, capturing)

    def release(self) -> None:
        self.scratch.clear()


def _blocking(options):
    """Collective options of a blocking call, as ``torch.distributed``'s own blocking calls set
    them (``asyncOp = False``): NCCL then runs on the caller's stream, without the side stream
    and the pair of events an asynchronous call costs (two more nodes per call inside a captured
    graph). Sum is the default reduction."""
    if hasattr(options, "asyncOp"):
        options.asyncOp = False
    return options


def _finish(work) -> None:
    """Completes a collective call: a blocking call of a CUDA process group returns no work
    object (the collective is already ordered on the caller's stream), others return one."""
    if work is not None:
        work.wait()


_ALLGATHER = _blocking(AllgatherOptions())
_ALLREDUCE = _blocking(AllreduceOptions())
_REDUCE_SCATTER = _blocking(ReduceScatterOptions())


def run_collective(
    op: str, comm: Communicator, state: CollectiveState, tensors, out, capturing: bool = False
):
    """The plain path, the baseline the overlapped one must beat: the group's collective (NCCL)
    and one torch GEMM, in the op's dtype, on the current stream. Same operands, shapes and
    result as the plan of ``state.spec``. ``capturing``: the current stream is being captured
    (torch.cuda.graph); the NCCL calls and GEMMs are recorded like any torch work.

    Written for host time, since it is chosen for small problems whose calls take tens of us:
    the process group's own methods (``_allgather_base`` etc., what ``torch.distributed``'s
    wrappers call, without their per-call argument checks and deprecation shims), the plan's
    buffers reused, and the overlapped path's per-call checks (``user_ptrs``)."""
    pg, device = comm.group, comm.device
    a, w, bias, c = tensors["a"], tensors["w"], tensors.get("bias"), tensors.get("c")
    _, out = user_ptrs(op, state, tensors, out, device)
    if state.precision.fp8:
        return _run_fp8(comm, state, tensors, out, capturing)
    kind = state.kind  # the branch follows the C++ definition, not the name
    if kind in ("gather_a", "gather_w"):
        part = a if kind == "gather_a" else w
        shape = state.gathered_shape
        # The gathered operand goes back to the caller only with return_gathered; otherwise one
        # buffer per plan, as a hand-written baseline keeps it (a fresh allocation per call makes
        # the caching allocator alternate blocks that NCCL's stream still holds).
        gathered = (
            torch.empty(shape, dtype=part.dtype, device=part.device)
            if state.want_gathered
            else _scratch(state, "gathered", shape, part, stream_ptr(device), capturing)
        )
        _finish(pg._allgather_base(gathered, part, _ALLGATHER))
        x, wf = (gathered, w) if kind == "gather_a" else (a, gathered)
        if bias is None:
            torch.mm(x, wf.t(), out=out)
        else:
            torch.addmm(bias, x, wf.t(), out=out)
        return (out, gathered) if state.want_gathered else out
    if kind == "all_reduce":
        torch.mm(a, w.t(), out=out)
        _finish(pg.allreduce([out], _ALLREDUCE))
    elif kind == "scatter_n":  # rs_tile_b
        # reduce-scatter splits dim 0: reduce D^T = W A^T and transpose this rank's rows.
        stream = stream_ptr(device)
        part_t = torch.mm(
            w,
            a.t(),
            out=_scratch(state, "partial", (w.shape[0], a.shape[0]), a, stream, capturing),
        )
        mine = _scratch(
            state,
            "mine",
            (part_t.shape[0] // state.spec.tp, part_t.shape[1]),
            a,
            stream,
            capturing,
        )
        _finish(pg._reduce_scatter_base(mine, part_t, _REDUCE_SCATTER))
        out.copy_(mine.t())
    else:  # scatter_m: rs_tile_a
        partial = torch.mm(
            a,
            w.t(),
            out=_scratch(
                state, "partial", (a.shape[0], w.shape[0]), a, stream_ptr(device), capturing
            ),
        )
        _finish(pg._reduce_scatter_base(out, partial, _REDUCE_SCATTER))
    return _finish_epilogue(out, c, bias, state.beta)


def _finish_epilogue(out, c, bias, beta: float) -> torch.Tensor:
    """out += beta * c + bias (each where given), after the reduction, as the plans do."""
    if c is not None:
        out.add_(c, alpha=beta)
    if bias is not None:
        out.add_(bias)
    return out


def scaled_mm(x, x_scale, y, y_scale, fast_accum: bool, out=None) -> torch.Tensor:
    """bf16 ``(x_scale * x) @ (y_scale * y).T`` of fp8 ``x`` [m, k] and ``y`` [n, k] through
    torch._scaled_mm, each float32 scale one value or one per row of its operand
    (``scales.scaled_mm_scales``)."""
    sx, sy = scaled_mm_scales(x_scale, y_scale, x.shape[0], y.shape[0])
    res = torch._scaled_mm(
        x, y.t(), scale_a=sx, scale_b=sy, out_dtype=torch.bfloat16, use_fast_accum=fast_accum
    )
    if out is None:
        return res
    return out.copy_(res)


def _gather(pg, state, name, part, stream, capturing, fresh: bool) -> torch.Tensor:
    """The all-gather of ``part`` along dim 0 (fp8 moved as bytes, which every NCCL has)."""
    shape = (part.shape[0] * state.spec.tp, *part.shape[1:])
    dst = (
        torch.empty(shape, dtype=part.dtype, device=part.device)
        if fresh
        else _scratch(state, name, shape, part, stream, capturing)
    )
    as_bytes = part.element_size() == 1
    _finish(
        pg._allgather_base(
            dst.view(torch.uint8) if as_bytes else dst,
            part.view(torch.uint8) if as_bytes else part,
            _ALLGATHER,
        )
    )
    return dst


def _run_fp8(comm: Communicator, state: CollectiveState, tensors, out, capturing: bool):
    """run_collective for fp8 operands: the collective and torch._scaled_mm (bf16 out). The
    all-gather schedules gather row scales with their rows; the reduce schedules reduce bf16
    partials."""
    pg, device = comm.group, comm.device
    a, w, bias, c = tensors["a"], tensors["w"], tensors.get("bias"), tensors.get("c")
    sa, sb = tensors["scale_a"], tensors["scale_b"]
    fast = state.precision.fast_accum
    stream = stream_ptr(device)
    kind = state.kind
    if kind in ("gather_a", "gather_w"):
        gather_a = kind == "gather_a"
        part, scale = (a, sa) if gather_a else (w, sb)
        gathered = _gather(pg, state, "gathered", part, stream, capturing, state.want_gathered)
        if scale.numel() > 1:
            scale = _gather(
                pg, state, "gathered_scale", scale.reshape(-1), stream, capturing, False
            )
        if gather_a:
            scaled_mm(gathered, scale, w, sb, fast, out=out)
        else:
            scaled_mm(a, sa, gathered, scale, fast, out=out)
        if bias is not None:
            out.add_(bias)
        return (out, gathered) if state.want_gathered else out
    if kind == "all_reduce":
        scaled_mm(a, sa, w, sb, fast, out=out)
        _finish(pg.allreduce([out], _ALLREDUCE))
    elif kind == "scatter_n":  # rs_tile_b: reduce D^T = W A^T, transpose this rank's rows
        part_t = _scratch(state, "partial", (w.shape[0], a.shape[0]), out, stream, capturing)
        scaled_mm(w, sb, a, sa, fast, out=part_t)
        mine = _scratch(
            state, "mine", (part_t.shape[0] // state.spec.tp, part_t.shape[1]), out, stream,
            capturing,
        )  # fmt: skip
        _finish(pg._reduce_scatter_base(mine, part_t, _REDUCE_SCATTER))
        out.copy_(mine.t())
    else:  # scatter_m: rs_tile_a
        partial = _scratch(state, "partial", (a.shape[0], w.shape[0]), out, stream, capturing)
        scaled_mm(a, sa, w, sb, fast, out=partial)
        _finish(pg._reduce_scatter_base(out, partial, _REDUCE_SCATTER))
    return _finish_epilogue(out, c, bias, state.beta)


def _scratch(
    state: CollectiveState,
    name: str,
    shape,
    like: torch.Tensor,
    stream: int,
    capturing: bool = False,
) -> torch.Tensor:
    """A buffer of the collective path kept with the entry, one per CUDA stream: calls on one
    stream are ordered, calls on two streams (e.g. overlapped micro-batches) must not share a
    buffer that one's NCCL kernel writes while the other's GEMM reads it. Inside a capture a
    fresh one from the caller's graph pool, owned by that graph: captures share one capture
    stream, and a buffer kept here would be shared by graphs that may replay on different
    streams."""
    if capturing:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    key = (name, stream)
    t = state.scratch.get(key)
    if t is None:
        t = state.scratch[key] = torch.empty(shape, dtype=like.dtype, device=like.device)
    return t


def collective_unavailable(group) -> str | None:
    """Why the collective path cannot run on ``group`` (None: it can): it needs a backend that
    runs collectives on CUDA tensors (NCCL). Depends on the group only, so every rank agrees."""
    try:
        backend = str(dist.get_backend(group))
    except Exception as e:  # noqa: BLE001 - an unusual group object: say so, keep the plan
        return f"the group's backend is unknown ({type(e).__name__}: {e})"
    if "nccl" not in backend.lower():
        return f"the group's backend is {backend!r}; the collective path needs NCCL"
    return None
