// Single-process symmetric workspace: peer access between every pair of devices and one
// zeroed allocation per device (device/workspace.hpp).
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "distgemm/device/check.hpp"
#include "distgemm/device/workspace.hpp"

namespace distgemm::device {

void enable_peer_access(const std::vector<int>& devices) {
  for (int d : devices) {
    DISTGEMM_CUDA_CHECK(cudaSetDevice(d));
    for (int e : devices) {
      if (e == d) continue;
      int can = 0;
      DISTGEMM_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, d, e));
      if (!can)
        throw std::runtime_error("GPU " + std::to_string(d) + " cannot access GPU " +
                                 std::to_string(e) +
                                 " directly (no NVLink/PCIe peer path): distgemm's single-process "
                                 "runtime needs peer access between all TP devices");
      // "Already enabled" is success here (another runtime of this process enabled it).
      const cudaError_t enabled = cudaDeviceEnablePeerAccess(e, 0);
      if (enabled == cudaErrorPeerAccessAlreadyEnabled)
        (void)cudaGetLastError();  // clear the non-sticky "already enabled" status
      else
        DISTGEMM_CUDA_CHECK(enabled);
    }
  }
}

LocalSymmetricWorkspace::LocalSymmetricWorkspace(const std::vector<int>& cuda_devices,
                                                 int64_t bytes)
    : devices_(cuda_devices), bytes_(bytes) {
  enable_peer_access(devices_);
  for (int d : devices_) {
    DISTGEMM_CUDA_CHECK(cudaSetDevice(d));
    void* p = nullptr;
    DISTGEMM_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(bytes_)));
    bases_.push_back(p);
    // Flags, barrier slots and the epoch start at generation 0 everywhere.
    DISTGEMM_CUDA_CHECK(cudaMemset(p, 0, static_cast<size_t>(bytes_)));
  }
  for (int d : devices_) {
    DISTGEMM_CUDA_CHECK(cudaSetDevice(d));
    DISTGEMM_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

LocalSymmetricWorkspace::~LocalSymmetricWorkspace() {
  for (size_t i = 0; i < bases_.size(); ++i) {
    cudaSetDevice(devices_[i]);
    cudaFree(bases_[i]);  // destructor: nothing to report to
  }
}

}  // namespace distgemm::device
