// distgemm._core, CUDA part: what the torch-facing API (python/distgemm/comm.py, ops.py) needs
// from the runtime, and nothing torch-specific: pointers and streams cross as Python ints.
//
//   IpcWorkspace  one rank's symmetric workspace: cudaMalloc'd on this rank's device, zeroed,
//                 exported as a CUDA IPC handle; opens the peers' handles and closes everything
//                 it opened or allocated on close()/destruction.
//   LaunchOrder   the launch order of every graph that shares one workspace on this device
//                 (see below why it exists), and the error sink its captured graphs share.
//   GraphLauncher device::DeviceGraph of one rank for a _core.Plan as it was built, with a
//                 GraphSetup (graph_setup.hpp): update(pointers), launch(stream), error();
//                 capture(stream, pointers) records it into the caller's stream capture.
//   RelaxedCaptureMode  context manager: setup work allowed while a stream is being captured.
//
// The GIL is released around everything that talks to the driver for longer than a few
// microseconds (allocation, IPC open, graph build/update, launch), so other Python threads (a
// data loader, torch's own callbacks) keep running. C++ exceptions reach Python through
// pybind11's translation: std::invalid_argument -> ValueError, other std::exception ->
// RuntimeError, with the message unchanged.
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "all.hpp"
#include "distgemm/device/check.hpp"
#include "distgemm/device/graph.hpp"
#include "distgemm/schedule/plan.hpp"
#include "graph_setup.hpp"
#include "launch_order.hpp"

namespace py = pybind11;

namespace {

using distgemm::device::DeviceGraph;
using distgemm::device::EpilogueArgs;
using distgemm::device::ErrorSink;
using distgemm::device::GraphOptions;
using distgemm::device::RelaxedCaptureMode;
using distgemm::device::UserBuffers;
using distgemm::kernel::DType;
using distgemm::python::LaunchOrder;
using distgemm::python::stream_capture;
using distgemm::python::StreamCapture;

void* as_ptr(uint64_t v) { return reinterpret_cast<void*>(static_cast<uintptr_t>(v)); }
uint64_t as_int(const void* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }

// One rank's symmetric workspace and its view of the peers' workspaces.
class IpcWorkspace {
 public:
  IpcWorkspace(int cuda_device, int64_t bytes) : device_(cuda_device), bytes_(bytes) {
    if (bytes < 1)
      throw std::invalid_argument("workspace size must be positive, got " + std::to_string(bytes));
    py::gil_scoped_release nogil;
    RelaxedCaptureMode relaxed;  // a new plan's first call may come inside a stream capture
    DISTGEMM_CUDA_CHECK(cudaSetDevice(device_));
    DISTGEMM_CUDA_CHECK(cudaMalloc(&base_, static_cast<size_t>(bytes_)));
    // Flags, barrier slots and the epoch word start at generation 0 on every rank; the memset
    // must be complete before a peer can see the handle, hence the synchronisation. On a private
    // stream: a device-wide synchronisation would conflict with a capture in progress.
    cudaStream_t zeroing = nullptr;
    cudaError_t e = cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMemsetAsync(base_, 0, static_cast<size_t>(bytes_), zeroing);
    if (e == cudaSuccess) e = cudaStreamSynchronize(zeroing);
    if (zeroing) cudaStreamDestroy(zeroing);
    if (e != cudaSuccess) {
      cudaFree(base_);
      base_ = nullptr;
      DISTGEMM_CUDA_CHECK(e);
    }
  }
  ~IpcWorkspace() { close_noexcept(); }
  IpcWorkspace(const IpcWorkspace&) = delete;
  IpcWorkspace& operator=(const IpcWorkspace&) = delete;

  py::bytes handle() const {
    require_open("handle()");
    cudaIpcMemHandle_t h;
    {
      py::gil_scoped_release nogil;
      RelaxedCaptureMode relaxed;
      DISTGEMM_CUDA_CHECK(cudaSetDevice(device_));
      DISTGEMM_CUDA_CHECK(cudaIpcGetMemHandle(&h, base_));
    }
    return py::bytes(reinterpret_cast<const char*>(&h), sizeof(h));
  }

