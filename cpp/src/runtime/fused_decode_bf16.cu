// Fused GEMM + all-reduce, bf16, the decode kernel at every token width (16, 32, 64; see
// kernel/fused_decode_sm90.cuh; kernel/fused_allreduce.hpp says which kernel runs a call).
#include "distgemm/kernel/fused_decode_sm90.cuh"

DISTGEMM_DEFINE_FUSED_DECODE_ENTRY_POINTS(decode_bf16, __nv_bfloat16)
