"""Drop-ins for torch's fused symm_mem ops, backed by distgemm where the layout maps to a schedule.

``torch.ops.symm_mem.fused_all_gather_matmul`` and
``torch.ops.symm_mem.fused_matmul_reduce_scatter``: the same signatures, results, shapes and
strides, backed by distgemm where the layout maps to a distgemm schedule.

Plain torch equivalents (``group`` the process group named ``group_name``, TP its size)::

    A = all_gather(A_shard, dim=gather_dim)                    # A_shard [..., K]
    fused_all_gather_matmul(...) == (A if return_A else None, [A @ B for B in Bs])  # B [K, N]
    fused_matmul_reduce_scatter(A, B, op, dim, ...) == reduce_scatter(A @ B, op, dim)

Where distgemm runs (CUDA, bf16/fp16, the extents distgemm needs): a gather or scatter along
any dim but the last moves that dim to the front (one copy unless it is already first), runs
``all_gather_gemm`` (``ag_rotate_a``) or ``gemm_reduce_scatter`` (``rs_tile_a``) on the rows, and
moves it back; a scatter along the last dim (N) runs ``gemm_reduce_scatter`` with
``schedule="rs_tile_b", steps=TP``. Several ``Bs`` share one all-gather: it hides under the GEMM
of the widest B, and the others run ``torch.matmul`` on the gathered A, so that no call
concatenates weights or copies its outputs apart. Everything else runs the plain collective +
``torch.matmul``; ``fallback_reason`` says why, ``all_gather_matmul_reason`` /
``matmul_reduce_scatter_reason`` for one call (with the op's arguments; ``compat.async_tp``
routes torch's ops by them).
"""

from __future__ import annotations

import torch

from .. import ops
from ..runtime.scales import FP8_DTYPE
from .custom_ops import (
    DISTGEMM_DTYPES,
    all_gather_into,
    group_of,
    group_size,
    reduce_scatter_into,
)

REDUCE_OPS = ("sum", "avg")
ALIGN_ELEMENTS = 8  # distgemm's contiguous GEMM extents are multiples of 8 elements
FP8_ALIGN_ELEMENTS = 16  # and of 16 for fp8 (16 bytes either way)


def row_major(t: torch.Tensor) -> torch.Tensor:
    """``t`` with row-major strides, those of a size-1 dim included: the strides torch's Meta
    kernels of the reduce-scatter ops give, which inductor takes the real output to have. A
    contiguous tensor can differ there (``movedim`` of a batch of 1), and a compiled region whose
    output keeps such strides hands the next region an input whose strides differ from the first
    call's: a recompile that makes them symbolic (dynamo's automatic dynamic shapes)."""
    return t.contiguous().view(-1).view(t.shape)  # a view of a view: no copy once contiguous


def _weight(B: torch.Tensor) -> torch.Tensor:
    """torch's ``B [K, N]`` as distgemm's weight ``[N, K]``: the ``.t()`` view of a contiguous B
    (read in place, N-contiguous), else a contiguous copy."""
    return B.t() if B.is_contiguous() else B.t().contiguous()


def fallback_reason(
    tensors,
    tp: int,
    extents: dict[str, int],
    divisible: dict[str, tuple[int, int]] | None = None,
    *,
    fp8: bool = False,
) -> str | None:
    """Why distgemm cannot serve this call, None when it can: CPU tensors, a dtype it lacks, a
    GEMM extent that is not a multiple of 8 elements (16 with ``fp8``; ``extents``: name ->
    value), or a split mode its pipeline steps do not divide (``divisible``: name -> (value,
    divisor)), or a group of one rank. ``fp8``: the operands of a scaled GEMM
    (``compat.symm_mem_fp8``), which distgemm takes in float8_e4m3fn."""
    if not all(t.is_cuda for t in tensors):
        return "CPU tensors: distgemm runs on CUDA GPUs only"
    if tp < 2:
        return f"tp={tp}: one rank has nothing to gather or scatter"
    dtypes = {t.dtype for t in tensors}
    accepted, align = (
        ((FP8_DTYPE,), FP8_ALIGN_ELEMENTS) if fp8 else (DISTGEMM_DTYPES, ALIGN_ELEMENTS)
    )
    if len(dtypes) != 1 or not dtypes <= set(accepted):
        what = "float8_e4m3fn" if fp8 else "bf16 or fp16"
        return f"dtypes {sorted(map(str, dtypes))}: distgemm takes one dtype, {what}"
    for name, value in extents.items():
        if value % align:
            return f"{name}={value} is not a multiple of {align}"
    for name, (value, divisor) in (divisible or {}).items():
        if value % divisor:
            return f"{name}={value} is not divisible by {divisor} (the most pipeline steps)"
    return None