  // handles[r]: rank r's exported handle (ignored for `rank`, this rank). Afterwards bases()[r]
  // is rank r's workspace as addressable from this device.
  void open_peers(const std::vector<std::string>& handles, int rank) {
    require_open("open_peers()");
    if (!peers_.empty())
      throw std::runtime_error("open_peers() was already called on this workspace");
    if (rank < 0 || rank >= static_cast<int>(handles.size()))
      throw std::invalid_argument("rank " + std::to_string(rank) + " is outside the " +
                                  std::to_string(handles.size()) + " handles");
    for (size_t r = 0; r < handles.size(); ++r)
      if (static_cast<int>(r) != rank && handles[r].size() != sizeof(cudaIpcMemHandle_t))
        throw std::invalid_argument("IPC handle of rank " + std::to_string(r) + " has " +
                                    std::to_string(handles[r].size()) + " bytes, expected " +
                                    std::to_string(sizeof(cudaIpcMemHandle_t)));
    py::gil_scoped_release nogil;
    RelaxedCaptureMode relaxed;
    DISTGEMM_CUDA_CHECK(cudaSetDevice(device_));
    peers_.assign(handles.size(), nullptr);
    bases_.assign(handles.size(), nullptr);
    for (size_t r = 0; r < handles.size(); ++r) {
      if (static_cast<int>(r) == rank) {
        bases_[r] = base_;
        continue;
      }
      cudaIpcMemHandle_t h;
      std::memcpy(&h, handles[r].data(), sizeof(h));
      void* p = nullptr;
      cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        throw std::runtime_error(
            "cudaIpcOpenMemHandle of rank " + std::to_string(r) + "'s workspace on CUDA device " +
            std::to_string(device_) + " failed: " + cudaGetErrorString(e) +
            " (the ranks must run on one host with peer access between their GPUs, and each "
            "rank on its own GPU)");
      }
      peers_[r] = p;
      bases_[r] = p;
    }
  }

  std::vector<uint64_t> bases() const {
    require_open("bases()");
    if (bases_.empty()) throw std::runtime_error("bases(): call open_peers() first");
    std::vector<uint64_t> out;
    for (void* p : bases_) out.push_back(as_int(p));
    return out;
  }

  // Closes the peers' mappings and frees this rank's allocation. The caller makes sure no
  // graph still uses the workspace and that the peers have closed their mappings of it first
  // (comm.py puts a barrier between the two halves: close_peers(), barrier, free()).
  void close_peers() {
    if (peers_.empty()) return;
    py::gil_scoped_release nogil;
    cudaSetDevice(device_);
    std::string err;
    for (void*& p : peers_) {
      if (!p) continue;
      cudaError_t e = cudaIpcCloseMemHandle(p);
      if (e != cudaSuccess && err.empty()) err = cudaGetErrorString(e);
      p = nullptr;
    }
    peers_.clear();
    bases_.clear();
    if (!err.empty()) throw std::runtime_error("cudaIpcCloseMemHandle failed: " + err);
  }
  void free() {
    close_peers();
    if (!base_) return;
    py::gil_scoped_release nogil;
    cudaSetDevice(device_);
    cudaError_t e = cudaFree(base_);
    base_ = nullptr;
    DISTGEMM_CUDA_CHECK(e);
  }

  bool closed() const { return base_ == nullptr; }
  uint64_t ptr() const { return as_int(base_); }
  int64_t nbytes() const { return bytes_; }
  int device() const { return device_; }

 private:
  void require_open(const char* what) const {
    if (!base_) throw std::runtime_error(std::string(what) + ": the workspace was freed");
  }
  void close_noexcept() {
    cudaSetDevice(device_);
    for (void* p : peers_)
      if (p) cudaIpcCloseMemHandle(p);
    peers_.clear();
    if (base_) cudaFree(base_);
    base_ = nullptr;
  }

  int device_;
  int64_t bytes_;
  void* base_ = nullptr;
  std::vector<void*> peers_;  // opened mappings (null for this rank)
  std::vector<void*> bases_;  // every rank's base as seen from this device
};

