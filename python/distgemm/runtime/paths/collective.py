"""The collective path: the group's NCCL collective (or, for an all-reduce, our one-shot or
two-shot kernel, flag or LL: ``runtime/allreduce.py``) and one torch GEMM, the baseline to beat.

On the current stream, capturable (no synchronisation, and inside a capture its buffers come from
the caller's graph pool). Its scratch buffers (the gathered operand, the partial product) are
one flat buffer per communicator and CUDA stream (``CollectiveScratch``, an attachment of the
communicator), shared by every entry and sized to the largest call, as the overlapped path's
workspace is shared per communicator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    ReduceScatterOptions,
)

from ... import _core
from ..allreduce import mm_then_all_reduce
from ..capture import stream_ptr
from ..communicator import Communicator
from ..scales import scaled_mm_scales
from ..spec import Spec
from ..validate import DTYPES
from ..workspace import GROWTH_HEADROOM
from .common import PathState, gathered_shape, user_ptrs

# Our own all-reduce algorithms (runtime/allreduce.py), the alternatives to NCCL's.
OWN_ALL_REDUCES = tuple(_core.ALLREDUCE_ALGORITHMS)


def own_all_reduce_problem(algorithm: str, numel: int, dtype: torch.dtype, tp: int) -> str:
    """'' where our ``algorithm`` kernel can all-reduce ``numel`` elements of ``dtype`` at
    ``tp``, else the reason (the build, the dtype and the size only: the same on every rank)."""
    if not getattr(_core, "cuda_runtime", False):
        return f"distgemm was built without the CUDA runtime ({_core.cuda_runtime_reason})"
    if dtype not in DTYPES:
        return f"dtype {dtype} is not bf16 or fp16"
    return _core.allreduce_problem(algorithm, numel, dtype.itemsize, tp)


def own_all_reduce_offer(numel: int, dtype: torch.dtype, tp: int) -> dict[str, str]:
    """``own_all_reduce_problem`` of every one of OWN_ALL_REDUCES: the offer the decode model
    prices ('' where the algorithm can run)."""
    return {a: own_all_reduce_problem(a, numel, dtype, tp) for a in OWN_ALL_REDUCES}


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
    """A collective state: its branch and the gathered operand's shape. Its scratch buffers are
    the communicator's (``CollectiveScratch``), so dropping the entry frees nothing."""

    kind: str = ""
    gathered_shape: tuple[int, int] = (0, 0)
    all_reduce: str = "nccl"  # an all-reduce's algorithm: "nccl" or one of OWN_ALL_REDUCES

    @classmethod
    def create(
        cls, spec: Spec, precision, beta: float, gathered: bool, all_reduce: str = "nccl"
    ) -> CollectiveState:
        kind = collective_kind(spec)
        return cls(
            **cls.call_fields(spec, precision, beta, gathered),
            kind=kind,
            gathered_shape=gathered_shape(spec) if kind.startswith("gather") else (0, 0),
            all_reduce=all_reduce if kind == "all_reduce" and not precision.fp8 else "nccl",
        )

    def run(self, op: str, comm: Communicator, tensors, out, capturing: bool):
        return run_collective(op, comm, self, tensors, out, capturing)


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


def mm_then_nccl_all_reduce(comm: Communicator, a, wt, out) -> None:
    """``out`` = the sum over ranks of ``a @ wt``: torch.mm, then NCCL's all-reduce in place on
    the communicator's group (blocking: ordered on the caller's stream), as the collective path
    runs it with NCCL (and the calibration times it)."""
    torch.mm(a, wt, out=out)
    _finish(comm.group.allreduce([out], _ALLREDUCE))


