// bf16 in/out, fp32 accumulate, output tile 128x128, cluster 1x1: one kernel instantiation (see
// kernel/gemm_sm90.cuh; kernel/tile_choice.hpp says which configuration runs a GEMM). Cluster
// 1x1 because CUTLASS pads the M tile count to the cluster's M: with cluster 2x1 a GEMM with an
// odd number of 128-row tiles (decode, M <= 128) runs a whole extra row of tiles. 128x128 rather
// than 128x256: such GEMMs are bound by reading B, and the narrow tile puts twice the CTAs on it.
#include "distgemm/kernel/gemm_sm90.cuh"

DISTGEMM_DEFINE_GEMM_ENTRY_POINTS(bf16_n128_c11,
                                  sm90::Config<cutlass::bfloat16_t, 128, 128, 1, 1, false, false>)