UserBuffers user_from(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t bias,
                      uint64_t scale_a = 0, uint64_t scale_b = 0) {
  UserBuffers u;
  u.scale_a = static_cast<const float*>(as_ptr(scale_a));
  u.scale_b = static_cast<const float*>(as_ptr(scale_b));
  u.a = as_ptr(a);
  u.b = as_ptr(b);
  u.c = as_ptr(c);
  u.d = as_ptr(d);
  u.bias = as_ptr(bias);
  return u;
}

// A rank's graph for one plan, plus its launch order.
class GraphLauncher {
 public:
  // capture_only: the graph only records into callers' captures (capture()), has no
  // executable of its own and reports timeouts into the order's shared capture error sink.
  GraphLauncher(const distgemm::schedule::Plan& plan, const distgemm::python::GraphSetup& setup,
                std::shared_ptr<LaunchOrder> order, uint64_t a, uint64_t b, uint64_t c, uint64_t d,
                uint64_t bias_ptr, bool capture_only, uint64_t scale_a, uint64_t scale_b)
      : order_(std::move(order)) {
    if (!order_) throw std::invalid_argument("GraphLauncher needs a LaunchOrder");
    if (order_->device() != setup.cuda_device)
      throw std::invalid_argument("LaunchOrder of CUDA device " + std::to_string(order_->device()) +
                                  " used for a graph on CUDA device " +
                                  std::to_string(setup.cuda_device));
    const DType dt = distgemm::kernel::parse_dtype(setup.dtype);
    std::vector<void*> bases;
    for (uint64_t p : setup.workspace_bases) bases.push_back(as_ptr(p));
    EpilogueArgs epi;
    epi.alpha = setup.alpha;
    epi.beta = setup.beta;
    epi.bias = setup.bias;
    GraphOptions opt;
    opt.timeout_s = setup.timeout_s;
    opt.tile_n = setup.tile_n;
    opt.b_n_major = setup.b_n_major;
    opt.fast_accum = setup.fast_accum;
    // The graph checks the plan's own layout (its partial transport included) against this.
    opt.workspace_bytes = setup.workspace_bytes;
    if (capture_only) {
      opt.instantiate = false;
      opt.errors = order_->capture_errors();
    }
    const UserBuffers user = user_from(a, b, c, d, bias_ptr, scale_a, scale_b);
    py::gil_scoped_release nogil;
    graph_ = std::make_unique<DeviceGraph>(plan, setup.rank, setup.cuda_device, dt, epi, bases,
                                           user, opt);
  }

  // New user pointers. The graph-exec update is tried first; where the driver refuses it (it
  // may, e.g. for memcpy nodes whose parameters it will not change in place) the graph is
  // re-instantiated instead, so that a refusal never surfaces as an error in the middle of a
  // model.
  // Returns true when it had to rebuild. Shape errors (std::invalid_argument) propagate as they
  // are.
  bool update(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t bias, uint64_t scale_a,
              uint64_t scale_b) {
    const UserBuffers u = user_from(a, b, c, d, bias, scale_a, scale_b);
    py::gil_scoped_release nogil;
    if (!update_refused_) {
      try {
        graph_->update(u);
        return false;
      } catch (const std::invalid_argument&) {
        throw;
      } catch (const std::runtime_error&) {
        update_refused_ = true;  // the same topology will be refused again: go straight to rebuild
      }
    }
    graph_->rebuild(u);
    ++rebuilds_;
    return true;
  }
  int64_t rebuilds() const { return rebuilds_; }

