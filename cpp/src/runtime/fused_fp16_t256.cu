// Fused GEMM + all-reduce, fp16, token tile 256: one kernel instantiation (see
// kernel/fused_allreduce_sm90.cuh; kernel/fused_allreduce.hpp says which tile runs a call).
#include "distgemm/kernel/fused_allreduce_sm90.cuh"

DISTGEMM_DEFINE_FUSED_ENTRY_POINTS(fp16_t256, cutlass::half_t, 256)
