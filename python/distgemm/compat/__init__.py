"""The framework layer: autograd layers, torch.library ops and drop-ins for torch's symm_mem ops.

``nn`` (ColumnParallelLinear, RowParallelLinear), ``custom_ops`` (the ops torch.compile sees),
``symm_mem`` and ``symm_mem_fp8`` (drop-ins for ``torch.ops.symm_mem``'s fused ops). Each
imports ``distgemm.ops`` and nothing above it.
"""