def run_collective(
    op: str, comm: Communicator, state: CollectiveState, tensors, out, capturing: bool = False
):
    """The plain path, the baseline the overlapped one must beat: the group's collective (NCCL)
    and one torch GEMM, in the op's dtype, on the current stream. Same operands, shapes and
    result as the plan of ``state.spec``. ``capturing``: the current stream is being captured
    (torch.cuda.graph); the NCCL calls and GEMMs are recorded like any torch work.

    Written for host time, since it is chosen for small problems whose calls take tens of us:
    the process group's own methods (``_allgather_base`` etc., what ``torch.distributed``'s
    wrappers call, without their per-call argument checks and deprecation shims), the
    communicator's scratch reused (``CollectiveScratch``: two dict lookups when warm), and the
    overlapped path's per-call checks (``user_ptrs``)."""
    pg, device = comm.group, comm.device
    a, w, bias, c = tensors["a"], tensors["w"], tensors.get("bias"), tensors.get("c")
    _, out = user_ptrs(op, state, tensors, out, device)
    if state.precision.fp8:
        return _run_fp8(comm, state, tensors, out, capturing)
    kind = state.kind  # the branch follows the C++ definition, not the name
    if kind in ("gather_a", "gather_w"):
        part = a if kind == "gather_a" else w
        shape = state.gathered_shape
        # The gathered operand goes back to the caller only with return_gathered; otherwise the
        # communicator's scratch, as a hand-written baseline keeps one buffer (a fresh allocation
        # per call makes the caching allocator alternate blocks that NCCL's stream still holds).
        if state.want_gathered:
            gathered = torch.empty(shape, dtype=part.dtype, device=part.device)
        else:
            (gathered,) = _scratch(
                comm, (("gathered", shape, part.dtype),), stream_ptr(device), capturing
            )
        _finish(pg._allgather_base(gathered, part, _ALLGATHER))
        x, wf = (gathered, w) if kind == "gather_a" else (a, gathered)
        if bias is None:
            torch.mm(x, wf.t(), out=out)
        else:
            torch.addmm(bias, x, wf.t(), out=out)
        return (out, gathered) if state.want_gathered else out
    if kind == "all_reduce":
        if state.all_reduce == "nccl":
            mm_then_nccl_all_reduce(comm, a, w.t(), out)
        else:  # on the current stream (the entry's choice checked the size)
            mm_then_all_reduce(comm, a, w.t(), out, state.all_reduce, capturing)
    elif kind == "scatter_n":  # rs_tile_b
        # reduce-scatter splits dim 0: reduce D^T = W A^T and transpose this rank's rows.
        part_t, mine = _scratch(
            comm, _transposed_regions(state, a, w, a.dtype), stream_ptr(device), capturing
        )
        torch.mm(w, a.t(), out=part_t)
        _finish(pg._reduce_scatter_base(mine, part_t, _REDUCE_SCATTER))
        out.copy_(mine.t())
    else:  # scatter_m: rs_tile_a
        (partial,) = _scratch(
            comm, (("partial", (a.shape[0], w.shape[0]), a.dtype),), stream_ptr(device), capturing
        )
        torch.mm(a, w.t(), out=partial)
        _finish(pg._reduce_scatter_base(out, partial, _REDUCE_SCATTER))
    return _finish_epilogue(out, c, bias, state.beta)


