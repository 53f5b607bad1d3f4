// Reference kernels of distgemm_bench: random fill, a shared-memory tiled SIMT GEMM in fp32
// (deliberately unrelated to the CUTLASS path it checks) and the error reductions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "distgemm/device/check.hpp"
#include "reference.hpp"

namespace distgemm::bench {

namespace {

__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
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

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// Uniform in [-1, 1): never zeros (zeros hide unwritten outputs and run faster).
template <class T>
__global__ void fill_random_kernel(T* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix(seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
    p[i] = from_f<T>(float(h >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// Reference: Dref[l, r, n] = sum_k A[l, rows[r], k] * B[l, n, k] in fp32 for the R checked rows
// (rows == nullptr: every row, R == M), a plain shared-memory tiled SIMT kernel (deliberately
// unrelated to the CUTLASS path it checks). 64x64 tile, 4x4 per thread.
template <class T>
__global__ void __launch_bounds__(256)
    ref_gemm(const T* A, const T* B, float* D, const int64_t* rows, int64_t R, int64_t M, int64_t N,
             int64_t K) {
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
      As[kk][r] = (gm < R && gk < K) ? to_f(A[(rows ? rows[gm] : gm) * K + gk]) : 0.0f;
      Bs[kk][r] = (gn < N && gk < K) ? to_f(B[gn * K + gk]) : 0.0f;
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

}  // namespace

void fill_random(kernel::DType dtype, void* p, int64_t n, uint64_t seed) {
  if (dtype == kernel::DType::BF16)
    fill_random_kernel<<<kBlocks, kThreads>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  else
    fill_random_kernel<<<kBlocks, kThreads>>>(static_cast<__half*>(p), n, seed);
  DISTGEMM_CUDA_CHECK(cudaGetLastError());
}

void reference_gemm(kernel::DType dtype, const void* A, const void* B, float* acc,
                    const int64_t* rows, int64_t R, int64_t M, int64_t N, int64_t K, int64_t L) {
  const dim3 grid(unsigned((N + 63) / 64), unsigned((R + 63) / 64), unsigned(L));
  if (dtype == kernel::DType::BF16)
    ref_gemm<<<grid, 256>>>(static_cast<const __nv_bfloat16*>(A),
                            static_cast<const __nv_bfloat16*>(B), acc, rows, R, M, N, K);
  else
    ref_gemm<<<grid, 256>>>(static_cast<const __half*>(A), static_cast<const __half*>(B), acc, rows,
                            R, M, N, K);
  DISTGEMM_CUDA_CHECK(cudaGetLastError());
}

void compare_to_reference(kernel::DType dtype, const void* out, const float* acc, const void* C,
                          const void* bias, float alpha, float beta, const int64_t* rows, int64_t L,
                          int64_t R, int64_t M, int64_t N, double* err) {
  if (dtype == kernel::DType::BF16) {
    using T = __nv_bfloat16;
    compare<<<kBlocks, kThreads>>>(static_cast<const T*>(out), acc, static_cast<const T*>(C),
                                   static_cast<const T*>(bias), alpha, beta, rows, L, R, M, N, err);
  } else {
    using T = __half;
    compare<<<kBlocks, kThreads>>>(static_cast<const T*>(out), acc, static_cast<const T*>(C),
                                   static_cast<const T*>(bias), alpha, beta, rows, L, R, M, N, err);
  }
  DISTGEMM_CUDA_CHECK(cudaGetLastError());
}

void count_nonfinite(kernel::DType dtype, const void* out, int64_t total, double* err) {
  if (dtype == kernel::DType::BF16)
    count_nonfinite_kernel<<<kBlocks, kThreads>>>(static_cast<const __nv_bfloat16*>(out), total,
                                                  err);
  else
    count_nonfinite_kernel<<<kBlocks, kThreads>>>(static_cast<const __half*>(out), total, err);
  DISTGEMM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace distgemm::bench