def normalise_dim(dim: int, ndim: int, name: str) -> int:
    if not -ndim <= dim < ndim:
        raise ValueError(f"{name}={dim} is out of range for a {ndim}-D A")
    return dim % ndim


def _check_bs(A: torch.Tensor, Bs, op: str) -> None:
    for i, B in enumerate(Bs):
        if B.dim() != 2:
            raise ValueError(f"{op}: Bs[{i}] must be 2-D [K, N], got shape {list(B.shape)}")


def _check_all_gather(A_shard, Bs, gather_dim: int, tp: int) -> int:
    """ValueError naming the values for operands torch's op refuses; the gather dim >= 0."""
    op = "fused_all_gather_matmul"
    if A_shard.dim() < 2:
        raise ValueError(f"{op}: A_shard must have at least 2 dims, got {list(A_shard.shape)}")
    _check_bs(A_shard, Bs, op)
    gather_dim = normalise_dim(gather_dim, A_shard.dim(), "gather_dim")
    k_mm = A_shard.shape[-1] * (tp if gather_dim == A_shard.dim() - 1 else 1)
    for i, B in enumerate(Bs):
        if B.shape[0] != k_mm:
            raise ValueError(f"{op}: Bs[{i}].shape[0]={B.shape[0]} must equal K={k_mm}")
    return gather_dim