  void launch(uint64_t stream) {
    cudaStream_t s = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream));
    py::gil_scoped_release nogil;
    // A graph launch inside someone else's stream capture would be recorded as a child graph
    // fixed at capture time, which later pointer updates of this executable would not reach:
    // inside a capture, capture() records the nodes themselves (ops.py routes there).
    const StreamCapture cap = stream_capture(s);
    if (cap.active)
      throw std::runtime_error(
          "GraphLauncher.launch() on a stream that is being captured: use capture() (the "
          "distgemm ops do so inside torch.cuda.graph)");
    DISTGEMM_CUDA_CHECK(cudaSetDevice(graph_->cuda_device()));
    order_->before(s, cap);
    graph_->launch(s);
    order_->after(s, cap);
  }

  // Record one launch for these user pointers into the capture in progress on `stream`.
  void capture(uint64_t stream, uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t bias,
               uint64_t scale_a, uint64_t scale_b) {
    enqueue_nodes(stream, user_from(a, b, c, d, bias, scale_a, scale_b), true);
  }

  // Enqueue one launch for these user pointers on `stream` (not capturing) as plain stream work,
  // without a graph: for pointers the caller keeps no graph for (OverlappedState.graph_for).
  void launch_direct(uint64_t stream, uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t bias,
                     uint64_t scale_a, uint64_t scale_b) {
    enqueue_nodes(stream, user_from(a, b, c, d, bias, scale_a, scale_b), false);
  }

  std::string error() const { return graph_->error(); }
  void check() const { graph_->check(); }
  int rank() const { return graph_->rank(); }
  int cuda_device() const { return graph_->cuda_device(); }
  py::dict stats() const {
    const auto& s = graph_->stats();
    py::dict d;
    d["gemm_nodes"] = s.gemm_nodes;
    d["copy_nodes"] = s.copy_nodes;
    d["signal_nodes"] = s.signal_nodes;
    d["wait_kernels"] = s.wait_kernels;
    d["pdl"] = s.pdl;
    d["gemm_n128"] = s.gemm_n128;
    d["gemm_cublaslt"] = s.gemm_cublaslt;
    return d;
  }

 private:
  // The plan's nodes for `u` on `stream`, between the launch order's before and after: recorded
  // into the capture in progress there (`into_capture`), or enqueued as plain stream work.
  void enqueue_nodes(uint64_t stream, const UserBuffers& u, bool into_capture) {
    cudaStream_t s = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream));
    py::gil_scoped_release nogil;
    const StreamCapture cap = stream_capture(s);
    if (cap.active != into_capture)
      throw std::runtime_error(
          into_capture
              ? "GraphLauncher.capture() on a stream that is not being captured: use launch()"
              : "GraphLauncher.launch_direct() on a stream that is being captured: use capture()");
    DISTGEMM_CUDA_CHECK(cudaSetDevice(graph_->cuda_device()));
    order_->before(s, cap);
    if (into_capture)
      graph_->capture_into(s, u);
    else
      graph_->enqueue_on(s, u);
    order_->after(s, cap);
  }

  std::shared_ptr<LaunchOrder> order_;
  std::unique_ptr<DeviceGraph> graph_;
  bool update_refused_ = false;
  int64_t rebuilds_ = 0;
};

// device::RelaxedCaptureMode as a Python context manager (one `with` at a time per object).
class PyRelaxedCaptureMode {
 public:
  void enter() {
    if (guard_) throw std::runtime_error("RelaxedCaptureMode entered twice; use a new one");
    guard_.emplace();
  }
  void exit() { guard_.reset(); }

 private:
  std::optional<RelaxedCaptureMode> guard_;
};

}  // namespace

