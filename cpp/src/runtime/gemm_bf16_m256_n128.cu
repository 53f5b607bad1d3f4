// bf16 in/out, fp32 accumulate, output tile 256x128, cooperative, cluster 1x2: one kernel
// instantiation (see kernel/gemm_sm90.cuh). Cluster 1x2 rather than 2x1: the pair shares its
// 256-row A tile (the larger operand tile, multicast to both), and the padding to the cluster
// falls on N, whose tile count is even on every Llama shape, not on M (one 256-row tile at
// M <= 256 would run two). Each consumer warpgroup owns a 128x128 accumulator, the same fp32
// registers as 128x256's 64x256.
#include "distgemm/kernel/gemm_sm90.cuh"

DISTGEMM_DEFINE_GEMM_ENTRY_POINTS(bf16_m256_n128,
                                  sm90::Config<cutlass::bfloat16_t, 256, 128, 1, 2, false, false>)
