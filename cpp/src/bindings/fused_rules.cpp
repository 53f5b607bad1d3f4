// distgemm._core's host-only rules of the fused GEMM + all-reduce (kernel/fused_allreduce.hpp):
// which kernel, token tile, split-K factor or the decode kernel's grid and pieces, the tails
// (one-shot, two-shot) and their slice owners, buffer sizes, the control region's flag layout
// and the shape check, so that Python decides the path and sizes the workspace the same way
// with or without a GPU.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "distgemm/kernel/fused_allreduce.hpp"

namespace py = pybind11;
namespace k = distgemm::kernel;

namespace {

std::string unknown_tail(const std::string& tail) {
  std::string known;
  for (const char* name : k::kFusedTailModeNames)
    known += (known.empty() ? "" : ", ") + std::string(name);
  return "tail '" + tail + "' is not one of " + known;
}

// The tail named `tail`; ValueError with fused_tail_problem's reason for an unknown name.
k::FusedTailMode tail_of(const std::string& tail) {
  k::FusedTailMode mode;
  if (!k::parse_fused_tail(tail, mode)) throw py::value_error(unknown_tail(tail));
  return mode;
}

}  // namespace

void register_fused_rules(py::module_& m) {
  m.attr("FUSED_CONTROL_BYTES") = py::int_(k::fused_control_bytes());
  m.attr("FUSED_MAX_SPLITS") = py::int_(k::kFusedMaxSplits);
  m.attr("FUSED_DECODE_MAX_PIECES") = py::int_(k::kFusedDecodeMaxPieces);
  m.attr("FUSED_DECODE_MAX_TOKENS") = py::int_(k::kFusedDecodeMaxTokens);
  m.attr("FUSED_MAX_TILES") = py::int_(k::kFusedMaxTiles);
  m.attr("FUSED_MAX_CTAS") = py::int_(k::kFusedMaxCtas);
  m.attr("FUSED_LINE_BYTES") = py::int_(k::kFusedLineBytes);
  py::tuple tails(k::kFusedTailModes);
  for (int i = 0; i < k::kFusedTailModes; ++i) tails[i] = k::kFusedTailModeNames[i];
  m.attr("FUSED_TAILS") = tails;
  m.attr("FUSED_SUM_SECTION") = py::int_(k::kFusedSumSection);
  m.attr("FUSED_FLAG_SECTIONS") = py::int_(k::kFusedFlagSections);
  m.def("fused_flag_word", &k::fused_flag_word, py::arg("section"), py::arg("index"),
        "Word of flag `index` of flag section `section` in a rank's fused control region "
        "(sections 0..MAX_TP-1: each rank's partials; FUSED_SUM_SECTION: the two-shot sums).");
  m.def(
      "fused_tail_problem",
      [](const std::string& tail, int64_t m) {
        k::FusedTailMode mode;
        if (!k::parse_fused_tail(tail, mode)) return unknown_tail(tail);
        return k::fused_tail_problem(mode, m);
      },
      py::arg("tail"), py::arg("m"),
      "'' when the tail (FUSED_TAILS) runs m tokens, else the reason.");
  m.def("fused_slice_owner", &k::fused_slice_owner, py::arg("nb"), py::arg("tb"), py::arg("s"),
        py::arg("n_blocks"), py::arg("token_blocks"), py::arg("tp"),
        "The rank that sums slice s of tile (nb, tb) in the two-shot tail.");
  m.def(
      "fused_sum_bytes",
      [](int64_t mm, int64_t n, int element_bytes, const std::string& tail) {
        return k::fused_sum_bytes(mm, n, element_bytes, tail_of(tail));
      },
      py::arg("m"), py::arg("n"), py::arg("element_bytes"), py::arg("tail"),
      "Bytes of one rank's two-shot sum buffers (two parities of m x n elements); 0 for the "
      "one-shot tail.");
  m.def(
      "fused_sum_buffers_problem",
      [](const std::string& dtype, int64_t mm, int64_t n, int splits, const std::string& tail,
         const std::vector<uint64_t>& partial, const std::vector<uint64_t>& sum,
         int64_t parity_bytes) {
        if (partial.size() != sum.size() || partial.empty() ||
            partial.size() > size_t(k::kMaxDevices))
          throw py::value_error("partial and sum need one address per rank (1.." +
                                std::to_string(k::kMaxDevices) + ")");
        k::FusedAllReduceDesc f;
        f.dtype = k::parse_dtype(dtype);
        f.m = mm;
        f.n = n;
        f.splits = splits;
        f.tail = tail_of(tail);
        f.tp = static_cast<int>(partial.size());
        f.parity_bytes = parity_bytes;
        for (size_t q = 0; q < partial.size(); ++q) {
          f.partial[q] = reinterpret_cast<void*>(static_cast<uintptr_t>(partial[q]));
          f.sum[q] = reinterpret_cast<void*>(static_cast<uintptr_t>(sum[q]));
        }
        return k::fused_sum_buffers_problem(f);
      },
      py::arg("dtype"), py::arg("m"), py::arg("n"), py::arg("splits"), py::arg("tail"),
      py::arg("partial"), py::arg("sum"), py::arg("parity_bytes"),
      "'' when the two-shot sum buffers at these addresses (0: none) are apart from the partial "
      "buffers and each other in both parities, else the reason (the launch's own check).");
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