def all_gather_matmul(
    A_shard: torch.Tensor,
    Bs: list[torch.Tensor],
    gather_dim: int,
    group_name: str,
    *,
    return_A: bool = True,
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """``all_gather(A_shard, gather_dim) @ B`` for each ``B`` in ``Bs``.

    Per-rank shapes: ``A_shard``: ``[..., K]`` with dim ``gather_dim`` this rank's slice (rank r
    holds slice r); ``Bs``: ``[K, N_i]`` each (for ``gather_dim`` the last dim, ``[TP*K, N_i]``).
    Returns ``(A, [A @ B_i])`` with ``A`` the gathered ``A_shard`` (None when ``return_A`` is
    False), strides as torch's op returns them. No autograd, as torch's op; the torch.library
    op ``torch.ops.distgemm.fused_all_gather_matmul`` (below) runs it.
    """
    group = group_of(group_name)
    tp = group.size()
    gather_dim = _check_all_gather(A_shard, Bs, gather_dim, tp)
    if _all_gather_reason(A_shard, Bs, gather_dim, tp) is not None:
        return _all_gather_matmul_collective(A_shard, Bs, gather_dim, group, return_A)
    k = A_shard.shape[-1]
    # Rows of A_shard with the gathered dim first: rank r's rows follow rank r-1's.
    a_rows = A_shard.movedim(gather_dim, 0).contiguous()
    moved_shape = (tp * a_rows.shape[0], *a_rows.shape[1:-1])
    widest = _widest(Bs)
    if not return_A and len(Bs) == 1:  # nothing needs the gathered A: no copy of it
        out = ops.all_gather_gemm(a_rows.view(-1, k), _weight(Bs[0]), group=group)
        return None, [out.view(*moved_shape, out.shape[1]).movedim(0, gather_dim)]
    out, a = ops.all_gather_gemm(
        a_rows.view(-1, k), _weight(Bs[widest]), return_gathered=True, group=group
    )
    outs = [out if i == widest else torch.matmul(a, B) for i, B in enumerate(Bs)]
    results = [o.view(*moved_shape, o.shape[1]).movedim(0, gather_dim) for o in outs]
    A = a.view(*moved_shape, k).movedim(0, gather_dim) if return_A else None
    return A, results


def _widest(Bs) -> int:
    """The index of the B with the most columns (the first of equals): the GEMM the all-gather
    hides under."""
    return max(range(len(Bs)), key=lambda i: Bs[i].shape[1])


def _all_gather_reason(A_shard, Bs, gather_dim: int, tp: int) -> str | None:
    """fallback_reason of a checked all-gather call (``gather_dim`` >= 0): distgemm runs the
    widest B's GEMM, torch.matmul the others."""
    if gather_dim == A_shard.dim() - 1:
        return "gather_dim is the contracted dim K: no distgemm schedule gathers K"
    n = Bs[_widest(Bs)].shape[1]
    return fallback_reason([A_shard, *Bs], tp, {"K": A_shard.shape[-1], "N of the widest B": n})


def all_gather_matmul_reason(A_shard, Bs, gather_dim, group_name, *, return_A=True) -> str | None:
    """Why ``fused_all_gather_matmul`` with these arguments (its own signature) runs the plain
    collective + matmul instead of distgemm, None when distgemm serves it; ValueError as the op
    raises it."""
    tp = group_size(group_name)
    gather_dim = _check_all_gather(A_shard, Bs, gather_dim, tp)
    return _all_gather_reason(A_shard, Bs, gather_dim, tp)


# all_gather_matmul as the torch.library op torch.ops.distgemm.fused_all_gather_matmul
# (one node under torch.compile); compat.async_tp's router calls the function itself.
fused_all_gather_matmul = torch.library.custom_op(
    "distgemm::fused_all_gather_matmul",
    mutates_args=(),
    schema="(Tensor A_shard, Tensor[] Bs, int gather_dim, str group_name, *, "
    "bool return_A=True) -> (Tensor?, Tensor[])",
)(all_gather_matmul)


@fused_all_gather_matmul.register_fake
def _(A_shard, Bs, gather_dim, group_name, *, return_A=True):
    tp = group_of(group_name).size()
    gather_dim = _check_all_gather(A_shard, Bs, gather_dim, tp)
    gathered = A_shard.new_empty((tp * A_shard.shape[0], *A_shard.shape[1:]))
    return _torch_layout(gathered, A_shard.shape, Bs, gather_dim, tp, return_A)


def _all_gather_matmul_collective(A_shard, Bs, gather_dim, group, return_A):
    """The plain all-gather along dim 0 + matmul, laid out as torch's op lays it out."""
    gathered = A_shard.new_empty((group.size() * A_shard.shape[0], *A_shard.shape[1:]))
    all_gather_into(gathered, A_shard.contiguous(), group=group)
    return _torch_layout(gathered, A_shard.shape, Bs, gather_dim, group.size(), return_A)


def _torch_layout(gathered, shard_shape, Bs, gather_dim, tp, return_A):
    """torch's reference steps from the ranks' stacked shards to ``(A, [A @ B])``: the same
    shapes and strides on real tensors (the collective path) and fake ones (the fake kernel)."""
    if gather_dim == len(shard_shape) - 1:
        A = torch.cat(gathered.chunk(tp), dim=-1)
        return (A if return_A else None), [torch.matmul(A, B) for B in Bs]
    A = gathered.view(tp, *shard_shape).movedim(gather_dim + 1, 1).flatten(0, 1)
    results = [torch.matmul(A, B).movedim(0, gather_dim) for B in Bs]
    return (A.movedim(0, gather_dim) if return_A else None), results


def _check_reduce_scatter(A, B, reduce_op: str, scatter_dim: int, tp: int) -> int:
    """ValueError naming the values for operands torch's op refuses; the scatter dim >= 0."""
    op = "fused_matmul_reduce_scatter"
    if reduce_op not in REDUCE_OPS:
        raise ValueError(f"{op}: reduce_op={reduce_op!r} is not one of {REDUCE_OPS}")
    if A.dim() < 2:
        raise ValueError(f"{op}: A must have at least 2 dims, got {list(A.shape)}")
    _check_bs(A, [B], op)
    if B.shape[0] != A.shape[-1]:
        raise ValueError(f"{op}: B.shape[0]={B.shape[0]} must equal K=A.shape[-1]={A.shape[-1]}")
    scatter_dim = normalise_dim(scatter_dim, A.dim(), "scatter_dim")
    extent = B.shape[1] if scatter_dim == A.dim() - 1 else A.shape[scatter_dim]
    if extent % tp:
        raise ValueError(f"{op}: dim {scatter_dim} of A @ B ({extent}) is not divisible by tp={tp}")
    return scatter_dim


def matmul_reduce_scatter(
    A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: str
) -> torch.Tensor:
    """``reduce_scatter(A @ B, reduce_op, scatter_dim)``.

    Per-rank shapes: ``A``: ``[..., K]`` (this rank's partial operand), ``B``: ``[K, N]``;
    returns ``A @ B`` reduced over the ranks (``"sum"`` or ``"avg"``) and split along
    ``scatter_dim`` (rank r gets slice r), contiguous, e.g. ``[BATCH, M/TP, N]`` for
    ``scatter_dim=1`` and ``A: [BATCH, M, K]``. No autograd, as torch's op; the torch.library
    op ``torch.ops.distgemm.fused_matmul_reduce_scatter`` (below) runs it.
    """
    group = group_of(group_name)
    tp = group.size()
    scatter_dim = _check_reduce_scatter(A, B, reduce_op, scatter_dim, tp)
    if _reduce_scatter_reason(A, B, scatter_dim, tp) is not None:
        return _matmul_reduce_scatter_collective(A, B, reduce_op, scatter_dim, group)
    last = scatter_dim == A.dim() - 1
    rows = A.numel() // A.shape[-1]
    w = _weight(B)
    if last:
        out = ops.gemm_reduce_scatter(
            A.reshape(rows, A.shape[-1]).contiguous(),
            w,
            schedule="rs_tile_b",
            steps=tp,
            group=group,
        )
        out = out.view(*A.shape[:-1], out.shape[-1])
    else:
        a_rows = A.movedim(scatter_dim, 0).contiguous()
        out = ops.gemm_reduce_scatter(a_rows.view(rows, A.shape[-1]), w, group=group)
        out = out.view(a_rows.shape[0] // tp, *a_rows.shape[1:-1], out.shape[-1])
        out = row_major(out.movedim(0, scatter_dim))
    return out.div_(tp) if reduce_op == "avg" else out


def _reduce_scatter_reason(A, B, scatter_dim: int, tp: int) -> str | None:
    """fallback_reason of a checked reduce-scatter call (``scatter_dim`` >= 0)."""
    if scatter_dim == A.dim() - 1:  # rs_tile_b at S = TP: each step's N/TP columns, one GEMM
        return fallback_reason([A, B], tp, {"K": A.shape[-1], "N/tp": B.shape[1] // tp})
    # rs_tile_a: S is TP or 2*TP (default_steps), and M must split into S steps
    rows = A.numel() // A.shape[-1]
    extents = {"K": A.shape[-1], "N": B.shape[1]}
    return fallback_reason([A, B], tp, extents, {"M": (rows, 2 * tp)})


def matmul_reduce_scatter_reason(A, B, reduce_op, scatter_dim, group_name) -> str | None:
    """Why ``fused_matmul_reduce_scatter`` with these arguments (its own signature) runs the
    plain matmul + reduce-scatter instead of distgemm, None when distgemm serves it; ValueError
    as the op raises it."""
    tp = group_size(group_name)
    scatter_dim = _check_reduce_scatter(A, B, reduce_op, scatter_dim, tp)
    return _reduce_scatter_reason(A, B, scatter_dim, tp)


# matmul_reduce_scatter as the torch.library op torch.ops.distgemm.fused_matmul_reduce_scatter
# (one node under torch.compile); compat.async_tp's router calls the function itself.
fused_matmul_reduce_scatter = torch.library.custom_op(
    "distgemm::fused_matmul_reduce_scatter", mutates_args=()
)(matmul_reduce_scatter)


@fused_matmul_reduce_scatter.register_fake
def _(A, B, reduce_op, scatter_dim, group_name):
    tp = group_of(group_name).size()
    scatter_dim = _check_reduce_scatter(A, B, reduce_op, scatter_dim, tp)
    shape = [*A.shape[:-1], B.shape[1]]
    shape[scatter_dim] //= tp
    return A.new_empty(shape)


def _matmul_reduce_scatter_collective(A, B, reduce_op, scatter_dim, group):
    """The plain matmul + reduce-scatter along ``scatter_dim``, contiguous result."""
    tp = group.size()
    partial = torch.matmul(A, B).movedim(scatter_dim, 0).contiguous()
    out = partial.new_empty((partial.shape[0] // tp, *partial.shape[1:]))
    reduce_scatter_into(out, partial, group=group)
    out = row_major(out.movedim(0, scatter_dim))
    return out.div_(tp) if reduce_op == "avg" else out
