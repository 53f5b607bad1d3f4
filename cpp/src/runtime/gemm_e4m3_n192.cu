// fp8 e4m3 in, bf16 out, fp32 accumulate promoted every 4 k-blocks, output tile 128x192x128,
// cluster 2x1: the accurate fp8 kernel (see kernel/gemm_sm90.cuh's Fp8Config). One translation
// unit per kernel, so that the build compiles them in parallel.
#include "distgemm/kernel/gemm_sm90.cuh"

DISTGEMM_DEFINE_GEMM_ENTRY_POINTS(e4m3_n192, sm90::Fp8Config<128, 192, false>)
