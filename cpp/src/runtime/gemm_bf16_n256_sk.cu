// bf16 in/out, fp32 accumulate, output tile 128x256, cluster 2x1, stream-K tile scheduler: one
// kernel instantiation (see kernel/gemm_sm90.cuh). The model (kernel/tile_choice.hpp) runs it
// where the data-parallel tiles leave a partial last wave and the caller gives a workspace.
#include "distgemm/kernel/gemm_sm90.cuh"

DISTGEMM_DEFINE_GEMM_ENTRY_POINTS(bf16_n256_sk,
                                  sm90::Config<cutlass::bfloat16_t, 128, 256, 2, 1, false, true>)
