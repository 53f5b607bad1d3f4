"""The training-step benchmark's block: one Llama MLP block with sequence parallelism (operands,
their shards per rank), its timed variants (Megatron-style NCCL + torch.mm, torch async-TP,
distgemm's layers), the two one-GPU floors and the relative errors of a step's quantities."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

from benchmarks.training import report
from distgemm.compat import custom_ops
from distgemm.compat.nn import ColumnParallelLinear, RowParallelLinear
from distgemm.runtime.scales import FP8_DTYPE, quantize

# The functional collectives with autograd under the names of the running torch (newer releases
# add *_single and deprecate *_tensor).
_ag_autograd = (
    getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
)
_rs_autograd = (
    getattr(funcol, "reduce_scatter_single_autograd", None) or funcol.reduce_scatter_tensor_autograd
)


@dataclass
class BlockOperands:
    """One rank's shards of the block: the input and output-gradient rows ``[T/TP, H]``, the
    gate+up weight ``[2F/TP, H]`` and the down weight ``[H, F/TP]``."""

    x: torch.Tensor
    grad_out: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor


def full_block(tokens, hidden, ffn, device, dtype, seed=1234):
    """The full block's tensors, the same on every rank (one seed): x [T, H], grad_out [T, H],
    gate [F, H], up [F, H], down [H, F], the weights scaled by 1/sqrt(fan-in)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(shape, device=device, generator=gen) * scale).to(dtype)

    return (
        randn(tokens, hidden),
        randn(tokens, hidden),
        randn(ffn, hidden, scale=hidden**-0.5),
        randn(ffn, hidden, scale=hidden**-0.5),
        randn(hidden, ffn, scale=ffn**-0.5),
    )


