"""The torch.library ops behind the tensor-parallel layers, with fake kernels and autograd.

``distgemm::all_gather_linear`` and ``distgemm::linear_reduce_scatter``, with fake (shape)
implementations and autograd, so that ``torch.compile`` sees each as one node, forward and
backward.

Per-rank shapes, TP ranks in the group named ``group_name``:

- ``all_gather_linear(x_shard [M/TP, K], w [N, K], bias [N] | None, group_name)``
  returns ``(out [M, N], x [M, K])``: ``x = all_gather(x_shard, dim 0)``,
  ``out = x @ w.T + bias``. ``x`` is returned for the weight gradient and has no gradient of
  its own (a gradient flowing into it is ignored).
- ``linear_reduce_scatter(x [M, K], w [N, K], bias [N] | None, group_name)``
  returns ``out [M/TP, N] = reduce_scatter(x @ w.T, dim 0) + bias`` (bias added once).

Backward:

- ``all_gather_linear``: ``grad_x_shard = linear_reduce_scatter(grad_out, w.T)`` (the GEMM under
  the reduce-scatter), ``grad_w = grad_out.T @ x`` with ``x`` kept from forward (or, with
  ``return_gathered=False``, gathered again while the dgrad GEMM runs),
  ``grad_bias = grad_out.sum(0)``.
- ``linear_reduce_scatter``: ``(grad_x, grad_out_full) = all_gather_linear(grad_out, w.T)``
  (the all-gather under the dgrad GEMM), ``grad_w = grad_out_full.T @ x``,
  ``grad_bias = grad_out_full.sum(0)`` (the full bias gradient on every rank).

Where the work runs is decided in one place, ``uses_distgemm``: CUDA tensors in bf16/fp16 go to
``distgemm.all_gather_gemm`` / ``distgemm.gemm_reduce_scatter``; anything else (CPU tensors on a
gloo group, fp32) runs the plain collective and ``torch.mm`` in the tensors' dtype.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed import distributed_c10d as c10d

from .. import ops
from ..runtime.validate import n_major_weight

# The collectives under the names of the running torch: newer releases call them *_single and
# deprecate the older names, which torch 2.11 (the GPU machine's) still needs.
all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_into = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_funcol_all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor

NAMESPACE = "distgemm"
DISTGEMM_DTYPES = (torch.bfloat16, torch.float16)


def group_of(group_name: str):
    """The process group named ``group_name``."""
    return c10d._resolve_process_group(group_name)


def group_size(group_name: str) -> int:
    """The number of ranks in the process group named ``group_name``."""
    return group_of(group_name).size()


def group_name_of(group) -> str:
    """The name of ``group`` (a ProcessGroup, or None for the world group) for the ops."""
    if group is None:
        group = dist.group.WORLD
    if group is None:
        raise RuntimeError("no default process group: call torch.distributed.init_process_group")
    return group.group_name


def uses_distgemm(*tensors: torch.Tensor) -> bool:
    """Whether distgemm's overlapped ops run these tensors (CUDA, bf16/fp16); else the plain
    collective + torch.mm runs."""
    return all(t.is_cuda and t.dtype in DISTGEMM_DTYPES for t in tensors)


def dense(t: torch.Tensor | None, weight: bool = False) -> torch.Tensor | None:
    """``t`` as the distgemm ops take it: detached (the op's autograd is registered here),
    contiguous, and on CUDA 16-byte aligned (a view at an odd offset is copied). ``weight``:
    a transposed view of a contiguous tensor stays as it is (the GEMM reads it N-contiguous,
    ``validation.n_major_weight``), so the backward passes' ``w.t()`` costs no copy."""
    if t is None:
        return None
    t = t.detach()
    if not (weight and n_major_weight(t)):
        t = t.contiguous()
    return t.clone() if t.is_cuda and t.data_ptr() % 16 else t


def _all_gather_rows(x: torch.Tensor, group) -> torch.Tensor:
    out = x.new_empty((group.size() * x.shape[0], *x.shape[1:]))
    all_gather_into(out, x, group=group)
    return out


def _reduce_scatter_rows(x: torch.Tensor, group) -> torch.Tensor:
    out = x.new_empty((x.shape[0] // group.size(), *x.shape[1:]))
    reduce_scatter_into(out, x, group=group)
    return out


def check_operands(op: str, x_name: str, x, w, bias, tp: int | None = None) -> None:
    """ValueError naming the values when the operands of ``op`` do not fit: 2-D ``x`` and ``w``
    sharing K, a bias of ``[w.shape[0]]``, one dtype, and (``tp`` given) ``x``'s rows divisible by
    tp."""
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(
            f"{op} takes 2-D {x_name} and w, got {x_name}.shape={list(x.shape)} and "
            f"w.shape={list(w.shape)}"
        )
    if x.shape[1] != w.shape[1]:
        raise ValueError(
            f"{op}: {x_name}.shape[1]={x.shape[1]} must equal w.shape[1]={w.shape[1]} (K)"
        )
    if tp is not None and x.shape[0] % tp:
        raise ValueError(f"{op}: M={x_name}.shape[0]={x.shape[0]} is not divisible by tp={tp}")
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"{op}: bias.shape={list(bias.shape)} must be [w.shape[0]]=[{w.shape[0]}]")
    dtypes = {t.dtype for t in (x, w, bias) if t is not None}
    if len(dtypes) != 1:
        raise ValueError(f"{op}: operands must share one dtype, got {sorted(map(str, dtypes))}")


# ---------------------------------------------------------------------------------------------
# all_gather_linear


@torch.library.custom_op(f"{NAMESPACE}::all_gather_linear", mutates_args=())
def all_gather_linear(
    x_shard: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    group_name: str,
    return_gathered: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x = all_gather(x_shard, dim 0); out = F.linear(x, w, bias)``; returns ``(out, x)``.

    Per rank: ``x_shard [M/TP, K]``, ``w [N, K]``, ``bias [N]`` or None; ``out [M, N]``,
    ``x [M, K]``, or ``[0, K]`` with ``return_gathered=False`` (the backward then gathers
    ``x_shard`` again, under the dgrad GEMM). One dtype; on CUDA in bf16/fp16 distgemm's
    constraints apply (K and N multiples of 8)."""
    check_operands("all_gather_linear", "x_shard", x_shard, w, bias)
    group = group_of(group_name)
    x_shard, w, bias = dense(x_shard), dense(w, weight=True), dense(bias)
    if uses_distgemm(x_shard, w):
        if not return_gathered:
            out = ops.all_gather_gemm(x_shard, w, bias=bias, group=group)
            return out, x_shard.new_empty((0, x_shard.shape[1]))
        return ops.all_gather_gemm(x_shard, w, bias=bias, return_gathered=True, group=group)
    x = _all_gather_rows(x_shard, group)
    out = torch.mm(x, w.t()) if bias is None else torch.addmm(bias, x, w.t())
    return out, (x if return_gathered else x.new_empty((0, x.shape[1])))


@all_gather_linear.register_fake
def _(x_shard, w, bias, group_name, return_gathered=True):
    check_operands("all_gather_linear", "x_shard", x_shard, w, bias)
    rows = group_size(group_name) * x_shard.shape[0]
    gathered_rows = rows if return_gathered else 0
    return x_shard.new_empty((rows, w.shape[0])), x_shard.new_empty(
        (gathered_rows, x_shard.shape[1])
    )


def _all_gather_linear_setup(ctx, inputs, output):
    x_shard, w, bias, group_name, return_gathered = inputs
    ctx.save_for_backward(w, output[1] if return_gathered else x_shard)
    ctx.regather = not return_gathered
    ctx.group_name = group_name
    ctx.has_bias = bias is not None


def _all_gather_linear_backward(ctx, grad_out, _grad_gathered):
    w, x = ctx.saved_tensors
    if ctx.regather:  # asynchronous: the dgrad GEMM below runs while it is in flight
        x = _funcol_all_gather(x.contiguous(), 0, ctx.group_name)
    grad_x_shard = linear_reduce_scatter(grad_out, w.t(), None, ctx.group_name)
    grad_w = torch.mm(grad_out.t(), x)
    grad_bias = grad_out.sum(0) if ctx.has_bias else None
    return grad_x_shard, grad_w, grad_bias, None, None


all_gather_linear.register_autograd(
    _all_gather_linear_backward, setup_context=_all_gather_linear_setup
)


# ---------------------------------------------------------------------------------------------
# linear_reduce_scatter


@torch.library.custom_op(f"{NAMESPACE}::linear_reduce_scatter", mutates_args=())
def linear_reduce_scatter(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, group_name: str
) -> torch.Tensor:
    """``out = reduce_scatter(x @ w.T, dim 0) + bias``, the bias added once.

    Per rank: ``x [M, K_local]``, ``w [N, K_local]``, ``bias [N]`` or None (the same on every
    rank); ``out [M/TP, N]``, rank r's rows. One dtype; M divisible by TP; on CUDA in bf16/fp16
    distgemm's constraints apply (K_local and N multiples of 8)."""
    group = group_of(group_name)
    check_operands("linear_reduce_scatter", "x", x, w, bias, group.size())
    x, w, bias = dense(x), dense(w, weight=True), dense(bias)
    if uses_distgemm(x, w):
        return ops.gemm_reduce_scatter(x, w, bias=bias, group=group)
    out = _reduce_scatter_rows(torch.mm(x, w.t()), group)
    return out if bias is None else out + bias


@linear_reduce_scatter.register_fake
def _(x, w, bias, group_name):
    tp = group_size(group_name)
    check_operands("linear_reduce_scatter", "x", x, w, bias, tp)
    return x.new_empty((x.shape[0] // tp, w.shape[0]))


def _linear_reduce_scatter_setup(ctx, inputs, output):
    x, w, bias, group_name = inputs
    ctx.save_for_backward(x, w)
    ctx.group_name = group_name
    ctx.has_bias = bias is not None


def _linear_reduce_scatter_backward(ctx, grad_out):
    x, w = ctx.saved_tensors
    grad_x, grad_out_full = all_gather_linear(grad_out.contiguous(), w.t(), None, ctx.group_name)
    grad_w = torch.mm(grad_out_full.t(), x)
    grad_bias = grad_out_full.sum(0) if ctx.has_bias else None
    return grad_x, grad_w, grad_bias, None


linear_reduce_scatter.register_autograd(
    _linear_reduce_scatter_backward, setup_context=_linear_reduce_scatter_setup
)