def _transposed_regions(state: CollectiveState, a, w, dtype) -> tuple:
    """The scratch of rs_tile_b: this rank's partial D^T [N, M] and its reduced rows."""
    n, m = w.shape[0], a.shape[0]
    return (("partial", (n, m), dtype), ("mine", (n // state.spec.tp, m), dtype))


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


def _gather(pg, dst: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """The all-gather of ``part`` along dim 0 into ``dst`` (fp8 moved as bytes, which every NCCL
    has)."""
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
        tp = state.spec.tp
        shape = (part.shape[0] * tp, *part.shape[1:])
        regions = () if state.want_gathered else (("gathered", shape, part.dtype),)
        if scale.numel() > 1:  # row scales, gathered with their rows
            regions += (("gathered_scale", (scale.numel() * tp,), scale.dtype),)
        bufs = list(_scratch(comm, regions, stream, capturing)) if regions else []
        if state.want_gathered:
            bufs.insert(0, torch.empty(shape, dtype=part.dtype, device=part.device))
        gathered = _gather(pg, bufs[0], part)
        if scale.numel() > 1:
            scale = _gather(pg, bufs[1], scale.reshape(-1))
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
        part_t, mine = _scratch(
            comm, _transposed_regions(state, a, w, out.dtype), stream, capturing
        )
        scaled_mm(w, sb, a, sa, fast, out=part_t)
        _finish(pg._reduce_scatter_base(mine, part_t, _REDUCE_SCATTER))
        out.copy_(mine.t())
    else:  # scatter_m: rs_tile_a
        (partial,) = _scratch(
            comm, (("partial", (a.shape[0], w.shape[0]), out.dtype),), stream, capturing
        )
        scaled_mm(a, sa, w, sb, fast, out=partial)
        _finish(pg._reduce_scatter_base(out, partial, _REDUCE_SCATTER))
    return _finish_epilogue(out, c, bias, state.beta)


# The name of the collective path's per-communicator scratch (Communicator.attach).
ATTACHMENT = "collective"
# Headroom of a grown scratch buffer over the call that grows it: token counts that rise a little
# at a time (a server's batch sizes) reallocate about once per 10% of growth instead of at every
# call, and a buffer never exceeds the largest call's scratch by more than that. The workspace's
# bound, one number for both: what distgemm holds stays within 10% of its largest call.
SCRATCH_HEADROOM = GROWTH_HEADROOM
# Every region of a call starts at a multiple of this many bytes, the caching allocator's own
# granularity: a view is as aligned as a fresh tensor (cuBLAS and NCCL choose their vectorised
# kernels by alignment) and a view of any dtype is valid.
SCRATCH_ALIGN = 512
# View sets cached per buffer (one per call layout, host memory only); beyond it they are dropped
# and carved again.
MAX_VIEW_SETS = 256

# A call's scratch regions: ((name, shape, dtype), ...), disjoint parts of one buffer.
Regions = tuple[tuple[str, tuple[int, ...], torch.dtype], ...]


def _aligned(nbytes: int) -> int:
    return -(-nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN


def scratch_bytes(regions: Regions) -> int:
    """The bytes a call's regions take in a scratch buffer, each starting aligned."""
    return sum(_aligned(math.prod(shape) * dtype.itemsize) for _, shape, dtype in regions)


def _carve(flat: torch.Tensor, regions: Regions) -> tuple[torch.Tensor, ...]:
    """Views of the byte buffer ``flat``, one per region, in order, each starting aligned."""
    views, offset = [], 0
    for _, shape, dtype in regions:
        nbytes = math.prod(shape) * dtype.itemsize
        views.append(flat[offset : offset + nbytes].view(dtype).view(shape))
        offset += _aligned(nbytes)
    return tuple(views)


@dataclass(eq=False)
class _Buffer:
    """One stream's scratch: the flat bytes and the views carved from them, by call layout."""

    flat: torch.Tensor  # torch.uint8
    views: dict[Regions, tuple[torch.Tensor, ...]] = field(default_factory=dict)


class CollectiveScratch:
    """The collective path's scratch of one communicator (a ``Communicator`` attachment): one flat
    byte buffer per CUDA stream, shared by every collective entry; a call takes views of the
    shapes and dtypes it needs (``views``), so entries of every shape and dtype share it.

    Streams. Calls on one stream are ordered by it: a call's NCCL kernel and GEMM have finished
    with the buffer before the next call's start, whatever its entry. Calls on two streams may run
    concurrently (overlapped micro-batches), so each stream has its own buffer, never shared. The
    regions of one call (rs_tile_b's partial and its reduced rows) are disjoint.

    Size. A buffer grows when a call needs more than it holds, to that call's bytes plus
    ``SCRATCH_HEADROOM``, so it stays within that of the largest call made on its stream; a
    smaller call takes views of its first bytes. The memory is kept until ``close()``: evicting an
    entry frees nothing, and the next call of any size finds the buffer ready."""

    def __init__(self):
        self.buffers: dict[int, _Buffer] = {}  # by raw CUDA stream
        self.allocations = 0  # buffers allocated so far (each stream's first and every growth)

    @classmethod
    def of(cls, comm: Communicator) -> CollectiveScratch:
        """The communicator's scratch, made at its first collective call."""
        scratch = comm.attachment(ATTACHMENT)
        if scratch is None:
            scratch = comm.attach(ATTACHMENT, cls())
        return scratch

    def views(
        self, stream: int, regions: Regions, device: torch.device, capturing: bool = False
    ) -> tuple[torch.Tensor, ...]:
        """One tensor per region for a call on ``stream``: views of that stream's buffer (grown
        first when too small), made once per layout and buffer. Inside a capture fresh tensors
        from the caller's graph pool, owned by that graph: captures share one capture stream, and
        a buffer kept here would be shared by graphs that may replay on different streams."""
        if capturing:
            return tuple(torch.empty(s, dtype=dt, device=device) for _, s, dt in regions)
        buf = self.buffers.get(stream)
        if buf is not None:
            got = buf.views.get(regions)
            if got is not None:
                return got
        need = scratch_bytes(regions)
        if buf is None or buf.flat.numel() < need:
            buf = self._grow(stream, need, device)
        elif len(buf.views) >= MAX_VIEW_SETS:
            buf.views.clear()
        # Normal tensors, also when made under torch.inference_mode: the next call may run
        # outside it, where an inference tensor cannot be written in place.
        with torch.inference_mode(False):
            got = buf.views[regions] = _carve(buf.flat, regions)
        return got

    def _grow(self, stream: int, need: int, device: torch.device) -> _Buffer:
        """A new buffer of ``need`` bytes plus the headroom for ``stream``. The old one is dropped
        first, while this stream's earlier calls may still use it on the device: safe, because
        torch's caching allocator is stream-ordered (a freed block goes again only to work on the
        stream it was allocated on, this one, which runs after those calls) and the path's NCCL
        calls are blocking ones that run on the caller's stream (``_blocking``), so no other
        stream touches the buffer."""
        size = max(need, int(need * (1 + SCRATCH_HEADROOM)) // SCRATCH_ALIGN * SCRATCH_ALIGN)
        self.buffers.pop(stream, None)
        with torch.inference_mode(False):
            flat = torch.empty(size, dtype=torch.uint8, device=device)
        buf = self.buffers[stream] = _Buffer(flat)
        self.allocations += 1
        return buf

    # -- Attachment ------------------------------------------------------------------------
    def workspace_grown(self, ws, capturing: bool) -> None:
        """Nothing of this lives in the workspace."""

    def launch_error(self) -> str:
        return ""

    def memory_stats(self) -> dict[str, int]:
        return {
            "collective_bytes": sum(b.flat.numel() for b in self.buffers.values()),
            "collective_buffers": len(self.buffers),
            "collective_allocations": self.allocations,
        }

    def close(self) -> list:
        """Drop every buffer (the device is synchronised by the communicator)."""
        self.buffers.clear()
        return []


def _scratch(comm: Communicator, regions: Regions, stream: int, capturing: bool):
    """A call's scratch tensors, one per region (``CollectiveScratch.views``)."""
    return CollectiveScratch.of(comm).views(stream, regions, comm.device, capturing)


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
