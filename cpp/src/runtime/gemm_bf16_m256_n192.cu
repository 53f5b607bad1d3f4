// bf16 in/out, fp32 accumulate, output tile 256x192, cooperative, cluster 1x2: one kernel
// instantiation (see kernel/gemm_sm90.cuh). The tile moves 0.78x the operand bytes per flop of
// 128x256 ((256 + 192) / (256 * 192) against (128 + 256) / (128 * 256)), which is what the
// full-grid GEMMs are bound by under the power cap. Each consumer warpgroup owns a 128x192 fp32
// accumulator (192 registers of the 232 it gets); three 56 KB stages fit beside the epilogue.
// Cluster 1x2: the pair multicasts its 256-row A tile, and the padding to the cluster falls on N.
#include "distgemm/kernel/gemm_sm90.cuh"

DISTGEMM_DEFINE_GEMM_ENTRY_POINTS(bf16_m256_n192,
                                  sm90::Config<cutlass::bfloat16_t, 256, 192, 1, 2, false, false>)
