// distgemm._core's host-only rules of distgemm's one-shot and two-shot all-reduce, flag and LL
// (kernel/allreduce.hpp): algorithms, buffer bytes, the grid and the argument check, so that
// Python sizes its buffers and chooses the same way with or without a GPU.
#include <pybind11/pybind11.h>

#include <string>

#include "distgemm/kernel/allreduce.hpp"

namespace py = pybind11;
namespace k = distgemm::kernel;

namespace {

// ValueError with allreduce_problem's reason unless the arguments are runnable.
void require_runnable(const std::string& algorithm, int64_t numel, int element_bytes, int tp) {
  const std::string problem = k::allreduce_problem(algorithm, numel, element_bytes, tp);
  if (!problem.empty()) throw py::value_error(problem);
}

}  // namespace

void register_allreduce_rules(py::module_& m) {
  py::tuple names(k::kAllReduceAlgorithms);
  py::list lines, pull;
  for (int i = 0; i < k::kAllReduceAlgorithms; ++i) {
    names[i] = k::kAllReduceAlgorithmNames[i];
    if (k::allreduce_lines(static_cast<k::AllReduceAlgorithm>(i)))
      lines.append(k::kAllReduceAlgorithmNames[i]);
    if (k::allreduce_pull(static_cast<k::AllReduceAlgorithm>(i)))
      pull.append(k::kAllReduceAlgorithmNames[i]);
  }
  m.attr("ALLREDUCE_ALGORITHMS") = names;
  // The algorithms that push LL lines: their receive buffers hold nothing else (allreduce.hpp).
  m.attr("ALLREDUCE_LINE_ALGORITHMS") = py::tuple(lines);
  // The algorithms that read the ranks' inputs in their receive buffers (allreduce.hpp).
  m.attr("ALLREDUCE_PULL_ALGORITHMS") = py::tuple(pull);
  m.attr("ALLREDUCE_CONTROL_BYTES") = py::int_(k::allreduce_control_bytes());
  m.attr("ALLREDUCE_MAX_CTAS") = py::int_(k::kAllReduceMaxCtas);
  m.attr("ALLREDUCE_CTA_BYTES") = py::int_(k::kAllReduceCtaBytes);
  m.def("allreduce_problem", &k::allreduce_problem, py::arg("algorithm"), py::arg("numel"),
        py::arg("element_bytes"), py::arg("tp"),
        "'' when the all-reduce runs these arguments, else the reason with the values.");
  m.def(
      "allreduce_receive_bytes",
      [](const std::string& algorithm, int64_t numel, int element_bytes, int tp) {
        require_runnable(algorithm, numel, element_bytes, tp);
        return k::allreduce_receive_bytes(algorithm, numel, element_bytes, tp);
      },
      py::arg("algorithm"), py::arg("numel"), py::arg("element_bytes"), py::arg("tp"),
      "Bytes of one rank's receive buffers, both parities (ValueError where allreduce_problem "
      "objects).");
  m.def(
      "allreduce_chunk_elems",
      [](int64_t numel, int tp) {
        require_runnable("two_shot", numel, 2, tp);
        return k::allreduce_chunk_elems(numel, tp);
      },
      py::arg("numel"), py::arg("tp"),
      "two_shot's chunk per rank: numel / tp rounded up to a multiple of 8 elements.");
  m.def(
      "allreduce_ctas",
      [](const std::string& algorithm, int64_t numel, int element_bytes, int tp,
         int resident_ctas) {
        require_runnable(algorithm, numel, element_bytes, tp);
        if (resident_ctas < 1)
          throw py::value_error("resident_ctas=" + std::to_string(resident_ctas) +
                                " must be at least 1");
        return k::allreduce_ctas(algorithm, numel, element_bytes, tp, resident_ctas);
      },
      py::arg("algorithm"), py::arg("numel"), py::arg("element_bytes"), py::arg("tp"),
      py::arg("resident_ctas"),
      "The grid: one CTA per ALLREDUCE_CTA_BYTES that a CTA pushes to one peer, of its slice "
      "(one_shot: of the vector, two_shot: of a chunk) as data, or with LL as lines (twice the "
      "data), at most resident_ctas and ALLREDUCE_MAX_CTAS.");
}
