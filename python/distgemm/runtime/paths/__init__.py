"""The ways of running one op call, one module each, behind one interface (``common.PathState``):
``overlapped`` (the plan's CUDA graph), ``collective`` (NCCL and one torch GEMM) and ``fused``
(GEMM + all-reduce in one kernel); ``allreduce`` is distgemm's own one-shot / two-shot all-reduce,
a building block of the paths rather than a path."""
