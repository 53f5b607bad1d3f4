// Reference kernels of distgemm_bench: random fill (fp8: quantized data and scales), a
// shared-memory tiled SIMT GEMM in fp32 (deliberately unrelated to the CUTLASS path it checks)
// and the error reductions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "distgemm/device/check.hpp"
#include "reference.hpp"

namespace distgemm::bench {

namespace {

__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_fp8_e4m3 v) { return float(v); }
template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ __forceinline__ __half from_f(float v) {
  return __float2half(v);
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 from_f(float v) {
  return __nv_fp8_e4m3(v);  // round to nearest, saturating to the finite range
}

// The smallest magnitude fill_random writes: a positive value of the type (e4m3's least
// subnormal, 2^-9; for bf16 and fp16 one step of the generator, 2^-23), so no zeros.
template <class T>
constexpr float kLeastFill = 1.0f / 8388608.0f;
template <>
constexpr float kLeastFill<__nv_fp8_e4m3> = 1.0f / 512.0f;

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// Uniform in [0, 1) from element i of `seed`'s stream.
__device__ __forceinline__ float uniform01(uint64_t seed, int64_t i) {
  return float(mix(seed * 0x9e3779b97f4a7c15ull + uint64_t(i)) >> 40) * (1.0f / 16777216.0f);
}

// range * u for u uniform in [-1, 1), at least kLeastFill<T> in magnitude: never zeros (zeros hide
// unwritten outputs and run faster).
template <class T>
__global__ void fill_random_kernel(T* p, int64_t n, uint64_t seed, float range) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = (2.0f * uniform01(seed, i) - 1.0f) * range;
    if (fabsf(v) < kLeastFill<T>) v = copysignf(kLeastFill<T>, v);
    p[i] = from_f<T>(v);
  }
}

// a / kE4M3Max for an amax a uniform in [0.5, 2).
__global__ void fill_scales_kernel(float* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = (0.5f + 1.5f * uniform01(seed, i)) / kE4M3Max;
}

// The dequantizing factor of row `row` of an operand with scales `s` (null: 1).
__device__ __forceinline__ float scale_of(const float* s, bool per_row, int64_t row) {
  return s ? s[per_row ? row : 0] : 1.0f;
}

// Reference: Dref[l, r, n] = sum_k A[l, rows[r], k] * B[l, n, k] in fp32 for the R checked rows
// (rows == nullptr: every row, R == M), a plain shared-memory tiled SIMT kernel (deliberately
// unrelated to the CUTLASS path it checks), each operand element dequantized (x its row's or
// tensor's scale) as it is loaded. 64x64 tile, 4x4 per thread.
template <class T>
__global__ void __launch_bounds__(256)
    ref_gemm(const T* A, const T* B, RefScales sc, float* D, const int64_t* rows, int64_t R,
             int64_t M, int64_t N, int64_t K) {
  __shared__ float As[16][64 + 1];
  __shared__ float Bs[16][64 + 1];
  const int64_t l = blockIdx.z;
  A += l * M * K;
  B += l * N * K;
  D += l * R * N;
  const int64_t m0 = int64_t(blockIdx.y) * 64, n0 = int64_t(blockIdx.x) * 64;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    for (int i = threadIdx.x; i < 16 * 64; i += 256) {
      const int kk = i % 16, r = i / 16;
      const int64_t gm = m0 + r, gn = n0 + r, gk = k0 + kk;
      const int64_t am = gm < R ? (rows ? rows[gm] : gm) : 0;
      As[kk][r] = (gm < R && gk < K) ? to_f(A[am * K + gk]) * scale_of(sc.a, sc.a_rows, am) : 0.0f;
      Bs[kk][r] = (gn < N && gk < K) ? to_f(B[gn * K + gk]) * scale_of(sc.b, sc.b_rows, gn) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t gm = m0 + ty + 16 * i, gn = n0 + tx + 16 * j;
      if (gm < R && gn < N) D[gm * N + gn] = acc[i][j];
    }
}

