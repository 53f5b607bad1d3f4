// The push kernel of benchmarks/probes/sm_push.py: `ctas` CTAs copy `bytes` from this GPU's
// memory to a peer's (a UVA address) with 16-byte loads and stores, UNROLL of each in flight per
// thread. Built by the probe with nvcc into a shared library that it calls through ctypes.
#include <cuda_runtime.h>

#include <cstddef>

namespace {

constexpr int kUnroll = 4;

__global__ void push_kernel(const int4* __restrict__ src, int4* __restrict__ dst, size_t n16) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t base = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; base < n16;
       base += stride * kUnroll) {
    int4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t j = base + u * stride;
      if (j < n16) v[u] = __ldg(src + j);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t j = base + u * stride;
      if (j < n16) dst[j] = v[u];
    }
  }
}

}  // namespace

// Enqueues one push on `stream`; returns the launch's cudaError_t (0: launched). `bytes` is a
// multiple of 16 and both pointers 16-byte aligned (the probe's buffers are).
extern "C" int sm_push(void* dst, const void* src, size_t bytes, int ctas, int threads,
                       void* stream) {
  push_kernel<<<ctas, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const int4*>(src), static_cast<int4*>(dst), bytes / 16);
  return static_cast<int>(cudaGetLastError());
}
