// A CUDA driver API function reached through the runtime (cudaGetDriverEntryPointByVersion), so
// that nothing links libcuda: the CPU-only build machines have no driver.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace distgemm::device {

// The driver's function `name` of ABI `version` (e.g. 12000) as `Fn`; std::runtime_error naming
// `who` and `name` where the driver lacks it. Callers keep it in a function-local static: looked
// up once (a failed lookup is tried again at the next call).
template <class Fn>
Fn driver_entry(const char* name, int version, const char* who) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string(who) + ": " + name + " is unavailable in this driver");
  }
  return reinterpret_cast<Fn>(p);
}

}  // namespace distgemm::device
