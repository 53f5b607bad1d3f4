"""Decode-size GEMM + all-reduce: the row-parallel layers under torchrun (decode_layers), the
fused path at TP=1 on one GPU (fused_tp1), and the report."""
