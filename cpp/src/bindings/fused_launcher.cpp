// distgemm._core.FusedLauncher / fused_resident_ctas: launches of the fused GEMM + all-reduce
// (kernel/fused_allreduce.hpp) on caller-owned tensors, ordered with the graphs that share the
// communicator's workspace (launch_order.hpp). Pointers and streams cross as Python ints.
//
// A launch on a stream being captured records one kernel node into the caller's graph; its
// timeouts go to the LaunchOrder's capture error sink (shared with the plans' captured graphs,
// so that one missing peer ends the whole replay after one timeout). Eager launches report to
// the launcher's own sink, read with error().
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "distgemm/device/check.hpp"
#include "distgemm/kernel/fused_allreduce.hpp"
#include "kernel_launcher.hpp"

namespace py = pybind11;

namespace {

using distgemm::kernel::FusedAllReduceDesc;
using distgemm::python::as;
using distgemm::python::LaunchOrder;

class FusedLauncher : public distgemm::python::KernelLauncher {
 public:
  FusedLauncher(int cuda_device, std::shared_ptr<LaunchOrder> order, double timeout_s)
      : KernelLauncher("FusedLauncher", cuda_device, std::move(order), timeout_s) {}

  void launch(uint64_t stream, const std::string& dtype, int64_t m, int64_t n, int64_t k,
              uint64_t a, uint64_t w, uint64_t out, uint64_t bias, uint64_t c, float alpha,
              float beta, int splits, int ctas, const std::string& tail, int rank,
              const std::vector<uint64_t>& partial, const std::vector<uint64_t>& sum,
              int64_t parity_bytes, const std::vector<uint64_t>& control) {
    distgemm::python::check_rank_addresses("partial", partial, "control", control);
    if (!sum.empty() && sum.size() != partial.size())
      throw std::invalid_argument("sum needs one address per rank or none, got " +
                                  std::to_string(sum.size()) + " for " +
                                  std::to_string(partial.size()) + " ranks");
    FusedAllReduceDesc f;
    if (!distgemm::kernel::parse_fused_tail(tail, f.tail))
      throw std::invalid_argument("tail '" + tail + "' is not one_shot or two_shot");
    f.dtype = distgemm::kernel::parse_dtype(dtype);
    f.m = m;
    f.n = n;
    f.k = k;
    f.a = as<const void>(a);
    f.lda = k;
    f.w = as<const void>(w);
    f.ldw = k;
    f.out = as<void>(out);
    f.ldo = n;
    f.bias = as<const void>(bias);
    f.c = as<const void>(c);
    f.ldc = n;
    f.alpha = alpha;
    f.beta = beta;
    f.splits = splits;
    f.ctas = ctas;
    f.tp = static_cast<int>(partial.size());
    f.rank = rank;
    f.parity_bytes = parity_bytes;
    for (size_t q = 0; q < partial.size(); ++q) {
      f.partial[q] = as<void>(partial[q]);
      f.sum[q] = sum.empty() ? nullptr : as<void>(sum[q]);
      f.control[q] = as<uint32_t>(control[q]);
    }
    f.timeout_ns = timeout_ns();
    cudaStream_t s = as<CUstream_st>(stream);
    py::gil_scoped_release nogil;
    issue(s, [&](uint32_t* abort, distgemm::kernel::ErrorRecord* record) {
      f.abort = abort;
      f.record = record;
      distgemm::kernel::fused_allreduce_launch(f, device(), s);
    });
  }
};

}  // namespace

void register_fused(py::module_& m) {
  py::class_<FusedLauncher>(
      m, "FusedLauncher",
      "Launches of the fused GEMM + all-reduce on one device, ordered by the workspace's "
      "LaunchOrder; eager timeouts are reported by error().")
      .def(py::init<int, std::shared_ptr<LaunchOrder>, double>(), py::arg("cuda_device"),
           py::arg("order"), py::arg("timeout_s"))
      .def("launch", &FusedLauncher::launch, py::arg("stream"), py::arg("dtype"), py::arg("m"),
           py::arg("n"), py::arg("k"), py::arg("a"), py::arg("w"), py::arg("out"), py::arg("bias"),
           py::arg("c"), py::arg("alpha"), py::arg("beta"), py::arg("splits"), py::arg("ctas"),
           py::arg("tail"), py::arg("rank"), py::arg("partial"), py::arg("sum"),
           py::arg("parity_bytes"), py::arg("control"),
           "Record one launch on `stream` (into its capture when one is in progress); `tail` is "
           "one of FUSED_TAILS, `sum` every rank's two-shot sum buffer (empty for one_shot). "
           "ValueError when the kernel cannot run the shapes or pointers.")
      .def("error", &FusedLauncher::error,
           "'' or the timeout report of an eager launch (read after synchronising).");
  m.def(
      "fused_resident_ctas",
      [](const std::string& dtype, int64_t m, int device) {
        return distgemm::kernel::fused_allreduce_resident_ctas(distgemm::kernel::parse_dtype(dtype),
                                                               m, device);
      },
      py::arg("dtype"), py::arg("m"), py::arg("cuda_device"),
      "CTAs of the fused kernel for m tokens resident at once on the device.");
}
