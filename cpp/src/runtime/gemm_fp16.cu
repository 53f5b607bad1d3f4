// fp16 in/out, fp32 accumulate: one kernel instantiation (see kernel/gemm_sm90.cuh).
#include "distgemm/kernel/gemm_sm90.cuh"

DISTGEMM_DEFINE_GEMM_ENTRY_POINTS(fp16, cutlass::half_t)
