// bf16 in/out, fp32 accumulate, output tile 128x128, cluster 2x1, stream-K tile scheduler: one
// kernel instantiation (see kernel/gemm_sm90.cuh). For grids of 128x128 tiles that leave SMs of
// their only or last wave idle, where the caller gives a workspace.
#include "distgemm/kernel/gemm_sm90.cuh"

DISTGEMM_DEFINE_GEMM_ENTRY_POINTS(bf16_n128_sk,
                                  sm90::Config<cutlass::bfloat16_t, 128, 128, 2, 1, false, true>)
