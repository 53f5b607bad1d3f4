// fp16 in/out, fp32 accumulate, output tile 128x128: one kernel instantiation (see
// kernel/gemm_sm90.cuh; kernel/tile_choice.hpp says which tile runs a GEMM). One translation
// unit per kernel, so that the build compiles them in parallel.
#include "distgemm/kernel/gemm_sm90.cuh"

DISTGEMM_DEFINE_GEMM_ENTRY_POINTS(fp16_n128,
                                  sm90::Config<cutlass::half_t, 128, 128, 2, 1, false, false>)
