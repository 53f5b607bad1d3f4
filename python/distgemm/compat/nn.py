"""Tensor-parallel linear layers with autograd, in Megatron's sequence-parallel layout.

- ``ColumnParallelLinear(in_features=H, out_features=F)``: input ``[T/TP, ..., H]`` (this rank's
  tokens, sequence first), weight ``[F/TP, H]`` (this rank's rows of the ``nn.Linear`` weight),
  bias ``[F/TP]``; output ``[T, ..., F/TP]``. The all-gather of the tokens runs under the GEMM.
- ``RowParallelLinear(in_features=F, out_features=H)``: input ``[T, ..., F/TP]``, weight
  ``[H, F/TP]`` (this rank's columns), bias ``[H]`` (the same on every rank, added once); output
  ``[T/TP, ..., H]``. The reduce-scatter of the result runs under the GEMM.

Both run ``distgemm::all_gather_linear`` / ``distgemm::linear_reduce_scatter``
(``distgemm.compat.custom_ops``): the distgemm ops on CUDA in bf16/fp16, the plain collective +
``torch.mm`` otherwise, forward and backward, and one node each under ``torch.compile``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from . import custom_ops


def _shard_size(what: str, features: int, tp: int) -> int:
    if features % tp:
        raise ValueError(f"{what}={features} is not divisible by tp={tp}")
    return features // tp


def _check_input(layer: str, x: torch.Tensor, features: int, what: str) -> None:
    if x.dim() < 2 or x.shape[-1] != features:
        raise ValueError(
            f"{layer} expects input [tokens, ..., {what}={features}], got shape {list(x.shape)}"
        )


class _ParallelLinear(nn.Module):
    """What both layers share: the group, the sharded parameters and their construction."""

    def __init__(self, in_features, out_features, bias, group, device, dtype, shard_dim):
        super().__init__()
        group = group if group is not None else dist.group.WORLD
        # The group by name only, as the ops take it: a module holding no ProcessGroup object
        # can be deep-copied and pickled.
        self.group_name = custom_ops.group_name_of(group)
        self.tp = group.size()
        self.rank = group.rank()
        self.in_features = in_features
        self.out_features = out_features
        self.shard_dim = shard_dim  # the dim of the nn.Linear weight [out, in] that is sharded
        shape = [out_features, in_features]
        what = "out_features" if shard_dim == 0 else "in_features"
        shape[shard_dim] = _shard_size(what, shape[shard_dim], self.tp)
        self.weight = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        bias_size = shape[0]
        self.bias = (
            nn.Parameter(torch.empty(bias_size, device=device, dtype=dtype)) if bias else None
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation of the full layer, bounds from the full fan-in."""
        bound = self.in_features**-0.5
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, **options):
        """This rank's shard of ``linear`` (the same full layer on every rank); ``options``: the
        layer's own keyword arguments (``keep_gathered_input``)."""
        layer = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            group=group,
            device=linear.weight.device,
            dtype=linear.weight.dtype,
            **options,
        )
        with torch.no_grad():
            layer.weight.copy_(linear.weight.chunk(layer.tp, layer.shard_dim)[layer.rank])
            if linear.bias is not None:
                bias = (
                    linear.bias if layer.shard_dim == 1 else linear.bias.chunk(layer.tp)[layer.rank]
                )
                layer.bias.copy_(bias)
        return layer

    def gather_weight(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The full ``nn.Linear`` weight ``[out, in]`` and bias ``[out]`` (a collective)."""
        group = custom_ops.group_of(self.group_name)
        weight = self.weight.detach()
        if self.shard_dim == 1:
            weight = weight.t()
        full = weight.new_empty((self.tp * weight.shape[0], weight.shape[1]))
        custom_ops.all_gather_into(full, weight.contiguous(), group=group)
        if self.shard_dim == 1:
            full = full.t()
        bias = None
        if self.bias is not None:
            bias = self.bias.detach().clone()
            if self.shard_dim == 0:
                bias = bias.new_empty(self.out_features)
                custom_ops.all_gather_into(bias, self.bias.detach().contiguous(), group=group)
        return full.contiguous(), bias

    def to_linear(self) -> nn.Linear:
        """A plain ``nn.Linear`` holding the gathered full layer (a collective)."""
        weight, bias = self.gather_weight()
        linear = nn.Linear(
            self.in_features,
            self.out_features,
            bias=bias is not None,
            device=weight.device,
            dtype=weight.dtype,
        )
        with torch.no_grad():
            linear.weight.copy_(weight)
            if bias is not None:
                linear.bias.copy_(bias)
        return linear

    def _operands(self, x: torch.Tensor):
        """Input, weight and bias in the dtype the op computes in: under ``torch.autocast`` the
        autocast dtype (the parameters stay in theirs and get gradients through the cast), else
        as they are."""
        device = x.device.type
        if not torch.is_autocast_enabled(device):
            return x, self.weight, self.bias
        dtype = torch.get_autocast_dtype(device)
        bias = None if self.bias is None else self.bias.to(dtype)
        return x.to(dtype), self.weight.to(dtype), bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, tp={self.tp}"
        )


class ColumnParallelLinear(_ParallelLinear):
    """``y = all_gather(x, dim 0) @ w.T + b`` with ``w`` this rank's ``[F/TP, H]`` rows:
    ``[T/TP, ..., H]`` in, ``[T, ..., F/TP]`` out.

    ``keep_gathered_input``: True keeps the gathered ``[T, H]`` input from forward for the weight
    gradient; False keeps only this rank's shard and gathers it again in backward, while the
    dgrad GEMM runs (less memory, one more all-gather)."""

    def __init__(
        self,
        in_features,
        out_features,
        bias=True,
        group=None,
        device=None,
        dtype=None,
        keep_gathered_input=True,
    ):
        super().__init__(in_features, out_features, bias, group, device, dtype, shard_dim=0)
        self.keep_gathered_input = keep_gathered_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input("ColumnParallelLinear", x, self.in_features, "in_features")
        x2d, weight, bias = self._operands(x.reshape(-1, x.shape[-1]))
        out, _ = custom_ops.all_gather_linear(
            x2d, weight, bias, self.group_name, self.keep_gathered_input
        )
        return out.view(self.tp * x.shape[0], *x.shape[1:-1], out.shape[-1])


class RowParallelLinear(_ParallelLinear):
    """``y = reduce_scatter(x @ w.T, dim 0) + b`` with ``w`` this rank's ``[H, F/TP]`` columns:
    ``[T, ..., F/TP]`` in, ``[T/TP, ..., H]`` out."""

    def __init__(self, in_features, out_features, bias=True, group=None, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, group, device, dtype, shard_dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input("RowParallelLinear", x, self.weight.shape[1], "in_features/tp")
        if x.shape[0] % self.tp:
            raise ValueError(
                f"RowParallelLinear: tokens={x.shape[0]} (input dim 0) is not divisible by "
                f"tp={self.tp}"
            )
        x2d, weight, bias = self._operands(x.reshape(-1, x.shape[-1]))
        out = custom_ops.linear_reduce_scatter(x2d, weight, bias, self.group_name)
        return out.view(x.shape[0] // self.tp, *x.shape[1:-1], out.shape[-1])
