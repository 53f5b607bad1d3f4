// distgemm._core.AllReduceLauncher / allreduce_resident_ctas: launches of distgemm's one-shot and
// two-shot all-reduce, flag or LL (kernel/allreduce.hpp) on caller-owned tensors, ordered with the
// communicator's other launches (kernel_launcher.hpp). Pointers and streams cross as Python ints.
//
// As FusedLauncher: a launch on a stream being captured records one kernel node into the
// caller's graph and reports timeouts to the LaunchOrder's capture error sink; eager launches
// report to the launcher's own sink, read with error().
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "distgemm/device/check.hpp"
#include "distgemm/kernel/allreduce.hpp"
#include "kernel_launcher.hpp"

namespace py = pybind11;

namespace {

using distgemm::kernel::AllReduceDesc;
using distgemm::python::as;
using distgemm::python::LaunchOrder;
namespace k = distgemm::kernel;

class AllReduceLauncher : public distgemm::python::KernelLauncher {
 public:
  AllReduceLauncher(int cuda_device, std::shared_ptr<LaunchOrder> order, double timeout_s)
      : KernelLauncher("AllReduceLauncher", cuda_device, std::move(order), timeout_s) {}

  void launch(uint64_t stream, const std::string& dtype, const std::string& algorithm,
              int64_t numel, uint64_t src, uint64_t out, int rank,
              const std::vector<uint64_t>& receive, int64_t parity_bytes,
              const std::vector<uint64_t>& control, bool chained, int ctas,
              const std::vector<uint64_t>& shared_out) {
    distgemm::python::check_rank_addresses("receive", receive, "control", control);
    if (!shared_out.empty())
      distgemm::python::check_rank_addresses("receive", receive, "shared_out", shared_out);
    AllReduceDesc d;
    if (dtype != "bf16" && dtype != "fp16")
      throw std::invalid_argument("dtype '" + dtype + "' is not bf16 or fp16");
    d.dtype = k::parse_dtype(dtype);
    if (!k::parse_allreduce_algorithm(algorithm, d.algorithm))
      throw std::invalid_argument("all-reduce rejected: " +
                                  k::allreduce_algorithm_problem(algorithm));
    d.numel = numel;
    d.src = as<const void>(src);
    d.out = as<void>(out);
    d.tp = static_cast<int>(receive.size());
    d.rank = rank;
    if (ctas < 0)
      throw std::invalid_argument("ctas=" + std::to_string(ctas) +
                                  " must be 0 (this device's rule) or positive");
    const std::string problem =
        k::allreduce_problem(algorithm, numel, k::dtype_bytes(d.dtype), d.tp);
    if (!problem.empty()) throw std::invalid_argument("all-reduce rejected: " + problem);
    d.parity_bytes = parity_bytes;
    for (size_t q = 0; q < receive.size(); ++q) {
      d.receive[q] = as<void>(receive[q]);
      d.control[q] = as<uint32_t>(control[q]);
    }
    for (size_t q = 0; q < shared_out.size(); ++q) d.shared_out[q] = as<void>(shared_out[q]);
    d.timeout_ns = timeout_ns();
    d.chained = chained;
    cudaStream_t s = as<CUstream_st>(stream);
    py::gil_scoped_release nogil;
    d.ctas = ctas > 0 ? ctas
                      : k::allreduce_ctas(algorithm, numel, k::dtype_bytes(d.dtype), d.tp,
                                          k::allreduce_resident_ctas(device()));
    issue(s, [&](uint32_t* abort, k::ErrorRecord* record) {
      d.abort = abort;
      d.record = record;
      k::allreduce_launch(d, device(), s);
    });
  }
};

}  // namespace

void register_allreduce(py::module_& m) {
  py::class_<AllReduceLauncher>(
      m, "AllReduceLauncher",
      "Launches of distgemm's one-shot / two-shot (flag or LL) all-reduce on one device, "
      "ordered by the communicator's LaunchOrder; eager timeouts are reported by error().")
      .def(py::init<int, std::shared_ptr<LaunchOrder>, double>(), py::arg("cuda_device"),
           py::arg("order"), py::arg("timeout_s"))
      .def("launch", &AllReduceLauncher::launch, py::arg("stream"), py::arg("dtype"),
           py::arg("algorithm"), py::arg("numel"), py::arg("src"), py::arg("out"), py::arg("rank"),
           py::arg("receive"), py::arg("parity_bytes"), py::arg("control"), py::arg("chained"),
           py::arg("ctas") = 0, py::arg("shared_out") = std::vector<uint64_t>{},
           "Record one all-reduce of numel elements from src into out (src itself: in place) on "
           "`stream` (into its capture when one is in progress). ctas=0: allreduce_ctas on this "
           "device's resident CTAs; every rank must launch the same grid. chained: by programmatic "
           "dependent launch (scheduled while the kernel before it ends; it reads nothing "
           "before that kernel is complete). shared_out "
           "(two_shot_pull): every rank's out as seen from this device, out at this rank's "
           "index; the sums are stored there directly. ValueError when the kernel cannot run "
           "the arguments.")
      .def("error", &AllReduceLauncher::error,
           "'' or the timeout report of an eager launch (read after synchronising).");
  m.def("allreduce_resident_ctas", &k::allreduce_resident_ctas, py::arg("cuda_device"),
        "CTAs of the all-reduce kernel resident at once on the device, at most one per SM and "
        "ALLREDUCE_MAX_CTAS (allreduce_ctas' resident_ctas).");
}
