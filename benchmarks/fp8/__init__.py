"""fp8 (e4m3): the tensor-parallel layers against bf16 and torch (fp8_sweep) and the fp8 kernels
against torch._scaled_mm on one GPU."""
