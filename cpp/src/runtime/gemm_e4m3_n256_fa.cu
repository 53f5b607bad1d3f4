// fp8 e4m3 in, bf16 out, CUTLASS's fast accumulation, output tile 128x256x128, cluster 2x1: the
// fp8 kernel of GemmDesc::fast_accum (see kernel/gemm_sm90.cuh's Fp8Config). One translation
// unit per kernel, so that the build compiles them in parallel.
#include "distgemm/kernel/gemm_sm90.cuh"

DISTGEMM_DEFINE_GEMM_ENTRY_POINTS(e4m3_n256_fa, sm90::Fp8Config<128, 256, true>)
