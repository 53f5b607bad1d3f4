// fp16 in/out, fp32 accumulate, output tile 128x256, B N-contiguous ([k, n]: a transposed weight
// view, as a backward dgrad GEMM reads it): one kernel instantiation (see kernel/gemm_sm90.cuh).
// Only the wide tile has this layout: it serves the large GEMMs of training steps.
#include "distgemm/kernel/gemm_sm90.cuh"

DISTGEMM_DEFINE_GEMM_ENTRY_POINTS(fp16_n256_bn,
                                  sm90::Config<cutlass::half_t, 128, 256, 2, 1, true, false>)