void register_runtime(py::module_& m) {
  py::class_<IpcWorkspace>(
      m, "IpcWorkspace",
      "One rank's symmetric workspace: zeroed device memory exported as a CUDA "
      "IPC handle; opens the peers' handles.")
      .def(py::init<int, int64_t>(), py::arg("cuda_device"), py::arg("nbytes"))
      .def("handle", &IpcWorkspace::handle, "This rank's cudaIpcMemHandle_t, as bytes.")
      .def("open_peers", &IpcWorkspace::open_peers, py::arg("handles"), py::arg("rank"),
           "Open every other rank's handle (handles[rank] is ignored).")
      .def("bases", &IpcWorkspace::bases,
           "Every rank's workspace base as an address valid on this device (after open_peers).")
      .def("close_peers", &IpcWorkspace::close_peers, "Close the peers' mappings.")
      .def("free", &IpcWorkspace::free, "Close the peers' mappings and free this rank's memory.")
      .def_property_readonly("closed", &IpcWorkspace::closed)
      .def_property_readonly("ptr", &IpcWorkspace::ptr)
      .def_property_readonly("nbytes", &IpcWorkspace::nbytes)
      .def_property_readonly("device", &IpcWorkspace::device);

  py::class_<LaunchOrder, std::shared_ptr<LaunchOrder>>(
      m, "LaunchOrder", "Orders the launches of the graphs sharing one workspace on one device.")
      .def(py::init<int>(), py::arg("cuda_device"))
      .def(
          "record",
          [](LaunchOrder& o, uint64_t stream) {
            cudaStream_t s = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream));
            o.after(s, stream_capture(s));
          },
          py::arg("stream"),
          "Mark `stream`'s current position as the end of the last launch (work issued after a "
          "launch that still reads the workspace, e.g. copying out the gathered operand); inside "
          "a capture, the end of the last captured launch.")
      .def("capture_error", &LaunchOrder::capture_error,
           "'' or the timeout report of a graph captured on this workspace (read after "
           "synchronising).");

  py::class_<PyRelaxedCaptureMode>(
      m, "RelaxedCaptureMode",
      "Context manager: while inside, this thread may allocate and set up (cudaMalloc, IPC, "
      "graph objects) even though a stream capture in global mode is in progress.")
      .def(py::init<>())
      .def("__enter__",
           [](py::object self) {
             self.cast<PyRelaxedCaptureMode&>().enter();
             return self;
           })
      .def("__exit__", [](PyRelaxedCaptureMode& g, const py::args&) {
        g.exit();
        return false;
      });

  py::class_<GraphLauncher>(
      m, "GraphLauncher",
      "One rank's CUDA graph of a plan (device::DeviceGraph). Pointers and streams "
      "are integers (tensor.data_ptr(), stream.cuda_stream); 0 means absent.")
      .def(py::init<const distgemm::schedule::Plan&, const distgemm::python::GraphSetup&,
                    std::shared_ptr<LaunchOrder>, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                    bool, uint64_t, uint64_t>(),
           py::arg("plan"), py::arg("setup"), py::arg("order"), py::arg("a"), py::arg("b"),
           py::arg("c"), py::arg("d"), py::arg("bias_ptr"), py::arg("capture_only") = false,
           py::arg("scale_a") = 0, py::arg("scale_b") = 0,
           "The graph of `plan` (a _core.Plan, used as built: its partial transport, PDL and "
           "workspace layout) for setup.rank; ValueError when setup.workspace_bytes (if set) is "
           "smaller than the plan's layout. capture_only: no executable of its own, only "
           "capture() (timeouts go to the order's shared capture error sink).")
      .def("update", &GraphLauncher::update, py::arg("a"), py::arg("b"), py::arg("c"), py::arg("d"),
           py::arg("bias_ptr"), py::arg("scale_a") = 0, py::arg("scale_b") = 0,
           "Retarget the graph at new user buffers: a graph-exec update, or a re-instantiation "
           "where the driver refuses the update (returns True then).")
      .def_property_readonly("rebuilds", &GraphLauncher::rebuilds,
                             "How many retargets needed a re-instantiation.")
      .def("launch", &GraphLauncher::launch, py::arg("stream"), "Enqueue one launch on `stream`.")
      .def("capture", &GraphLauncher::capture, py::arg("stream"), py::arg("a"), py::arg("b"),
           py::arg("c"), py::arg("d"), py::arg("bias_ptr"), py::arg("scale_a") = 0,
           py::arg("scale_b") = 0,
           "Record one launch for these user pointers into the capture in progress on `stream` "
           "(the nodes themselves, not a graph launch).")
      .def("launch_direct", &GraphLauncher::launch_direct, py::arg("stream"), py::arg("a"),
           py::arg("b"), py::arg("c"), py::arg("d"), py::arg("bias_ptr"), py::arg("scale_a") = 0,
           py::arg("scale_b") = 0,
           "Enqueue one launch for these user pointers on `stream` (not being captured) as plain "
           "stream work, without a graph: no re-capture, no graph-exec update.")
      .def("error", &GraphLauncher::error,
           "'' or the timeout report of this rank (read after synchronising).")
      .def("check", &GraphLauncher::check, "Raise RuntimeError with error() when there is one.")
      .def_property_readonly("rank", &GraphLauncher::rank)
      .def_property_readonly("cuda_device", &GraphLauncher::cuda_device)
      .def("stats", &GraphLauncher::stats, "Node counts of the graph.");

  m.def(
      "cuda_device_count",
      []() {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess) {
          (void)cudaGetLastError();
          return 0;
        }
        return n;
      },
      "CUDA devices visible to this process (0 when there is no driver).");
}
