// distgemm._core's host-only rules of the fused GEMM + all-reduce (kernel/fused_allreduce.hpp):
// which kernel, token tile, split-K factor or the decode kernel's grid and pieces, buffer sizes
// and the shape check, so that Python
// decides the path and sizes the workspace the same way with or without a GPU.
#include <pybind11/pybind11.h>

#include <string>

#include "distgemm/kernel/fused_allreduce.hpp"

namespace py = pybind11;
namespace k = distgemm::kernel;

void register_fused_rules(py::module_& m) {
  m.attr("FUSED_CONTROL_BYTES") = py::int_(k::fused_control_bytes());
  m.attr("FUSED_MAX_SPLITS") = py::int_(k::kFusedMaxSplits);
  m.attr("FUSED_DECODE_MAX_PIECES") = py::int_(k::kFusedDecodeMaxPieces);
  m.attr("FUSED_DECODE_MAX_TOKENS") = py::int_(k::kFusedDecodeMaxTokens);
  m.attr("FUSED_MAX_TILES") = py::int_(k::kFusedMaxTiles);
  m.attr("FUSED_MAX_CTAS") = py::int_(k::kFusedMaxCtas);
  m.attr("FUSED_LINE_BYTES") = py::int_(k::kFusedLineBytes);
  m.def("fused_kernel", &k::fused_kernel_name, py::arg("m"),
        "The fused kernel that runs m tokens: 'decode' (up to FUSED_DECODE_MAX_TOKENS) or "
        "'cutlass'.");
  m.def("fused_decode_token_width", &k::fused_decode_token_width, py::arg("m"),
        "The decode kernel's padded tokens per block (16 or 32) for m tokens.");
  m.def("fused_token_tile", &k::fused_token_tile, py::arg("m"),
        "Tokens per output tile of the fused kernel for m tokens.");
  m.def("fused_splits", &k::fused_splits, py::arg("m"), py::arg("n"), py::arg("k"),
        py::arg("resident_ctas"),
        "Partials per rank of a tile's sum: the CUTLASS kernel's splits of K (the most that keep "
        "every tile resident at once), the decode kernel's most pieces of a tile over fused_ctas' "
        "grid.");
  m.def("fused_ctas", &k::fused_ctas, py::arg("m"), py::arg("n"), py::arg("k"),
        py::arg("resident_ctas"),
        "The decode kernel's grid (its tiles' K steps cut into equal shares, one per CTA); 0 for "
        "the CUTLASS kernel.");
  m.def(
      "fused_decode_pieces",
      [](int64_t m, int64_t n, int64_t kk, int ctas) {
        const std::string problem = k::fused_shape_problem(m, n, kk, 1, 1);
        if (!problem.empty()) throw py::value_error(problem);
        const k::FusedDecodeWork w = k::fused_decode_work(m, n, kk, 1);
        if (ctas < 1 || uint32_t(ctas) > w.units())
          throw py::value_error("ctas=" + std::to_string(ctas) + " must be in 1.." +
                                std::to_string(w.units()) + " (the tiles x K steps)");
        const k::FusedDecodeWork work{w.tiles, w.steps, uint32_t(ctas)};
        py::list out;
        for (uint32_t t = 0; t < work.tiles; ++t)
          out.append(py::make_tuple(work.first_cta(t), work.pieces(t)));
        return out;
      },
      py::arg("m"), py::arg("n"), py::arg("k"), py::arg("ctas"),
      "The decode kernel's tiles over `ctas` CTAs: (first CTA, pieces) of each tile.");
  m.def("fused_partial_bytes", &k::fused_partial_bytes, py::arg("m"), py::arg("n"),
        py::arg("splits"), py::arg("element_bytes"), py::arg("tp"),
        "Bytes of one rank's partial buffers: two parities of every split's partial (the decode "
        "kernel's: of every rank's too, as generation-tagged lines).");
  m.def("fused_shape_problem", &k::fused_shape_problem, py::arg("m"), py::arg("n"), py::arg("k"),
        py::arg("splits"), py::arg("tp"),
        "'' when the fused kernel takes these shapes, else the reason with the values.");
}
