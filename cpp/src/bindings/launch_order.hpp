// The launch order of the work that shares one workspace on one device (graphs of plans, fused
// GEMM + all-reduce launches), and whether a stream is being captured: shared by the runtime
// bindings (runtime.cpp, fused_launcher.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "distgemm/device/check.hpp"
#include "distgemm/device/graph.hpp"

namespace distgemm::python {

using distgemm::device::ErrorSink;
using distgemm::device::RelaxedCaptureMode;

// Whether a stream is being captured, and which capture (the id CUDA gives each capture
// sequence). An invalidated capture is an error: whatever was enqueued would be lost.
struct StreamCapture {
  bool active = false;
  unsigned long long id = 0;
};

inline StreamCapture stream_capture(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  StreamCapture c;
  DISTGEMM_CUDA_CHECK(cudaStreamGetCaptureInfo(s, &status, &c.id));
  if (status == cudaStreamCaptureStatusInvalidated)
    throw std::runtime_error(
        "the stream's CUDA graph capture was invalidated by an earlier call (an operation that "
        "is not allowed during capture); end the capture and capture again");
  c.active = status == cudaStreamCaptureStatusActive;
  return c;
}

// Graphs that share a workspace share its epoch word, flags and slots, so their launches on one
// device must never overlap: each launch's entry barrier assumes the previous launch on this
// device is complete. Launches on one stream are ordered by the stream; when the caller
// switches streams (torch.cuda.stream(...)), the new stream first waits for the last launch.
// Every launch records one event; the wait is only issued on a switch.
//
// Launches recorded into a stream capture are ordered the same way among themselves, within
// that capture (a second event, recorded and waited on inside the capture only: an event
// recorded inside a capture must not be waited on from outside it, nor one recorded outside
// waited on from inside). Between eager launches and replays of a captured graph the rule is
// the stream's: on one stream they interleave freely; on different streams the caller orders
// them (a replay runs no host code that could).
//
// Also holds the error sink of the graphs captured into callers' graphs on this workspace (made
// at the first capture): one timeout there aborts every later captured op of the replay.
class LaunchOrder {
 public:
  explicit LaunchOrder(int cuda_device) : device_(cuda_device) {
    DISTGEMM_CUDA_CHECK(cudaSetDevice(device_));
    DISTGEMM_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~LaunchOrder() {
    cudaSetDevice(device_);
    cudaEventDestroy(done_);
    if (captured_done_) cudaEventDestroy(captured_done_);
  }
  LaunchOrder(const LaunchOrder&) = delete;
  LaunchOrder& operator=(const LaunchOrder&) = delete;

  void before(cudaStream_t s, const StreamCapture& cap) {
    if (!cap.active) {
      if (used_ && s != last_) DISTGEMM_CUDA_CHECK(cudaStreamWaitEvent(s, done_, 0));
      return;
    }
    if (captured_used_ && cap.id == capture_id_ && s != captured_last_)
      DISTGEMM_CUDA_CHECK(cudaStreamWaitEvent(s, captured_done_, 0));
  }
  void after(cudaStream_t s, const StreamCapture& cap) {
    if (!cap.active) {
      DISTGEMM_CUDA_CHECK(cudaEventRecord(done_, s));
      last_ = s;
      used_ = true;
      return;
    }
    if (!captured_done_) {
      RelaxedCaptureMode relaxed;
      DISTGEMM_CUDA_CHECK(cudaEventCreateWithFlags(&captured_done_, cudaEventDisableTiming));
    }
    DISTGEMM_CUDA_CHECK(cudaEventRecord(captured_done_, s));
    captured_last_ = s;
    capture_id_ = cap.id;
    captured_used_ = true;
  }
  // The error sink of this workspace's captured graphs (made at the first call).
  std::shared_ptr<ErrorSink> capture_errors() {
    if (!capture_errors_) capture_errors_ = std::make_shared<ErrorSink>(device_);
    return capture_errors_;
  }
  // "" or the timeout report of a captured graph on this workspace.
  std::string capture_error() const { return capture_errors_ ? capture_errors_->error() : ""; }
  int device() const { return device_; }

 private:
  int device_;
  cudaEvent_t done_ = nullptr;
  cudaStream_t last_ = nullptr;
  bool used_ = false;
  cudaEvent_t captured_done_ = nullptr;  // recorded inside captures only
  cudaStream_t captured_last_ = nullptr;
  unsigned long long capture_id_ = 0;
  bool captured_used_ = false;
  std::shared_ptr<ErrorSink> capture_errors_;
};

}  // namespace distgemm::python
