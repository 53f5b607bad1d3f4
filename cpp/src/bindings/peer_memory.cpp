// distgemm._core.export_allocation / PeerMappings: CUDA IPC of memory the caller owns (a tensor
// from torch's caching allocator, e.g. a captured all-reduce's output), so that peers can write
// into it. The communicator's own symmetric regions use IpcWorkspace (runtime.cpp) instead.
//
//   export_allocation(cuda_device, ptr) -> (handle, offset): the IPC handle of the cudaMalloc
//       allocation holding `ptr` and ptr's byte offset in it. RuntimeError where the memory
//       cannot be exported (memory of the virtual memory API, as torch's expandable segments or
//       cudaMallocAsync pools, is not cudaMalloc'd).
//   PeerMappings(cuda_device).open(handle) -> base: a peer's exported allocation mapped on this
//       device, each handle opened once (the driver maps an allocation once per process) and kept
//       until close(): a captured graph that writes there may replay at any later time.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "distgemm/device/check.hpp"
#include "distgemm/device/driver_entry.hpp"
#include "distgemm/device/graph.hpp"  // RelaxedCaptureMode

namespace py = pybind11;

namespace {

// cuPointerGetAttribute, reached through the runtime (libcuda need not be linked).
using PointerGetAttribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);

PointerGetAttribute pointer_get_attribute() {
  static const auto fn = distgemm::device::driver_entry<PointerGetAttribute>(
      "cuPointerGetAttribute", 12000, "export_allocation");
  return fn;
}

py::tuple export_allocation(int cuda_device, uint64_t ptr) {
  cudaIpcMemHandle_t h;
  uint64_t base = 0;
  {
    py::gil_scoped_release nogil;
    distgemm::device::RelaxedCaptureMode relaxed;  // called while the caller captures
    DISTGEMM_CUDA_CHECK(cudaSetDevice(cuda_device));
    CUdeviceptr start = 0;
    const CUresult r = pointer_get_attribute()(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                               static_cast<CUdeviceptr>(ptr));
    if (r != CUDA_SUCCESS)
      throw std::runtime_error("cuPointerGetAttribute(RANGE_START_ADDR) of " + std::to_string(ptr) +
                               " failed with CUresult " + std::to_string(int(r)));
    base = static_cast<uint64_t>(start);
    const cudaError_t e = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base));
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw std::runtime_error(std::string("cudaIpcGetMemHandle failed: ") + cudaGetErrorString(e) +
                               " (memory that is not cudaMalloc'd, as torch's expandable "
                               "segments, cannot be exported)");
    }
  }
  return py::make_tuple(py::bytes(reinterpret_cast<const char*>(&h), sizeof(h)), ptr - base);
}

class PeerMappings {
 public:
  explicit PeerMappings(int cuda_device) : device_(cuda_device) {}
  ~PeerMappings() { close_noexcept(); }
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;

  uint64_t open(const std::string& handle) {
    if (handle.size() != sizeof(cudaIpcMemHandle_t))
      throw std::invalid_argument("IPC handle has " + std::to_string(handle.size()) +
                                  " bytes, expected " + std::to_string(sizeof(cudaIpcMemHandle_t)));
    auto it = opened_.find(handle);
    if (it != opened_.end()) return reinterpret_cast<uint64_t>(it->second);
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    void* p = nullptr;
    {
      py::gil_scoped_release nogil;
      distgemm::device::RelaxedCaptureMode relaxed;
      DISTGEMM_CUDA_CHECK(cudaSetDevice(device_));
      const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        throw std::runtime_error(std::string("cudaIpcOpenMemHandle of a peer's allocation on "
                                             "CUDA device ") +
                                 std::to_string(device_) + " failed: " + cudaGetErrorString(e));
      }
    }
    opened_.emplace(handle, p);
    return reinterpret_cast<uint64_t>(p);
  }

  void close() {
    py::gil_scoped_release nogil;
    close_noexcept();
  }
  size_t size() const { return opened_.size(); }

 private:
  void close_noexcept() {
    if (opened_.empty()) return;
    cudaSetDevice(device_);
    for (auto& kv : opened_) cudaIpcCloseMemHandle(kv.second);
    opened_.clear();
  }

  int device_;
  std::map<std::string, void*> opened_;  // handle bytes -> base mapped on this device
};

}  // namespace

void register_peer_memory(py::module_& m) {
  m.def("export_allocation", &export_allocation, py::arg("cuda_device"), py::arg("ptr"),
        "(IPC handle bytes, byte offset of ptr) of the cudaMalloc allocation holding device "
        "address ptr; RuntimeError where it cannot be exported.");
  py::class_<PeerMappings>(m, "PeerMappings",
                           "Peers' exported allocations mapped on one device, each handle once, "
                           "kept until close().")
      .def(py::init<int>(), py::arg("cuda_device"))
      .def("open", &PeerMappings::open, py::arg("handle"),
           "The base of the peer allocation `handle` as addressable from this device (mapped "
           "at its first open).")
      .def("close", &PeerMappings::close, "Unmap every allocation.")
      .def("__len__", &PeerMappings::size);
}