// Over the checked rows (acc[L, R, N]; out and C are [L, M, N], row rows[r] or r):
// err[0] += sum (out - ref)^2, err[1] += sum ref^2, err[2] += #non-finite outputs, where
// ref = alpha * acc + beta * C + bias.
template <class T>
__global__ void compare(const T* out, const float* acc, const T* C, const T* bias, float alpha,
                        float beta, const int64_t* rows, int64_t L, int64_t R, int64_t M, int64_t N,
                        double* err) {
  double e = 0.0, r = 0.0, bad = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < L * R * N;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t l = i / (R * N), row = (i / N) % R, n = i % N;
    const int64_t o_i = (l * M + (rows ? rows[row] : row)) * N + n;
    float ref = alpha * acc[i];
    if (C) ref += beta * to_f(C[o_i]);
    if (bias) ref += to_f(bias[n]);
    const float o = to_f(out[o_i]);
    if (!isfinite(o))
      bad += 1.0;
    else
      e += double(o - ref) * double(o - ref);
    r += double(ref) * double(ref);
  }
  for (int off = 16; off > 0; off /= 2) {
    e += __shfl_down_sync(0xffffffffu, e, off);
    r += __shfl_down_sync(0xffffffffu, r, off);
    bad += __shfl_down_sync(0xffffffffu, bad, off);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(err + 0, e);
    atomicAdd(err + 1, r);
    atomicAdd(err + 2, bad);
  }
}

// err[2] += #non-finite values of out[total]: with NaN-poisoned outputs, every element the
// launch left unwritten, also in the rows a sampled check does not compare.
template <class T>
__global__ void count_nonfinite_kernel(const T* out, int64_t total, double* err) {
  double bad = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x)
    if (!isfinite(to_f(out[i]))) bad += 1.0;
  for (int off = 16; off > 0; off /= 2) bad += __shfl_down_sync(0xffffffffu, bad, off);
  if (threadIdx.x % 32 == 0 && bad > 0.0) atomicAdd(err + 2, bad);
}

constexpr int kBlocks = 1024, kThreads = 256;  // grid-stride loops: enough blocks to fill a GPU

// f(T{}) with T the device type of `dtype`; kFp8 false: bf16 and fp16 only (the output types, so
// the comparison kernels have no fp8 instantiation).
template <bool kFp8 = true, class F>
void with_type(kernel::DType dtype, F&& f) {
  switch (dtype) {
    case kernel::DType::BF16:
      return f(__nv_bfloat16{});
    case kernel::DType::FP16:
      return f(__half{});
    case kernel::DType::E4M3:
      if constexpr (kFp8) return f(__nv_fp8_e4m3{});
      break;
  }
  throw std::logic_error(std::string("internal: no reference kernel for ") +
                         kernel::dtype_name(dtype));
}

}  // namespace

void fill_random(kernel::DType dtype, void* p, int64_t n, uint64_t seed) {
  with_type(dtype, [&](auto t) {
    using T = decltype(t);
    const float range = dtype == kernel::DType::E4M3 ? kE4M3Max : 1.0f;
    fill_random_kernel<<<kBlocks, kThreads>>>(static_cast<T*>(p), n, seed, range);
  });
  DISTGEMM_CUDA_CHECK(cudaGetLastError());
}

void fill_scales(float* p, int64_t n, uint64_t seed) {
  fill_scales_kernel<<<kBlocks, kThreads>>>(p, n, seed);
  DISTGEMM_CUDA_CHECK(cudaGetLastError());
}

void reference_gemm(kernel::DType dtype, const void* A, const void* B, const RefScales& scales,
                    float* acc, const int64_t* rows, int64_t R, int64_t M, int64_t N, int64_t K,
                    int64_t L) {
  const dim3 grid(unsigned((N + 63) / 64), unsigned((R + 63) / 64), unsigned(L));
  with_type(dtype, [&](auto t) {
    using T = decltype(t);
    ref_gemm<<<grid, 256>>>(static_cast<const T*>(A), static_cast<const T*>(B), scales, acc, rows,
                            R, M, N, K);
  });
  DISTGEMM_CUDA_CHECK(cudaGetLastError());
}

void compare_to_reference(kernel::DType dtype, const void* out, const float* acc, const void* C,
                          const void* bias, float alpha, float beta, const int64_t* rows, int64_t L,
                          int64_t R, int64_t M, int64_t N, double* err) {
  with_type<false>(kernel::out_dtype(dtype), [&](auto t) {
    using T = decltype(t);
    compare<<<kBlocks, kThreads>>>(static_cast<const T*>(out), acc, static_cast<const T*>(C),
                                   static_cast<const T*>(bias), alpha, beta, rows, L, R, M, N, err);
  });
  DISTGEMM_CUDA_CHECK(cudaGetLastError());
}

void count_nonfinite(kernel::DType dtype, const void* out, int64_t total, double* err) {
  with_type<false>(kernel::out_dtype(dtype), [&](auto t) {
    using T = decltype(t);
    count_nonfinite_kernel<<<kBlocks, kThreads>>>(static_cast<const T*>(out), total, err);
  });
  DISTGEMM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace distgemm::bench
