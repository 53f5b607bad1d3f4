"""The framework layer: autograd layers, torch.library ops and drop-ins for torch's symm_mem ops.

``nn`` (ColumnParallelLinear, RowParallelLinear), ``custom_ops`` (the ops torch.compile sees),
``symm_mem`` and ``symm_mem_fp8`` (drop-ins for ``torch.ops.symm_mem``'s fused ops),
``async_tp`` (the one switch: the drop-ins as the CUDA kernels of torch's ops, so that torch's
async-TP pass reaches distgemm). Each imports ``distgemm.ops`` and nothing above it.

``DISTGEMM_ASYNC_TP=1`` turns the switch on when this package is imported.
"""

from .async_tp import install_from_env

install_from_env()
