// bf16 in/out, fp32 accumulate: one kernel instantiation (see kernel/gemm_sm90.cuh).
#include "distgemm/kernel/gemm_sm90.cuh"

DISTGEMM_DEFINE_GEMM_ENTRY_POINTS(bf16, cutlass::bfloat16_t)
