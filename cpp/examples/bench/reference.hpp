// The reference side of distgemm_bench's verification: random fills, a plain fp32 GEMM over the
// checked rows, and the comparison kernels, launched on the current device's legacy stream.
// Host declarations only; the kernels (one instantiation per dtype) live in reference.cu.
#pragma once

#include <cstdint>

#include "distgemm/kernel/gemm.hpp"

namespace distgemm::bench {

// p[0 .. n) uniform in [-1, 1) from `seed`: never zeros (zeros hide unwritten outputs and run
// faster).
void fill_random(kernel::DType dtype, void* p, int64_t n, uint64_t seed);

// acc[l, r, n] = sum_k A[l, rows[r], k] * B[l, n, k] in fp32 for the R checked rows (rows null:
// every row, R == M); A [L, M, K], B [L, N, K].
void reference_gemm(kernel::DType dtype, const void* A, const void* B, float* acc,
                    const int64_t* rows, int64_t R, int64_t M, int64_t N, int64_t K, int64_t L);

// Over the checked rows (acc [L, R, N]; out and C [L, M, N], row rows[r] or r), with
// ref = alpha * acc + beta * C + bias: err[0] += sum (out - ref)^2, err[1] += sum ref^2,
// err[2] += #non-finite outputs. C and bias may be null.
void compare_to_reference(kernel::DType dtype, const void* out, const float* acc, const void* C,
                          const void* bias, float alpha, float beta, const int64_t* rows, int64_t L,
                          int64_t R, int64_t M, int64_t N, double* err);

// err[2] += #non-finite values of out[0 .. total): with NaN-poisoned outputs, every element a
// launch left unwritten, also in the rows a sampled check does not compare.
void count_nonfinite(kernel::DType dtype, const void* out, int64_t total, double* err);

}  // namespace distgemm::bench
