// What the launchers of single kernels on caller-owned tensors share (FusedLauncher,
// AllReduceLauncher): device addresses from Python and their per-rank check, the device, the wait
// bound, the eager error sink, and each launch issued between the communicator's LaunchOrder's
// before/after with the error sink that fits the stream (the LaunchOrder's capture sink when the
// stream is being captured).
#pragma once

#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "distgemm/device/check.hpp"
#include "distgemm/kernel/wait_spec.hpp"
#include "launch_order.hpp"

namespace distgemm::python {

// A device address passed from Python as an integer, as a pointer.
template <class T>
T* as(uint64_t v) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(v));
}

// ValueError (std::invalid_argument) unless `first` and `second` (named so) hold one address per
// rank each: as many, 1..kMaxDevices.
inline void check_rank_addresses(const char* first_name, const std::vector<uint64_t>& first,
                                 const char* second_name, const std::vector<uint64_t>& second) {
  if (first.size() != second.size() || first.empty() || first.size() > size_t(kernel::kMaxDevices))
    throw std::invalid_argument(
        std::string(first_name) + " and " + second_name + " need one address per rank (1.." +
        std::to_string(kernel::kMaxDevices) + "), got " + std::to_string(first.size()) + " and " +
        std::to_string(second.size()));
}

class KernelLauncher {
 public:
  // ValueError (std::invalid_argument) naming `what` when the order is missing or of another
  // device, or the timeout is not positive and finite.
  KernelLauncher(const char* what, int cuda_device, std::shared_ptr<LaunchOrder> order,
                 double timeout_s)
      : device_(cuda_device), order_(std::move(order)) {
    if (!order_) throw std::invalid_argument(std::string(what) + " needs a LaunchOrder");
    if (order_->device() != cuda_device)
      throw std::invalid_argument("LaunchOrder of CUDA device " + std::to_string(order_->device()) +
                                  " used for a launcher on CUDA device " +
                                  std::to_string(cuda_device));
    if (!(timeout_s > 0) || !std::isfinite(timeout_s))
      throw std::invalid_argument("timeout_s must be positive, got " + std::to_string(timeout_s));
    timeout_ns_ = static_cast<uint64_t>(timeout_s * 1e9);
    pybind11::gil_scoped_release nogil;
    sink_ = std::make_shared<ErrorSink>(cuda_device);
  }

  // `launch(abort, record)` records the kernel on `s`, ordered after this device's previous
  // launch of the communicator (called without the GIL).
  template <class Launch>
  void issue(cudaStream_t s, Launch&& launch) {
    const StreamCapture cap = stream_capture(s);
    const std::shared_ptr<ErrorSink> sink = cap.active ? order_->capture_errors() : sink_;
    DISTGEMM_CUDA_CHECK(cudaSetDevice(device_));
    order_->before(s, cap);
    launch(sink->abort(), sink->record_dev());
    order_->after(s, cap);
  }

  // "" or the timeout report of an eager launch (read after synchronising).
  std::string error() const { return sink_->error(); }
  int device() const { return device_; }
  uint64_t timeout_ns() const { return timeout_ns_; }

 private:
  int device_;
  std::shared_ptr<LaunchOrder> order_;
  std::shared_ptr<ErrorSink> sink_;
  uint64_t timeout_ns_ = 0;
};

}  // namespace distgemm::python
