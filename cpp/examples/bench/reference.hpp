// The reference side of distgemm_bench's verification: random fills (fp8: quantized data and its
// scales), a plain fp32 GEMM over the checked rows, and the comparison kernels, launched on the
// current device's legacy stream.
// Host declarations only; the kernels (one instantiation per dtype) live in reference.cu.
#pragma once

#include <cstdint>

#include "distgemm/kernel/gemm.hpp"

namespace distgemm::bench {

// p[0 .. n) uniform in [-1, 1) from `seed`: never zeros (zeros hide unwritten outputs and run
// faster). fp8 (E4M3): the data quantized at unit scale, e4m3(u * kE4M3Max) for u uniform in
// [-1, 1) (never zero either), to be read with scales from fill_scales.
void fill_random(kernel::DType dtype, void* p, int64_t n, uint64_t seed);

// The largest finite e4m3 value: a quantizer maps a tensor's (or row's) amax to it, so the scale
// of data of amax `a` is a / kE4M3Max (torch's convention).
inline constexpr float kE4M3Max = 448.0f;

// p[0 .. n) = a / kE4M3Max for a seeded amax `a` uniform in [0.5, 2): the scales of fp8 data from
// fill_random, which is then x / scale, rounded to e4m3, for data x uniform in [-a, a).
void fill_scales(float* p, int64_t n, uint64_t seed);

// fp8 scales of a reference GEMM: A's row m is multiplied by a[a_rows ? m : 0], B's row n by
// b[b_rows ? n : 0]. Null pointers (bf16, fp16): no scaling.
struct RefScales {
  const float* a = nullptr;
  bool a_rows = false;
  const float* b = nullptr;
  bool b_rows = false;
};

// acc[l, r, n] = sum_k A[l, rows[r], k] * B[l, n, k] in fp32 for the R checked rows (rows null:
// every row, R == M); A [L, M, K], B [L, N, K]; fp8 operands are dequantized (value x scale)
// before the product. Row scales need L = 1.
void reference_gemm(kernel::DType dtype, const void* A, const void* B, const RefScales& scales,
                    float* acc, const int64_t* rows, int64_t R, int64_t M, int64_t N, int64_t K,
                    int64_t L);

// Over the checked rows (acc [L, R, N]; out and C [L, M, N], row rows[r] or r), with
// ref = alpha * acc + beta * C + bias: err[0] += sum (out - ref)^2, err[1] += sum ref^2,
// err[2] += #non-finite outputs. C and bias may be null. `dtype`: the run's; out, C and bias are
// of its output type (kernel::out_dtype: bf16 for fp8).
void compare_to_reference(kernel::DType dtype, const void* out, const float* acc, const void* C,
                          const void* bias, float alpha, float beta, const int64_t* rows, int64_t L,
                          int64_t R, int64_t M, int64_t N, double* err);

// err[2] += #non-finite values of out[0 .. total) (of the output type of the run's `dtype`): with
// NaN-poisoned outputs, every element a launch left unwritten, also in the rows a sampled check
// does not compare.
void count_nonfinite(kernel::DType dtype, const void* out, int64_t total, double* err);

}  // namespace distgemm::bench
