"""distgemm's GEMM kernel against cuBLAS on one GPU: the shapes, the benchmark, its report, and
the comparison of the two output tiles."""