def shard_block(full, rank: int, tp: int, gathered: bool = False) -> BlockOperands:
    """This rank's shards of ``full_block``'s tensors; with ``gathered``, the full input and
    output gradient ``[T, H]`` instead of this rank's rows (what the all-gathers hand this
    rank's GEMMs)."""
    x, grad_out, gate, up, down = full
    rows = slice(rank * x.shape[0] // tp, (rank + 1) * x.shape[0] // tp)
    rows = slice(None) if gathered else rows
    cols = slice(rank * gate.shape[0] // tp, (rank + 1) * gate.shape[0] // tp)
    return BlockOperands(
        x[rows].contiguous(),
        grad_out[rows].contiguous(),
        torch.cat([gate[cols], up[cols]]).contiguous(),
        down[:, cols].contiguous(),
    )


def swiglu(y: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of the column layer's ``[T, 2F/TP]`` output (gate columns first)."""
    gate, up = y.chunk(2, dim=-1)
    return F.silu(gate) * up


class GatherMatmul(torch.autograd.Function):
    """Megatron's column-parallel linear: ``all_gather(x_shard) @ w.T``; backward: the dgrad
    GEMM, its reduce-scatter in flight while the wgrad GEMM runs on the kept gathered input."""

    @staticmethod
    def forward(ctx, x_shard, w, group):
        x = x_shard.new_empty((group.size() * x_shard.shape[0], x_shard.shape[1]))
        custom_ops.all_gather_into(x, x_shard.contiguous(), group=group)
        ctx.save_for_backward(x, w)
        ctx.group = group
        return torch.mm(x, w.t())

    @staticmethod
    def backward(ctx, grad_out):
        x, w = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_x = torch.mm(grad_out, w)
        grad_shard = grad_x.new_empty((grad_x.shape[0] // ctx.group.size(), grad_x.shape[1]))
        work = custom_ops.reduce_scatter_into(grad_shard, grad_x, group=ctx.group, async_op=True)
        grad_w = torch.mm(grad_out.t(), x)
        work.wait()
        return grad_shard, grad_w, None


class MatmulScatter(torch.autograd.Function):
    """Megatron's row-parallel linear: ``reduce_scatter(h @ w.T)``; backward: all-gather of the
    output gradient, then the dgrad and wgrad GEMMs."""

    @staticmethod
    def forward(ctx, h, w, group):
        partial = torch.mm(h, w.t())
        out = partial.new_empty((partial.shape[0] // group.size(), partial.shape[1]))
        custom_ops.reduce_scatter_into(out, partial, group=group)
        ctx.save_for_backward(h, w)
        ctx.group = group
        return out

    @staticmethod
    def backward(ctx, grad_out):
        h, w = ctx.saved_tensors
        grad_shard = grad_out.contiguous()
        grad = grad_shard.new_empty((ctx.group.size() * grad_shard.shape[0], grad_shard.shape[1]))
        custom_ops.all_gather_into(grad, grad_shard, group=ctx.group)
        return torch.mm(grad, w), torch.mm(grad.t(), h), None


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise dynamic fp8 (e4m3) of ``t`` ``[rows, cols]`` (``runtime.scales.quantize``, each
    row's largest magnitude at e4m3's largest value: the row-wise recipe of torch's scaled fused
    ops): ``(q, s)``, ``s`` float32 ``[rows, 1]`` as torch's scaled ops take it."""
    q, s = quantize(t, rowwise=True)
    return q, s[:, None]


def _gather(x_shard, group):
    """all_gather(x_shard) along dim 0 (fp8 moved as bytes: gloo and NCCL both have bytes)."""
    x = x_shard.new_empty((group.size() * x_shard.shape[0], *x_shard.shape[1:]))
    as_bytes = x_shard.dtype == FP8_DTYPE
    src, dst = (x_shard.view(torch.uint8), x.view(torch.uint8)) if as_bytes else (x_shard, x)
    custom_ops.all_gather_into(dst, src.contiguous(), group=group)
    return x


class _Fp8Forward(torch.autograd.Function):
    """The fp8 linears' forward: ``a`` and ``w`` quantized row-wise (``quantize_rows``), then
    ``gemm(aq, a_scales, wq, w_scales)`` (bf16); ``a`` and ``w`` kept in bf16 for the backward."""

    @staticmethod
    def forward(ctx, a, w, group, gemm):
        (aq, a_s), (wq, ws) = quantize_rows(a), quantize_rows(w)
        ctx.save_for_backward(a, w)
        ctx.group = group
        return gemm(aq, a_s, wq, ws)


class Fp8GatherMatmul(_Fp8Forward):
    """The column-parallel linear with an fp8 forward: ``all_gather(x_shard) @ w.T``, the
    ``gemm`` taking this rank's fp8 rows and giving bf16 ``[T, N]``; backward in bf16 as
    Megatron's, the input gathered again (the fp8 forward keeps no bf16 gathered input), its
    all-gather in flight under the dgrad GEMM and the dgrad's reduce-scatter under the wgrad
    GEMM."""

    @staticmethod
    def backward(ctx, grad_out):
        x_shard, w = ctx.saved_tensors
        group, grad_out = ctx.group, grad_out.contiguous()
        x = x_shard.new_empty((group.size() * x_shard.shape[0], x_shard.shape[1]))
        gathering = custom_ops.all_gather_into(x, x_shard, group=group, async_op=True)
        grad_x = torch.mm(grad_out, w)
        grad_shard = grad_x.new_empty((grad_x.shape[0] // group.size(), grad_x.shape[1]))
        gathering.wait()
        scattering = custom_ops.reduce_scatter_into(grad_shard, grad_x, group=group, async_op=True)
        grad_w = torch.mm(grad_out.t(), x)
        scattering.wait()
        return grad_shard, grad_w, None, None


class Fp8MatmulScatter(_Fp8Forward):
    """The row-parallel linear with an fp8 forward: ``reduce_scatter(h @ w.T)``, the ``gemm``
    giving bf16 ``[T/TP, H]``; backward in bf16 as Megatron's."""

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, _ = MatmulScatter.backward(ctx, grad_out)
        return grad_h, grad_w, None, None


def _scaled_mm(aq, a_s, wq, ws):
    """bf16 ``(a_s * aq) @ (ws * wq).T`` (row-wise scales) by torch._scaled_mm."""
    return torch._scaled_mm(aq, wq.t(), scale_a=a_s, scale_b=ws.t(), out_dtype=torch.bfloat16)


def fp8_gemms(name: str, group, tokens: int):
    """(column gemm, row gemm) of Fp8GatherMatmul and Fp8MatmulScatter for variant ``name``:
    megatron_fp8 (NCCL + torch._scaled_mm), async_tp_fp8 (torch's fused scaled symm_mem ops)
    or distgemm_fp8 (distgemm's drop-ins of those ops, compat.symm_mem_fp8); ``tokens``: T."""
    group_name = group.group_name
    lists = dict(biases=[None], result_scales=[None], out_dtypes=[torch.bfloat16])
    lists["use_fast_accum"] = [False]
    if name == "megatron_fp8":

        def column(xq, xs, wq, ws):
            return _scaled_mm(_gather(xq, group), _gather(xs, group), wq, ws)

        def row(hq, hs, wq, ws):
            partial = _scaled_mm(hq, hs, wq, ws)
            out = partial.new_empty((partial.shape[0] // group.size(), partial.shape[1]))
            custom_ops.reduce_scatter_into(out, partial, group=group)
            return out

        return column, row
    if name == "async_tp_fp8":
        ag = torch.ops.symm_mem.fused_all_gather_scaled_matmul
        rs = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter
    elif name == "distgemm_fp8":
        from distgemm.compat import symm_mem_fp8

        ag = symm_mem_fp8.fused_all_gather_scaled_matmul
        rs = symm_mem_fp8.fused_scaled_matmul_reduce_scatter
    else:
        raise ValueError(f"unknown fp8 variant {name!r}")

    def column(xq, xs, wq, ws):
        return ag(xq, [wq.t()], xs, [ws.t()], 0, group_name, **lists)[1][0]

    def row(hq, hs, wq, ws):
        shape = [tokens, wq.shape[0]]
        return rs(hq, wq.t(), hs, ws.t(), "sum", 0, 0, group_name, shape, out_dtype=torch.bfloat16)

    return column, row


def functional_block(x_shard, w_gate_up, w_down, group_name: str):
    """The block in functional collectives (with autograd) + torch.mm, the form torch's
    micro-pipeline TP pass rewrites into its fused symmetric-memory ops under torch.compile."""
    x = _ag_autograd(x_shard, 0, group_name)
    h = swiglu(torch.mm(x, w_gate_up.t()))
    return _rs_autograd(torch.mm(h, w_down.t()), "sum", 0, group_name)


@dataclass
class Variant:
    """A timed block: ``forward(x)``, the leaves whose gradients a step computes (the input
    and the weights) and the output gradient it backpropagates."""

    name: str
    forward: Any
    x: torch.Tensor
    weights: tuple
    grad_out: torch.Tensor

    def step(self) -> torch.Tensor:
        """One training step: gradients cleared (set to None, as zero_grad does), forward,
        backward of the fixed output gradient; returns the output."""
        for t in (self.x, *self.weights):
            t.grad = None
        y = self.forward(self.x)
        y.backward(self.grad_out)
        return y

    def poisoned_step(self) -> None:
        """One step on a NaN input, the input restored and the gradients dropped after: the
        memory the caching allocator hands out next holds NaN, so a variant checked after this
        cannot pass by leaving an earlier variant's (right) result in an output it never
        wrote."""
        with torch.no_grad():
            saved = self.x.detach().clone()
            self.x.fill_(math.nan)
        self.step()
        with torch.no_grad():
            self.x.copy_(saved)
        for t in (self.x, *self.weights):
            t.grad = None

    def values(self) -> dict[str, torch.Tensor | None]:
        """The output and every gradient of one step (copies; None for a gradient the step
        did not compute)."""
        y = self.step()
        grads = [t.grad for t in (self.x, *self.weights)]
        return {
            q: None if v is None else v.detach().clone()
            for q, v in zip(report.QUANTITIES, [y, *grads])
        }


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def make_variant(name: str, ops: BlockOperands, group) -> Variant:
    """The variant ``name`` of the block on ``ops`` (its own copies of the leaves)."""
    x = _leaf(ops.x)
    if name in report.DISTGEMM:
        hidden, ffn2 = ops.x.shape[1], ops.w_gate_up.shape[0] * group.size()
        dev, dtype = ops.x.device, ops.x.dtype
        col = ColumnParallelLinear(
            hidden, ffn2, bias=False, group=group, device=dev, dtype=dtype,
            keep_gathered_input=name == "distgemm_keep",
        )  # fmt: skip
        row = RowParallelLinear(ffn2 // 2, hidden, bias=False, group=group, device=dev, dtype=dtype)
        with torch.no_grad():
            col.weight.copy_(ops.w_gate_up)
            row.weight.copy_(ops.w_down)

        def block(t):
            return row(swiglu(col(t)))

        forward = torch.compile(block, fullgraph=True) if name == "distgemm_compiled" else block
        return Variant(name, forward, x, (col.weight, row.weight), ops.grad_out)
    w1, w2 = _leaf(ops.w_gate_up), _leaf(ops.w_down)
    group_name = group.group_name
    if name == "megatron":

        def forward(t):
            return MatmulScatter.apply(swiglu(GatherMatmul.apply(t, w1, group)), w2, group)

    elif name == "async_tp":
        compiled = torch.compile(functional_block, fullgraph=True)

        def forward(t):
            return compiled(t, w1, w2, group_name)

    elif name == "async_tp_eager":  # the same math without the compiler (--cpu-smoke)

        def forward(t):
            return functional_block(t, w1, w2, group_name)

    elif name in report.FP8_VARIANTS:
        column, row = fp8_gemms(name, group, group.size() * ops.x.shape[0])

        def forward(t):
            y = Fp8GatherMatmul.apply(t, w1, group, column)
            return Fp8MatmulScatter.apply(swiglu(y), w2, group, row)

    else:
        raise ValueError(f"unknown variant {name!r}")
    return Variant(name, forward, x, (w1, w2), ops.grad_out)


def floor_step(ops: BlockOperands, tp: int):
    """The block's six GEMMs on one GPU with this rank's shapes, into preallocated outputs (no
    communication, no elementwise work): returns ``(step, outputs)``."""
    tokens, hidden = tp * ops.x.shape[0], ops.x.shape[1]
    ffn_local = ops.w_down.shape[1]
    like = ops.x

    def empty(*shape):
        return like.new_empty(shape)

    x, g2 = empty(tokens, hidden).normal_(), empty(tokens, hidden).normal_()
    h, g1 = empty(tokens, ffn_local).normal_(), empty(tokens, 2 * ffn_local).normal_()
    w1, w2 = ops.w_gate_up, ops.w_down
    outs = [
        empty(tokens, 2 * ffn_local),
        empty(tokens, hidden),
        empty(tokens, ffn_local),
        empty(*w2.shape),
        empty(tokens, hidden),
        empty(*w1.shape),
    ]

    def step():
        torch.mm(x, w1.t(), out=outs[0])  # forward gate+up
        torch.mm(h, w2.t(), out=outs[1])  # forward down (partial sums)
        torch.mm(g2, w2, out=outs[2])  # down dgrad
        torch.mm(g2.t(), h, out=outs[3])  # down wgrad
        torch.mm(g1, w1, out=outs[4])  # gate+up dgrad
        torch.mm(g1.t(), x, out=outs[5])  # gate+up wgrad

    return step, outs


def check_floor(ops: BlockOperands, tp: int):
    """The floor's step after its outputs are poisoned with NaN: every output written and
    finite (the GEMMs are torch.mm itself, so nothing else to compare); returns the step."""
    step, outs = floor_step(ops, tp)
    for o in outs:
        o.fill_(float("nan"))
    step()
    if not all(bool(torch.isfinite(o).all()) for o in outs):
        raise RuntimeError("floor: a GEMM output kept its NaN poison")
    return step


def local_block(x, w_gate_up, w_down):
    """The block without communication: ``swiglu(x @ w_gate_up.T) @ w_down.T``, the partial
    sums that the row-parallel layer's reduce-scatter consumes."""
    return torch.mm(swiglu(torch.mm(x, w_gate_up.t())), w_down.t())


def make_floor_step(gathered: BlockOperands, compiled: bool = True) -> Variant:
    """floor_step: ``local_block`` on one GPU (``compiled``: under torch.compile(fullgraph=True),
    so inductor fuses the elementwise work as in the compiled variants) on ``gathered``, a
    rank's weight shards with the full ``[T, H]`` input and output gradient (shard_block's
    ``gathered``); the input and both weights are leaves whose gradients every step computes."""
    w1, w2 = _leaf(gathered.w_gate_up), _leaf(gathered.w_down)
    block = torch.compile(local_block, fullgraph=True) if compiled else local_block

    def forward(t):
        return block(t, w1, w2)

    return Variant("floor_step", forward, _leaf(gathered.x), (w1, w2), gathered.grad_out)


def check_floor_step(gathered: BlockOperands) -> tuple[Variant, dict[str, float]]:
    """The compiled floor_step against the same block run eagerly in the same dtype, after a
    poisoned step (NaN in the memory the allocator hands out next): the output and every
    gradient present and within ERR_TOL (relative Frobenius error). Returns the variant and
    its errors; RuntimeError naming the quantity and its error where one is off."""
    ref = make_floor_step(gathered, compiled=False).values()
    variant = make_floor_step(gathered)
    variant.poisoned_step()  # also the first call: compiles forward and backward
    got = variant.values()
    for q, v in got.items():
        if v is None:
            raise RuntimeError(f"floor_step: {q} is None (the step computed no such gradient)")
    errs = rel_errors(got, ref)
    for q, e in errs.items():
        if not e < report.ERR_TOL:
            why = " (nan: not finite)" if e != e else ""
            raise RuntimeError(
                f"floor_step: {q} rel. err {e:.3g}{why} against the eager block "
                f"(tolerance {report.ERR_TOL})"
            )
    return variant, errs


def rel_errors(got: dict, ref: dict) -> dict[str, float]:
    """Relative Frobenius error of every quantity (NaN where ``got`` is not finite)."""
    out = {}
    for q, r in ref.items():
        g = got[q].float()
        finite = bool(torch.isfinite(g).all())
        err = (g - r.float()).norm() / r.float().norm().clamp_min(1e-30)
        out[q] = float(err) if finite else math.nan
    return out
